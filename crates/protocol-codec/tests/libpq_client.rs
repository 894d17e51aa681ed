//! Real libpq (psql 15) against this crate's server side: a minimal single-connection server
//! in a test thread, built only from the codecs, `ScramServer`, `tls::server_config` and the
//! `results` functions, answers SSLRequest, runs the TLS handshake, authenticates with
//! SCRAM-SHA-256 and answers IDENTIFY_SYSTEM. It checks the pieces the walsender is built from against libpq
//! alone, without the walsender itself.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use bytes::BytesMut;
use pg_testkit::{PgBin, TestPki};
use protocol_codec::auth::{make_scram_verifier, ScramServer};
use protocol_codec::command::{parse_command, ReplicationCommand};
use protocol_codec::messages::{
    ensure_nothing_pipelined, parse_sasl_initial_response, ReplicationMode, SslResponse,
    TransactionStatus,
};
use protocol_codec::{
    results, tls, AuthRequest, BackendMessage, FrontendMessage, ServerCodec, StartupCodec,
    StartupPacket,
};
use tokio_util::codec::{Decoder, Encoder};
use wal_types::{Lsn, SystemId, TimelineId};

trait Transport: Read + Write {}
impl<T: Read + Write> Transport for T {}

struct Peer {
    io: Box<dyn Transport>,
    rbuf: BytesMut,
}

impl Peer {
    fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 16 * 1024];
        match self.io.read(&mut tmp) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.rbuf.extend_from_slice(&tmp[..n]);
                true
            }
        }
    }

    fn startup(&mut self) -> Option<StartupPacket> {
        loop {
            if let Some(p) = StartupCodec.decode(&mut self.rbuf).unwrap() {
                return Some(p);
            }
            if !self.fill() {
                return None;
            }
        }
    }

    fn recv(&mut self) -> Option<FrontendMessage> {
        loop {
            if let Some(m) = ServerCodec::new().decode(&mut self.rbuf).unwrap() {
                return Some(m);
            }
            if !self.fill() {
                return None;
            }
        }
    }

    fn send(&mut self, msgs: &[BackendMessage]) {
        let mut out = BytesMut::new();
        for m in msgs {
            ServerCodec::new().encode(m, &mut out).unwrap();
        }
        self.io.write_all(&out).unwrap();
        self.io.flush().unwrap();
    }
}

const SYSTEM_ID: u64 = 7_000_000_000_000_000_001;

/// Serves one connection the way a walsender starts one; returns the gs2 header the client
/// used, or `None` if authentication failed.
fn serve_one(
    listener: TcpListener,
    tls_config: Option<Arc<rustls::ServerConfig>>,
    verifier: String,
) -> Option<String> {
    let (socket, _) = listener.accept().unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut peer = Peer {
        io: Box::new(socket.try_clone().unwrap()),
        rbuf: BytesMut::new(),
    };
    let mut packet = peer.startup().unwrap();
    if packet == StartupPacket::SslRequest {
        // Plaintext bytes pipelined behind the SSLRequest must not be taken as encrypted.
        ensure_nothing_pipelined(&peer.rbuf).unwrap();
        match &tls_config {
            Some(config) => {
                peer.io.write_all(&[SslResponse::Accept.byte()]).unwrap();
                let session = rustls::ServerConnection::new(config.clone()).unwrap();
                peer.io = Box::new(rustls::StreamOwned::new(session, socket));
            }
            None => peer.io.write_all(&[SslResponse::Refuse.byte()]).unwrap(),
        }
        packet = peer.startup().unwrap();
    }
    assert_eq!(packet.replication().unwrap(), ReplicationMode::Physical);
    let user = packet.user().unwrap().to_string();
    assert!(packet.protocol_negotiation().unwrap().is_none());

    let mut scram = ScramServer::new(&verifier, &user).unwrap();
    peer.send(&[BackendMessage::Authentication(ScramServer::request())]);
    let Some(FrontendMessage::PasswordMessage(first)) = peer.recv() else {
        panic!("no SASLInitialResponse")
    };
    let (mechanism, data) = parse_sasl_initial_response(&first).unwrap();
    let gs2 = String::from_utf8(data.as_ref().unwrap()[..3].to_vec()).unwrap();
    let server_first = scram
        .handle_initial_response(&mechanism, data.as_deref())
        .unwrap()
        .into_bytes();
    peer.send(&[BackendMessage::Authentication(AuthRequest::SaslContinue(
        server_first.into(),
    ))]);
    let Some(FrontendMessage::PasswordMessage(fin)) = peer.recv() else {
        panic!("no SASLResponse")
    };
    match scram.handle_client_final(&fin) {
        Ok(server_final) => peer.send(&[
            BackendMessage::Authentication(AuthRequest::SaslFinal(server_final.into())),
            BackendMessage::Authentication(AuthRequest::Ok),
        ]),
        Err(e) => {
            peer.send(&[BackendMessage::ErrorResponse(e.to_error_fields(&user))]);
            return None;
        }
    }
    let param = |name: &str, value: &str| BackendMessage::ParameterStatus {
        name: name.into(),
        value: value.into(),
    };
    peer.send(&[
        param("server_version", "15.0"),
        param("integer_datetimes", "on"),
        param("client_encoding", "UTF8"),
        param("server_encoding", "UTF8"),
        param("standard_conforming_strings", "on"),
        param("DateStyle", "ISO, MDY"),
        BackendMessage::BackendKeyData { pid: 4242, key: 7 },
        BackendMessage::ReadyForQuery(TransactionStatus::Idle),
    ]);
    while let Some(msg) = peer.recv() {
        match msg {
            FrontendMessage::Query(q) => {
                let mut answer = match parse_command(&q) {
                    Ok(ReplicationCommand::IdentifySystem) => results::identify_system(
                        SystemId(SYSTEM_ID),
                        TimelineId(1),
                        Lsn(0x100_0000),
                        None,
                    ),
                    Ok(other) => vec![BackendMessage::ErrorResponse(
                        other.refusal().unwrap_or_else(|| {
                            protocol_codec::ErrorFields::error(
                                protocol_codec::SqlState::FEATURE_NOT_SUPPORTED,
                                "not in this test",
                            )
                        }),
                    )],
                    Err(e) => vec![BackendMessage::ErrorResponse(e.to_error_fields())],
                };
                answer.push(BackendMessage::ReadyForQuery(TransactionStatus::Idle));
                peer.send(&answer);
            }
            FrontendMessage::Terminate => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    Some(gs2)
}

/// Runs psql against a one-connection server; returns (psql's output, gs2 header seen).
fn run_psql(
    tls_config: Option<Arc<rustls::ServerConfig>>,
    conninfo_extra: &str,
    password: &str,
    sql: &str,
) -> (std::process::Output, Option<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let verifier = make_scram_verifier("secret");
    let server = thread::spawn(move || serve_one(listener, tls_config, verifier));
    let out = Command::new(PgBin::require().tool("psql"))
        .arg(format!(
            "host=localhost hostaddr=127.0.0.1 port={port} user=repl dbname=replication \
             replication=true connect_timeout=10 {conninfo_extra}"
        ))
        .args(["-X", "-A", "-t", "-c", sql])
        .env("PGPASSWORD", password)
        .env_remove("PGSSLMODE")
        .output()
        .unwrap();
    (out, server.join().unwrap())
}

#[test]
fn libpq_logs_in_over_tls_and_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let files = TestPki::new(&["localhost"]).write_to(dir.path());
    let config = tls::server_config(&files.cert, &files.key).unwrap();

    // verify-full over our TLS: libpq checks our certificate and sends y,, because we do not
    // offer SCRAM-SHA-256-PLUS; our server accepts that.
    let verify_full = format!("sslmode=verify-full sslrootcert={}", files.root.display());
    let (out, gs2) = run_psql(
        Some(config.clone()),
        &verify_full,
        "secret",
        "IDENTIFY_SYSTEM",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{SYSTEM_ID}|1|0/1000000|")
    );
    assert_eq!(gs2.as_deref(), Some("y,,"));

    // Plaintext: n,,.
    let (out, gs2) = run_psql(None, "sslmode=disable", "secret", "IDENTIFY_SYSTEM");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(gs2.as_deref(), Some("n,,"));

    // A wrong password: libpq shows our FATAL.
    let (out, gs2) = run_psql(
        Some(config.clone()),
        &verify_full,
        "wrong",
        "IDENTIFY_SYSTEM",
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("password authentication failed for user \"repl\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(gs2, None);

    // SQL is refused with PostgreSQL's message; psql prints our ErrorResponse.
    let (out, _) = run_psql(Some(config), &verify_full, "secret", "SELECT 1");
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("cannot execute SQL commands in WAL sender for physical replication"));
}
