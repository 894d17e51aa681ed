//! Synchronous mode: the leader publishes its synchronous standby and replaces a lost one.

use crate::harness::*;

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
