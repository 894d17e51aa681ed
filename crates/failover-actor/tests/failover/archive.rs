//! A member behind what the leader keeps fills the gap from the archive: the actor hands the
//! archive to the walreceiver it starts when it follows a leader, as a standby's own
//! configuration does.

use wal_archive::{ArchiveConfig, ArchiveMode, ArchiveTarget, Archiver, Compression};
use wal_storage::Lsn;

use crate::harness::*;

const SEG: u64 = 1 << 20;

/// Waits until `node` has flushed `end`.
async fn wait_flushed(node: &Node, end: Lsn, what: &str) -> Result<()> {
    let mut rx = node.wal.subscribe();
    tokio::time::timeout(SETTLE, rx.wait_for(|p| p.flushed >= end))
        .await
        .with_context(|| {
            format!(
                "{what}: not at {end} within {SETTLE:?} (at {})",
                node.wal.flushed()
            )
        })??;
    Ok(())
}

/// Appends about `bytes` on `node` in records of 64 KiB.
async fn append_bytes(node: &Node, bytes: u64) -> Result<Lsn> {
    let mut end = Lsn(0);
    for _ in 0..bytes / (256 << 10) {
        let records = (0..4).map(|_| Bytes::from(vec![7u8; 64 << 10])).collect();
        let appended = node
            .supervisor
            .send(AppendRecords {
                records,
                durability: Some(Durability::Local),
            })
            .await?
            .map_err(|e| anyhow::anyhow!("append: {e}"))?;
        end = appended.end_lsn;
    }
    Ok(end)
}

#[test]
fn a_member_behind_what_the_leader_keeps_fills_the_gap_from_the_archive() -> Result<()> {
    log();
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir()?;
    let path = dir.path().to_path_buf();
    actix_rt::System::new().block_on(async move {
        let url = etcd.client_url();
        let archive = path.join("archive");
        std::fs::create_dir(&archive)?;
        let target = ArchiveTarget::Directory(archive);
        // Without member slots and with wal_keep_size 0, the leader keeps only what its
        // archive lacks.
        let configure = |t: ArchiveTarget| {
            move |c: &mut FailoverConfig| {
                c.use_slots = false;
                c.archive = Some(t);
            }
        };
        let p = start_primary_keeping(&path.join("a"), 0).await?;
        let (archiver, mut archived) = Archiver::start(
            p.wal.clone(),
            ArchiveConfig {
                mode: ArchiveMode::On,
                target: target.clone(),
                archive_timeout: Duration::ZERO,
                max_backlog: 0,
                compression: Compression::None,
            },
        );
        let mut a = start_actor_with(url, "a", p, configure(target.clone())).await?;
        let term = wait_for(&mut a, SETTLE, "leading", |l| l.leading.is_some())
            .await?
            .leading
            .context("leading")?;
        let b = start_standby(&path.join("b"), &a.node, "b").await?;
        let mut b = start_actor_with(url, "b", b, configure(target.clone())).await?;
        wait_for(&mut b, SETTLE, "following a", |l| {
            l.following == Some(("a".into(), term))
        })
        .await?;
        let end = append_bytes(&a.node, 256 << 10).await?;
        wait_flushed(&b.node, end, "b streams from a").await?;
        stop(&b, true).await?;
        let behind = b.node.wal.flushed();
        // Its storage's lock goes with the last handle.
        drop(b);

        // The leader goes on, archives, and removes what b still needs.
        let end = append_bytes(&a.node, 4 * SEG).await?;
        let need = end.segment_start(SEG);
        tokio::time::timeout(SETTLE, archived.wait_for(|s| s.archived_lsn >= Some(need)))
            .await
            .context("the leader archives")??;
        let wal = a.node.wal.clone();
        tokio::task::spawn_blocking(move || wal.run_retention()).await??;
        let oldest = a.node.wal.oldest_retained();
        anyhow::ensure!(
            oldest.segment_number(SEG) > behind.segment_number(SEG),
            "the leader still keeps b's next segment ({oldest}, b at {behind})"
        );

        // b comes back with a configuration that names no archive; following the leader,
        // its actor gives it the archive, and it fills the gap and streams on.
        let b = start_standby(&path.join("b"), &a.node, "b").await?;
        let mut b = start_actor_with(url, "b", b, configure(target.clone())).await?;
        wait_for(&mut b, SETTLE, "following a", |l| {
            l.following == Some(("a".into(), term))
        })
        .await?;
        wait_flushed(&b.node, end, "b fills its gap from the archive").await?;
        archiver.send(wal_archive::StopArchiver).await?;
        shutdown([b, a]).await;
        Ok(())
    })
}
