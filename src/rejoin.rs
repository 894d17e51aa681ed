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
