//! Data directories as `walserver init` makes them: a primary's, with a new system identifier,
//! and a standby's, which adopts its upstream's identity. `standby.signal`, the file whose
//! presence makes a node a standby, is supervisor-actor's (`datadir`), whose builder writes it
//! too.

use std::path::Path;

use anyhow::Context;
// The builder makes data directories too: it and `walserver init` share these, so both make
// the same ones.
pub use supervisor_actor::datadir::{new_system_id, StandbySignal, STANDBY_SIGNAL};
use wal_storage::{InitOptions, StorageConfig, SystemId, Wal, WalFormat};

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
    Ok(supervisor_actor::datadir::create_private_dir(dir)?)
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
