//! Election and fencing: bootstrap, a dead or cut-off leader replaced, pause and resume, an
//! old leader that comes back and follows.

use crate::harness::*;

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
        // Every lease was last renewed before the kill: a ttl later no member is one any
        // more, and each says so, with the reason.
        for m in [&a, &b, &c] {
            let health = m.actor.send(GetLocalHealth).await?;
            let reason = health.not_member.unwrap_or_default();
            assert!(
                reason.starts_with("the lease in etcd has not been renewed for "),
                "{}: {reason}",
                m.name
            );
            let status = m.actor.send(GetFailoverStatus).await?;
            assert_eq!(status.state, MembershipState::NotJoined, "{}", m.name);
            assert_eq!(status.reason.as_deref(), Some(reason.as_str()));
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
