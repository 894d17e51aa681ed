//! Times and durations as walserver shows them, and the serde helpers its status rows use.
//!
//! Instants are shown as PostgreSQL shows a `timestamptz` in UTC (`2026-11-30 00:53:20.123456+00`)
//! and lags as its interval text (`00:00:00.001234`), so that `/status` reads like
//! `pg_stat_replication` and `pg_stat_wal_receiver`. The serde helpers are for
//! `#[serde(serialize_with = "...")]` on status fields; `None` stays JSON `null`.

use std::time::{Duration, SystemTime};

use serde::Serializer;

/// An instant in UTC, to the microsecond, as PostgreSQL shows a `timestamptz` with
/// `TimeZone` set to UTC. Instants before the Unix epoch are shown as the epoch.
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

/// Serializes an instant with [`format_time`].
pub fn ser_time<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_time(*t))
}

/// Serializes an optional instant with [`format_time`]; `None` is `null`.
pub fn ser_opt_time<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => ser_time(t, s),
        None => s.serialize_none(),
    }
}

/// Serializes an optional lag with [`format_lag`]; `None` is `null`.
pub fn ser_lag<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
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

    #[derive(serde::Serialize)]
    struct Row {
        #[serde(serialize_with = "ser_time")]
        at: SystemTime,
        #[serde(serialize_with = "ser_opt_time")]
        seen: Option<SystemTime>,
        #[serde(serialize_with = "ser_opt_time")]
        never: Option<SystemTime>,
        #[serde(serialize_with = "ser_lag")]
        lag: Option<Duration>,
        #[serde(serialize_with = "ser_lag")]
        no_lag: Option<Duration>,
    }

    #[test]
    fn serde_helpers_write_the_text_and_keep_none_null() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_796_000_000_123_456);
        let row = Row {
            at: SystemTime::UNIX_EPOCH,
            seen: Some(t),
            never: None,
            lag: Some(Duration::from_micros(1_234)),
            no_lag: None,
        };
        let v = serde_json::to_value(&row).unwrap();
        assert_eq!(v["at"], "1970-01-01 00:00:00.000000+00");
        assert_eq!(v["seen"], "2026-11-30 00:53:20.123456+00");
        assert_eq!(v["never"], serde_json::Value::Null);
        assert_eq!(v["lag"], "00:00:00.001234");
        assert_eq!(v["no_lag"], serde_json::Value::Null);
    }
}
