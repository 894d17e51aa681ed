//! The tail cache: copies of the last small batches the writer made durable, so that a reader
//! following the end of WAL (a walsender streaming live) gets its few bytes from memory, on its
//! own thread, without a `pread` and without a hop through a blocking pool.
//!
//! Only batches of at most [`TAIL_BATCH_MAX`] bytes are kept, and at most [`TAIL_MAX`] bytes in
//! all. A large batch means a standby is catching up; its readers read megabytes at a time and go
//! to the files anyway, so such a batch empties the cache rather than being copied into it. The
//! cache holds durable bytes (the writer adds a batch after its fdatasync) and is emptied
//! when the timeline changes or WAL is truncated, so whatever it returns is exactly what the
//! segment files hold. Under the overlapped commit (`Wal::set_publish_written`) a batch is
//! added after its write and before its fdatasync; a failed batch empties the cache, so it
//! never holds bytes the files will not hold.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;

use crate::{Lsn, TimelineId};

/// The largest batch that is copied into the cache. A guess: large enough for any burst of
/// commits between two fdatasyncs, small enough that the copy is cheaper than a thread hop.
pub(crate) const TAIL_BATCH_MAX: usize = 64 << 10;

/// The most bytes the cache holds. A guess: a walsender more than this behind the end is
/// catching up and reads from the files.
pub(crate) const TAIL_MAX: usize = 1 << 20;

#[derive(Debug, Default)]
pub(crate) struct TailCache {
    inner: Mutex<Tail>,
}

#[derive(Debug, Default)]
struct Tail {
    tli: Option<TimelineId>,
    /// Contiguous batches, oldest first: each starts where the one before ends.
    batches: VecDeque<(Lsn, Bytes)>,
    bytes: usize,
}

impl Tail {
    fn end(&self) -> Option<Lsn> {
        self.batches
            .back()
            .map(|(start, b)| *start + b.len() as u64)
    }

    fn clear(&mut self) {
        self.batches.clear();
        self.bytes = 0;
    }
}

impl TailCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tail> {
        // The cache is plain data, consistent between statements.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `[start, start + len)` of `tli`, whose bytes are the concatenation of
    /// `parts`, is durable (or, under the overlapped commit, written and being synced).
    /// Called by the writer thread only. Returns whether the cache holds the batch.
    pub(crate) fn add(&self, tli: TimelineId, start: Lsn, len: usize, parts: &[&[u8]]) -> bool {
        let mut t = self.lock();
        if len == 0 {
            return false;
        }
        if len > TAIL_BATCH_MAX || t.tli != Some(tli) || t.end().is_some_and(|e| e != start) {
            t.clear();
            t.tli = Some(tli);
            if len > TAIL_BATCH_MAX {
                return false;
            }
        }
        let mut copy = Vec::with_capacity(len);
        for p in parts {
            copy.extend_from_slice(p);
        }
        debug_assert_eq!(copy.len(), len);
        t.bytes += copy.len();
        t.batches.push_back((start, Bytes::from(copy)));
        while t.bytes > TAIL_MAX {
            match t.batches.pop_front() {
                Some((_, b)) => t.bytes -= b.len(),
                None => break,
            }
        }
        true
    }

    /// Empties the cache: the timeline changed or WAL was cut.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// Up to `max_len` bytes of `tli` at `start` from one cached batch, never past `limit`;
    /// `None` when the cache does not hold `start`.
    pub(crate) fn get(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
        limit: Lsn,
    ) -> Option<Bytes> {
        let t = self.lock();
        if t.tli != Some(tli) || start >= limit {
            return None;
        }
        let i = t.batches.partition_point(|(s, _)| *s <= start);
        let (s, b) = t.batches.get(i.checked_sub(1)?)?;
        let from = (start.0 - s.0) as usize;
        if from >= b.len() {
            return None;
        }
        let upto = b
            .len()
            .min(from + max_len)
            .min(from + (limit.0 - start.0) as usize);
        Some(b.slice(from..upto))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: TimelineId = TimelineId(1);

    #[test]
    fn serves_only_what_it_holds_up_to_the_limit() {
        let c = TailCache::default();
        c.add(T1, Lsn(100), 5, &[b"ab", b"cde"]);
        c.add(T1, Lsn(105), 3, &[b"fgh"]);
        let end = Lsn(108);
        assert_eq!(
            c.get(T1, Lsn(100), 100, end).as_deref(),
            Some(&b"abcde"[..])
        );
        assert_eq!(c.get(T1, Lsn(102), 2, end).as_deref(), Some(&b"cd"[..]));
        assert_eq!(c.get(T1, Lsn(106), 100, end).as_deref(), Some(&b"gh"[..]));
        assert_eq!(
            c.get(T1, Lsn(106), 100, Lsn(107)).as_deref(),
            Some(&b"g"[..])
        );
        assert_eq!(c.get(T1, Lsn(99), 10, end), None);
        assert_eq!(c.get(T1, Lsn(108), 10, Lsn(200)), None);
        assert_eq!(c.get(TimelineId(2), Lsn(100), 10, end), None);
    }

    #[test]
    fn a_gap_a_new_timeline_or_a_large_batch_empties_it() {
        let c = TailCache::default();
        c.add(T1, Lsn(0), 4, &[b"abcd"]);
        c.add(T1, Lsn(10), 2, &[b"xy"]);
        assert_eq!(c.get(T1, Lsn(0), 4, Lsn(12)), None);
        assert_eq!(c.get(T1, Lsn(10), 4, Lsn(12)).as_deref(), Some(&b"xy"[..]));
        c.add(TimelineId(2), Lsn(12), 1, &[b"z"]);
        assert_eq!(c.get(T1, Lsn(10), 4, Lsn(13)), None);
        let big = vec![7u8; TAIL_BATCH_MAX + 1];
        c.add(TimelineId(2), Lsn(13), big.len(), &[&big]);
        assert_eq!(c.get(TimelineId(2), Lsn(12), 1, Lsn(u64::MAX)), None);
        assert_eq!(c.get(TimelineId(2), Lsn(13), 1, Lsn(u64::MAX)), None);
    }

    #[test]
    fn it_stays_within_its_size() {
        let c = TailCache::default();
        let chunk = vec![1u8; TAIL_BATCH_MAX];
        let n = TAIL_MAX / TAIL_BATCH_MAX + 3;
        for i in 0..n {
            c.add(T1, Lsn((i * chunk.len()) as u64), chunk.len(), &[&chunk]);
        }
        assert!(c.lock().bytes <= TAIL_MAX);
        assert_eq!(c.get(T1, Lsn(0), 1, Lsn(u64::MAX)), None);
        let last = Lsn(((n - 1) * chunk.len()) as u64);
        assert_eq!(c.get(T1, last, 1, Lsn(u64::MAX)).map(|b| b.len()), Some(1));
    }
}
