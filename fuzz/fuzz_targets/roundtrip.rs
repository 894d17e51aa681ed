//! What the `server` and `client` targets check, for either direction: `decoder` (with a
//! message limit of `MAX`) on arbitrary bytes never panics, never buffers far past its limit,
//! and every message it decodes, encoded by the other side's codec (`encoder`), decodes to
//! itself with nothing left over. Included by both targets with `#[path]`.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

pub const MAX: usize = 4096;

pub fn check<D, E>(mut decoder: D, mut encoder: E, data: &[u8])
where
    D: Decoder,
    D::Item: PartialEq + std::fmt::Debug,
    D::Error: std::fmt::Debug,
    E: for<'a> Encoder<&'a D::Item>,
    for<'a> <E as Encoder<&'a D::Item>>::Error: std::fmt::Debug,
{
    let mut src = BytesMut::from(data);
    loop {
        match decoder.decode(&mut src) {
            Ok(Some(msg)) => {
                let mut out = BytesMut::new();
                encoder
                    .encode(&msg, &mut out)
                    .expect("a decoded message encodes");
                let again = decoder
                    .decode(&mut out)
                    .expect("re-decodes")
                    .expect("whole");
                assert_eq!(again, msg);
                assert!(out.is_empty());
            }
            Ok(None) => {
                assert!(src.capacity() <= data.len().max(MAX + 5) * 2 + 64);
                break;
            }
            Err(_) => break,
        }
    }
}
