//! A walserver primary streams to a walreceiver over a real socket: byte-identical WAL,
//! status, a promotion followed on the same connection, small in-flight bounds.

use wal_storage::{Lsn, TimelineId};
use walreceiver_actor::messages::{GetReceiverStatus, StopReceiver};
use walreceiver_actor::{ReceiverState, StopReason};

use crate::common::*;

#[actix_rt::test]
async fn streams_byte_identical_wal_and_reports_its_status() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let primary = Primary::start(primary_wal(dirs.0.path()), Access::Trust);
    // WAL that exists before the standby connects, across several segments.
    append(&primary.wal, 300, 10_000).await;
    let standby = standby_wal(dirs.1.path(), SYSTEM);
    let mut r = Receiving::start(receiver_config(primary.conninfo("")), &standby);
    assert_eq!(r.streaming().await, (TimelineId(1), Lsn(SEGMENT)));
    // And WAL appended while it streams.
    for _ in 0..5 {
        append(&primary.wal, 50, 3_000).await;
    }
    let end = primary.wal.flushed();
    r.wait_flushed(&standby, TimelineId(1), end).await;
    assert_eq!(standby.flushed(), end);
    assert_same_wal(&primary.wal, &standby, TimelineId(1), Lsn(SEGMENT), end);
    // The records decode on the standby as they were appended.
    let records = standby
        .read_records(TimelineId(1), Lsn(SEGMENT + 24), 1000)
        .unwrap();
    assert_eq!(records.len(), 550);
    assert!(records[299]
        .payload
        .iter()
        .all(|&b| u64::from(b) == 299 % 251));

    let st = r.addr.send(GetReceiverStatus).await.unwrap();
    assert_eq!(st.status, ReceiverState::Streaming);
    assert_eq!(st.receive_start_lsn, Some(Lsn(SEGMENT)));
    assert_eq!(st.receive_start_tli, Some(TimelineId(1)));
    assert_eq!(st.flushed_lsn, Some(end));
    assert_eq!(st.written_lsn, Some(end));
    assert_eq!(st.received_tli, Some(TimelineId(1)));
    assert_eq!(st.sender_host.as_deref(), Some("127.0.0.1"));
    assert_eq!(st.sender_port, Some(primary.addr.port()));
    assert!(st.last_msg_receipt_time.is_some() && st.latest_end_lsn.is_some());
    assert!(!st.conninfo.contains("password"), "{}", st.conninfo);
    // The primary sees one walsender, named as configured.
    let rows = primary.replication().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].application_name, "standby_test");

    r.addr.send(StopReceiver).await.unwrap();
    let stopped = r.stopped().await;
    assert_eq!(stopped.reason, StopReason::ShutdownRequested);
    assert_eq!(stopped.status.flushed_lsn, Some(end));
}

#[actix_rt::test]
async fn follows_a_promotion_on_the_same_connection() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let primary = Primary::start(primary_wal(dirs.0.path()), Access::Trust);
    append(&primary.wal, 100, 5_000).await;
    let standby = standby_wal(dirs.1.path(), SYSTEM);
    let mut r = Receiving::start(receiver_config(primary.conninfo("")), &standby);
    assert_eq!(r.streaming().await.0, TimelineId(1));
    append(&primary.wal, 100, 5_000).await;
    let pid = primary.replication().await[0].pid;

    // The primary starts timeline 2 while the walreceiver streams.
    let (tli, switch) = promote(&primary.wal).await;
    assert_eq!(tli, TimelineId(2));
    // The stream of timeline 1 ends at the switch; the next begins there, with no stop.
    assert_eq!(r.streaming().await, (TimelineId(2), switch));
    append(&primary.wal, 100, 5_000).await;
    let end = primary.wal.flushed();
    r.wait_flushed(&standby, TimelineId(2), end).await;

    assert_eq!(standby.timeline(), TimelineId(2));
    assert_eq!(standby.history(), primary.wal.history());
    assert_eq!(
        standby.history_file(TimelineId(2)).unwrap(),
        primary.wal.history_file(TimelineId(2)).unwrap()
    );
    assert_same_wal(&primary.wal, &standby, TimelineId(1), Lsn(SEGMENT), switch);
    assert_same_wal(&primary.wal, &standby, TimelineId(2), Lsn(SEGMENT), end);
    // Still the first and only connection.
    let rows = primary.replication().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].pid, pid);
    assert_eq!(rows[0].timeline, Some(TimelineId(2)));
    assert!(!r.has_event(), "no other event");
}

#[actix_rt::test]
async fn a_standby_behind_a_switch_streams_the_old_timeline_then_follows() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let primary = Primary::start(primary_wal(dirs.0.path()), Access::Trust);
    append(&primary.wal, 100, 5_000).await;
    let (_, switch) = promote(&primary.wal).await;
    append(&primary.wal, 100, 5_000).await;
    // A standby still on timeline 1 at its very start.
    let standby = standby_wal(dirs.1.path(), SYSTEM);
    let mut r = Receiving::start(receiver_config(primary.conninfo("")), &standby);
    assert_eq!(r.streaming().await, (TimelineId(1), Lsn(SEGMENT)));
    assert_eq!(r.streaming().await, (TimelineId(2), switch));
    let end = primary.wal.flushed();
    r.wait_flushed(&standby, TimelineId(2), end).await;
    assert_same_wal(&primary.wal, &standby, TimelineId(2), Lsn(SEGMENT), end);
}

#[actix_rt::test]
async fn a_tiny_in_flight_bound_still_streams_everything() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let primary = Primary::start(primary_wal(dirs.0.path()), Access::Trust);
    append(&primary.wal, 400, 8_000).await;
    let standby = standby_wal(dirs.1.path(), SYSTEM);
    let mut config = receiver_config(primary.conninfo(""));
    // Smaller than one XLogData (128 KiB): each waits for the one before to be durable.
    config.max_wal_in_flight = 64 << 10;
    let mut r = Receiving::start(config, &standby);
    r.streaming().await;
    let end = primary.wal.flushed();
    r.wait_flushed(&standby, TimelineId(1), end).await;
    assert_same_wal(&primary.wal, &standby, TimelineId(1), Lsn(SEGMENT), end);
}

#[actix_rt::test]
async fn a_standby_made_by_init_standby_streams() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let primary = Primary::start(primary_wal(dirs.0.path()), Access::Trust);
    append(&primary.wal, 250, 10_000).await;
    let (_, switch) = promote(&primary.wal).await;
    append(&primary.wal, 150, 10_000).await;
    let conninfo = primary.conninfo("");
    let id = walreceiver_actor::fetch_upstream_identity(&conninfo, None, "init")
        .await
        .unwrap();
    assert_eq!(id.system_id, SYSTEM);
    assert_eq!(id.timeline, TimelineId(2));
    assert_eq!(id.segment_size, SEGMENT);
    assert_eq!(id.format, wal_storage::WalFormat::Walserver);
    assert_eq!(id.xlogpos, primary.wal.flushed());
    assert_eq!(id.history, primary.wal.history());
    assert_eq!(
        id.history_files,
        vec![(
            TimelineId(2),
            primary.wal.history_file(TimelineId(2)).unwrap().unwrap()
        )]
    );
    assert_eq!(id.start_lsn(), id.xlogpos.segment_start(SEGMENT));
    assert!(
        id.start_lsn() > switch.segment_start(SEGMENT),
        "starts on timeline 2"
    );

    let dir = dirs.1.path().join("standby");
    let standby = tokio::task::spawn_blocking({
        let id = id.clone();
        move || walreceiver_actor::init_standby(dir, keeping_config(), &id)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(standby.system_id(), SYSTEM);
    assert_eq!(standby.timeline(), TimelineId(2));
    assert_eq!(standby.flushed(), id.start_lsn());
    let mut r = Receiving::start(receiver_config(conninfo), &standby);
    assert_eq!(r.streaming().await, (TimelineId(2), id.start_lsn()));
    append(&primary.wal, 10, 100).await;
    let end = primary.wal.flushed();
    r.wait_flushed(&standby, TimelineId(2), end).await;
    assert_same_wal(&primary.wal, &standby, TimelineId(2), id.start_lsn(), end);
}
