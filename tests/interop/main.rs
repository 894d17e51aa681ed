//! Interop tests: real PostgreSQL 15 client programs (pg_receivewal, psql, libpq) against a
//! walserver primary. They fail, never skip, when PostgreSQL 15 is missing.

#[path = "../common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;
use pg_testkit::PgBin;
use protocol_codec::auth::make_scram_verifier;
use wal_storage::{segment_file_name, Lsn, TimelineId};

fn pg_receivewal(bin: &PgBin, node: &TestNode, dir: &Path, extra: &[&str]) -> Child {
    Command::new(bin.tool("pg_receivewal"))
        .arg("-h")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(node.addr().port().to_string())
        .arg("-U")
        .arg("repl")
        .arg("-D")
        .arg(dir)
        .arg("--no-password")
        .args(extra)
        .arg("--verbose")
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.with_extension("log"))
                .unwrap(),
        )
        .spawn()
        .expect("start pg_receivewal")
}

/// Waits until pg_receivewal has completed segment `segno` (the file lost its .partial).
fn wait_for_segment(dir: &Path, segno: u64, seg: u64) {
    let name = segment_file_name(TimelineId(1), segno, seg);
    let log = dir.with_extension("log");
    wait_until(
        &format!(
            "pg_receivewal to complete {name} (its log: {})",
            log.display()
        ),
        || dir.join(&name).exists(),
    );
}

/// Every completed segment pg_receivewal wrote is byte-identical to walserver's.
fn compare_segments(node: &TestNode, dir: &Path) -> usize {
    let mut compared = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.len() != 24 || name.ends_with(".partial") {
            continue;
        }
        let theirs = read_file(&dir.join(&name));
        let ours = read_file(&node.data_dir().join("pg_wal").join(&name));
        assert!(
            theirs == ours,
            "segment {name} differs between pg_receivewal and walserver"
        );
        compared += 1;
    }
    compared
}

fn interrupt(child: &mut Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    child.wait().unwrap();
}

fn append_mib(node: &TestNode, mib: usize, seed: u8) -> Lsn {
    let mut end = Lsn::INVALID;
    for i in 0..mib {
        end = node.append(8, 128 << 10, seed.wrapping_add(i as u8));
    }
    end
}

#[test]
fn pg_receivewal_streams_byte_identical_segments_and_resumes_after_a_restart() {
    let bin = PgBin::require();
    const SEG: u64 = 16 << 20;
    let node = TestNode::primary_with_segments(SEG, "wal_keep_size = \"1GB\"");
    let recv = tempfile::tempdir().unwrap();
    append_mib(&node, 8, 1);
    let mut child = pg_receivewal(&bin, &node, recv.path(), &[]);
    // Appends while it streams, across several segment boundaries (at least 64 MiB).
    let end = append_mib(&node, 72, 2);
    let last_complete = end.segment_number(SEG) - 1;
    wait_for_segment(recv.path(), last_complete, SEG);
    // Stopped, then restarted: it resumes where its files end, with no gap. It is stopped with
    // SIGINT, as an operator stops it: a SIGKILL while it zero-fills a new segment file leaves
    // a short .partial file that pg_receivewal itself then refuses ("should be 0 or 16777216"),
    // which says nothing about the server.
    interrupt(&mut child);
    let end = append_mib(&node, 20, 3);
    let mut child = pg_receivewal(&bin, &node, recv.path(), &[]);
    let last = end.segment_number(SEG) - 1;
    wait_for_segment(recv.path(), last, SEG);
    child.kill().unwrap();
    child.wait().unwrap();
    // Every segment from the first to the last completed one is there, and equal: no gap.
    let listing: Vec<_> = std::fs::read_dir(recv.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    for segno in 1..=last {
        let name = segment_file_name(TimelineId(1), segno, SEG);
        assert!(
            recv.path().join(&name).exists(),
            "pg_receivewal has no {name}: {listing:?}"
        );
    }
    let compared = compare_segments(&node, recv.path());
    assert!(
        compared as u64 >= last,
        "only {compared} segments compared: {listing:?}"
    );
}

#[test]
fn pg_receivewal_with_a_slot_and_synchronous_reports_flush() {
    let bin = PgBin::require();
    const SEG: u64 = 1 << 20;
    let node = TestNode::primary_with_segments(SEG, "wal_keep_size = \"64MB\"");
    let recv = tempfile::tempdir().unwrap();
    let out = Command::new(bin.tool("pg_receivewal"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &node.addr().port().to_string(),
            "-U",
            "repl",
            "--no-password",
        ])
        .args(["--create-slot", "--slot", "recv1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(node.http_get("/slots")[0]["slot_name"], "recv1");
    let mut child = pg_receivewal(
        &bin,
        &node,
        recv.path(),
        &["--slot", "recv1", "--synchronous"],
    );
    let end = append_mib(&node, 6, 5);
    // With --synchronous and a slot, pg_receivewal reports its fsynced position as flush, and
    // the slot follows it.
    wait_until("pg_receivewal to report flush", || {
        node.http_get("/status")["replication"][0]["flush_lsn"]
            == serde_json::json!(end.to_string())
    });
    wait_until("the slot to advance", || {
        node.http_get("/slots")[0]["restart_lsn"] == serde_json::json!(end.to_string())
    });
    assert_eq!(
        node.http_get("/status")["replication"][0]["slot_name"],
        "recv1"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(compare_segments(&node, recv.path()) >= 4);
}

fn psql(
    bin: &PgBin,
    node: &TestNode,
    user: &str,
    password: Option<&str>,
    sql: &str,
) -> std::process::Output {
    let mut c = Command::new(bin.tool("psql"));
    c.arg(format!(
        "host=127.0.0.1 port={} user={user} replication=true",
        node.addr().port()
    ))
    .args(["-X", "-A", "-F", "|", "-c", sql]);
    match password {
        Some(p) => c.env("PGPASSWORD", p),
        None => c.arg("--no-password"),
    };
    c.output().expect("run psql")
}

#[test]
fn psql_gets_postgres_result_shapes() {
    let bin = PgBin::require();
    let node = TestNode::primary("");
    let out = psql(&bin, &node, "u", None, "IDENTIFY_SYSTEM");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("systemid|timeline|xlogpos|dbname"));
    assert_eq!(
        lines.next().map(str::to_string),
        Some(format!(
            "{}|1|{}|",
            node.wal().system_id(),
            node.wal().flushed()
        ))
    );
    let out = psql(&bin, &node, "u", None, "SHOW wal_segment_size");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .take(2)
            .collect::<Vec<_>>(),
        ["wal_segment_size", "1MB"]
    );
    let out = psql(&bin, &node, "u", None, "SHOW server_version");
    assert!(String::from_utf8_lossy(&out.stdout).contains("15.0"));
    let out = psql(&bin, &node, "u", None, "SELECT 1");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("cannot execute SQL commands in WAL sender for physical replication"));
}

#[test]
fn libpq_scram_wrong_password_and_rejected_address() {
    let bin = PgBin::require();
    let verifier = make_scram_verifier("secret");
    let node = TestNode::primary(&format!(
        "[users]\nrepl = \"{verifier}\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"outsider\"\nmethod = \"reject\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n"
    ));
    let out = psql(&bin, &node, "repl", Some("secret"), "IDENTIFY_SYSTEM");
    assert!(
        out.status.success(),
        "SCRAM with libpq failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = psql(&bin, &node, "repl", Some("wrong"), "IDENTIFY_SYSTEM");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("password authentication failed for user \"repl\""),
        "{err}"
    );
    let out = psql(&bin, &node, "outsider", Some("secret"), "IDENTIFY_SYSTEM");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "pg_hba.conf rejects replication connection for host \"127.0.0.1\", user \"outsider\""
        ),
        "{err}"
    );
    // The SQLSTATEs behind those messages, read with our own client.
    assert_eq!(
        sqlstate(
            &PgConn::connect(node.addr(), "repl", Some("wrong"))
                .err()
                .unwrap()
        ),
        "28P01"
    );
    assert_eq!(
        sqlstate(
            &PgConn::connect(node.addr(), "outsider", Some("x"))
                .err()
                .unwrap()
        ),
        "28000"
    );
}

/// libpq over TLS: the walsender answers SSLRequest with 'S' when it has a certificate, and
/// psql with sslmode=verify-full (and SCRAM inside TLS) runs a command.
#[test]
fn libpq_over_tls_verify_full() {
    let bin = PgBin::require();
    let certs = tempfile::tempdir().unwrap();
    let files = pg_testkit::TestPki::new(&["localhost", "127.0.0.1"]).write_to(certs.path());
    let verifier = make_scram_verifier("secret");
    let node = TestNode::primary(&format!(
        "ssl_cert_file = {:?}\nssl_key_file = {:?}\n[users]\nrepl = \"{verifier}\"\n[[hba]]\ntype = \"hostssl\"\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n[[hba]]\ntype = \"hostnossl\"\naddress = \"all\"\nuser = \"all\"\nmethod = \"reject\"\n",
        files.cert.display().to_string(),
        files.key.display().to_string()
    ));
    let run = |sslmode: &str| {
        Command::new(bin.tool("psql"))
            .arg(format!(
                "host=localhost port={} user=repl replication=true sslmode={sslmode} sslrootcert={}",
                node.addr().port(),
                files.root.display()
            ))
            .args(["-X", "-A", "-t", "-c", "IDENTIFY_SYSTEM"])
            .env("PGPASSWORD", "secret")
            .output()
            .unwrap()
    };
    let out = run("verify-full");
    assert!(
        out.status.success(),
        "TLS connection failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&node.wal().system_id().to_string()));
    // The admin API serves TLS with the same certificate.
    let config = protocol_codec::tls::client_config(
        protocol_codec::tls::SslMode::VerifyFull,
        Some(&files.root),
    )
    .unwrap()
    .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let sock = std::net::TcpStream::connect(node.http_addr).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    use std::io::{Read, Write};
    write!(tls, "GET /status HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = tls.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(answer.contains("\"role\":\"primary\""), "{answer}");
    // Without TLS the rules refuse it.
    let out = run("disable");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pg_hba.conf rejects"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
