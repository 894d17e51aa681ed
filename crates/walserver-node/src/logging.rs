//! The logging settings: `log_level`, a filter in tracing's syntax that also takes
//! PostgreSQL's level names, and `log_format`.
//!
//! tracing's own filter parser takes any word it does not know for a target name, so
//! `log_level = "warning"` would enable only the (non-existent) target `warning` and turn off
//! every log line, errors included. Here each directive's level is checked and PostgreSQL's
//! spellings (`log_min_messages`'s) are mapped onto tracing's levels:
//!
//! | `log_level`                    | tracing level |
//! |--------------------------------|---------------|
//! | `error`, `fatal`, `panic`      | `error`       |
//! | `warning`, `warn`              | `warn`        |
//! | `notice`, `info`, `log`        | `info`        |
//! | `debug`, `debug1`              | `debug`       |
//! | `debug2`..`debug5`, `trace`    | `trace`       |
//! | `off`                          | `off`         |
//!
//! A filter is one directive or several separated by commas, each a level (the default for
//! every module) or `module=level`, such as `warning,walsender_actor=debug1`.

use serde::Deserialize;

/// The level names `log_level` accepts, for error messages and documentation.
pub const LEVEL_NAMES: &str = "error, warning (or warn), notice, info, log, debug, debug1 to debug5, trace, off (and fatal or panic, taken as error)";

/// The tracing level a PostgreSQL or tracing level name stands for, in any case.
pub fn tracing_level(name: &str) -> Option<&'static str> {
    Some(match name.to_ascii_lowercase().as_str() {
        "error" | "fatal" | "panic" => "error",
        "warning" | "warn" => "warn",
        "notice" | "info" | "log" => "info",
        "debug" | "debug1" => "debug",
        "debug2" | "debug3" | "debug4" | "debug5" | "trace" => "trace",
        "off" => "off",
        _ => return None,
    })
}

/// `log_level` in tracing's filter syntax, each level mapped to tracing's name, or why it is
/// not a filter.
pub fn filter_directives(log_level: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for directive in log_level.split(',').map(str::trim) {
        if directive.is_empty() {
            continue;
        }
        // `module=level`; a `=` inside a span or field filter (`[span{field=value}]`) is not
        // the one before the level, which is never followed by `]` or `}`.
        let (target, level) = match directive.rsplit_once('=') {
            Some((t, l)) if !l.contains([']', '}']) => (Some(t.trim()), l.trim()),
            _ => (None, directive),
        };
        let Some(mapped) = tracing_level(level) else {
            return Err(match target {
                Some(t) => format!(
                    "invalid log_level {log_level:?}: unknown level {level:?} for {t:?}; valid levels are {LEVEL_NAMES}"
                ),
                None => format!(
                    "invalid log_level {log_level:?}: unknown level {level:?}; valid levels are {LEVEL_NAMES}, alone or per module as module=level"
                ),
            });
        };
        out.push(match target {
            Some("") => {
                return Err(format!(
                    "invalid log_level {log_level:?}: {directive:?} names no module before '='"
                ))
            }
            Some(t) => format!("{t}={mapped}"),
            None => mapped.to_string(),
        });
    }
    if out.is_empty() {
        return Err(format!(
            "log_level is empty: valid levels are {LEVEL_NAMES}"
        ));
    }
    Ok(out.join(","))
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One line of text per event, coloured only when written to a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgresql_and_tracing_spellings_map_onto_tracing_levels() {
        for (given, expected) in [
            ("error", "error"),
            ("FATAL", "error"),
            ("panic", "error"),
            ("warning", "warn"),
            ("WARN", "warn"),
            ("notice", "info"),
            ("info", "info"),
            ("log", "info"),
            ("debug", "debug"),
            ("debug1", "debug"),
            ("debug2", "trace"),
            ("debug3", "trace"),
            ("debug4", "trace"),
            ("debug5", "trace"),
            ("trace", "trace"),
            ("off", "off"),
        ] {
            assert_eq!(filter_directives(given).as_deref(), Ok(expected), "{given}");
        }
    }

    #[test]
    fn per_module_levels_are_mapped_too() {
        assert_eq!(
            filter_directives("warning, walsender_actor=debug1,wal_storage=log").as_deref(),
            Ok("warn,walsender_actor=debug,wal_storage=info")
        );
        assert!(
            filter_directives("info,walsender_actor[conn{peer=x}]").is_err(),
            "a span filter without a level names no level"
        );
        assert_eq!(
            filter_directives("walsender_actor[conn{peer=x}]=debug2").as_deref(),
            Ok("walsender_actor[conn{peer=x}]=trace")
        );
    }

    #[test]
    fn unknown_levels_are_errors_naming_the_valid_ones() {
        for bad in [
            "verbose",
            "warnings",
            "info,walsender_actor=loud",
            "",
            "=info",
        ] {
            let e = filter_directives(bad).unwrap_err();
            assert!(e.contains("log_level"), "{bad}: {e}");
            if !bad.starts_with('=') {
                assert!(e.contains("warning") && e.contains("debug5"), "{bad}: {e}");
            }
        }
        assert!(filter_directives("verbose")
            .unwrap_err()
            .contains("\"verbose\""));
    }
}
