//! md5 and cleartext password authentication, both sides: the client's md5 answer, and the
//! server's checks of an answer against what is stored for the role.

use md5::{Digest as _, Md5};
use subtle::ConstantTimeEq;

use super::failure::{failed, AuthError};
use super::verifier::{make_md5_verifier, ScramVerifier};

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

/// Lower-case hex of the md5 of `parts`, one after the other.
pub(super) fn md5_hex(parts: &[&[u8]]) -> String {
    let mut h = Md5::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
