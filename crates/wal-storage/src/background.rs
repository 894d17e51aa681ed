//! The background thread: it creates segment files before the writer needs them
//! (preallocation, zero fill), removes WAL nothing needs any more and invalidates slots that
//! would hold too much (retention), and writes slots whose restart point moved (slot
//! persistence). The writer starts and stops it; handles reach it through [`Inner::bg_tx`].
//!
//! **Invariants:** a segment file enters `pg_wal` only whole, zero-filled and durable (made in
//! `tmp/`, linked into place, never replacing a file); retention never removes the segment
//! holding the last durable byte, and it moves `oldest_retained` forward before it removes
//! anything, so a reader is told `SegmentRemoved` rather than finding a file missing.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use crossbeam_channel::Receiver;
use wal_types::{Lsn, TimelineId};

use crate::io::{Io, FP_PREALLOC};
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
    if on_tmpfs(f) {
        io.check(FP_PREALLOC)?;
        // SAFETY: fallocate on a descriptor we own, over a valid range.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) } == 0 {
            return Ok(());
        }
    }
    io.write_zeros(f, 0, len, FP_PREALLOC)
}

fn on_tmpfs(f: &File) -> bool {
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
            slots.persist(inner.slot_paths(), &name)?;
        }
        keep
    };
    let cutoff = Lsn(keep * seg);
    inner.oldest_retained.fetch_max(cutoff.0, Ordering::AcqRel);
    let mut removed = false;
    for e in fs::read_dir(inner.pg_wal())
        .map_err(|e| WalError::io("listing pg_wal", e))?
        .flatten()
    {
        if let Some((_, segno)) = parse_segment_file_name(&e.file_name().to_string_lossy(), seg) {
            if segno < keep {
                match fs::remove_file(e.path()) {
                    Ok(()) => removed = true,
                    // Retention also runs by itself at each segment switch: a pass called at
                    // the same time may have removed the file since it was listed.
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                    Err(err) => {
                        return Err(WalError::io(
                            format!("removing {}", e.path().display()),
                            err,
                        ))
                    }
                }
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
        if let Err(e) = slots.persist(inner.slot_paths(), &name) {
            tracing::warn!(slot = %name, error = %e, "could not persist replication slot");
        }
    }
}
