//! Reading segment files: which file holds an LSN of a timeline, a cache of open files, reads
//! of a range, and [`WalFileRange`], where a range lies for a sender that hands the file to the
//! kernel.
//!
//! The cache keeps, with each open file, how long the file was last seen to be. Files are
//! never shortened while WAL in them is retained (a segment is removed whole, and a cut
//! zeroes bytes instead), so a range below that length needs no new `fstat`: a sender that
//! locates range after range of one segment asks the kernel for its size once, and
//! [`SegmentFiles::locate_cached`] can answer from memory alone.
//!
//! It also knows which segment files are still held by someone (a [`WalFileRange`] queued
//! in a walsender, a read in progress), so that retention can tell a file it may recycle
//! from one it may only remove: [`SegmentFiles::retire_below`] closes the door on old
//! segments (no later [`SegmentFiles::open`] hands one out) and names those still held.
//!
//! PostgreSQL's rule decides the file: an LSN `x` of timeline `T` belongs to the timeline in
//! `T`'s history that covers `x`; but the segment in which a timeline began is, on the new
//! timeline, a copy of the old one up to the switch point, so for each segment the newest
//! timeline of `T`'s ancestry that has bytes in it is preferred, falling back to older ones
//! while `x` lies below their end.

use std::collections::HashMap;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use bytes::{Bytes, BytesMut};
use wal_types::{Lsn, TimelineId};

use crate::io::Io;
use crate::naming::segment_file_name;
use crate::{HistoryEntry, Result, WalError};

/// A timeline with its ancestry: what `read` needs to find files.
#[derive(Clone, Debug)]
pub(crate) struct View {
    pub tli: TimelineId,
    /// The ancestry of `tli`, oldest first.
    pub history: Arc<Vec<HistoryEntry>>,
}

impl View {
    /// `(timeline, begin, end)` for every timeline of the view, newest first. The view's own
    /// timeline ends at `u64::MAX`.
    fn ranges(&self) -> impl Iterator<Item = (TimelineId, Lsn, Lsn)> + '_ {
        let n = self.history.len();
        (0..=n).rev().map(move |i| {
            let begin = if i == 0 {
                Lsn(0)
            } else {
                self.history[i - 1].switch_lsn
            };
            if i == n {
                (self.tli, begin, Lsn::MAX)
            } else {
                (self.history[i].parent, begin, self.history[i].switch_lsn)
            }
        })
    }

    /// The timeline whose own WAL covers `x`.
    pub(crate) fn timeline_of(&self, x: Lsn) -> TimelineId {
        self.ranges()
            .find(|&(_, begin, end)| x >= begin && x < end)
            .map(|(t, _, _)| t)
            .unwrap_or(self.tli)
    }

    /// Candidate files for segment `segno` that can serve `x`: `(timeline, serves up to)`,
    /// preferred first.
    pub(crate) fn candidates(&self, x: Lsn, segno: u64, seg: u64) -> Vec<(TimelineId, Lsn)> {
        let seg_end = Lsn((segno + 1) * seg);
        self.ranges()
            .filter(|&(_, begin, end)| begin < seg_end && x < end)
            .map(|(t, _, end)| (t, end))
            .collect()
    }
}

/// Where a range of durable WAL lies: `len` bytes of `file` at `offset`, all in one segment
/// file, all at or below the flushed end. Durable WAL never changes in place while a range of
/// it is held: a segment nobody needs is removed, or recycled (`wal_recycle`) only if no
/// range of it is held, and only `walserver rejoin` (offline) or a live demotion (with every
/// sender stopped first) cuts WAL. So the range can be sent later, straight from the file
/// (`sendfile`), and still be the bytes asked for.
#[derive(Clone, Debug)]
pub struct WalFileRange {
    pub file: Arc<std::fs::File>,
    pub offset: u64,
    pub len: usize,
}

/// Opens and caches segment files for reading.
#[derive(Debug)]
pub(crate) struct SegmentFiles {
    pub pg_wal: PathBuf,
    pub seg: u64,
    /// The `Wal`'s file operations (a clone sharing its counters and fail points).
    io: Io,
    cache: Mutex<Cache>,
}

/// A segment file: its timeline and segment number.
type SegmentKey = (TimelineId, u64);

/// The open files, who else holds them, and which segments are retired.
#[derive(Debug, Default)]
struct Cache {
    open: HashMap<SegmentKey, Cached>,
    /// Every file this cache handed out, by segment, while it may still be held (the cache's
    /// own entry may have been dropped at `CACHE_LIMIT`, the holder's copy not).
    handed: HashMap<SegmentKey, Vec<Weak<File>>>,
    /// Segments below this number are retired: `open` no longer hands them out.
    retired_below: u64,
}

/// An open segment file and the length it had when last looked at (0 until then).
#[derive(Debug)]
struct Cached {
    file: Arc<File>,
    known_len: u64,
}

/// How many open segment files the read cache keeps. A guess: readers mostly stream near the
/// end, a few lagging standbys read older segments.
const CACHE_LIMIT: usize = 64;

impl SegmentFiles {
    pub(crate) fn new(io: &Io, pg_wal: &Path, seg: u64) -> SegmentFiles {
        SegmentFiles {
            pg_wal: pg_wal.to_path_buf(),
            seg,
            io: io.clone(),
            cache: Mutex::new(Cache::default()),
        }
    }

    pub(crate) fn path(&self, tli: TimelineId, segno: u64) -> PathBuf {
        self.pg_wal.join(segment_file_name(tli, segno, self.seg))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // The map stays consistent even if a holder panicked.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open file, or `None` if it does not exist or is retired.
    pub(crate) fn open(&self, tli: TimelineId, segno: u64) -> Result<Option<Arc<File>>> {
        if let Some(c) = self.lock().open.get(&(tli, segno)) {
            return Ok(Some(c.file.clone()));
        }
        let path = self.path(tli, segno);
        let opened = self
            .io
            .open_if_exists(&path, OpenOptions::new().read(true))
            .map_err(|e| WalError::io(format!("opening {}", path.display()), e))?;
        let Some(f) = opened else {
            return Ok(None);
        };
        let f = Arc::new(f);
        let mut cache = self.lock();
        if segno < cache.retired_below {
            // Retired while it was being opened: the file may already be another segment's
            // (recycled), so it is not handed out. It is closed after the lock is released.
            drop(cache);
            return Ok(None);
        }
        // Files are closed after the lock is released: a reader on an actor's thread may be
        // waiting for it, and closing is a system call.
        let dropped = if cache.open.len() >= CACHE_LIMIT {
            std::mem::take(&mut cache.open)
        } else {
            HashMap::new()
        };
        cache.open.insert(
            (tli, segno),
            Cached {
                file: f.clone(),
                known_len: 0,
            },
        );
        let held = cache.handed.entry((tli, segno)).or_default();
        held.retain(|w| w.strong_count() > 0);
        held.push(Arc::downgrade(&f));
        drop(cache);
        drop(dropped);
        Ok(Some(f))
    }

    /// Forgets cached files matching `pred` (after removing or replacing them).
    pub(crate) fn evict(&self, pred: impl Fn(TimelineId, u64) -> bool) {
        let mut cache = self.lock();
        let gone: Vec<Cached> = cache
            .open
            .extract_if(|&(t, s), _| pred(t, s))
            .map(|(_, c)| c)
            .collect();
        drop(cache);
        drop(gone);
    }

    /// Retires every segment below `segno` (of any timeline): forgets their cached files and
    /// hands none of them out again, and returns those that someone still holds (a queued
    /// [`WalFileRange`], a read in progress). Retention calls it before it touches the files:
    /// a segment not returned is held by nobody and never will be, so its file may be reused;
    /// one returned may only be removed (its holders keep the old bytes through their open
    /// descriptor).
    pub(crate) fn retire_below(&self, segno: u64) -> HashSet<SegmentKey> {
        let mut cache = self.lock();
        cache.retired_below = cache.retired_below.max(segno);
        let gone: Vec<(SegmentKey, Cached)> =
            cache.open.extract_if(|&(_, s), _| s < segno).collect();
        let held: Vec<(SegmentKey, Vec<Weak<File>>)> =
            cache.handed.extract_if(|&(_, s), _| s < segno).collect();
        drop(cache);
        let mut in_use = HashSet::new();
        for (key, weaks) in held {
            // The cache's own entry, forgotten above, still counts until it is dropped.
            let ours = gone.iter().filter(|(k, _)| *k == key).count();
            let strong: usize = weaks.iter().map(Weak::strong_count).sum();
            if strong > ours {
                in_use.insert(key);
            }
        }
        drop(gone);
        in_use
    }

    /// The length of `file` (segment `segno` of `tli`), from the cache if it is known to be at
    /// least `needed`, else from `fstat`, which is then remembered.
    fn len_at_least(&self, tli: TimelineId, segno: u64, file: &File, needed: u64) -> Result<u64> {
        if let Some(c) = self.lock().open.get(&(tli, segno)) {
            if c.known_len >= needed {
                return Ok(c.known_len);
            }
        }
        let len = self.io.file_len(file).map_err(|e| {
            let path = self.path(tli, segno);
            WalError::io(format!("reading the size of {}", path.display()), e)
        })?;
        if let Some(c) = self.lock().open.get_mut(&(tli, segno)) {
            // Only for the same open file: an evicted and reopened one starts again at 0.
            if std::ptr::eq(Arc::as_ptr(&c.file), file) {
                c.known_len = c.known_len.max(len);
            }
        }
        Ok(len)
    }

    /// Reads up to `max_len` bytes of `view` at `x`, never at or past `limit`, within one
    /// segment. Returns `Ok(None)` if no file holds `x`; an empty buffer only if `max_len` is 0
    /// or `x >= limit`.
    pub(crate) fn read(
        &self,
        view: &View,
        x: Lsn,
        limit: Lsn,
        max_len: usize,
    ) -> Result<Option<Bytes>> {
        let mut buf = BytesMut::new();
        let read = self.read_into(view, x, limit, max_len, &mut buf)?;
        Ok(read.map(|_| buf.freeze()))
    }

    /// Like [`SegmentFiles::read`], but appends the bytes to `buf` and returns how many; on
    /// an error `buf` is as it was.
    pub(crate) fn read_into(
        &self,
        view: &View,
        x: Lsn,
        limit: Lsn,
        max_len: usize,
        buf: &mut BytesMut,
    ) -> Result<Option<usize>> {
        if x >= limit || max_len == 0 {
            return Ok(Some(0));
        }
        let Some(found) = self.find(view, x, limit, max_len)? else {
            return Ok(None);
        };
        let before = buf.len();
        let read = self
            .io
            .pread_append(&found.file, found.len, found.offset, buf);
        let got = buf.len() - before;
        // On a failure `buf` holds what it held before.
        if let Err(e) = read {
            buf.truncate(before);
            let path = self.pg_wal.join(found.name(self.seg));
            return Err(WalError::io(format!("reading {}", path.display()), e));
        }
        if got < found.len {
            buf.truncate(before);
            return Err(found.short(found.offset + got as u64, self.seg));
        }
        Ok(Some(got))
    }

    /// Like [`SegmentFiles::read`], but returns where the bytes are instead of reading them.
    /// The file must hold them: a shorter file is corruption, as for a read.
    pub(crate) fn locate(
        &self,
        view: &View,
        x: Lsn,
        limit: Lsn,
        max_len: usize,
    ) -> Result<Option<WalFileRange>> {
        let Some(found) = self.find(view, x, limit, max_len)? else {
            return Ok(None);
        };
        let end = found.offset + found.len as u64;
        let size = self.len_at_least(found.tli, found.segno, &found.file, end)?;
        if size < end {
            return Err(found.short(size, self.seg));
        }
        Ok(Some(found.range()))
    }

    /// What [`SegmentFiles::locate`] would find, from memory alone: `Some` only if the file
    /// that holds `x` is open in the cache and known to be long enough (no open, no `fstat`,
    /// so an actor may call it on its own thread); `None` when that cannot be told without
    /// touching a file.
    pub(crate) fn locate_cached(
        &self,
        view: &View,
        x: Lsn,
        limit: Lsn,
        max_len: usize,
    ) -> Option<WalFileRange> {
        let segno = x.segment_number(self.seg);
        // The first candidate is the file `find` would take if it exists; whether it does is
        // known only if it is open.
        let (tli, serves_to) = *view.candidates(x, segno, self.seg).first()?;
        let (file, known_len) = {
            let cache = self.lock();
            let c = cache.open.get(&(tli, segno))?;
            (c.file.clone(), c.known_len)
        };
        let found = self.found(x, limit.min(serves_to), max_len, tli, file);
        (found.offset + found.len as u64 <= known_len).then(|| found.range())
    }

    /// The file that holds `x` in `view`, and how much of it to take: up to `max_len` bytes,
    /// never past `limit`, the segment's end or where the timeline that owns it ends.
    fn find(&self, view: &View, x: Lsn, limit: Lsn, max_len: usize) -> Result<Option<Found>> {
        let segno = x.segment_number(self.seg);
        for (tli, serves_to) in view.candidates(x, segno, self.seg) {
            let Some(file) = self.open(tli, segno)? else {
                continue;
            };
            return Ok(Some(self.found(
                x,
                limit.min(serves_to),
                max_len,
                tli,
                file,
            )));
        }
        Ok(None)
    }

    /// The range of `x` in `file`, timeline `tli`'s copy of the segment holding `x`, which
    /// serves WAL up to `limit`: up to `max_len` bytes, never past `limit` or the segment.
    fn found(&self, x: Lsn, limit: Lsn, max_len: usize, tli: TimelineId, file: Arc<File>) -> Found {
        let segno = x.segment_number(self.seg);
        let upto = limit.min(Lsn((segno + 1) * self.seg));
        Found {
            file,
            tli,
            segno,
            offset: x.segment_offset(self.seg),
            len: (upto.0 - x.0).min(max_len as u64) as usize,
        }
    }
}

/// Where [`SegmentFiles::find`] found a range.
struct Found {
    file: Arc<File>,
    tli: TimelineId,
    segno: u64,
    offset: u64,
    len: usize,
}

impl Found {
    fn name(&self, seg: u64) -> String {
        segment_file_name(self.tli, self.segno, seg)
    }

    /// The error for a file that ends at `at`, before the range.
    fn short(&self, at: u64, seg: u64) -> WalError {
        WalError::Corruption {
            segment: self.name(seg),
            offset: at,
            reason: "segment file is shorter than the WAL it should hold".into(),
        }
    }

    fn range(self) -> WalFileRange {
        WalFileRange {
            file: self.file,
            offset: self.offset,
            len: self.len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(tli: u32, hist: &[(u32, u64)]) -> View {
        View {
            tli: TimelineId(tli),
            history: Arc::new(
                hist.iter()
                    .map(|&(p, s)| HistoryEntry {
                        parent: TimelineId(p),
                        switch_lsn: Lsn(s),
                        reason: String::new(),
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn file_choice_follows_postgres() {
        const SEG: u64 = 1 << 20;
        // Timeline 3: 1 until 0/250000, 2 until 0/480000, then 3.
        let v = view(3, &[(1, 0x250000), (2, 0x480000)]);
        let t = |x: u64| {
            let x = Lsn(x);
            v.candidates(x, x.segment_number(SEG), SEG)
                .into_iter()
                .map(|(t, e)| (t.0, e.0))
                .collect::<Vec<_>>()
        };
        assert_eq!(t(0x100000), vec![(1, 0x250000)]);
        // In the switch segment of 2, 2's copy is preferred, 1's file is the fallback.
        assert_eq!(t(0x200010), vec![(2, 0x480000), (1, 0x250000)]);
        assert_eq!(t(0x260000), vec![(2, 0x480000)]);
        assert_eq!(t(0x300000), vec![(2, 0x480000)]);
        assert_eq!(t(0x400000), vec![(3, u64::MAX), (2, 0x480000)]);
        assert_eq!(t(0x490000), vec![(3, u64::MAX)]);
        assert_eq!(v.timeline_of(Lsn(0x250000)), TimelineId(2));
        assert_eq!(v.timeline_of(Lsn(0x24FFFF)), TimelineId(1));
        assert_eq!(v.timeline_of(Lsn(0x500000)), TimelineId(3));
    }

    /// Retiring names the segments someone still holds, and no retired segment is handed out
    /// again, also when its file is still there.
    #[test]
    fn retired_segments_are_not_handed_out_and_held_ones_are_named() {
        const SEG: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let files = SegmentFiles::new(&Io::new(false), dir.path(), SEG);
        let tli = TimelineId(1);
        for segno in 1..=3 {
            std::fs::write(files.path(tli, segno), b"wal").unwrap();
        }
        let held = files.open(tli, 1).unwrap().unwrap();
        // Opened and let go again: only the cache holds segment 2.
        drop(files.open(tli, 2).unwrap().unwrap());
        let in_use = files.retire_below(3);
        assert_eq!(in_use, HashSet::from([(tli, 1)]));
        assert!(files.open(tli, 1).unwrap().is_none());
        assert!(files.open(tli, 2).unwrap().is_none());
        assert!(files.open(tli, 3).unwrap().is_some());
        // The holder's file still reads its bytes.
        let mut buf = [0u8; 3];
        std::os::unix::fs::FileExt::read_exact_at(&*held, &mut buf, 0).unwrap();
        assert_eq!(&buf, b"wal");
        // Retiring again names nothing: what was retired is forgotten, and 3 is not retired.
        drop(held);
        assert!(files.retire_below(3).is_empty());
    }
}
