//! What both ends of a SCRAM-SHA-256 exchange share: the mechanism names, PostgreSQL's
//! iteration count, and the digests the server derives its keys and proofs with (the client
//! side runs postgres-protocol's own).

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest as _, Sha256};

/// The SASL mechanism without channel binding, always offered. Over TLS a server that knows
/// its certificate's tls-server-end-point data also offers [`SCRAM_SHA_256_PLUS`]
/// ([`ScramServer::with_channel_binding`](crate::auth::ScramServer::with_channel_binding)).
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// The PLUS variant, with channel binding, which PostgreSQL offers on TLS connections.
pub const SCRAM_SHA_256_PLUS: &str = "SCRAM-SHA-256-PLUS";

/// PostgreSQL's default SCRAM iteration count.
pub const SCRAM_DEFAULT_ITERATIONS: u32 = 4096;

type HmacSha256 = Hmac<Sha256>;

pub(super) fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

pub(super) fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// SASLprep as PostgreSQL applies it: if the password is valid UTF-8 and SASLprep accepts it,
/// its prepared form; otherwise the raw bytes.
pub(super) fn saslprep(password: &str) -> Vec<u8> {
    match stringprep::saslprep(password) {
        Ok(p) => p.into_owned().into_bytes(),
        Err(_) => password.as_bytes().to_vec(),
    }
}
