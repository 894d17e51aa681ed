//! A walsender's protocol logic after authentication, as a plain state machine: replication
//! commands, the CopyBoth streaming sub-protocol, keepalives and timeouts, and the drain at
//! shutdown. The actor feeds it client messages, flush notifications, finished reads and
//! timer ticks, and carries out the [`Output`]s it returns. It never blocks and does no I/O:
//! WAL reads and commands that touch files are handed back to the actor as work to run on a
//! blocking pool, so every behaviour here is testable without sockets.
//!
//! The shape follows PostgreSQL's walsender (walsender.c): one command loop in which
//! streaming is a sub-state; an ERROR in any command, even inside COPY, answers ErrorResponse
//! and ReadyForQuery and returns to the loop; only protocol violations and shutdown end the
//! connection. While streaming, the client is always heard: a CopyDone that arrives while the
//! walsender waits for WAL that does not exist yet ends the stream at once (PostgreSQL's 2017
//! bug, fixed by fca85f8ef157, cannot happen here because waiting for WAL is not a state that
//! ignores input: it is the absence of a read in flight).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_codec::command::{parse_command, validate_slot_name, ReplicationCommand};
use protocol_codec::messages::{
    unexpected_copy_data, HotStandbyFeedback, PrimaryKeepalive, StandbyStatusUpdate,
    TransactionStatus, XLogData,
};
use protocol_codec::{results, BackendMessage, ErrorFields, FrontendMessage, SqlState};
use wal_storage::{
    Lsn, PgTimestamp, SlotGuard, TimelineId, Wal, WalError, WalFileRange, WalPosition,
};

use crate::lag::StandbyLags;
use crate::status::{lock, SharedStatus, WalSenderState, WalSenderStatus};

/// PostgreSQL's `MAX_SEND_SIZE`: the most WAL one XLogData carries (16 × XLOG_BLCKSZ).
pub const MAX_SEND_SIZE: usize = 128 * 1024;
/// `XLOG_BLCKSZ`: a capped XLogData ends on a page boundary, as PostgreSQL's does.
const PAGE_SIZE: u64 = 8192;
/// The most WAL one read from storage asks for; several XLogData are cut from it. A guess
/// that amortises the blocking-pool round trip while keeping a connection's memory small.
pub const READ_SIZE: usize = 1 << 20;

/// The settings a session reads; replaced whole on reload.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Disconnect a streaming client silent this long; zero disables (PostgreSQL's 0).
    pub wal_sender_timeout: Duration,
    /// What SHOW answers: canonical name and value text, matched case-insensitively.
    pub show: Arc<Vec<(String, String)>>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            wal_sender_timeout: Duration::from_secs(60),
            show: Arc::new(Vec::new()),
        }
    }
}

/// The SHOW values every walserver node answers, from facts of its storage: what PostgreSQL
/// 15's clients ask for (pg_receivewal: `wal_segment_size`, `data_directory_mode`) and what
/// identifies the server. Configured values are laid over these.
pub fn base_show_values(
    segment_size: u64,
    wal_format: wal_storage::WalFormat,
) -> Vec<(String, String)> {
    let size = if segment_size.is_multiple_of(1 << 30) {
        format!("{}GB", segment_size >> 30)
    } else {
        format!("{}MB", segment_size >> 20)
    };
    [
        ("wal_segment_size", size.as_str()),
        ("data_directory_mode", "0700"),
        ("server_version", crate::SERVER_VERSION),
        ("server_version_num", "150000"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("integer_datetimes", "on"),
        ("TimeZone", "Etc/UTC"),
        ("DateStyle", "ISO, MDY"),
        ("block_size", "8192"),
        ("wal_block_size", "8192"),
        ("wal_level", "replica"),
        ("wal_format", &wal_format.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `base` with `overrides` laid over it, names compared case-insensitively.
pub fn merge_show_values(
    base: Vec<(String, String)>,
    overrides: &[(String, String)],
) -> Vec<(String, String)> {
    let mut out = base;
    for (k, v) in overrides {
        match out.iter_mut().find(|(n, _)| n.eq_ignore_ascii_case(k)) {
            Some(slot) => slot.1 = v.clone(),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

/// How the server is going down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Streaming sessions send what is flushed, wait (until `deadline`) for the standby to
    /// confirm it, and end the copy with CommandComplete; the others end at once with FATAL.
    Fast { deadline: Instant },
    /// Every session ends at once with FATAL 57P01.
    Immediate,
}

/// Work for the actor.
#[derive(Debug)]
pub enum Output {
    /// Send a message.
    Msg(BackendMessage),
    /// Send WAL: the actor writes the header and the payload without copying the payload.
    Wal(XLogData),
    /// Send WAL that lies in a segment file: the actor's writer sends the XLogData header,
    /// then `range` straight from the file (`sendfile`), so the bytes are never copied into
    /// this process.
    WalFile {
        wal_start: Lsn,
        wal_end: Lsn,
        send_time: PgTimestamp,
        range: WalFileRange,
    },
    /// Read WAL and report it with [`Session::on_wal_read`].
    Read {
        timeline: TimelineId,
        start: Lsn,
        len: usize,
    },
    /// Run a command that touches files on a blocking pool, then call
    /// [`Session::on_command_done`] with its result.
    Run(BlockingCommand),
    /// The status changed (state, positions, lags): tell whoever shows it.
    StatusChanged,
    /// Everything queued so far is the last: write it and close the connection.
    Close,
}

/// WAL for the session to cut into messages: read into memory ([`Wal::read`], or storage's
/// tail cache), or where it lies in a segment file ([`Wal::locate`]).
#[derive(Debug)]
pub enum WalData {
    Bytes(Bytes),
    File(WalFileRange),
}

impl From<Bytes> for WalData {
    fn from(b: Bytes) -> WalData {
        WalData::Bytes(b)
    }
}

impl WalData {
    /// What [`Wal::locate`] found; `None`, nothing to read, is no bytes.
    pub fn located(range: Option<WalFileRange>) -> WalData {
        range.map_or(WalData::Bytes(Bytes::new()), WalData::File)
    }

    fn len(&self) -> usize {
        match self {
            WalData::Bytes(b) => b.len(),
            WalData::File(r) => r.len,
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `n` bytes (`n <= len`); `self` keeps the rest.
    fn split_to(&mut self, n: usize) -> WalData {
        match self {
            WalData::Bytes(b) => WalData::Bytes(b.split_to(n)),
            WalData::File(r) => {
                let head = WalFileRange {
                    file: r.file.clone(),
                    offset: r.offset,
                    len: n,
                };
                r.offset += n as u64;
                r.len -= n;
                WalData::File(head)
            }
        }
    }
}

/// A command that does file I/O or fsync, run off the actor's thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockingCommand {
    TimelineHistory(TimelineId),
    CreateSlot {
        name: String,
        temporary: bool,
        reserve_wal: bool,
    },
    DropSlot {
        name: String,
        /// `WAIT`: if the slot is in use, wait until it is released, then drop it.
        wait: bool,
    },
}

/// What a [`BlockingCommand`] produced.
#[derive(Debug)]
pub struct CommandResult {
    pub messages: Vec<BackendMessage>,
    /// The command failed with an ERROR (the last message is the ErrorResponse).
    pub failed: bool,
    /// A temporary slot this session now owns.
    pub temporary_slot: Option<String>,
    /// The command must run again once a slot is released (`DROP_REPLICATION_SLOT ... WAIT`
    /// on a slot in use); the actor waits for [`Wal::slot_releases`] and retries.
    pub retry_after_release: bool,
}

impl BlockingCommand {
    /// Runs the command against storage. Blocking: call it on a blocking pool.
    pub fn run(self, wal: &Wal) -> CommandResult {
        let ok = |messages| CommandResult {
            messages,
            failed: false,
            temporary_slot: None,
            retry_after_release: false,
        };
        let err = |mut messages: Vec<BackendMessage>, e: ErrorFields| {
            messages.push(BackendMessage::ErrorResponse(e));
            CommandResult {
                messages,
                failed: true,
                temporary_slot: None,
                retry_after_release: false,
            }
        };
        match self {
            BlockingCommand::TimelineHistory(tli) => match wal.history_file(tli) {
                Ok(Some(content)) => ok(results::timeline_history(tli, Bytes::from(content))),
                // PostgreSQL sends the RowDescription before it opens the file.
                Ok(None) => err(
                    vec![results::timeline_history_description()],
                    ErrorFields::error(
                        SqlState::UNDEFINED_FILE,
                        format!(
                            "could not open file \"pg_wal/{}\": No such file or directory",
                            results::timeline_history_filename(tli)
                        ),
                    ),
                ),
                Err(e) => err(
                    vec![results::timeline_history_description()],
                    wal_error_fields(&e),
                ),
            },
            BlockingCommand::CreateSlot {
                name,
                temporary,
                reserve_wal,
            } => match wal.create_slot(&name, temporary, reserve_wal) {
                // PostgreSQL 15 reports consistent_point 0/0 for physical slots.
                Ok(_) => CommandResult {
                    messages: results::create_replication_slot(&name, Lsn::INVALID, None, None),
                    failed: false,
                    temporary_slot: temporary.then_some(name),
                    retry_after_release: false,
                },
                Err(e) => err(Vec::new(), wal_error_fields(&e)),
            },
            BlockingCommand::DropSlot { name, wait } => match wal.drop_slot(&name) {
                Ok(()) => ok(results::drop_replication_slot()),
                Err(WalError::SlotInUse { .. }) if wait => CommandResult {
                    messages: Vec::new(),
                    failed: false,
                    temporary_slot: None,
                    retry_after_release: true,
                },
                Err(e) => err(Vec::new(), wal_error_fields(&e)),
            },
        }
    }
}

/// The ERROR for a storage failure, with PostgreSQL's SQLSTATE and wording where it has one.
pub fn wal_error_fields(e: &WalError) -> ErrorFields {
    let code = match e {
        WalError::SegmentRemoved { .. } => SqlState::UNDEFINED_FILE,
        WalError::SlotNameInvalid { .. } => SqlState::INVALID_NAME,
        WalError::SlotExists { .. } => SqlState::DUPLICATE_OBJECT,
        WalError::SlotNotFound { .. } => SqlState::UNDEFINED_OBJECT,
        WalError::SlotInUse { .. } => SqlState::OBJECT_IN_USE,
        WalError::SlotInvalidated { .. } => SqlState::OBJECT_IN_USE,
        _ => SqlState::INTERNAL_ERROR,
    };
    ErrorFields::error(code, e.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamEnd {
    /// The node's current timeline: stream up to its flushed end, forever.
    Current,
    /// A timeline that has ended: stream up to `switch`, then end the copy and tell the
    /// client that `next` starts there.
    Historic { switch: Lsn, next: TimelineId },
}

struct Stream {
    timeline: TimelineId,
    end: StreamEnd,
    /// The next byte to send.
    sent: Lsn,
    read_in_flight: bool,
    client_done: bool,
    server_done: bool,
    slot: Option<SlotGuard>,
    /// Whether a keepalive asking for a reply is outstanding.
    waiting_for_ping: bool,
    last_reply: Instant,
}

impl Stream {
    fn limit(&self, flushed: Lsn) -> Lsn {
        match self.end {
            StreamEnd::Current => flushed,
            StreamEnd::Historic { switch, .. } => switch,
        }
    }
}

enum Mode {
    /// Waiting for a command.
    Idle,
    /// A command runs on the blocking pool; further messages wait.
    Busy,
    Streaming(Box<Stream>),
    /// The connection is ending; nothing more is processed.
    Closed,
}

/// One replication connection's protocol state.
pub struct Session {
    wal: Wal,
    config: Arc<SessionConfig>,
    mode: Mode,
    /// The newest flushed position and timeline the session has been told of.
    position: WalPosition,
    status: SharedStatus,
    lags: StandbyLags,
    temporary_slots: Vec<String>,
    /// Set once a fast shutdown has begun: the copy ends when the standby confirms, or at the
    /// deadline.
    stopping: Option<Instant>,
    /// Clock origin for the lag tracker's microsecond samples.
    epoch: Instant,
    pid: u32,
}

impl Session {
    pub fn new(wal: Wal, config: Arc<SessionConfig>, status: SharedStatus) -> Session {
        let position = wal.position();
        let pid = lock(&status).pid;
        Session {
            pid,
            wal,
            config,
            mode: Mode::Idle,
            position,
            status,
            lags: StandbyLags::default(),
            temporary_slots: Vec::new(),
            stopping: None,
            epoch: Instant::now(),
        }
    }

    /// A snapshot of the status.
    pub fn status(&self) -> WalSenderStatus {
        lock(&self.status).clone()
    }

    pub fn set_config(&mut self, config: Arc<SessionConfig>) {
        self.config = config;
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.mode, Mode::Closed)
    }

    pub fn is_busy(&self) -> bool {
        matches!(self.mode, Mode::Busy)
    }

    pub fn is_streaming(&self) -> bool {
        matches!(self.mode, Mode::Streaming(_))
    }

    fn micros(&self, now: Instant) -> i64 {
        now.saturating_duration_since(self.epoch).as_micros() as i64
    }

    /// Temporary slots this session created and still owns; the actor drops them at the end.
    pub fn temporary_slots(&self) -> &[String] {
        &self.temporary_slots
    }

    /// A message from the client.
    pub fn on_message(&mut self, msg: FrontendMessage, now: Instant, out: &mut Vec<Output>) {
        match &mut self.mode {
            Mode::Closed => {}
            Mode::Streaming(stream) => {
                // Any message from the client counts as a sign of life (PostgreSQL's
                // last_reply_timestamp), and answers an outstanding ping.
                stream.last_reply = now;
                stream.waiting_for_ping = false;
                match msg {
                    FrontendMessage::StandbyStatusUpdate(r) => self.on_reply(r, now, out),
                    FrontendMessage::HotStandbyFeedback(h) => self.on_feedback(h, out),
                    FrontendMessage::CopyDone => self.on_client_copy_done(out),
                    FrontendMessage::CopyData(payload) => {
                        self.fatal(unexpected_copy_data(&payload), out)
                    }
                    FrontendMessage::Terminate => self.close(out),
                    other => self.fatal(
                        ErrorFields::fatal(
                            SqlState::PROTOCOL_VIOLATION,
                            format!("invalid standby message type \"{}\"", tag_of(&other)),
                        ),
                        out,
                    ),
                }
            }
            Mode::Idle | Mode::Busy => match msg {
                FrontendMessage::Query(q) => self.on_query(&q, now, out),
                FrontendMessage::Terminate => self.close(out),
                // PostgreSQL ignores copy messages outside COPY: a client may still be sending
                // them after a COPY that failed.
                FrontendMessage::CopyData(_)
                | FrontendMessage::CopyDone
                | FrontendMessage::CopyFail(_)
                | FrontendMessage::StandbyStatusUpdate(_)
                | FrontendMessage::HotStandbyFeedback(_) => {}
                other => self.fatal(
                    ErrorFields::fatal(
                        SqlState::PROTOCOL_VIOLATION,
                        format!("invalid frontend message type {}", tag_of(&other) as u32),
                    ),
                    out,
                ),
            },
        }
    }

    fn on_query(&mut self, query: &str, now: Instant, out: &mut Vec<Output>) {
        debug_assert!(
            matches!(self.mode, Mode::Idle),
            "queries wait while a command runs"
        );
        if self.stopping.is_some() {
            return self.error(
                ErrorFields::error(
                    SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    "cannot execute new commands while WAL sender is in stopping mode",
                ),
                out,
            );
        }
        let cmd = match parse_command(query) {
            Ok(c) => c,
            Err(e) => return self.error(e.to_error_fields(), out),
        };
        if let Some(refusal) = cmd.refusal() {
            return self.error(refusal, out);
        }
        match cmd {
            ReplicationCommand::IdentifySystem => {
                let pos = self.wal.position();
                out.extend(
                    results::identify_system(self.wal.system_id(), pos.timeline, pos.flushed, None)
                        .into_iter()
                        .map(Output::Msg),
                );
                self.ready(out);
            }
            ReplicationCommand::Show { name } => {
                match self
                    .config
                    .show
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(&name))
                {
                    Some((canonical, value)) => {
                        out.extend(results::show(canonical, value).into_iter().map(Output::Msg));
                        self.ready(out);
                    }
                    None => self.error(
                        ErrorFields::error(
                            SqlState::UNDEFINED_OBJECT,
                            format!("unrecognized configuration parameter \"{name}\""),
                        ),
                        out,
                    ),
                }
            }
            ReplicationCommand::TimelineHistory { timeline } => {
                self.mode = Mode::Busy;
                out.push(Output::Run(BlockingCommand::TimelineHistory(timeline)));
            }
            ReplicationCommand::CreateReplicationSlot {
                slot_name,
                temporary,
                reserve_wal,
            } => {
                if let Err(e) = validate_slot_name(&slot_name) {
                    return self.error(e.to_error_fields(), out);
                }
                self.mode = Mode::Busy;
                out.push(Output::Run(BlockingCommand::CreateSlot {
                    name: slot_name,
                    temporary,
                    reserve_wal,
                }));
            }
            ReplicationCommand::ReadReplicationSlot { slot_name } => {
                if let Err(e) = validate_slot_name(&slot_name) {
                    return self.error(e.to_error_fields(), out);
                }
                let read = self.wal.slot(&slot_name).ok().map(|s| results::ReadSlot {
                    slot_type: "physical".to_string(),
                    restart_lsn: s.restart_lsn,
                    restart_tli: s.restart_lsn.and(s.restart_tli),
                });
                out.extend(
                    results::read_replication_slot(read.as_ref())
                        .into_iter()
                        .map(Output::Msg),
                );
                self.ready(out);
            }
            ReplicationCommand::DropReplicationSlot { slot_name, wait } => {
                // Another session's active slot is "in use"; with WAIT the command waits until
                // that session releases it.
                self.temporary_slots.retain(|s| s != &slot_name);
                self.mode = Mode::Busy;
                out.push(Output::Run(BlockingCommand::DropSlot {
                    name: slot_name,
                    wait,
                }));
            }
            ReplicationCommand::StartReplication {
                slot_name,
                start,
                timeline,
            } => self.start_replication(slot_name, start, timeline, now, out),
            ReplicationCommand::NotSupported { .. } | ReplicationCommand::Sql { .. } => {
                unreachable!("refused above")
            }
        }
    }

    /// The result of a [`BlockingCommand`].
    pub fn on_command_done(&mut self, result: CommandResult, out: &mut Vec<Output>) {
        if !matches!(self.mode, Mode::Busy) {
            return; // The connection ended while the command ran.
        }
        self.mode = Mode::Idle;
        if let Some(slot) = result.temporary_slot {
            self.temporary_slots.push(slot);
        }
        out.extend(result.messages.into_iter().map(Output::Msg));
        if result.failed {
            self.drop_temporary_slots();
        }
        self.ready(out);
    }

    fn start_replication(
        &mut self,
        slot_name: Option<String>,
        start: Lsn,
        timeline: Option<TimelineId>,
        now: Instant,
        out: &mut Vec<Output>,
    ) {
        let slot = match &slot_name {
            Some(name) => match self.wal.acquire_slot(name) {
                Ok(g) => Some(g),
                Err(WalError::SlotInUse { name }) => {
                    return self.error(
                        ErrorFields::error(
                            SqlState::OBJECT_IN_USE,
                            format!("replication slot \"{name}\" is active"),
                        ),
                        out,
                    )
                }
                Err(e) => return self.error(wal_error_fields(&e), out),
            },
            None => None,
        };
        let pos = self.wal.position();
        self.position = pos;
        let tli = timeline.unwrap_or(pos.timeline);
        let end = if tli == pos.timeline {
            StreamEnd::Current
        } else {
            let history = self.wal.history();
            let Some(i) = history.iter().position(|e| e.parent == tli) else {
                return self.error(
                    ErrorFields::error(
                        SqlState::INTERNAL_ERROR,
                        format!("requested timeline {tli} is not in this server's history"),
                    ),
                    out,
                );
            };
            let switch = history[i].switch_lsn;
            let next = history.get(i + 1).map(|e| e.parent).unwrap_or(pos.timeline);
            if switch < start {
                return self.error(
                    ErrorFields::error(
                        SqlState::INTERNAL_ERROR,
                        format!("requested starting point {start} on timeline {tli} is not in this server's history"),
                    )
                    .detail(format!("This server's history forked from timeline {tli} at {switch}.")),
                    out,
                );
            }
            StreamEnd::Historic { switch, next }
        };
        let stream = Box::new(Stream {
            timeline: tli,
            end,
            sent: start,
            read_in_flight: false,
            client_done: false,
            server_done: false,
            slot,
            waiting_for_ping: false,
            last_reply: now,
        });
        // A historic timeline that ends exactly where the client starts has nothing to
        // stream: PostgreSQL answers with the next timeline at once, without COPY.
        if let StreamEnd::Historic { switch, next } = end {
            if start == switch {
                drop(stream);
                out.extend(
                    results::end_of_timeline(next, switch)
                        .into_iter()
                        .map(Output::Msg),
                );
                out.extend(results::end_of_streaming().into_iter().map(Output::Msg));
                return self.ready(out);
            }
        }
        out.push(Output::Msg(BackendMessage::CopyBothResponse));
        // PostgreSQL checks the start against the flushed end only once in copy mode; the
        // error ends the copy and the connection stays usable.
        if end == StreamEnd::Current && start > pos.flushed {
            drop(stream);
            return self.error(
                ErrorFields::error(
                    SqlState::INTERNAL_ERROR,
                    format!(
                        "requested starting point {start} is ahead of the WAL flush position of this server {}",
                        pos.flushed
                    ),
                ),
                out,
            );
        }
        {
            let mut st = lock(&self.status);
            st.slot_name = stream.slot.as_ref().map(|g| g.name().to_string());
            st.state = WalSenderState::Catchup;
            st.timeline = Some(tli);
            st.sent_lsn = Some(start);
        }
        self.mode = Mode::Streaming(stream);
        out.push(Output::StatusChanged);
        self.pump(usize::MAX, out);
    }

    /// The node's WAL position changed: more WAL is durable, or the timeline switched.
    pub fn on_wal_position(&mut self, pos: WalPosition, room: usize, out: &mut Vec<Output>) {
        let old_tli = self.position.timeline;
        self.position = pos;
        if let Mode::Streaming(stream) = &mut self.mode {
            if pos.timeline != old_tli
                && stream.end == StreamEnd::Current
                && stream.timeline != pos.timeline
            {
                // The timeline being streamed ended under us (promotion, or the upstream of a
                // cascading standby switched): finish it at its switch point.
                let history = self.wal.history();
                if let Some(i) = history.iter().position(|e| e.parent == stream.timeline) {
                    let next = history.get(i + 1).map(|e| e.parent).unwrap_or(pos.timeline);
                    stream.end = StreamEnd::Historic {
                        switch: history[i].switch_lsn,
                        next,
                    };
                }
            }
        }
        self.pump(room, out);
    }

    /// Asks for more WAL if the stream wants it and `room` bytes may be queued.
    pub fn pump(&mut self, room: usize, out: &mut Vec<Output>) {
        let flushed = self.position.flushed;
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        if stream.read_in_flight || stream.client_done || stream.server_done {
            return;
        }
        let limit = stream.limit(flushed);
        if stream.sent >= limit {
            if let StreamEnd::Historic { .. } = stream.end {
                // Everything up to the switch point is out: end the copy from our side.
                stream.server_done = true;
                out.push(Output::Msg(BackendMessage::CopyDone));
            } else if lock(&self.status).state == WalSenderState::Catchup {
                lock(&self.status).state = WalSenderState::Streaming;
                out.push(Output::StatusChanged);
            }
            self.check_drained(out);
            return;
        }
        if room == 0 {
            return;
        }
        let len = (limit.0 - stream.sent.0)
            .min(READ_SIZE as u64)
            .min(room as u64) as usize;
        stream.read_in_flight = true;
        out.push(Output::Read {
            timeline: stream.timeline,
            start: stream.sent,
            len,
        });
    }

    /// A read asked for with [`Output::Read`] finished: the bytes, or where they lie.
    pub fn on_wal_read(
        &mut self,
        start: Lsn,
        result: Result<WalData, WalError>,
        now: Instant,
        room: usize,
        out: &mut Vec<Output>,
    ) {
        let flushed = self.position.flushed;
        let now_us = self.micros(now);
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        stream.read_in_flight = false;
        if stream.client_done || stream.server_done || start != stream.sent {
            return; // The copy ended while the read ran; its bytes are not wanted.
        }
        let data = match result {
            Ok(d) => d,
            Err(e) => {
                let fields = match &e {
                    WalError::SegmentRemoved { segment } => ErrorFields::error(
                        SqlState::UNDEFINED_FILE,
                        format!("requested WAL segment {segment} has already been removed"),
                    ),
                    other => wal_error_fields(other),
                };
                self.end_stream_quietly();
                return self.error(fields, out);
            }
        };
        let wal_end = stream.limit(flushed);
        let send_time = PgTimestamp::now();
        let mut at = start;
        let mut rest = data;
        while !rest.is_empty() {
            let mut n = rest.len().min(MAX_SEND_SIZE);
            if rest.len() > MAX_SEND_SIZE {
                // Cut on a page boundary, as PostgreSQL's XLogSendPhysical does.
                let end = (at.0 + MAX_SEND_SIZE as u64) & !(PAGE_SIZE - 1);
                if end > at.0 {
                    n = (end - at.0) as usize;
                }
            }
            out.push(match rest.split_to(n) {
                WalData::Bytes(data) => Output::Wal(XLogData {
                    wal_start: at,
                    wal_end,
                    send_time,
                    data,
                }),
                WalData::File(range) => Output::WalFile {
                    wal_start: at,
                    wal_end,
                    send_time,
                    range,
                },
            });
            at = at + n as u64;
        }
        stream.sent = at;
        lock(&self.status).sent_lsn = Some(at);
        self.lags.record_sent(at, now_us);
        self.pump(room, out);
    }

    fn on_reply(&mut self, r: StandbyStatusUpdate, now: Instant, out: &mut Vec<Output>) {
        let now_us = self.micros(now);
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        let mut st = lock(&self.status);
        st.write_lsn = Some(r.write);
        st.flush_lsn = Some(r.flush);
        st.replay_lsn = Some(r.apply);
        st.reply_time = Some(r.send_time.to_system_time());
        self.lags
            .on_reply(r.write, r.flush, r.apply, stream.sent, now_us);
        st.write_lag = self.lags.write_lag;
        st.flush_lag = self.lags.flush_lag;
        st.replay_lag = self.lags.replay_lag;
        drop(st);
        if let Some(slot) = &stream.slot {
            if r.flush.is_valid() {
                if let Err(e) = self.wal.advance_slot(slot.name(), r.flush, stream.timeline) {
                    tracing::warn!(
                        slot = slot.name(),
                        "could not advance replication slot: {e}"
                    );
                }
            }
        }
        // After our CopyDone no more CopyData may follow, not even a keepalive.
        if r.reply_requested && !stream.server_done {
            out.push(Output::Msg(BackendMessage::PrimaryKeepalive(
                PrimaryKeepalive {
                    wal_end: stream.sent,
                    send_time: PgTimestamp::now(),
                    reply_requested: false,
                },
            )));
        }
        out.push(Output::StatusChanged);
        self.check_drained(out);
    }

    fn on_feedback(&mut self, h: HotStandbyFeedback, out: &mut Vec<Output>) {
        // Recorded and shown; walserver has no snapshots for it to hold back.
        let mut st = lock(&self.status);
        st.backend_xmin = (h.xmin != 0).then_some(h.xmin);
        st.backend_xmin_epoch = (h.xmin != 0).then_some(h.xmin_epoch);
        st.reply_time = Some(h.send_time.to_system_time());
        out.push(Output::StatusChanged);
    }

    fn on_client_copy_done(&mut self, out: &mut Vec<Output>) {
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        stream.client_done = true;
        if !stream.server_done {
            stream.server_done = true;
            out.push(Output::Msg(BackendMessage::CopyDone));
        }
        if let StreamEnd::Historic { switch, next } = stream.end {
            out.extend(
                results::end_of_timeline(next, switch)
                    .into_iter()
                    .map(Output::Msg),
            );
        }
        out.extend(results::end_of_streaming().into_iter().map(Output::Msg));
        self.end_stream_quietly();
        self.ready(out);
    }

    /// Leaves streaming without a word to the client (the caller says what is needed).
    fn end_stream_quietly(&mut self) {
        if let Mode::Streaming(_) = self.mode {
            self.mode = Mode::Idle; // Drops the stream and with it the slot guard.
            let mut st = lock(&self.status);
            st.state = WalSenderState::Startup;
            st.slot_name = None;
        }
    }

    /// When the next timer should fire, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        let timeout = self.config.wal_sender_timeout;
        let streaming = match &self.mode {
            Mode::Streaming(s) if !timeout.is_zero() => Some(if s.waiting_for_ping {
                s.last_reply + timeout
            } else {
                s.last_reply + timeout / 2
            }),
            _ => None,
        };
        match (streaming, self.stopping) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The timer fired.
    pub fn on_tick(&mut self, now: Instant, out: &mut Vec<Output>) {
        if let Some(deadline) = self.stopping {
            if now >= deadline && !self.is_closed() {
                tracing::warn!(
                    pid = self.pid,
                    "standby did not confirm all WAL before wal_sender_shutdown_timeout; terminating"
                );
                return self.fatal(admin_shutdown(), out);
            }
        }
        let timeout = self.config.wal_sender_timeout;
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        if timeout.is_zero() {
            return;
        }
        if now >= stream.last_reply + timeout {
            // PostgreSQL only logs this (COMMERROR) and exits; the client is gone or stuck.
            tracing::info!(
                pid = self.pid,
                "terminating walsender due to replication timeout"
            );
            return self.close(out);
        }
        if !stream.waiting_for_ping && !stream.server_done && now >= stream.last_reply + timeout / 2
        {
            stream.waiting_for_ping = true;
            out.push(Output::Msg(BackendMessage::PrimaryKeepalive(
                PrimaryKeepalive {
                    wal_end: stream.sent,
                    send_time: PgTimestamp::now(),
                    reply_requested: true,
                },
            )));
        }
    }

    /// The server is shutting down.
    pub fn shutdown(&mut self, mode: ShutdownMode, room: usize, out: &mut Vec<Output>) {
        match (mode, &mut self.mode) {
            (_, Mode::Closed) => {}
            (ShutdownMode::Fast { deadline }, Mode::Streaming(stream)) if !stream.client_done => {
                self.stopping = Some(deadline);
                lock(&self.status).state = WalSenderState::Stopping;
                out.push(Output::StatusChanged);
                self.pump(room, out);
                self.check_drained(out);
            }
            _ => self.fatal(admin_shutdown(), out),
        }
    }

    /// During a fast shutdown: once everything flushed is sent and the standby confirmed it,
    /// end the copy as PostgreSQL's WalSndDone does (CommandComplete "COPY 0", no CopyDone).
    fn check_drained(&mut self, out: &mut Vec<Output>) {
        if self.stopping.is_none() {
            return;
        }
        let flushed = self.position.flushed;
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        // After our own CopyDone (a historic timeline ended) the client's CopyDone ends the
        // stream; until then, or the deadline, there is nothing to add.
        if stream.read_in_flight || stream.server_done || stream.sent < stream.limit(flushed) {
            return;
        }
        // pg_receivewal without a slot reports flush 0: use its write position then.
        let (flush, write) = {
            let st = lock(&self.status);
            (st.flush_lsn, st.write_lsn)
        };
        let replicated = match flush {
            Some(f) if f.is_valid() => f,
            _ => write.unwrap_or(Lsn::INVALID),
        };
        if replicated >= stream.sent {
            out.push(Output::Msg(BackendMessage::CommandComplete(
                "COPY 0".to_string(),
            )));
            return self.close(out);
        }
        if !stream.waiting_for_ping {
            stream.waiting_for_ping = true;
            out.push(Output::Msg(BackendMessage::PrimaryKeepalive(
                PrimaryKeepalive {
                    wal_end: stream.sent,
                    send_time: PgTimestamp::now(),
                    reply_requested: true,
                },
            )));
        }
    }

    fn ready(&mut self, out: &mut Vec<Output>) {
        if !self.is_closed() {
            out.push(Output::Msg(BackendMessage::ReadyForQuery(
                TransactionStatus::Idle,
            )));
        }
    }

    /// An ERROR: the command (or the copy) ends, the connection stays.
    fn error(&mut self, fields: ErrorFields, out: &mut Vec<Output>) {
        self.end_stream_quietly();
        self.mode = Mode::Idle;
        // PostgreSQL's error cleanup drops the session's temporary slots.
        self.drop_temporary_slots();
        out.push(Output::Msg(BackendMessage::ErrorResponse(fields)));
        out.push(Output::StatusChanged);
        self.ready(out);
    }

    /// A FATAL: the connection ends.
    fn fatal(&mut self, fields: ErrorFields, out: &mut Vec<Output>) {
        out.push(Output::Msg(BackendMessage::ErrorResponse(fields)));
        self.close(out);
    }

    fn close(&mut self, out: &mut Vec<Output>) {
        if self.is_closed() {
            return;
        }
        self.end_stream_quietly();
        self.mode = Mode::Closed;
        self.drop_temporary_slots();
        out.push(Output::Close);
    }

    fn drop_temporary_slots(&mut self) {
        for name in std::mem::take(&mut self.temporary_slots) {
            // Temporary slots live only in memory: dropping one does no file I/O.
            if let Err(e) = self.wal.drop_slot(&name) {
                tracing::debug!(slot = %name, "temporary slot not dropped: {e}");
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.drop_temporary_slots();
    }
}

/// FATAL 57P01, PostgreSQL's word for a connection ended by shutdown.
pub fn admin_shutdown() -> ErrorFields {
    ErrorFields::fatal(
        SqlState::ADMIN_SHUTDOWN,
        "terminating connection due to administrator command",
    )
}

fn tag_of(m: &FrontendMessage) -> char {
    match m {
        FrontendMessage::Query(_) => 'Q',
        FrontendMessage::PasswordMessage(_)
        | FrontendMessage::SaslInitialResponse { .. }
        | FrontendMessage::SaslResponse(_) => 'p',
        FrontendMessage::StandbyStatusUpdate(_)
        | FrontendMessage::HotStandbyFeedback(_)
        | FrontendMessage::CopyData(_) => 'd',
        FrontendMessage::CopyDone => 'c',
        FrontendMessage::CopyFail(_) => 'f',
        FrontendMessage::Terminate => 'X',
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal_storage::{InitOptions, StorageConfig, SystemId, WalFormat};

    struct Fixture {
        _dir: tempfile::TempDir,
        wal: Wal,
        session: Session,
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
        assert_eq!(
            error_code(&f.query("BASE_BACKUP")).as_deref(),
            Some("0A000")
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
        let result = cmd.run(&f.wal);
        let mut out = Vec::new();
        f.session.on_command_done(result, &mut out);
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
}
