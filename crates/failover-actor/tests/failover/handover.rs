//! Handovers of the leader key: a switchover with zero loss, one refused, a forced failover.

use crate::harness::*;

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
