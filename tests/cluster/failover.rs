//! Automatic failover's endpoints and commands on nodes without it and with it: `/primary`
//! and `/replica?lag=` answer from the node's own state for load balancers, `/cluster` and
//! the other failover endpoints say clearly when no `[failover]` table is configured, and
//! `walserver cluster` passes the API's answers on; a `walserver run` with a `[failover]` table
//! starts its failover actor beside the node, and one with a wrong table exits with the reason.

use std::process::{Command, Output};

use super::binary::{write_config, Walserver};
use super::common::cluster::*;
use super::common::*;
use super::{KEEP, TL1};

fn walserver(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(args)
        .env_remove("WALSERVER_HTTP_AUTH_TOKEN")
        .output()
        .expect("run walserver")
}

/// The `error` text of a JSON error answer.
fn error_text(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("not a JSON error: {body:?}"))
}

/// Without failover: `/primary` is 200 on the primary and 503 on the standby, `/replica` the
/// other way round (and within a lag once the standby has caught up), a bad lag is a 400,
/// and every failover endpoint is a 503 saying failover is not configured, as is
/// `walserver cluster`.
#[test]
fn health_endpoints_without_failover() {
    let p = TestNode::primary(KEEP);
    let s = TestNode::standby_of(p.addr(), "health-standby", KEEP);
    let end = p.append(16, 1000, 1);
    s.wait_flushed(TL1, end);

    let (code, body) = http_get_any(p.http_addr, "/primary");
    assert_eq!(code, 200, "{body}");
    let (code, body) = http_get_any(s.http_addr, "/primary");
    assert_eq!(code, 503, "{body}");
    assert_eq!(error_text(&body), "this node is a standby");

    let (code, body) = http_get_any(p.http_addr, "/replica");
    assert_eq!(code, 503, "{body}");
    assert_eq!(error_text(&body), "this node is not a streaming standby");
    // The walreceiver reports streaming to no one outside; its status is asked until then.
    wait_until("the standby's /replica to answer 200", || {
        http_get_any(s.http_addr, "/replica").0 == 200
    });
    // Caught up: within any lag, 0 included, once the upstream's end is known here.
    wait_until("the standby to be within lag=0", || {
        http_get_any(s.http_addr, "/replica?lag=0").0 == 200
    });
    let (code, body) = http_get_any(s.http_addr, "/replica?lag=1MB");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["streaming"], true, "{body}");
    assert!(v["lag_bytes"].as_u64().is_some(), "{body}");
    for (bad, says) in [
        ("/replica?lag=5parsecs", "lag: invalid unit"),
        ("/replica?lag=-1", "lag=-1 is not a lag"),
        ("/replica?lagg=1", "invalid query string"),
        ("/primary?x=1", "takes no query parameters"),
    ] {
        let (code, body) = http_get_any(s.http_addr, bad);
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(error_text(&body).contains(says), "{bad}: {body}");
    }

    for path in ["/cluster", "/history"] {
        let (code, body) = http_get_any(p.http_addr, path);
        assert_eq!(code, 503, "{path}: {body}");
        assert!(
            error_text(&body).contains("automatic failover is not configured"),
            "{path}: {body}"
        );
    }
    for (path, body) in [
        ("/switchover", &b""[..]),
        ("/failover", br#"{"candidate": "x"}"#),
        ("/pause", b""),
        ("/resume", b""),
    ] {
        let (code, answer) = http_post(p.http_addr, path, body);
        assert_eq!(code, 503, "{path}: {answer}");
        assert!(
            answer["error"]
                .as_str()
                .is_some_and(|e| e.contains("automatic failover is not configured")),
            "{path}: {answer}"
        );
    }
    // A malformed body is a 400 before anything else.
    for (path, body, says) in [
        ("/failover", &b"{}"[..], "missing field `candidate`"),
        (
            "/switchover",
            b"{\"candidat\": 1}",
            "unknown field `candidat`",
        ),
        ("/switchover", b"not json", "invalid JSON body"),
    ] {
        let (code, answer) = http_post(p.http_addr, path, body);
        assert_eq!(code, 400, "{path}: {answer}");
        assert!(
            answer["error"].as_str().is_some_and(|e| e.contains(says)),
            "{path}: {answer}"
        );
    }

    // The commands pass the API's error on and fail.
    let http = p.http_addr.to_string();
    for args in [
        &["cluster", "list", "--http", &http][..],
        &["cluster", "history", "--http", &http, "--json"],
        &["cluster", "switchover", "--http", &http],
        &["cluster", "failover", "--http", &http, "--candidate", "x"],
        &["cluster", "pause", "--http", &http],
        &["cluster", "resume", "--http", &http],
    ] {
        let out = walserver(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            stderr.contains("automatic failover is not configured"),
            "{args:?}: {stderr}"
        );
    }
    let out = walserver(&["cluster", "failover", "--http", &http]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--candidate"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The admin API's bearer token guards the failover endpoints as it guards the others, and
/// `walserver cluster --token` sends it.
#[test]
fn the_failover_endpoints_take_the_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
    let config = write_config(dir.path(), "http_auth_token = \"s3cret\"\n");
    let w = Walserver::run(&config);
    for path in ["/primary", "/replica", "/cluster"] {
        let (code, body) = http_get_any(w.http, path);
        assert_eq!(code, 401, "{path}: {body}");
    }
    let http = w.http.to_string();
    let out = walserver(&["cluster", "list", "--http", &http]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bearer token"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = walserver(&["cluster", "list", "--http", &http, "--token", "s3cret"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("automatic failover is not configured"),
        "{stderr}"
    );
}

/// A wrong `[failover]` table stops `walserver run` before it starts, with the reason.
#[test]
fn a_wrong_failover_table_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
    let config = write_config(
        dir.path(),
        "[failover]\netcd_endpoints = \"127.0.0.1:2379\"\ncluster_name = \"c\"\nnode_name = \"a/b\"\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run walserver");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("failover.node_name \"a/b\" contains '/'"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .args(["-c", "failover.node_name=n1", "-c", "listen=0.0.0.0:0"])
        .output()
        .expect("run walserver");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("wildcard") && stderr.contains("failover.advertise_conninfo"),
        "{stderr}"
    );
}
