//! What the failover actor shows and answers: the cluster as it sees it in etcd.

use serde::{Deserialize, Serialize};

/// One member as its member key in etcd says (JSON), refreshed by the member itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub name: String,
    /// `primary` or `standby`.
    pub role: String,
    pub timeline: u32,
    /// `X/X`.
    pub flush_lsn: String,
    /// Bytes behind the leader's last published flush position, for a standby.
    pub lag_bytes: Option<u64>,
    /// Whether a standby's walreceiver is streaming.
    pub streaming: bool,
    pub conninfo: String,
    pub api_url: String,
    pub nofailover: bool,
    pub priority: u32,
    /// The term it last followed or led.
    pub term: Option<u64>,
}

/// Who holds the leader key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderView {
    pub name: String,
    /// The leader key's create revision.
    pub term: u64,
    /// The lease's remaining time as etcd reported it, in milliseconds.
    pub lease_remaining_ms: Option<u64>,
}

/// One term in the cluster's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermRecord {
    pub term: u64,
    pub leader: String,
    pub timeline: u32,
    /// `X/X`: where the leader's timeline starts.
    pub switch_lsn: String,
    /// Why: `bootstrap`, `failover`, `switchover`.
    pub reason: String,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

/// `GET /cluster`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterView {
    pub cluster: String,
    pub members: Vec<MemberInfo>,
    pub leader: Option<LeaderView>,
    /// Automatic action is off (`pause`); the leader keeps its key.
    pub paused: bool,
    /// The published synchronous standby, in `synchronous_mode` on or strict.
    pub sync_standby: Option<String>,
    pub synchronous_mode: crate::SynchronousMode,
    pub ttl_seconds: u64,
    pub history: Vec<TermRecord>,
}

/// What this node's health endpoints answer from (`GET /primary`, `GET /replica?lag=`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LocalHealth {
    /// This node holds the leader key and its own deadline has not passed.
    pub leader_with_live_lease: bool,
    /// A standby streaming from the leader.
    pub streaming: bool,
    /// Bytes behind the leader's last published position, for a standby.
    pub lag_bytes: Option<u64>,
    pub term: Option<u64>,
}
