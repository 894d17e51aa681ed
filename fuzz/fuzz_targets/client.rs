//! The client's decoder (backend messages) on arbitrary bytes: never panics, never buffers
//! past its limit, and what it decodes survives an encode/decode round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol_codec::{ClientCodec, ServerCodec};

#[path = "roundtrip.rs"]
mod roundtrip;

fuzz_target!(|data: &[u8]| {
    roundtrip::check(
        ClientCodec::with_max_message_len(roundtrip::MAX),
        ServerCodec::new(),
        data,
    );
});
