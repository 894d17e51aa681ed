//! The reconciliation: after every change the actor sees, one round decides on what is known
//! ([`machine::decide`]) and carries the decision out (campaign, lead, follow), one round at a
//! time; a change seen meanwhile runs another round after it.
//!
//! Each action is one future that does its work (a campaign, a promotion, a follow) against
//! etcd and the supervisor and returns to the actor once, where its outcome is applied.

use std::time::{Duration, Instant};

use actix::fut::LocalBoxActorFuture;
use actix::prelude::*;
use tracing::{info, warn};

use crate::actor::{node_status, FailoverActor};
use crate::error::FailoverError;
use crate::machine::{self, Action, Local, SyncPhase};
use crate::outage::Quoted;
use crate::store;
use crate::view::{MemberInfo, TermRecord};

/// How long a failed promotion or follow waits before the next reconciliation tries again.
/// A guess: the supervisor refuses while another change runs, which takes well under this.
const ACTION_RETRY: Duration = Duration::from_millis(500);

/// What taking up a term did, before the actor leads in it.
struct TermTaken {
    timeline: u32,
    switch_lsn: wal_storage::Lsn,
    /// `history/<term>` was written (the guard found the key ours).
    recorded: bool,
    /// Why the term was taken, as its history record says.
    reason: String,
}

impl FailoverActor {
    pub(crate) fn schedule_retry(&mut self, ctx: &mut Context<Self>, delay: Duration) {
        if self.decisions.retry_timer.is_some() {
            return;
        }
        self.decisions.retry_timer = Some(ctx.run_later(delay, |act, ctx| {
            act.decisions.retry_timer = None;
            act.reconcile(ctx);
        }));
    }

    /// Decides on what is known now and carries the decision out; one round at a time (a
    /// change seen meanwhile runs another round after it).
    pub(crate) fn reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.stopping || self.lease.id.is_none() {
            return;
        }
        if !self.decisions.round.ask() {
            return;
        }
        let supervisor = self.node.supervisor.clone();
        let status = async move { node_status(&supervisor).await };
        ctx.spawn(
            status
                .into_actor(self)
                .then(|status, act, ctx| {
                    match &status {
                        Some(status) => {
                            act.decisions.status_failures = 0;
                            act.take_status(status);
                        }
                        None => {
                            // Once per run of failures: the node may have been shut down.
                            if act.decisions.status_failures == 0 {
                                warn!("failover: the supervisor did not answer; deciding on its last status");
                            }
                            act.decisions.status_failures =
                                act.decisions.status_failures.saturating_add(1);
                        }
                    }
                    act.run_decision(ctx)
                })
                .map(|_, act, ctx| {
                    if act.decisions.round.finish() {
                        act.reconcile(ctx);
                    }
                }),
        );
    }

    fn run_decision(&mut self, ctx: &mut Context<Self>) -> LocalBoxActorFuture<Self, ()> {
        let Some(local) = self.local.clone() else {
            return Box::pin(fut::ready(()));
        };
        self.progress.lease = self.lease.id.map(|l| l.0);
        if let Some(key) = &self.cluster.leader {
            if key.holder != self.me() {
                self.progress.highest_term = self.progress.highest_term.max(key.term);
            }
        }
        self.start_forwarded_handover(ctx);
        let actions = machine::decide(&self.config, &self.cluster, &local, &self.progress);
        let mut next = None;
        for action in actions {
            match action {
                Action::RevokeFence => {
                    info!("failover: the leader key is not ours; appends stop");
                    self.step_down();
                }
                Action::Wait(reason) => tracing::debug!(reason, "failover: waiting"),
                other => next = Some(other),
            }
        }
        // A leader looks at its member slots on every change it decides on; every member at
        // the permanent slots (a standby's copies too: this round may be its first).
        self.manage_slots(ctx);
        self.sync_permanent_slots(ctx);
        match next {
            Some(Action::Campaign) => self.campaign(),
            Some(Action::CheckPeers) => self.check_peers(local),
            Some(Action::Lead { term, promote }) => self.lead(term, promote),
            Some(Action::Follow {
                leader,
                conninfo,
                term,
            }) => self.follow(leader, conninfo, term),
            _ => Box::pin(fut::ready(())),
        }
    }

    fn campaign(&mut self) -> LocalBoxActorFuture<Self, ()> {
        let Some(lease) = self.lease.id else {
            return Box::pin(fut::ready(()));
        };
        let reason = machine::campaign_reason(&self.cluster, self.me());
        let client = self.client.clone();
        let keys = self.keys.clone();
        let me = self.me().to_string();
        Box::pin(
            async move { store::campaign(&client, &keys, &me, lease).await }
                .into_actor(self)
                .map(move |result, act, ctx| match result {
                    Ok(Some(term)) => {
                        info!(term, "failover: won the leader key");
                        act.cluster.leader = Some(machine::LeaderKey {
                            holder: act.me().to_string(),
                            term,
                            lease: lease.0,
                        });
                        act.cluster.switchover = None;
                        act.decisions.won_reason = Some(reason);
                        // The next round sees the key won and takes the term up.
                        act.decisions.round.ask_again();
                    }
                    // Someone else won: the watch brings its key.
                    Ok(None) => {}
                    Err(e) => {
                        warn!(error = %Quoted(&e), "failover: campaign failed");
                        act.schedule_retry(ctx, ACTION_RETRY);
                    }
                }),
        )
    }

    fn check_peers(&mut self, local: Local) -> LocalBoxActorFuture<Self, ()> {
        let me = self.me().to_string();
        let members: Vec<MemberInfo> = self.cluster.members.values().cloned().collect();
        let mine = machine::PeerPosition {
            name: me.clone(),
            role: local.role,
            timeline: local.timeline,
            flush: local.flush,
            priority: self.config.priority,
            nofailover: self.config.nofailover,
        };
        Box::pin(
            async move { crate::peers::positions(&me, members).await }
                .into_actor(self)
                .then(move |peers, act, ctx| {
                    if act.cluster.leader.is_some() {
                        return Box::pin(fut::ready(())) as LocalBoxActorFuture<Self, ()>;
                    }
                    match machine::better_peer(&mine, &peers) {
                        None => act.campaign(),
                        Some(better) => {
                            let ahead = peers.iter().find(|p| p.name == better).is_some_and(|p| {
                                (p.timeline, p.flush) > (mine.timeline, mine.flush)
                            });
                            if ahead {
                                info!(better, "failover: another member is more advanced; it campaigns");
                            } else {
                                info!(better, "failover: another member is as advanced and preferred (role, priority or name); it campaigns");
                            }
                            // A real timeout: if it has not taken the key within a ttl, look again.
                            act.schedule_retry(ctx, act.lease.ttl);
                            Box::pin(fut::ready(()))
                        }
                    }
                }),
        )
    }

    /// Takes up the leader key won for `term`, in one future: promote the node if it is a
    /// standby or runs the overlapped commit (else read where its timeline starts), make the
    /// members' slots, hold appends in a synchronous mode, and record the term in the history
    /// (and, in a synchronous mode, the term's own `sync`, naming no standby yet). The actor
    /// returns to its state once, when all of it is done.
    ///
    /// The commit point is that return: only then does the actor lead in `term`, so no
    /// renewal before it grants the fence, and every append waits until the slots, the hold
    /// and the records are in place. A failure before it gives the key up. After it, a
    /// renewal is sent at once, and its confirmation grants the fence.
    fn lead(&mut self, term: u64, promote: bool) -> LocalBoxActorFuture<Self, ()> {
        let Some(lease) = self.lease.id else {
            return Box::pin(fut::ready(()));
        };
        let supervisor = self.node.supervisor.clone();
        let wal = self.node.wal.clone();
        let reason = self
            .decisions
            .won_reason
            .take()
            .unwrap_or("failover")
            .to_string();
        let slots = self.wanted_slots();
        let permanent = self.permanent_request(false);
        let synchronous = self.config.synchronous_mode != crate::SynchronousMode::Off;
        // Under the overlapped commit a primary taking up a term asks the supervisor too: it
        // starts a new timeline when it may have sent WAL early on the one it is on (rule 5),
        // and else takes the term up on its timeline, deciding the commit point from now.
        let overlap = self.node.shared.settings().session.commit_overlap;
        let promote = promote || overlap;
        let client = self.client.clone();
        let keys = self.keys.clone();
        let me = self.me().to_string();
        let work = async move {
            let (timeline, switch_lsn) = if promote {
                let promoted = supervisor
                    .send(supervisor_actor::PromoteForTerm { term })
                    .await
                    .map_err(|e| FailoverError::Refused(e.to_string()))?
                    .map_err(|e| FailoverError::Refused(format!("promotion failed: {e}")))?;
                (promoted.timeline.0, promoted.switch_lsn)
            } else {
                // Storage's in-memory state, read through the node's handle (see the crate's
                // story for why this is not a message to the supervisor).
                let start = wal
                    .history()
                    .last()
                    .map_or(wal_storage::Lsn(0), |h| h.switch_lsn);
                (wal.timeline().0, start)
            };
            // The members' slots before the fence is granted: no append (and so no segment
            // switch, where retention removes WAL) comes before them.
            ensure_slots(&supervisor, slots).await;
            // The permanent slots too, at the positions etcd holds where this node has no
            // copy yet: the client of one resumes here as soon as appends go on.
            ensure_permanent_slots(&supervisor, permanent).await;
            if synchronous {
                // Before the fence is granted, in both synchronous modes: appends wait until
                // this leader has a synchronous standby of its own (or, in `on`, has found
                // none and published that), so that none is acknowledged asynchronously
                // while an older term's record still names a standby that may lack it.
                supervisor
                    .send(supervisor_actor::SetSyncStandbys {
                        names: Some(machine::strict_hold()),
                    })
                    .await
                    .map_err(|e| FailoverError::Refused(e.to_string()))?;
            }
            let record = TermRecord {
                term,
                leader: me.clone(),
                timeline,
                switch_lsn: switch_lsn.to_string(),
                reason: reason.clone(),
                at: store::unix_now(),
            };
            let history = store::history_value(&record);
            let recorded =
                store::leader_put(&client, &keys, &me, lease, keys.history_of(term), history)
                    .await?;
            if synchronous {
                // The term's own record, naming no standby yet: from now on no older record
                // makes anyone promotable.
                let sync = crate::keys::SyncRecord {
                    leader: me.clone(),
                    sync_standby: None,
                    term,
                };
                let value = store::sync_value(&sync);
                if !store::leader_put(&client, &keys, &me, lease, keys.sync(), value).await? {
                    return Err(FailoverError::Refused("the leader key is not ours".into()));
                }
            }
            Ok::<_, FailoverError>(TermTaken {
                timeline,
                switch_lsn,
                recorded,
                reason,
            })
        };
        Box::pin(work.into_actor(self).then(move |taken, act, ctx| match taken {
            Ok(taken) => {
                act.take_up(ctx, term, taken);
                Box::pin(fut::ready(())) as LocalBoxActorFuture<Self, ()>
            }
            Err(e) => {
                warn!(term, error = %Quoted(&e), "failover: cannot take up the leader key; giving it up");
                act.resign_after_failure(ctx)
            }
        }))
    }

    /// [`FailoverActor::lead`]'s return: the actor leads in `term` from here.
    fn take_up(&mut self, ctx: &mut Context<Self>, term: u64, taken: TermTaken) {
        info!(term, timeline = taken.timeline, switch_lsn = %taken.switch_lsn, "failover: leading");
        *self
            .decisions
            .terms_taken
            .entry(taken.reason.clone())
            .or_default() += 1;
        self.progress.leading = Some(term);
        self.progress.highest_term = self.progress.highest_term.max(term);
        self.progress.following = None;
        if taken.recorded {
            self.cluster.has_history = true;
        }
        self.sync.phase = SyncPhase::Steady;
        let synchronous = self.config.synchronous_mode != crate::SynchronousMode::Off;
        self.sync.hold_since = synchronous.then(Instant::now);
        self.publish_leadership();
        // Publishes the slots just made, and starts the graces of departed members'; writes
        // the permanent slots' positions as this leader holds them.
        self.manage_slots(ctx);
        self.sync_permanent_slots(ctx);
        // Confirm the key and grant the fence now, not a renewal interval later.
        self.renew(ctx);
    }

    fn resign_after_failure(&mut self, ctx: &mut Context<Self>) -> LocalBoxActorFuture<Self, ()> {
        self.step_down();
        let Some(lease) = self.lease.id else {
            return Box::pin(fut::ready(()));
        };
        self.schedule_retry(ctx, ACTION_RETRY);
        let client = self.client.clone();
        let keys = self.keys.clone();
        let me = self.me().to_string();
        Box::pin(
            async move { store::resign(&client, &keys, &me, lease).await }
                .into_actor(self)
                .map(|result, _, _| {
                    if let Err(e) = result {
                        warn!(error = %Quoted(&e), "failover: cannot give up the leader key; it expires with the lease");
                    }
                }),
        )
    }

    fn follow(
        &mut self,
        leader: String,
        conninfo: String,
        term: u64,
    ) -> LocalBoxActorFuture<Self, ()> {
        // Its slot on the leader keeps the WAL this member has not received yet.
        let slot = if self.config.use_slots {
            crate::slot_names::member_slot_name(self.me())
        } else {
            None
        };
        let upstream = match self.config.follow_config(&conninfo, slot) {
            Ok(upstream) => upstream,
            Err(e) => {
                warn!(%leader, error = %Quoted(&e), "failover: the leader's conninfo does not parse");
                return Box::pin(fut::ready(()));
            }
        };
        self.fence.observe_term(term);
        let supervisor = self.node.supervisor.clone();
        // In a synchronous mode the leader holds everything acknowledged, so a fork below
        // the commit point this member was told is refused rather than cut.
        let synchronous = self.config.synchronous_mode != crate::SynchronousMode::Off;
        Box::pin(
            async move {
                supervisor
                    .send(supervisor_actor::FollowLeader {
                        upstream,
                        term,
                        synchronous,
                    })
                    .await
            }
            .into_actor(self)
            .map(move |result, act, ctx| match result {
                Ok(Ok(followed)) => {
                    info!(%leader, term, demoted = followed.demoted, dropped_bytes = followed.dropped_bytes, "failover: following the leader");
                    act.decisions.follow_failures = 0;
                    act.progress.following = Some((leader, term));
                    act.progress.highest_term = act.progress.highest_term.max(term);
                    act.publish_leadership();
                    act.drop_slots_as_follower(ctx);
                    act.sync_permanent_slots(ctx);
                }
                Ok(Err(e)) => {
                    let failures = act.decisions.follow_failures;
                    // Logged on the first failure and then every so often, not on each retry.
                    if failures % 20 == 0 {
                        if matches!(e, supervisor_actor::FollowError::NoSlot { .. }) {
                            // A new leader makes its members' slots as it starts leading.
                            info!(%leader, term, error = %Quoted(&e), failures = failures + 1, "failover: cannot follow the leader yet");
                        } else {
                            warn!(%leader, term, error = %Quoted(&e), failures = failures + 1, "failover: cannot follow the leader yet");
                        }
                    }
                    act.decisions.follow_failures = failures.wrapping_add(1);
                    act.schedule_retry(ctx, ACTION_RETRY);
                }
                Err(e) => warn!(error = %Quoted(&e), "failover: the supervisor is gone"),
            }),
        )
    }
}

/// Makes the member slots `names` on the node (nothing if there are none); a failure is
/// logged, and the leader's next reconciliation tries again: leading goes on without them.
async fn ensure_slots(supervisor: &Addr<supervisor_actor::Supervisor>, names: Vec<String>) {
    if names.is_empty() {
        return;
    }
    let asked = supervisor_actor::EnsureMemberSlots {
        names,
        prefix: crate::slot_names::MEMBER_SLOT_PREFIX.to_string(),
    };
    match supervisor.send(asked).await {
        Ok(Ok(slots)) => {
            info!(made = %slots.changed.join(","), held = %slots.held.join(","), "failover: member slots before leading")
        }
        Ok(Err(e)) => {
            warn!(error = %Quoted(&e), "failover: cannot make the member slots before leading")
        }
        Err(e) => warn!(error = %Quoted(&e), "failover: the supervisor is gone"),
    }
}

/// Makes the permanent slots this node lacks before it leads; a failure is logged, and the
/// leader's next slot round tries again.
async fn ensure_permanent_slots(
    supervisor: &Addr<supervisor_actor::Supervisor>,
    request: supervisor_actor::SyncPermanentSlots,
) {
    if request.slots.is_empty() {
        return;
    }
    match supervisor.send(request).await {
        Ok(Ok(done)) => {
            let held: Vec<String> = done
                .held
                .iter()
                .map(|(name, at)| match at {
                    Some(at) => format!("{name}@{at}"),
                    None => name.clone(),
                })
                .collect();
            info!(made = %done.made.join(","), held = %held.join(","), "failover: permanent slots before leading");
        }
        Ok(Err(e)) => {
            warn!(error = %Quoted(&e), "failover: cannot make the permanent slots before leading")
        }
        Err(e) => warn!(error = %Quoted(&e), "failover: the supervisor is gone"),
    }
}
