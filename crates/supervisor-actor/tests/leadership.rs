//! The leadership messages over real nodes on loopback: a standby promoted for a term records
//! the term in its timeline history; a demoted primary drops exactly its divergent tail and
//! streams from the new leader; a standby re-targeted at another upstream follows it at once;
//! the synchronous standbys can be changed under waiting appends.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use supervisor_actor::{
    AppendError, AppendRecords, Appended, Durability, Fence, GetNodeStatus, LocalLevel, Node,
    NodeBuilder, NodeRole, PromoteForTerm, ShutdownNode,
};
use wal_storage::{Lsn, TimelineId};

/// Every wait in these tests ends by this deadline, so a regression fails instead of hanging.
const DEADLINE: Duration = Duration::from_secs(30);

fn run<F: Future>(f: F) -> F::Output {
    actix_rt::System::new().block_on(f)
}

fn conninfo(upstream: &Node) -> String {
    format!("host=127.0.0.1 port={} user=r", upstream.listen_addr.port())
}

fn primary(dir: &Path, fence: Fence) -> NodeBuilder {
    NodeBuilder::primary(dir)
        .listen("127.0.0.1:0".parse().unwrap())
        .segment_size(1 << 20)
        .io_threads(0)
        .fence(fence)
}

fn standby_of(upstream: &Node, dir: &Path, name: &str, fence: Fence) -> NodeBuilder {
    NodeBuilder::standby(dir, &conninfo(upstream))
        .unwrap()
        .cluster_name(name)
        .listen("127.0.0.1:0".parse().unwrap())
        .io_threads(0)
        .fence(fence)
}

/// A grant far beyond the tests' own deadline.
fn lasting() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

async fn try_append(node: &Node, record: &str) -> Result<Appended, AppendError> {
    tokio::time::timeout(
        DEADLINE,
        node.supervisor.send(AppendRecords {
            records: vec![Bytes::from(record.to_string())],
            durability: Some(Durability::Local),
        }),
    )
    .await
    .expect("the append is answered by the deadline")
    .expect("the supervisor runs")
}

async fn append(node: &Node, record: &str) -> Lsn {
    try_append(node, record).await.unwrap().end_lsn
}

async fn flushed_to(node: &Node, lsn: Lsn) {
    tokio::time::timeout(DEADLINE, node.wait_for_lsn(lsn, LocalLevel::Flushed))
        .await
        .unwrap_or_else(|_| panic!("flushed to {lsn} by the deadline"));
}

async fn role(node: &Node) -> NodeRole {
    node.supervisor
        .send(GetNodeStatus)
        .await
        .unwrap()
        .unwrap()
        .role
}

async fn stop(node: Node) {
    node.supervisor
        .send(ShutdownNode { immediate: true })
        .await
        .unwrap();
}

#[test]
fn a_standby_promoted_for_a_term_records_it_in_its_history() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let p = primary(&dir.path().join("p"), Fence::open())
            .start()
            .await
            .unwrap();
        let end = append(&p, "before").await;
        let fence = Fence::closed();
        let s = standby_of(&p, &dir.path().join("s"), "s", fence.clone())
            .start()
            .await
            .unwrap();
        flushed_to(&s, end).await;
        let promoted = s
            .supervisor
            .send(PromoteForTerm { term: 7 })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(promoted.timeline, TimelineId(2));
        assert_eq!(role(&s).await, NodeRole::Primary);
        let history = s.wal.history();
        let last = history.last().expect("timeline 2 has a history");
        assert_eq!(last.parent, TimelineId(1));
        assert_eq!(last.switch_lsn, promoted.switch_lsn);
        assert!(last.reason.contains("term 7"), "{:?}", last.reason);
        assert_eq!(fence.term(), Some(7));
        // Promoted, but not yet granted: the failover actor grants after the promotion.
        assert!(matches!(
            try_append(&s, "early").await,
            Err(AppendError::NotLeader { term: Some(7) })
        ));
        fence.grant(7, lasting());
        assert!(append(&s, "after").await > promoted.switch_lsn);
        stop(s).await;
        stop(p).await;
    });
}
