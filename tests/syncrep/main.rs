//! Synchronous replication, durability levels and applying on standbys, end to end over real
//! sockets: PostgreSQL's 007_sync_rep scenarios as status, appends held until the chosen
//! standbys confirm, reloads that release them, synchronous_wait_timeout, remote_apply
//! through a standby's application, pg_receivewal as a synchronous standby, and kill -9 of
//! the primary during synchronous appends.

#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "failpoints")]
mod early_mark;
#[cfg(feature = "failpoints")]
mod overlap;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures_util::StreamExt;
use supervisor_actor::{AppendError, AppendRecords, Durability, Follow, Reconfigure, RecordEvent};
use wal_storage::Lsn;
use walserver_bench::node::{ChildNode, Output, Ready};

/// A walserver standby of `upstream` named `name` (its application_name upstream).
fn standby_of(upstream: &TestNode, name: &str, extra: &str) -> TestNode {
    let dir = tempfile::tempdir().unwrap();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=repl application_name={name}",
        upstream.addr().port()
    );
    walserver_node::init::init_standby(&dir.path().join("data"), &conninfo, None, None)
        .expect("init standby");
    TestNode::start_in(dir, extra)
}

fn append(node: &TestNode, payload: &[u8], durability: Durability) -> Result<Lsn, AppendError> {
    let msg = AppendRecords {
        records: vec![Bytes::copy_from_slice(payload)],
        durability: Some(durability),
    };
    futures_executor::block_on(node.node.supervisor.send(msg))
        .expect("supervisor")
        .map(|a| a.end_lsn)
}

/// Appends in a thread; the result arrives on the channel.
fn append_in_background(
    node: &TestNode,
    payload: &'static [u8],
    durability: Durability,
) -> mpsc::Receiver<Result<Lsn, String>> {
    let (tx, rx) = mpsc::channel();
    let sup = node.node.supervisor.clone();
    std::thread::spawn(move || {
        let msg = AppendRecords {
            records: vec![Bytes::from_static(payload)],
            durability: Some(durability),
        };
        let r = futures_executor::block_on(sup.send(msg)).expect("supervisor");
        let _ = tx.send(r.map(|a| a.end_lsn).map_err(|e| e.to_string()));
    });
    rx
}

fn sync_row(node: &TestNode, name: &str) -> (u64, String) {
    let s = node.http_get("/status");
    let row = s["replication"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["application_name"] == name)
        .unwrap_or_else(|| panic!("no walsender for {name}: {s}"))
        .clone();
    (
        row["sync_priority"].as_u64().unwrap(),
        row["sync_state"].as_str().unwrap().to_string(),
    )
}

fn wait_streaming(node: &TestNode, names: &[&str]) {
    wait_until("standbys streaming", || {
        let s = node.http_get("/status");
        names.iter().all(|n| {
            s["replication"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["application_name"] == *n && r["state"] == "streaming")
        })
    });
}

#[test]
fn sync_state_and_priority_follow_the_setting() {
    let primary = TestNode::primary("synchronous_standby_names = 'FIRST 1 (s1, s2)'");
    let s1 = standby_of(&primary, "s1", "");
    let s2 = standby_of(&primary, "s2", "");
    let s3 = standby_of(&primary, "s3", "");
    wait_streaming(&primary, &["s1", "s2", "s3"]);
    append(&primary, b"x", Durability::On).unwrap();
    assert_eq!(sync_row(&primary, "s1"), (1, "sync".into()));
    assert_eq!(sync_row(&primary, "s2"), (2, "potential".into()));
    assert_eq!(sync_row(&primary, "s3"), (0, "async".into()));
    // The sync standby leaves: the potential one takes over.
    drop(s1);
    wait_until("s2 to become sync", || {
        sync_row(&primary, "s2") == (2, "sync".into())
    });
    // Quorum with "*", by reload.
    reconfigure(&primary, "ANY 2 (*)");
    wait_until("quorum states", || {
        sync_row(&primary, "s2") == (1, "quorum".into())
            && sync_row(&primary, "s3") == (1, "quorum".into())
    });
    append(&primary, b"y", Durability::On).unwrap();
    drop((s2, s3));
}

/// A replication client named `name` that streams from the primary's end and confirms it:
/// a candidate for synchronous standby as soon as its walsender has caught up.
fn streaming_client(node: &TestNode, name: &str) -> PgConn {
    let mut c = PgConn::connect_as(node.addr(), "repl", None, name).expect("login");
    let end = node.wal().flushed();
    c.start_replication(end);
    c.reply(end, end, false);
    c
}

/// `application_name|sync_priority|sync_state` per walsender, in application_name order: what
/// 007_sync_rep.pl's query of pg_stat_replication prints.
fn sync_table(node: &TestNode) -> String {
    let s = node.http_get("/status");
    let mut rows: Vec<String> = s["replication"]
        .as_array()
        .expect("replication rows")
        .iter()
        .map(|r| {
            format!(
                "{}|{}|{}",
                r["application_name"].as_str().unwrap_or(""),
                r["sync_priority"],
                r["sync_state"].as_str().unwrap_or("")
            )
        })
        .collect();
    rows.sort();
    rows.join("\n")
}

/// Reloads `setting` when given, then waits until the table is `expected`, as the script's
/// test_sync_state does.
fn check_sync_table(node: &TestNode, expected: &str, what: &str, setting: Option<&str>) {
    if let Some(names) = setting {
        reconfigure(node, names);
    }
    // wait_until's way, with the table it last saw in the failure.
    let start = std::time::Instant::now();
    loop {
        let got = sync_table(node);
        if got == expected {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: expected\n{expected}\ngot\n{got}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// PostgreSQL's src/test/recovery/t/007_sync_rep.pl over real connections, step by step: the
/// standbys are replication clients that confirm what they were sent, so the order in which
/// they connect (which decides among equal priorities) is the test's to choose.
#[test]
fn sync_rep_007_over_real_connections() {
    let primary = TestNode::primary("");
    let s1 = streaming_client(&primary, "standby1");
    let s2 = streaming_client(&primary, "standby2");
    let s3 = streaming_client(&primary, "standby3");
    check_sync_table(
        &primary,
        "standby1|1|sync\nstandby2|2|potential\nstandby3|0|async",
        "old syntax of synchronous_standby_names",
        Some("standby1,standby2"),
    );
    check_sync_table(
        &primary,
        "standby1|1|sync\nstandby2|1|potential\nstandby3|1|potential",
        "asterisk in synchronous_standby_names",
        Some("*"),
    );
    // Every standby goes; standby2 and standby3 come back first, so among equal priorities
    // they are now preferred.
    drop((s1, s2, s3));
    wait_until("every walsender to go", || sync_table(&primary).is_empty());
    let s2 = streaming_client(&primary, "standby2");
    let s3 = streaming_client(&primary, "standby3");
    check_sync_table(
        &primary,
        "standby2|2|sync\nstandby3|3|sync",
        "2 synchronous standbys",
        Some("2(standby1,standby2,standby3)"),
    );
    let s1 = streaming_client(&primary, "standby1");
    let s4 = streaming_client(&primary, "standby4");
    check_sync_table(
        &primary,
        "standby1|1|sync\nstandby2|2|sync\nstandby3|3|potential\nstandby4|0|async",
        "2 sync, 1 potential, and 1 async",
        None,
    );
    check_sync_table(
        &primary,
        "standby1|0|async\nstandby2|4|sync\nstandby3|3|sync\nstandby4|1|sync",
        "num_sync exceeds the num of potential sync standbys",
        Some("6(standby4,standby0,standby3,standby2)"),
    );
    check_sync_table(
        &primary,
        "standby1|1|sync\nstandby2|2|sync\nstandby3|2|potential\nstandby4|2|potential",
        "asterisk comes before another standby name",
        Some("2(standby1,*,standby2)"),
    );
    check_sync_table(
        &primary,
        "standby1|1|potential\nstandby2|1|sync\nstandby3|1|sync\nstandby4|1|potential",
        "multiple standbys having the same priority are chosen as sync",
        Some("2(*)"),
    );
    drop(s3);
    check_sync_table(
        &primary,
        "standby1|1|sync\nstandby2|1|sync\nstandby4|1|potential",
        "potential standby found earlier in array is promoted to sync",
        None,
    );
    check_sync_table(
        &primary,
        "standby1|1|sync\nstandby2|2|sync\nstandby4|0|async",
        "priority-based sync replication specified by FIRST keyword",
        Some("FIRST 2(standby1, standby2)"),
    );
    check_sync_table(
        &primary,
        "standby1|1|quorum\nstandby2|1|quorum\nstandby4|0|async",
        "2 quorum and 1 async",
        Some("ANY 2(standby1, standby2)"),
    );
    let s3 = streaming_client(&primary, "standby3");
    check_sync_table(
        &primary,
        "standby1|1|quorum\nstandby2|1|quorum\nstandby3|1|quorum\nstandby4|1|quorum",
        "all standbys are considered as candidates for quorum sync standbys",
        Some("ANY 2(*)"),
    );
    drop((s1, s2, s3, s4));
}

/// Applies a new synchronous_standby_names as a reload would.
fn reconfigure(node: &TestNode, names: &str) {
    let mut settings = node.settings.clone();
    settings.synchronous_standby_names = names.to_string();
    let msg = Reconfigure {
        walsender: (*node.node.shared.settings()).clone(),
        max_wal_senders: settings.max_wal_senders,
        receiver: None,
        sync: walserver_node::node::sync_settings(&settings).unwrap(),
    };
    futures_executor::block_on(node.node.supervisor.send(msg)).unwrap();
}

#[test]
fn an_append_waits_for_the_only_sync_standby_and_completes_when_it_returns() {
    let primary =
        TestNode::primary("synchronous_standby_names = 'ANY 1 (s1)'\nwal_keep_size = '64MB'");
    let s1 = standby_of(&primary, "s1", "");
    wait_streaming(&primary, &["s1"]);
    let end = append(&primary, b"first", Durability::On).unwrap();
    assert!(
        s1.wal().flushed() >= end,
        "acknowledged before the standby flushed it"
    );
    // The standby goes away: a remote-flush append does not complete.
    let dir = s1.down(common::cluster::Down::Kill);
    let pending = append_in_background(&primary, b"second", Durability::On);
    assert!(
        pending.recv_timeout(Duration::from_millis(500)).is_err(),
        "completed without its standby"
    );
    // local appends still complete.
    append(&primary, b"local", Durability::Local).unwrap();
    // Back: the append completes as soon as the standby has confirmed it.
    let s1 = TestNode::start_in(dir, "");
    let end = pending
        .recv_timeout(DEADLINE)
        .expect("append never completed")
        .unwrap();
    assert!(s1.wal().flushed() >= end);
}

#[test]
fn synchronous_wait_timeout_fails_with_a_distinct_error() {
    let primary =
        TestNode::primary("synchronous_standby_names = 's1'\nsynchronous_wait_timeout = '200ms'");
    match append(&primary, b"x", Durability::On) {
        Err(AppendError::NotConfirmed {
            end_lsn,
            durability,
        }) => {
            assert_eq!(durability, Durability::On);
            assert!(primary.wal().flushed() >= end_lsn, "it is durable locally");
        }
        other => panic!("expected NotConfirmed, got {other:?}"),
    }
    // The error says what happened, for people.
    let e = append(&primary, b"x", Durability::RemoteWrite)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("durable locally") && e.contains("synchronous_wait_timeout"),
        "{e}"
    );
}

#[test]
fn a_reload_releases_the_waiters_it_satisfies() {
    let primary = TestNode::primary("synchronous_standby_names = 'FIRST 1 (nobody)'");
    let a = standby_of(&primary, "a", "");
    wait_streaming(&primary, &["a"]);
    let pending = append_in_background(&primary, b"held", Durability::On);
    assert!(pending.recv_timeout(Duration::from_millis(300)).is_err());
    // Naming the connected standby releases the append.
    reconfigure(&primary, "a");
    pending
        .recv_timeout(DEADLINE)
        .expect("not released by the reload")
        .unwrap();
    assert_eq!(sync_row(&primary, "a"), (1, "sync".into()));
    // Turning synchronous replication off releases everyone.
    reconfigure(&primary, "nobody");
    let pending = append_in_background(&primary, b"held again", Durability::On);
    assert!(pending.recv_timeout(Duration::from_millis(300)).is_err());
    reconfigure(&primary, "");
    pending
        .recv_timeout(DEADLINE)
        .expect("not released when turned off")
        .unwrap();
    drop(a);
}

#[test]
fn remote_apply_waits_for_the_standbys_application() {
    let primary = TestNode::primary("synchronous_standby_names = 's1'\nwal_keep_size = '64MB'");
    let s1 = standby_of(&primary, "s1", "");
    wait_streaming(&primary, &["s1"]);
    // The standby's application: applies records and reports them, on its own thread.
    let start = s1.wal().flushed();
    // Registering as the applier: from this report on, the standby tells its upstream the
    // application's position as apply, instead of its flush position.
    s1.node.report_applied(start);
    let node = s1.node.clone();
    let (applied_tx, applied_rx) = mpsc::channel::<Vec<u8>>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut records = Box::pin(node.records(start, Follow::Forever));
            while let Some(ev) = records.next().await {
                if let Ok(RecordEvent::Record { end, payload, .. }) = ev {
                    // Apply only when told to, so the test can see the append wait.
                    let _ = go_rx.recv();
                    let _ = applied_tx.send(payload.to_vec());
                    node.report_applied(end);
                }
            }
        });
    });
    let pending = append_in_background(&primary, b"apply me", Durability::RemoteApply);
    // Flushed on the standby, but not applied: the append waits.
    assert!(
        pending.recv_timeout(Duration::from_millis(500)).is_err(),
        "remote_apply did not wait for the application"
    );
    go_tx.send(()).unwrap();
    assert_eq!(applied_rx.recv_timeout(DEADLINE).unwrap(), b"apply me");
    pending
        .recv_timeout(DEADLINE)
        .expect("remote_apply append never completed")
        .unwrap();
}

fn walserver_bin() -> &'static str {
    env!("CARGO_BIN_EXE_walserver")
}

/// pg_receivewal with --synchronous and a slot is a synchronous standby of a walserver
/// primary: it reports flush, and remote-flush appends complete through it.
#[test]
fn pg_receivewal_is_accepted_as_a_synchronous_standby() {
    let bin = pg_testkit::PgBin::require();
    let primary = TestNode::primary(
        "synchronous_standby_names = 'pg_receivewal'\nsynchronous_wait_timeout = '20s'",
    );
    let port = primary.addr().port().to_string();
    let out = Command::new(bin.tool("pg_receivewal"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "repl",
            "--no-password",
            "--create-slot",
            "--slot",
            "sync1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin.tool("pg_receivewal"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "repl",
            "--no-password",
            "--slot",
            "sync1",
            "--synchronous",
            "-D",
        ])
        .arg(dir.path())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_streaming(&primary, &["pg_receivewal"]);
    for i in 0..20u8 {
        let end =
            append(&primary, &[i; 1000], Durability::On).expect("append through pg_receivewal");
        assert!(end.is_valid());
    }
    assert_eq!(sync_row(&primary, "pg_receivewal"), (1, "sync".into()));
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Writes a node's configuration file at `path` for `data` on fixed loopback ports, keeping
/// 1 GB of WAL, with `extra` lines; returns `path`.
fn write_config(path: &Path, data: &Path, port: u16, http: u16, extra: &str) -> PathBuf {
    std::fs::write(
        path,
        format!(
            "data_dir = {:?}\nlisten = \"127.0.0.1:{port}\"\nhttp_listen = \"127.0.0.1:{http}\"\nwal_keep_size = '1GB'\n{extra}",
            data.display().to_string()
        ),
    )
    .unwrap();
    path.to_path_buf()
}

/// `walserver run --config CONFIG` on `data`, its standard error appended to `log`; up when
/// its admin API answers.
fn spawn_node(config: &Path, data: &Path, log: &Path) -> ChildNode {
    let text = std::fs::read_to_string(config).unwrap();
    let mut node = ChildNode::new("node", Path::new(walserver_bin()), data);
    node.http = text
        .lines()
        .find_map(|l| l.strip_prefix("http_listen = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    node.config_file(config)
        .output(Output::File(log.to_path_buf()))
        .ready(Ready::AdminAnswers);
    node.start().expect("start the node");
    node
}

/// kill -9 of the primary while clients append with remote flush, 20 times: every append
/// that was acknowledged is on the restarted primary and on the synchronous standby.
#[test]
fn kill_9_of_the_primary_loses_no_acknowledged_synchronous_append() {
    let dir = tempfile::tempdir().unwrap();
    let p_data = dir.path().join("p");
    walserver_node::init::init_primary(&p_data, 1 << 20).unwrap();
    let port = |()| pg_testkit::free_port();
    let (p_port, p_http, s_port, s_http) = (port(()), port(()), port(()), port(()));
    let p_conf = write_config(
        &dir.path().join("p.toml"),
        &p_data,
        p_port,
        p_http,
        "synchronous_standby_names = 's1'\n",
    );
    let mut primary = spawn_node(&p_conf, &p_data, &dir.path().join("p.log"));
    let s_data = dir.path().join("s");
    walserver_node::init::init_standby(
        &s_data,
        &format!("host=127.0.0.1 port={p_port} user=repl application_name=s1"),
        None,
        None,
    )
    .unwrap();
    let s_conf = write_config(&dir.path().join("s.toml"), &s_data, s_port, s_http, "");
    let mut standby = spawn_node(&s_conf, &s_data, &dir.path().join("s.log"));
    let mut acked: Vec<Vec<u8>> = Vec::new();
    for round in 0..20u32 {
        // Four clients append until the primary dies under them.
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let clients: Vec<_> = (0..4u32)
            .map(|c| {
                let tx = tx.clone();
                let http = primary.http.clone();
                std::thread::spawn(move || {
                    for seq in 0.. {
                        let payload = format!("round {round} client {c} seq {seq}").into_bytes();
                        let body = walserver_node::records::join_records([payload.as_slice()]);
                        let url = format!("http://{http}/wal?durability=on");
                        let ok = ureq::post(&url)
                            .header(
                                "Content-Type",
                                walserver_node::records::RECORDS_CONTENT_TYPE,
                            )
                            .send(&body[..])
                            .is_ok_and(|r| r.status().is_success());
                        if !ok {
                            return;
                        }
                        let _ = tx.send(payload);
                    }
                })
            })
            .collect();
        drop(tx);
        // Kill after some acknowledgements.
        let first: Vec<Vec<u8>> = rx.iter().take(5 + round as usize).collect();
        primary.kill9();
        for c in clients {
            c.join().unwrap();
        }
        acked.extend(first);
        acked.extend(rx.try_iter());
        primary = spawn_node(&p_conf, &p_data, &dir.path().join("p.log"));
    }
    // The restarted primary shows only acknowledged WAL: wait for the standby to confirm what
    // it flushed before the kill. Then let the standby catch up with it, and compare.
    wait_until("the restarted primary's WAL to be acknowledged", || {
        walserver_node::admin::get_json(&primary.http, "/status", None).is_ok_and(|s| {
            s["acknowledged_lsn"].is_string() && s["acknowledged_lsn"] == s["flush_lsn"]
        })
    });
    let primary_records = read_all(&primary.http);
    wait_until("the standby to catch up", || {
        read_all(&standby.http).len() >= primary_records.len()
    });
    let standby_records: HashSet<Vec<u8>> = read_all(&standby.http).into_iter().collect();
    let primary_records: HashSet<Vec<u8>> = primary_records.into_iter().collect();
    for a in &acked {
        assert!(
            primary_records.contains(a),
            "acknowledged append lost on the primary: {}",
            String::from_utf8_lossy(a)
        );
        assert!(
            standby_records.contains(a),
            "acknowledged append missing on the standby: {}",
            String::from_utf8_lossy(a)
        );
    }
    eprintln!(
        "{} acknowledged synchronous appends survived 20 kill -9 of the primary",
        acked.len()
    );
    standby.kill9();
    primary.kill9();
}

/// Every record a node holds, from the start of its WAL.
fn read_all(http: &str) -> Vec<Vec<u8>> {
    use base64::Engine as _;
    let mut resp = ureq::get(&format!("http://{http}/wal?from=0/100000"))
        .call()
        .unwrap();
    let text = resp.body_mut().read_to_string().unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            v["data"]
                .as_str()
                .map(|d| base64::engine::general_purpose::STANDARD.decode(d).unwrap())
        })
        .collect()
}

/// Read-your-writes: the end LSN of an append on the primary, awaited on a standby, means the
/// record is durable there (or applied, for the application's level).
#[test]
fn wait_for_lsn_gives_read_your_writes_on_a_standby() {
    let primary = TestNode::primary("wal_keep_size = '64MB'");
    let standby = standby_of(&primary, "s1", "");
    wait_streaming(&primary, &["s1"]);
    let end = append(&primary, b"read me", Durability::Local).unwrap();
    let node = standby.node.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(node.wait_for_lsn(end, supervisor_actor::LocalLevel::Flushed));
        let _ = tx.send(node.wal.flushed());
    });
    let flushed = rx
        .recv_timeout(DEADLINE)
        .expect("wait_for_lsn never returned");
    assert!(flushed >= end);
    // The applied level waits for the application's report.
    let node = standby.node.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(node.wait_for_lsn(end, supervisor_actor::LocalLevel::Applied));
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "applied before any report"
    );
    standby.node.report_applied(end);
    rx.recv_timeout(DEADLINE).expect("not woken by the report");
}
