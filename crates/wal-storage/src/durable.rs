//! Durable file operations: replacing a file so that a crash leaves either its old or its new
//! contents, and removing a file so that the removal survives a crash.
//!
//! Storage replaces its control data, slots and history files this way, and so does anyone else
//! keeping a small file in a data directory (the standby signal, for one); there is one
//! definition of the rule, here. Inside the crate the operations go through the instance's
//! `Io` (fsync switch, fsync count, fail points); the public functions use a plain `Io` that
//! always fsyncs.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use crate::io::{Io, FP_ATOMIC};
use crate::{Result, WalError};

/// Writes `bytes` to `target` so that after a crash `target` holds either the old or the new
/// contents, never a mix: write a temp file `NAME.tmp` in `tmp_dir` (which must be on the same
/// file system as `target`), fsync it, rename it over `target`, fsync the target's directory.
///
/// # Panics
///
/// If `target` has no file name (it is `/` or ends in `..`).
pub fn write_atomic(tmp_dir: &Path, target: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(&Io::new(true), tmp_dir, target, bytes)
}

/// Removes `path` if it exists and fsyncs its directory, so that the file does not come back
/// after a crash. A file that is already gone is not an error.
pub fn remove(path: &Path) -> Result<()> {
    remove_with(&Io::new(true), path)
}

/// [`write_atomic`] through `io`.
pub(crate) fn write_atomic_with(
    io: &Io,
    tmp_dir: &Path,
    target: &Path,
    bytes: &[u8],
) -> Result<()> {
    let name = target
        .file_name()
        .expect("atomic targets are file paths")
        .to_string_lossy();
    let tmp = tmp_dir.join(format!("{name}.tmp"));
    (|| -> std::io::Result<()> {
        let written = io.check(FP_ATOMIC).and_then(|_| {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            Ok(f)
        });
        let f = io.count_write(written)?;
        io.sync_all(&f, FP_ATOMIC)?;
        io.count_write(fs::rename(&tmp, target))?;
        io.sync_dir(parent_dir(target))
    })()
    .map_err(|e| {
        let _ = fs::remove_file(&tmp);
        WalError::io(format!("writing {}", target.display()), e)
    })
}

/// [`remove`] through `io`.
pub(crate) fn remove_with(io: &Io, path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(WalError::io(format!("removing {}", path.display()), e)),
    }
    let dir = parent_dir(path);
    io.sync_dir(dir)
        .map_err(|e| WalError::io(format!("syncing {}", dir.display()), e))
}

/// The directory holding `path`; `.` for a bare file name.
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("tmp");
        fs::create_dir(&tmp).unwrap();
        let target = dir.path().join("f");
        write_atomic(&tmp, &target, b"one").unwrap();
        write_atomic(&tmp, &target, b"two").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"two");
        assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0);
    }

    #[test]
    fn failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        write_atomic(dir.path(), &target, b"old").unwrap();
        // A temp directory that does not exist: the write fails before touching the target.
        let err = write_atomic(&dir.path().join("missing"), &target, b"new").unwrap_err();
        assert!(err.to_string().starts_with("writing "), "{err}");
        assert_eq!(fs::read(&target).unwrap(), b"old");
    }

    #[test]
    fn remove_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        fs::write(&target, b"x").unwrap();
        remove(&target).unwrap();
        assert!(!target.exists());
        remove(&target).unwrap();
        // Something that cannot be removed as a file is an error, named.
        let err = remove(dir.path()).unwrap_err();
        assert!(err.to_string().starts_with("removing "), "{err}");
    }

    #[test]
    fn bare_names_sync_the_current_directory() {
        assert_eq!(parent_dir(Path::new("f")), Path::new("."));
        assert_eq!(parent_dir(Path::new("/a/f")), Path::new("/a"));
    }
}
