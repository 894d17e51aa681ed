//! The archiver's status: `pg_stat_archiver`'s columns and what this archiver adds.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use wal_types::time::{de_opt_time, ser_opt_time};
use wal_types::Lsn;

/// What `/status` shows as `archiver`. The first six fields are `pg_stat_archiver`'s columns
/// (since this archiver started); the rest say where it is and what is wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiverStatus {
    pub archived_count: u64,
    pub last_archived_wal: Option<String>,
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub last_archived_time: Option<SystemTime>,
    pub failed_count: u64,
    pub last_failed_wal: Option<String>,
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub last_failed_time: Option<SystemTime>,
    /// Every completed segment below it is archived (the durable position storage holds).
    pub archived_lsn: Option<Lsn>,
    /// The archive holds the current timeline's WAL up to here: completed segments and the
    /// last `archive_timeout` upload.
    pub covered_lsn: Option<Lsn>,
    /// Bytes of completed segments not yet archived.
    pub backlog_bytes: u64,
    /// What waits for the archive is past `archive_max_backlog`: appends are refused and a
    /// relay stops reading from its upstream until it falls.
    #[serde(default)]
    pub backpressure: bool,
    /// The last failure's message, until an upload succeeds.
    pub last_error: Option<String>,
    /// Set when the archive holds an object of the same name with other bytes: it is never
    /// overwritten, and archiving stays stuck on it until a person looks.
    pub alarm: Option<String>,
}
