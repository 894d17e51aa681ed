//! The CLI clients as commands: the built `walserver` binary run with `append`, `status`,
//! `promote` and `init --standby --start-lsn` against nodes over real sockets.

use std::process::{Command, Output};

use supervisor_actor::{NodeRole, RecordEvent};
use wal_storage::Lsn;

use super::common::cluster::*;
use super::common::*;
use super::records::read_records;
use super::{append_mib, KEEP, TL1, TL2};

/// Runs `walserver ARGS` and returns what it did.
fn walserver(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(args)
        .output()
        .expect("run walserver")
}

/// Runs `walserver ARGS`, asserts it succeeded and returns its standard output.
fn walserver_ok(args: &[&str]) -> String {
    let out = walserver(args);
    assert!(
        out.status.success(),
        "walserver {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// `walserver append`, `status` (table in 100 columns, `--wide` and `--json`) and `promote`
/// against a primary and its standby: the records land as generated, the status shows the
/// standby, the standby becomes a primary of timeline 2, and promoting a primary fails with
/// the reason.
#[test]
fn append_status_and_promote_as_commands() {
    let p = TestNode::primary(KEEP);
    let s = TestNode::standby_of(p.addr(), "cli-standby", KEEP);
    let p_http = p.http_addr.to_string();
    let s_http = s.http_addr.to_string();
    let from = p.wal().flushed();

    // append: 20 records of 50 bytes, "record N " padded with dots.
    let said = walserver_ok(&[
        "append",
        "--http",
        &p_http,
        "--count",
        "20",
        "--size",
        "50",
        "--durability",
        "local",
    ]);
    assert!(
        said.contains("appended 20 records (1000 bytes)") && said.contains("(local)"),
        "{said}"
    );
    let end = p.wal().flushed();
    assert!(said.contains(&format!("end LSN {end}")), "{said}");
    let payloads: Vec<Vec<u8>> = read_records(&p, from)
        .into_iter()
        .filter_map(|e| match e {
            RecordEvent::Record { payload, .. } => Some(payload.to_vec()),
            RecordEvent::TimelineSwitch { .. } => None,
        })
        .collect();
    let want: Vec<Vec<u8>> = (0..20)
        .map(|i| {
            let mut r = format!("record {i} ").into_bytes();
            r.resize(50, b'.');
            r
        })
        .collect();
    assert_eq!(payloads, want);
    s.wait_flushed(TL1, end);

    // status: the node's facts, and the standby in the replication table.
    wait_until("the standby's walsender to stream", || {
        p.status()
            .replication
            .iter()
            .any(|r| r.application_name == "cli-standby")
    });
    let table = walserver_ok(&["status", "--http", &p_http]);
    let line = |key: &str| -> String {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no {key} line in:\n{table}"))
            .to_string()
    };
    assert!(line("role").ends_with(" primary"), "{table}");
    assert!(line("flush_lsn").ends_with(&format!(" {end}")), "{table}");
    assert!(table.contains("replication (1 walsenders)"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.contains("cli-standby") && l.contains("streaming")),
        "{table}"
    );
    // It fits in 100 columns; --wide has every column of pg_stat_replication.
    let widest = table.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    eprintln!("walserver status: {widest} columns at most");
    assert!(widest <= 100, "{widest} columns:\n{table}");
    let wide = walserver_ok(&["status", "--http", &p_http, "--wide"]);
    for column in [
        "pid",
        "client_addr",
        "reply_time",
        "backend_xmin",
        "restart_tli",
    ] {
        assert!(wide.contains(column), "no {column} in --wide:\n{wide}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&walserver_ok(&["status", "--http", &p_http, "--json"]))
            .expect("status --json prints JSON");
    assert_eq!(json["role"], "primary");
    assert_eq!(json["flush_lsn"], end.to_string());
    assert_eq!(json["replication"][0]["application_name"], "cli-standby");
    assert_eq!(
        json["system_identifier"],
        p.http_get("/status")["system_identifier"]
    );

    // promote: a primary refuses, with the reason, and the command fails.
    let out = walserver(&["promote", "--http", &p_http]);
    assert!(!out.status.success(), "promoting a primary succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already a primary"), "{err}");
    // The standby becomes the primary of timeline 2, starting where it had received.
    let said = walserver_ok(&["promote", "--http", &s_http]);
    assert_eq!(said.trim(), format!("promoted: timeline 2 starts at {end}"));
    let status = s.status();
    assert_eq!(status.role, NodeRole::Primary);
    assert_eq!(status.timeline, TL2);
    assert!(status.wal_receiver.is_none());
    let said = walserver_ok(&["append", "--http", &s_http, "--count", "1", "--size", "10"]);
    assert!(said.contains("on timeline 2"), "{said}");
}

/// `walserver init --standby --start-lsn X` makes a standby that starts at the segment
/// holding X, an older one than the upstream's current segment (where it would start
/// without the option), and streams from there.
#[test]
fn init_standby_with_start_lsn_starts_there() {
    let p = TestNode::primary(KEEP);
    let seg = p.wal().segment_size();
    // Three segments of WAL; X lies in the second, the end in the fourth.
    let x = append_mib(&p, 1, 1);
    let end = append_mib(&p, 2, 2);
    let start = x.segment_start(seg);
    assert!(
        start < end.segment_start(seg),
        "X is not in an older segment"
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let said = walserver_ok(&[
        "init",
        "--standby",
        "--data-dir",
        data.to_str().unwrap(),
        "--primary-conninfo",
        &p.conninfo("from-x"),
        "--start-lsn",
        &x.to_string(),
    ]);
    assert!(said.contains(&format!("starting at {start}")), "{said}");
    let s = TestNode::start_in(dir, KEEP);
    s.wait_flushed(TL1, end);
    let info = s.wait_receiver("the standby to stream", |_| true);
    let status = info.status.expect("walreceiver status");
    assert_eq!(status.receive_start_lsn, Some(start));
    assert_eq!(status.receive_start_tli, Some(TL1));
    // It has WAL from the start of X's segment, and none before it.
    assert_same_wal(&p, &s, TL1, start, end);
    assert!(
        !s.wal()
            .read(TL1, Lsn(start.0 - seg), 16)
            .is_ok_and(|b| !b.is_empty()),
        "the standby has WAL before the segment of --start-lsn"
    );
    // A start beyond the upstream's end is refused.
    let dir = tempfile::tempdir().unwrap();
    let out = walserver(&[
        "init",
        "--standby",
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
        "--primary-conninfo",
        &p.conninfo("too-far"),
        "--start-lsn",
        &Lsn(end.0 + seg).to_string(),
    ]);
    assert!(
        !out.status.success(),
        "a start beyond the upstream's end was accepted"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--start-lsn"), "{err}");
}

/// The mistakes a new operator makes before any node runs get a message that names the
/// mistake and says what to do: no configuration, a directory that was never initialised,
/// a misspelt variable or key, and init in a directory holding other files.
#[test]
fn operator_mistakes_say_how_to_fix_them() {
    let fails = |args: &[&str], env: &[(&str, &str)]| -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("run walserver");
        assert!(
            !out.status.success(),
            "walserver {args:?} succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(out.stdout.is_empty(), "walserver {args:?} printed a result");
        String::from_utf8(out.stderr).expect("UTF-8 output")
    };
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();

    let err = fails(&["run"], &[]);
    assert_eq!(
        err.trim_end(),
        "walserver: no data directory: pass `--config FILE` (a configuration with data_dir) or `-c data_dir=DIR`"
    );

    let empty = path("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = fails(&["run", "-c", &format!("data_dir={empty}")], &[]);
    assert!(
        err.contains(&format!(
            "{empty} is not a walserver data directory (no control file); run `walserver init --data-dir {empty}` first"
        )),
        "{err}"
    );

    let err = fails(
        &["run", "-c", &format!("data_dir={empty}")],
        &[("WALSERVER_WAL_SENDER_TIMOUT", "5s")],
    );
    assert_eq!(
        err.trim_end(),
        "walserver: environment variable WALSERVER_WAL_SENDER_TIMOUT names no setting; did you mean WALSERVER_WAL_SENDER_TIMEOUT?"
    );

    let config = path("walserver.toml");
    std::fs::write(
        &config,
        format!("data_dir = {empty:?}\n[[hba]]\ntyp = \"hostssl\"\naddress = \"all\"\nuser = \"all\"\nmethod = \"trust\"\n"),
    )
    .unwrap();
    let err = fails(&["run", "--config", &config], &[]);
    assert_eq!(
        err.trim_end(),
        format!("walserver: invalid configuration (file {config}): unknown key `typ` in [[hba]] rule 1; did you mean `type`? (expected one of `type`, `address`, `user`, `method`)")
    );

    let junk = path("junk");
    std::fs::create_dir(&junk).unwrap();
    std::fs::write(dir.path().join("junk/notes.txt"), "mine").unwrap();
    let err = fails(&["init", "--data-dir", &junk], &[]);
    assert_eq!(
        err.trim_end(),
        format!("walserver: {junk} is not empty and is not a walserver data directory (it holds `notes.txt`); give `walserver init --data-dir` a new or empty directory")
    );
}
