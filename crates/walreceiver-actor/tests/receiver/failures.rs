//! How a walreceiver ends: refused upstreams, failed logins, a killed or shut down upstream,
//! a silent one, and a stop while still connecting.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use protocol_codec::messages::{TransactionStatus, XLogData};
use protocol_codec::{
    results, AuthRequest, BackendMessage, FrontendMessage, ServerCodec, StartupCodec, StartupPacket,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::codec::FramedRead;
use wal_storage::{Lsn, PgTimestamp, SystemId, TimelineId};
use walreceiver_actor::messages::StopReceiver;
use walreceiver_actor::{ReceiverError, StopReason};

use crate::common::*;

fn failure(reason: &StopReason) -> &ReceiverError {
    match reason {
        StopReason::Failed(e) => e,
        other => panic!("expected a failure, got {other}"),
    }
}

#[actix_rt::test]
async fn refuses_an_upstream_with_another_system_identifier() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let primary = Primary::start(primary_wal(dirs.0.path()), Access::Trust);
    let standby = standby_wal(dirs.1.path(), SystemId(1234));
    let mut r = Receiving::start(receiver_config(primary.conninfo("")), &standby);
    let stopped = r.stopped().await;
    assert_eq!(
        *failure(&stopped.reason),
        ReceiverError::SystemIdMismatch {
            local: SystemId(1234),
            upstream: SYSTEM
        }
    );
    assert_eq!(standby.flushed(), Lsn(SEGMENT), "nothing was written");
}

#[actix_rt::test]
async fn a_start_point_the_upstream_removed_is_its_58p01() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A primary that keeps no WAL for anyone: segment 1 goes once it is behind.
    let wal = wal_storage::Wal::init(
        dirs.0.path(),
        storage_config(),
        wal_storage::InitOptions::primary(SYSTEM, wal_storage::WalFormat::Walserver),
    )
    .unwrap();
    let primary = Primary::start(wal, Access::Trust);
    append(&primary.wal, 400, 10_000).await;
    let wal = primary.wal.clone();
    tokio::task::spawn_blocking(move || wal.run_retention())
        .await
        .unwrap()
        .unwrap();
    assert!(primary.wal.oldest_retained() > Lsn(SEGMENT));
    let standby = standby_wal(dirs.1.path(), SYSTEM);
    let mut r = Receiving::start(receiver_config(primary.conninfo("")), &standby);
    // The upstream refuses inside the copy, before any WAL. It may answer the walreceiver's
    // first status update before it finds the segment missing, and then the stream was
    // announced first.
    let stopped = match r.next_event().await {
        Event::Streaming(_) => r.stopped().await,
        Event::Stopped(s) => *s,
    };
    let e = failure(&stopped.reason);
    assert_eq!(e.sqlstate(), Some("58P01"), "{e}");
    assert!(e.to_string().contains("has already been removed"), "{e}");
}

#[actix_rt::test]
async fn authenticates_with_scram_and_reports_a_wrong_password() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let access = Access::Scram {
        user: "repl",
        password: "s3cret pass",
    };
    let primary = Primary::start(primary_wal(dirs.0.path()), access);
    append(&primary.wal, 20, 1000).await;
    let standby = standby_wal(dirs.1.path(), SYSTEM);

    let mut r = Receiving::start(
        receiver_config(primary.conninfo("password='wrong'")),
        &standby,
    );
    let e = failure(&r.stopped().await.reason).clone();
    assert_eq!(e.sqlstate(), Some("28P01"), "{e}");

    let mut r = Receiving::start(
        receiver_config(primary.conninfo("password='s3cret pass'")),
        &standby,
    );
    r.streaming().await;
    let end = primary.wal.flushed();
    r.wait_flushed(&standby, TimelineId(1), end).await;
    assert_same_wal(&primary.wal, &standby, TimelineId(1), Lsn(SEGMENT), end);
    let stopped_status = {
        r.addr.send(StopReceiver).await.unwrap();
        r.stopped().await.status
    };
    assert!(
        !stopped_status.conninfo.contains("s3cret"),
        "{}",
        stopped_status.conninfo
    );
}

#[actix_rt::test]
async fn a_killed_upstream_is_reported_at_once() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let primary = Primary::start(primary_wal(dirs.0.path()), Access::Trust);
    append(&primary.wal, 20, 1000).await;
    let standby = standby_wal(dirs.1.path(), SYSTEM);
    let mut r = Receiving::start(receiver_config(primary.conninfo("")), &standby);
    r.streaming().await;
    r.wait_flushed(&standby, TimelineId(1), primary.wal.flushed())
        .await;
    let killed = Instant::now();
    primary.kill();
    let stopped = r.stopped().await;
    let e = failure(&stopped.reason);
    assert!(
        matches!(
            e,
            ReceiverError::UpstreamClosed { .. } | ReceiverError::Io { .. }
        ),
        "{e}"
    );
    // Far below wal_receiver_timeout (60 s): the closed socket said it.
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
}

#[actix_rt::test]
async fn an_upstream_shutdown_is_reported_with_its_sqlstate() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let primary = Primary::start(primary_wal(dirs.0.path()), Access::Trust);
    let standby = standby_wal(dirs.1.path(), SYSTEM);
    let mut r = Receiving::start(receiver_config(primary.conninfo("")), &standby);
    r.streaming().await;
    primary.shutdown_walsenders().await;
    let stopped = r.stopped().await;
    assert_eq!(failure(&stopped.reason).sqlstate(), Some("57P01"));
}

#[actix_rt::test]
async fn a_refused_connection_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let standby = standby_wal(dir.path(), SYSTEM);
    // A port nobody listens on: bind, learn the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conninfo = protocol_codec::conninfo::ConnInfo::parse(&format!(
        "host=127.0.0.1 port={port} user=repl sslmode=disable"
    ))
    .unwrap();
    let mut r = Receiving::start(receiver_config(conninfo), &standby);
    let stopped = r.stopped().await;
    assert!(
        matches!(failure(&stopped.reason), ReceiverError::Connect { .. }),
        "{}",
        stopped.reason
    );
}

#[actix_rt::test]
async fn stops_at_once_while_the_upstream_never_answers() {
    let dir = tempfile::tempdir().unwrap();
    let standby = standby_wal(dir.path(), SYSTEM);
    // Connections are queued by the kernel and never accepted: the startup packet goes
    // nowhere, and no answer ever comes.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let conninfo = protocol_codec::conninfo::ConnInfo::parse(&format!(
        "host=127.0.0.1 port={} user=repl sslmode=disable",
        silent.local_addr().unwrap().port()
    ))
    .unwrap();
    let mut r = Receiving::start(receiver_config(conninfo), &standby);
    // Let the actor start connecting (its mailbox is processed after `started`).
    let status = r
        .addr
        .send(walreceiver_actor::messages::GetReceiverStatus)
        .await
        .unwrap();
    assert_eq!(status.status, walreceiver_actor::ReceiverState::Starting);
    let asked = Instant::now();
    r.addr.send(StopReceiver).await.unwrap();
    assert_eq!(r.stopped().await.reason, StopReason::ShutdownRequested);
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
}

/// A fake upstream that authenticates (trust), answers IDENTIFY_SYSTEM and
/// START_REPLICATION, sends 4 KiB of WAL, then says nothing more. It reports every status
/// update it receives.
async fn silent_upstream(
    listener: TcpListener,
    updates: tokio::sync::mpsc::UnboundedSender<(Lsn, Lsn, bool, Instant)>,
) {
    let (stream, _) = listener.accept().await.unwrap();
    let (r, mut w) = stream.into_split();
    let mut startup = FramedRead::new(r, StartupCodec);
    let packet = startup.next().await.unwrap().unwrap();
    assert!(matches!(packet, StartupPacket::Startup { .. }));
    assert_eq!(packet.param("replication"), Some("true"));
    assert_eq!(packet.application_name(), Some("standby_test"));
    let mut framed = startup.map_decoder(|_| ServerCodec::new());
    let send = |msgs: Vec<BackendMessage>| {
        let mut buf = BytesMut::new();
        for m in msgs {
            m.encode(&mut buf).unwrap();
        }
        buf
    };
    let hello = send(vec![
        BackendMessage::Authentication(AuthRequest::Ok),
        BackendMessage::ParameterStatus {
            name: "server_version".into(),
            value: "15.18".into(),
        },
        BackendMessage::BackendKeyData { pid: 7, key: 7 },
        BackendMessage::ReadyForQuery(TransactionStatus::Idle),
    ]);
    w.write_all(&hello).await.unwrap();
    while let Some(msg) = framed.next().await {
        match msg.unwrap() {
            FrontendMessage::Query(q) if q == "IDENTIFY_SYSTEM" => {
                let mut msgs =
                    results::identify_system(SYSTEM, TimelineId(1), Lsn(2 * SEGMENT), None);
                msgs.push(BackendMessage::ReadyForQuery(TransactionStatus::Idle));
                w.write_all(&send(msgs)).await.unwrap();
            }
            FrontendMessage::Query(q) => {
                assert_eq!(q, format!("START_REPLICATION {} TIMELINE 1", Lsn(SEGMENT)));
                let msgs = vec![
                    BackendMessage::CopyBothResponse,
                    BackendMessage::XLogData(XLogData {
                        wal_start: Lsn(SEGMENT),
                        wal_end: Lsn(SEGMENT + 4096),
                        send_time: PgTimestamp::now(),
                        data: Bytes::from(vec![7u8; 4096]),
                    }),
                ];
                w.write_all(&send(msgs)).await.unwrap();
            }
            FrontendMessage::StandbyStatusUpdate(u) => {
                let _ = updates.send((u.write, u.flush, u.reply_requested, Instant::now()));
            }
            FrontendMessage::HotStandbyFeedback(_) => {}
            FrontendMessage::Terminate => break,
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn next_update(
    updates: &mut tokio::sync::mpsc::UnboundedReceiver<(Lsn, Lsn, bool, Instant)>,
) -> (Lsn, Lsn, bool, Instant) {
    tokio::time::timeout(DEADLINE, updates.recv())
        .await
        .expect("a status update")
        .expect("the fake upstream lives")
}

#[actix_rt::test]
async fn a_silent_upstream_is_pinged_then_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let standby = standby_wal(dir.path(), SYSTEM);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, mut updates) = tokio::sync::mpsc::unbounded_channel();
    actix_rt::spawn(silent_upstream(listener, tx));
    let conninfo = protocol_codec::conninfo::ConnInfo::parse(&format!(
        "host=127.0.0.1 port={port} user=repl sslmode=disable"
    ))
    .unwrap();
    let mut config = receiver_config(conninfo);
    let timeout = Duration::from_millis(800);
    config.session.wal_receiver_timeout = timeout;
    let mut r = Receiving::start(config, &standby);
    r.streaming().await;
    let started = Instant::now();
    // The stream's first update (asking for a reply, to confirm the stream), then one for
    // the flush of the 4 KiB.
    let (write, flush, ping, _) = next_update(&mut updates).await;
    assert_eq!((write, flush, ping), (Lsn(SEGMENT), Lsn(SEGMENT), true));
    let mut seen = next_update(&mut updates).await;
    if seen.1 < Lsn(SEGMENT + 4096) {
        seen = next_update(&mut updates).await;
    }
    assert_eq!(
        (seen.0, seen.1, seen.2),
        (Lsn(SEGMENT + 4096), Lsn(SEGMENT + 4096), false)
    );
    // Half the timeout later, a ping asking for a reply.
    let (_, _, ping, at) = next_update(&mut updates).await;
    assert!(ping, "the update at half the timeout asks for a reply");
    assert!(at.duration_since(started) >= timeout / 2 - Duration::from_millis(100));
    // At the timeout, the end.
    let stopped = r.stopped().await;
    assert_eq!(
        *failure(&stopped.reason),
        ReceiverError::Timeout {
            timeout_ms: timeout.as_millis() as u64
        }
    );
    assert!(started.elapsed() >= timeout - Duration::from_millis(100));
    assert!(started.elapsed() < timeout * 5, "{:?}", started.elapsed());
}
