//! A walreceiver's protocol logic after authentication, as a plain state machine: identify the
//! upstream, fetch the history files this node lacks, choose where to start, stream, answer
//! keepalives, report positions, and cross timeline switches without reconnecting. The actor
//! feeds it upstream messages, storage's flush progress, finished storage work, applied
//! positions and timer ticks, and carries out the [`Output`]s it returns. It does no I/O and
//! never blocks, so every behaviour here is testable with message sequences.
//!
//! The command sequence is PostgreSQL 15's walreceiver's (walreceiver.c and
//! libpqwalreceiver.c): `IDENTIFY_SYSTEM` (the system identifier must be ours), then
//! `TIMELINE_HISTORY t` for each timeline in (ours, upstream's] not stored here, then
//! `START_REPLICATION [SLOT "s"] X/X TIMELINE n`. One check is walserver's own: the
//! upstream's timeline must descend from this node's, history line for history line, so when
//! both are on one timeline past the first its history file is asked for too
//! (`TIMELINE_HISTORY` of our own timeline) and compared. A timeline of one number made on two
//! nodes apart (an operator promoted a standby while the old primary, restarted after early
//! sends, began one of its own) fails it, and the walreceiver refuses rather than take the
//! upstream's bytes for a continuation of its own. The start is this node's durable end on its
//! own timeline. When that timeline is an ancestor of the upstream's, the upstream streams it up
//! to the switch point and ends the copy: CopyDone both ways, a `next_tli`/`next_tli_startpos`
//! row, CommandComplete twice, ReadyForQuery. Then storage follows the switch and streaming goes
//! on at the switch point on the next timeline, on the same connection. When this node's end
//! is exactly a switch point it follows at once; beyond one, its WAL forked and it refuses.
//!
//! Status updates (`'r'`) go out when storage reports a newer durable end (after each flush
//! batch), every `wal_receiver_status_interval`, and at once when a keepalive asks. After half
//! of `wal_receiver_timeout` without a message from upstream the update asks for a reply; after
//! all of it the connection ends. These are the only timers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use protocol_codec::command::{quote_ident, ReplicationCommand};
use protocol_codec::messages::{HotStandbyFeedback, StandbyStatusUpdate};
use protocol_codec::{BackendMessage, FrontendMessage};
use wal_storage::{
    departs_from, describe_line, parse_history, HistoryEntry, Lsn, PgTimestamp, SystemId,
    TimelineId, WalError, WalPosition,
};

use crate::cutback::{self, Floor, TailDecision, UpstreamRole};
use crate::error::ReceiverError;
use crate::query::{self, describe, QueryResult, ResultCollector};
use crate::status::{ReceiverState, ReceiverStatus};

/// The settings a session reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// `primary_slot_name`: stream through this physical slot on the upstream.
    pub slot_name: Option<String>,
    /// End the connection after this long without a message from upstream; zero disables
    /// (PostgreSQL's 0).
    pub wal_receiver_timeout: Duration,
    /// Send a status update at least this often while streaming; zero disables all status
    /// updates except the ones the upstream asks for (PostgreSQL's 0).
    pub wal_receiver_status_interval: Duration,
    /// What to report as applied.
    pub apply: ApplyReporting,
    /// `synchronous_commit_overlap` on this node (on by default): at stream start, WAL beyond the point the
    /// upstream's history shares with this node's is cut back ([`crate::cutback`]) instead
    /// of refused as `Forked`.
    pub commit_overlap: bool,
}

impl Default for SessionConfig {
    fn default() -> SessionConfig {
        SessionConfig {
            slot_name: None,
            wal_receiver_timeout: Duration::from_secs(60),
            wal_receiver_status_interval: Duration::from_secs(10),
            apply: ApplyReporting::FollowFlush,
            commit_overlap: true,
        }
    }
}

/// Where the apply position of status updates comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyReporting {
    /// No application reports what it applied: apply = flush. The first
    /// [`crate::messages::Applied`] switches to [`ApplyReporting::Application`].
    FollowFlush,
    /// An application reports; it has applied up to `applied` so far. An owner that restarts
    /// a walreceiver passes what the application last reported, so `remote_apply` never sees
    /// a position nothing applied.
    Application { applied: Lsn },
}

/// What the session knows of local storage when it begins: a snapshot the actor takes from
/// memory (`LocalWal::of`, in `crate::storage_ops`), so the session never holds a `Wal`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalWal {
    pub system_id: SystemId,
    pub timeline: TimelineId,
    /// The durable end of `timeline`.
    pub flushed: Lsn,
    /// The end of what storage was handed, at or past `flushed`: where streaming starts. It
    /// is past `flushed` only after a fill from the archive that ended inside a record.
    pub written: Lsn,
    /// The commit point an upstream told this node, if storage holds one.
    pub commit_point: Option<Lsn>,
    /// Where the WAL this node wrote as a primary ends (`Wal::primary_end`).
    pub primary_end: Option<Lsn>,
    /// The ancestry of `timeline`, oldest first (`Wal::history`; empty on timeline 1).
    pub history: Vec<HistoryEntry>,
}

/// Storage work that touches files, for the actor to run on a blocking pool
/// (`crate::storage_ops::run`) and report with [`Session::on_storage_done`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageOp {
    /// Read the stored history files of these timelines (missing ones are `None`).
    ReadHistoryFiles(Vec<TimelineId>),
    /// Store a history file fetched from upstream, byte for byte.
    StoreHistoryFile {
        timeline: TimelineId,
        content: Bytes,
    },
    /// Switch storage to `timeline`, which began at `switch` (`Wal::follow_timeline`). Storage's
    /// writer runs it after every write handed to it before, so it sees them durable.
    FollowTimeline {
        timeline: TimelineId,
        history: Bytes,
        switch: Lsn,
    },
    /// Drop the unacknowledged tail of `timeline` beyond `to` (`Wal::truncate_to`), counting
    /// it in storage's metrics.
    CutBack { timeline: TimelineId, to: Lsn },
}

/// What a [`StorageOp`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageDone {
    HistoryFiles(Vec<(TimelineId, Option<Bytes>)>),
    HistoryStored(TimelineId),
    Followed {
        timeline: TimelineId,
        switch: Lsn,
    },
    /// `bytes` beyond `to` were dropped.
    CutBack {
        to: Lsn,
        bytes: u64,
    },
}

/// Work for the actor.
#[derive(Debug, PartialEq)]
pub enum Output {
    /// Send a message to the upstream.
    Send(FrontendMessage),
    /// Hand WAL to storage (`Wal::write`). `data` is a slice of the read buffer.
    Write { start: Lsn, data: Bytes },
    /// Run storage work on a blocking pool.
    Run(StorageOp),
    /// A stream began: tell the owner.
    Streaming { timeline: TimelineId, start: Lsn },
    /// The commit point the upstream told (`Wal::set_told_commit_point`); `None` for a
    /// stream that carries none.
    CommitPoint(Option<Lsn>),
    /// The connection is over: close it and tell the owner why.
    Stop(ReceiverError),
}

/// Replication commands this session sends and waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    IdentifySystem,
    TimelineHistory(TimelineId),
}

#[derive(Debug)]
enum Phase {
    /// The actor is still connecting and authenticating.
    Connecting,
    /// A command was sent; its result is being collected.
    Command(Command, ResultCollector),
    /// Storage work runs; the upstream has nothing to say meanwhile.
    Storage,
    /// START_REPLICATION was sent: CopyBothResponse, an error, or (for a timeline that ends
    /// right at `start`) the next-timeline result without a copy comes next.
    Starting {
        start: Lsn,
        collector: ResultCollector,
    },
    Streaming,
    /// The upstream ended the copy and we answered CopyDone: the next-timeline result follows.
    EndingCopy(ResultCollector),
    Closed,
}

/// One connection's protocol state.
///
/// Invariants: `flushed <= handed` once streaming has begun (storage makes durable only what
/// it was handed); both only grow, except that following a timeline sets both to its switch
/// point, which is where they already are; `timeline <= upstream_tli`.
pub struct Session {
    config: Arc<SessionConfig>,
    system_id: SystemId,
    phase: Phase,
    /// The timeline storage is on.
    timeline: TimelineId,
    /// The newest timeline the upstream has named.
    upstream_tli: TimelineId,
    /// History files of the timelines in (timeline, upstream_tli], as stored or fetched.
    histories: BTreeMap<TimelineId, Bytes>,
    /// Local history files have been looked for up to this timeline.
    checked_local: TimelineId,
    /// The ancestry of `timeline`, which the upstream's must continue
    /// ([`wal_storage::departs_from`]).
    own_history: Vec<HistoryEntry>,
    /// Whether the upstream's ancestry was found to continue `own_history`: asked once per
    /// connection, of the upstream's history file of `timeline` when the upstream is on it.
    own_checked: bool,
    /// The end of the WAL handed to storage.
    handed: Lsn,
    /// The durable end, as storage last reported it.
    flushed: Lsn,
    apply: ApplyReporting,
    /// The write/flush/apply of the last status update, and when it went out.
    reported: (Lsn, Lsn, Lsn),
    last_status: Instant,
    /// The last message from the upstream, or the last command sent, whichever is later: the
    /// start of the silence `wal_receiver_timeout` measures.
    last_receipt: Instant,
    ping_sent: bool,
    /// The start of a stream not yet announced to the owner.
    unannounced: Option<Lsn>,
    /// The highest commit point an upstream told this node, while storage holds one.
    commit_point: Option<Lsn>,
    /// Where the WAL this node wrote as a primary ends; only an explicit cut, never one
    /// made here, ends it.
    primary_end: Option<Lsn>,
    /// The upstream's timeline and durable end, from IDENTIFY_SYSTEM: the point their
    /// histories share while this node's timeline is that one. Once this node follows the
    /// upstream to a later timeline on the same connection, the end says nothing of it.
    upstream_end: Option<(TimelineId, Lsn)>,
    /// What the upstream said it is at connection start: only a primary's end is a point
    /// their histories share on its own timeline.
    upstream_role: UpstreamRole,
    /// Whether the current stream carries the commit point: unknown until its first message,
    /// which is one if it does.
    carries_commit_point: Option<bool>,
    status: ReceiverStatus,
}

impl Session {
    pub fn new(
        config: Arc<SessionConfig>,
        local: LocalWal,
        status: ReceiverStatus,
        now: Instant,
    ) -> Session {
        Session {
            apply: config.apply,
            config,
            system_id: local.system_id,
            phase: Phase::Connecting,
            timeline: local.timeline,
            upstream_tli: local.timeline,
            histories: BTreeMap::new(),
            checked_local: local.timeline,
            own_checked: local.history.is_empty(),
            own_history: local.history,
            handed: local.written.max(local.flushed),
            flushed: local.flushed,
            reported: (Lsn::INVALID, Lsn::INVALID, Lsn::INVALID),
            last_status: now,
            last_receipt: now,
            ping_sent: false,
            unannounced: None,
            commit_point: local.commit_point,
            primary_end: local.primary_end,
            upstream_end: None,
            upstream_role: UpstreamRole::Unknown,
            carries_commit_point: None,
            status,
        }
    }

    pub fn status(&self) -> &ReceiverStatus {
        &self.status
    }

    pub fn status_mut(&mut self) -> &mut ReceiverStatus {
        &mut self.status
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }

    pub fn is_streaming(&self) -> bool {
        matches!(self.phase, Phase::Streaming)
    }

    /// The timeline storage is on.
    pub fn timeline(&self) -> TimelineId {
        self.timeline
    }

    /// The newest timeline the upstream has named.
    pub fn upstream_timeline(&self) -> TimelineId {
        self.upstream_tli
    }

    /// The end of the WAL handed to storage so far.
    pub fn handed(&self) -> Lsn {
        self.handed
    }

    /// The ordering relations between positions.
    pub fn check_invariants(&self) {
        debug_assert!(self.timeline <= self.upstream_tli, "{:?}", self.timeline);
        debug_assert!(
            self.flushed <= self.handed || !self.is_streaming(),
            "flushed {} beyond handed {}",
            self.flushed,
            self.handed
        );
    }

    /// The connection is authenticated, to an upstream that said it is `role`: begin with
    /// IDENTIFY_SYSTEM.
    pub fn on_connected(&mut self, role: UpstreamRole, now: Instant, out: &mut Vec<Output>) {
        if matches!(self.phase, Phase::Connecting) {
            self.upstream_role = role;
            self.command(Command::IdentifySystem, now, out);
        }
    }

    fn command(&mut self, cmd: Command, now: Instant, out: &mut Vec<Output>) {
        let text = match cmd {
            Command::IdentifySystem => ReplicationCommand::IdentifySystem,
            Command::TimelineHistory(timeline) => ReplicationCommand::TimelineHistory { timeline },
        };
        out.push(Output::Send(FrontendMessage::Query(text.to_string())));
        self.last_receipt = now;
        self.phase = Phase::Command(cmd, ResultCollector::default());
    }

    /// A message from the upstream.
    pub fn on_message(&mut self, msg: BackendMessage, now: Instant, out: &mut Vec<Output>) {
        self.last_receipt = now;
        self.ping_sent = false;
        self.status.last_msg_receipt_time = Some(SystemTime::now());
        let result = match &mut self.phase {
            Phase::Closed => return,
            Phase::Streaming => return self.on_stream_message(msg, now, out),
            Phase::Starting { .. } if msg == BackendMessage::CopyBothResponse => {
                return self.begin_streaming(now, out)
            }
            // The upstream may still answer a status update after its CopyDone (PostgreSQL's
            // walsender does too); libpq drops such copy data once the copy is over.
            Phase::EndingCopy(_)
                if matches!(
                    msg,
                    BackendMessage::PrimaryKeepalive(_)
                        | BackendMessage::XLogData(_)
                        | BackendMessage::CommitPoint(_)
                        | BackendMessage::CopyData(_)
                ) =>
            {
                return
            }
            Phase::Command(_, c) | Phase::Starting { collector: c, .. } | Phase::EndingCopy(c) => {
                c.feed(msg)
            }
            // Nothing was asked: only reports the upstream may send at any time are expected.
            Phase::Connecting | Phase::Storage => match msg {
                BackendMessage::ParameterStatus { .. } | BackendMessage::NoticeResponse(_) => {
                    Ok(None)
                }
                BackendMessage::ErrorResponse(e) => Err(ReceiverError::upstream(&e)),
                other => Err(ReceiverError::protocol(format!(
                    "unexpected {} while no command was running",
                    describe(&other)
                ))),
            },
        };
        match result {
            Err(e) => self.fail(e, out),
            Ok(None) => {}
            Ok(Some(r)) => match std::mem::replace(&mut self.phase, Phase::Storage) {
                Phase::Command(cmd, _) => self.on_command_done(cmd, r, now, out),
                Phase::Starting { .. } | Phase::EndingCopy(_) => self.on_stream_ended(r, now, out),
                other => self.phase = other,
            },
        }
    }

    fn on_command_done(
        &mut self,
        cmd: Command,
        r: QueryResult,
        now: Instant,
        out: &mut Vec<Output>,
    ) {
        match cmd {
            Command::IdentifySystem => {
                let id = match query::identify_system(&r) {
                    Ok(id) => id,
                    Err(e) => return self.fail(e, out),
                };
                if id.system_id != self.system_id {
                    return self.fail(
                        ReceiverError::SystemIdMismatch {
                            local: self.system_id,
                            upstream: id.system_id,
                        },
                        out,
                    );
                }
                if id.timeline < self.timeline {
                    return self.fail(
                        ReceiverError::UpstreamBehind {
                            local: self.timeline,
                            upstream: id.timeline,
                        },
                        out,
                    );
                }
                self.upstream_tli = id.timeline;
                self.upstream_end = Some((id.timeline, id.xlogpos));
                self.advance(now, out);
            }
            Command::TimelineHistory(tli) => {
                let content = match query::timeline_history(&r, tli) {
                    Ok(c) => c,
                    Err(e) => return self.fail(e, out),
                };
                let entries = match parse_history(&content) {
                    Ok(entries) => entries,
                    Err(e) => {
                        return self.fail(
                            ReceiverError::protocol(format!("history file of timeline {tli}: {e}")),
                            out,
                        )
                    }
                };
                if tli == self.timeline {
                    // Asked to compare with this node's own (`advance`), not to store.
                    self.own_checked = true;
                    if let Some(e) = self.clash(&entries) {
                        return self.fail(e, out);
                    }
                    return self.advance(now, out);
                }
                self.histories.insert(tli, content.clone());
                self.phase = Phase::Storage;
                out.push(Output::Run(StorageOp::StoreHistoryFile {
                    timeline: tli,
                    content,
                }));
            }
        }
    }

    /// Storage work asked for with [`Output::Run`] finished.
    pub fn on_storage_done(
        &mut self,
        result: Result<StorageDone, WalError>,
        now: Instant,
        out: &mut Vec<Output>,
    ) {
        if !matches!(self.phase, Phase::Storage) {
            return; // The connection ended while it ran.
        }
        self.last_receipt = now;
        match result {
            Err(e) => {
                let e = ReceiverError::storage(e, self.timeline);
                return self.fail(e, out);
            }
            Ok(StorageDone::HistoryFiles(files)) => {
                for (tli, content) in files {
                    if let Some(c) = content {
                        self.histories.insert(tli, c);
                    }
                }
            }
            Ok(StorageDone::HistoryStored(_)) => {}
            Ok(StorageDone::CutBack { to, bytes }) => {
                tracing::warn!(timeline = %self.timeline, %to, bytes, "cut back this node's unacknowledged WAL to the point its upstream's history shares");
                self.handed = to;
                self.flushed = self.flushed.min(to);
                self.status.written_lsn = Some(self.handed);
                self.status.flushed_lsn = Some(self.flushed);
            }
            Ok(StorageDone::Followed { timeline, switch }) => {
                tracing::info!(%timeline, %switch, "walreceiver followed the upstream to a new timeline");
                // The upstream's own history of the timeline followed, stored as it is.
                if let Some(Ok(entries)) = self.histories.get(&timeline).map(|h| parse_history(h)) {
                    self.own_history = entries;
                }
                self.timeline = timeline;
                self.handed = switch;
                self.flushed = self.flushed.max(switch);
                self.histories.retain(|t, _| *t > timeline);
                self.status.received_tli = Some(timeline);
                self.status.flushed_lsn = Some(self.flushed);
            }
        }
        self.advance(now, out);
    }

    /// The refusal of an upstream whose timeline's ancestry `theirs` does not continue this
    /// node's: the two hold a timeline of one number made apart, whose WAL may differ at the
    /// same LSNs, so no point of this node's timeline is known to be shared.
    fn clash(&self, theirs: &[HistoryEntry]) -> Option<ReceiverError> {
        let i = departs_from(&self.own_history, theirs)?;
        Some(ReceiverError::TimelineClash {
            timeline: self.timeline,
            local: describe_line(self.own_history.get(i)),
            upstream: describe_line(theirs.get(i)),
        })
    }

    /// Decides the next step towards streaming: look for local history files, fetch the
    /// missing ones, then start, follow a switch, or refuse a fork.
    fn advance(&mut self, now: Instant, out: &mut Vec<Output>) {
        let upstream = self.upstream_tli;
        if self.checked_local < upstream {
            let from = self.checked_local.max(self.timeline).0 + 1;
            self.checked_local = upstream;
            let want: Vec<TimelineId> = (from..=upstream.0)
                .map(TimelineId)
                .filter(|t| !self.histories.contains_key(t))
                .collect();
            if !want.is_empty() {
                self.phase = Phase::Storage;
                out.push(Output::Run(StorageOp::ReadHistoryFiles(want)));
                return;
            }
        }
        let missing = (self.timeline.0 + 1..=upstream.0)
            .map(TimelineId)
            .find(|t| !self.histories.contains_key(t));
        if let Some(tli) = missing {
            return self.command(Command::TimelineHistory(tli), now, out);
        }
        if self.timeline == upstream {
            if !self.own_checked {
                // Is the upstream's timeline of this number the one this node holds?
                return self.command(Command::TimelineHistory(upstream), now, out);
            }
            let shared = self.upstream_end.filter(|&(t, _)| t == self.timeline);
            if let Some((_, end)) = shared.filter(|_| self.config.commit_overlap) {
                let role = self.upstream_role;
                if self.cut_back(
                    end,
                    |local, floor| cutback::decide_on_same_timeline(local, role, end, floor),
                    out,
                ) {
                    return;
                }
            }
            return self.start_replication(now, out);
        }
        let entries = match parse_history(&self.histories[&upstream]) {
            Ok(e) => e,
            Err(e) => {
                return self.fail(
                    ReceiverError::protocol(format!("history file of timeline {upstream}: {e}")),
                    out,
                )
            }
        };
        if let Some(e) = self.clash(&entries) {
            return self.fail(e, out);
        }
        let Some((switch, child)) = switch_from(&entries, self.timeline, upstream) else {
            return self.fail(
                ReceiverError::NotInUpstreamHistory {
                    local: self.timeline,
                    upstream,
                },
                out,
            );
        };
        if self.handed > switch && self.config.commit_overlap {
            self.cut_back(
                switch,
                |local, floor| cutback::decide(local, switch, floor),
                out,
            );
            return;
        }
        if self.handed > switch {
            return self.fail(
                ReceiverError::Forked {
                    timeline: self.timeline,
                    fork_lsn: switch,
                    local_end: self.handed,
                },
                out,
            );
        }
        if self.handed < switch {
            // Receive the rest of our timeline first; the upstream ends the copy at `switch`.
            return self.start_replication(now, out);
        }
        let Some(history) = self.histories.get(&child).cloned() else {
            return self.fail(
                ReceiverError::protocol(format!(
                    "the history of timeline {upstream} names timeline {child}, which is outside ({}, {upstream}]",
                    self.timeline
                )),
                out,
            );
        };
        self.status.status = ReceiverState::Waiting;
        self.phase = Phase::Storage;
        out.push(Output::Run(StorageOp::FollowTimeline {
            timeline: child,
            history,
            switch,
        }));
    }

    /// Rule 4 of the overlapped commit ([`crate::cutback`]): cuts this node's WAL back to
    /// the highest point its history shares with the upstream's, `shared`, as `decide` says
    /// from this node's end and floor, or refuses when that is below the commit point it was
    /// told or the end of what it wrote as a primary. Returns whether it did either (storage
    /// work runs, or the connection ends).
    fn cut_back(
        &mut self,
        shared: Lsn,
        decide: impl FnOnce(Lsn, Lsn) -> TailDecision,
        out: &mut Vec<Output>,
    ) -> bool {
        let floor = Floor::of(self.commit_point, self.primary_end);
        match decide(self.handed, floor.lsn()) {
            TailDecision::Keep => false,
            TailDecision::Cut { to, .. } => {
                self.phase = Phase::Storage;
                out.push(Output::Run(StorageOp::CutBack {
                    timeline: self.timeline,
                    to,
                }));
                true
            }
            TailDecision::Refuse => {
                let (timeline, local_end) = (self.timeline, self.handed);
                let e = match floor {
                    Floor::WroteAsPrimary(primary_end) => ReceiverError::WroteAsPrimary {
                        timeline,
                        shared,
                        primary_end,
                        local_end,
                    },
                    _ => ReceiverError::BelowCommitPoint {
                        timeline,
                        shared,
                        commit_point: floor.lsn(),
                        local_end,
                    },
                };
                self.fail(e, out);
                true
            }
        }
    }

    /// START_REPLICATION of this node's timeline from the end of what it has.
    fn start_replication(&mut self, now: Instant, out: &mut Vec<Output>) {
        let (timeline, start) = (self.timeline, self.handed);
        out.push(Output::Send(FrontendMessage::Query(
            start_replication_command(self.config.slot_name.as_deref(), start, timeline),
        )));
        self.last_receipt = now;
        self.phase = Phase::Starting {
            start,
            collector: ResultCollector::default(),
        };
    }

    fn begin_streaming(&mut self, now: Instant, out: &mut Vec<Output>) {
        let Phase::Starting { start, .. } = self.phase else {
            return;
        };
        self.phase = Phase::Streaming;
        self.unannounced = Some(start);
        self.carries_commit_point = None;
        self.status.receive_start_lsn = Some(start);
        self.status.receive_start_tli = Some(self.timeline);
        self.status.written_lsn = Some(self.handed);
        self.status.flushed_lsn = Some(self.flushed);
        self.status.received_tli = Some(self.timeline);
        // As PostgreSQL's walreceiver does at the start of a stream: positions, and hot standby
        // feedback with no xmin so an upstream forgets one a previous connection set. The
        // update asks for a reply, so that an upstream with nothing to send yet still says
        // at once that the stream works (see `announce`).
        self.send_status(now, true, true, out);
        out.push(Output::Send(FrontendMessage::HotStandbyFeedback(
            HotStandbyFeedback {
                send_time: PgTimestamp::now(),
                xmin: 0,
                xmin_epoch: 0,
                catalog_xmin: 0,
                catalog_xmin_epoch: 0,
            },
        )));
    }

    /// The first WAL or keepalive of a stream: it works, so tell the owner it began. An
    /// upstream can still refuse the start inside the copy (58P01 for WAL it removed), and an
    /// owner that counted that as a start would reset its backoff and retry in a storm.
    fn announce(&mut self, out: &mut Vec<Output>) {
        if let Some(start) = self.unannounced.take() {
            self.status.status = ReceiverState::Streaming;
            out.push(Output::Streaming {
                timeline: self.timeline,
                start,
            });
        }
    }

    fn on_stream_message(&mut self, msg: BackendMessage, now: Instant, out: &mut Vec<Output>) {
        // An upstream that carries the commit point tells it before anything else. An error
        // (a start refused inside the copy) says nothing of it, so the told point stays.
        let content = !matches!(
            msg,
            BackendMessage::ErrorResponse(_) | BackendMessage::NoticeResponse(_)
        );
        if self.carries_commit_point.is_none() && content {
            let carries = matches!(msg, BackendMessage::CommitPoint(_));
            self.carries_commit_point = Some(carries);
            if !carries && self.commit_point.take().is_some() {
                out.push(Output::CommitPoint(None));
            }
        }
        match msg {
            BackendMessage::CommitPoint(c) => {
                self.announce(out);
                self.commit_point = Some(c.commit_point.max(self.commit_point.unwrap_or_default()));
                out.push(Output::CommitPoint(Some(c.commit_point)));
            }
            BackendMessage::XLogData(x) => {
                self.announce(out);
                self.on_sender_report(x.wal_end, x.send_time);
                if x.wal_start > self.handed {
                    return self.fail(
                        ReceiverError::protocol(format!(
                            "received WAL at {}, but the WAL received so far ends at {}",
                            x.wal_start, self.handed
                        )),
                        out,
                    );
                }
                let Some(end) = x.wal_start.checked_add(x.data.len() as u64) else {
                    return self.fail(ReceiverError::protocol("WAL beyond the last LSN"), out);
                };
                if !x.data.is_empty() {
                    out.push(Output::Write {
                        start: x.wal_start,
                        data: x.data,
                    });
                }
                self.handed = self.handed.max(end);
                self.status.written_lsn = Some(self.handed);
            }
            BackendMessage::PrimaryKeepalive(k) => {
                self.announce(out);
                self.on_sender_report(k.wal_end, k.send_time);
                if k.reply_requested {
                    self.send_status(now, true, false, out);
                }
            }
            BackendMessage::CopyDone => {
                // The upstream reached the end of the timeline it streams: answer, then read
                // which timeline comes next.
                out.push(Output::Send(FrontendMessage::CopyDone));
                self.status.status = ReceiverState::Waiting;
                self.phase = Phase::EndingCopy(ResultCollector::default());
            }
            BackendMessage::ErrorResponse(e) => self.fail(ReceiverError::upstream(&e), out),
            BackendMessage::CommandComplete(tag) => self.fail(
                ReceiverError::UpstreamClosed {
                    detail: format!("it ended streaming with {tag:?} (its controlled shutdown)"),
                },
                out,
            ),
            BackendMessage::ParameterStatus { .. } | BackendMessage::NoticeResponse(_) => {}
            BackendMessage::CopyData(payload) => self.fail(
                ReceiverError::protocol(format!(
                    "unexpected streaming message type {:?}",
                    payload.first().map(|b| char::from(*b))
                )),
                out,
            ),
            other => self.fail(
                ReceiverError::protocol(format!("unexpected {} while streaming", describe(&other))),
                out,
            ),
        }
    }

    /// PostgreSQL's ProcessWalSndrMessage: what the upstream's last message says about it.
    fn on_sender_report(&mut self, wal_end: Lsn, send_time: PgTimestamp) {
        let send_time = send_time.to_system_time();
        self.status.last_msg_send_time = Some(send_time);
        if self.status.latest_end_lsn.is_none_or(|l| l < wal_end) {
            self.status.latest_end_time = Some(send_time);
        }
        self.status.latest_end_lsn = Some(wal_end);
    }

    /// The copy ended (or never began, for a timeline that ends at the start point): the
    /// result names the next timeline.
    fn on_stream_ended(&mut self, r: QueryResult, now: Instant, out: &mut Vec<Output>) {
        let (next, startpos) = match query::next_timeline(&r) {
            Ok(Some(n)) => n,
            Ok(None) => {
                return self.fail(
                    ReceiverError::UpstreamClosed {
                        detail: format!(
                        "it ended streaming of timeline {} at {} without naming a next timeline",
                        self.timeline, self.handed
                    ),
                    },
                    out,
                )
            }
            Err(e) => return self.fail(e, out),
        };
        if next <= self.timeline {
            return self.fail(
                ReceiverError::protocol(format!(
                    "server reported unexpected next timeline {next}, following timeline {}",
                    self.timeline
                )),
                out,
            );
        }
        if startpos != self.handed {
            tracing::warn!(%next, %startpos, handed = %self.handed, "the upstream's next timeline starts elsewhere than where its stream ended");
        }
        self.status.status = ReceiverState::Waiting;
        self.upstream_tli = self.upstream_tli.max(next);
        self.advance(now, out);
    }

    /// Storage published a new position.
    pub fn on_position(&mut self, pos: WalPosition, now: Instant, out: &mut Vec<Output>) {
        if pos.flushed <= self.flushed || pos.timeline != self.timeline {
            return;
        }
        self.flushed = pos.flushed;
        self.status.flushed_lsn = Some(pos.flushed);
        self.status.received_tli = Some(pos.timeline);
        if self.is_streaming() {
            self.send_status(now, false, false, out);
        }
    }

    /// An application applied WAL up to `lsn`.
    pub fn on_applied(&mut self, lsn: Lsn, now: Instant, out: &mut Vec<Output>) {
        let applied = match self.apply {
            ApplyReporting::Application { applied } => applied.max(lsn),
            ApplyReporting::FollowFlush => lsn,
        };
        self.apply = ApplyReporting::Application { applied };
        if self.is_streaming() {
            self.send_status(now, false, false, out);
        }
    }

    fn apply_lsn(&self) -> Lsn {
        match self.apply {
            ApplyReporting::FollowFlush => self.flushed,
            ApplyReporting::Application { applied } => applied,
        }
    }

    /// PostgreSQL's XLogWalRcvSendReply: unless `force`d, only when enabled and something
    /// changed or the interval has passed.
    fn send_status(
        &mut self,
        now: Instant,
        force: bool,
        reply_requested: bool,
        out: &mut Vec<Output>,
    ) {
        let interval = self.config.wal_receiver_status_interval;
        let positions = (self.handed, self.flushed, self.apply_lsn());
        if !force
            && (interval.is_zero()
                || (positions == self.reported && now < self.last_status + interval))
        {
            return;
        }
        self.reported = positions;
        self.last_status = now;
        out.push(Output::Send(FrontendMessage::StandbyStatusUpdate(
            StandbyStatusUpdate {
                write: positions.0,
                flush: positions.1,
                apply: positions.2,
                send_time: PgTimestamp::now(),
                reply_requested,
            },
        )));
    }

    /// Whether the upstream owes us something, so its silence counts.
    fn waiting_on_upstream(&self) -> bool {
        !matches!(
            self.phase,
            Phase::Connecting | Phase::Storage | Phase::Closed
        )
    }

    /// When the next timer should fire, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        if !self.waiting_on_upstream() {
            return None;
        }
        let timeout = self.config.wal_receiver_timeout;
        let silence = (!timeout.is_zero()).then(|| {
            if self.is_streaming() && !self.ping_sent {
                self.last_receipt + timeout / 2
            } else {
                self.last_receipt + timeout
            }
        });
        let interval = self.config.wal_receiver_status_interval;
        let status =
            (self.is_streaming() && !interval.is_zero()).then(|| self.last_status + interval);
        match (silence, status) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The timer fired.
    pub fn on_tick(&mut self, now: Instant, out: &mut Vec<Output>) {
        if !self.waiting_on_upstream() {
            return;
        }
        let timeout = self.config.wal_receiver_timeout;
        if !timeout.is_zero() {
            if now >= self.last_receipt + timeout {
                return self.fail(
                    ReceiverError::Timeout {
                        timeout_ms: timeout.as_millis() as u64,
                    },
                    out,
                );
            }
            if self.is_streaming() && !self.ping_sent && now >= self.last_receipt + timeout / 2 {
                self.ping_sent = true;
                return self.send_status(now, true, true, out);
            }
        }
        if self.is_streaming() {
            self.send_status(now, false, false, out);
        }
    }

    /// The owner asked the walreceiver to stop: say goodbye as libpq's PQfinish does.
    pub fn stop(&mut self, out: &mut Vec<Output>) {
        if self.is_closed() {
            return;
        }
        let connected = !matches!(self.phase, Phase::Connecting);
        self.phase = Phase::Closed;
        self.status.status = ReceiverState::Stopping;
        if connected {
            out.push(Output::Send(FrontendMessage::Terminate));
        }
    }

    fn fail(&mut self, e: ReceiverError, out: &mut Vec<Output>) {
        if self.is_closed() {
            return;
        }
        self.phase = Phase::Closed;
        self.status.status = ReceiverState::Stopping;
        out.push(Output::Stop(e));
    }
}

/// Where `timeline` ends in the history `entries` of `upstream`, and which timeline begins
/// there.
fn switch_from(
    entries: &[HistoryEntry],
    timeline: TimelineId,
    upstream: TimelineId,
) -> Option<(Lsn, TimelineId)> {
    let i = entries.iter().position(|e| e.parent == timeline)?;
    let child = entries.get(i + 1).map_or(upstream, |e| e.parent);
    Some((entries[i].switch_lsn, child))
}

/// START_REPLICATION as PostgreSQL 15's walreceiver words it: no PHYSICAL keyword, the slot
/// double-quoted, the timeline always named.
pub fn start_replication_command(slot: Option<&str>, start: Lsn, timeline: TimelineId) -> String {
    match slot {
        Some(s) => format!(
            "START_REPLICATION SLOT {} {start} TIMELINE {timeline}",
            quote_ident(s)
        ),
        None => format!("START_REPLICATION {start} TIMELINE {timeline}"),
    }
}

#[cfg(test)]
mod tests;
