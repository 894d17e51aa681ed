//! The leader's synchronous standby in `synchronous_mode` on or strict: on each confirmed
//! renewal the leader plans the next loss-free step ([`machine::plan_sync`], with a new
//! leader's hold by [`machine::hold_for_sync`]) from its walsenders' status and carries it
//! out in order in one round: `SetSyncStandbys` on the node, `sync` in etcd (guarded by the
//! leader key). Waiting for a first standby to catch up is the registry's synchronous wait
//! (an event); a replacement is checked on the next renewals.

use actix::prelude::*;
use tracing::{info, warn};
use wal_storage::Lsn;

use crate::actor::FailoverActor;
use crate::error::FailoverError;
use crate::machine::{self, SyncAction, SyncPhase};
use crate::outage::Quoted;
use crate::store;

impl FailoverActor {
    /// The leader's synchronous standby, managed on each confirmed renewal, one round at a
    /// time. A renewal that comes while a round runs plans nothing: the next renewal plans
    /// from a fresher status than a replay of this one would.
    pub(crate) fn manage_sync(&mut self, ctx: &mut Context<Self>) {
        if self.config.synchronous_mode == crate::SynchronousMode::Off {
            return;
        }
        let (Some(term), Some(lease), Some(local)) =
            (self.progress.leading, self.lease.id, self.local.clone())
        else {
            return;
        };
        if !self.sync.round.try_start() {
            return;
        }
        let me = self.me().to_string();
        let published = self
            .cluster
            .sync
            .as_ref()
            .filter(|s| s.term == term && s.leader == me)
            .and_then(|s| s.sync_standby.clone());
        let candidates = machine::sync_candidates(&self.replication, &self.cluster.members);
        let mode = self.config.synchronous_mode;
        let (phase, planned) = machine::plan_sync(
            mode,
            &self.sync.phase,
            published.as_deref(),
            &candidates,
            local.flush,
        );
        let held_for = self.sync.hold_since.map(|since| since.elapsed());
        let round = machine::hold_for_sync(mode, &phase, planned, held_for, self.config.ttl);
        if round.gave_up {
            info!("failover: no synchronous standby to choose; appends go on asynchronously");
        }
        if round.recheck_soon {
            self.sync.recheck_soon = true;
        }
        if round.actions.is_empty() {
            // Nothing to carry out: the round ends here.
            self.sync.phase = phase;
            let _ = self.sync.round.finish();
            return;
        }
        if round
            .actions
            .iter()
            .any(|a| matches!(a, SyncAction::Set(None) | SyncAction::Publish(None)))
        {
            let seen: Vec<String> = candidates
                .iter()
                .map(|c| format!("{} (connected {}, flush {})", c.name, c.connected, c.flush))
                .collect();
            info!(seen = %seen.join(", "), "failover: no synchronous standby left to count on");
        }
        let supervisor = self.node.supervisor.clone();
        let client = self.client.clone();
        let keys = self.keys.clone();
        let actions = round.actions;
        let work = async move {
            for action in actions {
                match action {
                    SyncAction::Set(names) => {
                        info!(
                            names = %names.as_ref().map_or_else(|| "none".to_string(), sync_names),
                            "failover: synchronous standbys set"
                        );
                        supervisor
                            .send(supervisor_actor::SetSyncStandbys { names })
                            .await
                            .map_err(|e| FailoverError::Refused(e.to_string()))?;
                    }
                    SyncAction::Publish(standby) => {
                        info!(
                            standby = standby.as_deref().unwrap_or("none"),
                            "failover: synchronous standby published"
                        );
                        let record = crate::keys::SyncRecord {
                            leader: me.clone(),
                            sync_standby: standby,
                            term,
                        };
                        let value = store::sync_value(&record);
                        if !store::leader_put(&client, &keys, &me, lease, keys.sync(), value)
                            .await?
                        {
                            return Err(FailoverError::Refused(
                                "the leader key is not ours".into(),
                            ));
                        }
                    }
                }
            }
            Ok::<_, FailoverError>(())
        };
        let releases_hold = round.releases_hold;
        // The round's one return. Its commit point is the last action carried out: the phase
        // planned is taken up only if every action was, and a failed round leaves the phase
        // as it was, so that the next renewal plans the same step again.
        ctx.spawn(work.into_actor(self).map(move |done, act, ctx| {
            let _ = act.sync.round.finish();
            if let Err(e) = done {
                warn!(error = %Quoted(&e), "failover: changing the synchronous standby failed; retried on the next renewal");
                return;
            }
            if releases_hold {
                act.sync.hold_since = None;
            }
            if let SyncPhase::Adding {
                from: None, target, ..
            } = &phase
            {
                act.renew_when_synced(ctx, *target);
            }
            act.sync.phase = phase;
        }));
    }

    /// Waiting for the first standby to catch up to `target` is an event of the walsender
    /// registry's synchronous wait (the one appends wait on); when it comes, a renewal plans
    /// the publication at once. A replacement is checked on renewals instead: the old
    /// standby still counts meanwhile.
    fn renew_when_synced(&mut self, ctx: &mut Context<Self>, target: Lsn) {
        let wait = self
            .node
            .registry
            .send(walsender_actor::messages::WaitForSync {
                lsn: target,
                level: walsender_actor::syncrep::WaitLevel::Flush,
            });
        ctx.spawn(wait.into_actor(self).map(|_, act, ctx| act.renew(ctx)));
    }
}

/// `synchronous_standby_names` as it would be written: `FIRST 1 (b,c)`.
fn sync_names(names: &walsender_actor::syncrep::SyncStandbyNames) -> String {
    let method = match names.method {
        walsender_actor::syncrep::SyncMethod::First => "FIRST",
        walsender_actor::syncrep::SyncMethod::Any => "ANY",
    };
    format!("{method} {} ({})", names.num_sync, names.names.join(","))
}
