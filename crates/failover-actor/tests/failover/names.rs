//! One process per member name: a second process of a name is refused and never writes over
//! the live member's key; a member whose key another process took stops acknowledging; a name
//! whose process died a moment ago is free once its lease runs out.

use etcd_gateway::{Client, EventKind, KeyRange, KeyValue, LeaseId, WatchRequest};
use failover_actor::keys::Keys;
use failover_actor::{check_member_name, FailoverError, MemberInfo};

use crate::harness::*;

async fn member_key(client: &Client, name: &str) -> Result<(KeyValue, i64)> {
    let answer = client
        .range(&KeyRange::key(Keys::new("test").member(name)))
        .await?;
    let kv = answer.kvs.first().context("the member key")?.clone();
    Ok((kv, answer.header.revision))
}

#[test]
fn a_second_process_of_a_member_name_is_refused_and_never_overwrites_its_key() -> Result<()> {
    with_cluster(|setup| async move {
        let Setup {
            a,
            mut b,
            c,
            term,
            etcd,
            dir,
        } = setup;
        let client = etcd.client();
        let (held, revision) = member_key(&client, "b").await?;
        let mut changes = client
            .watch(
                &WatchRequest::new(KeyRange::key(Keys::new("test").member("b")))
                    .from_revision(revision + 1),
            )
            .await?;

        // The check a starting node makes: refused within one ttl, naming the holder.
        let refused = tokio::time::timeout(TTL, check_member_name(&client, "test", "b"))
            .await
            .context("the check answers within one ttl")?;
        match refused {
            Err(e @ FailoverError::NameHeld { .. }) => {
                assert!(e.to_string().contains(&conninfo(&b.node)), "{e}");
            }
            other => bail!("not refused as held: {other:?}"),
        }

        // A second actor of the name, started past the check, leaves failover by itself,
        // says so in its status (naming the holder), and never acknowledges.
        let twin = start_standby(&dir.join("twin"), &a.node, "b").await?;
        let twin = start_actor(etcd.client_url(), "b", twin).await?;
        let deadline = Instant::now() + TTL;
        let left = loop {
            let s = twin.actor.send(GetFailoverStatus).await?;
            if s.state == MembershipState::Left {
                break s;
            }
            if Instant::now() > deadline {
                bail!("the twin has not left within one ttl: {s:?}");
            }
            // Its state has no watch: asked again at a short interval, under the deadline.
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let reason = left.reason.unwrap_or_default();
        assert!(
            reason.starts_with("left automatic failover: ") && reason.contains(&conninfo(&b.node)),
            "{reason}"
        );
        let health = twin.actor.send(GetLocalHealth).await?;
        assert_eq!(health.not_member.as_deref(), Some(reason.as_str()));
        assert!(!twin.node.fence.may_acknowledge(Instant::now()));

        // Every change of b's key up to b's next refresh after the twin left was b's own.
        let (_, after) = member_key(&client, "b").await?;
        let deadline = Instant::now() + TTL;
        'refreshed: loop {
            let batch = tokio::time::timeout_at(deadline.into(), changes.next())
                .await
                .context("b refreshes its key within one ttl")?
                .context("the watch goes on")??;
            for event in batch.events {
                assert_eq!(event.kind, EventKind::Put, "b's key was deleted");
                assert_eq!(event.kv.lease, held.lease, "b's key was written over");
                let info: MemberInfo = serde_json::from_slice(&event.kv.value)?;
                assert_eq!(info.conninfo, conninfo(&b.node));
                if event.kv.mod_revision > after {
                    break 'refreshed;
                }
            }
        }
        assert_eq!(
            b.leadership.borrow().following,
            Some(("a".to_string(), term))
        );
        wait_for(&mut b, TTL, "still following a", |l| {
            l.following == Some(("a".into(), term))
        })
        .await?;
        shutdown([twin, a, b, c]).await;
        Ok(())
    })
}

#[test]
fn a_leader_whose_member_key_another_process_took_stops_acknowledging() -> Result<()> {
    with_cluster(|setup| async move {
        let Setup {
            mut a,
            b,
            c,
            term: _term,
            etcd,
            dir: _dir,
        } = setup;
        let client = etcd.client();
        let (held, _) = member_key(&client, "a").await?;
        let foreign = client.lease_grant(60).await?.id;
        assert_ne!(foreign, held.lease);
        client
            .put(
                Keys::new("test").member("a").as_bytes(),
                &held.value,
                Some(foreign),
            )
            .await?;
        // Its next renewal (every ttl/3) finds the key on a lease not its own.
        let _ = wait_for(&mut a, TTL, "not leading", |l| l.leading.is_none()).await;
        assert!(!a.node.fence.may_acknowledge(Instant::now()));
        assert!(append(&a.node, "after").await.is_err());
        let (now, _) = member_key(&client, "a").await?;
        assert_eq!(now.lease, foreign, "a wrote over the other process's key");
        client.lease_revoke(LeaseId(foreign.0)).await?;
        shutdown([a, b, c]).await;
        Ok(())
    })
}

/// A member killed a moment ago leaves its key on a lease nobody renews: the check of a process
/// started again at once waits for that lease to run out and lets it start, however much of a
/// second etcd's answer of the remaining time rounded away. Each round puts the key on a fresh
/// lease and checks at once, when the rounding loses most of a second.
#[test]
fn a_name_whose_process_just_died_is_free_once_its_lease_runs_out() -> Result<()> {
    log();
    let etcd = EtcdServer::start();
    actix_rt::System::new().block_on(async move {
        let client = etcd.client();
        for round in 0..3 {
            let lease = client.lease_grant(TTL.as_secs() as i64).await?.id;
            // The check reads only the key's lease.
            client
                .put(
                    Keys::new("test").member("dead").as_bytes(),
                    b"{}",
                    Some(lease),
                )
                .await?;
            let started = Instant::now();
            check_member_name(&client, "test", "dead")
                .await
                .with_context(|| format!("round {round}: the dead member's name is refused"))?;
            eprintln!("round {round}: free after {:?}", started.elapsed());
        }
        Ok(())
    })
}
