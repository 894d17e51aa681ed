//! The state every part of storage shares: [`Inner`] (directories, configuration, the segment
//! files, the slot table, the channels out), [`TimelineState`] (the positions that change
//! together), [`WalPosition`] (what is published), and the read paths (`read`, `read_cached`,
//! `locate`, `locate_cached`), which need nothing but this state and the files, so handles call them on their
//! own thread.
//!
//! **Invariants** (checked by [`TimelineState::check_invariants`] when positions are set):
//! `wal_start <= timeline_start <= flushed <= written`. Reads stop at the flushed end of the
//! current timeline, or the switch point of an ancestor, and below the oldest retained segment
//! they fail with `SegmentRemoved`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use crossbeam_channel::Sender;
use tokio::sync::watch;
use wal_types::{Lsn, SystemId, TimelineId};

use crate::archived::ArchiveHold;
use crate::durable::write_atomic_with;
use crate::early::EarlySends;
use crate::files::{encode_envelope, ControlData, FILE_VERSION};
use crate::health::HealthTx;
use crate::io::Io;
use crate::naming::segment_file_name;
use crate::recycle::RecyclePool;
use crate::segments::{SegmentFiles, View, WalFileRange};
use crate::slots::{SlotPaths, SlotTable};
use crate::tail::TailCache;
use crate::told::ToldCommit;
use crate::{HistoryEntry, Result, Role, StorageConfig, WalError, WalFormat};

/// Where the WAL stands: what the writer thread publishes after each write and each fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalPosition {
    pub timeline: TimelineId,
    /// End of what has been written to the segment files (not necessarily durable).
    pub written: Lsn,
    /// End of what is durable and found again by open after a crash; what walsenders send up
    /// to and a walreceiver reports upstream. Never ahead of `written`.
    pub flushed: Lsn,
    /// The overlapped commit's commit point as this node knows it ([`CommitBound`]).
    pub commit: CommitBound,
}

impl WalPosition {
    /// Where readers that may see only acknowledged WAL stop: the commit point this node
    /// knows, never beyond the flushed end; the flushed end when it knows none.
    pub fn committed(&self) -> Lsn {
        match self.commit {
            CommitBound::None => self.flushed,
            CommitBound::Own(c) | CommitBound::Told(c) => c.min(self.flushed),
        }
    }

    /// Where a walsender that does not send early stops: the flushed end, except on a node
    /// whose upstream told it a commit point, where every reader stops at that point (the
    /// overlapped commit's rule 3: nobody reads past the commit point).
    pub fn sendable(&self) -> Lsn {
        match self.commit {
            CommitBound::Told(_) => self.committed(),
            CommitBound::None | CommitBound::Own(_) => self.flushed,
        }
    }
}

/// What a node knows of the overlapped commit's commit point C: the highest LSN durable on
/// the primary and on its synchronous quorum. Under the overlapped commit a synchronous
/// standby may hold WAL past C that its primary never made durable; such WAL may vanish
/// (it is cut back at the standby's next stream start), so nothing past C is passed on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CommitBound {
    /// None: the switch is off, or the upstream carries none; readers stop at the flushed end.
    #[default]
    None,
    /// A primary's own commit point ([`Wal::set_own_commit_point`]): told to its standbys and
    /// bounding its archive; its walsenders keep the flushed limit for clients that cannot
    /// cut back.
    ///
    /// [`Wal::set_own_commit_point`]: crate::Wal::set_own_commit_point
    Own(Lsn),
    /// Told by the upstream ([`Wal::set_told_commit_point`]): every reader here stops at it.
    ///
    /// [`Wal::set_told_commit_point`]: crate::Wal::set_told_commit_point
    Told(Lsn),
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
    /// The role the control data records; it changes with the timeline at a promotion.
    pub role: Option<Role>,
    /// The commit point this node knows: a told one as far as it is durable (`told.rs`).
    pub commit: CommitBound,
    /// The control data's `primary_end`: where the WAL this node wrote as a primary ended
    /// when it became a standby, until an explicit cut went below it.
    pub primary_end: Option<Lsn>,
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
            commit: self.commit,
        }
    }

    /// The ordering relations between positions.
    pub(crate) fn check_invariants(&self) {
        debug_assert!(self.flushed <= self.written, "{self:?}");
        debug_assert!(self.timeline_start <= self.flushed, "{self:?}");
        debug_assert!(self.wal_start <= self.timeline_start, "{self:?}");
    }
}

/// What the background thread (`background.rs`) is asked to do. Declared here, beside the
/// sender in [`Inner`], so that everyone holding the state can ask without knowing the thread.
#[derive(Debug)]
pub(crate) enum BgRequest {
    /// Create segment `segno` of `tli` (from a recycled file, or zero-filled) and
    /// hand it back open for writing.
    Prealloc {
        tli: TimelineId,
        segno: u64,
        reply: Sender<Result<File>>,
    },
    /// Remove what no slot and no `wal_keep_size` needs (at a segment switch).
    Retain,
    /// Write the slots whose restart point moved to disk.
    PersistSlots,
    /// Write the newest commit point the upstream told, then publish it (`told.rs`).
    PersistCommitPoint,
    /// Write the early-send mark wanted, then wake the position's subscribers (`early.rs`).
    PersistEarlySends,
    Shutdown,
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
    /// Counts slot changes that matter beyond this node: a slot made or dropped, or a restart
    /// point that entered another segment (what retention counts in).
    pub slots_moved: watch::Sender<u64>,
    pub oldest_retained: AtomicU64,
    /// The slot table; a reopening after a storage failure shares it (it is the newest:
    /// restart points not yet persisted, and which slots are in use).
    pub slots: Arc<Mutex<SlotTable>>,
    /// The archive's hold on retention (`archived.rs`); shared with a reopening like the slots.
    pub archive: Arc<Mutex<ArchiveHold>>,
    /// The commit point the upstream told, on disk and wanted there; shared with a reopening.
    pub told: Arc<ToldCommit>,
    /// The timeline early sends are marked durably on (`early.rs`); shared with a reopening.
    pub early: Arc<EarlySends>,
    /// Feeds the background thread (preallocation, retention, slot persistence).
    pub bg_tx: Sender<BgRequest>,
    /// The last small durable batches, for readers at the end of WAL.
    pub tail: TailCache,
    /// Segment files retention handed over for reuse (`wal_recycle`).
    pub recycled: RecyclePool,
    /// Storage's health (`health.rs`); the writer moves it, and a restart.
    pub health: HealthTx,
    /// Publish each batch's written end before its fdatasync ([`Wal::set_publish_written`]);
    /// shared with a reopening like the slots.
    ///
    /// [`Wal::set_publish_written`]: crate::Wal::set_publish_written
    pub publish_written: Arc<AtomicBool>,
    /// Held for the life of the data directory's use; the lock goes with the file. Shared
    /// with the next opening after a storage failure, so the directory stays locked.
    pub lock: Arc<File>,
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

    pub(crate) fn archive(&self) -> std::sync::MutexGuard<'_, ArchiveHold> {
        self.archive.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the slot table writes its files.
    pub(crate) fn slot_paths(&self) -> SlotPaths<'_> {
        SlotPaths {
            io: &self.io,
            tmp: &self.tmp,
            dir: &self.slots_dir,
        }
    }

    pub(crate) fn pg_wal(&self) -> &Path {
        &self.files.pg_wal
    }

    /// Puts the current position into the watch and tells every receiver.
    ///
    /// The position is read inside the watch's lock, here and in
    /// [`Inner::publish_quietly`]. Threads publish side by side (the writer its batches, the
    /// supervisor's thread a primary's commit point, the background thread a standby's
    /// stored one), and a position read before taking the lock could land after a newer one
    /// and hide it: the writer's announcement of that batch already made, a waiter riding
    /// the watch would never see its end, and on a node with one client nothing would
    /// publish again. Read inside the lock, the value last put is the newest state. (The
    /// lock order is the watch's, then the state's; nothing holds the state while it takes
    /// the watch.)
    pub(crate) fn publish(&self) {
        self.pos_tx.send_modify(|p| *p = self.state().position());
    }

    /// Puts the current position into the watch without waking anyone: a receiver that
    /// looks (`borrow`) sees it, but none is told until [`Inner::announce`]. The writer
    /// stores a batch's end this way before it completes the batch's waiters and announces
    /// it after, so that a waiter that rides the watch (`Ticket::ride`) finds its reply
    /// when the announcement wakes it, and a waiter woken by its ticket already sees the
    /// new position in the watch.
    pub(crate) fn publish_quietly(&self) {
        self.pos_tx.send_if_modified(|p| {
            *p = self.state().position();
            false
        });
    }

    /// Tells every receiver of the watch that its value changed, even when it did not (a
    /// batch that failed, a request refused): after each round of replies the writer
    /// announces once, and that is what wakes the waiters that ride the watch.
    pub(crate) fn announce(&self) {
        self.pos_tx.send_modify(|_| {});
    }

    /// Changes the commit point this node knows with `f`, and publishes it if it changed.
    /// `f` runs inside the state's lock and may read the told point's marks (`told.rs`),
    /// whose lock is taken after the state's and never holds another.
    pub(crate) fn update_commit(&self, f: impl FnOnce(CommitBound) -> CommitBound) {
        let changed = {
            let mut st = self.state_mut();
            let next = f(st.commit);
            std::mem::replace(&mut st.commit, next) != next
        };
        if changed {
            self.publish();
        }
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
            role: st.role,
            primary_end: st.primary_end,
        };
        write_atomic_with(
            &self.io,
            &self.tmp,
            &self.dir.join("control"),
            &encode_envelope("control", &c),
        )
    }

    /// Sets the positions of the current timeline and publishes them.
    pub(crate) fn set_positions(&self, written: Lsn, flushed: Lsn) {
        self.set_positions_quietly(written, flushed);
        self.announce();
    }

    /// Sets the positions of the current timeline and puts them into the watch without
    /// telling anyone ([`Inner::publish_quietly`]): the writer's batches, which announce
    /// after their replies.
    pub(crate) fn set_positions_quietly(&self, written: Lsn, flushed: Lsn) {
        {
            let mut st = self.state_mut();
            st.written = written;
            st.flushed = flushed;
            st.check_invariants();
        }
        self.publish_quietly();
    }

    /// Moves the written end of the current timeline without publishing it. The writer calls
    /// it between a batch's write and its fdatasync: no subscriber acts on bytes not yet
    /// durable (walsenders send and walreceivers report only the flushed end), and waking
    /// the node's threads for it took CPU and a system call from the writer thread just
    /// before the fdatasync of every synchronous commit. [`Wal::position`](crate::Wal::position)
    /// reads it at once; the watch sees it with the flushed end that follows.
    pub(crate) fn set_written(&self, written: Lsn) {
        let mut st = self.state_mut();
        st.written = written;
        st.check_invariants();
    }

    /// Bytes of the current timeline at `start` from the tail cache, up to the flushed end
    /// (or, with `written`, the written end); see [`Wal::read_cached`](crate::Wal::read_cached).
    pub(crate) fn read_cached(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
        written: bool,
    ) -> Option<Bytes> {
        let limit = {
            let st = self.state();
            if st.tli != tli {
                return None;
            }
            if written {
                st.written
            } else {
                st.flushed
            }
        };
        // Like `read`, stop at the segment's end.
        let seg = self.cfg.segment_size;
        let in_segment = usize::try_from(seg - start.segment_offset(seg)).unwrap_or(usize::MAX);
        self.tail.get(tli, start, max_len.min(in_segment), limit)
    }

    /// Bytes of timeline `tli` at `start`; see [`Wal::read`](crate::Wal::read).
    pub(crate) fn read(&self, tli: TimelineId, start: Lsn, max_len: usize) -> Result<Bytes> {
        match self.find(tli, start, max_len, |files, view, limit| {
            files.read(view, start, limit, max_len)
        })? {
            Found::Empty => Ok(Bytes::new()),
            Found::Here(b) => Ok(b),
        }
    }

    /// Appends bytes of timeline `tli` at `start` to `buf`; see
    /// [`Wal::read_into`](crate::Wal::read_into).
    pub(crate) fn read_into(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
        buf: &mut bytes::BytesMut,
    ) -> Result<usize> {
        match self.find(tli, start, max_len, |files, view, limit| {
            files.read_into(view, start, limit, max_len, buf)
        })? {
            Found::Empty => Ok(0),
            Found::Here(n) => Ok(n),
        }
    }

    /// Where the bytes of timeline `tli` at `start` lie; see
    /// [`Wal::locate`](crate::Wal::locate).
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

    /// What `locate` would find, from memory alone; see
    /// [`Wal::locate_cached`](crate::Wal::locate_cached). Every error `locate` would report is
    /// `None` here, so the caller's `locate` reports it.
    pub(crate) fn locate_cached(
        &self,
        tli: TimelineId,
        start: Lsn,
        max_len: usize,
    ) -> Option<WalFileRange> {
        let found = self.find(tli, start, max_len, |files, view, limit| {
            Ok(files.locate_cached(view, start, limit, max_len))
        });
        match found {
            Ok(Found::Here(r)) => Some(r),
            _ => None,
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
