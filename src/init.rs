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

/// `walserver rejoin`: cut the WAL this node holds beyond the point where its new upstream's
/// history forked from it, and make it a standby of that upstream. An explicit operator
/// action: it says how many bytes it drops.
pub fn rejoin(data_dir: &Path, primary_conninfo: &str, slot: Option<&str>) -> anyhow::Result<()> {
    let config = walreceiver_actor::ReceiverConfig::parse(primary_conninfo, None)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let upstream = rt
        .block_on(walreceiver_actor::fetch_upstream_identity(
            &config.conninfo,
            slot,
            &config.application_name,
        ))
        .context("cannot identify the new upstream")?;
    // Rejoin drops the divergent tail and nothing else. Opening storage runs retention at the
    // first segment it touches; with the default wal_keep_size of 0 that would remove every
    // older segment the node's own configuration keeps (for its cascading standbys), so keep
    // everything here and leave retention to the node when it runs.
    let cfg = StorageConfig {
        segment_size: Wal::stored_segment_size(data_dir)?,
        wal_keep_size: u64::MAX,
        ..StorageConfig::default()
    };
    let wal = Wal::open(data_dir, cfg).with_context(|| {
        format!(
            "cannot open {} (is the node still running?)",
            data_dir.display()
        )
    })?;
    anyhow::ensure!(
        wal.system_id() == upstream.system_id,
        "the upstream has system identifier {}, this node {}: it is another cluster",
        upstream.system_id,
        wal.system_id()
    );
    let local_tli = wal.timeline();
    let flushed = wal.flushed();
    let fork = upstream
        .history
        .iter()
        .find(|e| e.parent == local_tli)
        .map(|e| e.switch_lsn);
    match fork {
        Some(fork) if flushed > fork => {
            let dropped = wal.truncate_to(fork)?;
            println!(
                "rejoin: dropped {dropped} bytes of WAL on timeline {local_tli} beyond the fork at {fork} (this node's WAL ended at {flushed})"
            );
        }
        Some(fork) => println!("rejoin: this node's WAL ends at {flushed}, at or before the fork at {fork}: nothing to drop"),
        None if upstream.timeline == local_tli => println!("rejoin: the upstream is on this node's timeline {local_tli}: nothing to drop"),
        None => anyhow::bail!(
            "this node's timeline {local_tli} is not in the history of the upstream's timeline {}",
            upstream.timeline
        ),
    }
    drop(wal);
    StandbySignal {
        primary_conninfo: Some(primary_conninfo.to_string()),
        primary_slot_name: slot.map(str::to_string),
    }
    .write(data_dir)?;
    println!(
        "rejoin: {} is now a standby of {}",
        data_dir.display(),
        config.conninfo.to_string_without_password()
    );
    Ok(())
}
