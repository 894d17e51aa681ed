//! psql and libpq against a walserver primary: the result shapes PostgreSQL's clients expect,
//! SCRAM with a wrong password, an address the rules reject, and TLS with `verify-full`.

use std::process::Command;

use pg_testkit::PgBin;
use protocol_codec::auth::make_scram_verifier;

use crate::common::*;

pub(crate) fn psql(
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
pub(crate) fn psql_gets_postgres_result_shapes() {
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
pub(crate) fn libpq_scram_wrong_password_and_rejected_address() {
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
            "walserver's hba rules reject replication connection for host \"127.0.0.1\", user \"outsider\""
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
pub(crate) fn libpq_over_tls_verify_full() {
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
        String::from_utf8_lossy(&out.stderr).contains("walserver's hba rules reject"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
