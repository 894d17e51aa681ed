//! The [`Wal`] handle: what callers hold. It owns the writer thread (through [`Handle`]) and
//! shares [`Inner`] with it; every method is a thin entry into the module that does the work:
//! `recovery.rs` (init, open, reopen), `state.rs` (positions and reads), `reader.rs` (records),
//! `writer.rs` (writes and appends, as tickets), `timeline.rs` (promotion, following,
//! truncation, run on the writer thread), `slots.rs` and `background.rs` (slots, retention).
//!
//! A storage failure (`health.rs`) is recovered from under the handle: [`Wal::restart`] stops
//! the failed writer, reopens the data directory ([`recovery::reopen`]) and puts the new
//! opening in place of the old one, so every clone of the handle (walsenders, the
//! walreceiver, the admin API) goes on with it. What must outlive an opening lives here or
//! is handed from one opening to the next: the request channel, the directory's lock, the
//! position and health watches that subscribers hold, the slot table (shared, with which
//! slots are in use), the counters and the fail points.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use tokio::sync::{oneshot, watch};
use wal_types::{Lsn, SystemId, TimelineId};

use crate::archived::ArchiveBacklog;
use crate::background;
use crate::format::Record;
use crate::health::{self, StorageHealth, StorageState};
use crate::history::{check_history_for, parse_history};
#[cfg(feature = "failpoints")]
use crate::io::Failpoints;
use crate::io::Io;
use crate::metrics::StorageMetrics;
use crate::naming::{history_file_name, parse_history_file_name};
use crate::reader::RecordReader;
use crate::recovery::{self, InitOptions, Recovered, RecoveryReport};
use crate::segments::WalFileRange;
use crate::slots::SlotInfo;
use crate::state::{BgRequest, CommitBound, Inner, WalPosition};
use crate::writer::{self, Request, Writer};
use crate::{HistoryEntry, Result, Role, StorageConfig, WalError, WalFormat};

/// A handle on the WAL of one data directory. Cheap to clone; all clones share one writer
/// thread, which stops when the last clone is dropped (after finishing what was sent to it).
#[derive(Clone, Debug)]
pub struct Wal {
    shared: Arc<Shared>,
}

/// A handle on a [`Wal`] that does not keep it open: a task that lives as long as its actor,
/// not as long as storage, holds this, so that storage (and the data directory's lock) goes
/// with the last real handle and not whenever that task happens to be dropped.
#[derive(Clone, Debug)]
pub struct WeakWal {
    shared: std::sync::Weak<Shared>,
}

impl WeakWal {
    /// The storage, while some [`Wal`] still holds it open.
    pub fn upgrade(&self) -> Option<Wal> {
        self.shared.upgrade().map(|shared| Wal { shared })
    }
}

/// What every clone shares, for the life of the handle.
#[derive(Debug)]
struct Shared {
    /// Fixed for the directory: the same in every opening.
    dir: PathBuf,
    cfg: StorageConfig,
    system_id: SystemId,
    format: WalFormat,
    /// The current opening; replaced by a restart.
    current: RwLock<Arc<Opened>>,
    handle: Handle,
    /// One restart at a time.
    restarting: Mutex<()>,
    /// Set while the archive's backlog is past its bound (`archived.rs`).
    archive_gate: watch::Sender<Option<ArchiveBacklog>>,
}

/// One opening of the data directory: the state its writer thread works on, and what its
/// recovery found.
#[derive(Debug)]
struct Opened {
    inner: Arc<Inner>,
    recovery: RecoveryReport,
}

/// Owns the writer thread. Dropping it stops the writer, which stops the background thread.
/// The request channel outlives a writer: requests queued while storage restarts are taken
/// by the next one.
#[derive(Debug)]
struct Handle {
    tx: Sender<Request>,
    rx: Receiver<Request>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Handle {
    /// Stops the writer thread, if one runs, and waits for it.
    fn stop(&self) {
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = self.tx.send(Request::Shutdown);
            // The writer finishes its batch, persists slots, stops the background thread.
            let _ = t.join();
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Resolves when the bytes of a `write` or the records of an `append` are durable, with the
/// result of the write. Await it, or call [`Ticket::wait`] outside async code.
#[derive(Debug)]
pub struct Ticket<T> {
    rx: oneshot::Receiver<Result<T>>,
}

/// Resolves after the write's bytes are fsynced, to the flushed end then published (see
/// [`Wal::flushed`]), which may stop before the end of the write when it ends inside a
/// walserver record.
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

impl<T> Ticket<T> {
    /// Waits for the ticket through `pos`, a receiver of this storage's position watch
    /// ([`Wal::subscribe`], or a relay of it such as walserver's actors take through
    /// `actor_util::relayed`), instead of through a wake-up of its own.
    ///
    /// Awaited as it is, a ticket is woken by the writer thread when it is answered: one more
    /// cross-thread wake-up (a system call, and a switch when both threads share a CPU) on
    /// top of the one the position's announcement already costs every thread that follows
    /// the WAL. The writer answers a round of requests before it announces the position, and
    /// announces after every round that answered one, failures and refusals included; so a
    /// waiter that looks at its ticket each time `pos` changes never misses its answer, and a
    /// thread whose actors follow the position through one relay is woken once per commit
    /// for all of them and its waiters. If `pos` closes first, the ticket is awaited as it is.
    ///
    /// `pos` must follow this storage (its watch survives [`Wal::restart`]); a receiver of
    /// another watch would leave the ride waiting for announcements that never come.
    /// One receiver may serve a series of tickets, waited on one after the other.
    pub async fn ride(mut self, pos: &mut watch::Receiver<WalPosition>) -> Result<T> {
        loop {
            match self.rx.try_recv() {
                Ok(r) => return r,
                Err(oneshot::error::TryRecvError::Closed) => return Err(WalError::Closed),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            if pos.changed().await.is_err() {
                return self.await;
            }
        }
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
///
/// It releases the slot in whichever opening of storage is current, so a restart in between
/// does not leave the slot marked in use.
#[derive(Debug)]
pub struct SlotGuard {
    wal: Wal,
    name: String,
}

impl SlotGuard {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let inner = self.wal.inner();
        inner.slots().release(&self.name);
        inner.slot_released.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl Wal {
    /// Creates a data directory and opens it. Fails if `dir` already holds one.
    pub fn init(dir: impl AsRef<Path>, cfg: StorageConfig, opts: InitOptions) -> Result<Wal> {
        let io = Io::new(cfg.fsync);
        Wal::start(recovery::init(dir.as_ref(), cfg, opts, io)?)
    }

    /// Opens a data directory, finding the end of durable WAL (see the crate docs on crash
    /// safety) and cutting off whatever lies beyond it.
    pub fn open(dir: impl AsRef<Path>, cfg: StorageConfig) -> Result<Wal> {
        let io = Io::new(cfg.fsync);
        Wal::start(recovery::open(dir.as_ref(), cfg, io)?)
    }

    /// [`Wal::open`] with fail points that are already in force while it recovers; the
    /// `Wal` keeps them ([`Wal::failpoints`]).
    #[cfg(feature = "failpoints")]
    pub fn open_with_failpoints(
        dir: impl AsRef<Path>,
        cfg: StorageConfig,
        failpoints: Arc<Failpoints>,
    ) -> Result<Wal> {
        let io = Io::with_failpoints(cfg.fsync, failpoints);
        Wal::start(recovery::open(dir.as_ref(), cfg, io)?)
    }

    /// Starts the writer thread (which starts the background thread) on a recovered directory.
    fn start(r: Recovered) -> Result<Wal> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = writer::spawn(r.inner.clone(), rx.clone(), r.bg_rx, r.pointer)?;
        let inner = &r.inner;
        Ok(Wal {
            shared: Arc::new(Shared {
                dir: inner.dir.clone(),
                cfg: inner.cfg.clone(),
                system_id: inner.system_id,
                format: inner.format,
                current: RwLock::new(Arc::new(Opened {
                    inner: r.inner.clone(),
                    recovery: r.report,
                })),
                handle: Handle {
                    tx,
                    rx,
                    thread: Mutex::new(Some(thread)),
                },
                restarting: Mutex::new(()),
                archive_gate: watch::Sender::new(None),
            }),
        })
    }

    /// The current opening.
    fn opened(&self) -> Arc<Opened> {
        self.shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The state of the current opening.
    fn inner(&self) -> Arc<Inner> {
        self.opened().inner.clone()
    }

    /// Storage's health: `ok`, `full`, `failed` or `restarting`, with the error and the file
    /// of the failure, since when, and how often storage was restarted.
    pub fn health(&self) -> StorageHealth {
        self.inner().health.borrow().clone()
    }

    /// Every change of [`Wal::health`], as it happens: how an owner hears that storage failed
    /// and must be restarted ([`Wal::restart`]), without asking.
    pub fn subscribe_health(&self) -> watch::Receiver<StorageHealth> {
        self.inner().health.subscribe()
    }

    /// Restarts storage after a failure: stops the failed writer, reopens the data directory
    /// with the last good sync as its end (verifying the records below it and cutting,
    /// zeroing and syncing what lies beyond, as open does after a crash), and resumes writes
    /// on the new opening; every clone of this handle goes on with it, and subscribers of the
    /// position keep their channel. Blocks (call it on a blocking thread); returns what the
    /// reopening found, or `None` if storage had not failed (nothing to do).
    ///
    /// If the reopening fails (the disk still fails its syncs, say), storage stays failed with
    /// that error, and the caller tries again later: it is the owner's restart policy that
    /// decides when.
    pub fn restart(&self) -> Result<Option<RecoveryReport>> {
        let _one = self
            .shared
            .restarting
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let old = self.opened();
        let tx = old.inner.health.clone();
        let (was, error, path) = {
            let h = tx.borrow();
            (h.state, h.error.clone(), h.path.clone())
        };
        if !was.is_failed() {
            return Ok(None);
        }
        health::set(&tx, StorageState::Restarting, error, path);
        self.shared.handle.stop();
        let reopened = recovery::reopen(&old.inner).and_then(|r| {
            let thread = writer::spawn(
                r.inner.clone(),
                self.shared.handle.rx.clone(),
                r.bg_rx,
                r.pointer,
            )?;
            Ok((r.inner, r.report, thread))
        });
        match reopened {
            Ok((inner, report, thread)) => {
                *self
                    .shared
                    .current
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = Arc::new(Opened {
                    inner,
                    recovery: report.clone(),
                });
                *self
                    .shared
                    .handle
                    .thread
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(thread);
                tx.send_modify(|h| h.restarts += 1);
                health::set(&tx, StorageState::Ok, None, None);
                tracing::info!(end = %report.end, discarded_bytes = report.discarded_bytes, "WAL storage reopened after a failure; writes resume");
                Ok(Some(report))
            }
            Err(e) => {
                tx.send_modify(|h| h.failed_restarts += 1);
                health::set(&tx, StorageState::Failed, Some(e.to_string()), path_of(&e));
                Err(e)
            }
        }
    }

    /// The segment size a data directory was made with, read from its control file, so a
    /// caller can open it without knowing that in advance.
    pub fn stored_segment_size(dir: impl AsRef<Path>) -> Result<u64> {
        Ok(recovery::stored_control(dir.as_ref())?.segment_size)
    }

    /// The kind of WAL a data directory holds, read from its control file.
    pub fn stored_format(dir: impl AsRef<Path>) -> Result<WalFormat> {
        Ok(recovery::stored_control(dir.as_ref())?.wal_format)
    }

    /// The role a data directory's control data records, and its current timeline, read
    /// without opening it. `None` for a directory made before the role was recorded.
    pub fn stored_role(dir: impl AsRef<Path>) -> Result<(Option<Role>, TimelineId)> {
        let c = recovery::stored_control(dir.as_ref())?;
        Ok((c.role, c.timeline))
    }

    /// The role the control data records (see [`Role`]).
    pub fn role(&self) -> Option<Role> {
        self.inner().state().role
    }

    /// Where the WAL this node wrote as a primary ends: its durable end while the control
    /// data says primary, else the end it had when it became a standby; `None` if it never
    /// was one, or an explicit cut ([`Wal::truncate_to`], [`Wal::truncate_beyond`]) went
    /// below that end since. The overlapped commit's rule 4 cuts no lower at a stream start:
    /// that WAL may have been acknowledged, and it may be the only copy. Memory only.
    pub fn primary_end(&self) -> Option<Lsn> {
        let inner = self.inner();
        let st = inner.state();
        match st.role {
            Some(Role::Primary) => Some(st.flushed),
            _ => st.primary_end,
        }
    }

    /// Records the node's role in the control data, durably and atomically; a primary that
    /// becomes a standby records its durable end as [`Wal::primary_end`] in the same write.
    /// Blocks until done.
    pub fn set_role(&self, role: Role) -> Result<()> {
        self.control(move |w| w.set_role(role))
    }

    pub fn system_id(&self) -> SystemId {
        self.shared.system_id
    }

    pub fn format(&self) -> WalFormat {
        self.shared.format
    }

    pub fn segment_size(&self) -> u64 {
        self.shared.cfg.segment_size
    }

    pub fn config(&self) -> &StorageConfig {
        &self.shared.cfg
    }

    pub fn data_dir(&self) -> &Path {
        &self.shared.dir
    }

    pub fn timeline(&self) -> TimelineId {
        self.inner().state().tli
    }

    /// The ancestry of the current timeline, oldest first.
    pub fn history(&self) -> Vec<HistoryEntry> {
        self.inner().state().history.to_vec()
    }

    /// The stored history file of `tli`, byte for byte (for TIMELINE_HISTORY). `None` for
    /// timeline 1 or an unknown timeline.
    pub fn history_file(&self, tli: TimelineId) -> Result<Option<Vec<u8>>> {
        let inner = self.inner();
        let path = inner.pg_wal().join(history_file_name(tli));
        crate::files::read_if_exists(&inner.io, &path)
    }

    /// A handle that does not keep this storage open.
    pub fn downgrade(&self) -> WeakWal {
        WeakWal {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Where timeline `tli` ended, if it is an ancestor of the current one.
    pub fn timeline_end(&self, tli: TimelineId) -> Option<Lsn> {
        self.inner()
            .state()
            .history
            .iter()
            .find(|e| e.parent == tli)
            .map(|e| e.switch_lsn)
    }

    /// The durable end of the current timeline: what open would find again after a crash.
    /// After a standby's raw bytes of walserver records that end inside a record, it is the
    /// end of the last complete record (or the flush pointer, if later), and the durable rest
    /// counts as [`Wal::written`] only.
    pub fn flushed(&self) -> Lsn {
        self.inner().state().flushed
    }

    /// The end of what has been written (maybe not yet durable).
    pub fn written(&self) -> Lsn {
        self.inner().state().written
    }

    pub fn position(&self) -> WalPosition {
        self.inner().state().position()
    }

    /// The oldest LSN still readable; older segments were removed by retention.
    pub fn oldest_retained(&self) -> Lsn {
        self.inner().oldest_retained()
    }

    /// How many segment files were made from a recycled one since this opening (with
    /// `wal_recycle` on, retention hands segments nobody holds to preallocation instead of
    /// removing them).
    pub fn segments_recycled(&self) -> u64 {
        self.inner().recycled.reused()
    }

    /// What `open` found (for the binary to log).
    pub fn recovery_report(&self) -> RecoveryReport {
        self.opened().recovery.clone()
    }

    /// The number of fsync/fdatasync calls made so far (segments, flush pointer, directories,
    /// control and slot files, preallocation).
    pub fn fsync_count(&self) -> u64 {
        self.inner().io.fsync_count()
    }

    /// Storage's counters for `/metrics`: fsync latency and failed operations by kind.
    pub fn metrics(&self) -> Arc<StorageMetrics> {
        self.inner().io.metrics.clone()
    }

    /// The bytes still free for writing on the data directory's file system. A system call
    /// that may block: call it on a blocking thread, never on an actor's.
    pub fn disk_free_bytes(&self) -> std::io::Result<u64> {
        crate::metrics::disk_free_bytes(self.data_dir())
    }

    /// The fault-injection points of this instance.
    #[cfg(feature = "failpoints")]
    pub fn failpoints(&self) -> Arc<Failpoints> {
        self.inner().io.failpoints.clone()
    }

    /// Flush progress: the receiver sees every new position the writer publishes (coalesced:
    /// the newest covers earlier ones). The writer publishes when the flushed end moves (and
    /// at timeline changes and failures), not when a batch has only been written: `written`
    /// in a published position is current, but a written end alone wakes no one.
    ///
    /// The writer thread wakes each waiting receiver on its own, one cross-thread wake-up
    /// apiece: a thread with several subscribers does better to share one receiver among them
    /// (walserver's actors take it through `actor_util::relayed`, one relay per thread).
    pub fn subscribe(&self) -> watch::Receiver<WalPosition> {
        self.inner().pos_tx.subscribe()
    }

    /// Changes each time a slot stops being in use: waiting for an active slot to become
    /// free awaits this instead of polling.
    pub fn slot_releases(&self) -> watch::Receiver<u64> {
        self.inner().slot_released.subscribe()
    }

    /// Changes each time a slot is made or dropped, and each time a slot's restart point
    /// enters another segment: the granularity retention works in, so a copy of the slot's
    /// position kept elsewhere (a standby's, for failover) that follows these changes holds
    /// every segment the slot does. It survives [`Wal::restart`].
    pub fn slot_moves(&self) -> watch::Receiver<u64> {
        self.inner().slots_moved.subscribe()
    }

    fn send(&self, req: Request) -> Result<()> {
        self.shared
            .handle
            .tx
            .send(req)
            .map_err(|_| WalError::Closed)
    }

    /// While storage has failed, writes are refused at once, without a trip to the writer.
    fn refuse_if_failed(&self) -> Result<()> {
        let inner = self.inner();
        let h = inner.health.borrow();
        if h.state.is_failed() {
            return Err(WalError::StorageFailed {
                reason: h.error.clone().unwrap_or_else(|| "a sync failed".into()),
            });
        }
        Ok(())
    }

    /// Writes `data` at `start` on the current timeline. `start` must not be beyond the end
    /// (a gap); bytes below the end must equal what is stored, and only the new suffix is
    /// written. Gaps and mismatches fail the ticket.
    pub fn write(&self, start: Lsn, data: Bytes) -> Result<WriteTicket> {
        self.refuse_if_failed()?;
        let (reply, rx) = oneshot::channel();
        self.send(Request::Write { start, data, reply })?;
        Ok(Ticket { rx })
    }

    /// Appends walserver records; the ticket resolves to each record's end LSN once durable.
    pub fn append(&self, payloads: Vec<Bytes>) -> Result<AppendTicket> {
        if self.shared.format != WalFormat::Walserver {
            return Err(WalError::WrongFormat {
                op: "append",
                format: self.shared.format,
            });
        }
        let max = self.shared.cfg.max_record_size;
        if let Some(p) = payloads.iter().find(|p| p.len() > max) {
            return Err(WalError::RecordTooLarge { size: p.len(), max });
        }
        self.refuse_if_failed()?;
        if let Some(ArchiveBacklog { backlog, bound }) = *self.shared.archive_gate.borrow() {
            return Err(WalError::ArchiveBacklog { backlog, bound });
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
        self.inner().read(tli, start, max_len)
    }

    /// Like [`Wal::read`], but appends the bytes to `buf` and returns how many (0 at the
    /// end), for a reader that keeps one buffer for many reads instead of a fresh one each
    /// (whose pages the kernel faults in anew on every read).
    /// On an error `buf` is as it was.
    pub fn read_into(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
        buf: &mut bytes::BytesMut,
    ) -> Result<usize> {
        self.inner().read_into(tli, start, max_len, buf)
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
        self.inner().read_cached(tli, start, max_len, false)
    }

    /// Like [`Wal::read_cached`], but up to the written end: with
    /// [`Wal::set_publish_written`] on, that includes the batch whose fdatasync is running.
    /// Such bytes may still be lost (the sync may fail, the power may go), so only a reader
    /// whose consumer can cut back what was never acknowledged may take them: a synchronous
    /// walserver standby under the overlapped commit. A reader that asks for no more than the
    /// flushed end gets exactly what [`Wal::read_cached`] gives.
    pub fn read_cached_written(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
    ) -> Option<Bytes> {
        if max_len == 0 {
            return None;
        }
        self.inner().read_cached(tli, start, max_len, true)
    }

    /// Whether each batch's written end is published (with its bytes in the tail cache)
    /// before its fdatasync, so that a walsender can send it while the sync runs: the
    /// overlapped commit. Off (the default), the written end is published only with the
    /// flushed end that follows it, and nothing is readable beyond the flushed end. Only
    /// batches small enough for the tail cache are published early; a larger one (a standby
    /// catching up) waits for its sync as before. It lasts across [`Wal::restart`].
    pub fn set_publish_written(&self, on: bool) {
        self.inner()
            .publish_written
            .store(on, std::sync::atomic::Ordering::Release);
    }

    /// Sets this primary's own commit point (the overlapped commit: its flush AND its
    /// synchronous quorum's), or `None` when its own flush is the commit point. Published in
    /// the position ([`WalPosition::committed`]) for its walsenders to tell their standbys and
    /// for its archiver; ignored while an upstream's told point is in force (a standby).
    pub fn set_own_commit_point(&self, c: Option<Lsn>) {
        self.inner().update_commit(|old| match (old, c) {
            (CommitBound::Told(_), _) => old,
            (_, Some(c)) => CommitBound::Own(c),
            (_, None) => CommitBound::None,
        });
    }

    /// Sets the commit point the upstream told this standby, or `None` for an upstream that
    /// carries none (every byte it sends is acknowledged as far as it knows). Every reader
    /// here stops at it ([`WalPosition::sendable`]), as far as it is durable: the background
    /// thread stores the newest one told in `DATA/commit_point` and publishes it then
    /// (`told.rs`), so a restarted standby still knows the point it served readers up to.
    /// Memory only here, for the walreceiver's thread. It never moves back while told: a
    /// commit point is acknowledged WAL, and an upstream that knows less (one that lags) does
    /// not make it less. A promotion forgets it; the fork cut ([`Wal::truncate_beyond`])
    /// lowers it to the fork.
    pub fn set_told_commit_point(&self, c: Option<Lsn>) {
        let inner = self.inner();
        if let Some(c) = c {
            let (_, queue) = inner.told.want(c);
            if queue {
                let _ = inner.bg_tx.send(BgRequest::PersistCommitPoint);
            }
        }
        inner.update_commit(|old| match (old, c) {
            (_, None) => CommitBound::None,
            (old, Some(_)) => {
                // The point on disk, read under the state's lock (`told.rs`).
                let stored = inner.told.persisted().unwrap_or(Lsn::INVALID);
                match old {
                    CommitBound::Told(o) => CommitBound::Told(o.max(stored)),
                    _ => CommitBound::Told(stored),
                }
            }
        });
    }

    /// Asks for the durable mark that this node sends WAL past its durable end on timeline
    /// `tli` (the overlapped commit's early sends, `early.rs`), and returns the timeline the
    /// mark on disk names now. A walsender sends early only while it names the timeline it
    /// streams; until then it keeps the flushed limit. Memory only, for a walsender's thread:
    /// the background thread writes the mark and then wakes the position's subscribers.
    pub fn mark_early_sends(&self, tli: TimelineId) -> Option<TimelineId> {
        let inner = self.inner();
        let (marked, queue) = inner.early.want(tli);
        if queue {
            let _ = inner.bg_tx.send(BgRequest::PersistEarlySends);
        }
        marked
    }

    /// The timeline the durable early-send mark names: one on which this node may have sent a
    /// standby WAL it did not hold durably (rule 5 of the overlapped commit asks it at a
    /// start). Memory only.
    pub fn early_sends_marked(&self) -> Option<TimelineId> {
        self.inner().early.marked()
    }

    /// Forgets the commit point an upstream told, as a promotion does: for a primary that
    /// takes up a failover term on the timeline it is on (it sent nothing early on it, so no
    /// new timeline is needed), and from then decides the commit point itself. A primary's
    /// own commit point stays. Memory only.
    pub fn forget_told_commit_point(&self) {
        self.inner().update_commit(|old| match old {
            CommitBound::Told(_) => CommitBound::None,
            other => other,
        });
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
        self.inner().locate(tli, start, max_len)
    }

    /// Like [`Wal::locate`], but only from memory: `Some` when the segment file that holds
    /// `start` is already open in storage's read cache and known to be long enough, which is
    /// the case for every range after the first of a segment that a sender works through.
    /// `None` when that cannot be told without touching a file, and wherever `locate` would
    /// fail or find nothing (the caller then runs [`Wal::locate`] on a blocking pool, which
    /// says why). `Some` is what `locate` would return. It never touches a file, so an actor
    /// may call it on its own thread.
    pub fn locate_cached(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
    ) -> Option<WalFileRange> {
        if max_len == 0 {
            return None;
        }
        self.inner().locate_cached(tli, start, max_len)
    }

    /// A decoder of the records of timeline `tli` from `from`, which must be a record boundary
    /// or a segment start.
    pub fn record_reader(&self, tli: TimelineId, from: Lsn) -> Result<RecordReader> {
        if self.shared.format != WalFormat::Walserver {
            return Err(WalError::WrongFormat {
                op: "reading records",
                format: self.shared.format,
            });
        }
        Ok(RecordReader::new(self.inner(), tli, from))
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
        f: impl FnOnce(&mut Writer) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.refuse_if_failed()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send(Request::Control(Box::new(move |w| {
            let _ = tx.send(match w.refusal() {
                Some(e) => Err(e),
                None => f(w).map_err(|e| w.control_failed(e)),
            });
        })))?;
        rx.recv().map_err(|_| WalError::Closed)?
    }

    /// Records a clean shutdown (`clean.rs`): on the writer thread, after everything written
    /// so far is durable, the timeline and durable end go into `DATA/clean_shutdown`. Call it
    /// once nothing more will be appended or sent. Refused when storage has failed: that
    /// shutdown was not clean. Blocks until done.
    pub fn mark_clean_shutdown(&self) -> Result<()> {
        self.control(|w| w.mark_clean_shutdown())
    }

    /// Takes the clean-shutdown mark, removing it durably, and says whether it records exactly
    /// this opening's timeline and durable end: whether the last run ended cleanly. Call it at
    /// every start before anything is appended, so that a crash after this start is never
    /// taken for clean. After a clean shutdown every byte any standby was sent is durable
    /// here, so the early-send mark is removed too ([`Wal::early_sends_marked`] is then
    /// `None`) and this run's first early send writes it anew. Blocks (it removes files and
    /// syncs the directory).
    pub fn take_clean_shutdown_mark(&self) -> Result<bool> {
        let inner = self.inner();
        let mark = crate::clean::take(&inner.io, &inner.dir)?;
        let pos = inner.state().position();
        let clean = mark == Some((pos.timeline, pos.flushed));
        if clean {
            inner.early.forget(&inner.io)?;
        }
        Ok(clean)
    }

    /// Starts a new timeline at the end of the last complete record at or below the durable
    /// end, writes its history file, and publishes it. The control data records the new
    /// timeline and the role [`Role::Primary`] in one atomic write, the promotion's commit
    /// point. The history's new line gives `reason` and the moment it was made, so that no
    /// other timeline of that number has the same history ([`departs_from`]). Returns the new
    /// timeline and where it begins. Blocks until done.
    ///
    /// [`departs_from`]: crate::departs_from
    pub fn promote(&self, reason: &str) -> Result<(TimelineId, Lsn)> {
        if self.shared.format != WalFormat::Walserver {
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
        let entries = parse_history(&bytes)?;
        check_history_for(tli, &entries)?;
        if parse_history_file_name(&history_file_name(tli)) != Some(tli) {
            return Err(WalError::InvalidHistory(format!("bad timeline {tli}")));
        }
        self.control(move |w| w.store_history(tli, &bytes))
    }

    /// Drops the current timeline's WAL beyond `lsn`, durably (for rejoining after a fork).
    /// Returns how many bytes were dropped. The flushed end moves back: whoever streamed the
    /// dropped bytes must be told by the caller. It is the one change of durable WAL in place,
    /// so it is for a node with no readers of that WAL: ranges handed out by [`Wal::locate`]
    /// and not yet sent would read the cut. `walserver rejoin` runs it on a stopped node; a
    /// live demotion (supervisor-actor) ends every walsender session first and holds new
    /// ones until the node is a standby, and its record readers end with
    /// [`WalError::ReadWalDropped`] when they see their position beyond the new end. It
    /// leaves the told commit point as it is: the cut at a stream start (rule 4) never goes
    /// below it, and the fork cut, which may, is [`Wal::truncate_beyond`].
    pub fn truncate_to(&self, lsn: Lsn) -> Result<u64> {
        let cut = self.control(move |w| w.truncate(lsn))?;
        self.rewind_archive_to(lsn)?;
        Ok(cut)
    }

    /// [`Wal::truncate_to`] if this node holds WAL beyond `lsn`, decided on storage's thread
    /// after every write queued before the call has been made durable (a write still landing
    /// when the caller read [`Wal::flushed`] is cut with the rest); 0 when nothing lies beyond.
    ///
    /// The fork cut (`walserver rejoin`, a member following a new leader past its fork): the
    /// WAL past `lsn` is another history than the upstream's. So a told commit point above
    /// `lsn` is lowered to it, durably, before the WAL is cut, also when nothing lies beyond:
    /// readers here stop at it until the new upstream tells a point of its own (`told.rs`).
    pub fn truncate_beyond(&self, lsn: Lsn) -> Result<u64> {
        let cut = self.control(move |w| w.cut_beyond(lsn))?;
        match cut {
            None => Ok(0),
            Some(dropped) => {
                self.rewind_archive_to(lsn)?;
                Ok(dropped)
            }
        }
    }

    /// After a cut at `lsn`, the archive's hold comes back to the cut's segment: what follows
    /// it is a new history the archive may not have yet (`archived.rs`).
    fn rewind_archive_to(&self, lsn: Lsn) -> Result<()> {
        let inner = self.inner();
        let rewound = inner.archive().rewind(
            &inner.io,
            &inner.tmp,
            lsn.segment_start(self.segment_size()),
        );
        rewound
    }

    /// Creates a physical slot. With `reserve_wal` its restart LSN is the current flushed end.
    pub fn create_slot(&self, name: &str, temporary: bool, reserve_wal: bool) -> Result<SlotInfo> {
        let flushed = reserve_wal.then(|| self.inner().state().flushed);
        self.create_slot_at(name, temporary, flushed)
    }

    /// Creates a physical slot whose restart point is `restart` (on the current timeline),
    /// or that reserves nothing yet if it is `None`; a point beyond the flushed end is taken
    /// as the flushed end, since no WAL beyond it exists here to hold.
    pub fn create_slot_at(
        &self,
        name: &str,
        temporary: bool,
        restart: Option<Lsn>,
    ) -> Result<SlotInfo> {
        let inner = self.inner();
        let restart = {
            let st = inner.state();
            restart.map(|r| (r.min(st.flushed), st.tli))
        };
        inner
            .slots()
            .create(inner.slot_paths(), name, temporary, restart)?;
        inner.slots_moved.send_modify(|n| *n = n.wrapping_add(1));
        self.slot(name)
    }

    /// Drops a slot that is not in use.
    pub fn drop_slot(&self, name: &str) -> Result<()> {
        let inner = self.inner();
        let dropped = inner.slots().drop_slot(inner.slot_paths(), name);
        if dropped.is_ok() {
            inner.slots_moved.send_modify(|n| *n = n.wrapping_add(1));
        }
        dropped
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
        let oldest_seg = self.oldest_retained().segment_number(self.segment_size());
        self.inner()
            .slots()
            .infos(written, oldest_seg, &self.shared.cfg)
    }

    /// Marks a slot in use by `pid` (the holder's process id, reported as the slot's
    /// `active_pid` and in `SlotInUse`) until the guard is dropped; `SlotInUse` if it already
    /// is.
    pub fn acquire_slot(&self, name: &str, pid: u32) -> Result<SlotGuard> {
        self.inner().slots().acquire(name, pid)?;
        Ok(SlotGuard {
            wal: self.clone(),
            name: name.to_string(),
        })
    }

    /// Removes the segments no slot and no `wal_keep_size` needs, invalidating slots beyond
    /// `max_slot_wal_keep_size`. It runs by itself at every segment switch; call it to apply a
    /// change at once (after dropping or advancing a slot, say).
    pub fn run_retention(&self) -> Result<()> {
        background::retain(&self.inner())
    }

    /// The archived position, while archiving holds retention (`archived.rs`): every
    /// completed segment below it is in the archive, and no segment from the one holding it
    /// on is removed or recycled.
    pub fn archived(&self) -> Option<Lsn> {
        self.inner().archive().archived()
    }

    /// Makes the archive hold retention, durably, from the oldest WAL still on disk unless it
    /// already holds from an earlier position; returns the position held. An archiver calls
    /// it before it starts, so nothing it has not copied can be removed. It writes and fsyncs
    /// a file: call it off any event loop.
    pub fn hold_for_archive(&self) -> Result<Lsn> {
        let inner = self.inner();
        let from = inner.oldest_retained();
        let held = inner.archive().hold(&inner.io, &inner.tmp, from);
        held
    }

    /// Records durably that every completed segment below `upto` is archived, then lets
    /// retention remove what nothing else holds. A position not ahead of the current one
    /// changes nothing. Writes and fsyncs a file: call it off any event loop.
    pub fn set_archived(&self, upto: Lsn) -> Result<()> {
        let inner = self.inner();
        let moved = inner.archive().advance(&inner.io, &inner.tmp, upto)?;
        if moved {
            let _ = inner.bg_tx.send(BgRequest::Retain);
        }
        Ok(())
    }

    /// Says whether the archive's backlog is past `archive_max_backlog` (`archived.rs`): while
    /// it is, appends are refused with [`WalError::ArchiveBacklog`] and relays stop reading.
    /// Only a change wakes the watchers. Memory only; the archiver calls it at each crossing.
    pub fn set_archive_backlog(&self, over: Option<ArchiveBacklog>) {
        self.shared.archive_gate.send_if_modified(|g| {
            let crossed = g.is_some() != over.is_some();
            *g = over;
            crossed
        });
    }

    /// The archive's backlog gate: `Some` while the backlog is past its bound. A relay waits on
    /// it for `None` before it reads more from its upstream.
    pub fn archive_backlog(&self) -> watch::Receiver<Option<ArchiveBacklog>> {
        self.shared.archive_gate.subscribe()
    }

    /// Ends the archive's hold on retention (archiving was turned off) and removes its file.
    pub fn release_archive_hold(&self) -> Result<()> {
        let inner = self.inner();
        let released = inner.archive().release(&inner.io);
        released
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
        let seg = self.segment_size();
        let inner = self.inner();
        let due = inner.slots().advance(name, restart_lsn, restart_tli, seg)?;
        if due {
            let _ = inner.bg_tx.send(BgRequest::PersistSlots);
            inner.slots_moved.send_modify(|n| *n = n.wrapping_add(1));
        }
        Ok(())
    }
}

/// The file an error names, for `/status`.
fn path_of(e: &WalError) -> Option<PathBuf> {
    match e {
        WalError::DiskFull { path, .. } | WalError::BadFile { path, .. } => Some(path.clone()),
        _ => None,
    }
}
