//! The archive's identity: which database system its WAL belongs to.
//!
//! WAL names carry a timeline and a position, not a system: two clusters archiving to one
//! place would give the same names to different WAL, and the first put of each would land
//! beside the other's. So an archive names its system once, in the object [`IDENTITY_FILE`]
//! at its root:
//!
//! ```text
//! system_identifier=N\n      the system identifier, in decimal as IDENTIFY_SYSTEM shows it
//! ```
//!
//! It is put as any file is (`target.rs`: created only if absent, with its checksum
//! sidecar, never overwritten), by the first archiver that archives there, before its first
//! upload; every later archiver reads it and refuses to archive into an archive of another
//! system ([`ArchiveError::OtherSystem`], an alarm that needs a person, as a mismatch is).
//! Every reader that feeds a node's WAL checks it too ([`ArchiveTarget::check_system`]): a
//! standby under `on` following the archive, a walreceiver filling a gap, and
//! `init --from-archive --standby`; WAL names alone would let system A take system B's WAL.
//! An archive that names no system is read as before: PostgreSQL's `archive_command`
//! (`cp`, WAL-G, pgBackRest into a directory) writes none.
//! A relay of PostgreSQL carries its upstream's identifier, so its archive names the
//! PostgreSQL system. An archive made before this file existed gets it at its next
//! archiver's start. `archive_command` targets are not read back and carry none: the
//! command keeps its own (pgBackRest's `archive.info` does).

use bytes::Bytes;
use wal_types::SystemId;

use crate::compression::Compression;
use crate::error::{ArchiveError, Result};
use crate::target::{ArchiveTarget, Put};

/// The name of the object that holds the archive's system identifier. No WAL file has a
/// name of this shape, so it never meets one.
pub const IDENTITY_FILE: &str = "walserver.identity";

/// The identity file's contents for `system_id`.
fn identity_text(system_id: SystemId) -> String {
    format!("system_identifier={system_id}\n")
}

impl ArchiveTarget {
    /// The system identifier the archive names, `None` if it names none yet. The file is
    /// checked against its sidecar first; one that does not parse is corrupt. Blocking.
    pub fn system_id(&self) -> Result<Option<SystemId>> {
        let Some(bytes) = self.get(IDENTITY_FILE)? else {
            return Ok(None);
        };
        std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| t.strip_prefix("system_identifier="))
            .and_then(|t| t.strip_suffix('\n'))
            .and_then(|t| t.parse().ok())
            .map(Some)
            .ok_or_else(|| ArchiveError::Corrupt {
                name: IDENTITY_FILE.to_string(),
                reason: "it does not name a system identifier".into(),
            })
    }

    /// Makes sure the archive belongs to `system_id`: names it if the archive names none
    /// (created only if absent, so of two first archivers one wins and the other reads it),
    /// and refuses with [`ArchiveError::OtherSystem`] if it names another. Blocking.
    pub fn claim(&self, system_id: SystemId) -> Result<Put> {
        if let Some(theirs) = self.system_id()? {
            return self.same_system(theirs, system_id);
        }
        let text = Bytes::from(identity_text(system_id));
        match self.put(IDENTITY_FILE, text, Compression::None) {
            Err(ArchiveError::Mismatch { .. }) => match self.system_id()? {
                Some(theirs) => self.same_system(theirs, system_id),
                None => Err(ArchiveError::Corrupt {
                    name: IDENTITY_FILE.to_string(),
                    reason: "it was taken, then found empty".into(),
                }),
            },
            other => other,
        }
    }

    /// Whether a reader of system `ours` may take WAL from the archive: the system it names
    /// if that is `ours`, `None` if it names none (nothing to check against: an archive
    /// PostgreSQL's `archive_command` filled, or one whose archiver has not restarted since
    /// identities began), [`ArchiveError::OtherSystem`] if it names another. Blocking.
    pub fn check_system(&self, ours: SystemId) -> Result<Option<SystemId>> {
        match self.system_id()? {
            Some(theirs) => self.same_system(theirs, ours).map(|_| Some(theirs)),
            None => Ok(None),
        }
    }

    fn same_system(&self, theirs: SystemId, ours: SystemId) -> Result<Put> {
        if theirs == ours {
            return Ok(Put::AlreadyThere);
        }
        Err(ArchiveError::OtherSystem {
            archive: self.describe(""),
            theirs,
            ours,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_claim_names_the_system_and_another_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        assert_eq!(t.system_id().unwrap(), None);
        // A reader of any system may read an archive that names none.
        assert_eq!(t.check_system(SystemId(8)).unwrap(), None);
        assert_eq!(t.claim(SystemId(7)).unwrap(), Put::Stored);
        assert_eq!(t.check_system(SystemId(7)).unwrap(), Some(SystemId(7)));
        assert!(matches!(
            t.check_system(SystemId(8)),
            Err(ArchiveError::OtherSystem {
                theirs: SystemId(7),
                ours: SystemId(8),
                ..
            })
        ));
        assert_eq!(t.claim(SystemId(7)).unwrap(), Put::AlreadyThere);
        assert_eq!(t.system_id().unwrap(), Some(SystemId(7)));
        let e = t.claim(SystemId(8)).unwrap_err();
        assert!(
            matches!(
                e,
                ArchiveError::OtherSystem {
                    theirs: SystemId(7),
                    ours: SystemId(8),
                    ..
                }
            ),
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("system 7") && text.contains("system 8"),
            "{text}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join(IDENTITY_FILE)).unwrap(),
            "system_identifier=7\n"
        );
    }

    #[test]
    fn a_damaged_identity_is_corrupt_not_another_system() {
        let dir = tempfile::tempdir().unwrap();
        let t = ArchiveTarget::Directory(dir.path().into());
        t.put(
            IDENTITY_FILE,
            &b"system_identifier=x\n"[..],
            Compression::None,
        )
        .unwrap();
        assert!(matches!(
            t.claim(SystemId(7)),
            Err(ArchiveError::Corrupt { .. })
        ));
        std::fs::write(dir.path().join(IDENTITY_FILE), "system_identifier=9\n").unwrap();
        assert!(matches!(t.system_id(), Err(ArchiveError::Corrupt { .. })));
    }
}
