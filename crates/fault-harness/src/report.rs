//! One row of figures per fault scenario, written as JSON so that a table can be made from
//! the rows of every fault test (this crate's network scenarios and the process and disk
//! ones alike).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Recovery times of a scenario's fault cycles, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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

/// What one fault scenario measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The fault, in a few words ("sync standby cut off 3s").
    pub fault: String,
    /// How many times the fault was applied and healed.
    pub cycles: u64,
    /// How long the scenario ran, load included, in seconds.
    pub duration_s: f64,
    /// Appends the client saw acknowledged.
    pub acknowledged: u64,
    /// Acknowledged appends missing or different on some node afterwards.
    pub lost: u64,
    /// Whether everything the scenario expects to recover did.
    pub recovered: bool,
    pub recover_ms: RecoverMs,
    /// The command that runs the scenario again.
    pub replay: String,
}

/// The environment variable naming the directory rows go to.
pub const DIR_VAR: &str = "WALSERVER_RELIABILITY_DIR";

/// The directory rows go to: `WALSERVER_RELIABILITY_DIR`, else `reliability/` in
/// `CARGO_TARGET_DIR` (or `target/` of the current directory when that is unset).
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os(DIR_VAR) {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("reliability")
}

impl Row {
    /// Writes the row as `<dir()>/<scenario>.json` (one JSON object, replacing an older row of
    /// the same scenario) and returns the path.
    pub fn write(&self, scenario: &str) -> Result<PathBuf> {
        self.write_in(&dir(), scenario)
    }

    /// [`Row::write`] into `dir`.
    pub fn write_in(&self, dir: &Path, scenario: &str) -> Result<PathBuf> {
        let io = |e: std::io::Error| Error::Io {
            what: format!("write the row of {scenario} in {}", dir.display()),
            source: e,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let path = dir.join(format!("{scenario}.json"));
        let text = serde_json::to_string(self).map_err(|e| Error::Json(e.to_string()))?;
        std::fs::write(&path, format!("{text}\n")).map_err(io)?;
        Ok(path)
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
        let dir = std::env::temp_dir().join(format!("fault-harness-row-{}", std::process::id()));
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
        let path = row.write_in(&dir, "cut").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
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
        let mut got = keys.clone();
        got.sort();
        assert_eq!(got, want);
        assert_eq!(v["recover_ms"]["max"], 20.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
