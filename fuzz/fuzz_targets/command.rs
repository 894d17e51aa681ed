//! The replication command parser on arbitrary text: never panics, and every command it
//! accepts prints back to text that parses to the same command.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol_codec::command::{parse_command, ReplicationCommand};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cmd) = parse_command(text) {
        if !matches!(
            cmd,
            ReplicationCommand::Sql { .. } | ReplicationCommand::NotSupported { .. }
        ) {
            assert_eq!(parse_command(&cmd.to_string()), Ok(cmd));
        }
    }
});
