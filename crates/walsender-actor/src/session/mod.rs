//! A walsender's protocol logic after authentication, as a plain state machine: replication
//! commands, the CopyBoth streaming sub-protocol, keepalives and timeouts, and the drain at
//! shutdown. The actor feeds it client messages, flush notifications, finished reads and
//! storage work, and timer ticks, and carries out the [`Output`]s it returns. It never blocks
//! and does no I/O, so every behaviour here is testable without sockets.
//!
//! It sees storage only through a [`StorageView`]: facts and slot bookkeeping kept in memory.
//! Work that touches files is an effect it returns: [`Output::Read`] (WAL to read or locate)
//! and [`Output::Run`] with a [`StorageOp`] (a command that touches files), which the actor
//! runs on a blocking pool (`crate::storage_ops`) and reports with [`Session::on_wal_read`] and
//! [`Session::on_storage_done`].
//!
//! The shape follows PostgreSQL's walsender (walsender.c): one command loop in which
//! streaming is a sub-state; an ERROR in any command, even inside COPY, answers ErrorResponse
//! and ReadyForQuery and returns to the loop; only protocol violations and shutdown end the
//! connection. While streaming, the client is always heard: a CopyDone that arrives while the
//! walsender waits for WAL that does not exist yet ends the stream at once (PostgreSQL's 2017
//! bug, fixed by fca85f8ef157, cannot happen here because waiting for WAL is not a state that
//! ignores input: it is the absence of a read in flight).
//!
//! Layout: this module holds the state and the message dispatch, and the ways a command or
//! the connection ends; `commands.rs` the replication commands, `stream.rs` streaming and its
//! timers and shutdown, `show.rs` the `SHOW` values, `storage.rs` the storage view and effects.

use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol_codec::client_settings::ClientSettings;
use protocol_codec::messages::{unexpected_copy_data, TransactionStatus, XLogData};
use protocol_codec::{BackendMessage, ErrorFields, FrontendMessage, SqlState};
use wal_storage::{Lsn, PgTimestamp, SlotGuard, TimelineId, WalFileRange, WalPosition};

use crate::lag::StandbyLags;
use crate::status::{lock, SharedStatus, WalSenderStatus};

mod commands;
mod show;
mod storage;
mod stream;
#[cfg(test)]
mod tests;

pub use show::{base_show_values, merge_show_values, role_values};
pub use storage::{wal_error_fields, StorageDone, StorageOp, StorageView, WalData};

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
    /// `synchronous_commit_overlap` (on by default): a synchronous standby that can cut back
    /// is sent WAL while this node's fdatasync runs ([`crate::overlap`]).
    pub commit_overlap: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            wal_sender_timeout: Duration::from_secs(60),
            show: Arc::new(Vec::new()),
            commit_overlap: true,
        }
    }
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

/// In words, for the log: "fast (standbys have 10s to confirm)" or "immediate".
impl std::fmt::Display for ShutdownMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShutdownMode::Fast { deadline } => {
                let left = deadline.saturating_duration_since(Instant::now());
                write!(
                    f,
                    "fast (standbys have {:.1}s to confirm)",
                    left.as_secs_f64()
                )
            }
            ShutdownMode::Immediate => f.write_str("immediate"),
        }
    }
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
    /// Read WAL (or, where the actor sends from files, find where it lies) off the actor's
    /// thread, and report it with [`Session::on_wal_read`].
    Read {
        timeline: TimelineId,
        start: Lsn,
        len: usize,
    },
    /// Run storage work that touches files on a blocking pool, then call
    /// [`Session::on_storage_done`] with its result.
    Run(StorageOp),
    /// The status changed (state, positions, lags): tell whoever shows it.
    StatusChanged,
    /// Everything queued so far is the last: write it and close the connection.
    Close,
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
    /// The commit point and flushed end last told the client, on a stream that carries them
    /// ([`crate::overlap::carries_commit_point`]); told again when the commit point moves.
    told: Option<(Lsn, Lsn)>,
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

/// One replication connection's protocol state, over a storage view `S` (a `Wal` in the actor).
pub struct Session<S: StorageView> {
    storage: S,
    config: Arc<SessionConfig>,
    /// What the client set when it connected; its values outlive a reload of `config`.
    client: ClientSettings,
    /// What SHOW answers for parameters that are facts of the connection's socket.
    socket_values: Vec<(String, String)>,
    /// What SHOW answers for the parameters that are facts of who connected
    /// (`session_authorization`).
    user_values: Vec<(String, String)>,
    /// What SHOW answers for the parameters that follow the node's role ([`role_values`]).
    role_values: Vec<(String, String)>,
    mode: Mode,
    /// After a refused message of the extended query protocol, every message up to the
    /// client's Sync is ignored, as PostgreSQL ignores them.
    skipping_till_sync: bool,
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

impl<S: StorageView> Session<S> {
    pub fn new(storage: S, config: Arc<SessionConfig>, status: SharedStatus) -> Session<S> {
        let position = storage.position();
        let pid = lock(&status).pid;
        Session {
            pid,
            storage,
            config,
            client: ClientSettings::default(),
            socket_values: Vec::new(),
            user_values: Vec::new(),
            role_values: role_values(false, false),
            mode: Mode::Idle,
            skipping_till_sync: false,
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

    /// The node's role now, for SHOW: a standby (`in_hot_standby`), or a primary that takes no
    /// writes (`read_only`, its failover fence closed). Set when the session starts and again
    /// whenever the role changes, so SHOW tells the role of the moment it is asked.
    pub fn set_role(&mut self, in_hot_standby: bool, read_only: bool) {
        self.role_values = role_values(in_hot_standby, read_only);
    }

    /// The parameters the client set when it connected.
    pub fn with_client_settings(mut self, client: ClientSettings) -> Session<S> {
        self.client = client;
        self
    }

    /// The user the client authenticated as, which SHOW `session_authorization` answers, as
    /// the greeting reported it.
    pub fn with_user(mut self, user: &str) -> Session<S> {
        self.user_values = vec![("session_authorization".to_string(), user.to_string())];
        self
    }

    /// What SHOW answers for the socket's parameters (its keepalive timing), read from it
    /// when the connection was established.
    pub fn with_socket_values(mut self, values: Vec<(String, String)>) -> Session<S> {
        self.set_socket_values(values);
        self
    }

    /// Replaces what SHOW answers for the socket's parameters, after a reload changed them.
    pub fn set_socket_values(&mut self, values: Vec<(String, String)>) {
        self.socket_values = values;
    }

    /// The connection's `wal_sender_timeout`: the client's, else the node's.
    fn wal_sender_timeout(&self) -> Duration {
        self.client
            .wal_sender_timeout
            .unwrap_or(self.config.wal_sender_timeout)
    }

    /// The answer to `SHOW name`: what the client set, else what the node shows.
    fn show(&self, name: &str) -> Result<Vec<BackendMessage>, ErrorFields> {
        show::answer_for(
            &self.client,
            &self.socket_values,
            &self.user_values,
            &self.role_values,
            &self.config.show,
            name,
        )
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
                    other => self.fatal(invalid_message_type(other.tag(), true), out),
                }
            }
            // PostgreSQL skips everything, Terminate and queries included, until the Sync
            // that ends the extended-protocol exchange it refused.
            Mode::Idle | Mode::Busy if self.skipping_till_sync => {
                if matches!(msg, FrontendMessage::Sync) {
                    self.skipping_till_sync = false;
                    self.ready(out);
                }
            }
            Mode::Idle | Mode::Busy => match msg {
                FrontendMessage::Query(q) => self.on_query(&q, now, out),
                // A replication connection speaks the simple query protocol only. PostgreSQL
                // refuses the first extended-protocol message with an ERROR, without a
                // ReadyForQuery, and skips the rest up to the Sync.
                FrontendMessage::ExtendedQuery { .. } => {
                    self.error_without_ready(
                        ErrorFields::error(
                            SqlState::PROTOCOL_VIOLATION,
                            "extended query protocol not supported in a replication connection",
                        ),
                        out,
                    );
                    self.skipping_till_sync = true;
                }
                FrontendMessage::FunctionCall(_) => self.error(
                    ErrorFields::error(
                        SqlState::PROTOCOL_VIOLATION,
                        "fastpath function calls not supported in a replication connection",
                    ),
                    out,
                ),
                FrontendMessage::Sync => self.ready(out),
                // Nothing is held back to flush: every answer is written as it is made.
                FrontendMessage::Flush => {}
                FrontendMessage::Terminate => self.close(out),
                // PostgreSQL ignores copy messages outside COPY: a client may still be sending
                // them after a COPY that failed.
                FrontendMessage::CopyData(_)
                | FrontendMessage::CopyDone
                | FrontendMessage::CopyFail(_)
                | FrontendMessage::StandbyStatusUpdate(_)
                | FrontendMessage::HotStandbyFeedback(_) => {}
                other => self.fatal(invalid_message_type(other.tag(), false), out),
            },
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
        self.error_without_ready(fields, out);
        self.ready(out);
    }

    /// [`Self::error`] without the ReadyForQuery that follows it.
    fn error_without_ready(&mut self, fields: ErrorFields, out: &mut Vec<Output>) {
        self.end_stream_quietly();
        self.mode = Mode::Idle;
        // PostgreSQL's error cleanup drops the session's temporary slots.
        self.drop_temporary_slots();
        out.push(Output::Msg(BackendMessage::ErrorResponse(fields)));
        out.push(Output::StatusChanged);
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
            if let Err(e) = self.storage.drop_temporary_slot(&name) {
                tracing::debug!(slot = %name, "temporary slot not dropped: {e}");
            }
        }
    }
}

impl<S: StorageView> Drop for Session<S> {
    fn drop(&mut self) {
        self.drop_temporary_slots();
    }
}

/// FATAL 08P01 for a message of type `tag` that the connection cannot take where it is, in
/// PostgreSQL's words for each place: in the middle of a copy (`streaming`, walsender.c's
/// ProcessRepliesIfAny) and between commands (postgres.c's PostgresMain, the number alone).
/// For a type the codec knows and for one it does not.
pub fn invalid_message_type(tag: u8, streaming: bool) -> ErrorFields {
    let text = if streaming {
        format!("invalid standby message type \"{}\"", char::from(tag))
    } else {
        format!("invalid frontend message type {tag}")
    };
    ErrorFields::fatal(SqlState::PROTOCOL_VIOLATION, text)
}

/// FATAL 57P01, PostgreSQL's word for a connection ended by shutdown.
pub fn admin_shutdown() -> ErrorFields {
    ErrorFields::fatal(
        SqlState::ADMIN_SHUTDOWN,
        "terminating connection due to administrator command",
    )
}
