//! The `Archiver` actor: the schedule's decisions carried out.
//!
//! It wakes on storage's position watch (new WAL, a promotion, a demotion) and on its own
//! backoff timer, asks [`Schedule`] what to do, and runs each upload as one blocking job:
//! read the file through storage, put it into the target, and for a segment store the new
//! archived position in storage, before the job returns to the actor once. One job at a time;
//! nothing on the actor's thread touches a file.
//!
//! With a backlog, one job (a round) takes up to [`ROUND_SEGMENTS`] consecutive segments and
//! puts them through [`UPLOADS_IN_FLIGHT`] threads, each reading, compressing, checksumming
//! and putting one segment and then taking the next not yet started, so one segment's
//! compression overlaps others' requests and the store's work on them, and no thread waits
//! for the slowest of a batch. Each thread reads and compresses into buffers (and a zstd
//! context) it keeps from one segment to the next, for the round's life; a job of one upload
//! runs on a blocking-pool thread, which keeps them while it lives. Each time the segments
//! archived in order reach further, the round stores the archived position there and tells
//! the actor those segments ([`RoundProgressed`]), so retention, the backlog gate and
//! `/status` move a segment at a time while the round runs; the job's outcome then carries
//! the rest, up to and including a failure. After a failure, a stop or the loss of the
//! leader's fence, it starts no further segment; the actor takes back those it did not start.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use bytes::{Bytes, BytesMut};
use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt;
use wal_storage::{format_history, segment_file_name, ArchiveBacklog, Role, Wal, WalPosition};
use wal_types::{Lsn, TimelineId};

use crate::compression::Compression;
use crate::error::{ArchiveError, Result};
use crate::known::Known;
use crate::messages::{GetArchiverStatus, StopArchiver};
use crate::read::ArchivedFile;
use crate::schedule::{prefix_stem, timeline_of, Item, Next, Schedule, WalView};
use crate::status::{ArchiverStatus, BacklogClock};
use crate::target::{ArchiveTarget, Put};

/// PostgreSQL's `archive_mode` values that archive (`off` starts no archiver).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArchiveMode {
    /// A primary archives; a standby does not, and holds its WAL until the archive has it
    /// (looking at the archive each time a segment completes here), so that after a failover
    /// it goes on where the archive ends. With an `archive_command`, which cannot be looked
    /// at, a standby drops the hold instead, as PostgreSQL's standby marks what it receives
    /// as done.
    On,
    /// Every node archives what it stores.
    Always,
}

/// What an archiver needs to start.
#[derive(Clone, Debug)]
pub struct ArchiveConfig {
    pub mode: ArchiveMode,
    pub target: ArchiveTarget,
    /// `archive_timeout`: the current segment's durable prefix goes to the archive at least
    /// this often (named as the crate's story says); zero puts none.
    pub archive_timeout: Duration,
    /// `archive_max_backlog`: past this many bytes waiting for the archive, storage refuses
    /// appends and relays stop reading until it falls; zero is unbounded.
    pub max_backlog: u64,
    /// How objects are stored (`archive_compression`).
    pub compression: Compression,
}

/// Segments uploaded at once when a backlog waits. A guess, as pgBackRest's `process-max`
/// is: enough to overlap one segment's compression with others' requests on two cores, and
/// at most this many segments (16 MiB each, and their compressed forms) in memory.
pub const UPLOADS_IN_FLIGHT: usize = 4;

/// Segments one round of uploads takes at most. Each round ends in a wait for its last
/// upload, with fewer threads busy, and while it runs the archiver starts nothing else (a
/// history file, an `archive_timeout` prefix); the archived position moves a segment at a
/// time either way. A guess between the two: a few seconds of uploads on a store that takes
/// twenty segments a second, a gigabyte of 16 MiB segments.
pub const ROUND_SEGMENTS: usize = 16 * UPLOADS_IN_FLIGHT;

/// What a blocking job did.
enum Done {
    /// The hold was taken at this position, or released (`None`).
    Held(Option<Lsn>),
    /// A standby under `on` moved its hold past what the archive holds, to here.
    Followed(Lsn),
    /// The outcome of each item of an upload job, in the order they were offered; the
    /// items after a failure are not there. The first ones may have been told already by the
    /// round's [`RoundProgressed`] messages; the actor takes each outcome once.
    Uploads(Vec<(Item, Result<Put>)>),
    /// Taking or releasing the hold failed.
    HoldFailed(ArchiveError),
}

pub struct Archiver {
    wal: Wal,
    config: Arc<ArchiveConfig>,
    /// `Some` while the archive holds retention and this node archives.
    schedule: Option<Schedule>,
    /// A standby under `on` following the archive: the segment its flushed end was in at the
    /// last look at the archive.
    followed: Option<u64>,
    status: watch::Sender<ArchiverStatus>,
    /// A blocking job is running; its outcome comes back as `Done`.
    busy: bool,
    /// The timer of a backoff or of the next `archive_timeout` upload.
    wake: Option<SpawnHandle>,
    /// Answered once the job in flight (if any) has returned and the actor stopped.
    stopping: Option<Vec<oneshot::Sender<()>>>,
    /// When the segments waiting for the archive were completed: the backlog's age.
    clock: BacklogClock,
    /// Under automatic failover, whether this node holds the leader's fence now (`None`
    /// without failover); see [`Archiver::start_fenced`].
    fence: Option<watch::Receiver<bool>>,
    /// The archive's names as far as this archiver knows (`known.rs`); only one job at a
    /// time uses it (its uploads side by side lock it for their bookkeeping).
    known: Arc<Mutex<Known>>,
    /// Set when the archiver stops: the round in flight starts no further upload.
    halted: Arc<AtomicBool>,
    /// The number of the upload job in flight (or the next one), which its
    /// [`RoundProgressed`] messages carry.
    round: u64,
    /// How many of that job's outcomes the actor has taken, in order, from its progress.
    taken: usize,
}

/// Whether a round of uploads may start its next one.
pub(crate) struct MayStart {
    pub(crate) halted: Arc<AtomicBool>,
    /// The leader's fence when it governs uploads (`on` under failover).
    pub(crate) fence: Option<watch::Receiver<bool>>,
}

impl MayStart {
    fn now(&self) -> bool {
        !self.halted.load(Ordering::Acquire) && self.fence.as_ref().is_none_or(|f| *f.borrow())
    }
}

impl Archiver {
    /// Starts an archiver of `wal`'s WAL on the current arbiter; its status is on the
    /// returned watch.
    pub fn start(
        wal: Wal,
        config: ArchiveConfig,
    ) -> (Addr<Archiver>, watch::Receiver<ArchiverStatus>) {
        Archiver::start_fenced(wal, config, None)
    }

    /// As [`Archiver::start`], for a node under automatic failover: `fence` says whether
    /// the node holds the leader's fence now. Under `archive_mode = on` a primary starts an
    /// upload only while it does, so a leader that lost its lease (and has not been demoted
    /// yet) stops adding to the archive the new leader writes; an upload already running
    /// finishes, which is harmless, since a put never overwrites and two nodes putting the
    /// same name with the same bytes both count it as archived. `always` ignores the fence:
    /// there every node archives what it stores.
    pub fn start_fenced(
        wal: Wal,
        config: ArchiveConfig,
        fence: Option<watch::Receiver<bool>>,
    ) -> (Addr<Archiver>, watch::Receiver<ArchiverStatus>) {
        let (status, rx) = watch::channel(ArchiverStatus::default());
        let addr = Archiver {
            wal,
            config: Arc::new(config),
            schedule: None,
            followed: None,
            status,
            busy: false,
            wake: None,
            stopping: None,
            clock: BacklogClock::default(),
            fence,
            known: Arc::default(),
            halted: Arc::default(),
            round: 0,
            taken: 0,
        }
        .start();
        (addr, rx)
    }

    /// Notes the backlog's age, also while an upload runs (so a segment completed meanwhile
    /// is timed when it completed).
    fn time_backlog(&mut self) {
        let Some(schedule) = &self.schedule else {
            return;
        };
        let since = self.clock.observe(
            self.wal.segment_size(),
            schedule.archived(),
            self.wal.flushed(),
            SystemTime::now(),
        );
        if since != self.status.borrow().backlog_since {
            self.status.send_modify(|s| s.backlog_since = since);
        }
    }

    /// Does whatever is due now.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        self.time_backlog();
        self.check_backlog();
        if self.busy || self.stopping.is_some() {
            return;
        }
        let archives =
            self.config.mode == ArchiveMode::Always || self.wal.role() != Some(Role::Standby);
        let wal = self.wal.clone();
        // Whether this node reads the archive's state: a standby under `on` then keeps what
        // the archive does not have yet, and a new leader starts where the archive ends.
        let readable = !matches!(self.config.target, ArchiveTarget::Command(_));
        let target = self.config.target.clone();
        let fenced_in = self.fenced_in();
        match (&mut self.schedule, archives) {
            // At a promotion the hold is where following the archive left it, a segment or
            // two behind the archive's end: those are put again, and each put compares with
            // what the archive holds, so the archive's state decides, not the local position.
            (None, true) => self.run(ctx, move || match wal.hold_for_archive() {
                Ok(at) => Done::Held(Some(at)),
                Err(e) => Done::HoldFailed(e.into()),
            }),
            (Some(_), false) if readable => {
                tracing::info!("a standby with archive_mode = on: not archiving; holding WAL until the archive has it");
                self.schedule = None;
                self.followed = None;
                self.pump(ctx);
            }
            (Some(_), false) => self.run(ctx, move || match wal.release_archive_hold() {
                Ok(()) => Done::Held(None),
                Err(e) => Done::HoldFailed(e.into()),
            }),
            (None, false) if readable => {
                // Looked at when a segment completes here: by then the leader has usually
                // archived the ones before, so the hold trails the archive by a segment or
                // two and never by what the archive lacks.
                let segno = wal.flushed().segment_number(wal.segment_size());
                if self.followed != Some(segno) {
                    self.followed = Some(segno);
                    let known = self.known.clone();
                    self.run(ctx, move || {
                        match wal
                            .hold_for_archive()
                            .map_err(ArchiveError::from)
                            .and_then(|at| follow_archive(&wal, &target, &known, at))
                        {
                            Ok(at) => Done::Followed(at),
                            Err(e) => Done::HoldFailed(e),
                        }
                    });
                }
            }
            (None, false) => {}
            (Some(schedule), true) => {
                let pos = self.wal.position();
                let backlog = schedule.backlog(pos.flushed);
                self.status.send_modify(|s| s.backlog_bytes = backlog);
                if !fenced_in {
                    // Not the leader's fence: no new upload; its next grant pumps again.
                    return;
                }
                let history = self.wal.history();
                // What the archive may take is acknowledged WAL: the flushed end, or under
                // the overlapped commit the commit point this node knows, since WAL past it
                // may be cut back and an archived object is never replaced.
                let view = WalView {
                    timeline: pos.timeline,
                    history: &history,
                    flushed: pos.committed(),
                };
                let next = schedule.next(Instant::now(), view);
                match next {
                    Next::Upload(item) => {
                        let mut items = vec![item];
                        // An archive_command runs one file at a time, as PostgreSQL runs it.
                        if !matches!(self.config.target, ArchiveTarget::Command(_)) {
                            items.extend(schedule.more(view, ROUND_SEGMENTS - 1));
                        }
                        let config = self.config.clone();
                        let known = self.known.clone();
                        let may_start = MayStart {
                            halted: self.halted.clone(),
                            fence: self
                                .fence
                                .clone()
                                .filter(|_| self.config.mode == ArchiveMode::On),
                        };
                        let (addr, round) = (ctx.address(), self.round);
                        let progressed = move |from, archived| {
                            addr.do_send(RoundProgressed {
                                round,
                                from,
                                archived,
                            })
                        };
                        self.run(ctx, move || {
                            Done::Uploads(upload_all(
                                &wal,
                                &config,
                                &known,
                                items,
                                pos.timeline,
                                &may_start,
                                &progressed,
                            ))
                        })
                    }
                    Next::WaitUntil(at) => {
                        if let Some(h) = self.wake.take() {
                            ctx.cancel_future(h);
                        }
                        let wait = at.saturating_duration_since(Instant::now());
                        self.wake = Some(ctx.run_later(wait, |act, ctx| {
                            act.wake = None;
                            act.pump(ctx);
                        }));
                    }
                    Next::Idle | Next::Busy => {}
                }
            }
        }
    }

    /// Whether this node may start an upload as far as failover is concerned.
    fn fenced_in(&self) -> bool {
        self.config.mode == ArchiveMode::Always || self.fence.as_ref().is_none_or(|f| *f.borrow())
    }

    /// Tells storage whether what waits for the archive is past `archive_max_backlog`, at
    /// every change of the WAL and after every upload, so the crossing either way is heard at
    /// once. What waits is the WAL the hold keeps for the archive: from the archived position
    /// to the flushed end. Without a schedule (a standby under `on`) or once stopping,
    /// nothing waits for this archiver.
    fn check_backlog(&mut self) {
        let bound = self.config.max_backlog;
        let over = match &self.schedule {
            Some(schedule) if bound > 0 && self.stopping.is_none() => {
                let backlog = self.wal.flushed().0.saturating_sub(schedule.archived().0);
                (backlog > bound).then_some(ArchiveBacklog { backlog, bound })
            }
            _ => None,
        };
        if over.is_some() != self.status.borrow().backpressure {
            match over {
                Some(b) => tracing::warn!(backlog = b.backlog, bound = b.bound, "the archive is behind by more than archive_max_backlog: refusing appends and pausing the upstream until it catches up"),
                None => tracing::info!("the archive's backlog is within archive_max_backlog again: appends resume"),
            }
            self.status.send_modify(|s| s.backpressure = over.is_some());
        }
        self.wal.set_archive_backlog(over);
    }

    /// Runs `job` on the blocking pool and takes its outcome back on the actor.
    fn run(&mut self, ctx: &mut Context<Self>, job: impl FnOnce() -> Done + Send + 'static) {
        self.busy = true;
        let handle = tokio::task::spawn_blocking(job);
        ctx.spawn(
            actix::fut::wrap_future(handle).map(|res, act: &mut Archiver, ctx| {
                act.busy = false;
                match res {
                    Ok(done) => act.done(done),
                    Err(e) => tracing::error!(error = %e, "an archive job ended without an answer"),
                }
                if let Some(waiters) = act.stopping.take() {
                    ctx.stop();
                    for w in waiters {
                        let _ = w.send(());
                    }
                    return;
                }
                act.pump(ctx);
            }),
        );
    }

    fn done(&mut self, done: Done) {
        let seg = self.wal.segment_size();
        match done {
            Done::Held(Some(at)) => {
                tracing::info!(archived = %at, "archiving WAL from the archived position");
                // Archiving starts (again): the archive is listed at the first need.
                self.known
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .forget();
                let timeout = self.config.archive_timeout;
                let schedule = Schedule::new(seg, at, Some(timeout));
                let covered = schedule.covered();
                self.schedule = Some(schedule);
                self.status.send_modify(|s| {
                    s.archived_lsn = Some(at);
                    s.covered_lsn = Some(covered);
                });
            }
            Done::Held(None) => {
                tracing::info!("a standby with archive_mode = on: not archiving");
                self.schedule = None;
                self.status.send_modify(|s| {
                    s.archived_lsn = None;
                    s.covered_lsn = None;
                });
            }
            Done::Followed(at) => {
                tracing::debug!(archived = %at, "the archive holds the WAL below this position");
                self.status.send_modify(|s| {
                    s.archived_lsn = Some(at);
                    s.last_error = None;
                    s.alarm = None;
                });
            }
            Done::HoldFailed(e @ ArchiveError::OtherSystem { .. }) => {
                // A standby under `on` found another system's archive: its names say nothing
                // of this node's WAL, so the hold stays where it is (the WAL is kept) until a
                // person points archive_target at this cluster's archive.
                tracing::error!(error = %e, "not following the archive: it holds another system's WAL");
                self.status.send_modify(|s| {
                    s.last_error = Some(e.to_string());
                    s.alarm = Some(e.to_string());
                });
            }
            Done::HoldFailed(e) => {
                // Retried at the next change of position; a storage failure is also shown by
                // storage's own health.
                tracing::warn!(error = %e, "could not change the archive's hold on WAL");
                self.status
                    .send_modify(|s| s.last_error = Some(e.to_string()));
            }
            Done::Uploads(outcomes) => {
                // Those the round's progress told are taken already; a progress message
                // still on its way is stale from here on.
                let taken = std::mem::take(&mut self.taken);
                self.round += 1;
                for (item, outcome) in outcomes.into_iter().skip(taken) {
                    match outcome {
                        Ok(put) => self.uploaded(item, put),
                        Err(e) => self.failed(item, e),
                    }
                }
                // What the round did not start (it stopped early) is offered again.
                if let Some(schedule) = self.schedule.as_mut() {
                    schedule.take_back();
                }
            }
        }
    }

    fn uploaded(&mut self, item: Item, put: Put) {
        let seg = self.wal.segment_size();
        let Some(schedule) = self.schedule.as_mut() else {
            return;
        };
        let name = item.file_name(seg);
        let archived = schedule.uploaded(item);
        let covered = schedule.covered();
        tracing::debug!(file = %name, ?put, "archived");
        self.status.send_modify(|s| {
            s.archived_count += 1;
            s.last_archived_wal = Some(name);
            s.last_archived_time = Some(SystemTime::now());
            s.last_error = None;
            s.alarm = None;
            if let Some(a) = archived {
                s.archived_lsn = Some(a);
            }
            s.covered_lsn = Some(covered);
        });
    }

    fn failed(&mut self, item: Item, e: ArchiveError) {
        let seg = self.wal.segment_size();
        let Some(schedule) = self.schedule.as_mut() else {
            return;
        };
        let name = item.file_name(seg);
        schedule.failed(item, Instant::now());
        let tries = schedule.failures_in_a_row();
        let mismatch = matches!(
            e,
            ArchiveError::Mismatch { .. }
                | ArchiveError::OtherSystem { .. }
                | ArchiveError::NoCreateIfAbsent { .. }
        );
        if mismatch {
            tracing::error!(file = %name, error = %e, tries, "archiving is stuck until a person looks");
        } else {
            tracing::warn!(file = %name, error = %e, tries, "archiving failed; will retry");
        }
        self.status.send_modify(|s| {
            s.failed_count += 1;
            s.last_failed_wal = Some(name);
            s.last_failed_time = Some(SystemTime::now());
            s.last_error = Some(e.to_string());
            if mismatch {
                s.alarm = Some(e.to_string());
            }
        });
    }
}

/// What a round tells as it goes: `(from, archived)`, the outcomes `from..` of its items
/// (`archived`, every one a success, in order), once the archived position is stored past
/// them.
pub(crate) type Progress<'a> = &'a (dyn Fn(usize, Vec<(Item, Put)>) + Sync);

/// Puts `items` (one file, or consecutive segments through [`upload_round`]) and stores the
/// archived position at the end of the segments that succeeded in order: the blocking job of
/// one upload or one round. Returns the outcomes in order, up to and including the first
/// failure, and only of the items the job started; a round has told some of them through
/// `progress` already. `current` is the timeline whose view reads resolve through.
pub(crate) fn upload_all(
    wal: &Wal,
    config: &ArchiveConfig,
    known: &Mutex<Known>,
    items: Vec<Item>,
    current: TimelineId,
    may_start: &MayStart,
    progress: Progress<'_>,
) -> Vec<(Item, Result<Put>)> {
    // The store's create-if-absent, on which every put's never-overwrite rests (the identity's
    // own put included), is checked before this archiver's first upload.
    if !lock(known).probed() {
        if let Err(e) = config.target.check_create_if_absent(wal.system_id()) {
            return vec![(items[0], Err(e))];
        }
        lock(known).set_probed();
    }
    // The archive's identity is checked (and named, in a new archive) before this
    // archiver's first upload, so no WAL of this system lands in another's archive.
    if !matches!(config.target, ArchiveTarget::Command(_)) && !lock(known).claimed() {
        if let Err(e) = config.target.claim(wal.system_id()) {
            return vec![(items[0], Err(e))];
        }
        lock(known).set_claimed();
    }
    let seg = wal.segment_size();
    let outcomes: Vec<(Item, Result<Put>)> = match &items[..] {
        [item] => {
            let outcome = upload(wal, config, known, *item, current).and_then(|put| {
                // The object is durable; the position must be too before it counts. If it
                // is not, the retry finds its own bytes in the archive.
                match item.segment_end(seg) {
                    Some(end) => wal.set_archived(end).map(|()| put).map_err(Into::into),
                    None => Ok(put),
                }
            });
            vec![(*item, outcome)]
        }
        _ => upload_round(wal, config, known, &items, current, may_start, progress),
    };
    if outcomes.iter().any(|(_, o)| o.is_err()) {
        // What failed may have half happened: look again.
        lock(known).forget();
    }
    outcomes
}

/// A round's bookkeeping, shared by its threads.
struct RoundState {
    /// Each item's outcome, once its upload ended.
    slots: Vec<Option<Result<Put>>>,
    /// The items before this one succeeded, the archived position is stored past them, and
    /// `progress` told them.
    stored: usize,
}

/// Puts `items` (consecutive segments) through up to [`UPLOADS_IN_FLIGHT`] threads, each
/// taking the next item not yet started as soon as its last one is done, until a failure, a
/// stop or a closed fence ends the round. Each time the segments that succeeded in order
/// reach further, the archived position is stored at their end and `progress` tells them.
/// Returns the outcomes in the order of `items`, up to and including the first failure and
/// up to the first item without one (not started, or its thread panicked, which counts as
/// its failure).
fn upload_round(
    wal: &Wal,
    config: &ArchiveConfig,
    known: &Mutex<Known>,
    items: &[Item],
    current: TimelineId,
    may_start: &MayStart,
    progress: Progress<'_>,
) -> Vec<(Item, Result<Put>)> {
    let seg = wal.segment_size();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let state = Mutex::new(RoundState {
        slots: items.iter().map(|_| None).collect(),
        stored: 0,
    });
    let worker = || {
        while !failed.load(Ordering::Relaxed) && may_start.now() {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&item) = items.get(i) else {
                return;
            };
            let outcome = upload(wal, config, known, item, current);
            if outcome.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            let mut round = state.lock().unwrap_or_else(|p| p.into_inner());
            round.slots[i] = Some(outcome);
            let from = round.stored;
            let reach = from
                + round.slots[from..]
                    .iter()
                    .take_while(|o| matches!(o, Some(Ok(_))))
                    .count();
            if reach == from {
                continue;
            }
            // A round holds segments only (`Schedule::more`).
            let Some(end) = items[reach - 1].segment_end(seg) else {
                continue;
            };
            // Stored under the lock, so positions go to storage in order; the other threads
            // wait for it only as each finishes an upload.
            match wal.set_archived(end) {
                Ok(()) => {
                    let archived = (from..reach)
                        .filter_map(|k| match round.slots[k] {
                            Some(Ok(put)) => Some((items[k], put)),
                            _ => None,
                        })
                        .collect();
                    round.stored = reach;
                    progress(from, archived);
                }
                Err(e) => {
                    // The objects are durable but the position is not: the first of them
                    // fails, and its retry (and the others') finds its own bytes there.
                    round.slots[from] = Some(Err(e.into()));
                    failed.store(true, Ordering::Relaxed);
                }
            }
        }
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..UPLOADS_IN_FLIGHT.min(items.len()))
            .map(|_| scope.spawn(worker))
            .collect();
        for t in threads {
            // A thread that panicked left its item without an outcome: judged below.
            let _ = t.join();
        }
    });
    let started = next.into_inner().min(items.len());
    let slots = state.into_inner().unwrap_or_else(|p| p.into_inner()).slots;
    let mut outcomes = Vec::with_capacity(started);
    for (i, (&item, slot)) in items.iter().zip(slots).enumerate() {
        match slot {
            Some(outcome) => {
                let failed = outcome.is_err();
                outcomes.push((item, outcome));
                if failed {
                    break;
                }
            }
            None if i < started => {
                let e = ArchiveError::io(
                    format!("archiving {}", item.file_name(seg)),
                    std::io::Error::other("the upload's thread panicked"),
                );
                outcomes.push((item, Err(e)));
                break;
            }
            None => break,
        }
    }
    outcomes
}

/// Puts `item` into `target` and removes what it supersedes. `current` is the timeline whose
/// view reads resolve through (below a switch point it reads the old timeline's bytes).
/// `known` is locked only around its own bookkeeping, so uploads side by side wait for each
/// other only while one lists the archive.
pub(crate) fn upload(
    wal: &Wal,
    config: &ArchiveConfig,
    known: &Mutex<Known>,
    item: Item,
    current: TimelineId,
) -> Result<Put> {
    let (target, compression) = (&config.target, config.compression);
    let seg = wal.segment_size();
    let name = item.file_name(seg);
    match item {
        Item::History(tli) => {
            let bytes = match wal.history_file(tli)? {
                Some(b) => Bytes::from(b),
                // A node that never stored this ancestor's file (a standby fetches the newest
                // one) makes it from the ancestry: a timeline's history is the prefix of its
                // descendants'.
                None => {
                    let history = wal.history();
                    let until = history
                        .iter()
                        .position(|h| h.parent == tli)
                        .unwrap_or(history.len());
                    Bytes::from(format_history(&history[..until]))
                }
            };
            let put = target.put(&name, bytes, compression)?;
            lock(known).put(&name, put);
            Ok(put)
        }
        Item::Segment { tli, segno } => {
            let start = Lsn(segno * seg);
            let bytes = read_range(wal, current, start, Lsn(start.0 + seg), &name)?;
            let put = target.put(&name, bytes.clone(), compression);
            give_back(bytes);
            let put = put?;
            let mut known = lock(known);
            known.put(&name, put);
            remove_prefixes(target, &mut known, tli, segno, seg, None)?;
            Ok(put)
        }
        Item::Partial { tli, segno, end } => {
            // PostgreSQL's shape: the old timeline's bytes, then zeros to the segment's size,
            // so that a restore can rename it into a segment file.
            let start = Lsn(segno * seg);
            let mut bytes = BytesMut::from(read_range(wal, current, start, end, &name)?);
            bytes.resize(seg as usize, 0);
            let put = target.put(&name, bytes.freeze(), compression)?;
            let mut known = lock(known);
            known.put(&name, put);
            remove_prefixes(target, &mut known, tli, segno, seg, None)?;
            Ok(put)
        }
        Item::Prefix { tli, segno, end } => {
            let bytes = read_range(wal, current, Lsn(segno * seg), end, &name)?;
            let put = target.put(&name, bytes, compression)?;
            let mut known = lock(known);
            known.put(&name, put);
            remove_prefixes(target, &mut known, tli, segno, seg, Some(end))?;
            Ok(put)
        }
    }
}

fn lock(known: &Mutex<Known>) -> std::sync::MutexGuard<'_, Known> {
    known.lock().unwrap_or_else(|p| p.into_inner())
}

/// Moves a standby's hold from `from` past every completed segment the archive already
/// holds under the name this node gives it, and returns the new position: a standby under
/// `on` keeps what the leader has not archived yet, whatever its slots and `wal_keep_size`
/// say, so that it can go on where the archive ends if it is promoted. Names are trusted
/// here; the contents are compared when a leader puts. It asks for each name rather than
/// listing (`known.rs`): the hold trails the archive's end by a segment or two, so that is
/// a few requests, whatever the archive's size. Names are trusted only in an archive of
/// this node's system (read once, then remembered in `known`): another system's archive
/// holds the same names for other WAL, and following it would drop WAL this node's leader
/// has not archived.
fn follow_archive(
    wal: &Wal,
    target: &ArchiveTarget,
    known: &Mutex<Known>,
    from: Lsn,
) -> Result<Lsn> {
    if !lock(known).claimed() && target.check_system(wal.system_id())?.is_some() {
        lock(known).set_claimed();
    }
    let seg = wal.segment_size();
    let pos = wal.position();
    let history = wal.history();
    let view = WalView {
        timeline: pos.timeline,
        history: &history,
        flushed: pos.flushed,
    };
    let mut at = from.segment_start(seg);
    while at.0 + seg <= pos.flushed.0 {
        let segno = at.segment_number(seg);
        let tli = timeline_of(Lsn(at.0 + seg - 1), view);
        if !target.contains(&segment_file_name(tli, segno, seg))? {
            break;
        }
        at = Lsn(at.0 + seg);
    }
    if at > from {
        wal.set_archived(at)?;
    }
    Ok(at.max(from))
}

thread_local! {
    /// Each upload thread's read buffer, kept between segments: a fresh 16 MiB one per
    /// segment had its pages faulted in by the read and returned at its free, every time.
    static READ_BUFFER: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
}

/// The WAL in `[start, end)` through timeline `current`'s view, read into this thread's kept
/// buffer; [`give_back`] returns it once the bytes are no longer needed.
pub(crate) fn read_range(
    wal: &Wal,
    current: TimelineId,
    start: Lsn,
    end: Lsn,
    name: &str,
) -> Result<Bytes> {
    let len = end.0.saturating_sub(start.0) as usize;
    let mut bytes = READ_BUFFER.take();
    bytes.clear();
    bytes.reserve(len);
    while bytes.len() < len {
        let at = Lsn(start.0 + bytes.len() as u64);
        if wal.read_into(current, at, len - bytes.len(), &mut bytes)? == 0 {
            return Err(ArchiveError::io(
                format!("reading {name}"),
                std::io::Error::other(format!("WAL ends at {at}, before {end}")),
            ));
        }
    }
    Ok(bytes.freeze())
}

/// The room of this thread's kept read buffer (0 while a read holds it).
#[cfg(test)]
pub(crate) fn kept_read_buffer() -> usize {
    READ_BUFFER.with_borrow(|b| b.capacity())
}

/// Hands `bytes` back as this thread's read buffer if nothing else holds them (a store
/// client may still hold a body it sent; the next read then takes a new buffer).
pub(crate) fn give_back(bytes: Bytes) {
    if let Ok(buffer) = bytes.try_into_mut() {
        READ_BUFFER.set(buffer);
    }
}

/// Removes the `archive_timeout` objects of segment `segno` of `tli` that end before
/// `below` (all of them with `None`): a longer one, the `.partial` or the whole segment is
/// in the archive now. Those of an earlier run or another node go too, as far as `known`
/// knows them (it lists the archive when it does not).
fn remove_prefixes(
    target: &ArchiveTarget,
    known: &mut Known,
    tli: TimelineId,
    segno: u64,
    seg: u64,
    below: Option<Lsn>,
) -> Result<()> {
    if let ArchiveTarget::Command(_) = target {
        // It cannot be listed, and with it the node puts no prefixes.
        return Ok(());
    }
    let stem = prefix_stem(tli, segno, seg);
    let superseded: Vec<String> = known
        .names(target)?
        .range(stem.clone()..)
        .take_while(|name| name.starts_with(&stem))
        .filter(|name| {
            matches!(ArchivedFile::parse(name, seg),
                Some(ArchivedFile::Partial { end: Some(end), .. }) if below.is_none_or(|b| end < b))
        })
        .cloned()
        .collect();
    for name in superseded {
        target.remove(&name)?;
        known.removed(&name);
        tracing::debug!(file = %name, "removed a superseded partial segment");
    }
    Ok(())
}

impl Actor for Archiver {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.add_stream(WatchStream::new(self.wal.subscribe()));
        if let Some(fence) = &self.fence {
            ctx.add_stream(WatchStream::new(fence.clone()).map(FenceChanged));
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // However it stopped, appends are not refused on its account any more.
        self.wal.set_archive_backlog(None);
    }
}

impl StreamHandler<WalPosition> for Archiver {
    fn handle(&mut self, _: WalPosition, ctx: &mut Context<Self>) {
        self.time_backlog();
        self.pump(ctx);
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // Storage's watch outlives every handle the archiver holds; it cannot end first.
    }
}

/// The leader's fence was granted (`true`) or closed.
struct FenceChanged(bool);

impl StreamHandler<FenceChanged> for Archiver {
    fn handle(&mut self, FenceChanged(held): FenceChanged, ctx: &mut Context<Self>) {
        if self.config.mode == ArchiveMode::On && self.wal.role() != Some(Role::Standby) {
            if held {
                tracing::info!("the leader's fence is granted: archiving");
            } else {
                tracing::info!(
                    "the leader's fence is closed: starting no upload until it is granted again"
                );
            }
        }
        self.pump(ctx);
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // The fence's sender goes with the node; without it nothing grants again, and the
        // last value read stays.
    }
}

/// Segments a round archived, in order, with the archived position stored past them: its
/// outcomes `from..` (`archived`, successes all). Sent by the round's threads as it goes.
struct RoundProgressed {
    round: u64,
    from: usize,
    archived: Vec<(Item, Put)>,
}

impl Message for RoundProgressed {
    type Result = ();
}

impl Handler<RoundProgressed> for Archiver {
    type Result = ();

    fn handle(&mut self, msg: RoundProgressed, _: &mut Context<Self>) {
        // A round's messages come in order; one that arrives after its round's outcome was
        // taken is stale (the outcome carried its segments too).
        if !self.busy || msg.round != self.round || msg.from != self.taken {
            return;
        }
        self.taken += msg.archived.len();
        for (item, put) in msg.archived {
            self.uploaded(item, put);
        }
        self.time_backlog();
        self.check_backlog();
    }
}

impl Handler<GetArchiverStatus> for Archiver {
    type Result = MessageResult<GetArchiverStatus>;

    fn handle(&mut self, _: GetArchiverStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.status.borrow().clone())
    }
}

impl Handler<StopArchiver> for Archiver {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: StopArchiver, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.halted.store(true, Ordering::Release);
        let waiters = self.stopping.get_or_insert_with(Vec::new);
        if self.busy {
            // The upload in flight finishes (its position stored or not); then the actor stops.
            waiters.push(tx);
        } else {
            ctx.stop();
            let _ = tx.send(());
        }
        // Nothing waits for a stopped archiver: appends must not stay refused on its account.
        self.check_backlog();
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}
