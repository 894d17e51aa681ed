//! Helpers shared by the unit tests.

/// Bytes from hex digits; whitespace is ignored so vectors can be grouped by field.
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digits"))
        .collect()
}
