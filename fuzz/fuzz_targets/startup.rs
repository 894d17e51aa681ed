//! The startup-phase decoder on arbitrary bytes: never panics, never buffers past the
//! 10 000-byte cap, and every packet it accepts re-encodes to the bytes it came from.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use protocol_codec::{StartupCodec, MAX_STARTUP_PACKET_LEN};
use tokio_util::codec::{Decoder, Encoder};

fuzz_target!(|data: &[u8]| {
    let mut src = BytesMut::from(data);
    loop {
        let before = src.clone();
        match StartupCodec.decode(&mut src) {
            Ok(Some(packet)) => {
                let used = before.len() - src.len();
                let mut out = BytesMut::new();
                StartupCodec.encode(packet, &mut out).expect("a decoded packet encodes");
                assert_eq!(&out[..], &before[..used]);
            }
            Ok(None) => {
                assert!(src.capacity() <= data.len().max(MAX_STARTUP_PACKET_LEN) * 2 + 64);
                break;
            }
            Err(_) => break,
        }
    }
});
