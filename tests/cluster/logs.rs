//! The log of the `walserver` binary as an operator reads it, its standard error piped as a
//! log collector would: no colour codes, JSON lines that parse when `log_format = "json"`,
//! words rather than Rust's `Debug` text, an error's text once and naming the setting, each
//! refused connection once with the rule that refused it, and a standby whose upstream is down
//! logging a few lines rather than one per attempt.

use std::net::TcpListener;
use std::process::Command;

use super::binary::{run, spawn, write_config};
use super::common::cluster::*;
use super::common::*;
use super::KEEP;

/// `Debug` text of the kinds that leaked into the log: structs, `Some(..)`, instants.
fn assert_no_debug_text(log: &[String]) {
    for line in log {
        for leak in ["Instant {", "tv_sec", "Some(", " { segment", "deadline:"] {
            assert!(!line.contains(leak), "Debug text {leak:?} in {line:?}");
        }
    }
}

/// Runs a primary to its "admin API listening" line, then SIGTERM to its exit; its whole log.
fn run_to_exit(extra: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
    let config = write_config(dir.path(), extra);
    let mut w = spawn(&config, &[]);
    w.wait_line("admin API listening")
        .expect("a line of the log");
    w.signal(libc::SIGTERM).expect("signal");
    let status = w.wait_exit().expect("the exit");
    assert!(
        status.success(),
        "{status}; the log:\n{}",
        w.log_lines.join("\n")
    );
    std::mem::take(&mut w.log_lines)
}

#[test]
fn piped_text_logs_have_no_colour_codes_and_say_things_in_words() {
    let log = run_to_exit("");
    assert!(log.len() >= 3, "{log:?}");
    for line in &log {
        assert!(!line.contains("\x1b["), "an escape code in {line:?}");
    }
    let shutdown = log
        .iter()
        .find(|l| l.contains("shutting down"))
        .expect("a shutdown line");
    assert!(
        shutdown.contains("mode=fast (standbys have"),
        "{shutdown:?}"
    );
    assert_no_debug_text(&log);
}

#[test]
fn json_logs_are_one_object_per_line() {
    let log = run_to_exit("log_format = \"json\"\n");
    assert!(log.len() >= 3, "{log:?}");
    let mut messages = Vec::new();
    for line in &log {
        assert!(!line.contains("\x1b["), "an escape code in {line:?}");
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        assert!(v["level"].is_string(), "{line}");
        messages.push(v["fields"]["message"].as_str().unwrap_or("").to_string());
        if v["fields"]["message"] == "shutting down" {
            let mode = v["fields"]["mode"].as_str().unwrap_or("");
            assert!(mode.starts_with("fast (standbys have"), "{line}");
        }
    }
    assert!(
        messages.iter().any(|m| m == "admin API listening"),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m == "shutting down"),
        "{messages:?}"
    );
    assert_no_debug_text(&log);
}

#[test]
fn a_taken_address_is_named_with_its_setting_and_the_error_told_once() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    for setting in ["listen", "http_listen"] {
        let dir = tempfile::tempdir().unwrap();
        walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
        let config = write_config(dir.path(), "");
        let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
            .args(["run", "--config"])
            .arg(&config)
            .arg("-c")
            .arg(format!("{setting}={addr}"))
            .env_remove("RUST_LOG")
            .output()
            .expect("run walserver");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("");
        assert!(
            last.contains(&format!("({setting})")) && last.contains(&addr.to_string()),
            "{setting}: {err}"
        );
        assert_eq!(
            err.matches("already in use").count(),
            1,
            "{setting}: the error's text once: {err}"
        );
    }
}

#[test]
fn a_refused_connection_is_logged_once_with_the_rule_that_refused_it() {
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
    let config = write_config(
        dir.path(),
        r#"
[[hba]]
address = "127.0.0.0/8"
user = "intruder"
method = "reject"
[[hba]]
address = "127.0.0.0/8"
user = "repl"
method = "trust"
"#,
    );
    let mut w = run(&config);
    for user in ["intruder", "stranger"] {
        let e = PgConn::connect(w.listen, user, None)
            .err()
            .expect("refused");
        assert_eq!(sqlstate(&e), "28000");
        assert!(!message(&e).contains("pg_hba.conf"), "{}", message(&e));
        assert!(message(&e).contains("walserver"), "{}", message(&e));
    }
    assert!(PgConn::connect(w.listen, "repl", None).is_ok());
    // The refusals are logged before the client hears of them: a line the process writes
    // after they were sent comes after their lines.
    w.signal(libc::SIGHUP).expect("signal");
    w.wait_line("configuration reloaded")
        .expect("a line of the log");
    let refused: Vec<&String> = w
        .log_lines
        .iter()
        .filter(|l| l.contains("connection refused"))
        .collect();
    assert_eq!(refused.len(), 2, "{:#?}", w.log_lines);
    assert!(
        refused[0].contains(
            "hba rule 1 (host intruder 127.0.0.0/8 reject) rejects user \"intruder\" from 127.0.0.1"
        ),
        "{}",
        refused[0]
    );
    assert!(
        refused[1].contains("no hba rule matches: user \"stranger\" from 127.0.0.1"),
        "{}",
        refused[1]
    );
    for user in ["intruder", "stranger"] {
        let about = w
            .log_lines
            .iter()
            .filter(|l| l.contains(&format!("\"{user}\"")))
            .count();
        assert_eq!(about, 1, "one line about {user}: {:#?}", w.log_lines);
    }
}

#[test]
fn an_unreachable_upstream_is_logged_at_a_bounded_rate() {
    let u = TestNode::primary(KEEP);
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_standby(&dir.path().join("data"), &u.conninfo("s"), None, None)
        .expect("init_standby");
    // The upstream goes down; its port is where the standby looks for it.
    let port = u.addr().port();
    let conninfo = u.conninfo("s");
    let u_dir = u.down(Down::Immediate);
    let config = write_config(
        dir.path(),
        &format!("primary_conninfo = {conninfo:?}\n{KEEP}"),
    );
    let mut w = run(&config);
    let schedule = w
        .status()
        .expect("/status")
        .wal_receiver
        .expect("a standby's walreceiver part")
        .retry_schedule;
    assert_eq!(schedule.first_retry_ms, 0, "{schedule:?}");
    assert_eq!(schedule.wal_retrieve_retry_interval_ms, 100, "{schedule:?}");
    // Thirty attempts take about three seconds at the default schedule.
    let mut attempts = 0;
    wait_until("thirty attempts to reach the upstream", || {
        attempts = w
            .status()
            .expect("/status")
            .wal_receiver
            .map_or(0, |r| u64::from(r.restart.attempts));
        attempts >= 30
    });
    // A line written after those attempts, so that every line about them has been read.
    w.signal(libc::SIGHUP).expect("signal");
    w.wait_line("configuration reloaded")
        .expect("a line of the log");
    let about_upstream: Vec<&String> = w
        .log_lines
        .iter()
        .filter(|l| l.contains("walreceiver") || l.contains("upstream"))
        .collect();
    assert!(
        !about_upstream.is_empty() && about_upstream.len() <= 3,
        "{attempts} attempts, {} lines: {about_upstream:#?}",
        about_upstream.len()
    );
    assert!(
        about_upstream[0].contains("WARN") && about_upstream[0].contains("walreceiver stopped"),
        "{}",
        about_upstream[0]
    );
    // The upstream comes back on its port: one line says the standby streams again.
    let _u = TestNode::start_listening(u_dir, &format!("127.0.0.1:{port}"), KEEP);
    let again = w
        .wait_line("streaming from upstream")
        .expect("a line of the log");
    assert!(
        again.contains("INFO")
            && again.contains("again, after")
            && again.contains("failed attempts since"),
        "{again}"
    );
}
