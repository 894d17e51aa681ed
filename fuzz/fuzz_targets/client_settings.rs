//! A startup packet's parameters as the server reads them, on arbitrary text: never panics;
//! a `wal_sender_timeout` it accepts is one PostgreSQL allows (0 to 2^31 - 1 ms); a refusal is
//! a FATAL with a SQLSTATE and a message.
//!
//! Input: parameters separated by 0x00 bytes, each `name` 0x01 `value`; invalid UTF-8 is
//! replaced, as the codec hands the server only text.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use protocol_codec::client_settings::{format_ms, parse_ms, ClientSettings};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let params: Vec<(String, String)> = text
        .split('\0')
        .map(|p| match p.split_once('\u{1}') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => ("options".to_string(), p.to_string()),
        })
        .collect();
    match ClientSettings::from_startup(&params) {
        Ok(s) => {
            if let Some(t) = s.wal_sender_timeout {
                assert!(t <= Duration::from_millis(i32::MAX as u64));
                // What SHOW prints reads back as the same value.
                let shown = format_ms(t);
                assert_eq!(parse_ms("wal_sender_timeout", &shown, 0, i32::MAX as i64).ok(), Some(t));
            }
        }
        Err(e) => {
            assert_eq!(e.get(b'S'), Some("FATAL"));
            assert!(e.code().is_some() && e.message().is_some());
        }
    }
});
