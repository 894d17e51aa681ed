//! What storage counts for the admin API's `/metrics`: how long fsyncs take, which file
//! operations failed and how, and how much room is left on the data directory's file system.
//! The counts are kept by [`Io`](crate::io), which every file operation goes through.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use wal_types::metrics::Histogram;

/// What kind of file operation failed. A full disk is its own kind, whatever the operation,
/// because it is the one an operator fixes differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageErrorKind {
    /// Writing WAL, the flush pointer, a zero fill or a control, slot or history file.
    Write,
    /// fsync or fdatasync of a file or directory.
    Fsync,
    /// Any operation that failed with ENOSPC (or EDQUOT, a quota that is full).
    Enospc,
    /// Reading WAL, a small file, a file's size or a directory's entries.
    Read,
    /// Opening, creating or locking a file.
    Open,
    /// Changing a directory's entries: renaming, linking or removing a file, making or
    /// removing a directory.
    Directory,
}

impl StorageErrorKind {
    pub const ALL: [StorageErrorKind; 6] = [
        StorageErrorKind::Write,
        StorageErrorKind::Fsync,
        StorageErrorKind::Enospc,
        StorageErrorKind::Read,
        StorageErrorKind::Open,
        StorageErrorKind::Directory,
    ];

    /// The `kind` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageErrorKind::Write => "write",
            StorageErrorKind::Fsync => "fsync",
            StorageErrorKind::Enospc => "enospc",
            StorageErrorKind::Read => "read",
            StorageErrorKind::Open => "open",
            StorageErrorKind::Directory => "directory",
        }
    }

    /// The kind of `e`, from the operation that met it.
    fn of(op: StorageErrorKind, e: &io::Error) -> StorageErrorKind {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => StorageErrorKind::Enospc,
            _ => op,
        }
    }
}

/// Storage's counters of one [`Wal`](crate::Wal).
#[derive(Debug, Default)]
pub struct StorageMetrics {
    /// How long each fsync and fdatasync took (none are timed with `fsync = off`).
    pub fsync_seconds: Histogram,
    errors: [AtomicU64; StorageErrorKind::ALL.len()],
    /// The overlapped commit's cut-backs of an unacknowledged tail at stream start: how
    /// many, how many bytes, and how many were refused (below the commit point). Counted
    /// here, on the one object every part of a node shares, since they outlive the
    /// walreceiver that made them.
    tail_cuts: AtomicU64,
    tail_cut_bytes: AtomicU64,
    tail_cut_refusals: AtomicU64,
}

impl StorageMetrics {
    /// Failed operations of this kind so far.
    pub fn errors(&self, kind: StorageErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }

    /// Counts a cut of `bytes` of unacknowledged WAL.
    pub fn count_tail_cut(&self, bytes: u64) {
        self.tail_cuts.fetch_add(1, Ordering::Relaxed);
        self.tail_cut_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a cut refused because it would have gone below the commit point.
    pub fn count_tail_cut_refusal(&self) {
        self.tail_cut_refusals.fetch_add(1, Ordering::Relaxed);
    }

    /// Cuts of an unacknowledged tail so far, and their bytes.
    pub fn tail_cuts(&self) -> (u64, u64) {
        (
            self.tail_cuts.load(Ordering::Relaxed),
            self.tail_cut_bytes.load(Ordering::Relaxed),
        )
    }

    /// Cuts refused so far.
    pub fn tail_cut_refusals(&self) -> u64 {
        self.tail_cut_refusals.load(Ordering::Relaxed)
    }

    /// Counts `r`'s error, if it is one, under the kind `op` and its errno give.
    pub(crate) fn count<T>(&self, op: StorageErrorKind, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            self.errors[StorageErrorKind::of(op, e) as usize].fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

/// The bytes an unprivileged writer may still use on the file system that holds `dir`
/// (`statvfs`'s `f_bavail` blocks of `f_frsize` bytes). It is a system call that may block on
/// a slow or remote file system: call it on a blocking thread, never on an actor's.
pub fn disk_free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and `st` is writable
    // memory of the size statvfs fills.
    let rc = unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // The field types differ between platforms (u32 on some 32-bit ones).
    #[allow(clippy::unnecessary_cast)]
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_counted_by_kind_with_a_full_disk_apart() {
        let m = StorageMetrics::default();
        let _ = m.count(StorageErrorKind::Write, Ok::<(), io::Error>(()));
        let _ = m.count::<()>(StorageErrorKind::Write, Err(io::Error::other("x")));
        let _ = m.count::<()>(
            StorageErrorKind::Fsync,
            Err(io::Error::from_raw_os_error(libc::EIO)),
        );
        let _ = m.count::<()>(
            StorageErrorKind::Write,
            Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        );
        assert_eq!(m.errors(StorageErrorKind::Write), 1);
        assert_eq!(m.errors(StorageErrorKind::Fsync), 1);
        assert_eq!(m.errors(StorageErrorKind::Enospc), 1);
    }

    #[test]
    fn disk_free_is_known_for_a_directory_and_an_error_for_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        assert!(disk_free_bytes(dir.path()).unwrap() > 0);
        assert!(disk_free_bytes(&dir.path().join("missing")).is_err());
    }
}
