//! Member slots: the WAL a member behind or down needs stays on the leader.

use crate::harness::*;

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
