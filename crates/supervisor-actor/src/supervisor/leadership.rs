//! The supervisor's side of automatic failover: the failover actor's messages
//! ([`crate::messages`]).
//!
//! Following a leader ([`FollowLeader`]) is one sequence for a primary and a standby: the
//! fence closes (a primary), the walreceiver stops (a standby: it must not write more of the
//! old upstream's WAL while the fork is checked), the leader says who it is, and if this node
//! holds WAL beyond the fork (or is demoted) every walsender session ends and new ones are
//! held while that WAL is dropped ([`crate::fork::cut_back_to_fork`], on a blocking thread);
//! then `standby.signal` names the leader, a primary's control data says standby (the
//! commit point of the demotion), and a walreceiver starts at once, with no backoff.
//!
//! The member slots ([`EnsureMemberSlots`], [`DropMemberSlots`]) and the permanent slots
//! ([`SyncPermanentSlots`]) are plain storage calls on a blocking thread (a slot's file is
//! written and synced): which slots, and when, is the failover actor's decision.

use actix::prelude::*;
use wal_storage::{CommitBound, Lsn, Role, Wal, WalError, WalFormat};
use walreceiver_actor::messages::StopReceiver;
use walreceiver_actor::{ReceiverConfig, UpstreamIdentity};
use walsender_actor::messages::{HoldWalSenders, ResumeWalSenders, SetSyncStandbyNames};

use super::{Receiver, Supervisor};
use crate::datadir::StandbySignal;
use crate::error::{FollowError, PromoteError};
use crate::fork::{cut_back_to_fork, fork_point, forks_below_commit_point, CutBack};
use crate::messages::{
    DropMemberSlots, EnsureMemberSlots, FollowLeader, Followed, MemberSlots, PermanentSlots,
    PromoteForTerm, Promoted, SetSyncStandbys, SyncPermanentSlots,
};
use crate::restart::RestartState;
use crate::status::NodeRole;

impl Handler<PromoteForTerm> for Supervisor {
    type Result = ResponseActFuture<Self, Result<Promoted, PromoteError>>;

    fn handle(&mut self, msg: PromoteForTerm, _: &mut Context<Self>) -> Self::Result {
        // The term is known from now, whatever the promotion's outcome; the fence stays closed
        // until the failover actor grants it, after the promotion.
        self.fence.observe_term(msg.term);
        let reason = format!("promoted by walserver failover for term {}", msg.term);
        // Rule 5 of the overlapped commit: a primary taking up a term does not resume a
        // timeline on which it sent early, since a synchronous standby may hold a tail of it
        // that this node lost in a crash. Under the overlapped commit one that did not takes
        // the term up on its timeline: it started told no commit point beyond the one it
        // stored (`NodeBuilder`), reading nothing new, and decides the commit point from now,
        // as a promotion would make it. With the switch off a primary is refused, as before.
        let overlap = self.shared.settings().session.commit_overlap;
        if let Some(wal) = self.wal.clone().filter(|_| self.role == NodeRole::Primary) {
            let timeline = wal.timeline();
            if walsender_actor::overlap::starts_new_timeline(wal.early_sends_marked(), timeline) {
                return self.start_new_timeline(reason);
            }
            if overlap {
                wal.forget_told_commit_point();
                self.update_visibility();
                let switch_lsn = wal.history().last().map_or(Lsn(0), |h| h.switch_lsn);
                tracing::info!(%timeline, term = msg.term, "taking up the term on this timeline: nothing was sent early on it");
                return Box::pin(actix::fut::ready(Ok(Promoted {
                    timeline,
                    switch_lsn,
                })));
            }
        }
        self.promote(reason)
    }
}

/// Whether a walreceiver of `a` and one of `b` stream the same way: `FollowLeader` and
/// `Reconfigure` reconnect only when they do not.
pub(super) fn same_upstream(a: &ReceiverConfig, b: &ReceiverConfig) -> bool {
    a.conninfo == b.conninfo
        && a.application_name == b.application_name
        && a.session == b.session
        && a.max_wal_in_flight == b.max_wal_in_flight
        && a.archive == b.archive
}

/// The conninfo `standby.signal` keeps for a restart that names none, password included
/// (the configuration that gave it holds it as well), in libpq's quoting.
fn signal_conninfo(config: &ReceiverConfig) -> String {
    let mut s = config.conninfo.to_string_without_password();
    if let Some(p) = &config.conninfo.password {
        let quoted = p.replace('\\', "\\\\").replace('\'', "\\'");
        s.push_str(&format!(" password='{quoted}'"));
    }
    s
}

/// What the second half of following yields: whether walsender sessions were held, and the
/// cut (`None`: nothing to do, the node already follows this leader on its history).
type FollowOutcome = (bool, Result<Option<CutBack>, FollowError>);

impl Handler<FollowLeader> for Supervisor {
    type Result = ResponseActFuture<Self, Result<Followed, FollowError>>;

    fn handle(&mut self, msg: FollowLeader, _: &mut Context<Self>) -> Self::Result {
        let refuse = |e| Box::pin(actix::fut::ready(Err(e))) as Self::Result;
        if self.shutting_down {
            return refuse(FollowError::ShuttingDown);
        }
        if self.promoting || self.following {
            return refuse(FollowError::InProgress);
        }
        let Some(wal) = self.wal.clone() else {
            return refuse(FollowError::ShuttingDown);
        };
        if wal.format() != WalFormat::Walserver {
            return refuse(FollowError::RelayedPostgresWal);
        }
        self.fence.observe_term(msg.term);
        let demoting = self.role == NodeRole::Primary;
        if demoting {
            // From here this node acknowledges nothing: another node leads.
            self.fence.revoke();
        }
        self.following = true;
        let upstream = msg.upstream.clone();
        tracing::info!(
            term = msg.term,
            demoting,
            leader = %upstream.conninfo.to_string_without_password(),
            "starting to follow the leader"
        );
        let identify = {
            let upstream = upstream.clone();
            async move {
                let slot = upstream.session.slot_name.as_deref();
                walreceiver_actor::fetch_upstream_identity(
                    &upstream.conninfo,
                    slot,
                    &upstream.application_name,
                )
                .await
                .map_err(|e| match slot {
                    // 42704, undefined object: READ_REPLICATION_SLOT found no such slot.
                    Some(slot) if e.sqlstate() == Some("42704") => FollowError::NoSlot {
                        slot: slot.to_string(),
                    },
                    _ => FollowError::Upstream(e.to_string()),
                })
            }
        };
        let synchronous = msg.synchronous;
        let work = identify.into_actor(self).then(move |identity, act, _| {
            act.follow_identified(identity, upstream, demoting, synchronous)
        });
        Box::pin(work.map(move |(held, res), act, ctx| {
            act.following = false;
            let result = res.map(|cut| match cut {
                Some(cut) => act.followed(msg.upstream, cut, demoting, ctx),
                None => Followed {
                    demoted: false,
                    fork: None,
                    dropped_bytes: 0,
                    timeline: wal.timeline(),
                },
            });
            if let Err(e) = &result {
                if matches!(e, FollowError::NoSlot { .. }) {
                    // Expected while a new leader makes its members' slots; tried again.
                    tracing::info!("could not follow the leader yet: {e}");
                } else if matches!(e, FollowError::BelowCommitPoint { .. }) {
                    // The alarm, as rule 4's at a stream start: the log, the refusal in
                    // storage's metrics (counted by `commit_follow`), and `/status` until the
                    // walreceiver streams again.
                    tracing::error!("{e}");
                    if let Some(r) = act.receiver.as_mut() {
                        r.tail_alarm = Some(e.to_string());
                    }
                } else {
                    tracing::warn!("could not follow the leader: {e}");
                }
                // A standby goes on with the upstream it had; a primary stays one, fenced.
                if let Some(r) = act.receiver.as_mut() {
                    r.wanted = true;
                }
                act.reconcile(ctx);
            }
            if held {
                act.registry.do_send(ResumeWalSenders);
            }
            result
        }))
    }
}

impl Supervisor {
    /// Following, once the leader has said who it is: stop the walreceiver, hold walsender
    /// sessions if WAL is dropped or the node demoted, and commit on a blocking thread.
    fn follow_identified(
        &mut self,
        identity: Result<UpstreamIdentity, FollowError>,
        upstream: ReceiverConfig,
        demoting: bool,
        synchronous: bool,
    ) -> std::pin::Pin<Box<dyn ActorFuture<Self, Output = FollowOutcome>>> {
        let done = |o: FollowOutcome| Box::pin(actix::fut::ready(o));
        let Some(wal) = self.wal.clone() else {
            return done((false, Err(FollowError::ShuttingDown)));
        };
        let identity = match identity.and_then(|i| fork_point(&wal, &i).map(|p| (i, p))) {
            Ok((i, point)) => {
                let same = self
                    .receiver
                    .as_ref()
                    .is_some_and(|r| r.wanted && same_upstream(&r.config, &upstream));
                if !demoting && same && !point.must_cut() {
                    // Already following this leader on its history; the walreceiver follows
                    // its timeline switches by itself.
                    return done((false, Ok(None)));
                }
                i
            }
            Err(e) => return done((false, Err(e))),
        };
        // Stopped before the cut: it must not write more of the old upstream's WAL.
        self.stop_receiver();
        let stopped = self.receiver_stopped();
        let registry = self.registry.clone();
        let data_dir = self.data_dir.clone();
        let work = async move {
            stopped.await;
            // Decided again now that nothing writes WAL here.
            let point = match fork_point(&wal, &identity) {
                Ok(p) => p,
                Err(e) => return (false, Err(e)),
            };
            // A walsender may have read (or be about to send) WAL beyond the fork, and a
            // cascading standby of a demoted primary must reconnect to see the new history.
            // Held whenever the leader's history forks from this node's timeline, not only
            // when the flushed end read here is past the fork: a write of the stopped
            // walreceiver may still be landing, and the cut (storage's decision) takes it.
            let hold = demoting || point.fork.is_some();
            if hold && registry.send(HoldWalSenders).await.is_err() {
                return (false, Err(FollowError::ShuttingDown));
            }
            let signal = StandbySignal {
                primary_conninfo: Some(signal_conninfo(&upstream)),
                primary_slot_name: upstream.session.slot_name.clone(),
                standby_since: None,
            };
            let cut = tokio::task::spawn_blocking(move || {
                commit_follow(&wal, &identity, &signal, &data_dir, demoting, synchronous)
            })
            .await
            .unwrap_or_else(|e| {
                Err(FollowError::Storage(WalError::Io {
                    context: "following the leader".into(),
                    cause: std::io::Error::other(e.to_string()),
                }))
            });
            (hold, cut.map(Some))
        };
        Box::pin(work.into_actor(self))
    }
}

/// The blocking part of following: the cut, then `standby.signal`, then (demoting) the
/// role in the control data, the commit point: a crash before it leaves a primary's
/// directory holding a signal, which the role rule of `datadir` makes a standby all the same.
/// A cut below the commit point this node was told is refused where the leader was chosen
/// to hold everything acknowledged (`forks_below_commit_point`); the refusal and a cut are
/// counted with rule 4's at a stream start (`commit` in `/status` and `/metrics`).
fn commit_follow(
    wal: &wal_storage::Wal,
    identity: &UpstreamIdentity,
    signal: &StandbySignal,
    data_dir: &std::path::Path,
    demoting: bool,
    synchronous: bool,
) -> Result<CutBack, FollowError> {
    let told = match wal.position().commit {
        CommitBound::Told(c) => Some(c),
        _ => None,
    };
    let fork = fork_point(wal, identity)?.fork;
    if let (true, Some(fork), Some(commit_point)) = (
        forks_below_commit_point(fork, told, synchronous),
        fork,
        told,
    ) {
        wal.metrics().count_tail_cut_refusal();
        return Err(FollowError::BelowCommitPoint { fork, commit_point });
    }
    let cut = cut_back_to_fork(wal, identity)?;
    if cut.dropped_bytes > 0 {
        wal.metrics().count_tail_cut(cut.dropped_bytes);
    }
    signal
        .write(data_dir)
        .map_err(|e| FollowError::StandbySignal(e.to_string()))?;
    if demoting {
        wal.set_role(Role::Standby)?;
    }
    Ok(cut)
}

impl Supervisor {
    /// The actor's side once following is committed: a standby of `upstream`, streaming at
    /// once.
    fn followed(
        &mut self,
        upstream: ReceiverConfig,
        cut: CutBack,
        demoted: bool,
        ctx: &mut Context<Self>,
    ) -> Followed {
        self.standby_signal = Some(StandbySignal::path(&self.data_dir));
        if demoted {
            self.role = NodeRole::Standby;
            self.receiver = Some(Receiver::new(upstream));
            self.update_visibility();
            self.publish_role();
        } else if let Some(r) = self.receiver.as_mut() {
            r.config = upstream;
            // A new upstream deserves a fresh start: no backoff carried over.
            r.restart = RestartState::default();
            if let Some(h) = r.retry.take() {
                ctx.cancel_future(h);
            }
            r.wanted = true;
            if let Some((_, addr)) = &r.current {
                // Its stop event starts the new one.
                addr.do_send(StopReceiver);
            }
        }
        self.reconcile(ctx);
        let timeline = self
            .wal
            .as_ref()
            .map_or(cut.point.timeline, |w| w.timeline());
        tracing::info!(
            demoted,
            fork = %cut.point.fork.map_or_else(|| "none".to_string(), |f| f.to_string()),
            dropped_bytes = cut.dropped_bytes,
            %timeline,
            "following the leader"
        );
        Followed {
            demoted,
            fork: cut.point.fork,
            dropped_bytes: cut.dropped_bytes,
            timeline,
        }
    }
}

impl Handler<SetSyncStandbys> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: SetSyncStandbys, _: &mut Context<Self>) {
        // The registry releases the waiting appends the new setting satisfies (all of them
        // when there are no synchronous standbys any more).
        self.registry
            .do_send(SetSyncStandbyNames(msg.names.clone()));
        self.sync.standby_names = msg.names;
        self.update_visibility();
    }
}

impl Handler<EnsureMemberSlots> for Supervisor {
    type Result = ResponseFuture<Result<MemberSlots, WalError>>;

    fn handle(&mut self, msg: EnsureMemberSlots, _: &mut Context<Self>) -> Self::Result {
        let wal = self.wal.clone();
        Box::pin(on_storage(wal, move |wal| {
            let held = wal.slots();
            let mut changed = Vec::new();
            for name in &msg.names {
                if held.iter().any(|s| s.name == *name) {
                    continue;
                }
                match wal.create_slot(name, false, true) {
                    Ok(_) => changed.push(name.clone()),
                    // Made meanwhile by someone else: it is there, which is what was asked.
                    Err(WalError::SlotExists { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(MemberSlots {
                changed,
                held: held_with_prefix(wal, &msg.prefix),
            })
        }))
    }
}

impl Handler<DropMemberSlots> for Supervisor {
    type Result = ResponseFuture<Result<MemberSlots, WalError>>;

    fn handle(&mut self, msg: DropMemberSlots, _: &mut Context<Self>) -> Self::Result {
        let wal = self.wal.clone();
        Box::pin(on_storage(wal, move |wal| {
            let mut changed = Vec::new();
            for name in &msg.names {
                match wal.drop_slot(name) {
                    Ok(()) => changed.push(name.clone()),
                    Err(WalError::SlotNotFound { .. }) => {}
                    Err(WalError::SlotInUse { .. }) => {
                        tracing::info!(slot = %name, "not dropping a replication slot in use; asked again later");
                    }
                    Err(e) => return Err(e),
                }
            }
            if !changed.is_empty() {
                // Release at once the WAL only those slots kept, not at the next segment.
                wal.run_retention()?;
            }
            Ok(MemberSlots {
                changed,
                held: held_with_prefix(wal, &msg.prefix),
            })
        }))
    }
}

impl Handler<SyncPermanentSlots> for Supervisor {
    type Result = ResponseFuture<Result<PermanentSlots, WalError>>;

    fn handle(&mut self, msg: SyncPermanentSlots, _: &mut Context<Self>) -> Self::Result {
        let wal = self.wal.clone();
        Box::pin(on_storage(wal, move |wal| {
            let mut done = PermanentSlots::default();
            let mut moved_any = false;
            for name in &msg.drop {
                match wal.drop_slot(name) {
                    Ok(()) => done.dropped.push(name.clone()),
                    Err(WalError::SlotNotFound { .. }) => {}
                    Err(WalError::SlotInUse { .. }) => {
                        tracing::info!(slot = %name, "not dropping a replication slot in use that is no longer permanent");
                    }
                    Err(e) => return Err(e),
                }
            }
            for (name, position) in &msg.slots {
                match wal.slot(name) {
                    Ok(slot) => {
                        let moved = position.filter(|p| msg.follow && slot.restart_lsn != Some(*p));
                        if let Some(p) = moved {
                            moved_any = true;
                            // The timeline is the one this node writes: the leader's position
                            // is on this node's history (it follows the leader).
                            match wal.advance_slot(name, p, wal.timeline()) {
                                Ok(()) | Err(WalError::SlotNotFound { .. }) => {}
                                // An invalidated copy is made again at the leader's position.
                                Err(WalError::SlotInvalidated { .. }) => {
                                    wal.drop_slot(name)?;
                                    wal.create_slot_at(name, false, Some(p))?;
                                }
                                Err(e) => return Err(e),
                            }
                        }
                    }
                    Err(WalError::SlotNotFound { .. }) => {
                        let at = match position {
                            Some(p) => Some(*p),
                            None if !msg.follow => Some(wal.flushed()),
                            None => None,
                        };
                        match wal.create_slot_at(name, false, at) {
                            Ok(_) => done.made.push(name.clone()),
                            // Made meanwhile by a client: it is there, which is what was asked.
                            Err(WalError::SlotExists { .. }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            if !done.dropped.is_empty() || moved_any {
                // Release at once the WAL only those slots (or a copy's older position) kept.
                wal.run_retention()?;
            }
            let wanted: std::collections::BTreeSet<&str> =
                msg.slots.iter().map(|(n, _)| n.as_str()).collect();
            done.held = wal
                .slots()
                .into_iter()
                .filter(|s| wanted.contains(s.name.as_str()))
                .map(|s| (s.name, s.restart_lsn))
                .collect();
            Ok(done)
        }))
    }
}

/// Runs `f` with the node's storage on a blocking thread (slot files are written and synced).
async fn on_storage<T: Send + 'static>(
    wal: Option<Wal>,
    f: impl FnOnce(&Wal) -> Result<T, WalError> + Send + 'static,
) -> Result<T, WalError> {
    let wal = wal.ok_or(WalError::Closed)?;
    tokio::task::spawn_blocking(move || f(&wal))
        .await
        .unwrap_or_else(|e| {
            Err(WalError::Io {
                context: "managing replication slots".into(),
                cause: std::io::Error::other(e.to_string()),
            })
        })
}

/// The names of the slots starting with `prefix`, sorted.
fn held_with_prefix(wal: &Wal, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = wal
        .slots()
        .into_iter()
        .map(|s| s.name)
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort_unstable();
    names
}
