//! The server side of a SCRAM-SHA-256 exchange ([`ScramServer`]), and its reading of the
//! client's messages byte by byte as PostgreSQL 15's `auth-scram.c` reads them, refused with
//! its SQLSTATEs, texts and details.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use subtle::ConstantTimeEq;

use super::failure::{failed, AuthError};
use super::scram::{hmac, sha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS};
use super::verifier::ScramVerifier;
use crate::messages::{AuthRequest, SqlState};

/// PostgreSQL's server nonce length in raw bytes (`SCRAM_RAW_NONCE_LEN`).
const SCRAM_RAW_NONCE_LEN: usize = 18;

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
    pub(super) fn respond_to_client_first(
        &mut self,
        first: ClientFirst<'_>,
        server_nonce: &str,
    ) -> Vec<u8> {
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
pub(super) struct ClientFirst<'a> {
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
pub(super) fn read_client_first(
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
