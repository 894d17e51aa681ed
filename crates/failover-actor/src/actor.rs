//! The failover actor: it carries out [`crate::machine`]'s decisions against etcd and the
//! node's supervisor. Its cycle: one lease (renewed every ttl/3), one watch on the cluster's
//! prefix, and a reconciliation after every change it sees, one at a time.
//!
//! This file holds the actor's state, its start and stop, the lease and the watch; the
//! reconciliation is `reconcile.rs`, the synchronous standby `sync.rs`, the member slots
//! `slots.rs`, the admin messages `admin.rs` and the handovers `handover.rs`.

use std::time::{Duration, Instant, SystemTime};

use actix::fut::LocalBoxActorFuture;
use actix::prelude::*;
use etcd_gateway::{Client, LeaseId, WatchBatch, WatchRequest};
use supervisor_actor::{Fence, GetNodeStatus, Node, NodeRole, NodeState, NodeStatus};
use tokio::sync::oneshot;
use tracing::{debug, info, warn};
use wal_types::time::format_time;
use walsender_actor::status::WalSenderStatus;

use crate::config::FailoverConfig;
use crate::error::FailoverError;
use crate::keys::Keys;
use crate::machine::{self, Cluster, Local, LocalRole, Progress, Renewed, SlotAbsences, SyncPhase};
use crate::membership::Membership;
use crate::messages::Leadership;
use crate::outage::{Outage, OutageLog, Quoted};
use crate::permanent::PermanentState;
use crate::round::Rounds;
use crate::store;
use crate::view::{Departures, MemberInfo};

/// Keeps one node's membership and leadership in etcd and tells its supervisor what to do.
pub struct FailoverActor {
    pub(crate) config: FailoverConfig,
    pub(crate) node: Node,
    pub(crate) fence: Fence,
    pub(crate) client: Client,
    pub(crate) keys: Keys,
    /// The cluster as last read or watched.
    pub(crate) cluster: Cluster,
    /// What this actor has done: the machine's record of its own leading and following.
    pub(crate) progress: Progress,
    /// The node as its last status said.
    pub(crate) local: Option<Local>,
    /// The leader's walsenders as its last status said.
    pub(crate) replication: Vec<WalSenderStatus>,
    pub(crate) lease: LeaseState,
    pub(crate) decisions: DecisionState,
    pub(crate) sync: SyncState,
    pub(crate) slots: SlotState,
    pub(crate) permanent: PermanentState,
    pub(crate) handover: HandoverState,
    /// `StopFailover` came, or the member name was lost: nothing starts any more.
    pub(crate) stopping: bool,
    pub(crate) leadership: tokio::sync::watch::Sender<Leadership>,
    /// Whether this node is a member of the cluster now, and since when.
    pub(crate) membership: Membership,
    /// The members seen to go (`GET /cluster`'s `departed`).
    pub(crate) departures: Departures,
    /// The node's role and streaming as its supervisor publishes them at each change.
    pub(crate) node_state: tokio::sync::watch::Receiver<NodeState>,
    /// The publication of this member's key after a change of the node: one at a time.
    publishing: Rounds,
}

/// The node's lease in etcd, its renewals, and the watch started with it.
pub(crate) struct LeaseState {
    pub(crate) id: Option<LeaseId>,
    /// The ttl the fence's deadline is computed with: the configured one, or etcd's if lower.
    pub(crate) ttl: Duration,
    /// A join (lease, member key, first read, watch) runs.
    connecting: bool,
    /// Failed renewals (or joins) in a row, for the backoff.
    failures: u32,
    /// When etcd last answered a renewal or delivered a watch batch (`/metrics`).
    pub(crate) last_contact: Option<Instant>,
    /// When the last renewal (or grant) that succeeded was sent: the lease lives a ttl from
    /// there at most.
    pub(crate) renewed: Option<Instant>,
    /// Why the last join or renewal failed, until one succeeds.
    pub(crate) last_error: Option<String>,
    /// The runs of failed joins, renewals and watches, each logged at a bounded rate.
    join_outage: Outage,
    renew_outage: Outage,
    watch_outage: Outage,
    renew_timer: Option<SpawnHandle>,
    watch: Option<SpawnHandle>,
}

/// The reconciliation: one round at a time, and what the rounds carry between them.
#[derive(Default)]
pub(crate) struct DecisionState {
    pub(crate) round: Rounds,
    /// The next round after a failed action, when it is due.
    pub(crate) retry_timer: Option<SpawnHandle>,
    /// Why the key just won was campaigned for (the history's reason).
    pub(crate) won_reason: Option<&'static str>,
    /// Failed follows and unanswered status requests in a row, to log once per run of them.
    pub(crate) follow_failures: u32,
    pub(crate) status_failures: u32,
    /// Terms this node took up, by their history's reason (`/metrics`).
    pub(crate) terms_taken: std::collections::BTreeMap<String, u64>,
}

/// The leader's synchronous standby (`synchronous_mode` on or strict).
#[derive(Default)]
pub(crate) struct SyncState {
    pub(crate) phase: SyncPhase,
    pub(crate) round: Rounds,
    /// Since when this leader holds appends for want of a synchronous standby of its own (set
    /// when it starts leading in a synchronous mode, cleared once it has one or, in `on`, has
    /// given up waiting and gone asynchronous).
    pub(crate) hold_since: Option<Instant>,
    /// The last round asked to renew (and look again) sooner than usual.
    pub(crate) recheck_soon: bool,
}

/// The handover of the leader key, and who waits for a member to take it.
#[derive(Default)]
pub(crate) struct HandoverState {
    /// A handover of the key runs: renewals do not grant the fence meanwhile.
    pub(crate) running: bool,
    /// Who waits for a named member to take the leader key (switchover reports).
    pub(crate) awaiting_leader: Vec<(String, oneshot::Sender<u64>)>,
}

/// What the actor knows of member slots.
pub(crate) struct SlotState {
    /// Since when each member slot's member has had no key.
    pub(crate) absences: SlotAbsences,
    /// The leader's rounds of `manage_slots` (`slots.rs`).
    pub(crate) round: Rounds,
    /// The next look at a departed member's slot, when its grace ends.
    pub(crate) timer: Option<SpawnHandle>,
    /// The last round's slot operation failed: the next one comes after `SLOT_RETRY`.
    pub(crate) failed: bool,
    /// Slot operations have been failing since the last success (logged once per run).
    pub(crate) failing: bool,
    /// The member slots this node holds, as last known (what `SubscribeMemberSlots` watches).
    pub(crate) held: tokio::sync::watch::Sender<Option<Vec<String>>>,
}

impl Default for SlotState {
    fn default() -> SlotState {
        SlotState {
            absences: SlotAbsences::default(),
            round: Rounds::default(),
            timer: None,
            failed: false,
            failing: false,
            held: tokio::sync::watch::Sender::new(None),
        }
    }
}

/// What a renewal found.
pub(crate) struct RenewalAnswer {
    /// When the keepalive was sent: the lease was renewed no earlier.
    sent_at: Instant,
    /// The ttl etcd granted, in its whole seconds.
    granted_ttl: i64,
    /// The term a leader's transaction checked and whether the key held; `None` for a
    /// follower's renewal, which checks nothing.
    confirmed: Option<(u64, bool)>,
    /// The member key it wrote, as the node's status said before the keepalive.
    member: MemberInfo,
}

/// How soon a new leader looks again for a synchronous standby while it holds appends for
/// want of one (a guess: a standby connects and reports within a few milliseconds here).
pub(crate) const SYNC_RECHECK: Duration = Duration::from_millis(50);

/// How long a failed start (lease, first read, watch) waits before the next attempt, and the
/// cap of its backoff. Guesses: quick enough that a node joins as soon as etcd is back.
const CONNECT_RETRY_MIN: Duration = Duration::from_millis(200);
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(2);

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
        let lease = LeaseState {
            id: None,
            ttl: config.ttl,
            connecting: false,
            failures: 0,
            last_contact: None,
            renewed: None,
            last_error: None,
            join_outage: Outage::default(),
            renew_outage: Outage::default(),
            watch_outage: Outage::default(),
            renew_timer: None,
            watch: None,
        };
        let node_state = node.state();
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
            lease,
            decisions: DecisionState::default(),
            sync: SyncState::default(),
            slots: SlotState::default(),
            permanent: PermanentState::default(),
            handover: HandoverState::default(),
            stopping: false,
            leadership: tokio::sync::watch::Sender::new(Leadership::default()),
            membership: Membership::new(SystemTime::now()),
            departures: Departures::default(),
            node_state,
            publishing: Rounds::default(),
        }))
    }

    pub(crate) fn me(&self) -> &str {
        &self.config.node_name
    }

    /// The node's status, read into `local`. Whether it streams is the supervisor's own
    /// word (`Node::state`), which a stopped walreceiver's last status row may contradict.
    pub(crate) fn take_status(&mut self, status: &NodeStatus) {
        let streaming = self.node_state.borrow().streaming
            && status.role == NodeRole::Standby
            && status.wal_receiver.is_some();
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
        if self.lease.connecting || self.stopping {
            return;
        }
        self.lease.connecting = true;
        if let Some(handle) = self.lease.watch.take() {
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
            let old = act.lease.id.take();
            async move {
                if let Some(old) = old {
                    // Best effort: a lease that renewals could not keep is gone or going.
                    let _ = client.lease_revoke(old).await;
                }
                let asked = Instant::now();
                let lease = client.lease_grant(ttl).await?;
                store::put_member(&client, &keys, lease.id, &member).await?;
                let (cluster, revision, _) = store::read_cluster(&client, &keys, &known).await?;
                let watch = client
                    .watch(&WatchRequest::new(etcd_gateway::KeyRange::prefix(keys.prefix())).from_revision(revision + 1))
                    .await?;
                Ok::<_, FailoverError>((lease, cluster, watch, asked))
            }
            .into_actor(act)
            .map(|result, act, ctx| {
                act.lease.connecting = false;
                match result {
                    Ok((lease, cluster, watch, asked)) => {
                        match act.lease.join_outage.ended() {
                            Some(run) => info!(
                                lease = %lease.id,
                                granted_ttl = lease.ttl,
                                "failover: joined the cluster, after {} failed attempts since {}",
                                run.failures,
                                format_time(run.since)
                            ),
                            None => info!(lease = %lease.id, granted_ttl = lease.ttl, "failover: joined the cluster"),
                        }
                        act.membership.joined(SystemTime::now());
                        act.lease.renewed = Some(asked);
                        act.lease.last_error = None;
                        act.lease.id = Some(lease.id);
                        act.lease.ttl = machine::effective_ttl(act.config.ttl, lease.ttl);
                        act.replace_cluster(cluster);
                        act.lease.failures = 0;
                        act.lease.watch = Some(ctx.add_stream(watch));
                        act.schedule_renewal(ctx, machine::renewal_interval(act.lease.ttl));
                        act.reconcile(ctx);
                    }
                    Err(e @ FailoverError::NameHeld { .. }) => act.displaced(ctx, &e),
                    Err(e) => {
                        act.lease.failures = act.lease.failures.saturating_add(1);
                        let delay = CONNECT_RETRY_MIN
                            .saturating_mul(act.lease.failures.min(10))
                            .min(CONNECT_RETRY_MAX);
                        act.join_failed(&e);
                        ctx.run_later(delay, |act, ctx| act.connect(ctx));
                    }
                }
            })
        }));
    }

    /// A join failed: this node is not a member, and says so once, then at a bounded rate.
    fn join_failed(&mut self, e: &FailoverError) {
        let wall = SystemTime::now();
        self.lease.last_error = Some(e.to_string());
        self.membership
            .not_joined(format!("cannot join the cluster in etcd: {e}"), wall);
        match self.lease.join_outage.failed(Instant::now(), wall) {
            OutageLog::First => warn!(
                error = %Quoted(e),
                "failover: not a member of the cluster: cannot join it in etcd; retrying"
            ),
            OutageLog::Summary { failures, since } => warn!(
                error = %Quoted(e),
                "failover: still not a member of the cluster: {failures} failed attempts to join since {}",
                format_time(since)
            ),
            OutageLog::Quiet => {
                debug!(error = %Quoted(e), "failover: cannot join the cluster in etcd")
            }
        }
    }

    /// The cluster as a fresh read found it, with the absences of members' slots updated.
    fn replace_cluster(&mut self, cluster: Cluster) {
        let before = self.member_names();
        let members_before = self.cluster.members.clone();
        let was_paused = self.cluster.paused;
        let permanent_before = self.cluster.permanent_slots.clone();
        self.cluster = cluster;
        self.departures.note(
            &members_before,
            &self.cluster.members,
            Instant::now(),
            SystemTime::now(),
        );
        self.note_members(&before);
        // The reconciliation that follows every fresh read runs the slot round.
        self.note_permanent(&permanent_before);
        self.note_pause(was_paused);
        // A new leader may show in a fresh read rather than in the watch.
        self.answer_awaiting_leader();
    }

    /// Says once, on every member, that the cluster was paused or resumed (the `pause` key
    /// came or went): while paused nothing is promoted or followed anew.
    pub(crate) fn note_pause(&self, was_paused: bool) {
        match (was_paused, self.cluster.paused) {
            (false, true) => {
                info!("failover: the cluster is paused; no automatic failover until it is resumed")
            }
            (true, false) => {
                info!("failover: the cluster is resumed; automatic failover is on again")
            }
            _ => {}
        }
    }

    fn schedule_renewal(&mut self, ctx: &mut Context<Self>, delay: Duration) {
        if let Some(handle) = self.lease.renew_timer.take() {
            ctx.cancel_future(handle);
        }
        self.lease.renew_timer = Some(ctx.run_later(delay, |act, ctx| {
            act.lease.renew_timer = None;
            act.renew(ctx);
        }));
    }

    /// Renews the lease; the leader confirms its key in a transaction and only then extends
    /// the fence, from the instant the renewal was sent.
    pub(crate) fn renew(&mut self, ctx: &mut Context<Self>) {
        let Some(lease) = self.lease.id else {
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
            let leading = act.progress.leading.filter(|_| !act.handover.running);
            async move {
                let sent_at = Instant::now();
                let renewed = client.lease_keepalive(lease).await?;
                let confirmed = match leading {
                    Some(term) => Some((
                        term,
                        store::confirm(&client, &keys, &me, lease, &member).await?,
                    )),
                    None => {
                        store::put_member(&client, &keys, lease, &member).await?;
                        None
                    }
                };
                Ok::<_, FailoverError>(RenewalAnswer {
                    sent_at,
                    granted_ttl: renewed.ttl,
                    confirmed,
                    member,
                })
            }
            .into_actor(act)
            .map(move |result, act, ctx| act.renewed(ctx, lease, result))
        }));
    }

    fn renewed(
        &mut self,
        ctx: &mut Context<Self>,
        lease: LeaseId,
        result: Result<RenewalAnswer, FailoverError>,
    ) {
        if self.lease.id != Some(lease) {
            return;
        }
        match result {
            Ok(RenewalAnswer {
                sent_at,
                granted_ttl,
                confirmed,
                member,
            }) => {
                // The node changed while the renewal was under way, and a publication of the
                // change may have landed before the renewal's older key: publish again.
                let now = *self.node_state.borrow();
                let role = match now.role {
                    NodeRole::Primary => "primary",
                    NodeRole::Standby => "standby",
                };
                if member.streaming != now.streaming || member.role != role {
                    self.publish_member(ctx);
                }
                self.lease.failures = 0;
                self.lease.last_contact = Some(Instant::now());
                self.lease.renewed = Some(sent_at);
                self.lease.last_error = None;
                if let Some(run) = self.lease.renew_outage.ended() {
                    info!(
                        "failover: renewed the lease again, after {} failed renewals since {}",
                        run.failures,
                        format_time(run.since)
                    );
                }
                if self.membership.joined(SystemTime::now()) {
                    info!("failover: a member of the cluster again");
                }
                let ttl = machine::effective_ttl(self.config.ttl, granted_ttl);
                match machine::after_renewal(
                    confirmed,
                    self.progress.leading,
                    self.handover.running,
                    sent_at,
                    ttl,
                ) {
                    Renewed::Grant { term, until } => {
                        self.fence.grant(term, until);
                        self.publish_leadership();
                        self.manage_sync(ctx);
                    }
                    Renewed::StepDown { term } => {
                        warn!(
                            term,
                            "failover: the leader key is no longer ours; appends stop"
                        );
                        self.step_down();
                        self.reconcile(ctx);
                    }
                    Renewed::Nothing => {}
                }
                let sooner = std::mem::take(&mut self.sync.recheck_soon).then_some(SYNC_RECHECK);
                let next = machine::next_renewal(ttl, sent_at.elapsed(), sooner);
                self.schedule_renewal(ctx, next);
            }
            Err(FailoverError::Etcd(etcd_gateway::Error::LeaseNotFound { .. })) => {
                warn!(lease = %lease, "failover: our lease expired; not a member until a new lease is taken, and appends stop");
                self.membership.not_joined(
                    "the lease in etcd expired; joining again".into(),
                    SystemTime::now(),
                );
                self.lease.renew_outage.ended();
                self.step_down();
                self.lease.id = None;
                self.connect(ctx);
            }
            Err(e @ FailoverError::NameHeld { .. }) => self.displaced(ctx, &e),
            Err(e) => {
                // The fence closes by its own deadline; retry quickly meanwhile.
                let delay = machine::retry_delay(self.lease.failures, self.lease.ttl);
                self.lease.failures = self.lease.failures.saturating_add(1);
                self.renewal_failed(&e);
                self.schedule_renewal(ctx, delay);
            }
        }
    }

    /// A renewal failed: logged once, then at a bounded rate; once the lease has had its ttl
    /// without a renewal, this node is no longer a member, and says so once.
    fn renewal_failed(&mut self, e: &FailoverError) {
        let now = Instant::now();
        let wall = SystemTime::now();
        self.lease.last_error = Some(e.to_string());
        match self.lease.renew_outage.failed(now, wall) {
            OutageLog::First => warn!(error = %Quoted(e), "failover: renewal failed; retrying"),
            OutageLog::Summary { failures, since } => warn!(
                error = %Quoted(e),
                "failover: still cannot renew the lease: {failures} failed renewals since {}",
                format_time(since)
            ),
            OutageLog::Quiet => debug!(error = %Quoted(e), "failover: renewal failed"),
        }
        if let Some(reason) = self.membership.not_member(
            self.lease.renewed,
            self.lease.ttl,
            now,
            self.lease.last_error.as_deref(),
        ) {
            let was_member = self
                .membership
                .not_member(None, self.lease.ttl, now, None)
                .is_none();
            self.membership.not_joined(reason.clone(), wall);
            if was_member {
                warn!(reason = %Quoted(&reason), "failover: no longer a member of the cluster");
            }
        }
    }

    /// Another process holds this node's member name (`error` says which): two processes
    /// of one name would each be taken for the other, so this one stops acknowledging, gives
    /// up its lease (and the leader key with it, if it held it) and leaves failover. The
    /// actor stays, to say so (`/status`, `/replica`, `/primary`) until the node stops.
    fn displaced(&mut self, ctx: &mut Context<Self>, error: &FailoverError) {
        tracing::error!(
            "failover: {error}; this node stops acknowledging and leaves automatic failover"
        );
        self.membership.left(
            format!("left automatic failover: {error}"),
            SystemTime::now(),
        );
        self.step_down();
        if let Some(lease) = self.lease.id.take() {
            let client = self.client.clone();
            actix::spawn(async move {
                // Best effort: the lease runs out by itself otherwise.
                let _ = client.lease_revoke(lease).await;
            });
        }
        self.stopping = true;
        for handle in [self.lease.renew_timer.take(), self.lease.watch.take()]
            .into_iter()
            .flatten()
        {
            ctx.cancel_future(handle);
        }
    }

    /// Not the leader any more: no acknowledgement from now on.
    pub(crate) fn step_down(&mut self) {
        self.fence.revoke();
        self.progress.leading = None;
        self.sync.phase = SyncPhase::Steady;
        self.sync.hold_since = None;
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
}

impl Actor for FailoverActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The node acknowledges nothing until this actor leads.
        self.fence.revoke();
        // Each change of the node's role or streaming, as it happens.
        let changes = futures_util::stream::unfold(self.node_state.clone(), |mut rx| async move {
            rx.changed().await.ok()?;
            let now = *rx.borrow_and_update();
            Some((NodeChanged(now), rx))
        });
        ctx.add_stream(changes);
        self.watch_slot_moves(ctx);
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
                self.lease.last_contact = Some(Instant::now());
                if self.lease.watch_outage.ended().is_some() {
                    info!("failover: watching the cluster again");
                }
                let mut relevant = false;
                let before = self.member_names();
                let members_before = self.cluster.members.clone();
                let was_paused = self.cluster.paused;
                let permanent_before = self.cluster.permanent_slots.clone();
                for event in &batch.events {
                    let kind = self.keys.classify(&event.kv.key);
                    relevant |= machine::calls_for_decision(&kind, &self.cluster);
                    store::apply_event(&mut self.cluster, &self.keys, event);
                }
                self.departures.note(
                    &members_before,
                    &self.cluster.members,
                    Instant::now(),
                    SystemTime::now(),
                );
                // A member that came or went changes the slots the leader holds.
                let members_changed = self.note_members(&before);
                self.note_pause(was_paused);
                relevant |= members_changed && self.progress.leading.is_some();
                self.answer_awaiting_leader();
                if self.note_permanent(&permanent_before) {
                    self.sync_permanent_slots(ctx);
                }
                if relevant {
                    self.reconcile(ctx);
                }
            }
            Err(e) => self.watch_failed("the watch ended", &e),
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        // Read everything again and watch from there (the lease stays).
        self.lease.watch = None;
        ctx.run_later(CONNECT_RETRY_MIN, |act, ctx| act.rewatch(ctx));
    }
}

impl FailoverActor {
    fn rewatch(&mut self, ctx: &mut Context<Self>) {
        if self.stopping || self.lease.watch.is_some() || self.lease.connecting {
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
                    act.replace_cluster(cluster);
                    act.lease.watch = Some(ctx.add_stream(watch));
                    act.reconcile(ctx);
                }
                Err(e) => {
                    act.watch_failed("cannot watch the cluster again yet", &e);
                    ctx.run_later(CONNECT_RETRY_MAX, |act, ctx| act.rewatch(ctx));
                }
            }),
        );
    }

    /// The watch failed (`what`): logged once, then at a bounded rate.
    fn watch_failed(&mut self, what: &str, e: &dyn std::fmt::Display) {
        match self
            .lease
            .watch_outage
            .failed(Instant::now(), SystemTime::now())
        {
            OutageLog::First => warn!(error = %Quoted(e), "failover: {what}"),
            OutageLog::Summary { failures, since } => warn!(
                error = %Quoted(e),
                "failover: {what}: {failures} failures since {}",
                format_time(since)
            ),
            OutageLog::Quiet => debug!(error = %Quoted(e), "failover: {what}"),
        }
    }

    /// Publishes this member's key after a change of the node (its role, its streaming), at
    /// once rather than at the next renewal: the other members' views and candidates read
    /// it. One publication at a time; a change meanwhile publishes again after it.
    fn publish_member(&mut self, ctx: &mut Context<Self>) {
        if self.stopping || self.lease.id.is_none() || !self.publishing.ask() {
            return;
        }
        let supervisor = self.node.supervisor.clone();
        let status = async move { node_status(&supervisor).await };
        ctx.spawn(
            status
                .into_actor(self)
                .then(|status, act, _| {
                    if let Some(status) = &status {
                        act.take_status(status);
                    }
                    let client = act.client.clone();
                    let keys = act.keys.clone();
                    let lease = act.lease.id;
                    let member = act.member_info();
                    async move {
                        match lease {
                            Some(lease) => store::put_member(&client, &keys, lease, &member).await,
                            None => Ok(()),
                        }
                    }
                    .into_actor(act)
                })
                .map(|result, act, ctx| {
                    match result {
                        Ok(()) => {}
                        Err(e @ FailoverError::NameHeld { .. }) => act.displaced(ctx, &e),
                        // The next renewal publishes it again, and says what fails.
                        Err(e) => debug!(error = %Quoted(&e), "failover: cannot publish this member's change yet"),
                    }
                    if act.publishing.finish() {
                        act.publish_member(ctx);
                    }
                }),
        );
    }

    /// Stops: the fence first, then the lease (so a successor need not wait the ttl).
    pub(crate) fn stop(&mut self, release: bool) -> LocalBoxActorFuture<Self, ()> {
        self.stopping = true;
        self.step_down();
        let client = self.client.clone();
        let lease = self.lease.id.take().filter(|_| release);
        Box::pin(
            async move {
                if let Some(lease) = lease {
                    match client.lease_revoke(lease).await {
                        Ok(_) => info!(
                            lease = %lease,
                            "failover: released the lease; this member's keys are gone"
                        ),
                        Err(e) => {
                            warn!(error = %Quoted(&e), "failover: cannot revoke the lease; it expires by its ttl")
                        }
                    }
                }
            }
            .into_actor(self)
            .map(|_, _, ctx: &mut Context<Self>| ctx.stop()),
        )
    }
}

/// The node's role or streaming changed (from [`Node::state`]).
struct NodeChanged(#[allow(dead_code)] NodeState);

impl StreamHandler<NodeChanged> for FailoverActor {
    fn handle(&mut self, _: NodeChanged, ctx: &mut Context<Self>) {
        self.publish_member(ctx);
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // The supervisor is gone: the node stops, and this actor with it.
    }
}

/// The node's status, or `None` if its supervisor is gone.
pub(crate) async fn node_status(
    supervisor: &Addr<supervisor_actor::Supervisor>,
) -> Option<NodeStatus> {
    supervisor.send(GetNodeStatus).await.ok()?.ok()
}
