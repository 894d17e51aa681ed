//! The client handshake driven without sockets: one test per order rule, the sslmode table,
//! every authentication method, and PostgreSQL 15's captured greeting.

use bytes::{Bytes, BytesMut};
use tokio_util::codec::Decoder;

use super::*;
use crate::auth::{self, ScramServer, SCRAM_SHA_256, SCRAM_SHA_256_PLUS};
use crate::messages::{parse_password, parse_sasl_initial_response, parse_sasl_response};
use crate::messages::{SqlState, TransactionStatus};
use crate::{ServerCodec, StartupCodec};

fn config(password: Option<&str>, sslmode: SslMode) -> StartupConfig {
    StartupConfig {
        sslmode,
        ..StartupConfig::replication("repl", password, "test").param("options", "-c x=y")
    }
}

/// A handshake past its startup packet, and the packet it sent.
fn started(password: Option<&str>) -> (ClientHandshake, StartupPacket) {
    let mut h = ClientHandshake::new(config(password, SslMode::Disable), Encryption::Plain);
    let Step::ReadMessage { send } = h.start().unwrap() else {
        panic!("plaintext starts with the startup packet")
    };
    let packet = StartupCodec
        .decode(&mut BytesMut::from(&send[..]))
        .unwrap()
        .unwrap();
    (h, packet)
}

/// The one client message in `step`.
fn sent(step: Step) -> FrontendMessage {
    let Step::ReadMessage { send } = step else {
        panic!("expected a message to send, got {step:?}")
    };
    let mut buf = BytesMut::from(&send[..]);
    let m = ServerCodec::new().decode(&mut buf).unwrap().unwrap();
    assert!(buf.is_empty(), "more than one message");
    m
}

fn nothing_sent(step: Step) {
    assert_eq!(step, Step::ReadMessage { send: Bytes::new() });
}

fn ok(h: &mut ClientHandshake) {
    nothing_sent(
        h.on_message(BackendMessage::Authentication(AuthRequest::Ok))
            .unwrap(),
    );
}

fn param(name: &str, value: &str) -> BackendMessage {
    BackendMessage::ParameterStatus {
        name: name.into(),
        value: value.into(),
    }
}

fn ready() -> BackendMessage {
    BackendMessage::ReadyForQuery(TransactionStatus::Idle)
}

fn protocol_error(r: Result<Step, StartupError>) -> String {
    match r {
        Err(StartupError::Protocol(m)) => m,
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn sslmode_attempts_follow_libpq() {
    use AttemptFailure::{Other, ServerError};
    use Encryption::{Plain, Tls};
    let tls_failed = AttemptFailure::Tls;
    assert_eq!(first_attempt(SslMode::Disable), Plain);
    assert_eq!(first_attempt(SslMode::Allow), Plain);
    for mode in [
        SslMode::Prefer,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ] {
        assert_eq!(first_attempt(mode), Tls, "{mode}");
    }
    assert_eq!(next_attempt(SslMode::Allow, Plain, ServerError), Some(Tls));
    assert_eq!(next_attempt(SslMode::Allow, Plain, Other), None);
    assert_eq!(next_attempt(SslMode::Allow, Tls, ServerError), None);
    assert_eq!(next_attempt(SslMode::Prefer, Tls, tls_failed), Some(Plain));
    assert_eq!(next_attempt(SslMode::Prefer, Tls, ServerError), None);
    assert_eq!(next_attempt(SslMode::Prefer, Plain, tls_failed), None);
    for mode in [
        SslMode::Disable,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ] {
        for failure in [ServerError, tls_failed, Other] {
            assert_eq!(next_attempt(mode, first_attempt(mode), failure), None);
        }
    }
}

#[test]
fn trust_login_collects_the_greeting() {
    let (mut h, packet) = started(None);
    assert_eq!(
        packet,
        StartupPacket::startup([
            ("user", "repl"),
            ("replication", "true"),
            ("application_name", "test"),
            ("options", "-c x=y"),
        ])
    );
    ok(&mut h);
    let notice = ErrorFields::notice(SqlState::from_code("01000").unwrap(), "hello");
    for m in [
        param("server_version", "15.4"),
        BackendMessage::NoticeResponse(notice.clone()),
        BackendMessage::BackendKeyData { pid: 42, key: 7 },
        param("server_version", "15.5"),
    ] {
        nothing_sent(h.on_message(m).unwrap());
    }
    let Step::Ready(e) = h.on_message(ready()).unwrap() else {
        panic!("ReadyForQuery ends the startup")
    };
    assert_eq!(e.param("server_version"), Some("15.5"));
    assert_eq!(e.params.len(), 2);
    assert_eq!(e.backend_key, Some((42, 7)));
    assert_eq!(e.notices, vec![notice]);
    assert_eq!(e.mechanism, None);
    assert!(!e.tls);
    // Done: nothing more is accepted.
    protocol_error(h.on_message(ready()));
}

#[test]
fn ssl_request_then_tls() {
    let mut h = ClientHandshake::new(config(None, SslMode::Require), Encryption::Tls);
    let Step::ReadSslAnswer { send } = h.start().unwrap() else {
        panic!("TLS starts with SSLRequest")
    };
    assert_eq!(&send[..], &[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
    // The startup packet waits for TLS.
    protocol_error(h.on_message(ready()));
    let mut h = ClientHandshake::new(config(None, SslMode::Require), Encryption::Tls);
    h.start().unwrap();
    assert_eq!(h.on_ssl_answer(b'S').unwrap(), Step::StartTls);
    protocol_error(h.on_ssl_answer(b'S'));
    let packet = match h
        .tls_started(ChannelBindingMode::TlsWithoutBinding)
        .unwrap()
    {
        Step::ReadMessage { send } => StartupCodec
            .decode(&mut BytesMut::from(&send[..]))
            .unwrap()
            .unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(packet.user(), Some("repl"));
    ok(&mut h);
    let Step::Ready(e) = h.on_message(ready()).unwrap() else {
        panic!()
    };
    assert!(e.tls);
}

#[test]
fn refused_ssl_goes_on_in_plaintext_unless_required() {
    for mode in [SslMode::Allow, SslMode::Prefer] {
        let mut h = ClientHandshake::new(config(None, mode), Encryption::Tls);
        h.start().unwrap();
        let Step::ReadMessage { send } = h.on_ssl_answer(b'N').unwrap() else {
            panic!("{mode}: 'N' means plaintext")
        };
        let packet = StartupCodec
            .decode(&mut BytesMut::from(&send[..]))
            .unwrap()
            .unwrap();
        assert_eq!(packet.user(), Some("repl"));
        // tls_started is for 'S' only.
        protocol_error(h.tls_started(ChannelBindingMode::TlsWithoutBinding));
    }
    for mode in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
        let mut h = ClientHandshake::new(config(None, mode), Encryption::Tls);
        h.start().unwrap();
        let err = h.on_ssl_answer(b'N').unwrap_err();
        assert!(
            matches!(err, StartupError::SslRequired(m) if m == mode),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("server does not support SSL, but SSL was required (sslmode={mode})")
        );
        assert_eq!(err.failure(), AttemptFailure::Tls);
    }
    let mut h = ClientHandshake::new(config(None, SslMode::Prefer), Encryption::Tls);
    h.start().unwrap();
    let err = h.on_ssl_answer(b'E').unwrap_err();
    assert!(
        matches!(err, StartupError::InvalidSslAnswer(b'E')),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "received invalid response to SSL negotiation: 'E'"
    );
}

#[test]
fn calls_out_of_order_are_refused() {
    let mut h = ClientHandshake::new(config(None, SslMode::Disable), Encryption::Plain);
    protocol_error(h.on_message(BackendMessage::Authentication(AuthRequest::Ok)));
    let mut h = ClientHandshake::new(config(None, SslMode::Disable), Encryption::Plain);
    protocol_error(h.on_ssl_answer(b'S'));
    h.start().unwrap();
    protocol_error(h.start());
    protocol_error(h.on_ssl_answer(b'S'));
    protocol_error(h.tls_started(ChannelBindingMode::NoTls));
}

#[test]
fn cleartext_and_md5_answer_with_the_password() {
    let (mut h, _) = started(Some("pw"));
    let FrontendMessage::PasswordMessage(body) = sent(
        h.on_message(BackendMessage::Authentication(
            AuthRequest::CleartextPassword,
        ))
        .unwrap(),
    ) else {
        panic!()
    };
    assert_eq!(parse_password(&body).unwrap(), "pw");
    ok(&mut h);

    let (mut h, _) = started(Some("pw"));
    let salt = [1, 2, 3, 4];
    let FrontendMessage::PasswordMessage(body) = sent(
        h.on_message(BackendMessage::Authentication(AuthRequest::Md5Password {
            salt,
        }))
        .unwrap(),
    ) else {
        panic!()
    };
    let answer = parse_password(&body).unwrap();
    assert_eq!(answer, auth::md5_response("repl", "pw", salt));
    let stored = auth::make_md5_verifier("repl", "pw");
    auth::verify_md5(&stored, "repl", salt, &answer).unwrap();
    ok(&mut h);

    // No password to give: our side fails, not the protocol.
    let (mut h, _) = started(None);
    let err = h
        .on_message(BackendMessage::Authentication(
            AuthRequest::CleartextPassword,
        ))
        .unwrap_err();
    assert!(
        matches!(err, StartupError::Auth(AuthError::NoPassword)),
        "{err:?}"
    );
    assert_eq!(err.failure(), AttemptFailure::Other);
}

/// A whole SCRAM exchange against walserver's own server side.
#[test]
fn scram_against_our_server() {
    let verifier = auth::make_scram_verifier("secret");
    for (password, accepted) in [("secret", true), ("wrong", false)] {
        let mut server = ScramServer::new(&verifier, "repl").unwrap();
        let (mut h, _) = started(Some(password));
        let FrontendMessage::PasswordMessage(body) = sent(
            h.on_message(BackendMessage::Authentication(ScramServer::request()))
                .unwrap(),
        ) else {
            panic!()
        };
        let (mechanism, data) = parse_sasl_initial_response(&body).unwrap();
        assert_eq!(mechanism, SCRAM_SHA_256);
        let first = server
            .handle_initial_response(&mechanism, data.as_deref())
            .unwrap()
            .into_bytes();
        let FrontendMessage::PasswordMessage(body) = sent(
            h.on_message(BackendMessage::Authentication(AuthRequest::SaslContinue(
                Bytes::from(first),
            )))
            .unwrap(),
        ) else {
            panic!()
        };
        let fin = parse_sasl_response(&body).unwrap();
        match server.handle_client_final(&fin) {
            Ok(last) => {
                assert!(accepted);
                nothing_sent(
                    h.on_message(BackendMessage::Authentication(AuthRequest::SaslFinal(
                        Bytes::from(last),
                    )))
                    .unwrap(),
                );
                ok(&mut h);
                let Step::Ready(e) = h.on_message(ready()).unwrap() else {
                    panic!()
                };
                assert_eq!(e.mechanism.as_deref(), Some(SCRAM_SHA_256));
            }
            Err(e) => {
                assert!(!accepted);
                let err = h
                    .on_message(BackendMessage::ErrorResponse(e.to_error_fields("repl")))
                    .unwrap_err();
                assert_eq!(
                    err.server_error().and_then(ErrorFields::code),
                    Some(SqlState::INVALID_PASSWORD)
                );
                assert_eq!(err.failure(), AttemptFailure::ServerError);
            }
        }
    }
}

#[test]
fn scram_plus_when_the_certificate_hash_is_at_hand() {
    let offer = AuthRequest::Sasl {
        mechanisms: vec![SCRAM_SHA_256_PLUS.into(), SCRAM_SHA_256.into()],
    };
    for (binding, mechanism) in [
        (
            ChannelBindingMode::TlsServerEndPoint(vec![7; 32]),
            SCRAM_SHA_256_PLUS,
        ),
        (ChannelBindingMode::TlsWithoutBinding, SCRAM_SHA_256),
    ] {
        let mut h = ClientHandshake::new(config(Some("pw"), SslMode::Require), Encryption::Tls);
        h.start().unwrap();
        h.on_ssl_answer(b'S').unwrap();
        h.tls_started(binding).unwrap();
        let FrontendMessage::PasswordMessage(body) = sent(
            h.on_message(BackendMessage::Authentication(offer.clone()))
                .unwrap(),
        ) else {
            panic!()
        };
        let (chosen, data) = parse_sasl_initial_response(&body).unwrap();
        assert_eq!(chosen, mechanism);
        let gs2 = if mechanism == SCRAM_SHA_256_PLUS {
            &b"p=tls-server-end-point,,"[..]
        } else {
            &b"n,,"[..]
        };
        assert!(data.unwrap().starts_with(gs2));
    }
}

#[test]
fn a_scram_exchange_the_server_did_not_finish_is_refused() {
    let (mut h, _) = started(Some("pw"));
    h.on_message(BackendMessage::Authentication(ScramServer::request()))
        .unwrap();
    let err = h
        .on_message(BackendMessage::Authentication(AuthRequest::Ok))
        .unwrap_err();
    assert!(
        matches!(err, StartupError::Auth(AuthError::ServerScram(_))),
        "{err:?}"
    );
    // The attempt is over.
    protocol_error(h.on_message(BackendMessage::Authentication(AuthRequest::Ok)));
}

#[test]
fn only_authentication_messages_before_authentication_ok() {
    for m in [
        param("server_version", "15"),
        BackendMessage::BackendKeyData { pid: 1, key: 2 },
        ready(),
        BackendMessage::CommandComplete("x".into()),
        BackendMessage::CopyBothResponse,
    ] {
        let (mut h, _) = started(None);
        let name = m.name();
        let msg = protocol_error(h.on_message(m));
        assert_eq!(
            msg,
            format!("unexpected {name} during connection startup, before AuthenticationOk")
        );
    }
    // Notices and protocol negotiation are fine while authenticating.
    let (mut h, _) = started(None);
    nothing_sent(
        h.on_message(BackendMessage::NegotiateProtocolVersion {
            newest_minor: 0,
            unrecognized: vec!["_pq_.x".into()],
        })
        .unwrap(),
    );
    nothing_sent(
        h.on_message(BackendMessage::NoticeResponse(ErrorFields::notice(
            SqlState::from_code("01000").unwrap(),
            "n",
        )))
        .unwrap(),
    );
    ok(&mut h);
    assert!(matches!(h.on_message(ready()).unwrap(), Step::Ready(_)));
}

#[test]
fn after_authentication_ok_only_the_greeting() {
    let (mut h, _) = started(None);
    ok(&mut h);
    assert_eq!(
        protocol_error(h.on_message(BackendMessage::Authentication(AuthRequest::Ok))),
        "authentication request after AuthenticationOk"
    );
    for m in [
        BackendMessage::Authentication(AuthRequest::CleartextPassword),
        BackendMessage::NegotiateProtocolVersion {
            newest_minor: 0,
            unrecognized: vec![],
        },
        BackendMessage::DataRow(vec![]),
        BackendMessage::CopyDone,
    ] {
        let (mut h, _) = started(Some("pw"));
        ok(&mut h);
        let name = m.name();
        let msg = protocol_error(h.on_message(m));
        assert!(
            msg.contains(name) || msg.contains("after AuthenticationOk"),
            "{msg}"
        );
    }
}

#[test]
fn an_error_response_ends_the_attempt_in_either_phase() {
    let fatal = ErrorFields::fatal(SqlState::TOO_MANY_CONNECTIONS, "sorry, too many clients");
    for authenticated in [false, true] {
        let (mut h, _) = started(None);
        if authenticated {
            ok(&mut h);
        }
        let err = h
            .on_message(BackendMessage::ErrorResponse(fatal.clone()))
            .unwrap_err();
        assert_eq!(err.server_error(), Some(&fatal));
        assert_eq!(err.to_string(), fatal.to_string());
        protocol_error(h.on_message(ready()));
    }
}

/// PostgreSQL 15's answer to pg_receivewal, from the capture: 'N' to SSLRequest, then, after
/// the SCRAM exchange, AuthenticationOk, its ParameterStatus set, BackendKeyData and
/// ReadyForQuery.
#[test]
fn postgresql_greeting_from_a_capture() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/pg15-captures/pg_receivewal-scram.1.jsonl"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let server: Vec<Vec<u8>> = text
        .lines()
        .filter(|l| l.contains("\"s2c\""))
        .map(|l| {
            let hex = l.rsplit("\"hex\": \"").next().unwrap();
            let hex = hex.trim_end_matches("\"}");
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect();
    let mut h = ClientHandshake::new(config(Some("secret"), SslMode::Prefer), Encryption::Tls);
    h.start().unwrap();
    assert_eq!(server[0], b"N");
    h.on_ssl_answer(server[0][0]).unwrap();
    // The SASL offer; the SCRAM messages after it carry PostgreSQL's nonces, not ours.
    let mut buf = BytesMut::from(&server[1][..]);
    let offer = crate::ClientCodec::new().decode(&mut buf).unwrap().unwrap();
    assert!(matches!(
        sent(h.on_message(offer).unwrap()),
        FrontendMessage::PasswordMessage(_)
    ));
    // Skip SASLFinal at the head of the greeting: an unfinished exchange is refused (tested
    // above), so the rest goes to a trust-mode handshake.
    let mut buf = BytesMut::from(&server[3][..]);
    let codec = &mut crate::ClientCodec::new();
    let fin = codec.decode(&mut buf).unwrap().unwrap();
    assert!(matches!(
        fin,
        BackendMessage::Authentication(AuthRequest::SaslFinal(_))
    ));
    let (mut h, _) = started(None);
    let mut ready_with = None;
    while let Some(m) = codec.decode(&mut buf).unwrap() {
        if let Step::Ready(e) = h.on_message(m).unwrap() {
            ready_with = Some(e);
        }
    }
    let e = ready_with.expect("the capture ends the startup with ReadyForQuery");
    assert!(e.param("server_version").unwrap().starts_with("15."));
    assert_eq!(e.param("application_name"), Some("pg_receivewal"));
    assert!(e.backend_key.is_some());
}
