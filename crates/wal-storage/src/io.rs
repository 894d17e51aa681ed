//! The file operations under everything else: every one that can fail at run time goes through
//! [`Io`], so that fsync can be turned off for throwaway directories, fsyncs can be counted (the
//! benches and the group-commit test prove batching with the count) and timed, failures are
//! counted by kind ([`StorageMetrics`]), and, under the `failpoints`
//! feature, faults can be injected at named points. Positional reads into fresh buffers
//! ([`pread_exact`]) live here too; reads have no fail points.
//!
//! Fail points are per [`Wal`](crate::Wal) instance, not global, so tests that run in parallel in
//! one process do not disturb each other. The names:
//!
//! - `wal_storage::write::err`: writing WAL bytes into a segment file.
//! - `wal_storage::fsync::err`: fdatasync of a segment file.
//! - `wal_storage::pointer::err`: writing the flush pointer.
//! - `wal_storage::prealloc::err`: zero-filling a new segment file.
//! - `wal_storage::atomic::err`: writing a control, slot or history file.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::metrics::{StorageErrorKind, StorageMetrics};

pub const FP_WRITE: &str = "wal_storage::write::err";
pub const FP_FSYNC: &str = "wal_storage::fsync::err";
pub const FP_POINTER: &str = "wal_storage::pointer::err";
pub const FP_PREALLOC: &str = "wal_storage::prealloc::err";
pub const FP_ATOMIC: &str = "wal_storage::atomic::err";

/// The counters and fail points are shared by every opening of one data directory (a restart
/// after a storage failure reopens it), so counts go on and a fault set by a test stays set.
#[derive(Debug, Default)]
pub(crate) struct Io {
    pub(crate) fsync: bool,
    pub(crate) metrics: Arc<StorageMetrics>,
    #[cfg(feature = "failpoints")]
    pub(crate) failpoints: Arc<Failpoints>,
}

impl Io {
    pub(crate) fn new(fsync: bool) -> Io {
        Io {
            fsync,
            ..Io::default()
        }
    }

    /// An `Io` for a reopening: its counters and fail points are `other`'s.
    pub(crate) fn sharing(other: &Io) -> Io {
        Io {
            fsync: other.fsync,
            metrics: other.metrics.clone(),
            #[cfg(feature = "failpoints")]
            failpoints: other.failpoints.clone(),
        }
    }

    /// The syncs made so far: the fsync latency histogram counts every one.
    pub(crate) fn fsync_count(&self) -> u64 {
        self.metrics.fsync_seconds.snapshot().count
    }

    #[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
    pub(crate) fn check(&self, point: &'static str) -> io::Result<()> {
        #[cfg(feature = "failpoints")]
        self.failpoints.check(point)?;
        Ok(())
    }

    /// Counts `r`'s error, if any, as a failed write: for writes made outside `Io`'s own
    /// methods (creating and renaming small files, fallocate).
    pub(crate) fn count_write<T>(&self, r: io::Result<T>) -> io::Result<T> {
        self.metrics.count(StorageErrorKind::Write, r)
    }

    pub(crate) fn pwrite_all(
        &self,
        f: &File,
        buf: &[u8],
        offset: u64,
        point: &'static str,
    ) -> io::Result<()> {
        self.count_write(self.check(point).and_then(|_| f.write_all_at(buf, offset)))
    }

    /// Writes the slices one after another at `offset` with `pwritev` (in groups of at most
    /// IOV_MAX), retrying short writes.
    pub(crate) fn pwritev_all(
        &self,
        f: &File,
        bufs: &[&[u8]],
        offset: u64,
        point: &'static str,
    ) -> io::Result<()> {
        self.count_write(self.check(point).and_then(|_| pwritev_all(f, bufs, offset)))
    }

    /// Zeroes `len` bytes of `f` at `offset`.
    pub(crate) fn write_zeros(
        &self,
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
            self.pwrite_all(f, &ZEROS[..n], offset + done, point)?;
            done += n as u64;
        }
        Ok(())
    }

    /// fdatasync: the file's data and the metadata needed to read it back.
    pub(crate) fn sync_data(&self, f: &File, point: &'static str) -> io::Result<()> {
        let r = self
            .check(point)
            .and_then(|_| self.timed_sync(|| f.sync_data()));
        self.metrics.count(StorageErrorKind::Fsync, r)
    }

    /// fsync, for files whose size or name changed.
    pub(crate) fn sync_all(&self, f: &File, point: &'static str) -> io::Result<()> {
        let r = self
            .check(point)
            .and_then(|_| self.timed_sync(|| f.sync_all()));
        self.metrics.count(StorageErrorKind::Fsync, r)
    }

    /// fsync of a directory, after creating, renaming or removing entries in it.
    pub(crate) fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let r = self.timed_sync(|| File::open(dir)?.sync_all());
        self.metrics.count(StorageErrorKind::Fsync, r)
    }

    /// Runs one sync, counted and timed, unless fsync is off.
    fn timed_sync(&self, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        if !self.fsync {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let r = sync();
        self.metrics.fsync_seconds.observe(started.elapsed());
        r
    }
}

/// Writes the slices one after another at `offset` with `pwritev` (in groups of at most
/// IOV_MAX), retrying short writes.
fn pwritev_all(f: &File, bufs: &[&[u8]], mut offset: u64) -> io::Result<()> {
    const IOV_MAX: usize = 1024;
    let mut bufs: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
    let mut i = 0;
    while i < bufs.len() {
        let iov: Vec<libc::iovec> = bufs[i..]
            .iter()
            .take(IOV_MAX)
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: every iovec points into a live slice of `bufs` for its whole length, and
        // pwritev only reads them.
        let n = unsafe {
            libc::pwritev(
                f.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        let mut n = n as usize;
        offset += n as u64;
        while n > 0 {
            if n >= bufs[i].len() {
                n -= bufs[i].len();
                i += 1;
            } else {
                bufs[i] = &bufs[i][n..];
                n = 0;
            }
        }
    }
    Ok(())
}

/// Reads `n` bytes at `offset` into a new buffer with one `pread` (more only on a short read),
/// without zeroing the buffer first. Fewer bytes mean end of file.
pub(crate) fn pread_exact(file: &File, n: usize, offset: u64) -> std::io::Result<Bytes> {
    let mut buf = BytesMut::with_capacity(n);
    let fd = file.as_raw_fd();
    while buf.len() < n {
        let want = n - buf.len();
        let done = buf.len() as u64;
        let spare = buf.spare_capacity_mut();
        // SAFETY: `spare` is writable memory of at least `want` bytes owned by `buf`; pread
        // writes at most `want` bytes into it, and we mark only the bytes it wrote as initialized.
        let got = unsafe {
            libc::pread(
                fd,
                spare.as_mut_ptr().cast(),
                want,
                (offset + done) as libc::off_t,
            )
        };
        if got < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if got == 0 {
            break;
        }
        // SAFETY: pread initialized `got` bytes past the current length.
        unsafe { buf.set_len(buf.len() + got as usize) };
    }
    Ok(buf.freeze())
}

/// Named fault-injection points of one `Wal`. While a point is set, every operation passing it
/// fails with the given OS error (for example `libc::ENOSPC`), until it is cleared.
#[cfg(feature = "failpoints")]
#[derive(Debug, Default)]
pub struct Failpoints {
    points: std::sync::Mutex<std::collections::HashMap<&'static str, i32>>,
}

#[cfg(feature = "failpoints")]
impl Failpoints {
    pub fn set(&self, point: &'static str, errno: i32) {
        self.lock().insert(point, errno);
    }

    pub fn clear(&self, point: &'static str) {
        self.lock().remove(point);
    }

    pub fn clear_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<&'static str, i32>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.points.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self, point: &'static str) -> io::Result<()> {
        match self.lock().get(point) {
            Some(&errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
}
