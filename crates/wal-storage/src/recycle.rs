//! The pool of retired segment files kept for reuse (`wal_recycle`, on by default).
//!
//! Retention hands a segment nobody needs to this pool, in `tmp/`, instead of removing it,
//! and preallocation links it into place as a later segment, as PostgreSQL recycles its WAL
//! files; the background thread (`background.rs`) does both and says why it pays. The pool
//! itself only keeps the list: at most [`RECYCLE_LIMIT`] files, moved in by a rename under
//! its lock, handed out one at a time. It knows nothing of segments' names or of the writer.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::io::Io;

/// How many retired segment files the pool keeps for reuse. A guess: retention frees about
/// one segment per segment switch and preallocation takes one, so two cover a switch that
/// runs ahead of the other; more would hold disk space (or tmpfs memory) that nothing uses.
const RECYCLE_LIMIT: usize = 2;

/// Segment files retention handed over for reuse, waiting in `tmp/` under names of their
/// own (see the module's comment); always empty with `wal_recycle` off. Files left in `tmp/`
/// by a crash are removed at the next open, like every leftover there.
#[derive(Debug)]
pub(crate) struct RecyclePool {
    enabled: bool,
    files: Mutex<Vec<PathBuf>>,
    /// Names files as they enter the pool.
    next: AtomicU64,
    /// Segments made from a recycled file since open.
    reused: AtomicU64,
}

impl RecyclePool {
    /// A pool for the segment files of `pg_wal`; `enabled` is `wal_recycle`.
    pub(crate) fn new(enabled: bool) -> RecyclePool {
        RecyclePool {
            enabled,
            files: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
            reused: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PathBuf>> {
        // A list of paths, consistent between statements.
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a segment made from a file the pool handed out.
    pub(crate) fn count_reuse(&self) {
        self.reused.fetch_add(1, Ordering::Relaxed);
    }

    /// How many segments were made from a recycled file since open.
    pub(crate) fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    /// Moves `path` (a retired segment held by nobody) into the pool in `tmp/`, if the pool
    /// is in use and has room. `Ok(false)` if the caller should remove it instead. The lock
    /// is held across the rename, so that two retention runs cannot both fill the last place;
    /// only retention and preallocation take it, never an actor's thread.
    pub(crate) fn put(&self, io: &Io, tmp: &Path, path: &Path) -> io::Result<bool> {
        if !self.enabled {
            return Ok(false);
        }
        let mut files = self.lock();
        if files.len() >= RECYCLE_LIMIT {
            return Ok(false);
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let to = tmp.join(format!("recycled.{n}"));
        match io.rename(path, &to) {
            Ok(()) => files.push(to),
            // Two retention runs may list the same file; the one that finds it gone has
            // nothing left to do.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(true)
    }

    pub(crate) fn take(&self) -> Option<PathBuf> {
        self.lock().pop()
    }
}
