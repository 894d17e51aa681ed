//! The failover actor: it carries out [`crate::machine`]'s decisions against etcd and the
//! node's supervisor. Its cycle: one lease (renewed every ttl/3), one watch on the cluster's
//! prefix, and a reconciliation after every change it sees, one at a time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::fut::LocalBoxActorFuture;
use actix::prelude::*;
use etcd_gateway::{Client, LeaseId, WatchBatch, WatchRequest};
use supervisor_actor::{Fence, GetNodeStatus, Node, NodeRole, NodeStatus};
use tokio::sync::oneshot;
use tracing::{info, warn};
use walreceiver_actor::ReceiverState;
use walsender_actor::status::WalSenderStatus;

use crate::config::FailoverConfig;
use crate::error::FailoverError;
use crate::keys::{KeyKind, Keys};
use crate::machine::{self, Action, Cluster, Local, LocalRole, Progress, SyncPhase};
use crate::messages::Leadership;
use crate::store;
use crate::view::MemberInfo;

/// Keeps one node's membership and leadership in etcd and tells its supervisor what to do.
pub struct FailoverActor {
    pub(crate) config: FailoverConfig,
    pub(crate) node: Node,
    pub(crate) fence: Fence,
    pub(crate) client: Client,
    pub(crate) keys: Keys,
    pub(crate) cluster: Cluster,
    pub(crate) progress: Progress,
    /// The node as its last status said.
    pub(crate) local: Option<Local>,
    /// The leader's walsenders as its last status said.
    pub(crate) replication: Vec<WalSenderStatus>,
    pub(crate) lease: Option<LeaseId>,
    /// The ttl the fence's deadline is computed with: the configured one, or etcd's if lower.
    pub(crate) lease_ttl: Duration,
    connecting: bool,
    reconciling: bool,
    dirty: bool,
    renew_failures: u32,
    follow_failures: u32,
    status_failures: u32,
    renew_timer: Option<SpawnHandle>,
    retry_timer: Option<SpawnHandle>,
    watch: Option<SpawnHandle>,
    pub(crate) sync_phase: SyncPhase,
    pub(crate) sync_busy: bool,
    /// Since when this leader holds appends for want of a synchronous standby of its own (set
    /// when it starts leading in a synchronous mode, cleared once it has one or, in `on`, has
    /// given up waiting and gone asynchronous).
    pub(crate) sync_hold_since: Option<Instant>,
    /// The sync standby management asked to renew (and look again) sooner than usual.
    pub(crate) sync_recheck: bool,
    /// A handover of the key runs: renewals do not grant the fence meanwhile.
    pub(crate) handing_over: bool,
    /// Who waits for a named member to take the leader key (switchover reports).
    pub(crate) awaiting_leader: Vec<(String, oneshot::Sender<u64>)>,
    stopping: bool,
    /// Why the key just won was campaigned for (the history's reason).
    won_reason: Option<&'static str>,
    pub(crate) leadership: tokio::sync::watch::Sender<Leadership>,
    pub(crate) slots: SlotState,
    /// The member slots this node holds, as last known.
    pub(crate) held_slots: tokio::sync::watch::Sender<Option<Vec<String>>>,
}

/// How soon a new leader looks again for a synchronous standby while it holds appends for
/// want of one (a guess: a standby connects and reports within a few milliseconds here).
pub(crate) const SYNC_RECHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// What the actor knows of member slots.
#[derive(Default)]
pub(crate) struct SlotState {
    /// Since when each member slot's member has had no key (by slot name).
    pub(crate) absent_since: HashMap<String, Instant>,
    /// A round of `manage_slots` runs; `again`: another after it.
    pub(crate) busy: bool,
    pub(crate) again: bool,
    /// The next look at a departed member's slot, when its grace ends.
    pub(crate) timer: Option<SpawnHandle>,
    /// The last round's slot operation failed: the next one comes after
    /// [`SLOT_RETRY`](crate::slots::SLOT_RETRY).
    pub(crate) failed: bool,
    /// Slot operations have been failing since the last success (logged once per run).
    pub(crate) failing: bool,
}

/// How long a failed start (lease, first read, watch) waits before the next attempt, and the
/// cap of its backoff. Guesses: quick enough that a node joins as soon as etcd is back.
const CONNECT_RETRY_MIN: Duration = Duration::from_millis(200);
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(2);
/// How long a failed promotion or follow waits before the next reconciliation tries again.
/// A guess: the supervisor refuses while another change runs, which takes well under this.
const ACTION_RETRY: Duration = Duration::from_millis(500);

impl FailoverActor {
    /// Starts the actor for `node`, whose fence must be [`supervisor_actor::Fence::closed`]
    /// (the node acknowledges nothing until this actor has won the leader key).
    pub fn start(config: FailoverConfig, node: Node) -> Result<Addr<FailoverActor>, FailoverError> {
        if !node.fence.is_managed() {
            return Err(FailoverError::Refused(
                "the node's fence is open: start it with Fence::closed() under failover".into(),
            ));
        }
        if config.ttl < Duration::from_secs(1) {
            return Err(FailoverError::Refused(
                "ttl must be at least 1 s (etcd's leases count whole seconds)".into(),
            ));
        }
        crate::slot_names::check_slot_name(&config).map_err(FailoverError::Refused)?;
        // A guess that leaves room for the whole exchange: etcd's calls must end well inside
        // one renewal interval, or a slow answer would eat the fence's margin.
        let timeout = machine::renewal_interval(config.ttl).max(Duration::from_millis(300));
        let client = config.etcd_client()?.with_request_timeout(timeout);
        let keys = Keys::new(&config.cluster_name);
        let fence = node.fence.clone();
        let lease_ttl = config.ttl;
        Ok(Actor::start(FailoverActor {
            config,
            node,
            fence,
            client,
            keys,
            cluster: Cluster::default(),
            progress: Progress::default(),
            local: None,
            replication: Vec::new(),
            lease: None,
            lease_ttl,
            connecting: false,
            reconciling: false,
            dirty: false,
            renew_failures: 0,
            follow_failures: 0,
            status_failures: 0,
            renew_timer: None,
            retry_timer: None,
            watch: None,
            sync_phase: SyncPhase::Steady,
            sync_busy: false,
            sync_hold_since: None,
            sync_recheck: false,
            handing_over: false,
            awaiting_leader: Vec::new(),
            stopping: false,
            won_reason: None,
            leadership: tokio::sync::watch::Sender::new(Leadership::default()),
            slots: SlotState::default(),
            held_slots: tokio::sync::watch::Sender::new(None),
        }))
    }

    pub(crate) fn me(&self) -> &str {
        &self.config.node_name
    }

    /// The node's status, read into `local`.
    fn take_status(&mut self, status: &NodeStatus) {
        let streaming = status
            .wal_receiver
            .as_ref()
            .and_then(|r| r.status.as_ref())
            .is_some_and(|s| s.status == ReceiverState::Streaming);
        self.local = Some(Local {
            role: match status.role {
                NodeRole::Primary => LocalRole::Primary,
                NodeRole::Standby => LocalRole::Standby,
            },
            timeline: status.timeline.0,
            flush: status.flush_lsn,
            streaming,
        });
        self.replication = status.replication.clone();
    }

    /// Bytes behind the last known leader, for a standby.
    pub(crate) fn lag_bytes(&self) -> Option<u64> {
        let local = self.local.as_ref()?;
        if local.role == LocalRole::Primary {
            return None;
        }
        let last = self.cluster.last_leader.as_ref()?;
        Some(last.flush.saturating_sub(local.flush))
    }

    pub(crate) fn member_info(&self) -> MemberInfo {
        let (role, timeline, flush, streaming) = match &self.local {
            Some(l) => (
                match l.role {
                    LocalRole::Primary => "primary",
                    LocalRole::Standby => "standby",
                },
                l.timeline,
                l.flush,
                l.streaming,
            ),
            None => ("standby", 0, wal_storage::Lsn(0), false),
        };
        MemberInfo {
            name: self.config.node_name.clone(),
            role: role.to_string(),
            timeline,
            flush_lsn: flush.to_string(),
            lag_bytes: self.lag_bytes(),
            streaming,
            conninfo: self.config.conninfo.clone(),
            api_url: self.config.api_url.clone(),
            nofailover: self.config.nofailover,
            priority: self.config.priority,
            term: self
                .progress
                .leading
                .or(self.progress.following.as_ref().map(|f| f.1)),
        }
    }

    /// Gets a lease, publishes the member key, reads the cluster and watches it from there.
    fn connect(&mut self, ctx: &mut Context<Self>) {
        if self.connecting || self.stopping {
            return;
        }
        self.connecting = true;
        if let Some(handle) = self.watch.take() {
            ctx.cancel_future(handle);
        }
        let supervisor = self.node.supervisor.clone();
        let status = async move { node_status(&supervisor).await };
        ctx.spawn(status.into_actor(self).then(|status, act, _| {
            if let Some(status) = &status {
                act.take_status(status);
            }
            let client = act.client.clone();
            let keys = act.keys.clone();
            let known = act.cluster.clone();
            let member = act.member_info();
            let ttl = i64::try_from(act.config.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
            let old = act.lease.take();
            async move {
                if let Some(old) = old {
                    // Best effort: a lease that renewals could not keep is gone or going.
                    let _ = client.lease_revoke(old).await;
                }
                let lease = client.lease_grant(ttl).await?;
                store::put_member(&client, &keys, lease.id, &member).await?;
                let (cluster, revision, _) = store::read_cluster(&client, &keys, &known).await?;
                let watch = client
                    .watch(&WatchRequest::new(etcd_gateway::KeyRange::prefix(keys.prefix())).from_revision(revision + 1))
                    .await?;
                Ok::<_, FailoverError>((lease, cluster, watch))
            }
            .into_actor(act)
            .map(|result, act, ctx| {
                act.connecting = false;
                match result {
                    Ok((lease, cluster, watch)) => {
                        info!(lease = %lease.id, granted_ttl = lease.ttl, "failover: joined the cluster");
                        act.lease = Some(lease.id);
                        let granted = Duration::from_secs(u64::try_from(lease.ttl).unwrap_or(0));
                        act.lease_ttl = act.config.ttl.min(granted.max(Duration::from_secs(1)));
                        let before = act.member_names();
                        act.cluster = cluster;
                        act.note_members(&before);
                        act.renew_failures = 0;
                        act.watch = Some(ctx.add_stream(watch));
                        act.schedule_renewal(ctx, machine::renewal_interval(act.lease_ttl));
                        act.reconcile(ctx);
                    }
                    Err(e) => {
                        act.renew_failures = act.renew_failures.saturating_add(1);
                        let delay = CONNECT_RETRY_MIN
                            .saturating_mul(act.renew_failures.min(10))
                            .min(CONNECT_RETRY_MAX);
                        warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "failover: cannot join the cluster in etcd");
                        ctx.run_later(delay, |act, ctx| act.connect(ctx));
                    }
                }
            })
        }));
    }

    fn schedule_renewal(&mut self, ctx: &mut Context<Self>, delay: Duration) {
        if let Some(handle) = self.renew_timer.take() {
            ctx.cancel_future(handle);
        }
        self.renew_timer = Some(ctx.run_later(delay, |act, ctx| {
            act.renew_timer = None;
            act.renew(ctx);
        }));
    }

    /// Renews the lease; the leader confirms its key in a transaction and only then extends
    /// the fence, from the instant the renewal was sent.
    pub(crate) fn renew(&mut self, ctx: &mut Context<Self>) {
        let Some(lease) = self.lease else {
            return;
        };
        if self.stopping {
            return;
        }
        let supervisor = self.node.supervisor.clone();
        let status = async move { node_status(&supervisor).await };
        ctx.spawn(status.into_actor(self).then(move |status, act, _| {
            if let Some(status) = &status {
                act.take_status(status);
            }
            let client = act.client.clone();
            let keys = act.keys.clone();
            let me = act.me().to_string();
            let member = act.member_info();
            let leading = act.progress.leading.filter(|_| !act.handing_over);
            async move {
                let sent_at = Instant::now();
                let renewed = client.lease_keepalive(lease).await?;
                let held = match leading {
                    Some(_) => Some(store::confirm(&client, &keys, &me, lease, &member).await?),
                    None => {
                        store::put_member(&client, &keys, lease, &member).await?;
                        None
                    }
                };
                Ok::<_, FailoverError>((sent_at, renewed.ttl, leading, held))
            }
            .into_actor(act)
            .map(move |result, act, ctx| act.renewed(ctx, lease, result))
        }));
    }

    fn renewed(
        &mut self,
        ctx: &mut Context<Self>,
        lease: LeaseId,
        result: Result<(Instant, i64, Option<u64>, Option<bool>), FailoverError>,
    ) {
        if self.lease != Some(lease) {
            return;
        }
        match result {
            Ok((sent_at, granted, leading, held)) => {
                self.renew_failures = 0;
                let granted = Duration::from_secs(u64::try_from(granted).unwrap_or(0));
                let ttl = self.config.ttl.min(granted.max(Duration::from_secs(1)));
                match (leading, held) {
                    (Some(term), Some(true))
                        if self.progress.leading == Some(term) && !self.handing_over =>
                    {
                        self.fence
                            .grant(term, machine::fence_deadline(sent_at, ttl));
                        self.publish_leadership();
                        self.manage_sync(ctx);
                    }
                    (Some(term), Some(false)) => {
                        warn!(
                            term,
                            "failover: the leader key is no longer ours; appends stop"
                        );
                        self.step_down();
                        self.reconcile(ctx);
                    }
                    _ => {}
                }
                let mut next = machine::renewal_interval(ttl).saturating_sub(sent_at.elapsed());
                if std::mem::take(&mut self.sync_recheck) {
                    next = next.min(SYNC_RECHECK);
                }
                self.schedule_renewal(ctx, next);
            }
            Err(FailoverError::Etcd(etcd_gateway::Error::LeaseNotFound { .. })) => {
                warn!(lease = %lease, "failover: our lease expired; appends stop and a new lease is taken");
                self.step_down();
                self.lease = None;
                self.connect(ctx);
            }
            Err(e) => {
                // The fence closes by its own deadline; retry quickly meanwhile.
                let delay = machine::retry_delay(self.renew_failures, self.lease_ttl);
                self.renew_failures = self.renew_failures.saturating_add(1);
                warn!(error = %e, failures = self.renew_failures, retry_in_ms = delay.as_millis() as u64, "failover: renewal failed");
                self.schedule_renewal(ctx, delay);
            }
        }
    }

    /// Not the leader any more: no acknowledgement from now on.
    pub(crate) fn step_down(&mut self) {
        self.fence.revoke();
        self.progress.leading = None;
        self.sync_phase = SyncPhase::Steady;
        self.sync_hold_since = None;
        self.publish_leadership();
    }

    /// Tells the subscribers what this node does now (only when it changed).
    pub(crate) fn publish_leadership(&self) {
        let leading = self
            .progress
            .leading
            .filter(|_| self.fence.may_acknowledge(Instant::now()));
        let now = Leadership {
            leading,
            following: self.progress.following.clone(),
        };
        self.leadership.send_if_modified(|l| {
            let changed = *l != now;
            *l = now;
            changed
        });
    }

    fn schedule_retry(&mut self, ctx: &mut Context<Self>, delay: Duration) {
        if self.retry_timer.is_some() {
            return;
        }
        self.retry_timer = Some(ctx.run_later(delay, |act, ctx| {
            act.retry_timer = None;
            act.reconcile(ctx);
        }));
    }

    /// Decides on what is known now and carries the decision out; one at a time (a change
    /// seen meanwhile runs another round after it).
    pub(crate) fn reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.stopping || self.lease.is_none() {
            return;
        }
        if self.reconciling {
            self.dirty = true;
            return;
        }
        self.reconciling = true;
        self.dirty = false;
        let supervisor = self.node.supervisor.clone();
        let status = async move { node_status(&supervisor).await };
        ctx.spawn(
            status
                .into_actor(self)
                .then(|status, act, ctx| {
                    match &status {
                        Some(status) => {
                            act.status_failures = 0;
                            act.take_status(status);
                        }
                        None => {
                            // Once per run of failures: the node may have been shut down.
                            if act.status_failures == 0 {
                                warn!("failover: the supervisor did not answer; deciding on its last status");
                            }
                            act.status_failures = act.status_failures.saturating_add(1);
                        }
                    }
                    act.run_decision(ctx)
                })
                .map(|_, act, ctx| {
                    act.reconciling = false;
                    if act.dirty {
                        act.reconcile(ctx);
                    }
                }),
        );
    }

    fn run_decision(&mut self, ctx: &mut Context<Self>) -> LocalBoxActorFuture<Self, ()> {
        let Some(local) = self.local.clone() else {
            return Box::pin(fut::ready(()));
        };
        self.progress.lease = self.lease.map(|l| l.0);
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
        // A leader looks at its member slots on every change it decides on.
        self.manage_slots(ctx);
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
        let Some(lease) = self.lease else {
            return Box::pin(fut::ready(()));
        };
        // Why this campaign, for the history, as things stand before it (once the key is won
        // the watch shows this node as the last leader and the handover as ended).
        let reason = if self.cluster.switchover.is_some() {
            "switchover"
        } else if !self.cluster.has_history {
            "bootstrap"
        } else if self
            .cluster
            .last_leader
            .as_ref()
            .is_some_and(|l| l.name == self.config.node_name)
        {
            "restart"
        } else {
            "failover"
        };
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
                        act.won_reason = Some(reason);
                        act.dirty = true;
                    }
                    // Someone else won: the watch brings its key.
                    Ok(None) => {}
                    Err(e) => {
                        warn!(error = %e, "failover: campaign failed");
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
                            info!(
                                better,
                                "failover: another member is more advanced; it campaigns"
                            );
                            // A real timeout: if it has not taken the key within a ttl, look again.
                            act.schedule_retry(ctx, act.lease_ttl);
                            Box::pin(fut::ready(()))
                        }
                    }
                }),
        )
    }

    fn lead(&mut self, term: u64, promote: bool) -> LocalBoxActorFuture<Self, ()> {
        let supervisor = self.node.supervisor.clone();
        let wal = self.node.wal.clone();
        let reason = self.won_reason.take().unwrap_or("failover").to_string();
        let slots = self.wanted_slots();
        Box::pin(
            async move {
                let taken = if promote {
                    let promoted = supervisor
                        .send(supervisor_actor::PromoteForTerm { term })
                        .await
                        .map_err(|e| FailoverError::Refused(e.to_string()))?
                        .map_err(|e| FailoverError::Refused(format!("promotion failed: {e}")))?;
                    (promoted.timeline.0, promoted.switch_lsn)
                } else {
                    let start = wal.history().last().map_or(wal_storage::Lsn(0), |h| h.switch_lsn);
                    (wal.timeline().0, start)
                };
                // The members' slots before the fence is granted: no append (and so no segment
                // switch, where retention removes WAL) comes before them.
                ensure_slots(&supervisor, slots).await;
                Ok::<_, FailoverError>(taken)
            }
            .into_actor(self)
            .then(move |promoted, act, ctx| {
                let (timeline, switch_lsn) = match promoted {
                    Ok(p) => p,
                    Err(e) => {
                        warn!(term, error = %e, "failover: cannot take up the leader key; giving it up");
                        return act.resign_after_failure(ctx);
                    }
                };
                info!(term, timeline, %switch_lsn, "failover: leading");
                act.progress.leading = Some(term);
                act.progress.highest_term = act.progress.highest_term.max(term);
                act.progress.following = None;
                act.publish_leadership();
                // Publishes the slots just made, and starts the graces of departed members'.
                act.manage_slots(ctx);
                act.sync_phase = SyncPhase::Steady;
                let synchronous = act.config.synchronous_mode != crate::SynchronousMode::Off;
                act.sync_hold_since = synchronous.then(Instant::now);
                let supervisor = act.node.supervisor.clone();
                let record = crate::view::TermRecord {
                    term,
                    leader: act.me().to_string(),
                    timeline,
                    switch_lsn: switch_lsn.to_string(),
                    reason,
                    at: store::unix_now(),
                };
                let client = act.client.clone();
                let keys = act.keys.clone();
                let me = act.me().to_string();
                let lease = act.lease;
                Box::pin(
                    async move {
                        let Some(lease) = lease else { return Ok(false) };
                        if synchronous {
                            // Before the fence is granted, in both synchronous modes: appends
                            // wait until this leader has a synchronous standby of its own
                            // (or, in `on`, has found none and published that), so that none
                            // is acknowledged asynchronously while an older term's record
                            // still names a standby that may lack it.
                            supervisor
                                .send(supervisor_actor::SetSyncStandbys { names: Some(machine::strict_hold()) })
                                .await
                                .map_err(|e| FailoverError::Refused(e.to_string()))?;
                        }
                        let history = store::leader_put(&client, &keys, &me, lease, keys.history_of(term), store::history_value(&record)).await?;
                        if synchronous {
                            // The term's own record, naming no standby yet: from now on no
                            // older record makes anyone promotable.
                            let sync = crate::keys::SyncRecord { leader: me.clone(), sync_standby: None, term };
                            if !store::leader_put(&client, &keys, &me, lease, keys.sync(), store::sync_value(&sync)).await? {
                                return Err(FailoverError::Refused("the leader key is not ours".into()));
                            }
                        }
                        Ok(history)
                    }
                    .into_actor(act)
                    .then(move |written, act, ctx| {
                        match written {
                            Ok(true) => act.cluster.has_history = true,
                            Ok(false) => {}
                            Err(e) => {
                                warn!(term, error = %e, "failover: cannot record the term; giving the leader key up");
                                return act.resign_after_failure(ctx);
                            }
                        }
                        // Confirm the key and grant the fence now, not a renewal interval later.
                        act.renew(ctx);
                        Box::pin(fut::ready(())) as LocalBoxActorFuture<Self, ()>
                    }),
                )
            }),
        )
    }

    fn resign_after_failure(&mut self, ctx: &mut Context<Self>) -> LocalBoxActorFuture<Self, ()> {
        self.step_down();
        let Some(lease) = self.lease else {
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
                        warn!(error = %e, "failover: cannot give up the leader key; it expires with the lease");
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
        let mut upstream = match walreceiver_actor::ReceiverConfig::parse(&conninfo, None) {
            Ok(upstream) => upstream,
            Err(e) => {
                warn!(%leader, error = %e, "failover: the leader's conninfo does not parse");
                return Box::pin(fut::ready(()));
            }
        };
        upstream.application_name = self.config.node_name.clone();
        if self.config.use_slots {
            // Its slot on the leader keeps the WAL this member has not received yet.
            upstream.session.slot_name = crate::slot_names::member_slot_name(self.me());
        }
        self.fence.observe_term(term);
        let supervisor = self.node.supervisor.clone();
        Box::pin(
            async move {
                supervisor
                    .send(supervisor_actor::FollowLeader { upstream, term })
                    .await
            }
            .into_actor(self)
            .map(move |result, act, ctx| match result {
                Ok(Ok(followed)) => {
                    info!(%leader, term, demoted = followed.demoted, dropped_bytes = followed.dropped_bytes, "failover: following the leader");
                    act.follow_failures = 0;
                    act.progress.following = Some((leader, term));
                    act.progress.highest_term = act.progress.highest_term.max(term);
                    act.publish_leadership();
                    act.drop_slots_as_follower(ctx);
                }
                Ok(Err(e)) => {
                    // Logged on the first failure and then every so often, not on each retry.
                    if act.follow_failures % 20 == 0 {
                        if matches!(e, supervisor_actor::FollowError::NoSlot { .. }) {
                            // A new leader makes its members' slots as it starts leading.
                            info!(%leader, term, error = %e, failures = act.follow_failures + 1, "failover: cannot follow the leader yet");
                        } else {
                            warn!(%leader, term, error = %e, failures = act.follow_failures + 1, "failover: cannot follow the leader yet");
                        }
                    }
                    act.follow_failures = act.follow_failures.wrapping_add(1);
                    act.schedule_retry(ctx, ACTION_RETRY);
                }
                Err(e) => warn!(error = %e, "failover: the supervisor is gone"),
            }),
        )
    }
}

impl Actor for FailoverActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The node acknowledges nothing until this actor leads.
        self.fence.revoke();
        self.connect(ctx);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.fence.revoke();
    }
}

impl StreamHandler<etcd_gateway::Result<WatchBatch>> for FailoverActor {
    fn handle(&mut self, item: etcd_gateway::Result<WatchBatch>, ctx: &mut Context<Self>) {
        match item {
            Ok(batch) => {
                // Only what a decision reads calls for one: the leader key, `sync`, `pause`,
                // `switchover`, the leader's member key, and any member key while there is no
                // leader (the candidates weigh each other). Members' routine refreshes do not.
                let mut relevant = false;
                let before = self.member_names();
                for event in &batch.events {
                    relevant |= match self.keys.classify(&event.kv.key) {
                        KeyKind::Leader | KeyKind::Sync | KeyKind::Pause | KeyKind::Switchover => {
                            true
                        }
                        KeyKind::Member(name) => self
                            .cluster
                            .leader
                            .as_ref()
                            .is_none_or(|l| l.holder == name),
                        KeyKind::History | KeyKind::Other => false,
                    };
                    store::apply_event(&mut self.cluster, &self.keys, event);
                }
                // A member that came or went changes the slots the leader holds.
                let members_changed = self.note_members(&before);
                relevant |= members_changed && self.progress.leading.is_some();
                if let Some(key) = &self.cluster.leader {
                    let holder = key.holder.clone();
                    let term = key.term;
                    let waiting = std::mem::take(&mut self.awaiting_leader);
                    for (name, tx) in waiting {
                        if name == holder {
                            let _ = tx.send(term);
                        } else if !tx.is_closed() {
                            self.awaiting_leader.push((name, tx));
                        }
                    }
                }
                if relevant {
                    self.reconcile(ctx);
                }
            }
            Err(e) => warn!(error = %e, "failover: the watch ended"),
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        // Read everything again and watch from there (the lease stays).
        self.watch = None;
        ctx.run_later(CONNECT_RETRY_MIN, |act, ctx| act.rewatch(ctx));
    }
}

impl FailoverActor {
    fn rewatch(&mut self, ctx: &mut Context<Self>) {
        if self.stopping || self.watch.is_some() || self.connecting {
            return;
        }
        let client = self.client.clone();
        let keys = self.keys.clone();
        let known = self.cluster.clone();
        ctx.spawn(
            async move {
                let (cluster, revision, _) = store::read_cluster(&client, &keys, &known).await?;
                let watch = client
                    .watch(
                        &WatchRequest::new(etcd_gateway::KeyRange::prefix(keys.prefix()))
                            .from_revision(revision + 1),
                    )
                    .await?;
                Ok::<_, FailoverError>((cluster, watch))
            }
            .into_actor(self)
            .map(|result, act, ctx| match result {
                Ok((cluster, watch)) => {
                    let before = act.member_names();
                    act.cluster = cluster;
                    act.note_members(&before);
                    act.watch = Some(ctx.add_stream(watch));
                    act.reconcile(ctx);
                }
                Err(e) => {
                    warn!(error = %e, "failover: cannot watch the cluster again yet");
                    ctx.run_later(CONNECT_RETRY_MAX, |act, ctx| act.rewatch(ctx));
                }
            }),
        );
    }

    /// Stops: the fence first, then the lease (so a successor need not wait the ttl).
    pub(crate) fn stop(&mut self, release: bool) -> LocalBoxActorFuture<Self, ()> {
        self.stopping = true;
        self.step_down();
        let client = self.client.clone();
        let lease = self.lease.take().filter(|_| release);
        Box::pin(
            async move {
                if let Some(lease) = lease {
                    if let Err(e) = client.lease_revoke(lease).await {
                        warn!(error = %e, "failover: cannot revoke the lease; it expires by its ttl");
                    }
                }
            }
            .into_actor(self)
            .map(|_, _, ctx: &mut Context<Self>| ctx.stop()),
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
            info!(made = ?slots.changed, held = ?slots.held, "failover: member slots before leading")
        }
        Ok(Err(e)) => warn!(error = %e, "failover: cannot make the member slots before leading"),
        Err(e) => warn!(error = %e, "failover: the supervisor is gone"),
    }
}

/// The node's status, or `None` if its supervisor is gone.
pub(crate) async fn node_status(
    supervisor: &Addr<supervisor_actor::Supervisor>,
) -> Option<NodeStatus> {
    supervisor.send(GetNodeStatus).await.ok()?.ok()
}
