//! The client's decoder (backend messages) on arbitrary bytes: never panics, never buffers
//! past its limit, and what it decodes survives an encode/decode round trip.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use protocol_codec::{ClientCodec, ServerCodec};
use tokio_util::codec::{Decoder, Encoder};

const MAX: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let mut codec = ClientCodec::with_max_message_len(MAX);
    let mut src = BytesMut::from(data);
    loop {
        match codec.decode(&mut src) {
            Ok(Some(msg)) => {
                let mut out = BytesMut::new();
                ServerCodec::new().encode(&msg, &mut out).expect("a decoded message encodes");
                let again = codec.decode(&mut out).expect("re-decodes").expect("whole");
                assert_eq!(again, msg);
                assert!(out.is_empty());
            }
            Ok(None) => {
                assert!(src.capacity() <= data.len().max(MAX + 5) * 2 + 64);
                break;
            }
            Err(_) => break,
        }
    }
});
