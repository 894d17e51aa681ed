//! The session's behaviour, driven with message sequences over real storage in a temporary
//! directory; the reads and commands it asks for are carried out as the actor would.

use bytes::Bytes;
use protocol_codec::client_settings::ClientSettings;
use protocol_codec::messages::{PrimaryKeepalive, StandbyStatusUpdate};
use protocol_codec::ACCEPTS_UNFLUSHED_PARAM;
use wal_storage::{InitOptions, StorageConfig, SystemId, Wal, WalFormat};

use super::*;
use crate::status::WalSenderState;
use crate::storage_ops;

struct Fixture {
    _dir: tempfile::TempDir,
    wal: Wal,
    session: Session<Wal>,
    t0: Instant,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StorageConfig {
        segment_size: 1 << 20,
        fsync: false,
        ..StorageConfig::default()
    };
    let wal = Wal::init(
        dir.path(),
        cfg,
        InitOptions::primary(SystemId(42), WalFormat::Walserver),
    )
    .unwrap();
    let config = Arc::new(SessionConfig {
        wal_sender_timeout: Duration::from_secs(60),
        show: Arc::new(vec![("wal_segment_size".into(), "1MB".into())]),
        commit_overlap: false,
    });
    let status = WalSenderStatus::new(1, "u", "app", "127.0.0.1:1".parse().unwrap()).shared();
    let session = Session::new(wal.clone(), config, status);
    Fixture {
        _dir: dir,
        wal,
        session,
        t0: Instant::now(),
    }
}

impl Fixture {
    fn query(&mut self, q: &str) -> Vec<Output> {
        let mut out = Vec::new();
        self.session
            .on_message(FrontendMessage::Query(q.into()), self.t0, &mut out);
        out
    }

    fn append(&self, n: usize, size: usize) -> Lsn {
        let payloads = (0..n).map(|i| Bytes::from(vec![i as u8; size])).collect();
        let ends = self.wal.append(payloads).unwrap().wait().unwrap();
        *ends.last().unwrap()
    }

    /// Performs the reads the session asks for until it asks for none.
    fn serve_reads(&mut self, mut out: Vec<Output>) -> Vec<Output> {
        let mut all = Vec::new();
        while let Some(i) = out.iter().position(|o| matches!(o, Output::Read { .. })) {
            let Output::Read {
                timeline,
                start,
                len,
            } = out.remove(i)
            else {
                unreachable!()
            };
            all.append(&mut out);
            let data = self.wal.read(timeline, start, len).map(WalData::from);
            self.session
                .on_wal_read(start, data, self.t0, usize::MAX, &mut out);
        }
        all.append(&mut out);
        all
    }
}

fn msgs(out: &[Output]) -> Vec<&BackendMessage> {
    out.iter()
        .filter_map(|o| match o {
            Output::Msg(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn error_code(out: &[Output]) -> Option<String> {
    msgs(out).into_iter().find_map(|m| match m {
        BackendMessage::ErrorResponse(f) => f.get(ErrorFields::CODE).map(str::to_string),
        _ => None,
    })
}

fn wal_bytes(out: &[Output]) -> Vec<(Lsn, usize)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Wal(x) => Some((x.wal_start, x.data.len())),
            _ => None,
        })
        .collect()
}

fn is_ready(m: &BackendMessage) -> bool {
    matches!(m, BackendMessage::ReadyForQuery(_))
}

#[test]
fn identify_system_and_show() {
    let mut f = fixture();
    let out = f.query("IDENTIFY_SYSTEM");
    let m = msgs(&out);
    assert!(matches!(m[0], BackendMessage::RowDescription(_)));
    let BackendMessage::DataRow(row) = m[1] else {
        panic!()
    };
    assert_eq!(row[0].as_deref(), Some(&b"42"[..]));
    assert_eq!(row[1].as_deref(), Some(&b"1"[..]));
    assert_eq!(
        row[2].as_deref(),
        Some(f.wal.flushed().to_string().as_bytes())
    );
    assert!(is_ready(m[3]));
    let out = f.query("SHOW WAL_SEGMENT_SIZE");
    let BackendMessage::DataRow(row) = msgs(&out)[1] else {
        panic!()
    };
    assert_eq!(row[0].as_deref(), Some(&b"1MB"[..]));
    assert_eq!(
        error_code(&f.query("SHOW nonsense")).as_deref(),
        Some("42704")
    );
    assert_eq!(error_code(&f.query("SELECT 1")).as_deref(), Some("0A000"));
    let base_backup = f.query("BASE_BACKUP");
    assert_eq!(error_code(&base_backup).as_deref(), Some("0A000"));
    // The refusal says where a base backup comes from instead.
    let hint = msgs(&base_backup).into_iter().find_map(|m| match m {
        BackendMessage::ErrorResponse(f) => f.get(ErrorFields::HINT).map(str::to_string),
        _ => None,
    });
    let hint = hint.expect("BASE_BACKUP's error has a HINT");
    assert!(
        hint.contains("pg_basebackup") && hint.contains("primary_conninfo"),
        "{hint}"
    );
    assert_eq!(
        error_code(&f.query("START_REPLICATION garbage")).as_deref(),
        Some("42601")
    );
    // Every answer ends with ReadyForQuery: the connection stays usable.
    assert!(is_ready(msgs(&f.query("SELECT 1")).last().unwrap()));
}

#[test]
fn start_ahead_of_flush_errors_inside_copy_and_keeps_the_connection() {
    let mut f = fixture();
    let end = f.wal.flushed();
    let out = f.query(&format!("START_REPLICATION {}", end + 0x100));
    let m = msgs(&out);
    assert_eq!(m[0], &BackendMessage::CopyBothResponse);
    let BackendMessage::ErrorResponse(e) = m[1] else {
        panic!("{m:?}")
    };
    assert_eq!(e.get(ErrorFields::CODE), Some("XX000"));
    assert!(e
        .message()
        .unwrap()
        .contains("is ahead of the WAL flush position of this server"));
    assert!(is_ready(m[2]));
    assert!(!f.session.is_streaming());
    assert!(!f.query("IDENTIFY_SYSTEM").is_empty());
}

#[test]
fn streams_in_page_aligned_chunks_of_at_most_128k() {
    let mut f = fixture();
    let start = f.wal.flushed();
    let end = f.append(40, 10_000);
    let out = f.query(&format!("START_REPLICATION {start}"));
    let out = f.serve_reads(out);
    let chunks = wal_bytes(&out);
    let mut at = start;
    for (i, (s, n)) in chunks.iter().enumerate() {
        assert_eq!(*s, at);
        assert!(*n <= MAX_SEND_SIZE);
        if i + 1 < chunks.len() && *n == MAX_SEND_SIZE {
            assert_eq!((s.0 + *n as u64) % PAGE_SIZE, 0);
        }
        at = at + *n as u64;
    }
    assert_eq!(at, end);
    assert_eq!(f.session.status().state, WalSenderState::Streaming);
}

#[test]
fn copy_done_while_waiting_for_wal_ends_the_stream_at_once() {
    let mut f = fixture();
    let start = f.wal.flushed();
    let out = f.query(&format!("START_REPLICATION {start}"));
    // Caught up: no read in flight, waiting for WAL that does not exist yet.
    assert!(!out.iter().any(|o| matches!(o, Output::Read { .. })));
    let mut out = Vec::new();
    f.session
        .on_message(FrontendMessage::CopyDone, f.t0, &mut out);
    let m = msgs(&out);
    assert_eq!(m[0], &BackendMessage::CopyDone);
    assert_eq!(
        m[1],
        &BackendMessage::CommandComplete("START_STREAMING".into())
    );
    assert_eq!(
        m[2],
        &BackendMessage::CommandComplete("START_REPLICATION".into())
    );
    assert!(is_ready(m[3]));
    assert!(!f.session.is_streaming());
    // New WAL after the stream ended is not sent.
    f.append(1, 10);
    let mut out = Vec::new();
    f.session
        .on_wal_position(f.wal.position(), usize::MAX, &mut out);
    assert!(out.is_empty());
}

#[test]
fn copy_done_during_a_read_discards_it() {
    let mut f = fixture();
    let start = f.wal.flushed();
    f.append(3, 100);
    let out = f.query(&format!("START_REPLICATION {start}"));
    let Some(Output::Read {
        timeline,
        start: s,
        len,
    }) = out.into_iter().find(|o| matches!(o, Output::Read { .. }))
    else {
        panic!("no read")
    };
    let mut out = Vec::new();
    f.session
        .on_message(FrontendMessage::CopyDone, f.t0, &mut out);
    let mut late = Vec::new();
    f.session.on_wal_read(
        s,
        f.wal.read(timeline, s, len).map(WalData::from),
        f.t0,
        usize::MAX,
        &mut late,
    );
    assert!(late.is_empty(), "{late:?}");
}

#[test]
fn new_wal_is_sent_when_flushed() {
    let mut f = fixture();
    let start = f.wal.flushed();
    f.query(&format!("START_REPLICATION {start}"));
    let end = f.append(2, 50);
    let mut out = Vec::new();
    f.session
        .on_wal_position(f.wal.position(), usize::MAX, &mut out);
    let out = f.serve_reads(out);
    let chunks = wal_bytes(&out);
    assert_eq!(chunks.first().unwrap().0, start);
    let (s, n) = *chunks.last().unwrap();
    assert_eq!(s + n as u64, end);
}

#[test]
fn no_room_means_no_read() {
    let mut f = fixture();
    let start = f.wal.flushed();
    f.append(2, 50);
    f.query(&format!("START_REPLICATION {start}"));
    let mut out = Vec::new();
    f.session.on_wal_read(
        start,
        Ok(Bytes::from_static(b"x").into()),
        f.t0,
        0,
        &mut out,
    );
    assert!(!out.iter().any(|o| matches!(o, Output::Read { .. })));
    let mut out = Vec::new();
    f.session.pump(1, &mut out);
    assert!(
        out.iter().any(|o| matches!(o, Output::Read { len: 1, .. })),
        "{out:?}"
    );
}

#[test]
fn historic_timeline_ends_with_the_next_timeline() {
    let mut f = fixture();
    let start = f.wal.flushed();
    f.append(3, 1000);
    let (tli2, switch) = f.wal.promote("test").unwrap();
    assert_eq!(tli2, TimelineId(2));
    // Exactly at the switch point: no COPY at all.
    let out = f.query(&format!("START_REPLICATION {switch} TIMELINE 1"));
    let m = msgs(&out);
    assert!(!m.contains(&&BackendMessage::CopyBothResponse));
    let BackendMessage::DataRow(row) = m[1] else {
        panic!("{m:?}")
    };
    assert_eq!(row[0].as_deref(), Some(&b"2"[..]));
    assert_eq!(row[1].as_deref(), Some(switch.to_string().as_bytes()));
    // From before it: stream to the switch point, CopyDone, then after the client's CopyDone
    // the next-timeline result set.
    let out = f.query(&format!("START_REPLICATION {start} TIMELINE 1"));
    let out = f.serve_reads(out);
    let sent: u64 = wal_bytes(&out).iter().map(|(_, n)| *n as u64).sum();
    assert_eq!(start + sent, switch);
    assert_eq!(msgs(&out).last().unwrap(), &&BackendMessage::CopyDone);
    let mut out = Vec::new();
    f.session
        .on_message(FrontendMessage::CopyDone, f.t0, &mut out);
    let m = msgs(&out);
    assert!(matches!(m[0], BackendMessage::RowDescription(_)), "{m:?}");
    assert_eq!(
        m[2],
        &BackendMessage::CommandComplete("START_STREAMING".into())
    );
    // Beyond the switch point: the fork error, before COPY.
    let out = f.query(&format!("START_REPLICATION {} TIMELINE 1", switch + 8));
    assert_eq!(error_code(&out).as_deref(), Some("XX000"));
    assert!(!msgs(&out).contains(&&BackendMessage::CopyBothResponse));
    // Unknown timeline.
    assert_eq!(
        error_code(&f.query(&format!("START_REPLICATION {start} TIMELINE 7"))).as_deref(),
        Some("XX000")
    );
}

#[test]
fn streaming_timeline_that_ends_under_us_finishes_at_the_switch() {
    let mut f = fixture();
    let start = f.wal.flushed();
    f.query(&format!("START_REPLICATION {start}"));
    f.append(2, 100);
    let (_, switch) = f.wal.promote("test").unwrap();
    let mut out = Vec::new();
    f.session
        .on_wal_position(f.wal.position(), usize::MAX, &mut out);
    let out = f.serve_reads(out);
    let sent: u64 = wal_bytes(&out).iter().map(|(_, n)| *n as u64).sum();
    assert_eq!(start + sent, switch);
    assert_eq!(msgs(&out).last().unwrap(), &&BackendMessage::CopyDone);
}

#[test]
fn keepalive_at_half_timeout_then_disconnect() {
    let mut f = fixture();
    f.query(&format!("START_REPLICATION {}", f.wal.flushed()));
    let t0 = f.t0;
    assert_eq!(
        f.session.next_deadline(),
        Some(t0 + Duration::from_secs(30))
    );
    let mut out = Vec::new();
    f.session.on_tick(t0 + Duration::from_secs(29), &mut out);
    assert!(out.is_empty());
    f.session.on_tick(t0 + Duration::from_secs(30), &mut out);
    assert!(matches!(
        msgs(&out)[..],
        [BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
            reply_requested: true,
            ..
        })]
    ));
    assert_eq!(
        f.session.next_deadline(),
        Some(t0 + Duration::from_secs(60))
    );
    // A reply resets the clock.
    let mut out = Vec::new();
    let reply = StandbyStatusUpdate {
        write: Lsn(1),
        flush: Lsn(1),
        apply: Lsn(0),
        send_time: PgTimestamp::now(),
        reply_requested: true,
    };
    f.session.on_message(
        FrontendMessage::StandbyStatusUpdate(reply),
        t0 + Duration::from_secs(40),
        &mut out,
    );
    // reply_requested is answered with a keepalive that does not ask for one.
    assert!(msgs(&out).iter().any(|m| matches!(
        m,
        BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
            reply_requested: false,
            ..
        })
    )));
    assert_eq!(
        f.session.next_deadline(),
        Some(t0 + Duration::from_secs(70))
    );
    let mut out = Vec::new();
    f.session.on_tick(t0 + Duration::from_secs(101), &mut out);
    assert!(matches!(out.last(), Some(Output::Close)), "{out:?}");
}

#[test]
fn fast_shutdown_drains_and_waits_for_confirmation() {
    let mut f = fixture();
    let start = f.wal.flushed();
    let end = f.append(2, 100);
    let out = f.query(&format!("START_REPLICATION {start}"));
    f.serve_reads(out);
    let deadline = f.t0 + Duration::from_secs(10);
    let mut out = Vec::new();
    f.session
        .shutdown(ShutdownMode::Fast { deadline }, usize::MAX, &mut out);
    // Not confirmed yet: a keepalive asks for a reply, the connection stays.
    assert!(!out.iter().any(|o| matches!(o, Output::Close)));
    assert!(msgs(&out).iter().any(|m| matches!(
        m,
        BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
            reply_requested: true,
            ..
        })
    )));
    // pg_receivewal without a slot: write = end, flush = 0.
    let reply = StandbyStatusUpdate {
        write: end,
        flush: Lsn::INVALID,
        apply: Lsn::INVALID,
        send_time: PgTimestamp::now(),
        reply_requested: false,
    };
    let mut out = Vec::new();
    f.session
        .on_message(FrontendMessage::StandbyStatusUpdate(reply), f.t0, &mut out);
    let m = msgs(&out);
    assert_eq!(
        m.last().unwrap(),
        &&BackendMessage::CommandComplete("COPY 0".into())
    );
    assert!(!m.contains(&&BackendMessage::CopyDone));
    assert!(matches!(out.last(), Some(Output::Close)));
}

/// WAL made durable just before the shutdown, whose notification the walsender has not had
/// yet (the position watch and the shutdown race on the actor's thread), is still sent: the
/// drain takes the durable end from storage, not from the last notification.
#[test]
fn fast_shutdown_sends_wal_flushed_before_it_was_announced() {
    let mut f = fixture();
    let start = f.wal.flushed();
    let out = f.query(&format!("START_REPLICATION {start}"));
    assert!(wal_bytes(&f.serve_reads(out)).is_empty());
    // Durable, but no on_wal_position for it.
    let end = f.append(3, 100);
    let deadline = f.t0 + Duration::from_secs(10);
    let mut out = Vec::new();
    f.session
        .shutdown(ShutdownMode::Fast { deadline }, usize::MAX, &mut out);
    let out = f.serve_reads(out);
    assert!(
        !msgs(&out).contains(&&BackendMessage::CommandComplete("COPY 0".into())),
        "the copy ended before the WAL was sent: {out:?}"
    );
    let sent: usize = wal_bytes(&out).iter().map(|(_, n)| n).sum();
    assert_eq!(start + sent as u64, end, "{out:?}");
}

#[test]
fn fast_shutdown_gives_up_at_the_deadline() {
    let mut f = fixture();
    let start = f.wal.flushed();
    f.append(2, 100);
    let out = f.query(&format!("START_REPLICATION {start}"));
    f.serve_reads(out);
    let deadline = f.t0 + Duration::from_secs(1);
    let mut out = Vec::new();
    f.session
        .shutdown(ShutdownMode::Fast { deadline }, usize::MAX, &mut out);
    assert_eq!(f.session.next_deadline(), Some(deadline));
    let mut out = Vec::new();
    f.session.on_tick(deadline, &mut out);
    assert_eq!(error_code(&out).as_deref(), Some("57P01"));
    assert!(matches!(out.last(), Some(Output::Close)));
}

#[test]
fn shutdown_in_command_mode_is_fatal_at_once() {
    for mode in [
        ShutdownMode::Immediate,
        ShutdownMode::Fast {
            deadline: Instant::now(),
        },
    ] {
        let mut f = fixture();
        let mut out = Vec::new();
        f.session.shutdown(mode, usize::MAX, &mut out);
        assert_eq!(error_code(&out).as_deref(), Some("57P01"));
        assert!(matches!(out.last(), Some(Output::Close)));
    }
}

#[test]
fn slots_and_temporary_slots() {
    let mut f = fixture();
    let out = f.query("CREATE_REPLICATION_SLOT s1 TEMPORARY PHYSICAL (RESERVE_WAL)");
    let Some(Output::Run(cmd)) = out.into_iter().next() else {
        panic!()
    };
    assert!(f.session.is_busy());
    let result = storage_ops::run(cmd, &f.wal);
    let mut out = Vec::new();
    f.session.on_storage_done(result, &mut out);
    assert_eq!(f.session.temporary_slots(), ["s1"]);
    assert!(f.wal.slot("s1").is_ok());
    // READ_REPLICATION_SLOT of a missing slot: a row of NULLs.
    let out = f.query("READ_REPLICATION_SLOT nope");
    let BackendMessage::DataRow(row) = msgs(&out)[1] else {
        panic!()
    };
    assert!(row.iter().all(Option::is_none));
    // An ERROR drops the session's temporary slots, as in PostgreSQL.
    f.query("SHOW nonsense");
    assert!(f.wal.slot("s1").is_err());
    // A missing slot in START_REPLICATION.
    assert_eq!(
        error_code(&f.query("START_REPLICATION SLOT nope 0/1000000")).as_deref(),
        Some("42704")
    );
    assert_eq!(
        error_code(&f.query("CREATE_REPLICATION_SLOT \"Bad\" PHYSICAL")).as_deref(),
        Some("42602")
    );
}

#[test]
fn removed_wal_is_58p01() {
    let mut f = fixture();
    f.append(1, 10);
    // With 1 MiB segments the WAL begins at 0/100000; segment 0 never existed.
    let out = f.query("START_REPLICATION 0/80000");
    let out = f.serve_reads(out);
    let code = error_code(&out);
    assert_eq!(code.as_deref(), Some("58P01"), "{out:?}");
    let BackendMessage::ErrorResponse(e) = msgs(&out)
        .into_iter()
        .find(|m| matches!(m, BackendMessage::ErrorResponse(_)))
        .unwrap()
    else {
        unreachable!()
    };
    assert!(
        e.message()
            .unwrap()
            .starts_with("requested WAL segment 0000000100000000000000"),
        "{e:?}"
    );
}

#[test]
fn unknown_copy_data_is_fatal() {
    let mut f = fixture();
    f.query(&format!("START_REPLICATION {}", f.wal.flushed()));
    let mut out = Vec::new();
    f.session.on_message(
        FrontendMessage::CopyData(Bytes::from_static(b"zzz")),
        f.t0,
        &mut out,
    );
    assert_eq!(error_code(&out).as_deref(), Some("08P01"));
    assert!(matches!(out.last(), Some(Output::Close)));
}

#[test]
fn extended_query_messages_are_refused_and_skipped_until_sync() {
    let mut f = fixture();
    let mut send = |m: FrontendMessage| {
        let mut out = Vec::new();
        f.session.on_message(m, f.t0, &mut out);
        out
    };
    let parse = FrontendMessage::ExtendedQuery {
        tag: b'P',
        body: bytes::Bytes::from_static(b"\0IDENTIFY_SYSTEM\0\0\0"),
    };
    // The ERROR, without a ReadyForQuery: the client's Sync is still to come.
    let out = send(parse.clone());
    assert_eq!(error_code(&out).as_deref(), Some("08P01"));
    assert!(!msgs(&out).into_iter().any(is_ready));
    // Everything up to the Sync is skipped, a query and a Terminate included.
    for m in [
        parse,
        FrontendMessage::Query("IDENTIFY_SYSTEM".into()),
        FrontendMessage::Terminate,
    ] {
        assert!(send(m).is_empty());
    }
    let out = send(FrontendMessage::Sync);
    assert_eq!(msgs(&out).len(), 1);
    assert!(is_ready(msgs(&out)[0]));
    // And the session answers again.
    let out = send(FrontendMessage::FunctionCall(bytes::Bytes::new()));
    assert_eq!(error_code(&out).as_deref(), Some("08P01"));
    assert!(msgs(&out).into_iter().any(is_ready));
    assert!(send(FrontendMessage::Flush).is_empty());
    assert!(!f.session.is_closed());
}

#[test]
fn show_session_authorization_is_the_connections_user() {
    let f = fixture();
    let mut f = Fixture {
        session: f.session.with_user("alice"),
        ..f
    };
    let out = f.query("SHOW session_authorization");
    let BackendMessage::DataRow(row) = msgs(&out)[1] else {
        panic!("{out:?}")
    };
    assert_eq!(row[0].as_deref(), Some(&b"alice"[..]));
}

/// A session of a client that says whether it accepts unflushed WAL, on a node with the
/// overlapped commit on or off, in `sync_state`.
fn overlap_fixture(overlap: bool, accepts: Option<&str>, sync_state: &str) -> Fixture {
    let mut f = fixture();
    let mut config = (*f.session.config).clone();
    config.commit_overlap = overlap;
    let status = f.session.status.clone();
    let mut params = vec![("user".to_string(), "u".to_string())];
    if let Some(v) = accepts {
        params.push((ACCEPTS_UNFLUSHED_PARAM.to_string(), v.to_string()));
    }
    f.session = Session::new(f.wal.clone(), Arc::new(config), status.clone())
        .with_client_settings(ClientSettings::from_startup(&params).unwrap());
    lock(&status).sync_state = sync_state.to_string();
    f
}

/// How long a test waits for storage's background thread.
const DEADLINE: Duration = Duration::from_secs(10);

/// [`overlap_fixture`]'s session streaming from the flushed end; then storage announces a
/// written end 100 bytes beyond it. Returns the length of the read the session asks for
/// once storage's early-send mark is durable; before that it asks for none.
fn early_read(overlap: bool, accepts: Option<&str>, sync_state: &str) -> Option<usize> {
    let mut f = overlap_fixture(overlap, accepts, sync_state);
    let (end, pos) = f.stream_with_unflushed_tail();
    let mut announced = f.wal.subscribe();
    assert_eq!(f.read_past(end, pos), None, "sent before the mark");
    // The mark, asked for here too so that every case waits the same way.
    f.wal.mark_early_sends(pos.timeline);
    f.wait_marked(&mut announced);
    f.read_past(end, pos)
}

impl Fixture {
    /// Starts streaming at the flushed end; returns it, and a position whose written end is
    /// 100 bytes beyond it (a batch whose fdatasync runs).
    fn stream_with_unflushed_tail(&mut self) -> (Lsn, WalPosition) {
        let end = self.append(1, 100);
        let out = self.query(&format!("START_REPLICATION {end}"));
        self.serve_reads(out);
        let mut pos = self.wal.position();
        pos.written = end + 100;
        (end, pos)
    }

    /// Tells the session `pos`; returns the length of the read it asks for from `end`.
    fn read_past(&mut self, end: Lsn, pos: WalPosition) -> Option<usize> {
        let mut out = Vec::new();
        self.session.on_wal_position(pos, usize::MAX, &mut out);
        out.iter().find_map(|o| match o {
            Output::Read { start, len, .. } => {
                assert_eq!(*start, end);
                Some(*len)
            }
            _ => None,
        })
    }

    /// Waits, with a deadline, until storage's early-send mark names the current timeline,
    /// looking at each position storage announces (`rx`, subscribed before the mark was
    /// asked for: storage announces once it is durable).
    fn wait_marked(&self, rx: &mut tokio::sync::watch::Receiver<WalPosition>) {
        let tli = self.wal.timeline();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(DEADLINE, async {
                while self.wal.early_sends_marked() != Some(tli) {
                    rx.changed().await.expect("storage is open");
                }
            })
            .await
            .expect("the mark is durable in time")
        });
    }
}

/// Rule 5 holds only if a crash after an early send finds the mark: the first byte sent
/// past the flushed end waits until the mark naming the timeline is durable. Its write is
/// held inside storage's atomic write (the temp file, not yet synced or in place): nothing
/// is sent early, however often the session looks; once it is done, storage's announcement
/// lets the written tail go.
#[cfg(feature = "failpoints")]
#[test]
fn an_early_send_waits_until_the_mark_is_durable() {
    /// Releases the held point however the test ends, or storage's background thread,
    /// waiting there, would keep the fixture's storage from closing.
    struct Held(Arc<wal_storage::Failpoints>);
    impl Drop for Held {
        fn drop(&mut self) {
            self.0.release(wal_storage::FP_ATOMIC);
        }
    }
    let mut f = overlap_fixture(true, Some("on"), "sync");
    let tli = f.wal.timeline();
    let fp = f.wal.failpoints();
    let _held = Held(fp.clone());
    fp.hold(wal_storage::FP_ATOMIC);
    let (end, pos) = f.stream_with_unflushed_tail();
    let mut announced = f.wal.subscribe();
    assert_eq!(f.read_past(end, pos), None);
    assert!(
        fp.wait_until_held(wal_storage::FP_ATOMIC, DEADLINE),
        "the session asked for the mark"
    );
    assert_eq!(
        f.read_past(end, pos),
        None,
        "sent while the mark is written"
    );
    assert_eq!(f.wal.early_sends_marked(), None);
    fp.release(wal_storage::FP_ATOMIC);
    f.wait_marked(&mut announced);
    assert_eq!(f.wal.early_sends_marked(), Some(tli));
    assert_eq!(f.read_past(end, pos), Some(100));
}

/// The commit points a session's outputs tell.
fn told(out: &[Output]) -> Vec<Lsn> {
    msgs(out)
        .into_iter()
        .filter_map(|m| match m {
            BackendMessage::CommitPoint(c) => Some(c.commit_point),
            _ => None,
        })
        .collect()
}

/// Under the overlapped commit a synchronous standby's stream opens with the commit point,
/// and tells it again each time it moves, and only then: the primary's flush moving ahead
/// of it (once per commit, before the standby's reply moves the commit point) is no news
/// to the standby, and a message for it cost the standby's thread a wake-up per commit.
#[test]
fn the_commit_point_is_told_when_it_moves_and_only_then() {
    let mut f = overlap_fixture(true, Some("on"), "sync");
    let end = f.append(1, 100);
    let out = f.query(&format!("START_REPLICATION {end}"));
    assert_eq!(told(&out), [end], "the stream opens with it");
    f.serve_reads(out);
    let step = |f: &mut Fixture, flushed: Lsn, commit: Lsn| {
        let mut pos = f.wal.position();
        pos.written = flushed;
        pos.flushed = flushed;
        pos.commit = wal_storage::CommitBound::Own(commit);
        let mut out = Vec::new();
        f.session.on_wal_position(pos, usize::MAX, &mut out);
        told(&out)
    };
    // The primary's flush moved, the standby has not confirmed: nothing to tell.
    assert_eq!(step(&mut f, end + 100, end), []);
    // The standby confirmed: the commit point moved.
    assert_eq!(step(&mut f, end + 100, end + 100), [end + 100]);
    // Nothing moved.
    assert_eq!(step(&mut f, end + 100, end + 100), []);
    // Both moved at once (the standby confirmed first).
    assert_eq!(step(&mut f, end + 200, end + 200), [end + 200]);
}

#[test]
fn only_a_synchronous_standby_that_can_cut_back_is_sent_written_wal() {
    assert_eq!(early_read(true, Some("on"), "sync"), Some(100));
    assert_eq!(early_read(true, Some("on"), "quorum"), Some(100));
    // Everyone else waits for the flush: the switch off, a client that cannot cut back
    // (pg_receivewal, PostgreSQL), a standby not waited for.
    assert_eq!(early_read(false, Some("on"), "sync"), None);
    assert_eq!(early_read(true, None, "sync"), None);
    assert_eq!(early_read(true, Some("off"), "sync"), None);
    assert_eq!(early_read(true, Some("on"), "async"), None);
    assert_eq!(early_read(true, Some("on"), "potential"), None);
}
