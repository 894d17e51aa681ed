//! Where archived files go, and the rule every target keeps: an object is created only if
//! absent, is durable before it counts, and is never overwritten.
//!
//! Each object `NAME` has a checksum sidecar `NAME.crc32c` that a restore checks the object
//! against before it hands the bytes to anyone:
//!
//! ```text
//! crc32c=XXXXXXXX size=N\n      the CRC32C (8 hex digits) and length of NAME's bytes, uncompressed
//! ```
//!
//! The sidecar is put first and the object second, so an object that exists always has its
//! checksum; a sidecar without its object is what a crash between the two leaves, and the
//! retry puts the object beside it. A later compressed object keeps the sidecar of the bytes
//! before compression.
//!
//! A directory target (`file:///path`) puts a file by writing it under a temporary name in
//! the target directory, fsyncing it, linking it to its name (`link` fails if the name
//! exists, so nothing is replaced), removing the temporary name and fsyncing the directory:
//! only then is the put reported. A name that exists is read back: the same bytes count as
//! archived (a retry after a crash), other bytes are [`ArchiveError::Mismatch`].

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use crate::command::ArchiveCommand;
use crate::error::{ArchiveError, Result};

/// An archive, as `archive_target` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArchiveTarget {
    /// `file:///path`: a directory on a file system this node can write.
    Directory(PathBuf),
    /// `archive_command`, PostgreSQL's contract (`command.rs`); it can only put.
    Command(ArchiveCommand),
}

/// What a put found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    /// The object was created.
    Stored,
    /// The object was already there with the same bytes.
    AlreadyThere,
}

impl ArchiveTarget {
    /// Parses `archive_target`. Only `file://` with an absolute path is supported by this
    /// build.
    pub fn parse(target: &str) -> Result<ArchiveTarget> {
        let bad = |reason: &str| ArchiveError::BadTarget {
            target: target.to_string(),
            reason: reason.to_string(),
        };
        match target.split_once("://") {
            Some(("file", path)) if path.starts_with('/') => {
                Ok(ArchiveTarget::Directory(PathBuf::from(path)))
            }
            Some(("file", _)) => Err(bad(
                "a file:// target needs an absolute path (file:///path)",
            )),
            Some((scheme, _)) => Err(bad(&format!(
                "the {scheme}:// scheme is not supported; use file:///path"
            ))),
            None => Err(bad("expected a URL such as file:///path")),
        }
    }

    /// Puts `bytes` as `name` with its checksum sidecar. Blocking: run it on a blocking pool.
    pub fn put(&self, name: &str, bytes: &[u8]) -> Result<Put> {
        match self {
            ArchiveTarget::Directory(dir) => {
                put_file(dir, &format!("{name}.crc32c"), sidecar(bytes).as_bytes())?;
                put_file(dir, name, bytes)
            }
            ArchiveTarget::Command(cmd) => cmd.put(name, bytes),
        }
    }
}

impl ArchiveTarget {
    /// Removes object `name` and then its sidecar, durably; an absent one is not an error.
    /// Only superseded `archive_timeout` prefixes are ever removed. Blocking.
    pub fn remove(&self, name: &str) -> Result<()> {
        match self {
            ArchiveTarget::Directory(dir) => {
                for n in [name.to_string(), format!("{name}.crc32c")] {
                    let path = dir.join(&n);
                    match fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(ArchiveError::io(format!("removing {}", path.display()), e))
                        }
                    }
                }
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| ArchiveError::io(format!("syncing {}", dir.display()), e))
            }
            ArchiveTarget::Command(_) => Err(unreadable()),
        }
    }
}

/// What an `archive_command` answers to anything but a put.
pub(crate) fn unreadable() -> ArchiveError {
    ArchiveError::Unsupported(
        "an archive_command target can only put files: it cannot be listed, read or changed".into(),
    )
}

/// The sidecar's contents for an object of `bytes`.
pub fn sidecar(bytes: &[u8]) -> String {
    format!(
        "crc32c={:08x} size={}\n",
        crc32c::crc32c(bytes),
        bytes.len()
    )
}

/// Creates `dir/name` holding `bytes`, durably, unless it exists (see the module's story).
fn put_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<Put> {
    let target = dir.join(name);
    if let Some(put) = compare_existing(&target, bytes)? {
        return Ok(put);
    }
    // One writer per target directory and name is the archiver's rule; the process id keeps
    // two nodes that share a directory by mistake from writing one temporary file.
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let fail = |what: &str, path: &Path| {
        let context = format!("archiving {name}: {what} {}", path.display());
        move |e| ArchiveError::io(context, e)
    };
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(fail("creating", &tmp))?;
        f.write_all(bytes).map_err(fail("writing", &tmp))?;
        f.sync_all().map_err(fail("syncing", &tmp))?;
        match fs::hard_link(&tmp, &target) {
            Ok(()) => Ok(None),
            // Someone put it between the check and the link: judge what is there.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(Some(())),
            Err(e) => Err(fail("linking into place as", &target)(e)),
        }
    })();
    let _ = fs::remove_file(&tmp);
    if result?.is_some() {
        return compare_existing(&target, bytes)?
            .ok_or_else(|| ArchiveError::io("archiving", ErrorKind::NotFound.into()));
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail("syncing", dir))?;
    Ok(Put::Stored)
}

/// `None` if `target` does not exist; `AlreadyThere` if it holds `bytes`; a mismatch if not.
fn compare_existing(target: &Path, bytes: &[u8]) -> Result<Option<Put>> {
    match fs::read(target) {
        Ok(there) if there == bytes => Ok(Some(Put::AlreadyThere)),
        Ok(_) => Err(ArchiveError::Mismatch {
            path: target.to_path_buf(),
        }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ArchiveError::io(
            format!("reading {} to compare", target.display()),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_as_urls() {
        assert_eq!(
            ArchiveTarget::parse("file:///var/archive").unwrap(),
            ArchiveTarget::Directory("/var/archive".into())
        );
        for bad in ["file://relative", "s3://bucket/prefix", "/var/archive", ""] {
            let e = ArchiveTarget::parse(bad).unwrap_err();
            assert!(matches!(e, ArchiveError::BadTarget { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn a_put_creates_once_with_its_checksum_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        assert_eq!(
            t.put("000000010000000000000001", b"abc").unwrap(),
            Put::Stored
        );
        assert_eq!(
            fs::read(dir.path().join("000000010000000000000001")).unwrap(),
            b"abc"
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("000000010000000000000001.crc32c")).unwrap(),
            format!("crc32c={:08x} size=3\n", crc32c::crc32c(b"abc"))
        );
        // The same bytes again: archived already.
        assert_eq!(
            t.put("000000010000000000000001", b"abc").unwrap(),
            Put::AlreadyThere
        );
        // Other bytes: refused, and the object is untouched.
        let e = t.put("000000010000000000000001", b"abd").unwrap_err();
        assert!(matches!(e, ArchiveError::Mismatch { .. }), "{e}");
        assert_eq!(
            fs::read(dir.path().join("000000010000000000000001")).unwrap(),
            b"abc"
        );
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn a_sidecar_left_by_a_crash_gets_its_object() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("00000002.history.crc32c"), sidecar(b"h")).unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        assert_eq!(t.put("00000002.history", b"h").unwrap(), Put::Stored);
        assert_eq!(fs::read(dir.path().join("00000002.history")).unwrap(), b"h");
    }

    #[test]
    fn an_unwritable_target_fails_the_put() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().join("missing"));
        let e = t.put("000000010000000000000001", b"abc").unwrap_err();
        assert!(matches!(e, ArchiveError::Io { .. }), "{e}");
    }
}
