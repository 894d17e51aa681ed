//! The overlapped commit (`synchronous_commit_overlap`) as plain functions: where a
//! walsender's stream stops for now, and the commit point an append is acknowledged at.
//!
//! Today's rule, and the rule with the switch off, is PostgreSQL's: a walsender sends only
//! WAL durable on this node, so no standby ever holds WAL its primary could lose, and one
//! synchronous commit costs the primary's fdatasync and then the standby's, one after the
//! other. With the switch on, a synchronous walserver standby gets a batch of appends as soon
//! as the primary has written it, while the primary's fdatasync runs, so the two syncs
//! overlap (Raft's parallel leader write, thesis 10.2.1). The price is that a standby may
//! hold a tail its primary lost in a crash; only a client that can cut such a tail back at
//! its next stream start may get it, and it says so in its startup packet
//! ([`protocol_codec::ACCEPTS_UNFLUSHED_PARAM`]). Asynchronous standbys, PostgreSQL standbys
//! and pg_receivewal keep the flushed limit: they cut nothing back, and an asynchronous
//! standby's copy is not waited for, so sending it early would gain nothing.
//!
//! An append is acknowledged only at or below the commit point: durable on this node AND on
//! the synchronous quorum. The primary's own flush is always required, also with no
//! synchronous standby (etcd lost acknowledged writes once it answered before its own write
//! was durable, etcd#14370); the supervisor waits for it before it waits for the standbys,
//! and readers on the primary stop at the same point (`supervisor_actor`'s visibility).

use wal_storage::{Lsn, TimelineId, WalPosition};

/// Crash point (`wal_storage::crash`, feature `failpoints`): a standby reported WAL received
/// beyond this node's flushed end, so an early send reached it while the local flush had not
/// returned. Passed before the report is taken in.
pub const CRASH_SENT_EARLY: &str = "walsender_actor::sent_early::crash";
/// Crash point: the synchronous standbys' confirmation moved the commit point past waiting
/// appends (their own flush came first), which are not answered yet.
pub const CRASH_RELEASE: &str = "walsender_actor::release::crash";
/// Every crash point of this crate.
pub const CRASH_POINTS: &[&str] = &[CRASH_SENT_EARLY, CRASH_RELEASE];

/// The commit point: the lowest of this node's flushed end and, when synchronous standbys
/// must confirm, the position they confirmed together (`None`: no standby must confirm).
pub fn commit_point(own_flushed: Lsn, quorum: Option<Lsn>) -> Lsn {
    quorum.map_or(own_flushed, |q| own_flushed.min(q))
}

/// Rule 1's timeline filter: up to where a position reported on timeline `reported_on` (the
/// timeline the standby was streaming when it reported) counts toward the commit point of
/// this node's `current` timeline; `ended_at` gives where an ancestor of the current
/// timeline ended (`Wal::timeline_end`).
///
/// A report made on the current timeline counts whole. One made on an ancestor counts only
/// up to that ancestor's switch point: below it both histories hold the same bytes, above it
/// the standby holds the old timeline's WAL (a tail sent early that this node lost, or the
/// other side of a promotion), which says nothing of this timeline's appends at the same
/// LSNs. A report of no stream, or of a timeline outside the history, counts for nothing.
/// With the switch off this changes nothing: a standby is sent only durable WAL, so a report
/// on an ancestor never lies past its switch point.
pub fn counted_up_to(
    reported_on: Option<TimelineId>,
    current: TimelineId,
    ended_at: impl FnOnce(TimelineId) -> Option<Lsn>,
) -> Lsn {
    match reported_on {
        Some(t) if t == current => Lsn(u64::MAX),
        Some(t) => ended_at(t).unwrap_or(Lsn::INVALID),
        None => Lsn::INVALID,
    }
}

/// Whether a walsender may send WAL that is written but not yet durable on this node: the
/// switch is on, the client said it can cut back, and it is synchronous now (`sync` or
/// `quorum` in `pg_stat_replication`; a `potential` standby is not waited for).
pub fn sends_early(overlap: bool, client_accepts_unflushed: bool, sync_state: &str) -> bool {
    overlap && client_accepts_unflushed && matches!(sync_state, "sync" | "quorum")
}

/// Where a stream of the current timeline stops for now: the written end for a walsender
/// that [`sends_early`], else the flushed end, or on a standby told a commit point that
/// point ([`WalPosition::sendable`]: nobody reads past it).
pub fn send_limit(pos: &WalPosition, early: bool) -> Lsn {
    if early {
        pos.written.max(pos.sendable())
    } else {
        pos.sendable()
    }
}

/// Rule 5's mark, on the sending side: whether a walsender may send WAL of timeline `current`
/// past this node's durable end, given the timeline storage's durable early-send mark names
/// (`Wal::mark_early_sends`). Only once the mark is durable: a crash after the send then
/// finds it, and [`starts_new_timeline`] says what the send requires.
pub fn early_sends_marked(marked: Option<TimelineId>, current: TimelineId) -> bool {
    marked == Some(current)
}

/// Rule 5: whether a node about to take appends as a primary (it starts as one, reopens
/// failed storage, or takes up a failover term) must first start a new timeline at its own
/// durable end instead of resuming `current`, the timeline it is on; `marked` is the timeline
/// storage's durable early-send mark names (`Wal::early_sends_marked`; a clean shutdown
/// removes it).
///
/// Under the overlapped commit a synchronous standby may hold a tail of the current timeline
/// that this node wrote, sent early, and then lost in a crash (or in a failed fdatasync that
/// storage reopened past). Resuming the timeline would write different bytes at the same LSNs,
/// and the standby, whose copy reaches further, would report flush positions that count for
/// appends it never received. A new timeline from the durable end makes the standby's extra
/// tail a fork that it cuts back at its next stream start, and it costs a history file.
/// Everything acknowledged is at or below the durable end (the commit point needs this node's
/// own flush), so the new timeline's start keeps it. That can only happen on a timeline the
/// mark names, since the first early send on a timeline waits for the mark
/// ([`early_sends_marked`]); on any other no standby holds WAL this node lacks, and the
/// timeline is resumed as PostgreSQL does (always, with the switch off and never on before).
/// A mark left by a run with the switch on counts after it is turned off too: the standby's
/// tail does not go away with the switch.
pub fn starts_new_timeline(marked: Option<TimelineId>, current: TimelineId) -> bool {
    marked == Some(current)
}

/// Whether a stream carries the commit point ([`protocol_codec::messages::CommitPoint`]):
/// the switch is on and the client said it can cut back, which only walserver's
/// walreceiver says; PostgreSQL clients see PostgreSQL's protocol byte for byte.
pub fn carries_commit_point(overlap: bool, client_accepts_unflushed: bool) -> bool {
    overlap && client_accepts_unflushed
}

/// Whether a client's value of [`protocol_codec::ACCEPTS_UNFLUSHED_PARAM`] says yes, in
/// PostgreSQL's boolean spellings.
pub fn accepts_unflushed(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "on" | "true" | "yes" | "1"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal_storage::{CommitBound, TimelineId};

    #[test]
    fn the_commit_point_needs_the_primary_s_flush_and_the_quorum_s() {
        // The standby is ahead of the primary's fdatasync: the primary's flush decides.
        assert_eq!(commit_point(Lsn(100), Some(Lsn(150))), Lsn(100));
        // The standby is behind.
        assert_eq!(commit_point(Lsn(100), Some(Lsn(60))), Lsn(60));
        // No synchronous standby: the primary's own flush, never anything beyond it.
        assert_eq!(commit_point(Lsn(100), None), Lsn(100));
        // A quorum that confirmed nothing yet holds everything back.
        assert_eq!(commit_point(Lsn(100), Some(Lsn(0))), Lsn(0));
    }

    #[test]
    fn only_reports_on_the_current_timeline_count_past_its_switch_point() {
        let history = |t: TimelineId| (t == TimelineId(1)).then_some(Lsn(100));
        let current = TimelineId(2);
        // Made on the current timeline: counted whole.
        let limit = counted_up_to(Some(current), current, history);
        assert_eq!(Lsn(500).min(limit), Lsn(500));
        // Made on the ancestor, past the switch point (a tail this node lost): only the
        // shared part counts, which is below every append of the new timeline.
        let limit = counted_up_to(Some(TimelineId(1)), current, history);
        assert_eq!(Lsn(500).min(limit), Lsn(100));
        assert_eq!(Lsn(60).min(limit), Lsn(60));
        // A timeline outside the history, or no stream: nothing.
        assert_eq!(counted_up_to(Some(TimelineId(3)), current, history), Lsn(0));
        assert_eq!(counted_up_to(None, current, history), Lsn(0));
    }

    #[test]
    fn only_a_synchronous_standby_that_can_cut_back_is_sent_early() {
        for state in ["sync", "quorum"] {
            assert!(sends_early(true, true, state));
            assert!(!sends_early(false, true, state), "the switch is off");
            assert!(
                !sends_early(true, false, state),
                "pg_receivewal, PostgreSQL"
            );
        }
        for state in ["async", "potential", ""] {
            assert!(!sends_early(true, true, state), "{state}");
        }
    }

    #[test]
    fn the_limit_is_the_written_end_only_for_an_early_sender() {
        let mut pos = WalPosition {
            timeline: TimelineId(1),
            written: Lsn(200),
            flushed: Lsn(120),
            commit: CommitBound::None,
        };
        assert_eq!(send_limit(&pos, true), Lsn(200));
        assert_eq!(send_limit(&pos, false), Lsn(120));
        // A primary's own commit point does not hold back its own walsenders (rule 2).
        pos.commit = CommitBound::Own(Lsn(100));
        assert_eq!(send_limit(&pos, false), Lsn(120));
    }

    #[test]
    fn a_standby_told_a_commit_point_sends_nothing_past_it() {
        let mut pos = WalPosition {
            timeline: TimelineId(1),
            written: Lsn(200),
            flushed: Lsn(200),
            commit: CommitBound::Told(Lsn(150)),
        };
        assert_eq!(send_limit(&pos, false), Lsn(150));
        // Its own flush still bounds it.
        pos.commit = CommitBound::Told(Lsn(300));
        assert_eq!(send_limit(&pos, false), Lsn(200));
        pos.commit = CommitBound::None;
        assert_eq!(send_limit(&pos, false), Lsn(200));
    }

    #[test]
    fn only_a_timeline_the_mark_names_is_left_for_a_new_one() {
        let (t1, t2) = (TimelineId(1), TimelineId(2));
        // No early send was ever marked (the switch off, or no synchronous walserver
        // standby, or a clean shutdown since): the timeline goes on.
        assert!(!starts_new_timeline(None, t1));
        assert!(!early_sends_marked(None, t1));
        // A mark of an older timeline is stale.
        assert!(!starts_new_timeline(Some(t1), t2));
        assert!(!early_sends_marked(Some(t1), t2));
        // Early sends may have happened on this timeline.
        assert!(starts_new_timeline(Some(t2), t2));
        assert!(early_sends_marked(Some(t2), t2));
    }

    #[test]
    fn the_client_s_word_is_read_as_a_boolean() {
        for yes in ["on", "ON", "true", "1", "yes"] {
            assert!(accepts_unflushed(Some(yes)), "{yes}");
        }
        for no in ["off", "0", "false", "maybe", ""] {
            assert!(!accepts_unflushed(Some(no)), "{no}");
        }
        assert!(!accepts_unflushed(None));
    }
}
