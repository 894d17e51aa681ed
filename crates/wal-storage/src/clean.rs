//! The clean-shutdown mark: a primary that may have sent early on its timeline (the
//! early-send mark, `early.rs`) begins a new timeline at its next start (rule 5), except after
//! a clean shutdown, which it records here; taking this mark then removes the early-send mark.
//!
//! A new timeline at start exists because a synchronous standby may hold WAL this node wrote,
//! sent early and lost in a crash. After a clean shutdown that cannot be: appends were refused
//! and the walsenders had stopped, and the mark is written on the writer thread between
//! batches, after everything written is durable. So this node's durable end is at or past
//! every byte any standby received, and a standby's copy of the timeline is a prefix of this
//! node's; resuming the timeline writes nothing at an LSN a standby holds. The mark names the
//! timeline and the durable end it was written at, and counts only if the next open finds
//! exactly those. It is taken at every start, removed durably before anything is appended, so
//! that a crash after that start is never taken for a clean shutdown.

// Format of DATA/clean_shutdown (the control file's envelope, `files.rs`):
//
//   walserver-clean crc32c=XXXXXXXX\n{"version": 1, "timeline": N, "end": "X/X"}

use std::path::Path;

use serde::{Deserialize, Serialize};
use wal_types::{Lsn, TimelineId};

use crate::durable::{remove_with, write_atomic_with};
use crate::files::{decode_envelope, encode_envelope, read_if_exists, FILE_VERSION};
use crate::io::Io;
use crate::Result;

const KIND: &str = "clean";
const FILE: &str = "clean_shutdown";

#[derive(Serialize, Deserialize)]
struct MarkFile {
    version: u32,
    timeline: TimelineId,
    end: Lsn,
}

/// Writes the mark: a clean shutdown with everything up to `end` of `timeline` durable.
pub(crate) fn write(io: &Io, tmp: &Path, dir: &Path, timeline: TimelineId, end: Lsn) -> Result<()> {
    let body = MarkFile {
        version: FILE_VERSION,
        timeline,
        end,
    };
    write_atomic_with(io, tmp, &dir.join(FILE), &encode_envelope(KIND, &body))
}

/// Reads the mark, if there is one, and removes it durably. A damaged mark is removed too,
/// and counts as none: the safe side is a new timeline.
pub(crate) fn take(io: &Io, dir: &Path) -> Result<Option<(TimelineId, Lsn)>> {
    let path = dir.join(FILE);
    let Some(bytes) = read_if_exists(io, &path)? else {
        return Ok(None);
    };
    let mark = decode_envelope::<MarkFile>(KIND, &path, &bytes).ok();
    remove_with(io, &path)?;
    Ok(mark.map(|m| (m.timeline, m.end)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{damage_envelope, scratch_dir};

    #[test]
    fn a_mark_is_taken_once_and_a_damaged_one_counts_as_none() {
        let (dir, tmp, io) = scratch_dir();
        assert_eq!(take(&io, dir.path()).unwrap(), None);
        write(&io, &tmp, dir.path(), TimelineId(3), Lsn(500)).unwrap();
        assert_eq!(
            take(&io, dir.path()).unwrap(),
            Some((TimelineId(3), Lsn(500)))
        );
        assert_eq!(take(&io, dir.path()).unwrap(), None, "taken");
        write(&io, &tmp, dir.path(), TimelineId(3), Lsn(500)).unwrap();
        let path = dir.path().join(FILE);
        damage_envelope(&path);
        assert_eq!(take(&io, dir.path()).unwrap(), None);
        assert!(!path.exists(), "a damaged mark is removed too");
    }
}
