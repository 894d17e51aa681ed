//! Reading the archive back: what a restore, a listing and a check need.
//!
//! Every object is handed out only after it matched its sidecar (`target.rs` writes it down:
//! the CRC32C and length of the object's bytes). A missing object is not an error, since
//! PostgreSQL's `restore_command` asks for files that do not exist (the history file of the
//! next timeline, a segment past the end); a damaged one is, and the error names it, so
//! nothing reads bytes the archive cannot vouch for. A sidecar without its object is what a
//! crash between the two puts leaves, and reads as missing.
//!
//! Object names are PostgreSQL's, as [`ArchivedFile`] parses them:
//!
//! ```text
//! TTTTTTTTXXXXXXXXYYYYYYYY                 a whole segment
//! TTTTTTTT.history                         a timeline history file
//! TTTTTTTTXXXXXXXXYYYYYYYY.partial         the old timeline's last segment at a promotion
//! TTTTTTTTXXXXXXXXYYYYYYYY.partial.EEEEEEEE  a durable prefix of a segment, up to offset E (hex)
//! NAME.crc32c                              NAME's sidecar, never listed as an object
//! ```

use std::fs;
use std::path::Path;

use wal_storage::{
    history_file_name, parse_history, parse_history_file_name, parse_segment_file_name,
    HistoryEntry,
};
use wal_types::{Lsn, TimelineId};

use crate::compression::Compression;
use crate::error::{ArchiveError, Result};
use crate::target::ArchiveTarget;

/// The suffix of a checksum sidecar.
pub const SIDECAR_SUFFIX: &str = ".crc32c";

/// One object of an archive, as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectInfo {
    /// The object's name in the archive.
    pub name: String,
    /// Its size as stored.
    pub size: u64,
}

/// What an object's name says it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ArchivedFile {
    /// `TTTTTTTT.history`.
    History(TimelineId),
    /// A whole segment.
    Segment { tli: TimelineId, segno: u64 },
    /// A segment's prefix: `end` is the LSN it covers up to when the name carries one
    /// (`archive_timeout`'s uploads); `None` for a promotion's `.partial`, which covers the
    /// old timeline up to its switch point.
    Partial {
        tli: TimelineId,
        segno: u64,
        end: Option<Lsn>,
    },
}

impl ArchivedFile {
    /// Parses an object's name; `None` for names that are no WAL file (sidecars, temporary
    /// files, anything else a person left in the archive).
    pub fn parse(name: &str, segment_size: u64) -> Option<ArchivedFile> {
        if let Some(tli) = parse_history_file_name(name) {
            return Some(ArchivedFile::History(tli));
        }
        let (segment, rest) = name.split_at_checked(24)?;
        let (tli, segno) = parse_segment_file_name(segment, segment_size)?;
        match rest {
            "" => Some(ArchivedFile::Segment { tli, segno }),
            ".partial" => Some(ArchivedFile::Partial {
                tli,
                segno,
                end: None,
            }),
            _ => {
                let hex = rest.strip_prefix(".partial.")?;
                if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                let offset = u64::from_str_radix(hex, 16).ok()?;
                // A prefix covers at least a byte and at most the segment.
                if offset == 0 || offset > segment_size {
                    return None;
                }
                Some(ArchivedFile::Partial {
                    tli,
                    segno,
                    end: Some(Lsn(segno * segment_size + offset)),
                })
            }
        }
    }

    /// The timeline the file belongs to.
    pub fn timeline(&self) -> TimelineId {
        match *self {
            ArchivedFile::History(tli)
            | ArchivedFile::Segment { tli, .. }
            | ArchivedFile::Partial { tli, .. } => tli,
        }
    }
}

/// A sidecar's contents: the object's CRC32C and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checksum {
    pub crc32c: u32,
    pub size: u64,
}

impl Checksum {
    /// Parses `crc32c=XXXXXXXX size=N` (with its newline), the only form `sidecar` writes.
    pub fn parse(text: &[u8]) -> Option<Checksum> {
        let text = std::str::from_utf8(text).ok()?.strip_suffix('\n')?;
        let (crc, size) = text.split_once(' ')?;
        let crc = crc.strip_prefix("crc32c=")?;
        let size = size.strip_prefix("size=")?;
        if crc.len() != 8 {
            return None;
        }
        Some(Checksum {
            crc32c: u32::from_str_radix(crc, 16).ok()?,
            size: size.parse().ok()?,
        })
    }

    /// Why `bytes` are not what this checksum describes, if they are not.
    pub fn mismatch(&self, bytes: &[u8]) -> Option<String> {
        if bytes.len() as u64 != self.size {
            return Some(format!(
                "{} bytes where its checksum says {}",
                bytes.len(),
                self.size
            ));
        }
        let crc = crc32c::crc32c(bytes);
        (crc != self.crc32c).then(|| {
            format!(
                "CRC32C {crc:08x} where its checksum says {:08x}",
                self.crc32c
            )
        })
    }
}

impl ArchiveTarget {
    /// The object `name`, checked against its sidecar: `Ok(None)` if the archive has no such
    /// object, [`ArchiveError::Corrupt`] naming it if its bytes or its sidecar are damaged.
    /// Blocking: run it on a blocking pool.
    pub fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        // One file has one stored form (`target.rs`); a compressed one carries its suffix.
        let mut found = None;
        for c in Compression::ALL {
            if let Some(stored) = self.get_raw(&c.object_name(name))? {
                found = Some((c, stored));
                break;
            }
        }
        let Some((compression, stored)) = found else {
            return Ok(None);
        };
        let corrupt = |reason: String| ArchiveError::Corrupt {
            name: name.to_string(),
            reason,
        };
        let Some(sidecar) = self.get_raw(&format!("{name}{SIDECAR_SUFFIX}"))? else {
            // The sidecar is put before its object, so an object without one was damaged.
            return Err(corrupt("its checksum sidecar is missing".into()));
        };
        let sum = Checksum::parse(&sidecar)
            .ok_or_else(|| corrupt("its checksum sidecar is unreadable".into()))?;
        // The checksum is of the bytes before compression; no more than it names is read.
        let bytes = compression
            .decode(&stored, sum.size)
            .map_err(|e| corrupt(format!("its stored form does not decode: {e}")))?;
        if let Some(reason) = sum.mismatch(&bytes) {
            return Err(corrupt(reason));
        }
        Ok(Some(bytes))
    }

    /// The ancestry of timeline `tli` (oldest first) from its history file, checked; empty
    /// for timeline 1, `None` if the archive has no history file of `tli`.
    pub fn history(&self, tli: TimelineId) -> Result<Option<Vec<HistoryEntry>>> {
        if tli == TimelineId::FIRST {
            return Ok(Some(Vec::new()));
        }
        let name = history_file_name(tli);
        let Some(bytes) = self.get(&name)? else {
            return Ok(None);
        };
        parse_history(&bytes)
            .map(Some)
            .map_err(|e| ArchiveError::Corrupt {
                name,
                reason: format!("it does not parse as a history file: {e}"),
            })
    }

    /// The checksum sidecar of `name`, if it has one that parses.
    pub fn checksum(&self, name: &str) -> Result<Option<Checksum>> {
        Ok(self
            .get_raw(&format!("{name}{SIDECAR_SUFFIX}"))?
            .and_then(|b| Checksum::parse(&b)))
    }

    /// The archive's segment size, as the sidecar of its first whole segment (or padded
    /// `.partial`) among `objects` gives it; `None` if it holds neither. Only a power of two
    /// from 1 MiB to 1 GiB counts, the sizes a segment can have.
    pub fn segment_size(&self, objects: &[ObjectInfo]) -> Result<Option<u64>> {
        let whole = |name: &str| {
            let (segment, rest) = name.split_at_checked(24).unwrap_or((name, "x"));
            segment.bytes().all(|b| b.is_ascii_hexdigit()) && matches!(rest, "" | ".partial")
        };
        for o in objects.iter().filter(|o| whole(&o.name)) {
            if let Some(sum) = self.checksum(&o.name)? {
                if sum.size.is_power_of_two() && ((1 << 20)..=(1 << 30)).contains(&sum.size) {
                    return Ok(Some(sum.size));
                }
            }
        }
        Ok(None)
    }

    /// Every file in the archive, sidecars, temporary files and the store's create-if-absent
    /// probes left out (a probe is removed at once, but an archiver killed or cut off from
    /// its store between the probe's create and its removal leaves one behind, with no
    /// sidecar: `target.rs`), by name: a compressed object is listed under its file's name
    /// (without `.zst`) and its stored size. Blocking: run it on a blocking pool.
    pub fn list(&self) -> Result<Vec<ObjectInfo>> {
        let stored = match self {
            ArchiveTarget::Directory(dir) => list_dir(dir)?,
            ArchiveTarget::Command(_) => return Err(crate::target::unreadable()),
            ArchiveTarget::S3(s3) => s3
                .list()?
                .into_iter()
                .filter(|(name, _)| !name.ends_with(SIDECAR_SUFFIX))
                .map(|(name, size)| ObjectInfo { name, size })
                .collect(),
        };
        let mut objects: Vec<ObjectInfo> = stored
            .into_iter()
            .filter(|o| !o.name.starts_with(crate::target::PROBE_PREFIX))
            .map(|o| ObjectInfo {
                name: Compression::ALL
                    .iter()
                    .filter(|c| !c.suffix().is_empty())
                    .find_map(|c| o.name.strip_suffix(c.suffix()))
                    .map_or(o.name.clone(), str::to_string),
                size: o.size,
            })
            .collect();
        objects.sort();
        Ok(objects)
    }

    /// When the file `name` (in whichever stored form) was stored: the directory entry's
    /// modification time, or the S3 object's `Last-Modified`, on the store's clock. A file
    /// is stored only after its bytes were durable on the node that stored it, so this is a
    /// bound on when they became durable: at or before it. `None` if absent. Blocking.
    pub fn stored_at(&self, name: &str) -> Result<Option<std::time::SystemTime>> {
        for object in Compression::ALL.map(|c| c.object_name(name)) {
            let at = match self {
                ArchiveTarget::Directory(dir) => {
                    let path = dir.join(&object);
                    match fs::metadata(&path).and_then(|m| m.modified()) {
                        Ok(t) => Some(t),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                        Err(e) => {
                            return Err(ArchiveError::io(format!("reading {}", path.display()), e))
                        }
                    }
                }
                ArchiveTarget::S3(s3) => s3.stored_at(&object)?,
                ArchiveTarget::Command(_) => return Err(crate::target::unreadable()),
            };
            if at.is_some() {
                return Ok(at);
            }
        }
        Ok(None)
    }

    /// An object's stored bytes, unchecked; `None` if absent.
    fn get_raw(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.read(name)
    }
}

fn list_dir(dir: &Path) -> Result<Vec<ObjectInfo>> {
    let context = || format!("listing the archive {}", dir.display());
    let mut objects = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| ArchiveError::io(context(), e))? {
        let entry = entry.map_err(|e| ArchiveError::io(context(), e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        // Temporary files of a put in flight begin with a dot (`target.rs`).
        if name.starts_with('.') || name.ends_with(SIDECAR_SUFFIX) {
            continue;
        }
        let meta = entry
            .metadata()
            .map_err(|e| ArchiveError::io(context(), e))?;
        if meta.is_file() {
            objects.push(ObjectInfo {
                name,
                size: meta.len(),
            });
        }
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::sidecar;

    const SEG: u64 = 16 << 20;

    #[test]
    fn names_parse_as_postgres_writes_them() {
        let check = |name: &str, want: Option<ArchivedFile>| {
            assert_eq!(ArchivedFile::parse(name, SEG), want, "{name}");
        };
        let (t1, t2) = (TimelineId(1), TimelineId(2));
        check("00000002.history", Some(ArchivedFile::History(t2)));
        check(
            "000000010000000000000003",
            Some(ArchivedFile::Segment { tli: t1, segno: 3 }),
        );
        check(
            "0000000100000001000000FF",
            Some(ArchivedFile::Segment {
                tli: t1,
                segno: 0x1FF,
            }),
        );
        check(
            "000000010000000000000003.partial",
            Some(ArchivedFile::Partial {
                tli: t1,
                segno: 3,
                end: None,
            }),
        );
        check(
            "000000010000000000000003.partial.00A00000",
            Some(ArchivedFile::Partial {
                tli: t1,
                segno: 3,
                end: Some(Lsn(0x3A0_0000)),
            }),
        );
        for not_wal in [
            "000000010000000000000003.crc32c",
            "000000010000000000000003.partial.0",
            "000000010000000000000003.partial.01000001",
            "000000010000000000000003.partial.",
            "000000010000000000000003.backup",
            "0000000100000000000000",
            "00000001000000000000000g",
            "000000010000000000000100",
            ".000000010000000000000003.1.tmp",
            "2.history",
            "notes.txt",
            "",
        ] {
            check(not_wal, None);
        }
    }

    #[test]
    fn sidecars_parse_and_judge_bytes() {
        let sum = Checksum::parse(sidecar(b"abc").as_bytes()).unwrap();
        assert_eq!(sum.size, 3);
        assert_eq!(sum.mismatch(b"abc"), None);
        assert!(sum.mismatch(b"abd").unwrap().contains("CRC32C"));
        assert!(sum.mismatch(b"abcd").unwrap().contains("4 bytes"));
        for bad in [
            "",
            "crc32c=1234567 size=3\n",
            "crc32c=12345678 size=3",
            "crc32c=1234567g size=3\n",
            "crc=12345678 size=3\n",
            "crc32c=12345678 size=-3\n",
        ] {
            assert_eq!(Checksum::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn get_hands_out_only_checked_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        let name = "000000010000000000000001";
        assert_eq!(t.get(name).unwrap(), None);
        // A crash between the sidecar and the object: still missing.
        fs::write(dir.path().join(format!("{name}.crc32c")), sidecar(b"abc")).unwrap();
        assert_eq!(t.get(name).unwrap(), None);
        t.put(name, &b"abc"[..], Compression::None).unwrap();
        assert_eq!(t.get(name).unwrap().as_deref(), Some(&b"abc"[..]));

        // A flipped byte, a damaged sidecar and a lost sidecar are each refused by name.
        fs::write(dir.path().join(name), b"abd").unwrap();
        let e = t.get(name).unwrap_err();
        assert!(
            matches!(&e, ArchiveError::Corrupt { name: n, .. } if n == name),
            "{e}"
        );
        assert!(e.to_string().contains(name), "{e}");
        fs::write(dir.path().join(name), b"abc").unwrap();
        fs::write(dir.path().join(format!("{name}.crc32c")), "crc32c=x\n").unwrap();
        assert!(matches!(t.get(name), Err(ArchiveError::Corrupt { .. })));
        fs::remove_file(dir.path().join(format!("{name}.crc32c"))).unwrap();
        assert!(matches!(t.get(name), Err(ArchiveError::Corrupt { .. })));
    }

    #[test]
    fn get_decompresses_and_checks_the_bytes_before_compression() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        let name = "000000010000000000000001";
        let bytes = vec![7u8; 100_000];
        t.put(name, bytes.clone(), Compression::DEFAULT_ZSTD)
            .unwrap();
        assert!(!dir.path().join(name).exists());
        assert_eq!(t.get(name).unwrap(), Some(bytes.clone()));
        // Damaged: it does not decode, or decodes to other bytes; either is refused.
        let zst = dir.path().join(format!("{name}.zst"));
        let stored = fs::read(&zst).unwrap();
        fs::write(&zst, &stored[..stored.len() - 3]).unwrap();
        assert!(matches!(t.get(name), Err(ArchiveError::Corrupt { .. })));
        fs::write(
            &zst,
            Compression::DEFAULT_ZSTD
                .encode(&bytes::Bytes::from(vec![8u8; 100_000]))
                .unwrap(),
        )
        .unwrap();
        assert!(matches!(t.get(name), Err(ArchiveError::Corrupt { .. })));
        // More than the checksum's size is never decompressed.
        fs::write(
            &zst,
            Compression::DEFAULT_ZSTD
                .encode(&bytes::Bytes::from(vec![7u8; 200_000]))
                .unwrap(),
        )
        .unwrap();
        assert!(matches!(t.get(name), Err(ArchiveError::Corrupt { .. })));
    }

    #[test]
    fn list_shows_objects_without_sidecars_temporaries_or_probes() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        t.put("000000010000000000000002", &b"seg2"[..], Compression::None)
            .unwrap();
        t.put(
            "00000002.history",
            &b"1\t0/2000000\tno recovery target\n"[..],
            Compression::DEFAULT_ZSTD,
        )
        .unwrap();
        fs::write(dir.path().join(".000000010000000000000003.7.tmp"), b"x").unwrap();
        fs::write(dir.path().join("walserver.probe.7.0123456789abcdef"), b"x").unwrap();
        fs::create_dir(dir.path().join("subdir")).unwrap();
        let names: Vec<_> = t.list().unwrap();
        assert_eq!(
            names,
            vec![
                ObjectInfo {
                    name: "000000010000000000000002".into(),
                    size: 4
                },
                // Listed under its file's name, with its stored size.
                ObjectInfo {
                    name: "00000002.history".into(),
                    size: fs::metadata(dir.path().join("00000002.history.zst"))
                        .unwrap()
                        .len()
                },
            ]
        );
        assert_eq!(
            t.segment_size(&names).unwrap(),
            None,
            "4 bytes is no segment size"
        );
        t.put(
            "000000010000000000000003",
            vec![0; 1 << 20],
            Compression::None,
        )
        .unwrap();
        assert_eq!(t.segment_size(&t.list().unwrap()).unwrap(), Some(1 << 20));
        let missing = ArchiveTarget::Directory(dir.path().join("missing"));
        assert!(matches!(missing.list(), Err(ArchiveError::Io { .. })));
    }
}
