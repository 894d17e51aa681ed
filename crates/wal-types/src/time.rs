//! Times and durations as walserver shows them, and the serde helpers its status rows use.
//!
//! Instants are shown as PostgreSQL shows a `timestamptz` in UTC (`2026-11-30 00:53:20.123456+00`)
//! and lags as its interval text (`00:00:00.001234`), so that `/status` reads like
//! `pg_stat_replication` and `pg_stat_wal_receiver`. The serde helpers are for
//! `#[serde(serialize_with = "...", deserialize_with = "...")]` on status fields, so that a
//! client reads `/status` back into the types the server wrote; `None` stays JSON `null`.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Deserializer, Serializer};

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

/// Howard Hinnant's days-from-civil algorithm, the inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `HH:MM:SS.ffffff` (hours may have more digits) as seconds and microseconds.
fn parse_clock(text: &str) -> Option<(u64, u32)> {
    let (hms, micros) = text.split_once('.')?;
    let mut f = hms.split(':');
    let (h, m, s) = (f.next()?, f.next()?, f.next()?);
    if f.next().is_some() || micros.len() != 6 {
        return None;
    }
    let (h, m, s): (u64, u64, u64) = (h.parse().ok()?, m.parse().ok()?, s.parse().ok()?);
    if m >= 60 || s >= 60 {
        return None;
    }
    Some((h * 3600 + m * 60 + s, micros.parse().ok()?))
}

/// The inverse of [`format_time`]: `None` for any other text.
pub fn parse_time(text: &str) -> Option<SystemTime> {
    let (date, rest) = text.split_once(' ')?;
    let clock = rest.strip_suffix("+00")?;
    let mut f = date.split('-');
    let (y, m, d) = (f.next()?, f.next()?, f.next()?);
    let (y, m, d): (i64, u32, u32) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    if f.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let (secs, micros) = parse_clock(clock)?;
    if secs >= 86_400 {
        return None;
    }
    let days = u64::try_from(days_from_civil(y, m, d)).ok()?;
    Some(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(days * 86_400 + secs)
            + Duration::from_micros(micros.into()),
    )
}

/// The inverse of [`format_lag`]: `None` for any other text.
pub fn parse_lag(text: &str) -> Option<Duration> {
    let (secs, micros) = parse_clock(text)?;
    Some(Duration::from_secs(secs) + Duration::from_micros(micros.into()))
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

/// Deserializes what [`ser_time`] wrote.
pub fn de_time<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let text = String::deserialize(d)?;
    parse_time(&text).ok_or_else(|| serde::de::Error::custom(format!("not a time: {text:?}")))
}

/// Deserializes what [`ser_opt_time`] wrote.
pub fn de_opt_time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(text) => parse_time(&text)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("not a time: {text:?}"))),
        None => Ok(None),
    }
}

/// Deserializes what [`ser_lag`] wrote.
pub fn de_lag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(text) => parse_lag(&text)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("not a lag: {text:?}"))),
        None => Ok(None),
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

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Row {
        #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
        at: SystemTime,
        #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
        seen: Option<SystemTime>,
        #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
        never: Option<SystemTime>,
        #[serde(serialize_with = "ser_lag", deserialize_with = "de_lag")]
        lag: Option<Duration>,
        #[serde(serialize_with = "ser_lag", deserialize_with = "de_lag")]
        no_lag: Option<Duration>,
    }

    /// What the helpers write reads back as the same values, and any other text is refused.
    #[test]
    fn times_and_lags_read_back() {
        for micros in [
            0,
            1_796_000_000_123_456,
            951_782_400_000_001,
            4_107_542_399_999_999,
        ] {
            let t = SystemTime::UNIX_EPOCH + Duration::from_micros(micros);
            assert_eq!(parse_time(&format_time(t)), Some(t), "{}", format_time(t));
        }
        let lag = Duration::from_micros(3_723_000_042);
        assert_eq!(parse_lag(&format_lag(lag)), Some(lag));
        let row = Row {
            at: SystemTime::UNIX_EPOCH + Duration::from_micros(5),
            seen: Some(SystemTime::UNIX_EPOCH + Duration::from_micros(1_796_000_000_123_456)),
            never: None,
            lag: Some(Duration::from_micros(1_234)),
            no_lag: None,
        };
        let json = serde_json::to_string(&row).unwrap();
        assert_eq!(serde_json::from_str::<Row>(&json).unwrap(), row);
        for bad in [
            "2026-11-30 00:53:20.123456",
            "2026-13-30 00:53:20.123456+00",
            "2026-11-30 24:00:00.000000+00",
            "2026-11-30 00:53:20.1234+00",
            "2026-11-30T00:53:20.123456+00",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
        assert_eq!(parse_lag("00:61:00.000000"), None);
        let bad = json.replace("00:00:00.001234", "soon");
        assert!(serde_json::from_str::<Row>(&bad).is_err());
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
