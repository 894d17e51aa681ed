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
//! S: R 10  "SCRAM-SHA-256\0\0"  (over TLS with binding data: "SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0")
//! C: p     mechanism "\0", Int32 n, client-first  = gs2-header "n=,r=" cnonce
//!                                                gs2-header: "n,," or "y,,"; "p=tls-server-end-point,," for -PLUS
//! S: R 11  server-first  = "r=" cnonce snonce ",s=" base64(salt) ",i=" iterations
//! C: p     client-final  = "c=" base64(gs2-header [binding data]) ",r=" cnonce snonce ",p=" base64(ClientProof)
//! S: R 12  server-final  = "v=" base64(ServerSignature)
//! S: R 0
//! ```
//! libpq sends an empty user name (`n=`); the server uses the startup packet's `user`.

use std::sync::OnceLock;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use md5::{Digest as _, Md5};
use postgres_protocol::authentication::sasl::{ChannelBinding as SaslBinding, ScramSha256};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::messages::{AuthRequest, ErrorFields, FrontendMessage, SqlState};

/// The SASL mechanism without channel binding, always offered. Over TLS a server that knows
/// its certificate's tls-server-end-point data also offers [`SCRAM_SHA_256_PLUS`]
/// ([`ScramServer::with_channel_binding`]).
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
    /// The client's SASL message breaks the protocol (08P01: "malformed SCRAM message",
    /// mostly) or its channel binding does not hold (28000): PostgreSQL's SQLSTATE, text and,
    /// where it gives one, detail.
    #[error("{message}{}", detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    Scram {
        code: SqlState,
        message: String,
        detail: Option<String>,
    },
    /// A PasswordMessage that is not one string filling the message (08P01).
    #[error("invalid password packet size")]
    InvalidPasswordPacket,
    /// An empty password, refused before it is checked, as PostgreSQL refuses it (28P01).
    #[error("empty password returned by client")]
    EmptyPassword,
    /// The client picked a mechanism we did not offer (08P01).
    #[error("client selected an invalid SASL authentication mechanism")]
    InvalidMechanism,
    /// A stored secret is not a valid SCRAM verifier (a server configuration error).
    #[error("invalid SCRAM secret: {detail}")]
    InvalidVerifier { detail: String },
    /// Client side: the server asked for something we cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// Client side, `channel_binding=require`: the server did not authenticate with a bound
    /// SCRAM exchange (libpq's texts).
    #[error("{0}")]
    ChannelBindingRequired(&'static str),
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
            AuthError::EmptyPassword => SqlState::INVALID_PASSWORD,
            AuthError::Scram { code, .. } => *code,
            AuthError::InvalidPasswordPacket
            | AuthError::InvalidMechanism
            | AuthError::Codec(_) => SqlState::PROTOCOL_VIOLATION,
            AuthError::InvalidVerifier { .. } | AuthError::ServerScram(_) => {
                SqlState::INTERNAL_ERROR
            }
            AuthError::Unsupported(_) => SqlState::FEATURE_NOT_SUPPORTED,
            AuthError::ChannelBindingRequired(_) => SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
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
            AuthError::Scram {
                code,
                message,
                detail,
            } => {
                let fields = ErrorFields::fatal(*code, message.clone());
                match detail {
                    Some(d) => fields.detail(d.clone()),
                    None => fields,
                }
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
        client_first_bare: Vec<u8>,
        server_first: String,
        nonce: String,
        /// What client-final's `c=` must be: base64 of the gs2 header (`biws` for `n,,`,
        /// `eSws` for `y,,`), followed for SCRAM-SHA-256-PLUS by the binding data.
        channel_binding: String,
    },
    Done,
}

/// What the server answers a SASL message with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScramReply {
    /// AuthenticationSASLContinue with these bytes: server-first-message, or nothing when the
    /// SASLInitialResponse carried no data (the client then sends client-first-message in a
    /// SASLResponse).
    Continue(Vec<u8>),
    /// AuthenticationSASLFinal with server-final-message, then AuthenticationOk.
    Final(Vec<u8>),
}

impl ScramReply {
    /// The SASL data to send.
    pub fn into_bytes(self) -> Vec<u8> {
        match self {
            ScramReply::Continue(b) | ScramReply::Final(b) => b,
        }
    }
}

/// The server side of a SCRAM-SHA-256 exchange, as a plain state machine: feed it the
/// client's messages, send back what it returns. Messages are parsed the way PostgreSQL 15
/// parses them, byte by byte, and refused with its SQLSTATEs, texts and details.
pub struct ScramServer {
    user: String,
    verifier: ScramVerifier,
    /// The exchange runs against a mock verifier and must fail at the proof.
    mock: bool,
    /// The tls-server-end-point data of this TLS connection's certificate, when the server
    /// offers SCRAM-SHA-256-PLUS on it.
    binding_data: Option<Vec<u8>>,
    /// The client chose SCRAM-SHA-256-PLUS.
    binding_in_use: bool,
    state: ScramState,
}

impl ScramServer {
    /// An exchange for `user` (the startup packet's user) against its stored verifier.
    pub fn new(verifier: &str, user: &str) -> Result<ScramServer, AuthError> {
        Ok(ScramServer {
            user: user.to_string(),
            verifier: ScramVerifier::parse(verifier)?,
            mock: false,
            binding_data: None,
            binding_in_use: false,
            state: ScramState::AwaitingClientFirst,
        })
    }

    /// Offers SCRAM-SHA-256-PLUS too, bound to `end_point`: the tls-server-end-point data of
    /// the certificate this TLS connection presented ([`crate::tls::tls_server_end_point`]),
    /// as PostgreSQL offers it on every TLS connection. A client that can bind must then bind
    /// (`y` in its gs2 header is refused), so a man in the middle who terminates TLS with
    /// another certificate cannot complete the exchange.
    pub fn with_channel_binding(mut self, end_point: Vec<u8>) -> ScramServer {
        self.binding_data = Some(end_point);
        self
    }

    /// An exchange for a role that does not exist or has no SCRAM secret: it looks like a
    /// real one to the client and ends in [`AuthError::PasswordFailed`], as PostgreSQL's mock
    /// authentication does, so a client cannot tell which roles exist.
    pub fn for_unknown_user(user: &str) -> ScramServer {
        ScramServer {
            user: user.to_string(),
            verifier: ScramVerifier::mock(user),
            mock: true,
            binding_data: None,
            binding_in_use: false,
            state: ScramState::AwaitingClientFirst,
        }
    }

    /// The AuthenticationSASL request that starts an exchange without channel binding.
    pub fn request() -> AuthRequest {
        AuthRequest::Sasl {
            mechanisms: vec![SCRAM_SHA_256.to_string()],
        }
    }

    /// The AuthenticationSASL request that starts this exchange: SCRAM-SHA-256-PLUS first
    /// when it is offered, then SCRAM-SHA-256, in PostgreSQL's order.
    pub fn offer(&self) -> AuthRequest {
        match self.binding_data {
            Some(_) => AuthRequest::Sasl {
                mechanisms: vec![SCRAM_SHA_256_PLUS.to_string(), SCRAM_SHA_256.to_string()],
            },
            None => ScramServer::request(),
        }
    }

    /// Handles the SASLInitialResponse's mechanism and data. Without data (length -1) the
    /// answer is an empty challenge, as in PostgreSQL, and client-first-message comes in the
    /// next SASLResponse.
    pub fn handle_initial_response(
        &mut self,
        mechanism: &str,
        data: Option<&[u8]>,
    ) -> Result<ScramReply, AuthError> {
        self.binding_in_use = match mechanism {
            SCRAM_SHA_256 => false,
            SCRAM_SHA_256_PLUS if self.binding_data.is_some() => true,
            _ => return Err(AuthError::InvalidMechanism),
        };
        match data {
            None => Ok(ScramReply::Continue(Vec::new())),
            Some(data) => self.handle_client_first(data).map(ScramReply::Continue),
        }
    }

    /// Handles a SASLResponse: client-first-message if the initial response had no data,
    /// client-final-message otherwise.
    pub fn handle_response(&mut self, msg: &[u8]) -> Result<ScramReply, AuthError> {
        match self.state {
            ScramState::AwaitingClientFirst => {
                self.handle_client_first(msg).map(ScramReply::Continue)
            }
            _ => self.handle_client_final(msg).map(ScramReply::Final),
        }
    }

    /// Handles client-first-message; returns server-first-message.
    pub fn handle_client_first(&mut self, msg: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, ScramState::AwaitingClientFirst) {
            return Err(malformed("unexpected client-first-message"));
        }
        self.state = ScramState::Done;
        check_input(msg)?;
        let first = read_client_first(msg, self.binding_in_use, self.binding_data.is_some())?;
        let mut raw = [0u8; SCRAM_RAW_NONCE_LEN];
        rand::fill(&mut raw);
        Ok(self.respond_to_client_first(first, &B64.encode(raw)))
    }

    /// The rest of client-first handling, with the server's part of the nonce given (tests
    /// replay a captured exchange with it).
    fn respond_to_client_first(&mut self, first: ClientFirst<'_>, server_nonce: &str) -> Vec<u8> {
        let nonce = format!("{}{server_nonce}", first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&self.verifier.salt),
            self.verifier.iterations
        );
        let mut cbind_input = first.gs2_header.to_vec();
        if self.binding_in_use {
            cbind_input.extend_from_slice(self.binding_data.as_deref().unwrap_or_default());
        }
        self.state = ScramState::AwaitingClientFinal {
            client_first_bare: first.bare.to_vec(),
            server_first: server_first.clone(),
            nonce,
            channel_binding: B64.encode(cbind_input),
        };
        server_first.into_bytes()
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
        check_input(msg)?;
        let mut c = Cursor { msg, at: 0 };
        let cbind = c.attr_value(b'c')?;
        if cbind != channel_binding.as_bytes() {
            return Err(if self.binding_in_use {
                // The client bound to another certificate than the one this server presented.
                scram_error(
                    SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                    "SCRAM channel binding check failed",
                    None,
                )
            } else {
                scram_error(
                    SqlState::PROTOCOL_VIOLATION,
                    "unexpected SCRAM channel-binding attribute in client-final-message",
                    None,
                )
            });
        }
        let final_nonce = c.attr_value(b'r')?;
        // Extensions may come before the proof; they are ignored.
        let (without_proof, proof) = loop {
            let start = c.at;
            if let (b'p', value) = c.any_attr()? {
                // The message without its proof ends before the comma ahead of `p=`.
                break (&msg[..start.saturating_sub(1)], value);
            }
        };
        let proof: [u8; 32] = B64
            .decode(proof)
            .ok()
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| malformed("Malformed proof in client-final-message."))?;
        if !c.at_end() {
            return Err(malformed(
                "Garbage found at the end of client-final-message.",
            ));
        }
        if final_nonce != nonce.as_bytes() {
            return Err(scram_error(
                SqlState::PROTOCOL_VIOLATION,
                "invalid SCRAM response",
                Some("Nonce does not match."),
            ));
        }

        let auth_message: [&[u8]; 5] = [
            &client_first_bare,
            b",",
            server_first.as_bytes(),
            b",",
            without_proof,
        ];
        let client_signature = hmac(&self.verifier.stored_key, &auth_message);
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
        let server_signature = hmac(&self.verifier.server_key, &auth_message);
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

fn malformed(detail: impl Into<String>) -> AuthError {
    scram_error(
        SqlState::PROTOCOL_VIOLATION,
        "malformed SCRAM message",
        Some(&detail.into()),
    )
}

fn scram_error(code: SqlState, message: impl Into<String>, detail: Option<&str>) -> AuthError {
    AuthError::Scram {
        code,
        message: message.into(),
        detail: detail.map(str::to_string),
    }
}

/// PostgreSQL's checks of every SASL message before it is parsed: not empty, and no NUL
/// inside (it reads the message as a C string).
fn check_input(msg: &[u8]) -> Result<(), AuthError> {
    if msg.is_empty() {
        return Err(malformed("The message is empty."));
    }
    if msg.contains(&0) {
        return Err(malformed("Message length does not match input length."));
    }
    Ok(())
}

/// Printable ASCII as SCRAM and PostgreSQL's error texts take it: 0x21 to 0x7e.
fn printable(c: u8) -> bool {
    (0x21..=0x7e).contains(&c)
}

/// A byte as PostgreSQL names it in a SCRAM error's detail: `'x'` when printable, `0x..`
/// otherwise (the end of the message is `0x00`).
fn sanitize_char(c: u8) -> String {
    if printable(c) {
        format!("'{}'", c as char)
    } else {
        format!("0x{c:02x}")
    }
}

/// Bytes as PostgreSQL quotes them in a SCRAM error: at most 30, each not printable ASCII
/// written `?`.
fn sanitize_str(b: &[u8]) -> String {
    b.iter()
        .take(30)
        .map(|&c| if printable(c) { c as char } else { '?' })
        .collect()
}

/// A position in a SCRAM message (`attr=value` pairs separated by commas), read the way
/// PostgreSQL reads it: the byte past the end reads as 0, its C string's terminator.
struct Cursor<'a> {
    msg: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> u8 {
        self.msg.get(self.at).copied().unwrap_or(0)
    }

    fn at_end(&self) -> bool {
        self.at >= self.msg.len()
    }

    /// The value up to the next comma (consumed) or the end.
    fn value(&mut self) -> &'a [u8] {
        let rest = &self.msg[self.at.min(self.msg.len())..];
        let len = rest.iter().position(|&b| b == b',').unwrap_or(rest.len());
        self.at += len;
        if !self.at_end() {
            self.at += 1;
        }
        &rest[..len]
    }

    /// `attr=value` for this `attr`.
    fn attr_value(&mut self, attr: u8) -> Result<&'a [u8], AuthError> {
        if self.peek() != attr {
            return Err(malformed(format!(
                "Expected attribute \"{}\" but found \"{}\".",
                attr as char,
                sanitize_char(self.peek())
            )));
        }
        self.at += 1;
        self.expect_equals(attr)?;
        Ok(self.value())
    }

    /// Any `attr=value`, the attribute a letter.
    fn any_attr(&mut self) -> Result<(u8, &'a [u8]), AuthError> {
        let attr = self.peek();
        if attr == 0 {
            return Err(malformed("Attribute expected, but found end of string."));
        }
        if !attr.is_ascii_alphabetic() {
            return Err(malformed(format!(
                "Attribute expected, but found invalid character \"{}\".",
                sanitize_char(attr)
            )));
        }
        self.at += 1;
        self.expect_equals(attr)?;
        Ok((attr, self.value()))
    }

    fn expect_equals(&mut self, attr: u8) -> Result<(), AuthError> {
        if self.peek() != b'=' {
            return Err(malformed(format!(
                "Expected character \"=\" for attribute \"{}\".",
                attr as char
            )));
        }
        self.at += 1;
        Ok(())
    }
}

/// The parts of client-first-message the exchange keeps.
struct ClientFirst<'a> {
    /// `n,,`, `y,,` or `p=tls-server-end-point,,`.
    gs2_header: &'a [u8],
    /// client-first-message-bare, part of the signed auth message.
    bare: &'a [u8],
    /// The client's nonce: printable ASCII without commas.
    nonce: &'a str,
}

/// Reads client-first-message: the gs2 header (`n,,` or `y,,`, or `p=tls-server-end-point,,`
/// when the client chose SCRAM-SHA-256-PLUS; an authorization identity and mandatory
/// extensions are not supported), then `n=<user>,r=<nonce>[,ext...]`. The user name is
/// ignored, as in PostgreSQL: the startup packet's user is the one authenticated.
/// `binding_in_use`: the client chose -PLUS; `binding_offered`: the server offered it.
fn read_client_first(
    msg: &[u8],
    binding_in_use: bool,
    binding_offered: bool,
) -> Result<ClientFirst<'_>, AuthError> {
    let mut c = Cursor { msg, at: 0 };
    match c.peek() {
        flag @ (b'n' | b'y') => {
            if binding_in_use {
                return Err(malformed(
                    "The client selected SCRAM-SHA-256-PLUS, but the SCRAM message does not include channel binding data.",
                ));
            }
            if flag == b'y' && binding_offered {
                // "I could bind, but you do not offer it": this server did offer it, so
                // someone in between removed it from the offer.
                return Err(scram_error(
                    SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                    "SCRAM channel binding negotiation error",
                    Some("The client supports SCRAM channel binding but thinks the server does not.  However, this server does support channel binding."),
                ));
            }
            c.at += 1;
            if c.peek() != b',' {
                return Err(malformed(format!(
                    "Comma expected, but found character \"{}\".",
                    sanitize_char(c.peek())
                )));
            }
            c.at += 1;
        }
        b'p' => {
            if !binding_in_use {
                return Err(malformed(
                    "The client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data.",
                ));
            }
            let kind = c.attr_value(b'p')?;
            if kind != b"tls-server-end-point" {
                return Err(scram_error(
                    SqlState::PROTOCOL_VIOLATION,
                    format!(
                        "unsupported SCRAM channel-binding type \"{}\"",
                        sanitize_str(kind)
                    ),
                    None,
                ));
            }
        }
        other => {
            return Err(malformed(format!(
                "Unexpected channel-binding flag \"{}\".",
                sanitize_char(other)
            )))
        }
    }
    if c.peek() == b'a' {
        return Err(AuthError::Unsupported(
            "client uses authorization identity, but it is not supported".into(),
        ));
    }
    if c.peek() != b',' {
        return Err(malformed(format!(
            "Unexpected attribute \"{}\" in client-first-message.",
            sanitize_char(c.peek())
        )));
    }
    c.at += 1;
    let (gs2_header, bare) = msg.split_at(c.at);
    if c.peek() == b'm' {
        return Err(AuthError::Unsupported(
            "client requires an unsupported SCRAM extension".into(),
        ));
    }
    c.attr_value(b'n')?;
    let nonce = c.attr_value(b'r')?;
    // PostgreSQL accepts an empty nonce; only its characters are checked.
    let nonce = std::str::from_utf8(nonce)
        .ok()
        .filter(|n| n.bytes().all(|b| printable(b) && b != b','))
        .ok_or_else(|| {
            scram_error(
                SqlState::PROTOCOL_VIOLATION,
                "non-printable characters in SCRAM nonce",
                None,
            )
        })?;
    while !c.at_end() {
        c.any_attr()?;
    }
    Ok(ClientFirst {
        gs2_header,
        bare,
        nonce,
    })
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
        let ScramReply::Continue(first) = server.handle_response(client.client_first()).unwrap()
        else {
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
            plain.handle_initial_response(
                SCRAM_SHA_256_PLUS,
                Some(b"p=tls-server-end-point,,n=,r=a")
            ),
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
