//! `archive_compression`: how an object's bytes are stored.
//!
//! A compressed object's name carries its compression's suffix (`NAME.zst`), so a restore
//! knows how to read it from the name alone, and one archive can hold objects of both kinds
//! (a node whose setting changed). The checksum sidecar stays `NAME.crc32c`, of the bytes
//! before compression: a restore checks what it hands on, not what was stored.

use std::io::Read;

use bytes::Bytes;

use crate::error::{ArchiveError, Result};

/// zstd's level 1, not its default 3: on pgbench's WAL (16 MiB segments, this project's
/// 2-core VM) level 1 took about 35% less CPU than 3 (36 ms against 55 ms a segment) for
/// about 17% more bytes, and both shrink such WAL tenfold or more. An archiver runs beside the
/// database it serves, whose CPU is dearer than the store's bytes. Restore reads any level;
/// `benches/archive-compare.sh` gives pgBackRest the same one.
const ZSTD_LEVEL: i32 = 1;

/// How objects are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// As they are.
    #[default]
    None,
    /// zstd, one frame per object, under `NAME.zst`.
    Zstd,
}

impl Compression {
    /// Every compression, for a reader that looks for a file under each name it may have.
    pub const ALL: [Compression; 2] = [Compression::None, Compression::Zstd];

    /// Parses `archive_compression`: `none` or `zstd`.
    pub fn parse(text: &str) -> Result<Compression> {
        match text {
            "none" => Ok(Compression::None),
            "zstd" => Ok(Compression::Zstd),
            other => Err(ArchiveError::BadCompression(other.to_string())),
        }
    }

    /// The suffix a stored object's name carries.
    pub fn suffix(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Zstd => ".zst",
        }
    }

    /// The name of the object that holds the file `name` stored this way.
    pub fn object_name(self, name: &str) -> String {
        format!("{name}{}", self.suffix())
    }

    /// The stored form of `bytes` (uncompressed, the same buffer). CPU-bound: run it off an
    /// actor's thread.
    pub fn encode(self, bytes: &Bytes) -> Result<Bytes> {
        match self {
            Compression::None => Ok(bytes.clone()),
            Compression::Zstd => {
                compress_zstd(bytes).map_err(|e| ArchiveError::io("compressing with zstd", e))
            }
        }
    }

    /// The file's bytes from its stored form, refusing to produce more than `limit` bytes:
    /// a damaged or foreign object must not make a reader allocate without bound.
    pub fn decode(self, stored: &[u8], limit: u64) -> Result<Vec<u8>> {
        match self {
            Compression::None if stored.len() as u64 > limit => Err(too_long(limit)),
            Compression::None => Ok(stored.to_vec()),
            Compression::Zstd => {
                let decoder = zstd::stream::read::Decoder::new(stored)
                    .map_err(|e| ArchiveError::io("reading a zstd object", e))?;
                let mut out = Vec::new();
                decoder
                    .take(limit.saturating_add(1))
                    .read_to_end(&mut out)
                    .map_err(|e| ArchiveError::io("decompressing a zstd object", e))?;
                if out.len() as u64 > limit {
                    return Err(too_long(limit));
                }
                Ok(out)
            }
        }
    }
}

thread_local! {
    /// Each upload thread's zstd output buffer, of the bound for the largest input it met, kept
    /// between objects. A fresh 16 MiB buffer per segment cost its pages' first-touch faults
    /// (and their return at free) on every segment: about 9% of the archiver's CPU in a
    /// profile of a zstd backlog drain. Only the compressed bytes are copied out.
    static ZSTD_OUT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One zstd frame of `bytes`, compressed through this thread's output buffer.
fn compress_zstd(bytes: &[u8]) -> std::io::Result<Bytes> {
    ZSTD_OUT.with_borrow_mut(|out| {
        out.clear();
        out.reserve(zstd::zstd_safe::compress_bound(bytes.len()));
        let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
        compressor.compress_to_buffer(bytes, out)?;
        Ok(Bytes::copy_from_slice(out))
    })
}

fn too_long(limit: u64) -> ArchiveError {
    ArchiveError::io(
        "reading an archived object",
        std::io::Error::other(format!("it holds more than the {limit} bytes expected")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_suffix_and_round_trip() {
        let bytes: Bytes = (0..100_000u32).map(|i| (i % 7) as u8).collect();
        for c in Compression::ALL {
            let stored = c.encode(&bytes).unwrap();
            assert_eq!(c.decode(&stored, bytes.len() as u64).unwrap(), bytes);
            assert!(c
                .object_name("000000010000000000000001")
                .starts_with("000000010000000000000001"));
        }
        assert_eq!(Compression::Zstd.object_name("a"), "a.zst");
        assert_eq!(Compression::None.object_name("a"), "a");
        assert!(Compression::Zstd.encode(&bytes).unwrap().len() < bytes.len() / 10);
        assert_eq!(Compression::parse("zstd").unwrap(), Compression::Zstd);
        assert_eq!(Compression::parse("none").unwrap(), Compression::None);
        assert!(Compression::parse("gzip").is_err());
    }

    #[test]
    fn one_thread_compresses_objects_of_any_size_one_after_another() {
        // The thread's output buffer serves every object: a smaller one after a larger must
        // come out as itself, with nothing of the one before.
        let large: Bytes = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let small: Bytes = (0..1_000u32).map(|i| (i % 13) as u8).collect();
        for bytes in [&large, &small, &large] {
            let stored = Compression::Zstd.encode(bytes).unwrap();
            let back = Compression::Zstd
                .decode(&stored, bytes.len() as u64)
                .unwrap();
            assert_eq!(&back[..], &bytes[..]);
        }
    }

    #[test]
    fn decoding_is_bounded_and_refuses_damage() {
        let bytes = Bytes::from(vec![0u8; 1 << 20]);
        let stored = Compression::Zstd.encode(&bytes).unwrap();
        assert!(Compression::Zstd.decode(&stored, 1000).is_err());
        assert!(Compression::None.decode(&bytes, 1000).is_err());
        let mut damaged = stored.clone();
        damaged.truncate(stored.len() / 2);
        assert!(Compression::Zstd.decode(&damaged, 1 << 20).is_err());
        assert!(Compression::Zstd.decode(b"not zstd", 1 << 20).is_err());
    }
}
