//! The client's startup phase as a plain state machine, the mirror of the walsender's: SSL
//! negotiation, the startup packet, authentication (trust, cleartext, md5, SCRAM-SHA-256 and
//! SCRAM-SHA-256-PLUS through [`ClientAuthenticator`]), then the server's ParameterStatus and
//! BackendKeyData up to the first ReadyForQuery. No I/O here: a driver (the walreceiver's
//! async connect, the blocking `repl-client`) writes what [`Step`] says, reads what it asks
//! for, and starts TLS when told, so every rule below is tested without a socket.
//!
//! One attempt, as libpq runs it:
//! ```text
//! C: SSLRequest                       (only with Encryption::Tls)
//! S: 'S' → TLS handshake  |  'N' → plaintext, or the end if sslmode requires TLS
//! C: StartupMessage (user, then the caller's parameters)
//! S: R ... (authentication requests; C answers each)   phase: authenticating
//! S: R 0 (AuthenticationOk)
//! S: S* K? (ParameterStatus, BackendKeyData)             phase: authenticated
//! S: Z (ReadyForQuery)                                   done
//! ```
//! The order is checked: while authenticating only authentication requests,
//! NegotiateProtocolVersion, NoticeResponse and ErrorResponse may come; after
//! AuthenticationOk only ParameterStatus, BackendKeyData, NoticeResponse, ErrorResponse and
//! ReadyForQuery. Anything else is a protocol violation, as is a second AuthenticationOk or a
//! SCRAM exchange the server did not finish. An ErrorResponse ends the attempt with the
//! server's fields, so callers can tell a refused password (28P01) from a broken server.
//!
//! Which attempts to make for a libpq `sslmode` (allow's and prefer's second try on a new
//! connection) is [`first_attempt`] and [`next_attempt`]; making them is the driver's.

use bytes::{Bytes, BytesMut};

use crate::auth::{AuthError, ChannelBinding, ChannelBindingMode, ClientAuthenticator};
use crate::error::CodecError;
use crate::messages::{AuthRequest, BackendMessage, ErrorFields, FrontendMessage, StartupPacket};
use crate::tls::SslMode;

/// Whether an attempt begins with SSLRequest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encryption {
    Plain,
    Tls,
}

/// How an attempt failed, as far as the choice of a next attempt cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptFailure {
    /// The server answered with an ErrorResponse (for example, no hba entry for plaintext).
    ServerError,
    /// The TLS handshake (or the server name for it) failed.
    Tls,
    /// Anything else: the connection, the protocol, our side of authentication.
    Other,
}

/// The first attempt for `mode`: TLS first, except for `disable` and `allow`.
pub fn first_attempt(mode: SslMode) -> Encryption {
    if mode.tries_tls_first() {
        Encryption::Tls
    } else {
        Encryption::Plain
    }
}

/// The attempt to make after one with `tried` failed with `failure`, if any: `allow` retries
/// with TLS when the server refused plaintext with an error, `prefer` retries in plaintext
/// when the TLS handshake failed (a server's `'N'` needs no new attempt: plaintext goes on
/// over the same connection). Every other mode makes one attempt.
pub fn next_attempt(
    mode: SslMode,
    tried: Encryption,
    failure: AttemptFailure,
) -> Option<Encryption> {
    match (mode, tried, failure) {
        (SslMode::Allow, Encryption::Plain, AttemptFailure::ServerError) => Some(Encryption::Tls),
        (SslMode::Prefer, Encryption::Tls, AttemptFailure::Tls) => Some(Encryption::Plain),
        _ => None,
    }
}

/// What one attempt sends and with what it authenticates.
#[derive(Clone, Debug)]
pub struct StartupConfig {
    /// The role, sent as the startup packet's first parameter `user`.
    pub user: String,
    pub password: Option<String>,
    /// The startup parameters after `user`, in order (`database`, `replication`,
    /// `application_name`, `options`, ...).
    pub params: Vec<(String, String)>,
    /// Decides what a server's `'N'` means: the end of the attempt when it requires TLS,
    /// plaintext otherwise.
    pub sslmode: SslMode,
    /// Whether SCRAM binds to the server's certificate (libpq's `channel_binding`).
    pub channel_binding: ChannelBinding,
}

impl StartupConfig {
    /// A physical replication connection (`replication=true`) as `user`, with
    /// `application_name`.
    pub fn replication(user: &str, password: Option<&str>, application_name: &str) -> Self {
        StartupConfig {
            user: user.to_string(),
            password: password.map(str::to_string),
            params: vec![
                ("replication".to_string(), "true".to_string()),
                ("application_name".to_string(), application_name.to_string()),
            ],
            sslmode: SslMode::Disable,
            channel_binding: ChannelBinding::Prefer,
        }
    }

    /// Adds a startup parameter after the ones already there.
    pub fn param(mut self, name: &str, value: &str) -> Self {
        self.params.push((name.to_string(), value.to_string()));
        self
    }
}

/// What the driver must do next.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Write `send` (SSLRequest), then read exactly one byte, the answer, for
    /// [`ClientHandshake::on_ssl_answer`]. Reading more would take bytes a man in the middle
    /// sent in plaintext before the TLS handshake as if they had come through it
    /// (CVE-2021-23214's client side).
    ReadSslAnswer { send: Bytes },
    /// Write `send` (if not empty), then read the next message for
    /// [`ClientHandshake::on_message`].
    ReadMessage { send: Bytes },
    /// The server said `'S'`: run the TLS handshake now, then call
    /// [`ClientHandshake::tls_started`].
    StartTls,
    /// ReadyForQuery: the connection is authenticated and idle.
    Ready(Established),
}

/// What the startup phase learnt about the connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Established {
    /// The ParameterStatus values, in the order the server sent them.
    pub params: Vec<(String, String)>,
    /// BackendKeyData: the backend's process id and its cancel key.
    pub backend_key: Option<(i32, i32)>,
    /// The SASL mechanism chosen, if SCRAM was used.
    pub mechanism: Option<String>,
    /// Whether TLS was started.
    pub tls: bool,
    /// The NoticeResponses received on the way.
    pub notices: Vec<ErrorFields>,
}

impl Established {
    /// The last value the server reported for parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why an attempt ended without a connection.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The server's ErrorResponse (a refused login, too many connections, ...).
    #[error("{0}")]
    Server(ErrorFields),
    /// The server answered `'N'` and `sslmode` requires TLS.
    #[error("server does not support SSL, but SSL was required (sslmode={0})")]
    SslRequired(SslMode),
    /// The answer to SSLRequest was neither `'S'` nor `'N'` (PostgreSQL before 9.x could
    /// send an ErrorResponse here).
    #[error("received invalid response to SSL negotiation: {:?}", char::from(*.0))]
    InvalidSslAnswer(u8),
    /// A message out of order, or a call out of order by the driver.
    #[error("{0}")]
    Protocol(String),
    /// Our side of authentication failed: no password, no common mechanism, a server that
    /// could not prove it knows the password.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A message could not be encoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

impl StartupError {
    /// The server's error fields, when the server ended the attempt.
    pub fn server_error(&self) -> Option<&ErrorFields> {
        match self {
            StartupError::Server(f) => Some(f),
            _ => None,
        }
    }

    /// The kind of failure [`next_attempt`] looks at.
    pub fn failure(&self) -> AttemptFailure {
        match self {
            StartupError::Server(_) => AttemptFailure::ServerError,
            StartupError::SslRequired(_) => AttemptFailure::Tls,
            _ => AttemptFailure::Other,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    /// `start` not yet called.
    New,
    /// SSLRequest sent, its answer awaited.
    SslAnswer,
    /// `'S'` received; the TLS handshake is the driver's.
    Tls,
    /// Startup packet sent; authentication requests until AuthenticationOk.
    Authenticating,
    /// After AuthenticationOk, until ReadyForQuery.
    Authenticated,
    /// ReadyForQuery or an error ended the attempt.
    Done,
}

/// One connection attempt's startup phase, client side.
pub struct ClientHandshake {
    config: StartupConfig,
    encryption: Encryption,
    phase: Phase,
    auth: Option<ClientAuthenticator>,
    established: Established,
}

impl ClientHandshake {
    pub fn new(config: StartupConfig, encryption: Encryption) -> ClientHandshake {
        ClientHandshake {
            config,
            encryption,
            phase: Phase::New,
            auth: None,
            established: Established::default(),
        }
    }

    /// The first bytes to send: SSLRequest, or the startup packet in plaintext.
    pub fn start(&mut self) -> Result<Step, StartupError> {
        if self.phase != Phase::New {
            return Err(self.misuse("start"));
        }
        match self.encryption {
            Encryption::Tls => {
                let mut out = BytesMut::new();
                StartupPacket::SslRequest.encode(&mut out)?;
                self.phase = Phase::SslAnswer;
                Ok(Step::ReadSslAnswer { send: out.freeze() })
            }
            Encryption::Plain => self.send_startup(ChannelBindingMode::NoTls),
        }
    }

    /// The server's one-byte answer to SSLRequest.
    pub fn on_ssl_answer(&mut self, answer: u8) -> Result<Step, StartupError> {
        if self.phase != Phase::SslAnswer {
            return Err(self.misuse("on_ssl_answer"));
        }
        match answer {
            b'S' => {
                self.phase = Phase::Tls;
                Ok(Step::StartTls)
            }
            b'N' if self.config.sslmode.requires_tls() => {
                self.phase = Phase::Done;
                Err(StartupError::SslRequired(self.config.sslmode))
            }
            b'N' => self.send_startup(ChannelBindingMode::NoTls),
            other => {
                self.phase = Phase::Done;
                Err(StartupError::InvalidSslAnswer(other))
            }
        }
    }

    /// TLS is up; `binding` is what SCRAM may bind to: the server certificate's
    /// tls-server-end-point hash if the driver has it, else
    /// [`ChannelBindingMode::TlsWithoutBinding`]. Returns the startup packet to send through
    /// TLS.
    pub fn tls_started(&mut self, binding: ChannelBindingMode) -> Result<Step, StartupError> {
        if self.phase != Phase::Tls {
            return Err(self.misuse("tls_started"));
        }
        self.established.tls = true;
        self.send_startup(binding)
    }

    fn send_startup(&mut self, binding: ChannelBindingMode) -> Result<Step, StartupError> {
        let c = &self.config;
        let params = std::iter::once(("user".to_string(), c.user.clone()))
            .chain(c.params.iter().cloned())
            .collect::<Vec<_>>();
        let mut out = BytesMut::new();
        StartupPacket::startup(params).encode(&mut out)?;
        self.auth = Some(
            ClientAuthenticator::new(&c.user, c.password.as_deref(), binding)
                .channel_binding(c.channel_binding),
        );
        self.phase = Phase::Authenticating;
        Ok(Step::ReadMessage { send: out.freeze() })
    }

    /// One message from the server.
    pub fn on_message(&mut self, msg: BackendMessage) -> Result<Step, StartupError> {
        let result = self.message(msg);
        if result.is_err() {
            self.phase = Phase::Done;
        }
        result
    }

    fn message(&mut self, msg: BackendMessage) -> Result<Step, StartupError> {
        let nothing = || Ok(Step::ReadMessage { send: Bytes::new() });
        match (&self.phase, msg) {
            (Phase::Authenticating | Phase::Authenticated, BackendMessage::ErrorResponse(e)) => {
                Err(StartupError::Server(e))
            }
            (Phase::Authenticating | Phase::Authenticated, BackendMessage::NoticeResponse(n)) => {
                self.established.notices.push(n);
                nothing()
            }
            (Phase::Authenticating, BackendMessage::NegotiateProtocolVersion { .. }) => nothing(),
            (Phase::Authenticating, BackendMessage::Authentication(req)) => {
                let auth = self
                    .auth
                    .as_mut()
                    .expect("the authenticator is made with the startup packet");
                let reply = auth.step(&req)?;
                if req == AuthRequest::Ok {
                    self.phase = Phase::Authenticated;
                }
                let Some(reply) = reply else {
                    return nothing();
                };
                if let FrontendMessage::SaslInitialResponse { mechanism, .. } = &reply {
                    self.established.mechanism = Some(mechanism.clone());
                }
                let mut out = BytesMut::new();
                reply.encode(&mut out)?;
                Ok(Step::ReadMessage { send: out.freeze() })
            }
            (Phase::Authenticated, BackendMessage::Authentication(_)) => Err(
                StartupError::Protocol("authentication request after AuthenticationOk".into()),
            ),
            (Phase::Authenticated, BackendMessage::ParameterStatus { name, value }) => {
                self.established.params.push((name, value));
                nothing()
            }
            (Phase::Authenticated, BackendMessage::BackendKeyData { pid, key }) => {
                self.established.backend_key = Some((pid, key));
                nothing()
            }
            (Phase::Authenticated, BackendMessage::ReadyForQuery(_)) => {
                self.phase = Phase::Done;
                Ok(Step::Ready(std::mem::take(&mut self.established)))
            }
            (Phase::Authenticating, other) => Err(StartupError::Protocol(format!(
                "unexpected {} during connection startup, before AuthenticationOk",
                other.name()
            ))),
            (Phase::Authenticated, other) => Err(StartupError::Protocol(format!(
                "unexpected {} during connection startup",
                other.name()
            ))),
            (_, other) => Err(StartupError::Protocol(format!(
                "{} received before the startup packet was sent",
                other.name()
            ))),
        }
    }

    fn misuse(&self, call: &str) -> StartupError {
        StartupError::Protocol(format!(
            "ClientHandshake::{call} called in phase {:?}",
            self.phase
        ))
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
