//! `walserver bench` as its users run it: against the in-process cluster it starts itself,
//! against a running node over HTTP, and the stream load's catch-up and fan-out. The figures
//! are not judged (speed is for benches/README.md); what is checked is that the tool measures
//! what it says: the appends it counts are in the node's WAL, the percentiles come from a
//! histogram of them, the plot is drawn, and every standby caught up to the primary's end.

use std::path::Path;
use std::process::Command;

use super::common::*;
use super::TL1;
use serde_json::Value;

/// Runs `walserver bench ARGS --json` and returns its JSON report.
fn bench_json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .env("NO_COLOR", "1")
        .output()
        .expect("run walserver bench");
    assert!(
        out.status.success(),
        "walserver bench {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "walserver bench {args:?} printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn num(v: &Value, path: &str) -> f64 {
    let mut cur = v;
    for k in path.split('.') {
        cur = &cur[k];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {v}"))
}

/// Percentiles are ordered and bounded by the max, as a histogram's are; `count` latencies
/// were recorded, one per append.
fn check_latency(report: &Value) {
    let l = &report["latency"];
    assert_eq!(
        num(l, "count"),
        num(report, "appends"),
        "one latency per append"
    );
    let ps = ["p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"].map(|k| num(l, k));
    assert!(ps[0] > 0.0, "{l}");
    assert!(
        ps.windows(2).all(|w| w[0] <= w[1]),
        "percentiles out of order: {l}"
    );
}

fn check_svg(path: &Path) {
    let svg = std::fs::read_to_string(path).expect("the plot was written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(
        svg.contains("<polyline") || svg.contains("<path"),
        "the plot draws no line"
    );
}

#[test]
fn append_load_on_its_own_cluster_reports_percentiles_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("append.svg");
    let r = bench_json(&[
        "append",
        "--cluster",
        "1",
        "--writers",
        "4",
        "--durability",
        "on",
        "--size",
        "100",
        "--bytes",
        "200kB",
        "--dir",
        dir.path().to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert_eq!(r["durability"], "on");
    assert_eq!(num(&r, "errors"), 0.0, "{}", r["first_error"]);
    assert!(num(&r, "records") >= 2000.0, "200 KB of 100 B records: {r}");
    assert_eq!(num(&r, "bytes"), num(&r, "records") * 100.0);
    assert!(num(&r, "appends_per_s") > 0.0);
    check_latency(&r);
    // Each append waited for an fsync on both nodes, shared with at most the other writers.
    let (p, s) = (
        num(&r, "fsyncs_per_append"),
        num(&r, "standby_fsyncs_per_append"),
    );
    assert!(p > 0.2 && p <= 1.1 && s > 0.2 && s <= 1.1, "{p} {s}");
    assert!(num(&r["peak_rss"][0], "bytes") > 1e6);
    assert!(!r["samples"].as_array().unwrap().is_empty());
    check_svg(&plot);
}

#[test]
fn append_load_over_http_lands_in_the_nodes_wal() {
    let primary = TestNode::primary("synchronous_standby_names = 'bench_s1'\n");
    let standby = TestNode::standby_of(primary.addr(), "bench_s1", "");
    standby.wait_receiver("streaming", |_| true);
    let before = primary.wal().flushed();
    let pid = std::process::id().to_string();
    let r = bench_json(&[
        "append",
        "--http",
        &primary.http_addr.to_string(),
        "--writers",
        "2",
        "--batch",
        "4",
        "--size",
        "1000",
        "--bytes",
        "400kB",
        "--durability",
        "on",
        "--pid",
        &pid,
    ]);
    assert_eq!(num(&r, "errors"), 0.0, "{}", r["first_error"]);
    let records = num(&r, "records") as u64;
    assert!(records >= 400, "{r}");
    assert_eq!(num(&r, "appends") as u64 * 4, records);
    check_latency(&r);
    // Every record the tool counted is in the primary's WAL and, being `on`, on the standby.
    let stored = primary
        .wal()
        .read_records(TL1, before, usize::MAX)
        .expect("read records");
    assert_eq!(stored.len() as u64, records);
    assert!(stored.iter().all(|rec| rec.payload.len() == 1000));
    let end = primary.wal().flushed();
    assert!(
        standby.wal().flushed() >= end,
        "sync standby behind the acknowledged end"
    );
    assert!(end > before + records * 1000);
    assert!(num(&r["peak_rss"][0], "bytes") > 1e6, "{}", r["peak_rss"]);
}

/// Runs `walserver bench verify` of `log` against the node at `http`: its JSON report and
/// whether the command succeeded.
fn verify(log: &Path, http: &str) -> (Value, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(["bench", "verify", "--json", "--http", http, "--ack-log"])
        .arg(log)
        .output()
        .expect("run walserver bench verify");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v, out.status.success())
}

#[test]
fn the_acknowledgement_log_is_checked_against_each_node() {
    let primary = TestNode::primary("synchronous_standby_names = 'ack_s1'\n");
    let standby = TestNode::standby_of(primary.addr(), "ack_s1", "");
    standby.wait_receiver("streaming", |_| true);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("acks.ndjson");
    let r = bench_json(&[
        "append",
        "--http",
        &primary.http_addr.to_string(),
        "--writers",
        "3",
        "--batch",
        "3",
        "--size",
        "200",
        "--bytes",
        "180kB",
        "--durability",
        "on",
        "--keep-going",
        "--request-timeout",
        "30",
        "--ack-log",
        log.to_str().unwrap(),
    ]);
    assert_eq!(num(&r, "errors"), 0.0, "{}", r["first_error"]);
    let lines = std::fs::read_to_string(&log).unwrap().lines().count() as f64;
    assert_eq!(
        lines,
        num(&r, "appends"),
        "one log line per acknowledged append"
    );
    // Every acknowledged record is on the primary and, at `on`, on the synchronous standby.
    for node in [&primary, &standby] {
        let (v, ok) = verify(&log, &node.http_addr.to_string());
        assert!(ok, "{v}");
        assert_eq!(num(&v, "found"), num(&r, "records"), "{v}");
        assert_eq!(num(&v, "lost"), 0.0, "{v}");
    }
    // A node that never had the appends fails the check, naming what is missing.
    let other = TestNode::primary("");
    other.append(3, 200, 7);
    let (v, ok) = verify(&log, &other.http_addr.to_string());
    assert!(!ok, "verify passed against a node without the appends: {v}");
    assert_eq!(num(&v, "lost"), num(&r, "records"), "{v}");
    assert!(!v["lost_examples"].as_array().unwrap().is_empty(), "{v}");
}

#[test]
fn stream_load_catches_up_every_standby() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("stream.svg");
    let r = bench_json(&[
        "stream",
        "--gib",
        "0.01",
        "--standbys",
        "3",
        "--primary-dir",
        dir.path().to_str().unwrap(),
        "--standby-dir",
        dir.path().to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(
        num(&r, "bytes_per_standby") >= 10.0 * 1024.0 * 1024.0 * 0.99,
        "{r}"
    );
    let run = &r["runs"][0];
    let standbys = run["standbys"].as_array().expect("per-standby figures");
    assert_eq!(standbys.len(), 3);
    for s in standbys {
        assert!(num(s, "mb_per_s") > 0.0 && num(s, "seconds") > 0.0, "{s}");
    }
    assert!(num(run, "aggregate_mb_per_s") > 0.0);
    assert!(num(run, "primary_cpu_ms_per_mb") >= 0.0);
    assert!(num(run, "primary_rss_peak") >= num(run, "primary_rss_before"));
    check_svg(&plot);
}

/// `bench catchup` started at the current end follows appends made after it (as
/// `benches/compare-postgres.sh` section (e) uses it), under the `application_name` it was
/// given, so a script can wait for that one connection to stream before it starts a load.
#[test]
fn catchup_from_the_end_follows_live_appends_under_its_name() {
    let primary = TestNode::primary("");
    let start = primary.wal().flushed();
    let end = start + 200_000;
    let child = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(["bench", "catchup", "--port"])
        .arg(primary.addr().port().to_string())
        .arg("--start")
        .arg(start.to_string())
        .arg("--end")
        .arg(end.to_string())
        .args(["--application-name", "live-catchup", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run walserver bench catchup");
    wait_until("the catchup client streaming", || {
        primary.status().replication.iter().any(|w| {
            w.application_name == "live-catchup"
                && w.state == walsender_actor::status::WalSenderState::Streaming
        })
    });
    // Nothing past the start existed when it began: all of it arrives live.
    let mut last = start;
    while last < end {
        last = primary.append(4, 8192, 7);
    }
    let out = child.wait_with_output().expect("catchup ends");
    assert!(out.status.success(), "bench catchup failed: {}", out.status);
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert!(num(&r, "bytes") >= (end.0 - start.0) as f64, "{r}");
    assert!(num(&r, "bytes") <= (last.0 - start.0) as f64, "{r}");
    assert!(num(&r, "mb_per_s") > 0.0, "{r}");
}
