//! The configuration parameters a client sets when it connects, as PostgreSQL 15 reads them:
//! the startup packet's `options` (`-c name=value` and `--name=value`, the way libpq passes
//! `PGOPTIONS` or `options='-c wal_sender_timeout=0'` in a standby's `primary_conninfo`), then
//! every other startup parameter that is not `user`, `database`, `options`, `replication` or a
//! protocol option (`_pq_.*`), in order, the last value of a name winning.
//!
//! A name PostgreSQL 15 does not know, a parameter a client may not set (one fixed at build,
//! at server start or in the configuration file), a malformed `options` string and a bad value
//! of a parameter are refused with PostgreSQL's FATAL, its SQLSTATE and its words, after
//! authentication, as PostgreSQL refuses them. Each value is read by its parameter's kind
//! and kept in the form SHOW gives it ([`crate::parameter_values`]). walserver uses three kinds:
//! `wal_sender_timeout`, which replaces the node's for this connection (and outlives a reload,
//! as a client's value does in PostgreSQL); `application_name`, which names the standby when
//! the startup packet has no `application_name` of its own; and the TCP keepalive timing
//! (`tcp_keepalives_idle`, `tcp_keepalives_interval`, `tcp_keepalives_count`,
//! `tcp_user_timeout`), which the server sets on the connection's socket. Every other known
//! parameter is kept for `SHOW` and the greeting: walserver has no such setting.
//! Custom names (`ext.name`) are kept as PostgreSQL keeps placeholders. The server's other
//! switches in `options` (`-B 128`, `-S 4096`, `-e`, ...) set the parameters they stand for, as
//! PostgreSQL's do ([`split_options`]).

use std::time::Duration;

use crate::parameter_values::read;
pub use crate::parameter_values::{format_ms, parse_int, parse_ms};
pub use crate::pg15_parameters::Unit;
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
        let known = pg15_parameters::context(name);
        match known {
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
        // A custom parameter's value is kept as given, as PostgreSQL keeps a placeholder's.
        let (value, number) = match known {
            Some(_) => read(name, value, self.get("DateStyle").unwrap_or("ISO, MDY"))?,
            None => (value.to_string(), None),
        };
        // The integers walserver uses, each in its parameter's unit and range (PostgreSQL's,
        // from `pg15_parameters::KINDS`: none is negative or beyond an i32).
        if let Some(n) = number {
            let n32 = || u32::try_from(n).ok();
            match name.to_ascii_lowercase().as_str() {
                "wal_sender_timeout" => {
                    self.wal_sender_timeout = u64::try_from(n).ok().map(Duration::from_millis)
                }
                "tcp_keepalives_idle" => self.tcp_keepalives.idle = n32(),
                "tcp_keepalives_interval" => self.tcp_keepalives.interval = n32(),
                "tcp_keepalives_count" => self.tcp_keepalives.count = n32(),
                "tcp_user_timeout" => self.tcp_keepalives.user_timeout = n32(),
                _ => {}
            }
        }
        self.values.push((name.to_string(), value));
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
/// ASCII white space, a backslash taking the next character as it is), and its switches read
/// as PostgreSQL's `process_postgres_switches` reads a client's: `-c name=value`,
/// `-cname=value` and `--name=value` (a `-` in a name read as `_`), and the server's other
/// switches as the parameters they set (`-B 128` is `shared_buffers=128`, which a client may
/// not set; `-S 4096` is `work_mem=4096`; `-e` is `DateStyle=euro`; `-fs` turns
/// `enable_seqscan` off; `-d 3` sets the debug parameters), one-letter switches clustered as
/// `getopt` allows (`-eP`). The switches that only the server's own command line may give
/// (`-b`, `-C`, `-D`, `-E`, `-j`, `-n`, `-r`, `-T`, `-v`) are ignored, as PostgreSQL ignores
/// them from a client. Returns the parameters in order.
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
        // `--` alone ends the switches; any word after it is an argument, which a client's
        // options may not have.
        if word == "--" {
            return match words.next() {
                Some(argument) => Err(bad_argument(&argument)),
                None => Ok(out),
            };
        }
        let Some(flags) = word.strip_prefix('-').filter(|f| !f.is_empty()) else {
            return Err(bad_argument(&word));
        };
        let mut rest = flags;
        while let Some(flag) = rest.chars().next() {
            rest = &rest[flag.len_utf8()..];
            if !SWITCHES_WITH_ARGUMENT.contains(flag) {
                switch(flag, "", &word, &mut out)?;
                continue;
            }
            let arg = if rest.is_empty() {
                words.next().ok_or_else(|| bad_argument(&word))?
            } else {
                rest.to_string()
            };
            switch(flag, &arg, &word, &mut out)?;
            break;
        }
    }
    Ok(out)
}

/// The switches of PostgreSQL's server that take an argument (its `getopt` string
/// `B:bc:C:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:`).
const SWITCHES_WITH_ARGUMENT: &str = "BcCDdfhkNprStvW-";

/// What switch `flag` with `arg` sets, appended to `out`, as PostgreSQL 15's
/// `process_postgres_switches` sets it for a client (not from the server's own command line).
/// `word` is the command-line word the switch came from, which a refusal names.
fn switch(
    flag: char,
    arg: &str,
    word: &str,
    out: &mut Vec<(String, String)>,
) -> Result<(), ErrorFields> {
    let mut set = |name: &str, value: &str| out.push((name.to_string(), value.to_string()));
    match flag {
        'c' | '-' => {
            let Some((name, value)) = arg.split_once('=') else {
                let shown = if flag == 'c' { "-c " } else { "--" };
                return Err(ErrorFields::fatal(
                    SqlState::SYNTAX_ERROR,
                    format!("{shown}{arg} requires a value"),
                ));
            };
            set(&name.replace('-', "_"), value);
        }
        'B' => set("shared_buffers", arg),
        'd' => debug_options(arg, &mut set),
        'e' => set("datestyle", "euro"),
        'F' => set("fsync", "false"),
        'f' => {
            let name = match arg.chars().next() {
                Some('s') => "enable_seqscan",
                Some('i') => "enable_indexscan",
                Some('o') => "enable_indexonlyscan",
                Some('b') => "enable_bitmapscan",
                Some('t') => "enable_tidscan",
                Some('n') => "enable_nestloop",
                Some('m') => "enable_mergejoin",
                Some('h') => "enable_hashjoin",
                _ => return Err(bad_argument(word)),
            };
            set(name, "false");
        }
        'h' => set("listen_addresses", arg),
        'i' => set("listen_addresses", "*"),
        'k' => set("unix_socket_directories", arg),
        'l' => set("ssl", "true"),
        'N' => set("max_connections", arg),
        'O' => set("allow_system_table_mods", "true"),
        'P' => set("ignore_system_indexes", "true"),
        'p' => set("port", arg),
        'S' => set("work_mem", arg),
        's' => set("log_statement_stats", "true"),
        't' => {
            // PostgreSQL looks at the first letter or two only (`pa`rser, `pl`anner, `e`xecutor).
            let name = match arg.as_bytes() {
                [b'p', b'a', ..] => "log_parser_stats",
                [b'p', b'l', ..] => "log_planner_stats",
                [b'e', ..] => "log_executor_stats",
                _ => return Err(bad_argument(word)),
            };
            set(name, "true");
        }
        'W' => set("post_auth_delay", arg),
        // Only the server's own command line may give these; from a client they do nothing.
        'b' | 'C' | 'D' | 'E' | 'j' | 'n' | 'r' | 'T' | 'v' => {}
        _ => return Err(bad_argument(word)),
    }
    Ok(())
}

/// PostgreSQL's `set_debug_options` for `-d level` from a client: C's `atoi` of the level,
/// then `log_min_messages` (`debugN`, or `notice` for 0) and, from level 2 on, the statement
/// and debug-print parameters.
fn debug_options(level: &str, set: &mut impl FnMut(&str, &str)) {
    let digits = level.trim_start_matches(|c: char| c.is_ascii_whitespace());
    let (negative, digits) = match digits.as_bytes().first() {
        Some(b'-') => (true, &digits[1..]),
        Some(b'+') => (false, &digits[1..]),
        _ => (false, digits),
    };
    let magnitude: i64 = digits
        .chars()
        .take_while(char::is_ascii_digit)
        .take(10)
        .fold(0, |n, d| n * 10 + i64::from(d as u8 - b'0'));
    let n = if negative { -magnitude } else { magnitude };
    if n > 0 {
        set("log_min_messages", &format!("debug{n}"));
    } else {
        set("log_min_messages", "notice");
    }
    for (from, name, value) in [
        (2, "log_statement", "all"),
        (3, "debug_print_parse", "true"),
        (4, "debug_print_plan", "true"),
        (5, "debug_print_rewritten", "true"),
    ] {
        if n >= from {
            set(name, value);
        }
    }
}

fn bad_argument(word: &str) -> ErrorFields {
    ErrorFields::fatal(
        SqlState::SYNTAX_ERROR,
        format!("invalid command-line argument for server process: {word}"),
    )
    .hint("Try \"postgres --help\" for more information.")
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
    fn the_server_s_other_switches_set_their_parameters() {
        let pairs = |options: &str| {
            split_options(options).map(|v| {
                v.into_iter()
                    .map(|(n, v)| format!("{n}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        };
        assert_eq!(
            pairs("-S 4096 -eP -fs -tpl -d 2 -T -b -- ").unwrap(),
            "work_mem=4096 datestyle=euro ignore_system_indexes=true enable_seqscan=false \
             log_planner_stats=true log_min_messages=debug2 log_statement=all"
        );
        assert_eq!(pairs("-B128").unwrap(), "shared_buffers=128");
        assert_eq!(pairs("-d 0").unwrap(), "log_min_messages=notice");
        let refused = |options: &str| {
            split_options(options)
                .unwrap_err()
                .message()
                .map(str::to_string)
        };
        for (options, word) in [
            ("-fx", "-fx"),
            ("-tzz", "-tzz"),
            ("-e -- extra", "extra"),
            ("-S", "-S"),
            ("-", "-"),
        ] {
            assert_eq!(
                refused(options).as_deref(),
                Some(format!("invalid command-line argument for server process: {word}").as_str()),
                "{options}"
            );
        }
        // And what they set is refused as a client's setting would be.
        assert_eq!(
            refusal(&[("options", "-F")]),
            (
                "55P02".into(),
                "parameter \"fsync\" cannot be changed now".into()
            )
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
}
