//! Which WAL readers on this node see: only WAL acknowledged at the node's durability level.
//!
//! On a primary with synchronous standbys and a synchronous default durability
//! (`synchronous_commit` other than `local`), WAL is acknowledged once the synchronous standbys
//! have confirmed it at that level; before that it is durable here but may not survive a
//! failover, so [`Node::records`](crate::Node::records) (and `GET /wal`) and the node's own
//! apply consumers do not see it yet. Elsewhere (no synchronous standbys, `local`, a standby)
//! the local flush is the acknowledged end, as before.
//!
//! What the standbys confirmed is not kept across a restart: a primary restarted with
//! synchronous standbys shows its readers nothing at all, not only nothing after its start
//! (the acknowledged end is 0/0: no confirmation counts before one is heard), until they
//! confirm again, which they do as soon as they stream. Under `[failover]` in a synchronous
//! mode that is a leader restarted after a power loss, from the hold it sets while taking up
//! its term (`SetSyncStandbys`) until its synchronous member confirms. That is the safe
//! side: nothing unacknowledged is shown, and nothing shown is taken back, since a reader
//! asks from its own position and is only held there until the confirmation comes.
//!
//! Under the overlapped commit (`synchronous_commit_overlap`) the acknowledged end is the
//! commit point: on a primary it goes into storage as its own
//! ([`Wal::set_own_commit_point`]), for its walsenders to tell its standbys; on a standby
//! readers stop at the commit point its upstream told, since WAL past it may be cut back.
//!
//! The acknowledged end is a watch, recomputed on events only: a local flush, a confirmation
//! of the synchronous standbys (the registry's watch), or a change of the rule (the
//! supervisor's, on a change of role or of synchronous settings).

use tokio::sync::watch;
use wal_storage::{CommitBound, Lsn, TimelineId, Wal, WalPosition};
use walsender_actor::overlap::{commit_point, counted_up_to};
use walsender_actor::syncrep::{Confirmed, WaitLevel};

/// The rule of a node: what its synchronous settings make acknowledged, on a primary.
pub(crate) fn rule_of(primary: bool, sync: &crate::durability::SyncSettings) -> Option<WaitLevel> {
    sync.standby_names
        .as_ref()
        .filter(|_| primary)
        .and_then(|_| sync.default_durability.wait_level())
}

/// A node's side: the acknowledged end, and the readers' gate.
#[derive(Clone, Debug)]
pub(crate) struct Acknowledged {
    pub(crate) end: watch::Receiver<Lsn>,
    pub(crate) gate: watch::Receiver<Option<Lsn>>,
}

/// The supervisor's side: it sets the rule, a task keeps the acknowledged end.
pub(crate) struct Visibility {
    /// `None`: the local flush is acknowledged; `Some(level)`: what the synchronous standbys
    /// confirmed at `level`, and never beyond the local flush.
    rule: watch::Sender<Option<WaitLevel>>,
    acknowledged: std::sync::Arc<watch::Sender<Lsn>>,
    /// What readers stop at: `None` while the local flush is the acknowledged end, so that
    /// they read up to the flush itself and never lag behind it.
    gate: std::sync::Arc<watch::Sender<Option<Lsn>>>,
    confirmed: watch::Receiver<Confirmed>,
    /// `synchronous_commit_overlap`: the acknowledged end goes into storage as this node's
    /// own commit point ([`Wal::set_own_commit_point`]), which its walsenders tell the
    /// standbys that can cut back and which bounds its archiver.
    overlap: bool,
}

/// The commit point at the rule's level (`walsender_actor::overlap::commit_point`): never
/// beyond the local flush, also where a synchronous standby got WAL before it (the
/// overlapped commit), and never past the switch point of a timeline the confirmation was
/// made on if that is not `pos`'s (rule 1: the registry may not have heard of the switch
/// yet when this node's first flush on the new timeline is announced); `ended_at` is
/// `Wal::timeline_end`.
fn acknowledged_end(
    pos: &WalPosition,
    rule: Option<WaitLevel>,
    confirmed: &Confirmed,
    ended_at: impl FnOnce(TimelineId) -> Option<Lsn>,
) -> Lsn {
    let confirmed = confirmed.positions.at_most(counted_up_to(
        Some(confirmed.timeline),
        pos.timeline,
        ended_at,
    ));
    let quorum = rule.map(|level| match level {
        WaitLevel::Write => confirmed.write,
        WaitLevel::Flush => confirmed.flush,
        WaitLevel::Apply => confirmed.apply,
    });
    commit_point(pos.flushed, quorum)
}

/// This node's own commit point under the overlapped commit (`None`: its own flush): rule
/// 1's C, durable here AND on the synchronous quorum, so the quorum's *flush* whatever level
/// appends wait for. It is what the standbys are told and stop their readers at. At the
/// rule's level it would be circular for `remote_apply`: a standby's apply consumer reads
/// only up to the point it was told, and that point would move only once the consumer had
/// applied. (`remote_write` would tell a standby a point it may not hold durably.)
fn own_commit_point(
    pos: &WalPosition,
    rule: Option<WaitLevel>,
    confirmed: &Confirmed,
    ended_at: impl FnOnce(TimelineId) -> Option<Lsn>,
) -> Option<Lsn> {
    rule.map(|_| acknowledged_end(pos, Some(WaitLevel::Flush), confirmed, ended_at))
}

/// What readers stop at (`None`: the local flush): the acknowledged end at the rule's
/// level on a primary, and on a standby whose upstream told it a commit point, that point
/// (the overlapped commit's rule 3: nobody reads past it).
fn readers_gate(
    pos: &WalPosition,
    rule: Option<WaitLevel>,
    confirmed: &Confirmed,
    ended_at: impl FnOnce(TimelineId) -> Option<Lsn>,
) -> Option<Lsn> {
    match pos.commit {
        CommitBound::Told(_) => Some(pos.committed()),
        CommitBound::None | CommitBound::Own(_) => {
            rule.map(|_| acknowledged_end(pos, rule, confirmed, ended_at))
        }
    }
}

impl Visibility {
    /// The rule `rule` from the start; `confirmed` is the registry's watch.
    pub(crate) fn new(
        wal: &Wal,
        rule: Option<WaitLevel>,
        confirmed: watch::Receiver<Confirmed>,
        overlap: bool,
    ) -> (Visibility, Acknowledged) {
        let pos = wal.position();
        let first_gate = readers_gate(&pos, rule, &confirmed.borrow(), |t| wal.timeline_end(t));
        if overlap {
            // Set before any reader starts (the archiver does beside the node, and a primary's
            // archive is a reader too): until the task below first runs, storage's commit
            // point would otherwise be none, which readers take as the flushed end.
            let c = own_commit_point(&pos, rule, &confirmed.borrow(), |t| wal.timeline_end(t));
            wal.set_own_commit_point(c);
        }
        let (acknowledged, end) = watch::channel(first_gate.unwrap_or(pos.flushed));
        let (gate, gate_rx) = watch::channel(first_gate);
        let v = Visibility {
            rule: watch::channel(rule).0,
            acknowledged: std::sync::Arc::new(acknowledged),
            gate: std::sync::Arc::new(gate),
            confirmed,
            overlap,
        };
        (v, Acknowledged { end, gate: gate_rx })
    }

    /// The acknowledged end now.
    pub(crate) fn acknowledged(&self) -> Lsn {
        *self.acknowledged.borrow()
    }

    /// Changes the rule (a change of role or of the synchronous settings).
    pub(crate) fn set_rule(&self, rule: Option<WaitLevel>) {
        self.rule.send_if_modified(|r| {
            let changed = *r != rule;
            *r = rule;
            changed
        });
    }

    /// Keeps the acknowledged end current until storage or the supervisor is gone. Each turn
    /// waits for an event; none polls. It holds storage only while a turn runs: the task
    /// ends with the supervisor's context, after the supervisor has answered its shutdown,
    /// and a node reopened on the same data directory at once must find it unlocked.
    pub(crate) fn run(&self, wal: &Wal) -> impl std::future::Future<Output = ()> + 'static {
        // Through the thread's relay, shared with the walsenders or the walreceiver on it.
        let mut flushed = actor_util::relayed(wal.subscribe());
        let mut confirmed = self.confirmed.clone();
        let mut rule = self.rule.subscribe();
        let acknowledged = self.acknowledged.clone();
        let gate = self.gate.clone();
        let overlap = self.overlap;
        let weak = wal.downgrade();
        async move {
            loop {
                let Some(wal) = weak.upgrade() else {
                    return;
                };
                let r = *rule.borrow_and_update();
                let pos = *flushed.borrow_and_update();
                let c = *confirmed.borrow_and_update();
                let g = readers_gate(&pos, r, &c, |t| wal.timeline_end(t));
                let end = g.unwrap_or(pos.flushed);
                acknowledged.send_if_modified(|a| {
                    let changed = *a != end;
                    *a = end;
                    changed
                });
                gate.send_if_modified(|x| {
                    let changed = *x != g;
                    *x = g;
                    changed
                });
                // Without a synchronous rule the flush itself is the commit point. Storage
                // ignores this on a standby, which keeps what its upstream told; a change
                // wakes this loop once more, to find nothing changed.
                if overlap {
                    wal.set_own_commit_point(own_commit_point(&pos, r, &c, |t| {
                        wal.timeline_end(t)
                    }));
                }
                drop(wal);
                let alive = tokio::select! {
                    r = flushed.changed() => r.is_ok(),
                    r = confirmed.changed() => r.is_ok(),
                    r = rule.changed() => r.is_ok(),
                };
                if !alive {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use walsender_actor::syncrep::SyncPositions;

    fn at(timeline: u32, flushed: u64) -> WalPosition {
        WalPosition {
            timeline: TimelineId(timeline),
            written: Lsn(flushed),
            flushed: Lsn(flushed),
            commit: CommitBound::None,
        }
    }

    fn no_history(_: TimelineId) -> Option<Lsn> {
        None
    }

    /// What the synchronous standbys confirmed on timeline 1.
    fn confirmed_on_1(write: u64, flush: u64, apply: u64) -> Confirmed {
        Confirmed {
            timeline: TimelineId(1),
            positions: SyncPositions {
                write: Lsn(write),
                flush: Lsn(flush),
                apply: Lsn(apply),
            },
        }
    }

    #[test]
    fn the_acknowledged_end_is_the_lower_of_the_flush_and_the_confirmation() {
        let c = confirmed_on_1(30, 20, 10);
        let pos = at(1, 25);
        let end = |level| acknowledged_end(&pos, level, &c, no_history);
        assert_eq!(end(None), Lsn(25));
        assert_eq!(end(Some(WaitLevel::Write)), Lsn(25));
        assert_eq!(end(Some(WaitLevel::Flush)), Lsn(20));
        assert_eq!(end(Some(WaitLevel::Apply)), Lsn(10));
    }

    /// The commit point told to standbys is the quorum's flush at every level: at
    /// `remote_apply` a standby's apply consumer reads up to it before it applies, so a point
    /// at the apply level would wait for itself.
    #[test]
    fn the_own_commit_point_is_the_quorum_s_flush_whatever_the_level() {
        let c = confirmed_on_1(30, 20, 10);
        let pos = at(1, 25);
        let own = |level| own_commit_point(&pos, level, &c, no_history);
        assert_eq!(own(None), None, "no synchronous rule: the local flush");
        for level in [WaitLevel::Write, WaitLevel::Flush, WaitLevel::Apply] {
            assert_eq!(own(Some(level)), Some(Lsn(20)), "{level:?}");
        }
        // Never beyond this node's own flush.
        assert_eq!(
            own_commit_point(&at(1, 15), Some(WaitLevel::Apply), &c, no_history),
            Some(Lsn(15))
        );
    }

    /// Rule 1: what the standbys confirmed on the old timeline counts on the new one only
    /// below the switch point, also before the registry has heard of the switch.
    #[test]
    fn a_confirmation_of_the_old_timeline_stops_at_its_switch_point() {
        let c = confirmed_on_1(300, 300, 300);
        let history = |t: TimelineId| (t == TimelineId(1)).then_some(Lsn(200));
        let flush = Some(WaitLevel::Flush);
        assert_eq!(acknowledged_end(&at(1, 250), flush, &c, history), Lsn(250));
        assert_eq!(acknowledged_end(&at(2, 250), flush, &c, history), Lsn(200));
        assert_eq!(acknowledged_end(&at(2, 250), flush, &c, no_history), Lsn(0));
    }
}
