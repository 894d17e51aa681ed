//! The errors of supervisor-actor: one enum per request, each the `Err` of one answer.
//!
//! The house rule is one error enum per library crate; this crate keeps four because each has
//! its own audience and its callers match on its variants: [`AppendError`] answers
//! [`AppendRecords`](crate::AppendRecords) (an HTTP status and a client's retry decision hang
//! on each variant, and two are indeterminate outcomes), [`PromoteError`] answers
//! [`Promote`](crate::Promote) and [`PromoteForTerm`](crate::PromoteForTerm),
//! [`FollowError`] answers [`FollowLeader`](crate::FollowLeader) (the failover actor retries
//! on [`FollowError::NoSlot`]), and [`NodeError`] is why a node did not start, for the
//! operator. One enum for all would make every caller handle variants its request can never
//! produce.

use std::net::SocketAddr;
use std::path::PathBuf;

use wal_storage::{Lsn, TimelineId, WalError};
use walreceiver_actor::ReceiverError;

use crate::durability::Durability;

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("cannot append: this node is a standby; append on the primary")]
    Standby,
    #[error("cannot append: this node relays PostgreSQL WAL, which walserver does not write")]
    RelayedPostgresWal,
    #[error("cannot append: the node is shutting down")]
    ShuttingDown,
    #[error("no records to append")]
    Empty,
    #[error(transparent)]
    Storage(#[from] WalError),
    /// The records are durable on this node but the synchronous standbys did not confirm them
    /// within `synchronous_wait_timeout`: an indeterminate outcome (they may or may not
    /// survive a failover).
    #[error("indeterminate: the append is durable locally at {end_lsn} but was not confirmed by the synchronous standbys within synchronous_wait_timeout ({durability} requested); it may or may not survive a failover")]
    NotConfirmed {
        end_lsn: Lsn,
        durability: Durability,
    },
    /// Refused before anything was written: under automatic failover this node does not hold
    /// the cluster's leadership (or its grant ran out, or a role change is in progress).
    #[error("cannot append: this node does not hold the cluster's leadership{}; append on the leader", term.map(|t| format!(" (last known term {t})")).unwrap_or_default())]
    NotLeader { term: Option<u64> },
    /// The records are durable on this node, but its leadership ended before it could answer:
    /// not acknowledged, and they may or may not survive a failover.
    #[error("indeterminate: the append is durable locally at {end_lsn} but not acknowledged: {reason}; it may or may not survive a failover")]
    Indeterminate { end_lsn: Lsn, reason: String },
}

impl AppendError {
    /// Whether the records may have been written and kept (durable here, not acknowledged):
    /// a client must not assume either that they are lost or that they will survive.
    pub fn is_indeterminate(&self) -> bool {
        matches!(
            self,
            AppendError::NotConfirmed { .. } | AppendError::Indeterminate { .. }
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    #[error("this node is already a primary")]
    NotStandby,
    #[error("a promotion is already in progress")]
    InProgress,
    #[error("the node is shutting down")]
    ShuttingDown,
    #[error("this node is under automatic failover: promote it through the cluster (`walserver cluster failover --candidate NAME`, POST /failover)")]
    ManagedByFailover,
    #[error("cannot promote: {0}")]
    Storage(#[from] WalError),
}

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("the node is shutting down")]
    ShuttingDown,
    #[error("a promotion or another change of upstream is in progress")]
    InProgress,
    #[error("this node relays PostgreSQL WAL: it follows its upstream's promotions by itself")]
    RelayedPostgresWal,
    #[error("cannot identify the leader: {0}")]
    Upstream(String),
    /// The leader does not hold the slot this node streams through (yet: a new leader makes
    /// its members' slots as it starts leading, and a member that races it tries again).
    #[error("the leader has no replication slot \"{slot}\" yet")]
    NoSlot { slot: String },
    #[error(
        "the leader has system identifier {upstream}, this node {local}: it is another cluster"
    )]
    OtherCluster { upstream: String, local: String },
    #[error(
        "this node's timeline {local} is not in the history of the leader's timeline {upstream}"
    )]
    NotInHistory {
        local: TimelineId,
        upstream: TimelineId,
    },
    /// The leader's history names this node's timeline, but not this node's timeline of that
    /// number: the two were made apart (`wal_storage::departs_from`), so no point of it is
    /// known to be shared and nothing is cut.
    #[error("this node's timeline {local} is not the leader's timeline of that number: {detail}; the two were made apart and their WAL may differ at the same LSNs, so nothing is cut: make this node again from the leader (walserver init --standby)")]
    TimelineClash { local: TimelineId, detail: String },
    /// The overlapped commit's rule 4 for a fork cut: the leader, chosen to hold everything
    /// acknowledged, forked from this node's history below the commit point it was told.
    #[error("refusing to follow the leader: its history forked from this node's at {fork}, below the commit point {commit_point} this node was told; the leader lacks acknowledged WAL this node holds")]
    BelowCommitPoint { fork: Lsn, commit_point: Lsn },
    #[error("cannot follow the leader: {0}")]
    Storage(#[from] WalError),
    #[error("cannot write standby.signal: {0}")]
    StandbySignal(String),
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Storage(#[from] WalError),
    // The source's text is not repeated here: whoever prints the whole chain prints it once.
    #[error("cannot listen on {addr} (listen)")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the storage thread panicked while preparing the data directory")]
    OpenPanicked,
    /// A standby's upstream: its conninfo does not parse, or it cannot say who it is.
    #[error("upstream: {0}")]
    Upstream(#[from] ReceiverError),
    #[error("{context}: {source}")]
    DataDir {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not empty and is not a walserver data directory: give a missing or empty directory for a new node", dir.display())]
    NotADataDirectory {
        dir: PathBuf,
        /// What it holds: the first few names, in backquotes.
        found: String,
    },
    #[error("{} holds standby.signal, so it is a standby's data directory: start it as a standby, or promote it first", dir.display())]
    StandbyDirectory { dir: PathBuf },
    #[error("{} is not valid: {reason}", path.display())]
    BadStandbySignal { path: PathBuf, reason: String },
    #[error("invalid {name}: {reason}")]
    InvalidSetting { name: &'static str, reason: String },
}
