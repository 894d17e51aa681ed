//! The gateway's JSON encodings of protobuf fields.
//!
//! The gateway is grpc-gateway's proto3 JSON mapping of etcd's gRPC API (field names as in
//! the `.proto` files, `OrigName`): `bytes` fields (keys, values) are standard base64 with
//! padding; 64-bit integers (revisions, lease IDs, TTLs, the header's IDs) are JSON strings;
//! enums are their names; a field at its zero value (0, false, empty, the first enum value
//! such as `PUT` or `EQUAL`) is left out. Streaming calls (`/v3/watch`,
//! `/v3/lease/keepalive`) answer with one JSON object per message, each ending in a newline,
//! as `{"result": ...}` or `{"error": {...}}`, inside a chunked body that stays open.
//! Requests here send the same forms (the gateway also accepts numbers for int64 fields).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Deserializer};

/// Base64 of a `bytes` field.
pub(crate) fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// An int64 field as the gateway writes it.
pub(crate) fn int(value: i64) -> String {
    value.to_string()
}

/// Deserializes a `bytes` field (base64; missing is empty, see `#[serde(default)]`).
pub(crate) fn de_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = Option::<String>::deserialize(d)?.unwrap_or_default();
    STANDARD
        .decode(text.as_bytes())
        .map_err(|e| serde::de::Error::custom(format!("bad base64: {e}")))
}

/// Deserializes a 64-bit integer written as a JSON string (or, leniently, a number).
pub(crate) fn de_int<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr + Default,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Wire {
        Text(String),
        Signed(i64),
        Unsigned(u64),
    }
    let text = match Option::<Wire>::deserialize(d)? {
        None => return Ok(T::default()),
        Some(Wire::Text(text)) => text,
        Some(Wire::Signed(n)) => n.to_string(),
        Some(Wire::Unsigned(n)) => n.to_string(),
    };
    text.parse()
        .map_err(|_| serde::de::Error::custom(format!("bad integer {text:?}")))
}

/// One message of a streaming call.
#[derive(Deserialize)]
pub(crate) struct StreamMessage<T> {
    pub(crate) result: Option<T>,
    pub(crate) error: Option<StreamError>,
}

/// A streaming call's error message (grpc-gateway's stream error body).
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct StreamError {
    pub(crate) grpc_code: i64,
    pub(crate) http_code: i64,
    pub(crate) message: String,
}

/// A unary call's error body: `{"error": "...", "code": 5, "message": "..."}`.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct ErrorBody {
    pub(crate) error: String,
    pub(crate) code: i64,
    pub(crate) message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Default, Debug)]
    #[serde(default)]
    struct Sample {
        #[serde(deserialize_with = "de_int")]
        revision: i64,
        #[serde(deserialize_with = "de_int")]
        member_id: u64,
        #[serde(deserialize_with = "de_bytes")]
        key: Vec<u8>,
    }

    fn check(json: &str) -> Result<Sample, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn decodes_gateway_forms() {
        let s = check(r#"{"revision":"42","member_id":"18446744073709551615","key":"Zm9v"}"#)
            .expect("decodes");
        assert_eq!(s.revision, 42);
        assert_eq!(s.member_id, u64::MAX);
        assert_eq!(s.key, b"foo");
        let s = check(r#"{"revision":7}"#).expect("numbers too");
        assert_eq!(s.revision, 7);
        let s = check("{}").expect("zero values are left out");
        assert_eq!((s.revision, s.key.len()), (0, 0));
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(int(-1), "-1");
    }

    #[test]
    fn refuses_bad_fields() {
        assert!(check(r#"{"revision":"x1"}"#)
            .unwrap_err()
            .contains("bad integer"));
        assert!(check(r#"{"key":"!!"}"#).unwrap_err().contains("bad base64"));
        assert!(check(r#"{"member_id":"-1"}"#).is_err());
    }
}
