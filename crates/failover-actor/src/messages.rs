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

/// Stops the actor: the fence closes at once, then the lease is revoked (its member key, and
/// the leader key if it held it, go with it, so a successor need not wait the ttl).
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopFailover;
