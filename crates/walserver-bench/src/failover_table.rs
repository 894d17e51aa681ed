//! The failover table: each automatic-failover scenario (the `failover` tests of the
//! `walserver` package) leaves one JSON [`FailoverRow`] in a directory
//! (`$CARGO_TARGET_DIR/failover/` by default), and `walserver-bench failover-table` turns the
//! rows into the markdown table of `benches/FAILOVER.md`.
//!
//! A row says what was done, what the client saw (appends acknowledged, acknowledged appends
//! missing afterwards, appends whose outcome it never learnt and how many of those the final
//! leader holds, acknowledgements of an old term after the first of a new one, leader changes),
//! how long from each fault to the first acknowledgement by the new leader, and the command
//! that replays it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::reliability::{read_json_files, RecoverMs, DIR_VAR};

/// One failover scenario's outcome, one JSON file per scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailoverRow {
    pub fault: String,
    pub cycles: u64,
    pub duration_s: f64,
    /// Records the client saw acknowledged.
    pub acknowledged: u64,
    /// Acknowledged records missing or different on the final leader or any node afterwards.
    pub lost: u64,
    /// Appends whose outcome the client never learnt, and how many the final leader holds.
    pub indeterminate: u64,
    pub indeterminate_present: u64,
    /// Acknowledgements of an older timeline received after the first of a newer one.
    pub old_term_acks: u64,
    /// Leader changes the client saw.
    pub promotions: u64,
    /// From each fault to the first acknowledgement by the new leader.
    pub failover_ms: RecoverMs,
    /// The longest pause between acknowledgements, where the scenario measures it.
    pub pause_ms: Option<f64>,
    /// Whether every check of the scenario held.
    pub passed: bool,
    pub replay: String,
}

impl FailoverRow {
    /// Writes the row as `<dir>/<scenario>.json` in [`default_dir`] of the current directory.
    pub fn write(&self, scenario: &str) -> anyhow::Result<PathBuf> {
        self.write_in(&default_dir(&std::env::current_dir()?), scenario)
    }

    pub fn write_in(&self, dir: &Path, scenario: &str) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("{scenario}.json"));
        std::fs::write(&path, format!("{}\n", serde_json::to_string(self)?))
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    }
}

/// Where rows go: `$WALSERVER_TEST_RELIABILITY_DIR/failover`, else
/// `$CARGO_TARGET_DIR/failover`, else `target/failover` under `workspace`.
pub fn default_dir(workspace: &Path) -> PathBuf {
    if let Some(d) = std::env::var_os(DIR_VAR) {
        return PathBuf::from(d).join("failover");
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t).join("failover"),
        None => workspace.join("target").join("failover"),
    }
}

/// Every row in `dir`, sorted by fault.
pub fn read_rows(dir: &Path) -> anyhow::Result<Vec<FailoverRow>> {
    let mut rows: Vec<FailoverRow> = read_json_files(dir, "a failover row")?;
    rows.sort_by(|a, b| a.fault.cmp(&b.fault));
    Ok(rows)
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The table of `rows`, under a heading that names the machine and the date.
pub fn render(rows: &[FailoverRow], machine: &str, date: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Automatic failover");
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Failover scenarios on three `walserver run` members and a three-member etcd, each \
         member in a network namespace of its own, on {machine}, {date}. Everything is judged \
         from the load's own log: \"lost\" counts acknowledged records missing or different \
         afterwards; \"old-term acks\" counts acknowledgements of an older timeline the client \
         received after the first of a newer one. Rendered by `walserver-bench failover-table`."
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| fault | cycles | duration | records acknowledged | lost | indeterminate (on leader) | old-term acks | promotions | kill → first ack p50 / p99 / max | longest pause | passed | replay |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for r in rows {
        let failover = if r.failover_ms.max > 0.0 {
            format!(
                "{:.0} / {:.0} / {:.0} ms",
                r.failover_ms.p50, r.failover_ms.p99, r.failover_ms.max
            )
        } else {
            "-".into()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} s | {} | {} | {} ({}) | {} | {} | {} | {} | {} | `{}` |",
            cell(&r.fault),
            r.cycles,
            r.duration_s,
            r.acknowledged,
            r.lost,
            r.indeterminate,
            r.indeterminate_present,
            r.old_term_acks,
            r.promotions,
            failover,
            r.pause_ms.map_or("-".into(), |p| format!("{p:.0} ms")),
            if r.passed { "yes" } else { "no" },
            cell(&r.replay).replace('`', "'"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_render() {
        let dir = tempfile::tempdir().unwrap();
        let row = FailoverRow {
            fault: "kill -9 of the primary".into(),
            cycles: 5,
            duration_s: 60.0,
            acknowledged: 1000,
            lost: 0,
            indeterminate: 4,
            indeterminate_present: 3,
            old_term_acks: 0,
            promotions: 5,
            failover_ms: RecoverMs::of(&[3000.0, 4000.0]),
            pause_ms: None,
            passed: true,
            replay: "cargo test --test failover kill -- --exact".into(),
        };
        row.write_in(dir.path(), "kill").unwrap();
        let rows = read_rows(dir.path()).unwrap();
        assert_eq!(rows, vec![row]);
        let t = render(&rows, "a machine", "2026-01-01");
        assert!(t.contains("| 4 (3) |"), "{t}");
        assert!(t.contains("3000 / 4000 / 4000 ms"), "{t}");
        assert!(
            t.contains("`cargo test --test failover kill -- --exact`"),
            "{t}"
        );
    }
}
