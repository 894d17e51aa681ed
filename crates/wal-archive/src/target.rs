//! Where archived files go, and the rule every target keeps: an object is created only if
//! absent, is durable before it counts, and is never overwritten.
//!
//! Each file `NAME` has a checksum sidecar `NAME.crc32c` that a restore checks the file
//! against before it hands the bytes to anyone:
//!
//! ```text
//! crc32c=XXXXXXXX size=N\n      the CRC32C (8 hex digits) and length of NAME's bytes, uncompressed
//! ```
//!
//! The sidecar is put first and the object second, so an object that exists always has its
//! checksum; a sidecar without its object is what a crash between the two leaves, and the
//! retry puts the object beside it. A compressed object is `NAME.zst` (see `compression.rs`)
//! and keeps the sidecar of the bytes before compression.
//!
//! Every target offers the same two steps, and [`ArchiveTarget::put`] builds the rule from
//! them: create a name only if it is absent, and read what a name holds. A name that exists
//! (the create found it taken) is judged by its contents after decompression: the same
//! bytes count as archived (a retry after a crash, or a second node archiving the same WAL),
//! other bytes are [`ArchiveError::Mismatch`]. A put of a new file costs one read (of its
//! other stored form) and two creates (sidecar, object). One file has one stored form: with compression on, a file the
//! archive already holds uncompressed counts as archived if its bytes are the same (and the
//! other way round), instead of a second object beside it.
//!
//! A directory target (`file:///path`) creates a file by writing it under a temporary name in
//! the target directory, fsyncing it, linking it to its name (`link` fails if the name
//! exists, so nothing is replaced), removing the temporary name and fsyncing the directory:
//! only then is the put reported. An S3 target (`s3://bucket/prefix`, `s3.rs`) creates with a
//! conditional PUT, which the store must honour: before its first upload an archiver checks
//! that it does ([`ArchiveTarget::check_create_if_absent`]), and archives nothing to a store
//! that does not.

/// The name of the create-if-absent probe's objects, `walserver.probe.<system>.<random>`:
/// no WAL file has a name of this shape, and each probe has a name of its own.
pub const PROBE_PREFIX: &str = "walserver.probe.";

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::command::ArchiveCommand;
use crate::compression::Compression;
use crate::error::{ArchiveError, Result};
use crate::s3::{S3Options, S3Target};

/// An archive, as `archive_target` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArchiveTarget {
    /// `file:///path`: a directory on a file system this node can write.
    Directory(PathBuf),
    /// `archive_command`, PostgreSQL's contract (`command.rs`); it can only put.
    Command(ArchiveCommand),
    /// `s3://bucket/prefix`: a bucket of an S3-compatible object store.
    S3(S3Target),
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
    /// Parses `archive_target` with no `[archive]` settings (an `s3://` target then fails
    /// for want of credentials).
    pub fn parse(target: &str) -> Result<ArchiveTarget> {
        ArchiveTarget::parse_with(target, &S3Options::default())
    }

    /// Parses `archive_target`, `file:///path` or `s3://bucket/prefix`, an `s3://` one with
    /// `options`. Checks the text only: nothing is reached.
    pub fn parse_with(target: &str, options: &S3Options) -> Result<ArchiveTarget> {
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
            Some(("s3", rest)) => S3Target::parse(rest, options)
                .map(ArchiveTarget::S3)
                .map_err(|reason| bad(&reason)),
            Some((scheme, _)) => Err(bad(&format!(
                "the {scheme}:// scheme is not supported; use file:///path or s3://bucket/prefix"
            ))),
            None => Err(bad(
                "expected a URL such as file:///path or s3://bucket/prefix",
            )),
        }
    }

    /// Puts the file `name` holding `bytes`, stored with `compression`, with its checksum
    /// sidecar. Blocking: run it on a blocking pool. Uncompressed, `bytes` themselves are the
    /// request's body: a segment is not copied on its way to the store.
    pub fn put(
        &self,
        name: &str,
        bytes: impl Into<Bytes>,
        compression: Compression,
    ) -> Result<Put> {
        let bytes: Bytes = bytes.into();
        if let ArchiveTarget::Command(cmd) = self {
            // PostgreSQL's contract hands the command the file as it is; the command keeps
            // its own checksums and compression.
            return cmd.put(name, &bytes);
        }
        self.put_object(
            &format!("{name}.crc32c"),
            &Bytes::from(sidecar(&bytes)),
            Compression::None,
        )?;
        // The other stored forms first: one file, one object.
        for other in Compression::ALL
            .into_iter()
            .filter(|c| !c.same_form(compression))
        {
            if let Some(put) = self.judge(name, &bytes, other)? {
                return Ok(put);
            }
        }
        self.put_object(name, &bytes, compression)
    }

    /// Creates `name`'s object stored with `compression` unless it exists, and judges what
    /// is there if it does. The create comes first, without a read before it: a create-only
    /// put that fails says the name exists, so the usual case (a new name) costs one request,
    /// and only a retry or a second writer reads.
    fn put_object(&self, name: &str, bytes: &Bytes, compression: Compression) -> Result<Put> {
        let object = compression.object_name(name);
        let stored = compression.encode(bytes)?;
        let created = match self {
            ArchiveTarget::Directory(dir) => create_file(dir, &object, &stored),
            ArchiveTarget::S3(s3) => s3.create(&object, stored.clone()),
            ArchiveTarget::Command(_) => return Err(unreadable()),
        };
        compression.give_back(stored);
        let created = created?;
        if created {
            return Ok(Put::Stored);
        }
        // The name exists: judge what is there.
        self.judge(name, bytes, compression)?.ok_or_else(|| {
            ArchiveError::io(
                format!("archiving {object}"),
                std::io::Error::other("the name was taken, then found empty"),
            )
        })
    }

    /// `None` if `name` has no object stored with `compression`; `AlreadyThere` if it holds
    /// `bytes`; a mismatch if it holds anything else (also if it does not decompress).
    fn judge(&self, name: &str, bytes: &[u8], compression: Compression) -> Result<Option<Put>> {
        let object = compression.object_name(name);
        let Some(stored) = self.read(&object)? else {
            return Ok(None);
        };
        match compression.decode(&stored, bytes.len() as u64) {
            Ok(there) if there == bytes => Ok(Some(Put::AlreadyThere)),
            _ => Err(ArchiveError::Mismatch {
                object: self.describe(&object),
            }),
        }
    }

    /// The object `object`'s stored bytes, `None` if there is none. Blocking.
    pub fn read(&self, object: &str) -> Result<Option<Vec<u8>>> {
        #[cfg(test)]
        tests::READS.with(|r| r.set(r.get() + 1));
        match self {
            ArchiveTarget::Directory(dir) => {
                let path = dir.join(object);
                match fs::read(&path) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(ArchiveError::io(format!("reading {}", path.display()), e)),
                }
            }
            ArchiveTarget::S3(s3) => Ok(s3.read(object)?.map(|b| b.to_vec())),
            ArchiveTarget::Command(_) => Err(unreadable()),
        }
    }

    /// Checks that the target creates a name only if it is absent, as every put here assumes:
    /// on S3, a probe object (named for `system_id`, with a random suffix) is created twice
    /// with `If-None-Match: *` and removed; a second create that succeeds is
    /// [`ArchiveError::NoCreateIfAbsent`]. A directory's `link(2)` never replaces a name, and
    /// an `archive_command` keeps its own rule: nothing to check. Blocking.
    pub fn check_create_if_absent(&self, system_id: wal_types::SystemId) -> Result<()> {
        let ArchiveTarget::S3(s3) = self else {
            return Ok(());
        };
        let probe = format!("{PROBE_PREFIX}{system_id}.{:016x}", rand::random::<u64>());
        if s3.honours_create_if_absent(&probe)? {
            return Ok(());
        }
        Err(ArchiveError::NoCreateIfAbsent {
            archive: self.describe(""),
            probe,
        })
    }

    /// Where the object `object` is, for messages: a path or an `s3://` URL.
    pub fn describe(&self, object: &str) -> String {
        match self {
            ArchiveTarget::Directory(dir) => dir.join(object).display().to_string(),
            ArchiveTarget::S3(s3) => s3.url_of(object),
            ArchiveTarget::Command(_) => object.to_string(),
        }
    }
}

impl ArchiveTarget {
    /// Removes the file `name` (each stored form of it) and then its sidecar, durably; an
    /// absent one is not an error. Only superseded `archive_timeout` objects are ever
    /// removed (`names.rs`). Blocking.
    pub fn remove(&self, name: &str) -> Result<()> {
        let objects = Compression::ALL
            .map(|c| c.object_name(name))
            .into_iter()
            .chain([format!("{name}.crc32c")]);
        match self {
            ArchiveTarget::Directory(dir) => {
                for n in objects {
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
            ArchiveTarget::S3(s3) => objects.into_iter().try_for_each(|n| s3.delete(&n)),
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

/// Creates `dir/name` holding `bytes`, durably, unless it exists: `false` if it does (see
/// the module's story).
fn create_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<bool> {
    let target = dir.join(name);
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
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(fail("linking into place as", &target)(e)),
        }
    })();
    let _ = fs::remove_file(&tmp);
    if !result? {
        return Ok(false);
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail("syncing", dir))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// How many reads this thread's puts made, to hold a put of a new file to its cost.
        pub(super) static READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    fn reads_during<T>(f: impl FnOnce() -> T) -> (T, u64) {
        let before = READS.with(|r| r.get());
        let out = f();
        (out, READS.with(|r| r.get()) - before)
    }

    #[test]
    fn a_put_of_a_new_file_reads_only_its_other_stored_form() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        for (i, c) in Compression::ALL.into_iter().enumerate() {
            let name = format!("0000000100000000000000{:02X}", i + 1);
            let (put, reads) = reads_during(|| t.put(&name, &b"abc"[..], c).unwrap());
            assert_eq!((put, reads), (Put::Stored, 1), "{c:?}");
            // Again: both creates find their names taken and read what is there.
            let (put, reads) = reads_during(|| t.put(&name, &b"abc"[..], c).unwrap());
            assert_eq!((put, reads), (Put::AlreadyThere, 3), "{c:?}");
        }
    }

    #[test]
    fn targets_parse_as_urls() {
        assert_eq!(
            ArchiveTarget::parse("file:///var/archive").unwrap(),
            ArchiveTarget::Directory("/var/archive".into())
        );
        for bad in [
            "file://relative",
            "s3://bucket/prefix",
            "s3://",
            "gs://b",
            "/var/archive",
            "",
        ] {
            let e = ArchiveTarget::parse(bad).unwrap_err();
            assert!(matches!(e, ArchiveError::BadTarget { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn a_put_creates_once_with_its_checksum_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        assert_eq!(
            t.put("000000010000000000000001", &b"abc"[..], Compression::None)
                .unwrap(),
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
            t.put("000000010000000000000001", &b"abc"[..], Compression::None)
                .unwrap(),
            Put::AlreadyThere
        );
        // Other bytes: refused, and the object is untouched.
        let e = t
            .put("000000010000000000000001", &b"abd"[..], Compression::None)
            .unwrap_err();
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
        assert_eq!(
            t.put("00000002.history", &b"h"[..], Compression::None)
                .unwrap(),
            Put::Stored
        );
        assert_eq!(fs::read(dir.path().join("00000002.history")).unwrap(), b"h");
    }

    #[test]
    fn an_unwritable_target_fails_the_put() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().join("missing"));
        let e = t
            .put("000000010000000000000001", &b"abc"[..], Compression::None)
            .unwrap_err();
        assert!(matches!(e, ArchiveError::Io { .. }), "{e}");
    }

    fn s3_options(server: &pg_testkit::SeaweedServer) -> S3Options {
        S3Options {
            endpoint: Some(server.endpoint()),
            allow_http: true,
            access_key_id: Some(pg_testkit::SEAWEED_ACCESS_KEY_ID.into()),
            secret_access_key: Some(pg_testkit::SEAWEED_SECRET_ACCESS_KEY.into()),
            ..S3Options::default()
        }
    }

    #[test]
    fn s3_targets_parse_with_their_settings() {
        let o = S3Options {
            endpoint: Some("https://s3.example".into()),
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
            ..S3Options::default()
        };
        let ArchiveTarget::S3(t) = ArchiveTarget::parse_with("s3://b/a/p/", &o).unwrap() else {
            panic!("not s3")
        };
        assert_eq!((t.bucket(), t.prefix()), ("b", "a/p"));
        assert_eq!(t.url_of("x"), "s3://b/a/p/x");
        let ArchiveTarget::S3(t) = ArchiveTarget::parse_with("s3://b", &o).unwrap() else {
            panic!("not s3")
        };
        assert_eq!(t.url_of("x"), "s3://b/x");
        // The secret never shows.
        assert!(!format!("{t:?}").contains("\"s\""), "{t:?}");
        for (url, o, needle) in [
            ("s3://b/p", S3Options::default(), "credentials"),
            (
                "s3://b/p",
                S3Options {
                    endpoint: Some("http://127.0.0.1:1".into()),
                    ..o.clone()
                },
                "allow_http",
            ),
            (
                "s3://b/p",
                S3Options {
                    endpoint: Some("127.0.0.1:1".into()),
                    ..o.clone()
                },
                "http:// or https://",
            ),
            ("s3:///p", o.clone(), "bucket"),
        ] {
            let e = ArchiveTarget::parse_with(url, &o).unwrap_err().to_string();
            assert!(e.contains(needle), "{url}: {e}");
        }
    }

    /// The rule on a real S3 store: create once with the checksum, same bytes count as
    /// archived, other bytes (put through the store's back door) are refused and left, also
    /// compressed and across compressions; wrong credentials fail.
    #[test]
    fn an_s3_put_creates_once_and_never_overwrites() {
        let server = pg_testkit::SeaweedServer::start();
        let url = format!("s3://{}/cluster-a", server.bucket());
        let t = ArchiveTarget::parse_with(&url, &s3_options(&server)).unwrap();
        let seg = "000000010000000000000001";
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 13) as u8).collect();
        assert_eq!(
            t.put(seg, bytes.clone(), Compression::None).unwrap(),
            Put::Stored
        );
        let raw = |key: &str| server.get_raw(&format!("cluster-a/{key}")).unwrap();
        assert_eq!(raw(seg).as_deref(), Some(&bytes[..]));
        assert_eq!(
            raw(&format!("{seg}.crc32c")).as_deref(),
            Some(sidecar(&bytes).as_bytes())
        );
        assert_eq!(
            t.put(seg, bytes.clone(), Compression::None).unwrap(),
            Put::AlreadyThere
        );
        // Stored uncompressed, it counts as archived with compression on too: one object.
        assert_eq!(
            t.put(seg, bytes.clone(), Compression::DEFAULT_ZSTD)
                .unwrap(),
            Put::AlreadyThere
        );
        assert_eq!(raw(&format!("{seg}.zst")), None);
        let mut other = bytes.clone();
        other[1000] ^= 1;
        let e = t.put(seg, other.clone(), Compression::None).unwrap_err();
        assert!(matches!(e, ArchiveError::Mismatch { .. }), "{e}");
        assert_eq!(raw(seg).as_deref(), Some(&bytes[..]));

        // Compressed: a .zst object, found equal by its contents.
        let seg2 = "000000010000000000000002";
        assert_eq!(
            t.put(seg2, bytes.clone(), Compression::DEFAULT_ZSTD)
                .unwrap(),
            Put::Stored
        );
        let stored = raw(&format!("{seg2}.zst")).unwrap();
        assert!(stored.len() < bytes.len() / 10);
        assert_eq!(raw(seg2), None);
        assert_eq!(
            t.put(seg2, bytes.clone(), Compression::DEFAULT_ZSTD)
                .unwrap(),
            Put::AlreadyThere
        );
        assert_eq!(
            t.put(seg2, bytes.clone(), Compression::None).unwrap(),
            Put::AlreadyThere
        );
        // A damaged compressed object is other bytes, and stays as it is.
        server
            .put_raw(
                &format!("cluster-a/{seg2}.zst"),
                &stored[..stored.len() / 2],
            )
            .unwrap();
        for c in Compression::ALL {
            let e = t.put(seg2, bytes.clone(), c).unwrap_err();
            assert!(matches!(e, ArchiveError::Mismatch { .. }), "{e}");
            assert!(
                e.to_string().contains("s3://walserver-archive/cluster-a/"),
                "{e}"
            );
        }
        assert_eq!(raw(&format!("{seg2}.zst")).unwrap().len(), stored.len() / 2);

        // A foreign object placed before the first put: refused, never overwritten. The
        // conditional PUT itself is what refuses a name taken after the read.
        let seg3 = "000000010000000000000003";
        server
            .put_raw(&format!("cluster-a/{seg3}"), b"foreign")
            .unwrap();
        let e = t.put(seg3, bytes.clone(), Compression::None).unwrap_err();
        assert!(matches!(e, ArchiveError::Mismatch { .. }), "{e}");
        assert_eq!(raw(seg3).as_deref(), Some(&b"foreign"[..]));
        let ArchiveTarget::S3(s3) = &t else {
            unreachable!()
        };
        assert!(
            !s3.create(seg3, bytes.clone().into()).unwrap(),
            "a taken name was created"
        );
        assert_eq!(raw(seg3).as_deref(), Some(&b"foreign"[..]));

        let mut names: Vec<_> = s3.list().unwrap().into_iter().map(|(n, _)| n).collect();
        names.sort();
        assert_eq!(
            names,
            [
                seg.to_string(),
                format!("{seg}.crc32c"),
                format!("{seg2}.crc32c"),
                format!("{seg2}.zst"),
                seg3.to_string(),
                format!("{seg3}.crc32c"),
            ]
        );

        let wrong = S3Options {
            secret_access_key: Some("not-the-secret".into()),
            ..s3_options(&server)
        };
        let t = ArchiveTarget::parse_with(&url, &wrong).unwrap();
        let e = t
            .put("000000010000000000000004", &b"x"[..], Compression::None)
            .unwrap_err();
        assert!(matches!(e, ArchiveError::Store { .. }), "{e}");
        assert_eq!(raw("000000010000000000000004"), None);
    }
}
