//! The writer thread: group commit.
//!
//! The writer blocks on `recv()`, then drains whatever else is queued with `try_recv()` (up to
//! [`MAX_BATCH_REQUESTS`] requests or [`MAX_BATCH_BYTES`]), stages every write and append of
//! the batch into one buffer, writes it with `pwrite` into the segment file or files it spans,
//! fdatasyncs each file touched once, stores the flush pointer when needed, publishes the new
//! position and only then completes every waiter. A control operation (promotion, following a
//! timeline, truncation: `timeline.rs`) first commits what is staged, then runs alone on the
//! thread, so it sees a quiet WAL with `written == flushed`. The writer starts the background
//! thread (`background.rs`) and stops it when it stops.
//!
//! If a batch fails (a full disk, an I/O error), every waiter in it gets the error, `written`
//! goes back to `flushed`, and the bytes the batch may have left on disk are zeroed by the next
//! successful batch, so that no failed write can resurface as a valid record after a crash.
//!
//! **Invariants:** a waiter is completed only after the fdatasync of every file its bytes went
//! to and, when the batch needs it, of the flush pointer; the tail cache gets a batch after its
//! fdatasync and before its end is published.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use bytes::Bytes;
use crossbeam_channel::Receiver;
use tokio::sync::oneshot;
use wal_types::{Lsn, TimelineId};

use crate::background;
use crate::files::PointerFile;
use crate::format::Framer;
use crate::io::{FP_FSYNC, FP_WRITE};
use crate::naming::segment_file_name;
use crate::scan::last_record_end;
use crate::state::{BgRequest, Inner};
use crate::{Result, WalError};

/// The most requests one batch takes. A guess, from a measurement on actix 0.13 where 128
/// concurrent writers averaged batches of about 65: large enough that 64 to 128 concurrent
/// writers fit in one fdatasync.
pub(crate) const MAX_BATCH_REQUESTS: usize = 1024;
/// The most staged bytes after which a batch stops draining; a single larger request still goes
/// whole. A guess that bounds the batch buffer and the latency of the first waiter.
pub(crate) const MAX_BATCH_BYTES: usize = 4 << 20;

pub(crate) enum Request {
    Write {
        start: Lsn,
        data: Bytes,
        reply: oneshot::Sender<Result<Lsn>>,
    },
    Append {
        payloads: Vec<Bytes>,
        reply: oneshot::Sender<Result<Vec<Lsn>>>,
    },
    Control(Box<dyn FnOnce(&mut Writer) + Send>),
    Shutdown,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Request::Write { .. } => "Write",
            Request::Append { .. } => "Append",
            Request::Control(_) => "Control",
            Request::Shutdown => "Shutdown",
        })
    }
}

enum Waiter {
    Write(oneshot::Sender<Result<Lsn>>),
    Append(oneshot::Sender<Result<Vec<Lsn>>>, Vec<Lsn>),
}

pub(crate) struct Writer {
    /// The shared state; timeline control (`timeline.rs`) works on it directly.
    pub(crate) inner: Arc<Inner>,
    tli: TimelineId,
    /// Durable end; `batch_start` equals it between batches.
    flushed: Lsn,
    batch: Staged,
    batch_start: Lsn,
    /// The batch holds raw bytes (whose durable end only the flush pointer can vouch for).
    batch_raw: bool,
    waiters: Vec<Waiter>,
    /// Bytes up to here beyond `flushed` may be on disk from a failed batch; zero them.
    dirty_until: Lsn,
    /// Segment files of the current timeline open for writing.
    files: BTreeMap<u64, File>,
    pending: HashMap<u64, Receiver<Result<File>>>,
    highest_seg: u64,
    pointer: PointerFile,
    bg: Option<JoinHandle<()>>,
    /// The staged end is known to be a record boundary, so records may be appended there. Raw
    /// writes (a standby's stream) end anywhere; the first append after them checks by scanning.
    at_boundary: bool,
}

pub(crate) fn spawn(
    inner: Arc<Inner>,
    rx: Receiver<Request>,
    bg_rx: Receiver<BgRequest>,
    pointer: PointerFile,
) -> Result<JoinHandle<()>> {
    let bg = background::spawn(inner.clone(), bg_rx)?;
    let st = inner.state().clone();
    let seg = inner.cfg.segment_size;
    let mut w = Writer {
        tli: st.tli,
        flushed: st.flushed,
        batch: Staged::default(),
        batch_start: st.flushed,
        batch_raw: false,
        waiters: Vec::new(),
        dirty_until: Lsn(0),
        files: BTreeMap::new(),
        pending: HashMap::new(),
        highest_seg: st.flushed.segment_number(seg),
        pointer,
        bg: Some(bg),
        at_boundary: false,
        inner,
    };
    let end_seg = st.flushed.segment_number(seg);
    w.request_prealloc(end_seg);
    w.request_prealloc(end_seg + 1);
    let _ = w.inner.bg_tx.send(BgRequest::Retain);
    thread::Builder::new()
        .name("wal-writer".into())
        .spawn(move || w.run(rx))
        .map_err(|e| WalError::io("starting the WAL writer thread", e))
}

/// The staged batch, in order: a standby's raw writes kept as the buffers they arrived in
/// (writing them with `pwritev` saves copying every received byte once more, about 8% of a
/// standby's CPU while it catches up), and appended records framed into `open`.
#[derive(Default)]
struct Staged {
    chunks: Vec<Bytes>,
    chunks_len: usize,
    open: Vec<u8>,
}

impl Staged {
    fn len(&self) -> usize {
        self.chunks_len + self.open.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn clear(&mut self) {
        self.chunks.clear();
        self.chunks_len = 0;
        self.open.clear();
    }

    /// Closes the open buffer so that what follows comes after it.
    fn seal(&mut self) {
        if !self.open.is_empty() {
            let open = std::mem::take(&mut self.open);
            self.chunks_len += open.len();
            self.chunks.push(Bytes::from(open));
        }
    }

    fn push_bytes(&mut self, b: Bytes) {
        self.seal();
        self.chunks_len += b.len();
        self.chunks.push(b);
    }

    /// Where appended records are framed.
    fn open_mut(&mut self) -> &mut Vec<u8> {
        &mut self.open
    }

    /// The staged bytes `[from, from + n)`, as slices in order.
    fn slices(&self, from: usize, n: usize) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let (mut pos, end) = (0usize, from + n);
        for part in self.chunks.iter().map(|b| &b[..]).chain([&self.open[..]]) {
            let (a, b) = (pos, pos + part.len());
            pos = b;
            if b <= from || part.is_empty() {
                continue;
            }
            if a >= end {
                break;
            }
            out.push(&part[from.max(a) - a..end.min(b) - a]);
        }
        out
    }
}

impl Writer {
    pub(crate) fn seg(&self) -> u64 {
        self.inner.cfg.segment_size
    }

    /// True if a failed batch may have left bytes beyond `lsn` on disk.
    pub(crate) fn dirty_beyond(&self, lsn: Lsn) -> bool {
        self.dirty_until > lsn
    }

    /// Stores the flush pointer durably.
    pub(crate) fn store_pointer(&mut self, tli: TimelineId, end: Lsn, exact: bool) -> Result<()> {
        self.pointer.store(&self.inner.io, tli, end, exact)
    }

    /// Closes the segment files open for writing and forgets pending preallocations, before
    /// timeline control changes or removes files under them.
    pub(crate) fn forget_files(&mut self) {
        self.files.clear();
        self.pending.clear();
    }

    /// Resumes group commit on `tli` at `end`, which is durable with nothing staged beyond it
    /// (after a timeline switch or a truncation). `at_boundary` says whether `end` is known to
    /// be a record boundary.
    pub(crate) fn resume_at(&mut self, tli: TimelineId, end: Lsn, at_boundary: bool) {
        self.tli = tli;
        self.at_boundary = at_boundary;
        self.flushed = end;
        self.batch_start = end;
        self.dirty_until = Lsn(0);
        self.forget_files();
        self.highest_seg = end.segment_number(self.seg());
    }

    fn run(mut self, rx: Receiver<Request>) {
        let mut shutdown = false;
        while !shutdown {
            let Ok(first) = rx.recv() else { break };
            let mut next = Some(first);
            let mut taken = 0;
            while let Some(req) = next.take() {
                match req {
                    Request::Write { start, data, reply } => self.stage_write(start, data, reply),
                    Request::Append { payloads, reply } => self.stage_append(&payloads, reply),
                    Request::Control(f) => {
                        self.commit();
                        f(&mut self);
                    }
                    Request::Shutdown => {
                        shutdown = true;
                        break;
                    }
                }
                taken += 1;
                if taken >= MAX_BATCH_REQUESTS || self.batch.len() >= MAX_BATCH_BYTES {
                    break;
                }
                next = rx.try_recv().ok();
            }
            self.commit();
        }
        self.close();
    }

    /// At a clean stop: persist slots and the durable end, stop the background thread.
    fn close(&mut self) {
        background::persist_dirty_slots(&self.inner);
        // Raw writes of walserver records move the pointer only per segment; a clean stop
        // records the end exactly, so the next start need not scan or drop a partial record.
        let p = self.pointer.last;
        if !p.exact || p.end != self.flushed || p.timeline != self.tli {
            if let Err(e) = self
                .pointer
                .store(&self.inner.io, self.tli, self.flushed, true)
            {
                tracing::warn!(error = %e, "could not record the exact durable end at shutdown");
            }
        }
        let st = self.inner.state().clone();
        if let Err(e) = self.inner.write_control(&st) {
            tracing::warn!(error = %e, "could not record the durable end in the control file at shutdown");
        }
        let _ = self.inner.bg_tx.send(BgRequest::Shutdown);
        if let Some(bg) = self.bg.take() {
            let _ = bg.join();
        }
    }

    fn staged_end(&self) -> Lsn {
        self.batch_start + self.batch.len() as u64
    }

    fn stage_write(&mut self, start: Lsn, data: Bytes, reply: oneshot::Sender<Result<Lsn>>) {
        match self.check_write(start, &data) {
            Ok(skip) => {
                if skip < data.len() {
                    self.batch.push_bytes(data.slice(skip..));
                    self.batch_raw = true;
                    self.at_boundary = false;
                }
                self.waiters.push(Waiter::Write(reply));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// Checks a raw write against what is stored and staged; returns how many of its leading
    /// bytes are already there.
    fn check_write(&self, start: Lsn, data: &[u8]) -> Result<usize> {
        let end = self.staged_end();
        if start > end {
            return Err(WalError::Gap {
                timeline: self.tli,
                start,
                end,
            });
        }
        let overlap = ((end.0 - start.0) as usize).min(data.len());
        let overlap_end = start + overlap as u64;
        let mismatch = |at: Lsn| WalError::OverlapMismatch { start, at };
        let mut pos = start;
        if pos < self.batch_start {
            if pos < self.inner.oldest_retained() {
                return Err(WalError::SegmentRemoved {
                    segment: segment_file_name(
                        self.tli,
                        pos.segment_number(self.seg()),
                        self.seg(),
                    ),
                });
            }
            let view = self.inner.state().view();
            let disk_end = overlap_end.min(self.batch_start);
            while pos < disk_end {
                let want = (disk_end.0 - pos.0) as usize;
                let got = self
                    .inner
                    .files
                    .read(&view, pos, disk_end, want.min(1 << 20))?
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| WalError::SegmentRemoved {
                        segment: segment_file_name(
                            view.timeline_of(pos),
                            pos.segment_number(self.seg()),
                            self.seg(),
                        ),
                    })?;
                let off = (pos.0 - start.0) as usize;
                if let Some(i) = first_difference(&got, &data[off..off + got.len()]) {
                    return Err(mismatch(pos + i as u64));
                }
                pos = pos + got.len() as u64;
            }
        }
        if pos < overlap_end {
            let b0 = (pos.0 - self.batch_start.0) as usize;
            let off = (pos.0 - start.0) as usize;
            let n = (overlap_end.0 - pos.0) as usize;
            let mut at = 0;
            for staged in self.batch.slices(b0, n) {
                let theirs = &data[off + at..off + at + staged.len()];
                if let Some(i) = first_difference(staged, theirs) {
                    return Err(mismatch(pos + (at + i) as u64));
                }
                at += staged.len();
            }
        }
        Ok(overlap)
    }

    fn stage_append(&mut self, payloads: &[Bytes], reply: oneshot::Sender<Result<Vec<Lsn>>>) {
        if !self.at_boundary {
            // Make what is staged durable, then look for the last record boundary below it.
            self.commit();
            let st = self.inner.state().clone();
            let checked = last_record_end(
                &self.inner.files,
                &st.view(),
                &self.inner.cfg,
                st.wal_start,
                st.flushed,
            )
            .and_then(|record_end| {
                if record_end == st.flushed {
                    Ok(())
                } else {
                    Err(WalError::NotAtRecordBoundary {
                        end: st.flushed,
                        record_end,
                    })
                }
            });
            if let Err(e) = checked {
                let _ = reply.send(Err(e));
                return;
            }
            self.at_boundary = true;
        }
        let mut framer = Framer {
            segment_size: self.seg(),
            pos: self.staged_end(),
        };
        let ends = payloads
            .iter()
            .map(|p| framer.push(self.batch.open_mut(), p))
            .collect();
        self.waiters.push(Waiter::Append(reply, ends));
    }

    /// Makes the staged batch durable and completes its waiters.
    fn commit(&mut self) {
        if self.waiters.is_empty() && self.batch.is_empty() {
            return;
        }
        let result = self.flush_batch();
        let waiters = std::mem::take(&mut self.waiters);
        match result {
            Ok(()) => {
                for w in waiters {
                    match w {
                        Waiter::Write(reply) => {
                            let _ = reply.send(Ok(self.flushed));
                        }
                        Waiter::Append(reply, ends) => {
                            let _ = reply.send(Ok(ends));
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "WAL write failed");
                for w in waiters {
                    match w {
                        Waiter::Write(reply) => {
                            let _ = reply.send(Err(e.duplicate()));
                        }
                        Waiter::Append(reply, _) => {
                            let _ = reply.send(Err(e.duplicate()));
                        }
                    }
                }
            }
        }
    }

    fn flush_batch(&mut self) -> Result<()> {
        let start = self.batch_start;
        let end = self.staged_end();
        let result = self.write_out(start, end);
        self.batch.clear();
        self.batch_raw = false;
        match result {
            Ok(()) => {
                self.batch_start = end;
                Ok(())
            }
            Err(e) => {
                self.at_boundary = false;
                self.dirty_until = self.dirty_until.max(end);
                self.batch_start = self.flushed;
                self.inner.set_positions(self.flushed, self.flushed);
                Err(e)
            }
        }
    }

    fn write_out(&mut self, start: Lsn, end: Lsn) -> Result<()> {
        let seg = self.seg();
        let zero_to = self.dirty_until.max(end);
        if zero_to <= start {
            return Ok(());
        }
        let first_seg = start.segment_number(seg);
        self.files.retain(|&s, _| s >= first_seg);
        let mut touched = Vec::new();
        let mut pos = start;
        while pos < zero_to {
            let segno = pos.segment_number(seg);
            let upto = Lsn((segno + 1) * seg).min(zero_to);
            self.ensure_segment(segno)?;
            let f = &self.files[&segno];
            let io = &self.inner.io;
            let name = || segment_file_name(self.tli, segno, seg);
            if pos < end {
                let dend = upto.min(end);
                let from = (pos.0 - start.0) as usize;
                let bytes = self.batch.slices(from, (dend.0 - pos.0) as usize);
                io.pwritev_all(f, &bytes, pos.segment_offset(seg), FP_WRITE)
                    .map_err(|e| WalError::io(format!("writing WAL segment {}", name()), e))?;
                if dend < upto {
                    io.write_zeros(f, dend.segment_offset(seg), upto.0 - dend.0, FP_WRITE)
                        .map_err(|e| WalError::io(format!("zeroing WAL segment {}", name()), e))?;
                }
            } else {
                io.write_zeros(f, pos.segment_offset(seg), upto.0 - pos.0, FP_WRITE)
                    .map_err(|e| WalError::io(format!("zeroing WAL segment {}", name()), e))?;
            }
            touched.push(segno);
            pos = upto;
        }
        self.inner.set_positions(end, self.flushed);
        for segno in touched {
            self.inner
                .io
                .sync_data(&self.files[&segno], FP_FSYNC)
                .map_err(|e| {
                    WalError::io(
                        format!(
                            "fdatasync of WAL segment {}",
                            segment_file_name(self.tli, segno, seg)
                        ),
                        e,
                    )
                })?;
        }
        // Raw bytes of relayed PostgreSQL WAL cannot be scanned back, so each batch's end is
        // stored exactly. Raw bytes of walserver records can: recovery scans records past a
        // non-exact pointer (`Wal::open`) and finds every complete record that was flushed,
        // so, as for appends, the pointer moves only when the end enters a new segment. That
        // saves a second fdatasync per batch on a standby, which sat on every synchronous
        // commit's path. What recovery may then drop is the partial record at the end, which
        // lies in the segment of the last durable end (the pointer is always in that segment),
        // a segment the upstream still keeps for this standby (its slot is at most there).
        let p = self.pointer.last;
        if (self.batch_raw && self.inner.format != crate::WalFormat::Walserver)
            || p.exact
            || p.timeline != self.tli
            || p.end.segment_number(seg) != end.segment_number(seg)
        {
            self.pointer.store(&self.inner.io, self.tli, end, false)?;
        }
        self.dirty_until = Lsn(0);
        self.flushed = end;
        // Into the tail cache before the new end is published, so that a walsender woken by
        // it finds the bytes in memory.
        let len = (end.0 - start.0) as usize;
        if len > 0 {
            let parts = self.batch.slices(0, len);
            self.inner.tail.add(self.tli, start, len, &parts);
        }
        self.inner.set_positions(end, end);
        Ok(())
    }

    /// Opens segment `segno` of the current timeline for writing, waiting for its preallocation
    /// if needed, and asks for the next one.
    fn ensure_segment(&mut self, segno: u64) -> Result<()> {
        if self.files.contains_key(&segno) {
            return Ok(());
        }
        let seg = self.seg();
        let path = self.inner.files.path(self.tli, segno);
        let file = match self.pending.remove(&segno) {
            Some(rx) => rx.recv().map_err(|_| WalError::Closed)??,
            None => match (self.inner.io)
                .open_if_exists(&path, OpenOptions::new().read(true).write(true))
                .map_err(|e| WalError::io(format!("opening {}", path.display()), e))?
            {
                Some(f) => {
                    let len = (self.inner.io)
                        .file_len(&f)
                        .map_err(|e| WalError::io(format!("reading {}", path.display()), e))?;
                    if len != seg {
                        return Err(WalError::BadFile {
                            path,
                            reason: format!("segment file is {len} bytes, expected {seg}"),
                        });
                    }
                    f
                }
                None => {
                    self.request_prealloc(segno);
                    let rx = self.pending.remove(&segno).expect("just requested");
                    rx.recv().map_err(|_| WalError::Closed)??
                }
            },
        };
        self.files.insert(segno, file);
        if segno > self.highest_seg {
            // A segment switch: the moment retention looks for WAL nobody needs.
            self.highest_seg = segno;
            let _ = self.inner.bg_tx.send(BgRequest::Retain);
        }
        self.request_prealloc(segno + 1);
        Ok(())
    }

    pub(crate) fn request_prealloc(&mut self, segno: u64) {
        // A file that cannot be looked at is asked for anyway: preallocation never replaces
        // a file, and reports what is wrong with the directory.
        let path = self.inner.files.path(self.tli, segno);
        if self.pending.contains_key(&segno)
            || self.files.contains_key(&segno)
            || self.inner.io.exists(&path).unwrap_or(false)
        {
            return;
        }
        let (reply, rx) = crossbeam_channel::bounded(1);
        let req = BgRequest::Prealloc {
            tli: self.tli,
            segno,
            reply,
        };
        if self.inner.bg_tx.send(req).is_ok() {
            self.pending.insert(segno, rx);
        }
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::io::Io;

    /// Raw chunks and framed records read back in order, for any range, and pwritev writes
    /// exactly them.
    #[test]
    fn staged_bytes_in_order() {
        let mut st = Staged::default();
        st.open_mut().extend_from_slice(b"ab");
        st.push_bytes(Bytes::from_static(b"cde"));
        st.push_bytes(Bytes::new());
        st.push_bytes(Bytes::from_static(b"f"));
        st.open_mut().extend_from_slice(b"ghij");
        assert_eq!(st.len(), 10);
        let all = b"abcdefghij";
        for from in 0..=10 {
            for n in 0..=10 - from {
                let got: Vec<u8> = st.slices(from, n).concat();
                assert_eq!(got, &all[from..from + n], "from {from} n {n}");
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        let io = Io::new(false);
        io.pwritev_all(&f, &st.slices(1, 8), 3, FP_WRITE).unwrap();
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"\0\0\0bcdefghi");
        st.clear();
        assert!(st.is_empty() && st.slices(0, 0).is_empty());
    }
}
