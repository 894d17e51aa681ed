//! The writer thread (group commit) and the background thread (preallocation, retention, slot
//! persistence).
//!
//! The writer blocks on `recv()`, then drains whatever else is queued with `try_recv()` (up to
//! [`MAX_BATCH_REQUESTS`] requests or [`MAX_BATCH_BYTES`]), stages every write and append of
//! the batch into one buffer, writes it with `pwrite` into the segment file or files it spans,
//! fdatasyncs each file touched once, stores the flush pointer when needed, publishes the new
//! position and only then completes every waiter. A control operation (promotion, following a
//! timeline, truncation) first commits what is staged, then runs alone on the thread, so it sees
//! a quiet WAL with `written == flushed`.
//!
//! If a batch fails (a full disk, an I/O error), every waiter in it gets the error, `written`
//! goes back to `flushed`, and the bytes the batch may have left on disk are zeroed by the next
//! successful batch, so that no failed write can resurface as a valid record after a crash.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use tokio::sync::oneshot;
use wal_types::{Lsn, TimelineId};

use crate::files::{write_atomic, PointerFile};
use crate::format::{Framer, Scan, Scanner};
use crate::history::{check_history_for, format_history, parse_history};
use crate::io::{Io, FP_FSYNC, FP_PREALLOC, FP_WRITE};
use crate::naming::{
    history_file_name, parse_history_file_name, parse_segment_file_name, segment_file_name,
};
use crate::segments::{SegmentFiles, View};
use crate::slots::keep_segno;
use crate::wal::{find_scan_start, Inner, TimelineState};
use crate::{HistoryEntry, Result, StorageConfig, WalError};

/// The most requests one batch takes. A guess, from ACTIX-NOTES §2d: large enough that 64 to
/// 128 concurrent writers fit in one fdatasync.
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

#[derive(Debug)]
pub(crate) enum BgRequest {
    Prealloc {
        tli: TimelineId,
        segno: u64,
        reply: Sender<Result<File>>,
    },
    Retain,
    PersistSlots,
    Shutdown,
}

enum Waiter {
    Write(oneshot::Sender<Result<Lsn>>),
    Append(oneshot::Sender<Result<Vec<Lsn>>>, Vec<Lsn>),
}

pub(crate) struct Writer {
    inner: Arc<Inner>,
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
    let bg_inner = inner.clone();
    let bg = thread::Builder::new()
        .name("wal-background".into())
        .spawn(move || bg_main(bg_inner, bg_rx))
        .map_err(|e| WalError::io("starting the WAL background thread", e))?;
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

/// Zeroes `len` bytes of `f` at `offset`.
pub(crate) fn write_zeros(
    io: &Io,
    f: &File,
    offset: u64,
    len: u64,
    point: &'static str,
) -> io::Result<()> {
    const CHUNK: usize = 256 << 10;
    static ZEROS: [u8; CHUNK] = [0; CHUNK];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        io.pwrite_all(f, &ZEROS[..n], offset + done, point)?;
        done += n as u64;
    }
    Ok(())
}

impl Writer {
    fn seg(&self) -> u64 {
        self.inner.cfg.segment_size
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
        persist_dirty_slots(&self.inner);
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

    fn set_positions(&self, written: Lsn, flushed: Lsn) {
        {
            let mut st = self.inner.state_mut();
            st.written = written;
            st.flushed = flushed;
            st.check_invariants();
        }
        self.inner.publish();
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
                self.set_positions(self.flushed, self.flushed);
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
                    write_zeros(io, f, dend.segment_offset(seg), upto.0 - dend.0, FP_WRITE)
                        .map_err(|e| WalError::io(format!("zeroing WAL segment {}", name()), e))?;
                }
            } else {
                write_zeros(io, f, pos.segment_offset(seg), upto.0 - pos.0, FP_WRITE)
                    .map_err(|e| WalError::io(format!("zeroing WAL segment {}", name()), e))?;
            }
            touched.push(segno);
            pos = upto;
        }
        self.set_positions(end, self.flushed);
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
        self.set_positions(end, end);
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
            None => match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(f) => {
                    let len = f
                        .metadata()
                        .map_err(|e| WalError::io(format!("reading {}", path.display()), e))?
                        .len();
                    if len != seg {
                        return Err(WalError::BadFile {
                            path,
                            reason: format!("segment file is {len} bytes, expected {seg}"),
                        });
                    }
                    f
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.request_prealloc(segno);
                    let rx = self.pending.remove(&segno).expect("just requested");
                    rx.recv().map_err(|_| WalError::Closed)??
                }
                Err(e) => return Err(WalError::io(format!("opening {}", path.display()), e)),
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

    fn request_prealloc(&mut self, segno: u64) {
        if self.pending.contains_key(&segno)
            || self.files.contains_key(&segno)
            || self.inner.files.path(self.tli, segno).exists()
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

    /// Starts a new timeline at the end of the last complete record at or below the flushed end.
    pub(crate) fn promote(&mut self, reason: &str) -> Result<(TimelineId, Lsn)> {
        let st = self.inner.state().clone();
        let x = last_record_end(
            &self.inner.files,
            &st.view(),
            &self.inner.cfg,
            st.wal_start,
            st.flushed,
        )?;
        // Like PostgreSQL's findNewestTimeLine: never reuse a timeline some history file names.
        let mut newest = st.tli;
        for e in fs::read_dir(self.inner.pg_wal())
            .map_err(|e| WalError::io("listing pg_wal", e))?
            .flatten()
        {
            if let Some(t) = parse_history_file_name(&e.file_name().to_string_lossy()) {
                newest = newest.max(t);
            }
        }
        let new_tli = newest.next();
        let mut history = st.history.to_vec();
        history.push(HistoryEntry {
            parent: st.tli,
            switch_lsn: x,
            reason: reason.to_string(),
        });
        let bytes = format_history(&history);
        self.switch_to(new_tli, history, &bytes, x)?;
        Ok((new_tli, x))
    }

    /// Follows an upstream's switch to `new_tli` at `switch_lsn`.
    pub(crate) fn follow(
        &mut self,
        new_tli: TimelineId,
        bytes: Vec<u8>,
        switch_lsn: Lsn,
    ) -> Result<()> {
        let entries = parse_history(&bytes)?;
        check_history_for(new_tli, &entries)?;
        let st = self.inner.state().clone();
        if new_tli <= st.tli {
            return Err(WalError::InvalidHistory(format!(
                "timeline {new_tli} is not newer than the current timeline {}",
                st.tli
            )));
        }
        let Some((last, ancestors)) = entries.split_last() else {
            return Err(WalError::InvalidHistory(format!(
                "the history of timeline {new_tli} names no ancestor"
            )));
        };
        if last.parent != st.tli || last.switch_lsn != switch_lsn {
            return Err(WalError::InvalidHistory(format!(
                "timeline {new_tli} branched from timeline {} at {}, not from this node's timeline {} at {switch_lsn}",
                last.parent, last.switch_lsn, st.tli
            )));
        }
        let same = ancestors.len() == st.history.len()
            && ancestors
                .iter()
                .zip(st.history.iter())
                .all(|(a, b)| a.parent == b.parent && a.switch_lsn == b.switch_lsn);
        if !same {
            return Err(WalError::InvalidHistory(format!(
                "the history of timeline {new_tli} disagrees with this node's history of timeline {}",
                st.tli
            )));
        }
        if st.flushed > switch_lsn {
            return Err(WalError::Forked {
                fork_lsn: switch_lsn,
                local_end: st.flushed,
            });
        }
        if st.flushed < switch_lsn {
            return Err(WalError::BehindSwitchPoint {
                switch_lsn,
                flushed: st.flushed,
            });
        }
        self.switch_to(new_tli, entries, &bytes, switch_lsn)
    }

    pub(crate) fn store_history(&mut self, tli: TimelineId, bytes: &[u8]) -> Result<()> {
        let target = self.inner.pg_wal().join(history_file_name(tli));
        write_atomic(&self.inner.io, &self.inner.tmp, &target, bytes)
    }

    /// Makes `new_tli` current, beginning at `x`. The control file is the commit point: a
    /// crash before it leaves the old timeline current (the new history file and switch
    /// segment are harmless leftovers, the latter removed at open).
    fn switch_to(
        &mut self,
        new_tli: TimelineId,
        history: Vec<HistoryEntry>,
        history_bytes: &[u8],
        x: Lsn,
    ) -> Result<()> {
        let seg = self.seg();
        self.store_history(new_tli, history_bytes)?;
        if x.segment_offset(seg) != 0 {
            self.copy_switch_segment(new_tli, x)?;
        }
        let old = self.inner.state().clone();
        self.inner.tail.clear();
        let st = TimelineState {
            tli: new_tli,
            history: Arc::new(history),
            timeline_start: x,
            wal_start: old.wal_start,
            written: x,
            flushed: x,
        };
        self.inner.write_control(&st)?;
        self.pointer.store(&self.inner.io, new_tli, x, true)?;
        *self.inner.state_mut() = st;
        self.inner.publish();
        self.tli = new_tli;
        self.at_boundary = true;
        self.flushed = x;
        self.batch_start = x;
        self.dirty_until = Lsn(0);
        self.files.clear();
        self.pending.clear();
        self.highest_seg = x.segment_number(seg);
        self.request_prealloc(x.segment_number(seg) + 1);
        tracing::info!(timeline = %new_tli, start = %x, "switched to a new timeline");
        Ok(())
    }

    /// Creates the new timeline's first segment: a copy of the old one up to `x`, zeros after.
    fn copy_switch_segment(&mut self, new_tli: TimelineId, x: Lsn) -> Result<()> {
        let seg = self.seg();
        let segno = x.segment_number(seg);
        let name = segment_file_name(new_tli, segno, seg);
        let tmp = self.inner.tmp.join(format!("{name}.switch"));
        let view = self.inner.state().view();
        let io = &self.inner.io;
        let result = (|| -> Result<()> {
            let ctx = |e| WalError::io(format!("creating switch segment {name}"), e);
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(ctx)?;
            let mut pos = x.segment_start(seg);
            while pos < x {
                let b = self
                    .inner
                    .files
                    .read(&view, pos, x, 1 << 20)?
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| WalError::SegmentRemoved {
                        segment: segment_file_name(view.timeline_of(pos), segno, seg),
                    })?;
                io.pwrite_all(&f, &b, pos.segment_offset(seg), FP_WRITE)
                    .map_err(ctx)?;
                pos = pos + b.len() as u64;
            }
            write_zeros(
                io,
                &f,
                x.segment_offset(seg),
                seg - x.segment_offset(seg),
                FP_WRITE,
            )
            .map_err(ctx)?;
            io.sync_all(&f, FP_FSYNC).map_err(ctx)?;
            fs::rename(&tmp, self.inner.pg_wal().join(&name)).map_err(ctx)?;
            io.sync_dir(self.inner.pg_wal()).map_err(ctx)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        self.inner.files.evict(|t, s| t == new_tli && s == segno);
        result
    }

    /// Drops the current timeline's WAL beyond `lsn`.
    pub(crate) fn truncate(&mut self, lsn: Lsn) -> Result<u64> {
        let seg = self.seg();
        let st = self.inner.state().clone();
        let bad = |reason: String| WalError::BadTruncate { lsn, reason };
        if lsn > st.flushed {
            return Err(bad(format!(
                "the WAL of timeline {} ends at {}",
                st.tli, st.flushed
            )));
        }
        if lsn == st.flushed && self.dirty_until <= lsn {
            return Ok(0);
        }
        if lsn < st.timeline_start {
            return Err(bad(format!(
                "timeline {} begins at {}",
                st.tli, st.timeline_start
            )));
        }
        if lsn < self.inner.oldest_retained() {
            return Err(bad("that WAL was already removed".into()));
        }
        self.inner.tail.clear();
        // The exact pointer first: a crash in the middle of the cut redoes it at open.
        self.pointer.store(&self.inner.io, st.tli, lsn, true)?;
        self.files.clear();
        self.pending.clear();
        let segno = lsn.segment_number(seg);
        let path = self.inner.files.path(st.tli, segno);
        if path.exists() {
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| WalError::io(format!("opening {}", path.display()), e))?;
            let off = lsn.segment_offset(seg);
            write_zeros(&self.inner.io, &f, off, seg - off, FP_WRITE)
                .and_then(|_| self.inner.io.sync_data(&f, FP_FSYNC))
                .map_err(|e| WalError::io(format!("truncating {}", path.display()), e))?;
        }
        for e in fs::read_dir(self.inner.pg_wal())
            .map_err(|e| WalError::io("listing pg_wal", e))?
            .flatten()
        {
            if let Some((t, s)) = parse_segment_file_name(&e.file_name().to_string_lossy(), seg) {
                if t == st.tli && s > segno {
                    fs::remove_file(e.path()).map_err(|err| {
                        WalError::io(format!("removing {}", e.path().display()), err)
                    })?;
                }
            }
        }
        self.inner.files.evict(|t, s| t == st.tli && s > segno);
        self.inner
            .io
            .sync_dir(self.inner.pg_wal())
            .map_err(|e| WalError::io("syncing pg_wal", e))?;
        let dropped = st.flushed.0 - lsn.0;
        self.at_boundary = false;
        self.flushed = lsn;
        self.batch_start = lsn;
        self.dirty_until = Lsn(0);
        self.highest_seg = segno;
        self.set_positions(lsn, lsn);
        let st = self.inner.state().clone();
        self.inner.write_control(&st)?;
        tracing::warn!(lsn = %lsn, dropped, "truncated WAL");
        Ok(dropped)
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Reads a view's files up to a limit, for scans.
pub(crate) struct LimitedSource<'a> {
    pub files: &'a SegmentFiles,
    pub view: &'a View,
    pub limit: Lsn,
}

impl crate::format::ByteSource for LimitedSource<'_> {
    fn read_at(&mut self, lsn: Lsn, max_len: usize) -> Result<Bytes> {
        Ok(self
            .files
            .read(self.view, lsn, self.limit, max_len)?
            .unwrap_or_default())
    }
}

/// The end of the last complete record at or below `upto`.
fn last_record_end(
    files: &SegmentFiles,
    view: &View,
    cfg: &StorageConfig,
    wal_start: Lsn,
    upto: Lsn,
) -> Result<Lsn> {
    let Some(start) = find_scan_start(files, view, wal_start, upto)? else {
        if upto == wal_start {
            return Ok(upto);
        }
        return Err(WalError::Corruption {
            segment: segment_file_name(
                view.tli,
                upto.segment_number(cfg.segment_size),
                cfg.segment_size,
            ),
            offset: upto.segment_offset(cfg.segment_size),
            reason: "no complete record below the flushed end to start a timeline at".into(),
        });
    };
    let src = LimitedSource {
        files,
        view,
        limit: upto,
    };
    let mut scanner = Scanner::new(src, cfg.segment_size, cfg.max_record_size, start);
    let mut end = start;
    while let Scan::Record(r) = scanner.next()? {
        end = r.end;
    }
    Ok(end)
}

fn bg_main(inner: Arc<Inner>, rx: Receiver<BgRequest>) {
    for req in rx {
        match req {
            BgRequest::Prealloc { tli, segno, reply } => {
                let _ = reply.send(preallocate(&inner, tli, segno));
            }
            BgRequest::Retain => {
                if let Err(e) = retain(&inner) {
                    tracing::warn!(error = %e, "WAL retention failed; will retry at the next segment switch");
                }
            }
            BgRequest::PersistSlots => persist_dirty_slots(&inner),
            BgRequest::Shutdown => break,
        }
    }
}

/// Gives a new, empty segment file its full size of zeros.
///
/// On tmpfs nothing is made durable and the kernel hands out zeroed pages, so `fallocate`
/// reserves the memory without copying 16 MiB of zeros from user space: that copy was about
/// 40% of a standby's CPU while catching up on tmpfs. Elsewhere the zeros are written, so
/// that later overwrites, and their fdatasync, change no file-system metadata (an unwritten
/// extent from fallocate would make every small commit's fdatasync a journal commit).
fn zero_fill(io: &Io, f: &File, len: u64) -> io::Result<()> {
    if on_tmpfs(f) {
        io.check(FP_PREALLOC)?;
        use std::os::fd::AsRawFd;
        // SAFETY: fallocate on a descriptor we own, over a valid range.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) } == 0 {
            return Ok(());
        }
    }
    write_zeros(io, f, 0, len, FP_PREALLOC)
}

fn on_tmpfs(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: fstatfs fills the struct we pass for a descriptor we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } == 0;
    ok && st.f_type as u64 == libc::TMPFS_MAGIC as u64
}

/// Creates a zero-filled segment file outside `pg_wal`, makes it durable, then links it into
/// `pg_wal` under its final name (never replacing a file there) and fsyncs the directory.
fn preallocate(inner: &Inner, tli: TimelineId, segno: u64) -> Result<File> {
    let seg = inner.cfg.segment_size;
    let name = segment_file_name(tli, segno, seg);
    let tmp = inner.tmp.join(format!("{name}.prealloc"));
    let target = inner.pg_wal().join(&name);
    let io = &inner.io;
    let result = (|| -> io::Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        zero_fill(io, &f, seg)?;
        io.sync_all(&f, FP_PREALLOC)?;
        match fs::hard_link(&tmp, &target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(&tmp)?;
                return OpenOptions::new().read(true).write(true).open(&target);
            }
            Err(e) => return Err(e),
        }
        fs::remove_file(&tmp)?;
        io.sync_dir(inner.pg_wal())?;
        Ok(f)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        WalError::io(format!("preallocating WAL segment {name}"), e)
    })
}

/// Removes segments nobody needs and invalidates slots that hold too much.
pub(crate) fn retain(inner: &Inner) -> Result<()> {
    let seg = inner.cfg.segment_size;
    let (flushed, wal_start) = {
        let st = inner.state();
        (st.flushed, st.wal_start)
    };
    // The segment holding the last durable byte stays even when the flushed end sits exactly
    // on a segment boundary: recovery reads it.
    let last_byte_seg = Lsn(flushed.0.saturating_sub(1))
        .max(wal_start)
        .segment_number(seg);
    let keep = {
        let mut slots = inner.slots();
        let keep = keep_segno(flushed, slots.min_restart_lsn(), &inner.cfg).min(last_byte_seg);
        let cutoff = Lsn(keep * seg);
        let doomed: Vec<String> = slots
            .slots
            .iter()
            .filter(|(_, s)| !s.invalidated && s.restart_lsn.is_some_and(|r| r < cutoff))
            .map(|(n, _)| n.clone())
            .collect();
        for name in doomed {
            let s = slots.slots.get_mut(&name).expect("listed above");
            tracing::warn!(slot = %name, restart_lsn = ?s.restart_lsn, "invalidating replication slot: it exceeds max_slot_wal_keep_size");
            s.invalidated = true;
            s.dirty = true;
            slots.persist(&inner.io, &inner.tmp, &inner.slots_dir, &name)?;
        }
        keep
    };
    let cutoff = Lsn(keep * seg);
    inner
        .oldest_retained
        .fetch_max(cutoff.0, std::sync::atomic::Ordering::AcqRel);
    let mut removed = false;
    for e in fs::read_dir(inner.pg_wal())
        .map_err(|e| WalError::io("listing pg_wal", e))?
        .flatten()
    {
        if let Some((_, segno)) = parse_segment_file_name(&e.file_name().to_string_lossy(), seg) {
            if segno < keep {
                fs::remove_file(e.path())
                    .map_err(|err| WalError::io(format!("removing {}", e.path().display()), err))?;
                removed = true;
            }
        }
    }
    if removed {
        inner.files.evict(|_, s| s < keep);
        inner
            .io
            .sync_dir(inner.pg_wal())
            .map_err(|e| WalError::io("syncing pg_wal", e))?;
    }
    Ok(())
}

pub(crate) fn persist_dirty_slots(inner: &Inner) {
    let mut slots = inner.slots();
    let dirty: Vec<String> = slots
        .slots
        .iter()
        .filter(|(_, s)| s.dirty && !s.temporary)
        .map(|(n, _)| n.clone())
        .collect();
    for name in dirty {
        if let Err(e) = slots.persist(&inner.io, &inner.tmp, &inner.slots_dir, &name) {
            tracing::warn!(slot = %name, error = %e, "could not persist replication slot");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
