//! Storage's health, as the writer and [`Wal::restart`](crate::Wal::restart) see it, published
//! on a watch channel so that the owner (the supervisor) hears of a failure as an event and
//! `/status` and `/metrics` can show it.
//!
//! The failure policy, which the writer (`writer.rs`) enforces:
//!
//! - A failed fsync or fdatasync is never retried and trusted. Linux may already have dropped
//!   the dirty pages it could not write and marked them clean, so a second sync can "succeed"
//!   over lost data (PostgreSQL PANICs on it since 2019; etcd exits). A write that fails other
//!   than for space is treated the same, as PostgreSQL does. The writer stops acknowledging
//!   at once: every waiter of the batch and every later request gets
//!   [`WalError::StorageFailed`](crate::WalError::StorageFailed), the flushed end stays at the
//!   last good sync (so nothing beyond it is readable or sent), and the state is `failed`.
//!   The owner then restarts storage: the data directory is reopened with the last good sync
//!   as its exact end, which re-verifies the tail, zeroes what the failed batch left and
//!   fsyncs it before any write is accepted. A control operation (promotion, following a
//!   timeline, truncation, a history file) that fails with an I/O error falls under the same
//!   rule, since it writes and syncs files too.
//! - A full disk (ENOSPC, EDQUOT) is backpressure: the batch that met it fails with
//!   [`WalError::DiskFull`](crate::WalError::DiskFull) and the state is `full`; later writes
//!   that need no new space succeed, and the next batch that succeeds makes the state `ok`.
//!   Nothing is restarted and nothing durable was lost.

use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use wal_types::time::{de_time, ser_time};

/// Where storage stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageState {
    /// Writes are accepted.
    Ok,
    /// The last batch failed for lack of space; writes that need no new space succeed.
    Full,
    /// A sync (or a write) failed: writes are refused until storage is restarted.
    Failed,
    /// Storage is being reopened after a failure.
    Restarting,
}

impl StorageState {
    pub const ALL: [StorageState; 4] = [
        StorageState::Ok,
        StorageState::Full,
        StorageState::Failed,
        StorageState::Restarting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StorageState::Ok => "ok",
            StorageState::Full => "full",
            StorageState::Failed => "failed",
            StorageState::Restarting => "restarting",
        }
    }

    /// Writes are refused until a restart.
    pub fn is_failed(self) -> bool {
        matches!(self, StorageState::Failed | StorageState::Restarting)
    }
}

/// Storage's health, as `/status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageHealth {
    pub state: StorageState,
    /// What made the state other than `ok`: the failed operation and its error. While
    /// `restarting`, the failure being recovered from; after a failed restart, its error.
    pub error: Option<String>,
    /// The file the failure was met on.
    pub path: Option<PathBuf>,
    /// When the state began.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    pub since: SystemTime,
    /// How many times storage was reopened after a failure, successfully.
    pub restarts: u64,
    /// How many reopenings failed (each is retried by the owner's restart policy).
    pub failed_restarts: u64,
}

impl Default for StorageHealth {
    fn default() -> Self {
        StorageHealth {
            state: StorageState::Ok,
            error: None,
            path: None,
            since: SystemTime::now(),
            restarts: 0,
            failed_restarts: 0,
        }
    }
}

/// The sending side, shared by every opening of one data directory.
pub(crate) type HealthTx = watch::Sender<StorageHealth>;

/// Moves `tx` to `state` (with its error and path), publishing only a change.
pub(crate) fn set(
    tx: &HealthTx,
    state: StorageState,
    error: Option<String>,
    path: Option<PathBuf>,
) {
    tx.send_if_modified(|h| {
        if h.state == state && h.error == error && h.path == path {
            return false;
        }
        if h.state != state {
            h.since = SystemTime::now();
        }
        h.state = state;
        h.error = error;
        h.path = path;
        true
    });
}
