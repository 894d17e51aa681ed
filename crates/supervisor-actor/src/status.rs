//! What `/status` shows of a node ([`NodeStatus`], the answer to
//! [`GetNodeStatus`](crate::GetNodeStatus)): its role, positions, replication rows, its
//! walreceiver with the restart state, storage's health and the supervised services. The
//! admin API writes these types as they are, and its clients (the CLI, the load tool, the
//! test harness) read `/status` back into them, so that no reader walks the JSON by hand.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use wal_storage::{Lsn, StorageHealth, SystemId, TimelineId, WalFormat};
use wal_types::time::{de_opt_time, ser_opt_time};
use walreceiver_actor::{ReceiverState, ReceiverStatus};
use walsender_actor::status::{WalSenderState, WalSenderStatus};

use crate::restart::{RestartState, RetrySchedule};

/// Whether the node serves as a primary or follows an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeRole {
    Primary,
    Standby,
}

/// The walreceiver part of `/status`: `pg_stat_wal_receiver`'s columns, and the supervisor's
/// restart state, shown even while no walreceiver runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// Set once the walreceiver refused to fill a gap from an archive that names another
    /// system (it took nothing from it); cleared once the node's WAL passes the gap.
    #[serde(default)]
    pub archive_alarm: Option<String>,
}

/// What `/status` shows.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// Where this node stands in its failover cluster; `None` without automatic failover.
    /// The supervisor leaves it empty: whoever runs the failover service beside the node (the
    /// admin API) fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverStatus>,
    /// The overlapped commit on this node.
    #[serde(default)]
    pub commit: CommitStatus,
}

/// The overlapped commit (`synchronous_commit_overlap`) as one node sees it: the commit point
/// it knows, what it cut back at stream starts, and the alarm of a refused cut.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitStatus {
    /// The commit point this node knows (its own on a primary, its upstream's on a standby);
    /// `None` where the flushed end is the commit point.
    pub commit_point: Option<Lsn>,
    /// Tails cut back since this node started, and their bytes: unacknowledged ones at a
    /// stream start (rule 4), and WAL past a new leader's fork when following it.
    pub tail_cuts: u64,
    pub tail_cut_bytes: u64,
    /// Cuts refused because the upstream's history (or, in a synchronous failover mode, the
    /// new leader's) shares less than the commit point.
    pub tail_cut_refusals: u64,
    /// Set while the walreceiver is stopped by such a refusal: the upstream lacks
    /// acknowledged WAL this node holds, and an operator must choose the upstream.
    pub alarm: Option<String>,
}

/// What the node does now, as [`Node::state`](crate::Node::state) publishes it at each
/// change: its role, and whether its walreceiver streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub role: NodeRole,
    /// A standby's walreceiver streams from its upstream.
    pub streaming: bool,
}

/// The failover service's part in `/status`: whether this node is a member of its cluster
/// now, and what it knows of the cluster's leadership.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverStatus {
    pub state: MembershipState,
    /// Why this node is not a member now (`not_joined` and `left`).
    pub reason: Option<String>,
    /// Since when it is in this state.
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub since: Option<SystemTime>,
    /// The member the leader key names, as last seen.
    pub leader: Option<String>,
    /// The latest term this node knows of.
    pub term: Option<u64>,
    /// Automatic action is off cluster-wide.
    pub paused: bool,
}

/// Whether a node under failover takes part in its cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MembershipState {
    /// Not a member: etcd is out of reach, the first join has not succeeded yet, or the lease
    /// was lost. Such a node neither leads nor counts as a standby of the cluster.
    NotJoined,
    /// A member on a live lease, not leading.
    Joined,
    /// A member that holds the leader key with its fence granted.
    Leading,
    /// Out of the cluster for good: another process holds its member name.
    Left,
}

impl MembershipState {
    pub fn as_str(self) -> &'static str {
        match self {
            MembershipState::NotJoined => "not joined",
            MembershipState::Joined => "joined",
            MembershipState::Leading => "leading",
            MembershipState::Left => "left",
        }
    }
}

impl NodeStatus {
    /// The `pg_stat_replication` row of `application_name`, if it is connected.
    pub fn sender(&self, application_name: &str) -> Option<&WalSenderStatus> {
        self.replication
            .iter()
            .find(|r| r.application_name == application_name)
    }

    /// Whether `application_name` streams from this node, caught up at least once.
    pub fn streams_to(&self, application_name: &str) -> bool {
        self.sender(application_name)
            .is_some_and(|r| r.state == WalSenderState::Streaming)
    }

    /// Whether this node's walreceiver streams.
    pub fn receiving(&self) -> bool {
        self.receiver_state() == Some(ReceiverState::Streaming)
    }

    /// The state of this node's walreceiver, if one runs.
    pub fn receiver_state(&self) -> Option<ReceiverState> {
        Some(self.wal_receiver.as_ref()?.status.as_ref()?.status)
    }
}

/// One supervised service in status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceInfo {
    pub name: String,
    pub state: ServiceState,
    /// Why it failed, or why it ended when nobody stopped it.
    pub last_error: Option<String>,
}

/// Where a supervised service stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceState {
    Running,
    /// Stopped by the supervisor, or ended cleanly on its own.
    Stopped,
    Failed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::time::{Duration, SystemTime};

    use crate::restart::RestartPolicy;

    /// `/status` reads back into the type the server wrote it from, field for field: a
    /// standby with a walreceiver (its row flattened beside the restart state) and a
    /// walsender, and one with no walreceiver at all.
    #[test]
    fn status_reads_back_as_written() {
        let addr: SocketAddr = "10.0.0.2:40000".parse().unwrap();
        let mut sender = WalSenderStatus::new(7, "walserver", "s1", addr);
        sender.flush_lsn = Some(Lsn(0x1_0000_0060));
        sender.write_lag = Some(Duration::from_micros(1_234));
        sender.reply_time =
            Some(SystemTime::UNIX_EPOCH + Duration::from_micros(1_796_000_000_123_456));
        let mut receiving = ReceiverStatus::new("host=a port=5433".into(), Some("s".into()));
        receiving.flushed_lsn = Some(Lsn(0x200_0000));
        let mut restart = RestartState::default();
        restart.attempts = 2;
        restart.last_error = Some("connection refused".into());
        let mut status = NodeStatus {
            role: NodeRole::Standby,
            system_identifier: SystemId(0x7fff_0000_1234_5678),
            timeline: TimelineId(3),
            flush_lsn: Lsn(0x200_0000),
            acknowledged_lsn: Lsn(0x1ff_0000),
            wal_format: WalFormat::Walserver,
            replication: vec![sender],
            wal_receiver: Some(WalReceiverInfo {
                pid: Some(4),
                status: Some(receiving),
                not_streaming_reason: None,
                restart,
                retry_schedule: RestartPolicy::default().schedule(),
                archive_alarm: None,
            }),
            storage: StorageHealth::default(),
            services: vec![ServiceInfo {
                name: "admin API".into(),
                state: ServiceState::Failed,
                last_error: Some("bind".into()),
            }],
            term: Some(9),
            failover: Some(FailoverStatus {
                state: MembershipState::NotJoined,
                reason: Some("cannot reach etcd: connection refused".into()),
                since: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000)),
                leader: Some("n1".into()),
                term: Some(9),
                paused: false,
            }),
            commit: CommitStatus {
                commit_point: Some(Lsn(0x1ff_0000)),
                tail_cuts: 1,
                tail_cut_bytes: 4096,
                tail_cut_refusals: 0,
                alarm: None,
            },
        };
        for _ in 0..2 {
            let json = serde_json::to_value(&status).unwrap();
            let back: NodeStatus = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(serde_json::to_value(&back).unwrap(), json);
            assert_eq!(back.flush_lsn, status.flush_lsn);
            assert_eq!(back.failover, status.failover);
            assert_eq!(
                back.wal_receiver.as_ref().map(|r| r.status.is_some()),
                status.wal_receiver.as_ref().map(|r| r.status.is_some())
            );
            // Without a walreceiver's row, the flattened part reads back as none.
            if let Some(r) = status.wal_receiver.as_mut() {
                r.status = None;
                r.pid = None;
            }
        }
        let json = serde_json::to_value(&status).unwrap();
        let back: NodeStatus = serde_json::from_value(json).unwrap();
        assert!(back.wal_receiver.is_some_and(|r| r.status.is_none()));
    }
}
