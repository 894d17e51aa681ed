//! The supervisor's side of storage failures (the policy is written in wal-storage's
//! `health.rs`): storage's health watch is one of the supervisor's streams; a `failed` state
//! plans a reopening on the restart schedule ([`StorageRestarts`]), run on a blocking thread
//! with [`Wal::restart`](wal_storage::Wal::restart) and planned again while it fails; a
//! return to `ok` starts a walreceiver at once if one waits. Under the overlapped commit a
//! primary's reopening also starts a new timeline (rule 5).

use std::time::Instant;

use actix::prelude::*;
use wal_storage::{StorageHealth, StorageState, WalFormat};
use walsender_actor::messages::{HoldWalSenders, ResumeWalSenders};

use super::Supervisor;
use crate::restart::StorageRestarts;
use crate::status::NodeRole;

/// The supervisor's side of storage's failures: the restart schedule and what is under way.
#[derive(Default)]
pub(super) struct StorageSupervision {
    restarts: StorageRestarts,
    /// The next reopening, while one waits for its time.
    pub(super) timer: Option<SpawnHandle>,
    /// A reopening runs on a blocking thread.
    running: bool,
    /// The reopening under way starts a new timeline (rule 5): appends wait for it.
    pub(super) new_timeline: bool,
    /// The state last heard of.
    last: Option<StorageState>,
}

impl Supervisor {
    /// Makes storage's health one of the actor's streams: the current state first, then
    /// every change.
    pub(super) fn watch_storage(&mut self, ctx: &mut Context<Self>) {
        if let Some(wal) = &self.wal {
            let health = wal.subscribe_health();
            // The current state first, then every change.
            ctx.add_stream(futures_util::stream::unfold(
                (health, true),
                |(mut rx, first)| async move {
                    if !first {
                        rx.changed().await.ok()?;
                    }
                    let h = rx.borrow_and_update().clone();
                    Some((h, (rx, false)))
                },
            ));
        }
    }
}

impl StreamHandler<StorageHealth> for Supervisor {
    fn handle(&mut self, h: StorageHealth, ctx: &mut Context<Self>) {
        let was = self.storage.last.replace(h.state);
        match h.state {
            StorageState::Failed => self.schedule_storage_restart(ctx),
            StorageState::Ok => {
                self.storage.restarts.on_healthy(Instant::now());
                if was.is_some_and(|w| w != StorageState::Ok) {
                    // A walreceiver stopped by the failure (or waiting out a full disk) need
                    // not wait for its backoff: start one now.
                    if let Some(h) = self.receiver.as_mut().and_then(|r| r.retry.take()) {
                        ctx.cancel_future(h);
                    }
                    self.reconcile(ctx);
                }
            }
            StorageState::Full | StorageState::Restarting => {}
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // Storage's handle is gone (shutdown): nothing more to hear, and no reason to stop.
    }
}

impl Supervisor {
    /// Plans the next reopening of failed storage, unless one is planned or running.
    fn schedule_storage_restart(&mut self, ctx: &mut Context<Self>) {
        if self.shutting_down || self.storage.running || self.storage.timer.is_some() {
            return;
        }
        let delay =
            self.storage
                .restarts
                .on_failed(&self.policy, Instant::now(), rand::random::<f64>());
        self.storage.timer = Some(ctx.run_later(delay, |act, ctx| {
            act.storage.timer = None;
            act.restart_storage(ctx);
        }));
    }

    /// Reopens storage on a blocking thread (it reads, zeroes and syncs files).
    fn restart_storage(&mut self, ctx: &mut Context<Self>) {
        let Some(wal) = self.wal.clone() else { return };
        if self.shutting_down || self.storage.running {
            return;
        }
        self.storage.running = true;
        let attempt = self.storage.restarts.attempts;
        // Rule 5 of the overlapped commit: a primary whose storage is reopened past its last
        // good sync has lost what it wrote after it, which a synchronous standby sent early
        // may hold; it goes on on a new timeline from its durable end, as at a start. Appends
        // are refused until then (`reopening_on_new_timeline`), and the walsenders are held,
        // so that no standby's report of the old timeline counts for an append of the new one.
        let new_timeline = self.role == NodeRole::Primary
            && wal.format() == WalFormat::Walserver
            && walsender_actor::overlap::starts_new_timeline(
                wal.early_sends_marked(),
                wal.timeline(),
            );
        self.storage.new_timeline = new_timeline;
        let registry = self.registry.clone();
        let work = async move {
            if new_timeline && registry.send(HoldWalSenders).await.is_err() {
                return Ok(Ok(None));
            }
            let reopened = tokio::task::spawn_blocking(move || {
                let report = wal.restart()?;
                if report.is_some() && new_timeline {
                    let (timeline, switch) =
                        wal.promote("storage reopened under synchronous_commit_overlap")?;
                    tracing::info!(%timeline, %switch, "storage reopened on a new timeline: a synchronous standby may hold WAL of the old one that this node lost");
                }
                Ok::<_, wal_storage::WalError>(report)
            })
            .await;
            if new_timeline {
                registry.do_send(ResumeWalSenders);
            }
            reopened
        };
        ctx.spawn(work.into_actor(self).map(move |res, act, ctx| {
            act.storage.running = false;
            act.storage.new_timeline = false;
            match res {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(
                    attempt,
                    "storage is still failing; reopening it again later: {e}"
                ),
                Err(e) => tracing::error!(attempt, "reopening storage panicked: {e}"),
            }
            let failed = act
                .wal
                .as_ref()
                .is_some_and(|w| w.health().state.is_failed());
            if failed {
                act.schedule_storage_restart(ctx);
            }
        }));
    }
}
