//! `walserver restore-wal %f %p`: PostgreSQL's `restore_command` over walserver's archive.
//!
//! PostgreSQL runs it for every file recovery needs, with `%f` the file's name in the archive
//! and `%p` where to put it (`pg_wal/RECOVERYXLOG`, `pg_wal/RECOVERYHISTORY`, relative to the
//! data directory it runs in). It asks for files that do not exist as a matter of course:
//! the history file of the next timeline, to learn whether one exists; the segment after the
//! last one archived, to learn where recovery ends. The contract, as PostgreSQL 15 reads the
//! exit status:
//!
//! - 0: `%p` holds the file, whole and checked against its sidecar. It is written under a
//!   temporary name beside `%p`, fsynced and renamed into place, so `%p` is never partial.
//! - [`EXIT_MISSING`] (1): the archive has no such file. PostgreSQL treats it as the end of
//!   what the archive offers. Only whole segments, history files and a promotion's
//!   `.partial` are served; an `archive_timeout` prefix is no file PostgreSQL asks for.
//! - [`EXIT_FAILED`] (200): the object is damaged or the archive could not be read. Any
//!   status up to 125 would tell PostgreSQL "not in the archive", and a recovery without a
//!   target would then end early at WAL the archive holds and fork a new timeline over it;
//!   above 125 PostgreSQL stops recovery with an error instead, which a person can act on.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use wal_archive::{ArchiveTarget, SIDECAR_SUFFIX};

/// The exit status for a file the archive does not have.
pub const EXIT_MISSING: i32 = 1;
/// The exit status for every failure that is not a missing file (see the module's story).
pub const EXIT_FAILED: i32 = 200;

/// What `restore-wal` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restored {
    /// `dest` now holds the file: this many bytes.
    Written(u64),
    /// The archive has no such file.
    Missing,
}

/// Fetches `name` from `target`, checked, and writes it to `dest` (temporary file, fsync,
/// rename). Nothing is written unless the whole file was fetched and checked.
pub fn restore_wal(target: &ArchiveTarget, name: &str, dest: &Path) -> anyhow::Result<Restored> {
    if !servable(name)? {
        return Ok(Restored::Missing);
    }
    let Some(bytes) = target.get(name)? else {
        return Ok(Restored::Missing);
    };
    write_whole(dest, &bytes).with_context(|| format!("writing {name} to {}", dest.display()))?;
    Ok(Restored::Written(bytes.len() as u64))
}

/// Whether `name` is a file `restore-wal` hands to PostgreSQL. A name that cannot be a
/// file's name in the archive is an error, since only a mistyped `restore_command` gives one.
fn servable(name: &str) -> anyhow::Result<bool> {
    anyhow::ensure!(
        !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\0']),
        "{name:?} is not the name of a file in a WAL archive (restore_command passes %f, the file's name)"
    );
    // An `archive_timeout` prefix (`NAME.partial.EEEEEEEE`, see `ArchivedFile`) is judged by
    // its shape: which offsets are valid depends on a segment size restore-wal is not told.
    let prefix = name
        .get(24..)
        .is_some_and(|rest| rest.starts_with(".partial."));
    Ok(!prefix && !name.ends_with(SIDECAR_SUFFIX))
}

/// Writes `bytes` as `dest` through a temporary file in `dest`'s directory.
fn write_whole(dest: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temporary_beside(dest);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, dest)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    // The rename is durable once the directory is; PostgreSQL renames the file again when it
    // keeps it, but until then a crash should not leave an empty `%p`.
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

fn temporary_beside(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.restore-wal.{}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_files_and_a_promotions_partial_are_served() {
        for name in [
            "000000010000000000000003",
            "00000002.history",
            "000000010000000000000003.partial",
            "000000010000000000000003.00000028.backup",
        ] {
            assert!(servable(name).unwrap(), "{name}");
        }
        for name in [
            "000000010000000000000003.partial.00800000",
            "000000010000000000000003.crc32c",
        ] {
            assert!(!servable(name).unwrap(), "{name}");
        }
        for name in ["", "../x", "a/b", ".000000010000000000000003.1.tmp"] {
            assert!(servable(name).is_err(), "{name:?}");
        }
    }

    #[test]
    fn a_restore_writes_the_checked_file_or_nothing() {
        let archive = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let target = ArchiveTarget::Directory(archive.path().into());
        let name = "000000010000000000000002";
        let dest = out.path().join("RECOVERYXLOG");
        assert_eq!(
            restore_wal(&target, name, &dest).unwrap(),
            Restored::Missing
        );
        assert!(!dest.exists());
        target
            .put(name, b"segment bytes", wal_archive::Compression::None)
            .unwrap();
        assert_eq!(
            restore_wal(&target, name, &dest).unwrap(),
            Restored::Written(13)
        );
        assert_eq!(fs::read(&dest).unwrap(), b"segment bytes");

        // A flipped byte: refused, and an existing %p is left as it was, nothing beside it.
        fs::write(archive.path().join(name), b"segment bytez").unwrap();
        fs::write(&dest, b"older").unwrap();
        let e = format!("{:#}", restore_wal(&target, name, &dest).unwrap_err());
        assert!(e.contains(name) && e.contains("corrupt"), "{e}");
        assert_eq!(fs::read(&dest).unwrap(), b"older");
        assert_eq!(fs::read_dir(out.path()).unwrap().count(), 1);
    }
}
