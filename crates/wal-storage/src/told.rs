//! The commit point a standby was told, kept durably, so that a restarted standby still
//! refuses to cut its WAL below it (the overlapped commit's rule 4) before its upstream has
//! told it again.
//!
//! A standby serves its readers (cascades, `GET /wal`, apply consumers, its archive) only up
//! to the commit point it knows. What it keeps must cover what it served, or a restart could
//! let it cut WAL a reader already took. So the point readers see is the one on disk: a told
//! point is first wanted ([`ToldCommit::want`]), the background thread writes the newest one
//! wanted (file, fsync, rename, directory fsync), and only then is it published in the
//! position. Writes are not made per message: at most one is queued, and it writes whatever
//! is newest when it runs, so under a stream of commit points the published one trails the
//! told one by about one write. That staleness is safe: readers stop at the published point,
//! and a cut-back after a restart may go down to it, no lower; WAL between it and the told
//! point was acknowledged, but is also durable on the primary and its quorum, and no reader
//! here was given it.
//!
//! **Invariant:** the persisted point never moves back, and it is published only after its
//! file is durable.

// Format of DATA/commit_point (the control file's envelope, `files.rs`):
//
//   walserver-commit crc32c=XXXXXXXX\n{"version": 1, "commit_point": "X/X"}

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use wal_types::Lsn;

use crate::durable::write_atomic_with;
use crate::files::{decode_envelope, encode_envelope, read_if_exists, FILE_VERSION};
use crate::io::Io;
use crate::Result;

const KIND: &str = "commit";

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
        let persisted = match read_if_exists(io, &path)? {
            Some(bytes) => Some(decode_envelope::<CommitFile>(KIND, &path, &bytes)?.commit_point),
            None => None,
        };
        Ok(ToldCommit {
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

    /// The commit point on disk.
    #[cfg(test)]
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
        let target = {
            let mut m = self.marks();
            m.queued = false;
            match m.wanted {
                Some(w) if Some(w) > m.persisted => w,
                _ => return Ok(None),
            }
        };
        let body = CommitFile {
            version: FILE_VERSION,
            commit_point: target,
        };
        write_atomic_with(io, tmp, &self.path, &encode_envelope(KIND, &body))?;
        let mut m = self.marks();
        m.persisted = m.persisted.max(Some(target));
        Ok(Some(target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::assert_damaged_envelope_refused;

    #[test]
    fn the_newest_wanted_point_is_written_once_and_survives_reload() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let io = Io::new(true);
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
    fn a_damaged_file_is_refused() {
        let body = CommitFile {
            version: FILE_VERSION,
            commit_point: Lsn(7),
        };
        assert_damaged_envelope_refused("commit_point", KIND, &body, |dir| {
            ToldCommit::load(&Io::new(true), dir)
        });
    }
}
