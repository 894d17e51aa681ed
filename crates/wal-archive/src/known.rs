//! What the archiver knows its archive holds, so that it lists the archive once rather than
//! at every upload: a listing costs one request per thousand objects on S3, and an archive
//! grows by a segment and its sidecar at each upload, so listing per upload costs O(archive)
//! per segment.
//!
//! A leader's archiver is normally the archive's only writer. It lists the archive when it
//! starts archiving and after a failed upload, and between those keeps the names itself:
//! each object it put, each it removed. The one name set it reads is the stems of the
//! `archive_timeout` prefixes to remove. A put that finds an object it did not know of
//! means another node writes here too (an old leader that has not stopped yet, or
//! `archive_mode = always`): the names are stale, and the next look lists again. A put
//! never trusts these names: every put is still a create-if-absent that judges what is
//! there, so stale names can only leave a prefix behind until the next listing, never
//! overwrite or skip anything.
//!
//! A standby under `on` follows someone else's uploads, so names it kept would always be
//! stale: it asks for the names it needs ([`ArchiveTarget::contains`]), one segment at a
//! time, instead of listing.

use std::collections::BTreeSet;
use std::fs;
use std::io::ErrorKind;

use crate::compression::Compression;
use crate::error::{ArchiveError, Result};
use crate::target::{unreadable, ArchiveTarget, Put};

/// The names (as [`ArchiveTarget::list`] gives them) the archive holds, as far as this
/// archiver knows.
#[derive(Debug, Default)]
pub(crate) struct Known {
    /// `None`: not listed yet, or no longer trusted.
    names: Option<BTreeSet<String>>,
    /// How many times the archive was listed, for the tests and the measurement.
    listings: u64,
    /// The archive was found to name this node's system (`identity.rs`). Kept through
    /// [`Known::forget`]: an archive's identity is written once and never changes.
    claimed: bool,
    /// The store was found to refuse a second create of a name (`target.rs`); a store's
    /// behaviour is checked once per archiver.
    probed: bool,
}

impl Known {
    /// The names, listing the archive first if they are not known.
    pub(crate) fn names(&mut self, target: &ArchiveTarget) -> Result<&BTreeSet<String>> {
        if self.names.is_none() {
            let listed: BTreeSet<String> = target.list()?.into_iter().map(|o| o.name).collect();
            self.listings += 1;
            tracing::debug!(
                objects = listed.len(),
                listings = self.listings,
                "listed the archive"
            );
            self.names = Some(listed);
        }
        Ok(self.names.get_or_insert_with(BTreeSet::new))
    }

    /// A put of `name` found `put`.
    pub(crate) fn put(&mut self, name: &str, put: Put) {
        let Some(names) = self.names.as_mut() else {
            return;
        };
        match put {
            Put::Stored => {
                names.insert(name.to_string());
            }
            // Its own earlier put (a retry, a restart) is known; anything else was put by
            // another node, which may have put more since the listing.
            Put::AlreadyThere if !names.contains(name) => self.forget(),
            Put::AlreadyThere => {}
        }
    }

    pub(crate) fn removed(&mut self, name: &str) {
        if let Some(names) = self.names.as_mut() {
            names.remove(name);
        }
    }

    pub(crate) fn claimed(&self) -> bool {
        self.claimed
    }

    pub(crate) fn set_claimed(&mut self) {
        self.claimed = true;
    }

    pub(crate) fn probed(&self) -> bool {
        self.probed
    }

    pub(crate) fn set_probed(&mut self) {
        self.probed = true;
    }

    /// Lists again at the next look: after a failure, or at the start of archiving.
    pub(crate) fn forget(&mut self) {
        self.names = None;
    }

    #[cfg(test)]
    pub(crate) fn listings(&self) -> u64 {
        self.listings
    }
}

impl ArchiveTarget {
    /// Whether the archive holds the file `name` in any stored form (its object, not only its
    /// sidecar, which is put first). One request per form on S3, whatever the archive's size.
    /// Blocking.
    pub fn contains(&self, name: &str) -> Result<bool> {
        for object in Compression::ALL.map(|c| c.object_name(name)) {
            let found = match self {
                ArchiveTarget::Directory(dir) => {
                    let path = dir.join(&object);
                    match fs::metadata(&path) {
                        Ok(m) => m.is_file(),
                        Err(e) if e.kind() == ErrorKind::NotFound => false,
                        Err(e) => {
                            return Err(ArchiveError::io(
                                format!("looking up {}", path.display()),
                                e,
                            ))
                        }
                    }
                }
                ArchiveTarget::S3(s3) => s3.exists(&object)?,
                ArchiveTarget::Command(_) => return Err(unreadable()),
            };
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_listed_once_then_kept_until_another_writer_shows() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        t.put("000000010000000000000001", &b"a"[..], Compression::None)
            .unwrap();
        let mut k = Known::default();
        assert!(k.names(&t).unwrap().contains("000000010000000000000001"));
        for n in 2..20 {
            let name = format!("0000000100000000000000{n:02X}");
            let put = t.put(&name, &b"b"[..], Compression::None).unwrap();
            k.put(&name, put);
            assert!(k.names(&t).unwrap().contains(&name));
        }
        k.removed("000000010000000000000002");
        assert!(!k.names(&t).unwrap().contains("000000010000000000000002"));
        // Its own object found again (a retry): still trusted.
        k.put("000000010000000000000003", Put::AlreadyThere);
        k.names(&t).unwrap();
        assert_eq!(k.listings(), 1);
        // An object it did not know of: someone else writes here; the next look lists.
        t.put("000000010000000000000030", &b"c"[..], Compression::None)
            .unwrap();
        k.put("000000010000000000000030", Put::AlreadyThere);
        assert!(k.names(&t).unwrap().contains("000000010000000000000030"));
        assert_eq!(k.listings(), 2);
        k.forget();
        k.names(&t).unwrap();
        assert_eq!(k.listings(), 3);
    }

    #[test]
    fn contains_sees_an_object_in_any_stored_form_and_not_a_lone_sidecar() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        t.put("000000010000000000000001", &b"a"[..], Compression::None)
            .unwrap();
        t.put(
            "000000010000000000000002",
            &b"b"[..],
            Compression::DEFAULT_ZSTD,
        )
        .unwrap();
        fs::write(
            dir.path().join("000000010000000000000003.crc32c"),
            crate::sidecar(b"c"),
        )
        .unwrap();
        assert!(t.contains("000000010000000000000001").unwrap());
        assert!(t.contains("000000010000000000000002").unwrap());
        assert!(!t.contains("000000010000000000000003").unwrap());
        assert!(!t.contains("000000010000000000000004").unwrap());
    }
}
