//! walsender-actor: PostgreSQL's walsender as actix actors.
//!
//! One [`WalSender`] actor serves one replication connection: it authenticates the client,
//! answers replication commands and streams durable WAL from `wal-storage` in PostgreSQL 15's
//! CopyBoth sub-protocol, so pg_receivewal, a PostgreSQL standby and walserver's own
//! walreceiver can all stream from it. Under the overlapped commit ([`overlap`],
//! `synchronous_commit_overlap`) a synchronous walserver standby is sent WAL as soon as it is
//! written, while this node's fdatasync runs; every other client only durable WAL. A client
//! that can cut back is also told this node's commit point (rule 3), and on a standby told
//! one by its upstream every stream stops there (`WalPosition::sendable`). Its peer is the client on the socket; the node's other
//! actors reach it through the [`WalSenderRegistry`], which knows every connection, enforces
//! `max_wal_senders`, shows `pg_stat_replication`, fans out shutdown, and runs synchronous
//! replication ([`syncrep`]): on every standby reply it decides who is synchronous and
//! releases the appends their positions cover (a report counts only as far as its stream's
//! timeline is shared with the node's current one, [`overlap::counted_up_to`]), publishing what they confirmed as a watch
//! (readers on the primary stop there). For a live demotion it ends every session and holds
//! new ones ([`messages::HoldWalSenders`]) while WAL is dropped. The [`Listener`] accepts connections and
//! starts walsenders. What happens before a connection reaches the registry (clients still
//! authenticating, and those refused) is counted in [`Shared`]'s [`StartupMetrics`].
//!
//! The protocol logic is in plain state machines the actors wrap: [`startup::Handshake`] (SSL
//! negotiation and authentication; over TLS it offers SCRAM-SHA-256-PLUS when [`ServerTls`]
//! carries the certificate's channel binding data; the parameters the client sets when it
//! connects are read by `protocol_codec::client_settings` as PostgreSQL 15 reads them) and
//! [`session::Session`] (commands and streaming). They do
//! no I/O, so their tests need no sockets. The session sees storage only through a
//! [`session::StorageView`] (what storage keeps in memory: the durable end, the timeline
//! history, the slot table) and returns what touches files as effects (WAL to read or locate,
//! a [`session::StorageOp`] for a command), which the actor hands to [`storage_ops`] to run
//! on the blocking pool; so no file I/O happens on an actor thread. The walreceiver is built
//! the same way, with the same names.
//!
//! How a walsender stops:
//! - normally, when the client sends Terminate or closes the socket;
//! - on error: a FATAL (protocol violation, failed authentication, a parameter the client may
//!   not set, `max_wal_senders` reached)
//!   is sent and the connection closed; an ERROR in a command (or inside COPY) is sent with
//!   ReadyForQuery and the connection stays, as after a message of the extended query protocol
//!   (refused as PostgreSQL refuses it, the messages after it skipped up to the client's Sync);
//! - on `wal_sender_timeout`, after a keepalive at half of it went unanswered;
//! - at shutdown ([`messages::Shutdown`]): immediate ends every connection with FATAL 57P01;
//!   fast does that for connections not streaming, and lets streaming ones send all flushed
//!   WAL and wait (until a deadline) for the standby to confirm it before CommandComplete.
//!
//! What it does not own: storage (it reads through a `Wal` handle), the decision to shut down
//! (the supervisor's), appends (the supervisor makes them durable, then asks the registry to
//! wait for the synchronous standbys), the wire format (`protocol-codec`, which also holds
//! [`SERVER_VERSION`]), and the deadline timer and stream type it shares with the walreceiver
//! (`actor-util`).
//!
//! Under the `failpoints` feature two places of the commit's path are crash points
//! (`wal_storage::crash`, named in `overlap.rs`): a standby's report of WAL beyond this node's
//! flushed end, and the registry's release of appends the commit point now covers.

mod actor;
pub mod connection;
pub mod hba;
pub mod lag;
mod listener;
pub mod messages;
pub mod overlap;
mod registry;
pub mod session;
mod shared;
pub mod startup;
pub mod status;
pub mod storage_ops;
pub mod syncrep;
pub mod writer;

pub use actor::WalSender;
pub use listener::{Listener, MAX_AUTHENTICATING};
pub use registry::WalSenderRegistry;
pub use shared::{ServerTls, Shared, StartupMetrics, WalSenderSettings};

/// The `server_version` walserver reports; a protocol fact, kept in `protocol-codec` and
/// re-exported here for existing users.
pub use protocol_codec::SERVER_VERSION;
