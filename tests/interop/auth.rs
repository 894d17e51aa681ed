//! Authentication beside a real PostgreSQL 15: SCRAM's and the password methods' failures,
//! and SCRAM channel binding over TLS.

use std::net::SocketAddr;
use std::process::Command;

use pg_testkit::PgBin;
use protocol_codec::auth::make_scram_verifier;

use crate::common::*;
use crate::compare::{answers, auth_start, error_line, frame, side_by_side};

/// How a server ends an authentication that asked for SCRAM: every message after the
/// client's last step (see [`auth_end`]).
fn auth_answer(addr: SocketAddr, user: &str, act: &dyn Fn(&mut PgConn)) -> Vec<String> {
    use protocol_codec::{AuthRequest, BackendMessage};
    let mut c = auth_start(addr, user);
    match c.recv() {
        BackendMessage::Authentication(AuthRequest::Sasl { .. }) => {}
        other => panic!("not a SASL request: {other:?}"),
    }
    act(&mut c);
    auth_end(&mut c)
}

/// The rest of an authentication as the side-by-side tests compare it: an error as its
/// severity, SQLSTATE, text and detail; SASL and authentication messages by name; up to
/// ReadyForQuery, or `closed` when the server closes.
fn auth_end(c: &mut PgConn) -> Vec<String> {
    use protocol_codec::{AuthRequest, BackendMessage};
    answers(c, &|m| match m {
        BackendMessage::ErrorResponse(f) => Some(format!(
            "{} (detail: {})",
            error_line(f),
            f.get(b'D').unwrap_or("-")
        )),
        BackendMessage::Authentication(AuthRequest::SaslFinal(_)) => Some("SASLFinal".into()),
        BackendMessage::Authentication(AuthRequest::SaslContinue(_)) => Some("SASLContinue".into()),
        BackendMessage::ParameterStatus { .. } | BackendMessage::BackendKeyData { .. } => None,
        m => Some(format!("{m:?}")),
    })
}

/// The SCRAM exchange up to the client's final message: client-first with `mechanism` and
/// `first`, then the server's first message handed to `last` for the final message.
fn scram_exchange(c: &mut PgConn, mechanism: &str, first: &[u8], last: &dyn Fn(&[u8]) -> Vec<u8>) {
    use protocol_codec::{AuthRequest, BackendMessage, FrontendMessage};
    c.send(FrontendMessage::SaslInitialResponse {
        mechanism: mechanism.into(),
        data: Some(bytes::Bytes::copy_from_slice(first)),
    });
    let server_first = match c.recv() {
        BackendMessage::Authentication(AuthRequest::SaslContinue(b)) => b,
        other => panic!("not SASLContinue: {other:?}"),
    };
    c.send(FrontendMessage::SaslResponse(bytes::Bytes::from(last(
        &server_first,
    ))));
}

/// Authentication's failures, walserver against a real PostgreSQL 15, both asking for
/// SCRAM-SHA-256 of the same role and password: the same client steps get the same end.
#[test]
fn authentication_fails_as_postgresql_15_does() {
    use protocol_codec::auth::{ScramClient, SCRAM_SHA_256};
    use protocol_codec::FrontendMessage;

    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default().hba("host replication all 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "secret", "scram-sha-256");
    let verifier = make_scram_verifier("secret");
    let node = TestNode::primary(&format!(
        "[users]\nrepl = \"{verifier}\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n"
    ));
    let full = |password: &'static str| {
        move |c: &mut PgConn| {
            let client = std::cell::RefCell::new(ScramClient::new(password, false));
            let first = client.borrow().client_first().to_vec();
            scram_exchange(c, SCRAM_SHA_256, &first, &|server_first| {
                client
                    .borrow_mut()
                    .handle_server_first(server_first)
                    .expect("server-first")
                    .to_vec()
            });
        }
    };
    // A client-final message with the server's nonce and the given binding and proof.
    let tampered = |binding: &'static str, nonce_suffix: &'static str| {
        move |c: &mut PgConn| {
            scram_exchange(
                c,
                SCRAM_SHA_256,
                b"n,,n=,r=abcdefghijklmnop",
                &|server_first| {
                    let text = String::from_utf8_lossy(server_first).to_string();
                    let nonce = text
                        .split(',')
                        .find_map(|a| a.strip_prefix("r="))
                        .expect("a nonce")
                        .to_string();
                    format!("c={binding},r={nonce}{nonce_suffix},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
                    .into_bytes()
                },
            );
        }
    };
    type Act = Box<dyn Fn(&mut PgConn)>;
    // A SASLInitialResponse with this mechanism and data, and nothing after it.
    let initial = |mechanism: &'static str, data: &'static [u8]| -> Act {
        Box::new(move |c| {
            c.send(FrontendMessage::SaslInitialResponse {
                mechanism: mechanism.into(),
                data: Some(bytes::Bytes::from_static(data)),
            })
        })
    };
    let cases: Vec<(&str, &str, Act)> = vec![
        ("the right password", "repl", Box::new(full("secret"))),
        ("a wrong password", "repl", Box::new(full("wrong"))),
        (
            "a role that does not exist",
            "nobody",
            Box::new(full("secret")),
        ),
        (
            "a mechanism not offered",
            "repl",
            initial("SCRAM-SHA-1", b"n,,n=,r=abcdefghijklmnop"),
        ),
        (
            "a client-first message that is not SCRAM",
            "repl",
            initial(SCRAM_SHA_256, b"garbage"),
        ),
        (
            "channel binding data without the PLUS mechanism",
            "repl",
            initial(
                SCRAM_SHA_256,
                b"p=tls-server-end-point,,n=,r=abcdefghijklmnop",
            ),
        ),
        (
            "no initial response data, then client-first in a SASL response",
            "repl",
            Box::new(|c| {
                use protocol_codec::{AuthRequest, BackendMessage};
                c.send(FrontendMessage::SaslInitialResponse {
                    mechanism: SCRAM_SHA_256.into(),
                    data: None,
                });
                match c.recv() {
                    BackendMessage::Authentication(AuthRequest::SaslContinue(b)) => {
                        assert!(b.is_empty(), "an empty challenge: {b:?}")
                    }
                    other => panic!("not SASLContinue: {other:?}"),
                }
                let mut client = ScramClient::new("secret", false);
                c.send(FrontendMessage::SaslResponse(
                    bytes::Bytes::copy_from_slice(client.client_first()),
                ));
                let server_first = match c.recv() {
                    BackendMessage::Authentication(AuthRequest::SaslContinue(b)) => b,
                    other => panic!("not SASLContinue: {other:?}"),
                };
                let last = client
                    .handle_server_first(&server_first)
                    .expect("server-first");
                c.send(FrontendMessage::SaslResponse(
                    bytes::Bytes::copy_from_slice(last),
                ));
            }),
        ),
        (
            "an empty SASL response",
            "repl",
            initial(SCRAM_SHA_256, b""),
        ),
        ("a wrong proof", "repl", Box::new(tampered("biws", ""))),
        (
            "a nonce that is not the server's",
            "repl",
            Box::new(tampered("biws", "x")),
        ),
        (
            "a binding that is not the header's",
            "repl",
            Box::new(tampered("eSws", "")),
        ),
        (
            "a client-first message with no nonce attribute",
            "repl",
            initial(SCRAM_SHA_256, b"n,,n=,x=1"),
        ),
        (
            "an unknown message type instead of the first SASL response",
            "repl",
            Box::new(|c| c.send_raw(b"z\0\0\0\x04")),
        ),
        (
            "a query instead of the first SASL response",
            "repl",
            Box::new(|c| c.send(FrontendMessage::Query("IDENTIFY_SYSTEM".into()))),
        ),
        (
            "Terminate instead of the first SASL response",
            "repl",
            Box::new(|c| c.send(FrontendMessage::Terminate)),
        ),
        (
            "a query instead of the final SASL response",
            "repl",
            Box::new(move |c| {
                initial(SCRAM_SHA_256, b"n,,n=,r=abcdefghijklmnop")(c);
                let _ = c.recv();
                c.send(FrontendMessage::Query("IDENTIFY_SYSTEM".into()));
            }),
        ),
    ];
    side_by_side(
        &cases,
        &|addr, user, act| auth_answer(addr, user, act.as_ref()),
        pg.addr(),
        node.addr(),
    );
}

/// Password authentication's failures (md5, and cleartext `password`), walserver against a
/// real PostgreSQL 15 with the same roles and passwords: the same client steps get the same
/// end.
#[test]
fn password_authentication_fails_as_postgresql_15_does() {
    use protocol_codec::auth::{make_md5_verifier, md5_response};
    use protocol_codec::{AuthRequest, BackendMessage, FrontendMessage};

    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default()
            .hba("host replication md 127.0.0.1/32 md5")
            .hba("host replication clear 127.0.0.1/32 password"),
    );
    pg.create_replication_role("md", "secret", "md5");
    pg.create_replication_role("clear", "secret", "scram-sha-256");
    let node = TestNode::primary(&format!(
        "[users]\nmd = \"{}\"\nclear = \"{}\"\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"md\"\nmethod = \"md5\"\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"clear\"\nmethod = \"password\"\n",
        make_md5_verifier("md", "secret"),
        make_scram_verifier("secret"),
    ));
    // What the client sends once asked for a password (given the md5 salt, none for a
    // cleartext request): a PasswordMessage, or another message's bytes.
    type Act = Box<dyn Fn(&str, Option<[u8; 4]>) -> Vec<u8>>;
    let password = |text: &'static str| -> Act {
        Box::new(move |user, salt| {
            let text = match salt {
                Some(salt) => md5_response(user, text, salt),
                None => text.to_string(),
            };
            frame(FrontendMessage::password(&text))
        })
    };
    let cases: Vec<(&str, &str, Act)> = vec![
        ("md5, the right password", "md", password("secret")),
        ("md5, a wrong password", "md", password("wrong")),
        ("cleartext, the right password", "clear", password("secret")),
        ("cleartext, a wrong password", "clear", password("wrong")),
        (
            "md5, an empty password",
            "md",
            Box::new(|_, _| frame(FrontendMessage::password(""))),
        ),
        (
            "cleartext, an empty password",
            "clear",
            Box::new(|_, _| frame(FrontendMessage::password(""))),
        ),
        (
            "a password packet with bytes after its string",
            "clear",
            Box::new(|_, _| {
                frame(FrontendMessage::PasswordMessage(bytes::Bytes::from_static(
                    b"secret\0x",
                )))
            }),
        ),
        (
            "a query instead of the password",
            "md",
            Box::new(|_, _| frame(FrontendMessage::Query("IDENTIFY_SYSTEM".into()))),
        ),
        (
            "Terminate instead of the password",
            "clear",
            Box::new(|_, _| frame(FrontendMessage::Terminate)),
        ),
    ];
    let answer = |addr: SocketAddr, user: &str, act: &Act| {
        let mut c = auth_start(addr, user);
        let salt = match c.recv() {
            BackendMessage::Authentication(AuthRequest::Md5Password { salt }) => Some(salt),
            BackendMessage::Authentication(AuthRequest::CleartextPassword) => None,
            other => panic!("not a password request: {other:?}"),
        };
        c.send_raw(&act(user, salt));
        auth_end(&mut c)
    };
    side_by_side(
        &cases,
        &|addr, user, act| answer(addr, user, act),
        pg.addr(),
        node.addr(),
    );
}

/// SCRAM channel binding over TLS, walserver against a real PostgreSQL 15 with the same
/// certificate, role and password: a client that binds gets SCRAM-SHA-256-PLUS from both; one
/// bound to another certificate (what a man in the middle would present) is refused by both
/// with the same FATAL; one that does not bind gets SCRAM-SHA-256 from both; and psql with
/// `channel_binding=require` connects to both.
#[test]
fn scram_channel_binding_works_as_with_postgresql_15() {
    use protocol_codec::auth::ChannelBindingMode;
    use protocol_codec::tls::SslMode;
    use repl_client::{ConnectOptions, ReplClient, TlsOptions};

    let bin = PgBin::require();
    let pki = pg_testkit::TestPki::new(&["localhost", "127.0.0.1"]);
    let certs = tempfile::tempdir().unwrap();
    let files = pki.write_to(certs.path());
    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default()
            .tls(&pki)
            .hba("hostssl replication repl 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "secret", "scram-sha-256");
    let node = TestNode::primary(&format!(
        "ssl_cert_file = {:?}\nssl_key_file = {:?}\n[users]\nrepl = \"{}\"\n\
         [[hba]]\ntype = \"hostssl\"\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n",
        files.cert.display().to_string(),
        files.key.display().to_string(),
        make_scram_verifier("secret")
    ));
    // The mechanism a TLS login used, or the server's FATAL.
    let login = |addr: SocketAddr, binding: Option<ChannelBindingMode>| -> String {
        let mut tls = TlsOptions::new(SslMode::VerifyFull, Some(&files.root), "localhost")
            .expect("TLS options");
        tls.channel_binding = binding;
        let options = ConnectOptions::new("repl", Some("secret"), "binding")
            .read_timeout(DEADLINE)
            .tls(tls);
        match ReplClient::connect_with(addr, &options) {
            Ok(c) => format!("authenticated with {:?}", c.session().mechanism),
            Err(e) => match e.server_error() {
                Some(f) => error_line(f),
                None => format!("failed without the server's error: {e}"),
            },
        }
    };
    let cases = [
        ("bound to the certificate presented", None),
        (
            "bound to another certificate",
            Some(ChannelBindingMode::TlsServerEndPoint(vec![0; 32])),
        ),
        ("not binding", Some(ChannelBindingMode::TlsWithoutBinding)),
    ];
    for (what, binding) in cases {
        let theirs = login(pg.addr(), binding.clone());
        let ours = login(node.addr(), binding);
        eprintln!("{what}:\n  pg: {theirs}\n  ws: {ours}");
        assert_eq!(ours, theirs, "{what}");
    }
    assert_eq!(
        login(node.addr(), None),
        "authenticated with Some(\"SCRAM-SHA-256-PLUS\")"
    );
    // libpq insisting on channel binding.
    for (who, port) in [("PostgreSQL", pg.port()), ("walserver", node.addr().port())] {
        let out = Command::new(bin.tool("psql"))
            .arg(format!(
                "host=localhost port={port} user=repl replication=true sslmode=verify-full \
                 sslrootcert={} channel_binding=require",
                files.root.display()
            ))
            .args(["-X", "-A", "-t", "-c", "IDENTIFY_SYSTEM"])
            .env("PGPASSWORD", "secret")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{who}: psql with channel_binding=require: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
