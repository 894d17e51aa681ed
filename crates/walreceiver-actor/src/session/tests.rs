//! The session driven by message sequences: what goes in, what comes out.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use protocol_codec::messages::{CommitPoint, PrimaryKeepalive, TransactionStatus, XLogData};
use protocol_codec::{results, ClientCodec, ErrorFields, SqlState};
use tokio_util::codec::Decoder;
use wal_storage::{format_history, CommitBound};

use super::*;

const SYSTEM: SystemId = SystemId(7713831534704266365);

struct Harness {
    s: Session,
    now: Instant,
    /// What the upstream says it is at connection start: a primary unless a test says not.
    role: UpstreamRole,
}

fn config() -> SessionConfig {
    SessionConfig {
        slot_name: None,
        wal_receiver_timeout: Duration::from_secs(60),
        wal_receiver_status_interval: Duration::from_secs(10),
        apply: ApplyReporting::FollowFlush,
        commit_overlap: false,
    }
}

impl Harness {
    fn new(cfg: SessionConfig, timeline: u32, flushed: u64) -> Harness {
        Harness::with_history(cfg, timeline, flushed, Vec::new())
    }

    /// A node on `timeline`, whose ancestry is `history`.
    fn with_history(
        cfg: SessionConfig,
        timeline: u32,
        flushed: u64,
        history: Vec<HistoryEntry>,
    ) -> Harness {
        let now = Instant::now();
        let local = LocalWal {
            system_id: SYSTEM,
            timeline: TimelineId(timeline),
            flushed: Lsn(flushed),
            written: Lsn(flushed),
            commit_point: None,
            primary_end: None,
            history,
        };
        let status = ReceiverStatus::new("host=up".into(), cfg.slot_name.clone());
        Harness {
            s: Session::new(Arc::new(cfg), local, status, now),
            now,
            role: UpstreamRole::Primary,
        }
    }

    /// Connected: IDENTIFY_SYSTEM must go out.
    fn connect(&mut self) {
        let mut out = Vec::new();
        self.s.on_connected(self.role, self.now, &mut out);
        assert_eq!(out, [query("IDENTIFY_SYSTEM")]);
    }

    fn feed(&mut self, msgs: impl IntoIterator<Item = BackendMessage>) -> Vec<Output> {
        let mut out = Vec::new();
        for m in msgs {
            self.s.on_message(m, self.now, &mut out);
            self.s.check_invariants();
        }
        out
    }

    fn done(&mut self, r: Result<StorageDone, WalError>) -> Vec<Output> {
        let mut out = Vec::new();
        self.s.on_storage_done(r, self.now, &mut out);
        out
    }

    fn position(&mut self, timeline: u32, flushed: u64) -> Vec<Output> {
        let mut out = Vec::new();
        let pos = WalPosition {
            timeline: TimelineId(timeline),
            written: Lsn(flushed),
            flushed: Lsn(flushed),
            commit: CommitBound::None,
        };
        self.s.on_position(pos, self.now, &mut out);
        out
    }

    fn tick_at(&mut self, at: Instant) -> Vec<Output> {
        self.now = at;
        let mut out = Vec::new();
        self.s.on_tick(at, &mut out);
        out
    }

    /// IDENTIFY_SYSTEM answered with the upstream on `timeline` at `xlogpos`.
    fn identified(&mut self, system: SystemId, timeline: u32, xlogpos: u64) -> Vec<Output> {
        self.feed(ready(results::identify_system(
            system,
            TimelineId(timeline),
            Lsn(xlogpos),
            None,
        )))
    }

    /// Brings the session to streaming `timeline` from `start`, on an upstream on that timeline.
    fn streaming(&mut self, timeline: u32, start: u64) {
        self.connect();
        let out = self.identified(SYSTEM, timeline, start);
        assert_eq!(
            out,
            [query(&format!(
                "START_REPLICATION {} TIMELINE {timeline}",
                Lsn(start)
            ))]
        );
        let out = self.feed([BackendMessage::CopyBothResponse]);
        assert!(!out.iter().any(|o| matches!(o, Output::Streaming { .. })));
        // The first message of the stream confirms it.
        let out = self.feed([keepalive(start, false)]);
        assert_eq!(
            out,
            [Output::Streaming {
                timeline: TimelineId(timeline),
                start: Lsn(start)
            }]
        );
        assert_eq!(self.s.status().status, ReceiverState::Streaming);
        assert!(self.s.is_streaming());
    }
}

fn query(q: &str) -> Output {
    Output::Send(FrontendMessage::Query(q.to_string()))
}

fn ready(mut msgs: Vec<BackendMessage>) -> Vec<BackendMessage> {
    msgs.push(BackendMessage::ReadyForQuery(TransactionStatus::Idle));
    msgs
}

fn xlog(start: u64, len: usize) -> BackendMessage {
    BackendMessage::XLogData(XLogData {
        wal_start: Lsn(start),
        wal_end: Lsn(start + len as u64),
        send_time: PgTimestamp::now(),
        data: Bytes::from(vec![0x78; len]),
    })
}

fn keepalive(wal_end: u64, reply_requested: bool) -> BackendMessage {
    BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
        wal_end: Lsn(wal_end),
        send_time: PgTimestamp::now(),
        reply_requested,
    })
}

/// The status updates among `out`: (write, flush, apply, reply_requested).
fn updates(out: &[Output]) -> Vec<(Lsn, Lsn, Lsn, bool)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send(FrontendMessage::StandbyStatusUpdate(u)) => {
                Some((u.write, u.flush, u.apply, u.reply_requested))
            }
            _ => None,
        })
        .collect()
}

fn stop_of(out: &[Output]) -> &ReceiverError {
    match out.last() {
        Some(Output::Stop(e)) => e,
        other => panic!("expected a stop, got {other:?} in {out:?}"),
    }
}

fn history(entries: &[(u32, u64)]) -> Bytes {
    let entries: Vec<HistoryEntry> = entries
        .iter()
        .map(|&(p, s)| HistoryEntry {
            parent: TimelineId(p),
            switch_lsn: Lsn(s),
            reason: "no recovery target specified".into(),
        })
        .collect();
    Bytes::from(format_history(&entries))
}

#[test]
fn refuses_an_upstream_with_another_system_identifier() {
    let mut h = Harness::new(config(), 1, 0x300_0000);
    h.connect();
    let out = h.identified(SystemId(42), 1, 0x500_0000);
    let e = stop_of(&out);
    assert_eq!(
        *e,
        ReceiverError::SystemIdMismatch {
            local: SYSTEM,
            upstream: SystemId(42)
        }
    );
    let text = e.to_string();
    assert!(
        text.contains("7713831534704266365") && text.contains("42"),
        "{text}"
    );
    assert!(h.s.is_closed());
    // Nothing more happens on a closed session.
    assert!(h.feed([keepalive(1, true)]).is_empty());
    assert_eq!(h.s.next_deadline(), None);
}

#[test]
fn refuses_an_upstream_behind_our_timeline() {
    let mut h = Harness::new(config(), 3, 0x300_0000);
    h.connect();
    let out = h.identified(SYSTEM, 2, 0x500_0000);
    assert_eq!(
        *stop_of(&out),
        ReceiverError::UpstreamBehind {
            local: TimelineId(3),
            upstream: TimelineId(2)
        }
    );
}

#[test]
fn starts_at_the_durable_end_with_the_slot_quoted() {
    let cfg = SessionConfig {
        slot_name: Some("standby_1".into()),
        ..config()
    };
    let mut h = Harness::new(cfg, 1, 0x300_0128);
    h.connect();
    let out = h.identified(SYSTEM, 1, 0x500_0000);
    assert_eq!(
        out,
        [query(
            "START_REPLICATION SLOT \"standby_1\" 0/3000128 TIMELINE 1"
        )]
    );
}

#[test]
fn fetches_the_history_files_it_lacks_and_streams_its_own_timeline_first() {
    let mut h = Harness::new(config(), 1, 0x300_0000);
    h.connect();
    let out = h.identified(SYSTEM, 3, 0x900_0000);
    assert_eq!(
        out,
        [Output::Run(StorageOp::ReadHistoryFiles(vec![
            TimelineId(2),
            TimelineId(3)
        ]))]
    );
    // Timeline 2's file is stored here already; 3's is fetched.
    let h2 = history(&[(1, 0x4025A50)]);
    let h3 = history(&[(1, 0x4025A50), (2, 0x700_0000)]);
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![
        (TimelineId(2), Some(h2.clone())),
        (TimelineId(3), None),
    ])));
    assert_eq!(out, [query("TIMELINE_HISTORY 3")]);
    let out = h.feed(ready(results::timeline_history(TimelineId(3), h3.clone())));
    assert_eq!(
        out,
        [Output::Run(StorageOp::StoreHistoryFile {
            timeline: TimelineId(3),
            content: h3
        })]
    );
    // Our timeline 1 ends at 0/4025A50 upstream and we are below it: stream it first.
    let out = h.done(Ok(StorageDone::HistoryStored(TimelineId(3))));
    assert_eq!(out, [query("START_REPLICATION 0/3000000 TIMELINE 1")]);
}

#[test]
fn at_a_switch_point_it_follows_at_once() {
    let mut h = Harness::new(config(), 1, 0x4025A50);
    h.connect();
    h.identified(SYSTEM, 3, 0x900_0000);
    let h2 = history(&[(1, 0x4025A50)]);
    let h3 = history(&[(1, 0x4025A50), (2, 0x700_0000)]);
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![
        (TimelineId(2), Some(h2.clone())),
        (TimelineId(3), Some(h3.clone())),
    ])));
    assert_eq!(
        out,
        [Output::Run(StorageOp::FollowTimeline {
            timeline: TimelineId(2),
            history: h2,
            switch: Lsn(0x4025A50)
        })]
    );
    assert_eq!(h.s.status().status, ReceiverState::Waiting);
    let out = h.done(Ok(StorageDone::Followed {
        timeline: TimelineId(2),
        switch: Lsn(0x4025A50),
    }));
    assert_eq!(out, [query("START_REPLICATION 0/4025A50 TIMELINE 2")]);
    assert_eq!(h.s.timeline(), TimelineId(2));
}

#[test]
fn wal_beyond_the_switch_point_is_a_fork() {
    let mut h = Harness::new(config(), 1, 0x500_0000);
    h.connect();
    h.identified(SYSTEM, 2, 0x900_0000);
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![(
        TimelineId(2),
        Some(history(&[(1, 0x4025A50)])),
    )])));
    let e = stop_of(&out);
    assert_eq!(
        *e,
        ReceiverError::Forked {
            timeline: TimelineId(1),
            fork_lsn: Lsn(0x4025A50),
            local_end: Lsn(0x500_0000)
        }
    );
    assert!(e.to_string().contains("0/4025A50"), "{e}");
}

#[test]
fn a_timeline_outside_the_upstream_history_is_refused() {
    let mut h = Harness::new(config(), 2, 0x500_0000);
    h.connect();
    h.identified(SYSTEM, 3, 0x900_0000);
    // Timeline 3 branched from 1: our 2 is a sibling, not an ancestor.
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![(
        TimelineId(3),
        Some(history(&[(1, 0x400_0000)])),
    )])));
    assert_eq!(
        *stop_of(&out),
        ReceiverError::NotInUpstreamHistory {
            local: TimelineId(2),
            upstream: TimelineId(3)
        }
    );
}

/// History entries with their reasons.
fn entries(e: &[(u32, u64, &str)]) -> Vec<HistoryEntry> {
    e.iter()
        .map(|&(p, s, r)| HistoryEntry {
            parent: TimelineId(p),
            switch_lsn: Lsn(s),
            reason: r.into(),
        })
        .collect()
}

/// A node that began timeline 2 itself at 0/4000000 (a primary restarted after early sends),
/// now holding WAL up to 0/4800000 on it.
fn restarted_on_2() -> Harness {
    let own = entries(&[(1, 0x400_0000, "restarted after early sends at t1")]);
    Harness::with_history(overlapped_config(), 2, 0x480_0000, own)
}

fn overlapped_config() -> SessionConfig {
    SessionConfig {
        commit_overlap: true,
        ..config()
    }
}

#[test]
fn an_upstream_on_a_timeline_of_our_number_made_apart_is_refused_and_nothing_is_cut() {
    let mut h = restarted_on_2();
    h.connect();
    // The upstream was promoted to its own timeline 2 at the same point, and is a primary
    // whose end lies below ours: without the check this node would cut its tail to that end
    // and stream the upstream's other bytes after its own.
    let out = h.identified(SYSTEM, 2, 0x440_0000);
    assert_eq!(out, [query("TIMELINE_HISTORY 2")]);
    let theirs = entries(&[(1, 0x400_0000, "promoted by walserver at t2")]);
    let file = Bytes::from(format_history(&theirs));
    let out = h.feed(ready(results::timeline_history(TimelineId(2), file)));
    assert!(
        !out.iter().any(|o| matches!(
            o,
            Output::Run(StorageOp::CutBack { .. } | StorageOp::StoreHistoryFile { .. })
        )),
        "{out:?}"
    );
    let e = stop_of(&out);
    assert!(
        matches!(
            e,
            ReceiverError::TimelineClash {
                timeline: TimelineId(2),
                ..
            }
        ),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("restarted after early sends at t1")
            && text.contains("promoted by walserver at t2"),
        "{text}"
    );
    assert!(h.s.is_closed());
}

#[test]
fn an_upstream_on_our_own_timeline_is_checked_once_then_streamed_from() {
    let mut h = restarted_on_2();
    h.connect();
    let out = h.identified(SYSTEM, 2, 0x480_0000);
    assert_eq!(out, [query("TIMELINE_HISTORY 2")]);
    // The same file, byte for byte (the upstream fetched it from this node): compared, not
    // stored again.
    let own = entries(&[(1, 0x400_0000, "restarted after early sends at t1")]);
    let file = Bytes::from(format_history(&own));
    let out = h.feed(ready(results::timeline_history(TimelineId(2), file)));
    assert_eq!(out, [query("START_REPLICATION 0/4800000 TIMELINE 2")]);
}

#[test]
fn an_upstream_descended_from_a_timeline_of_our_number_made_apart_is_refused() {
    let mut h = restarted_on_2();
    h.connect();
    h.identified(SYSTEM, 3, 0x900_0000);
    // The upstream's timeline 3 descends from its own timeline 2, which switched from 1 where
    // ours did: only the reason tells the two apart.
    let theirs = entries(&[
        (1, 0x400_0000, "promoted by walserver at t2"),
        (2, 0x500_0000, "promoted by walserver at t3"),
    ]);
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![(
        TimelineId(3),
        Some(Bytes::from(format_history(&theirs))),
    )])));
    assert!(
        matches!(
            stop_of(&out),
            ReceiverError::TimelineClash {
                timeline: TimelineId(2),
                ..
            }
        ),
        "{out:?}"
    );
    // A descendant of our own timeline 2 is followed as before.
    let mut h = restarted_on_2();
    h.connect();
    h.identified(SYSTEM, 3, 0x900_0000);
    let mut ours = entries(&[(1, 0x400_0000, "restarted after early sends at t1")]);
    ours.push(HistoryEntry {
        parent: TimelineId(2),
        switch_lsn: Lsn(0x480_0000),
        reason: "promoted".into(),
    });
    let h3 = Bytes::from(format_history(&ours));
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![(
        TimelineId(3),
        Some(h3.clone()),
    )])));
    assert_eq!(
        out,
        [Output::Run(StorageOp::FollowTimeline {
            timeline: TimelineId(3),
            history: h3,
            switch: Lsn(0x480_0000)
        })]
    );
}

#[test]
fn writes_each_xlogdata_at_its_lsn_and_refuses_gaps() {
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.streaming(1, 0x100_0000);
    let out = h.feed([xlog(0x100_0000, 100), xlog(0x100_0064, 28)]);
    let writes: Vec<(Lsn, usize)> = out
        .iter()
        .filter_map(|o| match o {
            Output::Write { start, data } => Some((*start, data.len())),
            _ => None,
        })
        .collect();
    assert_eq!(writes, [(Lsn(0x100_0000), 100), (Lsn(0x100_0064), 28)]);
    assert_eq!(h.s.handed(), Lsn(0x100_0080));
    assert_eq!(h.s.status().written_lsn, Some(Lsn(0x100_0080)));
    // Writes alone send no status update: durability does.
    assert!(updates(&out).is_empty());
    let out = h.feed([xlog(0x100_0100, 8)]);
    assert!(matches!(stop_of(&out), ReceiverError::Protocol { .. }));
}

#[test]
fn answers_a_keepalive_that_asks_at_once() {
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.streaming(1, 0x100_0000);
    assert!(h.feed([keepalive(0x100_0000, false)]).is_empty());
    h.feed([xlog(0x100_0000, 0x80)]);
    let out = h.feed([keepalive(0x100_0080, true)]);
    assert_eq!(
        updates(&out),
        [(Lsn(0x100_0080), Lsn(0x100_0000), Lsn(0x100_0000), false)]
    );
    assert_eq!(h.s.status().latest_end_lsn, Some(Lsn(0x100_0080)));
}

#[test]
fn status_updates_follow_flushes_and_the_interval() {
    let mut h = Harness::new(config(), 1, 0x100_0000);
    let t0 = h.now;
    h.connect();
    h.identified(SYSTEM, 1, 0x100_0000);
    let out = h.feed([BackendMessage::CopyBothResponse]);
    // The start of a stream reports positions (asking for a reply, which confirms the stream)
    // and clears hot standby feedback.
    assert_eq!(
        updates(&out),
        [(Lsn(0x100_0000), Lsn(0x100_0000), Lsn(0x100_0000), true)]
    );
    assert!(out.iter().any(|o| matches!(
        o,
        Output::Send(FrontendMessage::HotStandbyFeedback(f)) if f.xmin == 0
    )));
    h.feed([xlog(0x100_0000, 0x1000)]);
    // A flush batch: report it.
    let out = h.position(1, 0x100_0800);
    assert_eq!(
        updates(&out),
        [(Lsn(0x100_1000), Lsn(0x100_0800), Lsn(0x100_0800), false)]
    );
    // The same position again, or one of another timeline: nothing.
    assert!(h.position(1, 0x100_0800).is_empty());
    assert!(h.position(2, 0x100_0900).is_empty());
    // With nothing new, the next update is due a status interval after the last.
    assert_eq!(h.s.next_deadline(), Some(t0 + Duration::from_secs(10)));
    assert!(h.tick_at(t0 + Duration::from_secs(5)).is_empty());
    let out = h.tick_at(t0 + Duration::from_secs(10));
    assert_eq!(
        updates(&out),
        [(Lsn(0x100_1000), Lsn(0x100_0800), Lsn(0x100_0800), false)]
    );
    assert_eq!(h.s.next_deadline(), Some(t0 + Duration::from_secs(20)));
    // An application reports what it applied: apply stops following flush.
    let mut out = Vec::new();
    h.s.on_applied(Lsn(0x100_0400), h.now, &mut out);
    assert_eq!(
        updates(&out),
        [(Lsn(0x100_1000), Lsn(0x100_0800), Lsn(0x100_0400), false)]
    );
    let out = h.position(1, 0x100_1000);
    assert_eq!(
        updates(&out),
        [(Lsn(0x100_1000), Lsn(0x100_1000), Lsn(0x100_0400), false)]
    );
}

#[test]
fn a_zero_status_interval_sends_only_requested_updates() {
    let cfg = SessionConfig {
        wal_receiver_status_interval: Duration::ZERO,
        wal_receiver_timeout: Duration::ZERO,
        ..config()
    };
    let mut h = Harness::new(cfg, 1, 0x100_0000);
    h.connect();
    h.identified(SYSTEM, 1, 0x100_0000);
    let out = h.feed([BackendMessage::CopyBothResponse]);
    // The stream's first update is forced, as PostgreSQL's is.
    assert_eq!(updates(&out).len(), 1);
    h.feed([xlog(0x100_0000, 0x80)]);
    assert!(h.position(1, 0x100_0080).is_empty());
    assert_eq!(h.s.next_deadline(), None);
    assert_eq!(updates(&h.feed([keepalive(0x100_0080, true)])).len(), 1);
}

#[test]
fn silence_asks_for_a_reply_then_times_out() {
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.streaming(1, 0x100_0000);
    let t0 = h.now;
    // The status interval (10 s) comes before half the timeout (30 s).
    h.tick_at(t0 + Duration::from_secs(10));
    h.tick_at(t0 + Duration::from_secs(20));
    assert_eq!(h.s.next_deadline(), Some(t0 + Duration::from_secs(30)));
    let out = h.tick_at(t0 + Duration::from_secs(30));
    assert_eq!(updates(&out).len(), 1);
    assert!(updates(&out)[0].3, "the ping asks for a reply");
    // A message resets the silence.
    h.now = t0 + Duration::from_secs(40);
    h.feed([keepalive(0x100_0000, false)]);
    assert!(h
        .s
        .next_deadline()
        .is_some_and(|d| d <= t0 + Duration::from_secs(70)));
    let out = h.tick_at(t0 + Duration::from_secs(70));
    assert!(updates(&out)[0].3);
    assert!(h
        .tick_at(t0 + Duration::from_secs(80))
        .iter()
        .all(|o| !matches!(o, Output::Stop(_))));
    let out = h.tick_at(t0 + Duration::from_secs(100));
    assert_eq!(
        *stop_of(&out),
        ReceiverError::Timeout { timeout_ms: 60_000 }
    );
}

#[test]
fn a_silent_upstream_times_out_before_streaming_too() {
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.connect();
    let t0 = h.now;
    assert_eq!(h.s.next_deadline(), Some(t0 + Duration::from_secs(60)));
    let out = h.tick_at(t0 + Duration::from_secs(60));
    assert!(matches!(stop_of(&out), ReceiverError::Timeout { .. }));
}

#[test]
fn an_error_during_copy_stops_with_its_sqlstate() {
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.streaming(1, 0x100_0000);
    let out = h.feed([BackendMessage::ErrorResponse(ErrorFields::error(
        SqlState::UNDEFINED_FILE,
        "requested WAL segment 000000010000000000000001 has already been removed",
    ))]);
    let e = stop_of(&out);
    assert_eq!(e.sqlstate(), Some("58P01"));
    assert!(e.to_string().contains("has already been removed"), "{e}");
}

#[test]
fn an_error_at_the_start_of_the_copy_is_no_stream() {
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.connect();
    h.identified(SYSTEM, 1, 0x900_0000);
    h.feed([BackendMessage::CopyBothResponse]);
    let out = h.feed([BackendMessage::ErrorResponse(ErrorFields::error(
        SqlState::UNDEFINED_FILE,
        "requested WAL segment 000000010000000000000001 has already been removed",
    ))]);
    // The owner hears of a stop, never of a stream that began.
    assert!(matches!(out[..], [Output::Stop(_)]), "{out:?}");
    assert_eq!(stop_of(&out).sqlstate(), Some("58P01"));
}

#[test]
fn an_error_before_copy_stops_too() {
    let mut h = Harness::new(
        SessionConfig {
            slot_name: Some("gone".into()),
            ..config()
        },
        1,
        0x100_0000,
    );
    h.connect();
    h.identified(SYSTEM, 1, 0x100_0000);
    let out = h.feed(ready(vec![BackendMessage::ErrorResponse(
        ErrorFields::error(
            SqlState::UNDEFINED_OBJECT,
            "replication slot \"gone\" does not exist",
        ),
    )]));
    assert_eq!(stop_of(&out).sqlstate(), Some("42704"));
}

#[test]
fn a_controlled_shutdown_of_the_upstream_is_a_close() {
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.streaming(1, 0x100_0000);
    let out = h.feed([BackendMessage::CommandComplete("COPY 0".into())]);
    assert!(matches!(
        stop_of(&out),
        ReceiverError::UpstreamClosed { .. }
    ));
}

#[test]
fn stop_says_goodbye_once() {
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.streaming(1, 0x100_0000);
    let mut out = Vec::new();
    h.s.stop(&mut out);
    assert_eq!(out, [Output::Send(FrontendMessage::Terminate)]);
    assert_eq!(h.s.status().status, ReceiverState::Stopping);
    out.clear();
    h.s.stop(&mut out);
    assert!(out.is_empty());
    // Stopping while still connecting has nobody to say goodbye to.
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.s.stop(&mut out);
    assert!(out.is_empty());
}

/// An upstream that switched timelines between IDENTIFY_SYSTEM and START_REPLICATION, with
/// our start exactly at the switch point, answers without a copy: the next timeline at once.
#[test]
fn a_timeline_that_ends_at_the_start_point_answers_without_a_copy() {
    let mut h = Harness::new(config(), 1, 0x280_0000);
    h.connect();
    let out = h.identified(SYSTEM, 1, 0x280_0000);
    assert_eq!(out, [query("START_REPLICATION 0/2800000 TIMELINE 1")]);
    let mut msgs = results::end_of_timeline(TimelineId(2), Lsn(0x280_0000));
    msgs.extend(results::end_of_streaming());
    let out = h.feed(ready(msgs));
    assert_eq!(
        out,
        [Output::Run(StorageOp::ReadHistoryFiles(vec![TimelineId(
            2
        )]))]
    );
    let h2 = history(&[(1, 0x280_0000)]);
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![(
        TimelineId(2),
        Some(h2.clone()),
    )])));
    assert_eq!(
        out,
        [Output::Run(StorageOp::FollowTimeline {
            timeline: TimelineId(2),
            history: h2,
            switch: Lsn(0x280_0000)
        })]
    );
}

/// Decodes the upstream's side of a real PostgreSQL 15 session: each read that the capture
/// kept whole (bulk WAL reads are cut at 4 KiB and skipped), after the authentication phase.
fn captured_upstream_messages(name: &str) -> Vec<Vec<BackendMessage>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../protocol-codec/testdata/pg15-captures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reads = Vec::new();
    for line in text.lines() {
        let rec: serde_json::Value = serde_json::from_str(line).unwrap();
        let hex = rec["hex"].as_str().unwrap();
        let len = rec["len"].as_u64().unwrap() as usize;
        if rec["dir"] != "s2c" || hex.len() != 2 * len || len < 5 {
            continue;
        }
        let bytes: Vec<u8> = (0..len)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let mut buf = BytesMut::from(&bytes[..]);
        let mut msgs = Vec::new();
        while let Some(m) = ClientCodec::new().decode(&mut buf).unwrap() {
            msgs.push(m);
        }
        assert!(buf.is_empty(), "a whole read decodes to whole messages");
        if !matches!(msgs[0], BackendMessage::Authentication(_)) {
            reads.push(msgs);
        }
    }
    reads
}

/// The timeline switch as a real PostgreSQL 15 upstream did it (a cascading standby whose
/// upstream was promoted): our session answers the same way PostgreSQL's walreceiver did, up
/// to the restart on timeline 2, which it makes at the switch point instead of the segment
/// start. The same under the overlapped commit: the upstream's end from IDENTIFY_SYSTEM is of
/// timeline 1, and says nothing of where timeline 2 is shared, so nothing is cut there.
#[test]
fn follows_a_timeline_switch_as_postgresql_sends_it() {
    follows_a_timeline_switch_with(config());
    follows_a_timeline_switch_with(SessionConfig {
        commit_overlap: true,
        ..config()
    });
}

fn follows_a_timeline_switch_with(config: SessionConfig) {
    let reads = captured_upstream_messages("pg15-cascade-timeline-switch.1.jsonl");
    let mut reads = reads.into_iter();
    let mut h = Harness::new(config, 1, 0x500_0000);
    h.connect();
    // IDENTIFY_SYSTEM's answer, then START_REPLICATION as the standby sent it.
    let out = h.feed(reads.next().unwrap());
    assert_eq!(out, [query("START_REPLICATION 0/5000000 TIMELINE 1")]);
    let out = h.feed(reads.next().unwrap());
    assert!(!out.iter().any(|o| matches!(o, Output::Streaming { .. })));
    // The WAL of the cut reads, up to the switch point 0/5046A00.
    let out = h.feed([xlog(0x500_0000, 0x46A00)]);
    assert!(matches!(
        out[..],
        [Output::Streaming { .. }, Output::Write { .. }]
    ));
    // The upstream's CopyDone: we answer CopyDone and wait.
    let out = h.feed(reads.next().unwrap());
    assert_eq!(out, [Output::Send(FrontendMessage::CopyDone)]);
    assert_eq!(h.s.status().status, ReceiverState::Waiting);
    // A keepalive the upstream sent before it saw our CopyDone is dropped, as libpq does.
    assert!(h.feed([keepalive(0x5046A00, false)]).is_empty());
    // next_tli 2 at 0/5046A00, two CommandCompletes, a ParameterStatus, ReadyForQuery.
    let out = h.feed(reads.next().unwrap());
    assert_eq!(
        out,
        [Output::Run(StorageOp::ReadHistoryFiles(vec![TimelineId(
            2
        )]))]
    );
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![(TimelineId(2), None)])));
    assert_eq!(out, [query("TIMELINE_HISTORY 2")]);
    let out = h.feed(reads.next().unwrap());
    let content = Bytes::from_static(b"1\t0/5046A00\tno recovery target specified\n");
    assert_eq!(
        out,
        [Output::Run(StorageOp::StoreHistoryFile {
            timeline: TimelineId(2),
            content: content.clone()
        })]
    );
    let out = h.done(Ok(StorageDone::HistoryStored(TimelineId(2))));
    assert_eq!(
        out,
        [Output::Run(StorageOp::FollowTimeline {
            timeline: TimelineId(2),
            history: content,
            switch: Lsn(0x5046A00)
        })]
    );
    let out = h.done(Ok(StorageDone::Followed {
        timeline: TimelineId(2),
        switch: Lsn(0x5046A00),
    }));
    assert_eq!(out, [query("START_REPLICATION 0/5046A00 TIMELINE 2")]);
    h.feed([BackendMessage::CopyBothResponse]);
    let out = h.feed([xlog(0x5046A00, 0x100)]);
    assert_eq!(
        out[0],
        Output::Streaming {
            timeline: TimelineId(2),
            start: Lsn(0x5046A00)
        }
    );
    assert_eq!(h.s.status().receive_start_tli, Some(TimelineId(2)));
    // Flushes on the new timeline are reported.
    assert_eq!(updates(&h.position(2, 0x5046B00)).len(), 1);
}

#[test]
fn a_failed_follow_names_the_fork() {
    let mut h = Harness::new(config(), 1, 0x280_0000);
    h.connect();
    h.identified(SYSTEM, 2, 0x300_0000);
    h.done(Ok(StorageDone::HistoryFiles(vec![(
        TimelineId(2),
        Some(history(&[(1, 0x280_0000)])),
    )])));
    let out = h.done(Err(WalError::Forked {
        fork_lsn: Lsn(0x280_0000),
        local_end: Lsn(0x290_0000),
    }));
    assert_eq!(
        *stop_of(&out),
        ReceiverError::Forked {
            timeline: TimelineId(1),
            fork_lsn: Lsn(0x280_0000),
            local_end: Lsn(0x290_0000)
        }
    );
}

/// A session of a standby under the overlapped commit whose WAL ends at `end` on timeline
/// 1, told the commit point `told`.
fn overlapped(end: u64, told: Option<u64>) -> Harness {
    let mut h = Harness::new(
        SessionConfig {
            commit_overlap: true,
            ..config()
        },
        1,
        end,
    );
    h.s.commit_point = told.map(Lsn);
    h
}

#[test]
fn the_commit_point_on_the_wire_is_passed_to_storage() {
    let mut h = overlapped(0x100_0000, None);
    h.streaming_overlapped(0x100_0000);
    let c = |c: u64| {
        BackendMessage::CommitPoint(CommitPoint {
            commit_point: Lsn(c),
            flushed: Lsn(c + 10),
        })
    };
    assert_eq!(
        h.feed([c(0x100_0010)]),
        [Output::CommitPoint(Some(Lsn(0x100_0010)))]
    );
    // A lower one (an upstream that knows less) does not lower what the session holds.
    h.feed([c(0x100_0008)]);
    assert_eq!(h.s.commit_point, Some(Lsn(0x100_0010)));
}

#[test]
fn a_stream_that_does_not_start_with_a_commit_point_carries_none() {
    let mut h = overlapped(0x100_0000, Some(0x80_0000));
    h.connect();
    h.identified(SYSTEM, 1, 0x100_0000);
    h.feed([BackendMessage::CopyBothResponse]);
    let out = h.feed([keepalive(0x100_0000, false)]);
    assert_eq!(out[0], Output::CommitPoint(None), "{out:?}");
    assert_eq!(h.s.commit_point, None);
    // Without a told point the first message changes nothing in storage (the switch off).
    let mut h = Harness::new(config(), 1, 0x100_0000);
    h.streaming(1, 0x100_0000);
}

#[test]
fn a_tail_longer_than_the_upstream_s_end_is_cut_back_at_stream_start() {
    let mut h = overlapped(0x100_0100, Some(0x100_0000));
    h.connect();
    let out = h.identified(SYSTEM, 1, 0x100_0040);
    assert_eq!(
        out,
        [Output::Run(StorageOp::CutBack {
            timeline: TimelineId(1),
            to: Lsn(0x100_0040)
        })]
    );
    let out = h.done(Ok(StorageDone::CutBack {
        to: Lsn(0x100_0040),
        bytes: 0xc0,
    }));
    assert_eq!(out, [query("START_REPLICATION 0/1000040 TIMELINE 1")]);
    assert_eq!(h.s.handed(), Lsn(0x100_0040));
    // The switch off: no cut, today's start (the upstream refuses it).
    let mut h = Harness::new(config(), 1, 0x100_0100);
    h.connect();
    let out = h.identified(SYSTEM, 1, 0x100_0040);
    assert_eq!(out, [query("START_REPLICATION 0/1000100 TIMELINE 1")]);
}

/// A standby upstream (a cascading one, or any the operator points this node at) on this
/// node's timeline has a shorter end only because it has not received the rest yet: this
/// node's tail may hold acknowledged appends, so it is kept, above its floor or not, and the
/// stream starts at its end, as with the switch off. The upstream refuses that start until it
/// has caught up; the refusal is a stop the owner retries. An upstream that did not say what
/// it is gets the same.
#[test]
fn a_tail_longer_than_a_standby_upstream_s_end_is_kept() {
    for role in [UpstreamRole::Standby, UpstreamRole::Unknown] {
        for told in [None, Some(0x100_0000), Some(0x100_0080)] {
            let mut h = overlapped(0x100_0100, told);
            h.role = role;
            h.connect();
            let out = h.identified(SYSTEM, 1, 0x100_0040);
            assert_eq!(
                out,
                [query("START_REPLICATION 0/1000100 TIMELINE 1")],
                "{role:?}, told {told:?}"
            );
            assert_eq!(h.s.handed(), Lsn(0x100_0100));
            // As a walserver or PostgreSQL upstream refuses it: in copy mode.
            h.feed([BackendMessage::CopyBothResponse]);
            let out = h.feed([BackendMessage::ErrorResponse(ErrorFields::error(
                SqlState::INTERNAL_ERROR,
                "requested starting point 0/1000100 is ahead of the WAL flush position of this server 0/1000040",
            ))]);
            assert!(matches!(out[..], [Output::Stop(_)]), "{out:?}");
            // The refusal said nothing of the commit point: the told one stays.
            assert_eq!(h.s.commit_point, told.map(Lsn));
        }
    }
    // A standby upstream that has caught up streams on from this node's end.
    let mut h = overlapped(0x100_0100, Some(0x100_0080));
    h.role = UpstreamRole::Standby;
    h.connect();
    let out = h.identified(SYSTEM, 1, 0x100_0200);
    assert_eq!(out, [query("START_REPLICATION 0/1000100 TIMELINE 1")]);
}

#[test]
fn a_cut_below_the_commit_point_is_refused() {
    let mut h = overlapped(0x100_0100, Some(0x100_0080));
    h.connect();
    let out = h.identified(SYSTEM, 1, 0x100_0040);
    assert_eq!(
        *stop_of(&out),
        ReceiverError::BelowCommitPoint {
            timeline: TimelineId(1),
            shared: Lsn(0x100_0040),
            commit_point: Lsn(0x100_0080),
            local_end: Lsn(0x100_0100),
        }
    );
    assert!(!out.iter().any(|o| matches!(o, Output::Run(_))));
}

#[test]
fn wal_beyond_a_switch_point_is_cut_back_to_it_under_the_overlapped_commit() {
    let mut h = overlapped(0x500_0000, Some(0x400_0000));
    h.connect();
    h.identified(SYSTEM, 2, 0x900_0000);
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![(
        TimelineId(2),
        Some(history(&[(1, 0x4025A50)])),
    )])));
    assert_eq!(
        out,
        [Output::Run(StorageOp::CutBack {
            timeline: TimelineId(1),
            to: Lsn(0x4025A50)
        })]
    );
    // Then it follows the switch as a node that ended there does.
    let out = h.done(Ok(StorageDone::CutBack {
        to: Lsn(0x4025A50),
        bytes: 0x500_0000 - 0x4025A50,
    }));
    assert!(
        matches!(&out[..], [Output::Run(StorageOp::FollowTimeline { switch, .. })] if *switch == Lsn(0x4025A50)),
        "{out:?}"
    );
    // Below the commit point: refused.
    let mut h = overlapped(0x500_0000, Some(0x450_0000));
    h.connect();
    h.identified(SYSTEM, 2, 0x900_0000);
    let out = h.done(Ok(StorageDone::HistoryFiles(vec![(
        TimelineId(2),
        Some(history(&[(1, 0x4025A50)])),
    )])));
    assert!(matches!(
        stop_of(&out),
        ReceiverError::BelowCommitPoint { .. }
    ));
}

/// An old primary pointed at the new one: what it wrote as a primary past the fork is never
/// cut at stream start, told point or not; the refusal names the fork and asks for a rejoin.
/// A tail past that end (received from an upstream since) is cut as any standby's.
#[test]
fn an_old_primary_s_tail_past_the_fork_is_refused_not_cut() {
    let fork = 0x4025A50;
    for told in [None, Some(0x400_0000)] {
        let mut h = overlapped(0x500_0000, told);
        h.s.primary_end = Some(Lsn(0x500_0000));
        h.connect();
        h.identified(SYSTEM, 2, 0x900_0000);
        let out = h.done(Ok(StorageDone::HistoryFiles(vec![(
            TimelineId(2),
            Some(history(&[(1, fork)])),
        )])));
        let e = stop_of(&out);
        assert_eq!(
            *e,
            ReceiverError::WroteAsPrimary {
                timeline: TimelineId(1),
                shared: Lsn(fork),
                primary_end: Lsn(0x500_0000),
                local_end: Lsn(0x500_0000),
            }
        );
        assert!(e.to_string().contains("forked") && e.to_string().contains("rejoin"));
        assert!(!out.iter().any(|o| matches!(o, Output::Run(_))));
    }
    // On the upstream's own timeline too: an upstream that lacks what it wrote.
    let mut h = overlapped(0x100_0100, None);
    h.s.primary_end = Some(Lsn(0x100_0080));
    h.connect();
    let out = h.identified(SYSTEM, 1, 0x100_0040);
    assert!(matches!(
        stop_of(&out),
        ReceiverError::WroteAsPrimary { .. }
    ));
    // Past that end only what an upstream sent since: cut to the shared point.
    let out = {
        let mut h = overlapped(0x100_0100, None);
        h.s.primary_end = Some(Lsn(0x100_0040));
        h.connect();
        h.identified(SYSTEM, 1, 0x100_0080)
    };
    assert_eq!(
        out,
        [Output::Run(StorageOp::CutBack {
            timeline: TimelineId(1),
            to: Lsn(0x100_0080)
        })]
    );
}

impl Harness {
    /// Like [`Harness::streaming`], on an upstream that carries the commit point.
    fn streaming_overlapped(&mut self, start: u64) {
        self.connect();
        self.identified(SYSTEM, 1, start);
        self.feed([BackendMessage::CopyBothResponse]);
        let out = self.feed([BackendMessage::CommitPoint(CommitPoint {
            commit_point: Lsn(start),
            flushed: Lsn(start),
        })]);
        assert_eq!(
            out,
            [
                Output::Streaming {
                    timeline: TimelineId(1),
                    start: Lsn(start)
                },
                Output::CommitPoint(Some(Lsn(start)))
            ]
        );
    }
}
