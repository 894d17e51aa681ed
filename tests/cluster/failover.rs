//! Automatic failover's endpoints and commands on nodes without it and with it: `/primary`
//! and `/replica?lag=` answer from the node's own state for load balancers, `/cluster` and
//! the other failover endpoints say clearly when no `[failover]` table is configured, and
//! `walserver cluster` passes the API's answers on; a `walserver run` with a `[failover]` table
//! starts its failover actor beside the node, and one with a wrong table exits with the reason.
//! Against an etcd with client TLS and authentication, three members fail over through it,
//! a node whose password or CA etcd refuses stops at start saying so, and so does a second
//! process of a live member's `node_name`.

use std::process::{Command, Output};

use etcd_gateway::testkit::{EtcdServer, Pki};

use super::binary::{http_of, run, spawn, write_config};
use super::common::cluster::*;
use super::common::*;
use super::{KEEP, TL1};

pub(super) fn walserver(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(args)
        .env_remove("WALSERVER_HTTP_AUTH_TOKEN")
        .output()
        .expect("run walserver")
}

/// The `error` text of a JSON error answer.
pub(super) fn error_text(body: &str) -> String {
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
    let w = run(&config);
    for path in ["/primary", "/replica", "/cluster"] {
        let (code, body) = http_get_any(http_of(&w), path);
        assert_eq!(code, 401, "{path}: {body}");
    }
    let http = http_of(&w).to_string();
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

/// The `[failover]` table of member `name` of the cluster `t` on `etcd`.
fn failover_table(etcd: &EtcdServer, name: &str) -> String {
    format!(
        "[failover]\netcd_endpoints = [{:?}]\ncluster_name = \"t\"\nnode_name = \"{name}\"\nttl = \"4s\"\n",
        etcd.client_url()
    )
}

/// A second `walserver run` with a member's `node_name` exits non-zero within one ttl,
/// naming the live member's admin API; the member keeps leading.
#[test]
fn a_second_process_of_a_member_name_is_refused_at_start() {
    let etcd = EtcdServer::start();
    let p = TestNode::primary(&format!("{KEEP}{}", failover_table(&etcd, "n1")));
    wait_until("n1 to hold the leader key", || {
        http_get_any(p.http_addr, "/primary").0 == 200
    });
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
    let config = write_config(dir.path(), &failover_table(&etcd, "n1"));
    let started = std::time::Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run walserver");
    let pid = child.id();
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    // One ttl (4 s): a live holder refreshes its key every ttl/3.
    let out = match ended.recv_timeout(std::time::Duration::from_secs(4)) {
        Ok(out) => out.expect("wait for walserver"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("a second n1 still runs after one ttl");
        }
    };
    assert!(started.elapsed() < std::time::Duration::from_secs(4));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cluster \"t\" already has a member named \"n1\"")
            && stderr.contains(&format!("admin API http://{}", p.http_addr)),
        "{stderr}"
    );
    let (code, body) = http_get_any(p.http_addr, "/primary");
    assert_eq!(code, 200, "{body}");
}

/// A primary and its standby, both with failover on a real etcd: the primary takes the
/// leader key, so `/primary` is 200 there (and appends are acknowledged) and 503 on the
/// standby; `/cluster` lists both with the leader, and `walserver cluster list` and `history`
/// show them.
#[test]
fn with_failover_the_leader_answers_primary_and_the_cluster_lists_its_members() {
    let etcd = EtcdServer::start();
    let p = TestNode::primary(&format!("{KEEP}{}", failover_table(&etcd, "n1")));
    let start = std::time::Instant::now();
    loop {
        let (code, body) = http_get_any(p.http_addr, "/primary");
        if code == 200 {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "n1 does not hold the leader key: /primary {code} {body}; /cluster {:?}",
            http_get_any(p.http_addr, "/cluster")
        );
        // Leadership is won in etcd; the node tells it only when asked.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (code, answer) = http_post(p.http_addr, "/wal", b"under failover");
    assert_eq!(code, 200, "{answer}");
    let s = TestNode::standby_of(
        p.addr(),
        "n2",
        &format!("{KEEP}{}", failover_table(&etcd, "n2")),
    );
    let cluster = || -> serde_json::Value {
        let (code, body) = http_get_any(p.http_addr, "/cluster");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("JSON")
    };
    wait_until("n2 to be listed as a streaming standby", || {
        cluster()["members"].as_array().is_some_and(|m| {
            m.iter()
                .any(|m| m["name"] == "n2" && m["role"] == "standby" && m["streaming"] == true)
        })
    });
    let v = cluster();
    assert_eq!(v["cluster"], "t", "{v}");
    assert_eq!(v["leader"]["name"], "n1", "{v}");
    assert_eq!(v["ttl_seconds"], 4, "{v}");
    let n1 = v["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "n1"))
        .unwrap_or_else(|| panic!("no n1 in {v}"));
    assert_eq!(n1["role"], "primary", "{v}");
    assert_eq!(
        n1["api_url"],
        format!("http://{}", p.http_addr),
        "the advertised admin API is the bound one: {v}"
    );
    let (code, body) = http_get_any(s.http_addr, "/primary");
    assert_eq!(code, 503, "{body}");
    wait_until("n2's /replica to answer 200", || {
        http_get_any(s.http_addr, "/replica?lag=16MB").0 == 200
    });

    let http = p.http_addr.to_string();
    let out = walserver(&["cluster", "list", "--http", &http]);
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{list}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        list.starts_with("cluster t (synchronous_mode off, ttl 4s)"),
        "{list}"
    );
    let row = |name: &str| {
        list.lines()
            .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
            .find(|r| r.get(1) == Some(&name))
            .unwrap_or_else(|| panic!("no row {name} in\n{list}"))
    };
    assert_eq!(&row("n1")[..4], ["*", "n1", "primary", "leading"], "{list}");
    assert_eq!(
        &row("n2")[..4],
        ["", "n2", "standby", "streaming"],
        "{list}"
    );
    let out = walserver(&["cluster", "history", "--http", &http, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let history: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        history
            .as_array()
            .is_some_and(|h| h.iter().any(|t| t["leader"] == "n1")),
        "{history}"
    );
}

/// `walserver cluster pause`, `resume`, `switchover` and `failover` on a two-member cluster on
/// a real etcd, sent to the standby (which forwards a switchover to the leader): while paused a
/// switchover is refused with the reason, an unknown candidate is refused by name, a
/// switchover to the standby makes it the leader that acknowledges appends, with the old
/// leader answering 503 to `/primary`, and a forced failover brings the leadership back.
#[test]
fn pause_resume_switchover_and_failover_through_the_commands() {
    let etcd = EtcdServer::start();
    let p = TestNode::primary(&format!("{KEEP}{}", failover_table(&etcd, "n1")));
    wait_until("n1 to hold the leader key", || {
        http_get_any(p.http_addr, "/primary").0 == 200
    });
    let s = TestNode::standby_of(
        p.addr(),
        "n2",
        &format!("{KEEP}{}", failover_table(&etcd, "n2")),
    );
    let view = |node: &TestNode| -> serde_json::Value {
        let (code, body) = http_get_any(node.http_addr, "/cluster");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("JSON")
    };
    wait_until("n2 to be listed as a streaming standby on both", || {
        [&p, &s].iter().all(|n| {
            view(n)["members"].as_array().is_some_and(|m| {
                m.iter()
                    .any(|m| m["name"] == "n2" && m["streaming"] == true)
            })
        })
    });
    // The failover families: n1 leads in the bootstrap term, n2 follows it; the README's
    // table names exactly the families a member shows.
    let metrics = |node: &TestNode| http_get_any(node.http_addr, "/metrics").1;
    let sample = |node: &TestNode, key: &str| {
        let text = metrics(node);
        metric_value(&text, key).unwrap_or_else(|| panic!("no {key} in\n{text}"))
    };
    assert_eq!(sample(&p, "walserver_failover_leader"), 1.0);
    assert_eq!(sample(&s, "walserver_failover_leader"), 0.0);
    let first_term = sample(&p, "walserver_failover_term");
    assert_eq!(sample(&s, "walserver_failover_term"), first_term);
    assert_eq!(
        sample(
            &p,
            r#"walserver_failover_terms_taken_total{reason="bootstrap"}"#
        ),
        1.0
    );
    assert!(sample(&p, "walserver_failover_lease_remaining_seconds") > 0.0);
    assert_eq!(sample(&p, "walserver_failover_ttl_seconds"), 4.0);
    assert!(sample(&s, "walserver_failover_etcd_contact_age_seconds") < 4.0);
    let failover_families: std::collections::BTreeSet<String> = metric_families(&metrics(&p))
        .into_iter()
        .filter(|f| f.starts_with("walserver_failover_"))
        .collect();
    let listed: std::collections::BTreeSet<String> = readme_metric_names()
        .into_iter()
        .filter(|f| f.starts_with("walserver_failover_"))
        .collect();
    assert_eq!(
        failover_families, listed,
        "/metrics against the README's table"
    );

    let http = s.http_addr.to_string();
    let ok = |args: &[&str]| -> String {
        let out = walserver(args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let refused = |args: &[&str]| -> String {
        let out = walserver(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).to_string()
    };

    assert!(ok(&["cluster", "pause", "--http", &http]).starts_with("paused"));
    wait_until("both members to see the pause", || {
        view(&p)["paused"] == true && view(&s)["paused"] == true
    });
    assert_eq!(sample(&p, "walserver_failover_paused"), 1.0);
    assert_eq!(sample(&s, "walserver_failover_paused"), 1.0);
    let e = refused(&[
        "cluster",
        "switchover",
        "--http",
        &http,
        "--candidate",
        "n2",
    ]);
    assert!(e.contains("the cluster is paused"), "{e}");
    assert!(ok(&["cluster", "resume", "--http", &http]).starts_with("resumed"));
    wait_until("both members to see the resume", || {
        view(&p)["paused"] == false && view(&s)["paused"] == false
    });
    let e = refused(&[
        "cluster",
        "switchover",
        "--http",
        &http,
        "--candidate",
        "n9",
    ]);
    assert!(e.contains("no member named n9"), "{e}");
    let (code, answer) = http_post(s.http_addr, "/switchover", br#"{"candidate": "n9"}"#);
    assert_eq!(code, 404, "{answer}");

    let said = ok(&[
        "cluster",
        "switchover",
        "--http",
        &http,
        "--candidate",
        "n2",
    ]);
    assert!(said.starts_with("switchover: n2 leads term "), "{said}");
    assert!(said.contains("after n1"), "{said}");
    wait_until("n2 to answer /primary", || {
        http_get_any(s.http_addr, "/primary").0 == 200
    });
    let (code, body) = http_get_any(p.http_addr, "/primary");
    assert_eq!(code, 503, "{body}");
    let (code, answer) = http_post(s.http_addr, "/wal", b"after the switchover");
    assert_eq!(code, 200, "{answer}");
    let out = walserver(&["cluster", "history", "--http", &http, "--json"]);
    let history: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let last = history
        .as_array()
        .and_then(|h| h.last())
        .unwrap_or_else(|| panic!("no history: {history}"));
    assert_eq!(last["leader"], "n2", "{history}");
    assert_eq!(
        last["timeline"], 2,
        "a promotion to the next timeline: {history}"
    );
    assert_eq!(last["reason"], "switchover", "{history}");
    assert_eq!(sample(&s, "walserver_failover_leader"), 1.0);
    assert_eq!(
        sample(
            &s,
            r#"walserver_failover_terms_taken_total{reason="switchover"}"#
        ),
        1.0
    );
    assert!(sample(&s, "walserver_failover_term") > first_term);
    wait_until("n1 to stop leading", || {
        metric_value(&metrics(&p), "walserver_failover_leader") == Some(0.0)
    });

    // A forced failover back to n1, now n2's standby once it follows: the answer says how far
    // behind it was.
    wait_until("n1 to stream from n2", || {
        http_get_any(p.http_addr, "/replica").0 == 200
    });
    let said = ok(&["cluster", "failover", "--http", &http, "--candidate", "n1"]);
    assert!(said.starts_with("failover: n1 leads term "), "{said}");
    assert!(
        said.contains("after n2") && said.contains("bytes behind"),
        "{said}"
    );
    wait_until("n1 to answer /primary again", || {
        http_get_any(p.http_addr, "/primary").0 == 200
    });
    // Counted by the reason its history records for the term.
    let out = walserver(&["cluster", "history", "--http", &http, "--json"]);
    let history: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let reason = history
        .as_array()
        .and_then(|h| h.last())
        .and_then(|t| t["reason"].as_str())
        .unwrap_or_else(|| panic!("no reason in {history}"))
        .to_string();
    assert_eq!(
        sample(
            &p,
            &format!(r#"walserver_failover_terms_taken_total{{reason="{reason}"}}"#)
        ),
        1.0,
        "{history}"
    );

    // etcd gone: the README's alert rules fire. Nobody may acknowledge (WalserverNoLeader:
    // the highest walserver_failover_leader is 0), and each member's contact age passes its
    // ttl (WalserverEtcdUnreachable), counting failed calls meanwhile.
    drop(etcd);
    wait_until("no member to lead", || {
        [&p, &s]
            .iter()
            .all(|n| metric_value(&metrics(n), "walserver_failover_leader") == Some(0.0))
    });
    wait_until("the etcd contact age to pass the ttl on both", || {
        [&p, &s].iter().all(|n| {
            let text = metrics(n);
            let age = metric_value(&text, "walserver_failover_etcd_contact_age_seconds");
            let ttl = metric_value(&text, "walserver_failover_ttl_seconds");
            age.zip(ttl).is_some_and(|(age, ttl)| age > ttl)
        })
    });
    let errors: f64 = metrics(&p)
        .lines()
        .filter(|l| l.starts_with("walserver_failover_etcd_errors_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!(errors > 0.0, "failed etcd calls are counted");
}

/// The keys under the cluster `t`'s prefix in `etcd`, by name.
fn cluster_keys(etcd: &EtcdServer) -> Vec<String> {
    let client = etcd.client();
    let prefix = failover_actor::keys::Keys::new("t").prefix().to_string();
    let kvs = actix_rt::System::new()
        .block_on(async move {
            client
                .range(&etcd_gateway::KeyRange::prefix(prefix.into_bytes()))
                .await
        })
        .expect("etcd range")
        .kvs;
    kvs.into_iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).to_string())
        .collect()
}

/// `walserver run` with a `[failover]` table: the failover actor runs as one of the node's
/// services, and a SIGTERM (a fast shutdown, exit 0) releases its keys at once, the leader
/// key with them, so a successor need not wait out the 30 s ttl.
#[test]
fn walserver_run_with_failover_releases_its_keys_on_sigterm() {
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
    let table = failover_table(&etcd, "n1").replace("ttl = \"4s\"", "ttl = \"30s\"");
    let config = write_config(dir.path(), &table);
    let mut w = run(&config);
    // Logged before the admin API's line, which Walserver::run waited for.
    assert!(
        w.log_lines
            .iter()
            .any(|l| l.contains("starting automatic failover")),
        "{}",
        w.log_lines.join("\n")
    );
    wait_until("n1 to hold the leader key", || {
        http_get_any(http_of(&w), "/primary").0 == 200
    });
    let services = w.status().expect("/status").services;
    assert!(
        services
            .iter()
            .any(|s| s.name == "failover" && s.state == supervisor_actor::ServiceState::Running),
        "{services:?}"
    );
    let names = failover_actor::keys::Keys::new("t");
    let leader = names.leader();
    assert!(
        cluster_keys(&etcd).contains(&leader),
        "{:?}",
        cluster_keys(&etcd)
    );
    let t = std::time::Instant::now();
    w.signal(libc::SIGTERM).expect("signal");
    let status = w.wait_exit().expect("the exit");
    assert!(
        status.success(),
        "{status}; the log:\n{}",
        w.log_lines.join("\n")
    );
    let keys = cluster_keys(&etcd);
    assert!(
        !keys.contains(&leader) && !keys.iter().any(|k| k.starts_with(&names.members())),
        "{:.1?} after SIGTERM the keys are still there: {keys:?}",
        t.elapsed()
    );
}

/// The user the secured etcd's members log in as, whose role holds the cluster `t`'s keys.
const ETCD_USER: (&str, &str) = ("walserver", "walserver-password");

/// An etcd with client TLS (client certificates required) and authentication, with
/// [`ETCD_USER`] limited to the cluster `t`'s prefix.
fn secured_etcd(pki: &Pki) -> EtcdServer {
    let etcd = EtcdServer::start_secured(pki, None);
    let prefix = failover_actor::keys::Keys::new("t").prefix().to_string();
    etcd.add_user(ETCD_USER.0, ETCD_USER.1, Some(prefix.as_bytes()));
    etcd
}

/// [`failover_table`] for a secured etcd: its CA, the client certificate, and `password`.
fn secured_table(etcd: &EtcdServer, pki: &Pki, name: &str, password: &str) -> String {
    format!(
        "{}etcd_cacert = {:?}\netcd_cert = {:?}\netcd_key = {:?}\netcd_username = {:?}\netcd_password = {password:?}\n",
        failover_table(etcd, name),
        pki.ca.display().to_string(),
        pki.client_cert.display().to_string(),
        pki.client_key.display().to_string(),
        ETCD_USER.0,
    )
}

/// Three members on an etcd with client TLS and authentication: the primary takes the leader
/// key through them, and when it stops without releasing its lease (as in a crash), one of
/// the standbys takes the key and acknowledges appends.
#[test]
fn three_members_fail_over_through_tls_and_authentication() {
    let pki = Pki::new();
    let etcd = secured_etcd(&pki);
    let table = |name| format!("{KEEP}{}", secured_table(&etcd, &pki, name, ETCD_USER.1));
    let p = TestNode::primary(&table("n1"));
    wait_until("n1 to hold the leader key", || {
        http_get_any(p.http_addr, "/primary").0 == 200
    });
    let (code, answer) = http_post(p.http_addr, "/wal", b"before the failover");
    assert_eq!(code, 200, "{answer}");
    let standbys = [
        TestNode::standby_of(p.addr(), "n2", &table("n2")),
        TestNode::standby_of(p.addr(), "n3", &table("n3")),
    ];
    for s in &standbys {
        wait_until("the standbys to stream from n1", || {
            http_get_any(s.http_addr, "/replica").0 == 200
        });
    }
    // The System stops at once: the actor neither revokes its lease nor hands over.
    drop(p.stop());
    let mut leader = None;
    wait_until("a standby to take the leader key", || {
        leader = standbys
            .iter()
            .find(|s| http_get_any(s.http_addr, "/primary").0 == 200);
        leader.is_some()
    });
    let leader = leader.expect("a leader");
    let (code, answer) = http_post(leader.http_addr, "/wal", b"after the failover");
    assert_eq!(code, 200, "the new leader acknowledges: {answer}");
    let view = leader.http_get("/cluster");
    assert_ne!(view["leader"]["name"], "n1", "{view}");
}

/// `walserver run` against an etcd that refuses its settings stops before the node starts,
/// saying what etcd refused: a wrong password, and a CA that did not sign etcd's
/// certificate.
#[test]
fn a_node_whose_etcd_settings_are_refused_stops_at_start_saying_so() {
    let pki = Pki::new();
    let etcd = secured_etcd(&pki);
    let other_ca = Pki::new();
    let right = secured_table(&etcd, &pki, "n1", ETCD_USER.1);
    let cases = [
        (
            secured_table(&etcd, &pki, "n1", "not-the-password"),
            "refused the password of user \"walserver\"",
        ),
        (
            right.replace(
                &format!("{:?}", pki.ca.display().to_string()),
                &format!("{:?}", other_ca.ca.display().to_string()),
            ),
            "not signed by the CA",
        ),
    ];
    for (table, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
        let config = write_config(dir.path(), &table);
        // A node that started anyway would run on: the wait for its exit has a deadline.
        let mut w = spawn(&config, &[]);
        let status = w.wait_exit().expect("the exit");
        let stderr = w.log_lines.join("\n");
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("refuses this node's failover settings") && stderr.contains(expected),
            "{expected:?} not in: {stderr}"
        );
    }
}
