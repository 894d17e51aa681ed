//! `walserver demo`: a cluster in one process, to watch it work.
//!
//! It starts a primary and two standbys on free loopback ports with temporary directories:
//! standby1 synchronous (`synchronous_standby_names = 'ANY 1 (standby1)'`), standby2
//! cascading from standby1. It appends for a few seconds with a progress line, prints the
//! replication status, promotes standby1 and shows standby2 following timeline 2, and ends
//! with a summary. The primary archives to a directory (`archive_timeout = 1`) meanwhile,
//! and a node is restored from that archive to the LSN the primary had flushed halfway
//! through the appends (`init --from-archive --target-lsn`): its WAL is compared with the
//! primary's, and it takes an append on the new timeline the restore starts. Then, when an etcd executable is found, it shows automatic failover with
//! three nodes as processes of their own ([`crate::demo_failover`]).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use bytes::Bytes;
use supervisor_actor::{
    AppendRecords, Durability, GetNodeStatus, Node, NodeStatus, Promote, ShutdownNode,
};
use wal_archive::{ArchiveTarget, ArchiverStatus};
use walserver_node::config::{Settings, Sources};
use walserver_node::from_archive::{init_from_archive, RecoveryTarget};
use walserver_node::{init, start_node};

struct DemoNode {
    name: &'static str,
    node: Node,
    http: SocketAddr,
}

async fn start_demo_node(
    dir: &std::path::Path,
    name: &'static str,
    extra: &str,
) -> anyhow::Result<DemoNode> {
    let toml = format!(
        "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nwal_keep_size = \"256MB\"\ncluster_name = \"{name}\"\n{extra}",
        dir.join(name).display().to_string()
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml)?;
    let settings = Settings::load(&Sources {
        file: Some(path),
        overrides: vec![],
        env: Some(Default::default()),
    })?;
    let node = start_node(&settings, &dir.join(name), |_| {})?.await?;
    let http = crate::http::serve(&settings, "127.0.0.1:0".parse()?, &node, None)?;
    Ok(DemoNode { name, node, http })
}

async fn init_standby(
    dir: &std::path::Path,
    name: &str,
    upstream: &DemoNode,
) -> anyhow::Result<()> {
    let conninfo = format!(
        "host=127.0.0.1 port={} user=demo application_name={name}",
        upstream.node.listen_addr.port()
    );
    let path = dir.join(name);
    tokio::task::spawn_blocking(move || init::init_standby(&path, &conninfo, None, None).map(drop))
        .await??;
    Ok(())
}

async fn status(n: &DemoNode) -> anyhow::Result<NodeStatus> {
    Ok(n.node.supervisor.send(GetNodeStatus).await??)
}

/// Waits for `cond` on a node's WAL position, woken by its flush watch.
async fn wait_position(
    n: &DemoNode,
    what: &str,
    cond: impl Fn(&wal_storage::WalPosition) -> bool,
) -> anyhow::Result<()> {
    let mut rx = n.node.wal.subscribe();
    tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|p| cond(p)))
        .await
        .with_context(|| format!("{} did not reach {what} in time", n.name))??;
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Restores a node from the primary's archive to `target` (an LSN, and when in the appends
/// the primary had flushed it), shows that its WAL is the primary's up to there, and appends
/// to it.
async fn restore_from_archive(
    dir: &std::path::Path,
    primary: &DemoNode,
    archive: &std::path::Path,
    (target, when): (wal_storage::Lsn, Duration),
) -> anyhow::Result<()> {
    println!(
        "\npoint-in-time restore from the archive to {target} (the primary's end {:.1} s into the appends) ...",
        when.as_secs_f64()
    );
    // Sampling for the demo's own readiness: the archiver's status is a watch inside the
    // admin API, and its uploads are a second apart (archive_timeout).
    let http = primary.http.to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let covered = loop {
        let h = http.clone();
        let status = tokio::task::spawn_blocking(move || {
            walserver_node::admin::get_json(&h, "/status", None)
        })
        .await??;
        let archiver: Option<ArchiverStatus> = status
            .get("archiver")
            .and_then(|a| serde_json::from_value(a.clone()).ok());
        if let Some(covered) = archiver
            .and_then(|a| a.covered_lsn)
            .filter(|c| *c >= target)
        {
            break covered;
        }
        ensure!(
            Instant::now() < deadline,
            "the archive did not reach {target} in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let objects = std::fs::read_dir(archive)?.count();
    println!("archive: {objects} files (segments, a prefix of the current one, checksums), WAL up to {covered}");
    let data = dir.join("restored");
    let from = ArchiveTarget::Directory(archive.to_path_buf());
    let to = RecoveryTarget {
        lsn: Some(target),
        ..RecoveryTarget::default()
    };
    let r = tokio::task::spawn_blocking(move || init_from_archive(&data, &from, &to)).await??;
    let restored = start_demo_node(dir, "restored", "").await?;
    // The restored WAL is the primary's, byte for byte, from where it starts to its end.
    let (theirs, ours) = (primary.node.wal.clone(), restored.node.wal.clone());
    let same = tokio::task::spawn_blocking(move || {
        anyhow::Ok(
            read_range(&theirs, r.timeline, r.start, r.end)?
                == read_range(&ours, r.timeline, r.start, r.end)?,
        )
    })
    .await??;
    ensure!(same, "the restored WAL differs from the primary's");
    let appended = restored
        .node
        .supervisor
        .send(AppendRecords {
            records: vec![Bytes::from_static(b"after the restore")],
            durability: Some(Durability::Local),
        })
        .await??;
    let tli = restored.node.wal.timeline();
    println!(
        "restored: WAL {} to {} from {} objects, identical to the primary's; the last record \
         ends at {} (at or before the target); it goes on as timeline {tli} and took an append at {}",
        r.start, r.end, r.objects, r.end, appended.end_lsn
    );
    let _ = restored
        .node
        .supervisor
        .send(ShutdownNode { immediate: false })
        .await;
    Ok(())
}

/// `wal`'s bytes of timeline `tli` from `start` to `end` (a read stops at each segment's end).
fn read_range(
    wal: &wal_storage::Wal,
    tli: wal_storage::TimelineId,
    start: wal_storage::Lsn,
    end: wal_storage::Lsn,
) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let bytes = wal.read(tli, at, usize::try_from(end.0 - at.0)?)?;
        ensure!(!bytes.is_empty(), "no WAL of timeline {tli} at {at}");
        at = wal_storage::Lsn(at.0 + bytes.len() as u64);
        out.extend_from_slice(&bytes);
    }
    Ok(out)
}

/// Runs the demo; `seconds` of appends.
pub fn run(seconds: u64) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let system = actix_rt::System::new();
    system.block_on(demo(dir.path(), seconds))?;
    println!("\nautomatic failover on etcd");
    match crate::demo_failover::find_etcd() {
        Some(etcd) => crate::demo_failover::run(dir.path(), &etcd),
        None => {
            println!(
                "  skipped: no etcd on PATH or at /usr/bin/etcd; {}",
                crate::demo_failover::ETCD_HINT
            );
            Ok(())
        }
    }
}

async fn demo(dir: &std::path::Path, seconds: u64) -> anyhow::Result<()> {
    let t0 = Instant::now();
    println!(
        "walserver demo: a primary and two standbys in one process, in {}\n",
        dir.display()
    );
    {
        let p = dir.join("primary");
        // 1 MiB segments, so that even a short run completes some: a restore learns the
        // segment size from a whole archived segment.
        tokio::task::spawn_blocking(move || init::init_primary(&p, 1 << 20).map(drop)).await??;
    }
    let archive = dir.join("archive");
    std::fs::create_dir(&archive)?;
    let primary = start_demo_node(
        dir,
        "primary",
        &format!(
            "synchronous_standby_names = 'ANY 1 (standby1)'\nsynchronous_commit = 'on'\n\
             archive_mode = 'on'\narchive_target = 'file://{}'\narchive_timeout = 1",
            archive.display()
        ),
    )
    .await?;
    println!(
        "primary   replication {}  admin http://{}  (archiving to {})",
        primary.node.listen_addr,
        primary.http,
        archive.display()
    );
    init_standby(dir, "standby1", &primary).await?;
    let standby1 = start_demo_node(dir, "standby1", "").await?;
    println!(
        "standby1  replication {}  admin http://{}  (synchronous, from primary)",
        standby1.node.listen_addr, standby1.http
    );
    init_standby(dir, "standby2", &standby1).await?;
    let standby2 = start_demo_node(dir, "standby2", "").await?;
    println!(
        "standby2  replication {}  admin http://{}  (cascading, from standby1)\n",
        standby2.node.listen_addr, standby2.http
    );
    // Wait until standby1 is the synchronous standby, so the appends below are synchronous.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = status(&primary).await?;
        if s.replication
            .iter()
            .any(|r| r.application_name == "standby1" && r.sync_state == "quorum")
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "standby1 did not become synchronous"
        );
        // Sampling for the demo's own readiness: the walsender's state change has no event
        // outside the registry.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Appends with remote flush (synchronous_commit = on), from 16 concurrent writers.
    // The progress line is redrawn in place on standard error, as a terminal shows it; piped
    // or collected output gets no carriage returns.
    let progress = std::io::stderr().is_terminal();
    let until = Instant::now() + Duration::from_secs(seconds);
    let record = Bytes::from(vec![b'x'; 1000]);
    let mut writers = Vec::new();
    for _ in 0..16 {
        let sup = primary.node.supervisor.clone();
        let record = record.clone();
        writers.push(actix_rt::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < until {
                let t = Instant::now();
                let batch = (0..8).map(|_| record.clone()).collect();
                match sup
                    .send(AppendRecords {
                        records: batch,
                        durability: Some(Durability::On),
                    })
                    .await
                {
                    Ok(Ok(_)) => latencies.push(t.elapsed()),
                    Ok(Err(e)) => return Err(anyhow::anyhow!("append failed: {e}")),
                    Err(e) => return Err(anyhow::anyhow!("append failed: {e}")),
                }
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let started = Instant::now();
    let flushed_at_start = primary.node.wal.flushed();
    // The point in time the archive is restored to: the primary's flushed end halfway.
    let halfway = started + Duration::from_secs(seconds) / 2;
    let mut target = None;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if target.is_none() && Instant::now() >= halfway {
            target = Some((primary.node.wal.flushed(), started.elapsed()));
        }
        let bytes = primary.node.wal.flushed().saturating_sub(flushed_at_start);
        let secs = started.elapsed().as_secs_f64();
        if progress {
            eprint!(
                "\rappending {secs:4.1}/{seconds} s: {:.1} MB/s, flushed {}   ",
                bytes as f64 / secs / 1e6,
                primary.node.wal.flushed()
            );
        }
    }
    let mut latencies = Vec::new();
    for w in writers {
        latencies.extend(w.await??);
    }
    if progress {
        eprintln!();
    }
    let appended_secs = started.elapsed().as_secs_f64();
    let appended_bytes = primary.node.wal.flushed().saturating_sub(flushed_at_start);
    latencies.sort();
    let target = target.unwrap_or((primary.node.wal.flushed(), started.elapsed()));

    // Everyone catches up, then the status table.
    let end = primary.node.wal.flushed();
    wait_position(&standby1, "the primary's end", |p| p.flushed >= end).await?;
    wait_position(&standby2, "the primary's end", |p| p.flushed >= end).await?;
    let ps = status(&primary).await?;
    println!(
        "\nprimary status (as `walserver status --wide --http {}` shows it):\n",
        primary.http
    );
    print!(
        "{}",
        crate::cli::render_status(&serde_json::to_value(&ps)?, None, true)?
    );
    let s1 = status(&standby1).await?;
    print!(
        "\nstandby1 serves its cascading standby:\n{}",
        crate::cli::render_status(&serde_json::to_value(&s1)?, None, true)?
    );

    restore_from_archive(dir, &primary, &archive, target).await?;

    // Promotion: standby1 takes over on timeline 2; standby2 follows without reconnecting.
    println!("\npromoting standby1 ...");
    let promoted = standby1.node.supervisor.send(Promote).await??;
    println!(
        "standby1 is a primary on timeline {} from {}",
        promoted.timeline, promoted.switch_lsn
    );
    let after = standby1
        .node
        .supervisor
        .send(AppendRecords {
            records: (0..100).map(|_| record.clone()).collect(),
            durability: Some(Durability::Local),
        })
        .await??;
    let tli = promoted.timeline;
    wait_position(&standby2, "timeline 2 and the new primary's end", |p| {
        p.timeline == tli && p.flushed >= after.end_lsn
    })
    .await?;
    let s2 = status(&standby2).await?;
    println!(
        "standby2 follows: timeline {}, flushed {} (the new primary's end is {})",
        s2.timeline, s2.flush_lsn, after.end_lsn
    );
    // The timeline-2 history file is the same on both.
    let h1 = standby1
        .node
        .wal
        .history_file(tli)?
        .context("no history file on standby1")?;
    let h2 = standby2
        .node
        .wal
        .history_file(tli)?
        .context("no history file on standby2")?;
    ensure!(h1 == h2, "the history files differ");

    let count = latencies.len() * 8;
    println!("\nsummary");
    println!(
        "  appended {count} records of 1000 bytes ({:.1} MB of WAL) in {appended_secs:.1} s: {:.0} records/s, {:.1} MB/s",
        appended_bytes as f64 / 1e6,
        count as f64 / appended_secs,
        appended_bytes as f64 / appended_secs / 1e6
    );
    println!(
        "  synchronous append latency (batches of 8, ANY 1 (standby1)): p50 {:?}, p99 {:?}, max {:?}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default()
    );
    println!("  standby2 followed the promotion to timeline {tli}; history files identical");
    for n in [&standby2, &standby1, &primary] {
        let _ = n
            .node
            .supervisor
            .send(ShutdownNode { immediate: false })
            .await;
    }
    println!("  done in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}
