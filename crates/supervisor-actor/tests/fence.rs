//! The fence over real nodes on loopback: a closed fence refuses appends before anything is
//! written, a grant lets them through, and a grant whose deadline passes while an append waits
//! for a synchronous standby turns the answer into an indeterminate outcome.

mod common;
use common::*;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use supervisor_actor::{
    AppendError, AppendRecords, Durability, Fence, GetNodeStatus, Node, NodeBuilder,
};

/// A primary whose synchronous standby never connects: a synchronous append waits until
/// the fence or a timeout ends the wait.
async fn with_absent_standby(dir: &Path, fence: Fence) -> Node {
    primary(&dir.join("data"))
        .fence(fence)
        .synchronous_standby_names("never_connects")
        .unwrap()
        .start()
        .await
        .unwrap()
}

#[test]
fn a_closed_fence_refuses_and_a_grant_lets_appends_through() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let fence = Fence::closed();
        let node = primary(&dir.path().join("data"))
            .fence(fence.clone())
            .start()
            .await
            .unwrap();
        let before = node.wal.flushed();
        match try_append(&node, "fenced", Durability::Local).await {
            Err(AppendError::NotLeader { term: None }) => {}
            other => panic!("expected NotLeader, got {other:?}"),
        }
        assert_eq!(
            node.wal.flushed(),
            before,
            "a refused append writes nothing"
        );

        fence.grant(3, Instant::now() + Duration::from_secs(600));
        let appended = try_append(&node, "fenced", Durability::Local)
            .await
            .unwrap();
        assert!(appended.end_lsn > before);
        let status = node.supervisor.send(GetNodeStatus).await.unwrap().unwrap();
        assert_eq!(status.term, Some(3));

        fence.revoke();
        let at_revoke = node.wal.flushed();
        let e = try_append(&node, "fenced", Durability::Local)
            .await
            .unwrap_err();
        assert!(
            matches!(e, AppendError::NotLeader { term: Some(3) }),
            "{e:?}"
        );
        assert!(e.to_string().contains("leadership"), "{e}");
        assert!(!e.is_indeterminate());
        assert_eq!(node.wal.flushed(), at_revoke);
        stop(node).await;
    });
}

#[test]
fn an_open_fence_acknowledges_as_before_and_shows_no_term() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let node = NodeBuilder::primary(dir.path().join("data"))
            .listen("127.0.0.1:0".parse().unwrap())
            .segment_size(1 << 20)
            .io_threads(0)
            .start()
            .await
            .unwrap();
        try_append(&node, "fenced", Durability::Local)
            .await
            .unwrap();
        let status = node.supervisor.send(GetNodeStatus).await.unwrap().unwrap();
        assert_eq!(status.term, None);
        stop(node).await;
    });
}

#[test]
fn a_deadline_that_passes_during_the_synchronous_wait_makes_the_append_indeterminate() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let fence = Fence::closed();
        let node = with_absent_standby(dir.path(), fence.clone()).await;
        let grant = Duration::from_millis(300);
        let granted = Instant::now();
        fence.grant(1, granted + grant);
        let e = try_append(&node, "fenced", Durability::On)
            .await
            .unwrap_err();
        let AppendError::Indeterminate { end_lsn, reason } = &e else {
            panic!("expected Indeterminate, got {e:?}");
        };
        assert!(e.is_indeterminate());
        assert!(
            granted.elapsed() >= grant,
            "answered before the deadline passed"
        );
        assert!(reason.contains("term 1"), "{reason}");
        assert!(
            node.wal.flushed() >= *end_lsn,
            "the records are durable here although not acknowledged"
        );
        stop(node).await;
    });
}

#[test]
fn a_revocation_during_the_synchronous_wait_answers_at_once() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let fence = Fence::closed();
        let node = with_absent_standby(dir.path(), fence.clone()).await;
        // A grant far longer than the test's deadline: only the revocation can end the wait.
        fence.grant(2, Instant::now() + Duration::from_secs(3600));
        let pending = node.supervisor.send(AppendRecords {
            records: vec![Bytes::from_static(b"waits")],
            durability: Some(Durability::On),
        });
        let mut pending = Box::pin(pending);
        // The append is written before the revocation: wait for it to be durable here.
        let mut pos = node.wal.subscribe();
        let start = node.wal.flushed();
        tokio::select! {
            r = pos.wait_for(|p| p.flushed > start) => { r.unwrap(); }
            r = &mut pending => panic!("answered before the fence closed: {r:?}"),
        }
        fence.revoke();
        let e = tokio::time::timeout(DEADLINE, pending)
            .await
            .expect("answered by the deadline")
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, AppendError::Indeterminate { .. }), "{e:?}");
        stop(node).await;
    });
}

#[test]
fn a_synchronous_wait_that_times_out_is_indeterminate() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let node = primary(&dir.path().join("data"))
            .fence(Fence::open())
            .synchronous_standby_names("never_connects")
            .unwrap()
            .synchronous_wait_timeout(Some(Duration::from_millis(100)))
            .start()
            .await
            .unwrap();
        let e = try_append(&node, "fenced", Durability::On)
            .await
            .unwrap_err();
        assert!(matches!(e, AppendError::NotConfirmed { .. }), "{e:?}");
        assert!(e.is_indeterminate());
        assert!(e.to_string().starts_with("indeterminate"), "{e}");
        stop(node).await;
    });
}
