//! The names of member slots: one injective mapping from a member's name to a valid
//! PostgreSQL slot name under [`MEMBER_SLOT_PREFIX`], its inverse, and the check that a
//! configuration's own name has one. Pure functions; the slots' management is `slots.rs`.

use crate::config::FailoverConfig;

/// The prefix of every member slot.
pub const MEMBER_SLOT_PREFIX: &str = "walserver_member_";

/// PostgreSQL's longest slot name (`NAMEDATALEN - 1`).
const MAX_SLOT_NAME: usize = 63;

/// The slot of the member `name`, or `None` if its name would be longer than a slot name may
/// be. Injective: lower-case letters and digits stay; `_` becomes `__`, an upper-case letter
/// `_` and its lower case, `-` `_0`, `.` `_1`, any other byte `_2` and two hex digits, so
/// that two members never share a slot (`node-1` is `walserver_member_node_01`).
pub fn member_slot_name(name: &str) -> Option<String> {
    let mut slot = String::from(MEMBER_SLOT_PREFIX);
    for b in name.bytes() {
        match b {
            b'a'..=b'z' | b'0'..=b'9' => slot.push(char::from(b)),
            b'_' => slot.push_str("__"),
            b'A'..=b'Z' => {
                slot.push('_');
                slot.push(char::from(b.to_ascii_lowercase()));
            }
            b'-' => slot.push_str("_0"),
            b'.' => slot.push_str("_1"),
            other => slot.push_str(&format!("_2{other:02x}")),
        }
        if slot.len() > MAX_SLOT_NAME {
            return None;
        }
    }
    Some(slot)
}

/// The member whose slot is `slot` ([`member_slot_name`]'s inverse), or `None` if `slot` is
/// not a member slot.
pub fn slot_member(slot: &str) -> Option<String> {
    let rest = slot.strip_prefix(MEMBER_SLOT_PREFIX)?.as_bytes();
    let mut name = Vec::with_capacity(rest.len());
    let mut i = 0;
    while i < rest.len() {
        match rest[i] {
            b @ (b'a'..=b'z' | b'0'..=b'9') => name.push(b),
            b'_' => {
                i += 1;
                match *rest.get(i)? {
                    b'_' => name.push(b'_'),
                    b @ b'a'..=b'z' => name.push(b.to_ascii_uppercase()),
                    b'0' => name.push(b'-'),
                    b'1' => name.push(b'.'),
                    b'2' => {
                        let hex = std::str::from_utf8(rest.get(i + 1..i + 3)?).ok()?;
                        // Only what the mapping writes: lower-case hex of a byte it escapes.
                        let byte = u8::from_str_radix(hex, 16).ok()?;
                        if hex != format!("{byte:02x}") || member_slot_byte_is_plain(byte) {
                            return None;
                        }
                        name.push(byte);
                        i += 2;
                    }
                    _ => return None,
                }
            }
            _ => return None,
        }
        i += 1;
    }
    String::from_utf8(name).ok()
}

/// Whether the mapping writes `b` other than as `_2` and hex.
fn member_slot_byte_is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

/// Why a configuration cannot use member slots, if it cannot.
pub(crate) fn check_slot_name(config: &FailoverConfig) -> Result<(), String> {
    if config.use_slots && member_slot_name(&config.node_name).is_none() {
        return Err(format!(
            "node name {:?} is too long for its replication slot name (at most 63 bytes with the prefix {MEMBER_SLOT_PREFIX}, an upper-case letter, '_', '-' and '.' counting two)",
            config.node_name
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn names_map_to_valid_slot_names() {
        assert_eq!(
            member_slot_name("node1").as_deref(),
            Some("walserver_member_node1")
        );
        assert_eq!(
            member_slot_name("db.a_1-B").as_deref(),
            Some("walserver_member_db_1a__1_0_b")
        );
        for name in ["a", "node-1", "DB.Primary_2", "x".repeat(46).as_str()] {
            let slot = member_slot_name(name).expect("short enough");
            assert!(slot.len() <= 63, "{slot}");
            assert!(
                slot.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{slot} is not a valid slot name"
            );
            assert_eq!(slot_member(&slot).as_deref(), Some(name), "round trip");
        }
        // Even a byte the configuration refuses maps to a valid name.
        let odd = member_slot_name("a/é").expect("short enough");
        assert_eq!(odd, "walserver_member_a_22f_2c3_2a9");
        assert_eq!(slot_member(&odd).as_deref(), Some("a/é"));
    }

    #[test]
    fn names_that_would_be_too_long_have_no_slot() {
        assert!(member_slot_name(&"x".repeat(46)).is_some());
        assert!(member_slot_name(&"x".repeat(47)).is_none());
        // Escapes count twice.
        assert!(member_slot_name(&"-".repeat(23)).is_some());
        assert!(member_slot_name(&"-".repeat(24)).is_none());
        let mut config = FailoverConfig::new(vec![], "c", "y".repeat(47), "", "");
        assert!(check_slot_name(&config).is_err());
        config.use_slots = false;
        assert!(check_slot_name(&config).is_ok());
    }

    /// Names that differ only where a lossy mapping would merge them (case, `-` against `_`
    /// against `.`, an escape spelt out) get different slots.
    #[test]
    fn the_mapping_is_injective() {
        let names = [
            "a-b", "a_b", "a.b", "a__b", "a_0b", "A-b", "a-B", "ab", "Ab", "aB", "a_1b", "a_b_",
            "_ab", "a_2", "a_22d", "a-_", "a_-", "a__", "a",
        ];
        let slots: BTreeSet<String> = names
            .iter()
            .map(|n| member_slot_name(n).expect("short"))
            .collect();
        assert_eq!(slots.len(), names.len(), "{slots:?}");
        for n in names {
            let slot = member_slot_name(n).expect("short");
            assert_eq!(slot_member(&slot).as_deref(), Some(n));
        }
    }

    #[test]
    fn only_member_slots_decode() {
        assert_eq!(slot_member("standby1"), None);
        assert_eq!(slot_member("walserver_member_a_"), None);
        assert_eq!(slot_member("walserver_member_a_9"), None);
        // An escape the mapping never writes (a plain letter spelt in hex) is no member's.
        assert_eq!(slot_member("walserver_member__261"), None);
        assert_eq!(slot_member("walserver_member_").as_deref(), Some(""));
    }
}
