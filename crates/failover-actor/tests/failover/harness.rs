//! What every test here starts from: etcd, nodes with closed fences, their actors, and waits
//! on events under a deadline.

pub(crate) use std::path::Path;
pub(crate) use std::time::{Duration, Instant};

pub(crate) use anyhow::{bail, Context as _, Result};
pub(crate) use bytes::Bytes;
pub(crate) use etcd_gateway::testkit::EtcdServer;
pub(crate) use failover_actor::{
    member_slot_name, Failover, FailoverActor, FailoverConfig, GetClusterView, GetFailoverStatus,
    GetHistory, GetLocalHealth, Leadership, Pause, Resume, StopFailover, SubscribeLeadership,
    SubscribeMemberSlots, Switchover,
};
pub(crate) use futures_util::StreamExt;
pub(crate) use supervisor_actor::{
    AppendError, AppendRecords, Durability, Fence, MembershipState, Node, NodeBuilder, ShutdownNode,
};
pub(crate) use tokio::sync::watch;

pub(crate) const TTL: Duration = Duration::from_secs(2);
/// How long bootstrap may take: three actors join, the primary campaigns, two standbys
/// follow. A guess for two busy cores.
pub(crate) const SETTLE: Duration = Duration::from_secs(20);

pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) node: Node,
    pub(crate) actor: actix::Addr<FailoverActor>,
    pub(crate) leadership: watch::Receiver<Leadership>,
}

/// The actors' log, shown for a failing test (`RUST_LOG` chooses; warnings by default).
pub(crate) fn log() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "failover_actor=info,warn".into()),
        )
        .with_test_writer()
        .try_init();
}

pub(crate) fn conninfo(node: &Node) -> String {
    format!("host=127.0.0.1 port={} user=r", node.listen_addr.port())
}

/// What the primary keeps for standbys beyond what slots keep. The tests write megabytes in a
/// burst; standbys must not lose segments they need whatever the member slots do (the
/// member slot tests keep nothing but what slots keep).
pub(crate) const KEEP: u64 = 64 << 20;

pub(crate) async fn start_primary(dir: &Path) -> Result<Node> {
    start_primary_keeping(dir, KEEP).await
}

pub(crate) async fn start_primary_keeping(dir: &Path, wal_keep_size: u64) -> Result<Node> {
    Ok(NodeBuilder::primary(dir)
        .listen("127.0.0.1:0".parse()?)
        .segment_size(1 << 20)
        .wal_keep_size(wal_keep_size)
        .io_threads(0)
        .fence(Fence::closed())
        .start()
        .await?)
}

pub(crate) async fn start_standby(dir: &Path, upstream: &Node, name: &str) -> Result<Node> {
    Ok(NodeBuilder::standby(dir, &conninfo(upstream))?
        .cluster_name(name)
        .listen("127.0.0.1:0".parse()?)
        .segment_size(1 << 20)
        .io_threads(0)
        .fence(Fence::closed())
        .start()
        .await?)
}

pub(crate) async fn start_actor(etcd: &str, name: &str, node: Node) -> Result<Member> {
    start_actor_with(etcd, name, node, |_| {}).await
}

/// As [`start_actor`], the configuration changed by `configure` first.
pub(crate) async fn start_actor_with(
    etcd: &str,
    name: &str,
    node: Node,
    configure: impl FnOnce(&mut FailoverConfig),
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
pub(crate) async fn wait_for(
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

pub(crate) async fn append(
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
pub(crate) async fn cluster_with(
    a_etcd: &str,
    etcd: &str,
    dir: &Path,
) -> Result<(Member, Member, Member, u64)> {
    cluster_opts(a_etcd, etcd, dir, KEEP, |_| {}).await
}

/// As [`cluster_with`], the primary keeping `wal_keep_size`, every actor's configuration
/// changed by `configure`.
pub(crate) async fn cluster_opts(
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
pub(crate) struct Setup {
    pub(crate) etcd: EtcdServer,
    pub(crate) dir: std::path::PathBuf,
    pub(crate) a: Member,
    pub(crate) b: Member,
    pub(crate) c: Member,
    pub(crate) term: u64,
}

/// Runs `test` in an actix System on a settled cluster: etcd, `a` leading, `b` and `c`
/// following it.
pub(crate) fn with_cluster<F: std::future::Future<Output = Result<()>>>(
    test: impl FnOnce(Setup) -> F,
) -> Result<()> {
    with_cluster_opts(KEEP, |_| {}, test)
}

/// As [`with_cluster`], the primary keeping `wal_keep_size`, every actor's configuration
/// changed by `configure`.
pub(crate) fn with_cluster_opts<F: std::future::Future<Output = Result<()>>>(
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

pub(crate) async fn shutdown(members: impl IntoIterator<Item = Member>) {
    for m in members {
        let _ = stop(&m, true).await;
    }
}

/// Stops a member's actor (`release`: revoking its lease, else as in a crash) and its node.
pub(crate) async fn stop(m: &Member, release: bool) -> Result<Instant> {
    m.actor.send(StopFailover { release }).await?;
    let stopped = Instant::now();
    m.node
        .supervisor
        .send(ShutdownNode { immediate: true })
        .await?;
    Ok(stopped)
}

/// Whichever of `b` and `c` leads first, and its term.
pub(crate) async fn first_to_lead(
    b: &mut Member,
    c: &mut Member,
    within: Duration,
) -> Result<(String, u64)> {
    let won = tokio::select! {
        l = wait_for(b, within, "leading", |l| l.leading.is_some()) => ("b", l?),
        l = wait_for(c, within, "leading", |l| l.leading.is_some()) => ("c", l?),
    };
    Ok((won.0.to_string(), won.1.leading.context("leading")?))
}

/// Waits until `node` has flushed `lsn`, at most `within`.
pub(crate) async fn wait_flushed(
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
