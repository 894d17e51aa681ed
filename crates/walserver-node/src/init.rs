//! Data directories as `walserver init` makes them: a primary's, with a new system identifier,
//! and a standby's, which adopts its upstream's identity; and `standby.signal`, the file whose
//! presence makes a node a standby.

use std::path::Path;

use wal_storage::{InitOptions, StorageConfig, SystemId, Wal, WalFormat};

use crate::error::{Error, Result};

/// A new system identifier, made as PostgreSQL makes one (seconds and microseconds of the
/// current time, and some bits that differ per call) so it also sorts by creation time.
pub fn new_system_id() -> SystemId {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let random: u64 = rand::random::<u64>() & 0xFFF;
    SystemId((now.as_secs() << 32) | (u64::from(now.subsec_micros()) << 12) | random)
}

/// Creates a primary's data directory: a new system identifier, timeline 1, empty WAL of
/// walserver records starting at the start of segment 1.
pub fn init_primary(dir: &Path, segment_size: u64) -> Result<SystemId> {
    create_private_dir(dir)?;
    let system_id = new_system_id();
    let cfg = StorageConfig {
        segment_size,
        ..StorageConfig::default()
    };
    let wal = Wal::init(
        dir,
        cfg,
        InitOptions::primary(system_id, WalFormat::Walserver),
    )
    .map_err(|source| Error::InitDataDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    drop(wal);
    Ok(system_id)
}

/// Creates `dir` (mode 0700, as PostgreSQL requires of a data directory) if it is missing.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| Error::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
    } else {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(
            |source| Error::SetPermissions {
                dir: dir.to_path_buf(),
                source,
            },
        )?;
    }
    Ok(())
}

/// What `walserver init --standby` remembers about the upstream, in `DATA/standby.signal`.
/// The file's presence makes the node a standby (as PostgreSQL's `standby.signal` does);
/// promotion removes it. Settings in the configuration file win over what it holds.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StandbySignal {
    pub primary_conninfo: Option<String>,
    pub primary_slot_name: Option<String>,
}

pub const STANDBY_SIGNAL: &str = "standby.signal";

impl StandbySignal {
    /// Reads the data directory's standby signal, `None` if the node is a primary.
    pub fn read(data_dir: &Path) -> Result<Option<StandbySignal>> {
        let path = data_dir.join(STANDBY_SIGNAL);
        match std::fs::read(&path) {
            Ok(b) if b.iter().all(u8::is_ascii_whitespace) => Ok(Some(StandbySignal::default())),
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|source| Error::InvalidStandbySignal { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::ReadStandbySignal { path, source }),
        }
    }

    /// Writes the signal durably (temporary file, fsync, rename, fsync of the directory).
    pub fn write(&self, data_dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(Error::EncodeStandbySignal)?;
        wal_storage::durable::write_atomic(data_dir, &data_dir.join(STANDBY_SIGNAL), &bytes)?;
        Ok(())
    }
}

/// Creates a standby's data directory adopting the upstream's system identifier, timeline
/// history, segment size and kind of WAL; it starts at the upstream's current segment (or the
/// slot's restart point, or `start_lsn`).
pub fn init_standby(
    dir: &Path,
    primary_conninfo: &str,
    slot: Option<&str>,
    start_lsn: Option<wal_storage::Lsn>,
) -> Result<walreceiver_actor::UpstreamIdentity> {
    let config = walreceiver_actor::ReceiverConfig::parse(primary_conninfo, None)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    let mut identity = rt
        .block_on(walreceiver_actor::fetch_upstream_identity(
            &config.conninfo,
            slot,
            &config.application_name,
        ))
        .map_err(|e| Error::IdentifyUpstream(Box::new(e)))?;
    if let Some(start) = start_lsn {
        if !(start.is_valid() && start <= identity.xlogpos) {
            return Err(Error::StartLsnOutOfRange {
                start,
                flush: identity.xlogpos,
            });
        }
        identity.slot_restart = None;
        identity.xlogpos = start;
    }
    create_private_dir(dir)?;
    let wal = walreceiver_actor::init_standby(dir, StorageConfig::default(), &identity)?;
    drop(wal);
    StandbySignal {
        primary_conninfo: Some(primary_conninfo.to_string()),
        primary_slot_name: slot.map(str::to_string),
    }
    .write(dir)?;
    Ok(identity)
}
