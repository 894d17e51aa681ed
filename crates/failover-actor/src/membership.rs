//! Whether this node is a member of its cluster now: never silently outside it. A node
//! under failover that has not joined yet, cannot reach etcd, has let its lease run out or
//! lost its member name to another process is not a member, and says so (`/status`, and
//! `/replica` and `/primary` answer 503 with the reason), rather than serving as if it were
//! one.
//!
//! The events (a join, a failed join, a renewal, the lease found gone, the name taken) move
//! [`Membership`]; what it shows at an instant ([`Membership::status`]) also holds its lease
//! to its time: a member whose last successful renewal was sent a ttl ago or more has no
//! lease left, whatever the last event said.

use std::time::{Duration, Instant, SystemTime};

use supervisor_actor::{FailoverStatus, MembershipState};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Standing {
    NotJoined(String),
    Joined,
    Left(String),
}

/// This node's standing in the cluster, and since when.
#[derive(Clone, Debug)]
pub(crate) struct Membership {
    standing: Standing,
    since: SystemTime,
}

/// What the cluster's view adds to a standing for `/status`.
pub(crate) struct Seen {
    pub(crate) leader: Option<String>,
    pub(crate) term: Option<u64>,
    pub(crate) paused: bool,
}

impl Membership {
    /// A node that has not joined yet.
    pub(crate) fn new(wall: SystemTime) -> Membership {
        Membership {
            standing: Standing::NotJoined("joining the cluster in etcd".into()),
            since: wall,
        }
    }

    /// Joined (again): a lease granted and the member key written. `true` if it was not a
    /// member before.
    pub(crate) fn joined(&mut self, wall: SystemTime) -> bool {
        self.set(Standing::Joined, wall)
    }

    /// Not a member, for `reason`; the time it stopped being one stays while it stays out.
    pub(crate) fn not_joined(&mut self, reason: String, wall: SystemTime) {
        if matches!(self.standing, Standing::Left(_)) {
            return;
        }
        match &mut self.standing {
            Standing::NotJoined(r) => *r = reason,
            _ => {
                self.set(Standing::NotJoined(reason), wall);
            }
        }
    }

    /// Out for good: another process holds this node's member name.
    pub(crate) fn left(&mut self, reason: String, wall: SystemTime) {
        self.set(Standing::Left(reason), wall);
    }

    fn set(&mut self, standing: Standing, wall: SystemTime) -> bool {
        if self.standing == standing {
            return false;
        }
        self.standing = standing;
        self.since = wall;
        true
    }

    /// Why this node is not a member at `now`, if it is not: the last event's reason, or a
    /// lease whose last successful renewal was sent at `renewed` and has had its `ttl`
    /// (`last_error` says why no renewal succeeded since).
    pub(crate) fn not_member(
        &self,
        renewed: Option<Instant>,
        ttl: Duration,
        now: Instant,
        last_error: Option<&str>,
    ) -> Option<String> {
        match &self.standing {
            Standing::NotJoined(reason) | Standing::Left(reason) => Some(reason.clone()),
            Standing::Joined => {
                let renewed = renewed?;
                let quiet = now.saturating_duration_since(renewed);
                (quiet >= ttl).then(|| {
                    format!(
                        "the lease in etcd has not been renewed for {:.1} s, longer than the ttl ({} s){}",
                        quiet.as_secs_f64(),
                        ttl.as_secs(),
                        last_error.map(|e| format!(": {e}")).unwrap_or_default()
                    )
                })
            }
        }
    }

    /// The failover part of `/status` at `now` (`wall` being the same instant): as
    /// [`Membership::not_member`] says, else leading (`leading`: the fence is granted) or
    /// joined.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn status(
        &self,
        renewed: Option<Instant>,
        ttl: Duration,
        now: Instant,
        wall: SystemTime,
        last_error: Option<&str>,
        leading: bool,
        seen: Seen,
    ) -> FailoverStatus {
        let (state, reason, since) = match self.not_member(renewed, ttl, now, last_error) {
            Some(reason) => {
                let state = match self.standing {
                    Standing::Left(_) => MembershipState::Left,
                    _ => MembershipState::NotJoined,
                };
                let since = match (&self.standing, renewed) {
                    // Out since the lease ran out: its last renewal's send plus the ttl.
                    (Standing::Joined, Some(r)) => {
                        wall.checked_sub(now.saturating_duration_since(r + ttl))
                    }
                    _ => Some(self.since),
                };
                (state, Some(reason), since)
            }
            None if leading => (MembershipState::Leading, None, Some(self.since)),
            None => (MembershipState::Joined, None, Some(self.since)),
        };
        FailoverStatus {
            state,
            reason,
            since,
            leader: seen.leader,
            term: seen.term,
            paused: seen.paused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(4);

    fn seen() -> Seen {
        Seen {
            leader: Some("n1".into()),
            term: Some(7),
            paused: false,
        }
    }

    /// Not joined at start and after a failed join (keeping since when), joined after a join,
    /// out again once its lease has had its ttl without a renewal (since the lease's end),
    /// and left for good once its name is taken.
    #[test]
    fn a_member_is_one_only_on_a_live_lease() {
        let t0 = Instant::now();
        let w0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut m = Membership::new(w0);
        let s = m.status(None, TTL, t0, w0, None, false, seen());
        assert_eq!(s.state, MembershipState::NotJoined);
        assert_eq!(s.reason.as_deref(), Some("joining the cluster in etcd"));
        assert_eq!((s.leader.as_deref(), s.term), (Some("n1"), Some(7)));
        m.not_joined(
            "cannot join: connection refused".into(),
            w0 + Duration::from_secs(1),
        );
        let s = m.status(None, TTL, t0, w0, None, false, seen());
        assert_eq!(s.reason.as_deref(), Some("cannot join: connection refused"));
        assert_eq!(s.since, Some(w0), "still out since the start");

        let w1 = w0 + Duration::from_secs(5);
        assert!(m.joined(w1));
        assert!(!m.joined(w1));
        let s = m.status(Some(t0), TTL, t0 + TTL / 2, w1, None, true, seen());
        assert_eq!(
            (s.state, s.reason, s.since),
            (MembershipState::Leading, None, Some(w1))
        );
        let s = m.status(Some(t0), TTL, t0 + TTL / 2, w1, None, false, seen());
        assert_eq!(s.state, MembershipState::Joined);
        assert!(m
            .not_member(Some(t0), TTL, t0 + TTL - Duration::from_millis(1), None)
            .is_none());

        // A ttl without a renewal: out, since the lease's end, with the last error.
        let now = t0 + TTL + Duration::from_secs(2);
        let wall = w1 + Duration::from_secs(10);
        let s = m.status(Some(t0), TTL, now, wall, Some("timed out"), true, seen());
        assert_eq!(s.state, MembershipState::NotJoined);
        let reason = s.reason.unwrap_or_default();
        assert!(
            reason.contains("not been renewed for 6.0 s, longer than the ttl (4 s): timed out"),
            "{reason}"
        );
        assert_eq!(s.since, Some(wall - Duration::from_secs(2)));

        let mut gone = Membership::new(w0);
        gone.left("another process holds the name".into(), wall);
        gone.not_joined("cannot join".into(), wall + TTL);
        let s = gone.status(None, TTL, now, wall, None, false, seen());
        assert_eq!(s.state, MembershipState::Left);
        assert_eq!(s.reason.as_deref(), Some("another process holds the name"));
    }
}
