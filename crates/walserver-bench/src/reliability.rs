//! The reliability table: each fault scenario (the `chaos` and `faults` tests of the
//! `walserver` package, written with the fault harness's row type) leaves one JSON [`Row`] in
//! a directory (`$CARGO_TARGET_DIR/reliability/` by default), and `walserver-bench
//! reliability-table` turns the rows into the markdown table of `benches/RELIABILITY.md`.
//! [`Row`] is the one definition of that format: the harness (a test-only crate) re-exports it
//! and writes rows with [`Row::write`].
//!
//! A row says what was done (the fault, how many cycles, how long), what the client saw
//! (appends acknowledged, acknowledged appends missing afterwards, whether it recovered) and how
//! long recovery took, with the command that replays the run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Time to recover over a run's cycles, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecoverMs {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl RecoverMs {
    /// Percentiles of `samples` (milliseconds), nearest rank; all zero when there are none.
    pub fn of(samples: &[f64]) -> RecoverMs {
        if samples.is_empty() {
            return RecoverMs::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let rank = |q: f64| {
            let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
            s[i - 1]
        };
        RecoverMs {
            p50: rank(0.50),
            p99: rank(0.99),
            max: s[s.len() - 1],
        }
    }
}

/// One fault scenario's outcome, one JSON file per scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// What was done, in words (`kill -9 of a random node of a chain`).
    pub fault: String,
    /// How many times the fault was injected and lifted.
    pub cycles: u64,
    pub duration_s: f64,
    /// Appends the client saw acknowledged.
    pub acknowledged: u64,
    /// Acknowledged appends that were missing or different afterwards.
    pub lost: u64,
    /// Whether everything the scenario expects to recover did.
    pub recovered: bool,
    pub recover_ms: RecoverMs,
    /// The command that runs the scenario again (with its seed, where it has one).
    pub replay: String,
}

/// The variable that names the directory of rows: a test harness's, not a setting (walserver's
/// configuration lets `WALSERVER_TEST_` variables through; programs that start nodes still
/// take it out of the node's environment, as none of its business).
pub const DIR_VAR: &str = "WALSERVER_TEST_RELIABILITY_DIR";

impl Row {
    /// Writes the row as `<dir>/<scenario>.json` (one JSON object, replacing an older row of
    /// the same scenario) in [`default_dir`] of the current directory, and returns the path.
    pub fn write(&self, scenario: &str) -> anyhow::Result<PathBuf> {
        self.write_in(&default_dir(&std::env::current_dir()?), scenario)
    }

    /// [`Row::write`] into `dir`.
    pub fn write_in(&self, dir: &Path, scenario: &str) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("{scenario}.json"));
        let text = serde_json::to_string(self)?;
        std::fs::write(&path, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    }
}

/// Where rows go by default, as the fault harness writes them: `WALSERVER_TEST_RELIABILITY_DIR`,
/// else `$CARGO_TARGET_DIR/reliability`, else `target/reliability` under `workspace` (the
/// directory cargo builds in).
pub fn default_dir(workspace: &Path) -> PathBuf {
    if let Some(d) = std::env::var_os(DIR_VAR) {
        return PathBuf::from(d);
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t).join("reliability"),
        None => workspace.join("target").join("reliability"),
    }
}

/// Every row in `dir` (its `*.json` files), sorted by fault.
pub fn read_rows(dir: &Path) -> anyhow::Result<Vec<Row>> {
    let mut rows: Vec<Row> = read_json_files(dir, "a reliability row")?;
    rows.sort_by(|a, b| a.fault.cmp(&b.fault));
    Ok(rows)
}

/// Every `*.json` file in `dir`, each one `T` (`what` names it in errors).
pub fn read_json_files<T: serde::de::DeserializeOwned>(
    dir: &Path,
    what: &str,
) -> anyhow::Result<Vec<T>> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    for e in entries {
        let path = e?.path();
        if path.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        out.push(
            serde_json::from_str(&text)
                .with_context(|| format!("{} is not {what}", path.display()))?,
        );
    }
    Ok(out)
}

/// A markdown cell: `|` would end the cell and a newline the row.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The table of `rows`, under a heading that names the machine and the date.
pub fn render(rows: &[Row], machine: &str, date: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Reliability");
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Fault scenarios run against real `walserver run` processes on {machine}, {date}. \
         \"Lost\" counts appends the client saw acknowledged that were missing or different \
         afterwards, judged against the client's own log. Rendered by \
         `walserver-bench reliability-table` from the rows the scenarios wrote."
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| fault | cycles | duration | appends acknowledged | lost | recovered | time to recover p50 / p99 / max | replay |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} s | {} | {} | {} | {:.0} / {:.0} / {:.0} ms | `{}` |",
            cell(&r.fault),
            r.cycles,
            r.duration_s,
            r.acknowledged,
            r.lost,
            if r.recovered { "yes" } else { "no" },
            r.recover_ms.p50,
            r.recover_ms.p99,
            r.recover_ms.max,
            cell(&r.replay).replace('`', "'"),
        );
    }
    out
}

/// The command of `row`'s replay without its leading `VAR=value` settings (a seed, a cycle
/// count): what stays the same from run to run of a scenario.
pub fn replay_command(row: &Row) -> String {
    command_of(&row.replay)
}

/// `replay` without its leading `VAR=value` settings.
pub fn command_of(replay: &str) -> String {
    let words: Vec<&str> = replay
        .split_whitespace()
        .skip_while(|w| w.contains('='))
        .collect();
    words.join(" ")
}

/// Whether the rendered `table` has a row for `row`'s scenario (one whose replay runs the same
/// command), so that a suite can tell when its published table lacks a scenario.
pub fn published(table: &str, row: &Row) -> bool {
    published_replay(table, &row.replay)
}

/// Whether the rendered `table` (this one's or the failover table) has a row whose replay runs
/// the command of `replay`.
pub fn published_replay(table: &str, replay: &str) -> bool {
    let command = command_of(replay);
    !command.is_empty()
        && table
            .lines()
            .filter(|l| l.starts_with("| "))
            .any(|l| l.contains(&format!(" {command}`")) || l.contains(&format!("`{command}`")))
}

/// The machine in a few words: CPU model, cores and kernel (Linux's `/proc`), for the heading.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "an unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| format!(", Linux {}", k.trim()))
        .unwrap_or_default();
    format!("{cpu}, {cores} cores{kernel}")
}

/// Today's date in UTC as `YYYY-MM-DD` (the civil-from-days conversion of the proleptic
/// Gregorian calendar, so no date crate is needed for one heading).
pub fn today_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    civil_date((secs / 86_400) as i64)
}

fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fault: &str, recovered: bool) -> Row {
        Row {
            fault: fault.into(),
            cycles: 10,
            duration_s: 12.25,
            acknowledged: 5000,
            lost: 0,
            recovered,
            recover_ms: RecoverMs {
                p50: 200.0,
                p99: 300.4,
                max: 300.4,
            },
            replay: "WALSERVER_TEST_CHAOS_SEED=7 cargo test --test chaos kill".into(),
        }
    }

    fn write(dir: &Path, name: &str, r: &Row) {
        std::fs::write(
            dir.join(format!("{name}.json")),
            serde_json::to_vec(r).unwrap(),
        )
        .unwrap();
    }

    #[test]
    fn rows_are_read_from_a_directory_and_rendered_sorted() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "b", &row("b | pipes", false));
        write(dir.path(), "a", &row("a fault", true));
        std::fs::write(dir.path().join("notes.txt"), "not a row").unwrap();
        let rows = read_rows(dir.path()).unwrap();
        assert_eq!(rows, vec![row("a fault", true), row("b | pipes", false)]);
        let table = render(&rows, "a test machine", "2026-12-01");
        let lines: Vec<&str> = table.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert_eq!(
            lines[1],
            "| a fault | 10 | 12.2 s | 5000 | 0 | yes | 200 / 300 / 300 ms | \
             `WALSERVER_TEST_CHAOS_SEED=7 cargo test --test chaos kill` |"
        );
        assert!(lines[2].starts_with("| b \\| pipes |"), "{}", lines[2]);
        assert!(lines[2].contains("| no |"), "{}", lines[2]);
        assert!(table.contains("a test machine, 2026-12-01"));
        // A file that is not a row is an error naming it, not a silent skip.
        std::fs::write(dir.path().join("bad.json"), "{}").unwrap();
        let e = read_rows(dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("bad.json"), "{e:#}");
    }

    #[test]
    fn a_table_is_checked_for_a_scenario_by_its_replay_command() {
        let table = render(&[row("a fault", true)], "m", "2026-12-01");
        let mut other = row("the same scenario, another run", true);
        other.replay = "WALSERVER_TEST_CHAOS_SEED=99 WALSERVER_TEST_CHAOS_CYCLES=3 cargo test --test chaos kill".into();
        assert_eq!(replay_command(&other), "cargo test --test chaos kill");
        assert!(published(&table, &other), "{table}");
        other.replay = "cargo test --test chaos kill_more".into();
        assert!(!published(&table, &other), "{table}");
        other.replay = "cargo test --test chaos".into();
        assert!(
            !published(&table, &other),
            "a prefix of a command is not the command"
        );
    }

    #[test]
    fn the_fault_harness_row_shape_is_read() {
        // One line as the harness writes it (keys in its order, `recovered` a boolean).
        let line = r#"{"fault":"cut","cycles":2,"duration_s":1.5,"acknowledged":10,"lost":0,"recovered":true,"recover_ms":{"p50":10.0,"p99":20.0,"max":20.0},"replay":"cargo test --test faults cut"}"#;
        let r: Row = serde_json::from_str(line).unwrap();
        assert_eq!((r.cycles, r.recovered, r.recover_ms.max), (2, true, 20.0));
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(20_423), "2025-12-01");
        assert_eq!(civil_date(11_016), "2000-02-29");
        assert_eq!(today_utc().len(), 10);
    }
}
