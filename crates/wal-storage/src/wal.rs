//! The `Wal` handle: init, open and recovery, reads, and the public API that the writer thread
//! (in `writer.rs`) serves.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use bytes::Bytes;
use crossbeam_channel::Sender;
use tokio::sync::{oneshot, watch};
use wal_types::{Lsn, SystemId, TimelineId};

use crate::files::{
    encode_envelope, read_control, write_atomic, ControlData, FlushPointer, PointerFile,
    FILE_VERSION,
};
use crate::format::{
    ByteSource, Record, Scan, Scanner, SegmentHeader, StopKind, SEGMENT_HEADER_SIZE,
};
use crate::history::{check_history_for, format_history};
use crate::io::Io;
use crate::naming::{
    history_file_name, parse_history_file_name, parse_segment_file_name, segment_file_name,
};
use crate::segments::{SegmentFiles, View};
use crate::slots::{self, Slot, SlotInfo, SlotTable};
use crate::writer::{self, BgRequest, Request};
use crate::{HistoryEntry, Result, StorageConfig, WalError, WalFormat};

/// Where the WAL stands: what the writer thread publishes after each write and each fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalPosition {
    pub timeline: TimelineId,
    /// End of what has been written to the segment files (not necessarily durable).
    pub written: Lsn,
    /// End of what is durable. Never ahead of `written`.
    pub flushed: Lsn,
}

/// How to make a new data directory.
#[derive(Clone, Debug)]
pub struct InitOptions {
    pub system_id: SystemId,
    pub format: WalFormat,
    /// The timeline to start on: 1 for a new primary, the upstream's for a standby.
    pub timeline: TimelineId,
    /// Where the WAL starts, segment-aligned and not 0/0. `None` is the start of segment 1
    /// (0/1000000 with 16 MiB segments), where a new primary begins.
    pub start_lsn: Option<Lsn>,
    /// The ancestry of `timeline`, oldest first (empty for timeline 1).
    pub history: Vec<HistoryEntry>,
    /// Raw history files to store, as fetched from an upstream (TIMELINE_HISTORY), so they can
    /// be served again byte for byte. The file of `timeline` is written from `history` if it is
    /// not among them.
    pub history_files: Vec<(TimelineId, Vec<u8>)>,
}

impl InitOptions {
    /// A new primary: timeline 1, starting at segment 1.
    pub fn primary(system_id: SystemId, format: WalFormat) -> InitOptions {
        InitOptions {
            system_id,
            format,
            timeline: TimelineId::FIRST,
            start_lsn: None,
            history: Vec::new(),
            history_files: Vec::new(),
        }
    }
}

/// What `open` found and did to find the end of durable WAL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    pub timeline: TimelineId,
    /// The recovered durable end: writes continue here.
    pub end: Lsn,
    /// The durable end the flush pointer (or control file) vouched for.
    pub flush_pointer: Lsn,
    /// For walserver-format WAL, the end of the valid records found by scanning.
    pub records_end: Option<Lsn>,
    /// Why the record scan stopped, if it did at something other than never-written bytes.
    pub stop_reason: Option<String>,
    /// Bytes beyond the end that held something and were zeroed (a torn or unconfirmed tail).
    pub discarded_bytes: u64,
    /// Segment files beyond the end that were removed.
    pub removed_segments: Vec<String>,
}

/// The parts of the state that change together (promotion, following, truncation, writes).
#[derive(Clone, Debug)]
pub(crate) struct TimelineState {
    pub tli: TimelineId,
    pub history: Arc<Vec<HistoryEntry>>,
    pub timeline_start: Lsn,
    pub wal_start: Lsn,
    pub written: Lsn,
    pub flushed: Lsn,
}

impl TimelineState {
    pub(crate) fn view(&self) -> View {
        View {
            tli: self.tli,
            history: self.history.clone(),
        }
    }

    pub(crate) fn position(&self) -> WalPosition {
        WalPosition {
            timeline: self.tli,
            written: self.written,
            flushed: self.flushed,
        }
    }

    /// The ordering relations between positions.
    pub(crate) fn check_invariants(&self) {
        debug_assert!(self.flushed <= self.written, "{self:?}");
        debug_assert!(self.timeline_start <= self.flushed, "{self:?}");
        debug_assert!(self.wal_start <= self.timeline_start, "{self:?}");
    }
}

/// Everything shared by handles, the writer thread and the background thread.
#[derive(Debug)]
pub(crate) struct Inner {
    pub dir: PathBuf,
    pub tmp: PathBuf,
    pub slots_dir: PathBuf,
    pub cfg: StorageConfig,
    pub system_id: SystemId,
    pub format: WalFormat,
    pub io: Io,
    pub files: SegmentFiles,
    pub state: RwLock<TimelineState>,
    pub pos_tx: watch::Sender<WalPosition>,
    /// Counts slot releases, so a `DROP_REPLICATION_SLOT ... WAIT` can wait for one.
    pub slot_released: watch::Sender<u64>,
    pub oldest_retained: AtomicU64,
    pub slots: Mutex<SlotTable>,
    pub recovery: RecoveryReport,
    /// Feeds the background thread (preallocation, retention, slot persistence).
    pub bg_tx: Sender<BgRequest>,
    /// The last small durable batches, for readers at the end of WAL.
    pub tail: crate::tail::TailCache,
    /// Held for the life of the data directory's use; the lock goes with the file.
    _lock: File,
}

impl Inner {
    pub(crate) fn state(&self) -> std::sync::RwLockReadGuard<'_, TimelineState> {
        // The state is plain data, always consistent between statements.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn state_mut(&self) -> std::sync::RwLockWriteGuard<'_, TimelineState> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn slots(&self) -> std::sync::MutexGuard<'_, SlotTable> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn pg_wal(&self) -> &Path {
        &self.files.pg_wal
    }

    pub(crate) fn publish(&self) {
        let pos = self.state().position();
        self.pos_tx.send_replace(pos);
    }

    pub(crate) fn oldest_retained(&self) -> Lsn {
        Lsn(self.oldest_retained.load(Ordering::Acquire))
    }

    pub(crate) fn write_control(&self, st: &TimelineState) -> Result<()> {
        let c = ControlData {
            version: FILE_VERSION,
            system_identifier: self.system_id,
            wal_format: self.format,
            segment_size: self.cfg.segment_size,
            timeline: st.tli,
            history: st.history.to_vec(),
            timeline_start: st.timeline_start,
            wal_start: st.wal_start,
            durable_lsn: st.flushed,
        };
        write_atomic(
            &self.io,
            &self.tmp,
            &self.dir.join("control"),
            &encode_envelope("control", &c),
        )
    }

    /// Bytes of the current timeline at `start` from the tail cache; see [`Wal::read_cached`].
    pub(crate) fn read_cached(&self, tli: TimelineId, start: Lsn, max_len: usize) -> Option<Bytes> {
        let limit = {
            let st = self.state();
            if st.tli != tli {
                return None;
            }
            st.flushed
        };
        // Like `read`, stop at the segment's end.
        let seg = self.cfg.segment_size;
        let in_segment = usize::try_from(seg - start.segment_offset(seg)).unwrap_or(usize::MAX);
        self.tail.get(tli, start, max_len.min(in_segment), limit)
    }

    /// Bytes of timeline `tli` at `start`; see [`Wal::read`].
    pub(crate) fn read(&self, tli: TimelineId, start: Lsn, max_len: usize) -> Result<Bytes> {
        match self.find(tli, start, max_len, |files, view, limit| {
            files.read(view, start, limit, max_len)
        })? {
            Found::Empty => Ok(Bytes::new()),
            Found::Here(b) => Ok(b),
        }
    }

    /// Where the bytes of timeline `tli` at `start` lie; see [`Wal::locate`].
    pub(crate) fn locate(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
    ) -> Result<Option<WalFileRange>> {
        match self.find(tli, start, max_len, |files, view, limit| {
            files.locate(view, start, limit, max_len)
        })? {
            Found::Empty => Ok(None),
            Found::Here(r) => Ok(Some(r)),
        }
    }

    /// The checks `read` and `locate` share, then `get` on the segment files with the view of
    /// timeline `tli` and the end not to read past.
    fn find<T>(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
        get: impl FnOnce(&SegmentFiles, &View, Lsn) -> Result<Option<T>>,
    ) -> Result<Found<T>> {
        let (view, limit) = {
            let st = self.state();
            if tli == st.tli {
                (st.view(), st.flushed)
            } else if let Some(i) = st.history.iter().position(|e| e.parent == tli) {
                let view = View {
                    tli,
                    history: Arc::new(st.history[..i].to_vec()),
                };
                (view, st.history[i].switch_lsn)
            } else {
                return Err(WalError::UnknownTimeline(tli));
            }
        };
        if start > limit {
            return Err(WalError::BeyondEnd {
                timeline: tli,
                requested: start,
                end: limit,
            });
        }
        if start == limit || max_len == 0 {
            return Ok(Found::Empty);
        }
        let seg = self.cfg.segment_size;
        let removed = || WalError::SegmentRemoved {
            segment: segment_file_name(view.timeline_of(start), start.segment_number(seg), seg),
        };
        if start < self.oldest_retained() {
            return Err(removed());
        }
        match get(&self.files, &view, limit)? {
            Some(x) => Ok(Found::Here(x)),
            None => Err(removed()),
        }
    }
}

enum Found<T> {
    /// Nothing to read: `start` is the end, or no bytes were asked for.
    Empty,
    Here(T),
}

/// Where a range of durable WAL lies: `len` bytes of `file` at `offset`, all in one segment
/// file, all at or below the flushed end. Durable WAL never changes in place (segments are
/// removed, not recycled; only `walserver rejoin`, offline, cuts WAL), so the range can be
/// sent later, straight from the file (`sendfile`), and still be the bytes asked for.
#[derive(Clone, Debug)]
pub struct WalFileRange {
    pub file: Arc<std::fs::File>,
    pub offset: u64,
    pub len: usize,
}

/// A handle on the WAL of one data directory. Cheap to clone; all clones share one writer
/// thread, which stops when the last clone is dropped (after finishing what was sent to it).
#[derive(Clone, Debug)]
pub struct Wal {
    pub(crate) inner: Arc<Inner>,
    handle: Arc<Handle>,
}

/// Owns the writer thread. Dropping it stops the writer, which stops the background thread.
#[derive(Debug)]
struct Handle {
    tx: Sender<Request>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.tx.send(Request::Shutdown);
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = thread {
            // The writer finishes its batch, persists slots, stops the background thread.
            let _ = t.join();
        }
    }
}

/// Resolves when the bytes of a `write` or the records of an `append` are durable, with the
/// result of the write. Await it, or call [`Ticket::wait`] outside async code.
#[derive(Debug)]
pub struct Ticket<T> {
    rx: oneshot::Receiver<Result<T>>,
}

/// Resolves to the durable end of the current timeline after the write's bytes are fsynced.
pub type WriteTicket = Ticket<Lsn>;
/// Resolves to the end LSN of each appended record once they are durable.
pub type AppendTicket = Ticket<Vec<Lsn>>;

impl<T> Ticket<T> {
    /// Blocks until the write is durable or failed.
    ///
    /// # Panics
    ///
    /// If called from within an async runtime (use `.await` there).
    pub fn wait(self) -> Result<T> {
        self.rx.blocking_recv().unwrap_or(Err(WalError::Closed))
    }
}

impl<T> Future for Ticket<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(WalError::Closed)))
    }
}

/// Held while a slot is in use (streaming); dropping it releases the slot, and drops it if it
/// is temporary.
#[derive(Debug)]
pub struct SlotGuard {
    inner: Arc<Inner>,
    name: String,
}

impl SlotGuard {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut slots = self.inner.slots();
        let temporary = match slots.slots.get_mut(&self.name) {
            Some(s) => {
                s.active = false;
                s.temporary
            }
            None => false,
        };
        if temporary {
            slots.slots.remove(&self.name);
        }
        drop(slots);
        self.inner
            .slot_released
            .send_modify(|n| *n = n.wrapping_add(1));
    }
}

fn io_err(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> WalError {
    let ctx = format!("{what} {}", path.display());
    move |e| WalError::io(ctx, e)
}

fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join("walserver.lock");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err("opening", &path))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(WalError::Locked {
            dir: dir.to_path_buf(),
            lock: path,
        }),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(WalError::io(format!("locking {}", path.display()), e))
        }
    }
}

impl Wal {
    /// Creates a data directory and opens it. Fails if `dir` already holds one.
    pub fn init(dir: impl AsRef<Path>, cfg: StorageConfig, opts: InitOptions) -> Result<Wal> {
        let dir = dir.as_ref();
        cfg.validate()?;
        let seg = cfg.segment_size;
        fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        let lock = lock_dir(dir)?;
        if dir.join("control").exists() {
            return Err(WalError::AlreadyInitialized {
                dir: dir.to_path_buf(),
            });
        }
        let start = opts.start_lsn.unwrap_or(Lsn(seg));
        if !start.is_valid() || start.segment_offset(seg) != 0 {
            return Err(WalError::InvalidConfig(format!(
                "the WAL must start at a segment boundary other than 0/0, got {start}"
            )));
        }
        check_history_for(opts.timeline, &opts.history)?;
        if let Some(last) = opts.history.last() {
            if start < last.switch_lsn.segment_start(seg) {
                return Err(WalError::InvalidConfig(format!(
                    "timeline {} begins at {}; a standby starting at {start} must start on an older timeline",
                    opts.timeline, last.switch_lsn
                )));
            }
        }
        let io = Io::new(cfg.fsync);
        let pg_wal = dir.join("pg_wal");
        let tmp = dir.join("tmp");
        for d in [&pg_wal, &tmp, &dir.join("slots")] {
            fs::create_dir_all(d).map_err(io_err("creating", d))?;
        }
        let mut files = opts.history_files.clone();
        if opts.timeline != TimelineId::FIRST && !files.iter().any(|(t, _)| *t == opts.timeline) {
            files.push((opts.timeline, format_history(&opts.history)));
        }
        for (tli, bytes) in &files {
            crate::history::parse_history(bytes)?;
            write_atomic(&io, &tmp, &pg_wal.join(history_file_name(*tli)), bytes)?;
        }
        PointerFile::create(
            &io,
            &dir.join("flush_pointer"),
            FlushPointer {
                seq: 1,
                timeline: opts.timeline,
                end: start,
                exact: true,
            },
        )?;
        let control = ControlData {
            version: FILE_VERSION,
            system_identifier: opts.system_id,
            wal_format: opts.format,
            segment_size: seg,
            timeline: opts.timeline,
            history: opts.history.clone(),
            timeline_start: start,
            wal_start: start,
            durable_lsn: start,
        };
        io.sync_dir(&pg_wal).map_err(io_err("syncing", &pg_wal))?;
        write_atomic(
            &io,
            &tmp,
            &dir.join("control"),
            &encode_envelope("control", &control),
        )?;
        Wal::open_locked(dir, cfg, lock)
    }

    /// Opens a data directory, finding the end of durable WAL (see the crate docs on crash
    /// safety) and cutting off whatever lies beyond it.
    pub fn open(dir: impl AsRef<Path>, cfg: StorageConfig) -> Result<Wal> {
        let dir = dir.as_ref();
        cfg.validate()?;
        if !dir.join("control").exists() {
            return Err(WalError::NotInitialized {
                dir: dir.to_path_buf(),
            });
        }
        let lock = lock_dir(dir)?;
        Wal::open_locked(dir, cfg, lock)
    }

    /// The segment size a data directory was made with, read from its control file, so a
    /// caller can open it without knowing that in advance.
    pub fn stored_segment_size(dir: impl AsRef<Path>) -> Result<u64> {
        let dir = dir.as_ref();
        if !dir.join("control").exists() {
            return Err(WalError::NotInitialized {
                dir: dir.to_path_buf(),
            });
        }
        Ok(read_control(&dir.join("control"))?.segment_size)
    }

    /// The kind of WAL a data directory holds, read from its control file.
    pub fn stored_format(dir: impl AsRef<Path>) -> Result<WalFormat> {
        let dir = dir.as_ref();
        if !dir.join("control").exists() {
            return Err(WalError::NotInitialized {
                dir: dir.to_path_buf(),
            });
        }
        Ok(read_control(&dir.join("control"))?.wal_format)
    }

    fn open_locked(dir: &Path, cfg: StorageConfig, lock: File) -> Result<Wal> {
        let control = read_control(&dir.join("control"))?;
        if control.segment_size != cfg.segment_size {
            return Err(WalError::SegmentSizeMismatch {
                configured: cfg.segment_size,
                stored: control.segment_size,
            });
        }
        let seg = cfg.segment_size;
        let io = Io::new(cfg.fsync);
        let pg_wal = dir.join("pg_wal");
        let tmp = dir.join("tmp");
        let slots_dir = dir.join("slots");
        for d in [&tmp, &slots_dir] {
            fs::create_dir_all(d).map_err(io_err("creating", d))?;
        }
        // Leftovers of interrupted atomic writes and preallocations.
        for e in fs::read_dir(&tmp).map_err(io_err("listing", &tmp))? {
            let p = e.map_err(io_err("listing", &tmp))?.path();
            fs::remove_file(&p).map_err(io_err("removing", &p))?;
        }
        let files = SegmentFiles::new(&pg_wal, seg);
        let mut pointer = PointerFile::open(&dir.join("flush_pointer"))?;
        let mut st = TimelineState {
            tli: control.timeline,
            history: Arc::new(control.history.clone()),
            timeline_start: control.timeline_start,
            wal_start: control.wal_start,
            written: control.durable_lsn,
            flushed: control.durable_lsn,
        };

        // Segment files on disk, by timeline; those of timelines newer than the current one are
        // remnants of an interrupted promotion and go.
        let mut removed_segments = Vec::new();
        let mut on_disk: BTreeSet<(TimelineId, u64)> = BTreeSet::new();
        for e in fs::read_dir(&pg_wal).map_err(io_err("listing", &pg_wal))? {
            let e = e.map_err(io_err("listing", &pg_wal))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some((tli, segno)) = parse_segment_file_name(&name, seg) {
                if tli > st.tli {
                    fs::remove_file(e.path()).map_err(io_err("removing", &e.path()))?;
                    removed_segments.push(name);
                } else {
                    on_disk.insert((tli, segno));
                }
            }
        }

        // The durable end the pointer vouches for. A pointer of another timeline predates the
        // last switch, whose position the control file holds.
        let (vouched, exact) = if pointer.last.timeline == st.tli {
            (pointer.last.end.max(st.timeline_start), pointer.last.exact)
        } else {
            (control.durable_lsn, true)
        };
        let view = st.view();
        let mut report = RecoveryReport {
            timeline: st.tli,
            end: vouched,
            flush_pointer: vouched,
            records_end: None,
            stop_reason: None,
            discarded_bytes: 0,
            removed_segments: Vec::new(),
        };
        if control.wal_format == WalFormat::Walserver {
            if let Some((records_end, stop)) =
                scan_records_end(&files, &view, &cfg, st.wal_start, vouched)?
            {
                report.records_end = Some(records_end);
                report.stop_reason = stop;
                if !exact {
                    report.end = vouched.max(records_end);
                }
            }
        } else if vouched > st.wal_start {
            // Relayed PostgreSQL WAL: the pointer alone says where durable bytes end; the
            // segment holding the last of them must exist.
            let last = Lsn(vouched.0 - 1);
            if files
                .read(&view, last, Lsn::MAX, 1)?
                .is_none_or(|b| b.is_empty())
            {
                return Err(WalError::Corruption {
                    segment: segment_file_name(st.tli, last.segment_number(seg), seg),
                    offset: last.segment_offset(seg),
                    reason: "the segment holding durable WAL is missing".into(),
                });
            }
        }
        let end = report.end;

        // Record the end as exact before cutting, so that an interrupted cut is redone the same.
        pointer.store(&io, st.tli, end, true)?;
        let end_seg = end.segment_number(seg);
        for &(tli, segno) in on_disk.iter() {
            if tli == st.tli && segno > end_seg {
                let path = files.path(tli, segno);
                if !is_all_zero(&path)? {
                    report
                        .removed_segments
                        .push(segment_file_name(tli, segno, seg));
                }
                fs::remove_file(&path).map_err(io_err("removing", &path))?;
            }
        }
        if on_disk.contains(&(st.tli, end_seg)) {
            let path = files.path(st.tli, end_seg);
            let len = fs::metadata(&path).map_err(io_err("reading", &path))?.len();
            if len != seg {
                if end.segment_offset(seg) != 0 {
                    return Err(WalError::BadFile {
                        path,
                        reason: format!("segment file is {len} bytes, expected {seg}"),
                    });
                }
                // A partial file holding nothing durable: remove, preallocation recreates it.
                fs::remove_file(&path).map_err(io_err("removing", &path))?;
            } else {
                report.discarded_bytes = zero_tail(&io, &path, end.segment_offset(seg))?;
            }
        }
        io.sync_dir(&pg_wal).map_err(io_err("syncing", &pg_wal))?;
        removed_segments.append(&mut report.removed_segments);
        report.removed_segments = removed_segments;
        if report.discarded_bytes > 0 || !report.removed_segments.is_empty() {
            tracing::warn!(
                end = %end,
                discarded_bytes = report.discarded_bytes,
                removed = ?report.removed_segments,
                reason = report.stop_reason.as_deref().unwrap_or(""),
                "cut WAL beyond the durable end"
            );
        }
        st.written = end;
        st.flushed = end;
        st.check_invariants();

        // The oldest retained LSN: the first segment present in the current view.
        let oldest = on_disk
            .iter()
            .filter(|&&(tli, segno)| {
                view.candidates(Lsn(segno * seg), segno, seg)
                    .iter()
                    .any(|&(t, _)| t == tli)
            })
            .map(|&(_, segno)| Lsn(segno * seg))
            .min()
            .unwrap_or(end.segment_start(seg))
            .max(st.wal_start);

        let slots = SlotTable::load(&slots_dir)?;
        let (pos_tx, _) = watch::channel(st.position());
        let (bg_tx, bg_rx) = crossbeam_channel::unbounded();
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            tmp,
            slots_dir,
            cfg,
            system_id: control.system_identifier,
            format: control.wal_format,
            io,
            files,
            state: RwLock::new(st),
            pos_tx,
            slot_released: watch::channel(0).0,
            oldest_retained: AtomicU64::new(oldest.0),
            slots: Mutex::new(slots),
            recovery: report,
            bg_tx,
            tail: Default::default(),
            _lock: lock,
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = writer::spawn(inner.clone(), rx, bg_rx, pointer)?;
        Ok(Wal {
            inner,
            handle: Arc::new(Handle {
                tx,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    pub fn system_id(&self) -> SystemId {
        self.inner.system_id
    }

    pub fn format(&self) -> WalFormat {
        self.inner.format
    }

    pub fn segment_size(&self) -> u64 {
        self.inner.cfg.segment_size
    }

    pub fn config(&self) -> &StorageConfig {
        &self.inner.cfg
    }

    pub fn data_dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn timeline(&self) -> TimelineId {
        self.inner.state().tli
    }

    /// The ancestry of the current timeline, oldest first.
    pub fn history(&self) -> Vec<HistoryEntry> {
        self.inner.state().history.to_vec()
    }

    /// The stored history file of `tli`, byte for byte (for TIMELINE_HISTORY). `None` for
    /// timeline 1 or an unknown timeline.
    pub fn history_file(&self, tli: TimelineId) -> Result<Option<Vec<u8>>> {
        let path = self.inner.pg_wal().join(history_file_name(tli));
        match fs::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(WalError::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Where timeline `tli` ended, if it is an ancestor of the current one.
    pub fn timeline_end(&self, tli: TimelineId) -> Option<Lsn> {
        self.inner
            .state()
            .history
            .iter()
            .find(|e| e.parent == tli)
            .map(|e| e.switch_lsn)
    }

    /// The durable end of the current timeline.
    pub fn flushed(&self) -> Lsn {
        self.inner.state().flushed
    }

    /// The end of what has been written (maybe not yet durable).
    pub fn written(&self) -> Lsn {
        self.inner.state().written
    }

    pub fn position(&self) -> WalPosition {
        self.inner.state().position()
    }

    /// The oldest LSN still readable; older segments were removed by retention.
    pub fn oldest_retained(&self) -> Lsn {
        self.inner.oldest_retained()
    }

    /// What `open` found (for the binary to log).
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.recovery
    }

    /// The number of fsync/fdatasync calls made so far (segments, flush pointer, directories,
    /// control and slot files, preallocation).
    pub fn fsync_count(&self) -> u64 {
        self.inner.io.fsync_count()
    }

    /// The fault-injection points of this instance.
    #[cfg(feature = "failpoints")]
    pub fn failpoints(&self) -> &crate::io::Failpoints {
        &self.inner.io.failpoints
    }

    /// Flush progress: the receiver sees every new position the writer publishes (coalesced:
    /// the newest covers earlier ones).
    pub fn subscribe(&self) -> watch::Receiver<WalPosition> {
        self.inner.pos_tx.subscribe()
    }

    /// Changes each time a slot stops being in use: waiting for an active slot to become
    /// free awaits this instead of polling.
    pub fn slot_releases(&self) -> watch::Receiver<u64> {
        self.inner.slot_released.subscribe()
    }

    fn send(&self, req: Request) -> Result<()> {
        self.handle.tx.send(req).map_err(|_| WalError::Closed)
    }

    /// Writes `data` at `start` on the current timeline. `start` must not be beyond the end
    /// (a gap); bytes below the end must equal what is stored, and only the new suffix is
    /// written. Gaps and mismatches fail the ticket.
    pub fn write(&self, start: Lsn, data: Bytes) -> Result<WriteTicket> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Write { start, data, reply })?;
        Ok(Ticket { rx })
    }

    /// Appends walserver records; the ticket resolves to each record's end LSN once durable.
    pub fn append(&self, payloads: Vec<Bytes>) -> Result<AppendTicket> {
        if self.inner.format != WalFormat::Walserver {
            return Err(WalError::WrongFormat {
                op: "append",
                format: self.inner.format,
            });
        }
        let max = self.inner.cfg.max_record_size;
        if let Some(p) = payloads.iter().find(|p| p.len() > max) {
            return Err(WalError::RecordTooLarge { size: p.len(), max });
        }
        let (reply, rx) = oneshot::channel();
        self.send(Request::Append { payloads, reply })?;
        Ok(Ticket { rx })
    }

    /// Bytes of timeline `tli` from `start`: at most `max_len`, never past the flushed end (the
    /// current timeline) or the switch point (an ancestor). May return fewer bytes (it stops at
    /// a segment end) but never none while WAL exists there; empty at the end.
    ///
    /// A plain blocking `pread`; async callers run it on a blocking pool.
    pub fn read(&self, tli: TimelineId, start: Lsn, max_len: usize) -> Result<Bytes> {
        self.inner.read(tli, start, max_len)
    }

    /// Like [`Wal::read`], but only from memory: the last small batches made durable (at most
    /// 1 MiB, each at most 64 KiB), which is where a reader following the end of WAL reads.
    /// `None` when they do not hold `start` (the caller then runs [`Wal::read`] on a blocking
    /// pool); `Some` holds at least one byte, never beyond the flushed end, and is what
    /// `read` would return or a prefix of it. It never touches a file, so an actor may call
    /// it on its own thread.
    pub fn read_cached(&self, tli: TimelineId, start: Lsn, max_len: usize) -> Option<Bytes> {
        if max_len == 0 {
            return None;
        }
        self.inner.read_cached(tli, start, max_len)
    }

    /// Where [`Wal::read`] would read: the segment file, offset and length of up to `max_len`
    /// bytes of timeline `tli` at `start` (fewer at a segment end), with the same errors;
    /// `None` at the end. For senders that hand the file to the kernel instead of reading it.
    /// May open a file: async callers run it on a blocking pool.
    pub fn locate(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
    ) -> Result<Option<WalFileRange>> {
        self.inner.locate(tli, start, max_len)
    }

    /// A decoder of the records of timeline `tli` from `from`, which must be a record boundary
    /// or a segment start.
    pub fn record_reader(&self, tli: TimelineId, from: Lsn) -> Result<RecordReader> {
        if self.inner.format != WalFormat::Walserver {
            return Err(WalError::WrongFormat {
                op: "reading records",
                format: self.inner.format,
            });
        }
        Ok(RecordReader {
            scanner: Scanner::new(
                WalSource {
                    inner: self.inner.clone(),
                    tli,
                },
                self.inner.cfg.segment_size,
                self.inner.cfg.max_record_size,
                from,
            ),
            inner: self.inner.clone(),
        })
    }

    /// Up to `limit` records of timeline `tli` from `from`; see [`Wal::record_reader`].
    pub fn read_records(&self, tli: TimelineId, from: Lsn, limit: usize) -> Result<Vec<Record>> {
        let mut r = self.record_reader(tli, from)?;
        let mut out = Vec::new();
        while out.len() < limit {
            match r.next_record()? {
                Some(rec) => out.push(rec),
                None => break,
            }
        }
        Ok(out)
    }

    /// Runs `f` on the writer thread, in order with writes, and waits for its result.
    fn control<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut writer::Writer) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send(Request::Control(Box::new(move |w| {
            let _ = tx.send(f(w));
        })))?;
        rx.recv().map_err(|_| WalError::Closed)?
    }

    /// Starts a new timeline at the end of the last complete record at or below the flushed
    /// end, writes its history file, and publishes it. Returns the new timeline and where it
    /// begins. Blocks until done.
    pub fn promote(&self, reason: &str) -> Result<(TimelineId, Lsn)> {
        if self.inner.format != WalFormat::Walserver {
            return Err(WalError::PromotionNotSupported);
        }
        let reason = reason.to_string();
        self.control(move |w| w.promote(&reason))
    }

    /// Follows an upstream's switch to `new_tli` at `switch_lsn`, whose history file is
    /// `history_file`. This node's flushed end on its current timeline must be exactly
    /// `switch_lsn`: beyond it the node forked ([`WalError::Forked`]), below it the rest of the
    /// old timeline must be received first ([`WalError::BehindSwitchPoint`]).
    pub fn follow_timeline(
        &self,
        new_tli: TimelineId,
        history_file: Vec<u8>,
        switch_lsn: Lsn,
    ) -> Result<()> {
        self.control(move |w| w.follow(new_tli, history_file, switch_lsn))
    }

    /// Stores a history file fetched from an upstream, byte for byte.
    pub fn store_history_file(&self, tli: TimelineId, bytes: Vec<u8>) -> Result<()> {
        let entries = crate::history::parse_history(&bytes)?;
        check_history_for(tli, &entries)?;
        if parse_history_file_name(&history_file_name(tli)) != Some(tli) {
            return Err(WalError::InvalidHistory(format!("bad timeline {tli}")));
        }
        self.control(move |w| w.store_history(tli, &bytes))
    }

    /// Drops the current timeline's WAL beyond `lsn`, durably (for rejoining after a fork).
    /// Returns how many bytes were dropped. The flushed end moves back: whoever streamed the
    /// dropped bytes must be told by the caller. It is the one change of durable WAL in place,
    /// so it is for a node with no readers: ranges handed out by [`Wal::locate`] and not yet
    /// sent would read the cut (`walserver rejoin` runs it on a stopped node).
    pub fn truncate_to(&self, lsn: Lsn) -> Result<u64> {
        self.control(move |w| w.truncate(lsn))
    }

    /// Creates a physical slot. With `reserve_wal` its restart LSN is the current flushed end.
    pub fn create_slot(&self, name: &str, temporary: bool, reserve_wal: bool) -> Result<SlotInfo> {
        slots::validate_slot_name(name)?;
        let (tli, flushed) = {
            let st = self.inner.state();
            (st.tli, st.flushed)
        };
        let mut table = self.inner.slots();
        if table.slots.contains_key(name) {
            return Err(WalError::SlotExists {
                name: name.to_string(),
            });
        }
        table.slots.insert(
            name.to_string(),
            Slot {
                temporary,
                restart_lsn: reserve_wal.then_some(flushed),
                restart_tli: reserve_wal.then_some(tli),
                invalidated: false,
                active: false,
                persisted_lsn: None,
                dirty: true,
            },
        );
        if let Err(e) = table.persist(&self.inner.io, &self.inner.tmp, &self.inner.slots_dir, name)
        {
            table.slots.remove(name);
            return Err(e);
        }
        drop(table);
        self.slot(name)
    }

    /// Drops a slot that is not in use.
    pub fn drop_slot(&self, name: &str) -> Result<()> {
        let mut table = self.inner.slots();
        let slot = table
            .slots
            .get(name)
            .ok_or_else(|| WalError::SlotNotFound {
                name: name.to_string(),
            })?;
        if slot.active {
            return Err(WalError::SlotInUse {
                name: name.to_string(),
            });
        }
        if !slot.temporary {
            let path = self.inner.slots_dir.join(name);
            fs::remove_file(&path).map_err(io_err("removing", &path))?;
            self.inner
                .io
                .sync_dir(&self.inner.slots_dir)
                .map_err(io_err("syncing", &self.inner.slots_dir))?;
        }
        table.slots.remove(name);
        Ok(())
    }

    pub fn slot(&self, name: &str) -> Result<SlotInfo> {
        self.slots()
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| WalError::SlotNotFound {
                name: name.to_string(),
            })
    }

    /// Every slot, by name, with its `wal_status` as `pg_replication_slots` shows it.
    pub fn slots(&self) -> Vec<SlotInfo> {
        let written = self.written();
        let seg = self.inner.cfg.segment_size;
        let oldest_seg = self.oldest_retained().segment_number(seg);
        let table = self.inner.slots();
        let min = table.min_restart_lsn();
        table
            .slots
            .iter()
            .map(|(name, s)| {
                let (wal_status, safe_wal_size) = match (s.invalidated, s.restart_lsn) {
                    (true, _) => (Some(slots::WalStatus::Lost), None),
                    (false, None) => (None, None),
                    (false, Some(r)) => {
                        let (st, safe) = slots::wal_status(
                            r,
                            written,
                            min,
                            oldest_seg,
                            s.active,
                            &self.inner.cfg,
                        );
                        (Some(st), safe)
                    }
                };
                SlotInfo {
                    name: name.clone(),
                    temporary: s.temporary,
                    restart_lsn: if s.invalidated { None } else { s.restart_lsn },
                    restart_tli: s.restart_tli,
                    active: s.active,
                    wal_status,
                    safe_wal_size,
                }
            })
            .collect()
    }

    /// Marks a slot in use until the guard is dropped; `SlotInUse` if it already is.
    pub fn acquire_slot(&self, name: &str) -> Result<SlotGuard> {
        let mut table = self.inner.slots();
        let slot = table
            .slots
            .get_mut(name)
            .ok_or_else(|| WalError::SlotNotFound {
                name: name.to_string(),
            })?;
        if slot.active {
            return Err(WalError::SlotInUse {
                name: name.to_string(),
            });
        }
        slot.active = true;
        Ok(SlotGuard {
            inner: self.inner.clone(),
            name: name.to_string(),
        })
    }

    /// Removes the segments no slot and no `wal_keep_size` needs, invalidating slots beyond
    /// `max_slot_wal_keep_size`. It runs by itself at every segment switch; call it to apply a
    /// change at once (after dropping or advancing a slot, say).
    pub fn run_retention(&self) -> Result<()> {
        writer::retain(&self.inner)
    }

    /// Moves a slot's restart point (on a standby's flush feedback). Persisted in the
    /// background when it enters a new segment, and at a clean stop; after a crash the slot may
    /// be a little behind, which only retains more.
    pub fn advance_slot(
        &self,
        name: &str,
        restart_lsn: Lsn,
        restart_tli: TimelineId,
    ) -> Result<()> {
        let seg = self.inner.cfg.segment_size;
        let mut table = self.inner.slots();
        let slot = table
            .slots
            .get_mut(name)
            .ok_or_else(|| WalError::SlotNotFound {
                name: name.to_string(),
            })?;
        if slot.invalidated {
            return Err(WalError::SlotInvalidated {
                name: name.to_string(),
            });
        }
        slot.restart_lsn = Some(restart_lsn);
        slot.restart_tli = Some(restart_tli);
        let due = slot.persisted_lsn.map(|p| p.segment_number(seg))
            != Some(restart_lsn.segment_number(seg));
        if slot.temporary {
            return Ok(());
        }
        slot.dirty = true;
        if due {
            let _ = self.inner.bg_tx.send(BgRequest::PersistSlots);
        }
        Ok(())
    }
}

/// Decodes records from the stored stream; see [`Wal::record_reader`].
pub struct RecordReader {
    scanner: Scanner<WalSource>,
    inner: Arc<Inner>,
}

impl RecordReader {
    /// The next complete record, or `None` at the end of what is readable (call again later
    /// for more). Damage below the flushed end is an error.
    pub fn next_record(&mut self) -> Result<Option<Record>> {
        match self.scanner.next()? {
            Scan::Record(r) => Ok(Some(r)),
            Scan::Stop(stop) => match stop.kind {
                StopKind::Incomplete => Ok(None),
                StopKind::Zeroed | StopKind::Invalid(_) => {
                    let seg = self.inner.cfg.segment_size;
                    let reason = match stop.kind {
                        StopKind::Invalid(r) => r,
                        _ => "zeroed record header".into(),
                    };
                    Err(WalError::Corruption {
                        segment: segment_file_name(
                            self.scanner_tli(),
                            stop.at.segment_number(seg),
                            seg,
                        ),
                        offset: stop.at.segment_offset(seg),
                        reason,
                    })
                }
            },
        }
    }

    fn scanner_tli(&self) -> TimelineId {
        self.scanner.source().tli
    }

    /// Where the next record starts (or the scan position).
    pub fn position(&self) -> Lsn {
        self.scanner.position()
    }
}

impl Iterator for RecordReader {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        self.next_record().transpose()
    }
}

struct WalSource {
    inner: Arc<Inner>,
    tli: TimelineId,
}

impl ByteSource for WalSource {
    fn read_at(&mut self, lsn: Lsn, max_len: usize) -> Result<Bytes> {
        self.inner.read(self.tli, lsn, max_len)
    }
}

/// Reads the current view's files without a limit, for recovery scans.
struct FileSource<'a> {
    files: &'a SegmentFiles,
    view: &'a View,
}

impl ByteSource for FileSource<'_> {
    fn read_at(&mut self, lsn: Lsn, max_len: usize) -> Result<Bytes> {
        Ok(self
            .files
            .read(self.view, lsn, Lsn::MAX, max_len)?
            .unwrap_or_default())
    }
}

/// A record boundary at or below `upto` from which a scan can verify everything up to `upto`:
/// the first boundary of the newest segment whose header is below `upto` and whose first
/// boundary is too. `None` if no such segment exists (nothing below `upto` but a continuation).
pub(crate) fn find_scan_start(
    files: &SegmentFiles,
    view: &View,
    wal_start: Lsn,
    upto: Lsn,
) -> Result<Option<Lsn>> {
    let seg = files.seg;
    if upto <= wal_start {
        return Ok(None);
    }
    let mut segno = Lsn(upto.0 - 1).segment_number(seg);
    loop {
        let s = Lsn(segno * seg);
        if s < wal_start.segment_start(seg) {
            return Ok(None);
        }
        if s + SEGMENT_HEADER_SIZE <= upto {
            // A segment removed by retention ends the walk: nothing older can be scanned.
            let Some(b) = files.read(view, s, Lsn::MAX, SEGMENT_HEADER_SIZE as usize)? else {
                return Ok(None);
            };
            let h = SegmentHeader::decode(&b, s).map_err(|reason| WalError::Corruption {
                segment: segment_file_name(view.timeline_of(s), segno, seg),
                offset: 0,
                reason: format!("bad segment header below the durable end {upto}: {reason}"),
            })?;
            let first = s + SEGMENT_HEADER_SIZE + h.rem_len as u64;
            if (h.rem_len as u64) < seg - SEGMENT_HEADER_SIZE && first <= upto {
                return Ok(Some(first));
            }
        }
        if segno == 0 {
            return Ok(None);
        }
        segno -= 1;
    }
}

/// Scans walserver records from a boundary at or below `vouched` to the first invalid one.
/// Returns the end of the valid records and why the scan stopped; a record that should be
/// complete below `vouched` but is not is corruption.
fn scan_records_end(
    files: &SegmentFiles,
    view: &View,
    cfg: &StorageConfig,
    wal_start: Lsn,
    vouched: Lsn,
) -> Result<Option<(Lsn, Option<String>)>> {
    let start = match find_scan_start(files, view, wal_start, vouched)? {
        Some(b) => b,
        // Nothing durable yet but possibly records written without a pointer update: a fresh
        // WAL starts at a segment start, where the scanner reads the header.
        None if vouched == wal_start => wal_start,
        None => return Ok(None),
    };
    let seg = cfg.segment_size;
    let mut scanner = Scanner::new(FileSource { files, view }, seg, cfg.max_record_size, start);
    loop {
        match scanner.next()? {
            Scan::Record(_) => continue,
            Scan::Stop(stop) => {
                if stop.complete_by <= vouched {
                    let reason = match stop.kind {
                        StopKind::Invalid(r) => r,
                        StopKind::Zeroed => "zeroed bytes".into(),
                        StopKind::Incomplete => "missing bytes".into(),
                    };
                    return Err(WalError::Corruption {
                        segment: segment_file_name(
                            view.timeline_of(stop.at),
                            stop.at.segment_number(seg),
                            seg,
                        ),
                        offset: stop.at.segment_offset(seg),
                        reason: format!("{reason} below the durable end {vouched}"),
                    });
                }
                let why = match stop.kind {
                    StopKind::Invalid(r) => Some(r),
                    _ => None,
                };
                return Ok(Some((stop.at, why)));
            }
        }
    }
}

/// True if the file holds only zero bytes.
fn is_all_zero(path: &Path) -> Result<bool> {
    let f = File::open(path).map_err(io_err("opening", path))?;
    let len = f.metadata().map_err(io_err("reading", path))?.len();
    let mut off = 0;
    while off < len {
        let b = crate::segments::pread_exact(&f, (1 << 20).min((len - off) as usize), off)
            .map_err(io_err("reading", path))?;
        if b.is_empty() {
            break;
        }
        if b.iter().any(|&x| x != 0) {
            return Ok(false);
        }
        off += b.len() as u64;
    }
    Ok(true)
}

/// Zeroes a segment file from `from` to its end if anything there is non-zero, fsyncs it, and
/// returns how many bytes up to the last non-zero one were discarded.
fn zero_tail(io: &Io, path: &Path, from: u64) -> Result<u64> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err("opening", path))?;
    let len = f.metadata().map_err(io_err("reading", path))?.len();
    let mut last_nonzero = None;
    let mut off = from;
    while off < len {
        let b = crate::segments::pread_exact(&f, (1 << 20).min((len - off) as usize), off)
            .map_err(io_err("reading", path))?;
        if b.is_empty() {
            break;
        }
        if let Some(i) = b.iter().rposition(|&x| x != 0) {
            last_nonzero = Some(off + i as u64);
        }
        off += b.len() as u64;
    }
    let Some(last) = last_nonzero else {
        return Ok(0);
    };
    writer::write_zeros(io, &f, from, last + 1 - from, crate::io::FP_WRITE)
        .and_then(|_| io.sync_data(&f, crate::io::FP_FSYNC))
        .map_err(io_err("zeroing the tail of", path))?;
    Ok(last + 1 - from)
}
