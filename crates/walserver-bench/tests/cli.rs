//! `walserver-bench` as its users run it, on its own: the append load against the cluster it
//! starts itself, `catchup` from a primary this test runs in process, and `stream` told where
//! its `walserver` is. (`walserver bench`, the same tool inside the server's binary, is tested
//! with the server's cluster tests, against running nodes and with the stream load.)

use std::process::{Command, Output};

use bytes::Bytes;
use serde_json::Value;
use wal_storage::Lsn;
use walserver_bench::cluster::{self, SystemThread};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walserver-bench"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run walserver-bench")
}

/// Runs `walserver-bench ARGS --json` and returns its JSON report.
fn bench_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = bench(&all);
    assert!(
        out.status.success(),
        "walserver-bench {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "walserver-bench {args:?} printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

#[test]
fn append_load_on_its_own_cluster_counts_every_append() {
    let dir = tempfile::tempdir().unwrap();
    let r = bench_json(&[
        "append",
        "--cluster",
        "1",
        "--writers",
        "2",
        "--size",
        "64",
        "--bytes",
        "32kB",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(num(&r, "errors"), 0.0, "{}", r["first_error"]);
    assert_eq!(r["target"], "cluster");
    assert!(num(&r, "records") >= 500.0, "32 kB of 64 B records: {r}");
    assert_eq!(num(&r, "bytes"), num(&r, "records") * 64.0);
    assert_eq!(num(&r["latency"], "count"), num(&r, "appends"));
}

#[test]
fn catchup_streams_the_range_it_is_given() {
    let segment: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let system = SystemThread::spawn("test-primary").unwrap();
    let primary =
        cluster::start_primary_on(&system.arbiter, &dir.path().join("p"), segment, 4).unwrap();
    let record = Bytes::from(vec![7u8; 8192]);
    primary
        .wal
        .append(vec![record; 64])
        .unwrap()
        .wait()
        .unwrap();
    let (start, end) = (Lsn(segment), primary.wal.flushed());
    let r = bench_json(&[
        "catchup",
        "--port",
        &primary.listen_addr.port().to_string(),
        "--start",
        &start.to_string(),
        "--end",
        &end.to_string(),
    ]);
    assert!(num(&r, "bytes") >= (end.0 - start.0) as f64, "{r}");
    assert!(num(&r, "mb_per_s") > 0.0, "{r}");
    cluster::shutdown(&primary);
}

#[test]
fn stream_runs_the_walserver_it_is_told_of() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-walserver");
    let out = bench(&[
        "--walserver",
        missing.to_str().unwrap(),
        "stream",
        "--gib",
        "0.001",
        "--primary-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("walserver-bench: cannot run walserver"),
        "{stderr}"
    );
}
