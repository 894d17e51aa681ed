//! etcd-gateway against a real etcd (started by the testkit on loopback ports).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_gateway::testkit::{EtcdCluster, EtcdServer};
use etcd_gateway::{
    Client, Compare, CompareOp, CompareTarget, Error, EventKind, KeyRange, LeaseId, Op, OpResponse,
    Txn, WatchBatch, WatchRequest,
};

/// How long a test waits for an event etcd owes it. A guess for two busy cores; the events
/// come within milliseconds (a lease's expiry within about a second of its TTL).
const EVENT_DEADLINE: Duration = Duration::from_secs(10);

/// Receives watch batches until one holds an event, or fails at the deadline.
fn next_events(rx: &Receiver<etcd_gateway::Result<WatchBatch>>) -> Result<WatchBatch> {
    let deadline = Instant::now() + EVENT_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let batch = rx
            .recv_timeout(left)
            .context("no watch event before the deadline")??;
        if !batch.events.is_empty() {
            return Ok(batch);
        }
    }
}

#[test]
fn put_range_delete_and_prefix() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let first = client.put(b"app/a", b"1", None)?;
    let second = client.put(b"app/b", b"2", None)?;
    client.put(b"apq", b"outside", None)?;
    assert!(second.header.revision > first.header.revision);

    let one = client.range(&KeyRange::key("app/a"))?;
    assert_eq!(one.kvs.len(), 1);
    assert_eq!(one.kvs[0].value, b"1");
    assert_eq!(one.kvs[0].create_revision, first.header.revision);
    assert_eq!(one.kvs[0].version, 1);

    let prefix = client.range(&KeyRange::prefix("app/"))?;
    let keys: Vec<&[u8]> = prefix.kvs.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(keys, [b"app/a".as_slice(), b"app/b".as_slice()]);
    assert_eq!(prefix.count, 2);

    let deleted = client.delete_range(&KeyRange::prefix("app/"))?;
    assert_eq!(deleted.deleted, 2);
    assert!(deleted.header.revision > second.header.revision);
    assert!(client.range(&KeyRange::prefix("app/"))?.kvs.is_empty());
    assert_eq!(client.range(&KeyRange::key("apq"))?.kvs.len(), 1);
    // Keys and values are bytes, not text: base64 carries every byte.
    let binary = [0u8, 0xff, b'\n', b'"'];
    client.put(&binary, &binary, None)?;
    assert_eq!(client.range(&KeyRange::key(binary))?.kvs[0].value, binary);
    Ok(())
}

#[test]
fn create_if_absent_succeeds_once() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let create = |value: &str| {
        Txn::new()
            .when([Compare::absent("leader")])
            .and_then([Op::put("leader", value, None)])
            .or_else([Op::Range(KeyRange::key("leader"))])
    };
    let won = client.txn(&create("node-a"))?;
    assert!(won.succeeded);
    let Some(OpResponse::Put(put)) = won.responses.first() else {
        bail!("expected a put response, got {:?}", won.responses);
    };
    assert_eq!(put.header.revision, won.header.revision);

    let lost = client.txn(&create("node-b"))?;
    assert!(
        !lost.succeeded,
        "the key existed, so the second create must fail"
    );
    let Some(OpResponse::Range(range)) = lost.responses.first() else {
        bail!("expected a range response, got {:?}", lost.responses);
    };
    assert_eq!(range.kvs[0].value, b"node-a");
    // The winner's create revision is the term both sides can name.
    assert_eq!(range.kvs[0].create_revision, won.header.revision);
    Ok(())
}

#[test]
fn leader_key_confirmed_by_value_and_lease() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let lease = client.lease_grant(30)?.id;
    let other = client.lease_grant(30)?.id;
    client.put(b"leader", b"node-a", Some(lease))?;
    let confirm = |value: &str, lease: LeaseId| -> etcd_gateway::Result<bool> {
        let txn = Txn::new()
            .when([
                Compare::value_is("leader", value),
                Compare::lease_is("leader", lease),
            ])
            .and_then([Op::Range(KeyRange::key("leader"))]);
        client.txn(&txn).map(|answer| answer.succeeded)
    };
    assert!(confirm("node-a", lease)?);
    assert!(!confirm("node-b", lease)?, "another value must not confirm");
    assert!(!confirm("node-a", other)?, "another lease must not confirm");
    // The other comparisons reach etcd too.
    let rev = client.range(&KeyRange::key("leader"))?.kvs[0].mod_revision;
    let txn = Txn::new().when([
        Compare::new("leader", CompareOp::Equal, CompareTarget::ModRevision(rev)),
        Compare::new("leader", CompareOp::Equal, CompareTarget::Version(1)),
        Compare::new(
            "leader",
            CompareOp::Greater,
            CompareTarget::CreateRevision(0),
        ),
        Compare::new(
            "leader",
            CompareOp::NotEqual,
            CompareTarget::Value(b"x".to_vec()),
        ),
        Compare::new(
            "leader",
            CompareOp::Less,
            CompareTarget::ModRevision(rev + 1),
        ),
    ]);
    assert!(client.txn(&txn)?.succeeded);
    let stale = Txn::new().when([Compare::new(
        "leader",
        CompareOp::Equal,
        CompareTarget::ModRevision(rev - 1),
    )]);
    assert!(!client.txn(&stale)?.succeeded);
    Ok(())
}

#[test]
fn lease_grant_keepalive_revoke() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let grant = client.lease_grant(20)?;
    assert_eq!(grant.ttl, 20);
    client.put(b"member/a", b"up", Some(grant.id))?;
    assert_eq!(
        client.range(&KeyRange::key("member/a"))?.kvs[0].lease,
        grant.id
    );

    let renewed = client.lease_keepalive(grant.id)?;
    assert_eq!(renewed.id, grant.id);
    assert!(renewed.ttl > 0 && renewed.ttl <= 20, "{renewed:?}");
    let left = client.lease_time_to_live(grant.id, true)?;
    assert_eq!(left.granted_ttl, 20);
    assert_eq!(left.keys, [b"member/a".to_vec()]);

    client.lease_revoke(grant.id)?;
    match client.lease_keepalive(grant.id) {
        Err(Error::LeaseNotFound { id }) => assert_eq!(id, grant.id.0),
        other => bail!("a keepalive of a revoked lease must say it is gone, got {other:?}"),
    }
    assert!(matches!(
        client.lease_time_to_live(grant.id, false),
        Err(Error::LeaseNotFound { .. })
    ));
    assert!(matches!(
        client.lease_revoke(grant.id),
        Err(Error::LeaseNotFound { .. })
    ));
    assert!(client.range(&KeyRange::key("member/a"))?.kvs.is_empty());
    Ok(())
}

#[test]
fn lease_expires_by_itself() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    // One second is the testkit member's minimum TTL.
    let grant = client.lease_grant(1)?;
    let put = client.put(b"member/b", b"up", Some(grant.id))?;
    let (_watch, rx) = client.watch_channel(
        &WatchRequest::new(KeyRange::key("member/b")).from_revision(put.header.revision + 1),
    )?;
    let started = Instant::now();
    let batch = next_events(&rx)?;
    let event = &batch.events[0];
    assert_eq!(event.kind, EventKind::Delete);
    assert_eq!(event.kv.key, b"member/b");
    assert!(event.kv.mod_revision > put.header.revision);
    // It went at its TTL, not at once (etcd checks expiry every half second or so).
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(
        client.lease_keepalive(grant.id),
        Err(Error::LeaseNotFound { .. })
    ));
    Ok(())
}

#[test]
fn watch_sees_puts_and_deletes_in_order() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let (watch, rx) = client.watch_channel(&WatchRequest::new(KeyRange::prefix("w/")))?;
    let start = watch.created().revision;
    let a = client.put(b"w/a", b"1", None)?.header.revision;
    client.put(b"other", b"x", None)?;
    let b = client.put(b"w/a", b"2", None)?.header.revision;
    let c = client.delete_range(&KeyRange::key("w/a"))?.header.revision;
    assert!(start < a && a < b && b < c);

    let mut seen = Vec::new();
    while seen.len() < 3 {
        for event in next_events(&rx)?.events {
            seen.push((event.kind, event.kv.mod_revision, event.kv.value));
        }
    }
    assert_eq!(
        seen,
        [
            (EventKind::Put, a, b"1".to_vec()),
            (EventKind::Put, b, b"2".to_vec()),
            (EventKind::Delete, c, Vec::new()),
        ]
    );

    // From a past revision, the same history is replayed.
    let (again, replay_rx) =
        client.watch_channel(&WatchRequest::new(KeyRange::key("w/a")).from_revision(b))?;
    let replay = next_events(&replay_rx)?;
    assert_eq!(replay.events[0].kv.mod_revision, b);

    // Dropping a watch joins its thread, which drops the callback and so the channel's
    // sender: what is left drains, then the channel is disconnected, with no error delivered.
    // The drops run on a helper thread so that a drop that hangs fails the test.
    let (dropped_tx, dropped_rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(watch);
        drop(again);
        let _ = dropped_tx.send(());
    });
    dropped_rx
        .recv_timeout(EVENT_DEADLINE)
        .context("dropping the watch did not end its thread")?;
    client.put(b"w/a", b"3", None)?;
    loop {
        match rx.try_recv() {
            Ok(Ok(batch)) => assert!(batch.events.iter().all(|e| e.kv.mod_revision <= c)),
            Ok(Err(e)) => bail!("a dropped watch delivered an error: {e}"),
            Err(mpsc::TryRecvError::Empty) => bail!("the dropped watch's channel is still open"),
            Err(mpsc::TryRecvError::Disconnected) => break,
        }
    }
    Ok(())
}

#[test]
fn watch_from_a_compacted_revision_fails() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let first = client.put(b"c", b"1", None)?.header.revision;
    let last = client.put(b"c", b"2", None)?.header.revision;
    client.compact(last)?;
    // etcd creates the watch, then cancels it at once with the compaction revision.
    let (_watch, rx) =
        client.watch_channel(&WatchRequest::new(KeyRange::key("c")).from_revision(first))?;
    match rx.recv_timeout(EVENT_DEADLINE) {
        Ok(Err(Error::Compacted { compact_revision })) => assert_eq!(compact_revision, last),
        other => bail!("expected a compaction error, got {other:?}"),
    }
    // That was the watch's end: nothing follows.
    assert!(matches!(
        rx.recv_timeout(EVENT_DEADLINE),
        Err(mpsc::RecvTimeoutError::Disconnected)
    ));
    Ok(())
}

#[test]
fn watch_reports_the_end_of_its_stream() -> Result<()> {
    let mut etcd = EtcdServer::start();
    let client = etcd.client();
    let (_watch, rx) = client.watch_channel(&WatchRequest::new(KeyRange::key("k")))?;
    // The member goes away: the stream ends, and the watch says so once, then disconnects.
    etcd.kill();
    match rx.recv_timeout(EVENT_DEADLINE) {
        // A killed member leaves the chunked body unfinished: an I/O error, not a clean end.
        Ok(Err(Error::Io { .. })) => {}
        other => bail!("expected the end of the stream, got {other:?}"),
    }
    assert!(matches!(
        rx.recv_timeout(EVENT_DEADLINE),
        Err(mpsc::RecvTimeoutError::Disconnected)
    ));
    Ok(())
}

#[test]
fn failover_to_the_next_endpoint() -> Result<()> {
    let mut cluster = EtcdCluster::start(3);
    let leader = cluster.leader_index().map_err(anyhow::Error::msg)?;
    // The client talks to a follower first, so killing it needs no election.
    let first = (leader + 1) % 3;
    let mut urls = cluster.client_urls();
    urls.rotate_left(first);
    let client = Client::new(&urls)?.with_request_timeout(Duration::from_secs(10));
    let before = client.put(b"k", b"1", None)?;
    assert_eq!(client.current_endpoint(), urls[0]);

    cluster.member_mut(first).kill();
    let after = client.put(b"k", b"2", None)?;
    assert_ne!(client.current_endpoint(), urls[0]);
    assert_ne!(after.header.member_id, before.header.member_id);
    assert!(after.header.revision > before.header.revision);
    assert_eq!(client.range(&KeyRange::key("k"))?.kvs[0].value, b"2");
    Ok(())
}

#[test]
fn unreachable_endpoint_is_a_connection_error() -> Result<()> {
    // A port nothing listens on: bound, then released.
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let client = Client::new([format!("127.0.0.1:{port}")])?;
    let e = client.range(&KeyRange::key("k")).unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("no etcd endpoint reachable") && text.contains(&port.to_string()),
        "{text}"
    );
    assert!(matches!(
        Client::new(["https://h:1"]),
        Err(Error::InvalidEndpoint { .. })
    ));
    Ok(())
}

#[test]
fn bad_requests_carry_the_gateways_message() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    match client.put(b"k", b"v", Some(LeaseId(12345))) {
        Err(Error::Status {
            code: 5, message, ..
        }) => {
            assert!(message.contains("requested lease not found"), "{message}")
        }
        other => bail!("expected etcd's error, got {other:?}"),
    }
    let duplicate = Txn::new().and_then([Op::put("k", "1", None), Op::put("k", "2", None)]);
    match client.txn(&duplicate) {
        Err(Error::Status {
            status: 400,
            code: 3,
            message,
            ..
        }) => {
            assert!(message.contains("duplicate key"), "{message}")
        }
        other => bail!("expected etcd's error, got {other:?}"),
    }
    Ok(())
}

/// A server on a real socket that reads the request and answers `answer` (or nothing).
fn one_shot_server(answer: Option<&'static [u8]>) -> Result<(String, std::thread::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    let thread = std::thread::spawn(move || {
        let Ok((mut socket, _)) = listener.accept() else {
            return;
        };
        let _ = socket.set_read_timeout(Some(EVENT_DEADLINE));
        let mut request = [0u8; 4096];
        let _ = socket.read(&mut request);
        match answer {
            Some(bytes) => {
                let _ = socket.write_all(bytes);
            }
            // Holds the connection without answering until the client gives up.
            None => {
                let _ = socket.read(&mut request);
            }
        }
    });
    Ok((url, thread))
}

#[test]
fn a_silent_server_times_out() -> Result<()> {
    let (url, server) = one_shot_server(None)?;
    let patient = Client::new([url])?;
    let client = patient
        .clone()
        .with_request_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let e = client.range(&KeyRange::key("k")).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop((client, patient));
    let _ = server.join();
    Ok(())
}

#[test]
fn malformed_answers_are_errors() -> Result<()> {
    let answers: [&'static [u8]; 4] = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!",
        b"HTTP/1.1 200 OK\r\nContent-Length: 31\r\n\r\n{\"header\":{\"revision\":\"nope\"}}\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"SMTP ready\r\n\r\n",
    ];
    for answer in answers {
        let (url, server) = one_shot_server(Some(answer))?;
        let client = Client::new([url])?.with_request_timeout(Duration::from_secs(5));
        let e = client.range(&KeyRange::key("k")).unwrap_err();
        assert!(matches!(e, Error::Malformed { .. }), "{e:?} for {answer:?}");
        let _ = server.join();
    }
    Ok(())
}

#[test]
fn watch_stream_framing_and_a_clean_end() -> Result<()> {
    // The gateway's framing, byte for byte: chunks that do not align with the messages, one
    // JSON object per line, and a last chunk that ends the stream cleanly.
    let answer: &'static [u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        1c\r\n{\"result\":{\"header\":{\"revisi\r\n\
        21\r\non\":\"5\"},\"created\":true}}\n{\"resul\r\n\
        54\r\nt\":{\"header\":{\"revision\":\"6\"},\"events\":[{\"kv\":{\"key\":\"aw==\",\"mod_revision\":\"6\"}}]}}\n\r\n\
        0\r\n\r\n";
    let (url, server) = one_shot_server(Some(answer))?;
    let client = Client::new([url])?;
    let (watch, rx) = client.watch_channel(&WatchRequest::new(KeyRange::key("k")))?;
    assert_eq!(watch.created().revision, 5);
    let batch = next_events(&rx)?;
    assert_eq!(batch.header.revision, 6);
    assert_eq!(batch.events[0].kind, EventKind::Put);
    assert_eq!(batch.events[0].kv.key, b"k");
    match rx.recv_timeout(EVENT_DEADLINE) {
        Ok(Err(Error::WatchEnded)) => {}
        other => bail!("expected the stream's clean end, got {other:?}"),
    }
    let _ = server.join();
    Ok(())
}
