//! Helpers of the node tests: run in a System, stop a node, read its records, all bounded by
//! one deadline.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use supervisor_actor::{Follow, Node, RecordEvent, ShutdownNode};
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
