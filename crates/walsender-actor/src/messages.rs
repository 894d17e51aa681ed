//! The actix messages of walsender-actor. Commands are imperatives, events are in the past
//! tense; each has an explicit result type.

use actix::prelude::*;

use crate::session::ShutdownMode;
use crate::status::{SharedStatus, WalSenderStatus};
use crate::WalSender;

/// Listener → registry: a connection was accepted (it may still be in its startup phase).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ConnectionOpened {
    pub pid: u32,
    pub addr: Addr<WalSender>,
}

/// WalSender → registry: the client authenticated and wants to become a walsender; refused
/// when `max_wal_senders` are already active.
#[derive(Message)]
#[rtype(result = "Result<(), TooManyWalSenders>")]
pub struct RegisterWalSender {
    pub pid: u32,
    pub status: SharedStatus,
}

/// Why [`RegisterWalSender`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyWalSenders {
    pub max_wal_senders: usize,
}

/// WalSender → registry: the standby replied or the walsender's state changed; the new facts
/// are in the shared status.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StatusChanged {
    pub pid: u32,
}

/// WalSender → registry: the connection has ended.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ConnectionClosed {
    pub pid: u32,
}

/// Anyone → registry: the rows of `pg_stat_replication`.
#[derive(Message)]
#[rtype(result = "Vec<WalSenderStatus>")]
pub struct GetReplicationStatus;

/// Supervisor → registry: end every connection as `mode` says; answered once all are gone.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ShutdownWalSenders {
    pub mode: ShutdownMode,
}

/// Supervisor → registry: end every walsender session at once and hold new ones (each is
/// ended as soon as it is accepted) until [`ResumeWalSenders`]; answered once every
/// connection open at the request has closed. A live demotion needs it: WAL the sessions may
/// already have read is about to be dropped, and a cascading standby that reconnects after
/// the role change sees the new history.
#[derive(Message)]
#[rtype(result = "()")]
pub struct HoldWalSenders;

/// Supervisor → registry: accept walsender sessions again after [`HoldWalSenders`].
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResumeWalSenders;

/// Supervisor → registry: `max_wal_senders` changed (on reload).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetMaxWalSenders(pub usize);

/// Registry → WalSender: end the connection as `mode` says.
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub struct Shutdown {
    pub mode: ShutdownMode,
}

/// Registry → WalSender: the shared settings were replaced (reload); re-read them.
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub struct SettingsChanged;

/// Supervisor → listener: stop accepting connections (the first step of shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopAccepting;

/// Anyone → listener: the address it listens on (useful when bound to port 0).
#[derive(Message)]
#[rtype(result = "std::net::SocketAddr")]
pub struct GetListenAddr;

/// Anyone → registry: how many connections are open (authenticated or not).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct CountConnections;

/// Supervisor → registry: the parsed `synchronous_standby_names` (at start and on reload).
/// Waiting appends the new setting satisfies are released at once.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetSyncStandbyNames(pub Option<crate::syncrep::SyncStandbyNames>);

/// Supervisor → registry: wait until the synchronous standbys have reached `lsn` at `level`.
/// Answered at once when no synchronous standbys are configured.
#[derive(Message)]
#[rtype(result = "Result<(), SyncWaitAbandoned>")]
pub struct WaitForSync {
    pub lsn: wal_storage::Lsn,
    pub level: crate::syncrep::WaitLevel,
}

/// The registry stopped before the standbys confirmed (the node is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncWaitAbandoned;
