//! `walserver rejoin`: make a node whose WAL forked from its new upstream's history follow
//! that upstream, dropping (and saying how much) the divergent tail. Run on a stopped node.

use std::path::Path;

use anyhow::Context;
use wal_storage::{Role, StorageConfig, Wal};
use walserver_node::init::StandbySignal;

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
    // The same check and cut as a live demotion (supervisor-actor's `fork`).
    let cut = supervisor_actor::fork::cut_back_to_fork(&wal, &upstream)?;
    let point = cut.point;
    let (local_tli, flushed) = (point.timeline, point.local_end);
    match point.fork {
        Some(fork) if point.must_cut() => println!(
            "rejoin: dropped {} bytes of WAL on timeline {local_tli} beyond the fork at {fork} (this node's WAL ended at {flushed})",
            cut.dropped_bytes
        ),
        Some(fork) => println!("rejoin: this node's WAL ends at {flushed}, at or before the fork at {fork}: nothing to drop"),
        None => println!("rejoin: the upstream is on this node's timeline {local_tli}: nothing to drop"),
    }
    // The upstream first, then the role, the commit point: a crash in between leaves a
    // primary's directory holding a standby.signal it was never started with, which the role
    // rule (supervisor-actor's `datadir`) makes a standby all the same.
    StandbySignal {
        primary_conninfo: Some(primary_conninfo.to_string()),
        primary_slot_name: slot.map(str::to_string),
        standby_since: None,
    }
    .write(data_dir)?;
    wal.set_role(Role::Standby)?;
    drop(wal);
    println!(
        "rejoin: {} is now a standby of {}",
        data_dir.display(),
        config.conninfo.to_string_without_password()
    );
    Ok(())
}
