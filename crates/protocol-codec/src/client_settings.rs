//! The configuration parameters a client sets when it connects, as PostgreSQL 15 reads them:
//! the startup packet's `options` (`-c name=value` and `--name=value`, the way libpq passes
//! `PGOPTIONS` or `options='-c wal_sender_timeout=0'` in a standby's `primary_conninfo`), then
//! every other startup parameter that is not `user`, `database`, `options`, `replication` or a
//! protocol option (`_pq_.*`), in order, the last value of a name winning.
//!
//! A name PostgreSQL 15 does not know, a parameter a client may not set (one fixed at build,
//! at server start or in the configuration file), a malformed `options` string and a bad value
//! of a parameter walserver uses are refused with PostgreSQL's FATAL, its SQLSTATE and its
//! words, after authentication, as PostgreSQL refuses them. walserver uses three kinds:
//! `wal_sender_timeout`, which replaces the node's for this connection (and outlives a reload,
//! as a client's value does in PostgreSQL); `application_name`, which names the standby when
//! the startup packet has no `application_name` of its own; and the TCP keepalive timing
//! (`tcp_keepalives_idle`, `tcp_keepalives_interval`, `tcp_keepalives_count`,
//! `tcp_user_timeout`), which the server sets on the connection's socket. Every other known
//! parameter is accepted and kept for `SHOW`, its value unchecked: walserver has no such
//! setting.
//! Custom names (`ext.name`) are kept as PostgreSQL keeps placeholders. `options` holding
//! another of the server's switches (`-B 128`, `-S 4096`, ...) is refused as a bad argument,
//! where PostgreSQL would set the parameter the switch stands for.

use std::time::Duration;

use crate::pg15_parameters::{self, Context};
use crate::{ErrorFields, SqlState};

/// What a client set: every accepted name (as the client spelt it) and value, in order, and
/// what of it walserver uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientSettings {
    values: Vec<(String, String)>,
    /// The connection's `wal_sender_timeout`, if the client set one.
    pub wal_sender_timeout: Option<Duration>,
    /// The TCP keepalive timing the client set for its connection.
    pub tcp_keepalives: TcpKeepalives,
}

/// PostgreSQL's `tcp_keepalives_idle` and `tcp_keepalives_interval` (seconds),
/// `tcp_keepalives_count` and `tcp_user_timeout` (milliseconds) for one connection: `None`
/// (or 0) leaves the system's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpKeepalives {
    pub idle: Option<u32>,
    pub interval: Option<u32>,
    pub count: Option<u32>,
    pub user_timeout: Option<u32>,
}

impl TcpKeepalives {
    /// The four in the order `TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT`,
    /// `TCP_USER_TIMEOUT`, the socket options that carry them.
    pub fn values(&self) -> [Option<u32>; 4] {
        [self.idle, self.interval, self.count, self.user_timeout]
    }
}

impl ClientSettings {
    /// Reads the parameters of a startup packet (`params`, in their order).
    pub fn from_startup(params: &[(String, String)]) -> Result<ClientSettings, ErrorFields> {
        let mut settings = ClientSettings::default();
        for (_, options) in params.iter().filter(|(n, _)| n == "options") {
            for (n, v) in split_options(options)? {
                settings.set(&n, &v)?;
            }
        }
        for (name, value) in params {
            if !matches!(
                name.as_str(),
                "user" | "database" | "options" | "replication"
            ) && !name.starts_with("_pq_.")
            {
                settings.set(name, value)?;
            }
        }
        Ok(settings)
    }

    /// The value the client gave `name` (any case), the last one if it gave several.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every name and value the client set, for SHOW: later values of a name after earlier ones.
    pub fn values(&self) -> &[(String, String)] {
        &self.values
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), ErrorFields> {
        match pg15_parameters::context(name) {
            None if name.contains('.') => {
                if !valid_custom_name(name) {
                    return Err(ErrorFields::fatal(
                        SqlState::INVALID_NAME,
                        format!("invalid configuration parameter name \"{name}\""),
                    )
                    .detail(
                        "Custom parameter names must be two or more simple identifiers separated by dots.",
                    ));
                }
            }
            None => {
                return Err(ErrorFields::fatal(
                    SqlState::UNDEFINED_OBJECT,
                    format!("unrecognized configuration parameter \"{name}\""),
                ))
            }
            Some(Context::Internal) => return Err(cannot_change(name, "")),
            Some(Context::Postmaster) => {
                return Err(cannot_change(name, " without restarting the server"))
            }
            Some(Context::Sighup) => return Err(cannot_change(name, " now")),
            Some(Context::Backend | Context::Session) => {}
        }
        let max = i32::MAX as i64;
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            "wal_sender_timeout" => self.wal_sender_timeout = Some(parse_ms(name, value, 0, max)?),
            "tcp_keepalives_idle" => {
                self.tcp_keepalives.idle = Some(parse_int(name, value, Unit::S, 0, max)? as u32)
            }
            "tcp_keepalives_interval" => {
                self.tcp_keepalives.interval = Some(parse_int(name, value, Unit::S, 0, max)? as u32)
            }
            "tcp_keepalives_count" => {
                self.tcp_keepalives.count = Some(parse_int(name, value, Unit::None, 0, max)? as u32)
            }
            "tcp_user_timeout" => {
                self.tcp_keepalives.user_timeout =
                    Some(parse_int(name, value, Unit::Ms, 0, max)? as u32)
            }
            _ => {}
        }
        self.values.push((name.to_string(), value.to_string()));
        Ok(())
    }
}

fn cannot_change(name: &str, when: &str) -> ErrorFields {
    ErrorFields::fatal(
        SqlState::CANT_CHANGE_RUNTIME_PARAM,
        format!("parameter \"{name}\" cannot be changed{when}"),
    )
}

/// PostgreSQL's test for a custom parameter's name: two or more simple identifiers (a letter
/// or `_`, then letters, digits, `_` or `$`; bytes above 127 count as letters) joined by dots.
fn valid_custom_name(name: &str) -> bool {
    name.contains('.')
        && name.split('.').all(|part| {
            let mut bytes = part.bytes();
            bytes
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b >= 128)
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 128)
        })
}

/// The `options` parameter as the server's command line, split as PostgreSQL splits it (on
/// ASCII white space, a backslash taking the next character as it is), and its switches read:
/// `-c name=value`, `-cname=value` and `--name=value`, a `-` in a name read as `_`.
pub fn split_options(options: &str) -> Result<Vec<(String, String)>, ErrorFields> {
    let mut words = Vec::new();
    let mut chars = options.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_ascii_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut word = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_ascii_whitespace()) {
            if c == '\\' {
                match chars.next() {
                    Some(escaped) => word.push(escaped),
                    None => break,
                }
            } else {
                word.push(c);
            }
        }
        words.push(word);
    }
    let mut out = Vec::new();
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let (flag, arg) = if let Some(long) = word.strip_prefix("--").filter(|l| !l.is_empty()) {
            ("--", long.to_string())
        } else if let Some(rest) = word.strip_prefix("-c") {
            if rest.is_empty() {
                match words.next() {
                    Some(arg) => ("-c ", arg),
                    None => return Err(bad_argument(&word)),
                }
            } else {
                ("-c ", rest.to_string())
            }
        } else {
            return Err(bad_argument(&word));
        };
        let Some((name, value)) = arg.split_once('=') else {
            return Err(ErrorFields::fatal(
                SqlState::SYNTAX_ERROR,
                format!("{flag}{arg} requires a value"),
            ));
        };
        out.push((name.replace('-', "_"), value.to_string()));
    }
    Ok(out)
}

fn bad_argument(word: &str) -> ErrorFields {
    ErrorFields::fatal(
        SqlState::SYNTAX_ERROR,
        format!("invalid command-line argument for server process: {word}"),
    )
    .hint("Try \"postgres --help\" for more information.")
}

/// The unit an integer parameter is kept in, which decides the units its value may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A plain number (`tcp_keepalives_count`): no unit may follow it.
    None,
    /// Milliseconds (`wal_sender_timeout`, `tcp_user_timeout`).
    Ms,
    /// Seconds (`tcp_keepalives_idle`, `tcp_keepalives_interval`).
    S,
}

impl Unit {
    /// The time units a value may carry, and their size in this unit.
    fn size(self, unit: &str) -> Option<f64> {
        let ms = match unit {
            "us" => 0.001,
            "ms" => 1.0,
            "s" => 1000.0,
            "min" => 60_000.0,
            "h" => 3_600_000.0,
            "d" => 86_400_000.0,
            _ => return None,
        };
        match self {
            Unit::None => None,
            Unit::Ms => Some(ms),
            Unit::S => Some(ms / 1000.0),
        }
    }

    /// How PostgreSQL writes the unit after a value out of range.
    fn suffix(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Ms => " ms",
            Unit::S => " s",
        }
    }
}

/// Reads an integer parameter kept in `unit` as PostgreSQL's `parse_int` does: a decimal,
/// octal (`010`) or hexadecimal (`0x10`) integer, or a decimal fraction or exponent, then (for
/// a time) an optional unit after optional white space, rounded half to even; then checked
/// against `min..=max`. Errors are PostgreSQL's, SQLSTATE 22023.
pub fn parse_int(
    name: &str,
    value: &str,
    unit: Unit,
    min: i64,
    max: i64,
) -> Result<i64, ErrorFields> {
    let invalid = |hint: Option<&str>| {
        let e = ErrorFields::fatal(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("invalid value for parameter \"{name}\": \"{value}\""),
        );
        match hint {
            Some(h) => e.hint(h),
            None => e,
        }
    };
    let (number, rest) = leading_number(value).ok_or_else(|| invalid(None))?;
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
    let mut n = match rest.trim_end_matches(|c: char| c.is_ascii_whitespace()) {
        "" => number,
        _ if unit == Unit::None => return Err(invalid(None)),
        text => match unit.size(text) {
            Some(size) => number * size,
            None => {
                return Err(invalid(Some(
                    "Valid units for this parameter are \"us\", \"ms\", \"s\", \"min\", \"h\", and \"d\".",
                )))
            }
        },
    };
    n = round_half_even(n);
    if !(n >= i32::MIN as f64 && n <= i32::MAX as f64) {
        return Err(invalid(Some("Value exceeds integer range.")));
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

/// [`parse_int`] for a parameter kept in milliseconds, as a duration.
pub fn parse_ms(name: &str, value: &str, min: i64, max: i64) -> Result<Duration, ErrorFields> {
    parse_int(name, value, Unit::Ms, min, max).map(|ms| Duration::from_millis(ms as u64))
}

/// The number at the start of `text` (after white space), and what follows it: C's `strtol`
/// with base 0, or `strtod` when the integer is followed by `.`, `e` or `E`.
fn leading_number(text: &str) -> Option<(f64, &str)> {
    let t = text.trim_start_matches(|c: char| c.is_ascii_whitespace());
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

/// C's `strtod` for decimal text: digits, an optional fraction, an optional exponent.
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
    s[..i].parse().ok().map(|f| (f, &s[i..]))
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

/// A duration as PostgreSQL's SHOW prints a parameter kept in milliseconds: in the largest unit
/// that divides it (`1d`, `2h`, `1min`, `90s`, `1500ms`), `0` for zero.
pub fn format_ms(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0".to_string();
    }
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("min", 60_000),
        ("s", 1000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    fn refusal(list: &[(&str, &str)]) -> (String, String) {
        let e = ClientSettings::from_startup(&params(list)).expect_err("refused");
        (
            e.code().map(|c| c.as_str().to_string()).unwrap_or_default(),
            e.message().unwrap_or_default().to_string(),
        )
    }

    fn timeout(value: &str) -> Result<u64, String> {
        parse_ms("wal_sender_timeout", value, 0, i32::MAX as i64)
            .map(|d| d.as_millis() as u64)
            .map_err(|e| e.message().unwrap_or_default().to_string())
    }

    #[test]
    fn options_set_parameters_and_startup_parameters_come_after_them() {
        let s = ClientSettings::from_startup(&params(&[
            ("user", "u"),
            (
                "options",
                "-c wal_sender_timeout=5s  --application-name=a\\ b -cmy.x=1",
            ),
            ("replication", "true"),
            ("application_name", "param"),
            ("_pq_.something", "x"),
        ]))
        .unwrap();
        assert_eq!(s.wal_sender_timeout, Some(Duration::from_secs(5)));
        assert_eq!(s.get("APPLICATION_NAME"), Some("param"));
        assert_eq!(s.get("my.x"), Some("1"));
        assert_eq!(s.get("user"), None);
        assert_eq!(s.values().len(), 4);
        let s = ClientSettings::from_startup(&params(&[(
            "options",
            "-c wal_sender_timeout=5 -c WAL_Sender_Timeout=9",
        )]))
        .unwrap();
        assert_eq!(s.wal_sender_timeout, Some(Duration::from_millis(9)));
    }

    #[test]
    fn refusals_are_postgresql_15s() {
        // The parameters, then the SQLSTATE and message of the refusal.
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: [Case; 10] = [
            (
                &[("options", "-c nosuch=1")],
                "42704",
                "unrecognized configuration parameter \"nosuch\"",
            ),
            (
                &[("nosuch", "1")],
                "42704",
                "unrecognized configuration parameter \"nosuch\"",
            ),
            (
                &[("options", "-c shared_buffers=1MB")],
                "55P02",
                "parameter \"shared_buffers\" cannot be changed without restarting the server",
            ),
            (
                &[("options", "-c wal_keep_size=1")],
                "55P02",
                "parameter \"wal_keep_size\" cannot be changed now",
            ),
            (
                &[("server_version", "1")],
                "55P02",
                "parameter \"server_version\" cannot be changed",
            ),
            (
                &[("options", "-x")],
                "42601",
                "invalid command-line argument for server process: -x",
            ),
            (
                &[("options", "-c wal_sender_timeout=3s extra")],
                "42601",
                "invalid command-line argument for server process: extra",
            ),
            (
                &[("options", "-c wal_sender_timeout")],
                "42601",
                "-c wal_sender_timeout requires a value",
            ),
            (
                &[("options", "--wal_sender_timeout")],
                "42601",
                "--wal_sender_timeout requires a value",
            ),
            (
                &[("options", "-c foo..bar=1")],
                "42602",
                "invalid configuration parameter name \"foo..bar\"",
            ),
        ];
        for (list, code, message) in cases {
            assert_eq!(
                refusal(list),
                (code.to_string(), message.to_string()),
                "{list:?}"
            );
        }
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
    fn keepalive_parameters_are_read_in_their_units() {
        let s = ClientSettings::from_startup(&params(&[(
            "options",
            "-c tcp_keepalives_idle=1500ms -c tcp_keepalives_interval=1min -c tcp_keepalives_count=3 -c tcp_user_timeout=2s",
        )]))
        .unwrap();
        assert_eq!(
            s.tcp_keepalives,
            TcpKeepalives {
                idle: Some(2),
                interval: Some(60),
                count: Some(3),
                user_timeout: Some(2000)
            }
        );
        assert_eq!(
            refusal(&[("options", "-c tcp_keepalives_count=3s")]).1,
            "invalid value for parameter \"tcp_keepalives_count\": \"3s\""
        );
        assert_eq!(
            refusal(&[("options", "-c tcp_keepalives_idle=-3")]).1,
            "-3 s is outside the valid range for parameter \"tcp_keepalives_idle\" (0 .. 2147483647)"
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
}
