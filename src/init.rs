//! `walserver init`: make a data directory.

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
