//! The startup phase of a connection as a plain state machine: SSL negotiation, the startup
//! packet, access rules and authentication, up to the point where the walsender may greet
//! the client. No I/O here: the actor's handshake task feeds packets in and writes out what
//! comes back, so every branch is testable without a socket.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use protocol_codec::auth::{self, AuthError, ScramReply, ScramServer};
use protocol_codec::client_settings::ClientSettings;
use protocol_codec::messages::{
    parse_password, parse_sasl_initial_response, parse_sasl_response, ReplicationMode,
};
use protocol_codec::{
    AuthRequest, BackendMessage, CodecError, ErrorFields, FrontendMessage, SqlState, StartupPacket,
};

use crate::hba::{AuthMethod, EncryptionWords, HbaDecision, HbaRules};

/// What authentication needs to know about the node; shared, and replaced whole on reload.
#[derive(Clone, Debug, Default)]
pub struct AuthSettings {
    pub hba: HbaRules,
    /// User name to stored secret: a SCRAM verifier, an md5 verifier or a plain password.
    pub users: std::collections::BTreeMap<String, String>,
    /// Whether this server can answer SSLRequest with 'S'.
    pub tls_available: bool,
}

/// Who the client turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIdentity {
    pub user: String,
    pub application_name: String,
    pub tls: bool,
    /// The configuration parameters the client set in its startup packet.
    pub settings: ClientSettings,
}

/// What the driver must do next.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Answer an SSLRequest with this byte; after `b'S'` start the TLS handshake, then read a
    /// new startup packet through it.
    SslAnswer(u8),
    /// Send these messages and read the next client message.
    Send(Vec<BackendMessage>),
    /// Authentication succeeded: send these messages (the end of the exchange, including
    /// AuthenticationOk) and proceed to greet the client.
    Authenticated(Vec<BackendMessage>, ClientIdentity),
    /// Send this FATAL and close.
    Fatal(ErrorFields),
    /// Authentication succeeded but the client's parameters are refused: send these messages
    /// (the end of the exchange, including AuthenticationOk), then the FATAL, and close, as
    /// PostgreSQL reads a client's parameters only once it has authenticated it.
    Refused(Vec<BackendMessage>, ErrorFields),
    /// Close without a word (a CancelRequest, which walserver does not act on).
    Close,
}

enum State {
    /// Waiting for SSLRequest, GSSENCRequest, CancelRequest or StartupMessage.
    Startup,
    AwaitPassword {
        method: AuthMethod,
        stored: Option<String>,
        salt: [u8; 4],
    },
    AwaitSaslInitial(Box<ScramServer>),
    AwaitSaslResponse(Box<ScramServer>),
    Done,
}

/// One connection's startup phase.
pub struct Handshake {
    settings: Arc<AuthSettings>,
    peer: IpAddr,
    tls: bool,
    ssl_requested: bool,
    /// The tls-server-end-point data of the certificate TLS presented, when SCRAM-SHA-256-PLUS
    /// is offered on this connection.
    channel_binding: Option<Vec<u8>>,
    state: State,
    identity: Option<ClientIdentity>,
    /// Why the client's parameters are refused, told once it has authenticated.
    settings_refused: Option<ErrorFields>,
    /// A NegotiateProtocolVersion to send before the authentication request.
    negotiation: Option<BackendMessage>,
}

impl Handshake {
    pub fn new(settings: Arc<AuthSettings>, peer: IpAddr) -> Handshake {
        Handshake {
            settings,
            peer,
            tls: false,
            ssl_requested: false,
            channel_binding: None,
            state: State::Startup,
            identity: None,
            settings_refused: None,
            negotiation: None,
        }
    }

    /// Whether the startup packet has been read, i.e. the client speaks the protocol and can
    /// be sent an ErrorResponse it will understand.
    pub fn startup_received(&self) -> bool {
        self.identity.is_some()
    }

    /// The user named in the startup packet, once known.
    pub fn user(&self) -> Option<&str> {
        self.identity.as_ref().map(|i| i.user.as_str())
    }

    /// Tells the machine that TLS is now up (after answering 'S'), with the tls-server-end-point
    /// data of the certificate it presented if SCRAM-SHA-256-PLUS is to be offered.
    pub fn tls_started(&mut self, channel_binding: Option<Vec<u8>>) {
        self.tls = true;
        self.channel_binding = channel_binding;
    }

    pub fn on_packet(&mut self, packet: StartupPacket) -> Step {
        if !matches!(self.state, State::Startup) {
            return Step::Fatal(ErrorFields::fatal(
                SqlState::PROTOCOL_VIOLATION,
                "unexpected startup packet",
            ));
        }
        match packet {
            StartupPacket::SslRequest => {
                if self.ssl_requested || self.tls {
                    // PostgreSQL reads a second one as a StartupMessage of protocol
                    // 1234.5679 (the request's code) and refuses that version.
                    let e = CodecError::UnsupportedProtocol {
                        major: 1234,
                        minor: 5679,
                    };
                    return Step::Fatal(ErrorFields::fatal(e.sqlstate(), e.to_string()));
                }
                self.ssl_requested = true;
                Step::SslAnswer(if self.settings.tls_available {
                    b'S'
                } else {
                    b'N'
                })
            }
            StartupPacket::GssEncRequest => Step::SslAnswer(b'N'),
            StartupPacket::CancelRequest { .. } => Step::Close,
            startup @ StartupPacket::Startup { .. } => self.on_startup(startup),
        }
    }

    fn on_startup(&mut self, startup: StartupPacket) -> Step {
        match startup.protocol_negotiation() {
            Ok(n) => self.negotiation = n,
            Err(e) => {
                return Step::Fatal(ErrorFields::fatal(
                    SqlState::PROTOCOL_VIOLATION,
                    e.to_string(),
                ))
            }
        }
        let Some(user) = startup.user().filter(|u| !u.is_empty()) else {
            return Step::Fatal(ErrorFields::fatal(
                SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                "no PostgreSQL user name specified in startup packet",
            ));
        };
        // Read now, refused (if at all) after authentication, as PostgreSQL does.
        let settings = match &startup {
            StartupPacket::Startup { params, .. } => ClientSettings::from_startup(params),
            _ => Ok(ClientSettings::default()),
        };
        let (settings, refusal) = match settings {
            Ok(s) => (s, None),
            Err(e) => (ClientSettings::default(), Some(e)),
        };
        self.settings_refused = refusal;
        let identity = ClientIdentity {
            user: user.to_string(),
            application_name: settings.get("application_name").unwrap_or("").to_string(),
            tls: self.tls,
            settings,
        };
        self.identity = Some(identity);
        match startup.replication() {
            Ok(ReplicationMode::Physical) => {}
            Ok(ReplicationMode::Logical) => {
                return Step::Fatal(ErrorFields::fatal(
                    SqlState::FEATURE_NOT_SUPPORTED,
                    "logical replication is not supported by walserver",
                ))
            }
            Ok(ReplicationMode::Off) => {
                return Step::Fatal(
                    ErrorFields::fatal(
                        SqlState::FEATURE_NOT_SUPPORTED,
                        "walserver accepts only physical replication connections",
                    )
                    .hint("Connect with replication=true."),
                )
            }
            Err(e) => {
                return Step::Fatal(
                    ErrorFields::fatal(e.sqlstate(), e.to_string())
                        .hint(CodecError::REPLICATION_VALUES),
                )
            }
        }
        let enc = EncryptionWords(self.tls);
        let method = match self.settings.hba.check(self.peer, user, self.tls) {
            HbaDecision::Allow(m) => m,
            HbaDecision::Rejected { rule } => {
                // The log names the rule, as PostgreSQL's does ("Connection matched pg_hba.conf
                // line N"); the client learns only that the rules refused it.
                let rule_text = self
                    .settings
                    .hba
                    .rule(rule)
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default();
                tracing::info!(
                    "connection refused: hba rule {rule}{rule_text} rejects user \"{user}\" from {} ({enc})",
                    self.peer
                );
                return Step::Fatal(ErrorFields::fatal(
                    SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                    format!(
                        "walserver's hba rules reject replication connection for host \"{}\", user \"{user}\", {enc}",
                        self.peer
                    ),
                ));
            }
            HbaDecision::NoEntry => {
                let rules = if self.settings.hba.is_builtin() {
                    "no hba rule is configured and the built-in rules trust only loopback"
                } else {
                    "no hba rule matches"
                };
                tracing::info!(
                    "connection refused: {rules}: user \"{user}\" from {} ({enc})",
                    self.peer
                );
                return Step::Fatal(
                    ErrorFields::fatal(
                        SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                        format!(
                            "no walserver hba rule for replication connection from host \"{}\", user \"{user}\", {enc}",
                            self.peer
                        ),
                    )
                    .hint("walserver's hba rules are the [[hba]] tables of its configuration."),
                );
            }
        };
        let stored = self.settings.users.get(user).cloned();
        let is_scram = stored
            .as_deref()
            .is_some_and(|s| s.starts_with("SCRAM-SHA-256$"));
        let mut out: Vec<BackendMessage> = self.negotiation.take().into_iter().collect();
        match method {
            AuthMethod::Trust => return self.succeed(out),
            AuthMethod::Reject => unreachable!("HbaRules::check reports reject rules as Rejected"),
            // PostgreSQL answers an md5 rule with SCRAM when the stored secret is a SCRAM
            // verifier, since md5 cannot be checked against it.
            AuthMethod::ScramSha256 | AuthMethod::Md5
                if is_scram || method == AuthMethod::ScramSha256 =>
            {
                let mut server = match stored.as_deref().filter(|_| is_scram) {
                    Some(v) => match ScramServer::new(v, user) {
                        Ok(s) => s,
                        Err(e) => return self.auth_failed(e),
                    },
                    // Unknown users and non-SCRAM secrets get an exchange that looks real and
                    // fails at the proof, so a client cannot learn which roles exist.
                    None => ScramServer::for_unknown_user(user),
                };
                if let Some(end_point) = self.channel_binding.clone() {
                    server = server.with_channel_binding(end_point);
                }
                out.push(BackendMessage::Authentication(server.offer()));
                self.state = State::AwaitSaslInitial(Box::new(server));
            }
            AuthMethod::Md5 => {
                let salt = auth::random_md5_salt();
                out.push(BackendMessage::Authentication(AuthRequest::Md5Password {
                    salt,
                }));
                self.state = State::AwaitPassword {
                    method,
                    stored,
                    salt,
                };
            }
            AuthMethod::Password => {
                out.push(BackendMessage::Authentication(
                    AuthRequest::CleartextPassword,
                ));
                self.state = State::AwaitPassword {
                    method,
                    stored,
                    salt: [0; 4],
                };
            }
            AuthMethod::ScramSha256 => unreachable!("handled by the SCRAM arm above"),
        }
        Step::Send(out)
    }

    /// A message from the client during authentication: a PasswordMessage (a password or a
    /// SASL message, by the state), anything else is refused as PostgreSQL refuses it.
    pub fn on_message(&mut self, msg: FrontendMessage) -> Step {
        let body = match msg {
            FrontendMessage::PasswordMessage(b) => b,
            other => return self.on_unexpected_message(other.tag()),
        };
        match std::mem::replace(&mut self.state, State::Done) {
            State::AwaitPassword {
                method,
                stored,
                salt,
            } => self.on_password(method, stored, salt, &body),
            State::AwaitSaslInitial(mut server) => {
                let (mechanism, data) = match parse_sasl_initial_response(&body) {
                    Ok(x) => x,
                    Err(e) => return self.auth_failed(AuthError::Codec(e)),
                };
                let reply = server.handle_initial_response(&mechanism, data.as_deref());
                self.on_scram_reply(server, reply)
            }
            State::AwaitSaslResponse(mut server) => {
                let data = match parse_sasl_response(&body) {
                    Ok(d) => d,
                    Err(e) => return self.auth_failed(AuthError::Codec(e)),
                };
                let reply = server.handle_response(&data);
                self.on_scram_reply(server, reply)
            }
            State::Startup | State::Done => Step::Fatal(ErrorFields::fatal(
                SqlState::PROTOCOL_VIOLATION,
                "unexpected password message",
            )),
        }
    }

    /// A message of type `tag` where a password or SASL message belongs (a Terminate
    /// included): PostgreSQL's FATAL naming the type's byte in decimal.
    pub fn on_unexpected_message(&mut self, tag: u8) -> Step {
        let expected = match self.state {
            State::AwaitSaslInitial(_) | State::AwaitSaslResponse(_) => "SASL",
            _ => "password",
        };
        self.state = State::Done;
        Step::Fatal(ErrorFields::fatal(
            SqlState::PROTOCOL_VIOLATION,
            format!("expected {expected} response, got message type {tag}"),
        ))
    }

    fn on_scram_reply(
        &mut self,
        server: Box<ScramServer>,
        reply: Result<ScramReply, AuthError>,
    ) -> Step {
        match reply {
            Ok(ScramReply::Continue(data)) => {
                self.state = State::AwaitSaslResponse(server);
                Step::Send(vec![BackendMessage::Authentication(
                    AuthRequest::SaslContinue(Bytes::from(data)),
                )])
            }
            Ok(ScramReply::Final(data)) => self.succeed(vec![BackendMessage::Authentication(
                AuthRequest::SaslFinal(Bytes::from(data)),
            )]),
            Err(e) => self.auth_failed(e),
        }
    }

    fn on_password(
        &mut self,
        method: AuthMethod,
        stored: Option<String>,
        salt: [u8; 4],
        body: &Bytes,
    ) -> Step {
        let user = self.user().unwrap_or_default().to_string();
        let password = match parse_password(body) {
            Ok(p) => p,
            Err(_) => return self.auth_failed(AuthError::InvalidPasswordPacket),
        };
        if password.is_empty() {
            // PostgreSQL refuses an empty password outright.
            return self.auth_failed(AuthError::EmptyPassword);
        }
        let result = match (&stored, method) {
            (None, _) => Err(AuthError::PasswordFailed {
                user: user.clone(),
                reason: format!("Role \"{user}\" does not exist or has no password."),
            }),
            (Some(s), AuthMethod::Md5) => auth::verify_md5(s, &user, salt, &password),
            (Some(s), _) => auth::verify_cleartext(s, &user, &password),
        };
        match result {
            Ok(()) => self.succeed(Vec::new()),
            Err(e) => self.auth_failed(e),
        }
    }

    fn succeed(&mut self, mut out: Vec<BackendMessage>) -> Step {
        self.state = State::Done;
        out.push(BackendMessage::Authentication(AuthRequest::Ok));
        let mut identity = self
            .identity
            .clone()
            .expect("identity is set before authentication");
        identity.tls = self.tls;
        if let Some(refusal) = self.settings_refused.take() {
            tracing::info!(user = %identity.user, peer = %self.peer, "connection refused: {}", refusal.message().unwrap_or_default());
            return Step::Refused(out, refusal);
        }
        Step::Authenticated(out, identity)
    }

    fn auth_failed(&mut self, e: AuthError) -> Step {
        self.state = State::Done;
        let user = self.user().unwrap_or_default().to_string();
        tracing::info!(%user, peer = %self.peer, "authentication failed: {e}");
        Step::Fatal(e.to_error_fields(&user))
    }
}

/// The ParameterStatus set PostgreSQL 15 sends after AuthenticationOk on a replication
/// connection, in its order, then BackendKeyData and ReadyForQuery. `in_hot_standby` and
/// `read_only` are the node's role now (`WalSenderSettings`). A parameter the client set
/// itself is reported as it set it, in PostgreSQL's form (`ClientSettings` keeps it so), as
/// PostgreSQL reports it; the others have the values of a PostgreSQL 15 walsender for physical
/// replication, which is connected to no database and so has the encoding `SQL_ASCII`.
pub fn greeting(
    identity: &ClientIdentity,
    server_version: &str,
    in_hot_standby: bool,
    read_only: bool,
    pid: i32,
    key: i32,
) -> Vec<BackendMessage> {
    let p = |name: &str, value: &str| BackendMessage::ParameterStatus {
        name: name.to_string(),
        value: value.to_string(),
    };
    let client =
        |name: &str, default: &'static str| p(name, identity.settings.get(name).unwrap_or(default));
    vec![
        p("application_name", &identity.application_name),
        client("client_encoding", "SQL_ASCII"),
        client("DateStyle", "ISO, MDY"),
        client("default_transaction_read_only", on_off(read_only)),
        p("in_hot_standby", on_off(in_hot_standby)),
        p("integer_datetimes", "on"),
        client("IntervalStyle", "postgres"),
        p("is_superuser", "on"),
        p("server_encoding", "SQL_ASCII"),
        p("server_version", server_version),
        p("session_authorization", &identity.user),
        client("standard_conforming_strings", "on"),
        client("TimeZone", "Etc/UTC"),
        BackendMessage::BackendKeyData { pid, key },
        BackendMessage::ReadyForQuery(protocol_codec::messages::TransactionStatus::Idle),
    ]
}

/// A boolean setting as PostgreSQL shows it.
pub(crate) fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hba::{ConnectionType, HbaRuleSettings};
    use protocol_codec::auth::{make_md5_verifier, make_scram_verifier, ClientAuthenticator};

    fn settings(method: AuthMethod, users: &[(&str, String)]) -> Arc<AuthSettings> {
        let hba = HbaRules::from_settings(&[HbaRuleSettings {
            conn_type: ConnectionType::Host,
            address: "all".into(),
            user: "all".into(),
            method,
        }])
        .unwrap();
        Arc::new(AuthSettings {
            hba,
            users: users
                .iter()
                .map(|(u, s)| (u.to_string(), s.clone()))
                .collect(),
            tls_available: false,
        })
    }

    fn startup(user: &str, replication: &str) -> StartupPacket {
        StartupPacket::startup([
            ("user", user),
            ("replication", replication),
            ("application_name", "t"),
        ])
    }

    fn localhost() -> IpAddr {
        "127.0.0.1".parse().unwrap()
    }

    /// Runs a whole exchange with postgres-protocol's client logic on the other side.
    fn run(settings: Arc<AuthSettings>, user: &str, password: Option<&str>) -> Step {
        let mut hs = Handshake::new(settings, localhost());
        let mut client = ClientAuthenticator::new(
            user,
            password,
            protocol_codec::auth::ChannelBindingMode::NoTls,
        );
        let mut step = hs.on_packet(startup(user, "true"));
        loop {
            let msgs = match step {
                Step::Send(m) => m,
                other => return other,
            };
            let mut reply = None;
            for m in msgs {
                if let BackendMessage::Authentication(req) = m {
                    match client.step(&req) {
                        Ok(r) => reply = r,
                        Err(e) => panic!("client refused: {e}"),
                    }
                }
            }
            let reply = reply.expect("the client has something to say");
            // Encode and decode as the server codec would, so 'p' messages look as on the wire.
            let mut buf = bytes::BytesMut::new();
            reply.encode(&mut buf).unwrap();
            let decoded = tokio_util::codec::Decoder::decode(
                &mut protocol_codec::ServerCodec::new(),
                &mut buf,
            )
            .unwrap()
            .unwrap();
            step = hs.on_message(decoded);
        }
    }

    fn fatal_code(step: &Step) -> &str {
        match step {
            Step::Fatal(f) => f.get(ErrorFields::CODE).unwrap_or(""),
            other => panic!("expected FATAL, got {other:?}"),
        }
    }

    /// A client's parameters are refused only once it has authenticated, as PostgreSQL
    /// refuses them: a wrong password is told first, and a right one gets AuthenticationOk
    /// before the FATAL.
    #[test]
    fn client_parameters_are_refused_after_authentication() {
        let with_options = |options: &str| {
            StartupPacket::startup([
                ("user", "repl"),
                ("replication", "true"),
                ("options", options),
            ])
        };
        let mut hs = Handshake::new(settings(AuthMethod::Trust, &[]), localhost());
        let Step::Refused(msgs, f) = hs.on_packet(with_options("-c nosuch=1")) else {
            panic!("not refused")
        };
        assert_eq!(msgs, vec![BackendMessage::Authentication(AuthRequest::Ok)]);
        assert_eq!(
            f.code().map(|c| c.as_str().to_string()),
            Some("42704".into())
        );

        let s = settings(AuthMethod::Password, &[("repl", make_scram_verifier("pw"))]);
        let mut hs = Handshake::new(s, localhost());
        assert!(matches!(
            hs.on_packet(with_options("-c nosuch=1")),
            Step::Send(_)
        ));
        let wrong = hs.on_message(FrontendMessage::PasswordMessage(Bytes::from_static(
            b"bad\0",
        )));
        assert_eq!(fatal_code(&wrong), "28P01");

        let mut hs = Handshake::new(settings(AuthMethod::Trust, &[]), localhost());
        let Step::Authenticated(_, id) = hs.on_packet(with_options(
            "-c wal_sender_timeout=2s -c application_name=a",
        )) else {
            panic!("refused")
        };
        assert_eq!(
            id.settings.wal_sender_timeout,
            Some(std::time::Duration::from_secs(2))
        );
        assert_eq!(id.application_name, "a");
    }

    #[test]
    fn trust_succeeds_at_once() {
        let step = run(settings(AuthMethod::Trust, &[]), "u", None);
        let Step::Authenticated(msgs, id) = step else {
            panic!("{step:?}")
        };
        assert_eq!(msgs, vec![BackendMessage::Authentication(AuthRequest::Ok)]);
        assert_eq!(id.user, "u");
        assert_eq!(id.application_name, "t");
    }

    #[test]
    fn scram_right_and_wrong_password() {
        let s = settings(
            AuthMethod::ScramSha256,
            &[("repl", make_scram_verifier("secret"))],
        );
        assert!(matches!(
            run(s.clone(), "repl", Some("secret")),
            Step::Authenticated(..)
        ));
        let wrong = run(s.clone(), "repl", Some("nope"));
        assert_eq!(fatal_code(&wrong), "28P01");
        let Step::Fatal(f) = wrong else {
            unreachable!()
        };
        assert_eq!(
            f.message(),
            Some("password authentication failed for user \"repl\"")
        );
        // An unknown user fails the same way, at the proof.
        assert_eq!(fatal_code(&run(s, "ghost", Some("secret"))), "28P01");
    }

    #[test]
    fn md5_rule_with_scram_secret_uses_scram() {
        let s = settings(AuthMethod::Md5, &[("repl", make_scram_verifier("secret"))]);
        assert!(matches!(
            run(s, "repl", Some("secret")),
            Step::Authenticated(..)
        ));
    }

    #[test]
    fn md5_with_md5_secret() {
        let s = settings(
            AuthMethod::Md5,
            &[("repl", make_md5_verifier("repl", "pw"))],
        );
        assert!(matches!(
            run(s.clone(), "repl", Some("pw")),
            Step::Authenticated(..)
        ));
        assert_eq!(fatal_code(&run(s, "repl", Some("bad"))), "28P01");
    }

    #[test]
    fn cleartext_password() {
        let s = settings(AuthMethod::Password, &[("repl", make_scram_verifier("pw"))]);
        assert!(matches!(
            run(s.clone(), "repl", Some("pw")),
            Step::Authenticated(..)
        ));
        assert_eq!(fatal_code(&run(s, "repl", Some("bad"))), "28P01");
    }

    #[test]
    fn hba_refusals_name_walservers_rules_in_postgres_wording() {
        let s = Arc::new(AuthSettings::default());
        let mut hs = Handshake::new(s, "10.1.2.3".parse().unwrap());
        let step = hs.on_packet(startup("u", "true"));
        assert_eq!(fatal_code(&step), "28000");
        let Step::Fatal(f) = step else { unreachable!() };
        assert_eq!(
            f.message(),
            Some("no walserver hba rule for replication connection from host \"10.1.2.3\", user \"u\", no encryption")
        );
        let mut hs = Handshake::new(settings(AuthMethod::Reject, &[]), localhost());
        let Step::Fatal(f) = hs.on_packet(startup("u", "1")) else {
            panic!()
        };
        assert!(f
            .message()
            .unwrap()
            .starts_with("walserver's hba rules reject replication connection"));
    }

    #[test]
    fn non_replication_and_logical_are_refused() {
        let s = settings(AuthMethod::Trust, &[]);
        assert_eq!(
            fatal_code(&Handshake::new(s.clone(), localhost()).on_packet(startup("u", "false"))),
            "0A000"
        );
        assert_eq!(
            fatal_code(&Handshake::new(s.clone(), localhost()).on_packet(startup("u", "database"))),
            "0A000"
        );
        assert_eq!(
            fatal_code(&Handshake::new(s.clone(), localhost()).on_packet(startup("u", "maybe"))),
            "22023"
        );
        let no_user = StartupPacket::startup([("replication", "true")]);
        assert_eq!(
            fatal_code(&Handshake::new(s, localhost()).on_packet(no_user)),
            "28000"
        );
    }

    #[test]
    fn ssl_request_answers() {
        let s = settings(AuthMethod::Trust, &[]);
        let mut hs = Handshake::new(s, localhost());
        assert_eq!(
            hs.on_packet(StartupPacket::SslRequest),
            Step::SslAnswer(b'N')
        );
        // A second SSLRequest is refused as PostgreSQL 15 refuses it: 0A000.
        assert_eq!(
            fatal_code(&hs.on_packet(StartupPacket::SslRequest)),
            "0A000"
        );
        let tls = Arc::new(AuthSettings {
            tls_available: true,
            ..AuthSettings::default()
        });
        let mut hs = Handshake::new(tls, localhost());
        assert_eq!(
            hs.on_packet(StartupPacket::SslRequest),
            Step::SslAnswer(b'S')
        );
        hs.tls_started(None);
        let Step::Authenticated(_, id) = hs.on_packet(startup("u", "true")) else {
            panic!()
        };
        assert!(id.tls);
        assert_eq!(
            Handshake::new(Arc::new(AuthSettings::default()), localhost())
                .on_packet(StartupPacket::GssEncRequest),
            Step::SslAnswer(b'N')
        );
    }

    #[test]
    fn newer_minor_version_is_negotiated() {
        let mut hs = Handshake::new(settings(AuthMethod::Trust, &[]), localhost());
        let packet = StartupPacket::Startup {
            protocol: (3, 1),
            params: vec![
                ("user".into(), "u".into()),
                ("replication".into(), "true".into()),
                ("_pq_.x".into(), "1".into()),
            ],
        };
        let Step::Authenticated(msgs, _) = hs.on_packet(packet) else {
            panic!()
        };
        assert_eq!(
            msgs[0],
            BackendMessage::NegotiateProtocolVersion {
                newest_minor: 0,
                unrecognized: vec!["_pq_.x".into()]
            }
        );
        assert_eq!(msgs[1], BackendMessage::Authentication(AuthRequest::Ok));
    }

    #[test]
    fn messages_out_of_turn_are_protocol_violations() {
        let s = settings(
            AuthMethod::ScramSha256,
            &[("repl", make_scram_verifier("secret"))],
        );
        let mut hs = Handshake::new(s, localhost());
        assert!(matches!(
            hs.on_packet(startup("repl", "true")),
            Step::Send(_)
        ));
        assert_eq!(
            fatal_code(&hs.on_message(FrontendMessage::Query("IDENTIFY_SYSTEM".into()))),
            "08P01"
        );
        let mut hs = Handshake::new(settings(AuthMethod::Trust, &[]), localhost());
        assert_eq!(
            fatal_code(
                &hs.on_message(FrontendMessage::PasswordMessage(Bytes::from_static(b"x\0")))
            ),
            "08P01"
        );
    }

    #[test]
    fn garbage_sasl_is_a_clean_failure() {
        let s = settings(
            AuthMethod::ScramSha256,
            &[("repl", make_scram_verifier("secret"))],
        );
        let mut hs = Handshake::new(s, localhost());
        hs.on_packet(startup("repl", "true"));
        let step = hs.on_message(FrontendMessage::PasswordMessage(Bytes::from_static(
            b"\xff\xff",
        )));
        assert!(matches!(step, Step::Fatal(_)), "{step:?}");
    }

    #[test]
    fn other_messages_during_authentication_are_refused_by_their_type() {
        let text = |step: &Step| match step {
            Step::Fatal(f) => format!("{} {}", fatal_code(step), f.message().unwrap_or("")),
            other => panic!("expected FATAL, got {other:?}"),
        };
        let scram = settings(
            AuthMethod::ScramSha256,
            &[("repl", make_scram_verifier("secret"))],
        );
        let mut hs = Handshake::new(scram, localhost());
        hs.on_packet(startup("repl", "true"));
        assert_eq!(
            text(&hs.on_message(FrontendMessage::Terminate)),
            "08P01 expected SASL response, got message type 88"
        );
        let md5 = settings(
            AuthMethod::Md5,
            &[("repl", make_md5_verifier("repl", "pw"))],
        );
        let mut hs = Handshake::new(md5.clone(), localhost());
        hs.on_packet(startup("repl", "true"));
        assert_eq!(
            text(&hs.on_message(FrontendMessage::Query("SHOW x".into()))),
            "08P01 expected password response, got message type 81"
        );
        let mut hs = Handshake::new(md5.clone(), localhost());
        hs.on_packet(startup("repl", "true"));
        assert_eq!(
            text(&hs.on_unexpected_message(b'z')),
            "08P01 expected password response, got message type 122"
        );
        let mut hs = Handshake::new(md5.clone(), localhost());
        hs.on_packet(startup("repl", "true"));
        assert_eq!(
            text(&hs.on_message(FrontendMessage::password(""))),
            "28P01 empty password returned by client"
        );
        let mut hs = Handshake::new(md5, localhost());
        hs.on_packet(startup("repl", "true"));
        assert_eq!(
            text(
                &hs.on_message(FrontendMessage::PasswordMessage(Bytes::from_static(
                    b"pw\0x"
                )))
            ),
            "08P01 invalid password packet size"
        );
    }

    #[test]
    fn a_replication_value_that_is_no_boolean_gets_postgresqls_fatal_and_hint() {
        let mut hs = Handshake::new(settings(AuthMethod::Trust, &[]), localhost());
        let Step::Fatal(f) = hs.on_packet(startup("u", "maybe")) else {
            panic!("not refused")
        };
        assert_eq!(fatal_code(&Step::Fatal(f.clone())), "22023");
        assert_eq!(
            f.message(),
            Some("invalid value for parameter \"replication\": \"maybe\"")
        );
        assert_eq!(
            f.get(b'H'),
            Some("Valid values are: \"false\", 0, \"true\", 1, \"database\".")
        );
        // PostgreSQL's booleans are taken in any case and by prefix.
        let mut hs = Handshake::new(settings(AuthMethod::Trust, &[]), localhost());
        assert!(matches!(
            hs.on_packet(startup("u", "T")),
            Step::Authenticated(..)
        ));
    }
}
