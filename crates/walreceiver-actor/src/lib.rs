//! walreceiver-actor: PostgreSQL's walreceiver as an actix actor.
//!
//! A standby runs one [`WalReceiver`] while it streams. It connects to the upstream named by
//! `primary_conninfo` (a walserver primary or standby, or a real PostgreSQL 15 server) with
//! libpq's rules: each host of a host list in order, settling on the first that suits
//! `target_session_attrs`; TLS by `sslmode`; a replication startup packet; trust, cleartext,
//! md5 or SCRAM-SHA-256. It checks that the upstream has this node's system identifier, fetches the
//! history files it lacks, and streams from its durable end on its own timeline. Every
//! XLogData is written at its LSN, byte for byte, through a [`wal_storage::Wal`]; storage
//! makes it durable with group commit and says so on its watch channel, which is what makes
//! the walreceiver send a status update (write, flush, apply) upstream and what wakes this
//! node's own walsenders for cascading. When the upstream's timeline ends (it was promoted,
//! or it follows a promotion itself), the walreceiver reads the next timeline, has storage
//! follow it, and goes on streaming on the same connection. Its startup packet sets
//! `walserver.accept_unflushed=on` ([`protocol_codec::ACCEPTS_UNFLUSHED_PARAM`]): a walserver
//! upstream with the overlapped commit may send it WAL before the upstream's own fdatasync
//! ends; it reports as flushed only what its own storage has fdatasynced, as always. Such an
//! upstream also tells it the commit point ([`protocol_codec::messages::CommitPoint`]), which
//! it hands to storage (`Wal::set_told_commit_point`) so that this node's readers stop there.
//! It needs no mark from the upstream to flush at once: storage's writer syncs each batch as
//! soon as it has it, and the status update follows that flush. With
//! `synchronous_commit_overlap` on, a stream start first cuts back an unacknowledged tail
//! ([`cutback`]), never below the commit point it was told nor below what this node wrote
//! as a primary (`Wal::primary_end`: an old primary is refused until it rejoins); on the
//! upstream's own timeline only if the upstream said it is that timeline's writer
//! (`in_hot_standby = off`), since a standby's shorter end is WAL it has not received yet.
//!
//! Its peer is the upstream's walsender, on the socket. Its owner is the node's supervisor,
//! which starts it, stops it with [`messages::StopReceiver`], and is told of its life with
//! two events: [`messages::StreamingStarted`] when a stream begins, and
//! [`messages::ReceiverStopped`] with a [`StopReason`] when it ends. The owner is a pair of
//! `Recipient`s ([`messages::ReceiverOwner`]), so this crate does not know the supervisor.
//! Restarting, backoff and start requests are the owner's; a walreceiver runs once.
//!
//! The protocol logic is the plain state machine [`session::Session`]: no I/O, testable with
//! message sequences. It starts from a memory-only snapshot of local storage
//! ([`session::LocalWal`]) and returns storage work that touches files as effects
//! ([`session::StorageOp`]: history files, following a timeline), which the actor hands to
//! [`storage_ops`] to run on the blocking pool; WAL itself it returns as writes the actor
//! queues to storage's writer thread. The actor is glue: sockets, storage calls, timers,
//! events. The walsender is built the same way, with the same names.
//!
//! How a walreceiver stops:
//! - normally, never: it streams until told to stop;
//! - on error: the upstream closes the connection or reports an error (with its SQLSTATE:
//!   58P01 when it no longer has the WAL we need, 57P01 when it shuts down), the system
//!   identifiers differ, this node's WAL forked from the upstream's history (with the
//!   overlapped commit: below the commit point it was told), the upstream
//!   stays silent for `wal_receiver_timeout`, the socket or the protocol breaks, or storage
//!   fails. Each is a [`ReceiverError`] in [`StopReason::Failed`];
//! - at shutdown (or when `primary_conninfo` changes, or at promotion): [`messages::StopReceiver`]
//!   ends it at once, in any state, connecting included; it sends Terminate if connected and
//!   closes the socket. WAL already handed to storage still becomes durable: storage's writer
//!   finishes it.
//!
//! When the upstream refuses the start because it has already removed the WAL there (58P01)
//! and the configuration names an archive ([`ReceiverConfig::archive`]), the walreceiver
//! does what PostgreSQL's standby does with `restore_command`: it ends the connection, fills
//! the gap from the archive ([`gap::fill`], on the blocking pool: whole segments checked
//! against their sidecars, written with `Wal::write` like streamed WAL, never past the
//! timeline's switch point), and connects again at once from the new end. A gap the archive
//! lacks too ends it with [`ReceiverError::ArchiveGap`], and an archive that names another
//! system than this node's with [`ReceiverError::OtherSystemArchive`], taking nothing.
//!
//! It also holds what makes a standby: [`fetch_upstream_identity`] and [`init_standby`] create
//! a standby's data directory that adopts its upstream's system identifier, timeline history,
//! segment size and kind of WAL.
//!
//! What it does not own: storage (a `Wal` handle, shared with the node), the decision to run
//! (the supervisor's), the restart policy, promotion, and what applying WAL means (an
//! application reports it with [`messages::Applied`]). It does not depend on the walsender
//! crate: the deadline timer and the stream type come from `actor-util`, the time format from
//! `wal_types::time`, `SERVER_VERSION` from `protocol-codec` (the walsender is only a
//! dev-dependency, the upstream of its end-to-end tests).
//!
//! **Invariants:** WAL is handed to storage in upstream order and at the LSNs the upstream
//! gave it, so a standby's WAL is a byte-identical prefix of its upstream's, timeline by
//! timeline; the flush position reported upstream is never ahead of what storage made
//! durable; at most `max_wal_in_flight` bytes are received and not yet durable; nothing is
//! read from the upstream while storage's archive gate is closed; the socket's
//! receive low-water mark is raised only while the upstream has promised far more WAL than
//! is buffered, and is lowered when a message does not come within a grace period
//! (`low_water.rs`), so no small message waits on it.
//!
//! Under the `failpoints` feature a new durable position not yet reported upstream is a crash
//! point ([`CRASH_REPLY`], `wal_storage::crash`).

mod actor;
mod config;
pub mod connect;
pub mod cutback;
mod error;
pub mod gap;
mod identity;
mod low_water;
pub mod messages;
pub mod query;
pub mod session;
pub mod status;
pub mod storage_ops;

/// Crash point (`wal_storage::crash`, feature `failpoints`): storage made more of the stream
/// durable and the walreceiver has not yet reported it upstream. Passed before the report.
pub const CRASH_REPLY: &str = "walreceiver_actor::reply::crash";

pub use actor::WalReceiver;
pub use config::{ReceiverConfig, DEFAULT_MAX_WAL_IN_FLIGHT};
pub use error::{ReceiverError, StopReason};
pub use identity::{
    fetch_upstream_identity, init_standby, UpstreamIdentity, WALSERVER_VERSION_SUFFIX,
};
pub use session::{ApplyReporting, SessionConfig};
pub use status::{ReceiverState, ReceiverStatus};
