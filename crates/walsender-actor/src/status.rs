//! What a walsender shows about itself: the facts of PostgreSQL's `pg_stat_replication`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use wal_storage::{Lsn, TimelineId};

/// PostgreSQL's `WalSndState`, shown in `pg_stat_replication.state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
#[derive(Clone, Debug, Serialize)]
pub struct WalSenderStatus {
    /// A connection number, standing in for PostgreSQL's pid.
    pub pid: u32,
    pub usename: String,
    pub application_name: String,
    pub client_addr: String,
    pub client_port: u16,
    #[serde(serialize_with = "ser_time")]
    pub backend_start: SystemTime,
    pub state: WalSenderState,
    pub timeline: Option<TimelineId>,
    pub slot_name: Option<String>,
    pub sent_lsn: Option<Lsn>,
    pub write_lsn: Option<Lsn>,
    pub flush_lsn: Option<Lsn>,
    pub replay_lsn: Option<Lsn>,
    #[serde(serialize_with = "ser_lag")]
    pub write_lag: Option<Duration>,
    #[serde(serialize_with = "ser_lag")]
    pub flush_lag: Option<Duration>,
    #[serde(serialize_with = "ser_lag")]
    pub replay_lag: Option<Duration>,
    pub sync_priority: u32,
    pub sync_state: String,
    #[serde(serialize_with = "ser_opt_time")]
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

/// Seconds since the Unix epoch with microseconds, as a decimal string a JSON reader can keep
/// exact; `format_time` renders the same instant for people.
pub fn format_time(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, dd) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{dd:02} {:02}:{:02}:{:02}.{:06}+00",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A lag as PostgreSQL's interval text shows it (`00:00:00.001234`).
pub fn format_lag(d: Duration) -> String {
    let s = d.as_secs();
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        s / 3600,
        (s / 60) % 60,
        s % 60,
        d.subsec_micros()
    )
}

fn ser_time<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_time(*t))
}

fn ser_opt_time<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&format_time(*t)),
        None => s.serialize_none(),
    }
}

fn ser_lag<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format_lag(*d)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_and_lag_text() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_796_000_000_123_456);
        assert_eq!(format_time(t), "2026-11-30 00:53:20.123456+00");
        assert_eq!(
            format_time(SystemTime::UNIX_EPOCH),
            "1970-01-01 00:00:00.000000+00"
        );
        assert_eq!(
            format_lag(Duration::from_micros(3_723_000_042)),
            "01:02:03.000042"
        );
    }
}
