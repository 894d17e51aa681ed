//! The writer thread: group commit.
//!
//! The writer blocks on `recv()`, then drains whatever else is queued with `try_recv()` (up to
//! [`MAX_BATCH_REQUESTS`] requests or [`MAX_BATCH_BYTES`]; right after a larger batch of
//! appends it waits, at most about one sync's time, for as many: `gather.rs`), stages every write and append of
//! the batch into one buffer, writes it with `pwrite` into the segment file or files it spans,
//! fdatasyncs each file touched once, stores the flush pointer when needed, puts the new position
//! into the watch, completes every waiter and then announces the position: one wake-up per
//! subscriber, after the answers, so that a waiter that rides the watch (`Ticket::ride`) needs
//! no wake-up of its own. The flushed end it publishes is what open
//! would find again after a crash: the batch's end, except after a standby's raw bytes of
//! walserver records that end inside a record and that no stored pointer vouches for; then
//! it is the pointer or the end of the last complete record (`write_out`), and the rest
//! counts as written. A control operation (promotion, following a timeline, truncation:
//! `timeline.rs`) first commits what is staged, then runs alone on the thread, so it sees a
//! quiet WAL whose every written byte is durable. The writer starts the background thread
//! (`background.rs`) and stops it when it stops.
//!
//! If a batch fails, every waiter in it gets the error and `written` goes back to the durable
//! end; what happens next is the failure policy written in `health.rs`. For a full disk the
//! writer goes on: the bytes the batch may have left on disk (up to where it got, not where
//! it would have ended: a batch that could not preallocate the next segment wrote nothing
//! there) are zeroed by the next successful batch, so that no failed write can resurface as
//! a valid record after a crash, and writes that fit in the current segment succeed
//! meanwhile. For a failed sync, or any other failure, the writer is *failed*: it refuses
//! every request until [`Wal::restart`](crate::Wal::restart) replaces it, and stores nothing
//! more at its stop.
//!
//! **Invariants:** a waiter is completed only after the fdatasync of every file its bytes went
//! to and, when the batch needs it, of the flush pointer; the published flushed end never
//! passes what open would recover and never moves back; the tail cache gets a batch after its
//! fdatasync and before its end is published, except under the overlapped commit
//! (`publish_early`), where a batch of appends goes into it, with its written end announced,
//! between its write and its fdatasync, and a failed batch empties it.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use bytes::Bytes;
use crossbeam_channel::Receiver;
use tokio::sync::oneshot;
use wal_types::{Lsn, TimelineId};

use crate::background;
use crate::error::is_full_errno;
use crate::files::PointerFile;
use crate::format::Framer;
use crate::gather::Gather;
use crate::health::{self, StorageState};
use crate::io::{FP_FSYNC, FP_WRITE};
use crate::naming::segment_file_name;
use crate::scan::{last_record_end, FileSource, RecordEnds};
use crate::staged::{BatchSource, Staged};
use crate::state::{BgRequest, Inner};
use crate::{Result, WalError, WalFormat};

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

/// However the writer ends (a stop, a restart, a panic), the waiters of its unfinished batch
/// are dropped first, so their tickets see the writer gone, and the position is announced
/// after: a waiter riding the watch wakes, finds its ticket closed and does not wait for an
/// announcement that no writer would make. (Requests still queued belong to the next writer,
/// which announces after answering them.)
impl Drop for Writer {
    fn drop(&mut self) {
        drop(std::mem::take(&mut self.waiters));
        self.inner.announce();
    }
}

pub(crate) struct Writer {
    /// The shared state; timeline control (`timeline.rs`) works on it directly.
    pub(crate) inner: Arc<Inner>,
    tli: TimelineId,
    /// Durable end of the bytes written; `batch_start` equals it between batches.
    flushed: Lsn,
    /// The flushed end published: how far open would find the WAL again after a crash. It
    /// equals `flushed` except after a standby's raw bytes of walserver records that end
    /// inside a record, which no stored pointer vouches for (`write_out`).
    published: Lsn,
    /// How far open's record scan would reach in the bytes beyond the pointer.
    record_ends: RecordEnds,
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
    /// Set when a batch failed in a way that the failure policy does not retry (a failed
    /// sync): why. From then on every request is refused until a restart replaces the writer.
    failed: Option<String>,
    /// While the disk is full: the segment that could not be made, if that is what failed.
    /// The state stays `full` until it exists (appends that fit before it go on meanwhile).
    full_segment: Option<u64>,
    /// A request was answered outside a batch (refused, or failed its checks) since the last
    /// announcement of the position: the next `commit` announces even with nothing staged.
    owed: bool,
}

/// How a batch failed: the error, the file it was met on, whether it was a sync (never
/// retried, whatever the errno), and how far the batch may have put bytes on disk.
struct Failure {
    error: WalError,
    path: Option<PathBuf>,
    sync: bool,
    reach: Lsn,
    /// The segment that could not be opened or made, if that failed.
    segment: Option<u64>,
}

impl Failure {
    fn at(reach: Lsn, path: PathBuf) -> impl FnOnce(WalError) -> Failure {
        move |error| Failure {
            error,
            path: Some(path),
            sync: false,
            reach,
            segment: None,
        }
    }
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
        published: st.flushed,
        record_ends: RecordEnds::default(),
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
        failed: None,
        full_segment: None,
        owed: false,
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

impl Writer {
    pub(crate) fn seg(&self) -> u64 {
        self.inner.cfg.segment_size
    }

    /// The error every request gets once the writer has failed.
    pub(crate) fn refusal(&self) -> Option<WalError> {
        self.failed.as_ref().map(|reason| WalError::StorageFailed {
            reason: reason.clone(),
        })
    }

    /// The durable end of the bytes written, which may be beyond the published flushed end
    /// (see `write_out`): where promotion, following and truncation look for the end.
    pub(crate) fn durable_end(&self) -> Lsn {
        self.flushed
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
        self.published = end;
        self.record_ends = RecordEnds::default();
        self.batch_start = end;
        self.dirty_until = Lsn(0);
        self.forget_files();
        self.highest_seg = end.segment_number(self.seg());
    }

    fn run(mut self, rx: Receiver<Request>) {
        let mut shutdown = false;
        let mut gather = Gather::default();
        while !shutdown {
            let Ok(first) = rx.recv() else { break };
            let woke = Instant::now();
            let mut next = Some(first);
            let mut taken = 0;
            // Append requests in the batch, and whether it holds anything else: only a
            // batch of appends alone waits for more (`gather.rs`).
            let mut appends = 0;
            let mut others = false;
            while let Some(req) = next.take() {
                match req {
                    Request::Write { start, data, reply } => {
                        others = true;
                        self.stage_write(start, data, reply)
                    }
                    Request::Append { payloads, reply } => {
                        appends += 1;
                        self.stage_append(&payloads, reply)
                    }
                    Request::Control(f) => {
                        others = true;
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
                if next.is_none() && !others {
                    if let Some(until) = gather.wait_until(appends, woke) {
                        next = rx.recv_deadline(until).ok();
                    }
                }
            }
            let started = Instant::now();
            self.commit();
            let now = Instant::now();
            gather.committed(if others { 0 } else { appends }, now - started, now);
        }
        self.close();
    }

    /// At a clean stop: persist slots and the durable end, stop the background thread.
    fn close(&mut self) {
        background::persist_dirty_slots(&self.inner);
        if self.failed.is_some() {
            // Nothing more is stored by a failed writer: the reopening that replaces it
            // records the end (`recovery::reopen`).
            let _ = self.inner.bg_tx.send(BgRequest::Shutdown);
            if let Some(bg) = self.bg.take() {
                let _ = bg.join();
            }
            return;
        }
        // Raw writes of walserver records move the pointer only per segment; a clean stop
        // records the end exactly, so the next start need not scan or drop a partial record.
        let p = self.pointer.last;
        if !p.exact || p.end != self.flushed || p.timeline != self.tli {
            match self
                .pointer
                .store(&self.inner.io, self.tli, self.flushed, true)
            {
                Ok(()) => {
                    self.published = self.flushed;
                    self.inner.set_positions(self.flushed, self.flushed);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not record the exact durable end at shutdown")
                }
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
        if let Some(e) = self.refusal() {
            self.answer_now(reply, e);
            return;
        }
        match self.check_write(start, &data) {
            Ok(skip) => {
                if skip < data.len() {
                    self.batch.push_bytes(data.slice(skip..));
                    self.batch_raw = true;
                    self.at_boundary = false;
                }
                self.waiters.push(Waiter::Write(reply));
            }
            Err(e) => self.answer_now(reply, e),
        }
    }

    /// Fails a request before it joins a batch; the next `commit` announces the position
    /// all the same, since a waiter may be riding the watch for this answer.
    fn answer_now<T>(&mut self, reply: oneshot::Sender<Result<T>>, e: WalError) {
        let _ = reply.send(Err(e));
        self.owed = true;
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
        if let Some(e) = self.refusal() {
            self.answer_now(reply, e);
            return;
        }
        if !self.at_boundary {
            // Make what is staged durable, then look for the last record boundary below it.
            self.commit();
            let st = self.inner.state().clone();
            let end = self.flushed;
            let checked = last_record_end(
                &self.inner.files,
                &st.view(),
                &self.inner.cfg,
                st.wal_start,
                end,
            )
            .and_then(|record_end| {
                if record_end == end {
                    Ok(())
                } else {
                    Err(WalError::NotAtRecordBoundary { end, record_end })
                }
            });
            if let Err(e) = checked {
                let e = self.refusal().unwrap_or(e);
                self.answer_now(reply, e);
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
    ///
    /// The batch's new position goes into the watch quietly before the waiters are completed,
    /// and is announced after them, failed batches included: a waiter that rides the watch
    /// instead of waking on its ticket (`Ticket::ride`) then finds its answer when the one
    /// wake-up of its thread comes, and no waiter is left without one.
    fn commit(&mut self) {
        if self.waiters.is_empty() && self.batch.is_empty() {
            if std::mem::take(&mut self.owed) {
                self.inner.announce();
            }
            return;
        }
        let result = self.flush_batch();
        let waiters = std::mem::take(&mut self.waiters);
        match result {
            Ok(()) => {
                self.clear_full();
                for w in waiters {
                    match w {
                        Waiter::Write(reply) => {
                            let _ = reply.send(Ok(self.published));
                        }
                        Waiter::Append(reply, ends) => {
                            let _ = reply.send(Ok(ends));
                        }
                    }
                }
            }
            Err(f) => {
                let e = self.apply_policy(f);
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
        self.owed = false;
        self.inner.announce();
    }

    /// Leaves the `full` state once the segment that could not be made exists (or, when no
    /// segment was missing, after any batch that succeeded).
    fn clear_full(&mut self) {
        if self.inner.health.borrow().state != StorageState::Full {
            return;
        }
        if self
            .full_segment
            .is_some_and(|s| !self.files.contains_key(&s) && self.highest_seg < s)
        {
            return;
        }
        self.full_segment = None;
        tracing::info!("WAL writes succeed again: the disk has room");
        health::set(&self.inner.health, StorageState::Ok, None, None);
    }

    /// The failure policy (`health.rs`): a full disk is backpressure, anything else (a failed
    /// sync above all) fails the writer until a restart. Returns what the waiters get.
    /// A control operation (promotion, following a timeline, truncation, a history file)
    /// failed. Such operations write and sync files too, so an I/O failure falls under the same
    /// policy as a batch's: a full disk is backpressure, anything else fails storage until it
    /// is reopened, because a failed sync is never retried and trusted. Other errors (a request
    /// that makes no sense) go back as they are and leave storage as it was.
    pub(crate) fn control_failed(&mut self, e: WalError) -> WalError {
        match e {
            WalError::Io { .. } | WalError::DiskFull { .. } => self.apply_policy(Failure {
                error: e,
                path: None,
                sync: false,
                reach: self.published,
                segment: None,
            }),
            other => other,
        }
    }

    fn apply_policy(&mut self, f: Failure) -> WalError {
        let full_errno = match &f.error {
            WalError::Io { cause, .. } => is_full_errno(cause),
            WalError::DiskFull { .. } => true,
            _ => false,
        };
        if full_errno && !f.sync {
            let e = match f.error {
                WalError::Io { context, cause } => WalError::DiskFull {
                    context,
                    path: f.path.clone().unwrap_or_else(|| self.inner.dir.clone()),
                    cause,
                },
                other => other,
            };
            if self.inner.health.borrow().state != StorageState::Full {
                tracing::warn!(error = %e, "WAL write refused: the disk is full");
            }
            self.full_segment = f.segment;
            health::set(
                &self.inner.health,
                StorageState::Full,
                Some(e.to_string()),
                f.path,
            );
            return e;
        }
        let reason = format!(
            "{}; nothing beyond {} was acknowledged",
            f.error, self.published
        );
        tracing::error!(error = %f.error, flushed = %self.published, "WAL storage failed; refusing writes until it is reopened");
        health::set(
            &self.inner.health,
            StorageState::Failed,
            Some(f.error.to_string()),
            f.path,
        );
        self.failed = Some(reason);
        self.refusal().expect("just failed")
    }

    fn flush_batch(&mut self) -> std::result::Result<(), Failure> {
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
            Err(f) => {
                // The cache may hold the batch, published early: it will never be durable.
                self.inner.tail.clear();
                self.at_boundary = false;
                self.dirty_until = self.dirty_until.max(f.reach);
                self.batch_start = self.flushed;
                self.inner
                    .set_positions_quietly(self.flushed, self.published);
                Err(f)
            }
        }
    }

    fn write_out(&mut self, start: Lsn, end: Lsn) -> std::result::Result<(), Failure> {
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
            let path = self.inner.files.path(self.tli, segno);
            // Nothing reached this segment if it cannot be opened (or preallocated).
            self.ensure_segment(segno).map_err(|e| Failure {
                segment: Some(segno),
                ..Failure::at(pos, path.clone())(e)
            })?;
            let f = &self.files[&segno];
            let io = &self.inner.io;
            let name = || segment_file_name(self.tli, segno, seg);
            // A write that fails may have put any part of its range on disk.
            let failed = |what: &str, e| {
                Failure::at(upto, path.clone())(WalError::io(format!("{what} {}", name()), e))
            };
            if pos < end {
                let dend = upto.min(end);
                let from = (pos.0 - start.0) as usize;
                let bytes = self.batch.slices(from, (dend.0 - pos.0) as usize);
                io.pwritev_all(f, &bytes, pos.segment_offset(seg), FP_WRITE)
                    .map_err(|e| failed("writing WAL segment", e))?;
                if dend < upto {
                    io.write_zeros(f, dend.segment_offset(seg), upto.0 - dend.0, FP_WRITE)
                        .map_err(|e| failed("zeroing WAL segment", e))?;
                }
            } else {
                io.write_zeros(f, pos.segment_offset(seg), upto.0 - pos.0, FP_WRITE)
                    .map_err(|e| failed("zeroing WAL segment", e))?;
            }
            touched.push(segno);
            pos = upto;
        }
        self.inner.set_written(end);
        let cached = self.publish_early(start, end);
        for segno in touched {
            self.inner
                .io
                .sync_data(&self.files[&segno], FP_FSYNC)
                .map_err(|e| Failure {
                    error: WalError::io(
                        format!(
                            "fdatasync of WAL segment {}",
                            segment_file_name(self.tli, segno, seg)
                        ),
                        e,
                    ),
                    path: Some(self.inner.files.path(self.tli, segno)),
                    sync: true,
                    reach: zero_to,
                    segment: None,
                })?;
        }
        // Raw bytes of relayed PostgreSQL WAL cannot be scanned back, so each batch's end is
        // stored exactly. Raw bytes of walserver records can: recovery scans records past a
        // non-exact pointer (`Wal::open`) and finds every complete record that was flushed,
        // so, as for appends, the pointer moves only when the end enters a new segment (or
        // while open would find no scan start at or below it). That saves a second fdatasync
        // per batch on a standby, which sat on every synchronous commit's path. What recovery
        // may then drop is the partial record at the end, so the flushed end published stops
        // before it: at the pointer or at the end of the last complete record, whichever is
        // later (`published`). Walsenders (cascades) send no further, the walreceiver reports
        // no further upstream, and so the flushed end never moves back, even across a crash.
        let walserver = self.inner.format == WalFormat::Walserver;
        let p = self.pointer.last;
        let store = (self.batch_raw && !walserver)
            || p.exact
            || p.timeline != self.tli
            || p.end.segment_number(seg) != end.segment_number(seg)
            || (walserver && !self.record_ends.scannable());
        if store {
            // The pointer is written in place and synced: whatever failed, it is not retried
            // and trusted (a full disk cannot fail an in-place write of a preallocated file).
            let path = self.inner.dir.join("flush_pointer");
            self.pointer
                .store(&self.inner.io, self.tli, end, false)
                .map_err(|error| Failure {
                    error,
                    path: Some(path),
                    sync: true,
                    reach: zero_to,
                    segment: None,
                })?;
        }
        let published = if walserver {
            self.recoverable_end(start, end, store)
        } else {
            end
        };
        self.dirty_until = Lsn(0);
        self.flushed = end;
        self.published = published;
        // Into the tail cache before the new end is published, so that a walsender woken by
        // it finds the bytes in memory.
        let len = (end.0 - start.0) as usize;
        if len > 0 && !cached {
            let parts = self.batch.slices(0, len);
            self.inner.tail.add(self.tli, start, len, &parts);
        }
        self.inner.set_positions_quietly(end, published);
        Ok(())
    }

    /// The overlapped commit's early publication (`Wal::set_publish_written`): once a batch
    /// of appends is written and before its fdatasync, its bytes go into the tail cache and
    /// its written end is announced, so that a walsender of a synchronous walserver standby
    /// sends them while the sync runs. Returns whether the batch is in the cache. Only
    /// appends qualify (their written end is a record boundary, and a standby's raw bytes
    /// are not sent on before their sync), and only batches the cache takes: a reader is
    /// never told of written bytes it cannot read from memory.
    fn publish_early(&mut self, start: Lsn, end: Lsn) -> bool {
        if self.batch_raw || end <= start || !self.inner.publish_written.load(Ordering::Acquire) {
            return false;
        }
        let len = (end.0 - start.0) as usize;
        let parts = self.batch.slices(0, len);
        if !self.inner.tail.add(self.tli, start, len, &parts) {
            return false;
        }
        self.inner.set_positions(end, self.published);
        true
    }

    /// How far open would find walserver WAL again after a crash, once the batch `[start,
    /// end)` is durable and the pointer stored if `stored`: the pointer, or the end of the
    /// last complete record on the chain open scans, whichever is later. A failed scan (a
    /// read error) publishes no further than the pointer and makes the next batch store it.
    fn recoverable_end(&mut self, start: Lsn, end: Lsn, stored: bool) -> Lsn {
        let st = self.inner.state().clone();
        let view = st.view();
        let files = &self.inner.files;
        let scanned = (|| {
            if stored {
                (self.record_ends).pointer_stored(files, &view, st.wal_start, end)?;
            }
            if self.at_boundary {
                self.record_ends.complete_to(end);
                return Ok(Some(end));
            }
            let src = BatchSource {
                files: FileSource {
                    files,
                    view: &view,
                    limit: start,
                },
                batch: &self.batch,
                start,
                end,
                hint: (0, 0),
            };
            self.record_ends.advance(src, &self.inner.cfg, end)
        })();
        let pointer = self.pointer.last.end;
        match scanned {
            Ok(records) => pointer.max(records.unwrap_or(pointer)).min(end),
            Err(e) => {
                tracing::warn!(error = %e, "could not follow the records of received WAL; the flush pointer alone vouches for it");
                self.record_ends = RecordEnds::default();
                pointer
            }
        }
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
            Some(rx) => match rx.recv().map_err(|_| WalError::Closed)? {
                Ok(f) => f,
                // A preallocation asked for earlier failed (a full disk, most likely). Space
                // may have been freed since: try once more now rather than fail on an old
                // result.
                Err(_) => {
                    self.request_prealloc(segno);
                    let rx = self.pending.remove(&segno).ok_or(WalError::Closed)?;
                    rx.recv().map_err(|_| WalError::Closed)??
                }
            },
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
