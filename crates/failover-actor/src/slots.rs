//! Member slots: the leader holds a physical replication slot for every other member, and each
//! member streams through its own, so that the WAL a member behind or down still needs stays
//! on the leader (with `wal_keep_size` 0 nothing else keeps it, and a member that finds its
//! WAL removed can never catch up). As Patroni's `use_slots`.
//!
//! - Names: [`member_slot_name`] (`slot_names.rs`), one injective mapping from a member's
//!   name to a valid PostgreSQL slot name under [`MEMBER_SLOT_PREFIX`]. Only slots with the
//!   prefix are managed; any other slot is never touched.
//! - The leader ensures a slot for every member whose key it sees, and for every member whose
//!   key went less than the grace ago ([`member_slot_grace`]): a crashed primary's key goes
//!   with its lease, together with the leader key, and its slot must exist on the new leader
//!   when it comes back. It does so right after the promotion, before the
//!   fence is granted (so before any append can switch segments, where retention runs), and
//!   again at each reconciliation (a member key appeared or went).
//! - A held member slot whose member has been gone for longer than the grace is dropped, so a
//!   removed member does not fill the disk; `max_slot_wal_keep_size` bounds every slot
//!   meanwhile. A slot this actor has never seen a member for (the leader restarted) counts
//!   its absence from when it is first seen.
//! - A node that follows drops every member slot it holds: under failover every member
//!   streams from the leader, never from a standby, so such a slot (left from leading) would
//!   only keep WAL on the standby forever. It is made again if the node leads again.
//!
//! The slot operations are the supervisor's ([`EnsureMemberSlots`], [`DropMemberSlots`], on a
//! blocking thread); which slots, and when, is [`SlotAbsences`]' (a pure policy with time
//! passed in); this module carries it out, one round at a time.
//!
//! [`member_slot_grace`]: crate::config::FailoverConfig::member_slot_grace

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use actix::prelude::*;
use supervisor_actor::{DropMemberSlots, EnsureMemberSlots, MemberSlots};
use tracing::{info, warn};

use crate::actor::FailoverActor;
use crate::messages::SubscribeMemberSlots;
use crate::outage::Quoted;
use crate::slot_names::MEMBER_SLOT_PREFIX;

/// How long a leader waits before trying again a slot operation that failed (storage full or
/// restarting, say). A guess: storage's own restarts and a full disk's retries are on the
/// order of a second.
pub(crate) const SLOT_RETRY: Duration = Duration::from_secs(1);

impl Handler<SubscribeMemberSlots> for FailoverActor {
    type Result = MessageResult<SubscribeMemberSlots>;

    fn handle(&mut self, _: SubscribeMemberSlots, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.slots.held.subscribe())
    }
}

impl FailoverActor {
    /// Called after the known member keys changed from `before`: starts or ends the absence
    /// of each member's slot. Whether the set of members changed.
    pub(crate) fn note_members(&mut self, before: &BTreeSet<String>) -> bool {
        self.slots
            .absences
            .note_members(before, &self.cluster.members, Instant::now())
    }

    /// The member names known now, for [`FailoverActor::note_members`].
    pub(crate) fn member_names(&self) -> BTreeSet<String> {
        self.cluster.members.keys().cloned().collect()
    }

    /// The slots the leader must hold: every other member with a key, and every member whose
    /// key went less than the grace ago.
    pub(crate) fn wanted_slots(&self) -> Vec<String> {
        if !self.config.use_slots {
            return Vec::new();
        }
        let grace = self.config.member_slot_grace();
        self.slots
            .absences
            .wanted(&self.cluster.members, self.me(), grace, Instant::now())
    }

    /// The leader's round: ensure the wanted slots, drop those whose member has been gone for
    /// longer than the grace, and look again when the next grace ends. One round at a time.
    pub(crate) fn manage_slots(&mut self, ctx: &mut Context<Self>) {
        if !self.config.use_slots || self.progress.leading.is_none() {
            return;
        }
        if !self.slots.round.ask() {
            return;
        }
        let ensure = EnsureMemberSlots {
            names: self.wanted_slots(),
            prefix: MEMBER_SLOT_PREFIX.to_string(),
        };
        let supervisor = self.node.supervisor.clone();
        ctx.spawn(
            async move { supervisor.send(ensure).await }
                .into_actor(self)
                .then(|answer, act, _| {
                    let held = match answer {
                        Ok(Ok(slots)) => {
                            act.slots_changed("made", &slots);
                            slots.held
                        }
                        Ok(Err(e)) => {
                            if !act.slots.failing {
                                warn!(error = %Quoted(&e), "failover: cannot make the member slots; trying again every {} s", SLOT_RETRY.as_secs());
                            }
                            act.slots.failed = true;
                            Vec::new()
                        }
                        Err(e) => {
                            warn!(error = %Quoted(&e), "failover: the supervisor is gone");
                            Vec::new()
                        }
                    };
                    let expired = act.expired_slots(&held);
                    let supervisor = act.node.supervisor.clone();
                    async move {
                        if expired.is_empty() {
                            return None;
                        }
                        let drop = DropMemberSlots {
                            names: expired,
                            prefix: MEMBER_SLOT_PREFIX.to_string(),
                        };
                        Some(supervisor.send(drop).await)
                    }
                    .into_actor(act)
                })
                .map(|dropped, act, ctx| {
                    match dropped {
                        Some(Ok(Ok(slots))) => act.slots_changed("dropped", &slots),
                        Some(Ok(Err(e))) => {
                            if !act.slots.failing {
                                warn!(error = %Quoted(&e), "failover: cannot drop a departed member's slot; trying again every {} s", SLOT_RETRY.as_secs());
                            }
                            act.slots.failed = true;
                        }
                        Some(Err(e)) => warn!(error = %Quoted(&e), "failover: the supervisor is gone"),
                        None => {}
                    }
                    let again = act.slots.round.finish();
                    if act.slots.failing && !act.slots.failed {
                        info!("failover: member slots managed again");
                    }
                    act.slots.failing = act.slots.failed;
                    act.schedule_slot_look(ctx);
                    if again {
                        act.manage_slots(ctx);
                    }
                }),
        );
    }

    /// Of the member slots held, those to drop now: this node's own (nobody streams from
    /// itself), and those whose member has been gone for longer than the grace. A held slot
    /// of a member never seen starts its absence now.
    fn expired_slots(&mut self, held: &[String]) -> Vec<String> {
        let grace = self.config.member_slot_grace();
        let me = &self.config.node_name;
        self.slots
            .absences
            .expired(held, &self.cluster.members, me, grace, Instant::now())
    }

    /// A timer for the earliest end of a grace among the absent members' slots (a real
    /// timeout, the moment a slot is to be dropped), or for the retry of a failed operation.
    fn schedule_slot_look(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.slots.timer.take() {
            ctx.cancel_future(h);
        }
        let grace = self.config.member_slot_grace();
        let held = self.slots.held.borrow().clone().unwrap_or_default();
        let failed = std::mem::take(&mut self.slots.failed).then_some(SLOT_RETRY);
        let expiry = self
            .slots
            .absences
            .next_expiry(&held, grace, Instant::now());
        let next = expiry.into_iter().chain(failed).min();
        if let Some(wait) = next {
            // A little past the end, so that the round finds the grace over.
            let wait = wait + Duration::from_millis(10);
            self.slots.timer = Some(ctx.run_later(wait, |act, ctx| {
                act.slots.timer = None;
                act.manage_slots(ctx);
            }));
        }
    }

    /// Logs what a slot operation did and publishes the slots held.
    fn slots_changed(&mut self, what: &str, slots: &MemberSlots) {
        if !slots.changed.is_empty() {
            info!(slots = %slots.changed.join(","), "failover: {what} member slots");
        }
        self.publish_held_slots(slots.held.clone());
    }

    pub(crate) fn publish_held_slots(&self, held: Vec<String>) {
        self.slots.held.send_if_modified(|h| {
            let changed = h.as_ref() != Some(&held);
            *h = Some(held);
            changed
        });
    }

    /// After following a leader: drop every member slot this node holds (see the module).
    pub(crate) fn drop_slots_as_follower(&mut self, ctx: &mut Context<Self>) {
        if !self.config.use_slots {
            return;
        }
        let supervisor = self.node.supervisor.clone();
        let prefix = MEMBER_SLOT_PREFIX.to_string();
        ctx.spawn(
            async move {
                let listed = supervisor
                    .send(EnsureMemberSlots {
                        names: Vec::new(),
                        prefix: prefix.clone(),
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                if listed.held.is_empty() {
                    return Ok(listed);
                }
                supervisor
                    .send(DropMemberSlots {
                        names: listed.held,
                        prefix,
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())
            }
            .into_actor(self)
            .map(|result: Result<MemberSlots, String>, act, _| match result {
                Ok(slots) => act.slots_changed("dropped (following)", &slots),
                Err(e) => warn!(error = %Quoted(&e), "failover: cannot drop the member slots of a follower"),
            }),
        );
    }
}
