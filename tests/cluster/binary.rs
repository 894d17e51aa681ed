//! The `walserver` binary as an operator runs it: a reload (SIGHUP, `POST /reload`) that
//! changes `primary_conninfo` reconnects without a restart, and one that changes
//! `synchronous_standby_names` changes sync states and releases the appends it satisfies;
//! SIGTERM is a fast shutdown that exits 0, and a second SIGTERM (or SIGQUIT) during it is
//! immediate. A `primary_conninfo` without user or password takes them from the
//! environment, as libpq does. A reload names the settings that wait for a restart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use protocol_codec::messages::PrimaryKeepalive;
use protocol_codec::BackendMessage;
use wal_storage::Lsn;
use walserver_bench::node::{ChildNode, Output, Ready};

use super::common::cluster::*;
use super::common::*;
use super::{KEEP, TL1};

/// `walserver run --config CONFIG` started with `env` added to a test's environment from which
/// `RUST_LOG` and `NO_COLOR` are removed, its output captured beside the configuration; the
/// addresses are unknown until the caller reads them from the log ([`run_with`]).
pub(super) fn spawn(config: &Path, env: &[(&str, &str)]) -> ChildNode {
    let dir = config.parent().expect("the configuration's directory");
    let mut w = ChildNode::new(
        "walserver",
        Path::new(env!("CARGO_BIN_EXE_walserver")),
        &dir.join("data"),
    );
    w.config_file(config)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .output(Output::Captured(dir.join("walserver.log")))
        .ready(Ready::Spawned);
    for (k, v) in env {
        w.env(k, v);
    }
    w.start().expect("start walserver");
    w
}

/// Runs `config` and waits until it accepts replication connections and serves its admin
/// API, whose addresses its log tells.
pub(super) fn run(config: &Path) -> ChildNode {
    run_with(config, &[])
}

/// [`run`] with `env` added to its environment.
pub(super) fn run_with(config: &Path, env: &[(&str, &str)]) -> ChildNode {
    let mut all = vec![("NO_COLOR", "1"), ("RUST_LOG", "info")];
    all.extend_from_slice(env);
    let mut w = spawn(config, &all);
    let line = w
        .wait_line("accepting replication connections")
        .expect("the replication listener");
    w.listen = field(&line, "listen_addr").parse().expect("listen_addr");
    let line = w.wait_line("admin API listening").expect("the admin API");
    w.http = field(&line, "addr").to_string();
    w
}

/// The admin API's address of a node [`run`] started.
pub(super) fn http_of(w: &ChildNode) -> SocketAddr {
    w.http.parse().expect("the admin API's address")
}

/// The value of `name=value` in a tracing log line.
pub(super) fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let key = format!("{name}=");
    let at = line
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {line:?}"));
    line[at + key.len()..]
        .split_whitespace()
        .next()
        .unwrap_or("")
}

pub(super) fn write_config(dir: &Path, lines: &str) -> PathBuf {
    let path = dir.join("walserver.toml");
    let text = format!(
        "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nlog_level = \"info\"\n{lines}",
        dir.join("data").display().to_string()
    );
    std::fs::write(&path, text).expect("write the configuration");
    path
}

/// Waits until the process's walreceiver streams from `port`; returns its id.
fn wait_streaming_from(w: &ChildNode, port: u16) -> u64 {
    let mut pid = 0;
    wait_until(
        &format!("the walreceiver to stream from port {port}"),
        || {
            let s = w.status().expect("/status");
            let r = s.wal_receiver.as_ref();
            pid = r.and_then(|r| r.pid).unwrap_or(0);
            s.receiving() && r.and_then(|r| r.status.as_ref()?.sender_port) == Some(port)
        },
    );
    pid
}

/// A standby whose `primary_conninfo` names neither a user nor a password, run with `PGUSER`
/// and `PGPASSWORD` set as libpq reads them, streams from a primary that asks for a SCRAM
/// password; with a wrong `PGPASSWORD` it is refused and its status says so.
#[test]
fn the_user_and_password_come_from_the_environment_when_the_conninfo_has_none() {
    let verifier = protocol_codec::auth::make_scram_verifier("s3cret");
    let primary = TestNode::primary(&format!(
        "{KEEP}[users]\nrepl = \"{verifier}\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n"
    ));
    let port = primary.addr().port();
    let end = primary.append(4, 1000, 7);
    for (password, streams) in [("wrong", false), ("s3cret", true)] {
        let dir = tempfile::tempdir().unwrap();
        walserver_node::init::init_standby(
            &dir.path().join("data"),
            &format!("host=127.0.0.1 port={port} user=repl password=s3cret sslmode=disable"),
            None,
            None,
        )
        .expect("init_standby");
        let config = write_config(
            dir.path(),
            &format!(
                "primary_conninfo = \"host=127.0.0.1 port={port} sslmode=disable application_name=env\"\n"
            ),
        );
        let w = run_with(&config, &[("PGUSER", "repl"), ("PGPASSWORD", password)]);
        if streams {
            wait_streaming_from(&w, port);
            wait_until("the standby to flush the primary's WAL", || {
                w.status().expect("/status").flush_lsn == end
            });
        } else {
            let mut error = String::new();
            wait_until("the wrong password to be refused", || {
                error = w
                    .status()
                    .expect("/status")
                    .wal_receiver
                    .and_then(|r| r.restart.last_error)
                    .unwrap_or_default();
                !error.is_empty()
            });
            assert!(
                error.contains("password authentication failed for user \"repl\""),
                "{error}"
            );
        }
    }
}

#[test]
fn a_reload_changes_the_upstream_without_a_restart() {
    let u1 = TestNode::primary(KEEP);
    let u2 = TestNode::standby_of(u1.addr(), "u2", KEEP);
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_standby(&dir.path().join("data"), &u1.conninfo("s"), None, None)
        .expect("init_standby");
    let config = write_config(
        dir.path(),
        &format!("primary_conninfo = {:?}\n", u1.conninfo("s")),
    );
    let mut w = run(&config);
    let first = wait_streaming_from(&w, u1.addr().port());

    // SIGHUP with a new upstream: the same process streams from it.
    write_config(
        dir.path(),
        &format!("primary_conninfo = {:?}\n", u2.conninfo("s")),
    );
    w.signal(libc::SIGHUP).expect("signal");
    w.wait_line("configuration reloaded")
        .expect("a line of the log");
    let second = wait_streaming_from(&w, u2.addr().port());
    assert!(second > first, "a new walreceiver, {second} after {first}");
    assert!(w.running());

    // POST /reload, back to the first upstream under another name.
    write_config(
        dir.path(),
        &format!("primary_conninfo = {:?}\n", u1.conninfo("s2")),
    );
    let (code, body) = http_post(http_of(&w), "/reload", b"");
    assert_eq!(code, 200, "{body}");
    wait_streaming_from(&w, u1.addr().port());
    let end = u1.append(16, 1000, 3);
    u2.wait_flushed(TL1, end);
    wait_until("the standby to flush what U1 appended", || {
        w.status().expect("/status").flush_lsn == end
    });
    let names = u1.application_names();
    assert!(
        names.contains(&"s2".to_string()),
        "{names:?} {:?}",
        w.status().expect("/status")
    );

    // A reload that cannot be applied leaves the running settings as they are.
    std::fs::write(&config, "this is not toml = = =").unwrap();
    let (code, body) = http_post(http_of(&w), "/reload", b"");
    assert_eq!(code, 400, "{body}");
    assert!(w.running());

    // SIGTERM: a fast shutdown, exit status 0.
    let t = Instant::now();
    w.signal(libc::SIGTERM).expect("signal");
    let status = w.wait_exit().expect("the exit");
    eprintln!("SIGTERM: a standby exited in {:?}", t.elapsed());
    assert!(status.success(), "{status}");
}

/// A reload that changes `archive_target` applies the rest and says, in the log and in
/// `POST /reload`'s answer, that the archive stays as it runs until a restart: the archiver
/// and the walreceiver's gap fill read it as they started.
#[test]
fn a_reload_says_a_new_archive_target_waits_for_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
    let target = |name: &str| {
        let url = format!("file://{}", dir.path().join(name).display());
        format!("archive_target = {url:?}\n")
    };
    let config = write_config(dir.path(), &target("a"));
    let mut w = run(&config);

    write_config(dir.path(), &target("b"));
    let (code, body) = http_post(http_of(&w), "/reload", b"");
    assert_eq!(code, 200, "{body}");
    let said = "parameter \"archive_target\" cannot be changed without restarting the server";
    assert_eq!(
        body["pending_restart"],
        serde_json::json!(["archive_target"])
    );
    assert_eq!(body["warnings"], serde_json::json!([said]));
    w.wait_line(said).expect("a warning in the log");
    w.wait_line("configuration reloaded")
        .expect("a line of the log");

    // Back to the running value: nothing waits any more.
    write_config(dir.path(), &target("a"));
    let (code, body) = http_post(http_of(&w), "/reload", b"");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["pending_restart"], serde_json::json!([]));
}

/// A primary with a streaming standby that never confirms: SIGTERM starts the fast shutdown,
/// whose drain would wait `wal_sender_shutdown_timeout` (60 s) for the confirmation; a second
/// SIGTERM, or a SIGQUIT, ends it at once. A standby that confirms lets the first SIGTERM
/// finish by itself. Every way exits 0.
#[test]
fn sigterm_is_a_fast_shutdown_and_a_second_signal_is_immediate() {
    for second in [None, Some(libc::SIGTERM), Some(libc::SIGQUIT)] {
        let dir = tempfile::tempdir().unwrap();
        walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
        let config = write_config(dir.path(), "wal_sender_shutdown_timeout = \"60s\"\n");
        let mut w = run(&config);
        let end = w.status().expect("/status").flush_lsn;
        let mut standby = PgConn::connect(w.listen, "standby", None).unwrap();
        standby.start_replication(end);
        wait_until("the walsender to be registered", || {
            w.status().expect("/status").replication.len() == 1
        });
        let t = Instant::now();
        w.signal(libc::SIGTERM).expect("signal");
        // The drain asks the standby to confirm what it was sent.
        loop {
            match standby.recv() {
                BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
                    reply_requested: true,
                    ..
                }) => break,
                BackendMessage::PrimaryKeepalive(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        match second {
            None => {
                standby.reply(end, end, false);
                assert_eq!(
                    standby.recv(),
                    BackendMessage::CommandComplete("COPY 0".into())
                );
            }
            Some(sig) => {
                assert!(
                    w.running(),
                    "the fast shutdown did not wait for the standby"
                );
                w.signal(sig).expect("signal");
            }
        }
        let status = w.wait_exit().expect("the exit");
        let took = t.elapsed();
        eprintln!("SIGTERM then {second:?}: exited in {took:?}");
        assert!(status.success(), "{second:?}: {status}");
        assert!(took < Duration::from_secs(10), "{second:?}: {took:?}");
        assert!(standby.closed());
    }
}

/// The `sync_priority` and `sync_state` of the walsender serving `name`, if it is connected.
fn sync_row(w: &ChildNode, name: &str) -> Option<(u64, String)> {
    let s = w.status().expect("/status");
    let row = s.sender(name)?;
    Some((u64::from(row.sync_priority), row.sync_state.clone()))
}

/// `POST /wal?durability=on` of one record, in a thread; the status code and answer arrive on
/// the channel.
fn append_on_in_background(
    http: SocketAddr,
    payload: &'static [u8],
) -> mpsc::Receiver<(u16, serde_json::Value)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(http_post(http, "/wal?durability=on", payload));
    });
    rx
}

/// Rewrites the process's configuration with `names` and reloads it through `POST /reload`.
fn reload_sync_names_by_http(
    w: &mut ChildNode,
    dir: &Path,
    names: &str,
) -> (u16, serde_json::Value) {
    write_config(dir, &format!("synchronous_standby_names = {names:?}\n"));
    http_post(http_of(w), "/reload", b"")
}

/// A `walserver run` primary whose configuration file changes synchronous_standby_names:
/// `POST /reload` and SIGHUP each apply it (through the binary's Reloader, not a message sent
/// by the test), /status shows the standby's new sync_state, and an `on` append held for a
/// synchronous standby is released as soon as the new setting is satisfied.
#[test]
fn a_reload_changes_synchronous_standby_names() {
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
    let config = write_config(dir.path(), "synchronous_standby_names = \"nobody\"\n");
    let mut w = run(&config);
    let s1 = TestNode::standby_of(w.listen, "s1", "");
    wait_until("s1 to stream as an asynchronous standby", || {
        sync_row(&w, "s1") == Some((0, "async".into()))
    });

    // Nobody named is connected: the append waits.
    let pending = append_on_in_background(http_of(&w), b"held by nobody");
    assert!(
        pending.recv_timeout(Duration::from_millis(300)).is_err(),
        "an `on` append completed with no synchronous standby connected"
    );
    // POST /reload naming s1 releases it, and s1 has the record.
    let (code, body) = reload_sync_names_by_http(&mut w, dir.path(), "s1");
    assert_eq!(code, 200, "{body}");
    w.wait_line("configuration reloaded")
        .expect("a line of the log");
    let (code, body) = pending
        .recv_timeout(DEADLINE)
        .expect("the append was not released by POST /reload");
    assert_eq!(code, 200, "{body}");
    let end: Lsn = body["end_lsn"].as_str().unwrap().parse().unwrap();
    assert!(s1.wal().flushed() >= end, "released before s1 flushed it");
    wait_until("s1 to be sync", || {
        sync_row(&w, "s1") == Some((1, "sync".into()))
    });

    // A setting that does not parse is refused; the running one stays.
    let (code, body) = reload_sync_names_by_http(&mut w, dir.path(), "ANY 0 (s1)");
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("synchronous_standby_names"),
        "{body}"
    );
    assert_eq!(sync_row(&w, "s1"), Some((1, "sync".into())));

    // Back to nobody, then SIGHUP with a quorum that s1 satisfies.
    let (code, body) = reload_sync_names_by_http(&mut w, dir.path(), "nobody");
    assert_eq!(code, 200, "{body}");
    w.wait_line("configuration reloaded")
        .expect("a line of the log");
    wait_until("s1 to be async again", || {
        sync_row(&w, "s1") == Some((0, "async".into()))
    });
    let pending = append_on_in_background(http_of(&w), b"held by nobody again");
    // The append is durable locally before it waits for a standby: once /status shows the
    // primary's end past the last one, it is waiting.
    wait_until("the second append to be durable on the primary", || {
        w.status().expect("/status").flush_lsn > end
    });
    assert!(
        pending.try_recv().is_err(),
        "an `on` append completed with no synchronous standby connected"
    );
    write_config(
        dir.path(),
        "synchronous_standby_names = \"ANY 1 (other, s1)\"\n",
    );
    w.signal(libc::SIGHUP).expect("signal");
    w.wait_line("configuration reloaded")
        .expect("a line of the log");
    let (code, body) = pending
        .recv_timeout(DEADLINE)
        .expect("the append was not released by SIGHUP");
    assert_eq!(code, 200, "{body}");
    let end: Lsn = body["end_lsn"].as_str().unwrap().parse().unwrap();
    assert!(s1.wal().flushed() >= end, "released before s1 flushed it");
    wait_until("s1 to be a quorum standby", || {
        sync_row(&w, "s1") == Some((1, "quorum".into()))
    });
    assert!(w.running());
}

/// `GET /wal` from inside a record is a request's mistake, answered 400 before any record:
/// the node's log never reports WAL corruption for it (a reader started there would find
/// no valid record header and say the WAL is damaged).
#[test]
fn a_get_wal_inside_a_record_logs_no_corruption() {
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_primary(&dir.path().join("data"), 1 << 20).expect("init");
    let config = write_config(dir.path(), "");
    let mut w = run(&config);
    let start = w.status().expect("/status").flush_lsn;
    let (code, json) = http_post(http_of(&w), "/wal", &[7u8; 200]);
    assert_eq!(code, 200, "{json}");
    for extra in ["", "&format=binary", "&follow=true"] {
        let path = format!("/wal?from={}{extra}", Lsn(start.0 + 8));
        let (status, body) = http_get_any(http_of(&w), &path);
        assert_eq!(status, 400, "{extra}: {body}");
        assert!(body.contains("not a record boundary"), "{extra}: {body}");
    }
    // The whole log, to the process's exit.
    w.signal(libc::SIGTERM).expect("signal");
    assert!(w.wait_exit().expect("the exit").success());
    let log = w.log_lines.join("\n");
    assert!(!log.to_lowercase().contains("corrupt"), "{log}");
}
