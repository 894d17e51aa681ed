//! Interop with a real PostgreSQL 15, started by the test through pg-testkit: repl-client's
//! blocking client, whose login is this crate's `ClientHandshake`, authenticates (SCRAM with
//! and without channel binding, md5, cleartext, over plaintext and TLS), runs
//! replication commands and streams a little WAL. The results are compared with the shapes
//! the `results` module produces. PostgreSQL 15 missing is a failure, not a skip.

use std::path::Path;
use std::time::Duration;

use pg_testkit::{PgCluster, PgOptions, TestPki};
use protocol_codec::auth::{make_scram_verifier, ChannelBindingMode, ScramClient, ScramServer};
use protocol_codec::messages::StandbyStatusUpdate;
use protocol_codec::tls::SslMode;
use protocol_codec::{results, BackendMessage, ErrorFields, FrontendMessage, SqlState};
use repl_client::{ConnectOptions, ReplClient, TlsOptions};
use wal_types::{Lsn, PgTimestamp, SystemId, TimelineId};

/// A replication connection through repl-client (whose login is protocol-codec's
/// `ClientHandshake`), with panics for failures the tests do not expect.
#[derive(Debug)]
struct Conn {
    client: ReplClient,
}

fn options(user: &str, password: Option<&str>) -> ConnectOptions {
    // The read timeout is a deadline that turns a hang into a failure, not a
    // synchronisation device.
    ConnectOptions::new(user, password, "protocol-codec-test")
        .param("database", "replication")
        .read_timeout(Duration::from_secs(30))
}

/// Logs in over plaintext after the server refused SSLRequest (`sslmode=prefer` against a
/// server without TLS); returns the server's error if authentication fails.
fn login(pg: &PgCluster, user: &str, password: Option<&str>) -> Result<Conn, ErrorFields> {
    let tls = TlsOptions::new(SslMode::Prefer, None, "localhost").unwrap();
    match ReplClient::connect_with(pg.addr(), &options(user, password).tls(tls)) {
        Ok(client) => {
            assert!(
                !client.session().tls,
                "the server was expected to refuse SSL"
            );
            Ok(Conn { client })
        }
        Err(repl_client::Error::Server(e)) => Err(e),
        Err(e) => panic!("login as {user}: {e}"),
    }
}

/// SSLRequest, `'S'`, a rustls handshake for `sslmode` with `host` as the server name, then
/// the login; `binding` overrides SCRAM's channel binding (by default, the certificate the
/// server presented).
fn login_tls(
    pg: &PgCluster,
    sslmode: SslMode,
    root: Option<&Path>,
    host: &str,
    binding: Option<ChannelBindingMode>,
) -> Result<Conn, repl_client::Error> {
    let mut tls = TlsOptions::new(sslmode, root, host).unwrap();
    tls.channel_binding = binding;
    let client = ReplClient::connect_with(pg.addr(), &options("repl", Some("secret")).tls(tls))?;
    assert!(client.session().tls);
    Ok(Conn { client })
}

impl Conn {
    fn send(&mut self, msg: &FrontendMessage) {
        self.client.send(msg).expect("send");
    }

    fn recv(&mut self) -> BackendMessage {
        self.client.recv().expect("recv")
    }

    /// Runs a query and returns every message up to (not including) ReadyForQuery.
    fn query(&mut self, q: &str) -> Vec<BackendMessage> {
        self.client.simple_query(q).expect("query")
    }

    /// The SASL mechanism the login chose.
    fn mechanism(&self) -> Option<&str> {
        self.client.session().mechanism.as_deref()
    }

    /// The backend's pid, from BackendKeyData.
    fn pid(&self) -> i32 {
        self.client.session().backend_key.expect("BackendKeyData").0
    }
}

fn data_row(msgs: &[BackendMessage]) -> Vec<Option<String>> {
    match &msgs[1] {
        BackendMessage::DataRow(r) => r
            .iter()
            .map(|v| v.as_ref().map(|v| String::from_utf8(v.to_vec()).unwrap()))
            .collect(),
        other => panic!("not a DataRow: {other:?}"),
    }
}

fn cluster() -> PgCluster {
    let pg = PgCluster::init_primary(
        &PgOptions::default()
            .hba("host replication repl_md5 127.0.0.1/32 md5")
            .hba("host replication repl_clear 127.0.0.1/32 password")
            .hba("host replication all 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "secret", "scram-sha-256");
    pg
}

#[test]
fn scram_login_and_replication_commands() {
    let pg = cluster();
    let mut c = login(&pg, "repl", Some("secret")).expect("SCRAM login");
    let params = c.client.session().params.clone();
    let param = |n: &str| params.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    assert!(param("server_version").unwrap().starts_with("15."));
    assert_eq!(param("integer_datetimes"), Some("on"));

    // IDENTIFY_SYSTEM: PostgreSQL 15's exact shape, rebuilt by `results` from its values.
    let msgs = c.query("IDENTIFY_SYSTEM");
    let row = data_row(&msgs);
    let system_id: u64 = row[0].as_ref().unwrap().parse().unwrap();
    assert_eq!(
        system_id.to_string(),
        pg.psql("SELECT system_identifier FROM pg_control_system()")
    );
    let xlogpos: Lsn = row[2].as_ref().unwrap().parse().unwrap();
    assert_eq!(row[1].as_deref(), Some("1"));
    assert_eq!(row[3], None);
    assert_eq!(
        msgs,
        results::identify_system(SystemId(system_id), TimelineId(1), xlogpos, None)
    );

    let msgs = c.query("SHOW wal_segment_size");
    assert_eq!(msgs, results::show("wal_segment_size", "16MB"));

    // Timeline 1 has no history file: RowDescription first, then 58P01.
    let msgs = c.query("TIMELINE_HISTORY 1");
    assert_eq!(msgs[0], results::timeline_history_description());
    let BackendMessage::ErrorResponse(e) = &msgs[1] else {
        panic!("{msgs:?}")
    };
    assert_eq!(e.code(), Some(SqlState::UNDEFINED_FILE));
    assert_eq!(e.severity(), Some("ERROR"));

    let msgs = c.query("CREATE_REPLICATION_SLOT \"s1\" TEMPORARY PHYSICAL ( RESERVE_WAL)");
    assert_eq!(
        msgs,
        results::create_replication_slot("s1", Lsn(0), None, None)
    );
    let msgs = c.query("READ_REPLICATION_SLOT s1");
    let row = data_row(&msgs);
    let restart: Lsn = row[1].as_ref().unwrap().parse().unwrap();
    assert_eq!(
        msgs,
        results::read_replication_slot(Some(&results::ReadSlot {
            slot_type: "physical".into(),
            restart_lsn: Some(restart),
            restart_tli: Some(TimelineId(1)),
        }))
    );
    assert_eq!(
        c.query("READ_REPLICATION_SLOT nosuch"),
        results::read_replication_slot(None)
    );
    // The legacy syntax, then a duplicate: 42710, and the session goes on.
    assert_eq!(
        c.query("CREATE_REPLICATION_SLOT s2 PHYSICAL RESERVE_WAL"),
        results::create_replication_slot("s2", Lsn(0), None, None)
    );
    let msgs = c.query("CREATE_REPLICATION_SLOT s2 PHYSICAL");
    let BackendMessage::ErrorResponse(e) = &msgs[0] else {
        panic!("{msgs:?}")
    };
    assert_eq!(e.code(), Some(SqlState::DUPLICATE_OBJECT));
    assert_eq!(e.message(), Some("replication slot \"s2\" already exists"));
    // PostgreSQL 15 drops a session's temporary slots on any ERROR in that session.
    assert_eq!(
        c.query("READ_REPLICATION_SLOT s1"),
        results::read_replication_slot(None)
    );
    // SQL is refused in a physical walsender, with the message our parser's refusal copies.
    let msgs = c.query("SELECT 1");
    let BackendMessage::ErrorResponse(e) = &msgs[0] else {
        panic!("{msgs:?}")
    };
    let ours = protocol_codec::command::parse_command("SELECT 1")
        .unwrap()
        .refusal()
        .unwrap();
    assert_eq!(e.code(), ours.code());
    assert_eq!(e.message(), ours.message());

    // Stream from the segment start, ask for a reply, and end the copy from our side.
    let row = data_row(&c.query("READ_REPLICATION_SLOT s2"));
    let restart: Lsn = row[1].as_ref().unwrap().parse().unwrap();
    let start = restart.segment_start(16 << 20);
    c.send(&FrontendMessage::Query(format!(
        "START_REPLICATION SLOT \"s2\" PHYSICAL {start} TIMELINE 1"
    )));
    assert_eq!(c.recv(), BackendMessage::CopyBothResponse);
    let BackendMessage::XLogData(first) = c.recv() else {
        panic!("expected XLogData")
    };
    assert_eq!(first.wal_start, start);
    assert!(!first.data.is_empty());
    // The first page of a segment has PostgreSQL 15's magic, little-endian.
    assert_eq!(&first.data[..2], &0xD110u16.to_le_bytes());
    c.send(&FrontendMessage::StandbyStatusUpdate(StandbyStatusUpdate {
        write: first.wal_start,
        flush: first.wal_start,
        apply: Lsn(0),
        send_time: PgTimestamp::now(),
        reply_requested: true,
    }));
    // The walsender answers with a keepalive: exactly 18 bytes, or it would not decode.
    let keepalive = loop {
        match c.recv() {
            BackendMessage::XLogData(_) => continue,
            BackendMessage::PrimaryKeepalive(k) => break k,
            other => panic!("unexpected while streaming: {other:?}"),
        }
    };
    assert!(keepalive.wal_end >= first.wal_start);
    c.send(&FrontendMessage::CopyDone);
    let mut tail = Vec::new();
    loop {
        match c.recv() {
            BackendMessage::XLogData(_) | BackendMessage::PrimaryKeepalive(_) => continue,
            BackendMessage::ReadyForQuery(_) => break,
            m => tail.push(m),
        }
    }
    let mut expected = vec![BackendMessage::CopyDone];
    expected.extend(results::end_of_streaming());
    assert_eq!(tail, expected);
    // The connection is back in command mode.
    assert_eq!(
        data_row(&c.query("IDENTIFY_SYSTEM"))[0],
        Some(system_id.to_string())
    );
    c.send(&FrontendMessage::Terminate);
}

#[test]
fn wrong_password_md5_and_cleartext() {
    let pg = cluster();
    let err = login(&pg, "repl", Some("wrong")).expect_err("a wrong password must fail");
    assert!(err.is_fatal());
    assert_eq!(err.code(), Some(SqlState::INVALID_PASSWORD));
    assert_eq!(
        err.message(),
        Some("password authentication failed for user \"repl\"")
    );
    // Our server's report for the same failure is the same, field for field that matters.
    let ours = protocol_codec::auth::AuthError::PasswordFailed {
        user: "repl".into(),
        reason: String::new(),
    }
    .to_error_fields("repl");
    assert_eq!(
        (ours.severity(), ours.code(), ours.message()),
        (err.severity(), err.code(), err.message())
    );

    pg.create_replication_role("repl_md5", "md5pw", "md5");
    login(&pg, "repl_md5", Some("md5pw")).expect("md5 login");
    let err = login(&pg, "repl_md5", Some("nope")).unwrap_err();
    assert_eq!(err.code(), Some(SqlState::INVALID_PASSWORD));

    pg.create_replication_role("repl_clear", "clearpw", "scram-sha-256");
    login(&pg, "repl_clear", Some("clearpw")).expect("cleartext login");

    // An unknown role gets the same answer as a wrong password under SCRAM.
    let err = login(&pg, "ghost", Some("x")).unwrap_err();
    assert_eq!(err.code(), Some(SqlState::INVALID_PASSWORD));
}

#[test]
fn scram_verifiers_cross_check() {
    let pg = cluster();
    // PostgreSQL accepts a verifier made by make_scram_verifier as the role's secret...
    let verifier = make_scram_verifier("ours");
    pg.psql(&format!(
        "CREATE ROLE made LOGIN REPLICATION PASSWORD '{verifier}'"
    ));
    assert_eq!(
        pg.psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'made'"),
        verifier
    );
    login(&pg, "made", Some("ours")).expect("login with a verifier we made");

    // ...and our ScramServer accepts PostgreSQL's own verifier with postgres-protocol's client.
    let stored = pg.psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'repl'");
    let run = |password: &str| {
        let mut server = ScramServer::new(&stored, "repl").unwrap();
        let mut client = ScramClient::new(password, false);
        let first = server.handle_client_first(client.client_first())?;
        let fin = client.handle_server_first(&first)?.to_vec();
        let server_final = server.handle_client_final(&fin)?;
        client.handle_server_final(&server_final)
    };
    run("secret").expect("PostgreSQL's verifier works with our server");
    assert!(run("Secret").is_err());
}

#[test]
fn tls_sslmodes_and_scram_channel_binding() {
    let pki = TestPki::new(&["localhost"]);
    let pg = PgCluster::init_primary(
        &PgOptions::default()
            .tls(&pki)
            .hba("hostssl replication all 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "secret", "scram-sha-256");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root.crt");
    std::fs::write(&root, &pki.root_pem).unwrap();

    // verify-full, then SCRAM-SHA-256-PLUS bound to the certificate PostgreSQL presented.
    let mut c = login_tls(&pg, SslMode::VerifyFull, Some(&root), "localhost", None)
        .expect("SCRAM-SHA-256-PLUS over TLS");
    assert_eq!(c.mechanism(), Some("SCRAM-SHA-256-PLUS"));
    assert_eq!(
        pg.psql(&format!(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = {}",
            c.pid()
        )),
        "t"
    );
    assert_eq!(
        data_row(&c.query("IDENTIFY_SYSTEM"))[1].as_deref(),
        Some("1")
    );

    // Binding to the wrong certificate is caught by PostgreSQL: the proof of a MITM.
    let wrong = ChannelBindingMode::TlsServerEndPoint(vec![0; 32]);
    let err = login_tls(
        &pg,
        SslMode::VerifyFull,
        Some(&root),
        "localhost",
        Some(wrong),
    )
    .err()
    .unwrap();
    let err = err.server_error().expect("the server's error");
    assert!(err.is_fatal(), "{err}");
    assert_eq!(err.message(), Some("SCRAM channel binding check failed"));

    // Without the hash, over TLS: plain SCRAM-SHA-256 with n,, (y,, would be refused by a
    // server that offers -PLUS).
    let c = login_tls(
        &pg,
        SslMode::Require,
        None,
        "localhost",
        Some(ChannelBindingMode::TlsWithoutBinding),
    )
    .expect("SCRAM-SHA-256 over TLS without binding");
    assert_eq!(c.mechanism(), Some("SCRAM-SHA-256"));

    // Host name checks: verify-full refuses a name the certificate does not carry,
    // verify-ca accepts it, and a wrong root fails both.
    let tls_failed =
        |r: Result<Conn, repl_client::Error>| matches!(r, Err(repl_client::Error::Tls(_)));
    assert!(tls_failed(login_tls(
        &pg,
        SslMode::VerifyFull,
        Some(&root),
        "127.0.0.1",
        None
    )));
    login_tls(&pg, SslMode::VerifyCa, Some(&root), "127.0.0.1", None).unwrap();
    let other = dir.path().join("other.crt");
    std::fs::write(&other, TestPki::new(&["localhost"]).root_pem).unwrap();
    assert!(tls_failed(login_tls(
        &pg,
        SslMode::VerifyCa,
        Some(&other),
        "localhost",
        None
    )));
}

/// The errors a replication command's text alone provokes: walserver's parser against what a
/// real PostgreSQL 15 answers to the same text: the same SQLSTATE, the same words, and no
/// position (PostgreSQL's replication command parser says only "syntax error", and where).
#[test]
fn command_errors_match_postgresql_15() {
    let pg = cluster();
    let mut c = login(&pg, "repl", Some("secret")).expect("SCRAM login");
    let cases = [
        "CREATE_REPLICATION_SLOT e1 PHYSICAL (FOO)",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL (TWO_PHASE)",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL (SNAPSHOT 'export')",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL (RESERVE_WAL, RESERVE_WAL)",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL (RESERVE_WAL maybe)",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL EXPORT_SNAPSHOT",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL NOEXPORT_SNAPSHOT",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL USE_SNAPSHOT",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL TWO_PHASE",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL RESERVE_WAL RESERVE_WAL",
        "TIMELINE_HISTORY 0",
        "START_REPLICATION 0/0 TIMELINE 0",
        "IDENTIFY_SYSTEM extra",
        "SHOW",
        "TIMELINE_HISTORY abc",
        "TIMELINE_HISTORY -1",
        "START_REPLICATION zz",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL ()",
        "DROP_REPLICATION_SLOT e1 NOW",
        "DROP_REPLICATION_SLOT \"e1",
        "DROP_REPLICATION_SLOT 'e1",
        "START_REPLICATION LOGICAL 0/0",
        "CREATE_REPLICATION_SLOT e1 PHYSICAL (RESERVE_WAL yes)",
    ];
    for q in cases {
        let msgs = c.query(q);
        let theirs = msgs
            .iter()
            .find_map(|m| match m {
                BackendMessage::ErrorResponse(f) => Some(f.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{q}: PostgreSQL took it: {msgs:?}"));
        let ours = protocol_codec::command::parse_command(q)
            .expect_err(q)
            .to_error_fields();
        assert_eq!(
            (ours.code(), ours.message(), ours.get(b'P')),
            (theirs.code(), theirs.message(), theirs.get(b'P')),
            "{q}: {ours:?} against {theirs:?}"
        );
    }
}
