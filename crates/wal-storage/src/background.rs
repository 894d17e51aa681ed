//! The background thread: it creates segment files before the writer needs them
//! (preallocation, zero fill), removes WAL nothing needs any more (no slot, no `wal_keep_size`,
//! no archive hold) and invalidates slots that
//! would hold too much (retention), and writes slots whose restart point moved (slot
//! persistence). The writer starts and stops it; handles reach it through [`Inner::bg_tx`].
//!
//! With `wal_recycle` on (the default), retention hands a segment nobody needs to a small
//! pool in `tmp/` instead of removing it, and preallocation links it into place as a later
//! segment, as PostgreSQL recycles its WAL files. A new segment then costs a rename. Made
//! anew it costs 16 MiB of zeros written and flushed on a disk (twice the writes of the WAL
//! itself, for a standby catching up), and removing the old one costs freeing its blocks and
//! pages; on tmpfs, allocating and zeroing pages and freeing them. Measured on a standby
//! catching up 2 GiB (benches/README.md): on the disk, 1.1-1.2 → 2.4-2.6 GB/s and 42% less of
//! the standby's CPU; on tmpfs those two were about 30% of its CPU. A recycled file is whole
//! (every block written and flushed in its earlier life), so WAL written over it is made
//! durable by `fdatasync` alone, as over zeros. It keeps its old bytes past the point where
//! new WAL has been written. They never pass for WAL at the new place: every walserver
//! record and segment header carries its own start LSN, and a recycled file always becomes a
//! later segment than it was, so an old record fails that check where a scan meets it (as
//! PostgreSQL's page headers carry their own address for the same reason); relayed
//! PostgreSQL WAL ends where the flush pointer says, and nothing beyond it is read.
//!
//! **Invariants:** a segment file enters `pg_wal` only whole and durable (made in `tmp/`,
//! linked into place, never replacing a file), zero-filled or recycled from an earlier
//! segment; retention never removes the segment holding the last durable byte, and
//! it moves `oldest_retained` forward before it removes anything, so a reader is told
//! `SegmentRemoved` rather than finding a file missing; a segment file is recycled only if no
//! reader holds it ([`SegmentFiles::retire_below`](crate::segments::SegmentFiles)), so bytes
//! a walsender was handed for `sendfile` never change under it.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use crossbeam_channel::Receiver;
use wal_types::{Lsn, TimelineId};

use crate::io::{on_tmpfs, Io, FP_PREALLOC};
use crate::naming::{parse_segment_file_name, segment_file_name};
use crate::slots::{keep_segno, SlotPaths, SlotTable};
use crate::state::{BgRequest, CommitBound, Inner};
use crate::{Result, WalError};

/// Starts the background thread, which serves `rx` until it reads `Shutdown`.
pub(crate) fn spawn(inner: Arc<Inner>, rx: Receiver<BgRequest>) -> Result<JoinHandle<()>> {
    thread::Builder::new()
        .name("wal-background".into())
        .spawn(move || bg_main(inner, rx))
        .map_err(|e| WalError::io("starting the WAL background thread", e))
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
            BgRequest::PersistCommitPoint => persist_commit_point(&inner),
            BgRequest::PersistEarlySends => persist_early_sends(&inner),
            BgRequest::Shutdown => break,
        }
    }
}

/// Writes the newest commit point the upstream told and publishes it once it is durable
/// (`told.rs`). A failure leaves the published point where it was, the safe side; the next
/// point told queues another try.
fn persist_commit_point(inner: &Inner) {
    match inner.told.persist(&inner.io, &inner.tmp) {
        // The point on disk, read under the state's lock, not the one written: a cut
        // (`told.rs`) may have lowered it since.
        Ok(Some(_)) => inner.update_commit(|old| match old {
            CommitBound::Told(o) => {
                CommitBound::Told(o.max(inner.told.persisted().unwrap_or(Lsn::INVALID)))
            }
            other => other,
        }),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, "could not store the commit point; readers stay at the last one stored")
        }
    }
}

/// Writes the early-send mark wanted (`early.rs`) and, once it is durable, wakes every
/// subscriber of the position: a walsender held at the flushed end looks again and may now
/// send early. A failure leaves the walsenders at the flushed end, the safe side; the next
/// batch a walsender could send early asks again.
fn persist_early_sends(inner: &Inner) {
    match inner.early.persist(&inner.io, &inner.tmp) {
        Ok(Some(tli)) => {
            tracing::debug!(timeline = %tli, "recorded early sends");
            inner.announce();
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, "could not record early sends; walsenders keep the flushed limit")
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
    if on_tmpfs(f) && io.fallocate(f, len, FP_PREALLOC)? {
        return Ok(());
    }
    io.write_zeros(f, 0, len, FP_PREALLOC)
}

/// Makes segment `segno` of `tli`: from a recycled file if the pool has one, else a new
/// zero-filled one ([`create_segment`]).
fn preallocate(inner: &Inner, tli: TimelineId, segno: u64) -> Result<File> {
    let seg = inner.cfg.segment_size;
    while let Some(old) = inner.recycled.take() {
        match recycle_segment(&inner.io, &old, inner.pg_wal(), tli, segno, seg) {
            Ok(f) => {
                inner.recycled.count_reuse();
                return Ok(f);
            }
            Err(e) => {
                // The pool is an optimisation: a file that cannot be reused is removed and
                // the segment is made new.
                tracing::warn!(error = %e, "could not reuse a recycled WAL segment; making a new one");
                let _ = inner.io.remove_file(&old);
            }
        }
    }
    create_segment(&inner.io, &inner.tmp, inner.pg_wal(), tli, segno, seg)
}

/// Links the pool's file `old` into `pg_wal` as segment `segno` of `tli`, the way
/// [`create_segment`] links a new one: under its final name, never replacing a file there,
/// then the directory is synced. The file is already whole (a former segment, all its
/// pages in place), so there is nothing to fill.
fn recycle_segment(
    io: &Io,
    old: &Path,
    pg_wal: &Path,
    tli: TimelineId,
    segno: u64,
    seg: u64,
) -> Result<File> {
    let name = segment_file_name(tli, segno, seg);
    let target = pg_wal.join(&name);
    let ctx = format!("recycling a WAL segment as {name}");
    let fail = |what: &str, path: &Path| step_error(&ctx, what, path);
    let len = io.path_len(old).map_err(fail("reading the size of", old))?;
    if len != seg {
        return Err(WalError::io(
            ctx,
            io::Error::other(format!("{} is {len} bytes, not {seg}", old.display())),
        ));
    }
    let f = io
        .open(old, OpenOptions::new().read(true).write(true))
        .map_err(fail("opening", old))?;
    install(io, f, old, pg_wal, &target, fail)
}

/// The error of one step of making a segment: what it did and to which path.
fn step_error(ctx: &str, what: &str, path: &Path) -> impl FnOnce(io::Error) -> WalError {
    let ctx = format!("{ctx}: {what} {}", path.display());
    move |e| WalError::io(ctx, e)
}

/// Links the whole segment file `f`, at `from` outside `pg_wal`, into `pg_wal` as `target`,
/// never replacing a file there, removes `from` and syncs the directory. If `target` exists
/// it was made by an earlier request and entered `pg_wal` whole as well: that one is opened
/// and returned.
fn install<E: FnOnce(io::Error) -> WalError>(
    io: &Io,
    f: File,
    from: &Path,
    pg_wal: &Path,
    target: &Path,
    fail: impl Fn(&str, &Path) -> E,
) -> Result<File> {
    let linked = io
        .hard_link(from, target)
        .map_err(fail("linking into place", from))?;
    io.remove_file(from).map_err(fail("removing", from))?;
    if !linked {
        return io
            .open(target, OpenOptions::new().read(true).write(true))
            .map_err(fail("opening", target));
    }
    io.sync_dir(pg_wal).map_err(fail("syncing", pg_wal))?;
    Ok(f)
}

/// [`preallocate`] without a running `Wal`: `init` makes the first segment with it before it
/// writes the control file, so that a data directory too small for one segment is never
/// reported as initialised.
pub(crate) fn create_segment(
    io: &Io,
    tmp_dir: &Path,
    pg_wal: &Path,
    tli: TimelineId,
    segno: u64,
    seg: u64,
) -> Result<File> {
    let name = segment_file_name(tli, segno, seg);
    let tmp = tmp_dir.join(format!("{name}.prealloc"));
    let target = pg_wal.join(&name);
    let ctx = format!("preallocating WAL segment {name}");
    let fail = |what: &str, path: &Path| step_error(&ctx, what, path);
    let result = (|| -> Result<File> {
        let f = io.create(&tmp).map_err(fail("creating", &tmp))?;
        zero_fill(io, &f, seg)
            .and_then(|_| io.sync_all(&f, FP_PREALLOC))
            .map_err(fail("zero-filling", &tmp))?;
        install(io, f, &tmp, pg_wal, &target, fail)
    })();
    if result.is_err() {
        let _ = io.remove_file(&tmp);
    }
    result
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
        // WAL goes only below where every slot's file says it restarts: a crash brings a slot
        // back as its file says, and its WAL from there must still be on disk. So the slots
        // that moved are written first (PostgreSQL's checkpoint saves slots before it removes
        // WAL for the same reason); one that cannot be written holds its old WAL.
        persist_dirty(&mut slots, inner.slot_paths());
        let keep = keep_segno(flushed, slots.min_kept_lsn(), &inner.cfg).min(last_byte_seg);
        let cutoff = Lsn(keep * seg);
        let doomed: Vec<String> = slots
            .slots
            .iter()
            .filter(|(_, s)| !s.invalidated && s.restart_lsn.is_some_and(|r| r < cutoff))
            .map(|(n, _)| n.clone())
            .collect();
        for name in doomed {
            let s = slots.slots.get_mut(&name).expect("listed above");
            tracing::warn!(slot = %name, restart_lsn = %s.restart_lsn.unwrap_or(Lsn::INVALID), "invalidating replication slot: it exceeds max_slot_wal_keep_size");
            s.invalidated = true;
            s.dirty = true;
            slots.persist(inner.slot_paths(), &name)?;
        }
        keep
    };
    // The archive's hold keeps files only: a slot beyond `max_slot_wal_keep_size` was
    // invalidated above as it would be without an archive.
    let keep = match inner.archive().keep_segno(seg) {
        Some(archive) => keep.min(archive),
        None => keep,
    };
    let cutoff = Lsn(keep * seg);
    inner.oldest_retained.fetch_max(cutoff.0, Ordering::AcqRel);
    // From here no reader is handed a file below `keep`; those already handed out are named.
    let held = inner.files.retire_below(keep);
    let mut removed = false;
    let pg_wal = inner.pg_wal();
    let entries = (inner.io)
        .read_dir(pg_wal)
        .map_err(|e| WalError::io(format!("listing {}", pg_wal.display()), e))?;
    for e in entries {
        if let Some((tli, segno)) = parse_segment_file_name(&e.file_name().to_string_lossy(), seg) {
            if segno < keep {
                // Retention runs on the background thread at each segment switch and also when
                // a caller asks (`Wal::run_retention`); two runs may list the same file, and
                // the one that finds it gone has nothing left to do.
                let path = e.path();
                if !held.contains(&(tli, segno))
                    && inner
                        .recycled
                        .put(&inner.io, &inner.tmp, &path)
                        .map_err(|err| WalError::io(format!("recycling {}", path.display()), err))?
                {
                    removed = true;
                    continue;
                }
                removed |= (inner.io)
                    .remove_file(&path)
                    .map_err(|err| WalError::io(format!("removing {}", path.display()), err))?;
            }
        }
    }
    if removed {
        inner
            .io
            .sync_dir(pg_wal)
            .map_err(|e| WalError::io(format!("syncing {}", pg_wal.display()), e))?;
    }
    Ok(())
}

pub(crate) fn persist_dirty_slots(inner: &Inner) {
    persist_dirty(&mut inner.slots(), inner.slot_paths());
}

/// Writes every persistent slot that moved since it was last written; a failure is logged,
/// and the slot's file keeps holding retention where it was.
fn persist_dirty(slots: &mut SlotTable, paths: SlotPaths<'_>) {
    let dirty: Vec<String> = slots
        .slots
        .iter()
        .filter(|(_, s)| s.dirty && !s.temporary)
        .map(|(n, _)| n.clone())
        .collect();
    for name in dirty {
        if let Err(e) = slots.persist(paths, &name) {
            tracing::warn!(slot = %name, error = %e, "could not persist replication slot");
        }
    }
}
