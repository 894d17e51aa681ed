//! The reliability table's rows. Each fault scenario of the `faults` tests (the network
//! faults this crate makes) and of the `chaos` tests (kill -9 in a chain, a full disk, accept
//! failing with EMFILE; the soak writes none) writes one [`Row`] with `Row::write`, as
//! `<scenario>.json` in [`default_dir`], and fails through [`check_published`] when
//! `benches/RELIABILITY.md` has no row for it; `walserver-bench reliability-table` renders the
//! rows into that table. The format is the load tool's ([`walserver_bench::reliability`]),
//! re-exported here so that scenarios and renderer cannot disagree. The harness itself writes
//! no row: the tests do. The automatic-failover scenarios write rows of another shape
//! (`walserver_bench::failover_table::FailoverRow`), for `benches/FAILOVER.md`.

pub use walserver_bench::reliability::{default_dir, published, RecoverMs, Row, DIR_VAR};

/// Fails (naming what to do) unless the repository's published table,
/// `benches/RELIABILITY.md` under `workspace`, has a row for `row`'s scenario: a scenario the
/// suite runs must be in the table it keeps.
pub fn check_published(workspace: &std::path::Path, row: &Row) -> Result<(), String> {
    let path = workspace.join("benches").join("RELIABILITY.md");
    let table = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if published(&table, row) {
        Ok(())
    } else {
        Err(format!(
            "{} has no row for the scenario {:?} ({}): run it and render the table again, as \
             the notes under the table say",
            path.display(),
            row.fault,
            row.replay
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let r = RecoverMs::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((r.p50, r.p99, r.max), (3.0, 5.0, 5.0));
        assert_eq!(RecoverMs::of(&[]), RecoverMs::default());
    }

    #[test]
    fn a_row_is_one_json_object_in_the_agreed_shape() {
        let dir = tempfile::tempdir().unwrap();
        let row = Row {
            fault: "cut".into(),
            cycles: 2,
            duration_s: 1.5,
            acknowledged: 10,
            lost: 0,
            recovered: true,
            recover_ms: RecoverMs::of(&[10.0, 20.0]),
            replay: "cargo test --test faults cut".into(),
        };
        let path = row.write_in(dir.path(), "cut").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut got: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        let mut want = vec![
            "fault",
            "cycles",
            "duration_s",
            "acknowledged",
            "lost",
            "recovered",
            "recover_ms",
            "replay",
        ];
        want.sort();
        got.sort();
        assert_eq!(got, want);
        assert_eq!(v["recover_ms"]["max"], 20.0);
    }
}
