//! Open-time recovery: making a data directory (`init`, first segment included), opening one
//! (`open`), and finding the end of durable WAL there, as the crate docs' crash-safety argument
//! lays out. Open reads the control data and the flush pointer, scans walserver records forward
//! from a boundary at or below the pointer (the tail scan), records the end as an exact
//! pointer, zeroes the rest of the end's segment and removes later segment files, all before
//! any write is accepted; the [`RecoveryReport`] says what it found and cut.
//!
//! **Invariants:** a record that fails to validate below the vouched end is corruption and
//! open fails; nothing beyond the recovered end survives open (zeroed or removed, then
//! fsynced); `tmp/` is empty and `pg_wal` holds no segment of a newer timeline after it.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};

use crossbeam_channel::Receiver;
use tokio::sync::watch;
use wal_types::{Lsn, SystemId, TimelineId};

use crate::archived::ArchiveHold;
use crate::background::create_segment;
use crate::durable::write_atomic_with;
use crate::early::EarlySends;
use crate::files::{
    encode_envelope, read_control, ControlData, FlushPointer, PointerFile, FILE_VERSION,
};
use crate::format::{Scan, Scanner, StopKind};
use crate::health::{HealthTx, StorageHealth};
use crate::history::{check_history_for, format_history, parse_history};
use crate::io::{Io, FP_FSYNC, FP_WRITE};
use crate::naming::{history_file_name, parse_segment_file_name, segment_file_name};
use crate::recycle::RecyclePool;
use crate::scan::{find_scan_start, first_boundary_from, FileSource};
use crate::segments::{SegmentFiles, View};
use crate::slots::SlotTable;
use crate::state::{BgRequest, Inner, TimelineState, WalPosition};
use crate::told::ToldCommit;
use crate::{HistoryEntry, Result, Role, StorageConfig, WalError, WalFormat};

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
    /// The role recorded in the control data: `Primary` for a new primary, `Standby` for a
    /// standby made from its upstream's identity, so that it stays one even if a crash comes
    /// before its `standby.signal` is written.
    pub role: Role,
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
            role: Role::Primary,
        }
    }
}

/// What open found and did to find the end of durable WAL.
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
    /// Bytes beyond the end that held something and were zeroed (a torn or unconfirmed tail;
    /// where segment files are recycled, also the old WAL of the recycled file that holds the
    /// end).
    pub discarded_bytes: u64,
    /// Segment files beyond the end that held something and were removed (where segment
    /// files are recycled, also recycled files made ready ahead of the end).
    pub removed_segments: Vec<String>,
}

fn io_err(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> WalError {
    let ctx = format!("{what} {}", path.display());
    move |e| WalError::io(ctx, e)
}

fn lock_dir(io: &Io, dir: &Path) -> Result<File> {
    let path = dir.join("walserver.lock");
    let f = io
        .open(
            &path,
            OpenOptions::new().create(true).truncate(false).write(true),
        )
        .map_err(io_err("opening", &path))?;
    if io.try_lock(&f).map_err(io_err("locking", &path))? {
        Ok(f)
    } else {
        Err(WalError::Locked {
            dir: dir.to_path_buf(),
            lock: path,
        })
    }
}

/// Whether `dir` holds a control file.
fn has_control(io: &Io, dir: &Path) -> Result<bool> {
    let path = dir.join("control");
    io.exists(&path).map_err(io_err("looking for", &path))
}

/// What open hands the `Wal` handle: the shared state, ready for the writer thread (which
/// takes the flush pointer and the background thread's queue), and the report of what open
/// found.
pub(crate) struct Recovered {
    pub inner: Arc<Inner>,
    pub pointer: PointerFile,
    pub bg_rx: Receiver<BgRequest>,
    pub report: RecoveryReport,
}

/// Creates a data directory and opens it. Fails if `dir` already holds one.
pub(crate) fn init(dir: &Path, cfg: StorageConfig, opts: InitOptions, io: Io) -> Result<Recovered> {
    cfg.validate()?;
    let seg = cfg.segment_size;
    io.create_dir_all(dir).map_err(io_err("creating", dir))?;
    let lock = lock_dir(&io, dir)?;
    if has_control(&io, dir)? {
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
    let pg_wal = dir.join("pg_wal");
    let tmp = dir.join("tmp");
    let slots = dir.join("slots");
    for d in [&pg_wal, &tmp, &slots] {
        io.create_dir_all(d).map_err(io_err("creating", d))?;
    }
    // The first segment is made here, not left to the writer's preallocation, so that a disk
    // too small for it fails init instead of leaving a directory that cannot take a record.
    // It comes before every file but the lock, so a failure leaves only the directories
    // made above, still empty, which go again: a second init in the same directory starts
    // afresh.
    if let Err(e) = create_segment(
        &io,
        &tmp,
        &pg_wal,
        opts.timeline,
        start.segment_number(seg),
        seg,
    ) {
        for d in [&pg_wal, &tmp, &slots] {
            let _ = io.remove_dir(d);
        }
        return Err(e);
    }
    let mut files = opts.history_files.clone();
    if opts.timeline != TimelineId::FIRST && !files.iter().any(|(t, _)| *t == opts.timeline) {
        files.push((opts.timeline, format_history(&opts.history)));
    }
    for (tli, bytes) in &files {
        parse_history(bytes)?;
        write_atomic_with(&io, &tmp, &pg_wal.join(history_file_name(*tli)), bytes)?;
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
        role: Some(opts.role),
        primary_end: None,
    };
    io.sync_dir(&pg_wal).map_err(io_err("syncing", &pg_wal))?;
    write_atomic_with(
        &io,
        &tmp,
        &dir.join("control"),
        &encode_envelope("control", &control),
    )?;
    open_locked(dir, cfg, Arc::new(lock), io, None)
}

/// Opens a data directory, finding the end of durable WAL (see the crate docs on crash
/// safety) and cutting off whatever lies beyond it.
pub(crate) fn open(dir: &Path, cfg: StorageConfig, io: Io) -> Result<Recovered> {
    cfg.validate()?;
    if !has_control(&io, dir)? {
        return Err(WalError::NotInitialized {
            dir: dir.to_path_buf(),
        });
    }
    let lock = lock_dir(&io, dir)?;
    open_locked(dir, cfg, Arc::new(lock), io, None)
}

/// Opens the data directory of `prev` again after a storage failure, with its lock, its
/// channels and its counters, as an open after a crash would, except that the end is known:
/// `prev`'s flushed end, the last good sync. Records below it are verified as usual; what
/// lies beyond it (the failed batch's bytes, which may or may not be on disk) is cut, zeroed
/// and synced before any write is accepted, so it can never be read or vouched for later.
pub(crate) fn reopen(prev: &Inner) -> Result<Recovered> {
    let known = {
        let st = prev.state();
        (st.tli, st.flushed)
    };
    open_locked(
        &prev.dir,
        prev.cfg.clone(),
        prev.lock.clone(),
        prev.io.clone(),
        Some((prev, known)),
    )
}

/// The control data of an initialized data directory, read without opening it.
pub(crate) fn stored_control(dir: &Path) -> Result<ControlData> {
    // No `Wal` and so no fail points: an `Io` of its own.
    let io = Io::new(true);
    if !has_control(&io, dir)? {
        return Err(WalError::NotInitialized {
            dir: dir.to_path_buf(),
        });
    }
    read_control(&io, &dir.join("control"))
}

/// Reads the data directory with its lock held: control data, flush pointer, slots, the files
/// of `pg_wal`, and the end of durable WAL, cutting what lies beyond it.
///
/// With `prev`, this is a reopening ([`reopen`]): the end is the given one, exactly.
fn open_locked(
    dir: &Path,
    cfg: StorageConfig,
    lock: Arc<File>,
    io: Io,
    prev: Option<(&Inner, (TimelineId, Lsn))>,
) -> Result<Recovered> {
    let control = read_control_of_size(&io, dir, cfg.segment_size)?;
    let seg = cfg.segment_size;
    let pg_wal = dir.join("pg_wal");
    let tmp = dir.join("tmp");
    let slots_dir = dir.join("slots");
    prepare_work_dirs(&io, &tmp, &slots_dir)?;
    let files = SegmentFiles::new(&io, &pg_wal, seg);
    let mut pointer = PointerFile::open(&io, &dir.join("flush_pointer"))?;
    let mut st = TimelineState {
        tli: control.timeline,
        history: Arc::new(control.history.clone()),
        timeline_start: control.timeline_start,
        wal_start: control.wal_start,
        written: control.durable_lsn,
        flushed: control.durable_lsn,
        role: control.role,
        // A reopening after a storage failure keeps what the node was told; a first open
        // knows nothing yet.
        commit: prev.map(|(p, _)| p.state().commit).unwrap_or_default(),
        primary_end: control.primary_end,
    };
    let (on_disk, mut removed_segments) = segments_on_disk(&io, &pg_wal, seg, st.tli)?;
    let known = prev.and_then(|(_, (tli, end))| (tli == st.tli).then_some(end));
    let (vouched, exact) = vouched_end(known, &pointer.last, &st, &control);
    let view = st.view();
    let mut report = find_durable_end(&files, &view, &cfg, &control, &st, vouched, exact)?;
    let end = report.end;

    // Record the end as exact before cutting, so that an interrupted cut is redone the same.
    pointer.store(&io, st.tli, end, true)?;
    report.removed_segments = remove_segments_beyond(&io, &files, &on_disk, st.tli, end, seg)?;
    report.discarded_bytes =
        trim_end_segment(&io, &files, &on_disk, st.tli, end, seg, prev.is_some())?;
    io.sync_dir(&pg_wal).map_err(io_err("syncing", &pg_wal))?;
    removed_segments.append(&mut report.removed_segments);
    report.removed_segments = removed_segments;
    if report.discarded_bytes > 0 || !report.removed_segments.is_empty() {
        tracing::warn!(
            end = %end,
            discarded_bytes = report.discarded_bytes,
            removed = %report.removed_segments.join(", "),
            reason = report.stop_reason.as_deref().unwrap_or(""),
            "cut WAL beyond the durable end"
        );
    }
    st.written = end;
    st.flushed = end;
    st.check_invariants();

    let oldest = oldest_retained(&on_disk, &view, seg, end, st.wal_start);
    let carried = carry_over(prev.map(|(p, _)| p), &io, dir, &slots_dir, &st)?;
    let (bg_tx, bg_rx) = crossbeam_channel::unbounded();
    let recycled = RecyclePool::new(cfg.wal_recycle);
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
        pos_tx: carried.pos_tx,
        slot_released: carried.slot_released,
        slots_moved: carried.slots_moved,
        oldest_retained: AtomicU64::new(oldest.0),
        slots: carried.slots,
        archive: carried.archive,
        told: carried.told,
        early: carried.early,
        bg_tx,
        tail: Default::default(),
        recycled,
        health: carried.health,
        publish_written: carried.publish_written,
        lock,
    });
    Ok(Recovered {
        inner,
        pointer,
        bg_rx,
        report,
    })
}

/// The control data, refused if it was made with another segment size than `segment_size`.
fn read_control_of_size(io: &Io, dir: &Path, segment_size: u64) -> Result<ControlData> {
    let control = read_control(io, &dir.join("control"))?;
    if control.segment_size != segment_size {
        return Err(WalError::SegmentSizeMismatch {
            configured: segment_size,
            stored: control.segment_size,
        });
    }
    Ok(control)
}

/// Makes `tmp/` and `slots/` if missing and empties `tmp/` of the leftovers of interrupted
/// atomic writes and preallocations.
fn prepare_work_dirs(io: &Io, tmp: &Path, slots_dir: &Path) -> Result<()> {
    for d in [tmp, slots_dir] {
        io.create_dir_all(d).map_err(io_err("creating", d))?;
    }
    for e in io.read_dir(tmp).map_err(io_err("listing", tmp))? {
        let p = e.path();
        io.remove_file(&p).map_err(io_err("removing", &p))?;
    }
    Ok(())
}

/// The segment files of `pg_wal`, by timeline and segment number.
type OnDisk = BTreeSet<(TimelineId, u64)>;

/// The segment files in `pg_wal`, and the names of those removed:
/// files of timelines newer than `current` are remnants of an interrupted promotion and go.
fn segments_on_disk(
    io: &Io,
    pg_wal: &Path,
    seg: u64,
    current: TimelineId,
) -> Result<(OnDisk, Vec<String>)> {
    let mut removed = Vec::new();
    let mut on_disk = BTreeSet::new();
    for e in io.read_dir(pg_wal).map_err(io_err("listing", pg_wal))? {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some((tli, segno)) = parse_segment_file_name(&name, seg) {
            if tli > current {
                io.remove_file(&e.path())
                    .map_err(io_err("removing", &e.path()))?;
                removed.push(name);
            } else {
                on_disk.insert((tli, segno));
            }
        }
    }
    Ok((on_disk, removed))
}

/// The durable end the pointer vouches for, and whether it is exact. A pointer of another
/// timeline predates the last switch, whose position the control file holds. A reopening
/// knows the end exactly (`known`), unless a timeline switch failed half-way, when the control
/// file says where it stands.
fn vouched_end(
    known: Option<Lsn>,
    pointer: &FlushPointer,
    st: &TimelineState,
    control: &ControlData,
) -> (Lsn, bool) {
    if let Some(end) = known {
        (end.max(st.timeline_start), true)
    } else if pointer.timeline == st.tli {
        (pointer.end.max(st.timeline_start), pointer.exact)
    } else {
        (control.durable_lsn, true)
    }
}

/// The recovered end, in a report of what was found: for walserver records, `vouched` or,
/// when the pointer was not exact, the end of the valid records scanned past it; for relayed
/// PostgreSQL WAL, `vouched` alone, provided the segment holding the last of its bytes exists.
fn find_durable_end(
    files: &SegmentFiles,
    view: &View,
    cfg: &StorageConfig,
    control: &ControlData,
    st: &TimelineState,
    vouched: Lsn,
    exact: bool,
) -> Result<RecoveryReport> {
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
            scan_records_end(files, view, cfg, st.wal_start, vouched)?
        {
            report.records_end = Some(records_end);
            report.stop_reason = stop;
            if !exact {
                report.end = vouched.max(records_end);
            }
        }
    } else if vouched > st.wal_start {
        let seg = cfg.segment_size;
        let last = Lsn(vouched.0 - 1);
        if files
            .read(view, last, Lsn::MAX, 1)?
            .is_none_or(|b| b.is_empty())
        {
            return Err(WalError::Corruption {
                segment: segment_file_name(st.tli, last.segment_number(seg), seg),
                offset: last.segment_offset(seg),
                reason: "the segment holding durable WAL is missing".into(),
            });
        }
    }
    Ok(report)
}

/// Removes the segment files of timeline `tli` after the one holding `end`; returns the names
/// of those that held something (an all-zero file is a preallocation, not WAL).
fn remove_segments_beyond(
    io: &Io,
    files: &SegmentFiles,
    on_disk: &OnDisk,
    tli: TimelineId,
    end: Lsn,
    seg: u64,
) -> Result<Vec<String>> {
    let end_seg = end.segment_number(seg);
    let mut removed = Vec::new();
    for &(t, segno) in on_disk.iter() {
        if t == tli && segno > end_seg {
            let path = files.path(t, segno);
            if !is_all_zero(io, &path)? {
                removed.push(segment_file_name(t, segno, seg));
            }
            io.remove_file(&path).map_err(io_err("removing", &path))?;
        }
    }
    Ok(removed)
}

/// Cuts the segment file holding `end` to the durable end: a whole file has its tail beyond
/// `end` zeroed and synced (returns the bytes that held something); a short one holding
/// nothing durable is removed, for preallocation to make again; a short one that should hold
/// durable WAL is a bad file.
fn trim_end_segment(
    io: &Io,
    files: &SegmentFiles,
    on_disk: &OnDisk,
    tli: TimelineId,
    end: Lsn,
    seg: u64,
    reopening: bool,
) -> Result<u64> {
    let end_seg = end.segment_number(seg);
    if !on_disk.contains(&(tli, end_seg)) {
        return Ok(0);
    }
    let path = files.path(tli, end_seg);
    let len = io
        .path_len(&path)
        .map_err(io_err("reading the size of", &path))?;
    if len == seg {
        // A reopening after a failed sync zeroes and syncs the tail even if it reads back as
        // zeros: the page cache may show the zeros of an earlier attempt whose sync failed,
        // while the disk still holds the failed batch's bytes.
        return zero_tail(io, &path, end.segment_offset(seg), reopening);
    }
    if end.segment_offset(seg) != 0 {
        return Err(WalError::BadFile {
            path,
            reason: format!("segment file is {len} bytes, expected {seg}"),
        });
    }
    io.remove_file(&path).map_err(io_err("removing", &path))?;
    Ok(0)
}

/// The oldest retained LSN: the start of the first segment present in the current view, or of
/// the end's segment when there is none, never below the start of WAL.
fn oldest_retained(on_disk: &OnDisk, view: &View, seg: u64, end: Lsn, wal_start: Lsn) -> Lsn {
    on_disk
        .iter()
        .filter(|&&(tli, segno)| {
            view.candidates(Lsn(segno * seg), segno, seg)
                .iter()
                .any(|&(t, _)| t == tli)
        })
        .map(|&(_, segno)| Lsn(segno * seg))
        .min()
        .unwrap_or(end.segment_start(seg))
        .max(wal_start)
}

/// The state that outlives a reopening: slots, the archive's hold, the told commit point, the
/// early-send mark, the position and slot watches, and health.
struct Carried {
    slots: Arc<Mutex<SlotTable>>,
    archive: Arc<Mutex<ArchiveHold>>,
    told: Arc<ToldCommit>,
    early: Arc<EarlySends>,
    pos_tx: watch::Sender<WalPosition>,
    slot_released: watch::Sender<u64>,
    slots_moved: watch::Sender<u64>,
    health: HealthTx,
    publish_written: Arc<AtomicBool>,
}

/// A reopening takes `prev`'s slots, archive hold and channels, so that every clone of the
/// handle and every subscriber goes on, and publishes the reopened position on them; a first
/// open loads the slots from `slots_dir` and the archive hold from `dir`, and makes new
/// channels.
fn carry_over(
    prev: Option<&Inner>,
    io: &Io,
    dir: &Path,
    slots_dir: &Path,
    st: &TimelineState,
) -> Result<Carried> {
    Ok(match prev {
        Some(p) => {
            let now = st.position();
            p.pos_tx
                .send_if_modified(|pos| std::mem::replace(pos, now) != now);
            Carried {
                slots: p.slots.clone(),
                archive: p.archive.clone(),
                told: p.told.clone(),
                early: p.early.clone(),
                pos_tx: p.pos_tx.clone(),
                slot_released: p.slot_released.clone(),
                slots_moved: p.slots_moved.clone(),
                health: p.health.clone(),
                publish_written: p.publish_written.clone(),
            }
        }
        None => Carried {
            slots: Arc::new(Mutex::new(SlotTable::load(io, slots_dir)?)),
            archive: Arc::new(Mutex::new(ArchiveHold::load(io, dir)?)),
            told: Arc::new(ToldCommit::load(io, dir)?),
            early: Arc::new(EarlySends::load(io, dir, st.tli)?),
            pos_tx: watch::channel(st.position()).0,
            slot_released: watch::channel(0).0,
            slots_moved: watch::channel(0).0,
            health: watch::channel(StorageHealth::default()).0,
            publish_written: Arc::new(AtomicBool::new(false)),
        },
    })
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
        // No boundary at or below the pointer is left (retention removed the segment the
        // record reaching it began in): the records after it are found from the first
        // boundary after it, or they would be lost though acknowledged.
        None => match first_boundary_from(files, view, vouched, cfg.max_record_size as u64)? {
            Some(b) => b,
            None => return Ok(None),
        },
    };
    let seg = cfg.segment_size;
    let src = FileSource {
        files,
        view,
        limit: Lsn::MAX,
    };
    let mut scanner = Scanner::new(src, seg, cfg.max_record_size, start);
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
fn is_all_zero(io: &Io, path: &Path) -> Result<bool> {
    let f = io
        .open(path, OpenOptions::new().read(true))
        .map_err(io_err("opening", path))?;
    let len = io
        .file_len(&f)
        .map_err(io_err("reading the size of", path))?;
    let mut off = 0;
    while off < len {
        let b = io
            .pread_exact(&f, (1 << 20).min((len - off) as usize), off)
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

/// Zeroes a segment file from `from` to its end if anything there is non-zero (or always,
/// with `always`), fsyncs it, and returns how many bytes up to the last non-zero one were
/// discarded.
fn zero_tail(io: &Io, path: &Path, from: u64, always: bool) -> Result<u64> {
    let f = io
        .open(path, OpenOptions::new().read(true).write(true))
        .map_err(io_err("opening", path))?;
    let len = io
        .file_len(&f)
        .map_err(io_err("reading the size of", path))?;
    let mut last_nonzero = None;
    let mut off = from;
    while off < len {
        let b = io
            .pread_exact(&f, (1 << 20).min((len - off) as usize), off)
            .map_err(io_err("reading", path))?;
        if b.is_empty() {
            break;
        }
        if let Some(i) = b.iter().rposition(|&x| x != 0) {
            last_nonzero = Some(off + i as u64);
        }
        off += b.len() as u64;
    }
    let discarded = match last_nonzero {
        Some(last) => last + 1 - from,
        None if always => 0,
        None => return Ok(0),
    };
    let zero_len = if always {
        len.saturating_sub(from)
    } else {
        discarded
    };
    io.write_zeros(&f, from, zero_len, FP_WRITE)
        .and_then(|_| io.sync_data(&f, FP_FSYNC))
        .map_err(io_err("zeroing the tail of", path))?;
    Ok(discarded)
}
