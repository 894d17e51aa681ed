//! A run of failed etcd calls of one kind (joining, renewing, watching), logged the way
//! PostgreSQL's walreceiver logs a lost upstream: the first failure as it is, then at most
//! one summary line per [`SUMMARY_INTERVAL`] (how many failures since when, and the last
//! error), and the end of the run once. An etcd away for an hour so costs about 60 lines per
//! kind, not one per retry (a retry comes every 200 ms to 2 s).

use std::time::{Duration, Instant, SystemTime};

/// The most often a run of failures is summarised. A guess, the walreceiver's: often enough
/// that an operator tailing the log sees the outage go on, rarely enough to stay readable.
pub(crate) const SUMMARY_INTERVAL: Duration = Duration::from_secs(60);

/// A run of failures of one kind, and when it was last logged.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    /// Failures in the current run; 0 when none runs.
    failures: u32,
    /// When the run began (wall clock, for the log).
    since: Option<SystemTime>,
    last_logged: Option<Instant>,
}

/// What to log about one failure.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OutageLog {
    /// The first failure of a run: log it as it is.
    First,
    /// A summary is due: `failures` since `since`.
    Summary { failures: u32, since: SystemTime },
    /// Nothing: a line about this run was logged less than [`SUMMARY_INTERVAL`] ago.
    Quiet,
}

/// A run that ended: `failures` since `since`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Recovered {
    pub(crate) failures: u32,
    pub(crate) since: SystemTime,
}

impl Outage {
    /// Counts a failure at `now` (`wall` is the same instant on the wall clock) and says what
    /// to log about it.
    pub(crate) fn failed(&mut self, now: Instant, wall: SystemTime) -> OutageLog {
        let since = *self.since.get_or_insert(wall);
        self.failures = self.failures.saturating_add(1);
        if self
            .last_logged
            .is_some_and(|t| now.saturating_duration_since(t) < SUMMARY_INTERVAL)
        {
            return OutageLog::Quiet;
        }
        self.last_logged = Some(now);
        if self.failures == 1 {
            OutageLog::First
        } else {
            OutageLog::Summary {
                failures: self.failures,
                since,
            }
        }
    }

    /// A call of this kind succeeded: the run that it ends, if one ran.
    pub(crate) fn ended(&mut self) -> Option<Recovered> {
        let since = self.since.take()?;
        let failures = std::mem::take(&mut self.failures);
        self.last_logged = None;
        Some(Recovered { failures, since })
    }
}

/// A value in a log line, in double quotes when it holds a space (an error's text, a
/// time), so that a reader (or a parser of `key=value` lines) sees where it ends.
pub(crate) struct Quoted<T>(pub(crate) T);

impl<T: std::fmt::Display> std::fmt::Display for Quoted<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0.to_string();
        if text.contains(char::is_whitespace) || text.is_empty() {
            write!(f, "\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
        } else {
            f.write_str(&text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_with_spaces_are_quoted() {
        assert_eq!(Quoted("refused").to_string(), "refused");
        assert_eq!(
            Quoted("connection refused").to_string(),
            "\"connection refused\""
        );
        assert_eq!(Quoted("a \"b\"").to_string(), "\"a \\\"b\\\"\"");
        assert_eq!(Quoted("").to_string(), "\"\"");
    }

    /// An hour of failures every 200 ms: the first logged, then one summary a minute with
    /// the count since the start; the end of the run once, with its count; a new run starts
    /// with a first line again.
    #[test]
    fn a_long_outage_is_logged_once_a_minute() {
        let start = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut o = Outage::default();
        let mut lines = Vec::new();
        for i in 0..(3600 * 5) {
            let now = start + Duration::from_millis(200 * i);
            let log = o.failed(now, wall + Duration::from_millis(200 * i));
            if log != OutageLog::Quiet {
                lines.push((i, log));
            }
        }
        assert_eq!(lines.len(), 60, "{lines:?}");
        assert_eq!(lines[0], (0, OutageLog::First));
        assert_eq!(
            lines[1],
            (
                300,
                OutageLog::Summary {
                    failures: 301,
                    since: wall
                }
            )
        );
        assert_eq!(
            o.ended(),
            Some(Recovered {
                failures: 3600 * 5,
                since: wall
            })
        );
        assert_eq!(o.ended(), None);
        let later = start + Duration::from_secs(3601);
        assert_eq!(o.failed(later, wall), OutageLog::First);
    }
}
