//! `archive_compression`: how an object's bytes are stored.
//!
//! A compressed object's name carries its compression's suffix (`NAME.zst`), so a restore
//! knows how to read it from the name alone, and one archive can hold objects of both kinds
//! (a node whose setting changed). The checksum sidecar stays `NAME.crc32c`, of the bytes
//! before compression: a restore checks what it hands on, not what was stored.

use std::io::Read;

use bytes::Bytes;

use crate::error::{ArchiveError, Result};

/// zstd's level when `archive_compression_level` is unset: -1, its first fast level. On
/// PostgreSQL 15's WAL from pgbench (16 MiB segments, `zstd -b` on one core of this project's
/// 2-core VM, quiet):
///
/// ```text
/// level                          3      1     -1     -2     -3
/// archive-compare's WAL  ms     46.3   29.7   23.7   21.8   21.9
///                        MiB     3.04   3.10   3.43   3.94   4.24
/// pgbench -i alone       ms     18.0   14.0   11.0    9.8    9.7
///                        MiB     0.87   1.00   1.16   1.51   1.74
/// ```
///
/// Down to -1 each step saves a larger share of CPU than it adds in bytes (3 to 1: 22-36%
/// less CPU for 2-15% more bytes; 1 to -1: 20-21% less for 11-16% more); the next, to -2,
/// saves 8-11% for 15-30% more bytes, and below -2 the CPU hardly falls. An archiver runs
/// beside the database it serves, whose CPU is dearer than the store's bytes, but not at any
/// price in bytes (each is stored for the archive's whole retention): -1, where the bytes
/// begin to grow faster than the CPU falls. pgBackRest's default is 3; restore reads any
/// level, and `benches/archive-compare.sh` gives pgBackRest the same one.
pub const DEFAULT_ZSTD_LEVEL: i32 = -1;

/// The levels `archive_compression_level` takes: pgBackRest's range for zstd (2.45 refuses
/// -8 and 23), so that a level chosen here can be given to it too. zstd's own fast levels go
/// further down, to no use on WAL: below -3 they take as much CPU and store more bytes.
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = -7..=22;

/// How objects are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// As they are.
    #[default]
    None,
    /// zstd, one frame per object, under `NAME.zst`, compressed at `level` (any level
    /// reads back the same way).
    Zstd { level: i32 },
}

impl Compression {
    /// zstd at [`DEFAULT_ZSTD_LEVEL`].
    pub const DEFAULT_ZSTD: Compression = Compression::Zstd {
        level: DEFAULT_ZSTD_LEVEL,
    };

    /// Every stored form, for a reader that looks for a file under each name it may have.
    pub const ALL: [Compression; 2] = [Compression::None, Compression::DEFAULT_ZSTD];

    /// Parses `archive_compression` (`none` or `zstd`) with `archive_compression_level`
    /// (zstd's level, in [`ZSTD_LEVELS`]; [`DEFAULT_ZSTD_LEVEL`] when `None`). A level with
    /// `none` is refused rather than ignored.
    pub fn parse(text: &str, level: Option<i32>) -> Result<Compression> {
        match (text, level) {
            ("none", None) => Ok(Compression::None),
            ("none", Some(level)) => Err(ArchiveError::BadCompressionLevel {
                level,
                reason: "archive_compression = none compresses nothing".into(),
            }),
            ("zstd", None) => Ok(Compression::DEFAULT_ZSTD),
            ("zstd", Some(level)) if ZSTD_LEVELS.contains(&level) => {
                Ok(Compression::Zstd { level })
            }
            ("zstd", Some(level)) => Err(ArchiveError::BadCompressionLevel {
                level,
                reason: format!(
                    "zstd's levels here run from {} to {}",
                    ZSTD_LEVELS.start(),
                    ZSTD_LEVELS.end()
                ),
            }),
            (other, _) => Err(ArchiveError::BadCompression(other.to_string())),
        }
    }

    /// Whether `self` and `other` store under the same name and read back the same way,
    /// whatever their levels.
    pub fn same_form(self, other: Compression) -> bool {
        self.suffix() == other.suffix()
    }

    /// The suffix a stored object's name carries.
    pub fn suffix(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Zstd { .. } => ".zst",
        }
    }

    /// The name of the object that holds the file `name` stored this way.
    pub fn object_name(self, name: &str) -> String {
        format!("{name}{}", self.suffix())
    }

    /// The stored form of `bytes` (uncompressed, the same buffer; compressed, this thread's
    /// output buffer, which a put hands back through `give_back`). CPU-bound: run it off an
    /// actor's thread.
    pub fn encode(self, bytes: &Bytes) -> Result<Bytes> {
        match self {
            Compression::None => Ok(bytes.clone()),
            Compression::Zstd { level } => compress_zstd(bytes, level)
                .map_err(|e| ArchiveError::io("compressing with zstd", e)),
        }
    }

    /// Hands a stored form from [`Compression::encode`] back, once sent, as this thread's
    /// output buffer for the next object, if nothing else holds it.
    pub(crate) fn give_back(self, stored: Bytes) {
        if self == Compression::None {
            return;
        }
        if let Ok(buffer) = stored.try_into_mut() {
            ZSTD.with_borrow_mut(|z| {
                if buffer.capacity() > z.out.capacity() {
                    z.out = Vec::from(buffer);
                }
            });
        }
    }

    /// The file's bytes from its stored form, refusing to produce more than `limit` bytes:
    /// a damaged or foreign object must not make a reader allocate without bound.
    pub fn decode(self, stored: &[u8], limit: u64) -> Result<Vec<u8>> {
        match self {
            Compression::None if stored.len() as u64 > limit => Err(too_long(limit)),
            Compression::None => Ok(stored.to_vec()),
            Compression::Zstd { .. } => {
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
    /// Each upload thread's zstd output buffer and context, kept between objects.
    static ZSTD: std::cell::RefCell<ThreadZstd> = const {
        std::cell::RefCell::new(ThreadZstd {
            out: Vec::new(),
            context: None,
        })
    };
}

struct ThreadZstd {
    /// Of the bound for the largest input this thread met. A fresh 16 MiB buffer per segment
    /// cost its pages' first-touch faults (and their return at free) on every segment: about
    /// 9% of the archiver's CPU in a profile of a zstd backlog drain. It leaves as the
    /// stored form (copying it out was another 2%, its fresh pages' faults included) and
    /// comes back through `give_back`.
    out: Vec<u8>,
    /// The context and the level it is set to. A fresh one per object allocated and faulted
    /// in its tables each time; a reused one only resets them (`ZSTD_compress2` starts a new
    /// frame with the same parameters, the same bytes out).
    context: Option<(i32, zstd::bulk::Compressor<'static>)>,
}

/// One zstd frame of `bytes` at `level`, compressed through this thread's buffer and context.
fn compress_zstd(bytes: &[u8], level: i32) -> std::io::Result<Bytes> {
    ZSTD.with_borrow_mut(|ThreadZstd { out, context }| {
        let compressor = match context {
            Some((set, compressor)) if *set == level => compressor,
            slot => &mut slot.insert((level, zstd::bulk::Compressor::new(level)?)).1,
        };
        out.clear();
        out.reserve(zstd::zstd_safe::compress_bound(bytes.len()));
        compressor.compress_to_buffer(bytes, out)?;
        Ok(Bytes::from(std::mem::take(out)))
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
        assert_eq!(Compression::DEFAULT_ZSTD.object_name("a"), "a.zst");
        assert_eq!(Compression::None.object_name("a"), "a");
        assert!(Compression::DEFAULT_ZSTD.encode(&bytes).unwrap().len() < bytes.len() / 10);
        assert_eq!(
            Compression::parse("zstd", None).unwrap(),
            Compression::DEFAULT_ZSTD
        );
        assert_eq!(Compression::parse("none", None).unwrap(), Compression::None);
        assert!(Compression::parse("gzip", None).is_err());
    }

    /// Runs, repeats at a distance and noise, which compress differently at each level.
    fn wal_like(len: u32) -> Bytes {
        let mut x = 7u32;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                if i % 64 < 40 {
                    (i / 512 % 256) as u8
                } else {
                    (x % 16) as u8
                }
            })
            .collect()
    }

    #[test]
    fn the_level_is_parsed_checked_and_used() {
        for level in [*ZSTD_LEVELS.start(), -2, 0, 1, *ZSTD_LEVELS.end()] {
            assert_eq!(
                Compression::parse("zstd", Some(level)).unwrap(),
                Compression::Zstd { level }
            );
        }
        for level in [ZSTD_LEVELS.start() - 1, ZSTD_LEVELS.end() + 1] {
            let e = Compression::parse("zstd", Some(level)).unwrap_err();
            assert!(e.to_string().contains(&level.to_string()), "{e}");
        }
        // A level says nothing to `none`: refused, not ignored.
        assert!(Compression::parse("none", Some(1)).is_err());
        // WAL-like bytes differ in size at a fast and a strong level, and each reads back to
        // the same bytes: the level is the one used.
        let bytes = wal_like(1_000_000);
        let fast = Compression::Zstd { level: -5 }.encode(&bytes).unwrap();
        let strong = Compression::Zstd { level: 19 }.encode(&bytes).unwrap();
        assert!(
            fast.len() > strong.len() * 11 / 10,
            "{} {}",
            fast.len(),
            strong.len()
        );
        for stored in [&fast, &strong] {
            let back = Compression::DEFAULT_ZSTD
                .decode(stored, bytes.len() as u64)
                .unwrap();
            assert_eq!(&back[..], &bytes[..]);
        }
        assert!(Compression::Zstd { level: -5 }.same_form(Compression::DEFAULT_ZSTD));
        assert!(!Compression::None.same_form(Compression::DEFAULT_ZSTD));
    }

    #[test]
    fn one_thread_compresses_objects_of_any_size_one_after_another() {
        // The thread's output buffer and context serve every object: a smaller one after a
        // larger must come out as itself, with nothing of the one before, and a level after
        // another as that level's frame, what a new thread makes of it.
        let large = wal_like(300_000);
        let small = wal_like(1_000);
        for (bytes, level) in [(&large, 1), (&small, 1), (&large, 19), (&large, 1)] {
            let c = Compression::Zstd { level };
            let stored = c.encode(bytes).unwrap();
            let fresh = std::thread::scope(|s| s.spawn(|| c.encode(bytes).unwrap()).join());
            assert_eq!(stored, fresh.unwrap(), "level {level}");
            let back = Compression::DEFAULT_ZSTD
                .decode(&stored, bytes.len() as u64)
                .unwrap();
            assert_eq!(&back[..], &bytes[..]);
            c.give_back(stored);
        }
        // Handed back, the stored form is the next object's room; still held elsewhere, it
        // is not taken back, and what holds it keeps its bytes.
        let kept = || ZSTD.with_borrow(|z| z.out.capacity());
        assert!(kept() >= zstd::zstd_safe::compress_bound(large.len()));
        let stored = Compression::DEFAULT_ZSTD.encode(&large).unwrap();
        assert_eq!(kept(), 0, "the stored form holds the buffer");
        let held = stored.clone();
        Compression::DEFAULT_ZSTD.give_back(stored);
        assert_eq!(kept(), 0, "a buffer still held was taken back");
        let again = Compression::DEFAULT_ZSTD.encode(&small).unwrap();
        assert_eq!(held, Compression::DEFAULT_ZSTD.encode(&large).unwrap());
        Compression::DEFAULT_ZSTD.give_back(again);
        assert!(kept() > 0);
    }

    #[test]
    fn decoding_is_bounded_and_refuses_damage() {
        let bytes = Bytes::from(vec![0u8; 1 << 20]);
        let stored = Compression::DEFAULT_ZSTD.encode(&bytes).unwrap();
        assert!(Compression::DEFAULT_ZSTD.decode(&stored, 1000).is_err());
        assert!(Compression::None.decode(&bytes, 1000).is_err());
        let mut damaged = stored.clone();
        damaged.truncate(stored.len() / 2);
        assert!(Compression::DEFAULT_ZSTD.decode(&damaged, 1 << 20).is_err());
        assert!(Compression::DEFAULT_ZSTD
            .decode(b"not zstd", 1 << 20)
            .is_err());
    }
}
