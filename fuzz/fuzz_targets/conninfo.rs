//! The libpq connection string parser on arbitrary text: never panics, and what it accepts
//! prints (without the password) to a string that parses to the same settings. The same text
//! read as a password file never panics either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol_codec::conninfo::ConnInfo;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = protocol_codec::passfile::find_password(text, "h", 5432, "replication", "u");
    if let Ok(mut info) = ConnInfo::parse(text) {
        let printed = info.to_string_without_password();
        let again = ConnInfo::parse(&printed).expect("printed conninfo parses");
        info.password = None;
        assert_eq!(again, info);
    }
});
