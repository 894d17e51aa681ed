//! The messages a failover actor sends the supervisor: promote for a term, follow a leader
//! (a standby re-targets, a primary is demoted), and which standbys' acknowledgements count.
//! The supervisor stays the only one that acts on the node; the failover actor decides.

use actix::prelude::*;
use serde::Serialize;
use wal_storage::{Lsn, TimelineId, WalError};
use walreceiver_actor::ReceiverConfig;
use walsender_actor::syncrep::SyncStandbyNames;

use crate::supervisor::{PromoteError, Promoted};

/// Promote this standby as the leader of `term`: as [`Promote`](crate::Promote), with the
/// term recorded beside the new timeline in its history, so that the timeline history is also
/// the history of leadership.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "Result<Promoted, PromoteError>")]
pub struct PromoteForTerm {
    pub term: u64,
}

/// Follow the leader of `term` at `upstream`. A standby re-targets its walreceiver at once
/// (no reconnect delay). A primary is demoted live: it stops taking appends, drops its WAL
/// beyond the point where the leader's history forked from it (saying how much), becomes a
/// standby of the leader and streams from it. A standby whose WAL went past the fork is cut
/// back the same way.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<Followed, FollowError>")]
pub struct FollowLeader {
    pub upstream: ReceiverConfig,
    pub term: u64,
}

/// What following a leader did.
#[derive(Clone, Debug, Serialize)]
pub struct Followed {
    /// The node was a primary and is now a standby.
    pub demoted: bool,
    /// Where the leader's history forked from this node's, if it did.
    pub fork: Option<Lsn>,
    /// Bytes of WAL beyond the fork that were dropped.
    pub dropped_bytes: u64,
    /// The node's timeline after following.
    pub timeline: TimelineId,
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
    #[error("cannot follow the leader: {0}")]
    Storage(#[from] WalError),
    #[error("cannot write standby.signal: {0}")]
    StandbySignal(String),
}

/// Which standbys' acknowledgements count for synchronous appends from now on: set by a
/// failover actor in `synchronous_mode` after it has published the choice, so that only a
/// standby named in the cluster's store before its acknowledgements counted can be promoted.
/// `None` makes appends asynchronous (waiting appends are released).
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct SetSyncStandbys {
    pub names: Option<SyncStandbyNames>,
}

/// Makes sure this node holds a physical replication slot by each of `names` (made
/// persistent, reserving WAL from the flushed end, as PostgreSQL's
/// `pg_create_physical_replication_slot(name, true)`): the slots a leader keeps for the other
/// members, so that the WAL a member has not received yet stays while it is behind or down.
/// Existing slots are left as they are. The answer says which were made, and lists every slot
/// whose name starts with `prefix` afterwards (the slots of this kind the node holds).
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<MemberSlots, WalError>")]
pub struct EnsureMemberSlots {
    pub names: Vec<String>,
    pub prefix: String,
}

/// Drops the slots named `names` that exist and are not in use (a slot a walsender streams
/// through is left, and said so in the log; the caller asks again later). The answer says
/// which were dropped, and lists every slot whose name starts with `prefix` afterwards.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<MemberSlots, WalError>")]
pub struct DropMemberSlots {
    pub names: Vec<String>,
    pub prefix: String,
}

/// What [`EnsureMemberSlots`] or [`DropMemberSlots`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemberSlots {
    /// The slots made (ensuring) or dropped (dropping).
    pub changed: Vec<String>,
    /// Every slot with the prefix the node holds afterwards, sorted.
    pub held: Vec<String>,
}
