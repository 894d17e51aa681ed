//! The client's side of authentication: [`ClientAuthenticator`] answers each request of a
//! server (cleartext, md5, SCRAM-SHA-256 with or without channel binding, as libpq's
//! `channel_binding` says), using postgres-protocol's SCRAM client, which checks the server's
//! signature.

use postgres_protocol::authentication::sasl::{ChannelBinding as SaslBinding, ScramSha256};

use super::failure::AuthError;
use super::password::md5_response;
use super::scram::{SCRAM_SHA_256, SCRAM_SHA_256_PLUS};
use crate::messages::{AuthRequest, FrontendMessage};

/// The client side of SCRAM-SHA-256, over postgres-protocol's implementation (which checks
/// the server's signature in the final message).
pub struct ScramClient {
    inner: ScramSha256,
}

impl ScramClient {
    /// Without channel binding. `tls` says whether the connection is encrypted: then the gs2
    /// header is `y,,` ("I could bind, but you did not offer it"), otherwise `n,,`.
    pub fn new(password: &str, tls: bool) -> ScramClient {
        let binding = if tls {
            SaslBinding::unrequested()
        } else {
            SaslBinding::unsupported()
        };
        ScramClient {
            inner: ScramSha256::new(password.as_bytes(), binding),
        }
    }

    /// For SCRAM-SHA-256-PLUS: gs2 header `p=tls-server-end-point,,` with the server
    /// certificate's hash ([`crate::tls::tls_server_end_point`]).
    pub fn with_channel_binding(password: &str, server_end_point: Vec<u8>) -> ScramClient {
        ScramClient {
            inner: ScramSha256::new(
                password.as_bytes(),
                SaslBinding::tls_server_end_point(server_end_point),
            ),
        }
    }

    /// Neither binding nor claiming to be able to: gs2 header `n,,`.
    fn without_binding(password: &str) -> ScramClient {
        ScramClient::new(password, false)
    }

    /// client-first-message, for SASLInitialResponse.
    pub fn client_first(&self) -> &[u8] {
        self.inner.message()
    }

    /// Takes server-first-message (SASLContinue), returns client-final-message.
    pub fn handle_server_first(&mut self, msg: &[u8]) -> Result<&[u8], AuthError> {
        self.inner
            .update(msg)
            .map_err(|e| AuthError::ServerScram(e.to_string()))?;
        Ok(self.inner.message())
    }

    /// Takes server-final-message (SASLFinal) and checks the server's signature.
    pub fn handle_server_final(&mut self, msg: &[u8]) -> Result<(), AuthError> {
        self.inner
            .finish(msg)
            .map_err(|e| AuthError::ServerScram(e.to_string()))
    }
}

/// What the connection allows for SCRAM channel binding, which decides the mechanism and
/// gs2 header the client uses (libpq's `channel_binding=prefer`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChannelBindingMode {
    /// A plaintext connection: SCRAM-SHA-256 with `n,,`.
    NoTls,
    /// TLS, but the server certificate's hash is not at hand: `y,,` if the server offers
    /// only SCRAM-SHA-256, and `n,,` if it also offers -PLUS (a server that can bind refuses
    /// `y,,` as a possible downgrade).
    TlsWithoutBinding,
    /// TLS with the server certificate's tls-server-end-point hash: SCRAM-SHA-256-PLUS when
    /// offered (PostgreSQL offers it on every TLS connection), else `y,,`.
    TlsServerEndPoint(Vec<u8>),
}

/// libpq's `channel_binding`: whether SCRAM binds to the server's certificate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChannelBinding {
    /// Never bind (gs2 header `n,,`).
    Disable,
    /// Bind when the connection is TLS and the server offers SCRAM-SHA-256-PLUS (the default).
    #[default]
    Prefer,
    /// Authenticate only with a bound SCRAM exchange: any other request, and an
    /// AuthenticationOk before one, ends the attempt, so that a server that does not hold
    /// the certificate's key (a man in the middle) cannot pass for the real one.
    Require,
}

impl ChannelBinding {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelBinding::Disable => "disable",
            ChannelBinding::Prefer => "prefer",
            ChannelBinding::Require => "require",
        }
    }
}

/// The client's side of authentication: give it each [`AuthRequest`] the server sends, send
/// what it returns.
pub struct ClientAuthenticator {
    user: String,
    password: Option<String>,
    binding: ChannelBindingMode,
    policy: ChannelBinding,
    scram: Option<ScramClient>,
    /// The SCRAM exchange in progress is SCRAM-SHA-256-PLUS.
    scram_bound: bool,
    scram_verified: bool,
}

impl ClientAuthenticator {
    pub fn new(
        user: &str,
        password: Option<&str>,
        binding: ChannelBindingMode,
    ) -> ClientAuthenticator {
        ClientAuthenticator {
            user: user.to_string(),
            password: password.map(str::to_string),
            binding,
            policy: ChannelBinding::Prefer,
            scram: None,
            scram_bound: false,
            scram_verified: false,
        }
    }

    /// Binds, or insists on binding, as libpq's `channel_binding` says (default `prefer`).
    pub fn channel_binding(mut self, policy: ChannelBinding) -> ClientAuthenticator {
        self.policy = policy;
        self
    }

    /// libpq's refusal under `channel_binding=require` of a request that cannot bind.
    fn require_binding(&self, req: &AuthRequest) -> Result<(), AuthError> {
        if self.policy != ChannelBinding::Require {
            return Ok(());
        }
        match req {
            AuthRequest::Sasl { .. } | AuthRequest::SaslContinue(_) | AuthRequest::SaslFinal(_) => {
                Ok(())
            }
            AuthRequest::Ok if self.scram_bound && self.scram_verified => Ok(()),
            AuthRequest::Ok => Err(AuthError::ChannelBindingRequired(
                "channel binding required, but server authenticated client without channel binding",
            )),
            _ => Err(AuthError::ChannelBindingRequired(
                "channel binding required but not supported by server's authentication request",
            )),
        }
    }

    fn password(&self) -> Result<&str, AuthError> {
        self.password.as_deref().ok_or(AuthError::NoPassword)
    }

    /// The answer to `req`, or `None` when there is nothing to send. After
    /// `AuthRequest::Ok` authentication is complete. A server that ends a SCRAM exchange
    /// with AuthenticationOk before proving it knows the password is refused.
    pub fn step(&mut self, req: &AuthRequest) -> Result<Option<FrontendMessage>, AuthError> {
        self.require_binding(req)?;
        match req {
            AuthRequest::Ok => {
                if self.scram.is_some() && !self.scram_verified {
                    return Err(AuthError::ServerScram(
                        "server finished authentication without completing the SCRAM exchange"
                            .into(),
                    ));
                }
                Ok(None)
            }
            AuthRequest::CleartextPassword => Ok(Some(FrontendMessage::password(self.password()?))),
            AuthRequest::Md5Password { salt } => Ok(Some(FrontendMessage::password(
                &md5_response(&self.user, self.password()?, *salt),
            ))),
            AuthRequest::Sasl { mechanisms } => {
                let offers = |m: &str| mechanisms.iter().any(|o| o == m);
                let password = self.password()?;
                let binding = match self.policy {
                    // As libpq with channel_binding=disable: SCRAM-SHA-256 with `n,,`.
                    ChannelBinding::Disable => &ChannelBindingMode::NoTls,
                    _ => &self.binding,
                };
                let (mechanism, client) = match binding {
                    ChannelBindingMode::TlsServerEndPoint(hash) if offers(SCRAM_SHA_256_PLUS) => (
                        SCRAM_SHA_256_PLUS,
                        ScramClient::with_channel_binding(password, hash.clone()),
                    ),
                    _ if !offers(SCRAM_SHA_256) => {
                        return Err(AuthError::Unsupported(format!(
                            "none of the server's SASL authentication mechanisms are supported: {}",
                            mechanisms.join(", ")
                        )))
                    }
                    // No TLS, or TLS to a server that can bind while we cannot: "n,,".
                    ChannelBindingMode::NoTls => {
                        (SCRAM_SHA_256, ScramClient::without_binding(password))
                    }
                    _ if offers(SCRAM_SHA_256_PLUS) => {
                        (SCRAM_SHA_256, ScramClient::without_binding(password))
                    }
                    // TLS to a server that cannot bind: "y,,".
                    _ => (SCRAM_SHA_256, ScramClient::new(password, true)),
                };
                if self.policy == ChannelBinding::Require && mechanism != SCRAM_SHA_256_PLUS {
                    return Err(AuthError::ChannelBindingRequired(
                        "channel binding is required, but server did not offer an authentication method that supports channel binding",
                    ));
                }
                self.scram_bound = mechanism == SCRAM_SHA_256_PLUS;
                let data = bytes::Bytes::copy_from_slice(client.client_first());
                self.scram = Some(client);
                Ok(Some(FrontendMessage::SaslInitialResponse {
                    mechanism: mechanism.to_string(),
                    data: Some(data),
                }))
            }
            AuthRequest::SaslContinue(msg) => {
                let client = self
                    .scram
                    .as_mut()
                    .ok_or_else(|| AuthError::ServerScram("unexpected SASLContinue".into()))?;
                let reply = client.handle_server_first(msg)?;
                Ok(Some(FrontendMessage::SaslResponse(
                    bytes::Bytes::copy_from_slice(reply),
                )))
            }
            AuthRequest::SaslFinal(msg) => {
                let client = self
                    .scram
                    .as_mut()
                    .ok_or_else(|| AuthError::ServerScram("unexpected SASLFinal".into()))?;
                client.handle_server_final(msg)?;
                self.scram_verified = true;
                Ok(None)
            }
        }
    }
}
