//! A configuration parameter's value as PostgreSQL 15 reads it from a client and shows it back:
//! each parameter a client may set has a kind ([`Kind`], from `pg_settings`: `vartype`, `unit`,
//! `min_val`, `max_val` and `enumvals`), and [`canonical`] reads a value by that kind, refusing
//! what PostgreSQL refuses with its SQLSTATE (22023) and words, and returns the value in the
//! form SHOW and ParameterStatus give it (`true` → `on`, `4096kB` → `4MB`, `sql, dmy` →
//! `SQL, DMY`, `utf-8` → `UTF8`).
//!
//! The string parameters PostgreSQL checks against its catalogs, the locale or the time zone
//! database (`TimeZone`, `search_path`, `lc_*`, `role`, ...) are kept as the client gave them:
//! walserver has neither, and reading the time zone database would be file I/O on the thread
//! that reads the startup packet. The three that are checked by rules alone are read as
//! PostgreSQL reads them: `client_encoding` (its encoding names and aliases), `DateStyle` and
//! `application_name` (bytes outside printable ASCII become `?`); their rules are in
//! `text_values`, re-exported here.

use std::time::Duration;

use crate::pg15_parameters::{self, Kind, Unit};
pub use crate::text_values::{clean_ascii, client_encoding, date_style_value};
use crate::{ErrorFields, SqlState};

/// A unit a value may carry and its size in the parameter's own unit.
struct Conversion {
    unit: &'static str,
    size: f64,
}

const fn c(unit: &'static str, size: f64) -> Conversion {
    Conversion { unit, size }
}

const BLOCK_KB: f64 = 8.0;

/// PostgreSQL's conversion tables (`guc.c`), for each unit from the largest to the smallest.
fn conversions(unit: Unit) -> &'static [Conversion] {
    const MS: &[Conversion] = &[
        c("d", 86_400_000.0),
        c("h", 3_600_000.0),
        c("min", 60_000.0),
        c("s", 1000.0),
        c("ms", 1.0),
        c("us", 0.001),
    ];
    const S: &[Conversion] = &[
        c("d", 86_400.0),
        c("h", 3600.0),
        c("min", 60.0),
        c("s", 1.0),
        c("ms", 0.001),
        c("us", 0.000_001),
    ];
    const B: &[Conversion] = &[
        c("TB", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        c("GB", 1024.0 * 1024.0 * 1024.0),
        c("MB", 1024.0 * 1024.0),
        c("kB", 1024.0),
        c("B", 1.0),
    ];
    const KB: &[Conversion] = &[
        c("TB", 1024.0 * 1024.0 * 1024.0),
        c("GB", 1024.0 * 1024.0),
        c("MB", 1024.0),
        c("kB", 1.0),
        c("B", 1.0 / 1024.0),
    ];
    const BLOCKS: &[Conversion] = &[
        c("TB", 1024.0 * 1024.0 * 1024.0 / BLOCK_KB),
        c("GB", 1024.0 * 1024.0 / BLOCK_KB),
        c("MB", 1024.0 / BLOCK_KB),
        c("kB", 1.0 / BLOCK_KB),
        c("B", 1.0 / (BLOCK_KB * 1024.0)),
    ];
    match unit {
        Unit::None => &[],
        Unit::Ms => MS,
        Unit::S => S,
        Unit::B => B,
        Unit::Kb => KB,
        Unit::Blocks => BLOCKS,
    }
}

impl Unit {
    /// `text` (a unit and optional trailing white space) times `value`, in this unit, rounded
    /// as PostgreSQL rounds a fraction of a unit: to a whole number of the next smaller unit.
    fn convert(self, value: f64, text: &str) -> Option<f64> {
        let table = conversions(self);
        let unit = text.trim_end_matches(is_c_space);
        let i = table.iter().position(|c| c.unit == unit)?;
        let v = value * table[i].size;
        Some(match table.get(i + 1) {
            Some(next) => round_half_even(v / next.size) * next.size,
            None => v,
        })
    }

    /// The hint PostgreSQL gives with a value whose unit it does not know.
    fn hint(self) -> &'static str {
        match self {
            Unit::Ms | Unit::S => {
                "Valid units for this parameter are \"us\", \"ms\", \"s\", \"min\", \"h\", and \"d\"."
            }
            _ => "Valid units for this parameter are \"B\", \"kB\", \"MB\", \"GB\", and \"TB\".",
        }
    }

    /// How PostgreSQL writes the unit after a value out of range.
    fn suffix(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Ms => " ms",
            Unit::S => " s",
            Unit::B => " B",
            Unit::Kb => " kB",
            Unit::Blocks => " 8kB",
        }
    }
}

/// `value` of parameter `name` (a name PostgreSQL 15 lets a client set), read as PostgreSQL
/// reads it and written as SHOW writes it. `name` is the client's spelling, which PostgreSQL
/// repeats in most of its refusals. `date_style` is the connection's `DateStyle` so far, from
/// which a new value of it starts, as PostgreSQL's does.
pub fn canonical(name: &str, value: &str, date_style: &str) -> Result<String, ErrorFields> {
    read(name, value, date_style).map(|(shown, _)| shown)
}

/// [`canonical`], and for an integer parameter also its value in the parameter's own unit
/// (`wal_sender_timeout` in milliseconds), from the same reading.
pub fn read(
    name: &str,
    value: &str,
    date_style: &str,
) -> Result<(String, Option<i64>), ErrorFields> {
    let shown = match pg15_parameters::kind(name) {
        Kind::Int { unit, min, max } => {
            let n = parse_int(name, value, unit, min, max)?;
            return Ok((format_int(n, unit), Some(n)));
        }
        Kind::Bool => match parse_bool(value) {
            Some(b) => Ok(if b { "on" } else { "off" }.to_string()),
            None => Err(ErrorFields::fatal(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("parameter \"{name}\" requires a Boolean value"),
            )),
        },
        Kind::Real { unit, min, max } => {
            parse_real(name, value, unit, min, max).map(|x| format_real(x, unit))
        }
        Kind::Enum { values, aliases } => {
            let found = aliases
                .iter()
                .find(|(alias, _)| alias.eq_ignore_ascii_case(value))
                .map(|(_, to)| *to)
                .or_else(|| {
                    values
                        .iter()
                        .find(|v| v.eq_ignore_ascii_case(value))
                        .copied()
                });
            found.map(str::to_string).ok_or_else(|| {
                invalid(name, value).hint(format!("Available values: {}.", values.join(", ")))
            })
        }
        Kind::Text => match name.to_ascii_lowercase().as_str() {
            "client_encoding" => client_encoding(value)
                .map(str::to_string)
                .ok_or_else(|| invalid("client_encoding", value)),
            "datestyle" => date_style_value(date_style, value)
                .map_err(|detail| invalid("DateStyle", value).detail(detail)),
            "application_name" => Ok(clean_ascii(value)),
            _ => Ok(value.to_string()),
        },
    }?;
    Ok((shown, None))
}

fn invalid(name: &str, value: &str) -> ErrorFields {
    ErrorFields::fatal(
        SqlState::INVALID_PARAMETER_VALUE,
        format!("invalid value for parameter \"{name}\": \"{value}\""),
    )
}

/// C's `isspace` in the C locale.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// PostgreSQL's `parse_bool`: `true`, `false`, `yes`, `no` or a non-empty prefix of one, `on`,
/// `off` or `of`, `1`, `0`; any case.
pub fn parse_bool(value: &str) -> Option<bool> {
    let v = value.to_ascii_lowercase();
    let prefix_of = |word: &str, min: usize| v.len() >= min && word.starts_with(v.as_str());
    match v.as_bytes().first()? {
        b't' if prefix_of("true", 1) => Some(true),
        b'f' if prefix_of("false", 1) => Some(false),
        b'y' if prefix_of("yes", 1) => Some(true),
        b'n' if prefix_of("no", 1) => Some(false),
        b'o' if prefix_of("on", 2) => Some(true),
        b'o' if prefix_of("off", 2) => Some(false),
        b'1' if v.len() == 1 => Some(true),
        b'0' if v.len() == 1 => Some(false),
        _ => None,
    }
}

/// Reads an integer parameter kept in `unit` as PostgreSQL's `parse_int` does: a decimal,
/// octal (`010`) or hexadecimal (`0x10`) integer, or a decimal fraction or exponent, then (for
/// a parameter with a unit) an optional unit after optional white space, rounded half to even;
/// then checked against `min..=max`. Errors are PostgreSQL's, SQLSTATE 22023.
pub fn parse_int(
    name: &str,
    value: &str,
    unit: Unit,
    min: i64,
    max: i64,
) -> Result<i64, ErrorFields> {
    let (number, rest) = leading_number(value).ok_or_else(|| invalid(name, value))?;
    let n = with_unit(name, value, number, rest, unit)?;
    let n = round_half_even(n);
    if !(n >= i32::MIN as f64 && n <= i32::MAX as f64) {
        return Err(invalid(name, value).hint("Value exceeds integer range."));
    }
    let n = n as i64;
    if n < min || n > max {
        return Err(ErrorFields::fatal(
            SqlState::INVALID_PARAMETER_VALUE,
            format!(
                "{n}{} is outside the valid range for parameter \"{name}\" ({min} .. {max})",
                unit.suffix()
            ),
        ));
    }
    Ok(n)
}

/// `number` with the unit `rest` holds (after white space), in `unit`.
fn with_unit(
    name: &str,
    value: &str,
    number: f64,
    rest: &str,
    unit: Unit,
) -> Result<f64, ErrorFields> {
    let rest = rest.trim_start_matches(is_c_space);
    if rest.is_empty() {
        return Ok(number);
    }
    if unit == Unit::None {
        return Err(invalid(name, value));
    }
    unit.convert(number, rest)
        .ok_or_else(|| invalid(name, value).hint(unit.hint()))
}

/// Reads a floating-point parameter as PostgreSQL's `parse_real` does (C's `strtod`, then an
/// optional unit), checked against `min..=max`.
pub fn parse_real(
    name: &str,
    value: &str,
    unit: Unit,
    min: f64,
    max: f64,
) -> Result<f64, ErrorFields> {
    let t = value.trim_start_matches(is_c_space);
    let (sign, unsigned) = match t.as_bytes().first() {
        Some(b'-') => (-1.0, &t[1..]),
        Some(b'+') => (1.0, &t[1..]),
        _ => (1.0, t),
    };
    let infinity = ["infinity", "inf"].into_iter().find(|w| {
        unsigned
            .get(..w.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(w))
    });
    let (number, rest) = match infinity {
        Some(w) => (f64::INFINITY, &unsigned[w.len()..]),
        None => leading_float(unsigned).ok_or_else(|| invalid(name, value))?,
    };
    let x = with_unit(name, value, sign * number, rest, unit)?;
    if !(x >= min && x <= max) {
        return Err(ErrorFields::fatal(
            SqlState::INVALID_PARAMETER_VALUE,
            format!(
                "{}{} is outside the valid range for parameter \"{name}\" ({} .. {})",
                format_g(x),
                unit.suffix(),
                format_g(min),
                format_g(max)
            ),
        ));
    }
    Ok(x)
}

/// [`parse_int`] for a parameter kept in milliseconds, as a duration.
pub fn parse_ms(name: &str, value: &str, min: i64, max: i64) -> Result<Duration, ErrorFields> {
    parse_int(name, value, Unit::Ms, min, max).map(|ms| Duration::from_millis(ms as u64))
}

/// The number at the start of `text` (after white space), and what follows it: C's `strtol`
/// with base 0, or `strtod` when the integer is followed by `.`, `e` or `E`.
fn leading_number(text: &str) -> Option<(f64, &str)> {
    let t = text.trim_start_matches(is_c_space);
    let (negative, unsigned) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let sign = if negative { -1.0 } else { 1.0 };
    let digits_end = |s: &str, radix: u32| s.find(|c: char| !c.is_digit(radix)).unwrap_or(s.len());
    let hex = unsigned
        .strip_prefix("0x")
        .or_else(|| unsigned.strip_prefix("0X"))
        .filter(|h| digits_end(h, 16) > 0);
    let (int, rest) = if let Some(h) = hex {
        let end = digits_end(h, 16);
        (integer(&h[..end], 16), &h[end..])
    } else {
        let end = digits_end(unsigned, 10);
        let radix = if end > 1 && unsigned.starts_with('0') {
            8
        } else {
            10
        };
        let end = digits_end(unsigned, radix);
        if end == 0 && !unsigned.starts_with('.') {
            return None;
        }
        let int = if end == 0 {
            0.0
        } else {
            integer(&unsigned[..end], radix)
        };
        (int, &unsigned[end..])
    };
    if hex.is_none() && rest.starts_with(['.', 'e', 'E']) {
        return leading_float(unsigned).map(|(f, r)| (sign * f, r));
    }
    Some((sign * int, rest))
}

/// The value of `digits` in `radix`; past what a `u128` holds, infinity (which no range
/// admits, as C's `strtol` reports an overflow).
fn integer(digits: &str, radix: u32) -> f64 {
    u128::from_str_radix(digits, radix).map_or(f64::INFINITY, |n| n as f64)
}

/// C's `strtod` for decimal text: digits, an optional fraction, an optional exponent. A value
/// beyond a double (`1e400`) is refused, as `strtod`'s ERANGE is.
fn leading_float(s: &str) -> Option<(f64, &str)> {
    let b = s.as_bytes();
    let mut i = b.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut mantissa = i;
    if b.get(i) == Some(&b'.') {
        let frac = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        mantissa += frac;
        i += 1 + frac;
    }
    if mantissa == 0 {
        return None;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let exp = b[j..].iter().take_while(|c| c.is_ascii_digit()).count();
        if exp > 0 {
            i = j + exp;
        }
    }
    let f: f64 = s[..i].parse().ok()?;
    f.is_finite().then_some((f, &s[i..]))
}

/// C's `rint` in the default rounding mode: to the nearest integer, a half to the even one.
fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

/// An integer parameter's value as SHOW writes it: above zero, in the largest unit that
/// divides it (`1d`, `90s`, `4MB`, `800kB`), else the bare number.
pub fn format_int(n: i64, unit: Unit) -> String {
    if n <= 0 {
        return n.to_string();
    }
    for c in conversions(unit) {
        if c.size <= 1.0 || n % (c.size as i64) == 0 {
            return format!("{}{}", round_half_even(n as f64 / c.size) as i64, c.unit);
        }
    }
    n.to_string()
}

/// A floating-point parameter's value as SHOW writes it: C's `%g`, above zero in the largest
/// unit in which it is a whole number (or the smallest).
pub fn format_real(x: f64, unit: Unit) -> String {
    if x > 0.0 {
        let table = conversions(unit);
        for (i, c) in table.iter().enumerate() {
            let v = x / c.size;
            if v > 0.0 && ((round_half_even(v) / v) - 1.0).abs() <= 1e-8 || i + 1 == table.len() {
                return format!("{}{}", format_g(v), c.unit);
            }
        }
    }
    format_g(x)
}

/// PostgreSQL's `snprintf("%g")`: six significant digits, an exponent below 1e-4 and from 1e6
/// on, trailing zeros dropped; `Infinity` and `NaN` spelt as PostgreSQL spells them.
pub fn format_g(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        trim(&format!("{x:.*}", (5 - exp) as usize))
    }
}

/// A duration as PostgreSQL's SHOW prints a parameter kept in milliseconds: in the largest unit
/// that divides it (`1d`, `2h`, `1min`, `90s`, `1500ms`), `0` for zero.
pub fn format_ms(d: Duration) -> String {
    format_int(d.as_millis().min(i64::MAX as u128) as i64, Unit::Ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(name: &str, value: &str) -> Result<String, String> {
        canonical(name, value, "ISO, MDY").map_err(|e| {
            let mut s = format!(
                "{} {}",
                e.code().map(|c| c.as_str().to_string()).unwrap_or_default(),
                e.message().unwrap_or_default()
            );
            for field in [b'D', b'H'] {
                if let Some(v) = e.get(field) {
                    s.push_str(&format!(" | {v}"));
                }
            }
            s
        })
    }

    fn timeout(value: &str) -> Result<u64, String> {
        parse_ms("wal_sender_timeout", value, 0, i32::MAX as i64)
            .map(|d| d.as_millis() as u64)
            .map_err(|e| e.message().unwrap_or_default().to_string())
    }

    #[test]
    fn milliseconds_are_read_as_postgresql_reads_them() {
        for (text, ms) in [
            ("5s", 5000),
            ("1500", 1500),
            ("1.5s", 1500),
            ("1e3", 1000),
            ("0x10", 16),
            ("010", 8),
            ("+7", 7),
            ("0.5", 0),
            ("2.5ms", 2),
            ("3.5", 4),
            ("1d", 86_400_000),
            ("2 min ", 120_000),
            ("0", 0),
        ] {
            assert_eq!(timeout(text), Ok(ms), "{text}");
        }
        assert_eq!(
            timeout("abc"),
            Err("invalid value for parameter \"wal_sender_timeout\": \"abc\"".into())
        );
        assert_eq!(
            timeout(""),
            Err("invalid value for parameter \"wal_sender_timeout\": \"\"".into())
        );
        let e = parse_ms("wal_sender_timeout", "5x", 0, 10).unwrap_err();
        assert!(e.get(b'H').unwrap().starts_with("Valid units"), "{e:?}");
        let e = parse_ms("wal_sender_timeout", "9999999999", 0, 10).unwrap_err();
        assert_eq!(e.get(b'H'), Some("Value exceeds integer range."));
        assert_eq!(
            timeout("-5"),
            Err("-5 ms is outside the valid range for parameter \"wal_sender_timeout\" (0 .. 2147483647)".into())
        );
    }

    #[test]
    fn shows_milliseconds_as_postgresql_does() {
        for (ms, text) in [
            (0, "0"),
            (9, "9ms"),
            (1500, "1500ms"),
            (90_000, "90s"),
            (120_000, "2min"),
            (3_600_000, "1h"),
            (86_400_000, "1d"),
        ] {
            assert_eq!(format_ms(Duration::from_millis(ms)), text);
        }
    }

    /// Each value, and what PostgreSQL 15.18 showed for it or refused it with (taken from
    /// `SHOW` and the FATAL of a real server).
    #[test]
    fn values_are_read_and_shown_as_postgresql_15_does() {
        let ok = |name: &str, value: &str, shown: &str| {
            assert_eq!(show(name, value), Ok(shown.to_string()), "{name}={value}")
        };
        ok("default_transaction_read_only", "TRUE", "on");
        ok("standard_conforming_strings", "of", "off");
        ok("enable_seqscan", "y", "on");
        ok("enable_seqscan", "0", "off");
        ok("extra_float_digits", " 0x3 ", "3");
        ok("extra_float_digits", "2.5", "2");
        ok("work_mem", "4096", "4MB");
        ok("work_mem", "1GB", "1GB");
        ok("work_mem", "100", "100kB");
        ok("temp_buffers", "1024", "8MB");
        ok("temp_buffers", "100", "800kB");
        ok("statement_timeout", "60000", "1min");
        ok("statement_timeout", "0", "0");
        ok("log_min_duration_statement", "-1", "-1");
        ok("vacuum_cost_delay", "1.5ms", "1500us");
        ok("vacuum_cost_delay", "2", "2ms");
        ok("seq_page_cost", "1.23456789", "1.23457");
        ok("seq_page_cost", "1e7", "1e+07");
        ok("synchronous_commit", "TRUE", "on");
        ok("synchronous_commit", "Remote_Apply", "remote_apply");
        ok("wal_compression", "on", "pglz");
        ok("client_min_messages", "debug", "debug2");
        ok("IntervalStyle", "ISO_8601", "iso_8601");
        ok("client_encoding", "utf-8", "UTF8");
        ok("client_encoding", "UNICODE", "UNICODE");
        ok("client_encoding", "unicode", "UTF8");
        ok("client_encoding", "latin1", "LATIN1");
        ok("client_encoding", "Windows-1252", "WIN1252");
        ok("DateStyle", "sql, dmy", "SQL, DMY");
        ok("DateStyle", "German", "German, DMY");
        ok("DateStyle", "German,ymd", "German, YMD");
        ok("DateStyle", "default,sql", "SQL, MDY");
        ok("DateStyle", " Postgres , US ", "Postgres, MDY");
        ok("DateStyle", "\"iso\"", "ISO, MDY");
        ok("DateStyle", "", "ISO, MDY");
        ok("application_name", "é x", "?? x");
        ok("TimeZone", "Europe/Berlin", "Europe/Berlin");

        let refused = |name: &str, value: &str, why: &str| {
            assert_eq!(show(name, value), Err(why.to_string()), "{name}={value}")
        };
        refused(
            "enable_seqscan",
            "maybe",
            "22023 parameter \"enable_seqscan\" requires a Boolean value",
        );
        refused(
            "extra_float_digits",
            "9",
            "22023 9 is outside the valid range for parameter \"extra_float_digits\" (-15 .. 3)",
        );
        refused(
            "work_mem",
            "1",
            "22023 1 kB is outside the valid range for parameter \"work_mem\" (64 .. 2147483647)",
        );
        refused(
            "temp_buffers",
            "1kB",
            "22023 0 8kB is outside the valid range for parameter \"temp_buffers\" (100 .. 1073741823)",
        );
        refused(
            "work_mem",
            "5KB",
            "22023 invalid value for parameter \"work_mem\": \"5KB\" | Valid units for this parameter are \"B\", \"kB\", \"MB\", \"GB\", and \"TB\".",
        );
        refused(
            "vacuum_cost_delay",
            "200",
            "22023 200 ms is outside the valid range for parameter \"vacuum_cost_delay\" (0 .. 100)",
        );
        refused(
            "seq_page_cost",
            "-1",
            "22023 -1 is outside the valid range for parameter \"seq_page_cost\" (0 .. 1.79769e+308)",
        );
        refused(
            "seq_page_cost",
            "inf",
            "22023 Infinity is outside the valid range for parameter \"seq_page_cost\" (0 .. 1.79769e+308)",
        );
        refused(
            "seq_page_cost",
            "-Infinity",
            "22023 -Infinity is outside the valid range for parameter \"seq_page_cost\" (0 .. 1.79769e+308)",
        );
        refused(
            "seq_page_cost",
            "nan",
            "22023 invalid value for parameter \"seq_page_cost\": \"nan\"",
        );
        // Not a character boundary where "inf" would end: no panic, a refusal.
        refused(
            "seq_page_cost",
            "ab\u{e9}",
            "22023 invalid value for parameter \"seq_page_cost\": \"ab\u{e9}\"",
        );
        // Six digits, then a unit: PostgreSQL's SHOW of 1.000002 ms.
        ok("vacuum_cost_delay", "1.000002", "1000us");
        refused(
            "statement_timeout",
            "1e400",
            "22023 invalid value for parameter \"statement_timeout\": \"1e400\"",
        );
        refused(
            "INTERVALSTYLE",
            "x",
            "22023 invalid value for parameter \"INTERVALSTYLE\": \"x\" | Available values: postgres, postgres_verbose, sql_standard, iso_8601.",
        );
        refused(
            "client_encoding",
            "auto",
            "22023 invalid value for parameter \"client_encoding\": \"auto\"",
        );
        refused(
            "datestyle",
            "bogus",
            "22023 invalid value for parameter \"DateStyle\": \"bogus\" | Unrecognized key word: \"bogus\".",
        );
        refused(
            "DateStyle",
            "iso,sql",
            "22023 invalid value for parameter \"DateStyle\": \"iso,sql\" | Conflicting \"datestyle\" specifications.",
        );
        refused(
            "DateStyle",
            "ISO MDY",
            "22023 invalid value for parameter \"DateStyle\": \"ISO MDY\" | List syntax is invalid.",
        );
    }

    #[test]
    fn a_date_style_starts_from_the_one_before_it() {
        assert_eq!(
            date_style_value("German, DMY", "ymd"),
            Ok("German, YMD".into())
        );
        assert_eq!(date_style_value("SQL, DMY", "iso"), Ok("ISO, DMY".into()));
    }

    #[test]
    fn percent_g_is_postgresqls() {
        for (x, s) in [
            (1.0, "1"),
            (0.5, "0.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (f64::MAX, "1.79769e+308"),
            (-2.5, "-2.5"),
            (1e6, "1e+06"),
        ] {
            assert_eq!(format_g(x), s, "{x}");
        }
    }
}
