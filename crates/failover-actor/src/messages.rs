//! The failover actor's messages, for the admin API and the CLI behind it.

use actix::prelude::*;
use serde::Serialize;

use crate::error::FailoverError;
use crate::view::{ClusterView, LocalHealth, TermRecord};

/// `GET /cluster`.
#[derive(Message)]
#[rtype(result = "Result<ClusterView, FailoverError>")]
pub struct GetClusterView;

/// `GET /primary`, `GET /replica`: from this node's own state, without a trip to etcd.
#[derive(Message)]
#[rtype(result = "LocalHealth")]
pub struct GetLocalHealth;

/// `/status`'s `failover`: whether this node is a member of its cluster now (and why not),
/// the leader and term it knows of, and whether the cluster is paused; from its own state,
/// without a trip to etcd.
#[derive(Message)]
#[rtype(result = "supervisor_actor::FailoverStatus")]
pub struct GetFailoverStatus;

/// `/metrics`: what this member knows of the cluster and of itself, from its own state,
/// without a trip to etcd.
#[derive(Message)]
#[rtype(result = "FailoverMetrics")]
pub struct GetFailoverMetrics;

/// The failover facts `/metrics` shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FailoverMetrics {
    /// This node leads, with its fence granted.
    pub leading: bool,
    /// The latest term this node knows of (led or followed).
    pub term: Option<u64>,
    /// A leader's time left before its fence's deadline (its last confirmed renewal plus the
    /// ttl minus a margin), in seconds.
    pub lease_remaining_seconds: Option<f64>,
    /// Automatic action is paused cluster-wide.
    pub paused: bool,
    /// The leader key's lease, as configured (or as etcd granted it, if lower).
    pub ttl_seconds: f64,
    /// Seconds since etcd last answered a renewal or a watch; `None` before the first answer.
    pub since_etcd_contact_seconds: Option<f64>,
    /// Failed etcd calls, by kind (every kind, in `etcd_gateway::ErrorKind::ALL`'s order).
    pub etcd_errors: Vec<(&'static str, u64)>,
    /// Terms this node took up, by the reason its history records: `bootstrap`, `failover`,
    /// `switchover`, `restart`.
    pub terms_taken: Vec<(String, u64)>,
    /// The synchronous standby published in etcd.
    pub sync_standby: Option<String>,
    /// The leader the key names.
    pub leader: Option<String>,
}

/// `walserver cluster slots add NAME`: makes `name` a permanent slot (kept on whichever
/// member leads, its position copied to the standbys). `true` if it was not one already.
#[derive(Message)]
#[rtype(result = "Result<bool, FailoverError>")]
pub struct AddPermanentSlot {
    pub name: String,
}

/// `walserver cluster slots remove NAME`: `name` is no longer a permanent slot, and every
/// member drops its slot of that name. `true` if it was one.
#[derive(Message)]
#[rtype(result = "Result<bool, FailoverError>")]
pub struct RemovePermanentSlot {
    pub name: String,
}

/// Storage made or dropped a slot, or a slot's restart point entered another segment.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct SlotsMoved;

/// `walserver cluster history`.
#[derive(Message)]
#[rtype(result = "Result<Vec<TermRecord>, FailoverError>")]
pub struct GetHistory;

/// A planned switchover with zero loss: appends pause, the candidate (or the best standby)
/// catches up, the key is handed over, the old primary follows.
#[derive(Message)]
#[rtype(result = "Result<SwitchoverReport, FailoverError>")]
pub struct Switchover {
    pub candidate: Option<String>,
}

/// A forced failover to `candidate`, even with the leader alive; acknowledged appends the
/// candidate lacks are lost, and the report says how many bytes it was behind.
#[derive(Message)]
#[rtype(result = "Result<SwitchoverReport, FailoverError>")]
pub struct Failover {
    pub candidate: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct SwitchoverReport {
    pub old_leader: Option<String>,
    pub new_leader: String,
    pub term: u64,
    /// How long appends were refused on the old leader, in milliseconds.
    pub appends_paused_ms: u64,
    /// For a forced failover: how far behind the old leader the candidate was, in bytes.
    pub candidate_lag_bytes: Option<u64>,
}

/// Automatic action off cluster-wide: no promotion, no demotion; the leader keeps its key.
#[derive(Message)]
#[rtype(result = "Result<(), FailoverError>")]
pub struct Pause;

/// Automatic action on again.
#[derive(Message)]
#[rtype(result = "Result<(), FailoverError>")]
pub struct Resume;

/// Stops the actor: the fence closes at once; with `release` the lease is revoked too (its
/// member key, and the leader key if it held it, go with it, so a successor need not wait the
/// ttl). Without, the lease expires by its ttl, as after a crash.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopFailover {
    pub release: bool,
}

/// What this node does in the cluster, as a watch that changes when it does: whoever needs
/// to wait for it (the binary's health, tests) waits on the change instead of asking again.
#[derive(Message)]
#[rtype(result = "tokio::sync::watch::Receiver<Leadership>")]
pub struct SubscribeLeadership;

/// This node's part in the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Leadership {
    /// The term it leads, with the fence granted (set after each confirmed renewal).
    pub leading: Option<u64>,
    /// The leader and term it follows (after its supervisor accepted `FollowLeader`).
    pub following: Option<(String, u64)>,
}

/// The member slots this node holds, sorted, as a watch that changes after each slot
/// operation that changed them (`None` until the first one): for waiting on a slot to be made
/// or dropped rather than asking again.
#[derive(Message)]
#[rtype(result = "tokio::sync::watch::Receiver<Option<Vec<String>>>")]
pub struct SubscribeMemberSlots;
