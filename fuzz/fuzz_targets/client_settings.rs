//! A startup packet's parameters as the server reads them, on arbitrary text: never panics;
//! a `wal_sender_timeout` it accepts is one PostgreSQL allows (0 to 2^31 - 1 ms); a refusal is
//! a FATAL with a SQLSTATE and a message. And each value, read as a parameter of every kind
//! (boolean, integer and real with units, enum, encoding, date style, application name):
//! what is accepted reads back as itself in the form SHOW gives it.
//!
//! Input: parameters separated by 0x00 bytes, each `name` 0x01 `value`; invalid UTF-8 is
//! replaced, as the codec hands the server only text.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use protocol_codec::client_settings::{format_ms, parse_ms, ClientSettings};
use protocol_codec::parameter_values::canonical;

/// One parameter of each kind of value.
const KINDS: [&str; 10] = [
    "enable_seqscan",
    "extra_float_digits",
    "work_mem",
    "temp_buffers",
    "statement_timeout",
    "vacuum_cost_delay",
    "seq_page_cost",
    "synchronous_commit",
    "client_encoding",
    "DateStyle",
];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let params: Vec<(String, String)> = text
        .split('\0')
        .map(|p| match p.split_once('\u{1}') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => ("options".to_string(), p.to_string()),
        })
        .collect();
    for (_, value) in &params {
        for name in KINDS.iter().chain(["application_name"].iter()) {
            let Ok(shown) = canonical(name, value, "ISO, MDY") else {
                continue;
            };
            let again = canonical(name, &shown, "ISO, MDY").expect("what SHOW gives reads back");
            // A real with a unit may need a second round, as in PostgreSQL: 1.000002 ms
            // shows as "1000us" (six digits), which reads back as 1 ms and shows as "1ms".
            let settled = if *name == "vacuum_cost_delay" || *name == "seq_page_cost" {
                canonical(name, &again, "ISO, MDY").expect("and again")
            } else {
                again.clone()
            };
            assert_eq!(settled, again, "{name} = {value:?} shows as {shown:?}");
            if *name != "vacuum_cost_delay" && *name != "seq_page_cost" {
                assert_eq!(again, shown, "{name} = {value:?}");
            }
        }
    }
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
