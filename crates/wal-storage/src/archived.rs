//! The archived position: how far a node's WAL has been copied to its archive, kept durably
//! so that retention never removes a segment the archive does not have yet.
//!
//! It plays the part of PostgreSQL's `pg_wal/archive_status/*.ready` and `.done` files with
//! one position instead of a file per segment: the archiver copies segments in LSN order and
//! never skips one, so "every completed segment below `archived`" says all the `.done` files
//! would. While the hold exists, retention keeps every segment from the one holding
//! `archived` on, whatever `wal_keep_size` or a slot says; a slot is still invalidated by
//! `max_slot_wal_keep_size` as before (the hold keeps the files, not the slot).
//!
//! The hold exists only while archiving is on: the archiver takes it when it starts
//! ([`Wal::hold_for_archive`](crate::Wal::hold_for_archive)) and a node started with archiving
//! off releases it, as PostgreSQL ignores `.ready` files with `archive_mode = off`.
//!
//! **Invariant:** `archived` moves only forward (except back to a cut made by
//! [`Wal::truncate_to`](crate::Wal::truncate_to), which only retains more), and its file is written (fsync'd, renamed,
//! the directory fsync'd) before the new value holds in memory, so retention never removes a
//! segment on the strength of a position a crash could take back.

//! The archive's backlog bound (`archive_max_backlog`) is the other half: the archiver says
//! when what waits for the archive crossed it ([`Wal::set_archive_backlog`](crate::Wal::set_archive_backlog)),
//! and while it is past it [`Wal::append`](crate::Wal::append) refuses with
//! [`WalError::ArchiveBacklog`], a retryable error naming the archive, and a relay's
//! walreceiver stops reading from its upstream (whose slot then holds the WAL), both woken by
//! the same watch when it falls. It is memory only: after a restart the archiver says again.

// Format of DATA/archive_status (the control file's envelope, `files.rs`):
//
//   walserver-archive crc32c=XXXXXXXX\n{"version": 1, "archived": "X/X"}

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use wal_types::Lsn;

use crate::durable::{remove_with, write_atomic_with};
use crate::files::{decode_envelope, encode_envelope, read_if_exists, FILE_VERSION};
use crate::io::Io;
use crate::Result;

const KIND: &str = "archive";

/// WAL waiting for the archive past `archive_max_backlog`: while storage's gate holds one,
/// appends are refused and relays stop reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchiveBacklog {
    /// Bytes durable here and not yet in the archive as whole segments.
    pub backlog: u64,
    /// `archive_max_backlog`.
    pub bound: u64,
}

#[derive(Serialize, Deserialize)]
struct ArchiveFile {
    version: u32,
    archived: Lsn,
}

/// The archive's hold on retention: `None` while archiving is off.
#[derive(Debug)]
pub(crate) struct ArchiveHold {
    path: PathBuf,
    archived: Option<Lsn>,
}

impl ArchiveHold {
    /// Reads `DATA/archive_status`, if there is one.
    pub(crate) fn load(io: &Io, dir: &Path) -> Result<ArchiveHold> {
        let path = dir.join("archive_status");
        let archived = match read_if_exists(io, &path)? {
            Some(bytes) => Some(decode_envelope::<ArchiveFile>(KIND, &path, &bytes)?.archived),
            None => None,
        };
        Ok(ArchiveHold { path, archived })
    }

    pub(crate) fn archived(&self) -> Option<Lsn> {
        self.archived
    }

    /// The first segment retention must keep for the archive, if archiving holds any.
    pub(crate) fn keep_segno(&self, segment_size: u64) -> Option<u64> {
        self.archived.map(|a| a.segment_number(segment_size))
    }

    /// Takes the hold at `from` unless it is already held; returns the position held.
    pub(crate) fn hold(&mut self, io: &Io, tmp: &Path, from: Lsn) -> Result<Lsn> {
        match self.archived {
            Some(a) => Ok(a),
            None => {
                self.store(io, tmp, from)?;
                Ok(from)
            }
        }
    }

    /// Moves the position forward to `upto`; `false` if it was not behind (or not held).
    pub(crate) fn advance(&mut self, io: &Io, tmp: &Path, upto: Lsn) -> Result<bool> {
        match self.archived {
            Some(a) if a < upto => {
                self.store(io, tmp, upto)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Moves the position back to `to` if it is beyond it: the WAL was cut there, and what
    /// the new history writes from the cut's segment on is not archived yet. Retaining more is
    /// always safe, so this is the one move backwards.
    pub(crate) fn rewind(&mut self, io: &Io, tmp: &Path, to: Lsn) -> Result<()> {
        match self.archived {
            Some(a) if a > to => self.store(io, tmp, to),
            _ => Ok(()),
        }
    }

    /// Drops the hold and its file.
    pub(crate) fn release(&mut self, io: &Io) -> Result<()> {
        if self.archived.is_some() {
            remove_with(io, &self.path)?;
            self.archived = None;
        }
        Ok(())
    }

    fn store(&mut self, io: &Io, tmp: &Path, lsn: Lsn) -> Result<()> {
        let body = ArchiveFile {
            version: FILE_VERSION,
            archived: lsn,
        };
        write_atomic_with(io, tmp, &self.path, &encode_envelope(KIND, &body))?;
        self.archived = Some(lsn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{assert_damaged_envelope_refused, scratch_dir};

    #[test]
    fn hold_advances_forward_only_and_survives_reload() {
        let (dir, tmp, io) = scratch_dir();
        let mut h = ArchiveHold::load(&io, dir.path()).unwrap();
        assert_eq!(h.archived(), None);
        assert!(
            !h.advance(&io, &tmp, Lsn(5 << 20)).unwrap(),
            "no hold, no move"
        );
        assert_eq!(h.hold(&io, &tmp, Lsn(1 << 20)).unwrap(), Lsn(1 << 20));
        // A second hold keeps the first position.
        assert_eq!(h.hold(&io, &tmp, Lsn(9 << 20)).unwrap(), Lsn(1 << 20));
        assert!(h.advance(&io, &tmp, Lsn(3 << 20)).unwrap());
        assert!(!h.advance(&io, &tmp, Lsn(2 << 20)).unwrap(), "never back");
        assert_eq!(h.keep_segno(1 << 20), Some(3));
        let again = ArchiveHold::load(&io, dir.path()).unwrap();
        assert_eq!(again.archived(), Some(Lsn(3 << 20)));
        h.release(&io).unwrap();
        assert_eq!(ArchiveHold::load(&io, dir.path()).unwrap().archived(), None);
    }

    #[test]
    fn a_damaged_file_is_refused() {
        let body = ArchiveFile {
            version: FILE_VERSION,
            archived: Lsn(7),
        };
        assert_damaged_envelope_refused("archive_status", KIND, &body, |dir| {
            ArchiveHold::load(&Io::new(true), dir)
        });
    }
}
