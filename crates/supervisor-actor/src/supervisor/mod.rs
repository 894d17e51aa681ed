//! The supervisor actor: owns a node's children and their lifecycle.
//!
//! - A request to run the walreceiver is state (`wanted`), kept until a walreceiver runs, never
//!   an edge that can be lost: whenever anything changes (a walreceiver stopped, a retry timer
//!   fired, the configuration was reloaded) the supervisor compares what is wanted with what
//!   runs and starts one if none runs. A walreceiver's start and stop are confirmed by its own
//!   events, and a late event from a walreceiver already replaced carries an old id and is
//!   ignored, so a surplus start request is harmless.
//! - Shutdown goes in order: stop accepting, drain the walsenders (with their deadline), stop
//!   the walreceiver, stop the services handed over with [`SuperviseService`] (the admin API,
//!   which so answers `/status` during the drain), release storage.
//! - Promotion stops the walreceiver, waits for its stop event, starts the next timeline in
//!   storage, and turns the node into a primary.
//! - Storage's failures arrive as events on its health watch. A failed sync makes storage
//!   refuse writes; the supervisor then reopens it ([`Wal::restart`], on a blocking thread)
//!   on its restart schedule ([`StorageRestarts`]) until a reopening succeeds. No walreceiver
//!   is started while storage is failed; when storage is healthy again one starts at once.
//!   A full disk needs no restart: storage clears it by itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use wal_storage::{CommitBound, Lsn, Wal, WalError, WalFormat};
use wal_types::time::format_time;
use walreceiver_actor::messages::{
    Applied, GetReceiverStatus, ReceiverId, ReceiverOwner, ReceiverStopped, StopReceiver,
    StreamingStarted,
};
use walreceiver_actor::{
    ApplyReporting, ReceiverConfig, ReceiverError, ReceiverStatus, StopReason, WalReceiver,
};
use walsender_actor::messages::{
    GetReplicationStatus, SetMaxWalSenders, SetSyncStandbyNames, SettingsChanged,
    ShutdownWalSenders, StopAccepting,
};
use walsender_actor::session::ShutdownMode;
use walsender_actor::{Listener, Shared, WalSenderRegistry};

use crate::append_metrics::AppendMetrics;
use crate::durability::SyncSettings;
use crate::error::PromoteError;
use crate::fence::Fence;
use crate::messages::{
    GetNodeStatus, Promote, Promoted, Reconfigure, ReportApplied, ShutdownDone, ShutdownNode,
    SuperviseService,
};
use crate::restart::{FailureLog, RestartPolicy, RestartState};
use crate::status::{
    CommitStatus, NodeRole, NodeState, NodeStatus, ServiceInfo, ServiceState, WalReceiverInfo,
};
use crate::visibility::{rule_of, Visibility};

mod append;
mod leadership;
mod storage;
use storage::StorageSupervision;

struct Service {
    info: ServiceInfo,
    stop: Option<Box<dyn FnOnce() -> futures_util::future::BoxFuture<'static, ()> + Send>>,
}

struct Receiver {
    config: ReceiverConfig,
    /// The start request: a walreceiver should be running.
    wanted: bool,
    current: Option<(ReceiverId, Addr<WalReceiver>)>,
    streaming: bool,
    next_id: u64,
    retry: Option<SpawnHandle>,
    restart: RestartState,
    last_status: Option<ReceiverStatus>,
    /// The application's last reported apply position, carried to each new walreceiver.
    applied: Option<Lsn>,
    /// Waiting for the current walreceiver to stop (promotion).
    stop_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// The last walreceiver refused to cut this node's WAL below its commit point; cleared
    /// when a stream starts.
    tail_alarm: Option<String>,
    /// The last walreceiver refused to fill a gap from an archive of another system, when
    /// storage ended at this point; cleared once storage's end passes it. Not when a stream
    /// starts: an upstream that removed the WAL refuses it only after its stream started
    /// (PostgreSQL's walsender does too), so the alarm would blink with every retry.
    archive_alarm: Option<(String, Lsn)>,
}

impl Receiver {
    /// A walreceiver wanted, streaming from `config`'s upstream.
    fn new(config: ReceiverConfig) -> Receiver {
        Receiver {
            config,
            wanted: true,
            current: None,
            streaming: false,
            next_id: 1,
            retry: None,
            restart: RestartState::default(),
            last_status: None,
            applied: None,
            stop_waiters: Vec::new(),
            tail_alarm: None,
            archive_alarm: None,
        }
    }
}

/// Owns the node's children and shuts them down in order.
pub struct Supervisor {
    wal: Option<Wal>,
    shared: Arc<Shared>,
    registry: Addr<WalSenderRegistry>,
    listener: Option<Addr<Listener>>,
    arbiters: Vec<Arbiter>,
    shutdown_timeout: Duration,
    shutting_down: bool,
    shutdown_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    role: NodeRole,
    receiver: Option<Receiver>,
    policy: RestartPolicy,
    standby_signal: Option<PathBuf>,
    promoting: bool,
    sync: SyncSettings,
    services: Vec<Service>,
    storage: StorageSupervision,
    /// Asked before an append is taken and again before it is acknowledged.
    fence: Fence,
    /// A [`FollowLeader`](crate::FollowLeader) is under way: no appends, no promotion.
    following: bool,
    /// Where `standby.signal` goes when the node follows a leader.
    data_dir: PathBuf,
    /// What readers see: the acknowledged end, by a rule of the role and the settings.
    visibility: Visibility,
    /// Shared with [`Node`](crate::Node), which shows them in `/metrics`.
    pub(crate) append_metrics: Arc<AppendMetrics>,
    /// The role and whether the walreceiver streams, published at each change
    /// ([`Node::state`](crate::Node::state)), so that whoever shows them (the failover
    /// actor's member key, `/replica`) follows the change instead of asking again.
    pub(crate) state: tokio::sync::watch::Sender<NodeState>,
}

/// Whether clients see the node as read-only though it is not a standby: a primary whose
/// failover fence is closed acknowledges no writes.
pub(crate) fn read_only_to_clients(primary: bool, fence: &Fence) -> bool {
    primary && !fence.may_acknowledge(Instant::now())
}

impl Supervisor {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        wal: Wal,
        shared: Arc<Shared>,
        registry: Addr<WalSenderRegistry>,
        listener: Addr<Listener>,
        arbiters: Vec<Arbiter>,
        shutdown_timeout: Duration,
        standby: Option<ReceiverConfig>,
        policy: RestartPolicy,
        standby_signal: Option<PathBuf>,
        sync: SyncSettings,
        fence: Fence,
        data_dir: PathBuf,
        visibility: Visibility,
    ) -> Supervisor {
        let role = if standby.is_some() {
            NodeRole::Standby
        } else {
            NodeRole::Primary
        };
        Supervisor {
            wal: Some(wal),
            shared,
            registry,
            listener: Some(listener),
            arbiters,
            shutdown_timeout,
            shutting_down: false,
            shutdown_waiters: Vec::new(),
            role,
            receiver: standby.map(Receiver::new),
            policy,
            standby_signal,
            promoting: false,
            services: Vec::new(),
            storage: StorageSupervision::default(),
            sync,
            fence,
            following: false,
            data_dir,
            visibility,
            append_metrics: Arc::default(),
            state: tokio::sync::watch::Sender::new(NodeState {
                role,
                streaming: false,
            }),
        }
    }

    /// Publishes the role and whether the walreceiver streams, if either changed.
    fn publish_state(&self) {
        let now = NodeState {
            role: self.role,
            streaming: self.role == NodeRole::Standby
                && self.receiver.as_ref().is_some_and(|r| r.streaming),
        };
        self.state.send_if_modified(|s| {
            let changed = *s != now;
            *s = now;
            changed
        });
    }

    /// Tells the walsenders the node's role as clients see it: a standby (`in_hot_standby`),
    /// or a primary that acknowledges no writes now because its failover fence is closed
    /// (`default_transaction_read_only`), so that a client looking for a writable server
    /// (`target_session_attrs=read-write`) does not settle on a primary that has lost, or not
    /// yet won, the cluster's leadership. Called whenever the role or the fence changes.
    fn publish_role(&self) {
        self.publish_state();
        let settings = self.shared.settings();
        let in_hot_standby = self.role == NodeRole::Standby;
        let read_only = read_only_to_clients(self.role == NodeRole::Primary, &self.fence);
        if settings.in_hot_standby == in_hot_standby && settings.read_only == read_only {
            return;
        }
        let mut settings = (*settings).clone();
        settings.in_hot_standby = in_hot_standby;
        settings.read_only = read_only;
        self.shared.replace_settings(settings);
        self.registry.do_send(SettingsChanged);
    }

    /// Publishes the role and follows the fence for the next: one wait per change, each an
    /// event (a grant, a renewal, a revocation, or a grant's deadline), never a poll. The wait
    /// is armed before the role is read, so a change in between is not missed.
    fn publish_role_and_follow_fence(&self, ctx: &mut Context<Self>) {
        let next = self.fence.next_change();
        self.publish_role();
        ctx.spawn(
            next.into_actor(self)
                .map(|(), act, ctx| act.publish_role_and_follow_fence(ctx)),
        );
    }

    fn update_visibility(&self) {
        self.visibility
            .set_rule(rule_of(self.role == NodeRole::Primary, &self.sync));
    }

    /// Starts a walreceiver if one is wanted and none runs or waits for a retry.
    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        let Some(wal) = self.wal.clone() else { return };
        let arbiter = self.arbiters.first().map(Arbiter::handle);
        let owner = ReceiverOwner::of(&ctx.address());
        let Some(r) = self.receiver.as_mut() else {
            return;
        };
        if !r.wanted || r.current.is_some() || r.retry.is_some() || self.shutting_down {
            return;
        }
        // A walreceiver could write nothing: wait for storage to be back (an event).
        if wal.health().state.is_failed() {
            return;
        }
        let id = ReceiverId(r.next_id);
        r.next_id += 1;
        let mut config = r.config.clone();
        if let Some(applied) = r.applied {
            config.session.apply = ApplyReporting::Application { applied };
        }
        r.restart.on_started();
        r.streaming = false;
        let addr = match arbiter {
            Some(a) => {
                WalReceiver::start_in_arbiter(&a, move |_| WalReceiver::new(id, config, wal, owner))
            }
            None => WalReceiver::new(id, config, wal, owner).start(),
        };
        // Debug only: with an upstream down this happens on every retry; the failures' log
        // says what matters (see `restart`).
        tracing::debug!(receiver = id.0, "walreceiver started");
        r.current = Some((id, addr));
    }

    fn stop_receiver(&mut self) {
        if let Some(r) = self.receiver.as_mut() {
            r.wanted = false;
            if let Some((_, addr)) = &r.current {
                addr.do_send(StopReceiver);
            }
        }
    }

    /// Resolves once no walreceiver runs.
    fn receiver_stopped(&mut self) -> impl std::future::Future<Output = ()> + 'static {
        let rx = match self.receiver.as_mut() {
            Some(r) if r.current.is_some() => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                r.stop_waiters.push(tx);
                Some(rx)
            }
            _ => None,
        };
        async move {
            if let Some(rx) = rx {
                let _ = rx.await;
            }
        }
    }
}

impl Supervisor {
    /// Stops every supervised service that still runs; resolves when all have stopped.
    fn stop_services(&mut self) -> impl std::future::Future<Output = ()> + 'static {
        let stops: Vec<_> = self
            .services
            .iter_mut()
            .filter_map(|s| s.stop.take().map(|stop| stop()))
            .collect();
        async move {
            futures_util::future::join_all(stops).await;
        }
    }

    fn service_ended(&mut self, i: usize, result: Result<(), String>) {
        let Some(s) = self.services.get_mut(i) else {
            return;
        };
        // A service whose stop was not taken ended without the supervisor asking.
        let on_its_own = s.stop.take().is_some();
        match (result, on_its_own) {
            (Err(e), _) => {
                tracing::error!(service = %s.info.name, "service failed: {e}");
                s.info.state = ServiceState::Failed;
                s.info.last_error = Some(e);
            }
            (Ok(()), true) => {
                tracing::warn!(service = %s.info.name, "service ended without being stopped");
                s.info.state = ServiceState::Stopped;
                s.info.last_error = Some("ended without being stopped".into());
            }
            (Ok(()), false) => {
                tracing::debug!(service = %s.info.name, "service stopped");
                s.info.state = ServiceState::Stopped;
            }
        }
    }
}

impl Handler<SuperviseService> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: SuperviseService, ctx: &mut Context<Self>) {
        let i = self.services.len();
        self.services.push(Service {
            info: ServiceInfo {
                name: msg.name,
                state: ServiceState::Running,
                last_error: None,
            },
            stop: Some(msg.stop),
        });
        ctx.spawn(
            msg.ended
                .into_actor(self)
                .map(move |res, act, _| act.service_ended(i, res)),
        );
        if self.shutting_down {
            // Handed over too late to stop in order: stop it now.
            ctx.spawn(self.stop_services().into_actor(self));
        }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Appends from many clients arrive here: a deeper mailbox keeps `send` from parking.
        ctx.set_mailbox_capacity(4096);
        self.registry
            .do_send(SetSyncStandbyNames(self.sync.standby_names.clone()));
        self.watch_storage(ctx);
        self.publish_role_and_follow_fence(ctx);
        if let Some(wal) = &self.wal {
            ctx.spawn(actix::fut::wrap_future(self.visibility.run(wal)));
        }
        self.reconcile(ctx);
    }
}

impl Handler<StreamingStarted> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: StreamingStarted, _: &mut Context<Self>) {
        let Some(r) = self.receiver.as_mut() else {
            return;
        };
        if r.current.as_ref().map(|(id, _)| *id) != Some(msg.receiver) {
            return; // A walreceiver already replaced.
        }
        r.streaming = true;
        r.tail_alarm = None;
        let recovered = r.restart.on_streaming(Instant::now());
        self.publish_state();
        match recovered {
            Some(run) => tracing::info!(
                timeline = %msg.timeline,
                start = %msg.start,
                "streaming from upstream again, after {} failed attempts since {}",
                run.attempts,
                format_time(run.since)
            ),
            None => {
                tracing::info!(timeline = %msg.timeline, start = %msg.start, "streaming from upstream")
            }
        }
    }
}

impl Handler<ReceiverStopped> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: ReceiverStopped, ctx: &mut Context<Self>) {
        let policy = self.policy.clone();
        let end = self.wal.as_ref().map(|w| w.flushed()).unwrap_or_default();
        let Some(r) = self.receiver.as_mut() else {
            return;
        };
        if r.current.as_ref().map(|(id, _)| *id) != Some(msg.receiver) {
            return;
        }
        r.current = None;
        r.streaming = false;
        r.last_status = Some(msg.status);
        for w in r.stop_waiters.drain(..) {
            let _ = w.send(());
        }
        self.publish_state();
        let Some(r) = self.receiver.as_mut() else {
            return;
        };
        match msg.reason {
            StopReason::ShutdownRequested => {
                tracing::info!(receiver = msg.receiver.0, "walreceiver stopped on request");
            }
            StopReason::Failed(e) => {
                match e {
                    ReceiverError::BelowCommitPoint { .. }
                    | ReceiverError::WroteAsPrimary { .. }
                    | ReceiverError::TimelineClash { .. } => r.tail_alarm = Some(e.to_string()),
                    ReceiverError::OtherSystemArchive { .. } => {
                        r.archive_alarm = Some((e.to_string(), end))
                    }
                    _ => {}
                }
                let now = Instant::now();
                let delay = r.restart.on_failed(&policy, &e, now, rand::random::<f64>());
                let upstream = r.config.conninfo.to_string_without_password();
                match r.restart.log_failure(&policy, now) {
                    FailureLog::First => tracing::warn!(
                        %upstream,
                        "walreceiver stopped: {e}; retrying, at most every {:?}",
                        policy.transient_cap
                    ),
                    FailureLog::StillFailing { attempts, since } => tracing::warn!(
                        %upstream,
                        "still cannot stream from the upstream: {attempts} attempts since {}, last error: {e}",
                        format_time(since)
                    ),
                    FailureLog::Quiet => tracing::debug!(
                        receiver = msg.receiver.0,
                        attempts = r.restart.attempts,
                        retry_in_ms = delay.as_millis() as u64,
                        "walreceiver stopped: {e}"
                    ),
                }
                if !delay.is_zero() {
                    r.retry = Some(ctx.run_later(delay, |act, ctx| {
                        if let Some(r) = act.receiver.as_mut() {
                            r.retry = None;
                        }
                        act.reconcile(ctx);
                    }));
                }
            }
        }
        self.reconcile(ctx);
    }
}

impl Handler<ShutdownNode> for Supervisor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: ShutdownNode, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.shutdown_waiters.push(tx);
        let wait = Box::pin(async move {
            let _ = rx.await;
        });
        if self.shutting_down && !msg.immediate {
            return wait;
        }
        let mode = if msg.immediate {
            ShutdownMode::Immediate
        } else {
            ShutdownMode::Fast {
                deadline: Instant::now() + self.shutdown_timeout,
            }
        };
        tracing::info!(%mode, "shutting down");
        if let Some(l) = self.listener.take() {
            l.do_send(StopAccepting);
        }
        let first = !self.shutting_down;
        self.shutting_down = true;
        if let Some(r) = self.receiver.as_mut() {
            if let Some(h) = r.retry.take() {
                ctx.cancel_future(h);
            }
        }
        if let Some(h) = self.storage.timer.take() {
            ctx.cancel_future(h);
        }
        let registry = self.registry.clone();
        let me = ctx.address();
        ctx.spawn(
            async move {
                let _ = registry.send(ShutdownWalSenders { mode }).await;
            }
            .into_actor(self)
            .then(move |(), act, _| {
                // Walsenders are gone: now the walreceiver.
                act.stop_receiver();
                act.receiver_stopped().into_actor(act)
            })
            .then(move |(), act, _| {
                // Then the services beside the node, such as the admin API, which could show
                // the drain in `/status` until now.
                act.stop_services().into_actor(act)
            })
            .map(move |(), _, _| {
                if first {
                    me.do_send(ShutdownDone);
                }
            }),
        );
        wait
    }
}

impl Handler<ShutdownDone> for Supervisor {
    type Result = ();

    fn handle(&mut self, _: ShutdownDone, ctx: &mut Context<Self>) {
        // Storage last: every acknowledged write is already durable; dropping the supervisor's
        // handle lets the writer thread finish once the other holders are gone.
        let wal = self.wal.take();
        // A primary under the overlapped commit (or one whose early-send mark a run with it
        // left) records the clean shutdown, so that its next start removes the mark and goes
        // on on its timeline (rule 5): the walsenders are gone and nothing more is appended,
        // and storage writes the mark after everything written is durable.
        let mark = wal.filter(|w| {
            self.role == NodeRole::Primary
                && !self.promoting
                && (self.shared.settings().session.commit_overlap
                    || w.early_sends_marked().is_some())
        });
        // The arbiters' threads hold the walsenders' and the walreceiver's storage handles
        // until their event loops end: wait for that (off this thread) before answering, so
        // that a node reopened on the same data directory right after finds it unlocked.
        let arbiters = std::mem::take(&mut self.arbiters);
        let joined = tokio::task::spawn_blocking(move || {
            if let Some(wal) = mark {
                match wal.mark_clean_shutdown() {
                    Ok(()) => tracing::info!("recorded a clean shutdown"),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not record a clean shutdown; the next start begins a new timeline")
                    }
                }
            }
            join_arbiters(arbiters)
        });
        ctx.spawn(joined.into_actor(self).map(|_, act, ctx| {
            for w in act.shutdown_waiters.drain(..) {
                let _ = w.send(());
            }
            tracing::info!("shutdown complete");
            ctx.stop();
        }));
    }
}

/// Stops the arbiters and waits for their threads to end.
fn join_arbiters(arbiters: Vec<Arbiter>) {
    for a in &arbiters {
        a.stop();
    }
    for a in arbiters {
        if a.join().is_err() {
            tracing::error!("an arbiter thread panicked");
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // A System stopped without a shutdown (an embedding application's exit, a test's
        // kill) drops the supervisor: its arbiters still end before storage is free again.
        join_arbiters(std::mem::take(&mut self.arbiters));
    }
}

impl Handler<GetNodeStatus> for Supervisor {
    type Result = ResponseFuture<Result<NodeStatus, MailboxError>>;

    fn handle(&mut self, _: GetNodeStatus, _: &mut Context<Self>) -> Self::Result {
        let registry = self.registry.clone();
        let wal = self.wal.clone();
        let role = self.role;
        let services = self.services.iter().map(|s| s.info.clone()).collect();
        let retry_schedule = self.policy.schedule();
        let term = self.fence.term();
        let acknowledged_lsn = self.visibility.acknowledged();
        let tail_alarm = self.receiver.as_ref().and_then(|r| r.tail_alarm.clone());
        let end = self.wal.as_ref().map(|w| w.flushed());
        if let Some(r) = self.receiver.as_mut() {
            // WAL past the gap came from somewhere: the refusal no longer holds the node back.
            if r.archive_alarm
                .as_ref()
                .is_some_and(|(_, at)| end.is_some_and(|end| end > *at))
            {
                r.archive_alarm = None;
            }
        }
        let receiver = self.receiver.as_ref().map(|r| {
            let not_streaming_reason = if r.streaming {
                None
            } else if !r.wanted {
                Some("the walreceiver was stopped on request".to_string())
            } else if r.current.is_some() {
                Some("connecting to the upstream".to_string())
            } else {
                r.restart
                    .last_error
                    .clone()
                    .map(|e| format!("waiting to retry after: {e}"))
            };
            (
                r.current.as_ref().map(|(id, a)| (*id, a.clone())),
                r.last_status.clone(),
                r.restart.clone(),
                not_streaming_reason,
                r.archive_alarm.as_ref().map(|(alarm, _)| alarm.clone()),
            )
        });
        Box::pin(async move {
            let replication = registry.send(GetReplicationStatus).await?;
            let wal = wal.ok_or(MailboxError::Closed)?;
            let pos = wal.position();
            let wal_receiver = match receiver {
                None => None,
                Some((current, last, restart, not_streaming_reason, archive_alarm)) => {
                    let (pid, status) = match current {
                        Some((id, addr)) => {
                            (Some(id.0), addr.send(GetReceiverStatus).await.ok().or(last))
                        }
                        None => (None, last),
                    };
                    Some(WalReceiverInfo {
                        pid,
                        status,
                        not_streaming_reason,
                        restart,
                        retry_schedule,
                        archive_alarm,
                    })
                }
            };
            Ok(NodeStatus {
                role,
                system_identifier: wal.system_id(),
                timeline: pos.timeline,
                flush_lsn: pos.flushed,
                acknowledged_lsn,
                wal_format: wal.format(),
                replication,
                wal_receiver,
                storage: wal.health(),
                services,
                term,
                failover: None,
                commit: commit_status(&wal, tail_alarm),
            })
        })
    }
}

impl Handler<Promote> for Supervisor {
    type Result = ResponseActFuture<Self, Result<Promoted, PromoteError>>;

    fn handle(&mut self, _: Promote, _: &mut Context<Self>) -> Self::Result {
        // A promotion outside the failover actor would make a primary that holds no term: it
        // could acknowledge nothing, and the actor would demote it again.
        if self.fence.is_managed() {
            return Box::pin(actix::fut::ready(Err(PromoteError::ManagedByFailover)));
        }
        self.promote("promoted by walserver".into())
    }
}

impl Supervisor {
    /// Whether a new timeline may start now (`role_fits`: the node's role allows it), and
    /// storage's handle to start it with.
    fn may_switch_timeline(&self, role_fits: bool) -> Result<Wal, PromoteError> {
        if self.shutting_down {
            return Err(PromoteError::ShuttingDown);
        }
        if !role_fits {
            return Err(PromoteError::NotStandby);
        }
        if self.promoting || self.following {
            return Err(PromoteError::InProgress);
        }
        let wal = self.wal.clone().ok_or(PromoteError::ShuttingDown)?;
        if wal.format() != WalFormat::Walserver {
            return Err(PromoteError::Storage(WalError::PromotionNotSupported));
        }
        Ok(wal)
    }

    /// Promotes this standby, with `reason` beside the new timeline in its history file.
    fn promote(
        &mut self,
        reason: String,
    ) -> ResponseActFuture<Self, Result<Promoted, PromoteError>> {
        let wal = match self.may_switch_timeline(self.role == NodeRole::Standby) {
            Ok(wal) => wal,
            Err(e) => return Box::pin(actix::fut::ready(Err(e))),
        };
        self.promoting = true;
        self.stop_receiver();
        let signal = self.standby_signal.clone();
        let stopped = self.receiver_stopped();
        let work = async move {
            stopped.await;
            // Promotion writes and fsyncs the history file and the switch segment. Its commit
            // point is storage's control data, which records the new timeline and the role
            // primary in one write; `standby.signal` is removed after it, and a crash in
            // between leaves a signal known for a leftover (`datadir`'s role rule).
            tokio::task::spawn_blocking(move || {
                let (timeline, switch_lsn) = wal.promote(&reason)?;
                if let Some(path) = &signal {
                    // Committed already: a signal that stays is ignored and removed at the
                    // next start.
                    if let Err(e) = wal_storage::durable::remove(path) {
                        tracing::warn!(error = %e, path = %path.display(), "promoted, but could not remove standby.signal; the next start removes it");
                    }
                }
                Ok::<_, WalError>(Promoted {
                    timeline,
                    switch_lsn,
                })
            })
            .await
            .unwrap_or_else(|e| {
                Err(WalError::Io {
                    context: "promoting".into(),
                    cause: std::io::Error::other(e.to_string()),
                })
            })
        };
        Box::pin(work.into_actor(self).map(|res, act, _| {
            act.promoting = false;
            let promoted = res?;
            act.role = NodeRole::Primary;
            act.receiver = None;
            act.update_visibility();
            act.publish_role();
            tracing::info!(timeline = %promoted.timeline, switch = %promoted.switch_lsn, "promoted to primary");
            Ok(promoted)
        }))
    }
}

impl Supervisor {
    /// Starts a new timeline on this primary at its durable end, as a promotion does but with
    /// no walreceiver to stop and no role to change; walsenders streaming the old timeline
    /// end their copy at the switch, as after any promotion.
    fn start_new_timeline(
        &mut self,
        reason: String,
    ) -> ResponseActFuture<Self, Result<Promoted, PromoteError>> {
        let wal = match self.may_switch_timeline(true) {
            Ok(wal) => wal,
            Err(e) => return Box::pin(actix::fut::ready(Err(e))),
        };
        self.promoting = true;
        let work = tokio::task::spawn_blocking(move || wal.promote(&reason));
        Box::pin(work.into_actor(self).map(|res, act, _| {
            act.promoting = false;
            let (timeline, switch_lsn) = res.unwrap_or_else(|e| {
                Err(WalError::Io {
                    context: "starting a new timeline".into(),
                    cause: std::io::Error::other(e.to_string()),
                })
            })?;
            act.update_visibility();
            tracing::info!(%timeline, switch = %switch_lsn, "a new timeline for the term: a synchronous standby may hold WAL of the old one that this node lost");
            Ok(Promoted {
                timeline,
                switch_lsn,
            })
        }))
    }
}

impl Handler<Reconfigure> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: Reconfigure, ctx: &mut Context<Self>) {
        let mut walsender = msg.walsender;
        // The role is the supervisor's, not the configuration's.
        let now = self.shared.settings();
        walsender.in_hot_standby = now.in_hot_standby;
        walsender.read_only = now.read_only;
        if self.shared.tls.is_none() && walsender.auth.tls_available {
            let mut auth = (*walsender.auth).clone();
            auth.tls_available = false;
            walsender.auth = Arc::new(auth);
        }
        self.shared.replace_settings(walsender);
        self.registry.do_send(SetMaxWalSenders(msg.max_wal_senders));
        self.registry.do_send(SettingsChanged);
        let mut sync = msg.sync;
        if self.fence.is_managed() {
            // Under a failover actor the synchronous standbys are its choice, published in
            // the cluster's store before their acknowledgements count (`SetSyncStandbys`); a
            // reload must not replace them with the configuration's names.
            sync.standby_names = self.sync.standby_names.clone();
        }
        if sync != self.sync {
            self.registry
                .do_send(SetSyncStandbyNames(sync.standby_names.clone()));
            self.sync = sync;
            self.update_visibility();
        }
        let (Some(r), Some(new)) = (self.receiver.as_mut(), msg.receiver) else {
            return;
        };
        if leadership::same_upstream(&new, &r.config) {
            return;
        }
        tracing::info!(conninfo = %new.conninfo.to_string_without_password(), "walreceiver configuration changed; reconnecting");
        r.config = new;
        // A new upstream deserves a fresh start: no backoff carried over.
        r.restart = RestartState::default();
        if let Some(h) = r.retry.take() {
            ctx.cancel_future(h);
        }
        // The start request stays: the old walreceiver stops, and its stop event starts the
        // new one.
        if let Some((_, addr)) = &r.current {
            addr.do_send(StopReceiver);
        }
        self.reconcile(ctx);
    }
}

impl Handler<ReportApplied> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: ReportApplied, _: &mut Context<Self>) {
        if let Some(r) = self.receiver.as_mut() {
            r.applied = Some(r.applied.map_or(msg.lsn, |a| a.max(msg.lsn)));
            if let Some((_, addr)) = &r.current {
                addr.do_send(Applied { lsn: msg.lsn });
            }
        }
    }
}

/// The overlapped commit's part of `/status`, from storage's position and counters.
fn commit_status(wal: &Wal, alarm: Option<String>) -> CommitStatus {
    let pos = wal.position();
    let metrics = wal.metrics();
    let (tail_cuts, tail_cut_bytes) = metrics.tail_cuts();
    CommitStatus {
        commit_point: match pos.commit {
            CommitBound::None => None,
            CommitBound::Own(_) | CommitBound::Told(_) => Some(pos.committed()),
        },
        tail_cuts,
        tail_cut_bytes,
        tail_cut_refusals: metrics.tail_cut_refusals(),
        alarm,
    }
}
