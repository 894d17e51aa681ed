//! The server's decoder (frontend messages) on arbitrary bytes: never panics, never buffers
//! past its limit, and what it decodes survives an encode/decode round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol_codec::{ClientCodec, ServerCodec};

#[path = "roundtrip.rs"]
mod roundtrip;

fuzz_target!(|data: &[u8]| {
    roundtrip::check(
        ServerCodec::with_max_message_len(roundtrip::MAX),
        ClientCodec::new(),
        data,
    );
});
