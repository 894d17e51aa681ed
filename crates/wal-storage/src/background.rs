//! The background thread: it creates segment files before the writer needs them
//! (preallocation, zero fill), removes WAL nothing needs any more and invalidates slots that
//! would hold too much (retention), and writes slots whose restart point moved (slot
//! persistence). The writer starts and stops it; handles reach it through [`Inner::bg_tx`].
//!
//! **Invariants:** a segment file enters `pg_wal` only whole, zero-filled and durable (made in
//! `tmp/`, linked into place, never replacing a file); retention never removes the segment
//! holding the last durable byte, and it moves `oldest_retained` forward before it removes
//! anything, so a reader is told `SegmentRemoved` rather than finding a file missing.

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
use crate::slots::keep_segno;
use crate::state::{BgRequest, Inner};
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
    if on_tmpfs(f) && io.fallocate(f, len, FP_PREALLOC)? {
        return Ok(());
    }
    io.write_zeros(f, 0, len, FP_PREALLOC)
}

/// Creates a zero-filled segment file outside `pg_wal`, makes it durable, then links it into
/// `pg_wal` under its final name (never replacing a file there) and fsyncs the directory.
fn preallocate(inner: &Inner, tli: TimelineId, segno: u64) -> Result<File> {
    create_segment(
        &inner.io,
        &inner.tmp,
        inner.pg_wal(),
        tli,
        segno,
        inner.cfg.segment_size,
    )
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
    // Each step's error names what it did and to which path.
    let fail = |what: &str, path: &Path| {
        let ctx = format!(
            "preallocating WAL segment {name}: {what} {}",
            path.display()
        );
        move |e| WalError::io(ctx, e)
    };
    let result = (|| -> Result<File> {
        let f = io.create(&tmp).map_err(fail("creating", &tmp))?;
        zero_fill(io, &f, seg)
            .and_then(|_| io.sync_all(&f, FP_PREALLOC))
            .map_err(fail("zero-filling", &tmp))?;
        let linked = io
            .hard_link(&tmp, &target)
            .map_err(fail("linking into place", &tmp))?;
        io.remove_file(&tmp).map_err(fail("removing", &tmp))?;
        if !linked {
            // Made by an earlier request; it entered pg_wal whole, like this one would have.
            return io
                .open(&target, OpenOptions::new().read(true).write(true))
                .map_err(fail("opening", &target));
        }
        io.sync_dir(pg_wal).map_err(fail("syncing", pg_wal))?;
        Ok(f)
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
            tracing::warn!(slot = %name, restart_lsn = %s.restart_lsn.unwrap_or(Lsn::INVALID), "invalidating replication slot: it exceeds max_slot_wal_keep_size");
            s.invalidated = true;
            s.dirty = true;
            slots.persist(inner.slot_paths(), &name)?;
        }
        keep
    };
    let cutoff = Lsn(keep * seg);
    inner.oldest_retained.fetch_max(cutoff.0, Ordering::AcqRel);
    let mut removed = false;
    let pg_wal = inner.pg_wal();
    let entries = (inner.io)
        .read_dir(pg_wal)
        .map_err(|e| WalError::io(format!("listing {}", pg_wal.display()), e))?;
    for e in entries {
        if let Some((_, segno)) = parse_segment_file_name(&e.file_name().to_string_lossy(), seg) {
            if segno < keep {
                // Retention runs on the background thread at each segment switch and also when
                // a caller asks (`Wal::run_retention`); two runs may list the same file, and
                // the one that finds it gone has nothing left to do.
                let path = e.path();
                removed |= (inner.io)
                    .remove_file(&path)
                    .map_err(|err| WalError::io(format!("removing {}", path.display()), err))?;
            }
        }
    }
    if removed {
        inner.files.evict(|_, s| s < keep);
        inner
            .io
            .sync_dir(pg_wal)
            .map_err(|e| WalError::io(format!("syncing {}", pg_wal.display()), e))?;
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
        if let Err(e) = slots.persist(inner.slot_paths(), &name) {
            tracing::warn!(slot = %name, error = %e, "could not persist replication slot");
        }
    }
}
