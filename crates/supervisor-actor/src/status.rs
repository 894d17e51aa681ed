//! What `/status` shows of a node ([`NodeStatus`], the answer to
//! [`GetNodeStatus`](crate::GetNodeStatus)): its role, positions, replication rows, its
//! walreceiver with the restart state, storage's health and the supervised services.

use serde::Serialize;
use wal_storage::{Lsn, StorageHealth, SystemId, TimelineId, WalFormat};
use walreceiver_actor::ReceiverStatus;
use walsender_actor::status::WalSenderStatus;

use crate::restart::{RestartState, RetrySchedule};

/// Whether the node serves as a primary or follows an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeRole {
    Primary,
    Standby,
}

/// The walreceiver part of `/status`: `pg_stat_wal_receiver`'s columns, and the supervisor's
/// restart state, shown even while no walreceiver runs.
#[derive(Clone, Debug, Serialize)]
pub struct WalReceiverInfo {
    /// `pid`: the current walreceiver's id, if one runs.
    pub pid: Option<u64>,
    #[serde(flatten)]
    pub status: Option<ReceiverStatus>,
    /// Why no walreceiver is streaming right now, if none is.
    pub not_streaming_reason: Option<String>,
    #[serde(flatten)]
    pub restart: RestartState,
    /// When a failed walreceiver is retried (`wal_retrieve_retry_interval` and the rest).
    pub retry_schedule: RetrySchedule,
}

/// What `/status` shows.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub role: NodeRole,
    pub system_identifier: SystemId,
    pub timeline: TimelineId,
    pub flush_lsn: Lsn,
    /// The end of the WAL acknowledged at the node's durability level, which readers see
    /// ([`Node::acknowledged`](crate::Node::acknowledged)): `flush_lsn`, except on a primary
    /// with synchronous standbys and a synchronous `synchronous_commit`.
    pub acknowledged_lsn: Lsn,
    pub wal_format: WalFormat,
    pub replication: Vec<WalSenderStatus>,
    pub wal_receiver: Option<WalReceiverInfo>,
    /// Storage's health: `ok`, `full`, `failed` or `restarting`, the error and the file of
    /// the failure, since when, and how often storage was reopened.
    pub storage: StorageHealth,
    /// The services the supervisor stops with the node ([`SuperviseService`](crate::SuperviseService)).
    pub services: Vec<ServiceInfo>,
    /// The latest leadership term this node knows of (led or followed); `None` without
    /// automatic failover.
    pub term: Option<u64>,
}

/// One supervised service in status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceInfo {
    pub name: String,
    /// `running`, `stopped` (by the supervisor, or cleanly on its own) or `failed`.
    pub state: &'static str,
    /// Why it failed, or why it ended when nobody stopped it.
    pub last_error: Option<String>,
}
