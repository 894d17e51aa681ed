//! Physical replication slots and the retention arithmetic they feed.
//!
//! A slot holds back WAL removal from its `restart_lsn` on. Persistent slots live in
//! `DATA/slots/NAME`, one file each, replaced atomically. Temporary slots live only in memory and
//! disappear when released or when the node stops, as PostgreSQL's do.
//!
//! Retention and `wal_status` follow PostgreSQL 15 (`KeepLogSeg` and `GetWALAvailability` in
//! xlog.c), in whole segments, with this crate's knobs standing for PostgreSQL's:
//!
//! - `keep_segno(cur)`: start from the current segment (of the written end). If a slot's
//!   restart LSN is older, go back to its segment, but (when `max_slot_wal_keep_size` is set) at
//!   most `max_slot_wal_keep_size / segment_size` segments back. Then make sure at least
//!   `wal_keep_size / segment_size` segments are kept behind the current one (never below
//!   segment 1). Segments below `keep_segno` are removed; a slot whose restart LSN is below the
//!   start of `keep_segno` is invalidated (its restart LSN is forgotten, `wal_status` is `lost`).
//! - `wal_status` of a slot whose restart segment is `t`: `reserved` if `t >= keep_segno` and `t`
//!   is within `max(max_wal_size, wal_keep_size) / segment_size + 1` segments of the current one;
//!   `extended` if `t >= keep_segno` but older than that; `unreserved` if `t < keep_segno` but the
//!   segment is still on disk (it goes at the next segment switch); `lost` if it was removed or
//!   the slot was invalidated. A slot that never reserved WAL has no status (NULL in PostgreSQL).
//! - `safe_wal_size`: NULL without `max_slot_wal_keep_size` or once lost, else
//!   `(t + max(slot_keep_segs, keep_segs) + 1) * segment_size - written`, which may be negative.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use wal_types::{Lsn, TimelineId};

use crate::durable::{remove_with, write_atomic_with};
use crate::files::{decode_envelope, encode_envelope, FILE_VERSION};
use crate::io::Io;
use crate::{Result, StorageConfig, WalError};

/// A slot's `wal_status`, as `pg_replication_slots` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WalStatus {
    Reserved,
    Extended,
    Unreserved,
    Lost,
}

impl WalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            WalStatus::Reserved => "reserved",
            WalStatus::Extended => "extended",
            WalStatus::Unreserved => "unreserved",
            WalStatus::Lost => "lost",
        }
    }
}

/// What `slots()` and `slot()` report: the facts of `pg_replication_slots` for a physical slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlotInfo {
    pub name: String,
    pub temporary: bool,
    /// `None` if the slot never reserved WAL or was invalidated.
    pub restart_lsn: Option<Lsn>,
    pub restart_tli: Option<TimelineId>,
    pub active: bool,
    /// The process id of the connection streaming from the slot (its walsender's, as its
    /// BackendKeyData gave it), as `pg_replication_slots.active_pid`.
    pub active_pid: Option<u32>,
    /// `None` (NULL in PostgreSQL) if the slot never reserved WAL.
    pub wal_status: Option<WalStatus>,
    pub safe_wal_size: Option<i64>,
}

/// Checks PostgreSQL's slot name rule (`ReplicationSlotValidateName`; the rule itself is
/// [`wal_types::validate_slot_name`]).
pub fn validate_slot_name(name: &str) -> Result<()> {
    wal_types::validate_slot_name(name).map_err(|_| WalError::SlotNameInvalid {
        name: name.to_string(),
    })
}

/// The oldest segment to keep, as PostgreSQL's `KeepLogSeg` computes it.
pub(crate) fn keep_segno(cur: Lsn, min_slot_lsn: Option<Lsn>, cfg: &StorageConfig) -> u64 {
    let seg = cfg.segment_size;
    let cur_seg = cur.segment_number(seg);
    let mut segno = cur_seg;
    if let Some(keep) = min_slot_lsn.filter(|k| k.is_valid() && *k < cur) {
        segno = keep.segment_number(seg);
        if let Some(max) = cfg.max_slot_wal_keep_size {
            let slot_keep_segs = max / seg;
            if cur_seg - segno > slot_keep_segs {
                segno = cur_seg - slot_keep_segs;
            }
        }
    }
    let keep_segs = cfg.wal_keep_size / seg;
    if keep_segs > 0 && cur_seg - segno < keep_segs {
        segno = if cur_seg <= keep_segs {
            1
        } else {
            cur_seg - keep_segs
        };
    }
    segno
}

/// `wal_status` and `safe_wal_size` of a slot whose restart LSN is `restart`, given the written
/// end `cur`, the minimum restart LSN over all valid slots and the oldest segment still on disk.
pub(crate) fn wal_status(
    restart: Lsn,
    cur: Lsn,
    min_slot_lsn: Option<Lsn>,
    oldest_seg_on_disk: u64,
    active: bool,
    cfg: &StorageConfig,
) -> (WalStatus, Option<i64>) {
    let seg = cfg.segment_size;
    let cur_seg = cur.segment_number(seg);
    let target = restart.segment_number(seg);
    let oldest_slot_seg = keep_segno(cur, min_slot_lsn, cfg);
    let keep_segs = cfg.max_wal_size.max(cfg.wal_keep_size) / seg + 1;
    let oldest_max_wal_size = if cur_seg > keep_segs {
        cur_seg - keep_segs
    } else {
        1
    };
    let status = if target >= oldest_slot_seg {
        if target >= oldest_max_wal_size {
            WalStatus::Reserved
        } else {
            WalStatus::Extended
        }
    } else if target >= oldest_seg_on_disk || active {
        // PostgreSQL shows a removed-but-active slot as unreserved: its walsender may already
        // have moved past the removed segment.
        WalStatus::Unreserved
    } else {
        WalStatus::Lost
    };
    let safe = match (status, cfg.max_slot_wal_keep_size) {
        (WalStatus::Lost, _) | (_, None) => None,
        (_, Some(max)) => {
            let fail_seg = target + (max / seg).max(cfg.wal_keep_size / seg) + 1;
            Some((fail_seg * seg).wrapping_sub(cur.0) as i64)
        }
    };
    (status, safe)
}

// Format of DATA/slots/NAME (the envelope of `files.rs`):
//
//   walserver-slot crc32c=XXXXXXXX
//   {"version": 1, "name": "...", "restart_lsn": "X/X" | null, "restart_tli": n | null,
//    "invalidated": false}
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SlotFile {
    version: u32,
    name: String,
    restart_lsn: Option<Lsn>,
    restart_tli: Option<TimelineId>,
    invalidated: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct Slot {
    pub temporary: bool,
    pub restart_lsn: Option<Lsn>,
    pub restart_tli: Option<TimelineId>,
    pub invalidated: bool,
    /// Who holds the slot (a walsender's process id), if anyone does.
    pub active_pid: Option<u32>,
    /// The restart LSN last written to disk; persisting again is due when the restart LSN moves
    /// to another segment.
    pub persisted_lsn: Option<Lsn>,
    pub dirty: bool,
}

/// Where slot files are written, and through what.
#[derive(Clone, Copy)]
pub(crate) struct SlotPaths<'a> {
    pub io: &'a Io,
    /// The directory for temp files of atomic replacements.
    pub tmp: &'a Path,
    /// `DATA/slots`.
    pub dir: &'a Path,
}

#[derive(Debug, Default)]
pub(crate) struct SlotTable {
    pub slots: BTreeMap<String, Slot>,
}

/// `SlotInUse`, naming the holder, if `slot` (named `name`) is held.
fn not_in_use(slot: &Slot, name: &str) -> Result<()> {
    match slot.active_pid {
        Some(pid) => Err(WalError::SlotInUse {
            name: name.to_string(),
            pid,
        }),
        None => Ok(()),
    }
}

impl SlotTable {
    pub(crate) fn load(io: &Io, dir: &Path) -> Result<SlotTable> {
        let mut table = SlotTable::default();
        let entries = io
            .read_dir(dir)
            .map_err(|e| WalError::io(format!("listing {}", dir.display()), e))?;
        for entry in entries {
            let path = entry.path();
            let bytes = io
                .read_file(&path)
                .map_err(|e| WalError::io(format!("reading {}", path.display()), e))?;
            let f: SlotFile = decode_envelope("slot", &path, &bytes)?;
            table.slots.insert(
                f.name,
                Slot {
                    temporary: false,
                    restart_lsn: f.restart_lsn,
                    restart_tli: f.restart_tli,
                    invalidated: f.invalidated,
                    active_pid: None,
                    persisted_lsn: f.restart_lsn,
                    dirty: false,
                },
            );
        }
        Ok(table)
    }

    /// Writes one slot's file atomically.
    pub(crate) fn persist(&mut self, paths: SlotPaths<'_>, name: &str) -> Result<()> {
        let slot = self
            .slots
            .get_mut(name)
            .expect("persisting a slot that exists");
        if slot.temporary {
            return Ok(());
        }
        let body = SlotFile {
            version: FILE_VERSION,
            name: name.to_string(),
            restart_lsn: slot.restart_lsn,
            restart_tli: slot.restart_tli,
            invalidated: slot.invalidated,
        };
        write_atomic_with(
            paths.io,
            paths.tmp,
            &paths.dir.join(name),
            &encode_envelope("slot", &body),
        )?;
        slot.persisted_lsn = slot.restart_lsn;
        slot.dirty = false;
        Ok(())
    }

    /// Adds a slot and persists it unless it is temporary; `restart` is where it reserves WAL
    /// from, if it does. Nothing changes if the name is taken or the file cannot be written.
    pub(crate) fn create(
        &mut self,
        paths: SlotPaths<'_>,
        name: &str,
        temporary: bool,
        restart: Option<(Lsn, TimelineId)>,
    ) -> Result<()> {
        validate_slot_name(name)?;
        if self.slots.contains_key(name) {
            return Err(WalError::SlotExists {
                name: name.to_string(),
            });
        }
        self.slots.insert(
            name.to_string(),
            Slot {
                temporary,
                restart_lsn: restart.map(|r| r.0),
                restart_tli: restart.map(|r| r.1),
                invalidated: false,
                active_pid: None,
                persisted_lsn: None,
                dirty: true,
            },
        );
        if let Err(e) = self.persist(paths, name) {
            self.slots.remove(name);
            // The file may have been renamed into place before the step that failed (the
            // directory's fsync); a slot whose creation failed must not come back at the next
            // open.
            if !temporary {
                let _ = remove_with(paths.io, &paths.dir.join(name));
            }
            return Err(e);
        }
        Ok(())
    }

    /// Removes a slot that is not in use, and its file durably.
    pub(crate) fn drop_slot(&mut self, paths: SlotPaths<'_>, name: &str) -> Result<()> {
        let slot = self.get_mut(name)?;
        not_in_use(slot, name)?;
        if !slot.temporary {
            remove_with(paths.io, &paths.dir.join(name))?;
        }
        self.slots.remove(name);
        Ok(())
    }

    /// Marks a slot in use by `pid`; `SlotInUse` if it already is.
    pub(crate) fn acquire(&mut self, name: &str, pid: u32) -> Result<()> {
        let slot = self.get_mut(name)?;
        not_in_use(slot, name)?;
        slot.active_pid = Some(pid);
        Ok(())
    }

    /// Marks a slot no longer in use, dropping it if it is temporary.
    pub(crate) fn release(&mut self, name: &str) {
        let temporary = match self.slots.get_mut(name) {
            Some(s) => {
                s.active_pid = None;
                s.temporary
            }
            None => false,
        };
        if temporary {
            self.slots.remove(name);
        }
    }

    /// Moves a slot's restart point. Returns true if persisting it is due: the slot is
    /// persistent and its restart point entered another segment than the one on disk.
    pub(crate) fn advance(
        &mut self,
        name: &str,
        restart_lsn: Lsn,
        restart_tli: TimelineId,
        segment_size: u64,
    ) -> Result<bool> {
        let slot = self.get_mut(name)?;
        if slot.invalidated {
            return Err(WalError::SlotInvalidated {
                name: name.to_string(),
            });
        }
        slot.restart_lsn = Some(restart_lsn);
        slot.restart_tli = Some(restart_tli);
        let due = slot.persisted_lsn.map(|p| p.segment_number(segment_size))
            != Some(restart_lsn.segment_number(segment_size));
        if slot.temporary {
            return Ok(false);
        }
        slot.dirty = true;
        Ok(due)
    }

    /// Every slot, by name, as `pg_replication_slots` shows it, given the written end and the
    /// oldest segment still on disk.
    pub(crate) fn infos(
        &self,
        written: Lsn,
        oldest_seg: u64,
        cfg: &StorageConfig,
    ) -> Vec<SlotInfo> {
        let min = self.min_restart_lsn();
        self.slots
            .iter()
            .map(|(name, s)| {
                let (wal_status, safe_wal_size) = match (s.invalidated, s.restart_lsn) {
                    (true, _) => (Some(WalStatus::Lost), None),
                    (false, None) => (None, None),
                    (false, Some(r)) => {
                        let (st, safe) =
                            wal_status(r, written, min, oldest_seg, s.active_pid.is_some(), cfg);
                        (Some(st), safe)
                    }
                };
                SlotInfo {
                    name: name.clone(),
                    temporary: s.temporary,
                    restart_lsn: if s.invalidated { None } else { s.restart_lsn },
                    restart_tli: s.restart_tli,
                    active: s.active_pid.is_some(),
                    active_pid: s.active_pid,
                    wal_status,
                    safe_wal_size,
                }
            })
            .collect()
    }

    fn get_mut(&mut self, name: &str) -> Result<&mut Slot> {
        self.slots
            .get_mut(name)
            .ok_or_else(|| WalError::SlotNotFound {
                name: name.to_string(),
            })
    }

    /// The oldest LSN the slots hold on disk: per slot that still holds WAL, the older of its
    /// restart LSN and, for a persistent slot, the one its file holds (what a crash brings
    /// back). Retention keeps WAL from here.
    pub(crate) fn min_kept_lsn(&self) -> Option<Lsn> {
        self.slots
            .values()
            .filter(|s| !s.invalidated)
            .flat_map(|s| [s.restart_lsn, s.persisted_lsn.filter(|_| !s.temporary)])
            .flatten()
            .min()
    }

    /// The minimum restart LSN over slots that still hold WAL.
    pub(crate) fn min_restart_lsn(&self) -> Option<Lsn> {
        self.slots
            .values()
            .filter(|s| !s.invalidated)
            .filter_map(|s| s.restart_lsn)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = 16 << 20;

    fn cfg(wal_keep: u64, max_slot: Option<u64>, max_wal: u64) -> StorageConfig {
        StorageConfig {
            wal_keep_size: wal_keep,
            max_slot_wal_keep_size: max_slot,
            max_wal_size: max_wal,
            ..StorageConfig::default()
        }
    }

    fn seg(n: u64) -> Lsn {
        Lsn(n * SEG)
    }

    #[test]
    fn slot_names() {
        for ok in ["a", "standby_1", "0", &"x".repeat(63)] {
            assert!(validate_slot_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "has-dash", "dot.", "sp ace", "é", &"x".repeat(64)] {
            assert!(
                matches!(
                    validate_slot_name(bad),
                    Err(WalError::SlotNameInvalid { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn keep_segno_follows_postgres() {
        let cur = seg(10) + 100;
        // Nothing holds WAL: only the current segment is kept.
        assert_eq!(keep_segno(cur, None, &cfg(0, None, 1 << 30)), 10);
        // A slot holds from its segment.
        assert_eq!(keep_segno(cur, Some(seg(3) + 5), &cfg(0, None, 1 << 30)), 3);
        // max_slot_wal_keep_size of 4 segments caps it.
        assert_eq!(
            keep_segno(cur, Some(seg(3)), &cfg(0, Some(4 * SEG), 1 << 30)),
            6
        );
        // A fraction of a segment rounds down, as PostgreSQL's ConvertToXSegs does.
        assert_eq!(
            keep_segno(cur, Some(seg(3)), &cfg(0, Some(4 * SEG + SEG / 2), 1 << 30)),
            6
        );
        // wal_keep_size keeps 2 segments behind the current one even with no slot.
        assert_eq!(keep_segno(cur, None, &cfg(2 * SEG, None, 1 << 30)), 8);
        // ... but does not shorten what a slot holds.
        assert_eq!(
            keep_segno(cur, Some(seg(5)), &cfg(2 * SEG, None, 1 << 30)),
            5
        );
        // ... and never goes below segment 1.
        assert_eq!(keep_segno(seg(3), None, &cfg(20 * SEG, None, 1 << 30)), 1);
        // A slot ahead of the current position holds nothing.
        assert_eq!(keep_segno(cur, Some(seg(11)), &cfg(0, None, 1 << 30)), 10);
        // max_slot_wal_keep_size = 0 keeps nothing for slots.
        assert_eq!(keep_segno(cur, Some(seg(3)), &cfg(0, Some(0), 1 << 30)), 10);
    }

    #[test]
    fn wal_status_follows_postgres() {
        let cur = seg(100);
        let c = cfg(0, Some(50 * SEG), 16 * SEG);
        let status = |restart: Lsn, min: Lsn, oldest: u64| {
            wal_status(restart, cur, Some(min), oldest, false, &c)
        };
        // Within max_wal_size (16 segments + 1) of the current segment: reserved.
        assert_eq!(status(seg(90), seg(90), 1).0, WalStatus::Reserved);
        assert_eq!(status(seg(83), seg(83), 1).0, WalStatus::Reserved);
        // Older than max_wal_size but within max_slot_wal_keep_size: extended.
        assert_eq!(status(seg(82), seg(82), 1).0, WalStatus::Extended);
        assert_eq!(status(seg(50), seg(50), 1).0, WalStatus::Extended);
        // Beyond max_slot_wal_keep_size but still on disk: unreserved.
        assert_eq!(status(seg(49), seg(49), 1).0, WalStatus::Unreserved);
        // Removed: lost.
        assert_eq!(status(seg(49), seg(49), 50).0, WalStatus::Lost);
        // Active slots whose segment was removed show as unreserved.
        assert_eq!(
            wal_status(seg(49), cur, Some(seg(49)), 50, true, &c).0,
            WalStatus::Unreserved
        );
        // safe_wal_size: bytes left before the slot's segment falls out of the 50 kept.
        assert_eq!(
            status(seg(90) + 10, seg(90), 1).1,
            Some(((90 + 50 + 1) * SEG - 100 * SEG) as i64)
        );
        assert_eq!(status(seg(49), seg(49), 1).1, Some(0));
        assert_eq!(status(seg(49), seg(49), 50).1, None);
        // Without max_slot_wal_keep_size there is no safe size, and nothing is unreserved.
        let unlimited = cfg(0, None, 16 * SEG);
        let (st, safe) = wal_status(seg(2), cur, Some(seg(2)), 1, false, &unlimited);
        assert_eq!((st, safe), (WalStatus::Extended, None));
    }
}
