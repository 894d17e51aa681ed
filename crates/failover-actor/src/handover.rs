//! The handover of the leader key: a switchover with zero loss, or a forced failover.
//!
//! A handover asked of any member goes through etcd: the asking member writes `switchover`
//! (`from` the current leader, on the leader's lease, only while that leader holds the key),
//! the leader sees it on its watch and hands over. The leader itself hands over at once: its
//! appends stop, the candidate catches up (unless forced), and the leader key is deleted in a
//! transaction guarded by its value and lease, with `switchover` naming the candidate, so
//! that only the candidate campaigns.

use std::time::{Duration, Instant};

use actix::prelude::*;
use etcd_gateway::LeaseId;
use tokio::sync::oneshot;
use tracing::{info, warn};
use wal_storage::Lsn;

use crate::actor::FailoverActor;
use crate::admin::Reply;
use crate::error::FailoverError;
use crate::keys::SwitchoverRecord;
use crate::machine;
use crate::messages::{Failover, Switchover, SwitchoverReport};
use crate::outage::Quoted;
use crate::store;

/// How long a switchover waits for its candidate to have everything the leader flushed. A
/// guess: a streaming standby on a LAN is milliseconds behind; one that needs longer should
/// be caught up before it is switched to.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the old leader waits for its candidate to take the key (see it deleted, campaign,
/// promote) before it cancels the handover. A guess: a promotion takes well under a second.
const NEW_LEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The bounded re-reads of the leader's replication status while a candidate catches up: the
/// registry has no per-standby event (its synchronous wait would change the node's
/// synchronous setting), so this waits with a short backoff, bounded in count and time.
const CATCH_UP_CHECK_MIN: Duration = Duration::from_millis(5);
const CATCH_UP_CHECK_MAX: Duration = Duration::from_millis(100);
const CATCH_UP_CHECKS: u32 = 1000;

impl Handler<Switchover> for FailoverActor {
    type Result = Reply<SwitchoverReport>;

    fn handle(&mut self, msg: Switchover, _: &mut Context<Self>) -> Self::Result {
        self.handover_request(msg.candidate, false)
    }
}

impl Handler<Failover> for FailoverActor {
    type Result = Reply<SwitchoverReport>;

    fn handle(&mut self, msg: Failover, _: &mut Context<Self>) -> Self::Result {
        self.handover_request(Some(msg.candidate), true)
    }
}

fn refused<T: 'static>(e: FailoverError) -> Reply<T> {
    Box::pin(fut::ready(Err(e)))
}

impl FailoverActor {
    fn handover_request(
        &mut self,
        candidate: Option<String>,
        force: bool,
    ) -> Reply<SwitchoverReport> {
        if self.cluster.paused {
            return refused(FailoverError::Paused);
        }
        let Some(leader) = self.cluster.leader.clone() else {
            return refused(FailoverError::NoLeader);
        };
        let candidate = match candidate {
            Some(c) => c,
            None => match machine::switchover_candidate(&self.cluster.members, &leader.holder) {
                Some(c) => c,
                None => return refused(FailoverError::Refused("no standby can take over".into())),
            },
        };
        if candidate == leader.holder {
            return refused(FailoverError::NotEligible(
                candidate,
                "it is the leader".into(),
            ));
        }
        match self.cluster.members.get(&candidate) {
            None => return refused(FailoverError::NoSuchMember(candidate)),
            Some(m) if m.nofailover || m.priority == 0 => {
                return refused(FailoverError::NotEligible(
                    candidate,
                    "nofailover or priority 0".into(),
                ))
            }
            Some(_) => {}
        }
        if self.progress.leading == Some(leader.term) && leader.holder == self.me() {
            return self.hand_over(candidate, force);
        }
        self.forward(leader, candidate, force)
    }

    /// A member waits for `name` to take the leader key.
    fn await_leader(&mut self, name: &str) -> oneshot::Receiver<u64> {
        let (tx, rx) = oneshot::channel();
        self.handover.awaiting_leader.push((name.to_string(), tx));
        rx
    }

    /// Tells whoever waits for the member that now holds the leader key (called after each
    /// watched change); those waiting for another member, and still listening, wait on.
    pub(crate) fn answer_awaiting_leader(&mut self) {
        let Some(key) = &self.cluster.leader else {
            return;
        };
        let (holder, term) = (key.holder.clone(), key.term);
        let waiting = std::mem::take(&mut self.handover.awaiting_leader);
        for (name, tx) in waiting {
            if name == holder {
                let _ = tx.send(term);
            } else if !tx.is_closed() {
                self.handover.awaiting_leader.push((name, tx));
            }
        }
    }

    /// Asks the leader, through etcd, to hand over to `candidate`, and waits for it to lead.
    fn forward(
        &mut self,
        leader: machine::LeaderKey,
        candidate: String,
        force: bool,
    ) -> Reply<SwitchoverReport> {
        let started = Instant::now();
        let lag = self.member_lag(&leader.holder, &candidate);
        let client = self.client.clone();
        let keys = self.keys.clone();
        let record = SwitchoverRecord {
            from: leader.holder.clone(),
            to: candidate.clone(),
            force,
        };
        let rx = self.await_leader(&candidate);
        Box::pin(
            async move {
                if !store::request_switchover(&client, &keys, &record, LeaseId(leader.lease))
                    .await?
                {
                    return Err(FailoverError::Refused(
                        "the leader changed, or another switchover runs".into(),
                    ));
                }
                let term = wait_new_leader(rx, CATCH_UP_TIMEOUT + NEW_LEADER_TIMEOUT).await?;
                Ok(SwitchoverReport {
                    old_leader: Some(record.from),
                    new_leader: record.to,
                    term,
                    // Measured here, from the request to the new key: an upper bound.
                    appends_paused_ms: millis(started.elapsed()),
                    candidate_lag_bytes: if force { lag } else { None },
                })
            }
            .into_actor(self),
        )
    }

    /// How far `candidate` is behind `leader` by their member keys.
    fn member_lag(&self, leader: &str, candidate: &str) -> Option<u64> {
        let flush =
            |name: &str| -> Option<Lsn> { self.cluster.members.get(name)?.flush_lsn.parse().ok() };
        Some(flush(leader)?.saturating_sub(flush(candidate)?))
    }

    /// A switchover asked of another member reached us, the leader, through `switchover`.
    pub(crate) fn start_forwarded_handover(&mut self, ctx: &mut Context<Self>) {
        let Some(record) = self.cluster.switchover.clone() else {
            return;
        };
        if self.handover.running || record.from != self.me() || self.progress.leading.is_none() {
            return;
        }
        info!(to = %record.to, force = record.force, "failover: handing over, as asked through etcd");
        let handover = self.hand_over(record.to, record.force);
        // The handover logs its own outcome.
        ctx.spawn(handover.map(|_, _, _| ()));
    }

    /// The leader hands its key to `to`: appends stop, `to` catches up (unless forced), the
    /// key is deleted with `switchover` naming `to`, and `to` takes it.
    ///
    /// The catch-up, the request and the deletion are one future, and the actor returns to
    /// its state once, when it ends. The commit point is the deletion, a transaction guarded
    /// by the key's value and lease: after it this node no longer leads, and steps down and
    /// reconciles (to follow `to` once it leads); before it a failure leaves the key ours,
    /// and a renewal at once confirms it and grants the fence again. The reply waits for `to`
    /// to take the key beyond that, and cancels the handover if it does not; the actor's
    /// state plays no part in that wait.
    fn hand_over(&mut self, to: String, force: bool) -> Reply<SwitchoverReport> {
        let (Some(term), Some(lease)) = (self.progress.leading, self.lease.id) else {
            return refused(FailoverError::Refused("this node does not lead".into()));
        };
        if self.handover.running {
            return refused(FailoverError::Refused("a handover already runs".into()));
        }
        self.handover.running = true;
        let started = Instant::now();
        // Appends are refused from here; everything acknowledged is at or below this. Read
        // from the node's storage handle in this same handler, after the revocation and with
        // no wait between (see the crate's story for why this is not a message).
        self.fence.revoke();
        self.publish_leadership();
        let target = self.node.wal.flushed();
        info!(%to, force, %target, term, "failover: appends stopped for a handover");
        let supervisor = self.node.supervisor.clone();
        let client = self.client.clone();
        let keys = self.keys.clone();
        let me = self.me().to_string();
        let record = SwitchoverRecord {
            from: me.clone(),
            to: to.clone(),
            force,
        };
        let already = self.cluster.switchover.as_ref() == Some(&record);
        let request = record.clone();
        let rx = self.await_leader(&to);
        // What the candidate published at its last renewal, for when the leader has no
        // walsender for it at this moment (it is reconnecting, as after it began to stream
        // through its member slot): an upper bound of its lag all the same.
        let published: Option<Lsn> = self
            .cluster
            .members
            .get(&to)
            .and_then(|m| m.flush_lsn.parse().ok());
        let work = {
            let client = client.clone();
            let keys = keys.clone();
            async move {
                let candidate_flush = if force {
                    candidate_flush(&supervisor, &to).await.or(published)
                } else {
                    Some(wait_caught_up(&supervisor, &to, target).await?)
                };
                if !already && !store::request_switchover(&client, &keys, &request, lease).await? {
                    return Err(FailoverError::Refused("another switchover runs".into()));
                }
                if !store::resign(&client, &keys, &me, lease).await? {
                    return Err(FailoverError::Refused(
                        "the leader key is no longer ours".into(),
                    ));
                }
                Ok(candidate_flush)
            }
        };
        let record_to = record.to.clone();
        let reply = move |resigned: Result<Option<Lsn>, FailoverError>| async move {
            let outcome = match resigned {
                Ok(candidate_flush) => match wait_new_leader(rx, NEW_LEADER_TIMEOUT).await {
                    Ok(new_term) => Ok(SwitchoverReport {
                        old_leader: Some(record.from),
                        new_leader: record.to,
                        term: new_term,
                        appends_paused_ms: millis(started.elapsed()),
                        candidate_lag_bytes: candidate_flush
                            .filter(|_| force)
                            .map(|f| target.saturating_sub(f)),
                    }),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match &outcome {
                Ok(report) => info!(
                    to = %report.new_leader,
                    term = report.term,
                    appends_paused_ms = report.appends_paused_ms,
                    "failover: handed over the leader key"
                ),
                Err(e) => {
                    warn!(to = %record_to, error = %Quoted(&e), "failover: the handover did not happen");
                    // The handover did not happen or did not finish: let the cluster elect
                    // as usual (the key is ours still, or the candidate did not take it).
                    let _ = store::cancel_switchover(&client, &keys).await;
                }
            }
            outcome
        };
        Box::pin(
            work.into_actor(self)
                .map(|resigned, act, ctx| {
                    act.handover.running = false;
                    match &resigned {
                        Ok(_) => {
                            act.step_down();
                            act.reconcile(ctx);
                        }
                        // Still the leader if the key is ours: the renewal says so and grants.
                        Err(_) => act.renew(ctx),
                    }
                    resigned
                })
                .then(move |resigned, _, _| fut::wrap_future(reply(resigned))),
        )
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn wait_new_leader(
    rx: oneshot::Receiver<u64>,
    timeout: Duration,
) -> Result<u64, FailoverError> {
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(term)) => Ok(term),
        Ok(Err(_)) => Err(FailoverError::NotRunning),
        Err(_) => Err(FailoverError::Refused(format!(
            "the candidate did not take the leader key within {} ms",
            timeout.as_millis()
        ))),
    }
}

/// The candidate's flush position as the leader's walsender last heard it.
async fn candidate_flush(
    supervisor: &Addr<supervisor_actor::Supervisor>,
    candidate: &str,
) -> Option<Lsn> {
    let status = crate::actor::node_status(supervisor).await?;
    status
        .replication
        .iter()
        .filter(|r| r.application_name == candidate)
        .filter_map(|r| r.flush_lsn)
        .max()
}

/// Waits until the candidate has flushed `target`, bounded in time and count.
async fn wait_caught_up(
    supervisor: &Addr<supervisor_actor::Supervisor>,
    candidate: &str,
    target: Lsn,
) -> Result<Lsn, FailoverError> {
    let deadline = tokio::time::Instant::now() + CATCH_UP_TIMEOUT;
    let mut delay = CATCH_UP_CHECK_MIN;
    for _ in 0..CATCH_UP_CHECKS {
        if let Some(flush) = candidate_flush(supervisor, candidate).await {
            if flush >= target {
                return Ok(flush);
            }
        }
        if tokio::time::Instant::now() + delay > deadline {
            break;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(CATCH_UP_CHECK_MAX);
    }
    Err(FailoverError::Refused(format!(
        "{candidate} did not reach {target} within {} ms",
        CATCH_UP_TIMEOUT.as_millis()
    )))
}
