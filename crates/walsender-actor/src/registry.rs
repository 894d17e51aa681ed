//! The registry of walsenders: who is connected, `max_wal_senders`, the rows of
//! `pg_stat_replication`, and the fan-out of shutdown. One per node.
//!
//! Every connection is known from its accept (so shutdown reaches connections still in their
//! startup phase), but only authenticated walsenders count toward `max_wal_senders`, as in
//! PostgreSQL. A shutdown request is answered when the last connection has closed; each
//! connection reports its close with a message, so nothing here waits on a timer.
//!
//! What the synchronous standbys have confirmed, taken together, is also published as a watch
//! ([`WalSenderRegistry::sync_positions`]), so that readers on the primary can stop at WAL
//! acknowledged at the node's durability level.
//!
//! A standby's positions count only as far as they hold on the node's current timeline
//! (the overlapped commit's rule 1, [`crate::overlap::counted_up_to`]): each report carries
//! the timeline its stream was on, and the timeline is read from storage at each decision, so
//! an append of a new timeline is never released by a report made on the old one, whichever
//! of the two events reaches the registry first.

use std::collections::{BTreeMap, BTreeSet};

use actix::prelude::*;

use crate::messages::*;
use crate::overlap::counted_up_to;
use crate::status::{lock, SharedStatus, WalSenderState};
use crate::syncrep::{
    decide, Confirmed, StandbyPositions, SyncPositions, SyncStandbyNames, Waiters,
};
use crate::WalSender;
use wal_storage::{Wal, WeakWal};

struct Entry {
    addr: Addr<WalSender>,
    /// Set once the connection has authenticated as a walsender.
    status: Option<SharedStatus>,
}

pub struct WalSenderRegistry {
    max_wal_senders: usize,
    sync: Option<SyncStandbyNames>,
    waiters: Waiters<tokio::sync::oneshot::Sender<()>>,
    connections: BTreeMap<u32, Entry>,
    /// Answered when `connections` becomes empty during shutdown.
    shutdown_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    shutting_down: Option<crate::session::ShutdownMode>,
    /// Sessions are held ([`HoldWalSenders`]): every new connection is ended at once.
    held: bool,
    /// Each waits for the connections open at its [`HoldWalSenders`] to close.
    hold_waiters: Vec<(BTreeSet<u32>, tokio::sync::oneshot::Sender<()>)>,
    /// The highest positions the synchronous standbys ever confirmed together on the current
    /// timeline, each field on its own: once acknowledged, WAL stays acknowledged whoever is
    /// synchronous later. A new timeline keeps what lies below its switch point.
    confirmed: tokio::sync::watch::Sender<Confirmed>,
    /// The node's storage, for its current timeline and history at each decision. Weak: the
    /// registry may outlive the node's shutdown by a moment, and storage (with the data
    /// directory's lock) must go with the node's last real handle.
    wal: WeakWal,
}

impl WalSenderRegistry {
    pub fn new(max_wal_senders: usize, wal: Wal) -> WalSenderRegistry {
        let confirmed = Confirmed {
            timeline: wal.timeline(),
            positions: SyncPositions::default(),
        };
        WalSenderRegistry {
            max_wal_senders,
            sync: None,
            waiters: Waiters::default(),
            connections: BTreeMap::new(),
            shutdown_waiters: Vec::new(),
            shutting_down: None,
            held: false,
            hold_waiters: Vec::new(),
            confirmed: tokio::sync::watch::channel(confirmed).0,
            wal: wal.downgrade(),
        }
    }

    /// What the synchronous standbys have confirmed, taken together (each position the
    /// highest ever reached on the timeline it names); zero until they first confirm anything.
    pub fn sync_positions(&self) -> tokio::sync::watch::Receiver<Confirmed> {
        self.confirmed.subscribe()
    }

    fn active_walsenders(&self) -> usize {
        self.connections
            .values()
            .filter(|e| e.status.is_some())
            .count()
    }

    /// Decides each walsender's `sync_state` and releases the appends the synchronous
    /// standbys now cover. Runs on every event that can change either: a reply, a walsender
    /// coming or going, a new setting.
    fn recompute(&mut self) {
        // Storage gone: the node has shut down, and nothing is left to decide.
        let Some(wal) = self.wal.upgrade() else {
            return;
        };
        let current = wal.timeline();
        let ended_at = |t| wal.timeline_end(t);
        let mut standbys = Vec::new();
        for (pid, e) in &self.connections {
            if let Some(st) = &e.status {
                let st = lock(st);
                let reported = SyncPositions {
                    write: st.write_lsn.unwrap_or_default(),
                    flush: st.flush_lsn.unwrap_or_default(),
                    apply: st.replay_lsn.unwrap_or_default(),
                }
                .at_most(counted_up_to(st.reported_on, current, ended_at));
                standbys.push(StandbyPositions {
                    pid: *pid,
                    application_name: st.application_name.clone(),
                    streaming: st.state == WalSenderState::Streaming,
                    write: reported.write,
                    flush: reported.flush,
                    apply: reported.apply,
                });
            }
        }
        let decision = decide(self.sync.as_ref(), &standbys);
        for (pid, (priority, state)) in &decision.states {
            if let Some(st) = self.connections.get(pid).and_then(|e| e.status.as_ref()) {
                let mut st = lock(st);
                st.sync_priority = *priority;
                if st.sync_state != *state {
                    st.sync_state = state.to_string();
                }
            }
        }
        if let Some(p) = decision.positions {
            let released = self.waiters.release(p);
            #[cfg(feature = "failpoints")]
            if !released.is_empty() {
                wal_storage::crash::reached(crate::overlap::CRASH_RELEASE);
            }
            for w in released {
                let _ = w.send(());
            }
        }
        self.confirmed.send_if_modified(|c| {
            let mut kept = c
                .positions
                .at_most(counted_up_to(Some(c.timeline), current, ended_at));
            if let Some(p) = decision.positions {
                kept = SyncPositions {
                    write: kept.write.max(p.write),
                    flush: kept.flush.max(p.flush),
                    apply: kept.apply.max(p.apply),
                };
            }
            let next = Confirmed {
                timeline: current,
                positions: kept,
            };
            let changed = next != *c;
            *c = next;
            changed
        });
    }

    fn wake_if_empty(&mut self) {
        if self.connections.is_empty() {
            for w in self.shutdown_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }
}

impl Actor for WalSenderRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Status updates from many walsenders arrive here; a deeper mailbox keeps senders that
        // use `send` from parking on a full one: measured on actix 0.13, pipelined `send` across
        // arbiters ran about ten times slower with the default capacity of 16 than with 1024.
        ctx.set_mailbox_capacity(1024);
    }
}

impl Handler<ConnectionOpened> for WalSenderRegistry {
    type Result = ();

    fn handle(&mut self, msg: ConnectionOpened, _: &mut Context<Self>) {
        if let Some(mode) = self.shutting_down {
            // Accepted just before the listener stopped: end it like the rest.
            msg.addr.do_send(Shutdown { mode });
        } else if self.held {
            msg.addr.do_send(Shutdown {
                mode: crate::session::ShutdownMode::Immediate,
            });
            // Accepted before the hold but heard of after it: whoever waits for the sessions
            // to end waits for this one too, so nothing reads WAL when the wait is answered.
            for (open, _) in &mut self.hold_waiters {
                open.insert(msg.pid);
            }
        }
        self.connections.insert(
            msg.pid,
            Entry {
                addr: msg.addr,
                status: None,
            },
        );
    }
}

impl Handler<RegisterWalSender> for WalSenderRegistry {
    type Result = Result<(), TooManyWalSenders>;

    fn handle(&mut self, msg: RegisterWalSender, _: &mut Context<Self>) -> Self::Result {
        if self.active_walsenders() >= self.max_wal_senders {
            return Err(TooManyWalSenders {
                max_wal_senders: self.max_wal_senders,
            });
        }
        if let Some(e) = self.connections.get_mut(&msg.pid) {
            e.status = Some(msg.status);
        }
        self.recompute();
        Ok(())
    }
}

impl Handler<StatusChanged> for WalSenderRegistry {
    type Result = ();

    fn handle(&mut self, _: StatusChanged, _: &mut Context<Self>) {
        // The facts are in the shared status.
        self.recompute();
    }
}

impl Handler<ConnectionClosed> for WalSenderRegistry {
    type Result = ();

    fn handle(&mut self, msg: ConnectionClosed, _: &mut Context<Self>) {
        self.connections.remove(&msg.pid);
        self.recompute();
        self.wake_if_empty();
        self.hold_waiters.retain_mut(|(open, _)| {
            open.remove(&msg.pid);
            !open.is_empty()
        });
    }
}

impl Handler<HoldWalSenders> for WalSenderRegistry {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: HoldWalSenders, _: &mut Context<Self>) -> Self::Result {
        self.held = true;
        let mode = crate::session::ShutdownMode::Immediate;
        for e in self.connections.values() {
            e.addr.do_send(Shutdown { mode });
        }
        let open: BTreeSet<u32> = self.connections.keys().copied().collect();
        if open.is_empty() {
            return Box::pin(async {});
        }
        // Dropping the sender (when its last connection closes) answers the waiter.
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.hold_waiters.push((open, tx));
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

impl Handler<ResumeWalSenders> for WalSenderRegistry {
    type Result = ();

    fn handle(&mut self, _: ResumeWalSenders, _: &mut Context<Self>) {
        self.held = false;
    }
}

impl Handler<GetReplicationStatus> for WalSenderRegistry {
    type Result = MessageResult<GetReplicationStatus>;

    fn handle(&mut self, _: GetReplicationStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.connections
                .values()
                .filter_map(|e| e.status.as_ref().map(|s| lock(s).clone()))
                .collect(),
        )
    }
}

impl Handler<ShutdownWalSenders> for WalSenderRegistry {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: ShutdownWalSenders, _: &mut Context<Self>) -> Self::Result {
        self.shutting_down = Some(msg.mode);
        for e in self.connections.values() {
            e.addr.do_send(Shutdown { mode: msg.mode });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.shutdown_waiters.push(tx);
        self.wake_if_empty();
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

impl Handler<SetMaxWalSenders> for WalSenderRegistry {
    type Result = ();

    fn handle(&mut self, msg: SetMaxWalSenders, _: &mut Context<Self>) {
        self.max_wal_senders = msg.0;
    }
}

impl Handler<SettingsChanged> for WalSenderRegistry {
    type Result = ();

    fn handle(&mut self, msg: SettingsChanged, _: &mut Context<Self>) {
        for e in self.connections.values() {
            e.addr.do_send(msg);
        }
    }
}

impl Handler<CountConnections> for WalSenderRegistry {
    type Result = usize;

    fn handle(&mut self, _: CountConnections, _: &mut Context<Self>) -> usize {
        self.connections.len()
    }
}

impl Handler<SetSyncStandbyNames> for WalSenderRegistry {
    type Result = ();

    fn handle(&mut self, msg: SetSyncStandbyNames, _: &mut Context<Self>) {
        self.sync = msg.0;
        if self.sync.is_none() {
            // No synchronous standbys any more: nobody waits (PostgreSQL wakes them all).
            for w in self.waiters.release_all() {
                let _ = w.send(());
            }
        }
        self.recompute();
    }
}

impl Handler<WaitForSync> for WalSenderRegistry {
    type Result = ResponseFuture<Result<(), SyncWaitAbandoned>>;

    fn handle(&mut self, msg: WaitForSync, _: &mut Context<Self>) -> Self::Result {
        if self.sync.is_none() {
            return Box::pin(async { Ok(()) });
        }
        // Appends that gave up (synchronous_wait_timeout) leave closed senders behind.
        if self.waiters.len() >= 1024 {
            self.waiters.retain(|w| !w.is_closed());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiters.push(msg.level, msg.lsn, tx);
        self.recompute();
        Box::pin(async move { rx.await.map_err(|_| SyncWaitAbandoned) })
    }
}
