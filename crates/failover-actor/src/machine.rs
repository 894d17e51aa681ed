//! The election's decisions as plain functions of what the actor observed: no I/O, no
//! clock of its own (the caller passes `now` and the instants it measured), so every rule is
//! unit-tested here and the actor only carries the decisions out.
//!
//! Four parts:
//! - [`decide`]: from the leader key, the members, `sync`, `pause`, `switchover` and the
//!   node's own state, what to do about leadership: campaign (perhaps after asking the
//!   peers), lead (promote or just grant), follow the leader, drop the fence, or nothing;
//!   beside it which watched change calls for a decision ([`calls_for_decision`]), why a
//!   campaign is made ([`campaign_reason`]) and whom a switchover picks
//!   ([`switchover_candidate`]).
//! - The fence's deadline and the renewal's schedule ([`after_renewal`], [`fence_deadline`],
//!   [`effective_ttl`], [`renewal_interval`], [`next_renewal`], [`retry_delay`]).
//! - [`plan_sync`]: the loss-free order of changing the synchronous standby, and a new
//!   leader's hold on appends until it has one ([`hold_for_sync`]).
//! - [`SlotAbsences`]: which member slots the leader holds, and when a departed member's
//!   slot goes.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use wal_storage::Lsn;
use walsender_actor::status::{WalSenderState, WalSenderStatus};
use walsender_actor::syncrep::{SyncMethod, SyncStandbyNames};

use crate::config::{FailoverConfig, SynchronousMode};
use crate::keys::{KeyKind, SwitchoverRecord, SyncRecord};
use crate::slot_names::member_slot_name;
use crate::view::MemberInfo;

/// The leader key as read or watched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderKey {
    pub holder: String,
    /// The key's create revision.
    pub term: u64,
    /// The lease it is attached to.
    pub lease: i64,
}

/// What the node is, as its supervisor reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalRole {
    Primary,
    Standby,
}

/// The node's own state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Local {
    pub role: LocalRole,
    pub timeline: u32,
    pub flush: Lsn,
    pub streaming: bool,
}

/// The cluster as the actor last saw it in etcd.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cluster {
    pub leader: Option<LeaderKey>,
    pub members: BTreeMap<String, MemberInfo>,
    pub sync: Option<SyncRecord>,
    pub paused: bool,
    pub switchover: Option<SwitchoverRecord>,
    /// The last leader's published position, kept after its member key is gone (it goes with
    /// the leader's lease, together with the leader key).
    pub last_leader: Option<LeaderPosition>,
    /// The permanent slots (`slots/<name>`), with the position the leader last wrote.
    pub permanent_slots: BTreeMap<String, Option<Lsn>>,
    /// Whether `history/` holds any term: without one the cluster is bootstrapping.
    pub has_history: bool,
    /// The highest term `history/` holds: the last leader's, since a winner records its term
    /// before it acknowledges anything.
    pub latest_term: u64,
}

/// Where the last known leader was, from its member key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderPosition {
    pub name: String,
    pub timeline: u32,
    pub flush: Lsn,
}

/// What this actor has done so far (kept by the actor, updated as actions complete).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// This node's own lease.
    pub lease: Option<i64>,
    /// The term this node leads (it won the key and took it up).
    pub leading: Option<u64>,
    /// The leader and term this node follows (its supervisor accepted `FollowLeader`).
    pub following: Option<(String, u64)>,
    /// The highest term seen: an older one is refused.
    pub highest_term: u64,
}

/// What to do about leadership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create the leader key on our lease if it is absent.
    Campaign,
    /// Ask the other members' admin API for their position, then campaign unless [`better_peer`] names one.
    CheckPeers,
    /// We hold the key for `term`: promote first if the node is a standby, record the term in
    /// the history, confirm the key and grant the fence.
    Lead { term: u64, promote: bool },
    /// Follow `leader` at `conninfo`, in `term`.
    Follow {
        leader: String,
        conninfo: String,
        term: u64,
    },
    /// Stop acknowledging at once: the key is gone or someone else holds it.
    RevokeFence,
    /// Nothing to do, and why (for the log).
    Wait(&'static str),
}

/// The leadership decision for one observation.
pub fn decide(
    config: &FailoverConfig,
    cluster: &Cluster,
    local: &Local,
    progress: &Progress,
) -> Vec<Action> {
    let me = config.node_name.as_str();
    let mut actions = Vec::new();
    match &cluster.leader {
        Some(key) if key.holder == me && Some(key.lease) == progress.lease => {
            if progress.leading != Some(key.term) {
                actions.push(Action::Lead {
                    term: key.term,
                    promote: local.role == LocalRole::Standby,
                });
            }
        }
        Some(key) if key.holder == me => {
            // An earlier life of this node holds the key on a lease this process cannot renew;
            // it expires within the ttl, and the watch sees the deletion.
            if progress.leading.is_some() {
                actions.push(Action::RevokeFence);
            }
            actions.push(Action::Wait(
                "the leader key is on an earlier lease of this node",
            ));
        }
        Some(key) => {
            if progress.leading.is_some() {
                actions.push(Action::RevokeFence);
            }
            if key.term < progress.highest_term {
                actions.push(Action::Wait("the leader key's term is older than one seen"));
            } else if progress.following.as_ref() == Some(&(key.holder.clone(), key.term)) {
                // Already following this leader in this term.
            } else if cluster.paused && local.role == LocalRole::Primary {
                actions.push(Action::Wait("paused: a primary is not demoted"));
            } else {
                match cluster.members.get(&key.holder) {
                    // Only a leader that has taken up its term (promoted, its member key
                    // saying so): following it earlier compares this node's WAL with a
                    // history that does not yet hold the new timeline's fork, so a tail
                    // past the fork would be kept and streaming could never resume.
                    Some(member) if member.role == "primary" && member.term == Some(key.term) => {
                        actions.push(Action::Follow {
                            leader: key.holder.clone(),
                            conninfo: member.conninfo.clone(),
                            term: key.term,
                        })
                    }
                    Some(_) => {
                        actions.push(Action::Wait("the leader has not taken up its term yet"))
                    }
                    None => actions.push(Action::Wait("the leader has no member key yet")),
                }
            }
        }
        None => {
            if progress.leading.is_some() {
                actions.push(Action::RevokeFence);
            }
            actions.push(match may_campaign(config, cluster, local) {
                Ok(true) => Action::CheckPeers,
                Ok(false) => Action::Campaign,
                Err(reason) => Action::Wait(reason),
            });
        }
    }
    actions
}

/// Whether this node may campaign for a free leader key: `Ok(true)` if it may once no peer
/// is ahead of it, `Ok(false)` if it may at once, `Err` with why not.
pub fn may_campaign(
    config: &FailoverConfig,
    cluster: &Cluster,
    local: &Local,
) -> Result<bool, &'static str> {
    let me = config.node_name.as_str();
    if cluster.paused {
        return Err("paused");
    }
    if config.nofailover {
        return Err("nofailover");
    }
    if config.priority == 0 {
        return Err("priority 0");
    }
    if let Some(switchover) = &cluster.switchover {
        // A handover names its candidate; the old leader made sure it caught up (or the
        // operator forced it).
        return if switchover.to == me {
            Ok(false)
        } else {
            Err("a switchover names another candidate")
        };
    }
    if !cluster.has_history && local.role == LocalRole::Standby {
        return Err("bootstrap: only a primary takes the first term");
    }
    if config.synchronous_mode != SynchronousMode::Off {
        if let Some(sync) = &cluster.sync {
            // A record of an earlier term says nothing of what the last leader acknowledged:
            // every leader in a synchronous mode publishes its own record before it
            // acknowledges an append, so an older one means nobody is known to hold them all.
            if sync.term < cluster.latest_term {
                return Err("synchronous mode: the published synchronous standby is of an older term than the last leader's");
            }
            // Only the published synchronous standby has every acknowledged append; the
            // leader that published it had them too.
            return match &sync.sync_standby {
                Some(name) if name == me => Ok(false),
                _ if sync.leader == me => Ok(false),
                Some(_) => Err("synchronous mode: another member is the synchronous standby"),
                None => Err("synchronous mode: no synchronous standby is published"),
            };
        }
    }
    if let Some(last) = &cluster.last_leader {
        if last.name != me {
            if local.role == LocalRole::Primary && local.timeline < last.timeline {
                return Err("a primary on an older timeline than the last leader's");
            }
            if last.flush.saturating_sub(local.flush) > config.maximum_lag_on_failover {
                return Err("further behind the last leader than maximum_lag_on_failover");
            }
        }
    }
    Ok(true)
}

/// One member's position as its admin API answered (or as this node knows its own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerPosition {
    pub name: String,
    pub role: LocalRole,
    pub timeline: u32,
    pub flush: Lsn,
    pub priority: u32,
    pub nofailover: bool,
}

/// Whether `a` should win over `b`: the higher timeline, then the higher flush position,
/// then a primary over a standby (at bootstrap it has the data directory the standbys copied),
/// then the higher priority, then the smaller name.
pub fn rank(a: &PeerPosition, b: &PeerPosition) -> Ordering {
    a.timeline
        .cmp(&b.timeline)
        .then(a.flush.cmp(&b.flush))
        .then((a.role == LocalRole::Primary).cmp(&(b.role == LocalRole::Primary)))
        .then(a.priority.cmp(&b.priority))
        .then(b.name.cmp(&a.name))
}

/// After asking the peers: the name of an eligible live peer that should win instead of us,
/// if any (unreachable peers are left out by the caller, as Patroni does).
pub fn better_peer<'p>(me: &PeerPosition, peers: &'p [PeerPosition]) -> Option<&'p str> {
    peers
        .iter()
        .filter(|p| p.name != me.name && !p.nofailover && p.priority > 0)
        .filter(|p| rank(p, me) == Ordering::Greater)
        .max_by(|a, b| rank(a, b))
        .map(|p| p.name.as_str())
}

/// How much earlier than the lease's own expiry the fence closes: a tenth of the ttl, at
/// least 500 ms (a guess covering clock-rate differences and the time etcd takes to see the
/// renewal), never more than half the ttl.
pub fn fence_margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(500)).min(ttl / 2)
}

/// Until when a leader may acknowledge after a renewal confirmed: from the instant the
/// renewal request was sent (the lease was renewed no earlier), plus the ttl, minus the
/// margin.
pub fn fence_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl - fence_margin(ttl)
}

/// How often the lease is renewed: a third of the ttl (a guess, Patroni's loop is a third
/// of its ttl too), so two renewals can fail before the fence's deadline.
pub fn renewal_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// Whether a lease with `remaining` of its `granted` seconds left, as etcd reports them
/// (whole seconds, rounded up), is being renewed. Its holder renews every third of the ttl
/// and retries a failure within a tenth of it, so a live holder's lease never has less than
/// the ttl minus a renewal interval left; one more second covers etcd's rounding. Less
/// than that, and renewals have been missed: the holder is cut off, stopped or dead, and its
/// keys go when the lease runs out.
pub fn lease_renewing(remaining: i64, granted: i64) -> bool {
    let granted = granted.max(1) as f64;
    remaining as f64 >= granted - granted / 3.0 - 1.0
}

/// The delay before the `attempt`th retry of a failed renewal (from 0): 100 ms doubling,
/// capped at a tenth of the ttl (guesses: quick enough that a short etcd hiccup costs no
/// acknowledgement, slow enough not to flood a struggling etcd).
pub fn retry_delay(attempt: u32, ttl: Duration) -> Duration {
    let cap = (ttl / 10).max(Duration::from_millis(100));
    Duration::from_millis(100)
        .saturating_mul(1u32 << attempt.min(10))
        .min(cap)
}

/// The ttl the fence's deadline and the renewals are computed with: the configured one, or
/// the one etcd granted if lower (`granted_secs`, etcd's whole seconds), never under a
/// second.
pub fn effective_ttl(configured: Duration, granted_secs: i64) -> Duration {
    let granted = Duration::from_secs(u64::try_from(granted_secs).unwrap_or(0));
    configured.min(granted.max(Duration::from_secs(1)))
}

/// What a renewal's answer means for the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewed {
    /// The transaction found the key ours on our lease: acknowledge until `until`.
    Grant { term: u64, until: Instant },
    /// The transaction found the key not ours: stop acknowledging at once.
    StepDown { term: u64 },
    /// A follower's renewal, or a leader's that grants nothing now: the term it confirmed is
    /// no longer the one led, or a handover began while it ran.
    Nothing,
}

/// The fencing rule applied to one renewal: `confirmed` is the term the renewal's
/// transaction checked and whether the key held (`None`: a follower's renewal, which checks
/// nothing), `leading` and `handing_over` are the actor's state when the answer came, and
/// `sent_at` is when the keepalive was sent, the earliest the lease can have been renewed.
pub fn after_renewal(
    confirmed: Option<(u64, bool)>,
    leading: Option<u64>,
    handing_over: bool,
    sent_at: Instant,
    ttl: Duration,
) -> Renewed {
    match confirmed {
        Some((term, true)) if leading == Some(term) && !handing_over => Renewed::Grant {
            term,
            until: fence_deadline(sent_at, ttl),
        },
        Some((term, false)) => Renewed::StepDown { term },
        _ => Renewed::Nothing,
    }
}

/// How long after an answer the next renewal is sent: a renewal interval after the last one
/// was sent (`since_sent` ago), or within `sooner` if a round asked to look again soon.
pub fn next_renewal(ttl: Duration, since_sent: Duration, sooner: Option<Duration>) -> Duration {
    let next = renewal_interval(ttl).saturating_sub(since_sent);
    sooner.map_or(next, |s| next.min(s))
}

/// Why `me` campaigns, for the history's record of the term, as things stand before the
/// campaign (once the key is won the watch shows `me` as the last leader and the handover as
/// ended).
pub fn campaign_reason(cluster: &Cluster, me: &str) -> &'static str {
    if cluster.switchover.is_some() {
        "switchover"
    } else if !cluster.has_history {
        "bootstrap"
    } else if cluster.last_leader.as_ref().is_some_and(|l| l.name == me) {
        "restart"
    } else {
        "failover"
    }
}

/// Whether a watched change of the key `kind` calls for a decision, judged on the cluster as
/// known before the change: the leader key, `sync`, `pause`, `switchover`, the leader's member
/// key, and any member key while there is no leader (the candidates weigh each other).
/// Members' routine refreshes do not.
pub fn calls_for_decision(kind: &KeyKind<'_>, cluster: &Cluster) -> bool {
    match kind {
        KeyKind::Leader | KeyKind::Sync | KeyKind::Pause | KeyKind::Switchover => true,
        KeyKind::Member(name) => cluster.leader.as_ref().is_none_or(|l| l.holder == *name),
        // A permanent slot changes the slots, not who leads (`permanent.rs`).
        KeyKind::History | KeyKind::Slot(_) | KeyKind::Other => false,
    }
}

/// The most advanced eligible standby by the member keys (what each member last published),
/// for a switchover that names no candidate.
pub fn switchover_candidate(
    members: &BTreeMap<String, MemberInfo>,
    leader: &str,
) -> Option<String> {
    let candidates: Vec<SyncCandidate> = members
        .values()
        .filter(|m| m.name != leader && m.role == "standby")
        .filter_map(|m| {
            Some(SyncCandidate {
                name: m.name.clone(),
                connected: m.streaming,
                flush: m.flush_lsn.parse().ok()?,
                priority: m.priority,
                nofailover: m.nofailover,
            })
        })
        .collect();
    best_sync_candidate(&candidates, None).map(|c| c.name.clone())
}

/// A standby the leader could count on for synchronous appends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncCandidate {
    pub name: String,
    /// Whether its walsender is streaming or catching up: choosing one that catches up is
    /// loss-free, since it is published only once its flush reaches the leader's.
    pub connected: bool,
    pub flush: Lsn,
    pub priority: u32,
    pub nofailover: bool,
}

impl SyncCandidate {
    /// Whether it may be the synchronous standby: connected, not marked `nofailover`, and
    /// with a priority above 0.
    fn eligible(&self) -> bool {
        self.connected && !self.nofailover && self.priority > 0
    }
}

/// Where a change of synchronous standby stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SyncPhase {
    /// The published standby is the one the node counts on (or none is).
    #[default]
    Steady,
    /// The node counts on `to` (and `from` too, if any); `to` is published once its flush
    /// reaches `target`, the leader's flush position when the change began.
    Adding {
        to: String,
        from: Option<String>,
        target: Lsn,
    },
}

/// One step of a change of synchronous standby, carried out in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncAction {
    /// `SetSyncStandbys` on the node.
    Set(Option<SyncStandbyNames>),
    /// Write `sync` (guarded by the leader key).
    Publish(Option<String>),
}

fn first(names: &[&str]) -> Option<SyncStandbyNames> {
    Some(SyncStandbyNames {
        method: SyncMethod::First,
        num_sync: names.len(),
        names: names.iter().map(|n| n.to_string()).collect(),
    })
}

/// What a new leader in strict mode counts on before it has chosen a standby: one standby
/// out of none, which nobody satisfies, so appends wait rather than go on asynchronously.
pub fn strict_hold() -> SyncStandbyNames {
    SyncStandbyNames {
        method: SyncMethod::First,
        num_sync: 1,
        names: Vec::new(),
    }
}

/// The best standby to count on: eligible (connected), the most advanced, then the higher
/// priority, then the smaller name.
pub fn best_sync_candidate<'c>(
    candidates: &'c [SyncCandidate],
    except: Option<&str>,
) -> Option<&'c SyncCandidate> {
    candidates
        .iter()
        .filter(|c| c.eligible())
        .filter(|c| Some(c.name.as_str()) != except)
        .max_by(|a, b| {
            a.flush
                .cmp(&b.flush)
                .then(a.priority.cmp(&b.priority))
                .then(b.name.cmp(&a.name))
        })
}

/// The next steps of the synchronous standby's management on the leader, in a loss-free
/// order: a standby counts for acknowledgements before it is published, and is published
/// only once it has everything the leader had flushed when it began to count; the old one
/// stops counting only after the new one is published. `published` is what `sync` says for
/// this leader's term.
pub fn plan_sync(
    mode: SynchronousMode,
    phase: &SyncPhase,
    published: Option<&str>,
    candidates: &[SyncCandidate],
    leader_flush: Lsn,
) -> (SyncPhase, Vec<SyncAction>) {
    if mode == SynchronousMode::Off {
        return (SyncPhase::Steady, Vec::new());
    }
    let eligible = |name: &str| candidates.iter().any(|c| c.name == name && c.eligible());
    if let SyncPhase::Adding { to, from, target } = phase {
        let caught_up = candidates
            .iter()
            .any(|c| &c.name == to && c.connected && c.flush >= *target);
        if caught_up {
            let mut actions = vec![SyncAction::Publish(Some(to.clone()))];
            if from.is_some() {
                actions.push(SyncAction::Set(first(&[to])));
            }
            return (SyncPhase::Steady, actions);
        }
        if eligible(to) {
            return (phase.clone(), Vec::new());
        }
        // The standby being added is gone: start over from what is published. With nothing
        // published strict mode keeps the node's waiting setting; `on` lets appends go on
        // asynchronously unless another standby is chosen.
        let (next, mut actions) = plan_sync(
            mode,
            &SyncPhase::Steady,
            published,
            candidates,
            leader_flush,
        );
        if actions.is_empty() {
            match published {
                // Back to counting on the published one alone (loss-free: it is published).
                Some(p) => actions.push(SyncAction::Set(first(&[p]))),
                None if mode == SynchronousMode::On => actions.push(SyncAction::Set(None)),
                None => {}
            }
        }
        return (next, actions);
    }
    match published {
        Some(current) if eligible(current) => (SyncPhase::Steady, Vec::new()),
        Some(current) => match best_sync_candidate(candidates, Some(current)) {
            Some(next) => (
                SyncPhase::Adding {
                    to: next.name.clone(),
                    from: Some(current.to_string()),
                    target: leader_flush,
                },
                vec![SyncAction::Set(first(&[current, &next.name]))],
            ),
            None if mode == SynchronousMode::On => (
                SyncPhase::Steady,
                vec![SyncAction::Publish(None), SyncAction::Set(None)],
            ),
            None => (SyncPhase::Steady, Vec::new()),
        },
        None => match best_sync_candidate(candidates, None) {
            Some(next) => (
                SyncPhase::Adding {
                    to: next.name.clone(),
                    from: None,
                    target: leader_flush,
                },
                vec![SyncAction::Set(first(&[&next.name]))],
            ),
            None => (SyncPhase::Steady, Vec::new()),
        },
    }
}

/// Since when each member slot's member has had no key: the member slots' policy (see
/// `slots.rs`), with time passed in. A slot is kept while its member has a key and for a grace
/// after the key went; a held slot of a member never seen counts its absence from when it is
/// first seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotAbsences {
    /// By slot name.
    since: HashMap<String, Instant>,
}

impl SlotAbsences {
    /// The member keys went from `before` to `members`: the absence of each departed
    /// member's slot starts at `now` (unless it had started already), that of each present
    /// member's ends. Whether the set of members changed.
    pub fn note_members(
        &mut self,
        before: &BTreeSet<String>,
        members: &BTreeMap<String, MemberInfo>,
        now: Instant,
    ) -> bool {
        let mut changed = false;
        for gone in before.iter().filter(|n| !members.contains_key(*n)) {
            changed = true;
            if let Some(slot) = member_slot_name(gone) {
                self.since.entry(slot).or_insert(now);
            }
        }
        for name in members.keys() {
            changed |= !before.contains(name);
            if let Some(slot) = member_slot_name(name) {
                self.since.remove(&slot);
            }
        }
        changed
    }

    /// The slots a leader `me` must hold: every other member with a key, and every member
    /// whose key went less than `grace` before `now`.
    pub fn wanted(
        &self,
        members: &BTreeMap<String, MemberInfo>,
        me: &str,
        grace: Duration,
        now: Instant,
    ) -> Vec<String> {
        let mut wanted: BTreeSet<String> =
            members.keys().filter_map(|n| member_slot_name(n)).collect();
        wanted.extend(
            self.since
                .iter()
                .filter(|(_, since)| now.saturating_duration_since(**since) < grace)
                .map(|(slot, _)| slot.clone()),
        );
        if let Some(mine) = member_slot_name(me) {
            wanted.remove(&mine);
        }
        wanted.into_iter().collect()
    }

    /// Of the member slots `held`, those to drop at `now`: `me`'s own (nobody streams from
    /// itself), and those whose member has been gone for `grace` or longer. A held slot of a
    /// member never seen starts its absence now; the absences of slots no longer held and
    /// past the grace are forgotten.
    pub fn expired(
        &mut self,
        held: &[String],
        members: &BTreeMap<String, MemberInfo>,
        me: &str,
        grace: Duration,
        now: Instant,
    ) -> Vec<String> {
        let present: BTreeSet<String> = members
            .keys()
            .filter(|n| *n != me)
            .filter_map(|n| member_slot_name(n))
            .collect();
        let mine = member_slot_name(me);
        let mut expired = Vec::new();
        for slot in held {
            if Some(slot) == mine.as_ref() {
                expired.push(slot.clone());
            } else if !present.contains(slot) {
                let since = *self.since.entry(slot.clone()).or_insert(now);
                if now.saturating_duration_since(since) >= grace {
                    expired.push(slot.clone());
                }
            }
        }
        self.since.retain(|slot, since| {
            held.contains(slot) || now.saturating_duration_since(*since) < grace
        });
        expired
    }

    /// How long after `now` the earliest grace among the `held` slots' absences ends: when
    /// the leader looks again, to drop that slot.
    pub fn next_expiry(&self, held: &[String], grace: Duration, now: Instant) -> Option<Duration> {
        self.since
            .iter()
            .filter(|(slot, _)| held.contains(slot))
            .map(|(_, since)| grace.saturating_sub(now.saturating_duration_since(*since)))
            .min()
    }
}

/// The leader's walsenders as candidates for the synchronous standby, with what their member
/// keys say of them (a walsender with no member key is not eligible).
pub fn sync_candidates(
    replication: &[WalSenderStatus],
    members: &BTreeMap<String, MemberInfo>,
) -> Vec<SyncCandidate> {
    replication
        .iter()
        .map(|r| {
            let member = members.get(&r.application_name);
            SyncCandidate {
                name: r.application_name.clone(),
                // A standby still catching up counts as connected: choosing it is loss-free
                // (it is published only once it has caught up), and one that had just
                // reconnected was otherwise taken for gone and the choice undone.
                connected: matches!(r.state, WalSenderState::Streaming | WalSenderState::Catchup),
                flush: r.flush_lsn.unwrap_or(Lsn(0)),
                priority: member.map_or(0, |m| m.priority),
                nofailover: member.is_none_or(|m| m.nofailover),
            }
        })
        .collect()
}

/// One round of the synchronous standby's management, after the new leader's hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncRound {
    pub actions: Vec<SyncAction>,
    /// `on` gave up waiting for a first standby: appends go on asynchronously.
    pub gave_up: bool,
    /// The hold ends once these actions are carried out.
    pub releases_hold: bool,
    /// The hold is young: look again soon rather than a renewal interval later.
    pub recheck_soon: bool,
}

/// A new leader in a synchronous mode holds appends until it has published a synchronous
/// standby of its own; `held_for` is how long it has held them (`None`: no hold), `next` and
/// `actions` what [`plan_sync`] planned. Its standbys follow it within milliseconds of its
/// win (and each reconnects once as it does), so while the hold is young (under one renewal
/// interval) it looks again soon and does not take a standby that just reconnected for gone;
/// in `on` it gives up after that and goes on asynchronously: the term's record names no
/// standby, so nobody becomes promotable. The hold ends once a standby of this term is
/// published, or when `on` gives up.
pub fn hold_for_sync(
    mode: SynchronousMode,
    next: &SyncPhase,
    mut actions: Vec<SyncAction>,
    held_for: Option<Duration>,
    ttl: Duration,
) -> SyncRound {
    let mut gave_up = false;
    let mut recheck_soon = false;
    if let Some(held_for) = held_for {
        let young = held_for < renewal_interval(ttl);
        if young && actions == [SyncAction::Set(None)] {
            actions = vec![SyncAction::Set(Some(strict_hold()))];
        }
        let adding = matches!(next, SyncPhase::Adding { .. });
        if actions.is_empty() && !adding && !young && mode == SynchronousMode::On {
            actions.push(SyncAction::Set(None));
            gave_up = true;
        }
        recheck_soon = young;
    }
    let releases_hold = gave_up
        || actions
            .iter()
            .any(|a| matches!(a, SyncAction::Publish(Some(_))));
    SyncRound {
        actions,
        gave_up,
        releases_hold,
        recheck_soon,
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
