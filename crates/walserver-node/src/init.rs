//! Data directories as `walserver init` makes them: a primary's, with a new system identifier,
//! and a standby's, which adopts its upstream's identity; and `standby.signal`, the file whose
//! presence makes a node a standby.

use std::path::Path;

use anyhow::Context;
use wal_storage::{InitOptions, StorageConfig, SystemId, Wal, WalFormat};

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
pub fn init_primary(dir: &Path, segment_size: u64) -> anyhow::Result<SystemId> {
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
    .with_context(|| format!("cannot initialise {}", dir.display()))?;
    drop(wal);
    Ok(system_id)
}

/// Creates `dir` (mode 0700, as PostgreSQL requires of a data directory) if it is missing.
pub fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    } else {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cannot set the permissions of {}", dir.display()))?;
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
    pub fn read(data_dir: &Path) -> anyhow::Result<Option<StandbySignal>> {
        let path = data_dir.join(STANDBY_SIGNAL);
        match std::fs::read(&path) {
            Ok(b) if b.iter().all(u8::is_ascii_whitespace) => Ok(Some(StandbySignal::default())),
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .with_context(|| format!("{} is not valid", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes the signal durably (temporary file, fsync, rename, fsync of the directory).
    pub fn write(&self, data_dir: &Path) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec_pretty(self)?;
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
) -> anyhow::Result<walreceiver_actor::UpstreamIdentity> {
    let config = walreceiver_actor::ReceiverConfig::parse(primary_conninfo, None)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut identity = rt
        .block_on(walreceiver_actor::fetch_upstream_identity(
            &config.conninfo,
            slot,
            &config.application_name,
        ))
        .context("cannot identify the upstream")?;
    if let Some(start) = start_lsn {
        anyhow::ensure!(
            start.is_valid() && start <= identity.xlogpos,
            "--start-lsn {start} must be between 0/1 and the upstream's flush position {}",
            identity.xlogpos
        );
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
