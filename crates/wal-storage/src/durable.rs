//! Durable file operations: replacing a file so that a crash leaves either its old or its new
//! contents, and removing a file so that the removal survives a crash.
//!
//! Storage replaces its control data, slots and history files this way, and so does anyone else
//! keeping a small file in a data directory (the standby signal, for one); there is one
//! definition of the rule, here. Inside the crate the operations go through the instance's
//! `Io` (fsync switch, fsync count, fail points); the public functions use a plain `Io` that
//! always fsyncs.

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

/// [`write_atomic`] through `io`. The error names the step that failed and its path.
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
    let dir = parent_dir(target);
    let result = (|| -> Result<()> {
        let fail = |what: String| {
            move |e| WalError::io(format!("writing {}: {what}", target.display()), e)
        };
        let f = io
            .create(&tmp)
            .map_err(fail(format!("creating {}", tmp.display())))?;
        io.pwrite_all(&f, bytes, 0, FP_ATOMIC)
            .and_then(|_| io.sync_all(&f, FP_ATOMIC))
            .map_err(fail(format!("writing {}", tmp.display())))?;
        io.rename(&tmp, target)
            .map_err(fail(format!("renaming {} to it", tmp.display())))?;
        io.sync_dir(dir)
            .map_err(fail(format!("syncing {}", dir.display())))
    })();
    if result.is_err() {
        // Gone already once the rename happened.
        let _ = io.remove_file(&tmp);
    }
    result
}

/// [`remove`] through `io`.
pub(crate) fn remove_with(io: &Io, path: &Path) -> Result<()> {
    let removed = io
        .remove_file(path)
        .map_err(|e| WalError::io(format!("removing {}", path.display()), e))?;
    if !removed {
        return Ok(());
    }
    let dir = parent_dir(path);
    io.sync_dir(dir).map_err(|e| {
        WalError::io(
            format!("removing {}: syncing {}", path.display(), dir.display()),
            e,
        )
    })
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
    use std::fs;

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
