//! The file operations under everything else: every one storage makes goes through [`Io`], so
//! that fsync can be turned off for throwaway directories, fsyncs can be counted (the benches
//! and the group-commit test prove batching with the count) and timed, failures are counted by
//! kind ([`StorageMetrics`]), and, under the `failpoints` feature, faults can be injected at
//! named points. Positional reads into fresh or kept buffers ([`Io::pread_exact`],
//! [`Io::pread_append`]) live here too. Without the feature a point's check compiles to nothing, so the read path
//! walsenders use is a bare `pread` and a counter touched only when it fails.
//!
//! Fail points are per [`Wal`](crate::Wal) instance, not global, so tests that run in parallel in
//! one process do not disturb each other; `Wal::open_with_failpoints` hands them to `open`, so
//! recovery's own operations can fail too. While a point is set, every operation passing it
//! fails with the point's OS error before touching the file. The names, and what passes each:
//!
//! - `wal_storage::write::err`: writing WAL bytes into a segment file, zeroing a failed
//!   batch's or a cut tail's bytes, writing a switch segment's copy.
//! - `wal_storage::fsync::err`: fdatasync or fsync of a segment file.
//! - `wal_storage::pointer::err`: writing and syncing the flush pointer.
//! - `wal_storage::prealloc::err`: zero-filling (or, on tmpfs, fallocating) a new segment
//!   file, and its fsync.
//! - `wal_storage::atomic::err`: writing and syncing the temp file of a control, slot or
//!   history file.
//! - `wal_storage::open::err`: opening an existing file: segment files (to read, which is also
//!   how a walsender's `sendfile` gets its descriptor, and to write), the flush pointer, the
//!   lock file, a cut tail's segment.
//! - `wal_storage::create::err`: creating a file or directory: temp files of atomic writes,
//!   preallocation and switch segments, the flush pointer, the data directory and its
//!   subdirectories.
//! - `wal_storage::lock::err`: taking the data directory's lock.
//! - `wal_storage::read::err`: reading bytes or a size: segment files (`pread`, `fstat`),
//!   whole small files (control, slot and history files, each opened and read as one
//!   operation), the flush pointer, whether a file exists.
//! - `wal_storage::readdir::err`: listing `pg_wal`, `slots` or `tmp`.
//! - `wal_storage::rename::err`: renaming a temp file into place.
//! - `wal_storage::link::err`: linking a preallocated segment into `pg_wal`.
//! - `wal_storage::remove::err`: removing a file or directory: retention, dropping a slot,
//!   cutting segments beyond the end, emptying `tmp`, leftovers of a failed operation.
//! - `wal_storage::dirsync::err`: fsync of a directory after entries in it changed.
//!
//! No file is ever shortened in place (a cut zeroes bytes instead, under `write::err`), so
//! there is no truncation point. Two operations are left out on purpose: `fstatfs` (only
//! choosing between fallocate and a zero fill on tmpfs; if it fails the zero fill, which is
//! always right, runs) and `statvfs` (`disk_free_bytes`, a query for `/metrics` that reports
//! its own error). The walsender's `sendfile` (and the positional read it falls back to for a
//! range on a connection that cannot take one) reads a range that
//! [`Wal::locate`](crate::Wal::locate) found, through a descriptor opened here (under
//! `open::err`) after a size check here (under `read::err`): a fault in finding or opening
//! WAL fails `locate`, and the copy itself belongs to the socket's side, in walsender-actor.
//! So the zero-copy path has no open of its own to exempt.
//!
//! Under the same feature a [`PowerLoss`](crate::PowerLoss) recorder may be attached to the
//! fail points (`powerloss.rs` has its model). Every operation that changes a file or a
//! directory, or syncs one, then runs under the recorder's lock and is recorded after it
//! succeeds, so the recorder sees the operations in the order they happened; a sync is
//! recorded only when it really ran (fsync on). This is what the power-loss tests rely on:
//! an operation that bypasses `Io` is an operation the simulated crash cannot take back.
//!
//! Functions that work on a data directory without a `Wal` (`Wal::stored_format`,
//! [`durable::write_atomic`](crate::durable::write_atomic)) use an `Io` of their own, which
//! has no fail points set.

use std::fs::{self, DirEntry, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::metrics::{StorageErrorKind, StorageMetrics};
#[cfg(feature = "failpoints")]
use crate::powerloss::PowerLoss;

/// Runs `$op`; with a power-loss recorder attached, under its lock (failing with `EIO` once
/// the plug is pulled), recording `$rec` with `$r` the recording when `$op` succeeded with a
/// value matching `$v`. Without the feature it is `$op` alone.
#[cfg(feature = "failpoints")]
macro_rules! recorded {
    ($io:expr, $op:expr, |$r:ident, $v:pat_param| $rec:expr) => {
        match $io.failpoints.power_loss() {
            None => $op,
            Some(pl) => {
                let mut $r = pl.begin()?;
                let out = $op;
                if let Ok($v) = &out {
                    $rec;
                }
                out
            }
        }
    };
}

#[cfg(not(feature = "failpoints"))]
macro_rules! recorded {
    ($io:expr, $op:expr, |$r:ident, $v:pat_param| $rec:expr) => {
        $op
    };
}

pub const FP_WRITE: &str = "wal_storage::write::err";
pub const FP_FSYNC: &str = "wal_storage::fsync::err";
pub const FP_POINTER: &str = "wal_storage::pointer::err";
pub const FP_PREALLOC: &str = "wal_storage::prealloc::err";
pub const FP_ATOMIC: &str = "wal_storage::atomic::err";
pub const FP_OPEN: &str = "wal_storage::open::err";
pub const FP_CREATE: &str = "wal_storage::create::err";
pub const FP_LOCK: &str = "wal_storage::lock::err";
pub const FP_READ: &str = "wal_storage::read::err";
pub const FP_READDIR: &str = "wal_storage::readdir::err";
pub const FP_RENAME: &str = "wal_storage::rename::err";
pub const FP_LINK: &str = "wal_storage::link::err";
pub const FP_REMOVE: &str = "wal_storage::remove::err";
pub const FP_DIRSYNC: &str = "wal_storage::dirsync::err";

/// Every fail point, in the order of the list above.
pub const FAILPOINTS: &[&str] = &[
    FP_WRITE,
    FP_FSYNC,
    FP_POINTER,
    FP_PREALLOC,
    FP_ATOMIC,
    FP_OPEN,
    FP_CREATE,
    FP_LOCK,
    FP_READ,
    FP_READDIR,
    FP_RENAME,
    FP_LINK,
    FP_REMOVE,
    FP_DIRSYNC,
];

/// The file-operation layer of one `Wal`. Clones share the counters and the fail points, so
/// the segment read cache can hold its own, and a reopening after a storage failure keeps
/// counting and keeps the faults a test set.
#[derive(Clone, Debug, Default)]
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

    /// An `Io` whose operations fail while `failpoints` says so.
    #[cfg(feature = "failpoints")]
    pub(crate) fn with_failpoints(fsync: bool, failpoints: Arc<Failpoints>) -> Io {
        Io {
            fsync,
            failpoints,
            ..Io::default()
        }
    }

    /// The syncs made so far: the fsync latency histogram counts every one.
    pub(crate) fn fsync_count(&self) -> u64 {
        self.metrics.fsync_seconds.snapshot().count
    }

    #[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
    #[inline(always)]
    pub(crate) fn check(&self, point: &'static str) -> io::Result<()> {
        #[cfg(feature = "failpoints")]
        {
            crate::crash::reached(point);
            self.failpoints.check(point)?;
        }
        Ok(())
    }

    /// Runs `op` unless `point` is set, counting its failure under `kind`.
    #[inline(always)]
    fn run<T>(
        &self,
        kind: StorageErrorKind,
        point: &'static str,
        op: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        self.metrics
            .count(kind, self.check(point).and_then(|_| op()))
    }

    /// Like [`Io::run`], but `op` failing with `absent` is `Ok(None)` and not counted: for
    /// operations where a missing (or already present) file is an answer, not a failure.
    fn run_unless<T>(
        &self,
        kind: StorageErrorKind,
        point: &'static str,
        absent: io::ErrorKind,
        op: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<Option<T>> {
        match self.check(point).and_then(|_| op()) {
            Ok(x) => Ok(Some(x)),
            Err(e) if e.kind() == absent => Ok(None),
            Err(e) => self.metrics.count(kind, Err(e)),
        }
    }

    /// Opens an existing file (or, with `opts` that say so, creates it).
    pub(crate) fn open(&self, path: &Path, opts: &OpenOptions) -> io::Result<File> {
        self.run(StorageErrorKind::Open, FP_OPEN, || {
            recorded!(self, opts.open(path), |r, f| r.opened(path, f, false))
        })
    }

    /// Opens a file, or `None` if it does not exist.
    pub(crate) fn open_if_exists(
        &self,
        path: &Path,
        opts: &OpenOptions,
    ) -> io::Result<Option<File>> {
        let missing = io::ErrorKind::NotFound;
        self.run_unless(StorageErrorKind::Open, FP_OPEN, missing, || {
            recorded!(self, opts.open(path), |r, f| r.opened(path, f, false))
        })
    }

    /// Creates `path` empty (truncating a file already there), open for reading and writing.
    pub(crate) fn create(&self, path: &Path) -> io::Result<File> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(true);
        self.run(StorageErrorKind::Open, FP_CREATE, || {
            recorded!(self, opts.open(path), |r, f| r.opened(path, f, true))
        })
    }

    /// Creates a directory and its missing parents.
    pub(crate) fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.run(StorageErrorKind::Directory, FP_CREATE, || {
            recorded!(self, fs::create_dir_all(path), |r, _| r.created_dirs(path))
        })
    }

    /// Takes an exclusive lock on `f` without waiting; `false` if another holder has it.
    pub(crate) fn try_lock(&self, f: &File) -> io::Result<bool> {
        self.run(StorageErrorKind::Open, FP_LOCK, || match f.try_lock() {
            Ok(()) => Ok(true),
            Err(fs::TryLockError::WouldBlock) => Ok(false),
            Err(fs::TryLockError::Error(e)) => Err(e),
        })
    }

    /// The whole contents of a small file.
    pub(crate) fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.run(StorageErrorKind::Read, FP_READ, || fs::read(path))
    }

    /// The whole contents of a small file, or `None` if it does not exist.
    pub(crate) fn read_file_if_exists(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        let missing = io::ErrorKind::NotFound;
        self.run_unless(StorageErrorKind::Read, FP_READ, missing, || fs::read(path))
    }

    /// Reads `n` bytes of `f` at `offset`; see [`pread_append`].
    #[inline]
    pub(crate) fn pread_exact(&self, f: &File, n: usize, offset: u64) -> io::Result<Bytes> {
        let mut buf = BytesMut::new();
        self.pread_append(f, n, offset, &mut buf)?;
        Ok(buf.freeze())
    }

    /// Appends `n` bytes of `f` at `offset` to `buf`, for a reader that keeps its buffer; see
    /// [`pread_append`].
    #[inline]
    pub(crate) fn pread_append(
        &self,
        f: &File,
        n: usize,
        offset: u64,
        buf: &mut BytesMut,
    ) -> io::Result<()> {
        self.run(StorageErrorKind::Read, FP_READ, || {
            pread_append(f, n, offset, buf)
        })
    }

    /// The size of an open file.
    pub(crate) fn file_len(&self, f: &File) -> io::Result<u64> {
        self.run(StorageErrorKind::Read, FP_READ, || Ok(f.metadata()?.len()))
    }

    /// The size of the file at `path`.
    pub(crate) fn path_len(&self, path: &Path) -> io::Result<u64> {
        self.run(StorageErrorKind::Read, FP_READ, || {
            Ok(fs::metadata(path)?.len())
        })
    }

    /// Whether `path` exists (an error when that cannot be told, unlike `Path::exists`).
    pub(crate) fn exists(&self, path: &Path) -> io::Result<bool> {
        self.run(StorageErrorKind::Read, FP_READ, || path.try_exists())
    }

    /// The entries of a directory, all read before returning.
    pub(crate) fn read_dir(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        self.run(StorageErrorKind::Read, FP_READDIR, || {
            fs::read_dir(dir)?.collect()
        })
    }

    pub(crate) fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.run(StorageErrorKind::Directory, FP_RENAME, || {
            recorded!(self, fs::rename(from, to), |r, _| r.renamed(from, to))
        })
    }

    /// Links `from` at `to`; `false` if `to` already exists (it is left as it is).
    pub(crate) fn hard_link(&self, from: &Path, to: &Path) -> io::Result<bool> {
        let exists = io::ErrorKind::AlreadyExists;
        let linked = self.run_unless(StorageErrorKind::Directory, FP_LINK, exists, || {
            recorded!(self, fs::hard_link(from, to), |r, _| r.linked(from, to))
        })?;
        Ok(linked.is_some())
    }

    /// Removes a file; `false` if it was already gone.
    pub(crate) fn remove_file(&self, path: &Path) -> io::Result<bool> {
        let missing = io::ErrorKind::NotFound;
        let removed = self.run_unless(StorageErrorKind::Directory, FP_REMOVE, missing, || {
            recorded!(self, fs::remove_file(path), |r, _| r.removed(path))
        })?;
        Ok(removed.is_some())
    }

    /// Removes an empty directory.
    pub(crate) fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.run(StorageErrorKind::Directory, FP_REMOVE, || {
            recorded!(self, fs::remove_dir(path), |r, _| r.removed(path))
        })
    }

    pub(crate) fn pwrite_all(
        &self,
        f: &File,
        buf: &[u8],
        offset: u64,
        point: &'static str,
    ) -> io::Result<()> {
        self.run(StorageErrorKind::Write, point, || {
            recorded!(self, f.write_all_at(buf, offset), |r, _| r.wrote(
                f,
                offset,
                &[buf]
            ))
        })
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
        self.run(StorageErrorKind::Write, point, || {
            recorded!(self, pwritev_all(f, bufs, offset), |r, _| r
                .wrote(f, offset, bufs))
        })
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

    /// Gives `f` `len` bytes of (zeroed) space with `fallocate`. `Ok(false)` if the file
    /// system refused, for the caller to write zeros instead; only `point` is an error.
    pub(crate) fn fallocate(&self, f: &File, len: u64, point: &'static str) -> io::Result<bool> {
        self.run(StorageErrorKind::Write, point, || {
            // SAFETY: fallocate on a descriptor the caller owns, over a valid range.
            let op =
                || Ok(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) } == 0);
            recorded!(self, op(), |r, done| if *done {
                r.extended(f, len)
            })
        })
    }

    /// fdatasync: the file's data and the metadata needed to read it back.
    pub(crate) fn sync_data(&self, f: &File, point: &'static str) -> io::Result<()> {
        self.run(StorageErrorKind::Fsync, point, || {
            recorded!(
                self,
                self.timed_sync(|| f.sync_data()),
                |r, _| if self.fsync {
                    r.synced(f)
                }
            )
        })
    }

    /// fsync, for files whose size or name changed.
    pub(crate) fn sync_all(&self, f: &File, point: &'static str) -> io::Result<()> {
        self.run(StorageErrorKind::Fsync, point, || {
            recorded!(
                self,
                self.timed_sync(|| f.sync_all()),
                |r, _| if self.fsync {
                    r.synced(f)
                }
            )
        })
    }

    /// fsync of a directory, after creating, renaming or removing entries in it.
    pub(crate) fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.run(StorageErrorKind::Fsync, FP_DIRSYNC, || {
            let op = || self.timed_sync(|| File::open(dir)?.sync_all());
            recorded!(self, op(), |r, _| if self.fsync {
                r.synced_dir(dir)
            })
        })
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

/// True if `f` is on tmpfs. Not a fail point: a failed `fstatfs` answers false, and the caller
/// then writes zeros, which is right on any file system.
pub(crate) fn on_tmpfs(f: &File) -> bool {
    // SAFETY: fstatfs fills the struct we pass for a descriptor we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } == 0;
    ok && st.f_type as u64 == libc::TMPFS_MAGIC as u64
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

/// Appends `n` bytes at `offset` to `buf` with one `pread` (more only on a short read), without
/// zeroing its spare room first. Fewer bytes mean end of file.
fn pread_append(file: &File, n: usize, offset: u64, buf: &mut BytesMut) -> std::io::Result<()> {
    buf.reserve(n);
    let fd = file.as_raw_fd();
    let base = buf.len();
    while buf.len() - base < n {
        let want = n - (buf.len() - base);
        let done = (buf.len() - base) as u64;
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
    Ok(())
}

/// Named fault-injection points of one `Wal`. While a point is set, every operation passing it
/// fails with the given OS error (for example `libc::ENOSPC`), until it is cleared.
///
/// They may also carry a [`PowerLoss`] recorder ([`Failpoints::record_power_loss`]): the
/// `Wal` that holds them then has its operations recorded.
#[cfg(feature = "failpoints")]
#[derive(Debug, Default)]
pub struct Failpoints {
    points: std::sync::Mutex<std::collections::HashMap<&'static str, i32>>,
    power_loss: std::sync::OnceLock<Arc<PowerLoss>>,
    /// Points where operations wait ([`Failpoints::hold`]) until released, with how many
    /// wait there now.
    held: std::sync::Mutex<std::collections::HashMap<&'static str, usize>>,
    /// Signalled when a point is released and when an operation starts waiting at one.
    changed: std::sync::Condvar,
}

#[cfg(feature = "failpoints")]
impl Failpoints {
    /// Makes every operation passing `point` fail with OS error `errno`.
    ///
    /// # Panics
    ///
    /// If `point` is not one of [`FAILPOINTS`]: a misspelt point would never fire.
    pub fn set(&self, point: &'static str, errno: i32) {
        assert!(
            FAILPOINTS.contains(&point),
            "no fail point is named {point:?}"
        );
        self.lock().insert(point, errno);
    }

    pub fn clear(&self, point: &'static str) {
        self.lock().remove(point);
    }

    /// Makes every operation reaching `point` wait, on its own thread, until
    /// [`Failpoints::release`]: a test holds the writer's fdatasync this way to see what
    /// happens while it runs.
    ///
    /// # Panics
    ///
    /// If `point` is not one of [`FAILPOINTS`].
    pub fn hold(&self, point: &'static str) {
        assert!(
            FAILPOINTS.contains(&point),
            "no fail point is named {point:?}"
        );
        self.lock_held().entry(point).or_insert(0);
    }

    /// Lets the operations waiting at `point` go on.
    pub fn release(&self, point: &'static str) {
        self.lock_held().remove(point);
        self.changed.notify_all();
    }

    /// Waits until an operation waits at the held `point`, at most `timeout`; whether one
    /// does.
    pub fn wait_until_held(&self, point: &'static str, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut held = self.lock_held();
        loop {
            match held.get(point) {
                Some(&n) if n > 0 => return true,
                Some(_) => {}
                None => return false,
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            held = (self.changed.wait_timeout(held, left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn lock_held(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<&'static str, usize>> {
        // Counters cannot be left inconsistent by a panic.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn clear_all(&self) {
        self.lock().clear();
    }

    /// Starts recording the data directory `root` for a simulated power loss: what it holds
    /// now counts as durable. Give these fail points to `Wal::open_with_failpoints` on `root`.
    ///
    /// # Panics
    ///
    /// If these fail points already record: one recorder sees every operation or none.
    pub fn record_power_loss(&self, root: &Path) -> io::Result<Arc<PowerLoss>> {
        let pl = Arc::new(PowerLoss::start(root)?);
        let set = self.power_loss.set(pl.clone());
        assert!(set.is_ok(), "these fail points already record a power loss");
        Ok(pl)
    }

    fn power_loss(&self) -> Option<&PowerLoss> {
        self.power_loss.get().map(|pl| &**pl)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<&'static str, i32>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.points.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self, point: &'static str) -> io::Result<()> {
        let mut held = self.lock_held();
        if let Some(n) = held.get_mut(point) {
            *n += 1;
            self.changed.notify_all();
            while held.contains_key(point) {
                held = self.changed.wait(held).unwrap_or_else(|e| e.into_inner());
            }
        }
        drop(held);
        match self.lock().get(point) {
            Some(&errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in this file's `//!` list, in order.
    fn documented() -> Vec<&'static str> {
        include_str!("io.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! - `"))
            .filter_map(|l| l.split('`').next())
            .collect()
    }

    /// The values of this file's `FP_` constants, in order.
    fn declared() -> Vec<&'static str> {
        include_str!("io.rs")
            .lines()
            .filter(|l| l.starts_with("pub const FP_"))
            .filter_map(|l| l.split('"').nth(1))
            .collect()
    }

    #[test]
    fn the_documented_fail_points_are_the_declared_ones() {
        assert_eq!(documented(), FAILPOINTS);
        assert_eq!(declared(), FAILPOINTS);
        let mut names = FAILPOINTS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FAILPOINTS.len(), "a name is listed twice");
        for name in FAILPOINTS {
            let op = name
                .strip_prefix("wal_storage::")
                .and_then(|n| n.strip_suffix("::err"));
            assert!(op.is_some_and(|op| !op.contains(':')), "{name}");
        }
    }

    /// Calls that do file I/O directly, bypassing `Io`. Each module's code above its tests is
    /// searched; `io.rs` is where they belong, and `metrics.rs`'s `statvfs` is a query for
    /// `/metrics` (see the module docs above). A check by text, so it can be fooled, but it
    /// catches the plain way of adding a file operation.
    #[test]
    fn no_file_operation_bypasses_io() {
        const DIRECT: &[&str] = &[
            "fs::read",
            "fs::write",
            "fs::remove",
            "fs::rename",
            "fs::hard_link",
            "fs::create_dir",
            "fs::metadata",
            "fs::copy",
            "File::open",
            "File::create",
            "FileExt",
            ".metadata()",
            ".exists()",
            ".try_exists()",
            ".sync_all()",
            ".sync_data()",
            ".write_all(",
            ".read_to_end(",
            ".set_len(",
            ".try_lock()",
            "libc::pread",
            "libc::pwrite",
            "libc::fallocate",
            "libc::ftruncate",
        ];
        // Lines of an `OpenOptions` chain: an `.open(` right after one opens directly.
        const CHAIN: &[&str] = &[
            "OpenOptions::new()",
            ".read(",
            ".write(",
            ".create(",
            ".create_new(",
            ".truncate(",
            ".append(",
        ];
        // `needle` in `line`, not as the tail of a longer name (`PointerFile::open`).
        let has = |line: &str, needle: &str| {
            line.match_indices(needle).any(|(i, _)| {
                !line[..i]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        };
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        for entry in fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            // `powerloss.rs` is the test tool that rewrites a directory as a power loss would.
            if name == "io.rs" || name == "metrics.rs" || name == "powerloss.rs" {
                continue;
            }
            let text = fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let mut prev = "";
            for (i, line) in code.lines().enumerate() {
                let line = line.trim();
                if line.starts_with("//") {
                    continue;
                }
                let chained = line.find(".open(").is_some_and(|at| {
                    line[..at].contains("OpenOptions::new()")
                        || (at == 0 && CHAIN.iter().any(|c| prev.starts_with(c)))
                });
                if chained || DIRECT.iter().any(|d| has(line, d)) {
                    found.push(format!("{name}:{}: {line}", i + 1));
                }
                prev = line;
            }
        }
        assert!(
            found.is_empty(),
            "file operations outside Io:\n{}",
            found.join("\n")
        );
    }

    /// Every kind has its own counter, at its index in `StorageErrorKind::ALL`.
    #[test]
    fn error_kinds_index_their_counters() {
        for (i, kind) in StorageErrorKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, i, "{}", kind.as_str());
        }
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn a_set_point_fails_its_operations_until_cleared_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let io = Io::new(true);
        let path = dir.path().join("f");
        io.failpoints.set(FP_CREATE, libc::EIO);
        let err = io.create(&path).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        assert!(!path.exists(), "a failed point does not touch the file");
        assert_eq!(io.metrics.errors(StorageErrorKind::Open), 1);
        // Other points still pass.
        assert!(io
            .open_if_exists(&path, OpenOptions::new().read(true))
            .unwrap()
            .is_none());
        io.failpoints.clear(FP_CREATE);
        let f = io.create(&path).unwrap();
        io.pwrite_all(&f, b"abc", 0, FP_WRITE).unwrap();
        assert_eq!(&io.pread_exact(&f, 3, 0).unwrap()[..], b"abc");
        // A missing file for `remove_file` or an existing one for `hard_link` is an answer.
        assert!(!io.remove_file(&dir.path().join("missing")).unwrap());
        assert!(!io.hard_link(&path, &path).unwrap());
        assert_eq!(io.metrics.errors(StorageErrorKind::Directory), 0);
    }

    #[cfg(feature = "failpoints")]
    #[test]
    #[should_panic(expected = "no fail point is named")]
    fn a_misspelt_point_is_refused() {
        Failpoints::default().set("wal_storage::wirte::err", libc::EIO);
    }
}
