//! [`Fence`]: whether this node may acknowledge appends, and until when.
//!
//! A node without automatic failover has an open fence and acknowledges as it always did. A
//! node under a failover actor starts with its fence closed: it acknowledges nothing until the
//! actor holds the cluster's leader key and grants the fence a deadline. The deadline is the
//! actor's own monotonic estimate of when its lease could expire (the start of the last
//! successful renewal, plus the lease's ttl, minus a margin), so a primary that can no longer
//! renew stops acknowledging before another node can be promoted, without waiting for etcd or
//! anyone else to tell it. The supervisor checks the fence when an append arrives (refusing it
//! before anything is written) and again just before it answers (an append made durable after
//! the deadline is reported as indeterminate, not acknowledged).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

/// Shared between the failover actor (which grants and revokes) and the supervisor (which
/// asks before acknowledging). Cloning shares the same fence.
///
/// The state is a watch, so that an append waiting for synchronous standbys hears a
/// revocation or a renewal at once instead of reading the fence on a timer.
#[derive(Clone, Debug)]
pub struct Fence {
    inner: Arc<watch::Sender<FenceState>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FenceState {
    /// No failover: always acknowledge.
    Open,
    /// Under failover and not the leader (or not any more).
    Closed { term: Option<u64> },
    /// The leader of `term`, acknowledging until `until`.
    Granted { term: u64, until: Instant },
}

/// What the fence says at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceView {
    /// No failover runs: acknowledge.
    Open,
    /// Acknowledge: this node leads `term` until `until`.
    Leader { term: u64, until: Instant },
    /// Do not acknowledge; `term` is the last term this node knew of, if any.
    Closed { term: Option<u64> },
}

impl Fence {
    /// A fence that never closes: a node without automatic failover.
    pub fn open() -> Fence {
        Fence::with(FenceState::Open)
    }

    /// A fence that acknowledges nothing until [`Fence::grant`]: a node under a failover
    /// actor, before it knows it leads.
    pub fn closed() -> Fence {
        Fence::with(FenceState::Closed { term: None })
    }

    fn with(state: FenceState) -> Fence {
        Fence {
            inner: Arc::new(watch::channel(state).0),
        }
    }

    fn state(&self) -> FenceState {
        *self.inner.borrow()
    }

    /// Changes the state with `f`, telling waiters only when it changed.
    fn update(&self, f: impl FnOnce(FenceState) -> FenceState) {
        self.inner.send_if_modified(|s| {
            let next = f(*s);
            let changed = next != *s;
            *s = next;
            changed
        });
    }

    /// This node leads `term` and may acknowledge until `until` (a monotonic deadline that
    /// must lie before the lease can have expired). A grant never moves an earlier term back.
    pub fn grant(&self, term: u64, until: Instant) {
        self.update(|s| {
            let older = match s {
                FenceState::Granted { term: t, .. } => term < t,
                FenceState::Closed { term: Some(t) } => term < t,
                _ => false,
            };
            if older {
                s
            } else {
                FenceState::Granted { term, until }
            }
        });
    }

    /// Stops acknowledging at once (leadership lost, paused renewals, demotion). On an open
    /// fence this closes it: the node is under failover from now on.
    pub fn revoke(&self) {
        self.update(|s| {
            let term = match s {
                FenceState::Granted { term, .. } => Some(term),
                FenceState::Closed { term } => term,
                FenceState::Open => None,
            };
            FenceState::Closed { term }
        });
    }

    /// Records a term this node learned of without leading it (a standby following the
    /// leader of `term`, or a promotion for `term` before its grant): the fence stays or
    /// becomes closed. On an open fence (no failover actor) the term is not kept: such a node
    /// stays open.
    pub fn observe_term(&self, term: u64) {
        self.update(|s| match s {
            FenceState::Closed { term: t } if t.is_none_or(|t| t < term) => {
                FenceState::Closed { term: Some(term) }
            }
            FenceState::Granted { term: t, .. } if t < term => {
                FenceState::Closed { term: Some(term) }
            }
            s => s,
        });
    }

    /// Resolves when the fence no longer lets this node acknowledge: revoked, superseded, or
    /// its deadline passed (a renewal moves the deadline on). Never resolves on an open fence
    /// that stays open.
    pub async fn wait_closed(&self) {
        // Each turn waits for an event (a change of the fence or its deadline), so the loop
        // does not spin; the next change is armed before the fence is read, so none is missed.
        loop {
            let next = self.next_change();
            if let FenceView::Closed { .. } = self.view(Instant::now()) {
                return;
            }
            next.await;
        }
    }

    /// The fence's next change after this call: a grant, a renewal, a revocation, a new term,
    /// or the deadline of the grant held now passing. The watch is subscribed and the deadline
    /// read when this is called, not when the future is first polled, so a caller that reads
    /// the fence right after calling it misses no change made in between. Never resolves on an
    /// open fence that stays open; one future is one change, a follower asks again.
    pub fn next_change(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.subscribe();
        let until = match self.view(Instant::now()) {
            FenceView::Leader { until, .. } => Some(until),
            FenceView::Open | FenceView::Closed { .. } => None,
        };
        async move {
            match until {
                Some(until) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until.into()) => {}
                        _ = rx.changed() => {}
                    }
                }
                None => {
                    // The sender lives in every clone of the fence; were they all gone, there
                    // would be nothing left to follow.
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }

    /// What the fence says at `now`; a grant whose deadline has passed reads as closed.
    pub fn view(&self, now: Instant) -> FenceView {
        match self.state() {
            FenceState::Open => FenceView::Open,
            FenceState::Granted { term, until } if now < until => FenceView::Leader { term, until },
            FenceState::Granted { term, .. } => FenceView::Closed { term: Some(term) },
            FenceState::Closed { term } => FenceView::Closed { term },
        }
    }

    /// Whether an append may be acknowledged at `now`.
    pub fn may_acknowledge(&self, now: Instant) -> bool {
        !matches!(self.view(now), FenceView::Closed { .. })
    }

    /// The latest term this node knows of (led or followed); `None` without failover.
    pub fn term(&self) -> Option<u64> {
        match self.state() {
            FenceState::Open => None,
            FenceState::Granted { term, .. } => Some(term),
            FenceState::Closed { term } => term,
        }
    }

    /// Whether a failover actor governs this fence.
    pub fn is_managed(&self) -> bool {
        !matches!(self.state(), FenceState::Open)
    }
}

impl Default for Fence {
    fn default() -> Fence {
        Fence::open()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn next_change_wakes_on_a_grant_a_revocation_and_an_expiry() {
        let waiter = |f: &Fence| tokio::spawn(f.next_change());
        let f = Fence::closed();
        let w = waiter(&f);
        tokio::task::yield_now().await;
        assert!(!w.is_finished());
        let until = Instant::now() + Duration::from_millis(200);
        f.grant(1, until);
        w.await.unwrap();
        // Held: the next change is the deadline, with nobody touching the fence.
        f.next_change().await;
        assert!(Instant::now() >= until);
        assert!(!f.may_acknowledge(Instant::now()));
        // A revocation of a long grant wakes a waiter at once.
        f.grant(2, Instant::now() + Duration::from_secs(600));
        let w = waiter(&f);
        tokio::task::yield_now().await;
        assert!(!w.is_finished());
        f.revoke();
        tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("a revocation wakes the waiter")
            .unwrap();
        // A change made after the call but before the first poll counts: a follower that
        // asks, then reads the fence, misses nothing.
        let next = f.next_change();
        f.grant(3, Instant::now() + Duration::from_secs(600));
        tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("a change before the first poll wakes it");
        // So does a deadline that passes before the first poll (waited for here as the
        // deadline it is).
        let until = Instant::now() + Duration::from_millis(50);
        f.grant(4, until);
        let next = f.next_change();
        tokio::time::sleep_until(until.into()).await;
        tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("a deadline passed before the first poll wakes it");
    }

    #[test]
    fn an_open_fence_always_acknowledges() {
        let f = Fence::open();
        assert!(f.may_acknowledge(Instant::now()));
        assert_eq!(f.term(), None);
        assert!(!f.is_managed());
    }

    #[test]
    fn a_grant_expires_by_its_own_deadline() {
        let f = Fence::closed();
        let now = Instant::now();
        assert!(!f.may_acknowledge(now));
        f.grant(7, now + Duration::from_secs(1));
        assert!(f.may_acknowledge(now));
        assert!(!f.may_acknowledge(now + Duration::from_secs(1)));
        assert_eq!(
            f.view(now + Duration::from_secs(2)),
            FenceView::Closed { term: Some(7) }
        );
    }

    #[test]
    fn revoke_closes_and_an_older_term_cannot_reopen() {
        let f = Fence::closed();
        let later = Instant::now() + Duration::from_secs(60);
        f.grant(5, later);
        f.revoke();
        assert!(!f.may_acknowledge(Instant::now()));
        f.observe_term(9);
        f.grant(8, later);
        assert!(
            !f.may_acknowledge(Instant::now()),
            "term 8 is older than the known 9"
        );
        f.grant(9, later);
        assert!(f.may_acknowledge(Instant::now()));
        assert_eq!(f.term(), Some(9));
    }
}
