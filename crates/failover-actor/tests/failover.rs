//! The failover actor with a real etcd and real nodes in one actix System, on loopback: a
//! primary and two standbys, each with a closed fence and its own actor (ttl 2 s). Every wait
//! is on an event (the actors' leadership watch, an etcd watch) under a deadline.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use bytes::Bytes;
use etcd_gateway::testkit::EtcdServer;
use failover_actor::{
    FailoverActor, FailoverConfig, Leadership, Pause, Resume, StopFailover, SubscribeLeadership,
    Switchover,
};
use futures_util::StreamExt;
use supervisor_actor::{
    AppendError, AppendRecords, Durability, Fence, Node, NodeBuilder, ShutdownNode,
};
use tokio::sync::watch;

const TTL: Duration = Duration::from_secs(2);
/// How long bootstrap may take: three actors join, the primary campaigns, two standbys
/// follow. A guess for two busy cores.
const SETTLE: Duration = Duration::from_secs(20);

struct Member {
    name: String,
    node: Node,
    actor: actix::Addr<FailoverActor>,
    leadership: watch::Receiver<Leadership>,
}

/// The actors' log, shown for a failing test (`RUST_LOG` chooses; warnings by default).
fn log() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "failover_actor=info,warn".into()),
        )
        .with_test_writer()
        .try_init();
}

fn conninfo(node: &Node) -> String {
    format!("host=127.0.0.1 port={} user=r", node.listen_addr.port())
}

async fn start_primary(dir: &Path) -> Result<Node> {
    Ok(NodeBuilder::primary(dir)
        .listen("127.0.0.1:0".parse()?)
        .segment_size(1 << 20)
        .io_threads(0)
        .fence(Fence::closed())
        .start()
        .await?)
}

async fn start_standby(dir: &Path, upstream: &Node, name: &str) -> Result<Node> {
    Ok(NodeBuilder::standby(dir, &conninfo(upstream))?
        .cluster_name(name)
        .listen("127.0.0.1:0".parse()?)
        .segment_size(1 << 20)
        .io_threads(0)
        .fence(Fence::closed())
        .start()
        .await?)
}

async fn start_actor(etcd: &str, name: &str, node: Node) -> Result<Member> {
    let mut config = FailoverConfig::new(
        vec![etcd.to_string()],
        "test",
        name,
        conninfo(&node),
        String::new(),
    );
    config.ttl = TTL;
    let actor = FailoverActor::start(config, node.clone())?;
    let leadership = actor.send(SubscribeLeadership).await?;
    Ok(Member {
        name: name.to_string(),
        node,
        actor,
        leadership,
    })
}

/// Waits until `member`'s leadership satisfies `f`, at most `within`.
async fn wait_for(
    member: &mut Member,
    within: Duration,
    what: &str,
    f: impl Fn(&Leadership) -> bool,
) -> Result<Leadership> {
    let name = member.name.clone();
    let waited = tokio::time::timeout(within, member.leadership.wait_for(|l| f(l)))
        .await
        .map(|r| r.map(|l| l.clone()));
    match waited {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(_)) => bail!("{name}'s actor stopped before {what}"),
        Err(_) => bail!(
            "{name}: not {what} within {within:?} (now {:?})",
            *member.leadership.borrow()
        ),
    }
}

async fn append(
    node: &Node,
    text: &str,
) -> std::result::Result<supervisor_actor::Appended, AppendError> {
    node.supervisor
        .send(AppendRecords {
            records: vec![Bytes::from(text.to_string())],
            durability: Some(Durability::Local),
        })
        .await
        .expect("the supervisor answers")
}

/// A primary and two standbys under failover, settled: the primary leads, both follow it.
async fn cluster(etcd: &str, dir: &Path) -> Result<(Member, Member, Member, u64)> {
    let p = start_primary(&dir.join("a")).await?;
    let b = start_standby(&dir.join("b"), &p, "b").await?;
    let c = start_standby(&dir.join("c"), &p, "c").await?;
    let mut a = start_actor(etcd, "a", p).await?;
    let mut b = start_actor(etcd, "b", b).await?;
    let mut c = start_actor(etcd, "c", c).await?;
    let term = wait_for(&mut a, SETTLE, "leading", |l| l.leading.is_some())
        .await?
        .leading
        .context("leading")?;
    for m in [&mut b, &mut c] {
        wait_for(m, SETTLE, "following a", |l| {
            l.following == Some(("a".into(), term))
        })
        .await?;
    }
    Ok((a, b, c, term))
}

async fn shutdown(members: impl IntoIterator<Item = Member>) {
    for m in members {
        let _ = m.actor.send(StopFailover { release: true }).await;
        let _ = m
            .node
            .supervisor
            .send(ShutdownNode { immediate: true })
            .await;
    }
}

#[test]
fn bootstrap_elects_the_primary_and_the_standbys_follow() -> Result<()> {
    log();
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir()?;
    actix_rt::System::new().block_on(async {
        let (a, b, c, term) = cluster(etcd.client_url(), dir.path()).await?;
        assert!(term > 0);
        let appended = append(&a.node, "first")
            .await
            .context("the leader acknowledges")?;
        assert_eq!(a.node.fence.term(), Some(term));
        // The standbys know the term and never acknowledge.
        assert!(!b.node.fence.may_acknowledge(Instant::now()));
        assert_eq!(b.node.fence.term(), Some(term));
        assert!(appended.end_lsn > wal_storage::Lsn(0));
        shutdown([a, b, c]).await;
        Ok(())
    })
}

/// The leader's actor stops without releasing its lease (as in a crash) and its node shuts
/// down: a standby leads within the ttl plus a second.
#[test]
fn a_dead_leader_is_replaced_within_the_ttl_and_a_second() -> Result<()> {
    log();
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir()?;
    actix_rt::System::new().block_on(async {
        let (a, mut b, mut c, term) = cluster(etcd.client_url(), dir.path()).await?;
        let acked = append(&a.node, "before").await?.end_lsn;
        a.actor.send(StopFailover { release: false }).await?;
        let stopped = Instant::now();
        a.node.supervisor.send(ShutdownNode { immediate: true }).await?;
        let within = TTL + Duration::from_secs(1);
        // Whichever standby wins; the other then follows it.
        let won = tokio::select! {
            l = wait_for(&mut b, within + Duration::from_secs(5), "leading", |l| l.leading.is_some()) => ("b", l?),
            l = wait_for(&mut c, within + Duration::from_secs(5), "leading", |l| l.leading.is_some()) => ("c", l?),
        };
        let took = stopped.elapsed();
        eprintln!("a new leader ({}) after {took:?}", won.0);
        assert!(took <= within, "the new leader took {took:?}, more than {within:?}");
        let new_term = won.1.leading.context("leading")?;
        assert!(new_term > term);
        let (winner, other) = if won.0 == "b" { (&b, &mut c) } else { (&c, &mut b) };
        assert!(winner.node.wal.flushed() >= acked, "the winner has what was acknowledged");
        append(&winner.node, "after").await.context("the new leader acknowledges")?;
        wait_for(other, SETTLE, "following the new leader", |l| {
            l.following == Some((won.0.to_string(), new_term))
        })
        .await?;
        shutdown([b, c]).await;
        Ok(())
    })
}

/// etcd dies under the leader: its renewals fail, and it stops acknowledging by its own
/// deadline (the last renewal sent, plus the ttl, minus the margin), without anyone telling it.
#[test]
fn a_leader_cut_off_from_etcd_stops_acknowledging_by_its_deadline() -> Result<()> {
    log();
    let mut etcd = EtcdServer::start();
    let dir = tempfile::tempdir()?;
    let url = etcd.client_url().to_string();
    actix_rt::System::new().block_on(async {
        let (a, b, c, _) = cluster(&url, dir.path()).await?;
        append(&a.node, "before")
            .await
            .context("acknowledged while etcd lives")?;
        etcd.kill();
        let killed = Instant::now();
        // Every grant came from a renewal sent before the kill: none reaches past kill + ttl.
        assert!(
            !a.node.fence.may_acknowledge(killed + TTL),
            "the fence would still acknowledge a ttl after etcd died"
        );
        tokio::time::sleep_until((killed + TTL).into()).await;
        match append(&a.node, "after").await {
            Err(AppendError::NotLeader { .. }) => {}
            other => bail!("an append after the deadline was not refused: {other:?}"),
        }
        shutdown([a, b, c]).await;
        Ok(())
    })
}

/// While paused nobody campaigns for a free key; on resume a standby does.
#[test]
fn pause_stops_failover_and_resume_lets_it_happen() -> Result<()> {
    log();
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir()?;
    let client = etcd.client();
    actix_rt::System::new().block_on(async {
        let (a, mut b, mut c, _) = cluster(etcd.client_url(), dir.path()).await?;
        b.actor.send(Pause).await??;
        // The leader releases its lease: the key goes at once.
        a.actor.send(StopFailover { release: true }).await?;
        a.node
            .supervisor
            .send(ShutdownNode { immediate: true })
            .await?;
        // Nothing may happen for longer than a failover takes: no leader key appears.
        let leader_key = "/walserver/test/leader";
        let watch = client
            .watch(&etcd_gateway::WatchRequest::new(
                etcd_gateway::KeyRange::key(leader_key),
            ))
            .await?;
        let now = client
            .range(&etcd_gateway::KeyRange::key(leader_key))
            .await?;
        assert!(now.kvs.is_empty(), "the leader key is gone");
        let mut watch = Box::pin(watch);
        let quiet = TTL + Duration::from_secs(1);
        if let Ok(event) = tokio::time::timeout(quiet, watch.next()).await {
            bail!("paused, yet the leader key changed: {event:?}");
        }
        assert!(b.leadership.borrow().leading.is_none());
        assert!(c.leadership.borrow().leading.is_none());
        c.actor.send(Resume).await??;
        tokio::select! {
            l = wait_for(&mut b, SETTLE, "leading", |l| l.leading.is_some()) => { l?; }
            l = wait_for(&mut c, SETTLE, "leading", |l| l.leading.is_some()) => { l?; }
        }
        shutdown([b, c]).await;
        Ok(())
    })
}

/// A switchover asked of a standby's actor: the leader stops appends, `b` catches up, takes
/// the key and leads; everything acknowledged before is on `b`; the old leader follows `b`.
#[test]
fn a_switchover_loses_nothing_and_the_old_leader_follows() -> Result<()> {
    log();
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir()?;
    actix_rt::System::new().block_on(async {
        let (mut a, mut b, c, term) = cluster(etcd.client_url(), dir.path()).await?;
        let mut acked = wal_storage::Lsn(0);
        for i in 0..200 {
            acked = append(&a.node, &format!("record {i}")).await?.end_lsn;
        }
        let report = c
            .actor
            .send(Switchover {
                candidate: Some("b".into()),
            })
            .await??;
        eprintln!("switchover: {report:?}");
        assert_eq!(report.new_leader, "b");
        assert!(report.term > term);
        let l = wait_for(&mut b, SETTLE, "leading", |l| l.leading.is_some()).await?;
        assert_eq!(l.leading, Some(report.term));
        assert!(
            b.node.wal.flushed() >= acked,
            "b lacks acknowledged WAL: {} < {acked}",
            b.node.wal.flushed()
        );
        append(&b.node, "on b")
            .await
            .context("the new leader acknowledges")?;
        wait_for(&mut a, SETTLE, "following b", |l| {
            l.following == Some(("b".into(), report.term))
        })
        .await?;
        shutdown([a, b, c]).await;
        Ok(())
    })
}
