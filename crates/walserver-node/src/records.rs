//! The body format of many records in one request or response,
//! `application/x-walserver-records`: each record is a big-endian u32 length, then that many
//! bytes. `POST /wal` takes it, `GET /wal?format=binary` gives it, and the CLI's `append` and
//! the load tool write it.
//!
//! Format: `{ len: u32 (big-endian) | bytes: [u8; len] }*`; an empty body holds no record.

use bytes::{Buf, Bytes};

/// The content type of a body holding many records, each a big-endian u32 length then bytes.
pub const RECORDS_CONTENT_TYPE: &str = "application/x-walserver-records";

/// Splits a length-delimited body into records. A torn body is refused with the index of the
/// record it tears and the byte offset of that record's length from the start of the body.
pub fn split_records(mut body: Bytes) -> Result<Vec<Bytes>, String> {
    let total = body.len();
    let mut out = Vec::new();
    while !body.is_empty() {
        let at = total - body.len();
        if body.len() < 4 {
            return Err(format!(
                "record {} at byte {at}: truncated length ({} of 4 bytes)",
                out.len(),
                body.len()
            ));
        }
        let len = body.get_u32() as usize;
        if body.len() < len {
            return Err(format!(
                "record {} at byte {at}: claims {len} bytes but only {} remain",
                out.len(),
                body.len()
            ));
        }
        out.push(body.split_to(len));
    }
    Ok(out)
}

/// Joins records into a length-delimited body.
pub fn join_records<'a>(records: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        out.extend_from_slice(&(r.len() as u32).to_be_bytes());
        out.extend_from_slice(r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_torn_bodies_are_refused() {
        let records: [&[u8]; 3] = [b"one", b"", b"three"];
        let body = join_records(records);
        assert_eq!(&body[..7], b"\0\0\0\x03one");
        let split = split_records(Bytes::from(body.clone())).unwrap();
        assert_eq!(split, records.map(Bytes::from_static));
        assert!(split_records(Bytes::new()).unwrap().is_empty());
        // A length cut short, and a length claiming more than the body holds.
        let e = split_records(Bytes::from(body[..body.len() - 1].to_vec())).unwrap_err();
        assert_eq!(e, "record 2 at byte 11: claims 5 bytes but only 4 remain");
        let e = split_records(Bytes::from_static(b"\0\0\0\x01a\0\0")).unwrap_err();
        assert_eq!(e, "record 1 at byte 5: truncated length (2 of 4 bytes)");
    }
}
