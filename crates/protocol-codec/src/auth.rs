//! Authentication, both sides: cleartext, md5 and SCRAM-SHA-256 as PostgreSQL 15 does them
//! (trust needs no exchange: the server just sends AuthenticationOk).
//!
//! Server side: [`verify_cleartext`], [`verify_md5`] and the [`ScramServer`] state machine,
//! checking against what a node stores for a role: a SCRAM verifier
//! `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (made by
//! [`make_scram_verifier`]), an md5 hash `md5<hex>`, or a plain password.
//!
//! Client side: [`ClientAuthenticator`] answers each authentication request of a server, using
//! postgres-protocol's SCRAM client (which checks the server's signature) and md5 helper.
//!
//! SCRAM exchange (RFC 5802 / 7677 with PostgreSQL's habits):
//! ```text
//! S: R 10  "SCRAM-SHA-256\0\0"
//! C: p     "SCRAM-SHA-256\0", Int32 n, client-first  = gs2-header "n=,r=" cnonce
//!                                                    gs2-header: "n,," or "y,," ("p=..." needs -PLUS, never offered)
//! S: R 11  server-first  = "r=" cnonce snonce ",s=" base64(salt) ",i=" iterations
//! C: p     client-final  = "c=" base64(gs2-header) ",r=" cnonce snonce ",p=" base64(ClientProof)
//! S: R 12  server-final  = "v=" base64(ServerSignature)
//! S: R 0
//! ```
//! libpq sends an empty user name (`n=`); the server uses the startup packet's `user`.

use std::sync::OnceLock;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use md5::{Digest as _, Md5};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::messages::{AuthRequest, ErrorFields, FrontendMessage, SqlState};

/// The one SASL mechanism walserver offers. SCRAM-SHA-256-PLUS (channel binding) is not
/// offered, so clients send gs2 header `n,,` or `y,,`.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// PostgreSQL's default SCRAM iteration count.
pub const SCRAM_DEFAULT_ITERATIONS: u32 = 4096;

/// PostgreSQL's server nonce length in raw bytes (`SCRAM_RAW_NONCE_LEN`).
const SCRAM_RAW_NONCE_LEN: usize = 18;

/// Why authentication failed. Kept apart from [`crate::CodecError`] because the two are
/// reported differently: a failed password is FATAL 28P01 with a message that must not say
/// why (the reason goes to the server log), while codec errors are protocol violations.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The password or proof did not match (28P01). `reason` is for the server's log only;
    /// the client is told just the message.
    #[error("password authentication failed for user \"{user}\"")]
    PasswordFailed { user: String, reason: String },
    /// No such role (28000). Only for methods without a password exchange; password methods
    /// report [`AuthError::PasswordFailed`] so they do not reveal which roles exist.
    #[error("role \"{user}\" does not exist")]
    UnknownRole { user: String },
    /// The client's SASL message does not follow the protocol (08P01).
    #[error("malformed SCRAM message: {detail}")]
    MalformedScram { detail: String },
    /// The client picked a mechanism we did not offer (08P01).
    #[error("client selected an invalid SASL authentication mechanism")]
    InvalidMechanism,
    /// A stored secret is not a valid SCRAM verifier (a server configuration error).
    #[error("invalid SCRAM secret: {detail}")]
    InvalidVerifier { detail: String },
    /// Client side: the server asked for something we cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// Client side: the server asked for a password and none was configured.
    #[error("the server requested password-based authentication, but no password was provided")]
    NoPassword,
    /// Client side: the server's SCRAM messages were invalid or its signature did not verify,
    /// so the server may not be who it claims.
    #[error("SCRAM authentication with the server failed: {0}")]
    ServerScram(String),
    /// A message in the exchange could not be decoded.
    #[error(transparent)]
    Codec(#[from] crate::CodecError),
}

impl AuthError {
    pub fn sqlstate(&self) -> SqlState {
        match self {
            AuthError::PasswordFailed { .. } => SqlState::INVALID_PASSWORD,
            AuthError::UnknownRole { .. } => SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            AuthError::MalformedScram { .. }
            | AuthError::InvalidMechanism
            | AuthError::Codec(_) => SqlState::PROTOCOL_VIOLATION,
            AuthError::InvalidVerifier { .. } | AuthError::ServerScram(_) => {
                SqlState::INTERNAL_ERROR
            }
            AuthError::Unsupported(_) => SqlState::FEATURE_NOT_SUPPORTED,
            AuthError::NoPassword => SqlState::INVALID_PASSWORD,
        }
    }

    /// The FATAL a server sends before closing the connection. A verifier problem is reported
    /// to the client as a failed password, as PostgreSQL does.
    pub fn to_error_fields(&self, user: &str) -> ErrorFields {
        match self {
            AuthError::InvalidVerifier { .. } | AuthError::PasswordFailed { .. } => {
                ErrorFields::fatal(
                    SqlState::INVALID_PASSWORD,
                    format!("password authentication failed for user \"{user}\""),
                )
            }
            AuthError::MalformedScram { detail } => {
                ErrorFields::fatal(SqlState::PROTOCOL_VIOLATION, "malformed SCRAM message")
                    .detail(detail.clone())
            }
            other => ErrorFields::fatal(other.sqlstate(), other.to_string()),
        }
    }
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn md5_hex(parts: &[&[u8]]) -> String {
    let mut h = Md5::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// SASLprep as PostgreSQL applies it: if the password is valid UTF-8 and SASLprep accepts it,
/// its prepared form; otherwise the raw bytes.
fn saslprep(password: &str) -> Vec<u8> {
    match stringprep::saslprep(password) {
        Ok(p) => p.into_owned().into_bytes(),
        Err(_) => password.as_bytes().to_vec(),
    }
}

/// A parsed SCRAM-SHA-256 verifier.
///
/// Format: `SCRAM-SHA-256$<iterations>:<base64 salt>$<base64 StoredKey>:<base64 ServerKey>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramVerifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl ScramVerifier {
    pub fn parse(verifier: &str) -> Result<ScramVerifier, AuthError> {
        let bad = |detail: &str| AuthError::InvalidVerifier {
            detail: detail.to_string(),
        };
        let rest = verifier
            .strip_prefix("SCRAM-SHA-256$")
            .ok_or_else(|| bad("does not start with SCRAM-SHA-256$"))?;
        let (params, keys) = rest.split_once('$').ok_or_else(|| bad("missing '$'"))?;
        let (iterations, salt) = params.split_once(':').ok_or_else(|| bad("missing ':'"))?;
        let (stored, server) = keys.split_once(':').ok_or_else(|| bad("missing ':'"))?;
        let iterations: u32 = iterations
            .parse()
            .ok()
            .filter(|&i| i > 0)
            .ok_or_else(|| bad("invalid iteration count"))?;
        let salt = B64.decode(salt).map_err(|_| bad("invalid salt"))?;
        let key = |s: &str| -> Result<[u8; 32], AuthError> {
            B64.decode(s)
                .ok()
                .and_then(|k| <[u8; 32]>::try_from(k).ok())
                .ok_or_else(|| bad("invalid key"))
        };
        Ok(ScramVerifier {
            iterations,
            salt,
            stored_key: key(stored)?,
            server_key: key(server)?,
        })
    }

    /// The verifier of `password` with this verifier's salt and iterations.
    fn derive(password: &str, salt: &[u8], iterations: u32) -> ScramVerifier {
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(&saslprep(password), salt, iterations, &mut salted);
        let client_key = hmac(&salted, &[b"Client Key"]);
        ScramVerifier {
            iterations,
            salt: salt.to_vec(),
            stored_key: sha256(&client_key),
            server_key: hmac(&salted, &[b"Server Key"]),
        }
    }

    /// A stand-in for a role that does not exist or has no SCRAM secret, so that the
    /// exchange runs to the end and fails the same way a wrong password does. Like
    /// PostgreSQL's `scram_mock_salt`, the salt is derived from the user name and a secret
    /// chosen once per process, so repeated attempts see a stable salt.
    pub fn mock(user: &str) -> ScramVerifier {
        static MOCK_SECRET: OnceLock<[u8; 32]> = OnceLock::new();
        let secret = MOCK_SECRET.get_or_init(|| {
            let mut s = [0u8; 32];
            rand::fill(&mut s);
            s
        });
        let salt = sha256(&[user.as_bytes(), secret].concat());
        ScramVerifier {
            iterations: SCRAM_DEFAULT_ITERATIONS,
            salt: salt[..16].to_vec(),
            stored_key: [0; 32],
            server_key: [0; 32],
        }
    }
}

/// A new SCRAM-SHA-256 verifier for `password`, with a random salt and 4096 iterations, in
/// the form PostgreSQL stores (postgres-protocol's `password::scram_sha_256`).
pub fn make_scram_verifier(password: &str) -> String {
    postgres_protocol::password::scram_sha_256(password.as_bytes())
}

/// The md5 verifier PostgreSQL stored before SCRAM: `"md5" + hex(md5(password || user))`.
pub fn make_md5_verifier(user: &str, password: &str) -> String {
    postgres_protocol::password::md5(password.as_bytes(), user)
}

/// The client's answer to an MD5Password request:
/// `"md5" + hex(md5(hex(md5(password || user)) || salt))`.
pub fn md5_response(user: &str, password: &str, salt: [u8; 4]) -> String {
    postgres_protocol::authentication::md5_hash(user.as_bytes(), password.as_bytes(), salt)
}

/// A random salt for an MD5Password request.
pub fn random_md5_salt() -> [u8; 4] {
    let mut salt = [0u8; 4];
    rand::fill(&mut salt);
    salt
}

fn failed(user: &str, reason: impl Into<String>) -> AuthError {
    AuthError::PasswordFailed {
        user: user.to_string(),
        reason: reason.into(),
    }
}

/// Checks an md5 answer against what is stored for `user`: an md5 verifier or a plain
/// password. A SCRAM verifier cannot answer md5 (PostgreSQL: `User "x" has a password that
/// cannot be used with MD5 authentication`).
pub fn verify_md5(
    stored: &str,
    user: &str,
    salt: [u8; 4],
    response: &str,
) -> Result<(), AuthError> {
    let expected = if let Some(hash) = stored.strip_prefix("md5").filter(|h| h.len() == 32) {
        format!("md5{}", md5_hex(&[hash.as_bytes(), &salt]))
    } else if stored.starts_with("SCRAM-SHA-256$") {
        return Err(failed(
            user,
            format!("User \"{user}\" has a password that cannot be used with MD5 authentication."),
        ));
    } else {
        md5_response(user, stored, salt)
    };
    if bool::from(expected.as_bytes().ct_eq(response.as_bytes())) {
        Ok(())
    } else {
        Err(failed(user, "Password does not match for user."))
    }
}

/// Checks a cleartext password against what is stored for `user`: a SCRAM verifier, an md5
/// verifier, or a plain password.
pub fn verify_cleartext(stored: &str, user: &str, password: &str) -> Result<(), AuthError> {
    let ok = if stored.starts_with("SCRAM-SHA-256$") {
        let v = ScramVerifier::parse(stored)?;
        let d = ScramVerifier::derive(password, &v.salt, v.iterations);
        bool::from(d.stored_key.ct_eq(&v.stored_key) & d.server_key.ct_eq(&v.server_key))
    } else if stored.starts_with("md5") && stored.len() == 35 {
        bool::from(
            make_md5_verifier(user, password)
                .as_bytes()
                .ct_eq(stored.as_bytes()),
        )
    } else {
        bool::from(stored.as_bytes().ct_eq(password.as_bytes()))
    };
    if ok {
        Ok(())
    } else {
        Err(failed(user, "Password does not match for user."))
    }
}

enum ScramState {
    AwaitingClientFirst,
    AwaitingClientFinal {
        client_first_bare: String,
        server_first: String,
        nonce: String,
        channel_binding: String,
    },
    Done,
}

/// The server side of a SCRAM-SHA-256 exchange, as a plain state machine: feed it the
/// client's messages, send back what it returns.
pub struct ScramServer {
    user: String,
    verifier: ScramVerifier,
    /// The exchange runs against a mock verifier and must fail at the proof.
    mock: bool,
    state: ScramState,
}

impl ScramServer {
    /// An exchange for `user` (the startup packet's user) against its stored verifier.
    pub fn new(verifier: &str, user: &str) -> Result<ScramServer, AuthError> {
        Ok(ScramServer {
            user: user.to_string(),
            verifier: ScramVerifier::parse(verifier)?,
            mock: false,
            state: ScramState::AwaitingClientFirst,
        })
    }

    /// An exchange for a role that does not exist or has no SCRAM secret: it looks like a
    /// real one to the client and ends in [`AuthError::PasswordFailed`], as PostgreSQL's mock
    /// authentication does, so a client cannot tell which roles exist.
    pub fn for_unknown_user(user: &str) -> ScramServer {
        ScramServer {
            user: user.to_string(),
            verifier: ScramVerifier::mock(user),
            mock: true,
            state: ScramState::AwaitingClientFirst,
        }
    }

    /// The AuthenticationSASL request that starts the exchange.
    pub fn request() -> AuthRequest {
        AuthRequest::Sasl {
            mechanisms: vec![SCRAM_SHA_256.to_string()],
        }
    }

    /// Handles the SASLInitialResponse's mechanism and data; returns the server-first-message
    /// to send in SASLContinue.
    pub fn handle_initial_response(
        &mut self,
        mechanism: &str,
        data: Option<&[u8]>,
    ) -> Result<Vec<u8>, AuthError> {
        if mechanism != SCRAM_SHA_256 {
            return Err(AuthError::InvalidMechanism);
        }
        self.handle_client_first(data.unwrap_or_default())
    }

    /// Handles client-first-message; returns server-first-message.
    pub fn handle_client_first(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, ScramState::AwaitingClientFirst) {
            return Err(malformed("unexpected client-first-message"));
        }
        self.state = ScramState::Done;
        let msg = std::str::from_utf8(msg).map_err(|_| malformed("message is not UTF-8"))?;
        let (gs2_header, bare) = split_gs2_header(msg)?;
        let client_nonce = parse_client_first_bare(bare)?;

        let mut raw = [0u8; SCRAM_RAW_NONCE_LEN];
        rand::fill(&mut raw);
        self.respond_to_client_first(gs2_header, bare, client_nonce, &B64.encode(raw))
    }

    /// The rest of client-first handling, with the server's part of the nonce given (tests
    /// replay a captured exchange with it).
    fn respond_to_client_first(
        &mut self,
        gs2_header: &str,
        bare: &str,
        client_nonce: &str,
        server_nonce: &str,
    ) -> Result<Vec<u8>, AuthError> {
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&self.verifier.salt),
            self.verifier.iterations
        );
        self.state = ScramState::AwaitingClientFinal {
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
            channel_binding: B64.encode(gs2_header),
        };
        Ok(server_first.into_bytes())
    }

    /// Handles client-final-message; returns server-final-message (to send in SASLFinal,
    /// followed by AuthenticationOk) if the proof is right.
    pub fn handle_client_final(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        let ScramState::AwaitingClientFinal {
            client_first_bare,
            server_first,
            nonce,
            channel_binding,
        } = std::mem::replace(&mut self.state, ScramState::Done)
        else {
            return Err(malformed("unexpected client-final-message"));
        };
        let msg = std::str::from_utf8(msg).map_err(|_| malformed("message is not UTF-8"))?;
        let (without_proof, proof) = msg
            .rsplit_once(",p=")
            .ok_or_else(|| malformed("Could not find proof in client-final-message."))?;
        let mut attrs = without_proof.split(',');
        let cbind = attrs
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .ok_or_else(|| malformed("Expected attribute \"c\" in client-final-message."))?;
        let client_nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or_else(|| malformed("Expected attribute \"r\" in client-final-message."))?;
        // Any further attributes are extensions, which PostgreSQL ignores.
        if cbind != channel_binding {
            return Err(malformed(
                "SCRAM channel binding check failed: unexpected channel-binding attribute in client-final-message.",
            ));
        }
        if client_nonce != nonce {
            return Err(malformed("Nonce does not match."));
        }
        let proof: [u8; 32] = B64
            .decode(proof)
            .ok()
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| malformed("Malformed proof in client-final-message."))?;

        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature = hmac(&self.verifier.stored_key, &[auth_message.as_bytes()]);
        let mut client_key = proof;
        for (k, s) in client_key.iter_mut().zip(client_signature) {
            *k ^= s;
        }
        let proof_ok = bool::from(sha256(&client_key).ct_eq(&self.verifier.stored_key));
        if self.mock {
            return Err(failed(
                &self.user,
                format!(
                    "Role \"{}\" does not exist or has no SCRAM secret.",
                    self.user
                ),
            ));
        }
        if !proof_ok {
            return Err(failed(&self.user, "Password does not match for user."));
        }
        let server_signature = hmac(&self.verifier.server_key, &[auth_message.as_bytes()]);
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

fn malformed(detail: &str) -> AuthError {
    AuthError::MalformedScram {
        detail: detail.to_string(),
    }
}

/// Splits client-first-message into its gs2 header (`n,,` or `y,,`) and the bare message.
fn split_gs2_header(msg: &str) -> Result<(&str, &str), AuthError> {
    let after_flag = match msg.as_bytes().first() {
        Some(b'n') | Some(b'y') => &msg[1..],
        Some(b'p') => {
            return Err(malformed(
                "The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data.",
            ))
        }
        _ => return Err(malformed("Unexpected channel-binding flag in client-first-message.")),
    };
    let after_flag = after_flag
        .strip_prefix(',')
        .ok_or_else(|| malformed("Comma expected after channel-binding flag."))?;
    if after_flag.starts_with("a=") {
        return Err(AuthError::Unsupported(
            "client uses authorization identity, but it is not supported".into(),
        ));
    }
    let bare = after_flag
        .strip_prefix(',')
        .ok_or_else(|| malformed("Unexpected attribute in client-first-message."))?;
    Ok((&msg[..msg.len() - bare.len()], bare))
}

/// Reads `n=<user>,r=<nonce>[,ext...]` and returns the nonce. The user name is ignored, as in
/// PostgreSQL: the startup packet's user is the one authenticated.
fn parse_client_first_bare(bare: &str) -> Result<&str, AuthError> {
    if bare.starts_with("m=") {
        return Err(AuthError::Unsupported(
            "client requires an unsupported SCRAM extension".into(),
        ));
    }
    let mut attrs = bare.split(',');
    attrs
        .next()
        .and_then(|a| a.strip_prefix("n="))
        .ok_or_else(|| malformed("Expected attribute \"n\" in client-first-message."))?;
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or_else(|| malformed("Expected attribute \"r\" in client-first-message."))?;
    if nonce.is_empty() || !nonce.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(malformed("Invalid nonce in client-first-message."));
    }
    Ok(nonce)
}

/// The PLUS variant, with channel binding, which PostgreSQL offers on TLS connections.
pub const SCRAM_SHA_256_PLUS: &str = "SCRAM-SHA-256-PLUS";

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
            ChannelBinding::unrequested()
        } else {
            ChannelBinding::unsupported()
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
                ChannelBinding::tls_server_end_point(server_end_point),
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

/// The client's side of authentication: give it each [`AuthRequest`] the server sends, send
/// what it returns.
pub struct ClientAuthenticator {
    user: String,
    password: Option<String>,
    binding: ChannelBindingMode,
    scram: Option<ScramClient>,
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
            scram: None,
            scram_verified: false,
        }
    }

    fn password(&self) -> Result<&str, AuthError> {
        self.password.as_deref().ok_or(AuthError::NoPassword)
    }

    /// The answer to `req`, or `None` when there is nothing to send. After
    /// `AuthRequest::Ok` authentication is complete. A server that ends a SCRAM exchange
    /// with AuthenticationOk before proving it knows the password is refused.
    pub fn step(&mut self, req: &AuthRequest) -> Result<Option<FrontendMessage>, AuthError> {
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
                let (mechanism, client) = match &self.binding {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let client_first = "n,,n=,r=aJrSDlXMMIN2YDqnuyuprRm7";
        let (gs2, bare) = split_gs2_header(client_first).unwrap();
        let cnonce = parse_client_first_bare(bare).unwrap();
        let server_first = server
            .respond_to_client_first(gs2, bare, cnonce, "+UpG7of43TlfxAqtIA3tLXSC")
            .unwrap();
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

    #[test]
    fn client_first_checks() {
        let bad = |msg: &str| {
            let mut server = ScramServer::new(&make_scram_verifier("pw"), "u").unwrap();
            server.handle_client_first(msg.as_bytes()).unwrap_err()
        };
        assert!(matches!(
            bad("p=tls-server-end-point,,n=,r=abc"),
            AuthError::MalformedScram { .. }
        ));
        assert!(matches!(
            bad("n,a=admin,n=,r=abc"),
            AuthError::Unsupported(_)
        ));
        assert!(matches!(
            bad("n,,m=ext,n=,r=abc"),
            AuthError::Unsupported(_)
        ));
        assert!(matches!(
            bad("x,,n=,r=abc"),
            AuthError::MalformedScram { .. }
        ));
        assert!(matches!(bad("n,,n=,r="), AuthError::MalformedScram { .. }));
        assert!(matches!(bad("n,,r=abc"), AuthError::MalformedScram { .. }));
        assert!(matches!(bad("n,,"), AuthError::MalformedScram { .. }));
        assert!(matches!(bad(""), AuthError::MalformedScram { .. }));
        // A user name in the message is accepted and ignored; extensions are ignored.
        server_after_first("n,,n=someone,r=abc,x=ext");
        server_after_first("y,,n=,r=abc");
        let mut server = ScramServer::new(&make_scram_verifier("pw"), "u").unwrap();
        assert!(matches!(
            server.handle_initial_response("SCRAM-SHA-256-PLUS", Some(b"n,,n=,r=a")),
            Err(AuthError::InvalidMechanism)
        ));
    }

    #[test]
    fn client_final_checks() {
        let proof = B64.encode([0u8; 32]);
        let check = |first: &str, fin: &dyn Fn(&str) -> String| {
            let (mut server, nonce) = server_after_first(first);
            server
                .handle_client_final(fin(&nonce).as_bytes())
                .unwrap_err()
        };
        // Channel binding must echo the gs2 header: biws for n,, and eSws for y,,.
        let e = check("n,,n=,r=abc", &|n| format!("c=eSws,r={n},p={proof}"));
        assert!(matches!(e, AuthError::MalformedScram { .. }), "{e:?}");
        let e = check("y,,n=,r=abc", &|n| format!("c=biws,r={n},p={proof}"));
        assert!(matches!(e, AuthError::MalformedScram { .. }), "{e:?}");
        let e = check("n,,n=,r=abc", &|_| format!("c=biws,r=abcdef,p={proof}"));
        assert!(matches!(e, AuthError::MalformedScram { .. }), "{e:?}");
        let e = check("n,,n=,r=abc", &|n| format!("c=biws,r={n},p=short"));
        assert!(matches!(e, AuthError::MalformedScram { .. }), "{e:?}");
        let e = check("n,,n=,r=abc", &|n| format!("c=biws,r={n}"));
        assert!(matches!(e, AuthError::MalformedScram { .. }), "{e:?}");
        // A well-formed message with a wrong proof is a failed password.
        let e = check("n,,n=,r=abc", &|n| format!("c=biws,r={n},p={proof}"));
        assert!(matches!(e, AuthError::PasswordFailed { .. }), "{e:?}");
        // Messages out of order.
        let mut server = ScramServer::new(&make_scram_verifier("pw"), "u").unwrap();
        assert!(server.handle_client_final(b"c=biws,r=a,p=b").is_err());
        let (mut server, _) = server_after_first("n,,n=,r=abc");
        assert!(server.handle_client_first(b"n,,n=,r=abc").is_err());
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
            .unwrap();
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
            let Some(FrontendMessage::SaslInitialResponse { mechanism, data }) =
                c.step(&req).unwrap()
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
        let mut cannot_bind =
            ClientAuthenticator::new("repl", Some("pw"), ChannelBindingMode::NoTls);
        assert!(matches!(
            cannot_bind.step(&AuthRequest::Sasl {
                mechanisms: vec![SCRAM_SHA_256_PLUS.into()]
            }),
            Err(AuthError::Unsupported(_))
        ));
    }
}
