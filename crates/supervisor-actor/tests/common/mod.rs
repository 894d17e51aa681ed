//! Helpers of the node tests: run in a System, make a primary or a standby on loopback,
//! append, read a node's role and records, stop it; every wait bounded by one deadline.

#![allow(dead_code)]

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use supervisor_actor::{
    AppendError, AppendRecords, Appended, Durability, Follow, GetNodeStatus, Node, NodeBuilder,
    NodeRole, RecordEvent, ShutdownNode,
};
use wal_storage::{Lsn, TimelineId};

/// Every wait in these tests ends by this deadline, so a regression fails instead of hanging.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub fn run<F: Future>(f: F) -> F::Output {
    actix_rt::System::new().block_on(f)
}

pub async fn stop(node: Node) {
    node.supervisor
        .send(ShutdownNode { immediate: true })
        .await
        .unwrap();
}

/// Every record `node` shows from `from` to its current end: (timeline, end, payload).
pub async fn records(node: &Node, from: Lsn) -> Vec<(TimelineId, Lsn, Bytes)> {
    let events: Vec<_> = tokio::time::timeout(
        DEADLINE,
        node.records(from, Follow::UntilCurrentEnd)
            .collect::<Vec<_>>(),
    )
    .await
    .expect("read by the deadline");
    events
        .into_iter()
        .filter_map(|e| match e.unwrap() {
            RecordEvent::Record {
                timeline,
                end,
                payload,
                ..
            } => Some((timeline, end, payload)),
            RecordEvent::TimelineSwitch { .. } => None,
        })
        .collect()
}

/// A primary on loopback (any free port) with 1 MiB segments, its connections on the test's
/// own thread.
pub fn primary(dir: &Path) -> NodeBuilder {
    NodeBuilder::primary(dir)
        .listen("127.0.0.1:0".parse().unwrap())
        .segment_size(1 << 20)
        .io_threads(0)
}

/// How a standby reaches `upstream`.
pub fn conninfo(upstream: &Node) -> String {
    format!("host=127.0.0.1 port={} user=r", upstream.listen_addr.port())
}

/// A standby of `upstream` named `name` (its `application_name` there), on loopback.
pub fn standby_of(upstream: &Node, dir: &Path, name: &str) -> NodeBuilder {
    standby_from(&conninfo(upstream), dir, name)
}

/// A standby that connects as `conninfo` says, named `name`, on loopback.
pub fn standby_from(conninfo: &str, dir: &Path, name: &str) -> NodeBuilder {
    NodeBuilder::standby(dir, conninfo)
        .unwrap()
        .cluster_name(name)
        .listen("127.0.0.1:0".parse().unwrap())
        .io_threads(0)
}

/// Appends one record at `durability`; the node's answer, by the deadline.
pub async fn try_append(
    node: &Node,
    record: impl Into<Bytes>,
    durability: Durability,
) -> Result<Appended, AppendError> {
    tokio::time::timeout(
        DEADLINE,
        node.supervisor.send(AppendRecords {
            records: vec![record.into()],
            durability: Some(durability),
        }),
    )
    .await
    .expect("the append is answered by the deadline")
    .expect("the supervisor runs")
}

/// Appends one record at `durability`; where it ends. Panics if it is refused.
pub async fn append(node: &Node, record: impl Into<Bytes>, durability: Durability) -> Lsn {
    try_append(node, record, durability).await.unwrap().end_lsn
}

/// The node's role now.
pub async fn role(node: &Node) -> NodeRole {
    node.supervisor
        .send(GetNodeStatus)
        .await
        .unwrap()
        .unwrap()
        .role
}
