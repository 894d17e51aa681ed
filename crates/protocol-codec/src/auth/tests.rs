//! The exchanges of both sides against each other and against PostgreSQL's captured one, and
//! each side's refusals.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;

use super::password::md5_hex;
use super::scram_server::read_client_first;
use super::*;
use crate::messages::{AuthRequest, FrontendMessage, SqlState};

/// Runs a whole exchange between postgres-protocol's client (via ScramClient) and our
/// server; returns the server's verdict and whether the client accepted the server.
fn exchange(verifier: &str, password: &str, tls: bool) -> Result<(), AuthError> {
    let mut server = ScramServer::new(verifier, "repl")?;
    let mut client = ScramClient::new(password, tls);
    let server_first = server.handle_client_first(client.client_first())?;
    let client_final = client.handle_server_first(&server_first)?.to_vec();
    let server_final = server.handle_client_final(&client_final)?;
    client.handle_server_final(&server_final)
}

#[test]
fn made_verifiers_work_with_postgres_protocol_client() {
    let verifier = make_scram_verifier("secret");
    assert!(verifier.starts_with("SCRAM-SHA-256$4096:"));
    exchange(&verifier, "secret", false).unwrap();
    exchange(&verifier, "secret", true).unwrap();
    let err = exchange(&verifier, "wrong", false).unwrap_err();
    assert!(matches!(err, AuthError::PasswordFailed { .. }), "{err:?}");
    let fields = err.to_error_fields("repl");
    assert!(fields.is_fatal());
    assert_eq!(fields.code(), Some(SqlState::INVALID_PASSWORD));
    assert_eq!(
        fields.message(),
        Some("password authentication failed for user \"repl\"")
    );
}

#[test]
fn replays_the_captured_postgresql_exchange() {
    // pg_receivewal-scram.1.jsonl: password "secret", PostgreSQL's salt and nonces.
    let salt = B64.decode("ccQyN3BRWkaqmqvrvw/ttw==").unwrap();
    let v = ScramVerifier::derive("secret", &salt, 4096);
    let verifier = format!(
        "SCRAM-SHA-256$4096:{}${}:{}",
        B64.encode(&v.salt),
        B64.encode(v.stored_key),
        B64.encode(v.server_key)
    );
    let mut server = ScramServer::new(&verifier, "repl").unwrap();
    let client_first =
        read_client_first(b"n,,n=,r=aJrSDlXMMIN2YDqnuyuprRm7", false, false).unwrap();
    let server_first = server.respond_to_client_first(client_first, "+UpG7of43TlfxAqtIA3tLXSC");
    assert_eq!(
        server_first,
        b"r=aJrSDlXMMIN2YDqnuyuprRm7+UpG7of43TlfxAqtIA3tLXSC,s=ccQyN3BRWkaqmqvrvw/ttw==,i=4096"
    );
    let server_final = server
        .handle_client_final(b"c=biws,r=aJrSDlXMMIN2YDqnuyuprRm7+UpG7of43TlfxAqtIA3tLXSC,p=ugZACmGdEhv9GfNVNc6zhpIaDb83YnHuMl2Qupd0rl8=")
        .unwrap();
    assert_eq!(
        server_final,
        b"v=Wl8siUICdxXZc9AHqeIwQwDHQf34VGPz8TMjzzS7uf4="
    );
}

fn server_after_first(client_first: &str) -> (ScramServer, String) {
    let mut server = ScramServer::new(&make_scram_verifier("pw"), "u").unwrap();
    let first = server.handle_client_first(client_first.as_bytes()).unwrap();
    let first = String::from_utf8(first).unwrap();
    let nonce = first.split(',').next().unwrap()[2..].to_string();
    (server, nonce)
}

/// An error's text as the client sees it: SQLSTATE, message and detail.
fn seen(e: &AuthError) -> String {
    let f = e.to_error_fields("u");
    format!(
        "{} {}: {}",
        f.get(b'C').unwrap_or("?"),
        f.message().unwrap_or("?"),
        f.get(b'D').unwrap_or("-")
    )
}

#[test]
fn client_first_checks() {
    let bad = |msg: &[u8]| {
        let mut server = ScramServer::new(&make_scram_verifier("pw"), "u").unwrap();
        seen(&server.handle_client_first(msg).unwrap_err())
    };
    // PostgreSQL 15's texts, from its auth-scram.c.
    let malformed = |d: &str| format!("08P01 malformed SCRAM message: {d}");
    assert_eq!(
        bad(b"p=tls-server-end-point,,n=,r=abc"),
        malformed("The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data.")
    );
    assert_eq!(
        bad(b"n,a=admin,n=,r=abc"),
        "0A000 client uses authorization identity, but it is not supported: -"
    );
    assert_eq!(
        bad(b"n,,m=ext,n=,r=abc"),
        "0A000 client requires an unsupported SCRAM extension: -"
    );
    assert_eq!(
        bad(b"garbage"),
        malformed("Unexpected channel-binding flag \"'g'\".")
    );
    assert_eq!(
        bad(b"\x01,,n=,r=a"),
        malformed("Unexpected channel-binding flag \"0x01\".")
    );
    assert_eq!(
        bad(b"nx,n=,r=abc"),
        malformed("Comma expected, but found character \"'x'\".")
    );
    assert_eq!(
        bad(b"n"),
        malformed("Comma expected, but found character \"0x00\".")
    );
    assert_eq!(
        bad(b"n,x,n=,r=abc"),
        malformed("Unexpected attribute \"'x'\" in client-first-message.")
    );
    assert_eq!(
        bad(b"n,,r=abc"),
        malformed("Expected attribute \"n\" but found \"'r'\".")
    );
    assert_eq!(
        bad(b"n,,n=,r"),
        malformed("Expected character \"=\" for attribute \"r\".")
    );
    assert_eq!(
        bad(b"n,,"),
        malformed("Expected attribute \"n\" but found \"0x00\".")
    );
    assert_eq!(
        bad(b"n,,n=,r=ab\xffc"),
        "08P01 non-printable characters in SCRAM nonce: -"
    );
    assert_eq!(
        bad(b"n,,n=,r=abc,1=x"),
        malformed("Attribute expected, but found invalid character \"'1'\".")
    );
    assert_eq!(bad(b""), malformed("The message is empty."));
    assert_eq!(
        bad(b"n,,n=\0,r=abc"),
        malformed("Message length does not match input length.")
    );
    // A user name in the message is accepted and ignored; extensions are ignored; an
    // empty client nonce is accepted, as PostgreSQL accepts it.
    server_after_first("n,,n=someone,r=abc,x=ext");
    server_after_first("y,,n=,r=abc");
    server_after_first("n,,n=,r=");
    let mut server = ScramServer::new(&make_scram_verifier("pw"), "u").unwrap();
    assert!(matches!(
        server.handle_initial_response("SCRAM-SHA-256-PLUS", Some(b"n,,n=,r=a")),
        Err(AuthError::InvalidMechanism)
    ));
}

#[test]
fn an_initial_response_without_data_gets_an_empty_challenge() {
    let mut server = ScramServer::new(&make_scram_verifier("pw"), "u").unwrap();
    let mut client = ScramClient::new("pw", false);
    assert_eq!(
        server.handle_initial_response(SCRAM_SHA_256, None).unwrap(),
        ScramReply::Continue(Vec::new())
    );
    let ScramReply::Continue(first) = server.handle_response(client.client_first()).unwrap() else {
        panic!("server-first-message expected")
    };
    let fin = client.handle_server_first(&first).unwrap().to_vec();
    let ScramReply::Final(last) = server.handle_response(&fin).unwrap() else {
        panic!("server-final-message expected")
    };
    client.handle_server_final(&last).unwrap();
}

#[test]
fn client_final_checks() {
    // Each final message is a template: NONCE is the exchange's nonce, PROOF a
    // well-formed proof that is wrong.
    let proof = B64.encode([0u8; 32]);
    let check = |first: &str, fin: &str| {
        let (mut server, nonce) = server_after_first(first);
        let fin = fin.replace("NONCE", &nonce).replace("PROOF", &proof);
        seen(&server.handle_client_final(fin.as_bytes()).unwrap_err())
    };
    // PostgreSQL 15's texts, from its auth-scram.c.
    let malformed = |d: &str| format!("08P01 malformed SCRAM message: {d}");
    let unexpected_binding =
        "08P01 unexpected SCRAM channel-binding attribute in client-final-message: -";
    let failed = "28P01 password authentication failed for user \"u\": -";
    let cases = [
        // Channel binding must echo the gs2 header: biws for n,, and eSws for y,,.
        (
            "n,,n=,r=abc",
            "c=eSws,r=NONCE,p=PROOF",
            unexpected_binding.to_string(),
        ),
        (
            "y,,n=,r=abc",
            "c=biws,r=NONCE,p=PROOF",
            unexpected_binding.to_string(),
        ),
        (
            "n,,n=,r=abc",
            "c=biws,r=abcdef,p=PROOF",
            "08P01 invalid SCRAM response: Nonce does not match.".to_string(),
        ),
        (
            "n,,n=,r=abc",
            "c=biws,r=NONCE,p=short",
            malformed("Malformed proof in client-final-message."),
        ),
        (
            "n,,n=,r=abc",
            "c=biws,r=NONCE",
            malformed("Attribute expected, but found end of string."),
        ),
        (
            "n,,n=,r=abc",
            "c=biws,r=NONCE,p=PROOF,x",
            malformed("Garbage found at the end of client-final-message."),
        ),
        (
            "n,,n=,r=abc",
            "r=NONCE,p=PROOF",
            malformed("Expected attribute \"c\" but found \"'r'\"."),
        ),
        // A well-formed message with a wrong proof is a failed password; extensions
        // before the proof are ignored.
        ("n,,n=,r=abc", "c=biws,r=NONCE,p=PROOF", failed.to_string()),
        (
            "n,,n=,r=abc",
            "c=biws,r=NONCE,x=y,p=PROOF",
            failed.to_string(),
        ),
    ];
    for (first, fin, expected) in cases {
        assert_eq!(check(first, fin), expected, "{first} / {fin}");
    }
    // Messages out of order.
    let mut server = ScramServer::new(&make_scram_verifier("pw"), "u").unwrap();
    assert!(server.handle_client_final(b"c=biws,r=a,p=b").is_err());
    let (mut server, _) = server_after_first("n,,n=,r=abc");
    assert!(server.handle_client_first(b"n,,n=,r=abc").is_err());
}

#[test]
fn channel_binding_over_tls() {
    let end_point = vec![7u8; 32];
    let server = || {
        ScramServer::new(&make_scram_verifier("pw"), "u")
            .unwrap()
            .with_channel_binding(end_point.clone())
    };
    assert_eq!(
        server().offer(),
        AuthRequest::Sasl {
            mechanisms: vec![SCRAM_SHA_256_PLUS.into(), SCRAM_SHA_256.into()]
        }
    );
    // A client bound to the same certificate authenticates, and checks the server.
    let bound = |client_end_point: Vec<u8>| {
        let mut s = server();
        let mut client = ScramClient::with_channel_binding("pw", client_end_point);
        let first = s
            .handle_initial_response(SCRAM_SHA_256_PLUS, Some(client.client_first()))
            .unwrap()
            .into_bytes();
        let fin = client.handle_server_first(&first).unwrap().to_vec();
        s.handle_client_final(&fin)
            .and_then(|last| client.handle_server_final(&last))
    };
    bound(end_point.clone()).unwrap();
    // Bound to another certificate (a proxy's): refused, as PostgreSQL refuses it.
    assert_eq!(
        seen(&bound(vec![8u8; 32]).unwrap_err()),
        "28000 SCRAM channel binding check failed: -"
    );
    // A client that chose not to bind may still use the plain mechanism.
    let mut s = server();
    let mut client = ScramClient::new("pw", false);
    let first = s
        .handle_initial_response(SCRAM_SHA_256, Some(client.client_first()))
        .unwrap()
        .into_bytes();
    let fin = client.handle_server_first(&first).unwrap().to_vec();
    s.handle_client_final(&fin).unwrap();

    // PostgreSQL 15's refusals, from its auth-scram.c.
    let first_err = |mechanism: &str, msg: &[u8]| {
        seen(
            &server()
                .handle_initial_response(mechanism, Some(msg))
                .unwrap_err(),
        )
    };
    assert_eq!(
        first_err(SCRAM_SHA_256_PLUS, b"n,,n=,r=abc"),
        "08P01 malformed SCRAM message: The client selected SCRAM-SHA-256-PLUS, but the SCRAM message does not include channel binding data."
    );
    assert_eq!(
        first_err(SCRAM_SHA_256, b"y,,n=,r=abc"),
        "28000 SCRAM channel binding negotiation error: The client supports SCRAM channel binding but thinks the server does not.  However, this server does support channel binding."
    );
    assert_eq!(
        first_err(SCRAM_SHA_256_PLUS, b"p=tls-unique,,n=,r=abc"),
        "08P01 unsupported SCRAM channel-binding type \"tls-unique\": -"
    );
    assert_eq!(
        first_err(SCRAM_SHA_256, b"p=tls-server-end-point,,n=,r=abc"),
        "08P01 malformed SCRAM message: The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data."
    );
    // Without binding data the PLUS mechanism is not offered, and `y` is fine.
    let mut plain = ScramServer::new(&make_scram_verifier("pw"), "u").unwrap();
    assert!(matches!(
        plain.handle_initial_response(SCRAM_SHA_256_PLUS, Some(b"p=tls-server-end-point,,n=,r=a")),
        Err(AuthError::InvalidMechanism)
    ));
    server_after_first("y,,n=,r=abc");
}

#[test]
fn unknown_users_fail_like_wrong_passwords() {
    let mut server = ScramServer::for_unknown_user("ghost");
    let mut client = ScramClient::new("anything", false);
    let first = server.handle_client_first(client.client_first()).unwrap();
    // The salt is stable for a user name, so probing twice reveals nothing.
    let mut again = ScramServer::for_unknown_user("ghost");
    let first2 = again.handle_client_first(client.client_first()).unwrap();
    let salt = |m: &[u8]| {
        String::from_utf8(m.to_vec())
            .unwrap()
            .split(',')
            .nth(1)
            .unwrap()
            .to_string()
    };
    assert_eq!(salt(&first), salt(&first2));
    let fin = client.handle_server_first(&first).unwrap().to_vec();
    let err = server.handle_client_final(&fin).unwrap_err();
    assert_eq!(
        err.to_error_fields("ghost").code(),
        Some(SqlState::INVALID_PASSWORD)
    );
    let unknown = AuthError::UnknownRole {
        user: "ghost".into(),
    };
    assert_eq!(
        unknown.to_error_fields("ghost").code(),
        Some(SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
    );
    assert!(ScramServer::new("md5abc", "u").is_err());
    assert!(ScramServer::new("SCRAM-SHA-256$0:c2FsdA==$AA==:AA==", "u").is_err());
}

#[test]
fn md5_and_cleartext() {
    let salt = [1, 2, 3, 4];
    let response = md5_response("repl", "secret", salt);
    assert_eq!(response.len(), 35);
    let md5_stored = make_md5_verifier("repl", "secret");
    assert_eq!(md5_stored, format!("md5{}", md5_hex(&[b"secret", b"repl"])));
    verify_md5(&md5_stored, "repl", salt, &response).unwrap();
    verify_md5("secret", "repl", salt, &response).unwrap();
    assert!(verify_md5(&md5_stored, "repl", [0; 4], &response).is_err());
    assert!(verify_md5(
        &md5_stored,
        "other",
        salt,
        &md5_response("other", "secret", salt)
    )
    .is_err());
    assert!(verify_md5(&make_scram_verifier("secret"), "repl", salt, &response).is_err());

    verify_cleartext(&make_scram_verifier("secret"), "repl", "secret").unwrap();
    verify_cleartext(&md5_stored, "repl", "secret").unwrap();
    verify_cleartext("secret", "repl", "secret").unwrap();
    for stored in [make_scram_verifier("secret"), md5_stored, "secret".into()] {
        let e = verify_cleartext(&stored, "repl", "secreT").unwrap_err();
        assert_eq!(e.sqlstate(), SqlState::INVALID_PASSWORD);
    }
}

#[test]
fn the_clients_channel_binding_policy() {
    let end_point = vec![5u8; 32];
    let tls = || ChannelBindingMode::TlsServerEndPoint(end_point.clone());
    let client =
        |policy| ClientAuthenticator::new("repl", Some("pw"), tls()).channel_binding(policy);
    // A whole exchange against a server offering -PLUS; the mechanism the client chose.
    let run = |mut c: ClientAuthenticator| -> Result<String, AuthError> {
        let mut server = ScramServer::new(&make_scram_verifier("pw"), "repl")
            .unwrap()
            .with_channel_binding(end_point.clone());
        let Some(FrontendMessage::SaslInitialResponse { mechanism, data }) =
            c.step(&server.offer())?
        else {
            panic!("no SASLInitialResponse")
        };
        let first = server
            .handle_initial_response(&mechanism, data.as_deref())?
            .into_bytes();
        let Some(FrontendMessage::SaslResponse(fin)) =
            c.step(&AuthRequest::SaslContinue(first.into()))?
        else {
            panic!("no SASLResponse")
        };
        let last = server.handle_client_final(&fin)?;
        c.step(&AuthRequest::SaslFinal(last.into()))?;
        c.step(&AuthRequest::Ok)?;
        Ok(mechanism)
    };
    assert_eq!(
        run(client(ChannelBinding::Prefer)).unwrap(),
        SCRAM_SHA_256_PLUS
    );
    assert_eq!(
        run(client(ChannelBinding::Require)).unwrap(),
        SCRAM_SHA_256_PLUS
    );
    assert_eq!(run(client(ChannelBinding::Disable)).unwrap(), SCRAM_SHA_256);

    // require: libpq's refusals of whatever cannot bind.
    let refused = |c: &mut ClientAuthenticator, req: &AuthRequest| match c.step(req) {
        Err(AuthError::ChannelBindingRequired(text)) => text,
        other => panic!("not refused: {other:?}"),
    };
    let mut c = client(ChannelBinding::Require);
    assert_eq!(
        refused(&mut c, &AuthRequest::Ok),
        "channel binding required, but server authenticated client without channel binding"
    );
    for req in [
        AuthRequest::CleartextPassword,
        AuthRequest::Md5Password { salt: [1; 4] },
    ] {
        assert_eq!(
            refused(&mut c, &req),
            "channel binding required but not supported by server's authentication request"
        );
    }
    assert_eq!(
        refused(&mut c, &ScramServer::request()),
        "channel binding is required, but server did not offer an authentication method that supports channel binding"
    );
    let mut no_hash = ClientAuthenticator::new("repl", Some("pw"), ChannelBindingMode::NoTls)
        .channel_binding(ChannelBinding::Require);
    let both = AuthRequest::Sasl {
        mechanisms: vec![SCRAM_SHA_256_PLUS.into(), SCRAM_SHA_256.into()],
    };
    assert!(matches!(
        no_hash.step(&both),
        Err(AuthError::ChannelBindingRequired(_))
    ));
}

#[test]
fn client_authenticator_drives_each_method() {
    let mut c = ClientAuthenticator::new("repl", Some("secret"), ChannelBindingMode::NoTls);
    assert_eq!(c.step(&AuthRequest::Ok).unwrap(), None);
    assert_eq!(
        c.step(&AuthRequest::CleartextPassword).unwrap(),
        Some(FrontendMessage::password("secret"))
    );
    let salt = [9, 8, 7, 6];
    assert_eq!(
        c.step(&AuthRequest::Md5Password { salt }).unwrap(),
        Some(FrontendMessage::password(&md5_response(
            "repl", "secret", salt
        )))
    );

    // SCRAM against our server, through the messages.
    let mut server = ScramServer::new(&make_scram_verifier("secret"), "repl").unwrap();
    let Some(FrontendMessage::SaslInitialResponse { mechanism, data }) =
        c.step(&ScramServer::request()).unwrap()
    else {
        panic!()
    };
    let first = server
        .handle_initial_response(&mechanism, data.as_deref())
        .unwrap()
        .into_bytes();
    let Some(FrontendMessage::SaslResponse(fin)) =
        c.step(&AuthRequest::SaslContinue(first.into())).unwrap()
    else {
        panic!()
    };
    // AuthenticationOk before the server proved itself is refused.
    let mut early = ClientAuthenticator::new("repl", Some("secret"), ChannelBindingMode::NoTls);
    early.step(&ScramServer::request()).unwrap();
    assert!(early.step(&AuthRequest::Ok).is_err());

    let server_final = server.handle_client_final(&fin).unwrap();
    assert_eq!(
        c.step(&AuthRequest::SaslFinal(server_final.into()))
            .unwrap(),
        None
    );
    assert_eq!(c.step(&AuthRequest::Ok).unwrap(), None);

    // A forged server signature is refused.
    let mut c = ClientAuthenticator::new("repl", Some("secret"), ChannelBindingMode::NoTls);
    let mut server = ScramServer::new(&make_scram_verifier("other"), "repl").unwrap();
    let Some(FrontendMessage::SaslInitialResponse { data, .. }) =
        c.step(&ScramServer::request()).unwrap()
    else {
        panic!()
    };
    let first = server.handle_client_first(&data.unwrap()).unwrap();
    c.step(&AuthRequest::SaslContinue(first.into())).unwrap();
    let forged = format!("v={}", B64.encode([0u8; 32]));
    assert!(c.step(&AuthRequest::SaslFinal(forged.into())).is_err());

    // The gs2 header and mechanism follow what the connection and the server allow.
    let first = |binding: ChannelBindingMode, offered: &[&str]| {
        let mut c = ClientAuthenticator::new("repl", Some("pw"), binding);
        let req = AuthRequest::Sasl {
            mechanisms: offered.iter().map(|m| m.to_string()).collect(),
        };
        let Some(FrontendMessage::SaslInitialResponse { mechanism, data }) = c.step(&req).unwrap()
        else {
            panic!()
        };
        (
            mechanism,
            String::from_utf8(data.unwrap()[..3].to_vec()).unwrap(),
        )
    };
    let both = [SCRAM_SHA_256_PLUS, SCRAM_SHA_256];
    let plain = |h: &str| (SCRAM_SHA_256.to_string(), h.to_string());
    assert_eq!(first(ChannelBindingMode::NoTls, &both), plain("n,,"));
    assert_eq!(
        first(ChannelBindingMode::TlsWithoutBinding, &both),
        plain("n,,")
    );
    assert_eq!(
        first(ChannelBindingMode::TlsWithoutBinding, &[SCRAM_SHA_256]),
        plain("y,,")
    );
    let hash = ChannelBindingMode::TlsServerEndPoint(vec![1; 32]);
    assert_eq!(first(hash.clone(), &[SCRAM_SHA_256]), plain("y,,"));
    assert_eq!(
        first(hash, &both),
        (SCRAM_SHA_256_PLUS.to_string(), "p=t".to_string())
    );

    let mut nopw = ClientAuthenticator::new("repl", None, ChannelBindingMode::NoTls);
    assert!(matches!(
        nopw.step(&AuthRequest::CleartextPassword),
        Err(AuthError::NoPassword)
    ));
    // A server that offers only -PLUS to a client that cannot bind.
    let mut cannot_bind = ClientAuthenticator::new("repl", Some("pw"), ChannelBindingMode::NoTls);
    assert!(matches!(
        cannot_bind.step(&AuthRequest::Sasl {
            mechanisms: vec![SCRAM_SHA_256_PLUS.into()]
        }),
        Err(AuthError::Unsupported(_))
    ));
}
