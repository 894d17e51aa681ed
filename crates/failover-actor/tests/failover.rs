//! The failover actor with a real etcd and real nodes in one actix System, on loopback: a
//! primary and two standbys, each with a closed fence and its own actor (ttl 2 s). Every wait
//! is on an event (the actors' leadership watch, an etcd watch) under a deadline.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use bytes::Bytes;
use etcd_gateway::testkit::EtcdServer;
use failover_actor::{
    member_slot_name, Failover, FailoverActor, FailoverConfig, GetClusterView, GetHistory,
    GetLocalHealth, Leadership, Pause, Resume, StopFailover, SubscribeLeadership,
    SubscribeMemberSlots, Switchover,
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

/// What the primary keeps for standbys beyond what slots keep. The tests write megabytes in a
/// burst; standbys must not lose segments they need whatever the member slots do (the
/// member slot tests keep nothing but what slots keep).
const KEEP: u64 = 64 << 20;

async fn start_primary(dir: &Path) -> Result<Node> {
    start_primary_keeping(dir, KEEP).await
}

async fn start_primary_keeping(dir: &Path, wal_keep_size: u64) -> Result<Node> {
    Ok(NodeBuilder::primary(dir)
        .listen("127.0.0.1:0".parse()?)
        .segment_size(1 << 20)
        .wal_keep_size(wal_keep_size)
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
    start_actor_with(etcd, name, node, |_| {}).await
}

/// As [`start_actor`], the configuration changed by `configure` first.
async fn start_actor_with(
    etcd: &str,
    name: &str,
    node: Node,
    configure: fn(&mut FailoverConfig),
) -> Result<Member> {
    let mut config = FailoverConfig::new(
        vec![etcd.to_string()],
        "test",
        name,
        conninfo(&node),
        String::new(),
    );
    config.ttl = TTL;
    configure(&mut config);
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

/// A primary and two standbys under failover, settled: the primary leads, both follow it;
/// `a`'s actor reaches etcd at `a_etcd`, the others at `etcd`.
async fn cluster_with(
    a_etcd: &str,
    etcd: &str,
    dir: &Path,
) -> Result<(Member, Member, Member, u64)> {
    cluster_opts(a_etcd, etcd, dir, KEEP, |_| {}).await
}

/// As [`cluster_with`], the primary keeping `wal_keep_size`, every actor's configuration
/// changed by `configure`.
async fn cluster_opts(
    a_etcd: &str,
    etcd: &str,
    dir: &Path,
    wal_keep_size: u64,
    configure: fn(&mut FailoverConfig),
) -> Result<(Member, Member, Member, u64)> {
    let p = start_primary_keeping(&dir.join("a"), wal_keep_size).await?;
    let b = start_standby(&dir.join("b"), &p, "b").await?;
    let c = start_standby(&dir.join("c"), &p, "c").await?;
    let mut a = start_actor_with(a_etcd, "a", p, configure).await?;
    let mut b = start_actor_with(etcd, "b", b, configure).await?;
    let mut c = start_actor_with(etcd, "c", c, configure).await?;
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

/// What a test of a settled cluster gets. A test binds every field (`_name` for those it
/// does not use): an async block captures only the fields it names, and etcd must live
/// until the test ends.
struct Setup {
    etcd: EtcdServer,
    dir: std::path::PathBuf,
    a: Member,
    b: Member,
    c: Member,
    term: u64,
}

/// Runs `test` in an actix System on a settled cluster: etcd, `a` leading, `b` and `c`
/// following it.
fn with_cluster<F: std::future::Future<Output = Result<()>>>(
    test: impl FnOnce(Setup) -> F,
) -> Result<()> {
    with_cluster_opts(KEEP, |_| {}, test)
}

/// As [`with_cluster`], the primary keeping `wal_keep_size`, every actor's configuration
/// changed by `configure`.
fn with_cluster_opts<F: std::future::Future<Output = Result<()>>>(
    wal_keep_size: u64,
    configure: fn(&mut FailoverConfig),
    test: impl FnOnce(Setup) -> F,
) -> Result<()> {
    log();
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir()?;
    let path = dir.path().to_path_buf();
    actix_rt::System::new().block_on(async move {
        let url = etcd.client_url();
        let (a, b, c, term) = cluster_opts(url, url, &path, wal_keep_size, configure).await?;
        test(Setup {
            etcd,
            dir: path,
            a,
            b,
            c,
            term,
        })
        .await
    })
}

async fn shutdown(members: impl IntoIterator<Item = Member>) {
    for m in members {
        let _ = stop(&m, true).await;
    }
}

/// Stops a member's actor (`release`: revoking its lease, else as in a crash) and its node.
async fn stop(m: &Member, release: bool) -> Result<Instant> {
    m.actor.send(StopFailover { release }).await?;
    let stopped = Instant::now();
    m.node
        .supervisor
        .send(ShutdownNode { immediate: true })
        .await?;
    Ok(stopped)
}

/// Whichever of `b` and `c` leads first, and its term.
async fn first_to_lead(b: &mut Member, c: &mut Member, within: Duration) -> Result<(String, u64)> {
    let won = tokio::select! {
        l = wait_for(b, within, "leading", |l| l.leading.is_some()) => ("b", l?),
        l = wait_for(c, within, "leading", |l| l.leading.is_some()) => ("c", l?),
    };
    Ok((won.0.to_string(), won.1.leading.context("leading")?))
}

#[test]
fn bootstrap_elects_the_primary_and_the_standbys_follow() -> Result<()> {
    with_cluster(|setup| async move {
        let Setup {
            a,
            b,
            c,
            term,
            etcd: _etcd,
            dir: _dir,
        } = setup;
        assert!(term > 0);
        let appended = append(&a.node, "first")
            .await
            .context("the leader acknowledges")?;
        assert_eq!(a.node.fence.term(), Some(term));
        // The standbys know the term and never acknowledge.
        assert!(!b.node.fence.may_acknowledge(Instant::now()));
        assert_eq!(b.node.fence.term(), Some(term));
        assert!(appended.end_lsn > wal_storage::Lsn(0));
        // Any member's view of the cluster says the same, from etcd.
        let view = c.actor.send(GetClusterView).await??;
        let leader = view.leader.context("a leader in the view")?;
        assert_eq!((leader.name.as_str(), leader.term), ("a", term));
        assert!(leader.lease_remaining_ms.is_some_and(|ms| ms <= 2000));
        let mut names: Vec<_> = view.members.iter().map(|m| m.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(!view.paused);
        let history = b.actor.send(GetHistory).await??;
        assert_eq!(history.len(), 1);
        assert_eq!(
            (
                history[0].term,
                history[0].leader.as_str(),
                history[0].reason.as_str()
            ),
            (term, "a", "bootstrap")
        );
        let health = a.actor.send(GetLocalHealth).await?;
        assert!(health.leader_with_live_lease);
        assert_eq!(health.term, Some(term));
        assert!(!b.actor.send(GetLocalHealth).await?.leader_with_live_lease);
        shutdown([a, b, c]).await;
        Ok(())
    })
}

/// The leader's actor stops without releasing its lease (as in a crash) and its node shuts
/// down: a standby leads within the ttl plus a second.
#[test]
fn a_dead_leader_is_replaced_within_the_ttl_and_a_second() -> Result<()> {
    with_cluster(|setup| async move {
        let Setup {
            a,
            mut b,
            mut c,
            term,
            etcd: _etcd,
            dir: _dir,
        } = setup;
        let acked = append(&a.node, "before").await?.end_lsn;
        // synchronous_mode is off here, so an acknowledgement means only that `a` flushed it;
        // wait until both standbys hold it too, or whether the winner has it is a race.
        wait_flushed(&b.node, acked, SETTLE, "b before the crash").await?;
        wait_flushed(&c.node, acked, SETTLE, "c before the crash").await?;
        let stopped = stop(&a, false).await?;
        let within = TTL + Duration::from_secs(1);
        // Whichever standby wins; the other then follows it.
        let won = first_to_lead(&mut b, &mut c, within + Duration::from_secs(5)).await?;
        let took = stopped.elapsed();
        eprintln!("a new leader ({}) after {took:?}", won.0);
        assert!(
            took <= within,
            "the new leader took {took:?}, more than {within:?}"
        );
        let new_term = won.1;
        assert!(new_term > term);
        let (winner, other) = if won.0 == "b" {
            (&b, &mut c)
        } else {
            (&c, &mut b)
        };
        assert!(
            winner.node.wal.flushed() >= acked,
            "the winner has what was acknowledged"
        );
        let history = winner.actor.send(GetHistory).await??;
        assert_eq!(
            history.last().map(|r| (r.term, r.reason.as_str())),
            Some((new_term, "failover"))
        );
        append(&winner.node, "after")
            .await
            .context("the new leader acknowledges")?;
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
    with_cluster(|setup| async move {
        let Setup {
            mut etcd,
            a,
            b,
            c,
            dir: _dir,
            term: _term,
        } = setup;
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
    with_cluster(|setup| async move {
        let Setup {
            etcd,
            a,
            mut b,
            mut c,
            dir: _dir,
            term: _term,
        } = setup;
        let client = etcd.client();
        b.actor.send(Pause).await??;
        // The leader releases its lease: the key goes at once.
        stop(&a, true).await?;
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
        first_to_lead(&mut b, &mut c, SETTLE).await?;
        shutdown([b, c]).await;
        Ok(())
    })
}

/// A switchover asked of a standby's actor: the leader stops appends, `b` catches up, takes
/// the key and leads; everything acknowledged before is on `b`; the old leader follows `b`.
#[test]
fn a_switchover_loses_nothing_and_the_old_leader_follows() -> Result<()> {
    with_cluster(|setup| async move {
        let Setup {
            mut a,
            mut b,
            c,
            term,
            etcd: _etcd,
            dir: _dir,
        } = setup;
        for i in 0..50 {
            append(&a.node, &format!("record {i}")).await?;
        }
        // Appends stream in while the switchover is asked for, so the candidate is behind when
        // the leader stops appends: whatever was acknowledged must be on it all the same.
        let big = Bytes::from(vec![b'x'; 128 * 1024]);
        let mut appends: Vec<_> = (0..60)
            .map(|_| {
                a.node.supervisor.send(AppendRecords {
                    records: vec![big.clone()],
                    durability: Some(Durability::Local),
                })
            })
            .collect();
        let later = appends.split_off(10);
        let mut acked = wal_storage::Lsn(0);
        for answer in appends {
            acked = acked.max(answer.await??.end_lsn);
        }
        let switchover = c.actor.send(Switchover {
            candidate: Some("b".into()),
        });
        let (answers, report) =
            futures_util::future::join(futures_util::future::join_all(later), switchover).await;
        let report = report??;
        let refused = answers.iter().filter(|a| !matches!(a, Ok(Ok(_)))).count();
        for answer in answers.into_iter().filter_map(|a| a.ok()?.ok()) {
            acked = acked.max(answer.end_lsn);
        }
        eprintln!("{refused} of the 50 appends in flight were not acknowledged");
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

/// The old leader crashes (its lease expires by the ttl), a standby takes over, and the old
/// leader's data directory, restarted as the primary it was with a closed fence, follows the
/// new leader: it is demoted live and never acknowledges.
#[test]
fn a_restarted_old_leader_follows_the_new_one() -> Result<()> {
    with_cluster(|setup| async move {
        let Setup {
            etcd,
            dir,
            a,
            mut b,
            mut c,
            term: _term,
        } = setup;
        stop(&a, false).await?;
        let (winner, new_term) = first_to_lead(&mut b, &mut c, SETTLE).await?;
        // The storage lock goes with the last handle of the old node's storage.
        drop(a);
        let node = start_primary(&dir.join("a")).await?;
        assert!(
            !node.fence.may_acknowledge(Instant::now()),
            "a restarted node's fence is closed"
        );
        let mut a = start_actor(etcd.client_url(), "a", node).await?;
        wait_for(&mut a, SETTLE, "following the new leader", |l| {
            l.following == Some((winner.clone(), new_term))
        })
        .await?;
        let status = a
            .node
            .supervisor
            .send(supervisor_actor::GetNodeStatus)
            .await??;
        assert_eq!(status.role, supervisor_actor::NodeRole::Standby);
        assert!(a.leadership.borrow().leading.is_none());
        match append(&a.node, "on the old leader").await {
            Err(_) => {}
            Ok(done) => bail!("the old leader acknowledged an append: {done:?}"),
        }
        shutdown([a, b, c]).await;
        Ok(())
    })
}

/// Waits until etcd's `key` satisfies `f` (its value, or `None` when absent), by a watch.
async fn wait_key(
    client: &etcd_gateway::Client,
    key: &str,
    within: Duration,
    f: impl Fn(Option<&[u8]>) -> bool,
) -> Result<Option<Vec<u8>>> {
    let range = etcd_gateway::KeyRange::key(key);
    let now = client.range(&range).await?;
    let value = now.kvs.first().map(|kv| kv.value.clone());
    if f(value.as_deref()) {
        return Ok(value);
    }
    let watch = client
        .watch(&etcd_gateway::WatchRequest::new(range).from_revision(now.header.revision + 1))
        .await?;
    let mut watch = Box::pin(watch);
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let batch = match tokio::time::timeout_at(deadline, watch.next()).await {
            Ok(Some(batch)) => batch?,
            Ok(None) => bail!("the watch of {key} ended"),
            Err(_) => bail!("{key} did not change as expected within {within:?}"),
        };
        for event in batch.events {
            let value = match event.kind {
                etcd_gateway::EventKind::Put => Some(event.kv.value),
                etcd_gateway::EventKind::Delete => None,
            };
            if f(value.as_deref()) {
                return Ok(value);
            }
        }
    }
}

fn sync_standby(value: Option<&[u8]>) -> Option<String> {
    let record: serde_json::Value = serde_json::from_slice(value?).ok()?;
    record["sync_standby"].as_str().map(str::to_string)
}

/// `synchronous_mode = on`: the leader publishes a synchronous standby once it counts and has
/// caught up; when that standby goes, the other is counted, caught up and published, and
/// synchronous appends are acknowledged again.
#[test]
fn synchronous_mode_publishes_a_standby_and_replaces_a_lost_one() -> Result<()> {
    log();
    let etcd = EtcdServer::start();
    let client = etcd.client();
    let dir = tempfile::tempdir()?;
    actix_rt::System::new().block_on(async {
        let p = start_primary(&dir.path().join("a")).await?;
        let b = start_standby(&dir.path().join("b"), &p, "b").await?;
        let c = start_standby(&dir.path().join("c"), &p, "c").await?;
        let mut members = Vec::new();
        for (name, node) in [("a", p), ("b", b), ("c", c)] {
            let mut config = FailoverConfig::new(
                vec![etcd.client_url().to_string()],
                "test",
                name,
                conninfo(&node),
                String::new(),
            );
            config.ttl = TTL;
            config.synchronous_mode = failover_actor::SynchronousMode::On;
            let actor = FailoverActor::start(config, node.clone())?;
            let leadership = actor.send(SubscribeLeadership).await?;
            members.push(Member {
                name: name.into(),
                node,
                actor,
                leadership,
            });
        }
        wait_for(&mut members[0], SETTLE, "leading", |l| l.leading.is_some()).await?;
        let first = wait_key(&client, "/walserver/test/sync", SETTLE, |v| {
            sync_standby(v).is_some()
        })
        .await?;
        let first = sync_standby(first.as_deref()).context("a sync standby")?;
        eprintln!("first synchronous standby: {first}");
        let on = |node: &Node, text: &'static str| {
            let supervisor = node.supervisor.clone();
            async move {
                supervisor
                    .send(AppendRecords {
                        records: vec![Bytes::from(text)],
                        durability: Some(Durability::On),
                    })
                    .await
            }
        };
        on(&members[0].node, "sync 1")
            .await?
            .context("a synchronous append")?;
        let gone = members
            .iter()
            .position(|m| m.name == first)
            .context("the member")?;
        let lost = members.remove(gone);
        shutdown([lost]).await;
        let other = if first == "b" { "c" } else { "b" };
        wait_key(&client, "/walserver/test/sync", SETTLE, |v| {
            sync_standby(v).as_deref() == Some(other)
        })
        .await?;
        tokio::time::timeout(SETTLE, on(&members[0].node, "sync 2"))
            .await
            .context("the synchronous append waited too long")??
            .context("a synchronous append after the replacement")?;
        shutdown(members).await;
        Ok(())
    })
}

/// A switchover to a standby that cannot catch up (its node is gone, its actor still in
/// etcd) is refused after the catch-up timeout; the leader keeps its key and acknowledges
/// again.
#[test]
fn a_switchover_to_a_standby_that_cannot_catch_up_is_refused() -> Result<()> {
    with_cluster(|setup| async move {
        let Setup {
            mut a,
            b,
            c,
            term,
            etcd: _etcd,
            dir: _dir,
        } = setup;
        b.node
            .supervisor
            .send(ShutdownNode { immediate: true })
            .await?;
        append(&a.node, "b never gets this").await?;
        let asked = Instant::now();
        let answer = a
            .actor
            .send(Switchover {
                candidate: Some("b".into()),
            })
            .await?;
        eprintln!("refused after {:?}: {answer:?}", asked.elapsed());
        if let Ok(report) = answer {
            bail!("a switchover to a standby that lacks acknowledged WAL happened: {report:?}");
        }
        wait_for(&mut a, SETTLE, "leading again", |l| l.leading == Some(term)).await?;
        if let Err(e) = append(&a.node, "still the leader").await {
            bail!("the leader does not acknowledge again: {e:?}");
        }
        shutdown([a, b, c]).await;
        Ok(())
    })
}

/// A forced failover, asked of the leader itself: no catch-up wait; the report says how far
/// behind the candidate was, the candidate leads in a newer term and the old leader follows.
#[test]
fn a_forced_failover_hands_over_at_once_and_reports_the_lag() -> Result<()> {
    with_cluster(|setup| async move {
        let Setup {
            mut a,
            b,
            mut c,
            term,
            etcd: _etcd,
            dir: _dir,
        } = setup;
        append(&a.node, "before").await?;
        let report = a
            .actor
            .send(Failover {
                candidate: "c".into(),
            })
            .await??;
        eprintln!("forced failover: {report:?}");
        assert_eq!(report.new_leader, "c");
        assert!(report.term > term);
        assert!(report.candidate_lag_bytes.is_some());
        let l = wait_for(&mut c, SETTLE, "leading", |l| l.leading.is_some()).await?;
        assert_eq!(l.leading, Some(report.term));
        wait_for(&mut a, SETTLE, "following c", |l| {
            l.following == Some(("c".into(), report.term))
        })
        .await?;
        let history = c.actor.send(GetHistory).await??;
        assert_eq!(
            history.last().map(|r| (r.term, r.reason.as_str())),
            Some((report.term, "switchover"))
        );
        shutdown([a, b, c]).await;
        Ok(())
    })
}

/// A TCP relay on loopback between one actor and etcd that the test can cut (every relayed
/// connection is dropped and new ones are closed at once) and heal.
struct Relay {
    url: String,
    cut: watch::Sender<bool>,
}

impl Relay {
    async fn start(target: &str) -> Result<Relay> {
        let target = target
            .strip_prefix("http://")
            .context("an http URL")?
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (cut, cut_rx) = watch::channel(false);
        actix_rt::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *cut_rx.borrow() {
                    continue;
                }
                let target = target.clone();
                let mut cut_rx = cut_rx.clone();
                actix_rt::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Ok(Relay { url, cut })
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// The leader alone loses etcd (its relay is cut): it stops acknowledging by its own deadline,
/// a standby leads within the ttl and a second, and when etcd is back the old leader finds
/// its lease gone, joins again and follows the new leader, demoted.
#[test]
fn a_leader_cut_off_from_etcd_is_replaced_and_follows_when_it_comes_back() -> Result<()> {
    log();
    let etcd = EtcdServer::start();
    let dir = tempfile::tempdir()?;
    actix_rt::System::new().block_on(async {
        let relay = Relay::start(etcd.client_url()).await?;
        let (mut a, mut b, mut c, _) =
            cluster_with(&relay.url, etcd.client_url(), dir.path()).await?;
        append(&a.node, "before")
            .await
            .context("acknowledged before the cut")?;
        relay.set_cut(true);
        let cut = Instant::now();
        assert!(
            !a.node.fence.may_acknowledge(cut + TTL),
            "the cut-off leader's fence reaches past its lease"
        );
        let within = TTL + Duration::from_secs(1);
        let (winner, new_term) =
            first_to_lead(&mut b, &mut c, within + Duration::from_secs(5)).await?;
        let took = cut.elapsed();
        eprintln!("{winner} leads {took:?} after the leader was cut off from etcd");
        assert!(
            took <= within,
            "the new leader took {took:?}, more than {within:?}"
        );
        assert!(
            !a.node.fence.may_acknowledge(Instant::now()),
            "two nodes acknowledge at once"
        );
        match append(&a.node, "cut off").await {
            Err(AppendError::NotLeader { .. }) => {}
            other => bail!("the cut-off old leader answered an append: {other:?}"),
        }
        relay.set_cut(false);
        wait_for(&mut a, SETTLE, "following the new leader", |l| {
            l.following == Some((winner.clone(), new_term))
        })
        .await?;
        let status = a
            .node
            .supervisor
            .send(supervisor_actor::GetNodeStatus)
            .await??;
        assert_eq!(status.role, supervisor_actor::NodeRole::Standby);
        shutdown([a, b, c]).await;
        Ok(())
    })
}

// Member slots. Every node here keeps no WAL for others but what its slots keep
// (`wal_keep_size` 0, as by default), with 1 MiB segments.

/// Runs `test` on a settled cluster whose primary keeps no WAL for others but what slots
/// keep, every actor's configuration changed by `configure`, once `a` holds `b`'s and `c`'s
/// slots.
fn with_slot_cluster<F: std::future::Future<Output = Result<()>>>(
    configure: fn(&mut FailoverConfig),
    test: impl FnOnce(Setup) -> F,
) -> Result<()> {
    with_cluster_opts(0, configure, |setup| async move {
        wait_slots(&setup.a, SETTLE, "holding b's and c's slots", |s| {
            s == [slot("b"), slot("c")]
        })
        .await?;
        test(setup).await
    })
}

/// The member slot of `name`.
fn slot(name: &str) -> String {
    member_slot_name(name).expect("a short name has a slot")
}

/// Waits until the member slots `member`'s node holds satisfy `f`, at most `within`.
async fn wait_slots(
    member: &Member,
    within: Duration,
    what: &str,
    f: impl Fn(&[String]) -> bool,
) -> Result<Vec<String>> {
    let mut held = member.actor.send(SubscribeMemberSlots).await?;
    let waited = tokio::time::timeout(within, held.wait_for(|h| h.as_deref().is_some_and(&f)))
        .await
        .map(|r| r.map(|h| h.clone()));
    match waited {
        Ok(Ok(h)) => Ok(h.unwrap_or_default()),
        Ok(Err(_)) => bail!("{}'s actor stopped before {what}", member.name),
        Err(_) => bail!(
            "{}: not {what} within {within:?} (holds {:?})",
            member.name,
            *held.borrow()
        ),
    }
}

/// Appends `count` records of 128 KiB on `node`; the end of the last.
async fn append_megabytes(node: &Node, count: usize) -> Result<wal_storage::Lsn> {
    let big = Bytes::from(vec![b'w'; 128 * 1024]);
    let mut end = wal_storage::Lsn(0);
    for _ in 0..count {
        let done = node
            .supervisor
            .send(AppendRecords {
                records: vec![big.clone()],
                durability: Some(Durability::Local),
            })
            .await??;
        end = end.max(done.end_lsn);
    }
    Ok(end)
}

/// Waits until `node` has flushed `lsn`, at most `within`.
async fn wait_flushed(
    node: &Node,
    lsn: wal_storage::Lsn,
    within: Duration,
    what: &str,
) -> Result<()> {
    tokio::time::timeout(
        within,
        node.wait_for_lsn(lsn, supervisor_actor::LocalLevel::Flushed),
    )
    .await
    .with_context(|| {
        format!(
            "{what}: {lsn} not flushed within {within:?} (at {})",
            node.wal.flushed()
        )
    })
}

/// A standby stopped while the leader writes several segments finds, on restart, everything
/// it missed still there: its slot on the leader kept it (without it nothing would, and it
/// could never catch up).
#[test]
fn a_stopped_standby_catches_up_through_its_slot() -> Result<()> {
    with_slot_cluster(
        |_| {},
        |setup| async move {
            let Setup {
                etcd,
                dir,
                a,
                b,
                c,
                term,
            } = setup;
            let url = etcd.client_url();
            let end = append_megabytes(&a.node, 4).await?;
            wait_flushed(&c.node, end, SETTLE, "c before its stop").await?;
            stop(&c, true).await?;
            let c_flush = c.node.wal.flushed();
            drop(c);
            // Six segments while c is down: without its slot, retention removes what c needs at
            // the leader's segment switches.
            let end = append_megabytes(&a.node, 48).await?;
            assert!(
                end.0 >= c_flush.0 + (5 << 20),
                "several segments were written ({c_flush} to {end})"
            );
            wait_flushed(&b.node, end, SETTLE, "b").await?;
            let node = start_standby(&dir.join("c"), &a.node, "c").await?;
            let mut c = start_actor(url, "c", node).await?;
            wait_for(&mut c, SETTLE, "following a", |l| {
                l.following == Some(("a".into(), term))
            })
            .await?;
            wait_flushed(&c.node, end, SETTLE, "c after its restart").await?;
            // It streams through its slot, whose position follows what it has flushed.
            let info = a.node.wal.slot(&slot("c"))?;
            assert!(info.restart_lsn.is_some_and(|r| r >= c_flush), "{info:?}");
            shutdown([a, b, c]).await;
            Ok(())
        },
    )
}

/// After a failover the new leader holds the slots of the other members, the crashed old
/// leader's included (its key went with its lease, together with the leader key); the old
/// leader, back as a standby, drops the slots it held as the leader and catches up.
#[test]
fn after_a_failover_the_new_leader_holds_the_others_slots() -> Result<()> {
    with_slot_cluster(
        |_| {},
        |setup| async move {
            let Setup {
                etcd,
                dir,
                a,
                mut b,
                mut c,
                term: _term,
            } = setup;
            let url = etcd.client_url();
            stop(&a, false).await?;
            let (winner, new_term) = first_to_lead(&mut b, &mut c, SETTLE).await?;
            let (leader, other) = if winner == "b" { (&b, "c") } else { (&c, "b") };
            let mut want = vec![slot("a"), slot(other)];
            want.sort_unstable();
            wait_slots(leader, SETTLE, "holding the others' slots", |s| s == want).await?;
            // Segments while the old leader is down; then it comes back and follows.
            let end = append_megabytes(&leader.node, 24).await?;
            drop(a);
            let node = start_primary_keeping(&dir.join("a"), 0).await?;
            let mut a = start_actor(url, "a", node).await?;
            wait_for(&mut a, SETTLE, "following the new leader", |l| {
                l.following == Some((winner.clone(), new_term))
            })
            .await?;
            wait_slots(&a, SETTLE, "holding no member slot as a standby", |s| {
                s.is_empty()
            })
            .await?;
            wait_flushed(&a.node, end, SETTLE, "the old leader").await?;
            shutdown([a, b, c]).await;
            Ok(())
        },
    )
}

/// The grace of a departed member's slot in the test below.
const GRACE: Duration = Duration::from_secs(3);

/// A member gone for longer than the grace loses its slot on the leader; the others' slots
/// and a slot that is not a member slot stay.
#[test]
fn a_departed_member_s_slot_is_dropped_after_the_grace() -> Result<()> {
    with_slot_cluster(
        |config| {
            config.member_slot_grace = Some(GRACE);
        },
        |setup| async move {
            let Setup {
                etcd: _etcd,
                dir: _dir,
                a,
                b,
                c,
                term: _term,
            } = setup;
            a.node.wal.create_slot("not_a_member", false, true)?;
            // Its lease revoked: c's key goes at once.
            stop(&c, true).await?;
            let gone = Instant::now();
            wait_slots(&a, GRACE + SETTLE, "dropping c's slot", |s| {
                s == [slot("b")]
            })
            .await?;
            let took = gone.elapsed();
            assert!(
                took >= GRACE,
                "c's slot went after {took:?}, within the grace"
            );
            assert!(
                a.node.wal.slot("not_a_member").is_ok(),
                "another slot was dropped"
            );
            shutdown([a, b, c]).await;
            Ok(())
        },
    )
}
