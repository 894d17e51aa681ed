//! The failover actor's admin messages: the cluster's view, local health, history, pause and
//! resume, stop, and the leadership's watch. The handovers are `handover.rs`.

use std::time::{Instant, SystemTime};

use actix::prelude::*;
use etcd_gateway::{KeyRange, LeaseId};

use crate::actor::FailoverActor;
use crate::error::FailoverError;
use crate::membership::Seen;
use crate::messages::{
    AddPermanentSlot, FailoverMetrics, GetClusterView, GetFailoverMetrics, GetFailoverStatus,
    GetHistory, GetLocalHealth, Pause, RemovePermanentSlot, Resume, StopFailover,
    SubscribeLeadership,
};
use crate::store;
use crate::view::{ClusterView, LeaderView, LocalHealth, TermRecord};

pub(crate) type Reply<T> = ResponseActFuture<FailoverActor, Result<T, FailoverError>>;

impl Handler<GetClusterView> for FailoverActor {
    type Result = Reply<ClusterView>;

    fn handle(&mut self, _: GetClusterView, _: &mut Context<Self>) -> Self::Result {
        let departed = self
            .departures
            .shown(Instant::now(), self.config.member_slot_grace());
        let client = self.client.clone();
        let keys = self.keys.clone();
        let known = self.cluster.clone();
        let name = self.config.cluster_name.clone();
        let mode = self.config.synchronous_mode;
        let ttl_seconds = self.config.ttl.as_secs();
        Box::pin(
            async move {
                let (cluster, _, mut history) = store::read_cluster(&client, &keys, &known).await?;
                history.sort_by_key(|r| r.term);
                let leader = match &cluster.leader {
                    Some(key) => {
                        let api_url = cluster
                            .members
                            .get(&key.holder)
                            .map(|m| m.api_url.clone())
                            .filter(|u| !u.is_empty());
                        let (lease, api_reachable) = futures_util::join!(
                            client.lease_time_to_live(LeaseId(key.lease), false),
                            async {
                                match &api_url {
                                    Some(url) => Some(crate::peers::reachable(url).await),
                                    None => None,
                                }
                            }
                        );
                        let lease = lease.ok();
                        Some(LeaderView {
                            name: key.holder.clone(),
                            term: key.term,
                            lease_remaining_ms: lease
                                .as_ref()
                                .map(|t| u64::try_from(t.ttl).unwrap_or(0) * 1000),
                            renewing: lease.as_ref().is_none_or(|t| {
                                crate::machine::lease_renewing(t.ttl, t.granted_ttl)
                            }),
                            api_reachable,
                        })
                    }
                    None => None,
                };
                Ok(ClusterView {
                    cluster: name,
                    members: cluster.members.values().cloned().collect(),
                    leader,
                    paused: cluster.paused,
                    sync_standby: cluster.sync.and_then(|s| s.sync_standby),
                    synchronous_mode: mode,
                    ttl_seconds,
                    history,
                    departed,
                    permanent_slots: cluster
                        .permanent_slots
                        .iter()
                        .map(|(name, at)| (name.clone(), at.map(|at| at.to_string())))
                        .collect(),
                })
            }
            .into_actor(self),
        )
    }
}

impl Handler<GetLocalHealth> for FailoverActor {
    type Result = MessageResult<GetLocalHealth>;

    fn handle(&mut self, _: GetLocalHealth, _: &mut Context<Self>) -> Self::Result {
        let leader = matches!(
            self.fence.view(Instant::now()),
            supervisor_actor::FenceView::Leader { .. }
        );
        let state = *self.node_state.borrow();
        MessageResult(LocalHealth {
            leader_with_live_lease: leader,
            // The node's own state as its supervisor published it last, not a status read a
            // renewal ago: a standby that streams again is healthy at once.
            streaming: state.streaming,
            lag_bytes: self.lag_bytes(),
            term: self.fence.term(),
            not_member: self.membership.not_member(
                self.lease.renewed,
                self.lease.ttl,
                Instant::now(),
                self.lease.last_error.as_deref(),
            ),
        })
    }
}

impl Handler<GetFailoverStatus> for FailoverActor {
    type Result = MessageResult<GetFailoverStatus>;

    fn handle(&mut self, _: GetFailoverStatus, _: &mut Context<Self>) -> Self::Result {
        let now = Instant::now();
        let leading = matches!(
            self.fence.view(now),
            supervisor_actor::FenceView::Leader { .. }
        );
        MessageResult(self.membership.status(
            self.lease.renewed,
            self.lease.ttl,
            now,
            SystemTime::now(),
            self.lease.last_error.as_deref(),
            leading,
            Seen {
                leader: self.cluster.leader.as_ref().map(|l| l.holder.clone()),
                term: self.fence.term(),
                paused: self.cluster.paused,
            },
        ))
    }
}

impl Handler<GetFailoverMetrics> for FailoverActor {
    type Result = MessageResult<GetFailoverMetrics>;

    fn handle(&mut self, _: GetFailoverMetrics, _: &mut Context<Self>) -> Self::Result {
        let now = Instant::now();
        let (leading, lease_remaining_seconds) = match self.fence.view(now) {
            supervisor_actor::FenceView::Leader { until, .. } => (
                true,
                Some(until.saturating_duration_since(now).as_secs_f64()),
            ),
            _ => (false, None),
        };
        MessageResult(FailoverMetrics {
            leading,
            term: self.fence.term(),
            lease_remaining_seconds,
            paused: self.cluster.paused,
            ttl_seconds: self.lease.ttl.as_secs_f64(),
            since_etcd_contact_seconds: self
                .lease
                .last_contact
                .map(|t| now.saturating_duration_since(t).as_secs_f64()),
            etcd_errors: self
                .client
                .error_counts()
                .into_iter()
                .map(|(kind, n)| (kind.as_str(), n))
                .collect(),
            terms_taken: self
                .decisions
                .terms_taken
                .iter()
                .map(|(reason, n)| (reason.clone(), *n))
                .collect(),
            sync_standby: self
                .cluster
                .sync
                .as_ref()
                .and_then(|s| s.sync_standby.clone()),
            leader: self.cluster.leader.as_ref().map(|l| l.holder.clone()),
        })
    }
}

impl Handler<GetHistory> for FailoverActor {
    type Result = Reply<Vec<TermRecord>>;

    fn handle(&mut self, _: GetHistory, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        let keys = self.keys.clone();
        Box::pin(async move { store::read_history(&client, &keys).await }.into_actor(self))
    }
}

impl Handler<AddPermanentSlot> for FailoverActor {
    type Result = Reply<bool>;

    fn handle(&mut self, msg: AddPermanentSlot, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        let keys = self.keys.clone();
        Box::pin(
            async move {
                crate::permanent::check_permanent_slot_name(&msg.name)?;
                store::add_permanent_slot(&client, &keys, &msg.name).await
            }
            .into_actor(self),
        )
    }
}

impl Handler<RemovePermanentSlot> for FailoverActor {
    type Result = Reply<bool>;

    fn handle(&mut self, msg: RemovePermanentSlot, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        let keys = self.keys.clone();
        Box::pin(
            async move { store::remove_permanent_slot(&client, &keys, &msg.name).await }
                .into_actor(self),
        )
    }
}

impl Handler<Pause> for FailoverActor {
    type Result = Reply<()>;

    fn handle(&mut self, _: Pause, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        let key = self.keys.pause();
        let by = self.config.node_name.clone();
        Box::pin(
            async move {
                let value = serde_json::json!({ "by": by, "at": store::unix_now() }).to_string();
                client.put(key.as_bytes(), value.as_bytes(), None).await?;
                Ok(())
            }
            .into_actor(self)
            .map(|result, act, _| {
                if result.is_ok() {
                    let was_paused = std::mem::replace(&mut act.cluster.paused, true);
                    act.note_pause(was_paused);
                }
                result
            }),
        )
    }
}

impl Handler<Resume> for FailoverActor {
    type Result = Reply<()>;

    fn handle(&mut self, _: Resume, _: &mut Context<Self>) -> Self::Result {
        let client = self.client.clone();
        let key = self.keys.pause();
        Box::pin(
            async move {
                client.delete_range(&KeyRange::key(key)).await?;
                Ok(())
            }
            .into_actor(self),
        )
    }
}

impl Handler<StopFailover> for FailoverActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: StopFailover, _: &mut Context<Self>) -> Self::Result {
        self.stop(msg.release)
    }
}

impl Handler<SubscribeLeadership> for FailoverActor {
    type Result = MessageResult<SubscribeLeadership>;

    fn handle(&mut self, _: SubscribeLeadership, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.leadership.subscribe())
    }
}
