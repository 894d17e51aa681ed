//! What a walsender shows about itself: the facts of PostgreSQL's `pg_stat_replication`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use wal_storage::{Lsn, TimelineId};
use wal_types::time::{de_lag, de_opt_time, de_time, ser_lag, ser_opt_time, ser_time};

/// PostgreSQL's `WalSndState`, shown in `pg_stat_replication.state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WalSenderState {
    /// Connected, not streaming (running commands between streams).
    Startup,
    /// Streaming, but not yet caught up with the flushed end since the stream began.
    Catchup,
    /// Streaming and caught up at least once.
    Streaming,
    /// Draining at shutdown.
    Stopping,
}

/// One row of `pg_stat_replication`, as a walsender knows it. `sync_priority` and
/// `sync_state` are decided by the synchronous-replication tracker, which fills them in.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WalSenderStatus {
    /// A connection number, standing in for PostgreSQL's pid.
    pub pid: u32,
    pub usename: String,
    pub application_name: String,
    pub client_addr: String,
    pub client_port: u16,
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    pub backend_start: SystemTime,
    pub state: WalSenderState,
    pub timeline: Option<TimelineId>,
    pub slot_name: Option<String>,
    pub sent_lsn: Option<Lsn>,
    pub write_lsn: Option<Lsn>,
    pub flush_lsn: Option<Lsn>,
    pub replay_lsn: Option<Lsn>,
    /// The timeline the client was streaming when it reported the three positions above:
    /// the synchronous quorum counts them only on the node's current timeline (the
    /// overlapped commit's rule 1, [`crate::overlap::counted_up_to`]). Not a column of
    /// pg_stat_replication.
    #[serde(skip)]
    pub reported_on: Option<TimelineId>,
    #[serde(serialize_with = "ser_lag", deserialize_with = "de_lag")]
    pub write_lag: Option<Duration>,
    #[serde(serialize_with = "ser_lag", deserialize_with = "de_lag")]
    pub flush_lag: Option<Duration>,
    #[serde(serialize_with = "ser_lag", deserialize_with = "de_lag")]
    pub replay_lag: Option<Duration>,
    pub sync_priority: u32,
    pub sync_state: String,
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub reply_time: Option<SystemTime>,
    /// From hot standby feedback: the standby's xmin and its epoch, as sent.
    pub backend_xmin: Option<u32>,
    pub backend_xmin_epoch: Option<u32>,
}

/// A walsender's status, written by its session and read by the registry, so that showing
/// `pg_stat_replication` costs the walsender no messages.
pub type SharedStatus = Arc<Mutex<WalSenderStatus>>;

/// Locks a status; the data is plain and consistent between statements, so a poisoned lock
/// (a panic elsewhere) is still safe to read.
pub fn lock(s: &SharedStatus) -> MutexGuard<'_, WalSenderStatus> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl WalSenderStatus {
    pub fn shared(self) -> SharedStatus {
        Arc::new(Mutex::new(self))
    }

    pub fn new(
        pid: u32,
        usename: &str,
        application_name: &str,
        addr: SocketAddr,
    ) -> WalSenderStatus {
        WalSenderStatus {
            pid,
            usename: usename.to_string(),
            application_name: application_name.to_string(),
            client_addr: addr.ip().to_string(),
            client_port: addr.port(),
            backend_start: SystemTime::now(),
            state: WalSenderState::Startup,
            timeline: None,
            slot_name: None,
            sent_lsn: None,
            write_lsn: None,
            flush_lsn: None,
            replay_lsn: None,
            reported_on: None,
            write_lag: None,
            flush_lag: None,
            replay_lag: None,
            sync_priority: 0,
            sync_state: "async".to_string(),
            reply_time: None,
            backend_xmin: None,
            backend_xmin_epoch: None,
        }
    }
}

/// The time formats of the status rows, re-exported for existing users: they live in
/// `wal_types::time`, shared with pg_stat_wal_receiver's rows and the restart state.
pub use wal_types::time::{format_lag, format_time};
