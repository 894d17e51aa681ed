//! The small files beside `pg_wal`: control data, slots (both in a CRC'd JSON envelope and
//! replaced atomically through `durable.rs`) and the flush pointer (updated in place).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use wal_types::{Lsn, SystemId, TimelineId};

use crate::io::{Io, FP_POINTER};
use crate::{HistoryEntry, Result, Role, WalError, WalFormat};

/// The version of the control and slot files this code writes and reads.
pub(crate) const FILE_VERSION: u32 = 1;

// Format of the control and slot files (text):
//
//   walserver-<kind> crc32c=XXXXXXXX\n<JSON body>
//
// The CRC32C (8 hex digits) covers the JSON body bytes. The body carries `"version": 1`; an
// unknown version is refused with an error naming it.

/// The bytes of a small file beside `pg_wal`, or `None` if there is none; an error names the
/// file.
pub(crate) fn read_if_exists(io: &Io, path: &Path) -> Result<Option<Vec<u8>>> {
    io.read_file_if_exists(path)
        .map_err(|e| WalError::io(format!("reading {}", path.display()), e))
}

pub(crate) fn encode_envelope<T: Serialize>(kind: &str, body: &T) -> Vec<u8> {
    let json = serde_json::to_vec_pretty(body).expect("control data serializes");
    let mut out = format!("walserver-{kind} crc32c={:08x}\n", crc32c::crc32c(&json)).into_bytes();
    out.extend_from_slice(&json);
    out
}

/// For tests: a fresh data directory with its `tmp/`, and an `Io` that fsyncs: what the
/// small files beside pg_wal are written through.
#[cfg(test)]
pub(crate) fn scratch_dir() -> (tempfile::TempDir, PathBuf, Io) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("create tmp");
    (dir, tmp, Io::new(true))
}

/// For tests: flips one bit of the JSON body of the envelope file at `path`, as a torn or
/// rotten write would, so that its CRC no longer matches.
#[cfg(test)]
pub(crate) fn damage_envelope(path: &Path) {
    let mut bytes = std::fs::read(path).expect("read the file to damage");
    let last = bytes.len() - 2;
    bytes[last] ^= 1;
    std::fs::write(path, &bytes).expect("write the damaged file");
}

/// For tests: writes `body` as the `kind` file `name` of a fresh directory, damaged, and
/// checks that `load` (given the directory) refuses it as a bad file rather than taking it
/// as absent or as something else.
#[cfg(test)]
pub(crate) fn assert_damaged_envelope_refused<T: Serialize, L: std::fmt::Debug>(
    name: &str,
    kind: &str,
    body: &T,
    load: impl FnOnce(&Path) -> Result<L>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, encode_envelope(kind, body)).expect("write the file");
    damage_envelope(&path);
    let e = load(dir.path()).expect_err("a damaged file loaded");
    assert!(matches!(e, WalError::BadFile { .. }), "{e}");
}

pub(crate) fn decode_envelope<T: DeserializeOwned>(
    kind: &str,
    path: &Path,
    bytes: &[u8],
) -> Result<T> {
    let bad = |reason: String| WalError::BadFile {
        path: path.to_path_buf(),
        reason,
    };
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| bad("no header line".into()))?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| bad("bad header".into()))?;
    let crc_hex = header
        .strip_prefix(&format!("walserver-{kind} crc32c="))
        .ok_or_else(|| {
            bad(format!(
                "header {header:?} is not a walserver-{kind} header"
            ))
        })?;
    let crc = u32::from_str_radix(crc_hex, 16).map_err(|_| bad("bad CRC field".into()))?;
    let body = &bytes[nl + 1..];
    if crc32c::crc32c(body) != crc {
        return Err(bad("CRC mismatch".into()));
    }
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("bad JSON: {e}")))?;
    let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0) as u32;
    if version != FILE_VERSION {
        return Err(WalError::UnknownVersion {
            path: path.to_path_buf(),
            found: version,
            supported: FILE_VERSION,
        });
    }
    serde_json::from_value(value).map_err(|e| bad(format!("bad contents: {e}")))
}

/// The control file's body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ControlData {
    pub version: u32,
    pub system_identifier: SystemId,
    pub wal_format: WalFormat,
    pub segment_size: u64,
    /// The current timeline.
    pub timeline: TimelineId,
    /// The current timeline's ancestry, oldest first.
    pub history: Vec<HistoryEntry>,
    /// Where this node's WAL of the current timeline begins: the init position or the switch
    /// point. Nothing on the current timeline is below it except copies in the switch segment.
    pub timeline_start: Lsn,
    /// The first LSN this node ever stored (the init position).
    pub wal_start: Lsn,
    /// A durable position of the current timeline when this file was last written; the flush
    /// pointer is newer whenever it names the same timeline.
    pub durable_lsn: Lsn,
    /// The node's role. Absent in files written before it was recorded (still version 1:
    /// readers that do not know it ignore it, and it reads back as `None`), which keep the
    /// meaning they had: `standby.signal`'s presence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// The durable end this node had when it stopped being a primary, until an explicit cut
    /// (`Wal::truncate_to`, `Wal::truncate_beyond`) dropped WAL below it: the overlapped
    /// commit's rule-4 floor for WAL this node wrote, and may have acknowledged, itself.
    /// Absent in files of earlier versions and on nodes that never stopped being a primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_end: Option<Lsn>,
}

pub(crate) fn read_control(io: &Io, path: &Path) -> Result<ControlData> {
    let bytes = io
        .read_file(path)
        .map_err(|e| WalError::io(format!("reading {}", path.display()), e))?;
    decode_envelope("control", path, &bytes)
}

// Format of DATA/flush_pointer: two 512-byte slots (so a torn sector hits one slot at most),
// written alternately in place with pwrite + fdatasync. Each slot, little-endian:
//
//   | magic u32 "WSFP" | version u16 = 1 | flags u16 | seq u64 | timeline u32 | reserved u32 |
//   | end LSN u64 | crc32c u32 (of the 32 bytes before it) |
//
// flags bit 0 (EXACT): the end is exact, recovery must not look for records beyond it; set after
// a truncation or recovery, cleared by the next write. On open the valid slot with the highest
// sequence number wins.

const POINTER_MAGIC: u32 = u32::from_le_bytes(*b"WSFP");
const POINTER_SLOT: u64 = 512;
pub(crate) const POINTER_EXACT: u16 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlushPointer {
    pub seq: u64,
    pub timeline: TimelineId,
    pub end: Lsn,
    pub exact: bool,
}

impl FlushPointer {
    fn encode(&self) -> [u8; 36] {
        let mut b = [0u8; 36];
        b[0..4].copy_from_slice(&POINTER_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&1u16.to_le_bytes());
        let flags = if self.exact { POINTER_EXACT } else { 0 };
        b[6..8].copy_from_slice(&flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.timeline.0.to_le_bytes());
        b[24..32].copy_from_slice(&self.end.0.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..32]);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<FlushPointer> {
        if b.len() < 36 {
            return None;
        }
        let crc = u32::from_le_bytes(b[32..36].try_into().ok()?);
        if crc32c::crc32c(&b[0..32]) != crc
            || u32::from_le_bytes(b[0..4].try_into().ok()?) != POINTER_MAGIC
            || u16::from_le_bytes(b[4..6].try_into().ok()?) != 1
        {
            return None;
        }
        let flags = u16::from_le_bytes(b[6..8].try_into().ok()?);
        Some(FlushPointer {
            seq: u64::from_le_bytes(b[8..16].try_into().ok()?),
            timeline: TimelineId(u32::from_le_bytes(b[16..20].try_into().ok()?)),
            end: Lsn(u64::from_le_bytes(b[24..32].try_into().ok()?)),
            exact: flags & POINTER_EXACT != 0,
        })
    }
}

/// The open flush pointer file and the last pointer stored in it.
#[derive(Debug)]
pub(crate) struct PointerFile {
    file: File,
    path: PathBuf,
    pub(crate) last: FlushPointer,
}

impl PointerFile {
    /// The bytes of a new file whose both slots hold `initial`.
    pub(crate) fn layout(initial: FlushPointer) -> Vec<u8> {
        let mut buf = vec![0u8; 2 * POINTER_SLOT as usize];
        let enc = initial.encode();
        buf[..36].copy_from_slice(&enc);
        buf[POINTER_SLOT as usize..POINTER_SLOT as usize + 36].copy_from_slice(&enc);
        buf
    }

    /// Creates the file with both slots holding `initial`, durably (the caller fsyncs the dir).
    pub(crate) fn create(io: &Io, path: &Path, initial: FlushPointer) -> Result<()> {
        let buf = Self::layout(initial);
        let f = io
            .create(path)
            .map_err(|e| WalError::io(format!("creating {}", path.display()), e))?;
        io.pwrite_all(&f, &buf, 0, FP_POINTER)
            .and_then(|_| io.sync_all(&f, FP_POINTER))
            .map_err(|e| WalError::io(format!("writing {}", path.display()), e))
    }

    pub(crate) fn open(io: &Io, path: &Path) -> Result<PointerFile> {
        let ctx = |what: &str| format!("{what} {}", path.display());
        let file = io
            .open(path, OpenOptions::new().read(true).write(true))
            .map_err(|e| WalError::io(ctx("opening"), e))?;
        let buf = io
            .pread_exact(&file, 2 * POINTER_SLOT as usize, 0)
            .map_err(|e| WalError::io(ctx("reading"), e))?;
        let slots = [
            buf.get(..36).and_then(FlushPointer::decode),
            buf.get(POINTER_SLOT as usize..)
                .and_then(FlushPointer::decode),
        ];
        let last = slots
            .into_iter()
            .flatten()
            .max_by_key(|p| p.seq)
            .ok_or_else(|| WalError::BadFile {
                path: path.to_path_buf(),
                reason: "neither flush pointer slot is valid".into(),
            })?;
        Ok(PointerFile {
            file,
            path: path.to_path_buf(),
            last,
        })
    }

    /// Stores a new pointer durably in the slot not holding the newest one.
    pub(crate) fn store(
        &mut self,
        io: &Io,
        timeline: TimelineId,
        end: Lsn,
        exact: bool,
    ) -> Result<()> {
        let p = FlushPointer {
            seq: self.last.seq + 1,
            timeline,
            end,
            exact,
        };
        let offset = (p.seq % 2) * POINTER_SLOT;
        io.pwrite_all(&self.file, &p.encode(), offset, FP_POINTER)
            .and_then(|_| io.sync_data(&self.file, FP_POINTER))
            .map_err(|e| WalError::io(format!("writing {}", self.path.display()), e))?;
        self.last = p;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Body {
        version: u32,
        x: u32,
    }

    #[test]
    fn envelope_roundtrip_and_damage() {
        let p = Path::new("/x/control");
        let bytes = encode_envelope("control", &Body { version: 1, x: 7 });
        assert!(bytes.starts_with(b"walserver-control crc32c="));
        let back: Body = decode_envelope("control", p, &bytes).unwrap();
        assert_eq!(back, Body { version: 1, x: 7 });
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 3] ^= 1;
        assert!(decode_envelope::<Body>("control", p, &bad).is_err());
        assert!(decode_envelope::<Body>("slot", p, &bytes).is_err());
        let v2 = encode_envelope("control", &Body { version: 2, x: 7 });
        let err = decode_envelope::<Body>("control", p, &v2).unwrap_err();
        assert!(
            matches!(err, WalError::UnknownVersion { found: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("version 2"));
    }

    #[test]
    fn pointer_slots_alternate_and_survive_a_torn_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flush_pointer");
        let io = Io::new(true);
        let first = FlushPointer {
            seq: 1,
            timeline: TimelineId(1),
            end: Lsn(0x100_0000),
            exact: true,
        };
        PointerFile::create(&io, &path, first).unwrap();
        let mut pf = PointerFile::open(&io, &path).unwrap();
        assert_eq!(pf.last, first);
        pf.store(&io, TimelineId(1), Lsn(0x100_0100), false)
            .unwrap();
        pf.store(&io, TimelineId(1), Lsn(0x100_0200), false)
            .unwrap();
        let pf2 = PointerFile::open(&io, &path).unwrap();
        assert_eq!(pf2.last.end, Lsn(0x100_0200));
        assert_eq!(pf2.last.seq, 3);
        // Tear the newest slot (seq 3 sits in slot 1): the older one wins.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_at(&[0xFF; 8], POINTER_SLOT + 24).unwrap();
        let pf3 = PointerFile::open(&io, &path).unwrap();
        assert_eq!(pf3.last.end, Lsn(0x100_0100));
        // Both torn: an error, not a guess.
        f.write_at(&[0xFF; 8], 24).unwrap();
        assert!(PointerFile::open(&io, &path).is_err());
    }
}
