//! Permanent slots: physical replication slots named in the cluster's configuration in etcd
//! (`slots/<name>`, as Patroni's `slots:`), which exist on whichever member leads, so that a
//! client streaming through one (pg_receivewal `--slot`) keeps its retention through
//! switchovers and failovers.
//!
//! - The leader makes each one it lacks (from its flushed end, as PostgreSQL's
//!   `pg_create_physical_replication_slot(name, true)`; a slot of that name made by a client
//!   is the same slot, adopted as it is) and writes its position into the slot's key as the
//!   client confirms WAL. It makes them at promotion before its fence is granted, so before
//!   any append, and so before any segment switch, where retention runs.
//! - A position is written when storage says a slot's restart point entered another segment
//!   ([`wal_storage::Wal::slot_moves`], an event, not a poll): retention counts in whole
//!   segments, so a copy one segment behind holds everything the slot holds, and a write per
//!   segment keeps etcd's load small.
//! - Every standby keeps a copy of each slot at the position the key says, so its own
//!   retention keeps the segments the slot needs. The copy is only ever at or behind the
//!   leader's slot (the leader writes positions its client already confirmed), so the
//!   segments a copy keeps are at least those the client still needs. When a standby leads,
//!   its copy is the slot; the client resumes on it.
//! - Etcd and not the replication stream carries the positions: every member already watches
//!   the cluster's prefix, the key outlives any member (a standby that was down reads it when
//!   it comes back), and the stream would need a message PostgreSQL's protocol does not have.
//! - A name removed from the configuration is dropped on every member that sees the removal
//!   (left if a client streams through it).
//!
//! The slot operations are the supervisor's ([`SyncPermanentSlots`], on a blocking thread);
//! what to write back is [`positions_to_write`], a pure function; one round runs at a time.

use std::collections::{BTreeMap, BTreeSet};

use actix::prelude::*;
use supervisor_actor::SyncPermanentSlots;
use tracing::{info, warn};
use wal_storage::Lsn;

use crate::actor::FailoverActor;
use crate::error::FailoverError;
use crate::keys::PermanentSlotRecord;
use crate::machine::LocalRole;
use crate::messages::SlotsMoved;
use crate::outage::Quoted;
use crate::round::Rounds;
use crate::slot_names::MEMBER_SLOT_PREFIX;
use crate::slots::SLOT_RETRY;
use crate::store;

/// What the actor knows of the permanent slots beyond what etcd says.
#[derive(Default)]
pub(crate) struct PermanentState {
    pub(crate) round: Rounds,
    /// Names seen leaving the configuration, not yet dropped here.
    pub(crate) removed: BTreeSet<String>,
    /// The last round failed: the next comes after `SLOT_RETRY`.
    pub(crate) retry: Option<SpawnHandle>,
    /// Rounds have been failing since the last success (logged once per run).
    pub(crate) failing: bool,
}

/// Checks that `name` may be a permanent slot: PostgreSQL's slot name rule, and not a member
/// slot's prefix (those are managed by membership, `slots.rs`).
pub fn check_permanent_slot_name(name: &str) -> Result<(), FailoverError> {
    if wal_storage::validate_slot_name(name).is_err() {
        return Err(FailoverError::BadSlotName(format!(
            "{name:?} is not a valid replication slot name (1 to 63 lower-case letters, digits and underscores)"
        )));
    }
    if name.starts_with(MEMBER_SLOT_PREFIX) {
        return Err(FailoverError::BadSlotName(format!(
            "{name:?} starts with {MEMBER_SLOT_PREFIX}, the prefix of the members' own slots"
        )));
    }
    Ok(())
}

/// The leader's positions to write into etcd: each slot it holds with a restart point other
/// than the one its key says. A slot that reserves nothing (invalidated) writes nothing: its
/// key keeps the last position, which holds more on the standbys, never less.
pub fn positions_to_write(
    known: &BTreeMap<String, Option<Lsn>>,
    held: &[(String, Option<Lsn>)],
) -> Vec<(String, Lsn)> {
    held.iter()
        .filter_map(|(name, at)| {
            let at = (*at)?;
            let key = known.get(name)?;
            (*key != Some(at)).then(|| (name.clone(), at))
        })
        .collect()
}

impl Handler<SlotsMoved> for FailoverActor {
    type Result = ();

    fn handle(&mut self, _: SlotsMoved, ctx: &mut Context<Self>) {
        // Only the leader's slots are written back; a standby's copies follow etcd.
        if self.progress.leading.is_some() && !self.cluster.permanent_slots.is_empty() {
            self.sync_permanent_slots(ctx);
        }
    }
}

impl FailoverActor {
    /// Follows storage's slot changes for the life of the actor (a watch that survives
    /// storage's restarts).
    pub(crate) fn watch_slot_moves(&mut self, ctx: &mut Context<Self>) {
        let moves = self.node.wal.slot_moves();
        ctx.add_message_stream(futures_util::stream::unfold(moves, |mut rx| async move {
            rx.changed().await.ok()?;
            Some((SlotsMoved, rx))
        }));
    }

    /// After the cluster's keys changed from `before`: names that left the configuration are
    /// to be dropped here, and a name that came back is not. Whether the permanent slots
    /// changed.
    pub(crate) fn note_permanent(&mut self, before: &BTreeMap<String, Option<Lsn>>) -> bool {
        let now = &self.cluster.permanent_slots;
        let added: Vec<&str> = now
            .keys()
            .filter(|n| !before.contains_key(*n))
            .map(String::as_str)
            .collect();
        if !added.is_empty() {
            info!(slots = %added.join(","), "failover: permanent slots named");
        }
        for name in before.keys().filter(|n| !now.contains_key(*n)) {
            info!(slot = %name, "failover: no longer a permanent slot; dropping it here");
            self.permanent.removed.insert(name.clone());
        }
        self.permanent.removed.retain(|n| !now.contains_key(n));
        before != now
    }

    /// Whether this node keeps copies of the permanent slots (`Some(true)`), holds them
    /// itself (`Some(false)`: it leads), or neither (a primary not leading: it is about to be
    /// demoted or to lead).
    fn permanent_role(&self) -> Option<bool> {
        if self.progress.leading.is_some() {
            return Some(false);
        }
        let standby = self
            .local
            .as_ref()
            .is_some_and(|l| l.role == LocalRole::Standby);
        (self.progress.following.is_some() || standby).then_some(true)
    }

    /// The message that makes this node's slots agree with the configuration.
    pub(crate) fn permanent_request(&self, follow: bool) -> SyncPermanentSlots {
        SyncPermanentSlots {
            slots: self
                .cluster
                .permanent_slots
                .iter()
                .map(|(name, at)| (name.clone(), *at))
                .collect(),
            drop: self.permanent.removed.iter().cloned().collect(),
            follow,
        }
    }

    /// One round: make, move or drop this node's permanent slots, and on the leader write the
    /// positions that changed. One round at a time; a change seen meanwhile runs another.
    pub(crate) fn sync_permanent_slots(&mut self, ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        let Some(follow) = self.permanent_role() else {
            return;
        };
        if self.cluster.permanent_slots.is_empty() && self.permanent.removed.is_empty() {
            return;
        }
        if !self.permanent.round.ask() {
            return;
        }
        let request = self.permanent_request(follow);
        let asked_to_drop = request.drop.clone();
        let supervisor = self.node.supervisor.clone();
        ctx.spawn(
            async move { supervisor.send(request).await }
                .into_actor(self)
                .then(move |answer, act, _| {
                    let mut writes = Vec::new();
                    let mut failed = false;
                    match answer {
                        Ok(Ok(done)) => {
                            if !done.made.is_empty() {
                                info!(slots = %done.made.join(","), "failover: made permanent slots");
                            }
                            if !done.dropped.is_empty() {
                                info!(slots = %done.dropped.join(","), "failover: dropped slots no longer permanent");
                            }
                            for name in &asked_to_drop {
                                act.permanent.removed.remove(name);
                            }
                            if act.progress.leading.is_some() && !follow {
                                writes = positions_to_write(&act.cluster.permanent_slots, &done.held);
                            }
                        }
                        Ok(Err(e)) => {
                            if !act.permanent.failing {
                                warn!(error = %Quoted(&e), "failover: cannot keep the permanent slots; trying again every {} s", SLOT_RETRY.as_secs());
                            }
                            failed = true;
                        }
                        Err(e) => warn!(error = %Quoted(&e), "failover: the supervisor is gone"),
                    }
                    let client = act.client.clone();
                    let keys = act.keys.clone();
                    let me = act.me().to_string();
                    let lease = act.lease.id;
                    let term = act.progress.leading;
                    async move {
                        let mut written = Vec::new();
                        let Some(lease) = lease else {
                            return (written, failed);
                        };
                        for (name, at) in writes {
                            let record = PermanentSlotRecord {
                                restart_lsn: Some(at),
                                term,
                            };
                            match store::put_slot_position(&client, &keys, &me, lease, &name, &record).await {
                                Ok(true) => written.push((name, at)),
                                // Not ours any more, or no longer permanent: the watch says which.
                                Ok(false) => {}
                                Err(e) => {
                                    warn!(slot = %name, error = %Quoted(&e), "failover: cannot write a permanent slot's position");
                                    failed = true;
                                }
                            }
                        }
                        (written, failed)
                    }
                    .into_actor(act)
                })
                .map(|(written, failed), act, ctx| {
                    for (name, at) in written {
                        // What the watch will say: the write brings no second round.
                        if let Some(known) = act.cluster.permanent_slots.get_mut(&name) {
                            *known = Some(at);
                        }
                    }
                    if act.permanent.failing && !failed {
                        info!("failover: permanent slots kept again");
                    }
                    act.permanent.failing = failed;
                    let again = act.permanent.round.finish();
                    if failed && act.permanent.retry.is_none() {
                        act.permanent.retry = Some(ctx.run_later(SLOT_RETRY, |act, ctx| {
                            act.permanent.retry = None;
                            act.sync_permanent_slots(ctx);
                        }));
                    }
                    if again {
                        act.sync_permanent_slots(ctx);
                    }
                }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_writes_only_positions_that_changed() {
        let known: BTreeMap<String, Option<Lsn>> = [
            ("a".to_string(), Some(Lsn(0x100))),
            ("b".to_string(), None),
            ("c".to_string(), Some(Lsn(0x300))),
        ]
        .into();
        let held = vec![
            ("a".to_string(), Some(Lsn(0x100))),
            ("b".to_string(), Some(Lsn(0x200))),
            ("c".to_string(), None),
            ("gone".to_string(), Some(Lsn(0x400))),
        ];
        assert_eq!(
            positions_to_write(&known, &held),
            vec![("b".to_string(), Lsn(0x200))],
            "an unchanged one, an invalidated one and one no longer permanent write nothing"
        );
        // A position behind the key's (a copy that lagged, now leading) is written too.
        let held = vec![("a".to_string(), Some(Lsn(0x80)))];
        assert_eq!(
            positions_to_write(&known, &held),
            vec![("a".to_string(), Lsn(0x80))]
        );
    }

    #[test]
    fn permanent_slot_names_are_checked() {
        assert!(check_permanent_slot_name("s1").is_ok());
        for bad in ["", "S1", "a-b", &"x".repeat(64), "walserver_member_n1"] {
            assert!(
                matches!(
                    check_permanent_slot_name(bad),
                    Err(FailoverError::BadSlotName(_))
                ),
                "{bad}"
            );
        }
    }
}
