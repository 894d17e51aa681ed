//! The fence over real nodes on loopback: a closed fence refuses appends before anything is
//! written, a grant lets them through, and a grant whose deadline passes while an append waits
//! for a synchronous standby turns the answer into an indeterminate outcome. A client sees a
//! primary whose fence is closed as read-only, so that a standby looking for a writable server
//! passes it by.

mod common;
use common::*;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_codec::BackendMessage;
use repl_client::ReplClient;
use supervisor_actor::{
    AppendError, AppendRecords, Durability, Fence, GetNodeStatus, Node, NodeBuilder,
};

/// A primary behind `fence`, its data directory `dir`.
async fn fenced_primary(dir: &Path, fence: Fence) -> Node {
    primary(dir).fence(fence).start().await.unwrap()
}

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
        let node = fenced_primary(&dir.path().join("data"), fence.clone()).await;
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

/// The value of `SHOW name` on `client`.
fn show(client: &mut ReplClient, name: &str) -> String {
    let msgs = client.simple_query(&format!("SHOW {name}")).unwrap();
    let row = msgs.iter().find_map(|m| match m {
        BackendMessage::DataRow(row) => row.first().cloned().flatten(),
        _ => None,
    });
    String::from_utf8(row.unwrap_or_else(|| panic!("no row in {msgs:?}")).to_vec()).unwrap()
}

/// A new connection's view of the node at `addr`: its greeting's
/// `default_transaction_read_only` and `in_hot_standby`, and its SHOW of
/// `transaction_read_only`. Run off the node's thread, since the client blocks.
async fn seen_by_a_new_client(addr: SocketAddr) -> [String; 3] {
    tokio::task::spawn_blocking(move || {
        let mut c = ReplClient::connect(addr, "r", None, "looks").unwrap();
        let greeting = |name: &str| {
            c.param(name)
                .unwrap_or_else(|| panic!("{name}"))
                .to_string()
        };
        let seen = [
            greeting("default_transaction_read_only"),
            greeting("in_hot_standby"),
            show(&mut c, "transaction_read_only"),
        ];
        c.close();
        seen
    })
    .await
    .unwrap()
}

/// Connects anew until a new client's greeting says `default_transaction_read_only = want`:
/// a change of the fence reaches the walsenders through the supervisor, a moment after it is
/// made. Each turn is a connection's round trip; the whole is bounded by the deadline.
async fn read_only_to_new_clients(addr: SocketAddr, want: &str, after: &str) {
    let deadline = Instant::now() + DEADLINE;
    while seen_by_a_new_client(addr).await[0] != want {
        assert!(
            Instant::now() < deadline,
            "read-only never {want} after {after}"
        );
    }
}

#[test]
fn a_primary_whose_fence_is_closed_shows_itself_read_only() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let fence = Fence::closed();
        let node = fenced_primary(&dir.path().join("data"), fence.clone()).await;
        let addr = node.listen_addr;
        assert_eq!(seen_by_a_new_client(addr).await, ["on", "off", "on"]);

        // A connection opened while the fence is closed sees the grant: SHOW answers with
        // the role of the moment it is asked. The grant reaches the walsender through the
        // supervisor, so its SHOW is asked again until then (each a round trip, by the
        // deadline).
        let open = tokio::task::spawn_blocking(move || {
            ReplClient::connect(addr, "r", None, "stays").unwrap()
        })
        .await
        .unwrap();
        fence.grant(1, Instant::now() + Duration::from_secs(600));
        let open = tokio::task::spawn_blocking(move || {
            let mut c = open;
            let deadline = Instant::now() + DEADLINE;
            while show(&mut c, "default_transaction_read_only") != "off" {
                assert!(Instant::now() < deadline, "SHOW never saw the grant");
            }
            assert_eq!(show(&mut c, "transaction_read_only"), "off");
            c
        })
        .await
        .unwrap();
        assert_eq!(seen_by_a_new_client(addr).await, ["off", "off", "off"]);

        // Revoked, and read-only again for every new client.
        fence.revoke();
        read_only_to_new_clients(addr, "on", "a revocation").await;
        // A grant that runs out with no one revoking it closes the fence all the same.
        fence.grant(2, Instant::now() + Duration::from_millis(300));
        read_only_to_new_clients(addr, "off", "a short grant").await;
        fence.next_change().await;
        read_only_to_new_clients(addr, "on", "the grant's end").await;
        open.close();
        stop(node).await;
    });
}

#[test]
fn a_standby_looking_for_a_writable_server_passes_a_fenced_primary_by() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let fenced = fenced_primary(&dir.path().join("fenced"), Fence::closed()).await;
        let open = primary(&dir.path().join("open")).start().await.unwrap();
        let end = append(&open, "for the standby", Durability::Local).await;
        let conninfo = format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=r target_session_attrs=read-write",
            fenced.listen_addr.port(),
            open.listen_addr.port()
        );
        let standby = standby_from(&conninfo, &dir.path().join("standby"), "s")
            .start()
            .await
            .unwrap();
        let mut pos = standby.wal.subscribe();
        tokio::time::timeout(DEADLINE, pos.wait_for(|p| p.flushed >= end))
            .await
            .expect("the standby streams from the open primary by the deadline")
            .unwrap();
        assert_eq!(standby.wal.system_id(), open.wal.system_id());
        let status = standby
            .supervisor
            .send(GetNodeStatus)
            .await
            .unwrap()
            .unwrap();
        let receiver = status
            .wal_receiver
            .expect("a walreceiver")
            .status
            .expect("its status");
        assert_eq!(
            receiver.sender_port,
            Some(open.listen_addr.port()),
            "{receiver:?}"
        );
        stop(standby).await;
        stop(open).await;
        stop(fenced).await;
    });
}
