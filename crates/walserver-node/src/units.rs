//! PostgreSQL-style values with units in the configuration: `60s`, `500ms`, `1min`, `16MB`.
//!
//! PostgreSQL lets a bare number mean the setting's base unit (milliseconds for
//! `wal_sender_timeout`, seconds for `wal_receiver_status_interval`, megabytes for
//! `wal_keep_size`); the deserializers below take the base unit as a parameter so each knob
//! keeps PostgreSQL's meaning.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Int(i64),
    Text(String),
}

/// Parses `"10s"`, `"500ms"`, `"1min"`, `"2h"`, `"1d"`, `"250us"`, or a bare number in
/// `base_ms` milliseconds. Zero means "disabled" for the timeouts that allow it.
pub fn parse_duration(text: &str, base_ms: u64) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!("invalid duration {text:?}: expected a number with a unit like 10s or 500ms")
    })?;
    let unit_us: f64 = match unit.trim() {
        "" => base_ms as f64 * 1000.0,
        "us" => 1.0,
        "ms" => 1000.0,
        "s" => 1_000_000.0,
        "min" => 60_000_000.0,
        "h" => 3_600_000_000.0,
        "d" => 86_400_000_000.0,
        other => {
            return Err(format!(
            "invalid unit {other:?} in duration {text:?}: valid units are us, ms, s, min, h and d"
        ))
        }
    };
    Ok(Duration::from_micros((value * unit_us).round() as u64))
}

/// Parses `"16MB"`, `"1GB"`, `"8kB"`, `"512B"`, `"2TB"` or a bare number in `base` bytes.
/// `-1` (PostgreSQL's "unlimited") gives `None`.
pub fn parse_size(text: &str, base: u64) -> Result<Option<u64>, String> {
    let t = text.trim();
    if t == "-1" {
        return Ok(None);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {text:?}: expected a number with a unit like 16MB"))?;
    let mult: u64 = match unit.trim() {
        "" => base,
        "B" => 1,
        "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        other => {
            return Err(format!(
                "invalid unit {other:?} in size {text:?}: valid units are B, kB, MB, GB and TB"
            ))
        }
    };
    value
        .checked_mul(mult)
        .map(Some)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

fn duration_with_base<'de, D: Deserializer<'de>>(d: D, base_ms: u64) -> Result<Duration, D::Error> {
    match NumberOrText::deserialize(d)? {
        NumberOrText::Int(n) if n >= 0 => Ok(Duration::from_millis(n as u64 * base_ms)),
        NumberOrText::Int(n) => Err(serde::de::Error::custom(format!("negative duration {n}"))),
        NumberOrText::Text(t) => parse_duration(&t, base_ms).map_err(serde::de::Error::custom),
    }
}

/// A duration whose bare numbers are milliseconds.
pub fn duration_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    duration_with_base(d, 1)
}

/// A duration whose bare numbers are seconds.
pub fn duration_s<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    duration_with_base(d, 1000)
}

fn size_with_base<'de, D: Deserializer<'de>>(d: D, base: u64) -> Result<Option<u64>, D::Error> {
    match NumberOrText::deserialize(d)? {
        NumberOrText::Int(-1) => Ok(None),
        NumberOrText::Int(n) if n >= 0 => (n as u64)
            .checked_mul(base)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("size {n} is too large"))),
        NumberOrText::Int(n) => Err(serde::de::Error::custom(format!("invalid size {n}"))),
        NumberOrText::Text(t) => parse_size(&t, base).map_err(serde::de::Error::custom),
    }
}

/// A size whose bare numbers are megabytes and where -1 means unlimited.
pub fn size_mb_or_unlimited<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size_with_base(d, 1 << 20)
}

/// A size whose bare numbers are megabytes; -1 is refused.
pub fn size_mb<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    size_with_base(d, 1 << 20)?
        .ok_or_else(|| serde::de::Error::custom("-1 (unlimited) is not allowed here"))
}

/// A size whose bare numbers are bytes (as Patroni's `maximum_lag_on_failover`); -1 is refused.
pub fn size_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    size_with_base(d, 1)?
        .ok_or_else(|| serde::de::Error::custom("-1 (unlimited) is not allowed here"))
}

/// An optional size whose bare numbers are bytes, for a key whose absence means a default.
pub fn some_size_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size_bytes(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let d = |t: &str, base| parse_duration(t, base).unwrap();
        assert_eq!(d("60s", 1), Duration::from_secs(60));
        assert_eq!(d("500ms", 1), Duration::from_millis(500));
        assert_eq!(d("1min", 1), Duration::from_secs(60));
        assert_eq!(d("1.5s", 1), Duration::from_millis(1500));
        assert_eq!(d("250us", 1), Duration::from_micros(250));
        assert_eq!(d("10", 1000), Duration::from_secs(10));
        assert_eq!(d("10", 1), Duration::from_millis(10));
        assert!(parse_duration("10 parsecs", 1).is_err());
        assert!(parse_duration("s", 1).is_err());
        assert!(parse_duration("", 1).is_err());
    }

    #[test]
    fn sizes() {
        let s = |t: &str| parse_size(t, 1 << 20).unwrap();
        assert_eq!(s("16MB"), Some(16 << 20));
        assert_eq!(s("1GB"), Some(1 << 30));
        assert_eq!(s("8kB"), Some(8 << 10));
        assert_eq!(s("64"), Some(64 << 20));
        assert_eq!(s("-1"), None);
        assert!(
            parse_size("16mb", 1).is_err(),
            "PostgreSQL's units are case-sensitive"
        );
        assert!(parse_size("99999999999TB", 1).is_err());
    }
}

/// A duration as PostgreSQL's SHOW prints one kept in milliseconds: `1min`, `10s`, `1500ms`, `0`.
pub use protocol_codec::client_settings::format_ms as format_duration;

/// A size as PostgreSQL's SHOW prints a memory setting: `16MB`, `1GB`, `8kB`, `0`.
pub fn format_size(bytes: u64) -> String {
    if bytes == 0 {
        return "0".to_string();
    }
    for (unit, size) in [
        ("TB", 1u64 << 40),
        ("GB", 1 << 30),
        ("MB", 1 << 20),
        ("kB", 1 << 10),
    ] {
        if bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod format_tests {
    use super::*;

    #[test]
    fn shown_as_postgres_shows_them() {
        assert_eq!(format_duration(Duration::from_secs(60)), "1min");
        assert_eq!(format_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::ZERO), "0");
        assert_eq!(format_size(16 << 20), "16MB");
        assert_eq!(format_size(1 << 30), "1GB");
        assert_eq!(format_size(0), "0");
        assert_eq!(format_size(1000), "1000B");
    }
}
