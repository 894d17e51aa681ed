//! The builder's common cases, over real sockets on loopback: a primary made on its first start
//! and opened on the next, the directories it refuses, a standby that makes itself from its
//! upstream, stays a standby across restarts and starts as a primary once promoted (even when
//! a crash kept promotion from removing `standby.signal`), and a standby made from a copy of a
//! primary's directory.

mod common;
use common::*;

use supervisor_actor::datadir::StandbySignal;
use supervisor_actor::{Durability, NodeBuilder, NodeError, NodeRole};
use wal_storage::{Role, StorageConfig, TimelineId, Wal};

#[test]
fn a_primary_is_made_on_its_first_start_and_opened_on_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (system_id, end) = run(async {
        let node = primary(&data).start().await.unwrap();
        assert_eq!(role(&node).await, NodeRole::Primary);
        assert_eq!(node.wal.segment_size(), 1 << 20);
        let end = append(&node, "kept", Durability::Local).await;
        let id = node.wal.system_id();
        stop(node).await;
        (id, end)
    });
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&data).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    run(async {
        let node = primary(&data).start().await.unwrap();
        assert_eq!(node.wal.system_id(), system_id, "opened, not made again");
        assert_eq!(node.wal.flushed(), end);
        stop(node).await;
    });
}

#[test]
fn a_primary_refuses_a_foreign_directory_and_a_standby_s() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let data = dir.path().join("data");
    run(async {
        let e = primary(&foreign).start().await.err().expect("refused");
        assert!(matches!(e, NodeError::NotADataDirectory { .. }), "{e}");
        assert!(foreign.join("notes.txt").exists());
        stop(primary(&data).start().await.unwrap()).await;
    });
    StandbySignal::default().write(&data).unwrap();
    run(async {
        let e = primary(&data).start().await.err().expect("refused");
        assert!(matches!(e, NodeError::StandbyDirectory { .. }), "{e}");
    });
}

#[test]
fn invalid_synchronous_standby_names_are_refused_by_the_setter() {
    let e = NodeBuilder::primary("/nonexistent")
        .synchronous_standby_names("FIRST x (a)")
        .err()
        .expect("refused");
    assert!(e.to_string().contains("synchronous_standby_names"), "{e}");
    assert!(NodeBuilder::standby("/nonexistent", "host=h bogus=1").is_err());
}

#[test]
fn a_standby_makes_itself_from_its_upstream_and_starts_as_a_primary_once_promoted() {
    let dir = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (dir.path().join("p"), dir.path().join("s"));
    let (system_id, end) = run(async {
        let primary = primary(&p_dir)
            .synchronous_standby_names("replica")
            .unwrap()
            .start()
            .await
            .unwrap();
        let standby = standby_of(&primary, &s_dir, "replica")
            .start()
            .await
            .unwrap();
        assert_eq!(standby.wal.system_id(), primary.wal.system_id());
        assert_eq!(standby.wal.segment_size(), 1 << 20, "the upstream's");
        assert_eq!(role(&standby).await, NodeRole::Standby);
        // The standby is synchronous: the append returns once it has flushed the record.
        let end = append(&primary, "replicated", Durability::On).await;
        assert!(standby.wal.flushed() >= end);
        let signal = StandbySignal::read(&s_dir).unwrap().expect("a standby");
        assert!(signal
            .primary_conninfo
            .unwrap()
            .contains(&primary.listen_addr.port().to_string()));
        let id = primary.wal.system_id();
        stop(standby).await;
        stop(primary).await;
        (id, end)
    });
    run(async {
        let primary = primary(&p_dir).start().await.unwrap();
        let standby = standby_of(&primary, &s_dir, "replica")
            .start()
            .await
            .unwrap();
        assert_eq!(role(&standby).await, NodeRole::Standby, "still a standby");
        assert_eq!(standby.wal.system_id(), system_id);
        assert!(standby.wal.flushed() >= end);
        stop(standby).await;
        stop(primary).await;
    });
    // A crash between promotion's two steps: storage's control data says primary on
    // timeline 2 (its commit point), and standby.signal, which promotion removes next, is
    // still there. The node comes up as the primary of timeline 2 and takes appends.
    let signal = StandbySignal::read(&s_dir)
        .unwrap()
        .expect("a standby's signal");
    assert_eq!(
        signal.standby_since,
        Some(TimelineId(1)),
        "written at its first start"
    );
    let cfg = StorageConfig {
        segment_size: 1 << 20,
        ..StorageConfig::default()
    };
    let (tli, switch) = Wal::open(&s_dir, cfg)
        .unwrap()
        .promote("crash test")
        .unwrap();
    assert_eq!(tli, TimelineId(2));
    assert!(StandbySignal::path(&s_dir).exists());
    run(async {
        let upstream = primary(&p_dir).start().await.unwrap();
        let node = standby_of(&upstream, &s_dir, "replica")
            .start()
            .await
            .unwrap();
        assert_eq!(role(&node).await, NodeRole::Primary);
        assert_eq!(node.wal.timeline(), TimelineId(2));
        let after = append(&node, "after the crash", Durability::Local).await;
        assert!(after > switch);
        assert!(
            !StandbySignal::path(&s_dir).exists(),
            "the leftover signal is removed"
        );
        stop(node).await;
        stop(upstream).await;
    });
    run(async {
        let node = primary(&s_dir).start().await.unwrap();
        assert_eq!(role(&node).await, NodeRole::Primary, "and stays a primary");
        stop(node).await;
    });
}

/// A standby made from a copy of a primary's data directory, with a `standby.signal`
/// written into it (as after a base backup, and as `walserver rejoin` leaves a directory
/// between its two steps, the signal and then the role): the control data says primary, the
/// signal was never started with, so the node is a standby; its first start records that in
/// the control data and it streams from the primary.
#[test]
fn a_copy_of_a_primary_with_a_standby_signal_is_a_standby() {
    let dir = tempfile::tempdir().unwrap();
    let (p_dir, copy) = (dir.path().join("p"), dir.path().join("copy"));
    run(async { stop(primary(&p_dir).start().await.unwrap()).await });
    std::fs::create_dir(&copy).unwrap();
    for d in ["pg_wal", "slots"] {
        std::fs::create_dir(copy.join(d)).unwrap();
        for e in std::fs::read_dir(p_dir.join(d)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), copy.join(d).join(e.file_name())).unwrap();
        }
    }
    for f in ["control", "flush_pointer"] {
        std::fs::copy(p_dir.join(f), copy.join(f)).unwrap();
    }
    assert_eq!(Wal::stored_role(&copy).unwrap().0, Some(Role::Primary));
    run(async {
        let upstream = primary(&p_dir)
            .synchronous_standby_names("replica")
            .unwrap()
            .start()
            .await
            .unwrap();
        let conninfo = format!("host=127.0.0.1 port={} user=r", upstream.listen_addr.port());
        StandbySignal {
            primary_conninfo: Some(conninfo),
            primary_slot_name: None,
            standby_since: None,
        }
        .write(&copy)
        .unwrap();
        // Started as a primary, it is refused; started as a standby, it is one.
        let e = primary(&copy).start().await.err().expect("refused");
        assert!(matches!(e, NodeError::StandbyDirectory { .. }), "{e}");
        let node = standby_of(&upstream, &copy, "replica")
            .start()
            .await
            .unwrap();
        assert_eq!(role(&node).await, NodeRole::Standby);
        assert_eq!(
            node.wal.role(),
            Some(Role::Standby),
            "recorded at its first start"
        );
        let end = append(&upstream, "replicated", Durability::On).await;
        assert!(node.wal.flushed() >= end);
        stop(node).await;
        stop(upstream).await;
    });
}
