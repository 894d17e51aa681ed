//! What a node stores for a role and checks a password against: a SCRAM-SHA-256 verifier
//! (parsed into [`ScramVerifier`]) or an md5 hash, and how each is made.

use std::sync::OnceLock;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use sha2::Sha256;

use super::failure::AuthError;
use super::scram::{hmac, saslprep, sha256, SCRAM_DEFAULT_ITERATIONS};

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
    pub(super) fn derive(password: &str, salt: &[u8], iterations: u32) -> ScramVerifier {
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
