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
//!
//! Layout, one concern a file, every name re-exported here so callers say `auth::X`:
//! `failure` (the one error type, [`AuthError`]), `scram` (what both ends of SCRAM share:
//! mechanism names, digests), `verifier` (the stored forms), `password` (md5 and cleartext),
//! `scram_server` and `authenticator` (the client's side). Imports run one way: a file uses
//! only those listed before it.

mod authenticator;
mod failure;
mod password;
mod scram;
mod scram_server;
#[cfg(test)]
mod tests;
mod verifier;

pub use authenticator::{ChannelBinding, ChannelBindingMode, ClientAuthenticator, ScramClient};
pub use failure::AuthError;
pub use password::{md5_response, random_md5_salt, verify_cleartext, verify_md5};
pub use scram::{SCRAM_DEFAULT_ITERATIONS, SCRAM_SHA_256, SCRAM_SHA_256_PLUS};
pub use scram_server::{ScramReply, ScramServer};
pub use verifier::{make_md5_verifier, make_scram_verifier, ScramVerifier};
