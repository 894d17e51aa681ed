//! CopyData payloads in both directions (XLogData, keepalive, walserver's commit point,
//! status update, hot standby feedback, anything else), and the password-message parsers that
//! read raw 'p' bodies.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use protocol_codec::messages::{parse_password, parse_sasl_initial_response};
use protocol_codec::{BackendMessage, FrontendMessage};

fuzz_target!(|data: &[u8]| {
    let payload = Bytes::copy_from_slice(data);
    if let Ok(msg) = FrontendMessage::decode(b'd', payload.clone()) {
        let mut out = BytesMut::new();
        msg.encode(&mut out).expect("encodes");
        assert_eq!(FrontendMessage::decode(b'd', out.freeze().slice(5..)).unwrap(), msg);
    }
    if let Ok(msg) = BackendMessage::decode(b'd', payload.clone()) {
        let mut out = BytesMut::new();
        msg.encode(&mut out).expect("encodes");
        assert_eq!(BackendMessage::decode(b'd', out.freeze().slice(5..)).unwrap(), msg);
    }
    let _ = parse_password(&payload);
    let _ = parse_sasl_initial_response(&payload);
});
