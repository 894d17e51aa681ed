//! What readers see, over real nodes on loopback: on a primary with a synchronous standby and
//! a synchronous default durability, records end where the standby confirmed, not at the
//! local flush, also after a restart with WAL flushed here but never confirmed; without
//! synchronous standbys the local flush is the end, as before.

mod common;
use common::*;

use std::path::Path;

use bytes::Bytes;
use futures_util::StreamExt;
use supervisor_actor::{Durability, Follow, Node, RecordEvent};
use wal_storage::Lsn;

/// A primary whose synchronous standby is `s`, with `synchronous_commit = on`.
async fn synchronous_primary(dir: &Path) -> Node {
    primary(dir)
        .synchronous_standby_names("s")
        .unwrap()
        .synchronous_commit(Durability::On)
        .start()
        .await
        .unwrap()
}

#[test]
fn records_end_where_the_synchronous_standby_confirmed_also_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("p");
    let (from, end) = run(async {
        let p = synchronous_primary(&data).await;
        let from = p.wal.flushed();
        // Durable here (`local`), never confirmed: no standby is connected.
        let end = append(&p, "unconfirmed", Durability::Local).await;
        assert!(p.wal.flushed() >= end);
        assert!(*p.acknowledged().borrow() < end);
        assert!(
            payloads(&p, from).await.is_empty(),
            "unacknowledged WAL shown"
        );
        stop(p).await;
        (from, end)
    });
    run(async {
        let p = synchronous_primary(&data).await;
        assert!(p.wal.flushed() >= end, "the WAL is still here");
        assert!(*p.acknowledged().borrow() < end);
        assert!(
            payloads(&p, from).await.is_empty(),
            "unconfirmed WAL shown after a restart"
        );
        let mut follower = Box::pin(p.records(from, Follow::Forever));

        let conninfo = format!("host=127.0.0.1 port={} user=r", p.listen_addr.port());
        let s = standby_from(&conninfo, &dir.path().join("s"), "s")
            .start()
            .await
            .unwrap();
        // The record comes out once the standby has confirmed it, not before.
        let ev = tokio::time::timeout(DEADLINE, follower.next())
            .await
            .expect("a record by the deadline");
        match ev {
            Some(Ok(RecordEvent::Record {
                payload, end: e, ..
            })) => {
                assert_eq!(payload, "unconfirmed");
                assert_eq!(e, end);
            }
            other => panic!("{other:?}"),
        }
        assert!(s.wal.flushed() >= end, "given before the standby had it");
        assert!(*p.acknowledged().borrow() >= end);
        assert_eq!(payloads(&p, from).await, vec![Bytes::from("unconfirmed")]);
        stop(s).await;
        stop(p).await;
    });
}

#[test]
fn without_synchronous_standbys_the_local_flush_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let p = primary(&dir.path().join("p")).start().await.unwrap();
        let from = p.wal.flushed();
        let end = append(&p, "local", Durability::Local).await;
        assert_eq!(payloads(&p, from).await, vec![Bytes::from("local")]);
        let mut acknowledged = p.acknowledged();
        tokio::time::timeout(DEADLINE, acknowledged.wait_for(|a| *a >= end))
            .await
            .expect("acknowledged by the deadline")
            .unwrap();
        stop(p).await;
    });
}

async fn payloads(node: &Node, from: Lsn) -> Vec<Bytes> {
    records(node, from)
        .await
        .into_iter()
        .map(|(_, _, p)| p)
        .collect()
}
