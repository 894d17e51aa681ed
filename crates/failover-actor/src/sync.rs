//! The leader's synchronous standby in `synchronous_mode` on or strict: on each confirmed
//! renewal the leader plans the next loss-free step ([`machine::plan_sync`]) from its
//! walsenders' status and carries it out in order: `SetSyncStandbys` on the node, `sync` in
//! etcd (guarded by the leader key). Waiting for a first standby to catch up is the
//! registry's synchronous wait (an event); a replacement is checked on the next renewals.

use actix::prelude::*;
use tracing::{info, warn};
use walsender_actor::status::WalSenderState;

use crate::actor::FailoverActor;
use crate::error::FailoverError;
use crate::machine::{self, SyncCandidate, SyncPhase};
use crate::store;

impl FailoverActor {
    /// The leader's synchronous standby, managed on each confirmed renewal.
    pub(crate) fn manage_sync(&mut self, ctx: &mut Context<Self>) {
        if self.sync_busy || self.config.synchronous_mode == crate::SynchronousMode::Off {
            return;
        }
        let (Some(term), Some(lease), Some(local)) =
            (self.progress.leading, self.lease, self.local.clone())
        else {
            return;
        };
        let me = self.me().to_string();
        let published = self
            .cluster
            .sync
            .as_ref()
            .filter(|s| s.term == term && s.leader == me)
            .and_then(|s| s.sync_standby.clone());
        let candidates: Vec<SyncCandidate> = self
            .replication
            .iter()
            .map(|r| {
                let member = self.cluster.members.get(&r.application_name);
                SyncCandidate {
                    name: r.application_name.clone(),
                    // A standby still catching up counts as connected: choosing it is
                    // loss-free (it is published only once it has caught up), and one that
                    // had just reconnected was otherwise taken for gone and the choice undone.
                    connected: matches!(
                        r.state,
                        WalSenderState::Streaming | WalSenderState::Catchup
                    ),
                    flush: r.flush_lsn.unwrap_or(wal_storage::Lsn(0)),
                    priority: member.map_or(0, |m| m.priority),
                    nofailover: member.is_none_or(|m| m.nofailover),
                }
            })
            .collect();
        let (phase, mut actions) = machine::plan_sync(
            self.config.synchronous_mode,
            &self.sync_phase,
            published.as_deref(),
            &candidates,
            local.flush,
        );
        // A new leader holds appends until it has published a synchronous standby of its own.
        // Its standbys follow it within milliseconds of its win (and each reconnects once as it
        // does), so while the hold is young it looks again soon (a short backoff, not a poll of
        // something that would announce itself) and does not take a standby that just
        // reconnected for gone; in `on` it gives up after one renewal interval and goes on
        // asynchronously: the term's record names no standby, so nobody becomes promotable.
        let mut gave_up = false;
        if let Some(since) = self.sync_hold_since {
            let young = since.elapsed() < machine::renewal_interval(self.config.ttl);
            if young && actions == [machine::SyncAction::Set(None)] {
                actions = vec![machine::SyncAction::Set(Some(machine::strict_hold()))];
            }
            let adding = matches!(phase, SyncPhase::Adding { .. });
            if actions.is_empty()
                && !adding
                && !young
                && self.config.synchronous_mode == crate::SynchronousMode::On
            {
                info!("failover: no synchronous standby to choose; appends go on asynchronously");
                actions.push(machine::SyncAction::Set(None));
                gave_up = true;
            }
            if young {
                self.sync_recheck = true;
            }
        }
        if actions.is_empty() {
            self.sync_phase = phase;
            return;
        }
        if actions.iter().any(|a| {
            matches!(
                a,
                machine::SyncAction::Set(None) | machine::SyncAction::Publish(None)
            )
        }) {
            let seen: Vec<String> = candidates
                .iter()
                .map(|c| format!("{} (connected {}, flush {})", c.name, c.connected, c.flush))
                .collect();
            info!(?seen, "failover: no synchronous standby left to count on");
        }
        // The hold ends once a standby of this term is published, or when `on` gives up.
        let releases_hold = gave_up
            || actions
                .iter()
                .any(|a| matches!(a, machine::SyncAction::Publish(Some(_))));
        self.sync_busy = true;
        let supervisor = self.node.supervisor.clone();
        let registry = self.node.registry.clone();
        let client = self.client.clone();
        let keys = self.keys.clone();
        ctx.spawn(
            async move {
                for action in actions {
                    match action {
                        machine::SyncAction::Set(names) => {
                            info!(?names, "failover: synchronous standbys set");
                            supervisor
                                .send(supervisor_actor::SetSyncStandbys { names })
                                .await
                                .map_err(|e| FailoverError::Refused(e.to_string()))?;
                        }
                        machine::SyncAction::Publish(standby) => {
                            info!(?standby, "failover: synchronous standby published");
                            let record = crate::keys::SyncRecord {
                                leader: me.clone(),
                                sync_standby: standby,
                                term,
                            };
                            if !store::leader_put(&client, &keys, &me, lease, keys.sync(), store::sync_value(&record)).await? {
                                return Err(FailoverError::Refused("the leader key is not ours".into()));
                            }
                        }
                    }
                }
                Ok::<_, FailoverError>(())
            }
            .into_actor(self)
            .map(move |result, act, ctx| {
                act.sync_busy = false;
                match result {
                    Ok(()) => {
                        if releases_hold {
                            act.sync_hold_since = None;
                        }
                        // Waiting for the first standby to catch up is an event of the
                        // registry's synchronous wait; a replacement is checked on renewals.
                        if let SyncPhase::Adding { from: None, target, .. } = &phase {
                            let wait = registry.send(walsender_actor::messages::WaitForSync {
                                lsn: *target,
                                level: walsender_actor::syncrep::WaitLevel::Flush,
                            });
                            ctx.spawn(wait.into_actor(act).map(|_, act, ctx| act.renew(ctx)));
                        }
                        act.sync_phase = phase;
                    }
                    Err(e) => warn!(error = %e, "failover: changing the synchronous standby failed; retried on the next renewal"),
                }
            }),
        );
    }
}
