//! Appending walserver records on a primary, with a durability level.
//!
//! Every way of appending (the embedding message, HTTP `POST /wal`, `walserver append`) ends
//! in [`AppendRecords`], handled by the supervisor: storage's group commit makes the records
//! durable locally, then the append waits until its durability level holds.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix::prelude::*;
use bytes::Bytes;
use serde::Serialize;
use wal_storage::{Lsn, TimelineId, WalError};
use wal_types::metrics::Histogram;

/// How durable an append must be before it is acknowledged, with PostgreSQL's
/// `synchronous_commit` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Flushed on this node.
    Local,
    /// Also written (not necessarily flushed) by the synchronous standbys.
    RemoteWrite,
    /// Also flushed by the synchronous standbys (PostgreSQL's `on`, "remote flush").
    On,
    /// Also applied by the synchronous standbys' applications.
    RemoteApply,
}

impl Durability {
    pub const ALL: [Durability; 4] = [
        Durability::Local,
        Durability::RemoteWrite,
        Durability::On,
        Durability::RemoteApply,
    ];
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Durability, String> {
        match s.to_ascii_lowercase().as_str() {
            "local" | "off" => Ok(Durability::Local),
            "remote_write" => Ok(Durability::RemoteWrite),
            "on" | "remote_flush" | "true" | "yes" | "1" => Ok(Durability::On),
            "remote_apply" => Ok(Durability::RemoteApply),
            _ => Err(format!(
                "invalid durability {s:?}: expected local, remote_write, on (remote_flush) or remote_apply"
            )),
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Durability::Local => "local",
            Durability::RemoteWrite => "remote_write",
            Durability::On => "on",
            Durability::RemoteApply => "remote_apply",
        })
    }
}

/// How appends wait for synchronous standbys: PostgreSQL's `synchronous_standby_names`,
/// `synchronous_commit`, and walserver's `synchronous_wait_timeout`.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncSettings {
    pub standby_names: Option<walsender_actor::syncrep::SyncStandbyNames>,
    /// The durability of an append that does not name one.
    pub default_durability: Durability,
    /// After this long an append still waiting for standbys fails with
    /// [`AppendError::NotConfirmed`]; `None` waits as long as it takes, as PostgreSQL does.
    pub wait_timeout: Option<std::time::Duration>,
}

impl Default for SyncSettings {
    fn default() -> Self {
        SyncSettings {
            standby_names: None,
            default_durability: Durability::On,
            wait_timeout: None,
        }
    }
}

impl Durability {
    /// The standby position this level waits for, `None` for `local`.
    pub fn wait_level(self) -> Option<walsender_actor::syncrep::WaitLevel> {
        use walsender_actor::syncrep::WaitLevel;
        match self {
            Durability::Local => None,
            Durability::RemoteWrite => Some(WaitLevel::Write),
            Durability::On => Some(WaitLevel::Flush),
            Durability::RemoteApply => Some(WaitLevel::Apply),
        }
    }
}

/// Append records; answered with their end LSNs once `durability` holds (the node's
/// `synchronous_commit` when `None`).
#[derive(Message, Debug)]
#[rtype(result = "Result<Appended, AppendError>")]
pub struct AppendRecords {
    pub records: Vec<Bytes>,
    pub durability: Option<Durability>,
}

/// Where appended records ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Appended {
    /// The end of the last record: wait for this LSN to read your writes elsewhere.
    pub end_lsn: Lsn,
    /// The end of each record, in order.
    pub record_ends: Vec<Lsn>,
    pub timeline: TimelineId,
    pub durability: Durability,
}

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

/// What `/metrics` shows of appends, counted by the supervisor as it answers them, by the
/// durability level each asked for (the node's default when it named none).
#[derive(Debug, Default)]
pub struct AppendMetrics {
    by_level: [LevelCounts; 4],
    /// From the request's arrival to its answer, for appends that succeeded.
    pub latency_seconds: Histogram,
    /// How long acknowledged appends waited for the synchronous standbys, after their local
    /// flush; appends that did not wait (`local`, or no synchronous standbys) are not in it.
    pub sync_wait_seconds: Histogram,
}

#[derive(Debug, Default)]
struct LevelCounts {
    appends: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    failures: AtomicU64,
}

/// The counts of one durability level at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendCounts {
    /// Appends acknowledged (each may hold many records).
    pub appends: u64,
    pub records: u64,
    /// Payload bytes of the records acknowledged.
    pub bytes: u64,
    /// Appends refused or failed, including those durable locally but not confirmed.
    pub failures: u64,
}

impl AppendMetrics {
    pub fn counts(&self, level: Durability) -> AppendCounts {
        let c = &self.by_level[level as usize];
        AppendCounts {
            appends: c.appends.load(Ordering::Relaxed),
            records: c.records.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn acknowledged(
        &self,
        level: Durability,
        records: u64,
        bytes: u64,
        latency: Duration,
    ) {
        let c = &self.by_level[level as usize];
        c.appends.fetch_add(1, Ordering::Relaxed);
        c.records.fetch_add(records, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.latency_seconds.observe(latency);
    }

    pub(crate) fn failed(&self, level: Durability) {
        self.by_level[level as usize]
            .failures
            .fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_are_counted_by_their_level() {
        let m = AppendMetrics::default();
        m.acknowledged(Durability::Local, 2, 300, Duration::from_millis(1));
        m.acknowledged(Durability::Local, 1, 5, Duration::from_millis(2));
        m.failed(Durability::On);
        let local = m.counts(Durability::Local);
        assert_eq!((local.appends, local.records, local.bytes), (2, 3, 305));
        assert_eq!(local.failures, 0);
        assert_eq!(m.counts(Durability::On).failures, 1);
        assert_eq!(m.counts(Durability::On).appends, 0);
        assert_eq!(m.counts(Durability::RemoteApply), AppendCounts::default());
        // Failures are not timed: the histogram counts acknowledged appends only.
        assert_eq!(m.latency_seconds.snapshot().count, 2);
    }

    #[test]
    fn every_level_has_its_own_counts() {
        for (i, d) in Durability::ALL.into_iter().enumerate() {
            assert_eq!(d as usize, i, "{d} indexes the counts");
        }
    }
}
