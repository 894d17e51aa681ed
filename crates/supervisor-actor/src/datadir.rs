//! Data directories as a node finds them before it starts: a new system identifier, a
//! private directory, whether a directory is new, walserver's, or something else, whether
//! the node is a standby, and `standby.signal`, which holds a standby's upstream. The
//! builder and `walserver init` make data directories with these, so both make the same ones.
//!
//! # Role
//!
//! Storage's control data records the role ([`Role`]) and changes it in one atomic write:
//! promotion records `Primary` together with the new timeline, `walserver rejoin` records
//! `Standby`, and a standby's directory is made with `Standby`. `standby.signal` holds the
//! upstream's conninfo. [`StandbySignal::if_standby`] is the one rule for what the two say
//! together:
//!
//! - control data says standby: a standby (with what the signal holds, if it is there);
//! - control data says primary and the signal names an older timeline (`standby_since`)
//!   than the control data: a primary. A standby's first start writes its timeline into
//!   the signal; promotion commits, then removes the signal, so a crash in between leaves
//!   exactly this, and the next start removes the leftover ([`settle_role`]);
//! - otherwise the signal decides, as PostgreSQL's `standby.signal` does: one written into a
//!   primary's directory (by hand, into a copy of a primary's directory, say) makes it a
//!   standby, which its first start records in the control data; and a directory made
//!   before the control data recorded the role keeps the meaning it had, the signal's
//!   presence (its first start as a standby records the role too).

use std::path::{Path, PathBuf};

use wal_storage::{Role, SystemId, TimelineId, Wal, WalError};

use crate::error::NodeError;

/// A new system identifier, made as PostgreSQL makes one (seconds and microseconds of the
/// current time, and some bits that differ per call) so it also sorts by creation time.
pub fn new_system_id() -> SystemId {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let random: u64 = rand::random::<u64>() & 0xFFF;
    SystemId((now.as_secs() << 32) | (u64::from(now.subsec_micros()) << 12) | random)
}

/// Creates `dir` (mode 0700, as PostgreSQL requires of a data directory) if it is missing,
/// and gives an existing one that mode.
pub fn create_private_dir(dir: &Path) -> Result<(), NodeError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        // The directories this call creates, deepest first: each one's entry lives in its
        // parent, which must be fsynced too, or a power loss right after init can take the
        // whole data directory with it although every file in it was synced.
        let created: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| NodeError::DataDir {
                context: format!("cannot create {}", dir.display()),
                source,
            })?;
        for made in created {
            let parent = match made.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            std::fs::File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(|source| NodeError::DataDir {
                    context: format!("cannot fsync {}", parent.display()),
                    source,
                })?;
        }
        Ok(())
    } else {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|source| {
            NodeError::DataDir {
                context: format!("cannot set the permissions of {}", dir.display()),
                source,
            }
        })
    }
}

/// What a directory holds, as far as starting a node in it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDirState {
    /// Missing, empty, or holding only the lock file of an init that failed: a node may be
    /// initialised in it.
    New,
    /// A walserver data directory (it has a control file).
    Initialised,
}

/// The lock file storage takes first; alone, it is what a failed init leaves.
const LOCK_FILE: &str = "walserver.lock";

/// How many of a foreign directory's names an error lists.
const NAMES_SHOWN: usize = 5;

impl DataDirState {
    /// Looks at `dir`; a directory that is neither new nor walserver's is an error naming what
    /// it holds, so that a wrong path never gets a data directory made among someone else's
    /// files (as initdb refuses a non-empty directory).
    pub fn of(dir: &Path) -> Result<DataDirState, NodeError> {
        match Wal::stored_segment_size(dir) {
            Ok(_) => return Ok(DataDirState::Initialised),
            Err(WalError::NotInitialized { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let read_error = |source| NodeError::DataDir {
            context: format!("cannot read {}", dir.display()),
            source,
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DataDirState::New),
            Err(e) => return Err(read_error(e)),
        };
        let mut found = Vec::new();
        for entry in entries {
            let name = entry.map_err(read_error)?.file_name();
            let name = name.to_string_lossy().into_owned();
            if name != LOCK_FILE {
                found.push(name);
            }
        }
        if found.is_empty() {
            return Ok(DataDirState::New);
        }
        found.sort();
        let mut list = found
            .iter()
            .take(NAMES_SHOWN)
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        if found.len() > NAMES_SHOWN {
            list.push_str(&format!(" and {} more", found.len() - NAMES_SHOWN));
        }
        Err(NodeError::NotADataDirectory {
            dir: dir.to_path_buf(),
            found: list,
        })
    }
}

/// The role rule of the module docs: the standby signal if the node is a standby, given the
/// control data's role and timeline and the signal the directory holds.
fn role_rule(
    role: Option<Role>,
    timeline: TimelineId,
    signal: Option<StandbySignal>,
) -> Option<StandbySignal> {
    match (role, signal) {
        (Some(Role::Standby), signal) => Some(signal.unwrap_or_default()),
        (Some(Role::Primary), Some(s)) if s.standby_since.is_some_and(|t| t < timeline) => None,
        (_, signal) => signal,
    }
}

/// Makes the control data and `standby.signal` of a node just opened agree with what the
/// role rule made of them, so that the control data alone says the role from then on: a
/// standby's role is recorded (a signal written into a primary's or an old directory) and
/// its timeline written into its signal (`standby_since`) if missing; a signal that a crash
/// kept promotion from removing is removed. Only what agrees with how the node runs
/// (`standby`) is done. Blocking (file writes and fsyncs).
pub fn settle_role(data_dir: &Path, wal: &Wal, standby: bool) -> Result<(), NodeError> {
    let signal = StandbySignal::read(data_dir)?;
    let timeline = wal.timeline();
    match (role_rule(wal.role(), timeline, signal.clone()), signal) {
        (Some(_), signal) if standby => {
            if wal.role() != Some(Role::Standby) {
                wal.set_role(Role::Standby)?;
                tracing::info!("recorded the role standby in the control data");
            }
            if let Some(mut s) = signal.filter(|s| s.standby_since.is_none()) {
                s.standby_since = Some(timeline);
                s.write(data_dir)?;
            }
        }
        (None, Some(_)) if !standby => {
            let path = StandbySignal::path(data_dir);
            wal_storage::durable::remove(&path)?;
            tracing::info!(
                path = %path.display(),
                "removed a standby.signal left by a promotion that a crash interrupted"
            );
        }
        _ => {}
    }
    Ok(())
}

/// The name of the standby signal in a data directory.
pub const STANDBY_SIGNAL: &str = "standby.signal";

/// What a standby remembers about its upstream, in `DATA/standby.signal` (JSON; an empty file
/// holds nothing). Whether the node is a standby is the control data's role and this file's
/// together (see the module docs and [`StandbySignal::if_standby`]); promotion removes it.
/// Settings in a configuration file, or given to the builder, win over what it holds.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StandbySignal {
    pub primary_conninfo: Option<String>,
    pub primary_slot_name: Option<String>,
    /// The timeline the node was on when it first started as a standby with this file
    /// (written then): a primary on a later timeline was promoted since, so the file is a
    /// leftover that a crash kept promotion from removing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby_since: Option<TimelineId>,
}

impl StandbySignal {
    /// The signal's path in `data_dir`.
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(STANDBY_SIGNAL)
    }

    /// The standby signal if the node in `data_dir` is a standby (with an empty one if the
    /// control data says standby and the file is missing), `None` if it is a primary: the
    /// rule of the module docs. A directory without control data is a standby's if it holds
    /// the file.
    pub fn if_standby(data_dir: &Path) -> Result<Option<StandbySignal>, NodeError> {
        let signal = StandbySignal::read(data_dir)?;
        match Wal::stored_role(data_dir) {
            Ok((role, timeline)) => Ok(role_rule(role, timeline, signal)),
            Err(WalError::NotInitialized { .. }) => Ok(signal),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the data directory's standby signal, `None` if there is none. Whether the node
    /// is a standby is [`StandbySignal::if_standby`]'s to say.
    pub fn read(data_dir: &Path) -> Result<Option<StandbySignal>, NodeError> {
        let path = StandbySignal::path(data_dir);
        match std::fs::read(&path) {
            Ok(b) if b.iter().all(u8::is_ascii_whitespace) => Ok(Some(StandbySignal::default())),
            Ok(b) => {
                serde_json::from_slice(&b)
                    .map(Some)
                    .map_err(|e| NodeError::BadStandbySignal {
                        path,
                        reason: e.to_string(),
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(NodeError::DataDir {
                context: format!("cannot read {}", path.display()),
                source,
            }),
        }
    }

    /// Writes the signal durably (temporary file, fsync, rename, fsync of the directory).
    pub fn write(&self, data_dir: &Path) -> Result<(), NodeError> {
        let bytes = serde_json::to_vec_pretty(self).expect("two optional strings serialize");
        wal_storage::durable::write_atomic(data_dir, &StandbySignal::path(data_dir), &bytes)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_new_walserver_s_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert_eq!(DataDirState::of(&missing).unwrap(), DataDirState::New);
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert_eq!(DataDirState::of(&empty).unwrap(), DataDirState::New);
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("notes.txt"), "mine").unwrap();
        let e = DataDirState::of(&other).unwrap_err();
        assert!(matches!(e, NodeError::NotADataDirectory { .. }), "{e}");
        assert!(e.to_string().contains("other"), "{e}");
        // What a failed init leaves is new again.
        let failed = dir.path().join("failed");
        std::fs::create_dir(&failed).unwrap();
        std::fs::write(failed.join("walserver.lock"), "").unwrap();
        assert_eq!(DataDirState::of(&failed).unwrap(), DataDirState::New);
    }

    /// The role rule, case by case: the control data's role first, a signal older than a
    /// primary's timeline a leftover, otherwise the signal's presence.
    #[test]
    fn the_role_rule() {
        let signal = |since: Option<u32>| {
            Some(StandbySignal {
                primary_conninfo: Some("host=h".into()),
                primary_slot_name: None,
                standby_since: since.map(TimelineId),
            })
        };
        let standby = |r: Option<StandbySignal>| r.is_some();
        let (p, s) = (Some(Role::Primary), Some(Role::Standby));
        let t = TimelineId(3);
        // Recorded standby: with or without the file.
        assert!(standby(role_rule(s, t, None)));
        assert!(standby(role_rule(s, t, signal(Some(1)))));
        // Recorded primary: no file, or one a promotion from an older timeline left.
        assert!(!standby(role_rule(p, t, None)));
        assert!(!standby(role_rule(p, t, signal(Some(2)))));
        // A file written into a primary's directory after it became one (by hand, or by
        // rejoin before it records the role) makes a standby.
        assert!(standby(role_rule(p, t, signal(None))));
        assert!(standby(role_rule(p, t, signal(Some(3)))));
        // No role recorded (an older directory): the file's presence.
        assert!(standby(role_rule(None, t, signal(None))));
        assert!(standby(role_rule(None, t, signal(Some(1)))));
        assert!(!standby(role_rule(None, t, None)));
        assert_eq!(
            role_rule(s, t, signal(Some(1)))
                .unwrap()
                .primary_conninfo
                .as_deref(),
            Some("host=h")
        );
    }

    #[test]
    fn the_standby_signal_round_trips_and_an_empty_one_is_a_standby() {
        let dir = tempfile::tempdir().unwrap();
        assert!(StandbySignal::read(dir.path()).unwrap().is_none());
        std::fs::write(StandbySignal::path(dir.path()), "\n").unwrap();
        let s = StandbySignal::read(dir.path()).unwrap().unwrap();
        assert!(s.primary_conninfo.is_none());
        StandbySignal {
            primary_conninfo: Some("host=h".into()),
            primary_slot_name: Some("s".into()),
            standby_since: None,
        }
        .write(dir.path())
        .unwrap();
        let s = StandbySignal::read(dir.path()).unwrap().unwrap();
        assert_eq!(s.primary_conninfo.as_deref(), Some("host=h"));
        assert_eq!(s.primary_slot_name.as_deref(), Some("s"));
        std::fs::write(StandbySignal::path(dir.path()), "{").unwrap();
        let e = StandbySignal::read(dir.path()).unwrap_err();
        assert!(matches!(e, NodeError::BadStandbySignal { .. }), "{e}");
    }
}
