//! The early-send mark: the timeline on which this node may have sent WAL past its own durable
//! end (the overlapped commit), kept durably, so that a primary restarted after a crash knows
//! whether a standby may hold a tail of its timeline that it lost (rule 5).
//!
//! Only a synchronous walserver standby is ever sent WAL before it is durable here. A primary
//! that never did so holds, after any crash, every byte any standby received, and may resume
//! its timeline as PostgreSQL does; one that did must begin a new timeline at its durable end,
//! or it would write different bytes at LSNs a standby already holds. So the first early send
//! on a timeline waits for this mark: a walsender asks for it ([`EarlySends::want`], memory
//! only), the background thread writes it (file, fsync, rename, directory fsync) and wakes the
//! position's subscribers, and until then the walsender keeps the flushed-end limit. No actor
//! waits for the write. The mark names a timeline, so a mark of an older timeline is simply
//! stale and nothing clears it at a promotion; a clean shutdown, after which every byte sent
//! is durable here, removes it ([`EarlySends::forget`]).
//!
//! **Invariant:** [`EarlySends::marked`] names a timeline only once its file is durable, and
//! an early send on a timeline happens only while it names that timeline.

// Format of DATA/early_sends (the control file's envelope, `files.rs`):
//
//   walserver-early crc32c=XXXXXXXX\n{"version": 1, "timeline": N}

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use wal_types::TimelineId;

use crate::durable::{remove_with, write_atomic_with};
use crate::files::{decode_envelope, encode_envelope, read_if_exists, FILE_VERSION};
use crate::io::Io;
use crate::Result;

const KIND: &str = "early";
const FILE: &str = "early_sends";

#[derive(Serialize, Deserialize)]
struct MarkFile {
    version: u32,
    timeline: TimelineId,
}

/// The early-send mark: the timeline it names on disk, and the one wanted there next.
#[derive(Debug)]
pub(crate) struct EarlySends {
    path: PathBuf,
    marks: Mutex<Marks>,
}

#[derive(Debug, Default)]
struct Marks {
    persisted: Option<TimelineId>,
    wanted: Option<TimelineId>,
    /// A write is queued for the background thread and has not yet read `wanted`.
    queued: bool,
}

impl EarlySends {
    /// Reads `DATA/early_sends`, if there is one. A damaged mark is taken to name `current`,
    /// the timeline the node opens on: the safe side is a new timeline.
    pub(crate) fn load(io: &Io, dir: &Path, current: TimelineId) -> Result<EarlySends> {
        let path = dir.join(FILE);
        let persisted = match read_if_exists(io, &path)? {
            Some(bytes) => match decode_envelope::<MarkFile>(KIND, &path, &bytes) {
                Ok(m) => Some(m.timeline),
                Err(e) => {
                    tracing::warn!(error = %e, timeline = %current, "the early-send mark is damaged; taking it to name the current timeline");
                    Some(current)
                }
            },
            None => None,
        };
        Ok(EarlySends {
            path,
            marks: Mutex::new(Marks {
                persisted,
                ..Marks::default()
            }),
        })
    }

    fn marks(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The timeline the mark on disk names.
    pub(crate) fn marked(&self) -> Option<TimelineId> {
        self.marks().persisted
    }

    /// Notes that early sends are wanted on `tli`. Returns the timeline the mark on disk
    /// names now, and whether a write must be queued for the background thread. Memory only.
    pub(crate) fn want(&self, tli: TimelineId) -> (Option<TimelineId>, bool) {
        let mut m = self.marks();
        if m.persisted == Some(tli) {
            return (m.persisted, false);
        }
        m.wanted = Some(tli);
        let queue = !m.queued;
        m.queued = true;
        (m.persisted, queue)
    }

    /// Writes the timeline wanted, if the mark on disk names another; returns it once it is
    /// durable (`None`: nothing to write). On the background thread only: it fsyncs.
    pub(crate) fn persist(&self, io: &Io, tmp: &Path) -> Result<Option<TimelineId>> {
        let target = {
            let mut m = self.marks();
            m.queued = false;
            match m.wanted {
                Some(w) if Some(w) != m.persisted => w,
                _ => return Ok(None),
            }
        };
        let body = MarkFile {
            version: FILE_VERSION,
            timeline: target,
        };
        write_atomic_with(io, tmp, &self.path, &encode_envelope(KIND, &body))?;
        self.marks().persisted = Some(target);
        Ok(Some(target))
    }

    /// Removes the mark durably: after a clean shutdown every byte any standby was sent is
    /// durable here, so no early send of the last run can fork from this node's WAL. Blocks.
    pub(crate) fn forget(&self, io: &Io) -> Result<()> {
        remove_with(io, &self.path)?;
        let mut m = self.marks();
        m.persisted = None;
        m.wanted = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{damage_envelope, scratch_dir};

    #[test]
    fn a_mark_is_written_once_per_timeline_and_survives_reload() {
        let (dir, tmp, io) = scratch_dir();
        let early = EarlySends::load(&io, dir.path(), TimelineId(1)).unwrap();
        assert_eq!(early.marked(), None);
        // The first wish queues a write; those made before it runs ride on it.
        assert_eq!(early.want(TimelineId(1)), (None, true));
        assert_eq!(early.want(TimelineId(1)), (None, false));
        assert_eq!(early.marked(), None, "not durable yet");
        assert_eq!(early.persist(&io, &tmp).unwrap(), Some(TimelineId(1)));
        assert_eq!(early.persist(&io, &tmp).unwrap(), None, "nothing newer");
        assert_eq!(early.want(TimelineId(1)), (Some(TimelineId(1)), false));
        let again = EarlySends::load(&io, dir.path(), TimelineId(1)).unwrap();
        assert_eq!(again.marked(), Some(TimelineId(1)));
        // A new timeline needs a mark of its own; the old one is stale.
        assert_eq!(again.want(TimelineId(2)), (Some(TimelineId(1)), true));
        assert_eq!(again.persist(&io, &tmp).unwrap(), Some(TimelineId(2)));
        assert_eq!(again.marked(), Some(TimelineId(2)));
        again.forget(&io).unwrap();
        assert_eq!(again.marked(), None);
        let after = EarlySends::load(&io, dir.path(), TimelineId(2)).unwrap();
        assert_eq!(after.marked(), None, "forgotten durably");
    }

    #[test]
    fn a_damaged_mark_names_the_current_timeline() {
        let (dir, tmp, io) = scratch_dir();
        let early = EarlySends::load(&io, dir.path(), TimelineId(1)).unwrap();
        early.want(TimelineId(1));
        early.persist(&io, &tmp).unwrap();
        damage_envelope(&dir.path().join(FILE));
        let again = EarlySends::load(&io, dir.path(), TimelineId(4)).unwrap();
        assert_eq!(again.marked(), Some(TimelineId(4)));
    }
}
