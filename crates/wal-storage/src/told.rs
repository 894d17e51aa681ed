//! The commit point a standby was told, kept durably, so that a restarted standby still
//! refuses to cut its WAL below it (the overlapped commit's rule 4) before its upstream has
//! told it again.
//!
//! A standby serves its readers (cascades, `GET /wal`, apply consumers, its archive) only up
//! to the commit point it knows. What it keeps must cover what it served, or a restart could
//! let it cut WAL a reader already took. So the point readers see is the one on disk: a told
//! point is first wanted ([`ToldCommit::want`]), the background thread writes the newest one
//! wanted, and only then is it published in the position. Writes are not made per message: at
//! most one is queued, and it writes whatever is newest when it runs, so under a stream of
//! commit points the published one trails the told one by about one write. That staleness is
//! safe: readers stop at the published point, and a cut-back after a restart may go down to
//! it, no lower; WAL between it and the told point was acknowledged, but is also durable on
//! the primary and its quorum, and no reader here was given it.
//!
//! A standby under load stores a point about once per commit, on the same disk as its WAL, so
//! a store is one write in place and one fdatasync: the file has the flush pointer's layout
//! (two CRC'd slots, the newer sequence wins, a torn write damages only the slot it went to;
//! `files.rs`), with the point as its end. Made whole once and renamed into place, it then
//! changes no file-system metadata. (Written file, fsync, rename and directory fsync per
//! point, as at first, it cost two flushes and a journal commit per commit on a standby's
//! disk.) A file in the envelope form of earlier versions is read once and replaced at the
//! first store.
//!
//! An explicit cut (the fork cut, `Wal::truncate_beyond`: `walserver rejoin`, or a member
//! following a new leader past its fork) may go below the told point, and then lowers it to
//! the cut ([`ToldCommit::cut_to`]). Past the cut nothing is this node's history any more:
//! what readers were served there belonged to the history the cut abandons, and the new
//! leader's WAL that will take its place was told by no one yet. Left where it was, the old
//! point would let readers here read that new WAL up to it, and would be a floor of rule 4
//! taken from the old history. The point is lowered (on disk, then published) before the WAL
//! is cut, so a crash between leaves a point at the cut above WAL not yet cut, never a point
//! above the cut once new WAL follows it.
//!
//! **Invariant:** the persisted point never moves back, except to an explicit cut, which
//! lowers it to the cut before the cut is made, and to the switch point of a timeline this
//! node follows that switched below it (the point belongs to the history left behind); it is published only after its file is
//! durable, and a lowered one is published before the cut is done. Whoever publishes a told
//! point reads the one on disk ([`ToldCommit::persisted`]) inside the state's lock, where a cut
//! lowers it before it lowers the published one, so a point read before a cut never lands
//! after it.

// Format of DATA/commit_point: the flush pointer's two slots (`files.rs`), the end LSN the
// commit point, the timeline 0. Earlier versions wrote the control file's envelope, which is
// still read:
//
//   walserver-commit crc32c=XXXXXXXX\n{"version": 1, "commit_point": "X/X"}

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use wal_types::{Lsn, TimelineId};

use crate::durable::write_atomic_with;
use crate::files::{decode_envelope, read_if_exists, FlushPointer, PointerFile};
use crate::io::Io;
use crate::Result;

const KIND: &str = "commit";
/// How a file in the envelope form begins.
const ENVELOPE_START: &[u8] = b"walserver-commit ";

/// The envelope form of earlier versions.
#[derive(Serialize, Deserialize)]
struct CommitFile {
    version: u32,
    commit_point: Lsn,
}

/// The told commit point: what is on disk, and what is wanted there next.
#[derive(Debug)]
pub(crate) struct ToldCommit {
    path: PathBuf,
    marks: Mutex<Marks>,
    /// The file, open for stores in place once it has the two-slot layout; only the
    /// background thread stores.
    file: Mutex<Option<PointerFile>>,
}

#[derive(Debug, Default)]
struct Marks {
    persisted: Option<Lsn>,
    wanted: Option<Lsn>,
    /// A write is queued for the background thread and has not yet read `wanted`.
    queued: bool,
}

impl ToldCommit {
    /// Reads `DATA/commit_point`, if there is one.
    pub(crate) fn load(io: &Io, dir: &Path) -> Result<ToldCommit> {
        let path = dir.join("commit_point");
        let (persisted, file) = match read_if_exists(io, &path)? {
            None => (None, None),
            Some(bytes) if bytes.starts_with(ENVELOPE_START) => {
                let old = decode_envelope::<CommitFile>(KIND, &path, &bytes)?;
                (Some(old.commit_point), None)
            }
            Some(_) => {
                let file = PointerFile::open(io, &path)?;
                (Some(file.last.end), Some(file))
            }
        };
        Ok(ToldCommit {
            path,
            marks: Mutex::new(Marks {
                persisted,
                ..Marks::default()
            }),
            file: Mutex::new(file),
        })
    }

    fn marks(&self) -> MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The commit point on disk.
    pub(crate) fn persisted(&self) -> Option<Lsn> {
        self.marks().persisted
    }

    /// Notes that the upstream told `c`. Returns the point on disk (what readers may see now)
    /// and whether a write must be queued for the background thread. Memory only.
    pub(crate) fn want(&self, c: Lsn) -> (Option<Lsn>, bool) {
        let mut m = self.marks();
        let wanted = m.wanted.max(Some(c));
        m.wanted = wanted;
        let queue = wanted > m.persisted && !m.queued;
        m.queued |= queue;
        (m.persisted, queue)
    }

    /// Writes the newest point wanted, if it is ahead of the one on disk; returns it once it
    /// is durable (`None`: nothing to write). On the background thread only: it fsyncs.
    pub(crate) fn persist(&self, io: &Io, tmp: &Path) -> Result<Option<Lsn>> {
        // The file's lock before the marks, held to the end: a cut waits for a store in
        // flight, and a store never writes a point wanted before a cut after it.
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let target = {
            let mut m = self.marks();
            m.queued = false;
            match m.wanted {
                Some(w) if Some(w) > m.persisted => w,
                _ => return Ok(None),
            }
        };
        self.store(&mut file, io, tmp, target)?;
        let mut m = self.marks();
        m.persisted = m.persisted.max(Some(target));
        Ok(Some(target))
    }

    /// An explicit cut of the WAL at `cut`: lowers the point on disk to `cut` if it is above
    /// it, and the point wanted with it, so that a store queued before the cut does not raise
    /// it again. Returns whether the point on disk was lowered. On storage's threads only: it
    /// fsyncs.
    pub(crate) fn cut_to(&self, io: &Io, tmp: &Path, cut: Lsn) -> Result<bool> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let above = {
            let mut m = self.marks();
            m.wanted = m.wanted.map(|w| w.min(cut));
            m.persisted.is_some_and(|p| p > cut)
        };
        if !above {
            return Ok(false);
        }
        self.store(&mut file, io, tmp, cut)?;
        self.marks().persisted = Some(cut);
        Ok(true)
    }

    /// Stores `point` durably: in place once the file has the two-slot layout, else as a new
    /// file made whole and renamed into place.
    fn store(&self, file: &mut Option<PointerFile>, io: &Io, tmp: &Path, point: Lsn) -> Result<()> {
        match file.as_mut() {
            Some(f) => f.store(io, TimelineId(0), point, false),
            None => {
                let first = FlushPointer {
                    seq: 1,
                    timeline: TimelineId(0),
                    end: point,
                    exact: false,
                };
                write_atomic_with(io, tmp, &self.path, &PointerFile::layout(first))?;
                *file = Some(PointerFile::open(io, &self.path)?);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{
        assert_damaged_envelope_refused, encode_envelope, scratch_dir, FILE_VERSION,
    };

    #[test]
    fn the_newest_wanted_point_is_written_once_and_survives_reload() {
        let (dir, tmp, io) = scratch_dir();
        let told = ToldCommit::load(&io, dir.path()).unwrap();
        assert_eq!(told.persisted(), None);
        // The first point queues a write; those told before it runs ride on it.
        assert_eq!(told.want(Lsn(100)), (None, true));
        assert_eq!(told.want(Lsn(200)), (None, false));
        assert_eq!(told.want(Lsn(150)), (None, false), "never back");
        assert_eq!(told.persist(&io, &tmp).unwrap(), Some(Lsn(200)));
        assert_eq!(told.persist(&io, &tmp).unwrap(), None, "nothing newer");
        assert_eq!(told.want(Lsn(200)), (Some(Lsn(200)), false));
        let again = ToldCommit::load(&io, dir.path()).unwrap();
        assert_eq!(again.persisted(), Some(Lsn(200)));
        // After a restart an upstream that knows less does not take it back.
        assert_eq!(again.want(Lsn(50)), (Some(Lsn(200)), false));
        assert_eq!(again.persist(&io, &tmp).unwrap(), None);
    }

    #[test]
    fn a_cut_lowers_the_point_on_disk_and_the_one_wanted() {
        let (dir, tmp, io) = scratch_dir();
        let told = ToldCommit::load(&io, dir.path()).unwrap();
        assert!(
            !told.cut_to(&io, &tmp, Lsn(50)).unwrap(),
            "told nothing yet"
        );
        told.want(Lsn(200));
        told.persist(&io, &tmp).unwrap();
        // A point told before the cut, not yet stored, is not stored after it.
        assert_eq!(told.want(Lsn(300)), (Some(Lsn(200)), true));
        assert!(told.cut_to(&io, &tmp, Lsn(120)).unwrap());
        assert_eq!(told.persisted(), Some(Lsn(120)));
        assert_eq!(
            told.persist(&io, &tmp).unwrap(),
            None,
            "nothing above the cut"
        );
        assert_eq!(
            ToldCommit::load(&io, dir.path()).unwrap().persisted(),
            Some(Lsn(120)),
            "durable"
        );
        assert!(!told.cut_to(&io, &tmp, Lsn(150)).unwrap(), "a cut above it");
        // From the cut on it moves forward again.
        assert_eq!(told.want(Lsn(130)), (Some(Lsn(120)), true));
        assert_eq!(told.persist(&io, &tmp).unwrap(), Some(Lsn(130)));
    }

    #[test]
    fn a_damaged_file_of_earlier_versions_is_refused() {
        let body = CommitFile {
            version: FILE_VERSION,
            commit_point: Lsn(7),
        };
        assert_damaged_envelope_refused("commit_point", KIND, &body, |dir| {
            ToldCommit::load(&Io::new(true), dir)
        });
    }

    #[test]
    fn the_envelope_of_earlier_versions_is_read_and_replaced_at_the_first_store() {
        let (dir, tmp, io) = scratch_dir();
        let body = CommitFile {
            version: FILE_VERSION,
            commit_point: Lsn(300),
        };
        let path = dir.path().join("commit_point");
        std::fs::write(&path, encode_envelope(KIND, &body)).unwrap();
        let told = ToldCommit::load(&io, dir.path()).unwrap();
        assert_eq!(told.persisted(), Some(Lsn(300)));
        assert_eq!(told.want(Lsn(400)), (Some(Lsn(300)), true));
        assert_eq!(told.persist(&io, &tmp).unwrap(), Some(Lsn(400)));
        assert!(!std::fs::read(&path).unwrap().starts_with(ENVELOPE_START));
        // Later stores go in place, one slot after the other.
        told.want(Lsn(500));
        assert_eq!(told.persist(&io, &tmp).unwrap(), Some(Lsn(500)));
        told.want(Lsn(600));
        assert_eq!(told.persist(&io, &tmp).unwrap(), Some(Lsn(600)));
        let again = ToldCommit::load(&io, dir.path()).unwrap();
        assert_eq!(again.persisted(), Some(Lsn(600)));
    }

    #[test]
    fn a_torn_slot_leaves_the_other_and_two_are_refused() {
        use std::os::unix::fs::FileExt;
        let (dir, tmp, io) = scratch_dir();
        let told = ToldCommit::load(&io, dir.path()).unwrap();
        for c in [100, 200] {
            told.want(Lsn(c));
            told.persist(&io, &tmp).unwrap();
        }
        // Sequence 2, the newest, went to the first slot (offset 0): damage it.
        let path = dir.path().join("commit_point");
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xff; 8], 24).unwrap();
        let again = ToldCommit::load(&io, dir.path()).unwrap();
        assert_eq!(again.persisted(), Some(Lsn(100)), "the older slot stands");
        f.write_all_at(&[0xff; 8], 512 + 24).unwrap();
        assert!(ToldCommit::load(&io, dir.path()).is_err());
    }
}
