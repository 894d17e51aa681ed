//! The server side of SCRAM on arbitrary client messages, with and without channel binding:
//! never panics, and never accepts a proof made without the password (the server's nonce is
//! random, so no input can carry a valid one).
//!
//! Input: the first byte chooses the mechanism (bit 0: SCRAM-SHA-256-PLUS), whether the
//! server offers binding (bit 1) and whether the initial response carries no data (bit 2);
//! the rest is client-first-message, then a 0xff byte, then client-final-message.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use protocol_codec::auth::{make_scram_verifier, ScramServer, SCRAM_SHA_256, SCRAM_SHA_256_PLUS};

/// One verifier for every run: making one costs 4 096 iterations of PBKDF2.
fn verifier() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| make_scram_verifier("secret"))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (first, last) = match rest.iter().position(|&b| b == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let mut server = ScramServer::new(verifier(), "u").expect("a valid verifier");
    if mode & 2 != 0 {
        server = server.with_channel_binding(vec![7; 32]);
    }
    let mechanism = if mode & 1 != 0 {
        SCRAM_SHA_256_PLUS
    } else {
        SCRAM_SHA_256
    };
    let mut steps = if mode & 4 != 0 {
        vec![None, Some(first), Some(last)]
    } else {
        vec![Some(first), Some(last)]
    }
    .into_iter();
    let initial = steps.next().expect("a first step");
    if server.handle_initial_response(mechanism, initial).is_err() {
        return;
    }
    for msg in steps.flatten() {
        match server.handle_response(msg) {
            Ok(protocol_codec::auth::ScramReply::Final(_)) => {
                panic!("authenticated without the password")
            }
            Ok(protocol_codec::auth::ScramReply::Continue(_)) => {}
            Err(_) => return,
        }
    }
});
