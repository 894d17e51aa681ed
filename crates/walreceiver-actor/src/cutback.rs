//! The overlapped commit's rule 4: an unacknowledged tail is cut only at stream start.
//!
//! Under the overlapped commit a synchronous standby is sent WAL while its primary's
//! fdatasync runs, so it may hold a tail its primary lost in a crash: WAL past the commit
//! point C, never acknowledged to anyone. Nothing past C was passed on (rule 3), so the tail
//! may vanish. When the walreceiver (re)connects, its upstream names the highest point their
//! histories share, and the standby cuts its tail back to it:
//! - On the upstream's own timeline, when the upstream is that timeline's writer (a primary:
//!   it reported `in_hot_standby = off` at connection start), that point is its durable end
//!   (IDENTIFY_SYSTEM's `xlogpos`). One timeline has one writer, and a standby's bytes are a
//!   prefix of what that writer wrote; they differ from the writer's below its end only if it
//!   wrote the same LSNs twice, which a restarted primary never does (it takes appends only on
//!   a new timeline), or if the two hold timelines of one number made apart, which the
//!   session refuses before any cut (`TimelineClash`: their history files differ). So a standby's bytes up to the writer's end are the writer's, and a
//!   longer tail is a lost unacknowledged one. With rule 5 this cut is rare (an old leader
//!   restarted under failover before it takes a term); it stays as a defence should rule 5
//!   break.
//! - On the upstream's own timeline when the upstream is a standby (or did not say): its end
//!   is only how far it has received. A longer tail here is WAL it has not received yet, and
//!   may hold appends acknowledged by this node's flush, so nothing is cut: the stream starts
//!   at this node's end, which the upstream refuses until it has caught up, and the walreceiver
//!   retries, as PostgreSQL's does.
//! - Where the upstream's history switched away from the standby's timeline, it is the
//!   switch point (what `Forked` refuses with the switch off).
//!
//! Never below C: a shared point below the commit point this node was told means the
//! upstream lacks acknowledged WAL (another cluster's copy, a restored backup run as a
//! primary, a primary promoted from a standby that lagged). Cutting would destroy the only
//! copy of it, so the walreceiver refuses and alarms.
//!
//! Never below what this node wrote as a primary either ([`Floor::WroteAsPrimary`],
//! `Wal::primary_end`): an old primary pointed at the new one holds appends it may have
//! acknowledged itself, past the new timeline's fork, and was never told a commit point
//! that covers them. PostgreSQL refuses to stream such a node until pg_rewind; here it is
//! refused the same way until `walserver rejoin` (or, under failover, following the new
//! leader, which cuts past the fork by design). Both are explicit cuts: they end that floor,
//! and lower a told commit point above the fork to the fork (`Wal::truncate_beyond`), since
//! the point was told of a history the cut abandons.
//! The cut runs on storage's thread (`Wal::truncate_to`) before START_REPLICATION; readers
//! on this node stop at C, so none holds the bytes it drops.

use wal_storage::Lsn;

/// What to do with this node's WAL beyond the point it shares with its upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailDecision {
    /// Nothing beyond the shared point, or no shared point known: stream on from this node's
    /// end.
    Keep,
    /// Drop `bytes` of unacknowledged WAL beyond `to`, then stream from `to`.
    Cut { to: Lsn, bytes: u64 },
    /// The shared point is below the commit point: the upstream lacks acknowledged WAL.
    Refuse,
}

/// The lowest point a cut at stream start may reach, and what sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Floor {
    /// Nothing: told no commit point, and never a primary.
    None,
    /// The commit point this node was told.
    Told(Lsn),
    /// The end of the WAL this node wrote as a primary, above any commit point it was told.
    WroteAsPrimary(Lsn),
}

impl Floor {
    /// The floor of a node told the commit point `told` whose WAL written as a primary ends
    /// at `primary_end` (`Wal::primary_end`): the higher of the two.
    pub fn of(told: Option<Lsn>, primary_end: Option<Lsn>) -> Floor {
        match (told, primary_end) {
            (t, Some(p)) if Some(p) > t => Floor::WroteAsPrimary(p),
            (Some(t), _) => Floor::Told(t),
            (None, _) => Floor::None,
        }
    }

    pub fn lsn(self) -> Lsn {
        match self {
            Floor::None => Lsn::INVALID,
            Floor::Told(c) | Floor::WroteAsPrimary(c) => c,
        }
    }
}

/// The decision for a node whose WAL ends at `local_end`, that shares its history with the
/// upstream up to `shared`, and may cut no lower than `floor` ([`Floor::lsn`]).
pub fn decide(local_end: Lsn, shared: Lsn, floor: Lsn) -> TailDecision {
    if local_end <= shared {
        TailDecision::Keep
    } else if shared < floor {
        TailDecision::Refuse
    } else {
        TailDecision::Cut {
            to: shared,
            bytes: local_end.0 - shared.0,
        }
    }
}

/// What the upstream said it is at connection start: PostgreSQL 14 and later, and walserver,
/// report `in_hot_standby` in ParameterStatus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamRole {
    /// `in_hot_standby = off`: the writer of its timeline.
    Primary,
    /// `in_hot_standby = on`: it receives its timeline from elsewhere.
    Standby,
    /// It did not report `in_hot_standby` (an older server), or reported something else.
    Unknown,
}

impl UpstreamRole {
    /// The role an upstream's `in_hot_standby` ParameterStatus value names.
    pub fn of(in_hot_standby: Option<&str>) -> UpstreamRole {
        match in_hot_standby {
            Some("off") => UpstreamRole::Primary,
            Some("on") => UpstreamRole::Standby,
            _ => UpstreamRole::Unknown,
        }
    }
}

/// The decision at a stream start on the upstream's own timeline, for a node whose WAL ends
/// at `local_end`, with an upstream of `role` whose durable end is `upstream_end`: only a
/// primary's end is a point their histories share; a standby's is where its receipt stands.
pub fn decide_on_same_timeline(
    local_end: Lsn,
    role: UpstreamRole,
    upstream_end: Lsn,
    floor: Lsn,
) -> TailDecision {
    match role {
        UpstreamRole::Primary => decide(local_end, upstream_end, floor),
        UpstreamRole::Standby | UpstreamRole::Unknown => TailDecision::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_is_cut_to_the_shared_point_never_below_the_commit_point() {
        // Nothing beyond the upstream's end: nothing to cut, whatever C says.
        assert_eq!(decide(Lsn(100), Lsn(100), Lsn(100)), TailDecision::Keep);
        assert_eq!(decide(Lsn(90), Lsn(100), Lsn(500)), TailDecision::Keep);
        // A tail past C and past the shared point: cut to the shared point.
        assert_eq!(
            decide(Lsn(150), Lsn(120), Lsn(100)),
            TailDecision::Cut {
                to: Lsn(120),
                bytes: 30
            }
        );
        // Exactly to C is allowed: C itself is kept.
        assert_eq!(
            decide(Lsn(150), Lsn(100), Lsn(100)),
            TailDecision::Cut {
                to: Lsn(100),
                bytes: 50
            }
        );
        // The upstream lacks acknowledged WAL: refuse.
        assert_eq!(decide(Lsn(150), Lsn(99), Lsn(100)), TailDecision::Refuse);
        // A commit point beyond this node's own end (told before its flush caught up) still
        // guards the cut.
        assert_eq!(decide(Lsn(150), Lsn(120), Lsn(200)), TailDecision::Refuse);
    }

    #[test]
    fn what_a_node_wrote_as_a_primary_is_a_floor_above_a_lower_told_point() {
        assert_eq!(Floor::of(None, None), Floor::None);
        assert_eq!(Floor::of(None, None).lsn(), Lsn::INVALID);
        assert_eq!(Floor::of(Some(Lsn(100)), None), Floor::Told(Lsn(100)));
        // An old primary never told a commit point, or told one before it was promoted.
        assert_eq!(
            Floor::of(None, Some(Lsn(150))),
            Floor::WroteAsPrimary(Lsn(150))
        );
        assert_eq!(
            Floor::of(Some(Lsn(100)), Some(Lsn(150))),
            Floor::WroteAsPrimary(Lsn(150))
        );
        // Told a point past it since (it streamed the new upstream's WAL): the told one.
        assert_eq!(
            Floor::of(Some(Lsn(200)), Some(Lsn(150))),
            Floor::Told(Lsn(200))
        );
        assert_eq!(
            Floor::of(Some(Lsn(150)), Some(Lsn(150))),
            Floor::Told(Lsn(150))
        );
        // An old primary's tail past the fork is kept.
        let floor = Floor::of(None, Some(Lsn(150))).lsn();
        assert_eq!(decide(Lsn(150), Lsn(120), floor), TailDecision::Refuse);
    }

    #[test]
    fn on_the_same_timeline_only_a_primary_s_end_is_a_shared_point() {
        assert_eq!(UpstreamRole::of(Some("off")), UpstreamRole::Primary);
        assert_eq!(UpstreamRole::of(Some("on")), UpstreamRole::Standby);
        assert_eq!(UpstreamRole::of(None), UpstreamRole::Unknown);
        assert_eq!(UpstreamRole::of(Some("yes")), UpstreamRole::Unknown);
        // The writer's end: a longer tail above the floor is cut, one below it refused.
        let primary = UpstreamRole::Primary;
        assert_eq!(
            decide_on_same_timeline(Lsn(150), primary, Lsn(120), Lsn(100)),
            TailDecision::Cut {
                to: Lsn(120),
                bytes: 30
            }
        );
        assert_eq!(
            decide_on_same_timeline(Lsn(150), primary, Lsn(90), Lsn(100)),
            TailDecision::Refuse
        );
        // A standby's end, or an end nobody said whose it is: the tail is kept whether above
        // the floor or not, and the stream starts at this node's end.
        for role in [UpstreamRole::Standby, UpstreamRole::Unknown] {
            for floor in [Lsn::INVALID, Lsn(100), Lsn(140)] {
                assert_eq!(
                    decide_on_same_timeline(Lsn(150), role, Lsn(120), floor),
                    TailDecision::Keep
                );
            }
        }
    }
}
