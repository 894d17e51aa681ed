//! What to archive next and when, as a plain state machine with time passed in.
//!
//! The order is PostgreSQL's archiver contract: every completed segment, in LSN order, none
//! skipped; a timeline's history file before any segment of that timeline (a restore that
//! meets a segment of timeline N must be able to read N's ancestry). History files of the
//! whole current ancestry go first, so after a promotion the new history file is archived
//! before the switch segment. A failed upload is retried, the same file again, after a
//! backoff that doubles from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`]; nothing else is tried
//! meanwhile, since skipping would leave a gap that the archived position cannot express.
//!
//! A segment is named by the timeline that wrote its last byte (the newest timeline's copy
//! of a switch segment, as PostgreSQL archives it); the old timeline's unfinished switch
//! segment is a partial segment, not archived by this step.
//!
//! **Invariants:** `archived` is segment-aligned and only moves forward, one segment per
//! completed upload; a segment is offered only if it is complete (wholly below the flushed
//! end) and every history file of the ancestry was archived since this machine started.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use wal_storage::{history_file_name, segment_file_name, HistoryEntry};
use wal_types::{Lsn, TimelineId};

/// The first wait after a failure. A guess: long enough not to spin on a target that is
/// down, short enough that a passing fault costs little backlog.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between attempts (PostgreSQL's archiver waits a minute between rounds of
/// failures; also a guess there).
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// One file to put into the archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Item {
    /// `TTTTTTTT.history` of a timeline.
    History(TimelineId),
    /// A completed segment under the timeline that wrote its last byte.
    Segment { tli: TimelineId, segno: u64 },
}

impl Item {
    /// The object's name: PostgreSQL's file name.
    pub fn file_name(&self, segment_size: u64) -> String {
        match *self {
            Item::History(tli) => history_file_name(tli),
            Item::Segment { tli, segno } => segment_file_name(tli, segno, segment_size),
        }
    }
}

/// What the node's WAL looks like now: the only input besides time.
#[derive(Clone, Copy, Debug)]
pub struct WalView<'a> {
    /// The current timeline.
    pub timeline: TimelineId,
    /// Its ancestry, oldest first (storage's `history()`).
    pub history: &'a [HistoryEntry],
    /// The flushed end of the current timeline.
    pub flushed: Lsn,
}

/// The machine's answer to "what now?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Put this file into the archive, then report [`Schedule::uploaded`] or
    /// [`Schedule::failed`].
    Upload(Item),
    /// Retry after this instant (a backoff after a failure).
    RetryAt(Instant),
    /// Nothing to do until the WAL grows or the timeline changes.
    Idle,
    /// An upload is in flight: wait for its outcome.
    Busy,
}

/// The scheduler's state.
#[derive(Debug)]
pub struct Schedule {
    segment_size: u64,
    /// Every completed segment below it is archived: the durable position storage holds.
    archived: Lsn,
    /// History files archived since this machine started. After a restart each is put again;
    /// one already there with the same bytes counts as archived.
    histories: BTreeSet<TimelineId>,
    in_flight: Option<Item>,
    /// The failed item, how many times in a row, and when to try it again.
    failing: Option<(Item, u32, Instant)>,
}

impl Schedule {
    /// A machine that resumes from the durable archived position `archived`.
    pub fn new(segment_size: u64, archived: Lsn) -> Schedule {
        Schedule {
            segment_size,
            archived: archived.segment_start(segment_size),
            histories: BTreeSet::new(),
            in_flight: None,
            failing: None,
        }
    }

    pub fn archived(&self) -> Lsn {
        self.archived
    }

    /// The bytes of completed segments not yet archived.
    pub fn backlog(&self, flushed: Lsn) -> u64 {
        flushed
            .segment_start(self.segment_size)
            .saturating_sub(self.archived)
    }

    /// What to do at `now`. An `Upload` marks the item in flight until its outcome is told.
    pub fn next(&mut self, now: Instant, wal: WalView<'_>) -> Next {
        if self.in_flight.is_some() {
            return Next::Busy;
        }
        let item = match self.failing {
            Some((_, _, at)) if now < at => return Next::RetryAt(at),
            // The failed item again, even if something else now seems due: never skip.
            Some((item, _, _)) => Some(item),
            None => self.due(wal),
        };
        match item {
            Some(item) => {
                self.in_flight = Some(item);
                Next::Upload(item)
            }
            None => Next::Idle,
        }
    }

    /// The next file in archive order, if one is due.
    fn due(&self, wal: WalView<'_>) -> Option<Item> {
        // Timeline 1 has no history file; every later one of the ancestry needs its own.
        let ancestry = wal
            .history
            .iter()
            .skip(1)
            .map(|h| h.parent)
            .chain((wal.timeline.0 > 1).then_some(wal.timeline));
        if let Some(tli) = ancestry.into_iter().find(|t| !self.histories.contains(t)) {
            return Some(Item::History(tli));
        }
        let seg = self.segment_size;
        let segno = self.archived.segment_number(seg);
        let end = (segno + 1) * seg;
        if end > wal.flushed.0 {
            return None;
        }
        Some(Item::Segment {
            tli: timeline_of(Lsn(end - 1), wal),
            segno,
        })
    }

    /// The upload of the item in flight completed (or found the same bytes already there).
    /// Returns the new archived position when a segment completed: the caller stores it
    /// durably before it asks for more.
    pub fn uploaded(&mut self, item: Item) -> Option<Lsn> {
        debug_assert_eq!(self.in_flight, Some(item), "an outcome of another item");
        self.in_flight = None;
        self.failing = None;
        match item {
            Item::History(tli) => {
                self.histories.insert(tli);
                None
            }
            Item::Segment { segno, .. } => {
                self.archived = self.archived.max(Lsn((segno + 1) * self.segment_size));
                Some(self.archived)
            }
        }
    }

    /// The upload of the item in flight failed: it is retried after a backoff, and nothing
    /// else is uploaded before it succeeds. Returns when the retry is due.
    pub fn failed(&mut self, item: Item, now: Instant) -> Instant {
        debug_assert_eq!(self.in_flight, Some(item), "an outcome of another item");
        self.in_flight = None;
        let tries = match self.failing {
            Some((prev, n, _)) if prev == item => n + 1,
            _ => 1,
        };
        let at = now + backoff(tries);
        self.failing = Some((item, tries, at));
        at
    }

    /// Failures in a row of the item now failing.
    pub fn failures_in_a_row(&self) -> u32 {
        self.failing.map_or(0, |(_, n, _)| n)
    }
}

/// The wait before the attempt after `tries` failures in a row.
pub fn backoff(tries: u32) -> Duration {
    let doublings = tries.saturating_sub(1).min(16);
    (FIRST_BACKOFF * (1 << doublings)).min(MAX_BACKOFF)
}

/// The timeline of the ancestry that wrote the byte at `lsn`.
fn timeline_of(lsn: Lsn, wal: WalView<'_>) -> TimelineId {
    wal.history
        .iter()
        .find(|h| lsn < h.switch_lsn)
        .map_or(wal.timeline, |h| h.parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = 1 << 20;

    fn entry(parent: u32, switch: u64) -> HistoryEntry {
        HistoryEntry {
            parent: TimelineId(parent),
            switch_lsn: Lsn(switch),
            reason: "test".into(),
        }
    }

    fn seg(tli: u32, segno: u64) -> Item {
        Item::Segment {
            tli: TimelineId(tli),
            segno,
        }
    }

    /// Runs the machine with every upload succeeding until it is idle; returns the order.
    fn drain(s: &mut Schedule, now: Instant, wal: WalView<'_>) -> Vec<Item> {
        let mut out = Vec::new();
        while let Next::Upload(item) = s.next(now, wal) {
            s.uploaded(item);
            out.push(item);
        }
        out
    }

    #[test]
    fn completed_segments_go_in_order_and_the_current_one_waits() {
        let now = Instant::now();
        let mut s = Schedule::new(SEG, Lsn(SEG));
        let history = [];
        let wal = |flushed| WalView {
            timeline: TimelineId(1),
            history: &history,
            flushed: Lsn(flushed),
        };
        // Segment 1 is not complete until the flushed end reaches the start of segment 2.
        assert_eq!(s.next(now, wal(2 * SEG - 1)), Next::Idle);
        assert_eq!(
            drain(&mut s, now, wal(4 * SEG + 10)),
            [seg(1, 1), seg(1, 2), seg(1, 3)]
        );
        assert_eq!(s.archived(), Lsn(4 * SEG));
        assert_eq!(s.backlog(Lsn(6 * SEG + 10)), 2 * SEG);
    }

    #[test]
    fn history_files_come_before_their_timelines_segments() {
        let now = Instant::now();
        // Timeline 1 ended at 0/250000 (in segment 2), timeline 2 at 0/480000 (in segment 4).
        let history = [entry(1, 2 * SEG + 0x50000), entry(2, 4 * SEG + 0x80000)];
        let wal = WalView {
            timeline: TimelineId(3),
            history: &history,
            flushed: Lsn(6 * SEG),
        };
        let mut s = Schedule::new(SEG, Lsn(SEG));
        assert_eq!(
            drain(&mut s, now, wal),
            [
                Item::History(TimelineId(2)),
                Item::History(TimelineId(3)),
                seg(1, 1),
                // A switch segment goes under the timeline that wrote its end.
                seg(2, 2),
                seg(2, 3),
                seg(3, 4),
                seg(3, 5),
            ]
        );
    }

    #[test]
    fn a_promotion_puts_the_new_history_before_the_next_segment() {
        let now = Instant::now();
        let mut s = Schedule::new(SEG, Lsn(SEG));
        let before = [];
        let wal1 = WalView {
            timeline: TimelineId(1),
            history: &before,
            flushed: Lsn(3 * SEG + 100),
        };
        assert_eq!(drain(&mut s, now, wal1), [seg(1, 1), seg(1, 2)]);
        let after = [entry(1, 3 * SEG + 100)];
        let wal2 = WalView {
            timeline: TimelineId(2),
            history: &after,
            flushed: Lsn(5 * SEG),
        };
        assert_eq!(
            drain(&mut s, now, wal2),
            [Item::History(TimelineId(2)), seg(2, 3), seg(2, 4)]
        );
    }

    #[test]
    fn a_failure_retries_the_same_file_after_a_growing_backoff_and_skips_nothing() {
        let t0 = Instant::now();
        let history = [];
        let wal = WalView {
            timeline: TimelineId(1),
            history: &history,
            flushed: Lsn(5 * SEG),
        };
        let mut s = Schedule::new(SEG, Lsn(SEG));
        assert_eq!(s.next(t0, wal), Next::Upload(seg(1, 1)));
        assert_eq!(s.next(t0, wal), Next::Busy, "one upload at a time");
        let retry = s.failed(seg(1, 1), t0);
        assert_eq!(retry, t0 + FIRST_BACKOFF);
        // Before the retry is due nothing is offered, not even the next segment.
        assert_eq!(s.next(t0, wal), Next::RetryAt(retry));
        assert_eq!(s.next(retry, wal), Next::Upload(seg(1, 1)));
        let retry = s.failed(seg(1, 1), retry);
        assert_eq!(s.failures_in_a_row(), 2);
        assert_eq!(
            s.next(retry - Duration::from_millis(1), wal),
            Next::RetryAt(retry)
        );
        assert_eq!(s.next(retry, wal), Next::Upload(seg(1, 1)));
        assert_eq!(s.uploaded(seg(1, 1)), Some(Lsn(2 * SEG)));
        assert_eq!(s.failures_in_a_row(), 0);
        assert_eq!(drain(&mut s, retry, wal), [seg(1, 2), seg(1, 3), seg(1, 4)]);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        assert_eq!(backoff(1), FIRST_BACKOFF);
        assert_eq!(backoff(2), FIRST_BACKOFF * 2);
        assert_eq!(backoff(3), FIRST_BACKOFF * 4);
        assert_eq!(backoff(10), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn a_restart_resumes_at_the_durable_position_and_puts_histories_again() {
        let now = Instant::now();
        let history = [entry(1, 2 * SEG + 8)];
        let wal = WalView {
            timeline: TimelineId(2),
            history: &history,
            flushed: Lsn(5 * SEG),
        };
        let mut s = Schedule::new(SEG, Lsn(3 * SEG));
        assert_eq!(
            drain(&mut s, now, wal),
            [Item::History(TimelineId(2)), seg(2, 3), seg(2, 4)]
        );
    }
}
