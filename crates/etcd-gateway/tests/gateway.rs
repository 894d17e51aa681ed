//! etcd-gateway against a real etcd (started by the testkit on loopback ports).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_gateway::testkit::{EtcdCluster, EtcdServer};
use etcd_gateway::{
    Client, Compare, CompareOp, CompareTarget, Error, EventKind, KeyRange, LeaseId, Op, OpResponse,
    Txn, Watch, WatchBatch, WatchRequest,
};
use tokio::sync::oneshot;
use tokio::time::timeout;

/// How long a test waits for an event etcd owes it. A guess for two busy cores; the events
/// come within milliseconds (a lease's expiry within about a second of its TTL).
const EVENT_DEADLINE: Duration = Duration::from_secs(10);

/// Receives watch batches until one holds an event, or fails at the deadline.
async fn next_events(watch: &mut Watch) -> Result<WatchBatch> {
    let deadline = Instant::now() + EVENT_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let batch = timeout(left, watch.next_batch())
            .await
            .context("no watch event before the deadline")?
            .context("the watch ended without an error")??;
        if !batch.events.is_empty() {
            return Ok(batch);
        }
    }
}

/// The watch's next item, which must come before the deadline: `None` is its end.
async fn next_item(watch: &mut Watch) -> Result<Option<etcd_gateway::Result<WatchBatch>>> {
    timeout(EVENT_DEADLINE, watch.next_batch())
        .await
        .context("the watch said nothing before the deadline")
}

#[actix_rt::test]
async fn put_range_delete_and_prefix() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let first = client.put(b"app/a", b"1", None).await?;
    let second = client.put(b"app/b", b"2", None).await?;
    client.put(b"apq", b"outside", None).await?;
    assert!(second.header.revision > first.header.revision);

    let one = client.range(&KeyRange::key("app/a")).await?;
    assert_eq!(one.kvs.len(), 1);
    assert_eq!(one.kvs[0].value, b"1");
    assert_eq!(one.kvs[0].create_revision, first.header.revision);
    assert_eq!(one.kvs[0].version, 1);

    let prefix = client.range(&KeyRange::prefix("app/")).await?;
    let keys: Vec<&[u8]> = prefix.kvs.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(keys, [b"app/a".as_slice(), b"app/b".as_slice()]);
    assert_eq!(prefix.count, 2);

    let deleted = client.delete_range(&KeyRange::prefix("app/")).await?;
    assert_eq!(deleted.deleted, 2);
    assert!(deleted.header.revision > second.header.revision);
    assert!(client
        .range(&KeyRange::prefix("app/"))
        .await?
        .kvs
        .is_empty());
    assert_eq!(client.range(&KeyRange::key("apq")).await?.kvs.len(), 1);
    // Keys and values are bytes, not text: base64 carries every byte.
    let binary = [0u8, 0xff, b'\n', b'"'];
    client.put(&binary, &binary, None).await?;
    assert_eq!(
        client.range(&KeyRange::key(binary)).await?.kvs[0].value,
        binary
    );
    Ok(())
}

#[actix_rt::test]
async fn create_if_absent_succeeds_once() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let create = |value: &str| {
        Txn::new()
            .when([Compare::absent("leader")])
            .and_then([Op::put("leader", value, None)])
            .or_else([Op::Range(KeyRange::key("leader"))])
    };
    let won = client.txn(&create("node-a")).await?;
    assert!(won.succeeded);
    let Some(OpResponse::Put(put)) = won.responses.first() else {
        bail!("expected a put response, got {:?}", won.responses);
    };
    assert_eq!(put.header.revision, won.header.revision);

    let lost = client.txn(&create("node-b")).await?;
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

#[actix_rt::test]
async fn leader_key_confirmed_by_value_and_lease() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let lease = client.lease_grant(30).await?.id;
    let other = client.lease_grant(30).await?.id;
    client.put(b"leader", b"node-a", Some(lease)).await?;
    let confirm = |value: &'static str, lease: LeaseId| {
        let txn = Txn::new()
            .when([
                Compare::value_is("leader", value),
                Compare::lease_is("leader", lease),
            ])
            .and_then([Op::Range(KeyRange::key("leader"))]);
        let client = client.clone();
        async move { client.txn(&txn).await.map(|answer| answer.succeeded) }
    };
    assert!(confirm("node-a", lease).await?);
    assert!(
        !confirm("node-b", lease).await?,
        "another value must not confirm"
    );
    assert!(
        !confirm("node-a", other).await?,
        "another lease must not confirm"
    );
    // The other comparisons reach etcd too.
    let rev = client.range(&KeyRange::key("leader")).await?.kvs[0].mod_revision;
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
    assert!(client.txn(&txn).await?.succeeded);
    let stale = Txn::new().when([Compare::new(
        "leader",
        CompareOp::Equal,
        CompareTarget::ModRevision(rev - 1),
    )]);
    assert!(!client.txn(&stale).await?.succeeded);
    Ok(())
}

#[actix_rt::test]
async fn lease_grant_keepalive_revoke() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let grant = client.lease_grant(20).await?;
    assert_eq!(grant.ttl, 20);
    client.put(b"member/a", b"up", Some(grant.id)).await?;
    assert_eq!(
        client.range(&KeyRange::key("member/a")).await?.kvs[0].lease,
        grant.id
    );

    let renewed = client.lease_keepalive(grant.id).await?;
    assert_eq!(renewed.id, grant.id);
    assert!(renewed.ttl > 0 && renewed.ttl <= 20, "{renewed:?}");
    let left = client.lease_time_to_live(grant.id, true).await?;
    assert_eq!(left.granted_ttl, 20);
    assert_eq!(left.keys, [b"member/a".to_vec()]);

    client.lease_revoke(grant.id).await?;
    match client.lease_keepalive(grant.id).await {
        Err(Error::LeaseNotFound { id }) => assert_eq!(id, grant.id.0),
        other => bail!("a keepalive of a revoked lease must say it is gone, got {other:?}"),
    }
    assert!(matches!(
        client.lease_time_to_live(grant.id, false).await,
        Err(Error::LeaseNotFound { .. })
    ));
    assert!(matches!(
        client.lease_revoke(grant.id).await,
        Err(Error::LeaseNotFound { .. })
    ));
    assert!(client
        .range(&KeyRange::key("member/a"))
        .await?
        .kvs
        .is_empty());
    Ok(())
}

#[actix_rt::test]
async fn lease_expires_by_itself() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    // One second is the testkit member's minimum TTL.
    let grant = client.lease_grant(1).await?;
    let put = client.put(b"member/b", b"up", Some(grant.id)).await?;
    let mut watch = client
        .watch(&WatchRequest::new(KeyRange::key("member/b")).from_revision(put.header.revision + 1))
        .await?;
    let started = Instant::now();
    let batch = next_events(&mut watch).await?;
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
        client.lease_keepalive(grant.id).await,
        Err(Error::LeaseNotFound { .. })
    ));
    Ok(())
}

#[actix_rt::test]
async fn watch_sees_puts_and_deletes_in_order() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let mut watch = client
        .watch(&WatchRequest::new(KeyRange::prefix("w/")))
        .await?;
    let start = watch.created().revision;
    let a = client.put(b"w/a", b"1", None).await?.header.revision;
    client.put(b"other", b"x", None).await?;
    let b = client.put(b"w/a", b"2", None).await?.header.revision;
    let c = client
        .delete_range(&KeyRange::key("w/a"))
        .await?
        .header
        .revision;
    assert!(start < a && a < b && b < c);

    let mut seen = Vec::new();
    while seen.len() < 3 {
        for event in next_events(&mut watch).await?.events {
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
    let mut again = client
        .watch(&WatchRequest::new(KeyRange::key("w/a")).from_revision(b))
        .await?;
    let replay = next_events(&mut again).await?;
    assert_eq!(replay.events[0].kv.mod_revision, b);
    // (That a dropped watch closes its connection at once is checked on a plain socket, in
    // `dropping_a_watch_closes_its_connection`.)
    drop((watch, again));
    Ok(())
}

/// An actor as the failover actor will be, on an arbiter of its own: it creates its watch in
/// `ctx.wait` (no message is handled before the watch exists), takes it with
/// `ctx.add_stream`, then puts in `ctx.spawn`, and reports what it saw.
struct Watcher {
    client: Client,
    put_revision: Option<oneshot::Sender<etcd_gateway::Result<i64>>>,
    events: tokio::sync::mpsc::UnboundedSender<etcd_gateway::Result<WatchBatch>>,
}

impl actix::Actor for Watcher {
    type Context = actix::Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        use actix::{ActorFutureExt, AsyncContext, WrapFuture};
        let client = self.client.clone();
        let create = async move {
            client
                .watch(&WatchRequest::new(KeyRange::prefix("actor/")))
                .await
        };
        ctx.wait(create.into_actor(self).map(|created, actor, ctx| {
            let watch = match created {
                Ok(watch) => watch,
                Err(e) => {
                    if let Some(tx) = actor.put_revision.take() {
                        let _ = tx.send(Err(e));
                    }
                    return;
                }
            };
            ctx.add_stream(watch);
            let client = actor.client.clone();
            let put = async move { client.put(b"actor/k", b"v", None).await };
            ctx.spawn(put.into_actor(actor).map(|answer, actor, _ctx| {
                if let Some(tx) = actor.put_revision.take() {
                    let _ = tx.send(answer.map(|put| put.header.revision));
                }
            }));
        }));
    }
}

impl actix::StreamHandler<etcd_gateway::Result<WatchBatch>> for Watcher {
    fn handle(&mut self, batch: etcd_gateway::Result<WatchBatch>, _ctx: &mut Self::Context) {
        let _ = self.events.send(batch);
    }
}

#[actix_rt::test]
async fn an_actor_awaits_calls_and_takes_a_watch_as_a_stream() -> Result<()> {
    let etcd = EtcdServer::start();
    let (put_tx, put_rx) = oneshot::channel();
    let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
    // The client is Send; the futures it makes run on the actor's arbiter, not this thread.
    let client = etcd.client();
    let arbiter = actix::Arbiter::new();
    <Watcher as actix::Actor>::start_in_arbiter(&arbiter.handle(), move |_ctx| Watcher {
        client,
        put_revision: Some(put_tx),
        events: events_tx,
    });
    let revision = timeout(EVENT_DEADLINE, put_rx)
        .await
        .context("the actor's put did not finish")?
        .context("the actor went away")??;
    let batch = timeout(EVENT_DEADLINE, events_rx.recv())
        .await
        .context("the actor saw no watch event")?
        .context("the actor stopped")??;
    assert_eq!(batch.events[0].kv.key, b"actor/k");
    assert_eq!(batch.events[0].kv.mod_revision, revision);
    arbiter.stop();
    Ok(())
}

#[actix_rt::test]
async fn watch_from_a_compacted_revision_fails() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let first = client.put(b"c", b"1", None).await?.header.revision;
    let last = client.put(b"c", b"2", None).await?.header.revision;
    client.compact(last).await?;
    // etcd creates the watch, then cancels it at once with the compaction revision.
    let mut watch = client
        .watch(&WatchRequest::new(KeyRange::key("c")).from_revision(first))
        .await?;
    match next_item(&mut watch).await? {
        Some(Err(Error::Compacted { compact_revision })) => assert_eq!(compact_revision, last),
        other => bail!("expected a compaction error, got {other:?}"),
    }
    // That was the watch's end: nothing follows.
    assert!(next_item(&mut watch).await?.is_none());
    Ok(())
}

#[actix_rt::test]
async fn watch_reports_the_end_of_its_stream() -> Result<()> {
    let mut etcd = EtcdServer::start();
    let client = etcd.client();
    let mut watch = client.watch(&WatchRequest::new(KeyRange::key("k"))).await?;
    // The member goes away: the stream ends, and the watch says so once, then ends.
    etcd.kill();
    match next_item(&mut watch).await? {
        // A killed member leaves the chunked body unfinished, but awc ends a body at the
        // connection's end without telling whether its last chunk came, so this is the
        // stream's end; a reset would be an I/O error. Either means: watch again.
        Some(Err(Error::WatchEnded | Error::Io { .. })) => {}
        other => bail!("expected the end of the stream, got {other:?}"),
    }
    assert!(next_item(&mut watch).await?.is_none());
    Ok(())
}

#[actix_rt::test]
async fn failover_to_the_next_endpoint() -> Result<()> {
    let mut cluster = EtcdCluster::start(3);
    let leader = cluster.leader_index().map_err(anyhow::Error::msg)?;
    // The client talks to a follower first, so killing it needs no election.
    let first = (leader + 1) % 3;
    let mut urls = cluster.client_urls();
    urls.rotate_left(first);
    let client = Client::new(&urls)?.with_request_timeout(Duration::from_secs(10));
    let before = client.put(b"k", b"1", None).await?;
    assert_eq!(client.current_endpoint(), urls[0]);

    cluster.member_mut(first).kill();
    let after = client.put(b"k", b"2", None).await?;
    assert_ne!(client.current_endpoint(), urls[0]);
    assert_ne!(after.header.member_id, before.header.member_id);
    assert!(after.header.revision > before.header.revision);
    assert_eq!(client.range(&KeyRange::key("k")).await?.kvs[0].value, b"2");
    Ok(())
}

#[actix_rt::test]
async fn unreachable_endpoint_is_a_connection_error() -> Result<()> {
    // A port nothing listens on: bound, then released.
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let client = Client::new([format!("127.0.0.1:{port}")])?;
    let e = client.range(&KeyRange::key("k")).await.unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    // Counted once, by kind, for /metrics; a clone shares the counts.
    let counts = client.clone().error_counts();
    let count = |kind| counts.iter().find(|(k, _)| *k == kind).map(|(_, n)| *n);
    assert_eq!(
        count(etcd_gateway::ErrorKind::Connect),
        Some(1),
        "{counts:?}"
    );
    assert_eq!(counts.iter().map(|(_, n)| n).sum::<u64>(), 1, "{counts:?}");
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

#[actix_rt::test]
async fn bad_requests_carry_the_gateways_message() -> Result<()> {
    let etcd = EtcdServer::start();
    let client = etcd.client();
    match client.put(b"k", b"v", Some(LeaseId(12345))).await {
        Err(Error::Status {
            code: 5, message, ..
        }) => {
            assert!(message.contains("requested lease not found"), "{message}")
        }
        other => bail!("expected etcd's error, got {other:?}"),
    }
    let duplicate = Txn::new().and_then([Op::put("k", "1", None), Op::put("k", "2", None)]);
    match client.txn(&duplicate).await {
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

/// A server on a real socket that reads one request, answers `answer` (or nothing), then
/// waits for the client to close the connection. The receiver says whether the client closed
/// it before the deadline.
fn one_shot_server(answer: Option<&'static [u8]>) -> Result<(String, oneshot::Receiver<bool>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(serve_once(&listener, answer));
    });
    Ok((url, rx))
}

fn serve_once(listener: &TcpListener, answer: Option<&[u8]>) -> bool {
    let Ok((mut socket, _)) = listener.accept() else {
        return false;
    };
    if socket.set_read_timeout(Some(EVENT_DEADLINE)).is_err() || read_request(&mut socket).is_err()
    {
        return false;
    }
    if let Some(bytes) = answer {
        if socket.write_all(bytes).is_err() {
            return false;
        }
    }
    // Holds the connection until the client closes it (or the read timeout passes).
    let mut byte = [0u8; 1];
    matches!(socket.read(&mut byte), Ok(0))
}

/// Reads a request's head and its `Content-Length` body, so that the answer is not written
/// (and the socket not closed) over unread bytes.
fn read_request(socket: &mut TcpStream) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    // Bounded: every read takes at least a byte or fails, and a request here is small.
    while request.len() < 64 * 1024 {
        let n = socket.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        request.extend_from_slice(&buf[..n]);
        if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if request.len() >= end + 4 + length {
                return Ok(());
            }
        }
    }
    Err(std::io::ErrorKind::InvalidData.into())
}

/// Whether the one-shot server saw the client close its connection.
async fn client_closed(closed: oneshot::Receiver<bool>) -> Result<bool> {
    // Longer than the server's own read timeout, so that the server always answers first.
    timeout(2 * EVENT_DEADLINE, closed)
        .await
        .context("the server did not finish")?
        .context("the server thread went away")
}

#[actix_rt::test]
async fn a_request_cut_off_after_sending_is_not_resent() -> Result<()> {
    // The first endpoint takes the request and closes without an answer; the second listens.
    let first = TcpListener::bind("127.0.0.1:0")?;
    let second = TcpListener::bind("127.0.0.1:0")?;
    let urls = [
        format!("http://{}", first.local_addr()?),
        format!("http://{}", second.local_addr()?),
    ];
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let read = first.accept().and_then(|(mut socket, _)| {
            socket.set_read_timeout(Some(EVENT_DEADLINE))?;
            read_request(&mut socket)
        });
        let _ = tx.send(read.is_ok());
    });
    let client = Client::new(&urls)?;
    let e = client.put(b"k", b"v", None).await.unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert!(
        timeout(EVENT_DEADLINE, rx).await??,
        "the first endpoint got the request"
    );
    // The call has returned, so a connection it made to the second endpoint would be waiting
    // in the listener's backlog.
    second.set_nonblocking(true)?;
    match second.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => bail!("a request that was sent went to the next endpoint: {other:?}"),
    }
    assert_eq!(client.current_endpoint(), urls[0]);
    Ok(())
}

#[actix_rt::test]
async fn a_silent_server_times_out() -> Result<()> {
    let (url, closed) = one_shot_server(None)?;
    let patient = Client::new([url])?;
    let client = patient
        .clone()
        .with_request_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let e = client.range(&KeyRange::key("k")).await.unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The call that gave up has dropped its connection.
    assert!(client_closed(closed).await?);
    Ok(())
}

#[actix_rt::test]
async fn malformed_answers_are_errors() -> Result<()> {
    let answers: [&'static [u8]; 4] = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!",
        b"HTTP/1.1 200 OK\r\nContent-Length: 31\r\n\r\n{\"header\":{\"revision\":\"nope\"}}\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"SMTP ready\r\n\r\n",
    ];
    for answer in answers {
        let (url, closed) = one_shot_server(Some(answer))?;
        let client = Client::new([url])?.with_request_timeout(Duration::from_secs(5));
        let e = client.range(&KeyRange::key("k")).await.unwrap_err();
        assert!(matches!(e, Error::Malformed { .. }), "{e:?} for {answer:?}");
        // A failed call leaves no connection behind.
        assert!(client_closed(closed).await?, "{answer:?}");
    }
    Ok(())
}

#[actix_rt::test]
async fn watch_stream_framing_and_a_clean_end() -> Result<()> {
    // The gateway's framing, byte for byte: chunks that do not align with the messages, one
    // JSON object per line, and a last chunk that ends the stream cleanly.
    let answer: &'static [u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        1c\r\n{\"result\":{\"header\":{\"revisi\r\n\
        21\r\non\":\"5\"},\"created\":true}}\n{\"resul\r\n\
        54\r\nt\":{\"header\":{\"revision\":\"6\"},\"events\":[{\"kv\":{\"key\":\"aw==\",\"mod_revision\":\"6\"}}]}}\n\r\n\
        0\r\n\r\n";
    let (url, _closed) = one_shot_server(Some(answer))?;
    let client = Client::new([url])?;
    let mut watch = client.watch(&WatchRequest::new(KeyRange::key("k"))).await?;
    assert_eq!(watch.created().revision, 5);
    let batch = next_events(&mut watch).await?;
    assert_eq!(batch.header.revision, 6);
    assert_eq!(batch.events[0].kind, EventKind::Put);
    assert_eq!(batch.events[0].kv.key, b"k");
    match next_item(&mut watch).await? {
        Some(Err(Error::WatchEnded)) => {}
        other => bail!("expected the stream's clean end, got {other:?}"),
    }
    assert!(next_item(&mut watch).await?.is_none());
    Ok(())
}

#[actix_rt::test]
async fn dropping_a_watch_closes_its_connection() -> Result<()> {
    // A watch the server has created and that stays quiet: its chunked body never ends.
    let answer: &'static [u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        36\r\n{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n\r\n";
    let (url, mut closed) = one_shot_server(Some(answer))?;
    let client = Client::new([url])?;
    let watch = client.watch(&WatchRequest::new(KeyRange::key("k"))).await?;
    assert_eq!(watch.created().revision, 5);
    assert!(
        matches!(closed.try_recv(), Err(oneshot::error::TryRecvError::Empty)),
        "the connection ended while the watch was held"
    );
    drop(watch);
    assert!(
        client_closed(closed).await?,
        "dropping the watch did not close its connection"
    );
    Ok(())
}
