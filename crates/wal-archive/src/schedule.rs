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
//! of a switch segment, as PostgreSQL archives it). The old timeline's unfinished switch
//! segment goes as its `.partial` ([`Item::Partial`]) when the archived position reaches that
//! segment, before the whole segment of the new timeline: at the promotion itself, or, for
//! a node that takes over archiving behind the archive's end, when it gets there (the put
//! finds the same bytes if another node put it first).
//!
//! With `archive_timeout`, once no completed segment waits, the durable prefix of the
//! current segment goes as an [`Item::Prefix`] when its oldest byte not in the archive has
//! waited that long, so the archive alone never lags by more. The time a byte first waited
//! is when this machine first saw the flushed end past what the archive covers; after a
//! prefix it is when that prefix was read, so the wait is never understated.
//!
//! A backlog of completed segments goes several at a time: after [`Schedule::next`] offered a
//! segment, [`Schedule::more`] offers the completed segments that follow it, up to a count,
//! to upload beside it. Outcomes are told in the order offered, so `archived` still moves one
//! segment at a time; a failure takes back every item after it, which is offered again after
//! the failed one (its object, if it was stored, is then found with the same bytes), and a
//! round that ends early without a failure gives back what it did not start
//! ([`Schedule::take_back`]). History files, `.partial`s, prefixes and a retry go alone.
//!
//! **Invariants:** `archived` is segment-aligned and only moves forward, one segment per
//! completed upload; a segment is offered only if it is complete (wholly below the flushed
//! end) and every history file of the ancestry was archived since this machine started;
//! `covered >= archived`, and a prefix is offered only up to the flushed end; the items in
//! flight are consecutive segments, or one item of another kind.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use wal_storage::{history_file_name, segment_file_name, HistoryEntry};
use wal_types::{Lsn, TimelineId};

use crate::read::ArchivedFile;

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
    /// The `.partial` of timeline `tli`, whose last segment `segno` ends at the switch point
    /// `end`.
    Partial {
        tli: TimelineId,
        segno: u64,
        end: Lsn,
    },
    /// The current segment's durable bytes up to `end` (`archive_timeout`).
    Prefix {
        tli: TimelineId,
        segno: u64,
        end: Lsn,
    },
}

impl Item {
    /// What a restore reads it as (`ArchivedFile::parse` of its name).
    pub fn archived_file(&self) -> ArchivedFile {
        match *self {
            Item::History(tli) => ArchivedFile::History(tli),
            Item::Segment { tli, segno } => ArchivedFile::Segment { tli, segno },
            Item::Partial { tli, segno, .. } => ArchivedFile::Partial {
                tli,
                segno,
                end: None,
            },
            Item::Prefix { tli, segno, end } => ArchivedFile::Partial {
                tli,
                segno,
                end: Some(end),
            },
        }
    }

    /// Where the archived position goes once it is archived: a whole segment's end; the
    /// other kinds do not move it.
    pub(crate) fn segment_end(&self, segment_size: u64) -> Option<Lsn> {
        match *self {
            Item::Segment { segno, .. } => Some(Lsn((segno + 1) * segment_size)),
            _ => None,
        }
    }

    fn is_prefix(&self) -> bool {
        matches!(self, Item::Prefix { .. })
    }

    /// The object's name, as the crate's story draws it.
    pub fn file_name(&self, segment_size: u64) -> String {
        match *self {
            Item::History(tli) => history_file_name(tli),
            Item::Segment { tli, segno } => segment_file_name(tli, segno, segment_size),
            Item::Partial { tli, segno, .. } => {
                format!("{}.partial", segment_file_name(tli, segno, segment_size))
            }
            Item::Prefix { tli, segno, end } => format!(
                "{}{:08X}",
                prefix_stem(tli, segno, segment_size),
                end.segment_offset(segment_size)
            ),
        }
    }
}

/// What the names of every `archive_timeout` prefix of a segment start with (and its
/// `.partial`'s does not).
pub fn prefix_stem(tli: TimelineId, segno: u64, segment_size: u64) -> String {
    format!("{}.partial.", segment_file_name(tli, segno, segment_size))
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
    /// Ask again at this instant: a backoff after a failure, or the next `archive_timeout`
    /// upload; a change of the WAL may make something due sooner.
    WaitUntil(Instant),
    /// Nothing to do until the WAL grows or the timeline changes.
    Idle,
    /// An upload is in flight: wait for its outcome.
    Busy,
}

/// The scheduler's state.
#[derive(Debug)]
pub struct Schedule {
    segment_size: u64,
    /// `archive_timeout`; `None` puts no prefixes.
    timeout: Option<Duration>,
    /// Every completed segment below it is archived: the durable position storage holds.
    archived: Lsn,
    /// The archive holds the current timeline's WAL up to here: `archived`, or the end of the
    /// last prefix put when that is further.
    covered: Lsn,
    /// Since when WAL past `covered` has been durable, as far as this machine knows.
    waiting_since: Option<Instant>,
    /// When the prefix in flight was read: its successor's bytes waited at most since then.
    prefix_read_at: Option<Instant>,
    /// History files archived since this machine started. After a restart each is put again;
    /// one already there with the same bytes counts as archived.
    histories: BTreeSet<TimelineId>,
    /// Timelines whose `.partial` was put since this machine started.
    partials: BTreeSet<TimelineId>,
    /// Offered and not yet told, in the order offered.
    in_flight: VecDeque<Item>,
    /// The failed item, how many times in a row, and when to try it again.
    failing: Option<(Item, u32, Instant)>,
}

impl Schedule {
    /// A machine that resumes from the durable archived position `archived`, putting the
    /// current segment's prefix every `timeout` when there is one.
    pub fn new(segment_size: u64, archived: Lsn, timeout: Option<Duration>) -> Schedule {
        let archived = archived.segment_start(segment_size);
        Schedule {
            segment_size,
            timeout: timeout.filter(|t| !t.is_zero()),
            archived,
            covered: archived,
            waiting_since: None,
            prefix_read_at: None,
            histories: BTreeSet::new(),
            partials: BTreeSet::new(),
            in_flight: VecDeque::new(),
            failing: None,
        }
    }

    pub fn archived(&self) -> Lsn {
        self.archived
    }

    /// How far the archive holds the current timeline's WAL (segments and prefixes).
    pub fn covered(&self) -> Lsn {
        self.covered
    }

    /// The bytes of completed segments not yet archived.
    pub fn backlog(&self, flushed: Lsn) -> u64 {
        flushed
            .segment_start(self.segment_size)
            .saturating_sub(self.archived)
    }

    /// What to do at `now`. An `Upload` marks the item in flight until its outcome is told.
    pub fn next(&mut self, now: Instant, wal: WalView<'_>) -> Next {
        if wal.flushed > self.covered {
            let since = self.prefix_read_at.take().unwrap_or(now);
            self.waiting_since.get_or_insert(since);
        } else {
            // Everything durable is covered now: later bytes wait from now at most.
            self.waiting_since = None;
            self.prefix_read_at = None;
        }
        if !self.in_flight.is_empty() {
            return Next::Busy;
        }
        let due = match self.failing {
            Some((_, _, at)) if now < at => return Next::WaitUntil(at),
            // A failed prefix is not put again as it was: what is due now covers more.
            Some((item, _, _)) if item.is_prefix() => self.due(now, wal),
            // The failed item again, even if something else now seems due: never skip.
            Some((item, _, _)) => Ok(item),
            None => self.due(now, wal),
        };
        match due {
            Ok(item) => {
                if let Item::Prefix { .. } = item {
                    self.prefix_read_at = Some(now);
                }
                self.in_flight.push_back(item);
                Next::Upload(item)
            }
            Err(Some(at)) => Next::WaitUntil(at),
            Err(None) => Next::Idle,
        }
    }

    /// The next file in archive order if one is due, else when one will be (if known).
    fn due(&self, now: Instant, wal: WalView<'_>) -> Result<Item, Option<Instant>> {
        // Timeline 1 has no history file; every later one of the ancestry needs its own.
        let ancestry = wal
            .history
            .iter()
            .skip(1)
            .map(|h| h.parent)
            .chain((wal.timeline.0 > 1).then_some(wal.timeline));
        if let Some(tli) = ancestry.into_iter().find(|t| !self.histories.contains(t)) {
            return Ok(Item::History(tli));
        }
        let seg = self.segment_size;
        let segno = self.archived.segment_number(seg);
        // A switch inside the segment the archive is at: the old timeline's `.partial` first.
        if let Some(h) = wal.history.iter().find(|h| {
            h.switch_lsn.segment_number(seg) == segno
                && h.switch_lsn.segment_offset(seg) != 0
                && !self.partials.contains(&h.parent)
        }) {
            return Ok(Item::Partial {
                tli: h.parent,
                segno,
                end: h.switch_lsn,
            });
        }
        let end = (segno + 1) * seg;
        if end <= wal.flushed.0 {
            return Ok(Item::Segment {
                tli: timeline_of(Lsn(end - 1), wal),
                segno,
            });
        }
        let (Some(timeout), Some(since)) = (self.timeout, self.waiting_since) else {
            return Err(None);
        };
        if wal.flushed <= self.covered {
            return Err(None);
        }
        let at = since + timeout;
        if now < at {
            return Err(Some(at));
        }
        Ok(Item::Prefix {
            tli: timeline_of(Lsn(wal.flushed.0 - 1), wal),
            segno,
            end: wal.flushed,
        })
    }

    /// Up to `max` completed segments after the last one in flight, to upload beside it:
    /// marked in flight, their outcomes told after its. Nothing while a retry or an item of
    /// another kind is in flight, and nothing past a segment that holds a timeline switch
    /// (its `.partial` goes first, alone).
    pub fn more(&mut self, wal: WalView<'_>, max: usize) -> Vec<Item> {
        let seg = self.segment_size;
        let mut out = Vec::new();
        let Some(&Item::Segment {
            segno: mut last, ..
        }) = self.in_flight.back()
        else {
            return out;
        };
        if self.failing.is_some() {
            return out;
        }
        while out.len() < max {
            let segno = last + 1;
            let end = (segno + 1) * seg;
            let switch_inside = wal.history.iter().any(|h| {
                h.switch_lsn.segment_number(seg) == segno && h.switch_lsn.segment_offset(seg) != 0
            });
            if end > wal.flushed.0 || switch_inside {
                break;
            }
            let item = Item::Segment {
                tli: timeline_of(Lsn(end - 1), wal),
                segno,
            };
            self.in_flight.push_back(item);
            out.push(item);
            last = segno;
        }
        out
    }

    /// The upload of the first item in flight completed (or found the same bytes already
    /// there). Returns the new archived position when a segment completed: the caller stores
    /// it durably before it asks for more.
    pub fn uploaded(&mut self, item: Item) -> Option<Lsn> {
        let first = self.in_flight.pop_front();
        debug_assert_eq!(first, Some(item), "an outcome out of order");
        self.failing = None;
        match item {
            Item::History(tli) => {
                self.histories.insert(tli);
                None
            }
            Item::Partial { tli, .. } => {
                self.partials.insert(tli);
                None
            }
            Item::Prefix { end, .. } => {
                self.covered = self.covered.max(end);
                // The bytes after it were durable at most since it was read.
                self.waiting_since = None;
                None
            }
            Item::Segment { segno, .. } => {
                self.archived = self.archived.max(Lsn((segno + 1) * self.segment_size));
                self.covered = self.covered.max(self.archived);
                Some(self.archived)
            }
        }
    }

    /// The upload of the first item in flight failed: it is retried after a backoff, and
    /// nothing else is uploaded before it succeeds; the items after it are taken back (their
    /// outcomes are not told). Returns when the retry is due.
    pub fn failed(&mut self, item: Item, now: Instant) -> Instant {
        debug_assert_eq!(
            self.in_flight.front(),
            Some(&item),
            "an outcome out of order"
        );
        self.in_flight.clear();
        self.prefix_read_at = None;
        let tries = match self.failing {
            Some((prev, n, _)) if prev == item || (prev.is_prefix() && item.is_prefix()) => n + 1,
            _ => 1,
        };
        let at = now + backoff(tries);
        self.failing = Some((item, tries, at));
        at
    }

    /// The items still in flight will not be told: a round of uploads ended before it
    /// started them (the archiver is stopping, or lost the leader's fence). They are offered
    /// again, from the first, at the next [`Schedule::next`]; nothing failed, so no backoff.
    pub fn take_back(&mut self) {
        self.in_flight.clear();
    }

    /// Failures in a row of the item now failing.
    pub fn failures_in_a_row(&self) -> u32 {
        self.failing.map_or(0, |(_, n, _)| n)
    }

    /// Checks the ordering relations of the module's invariants.
    pub fn check_invariants(&self) {
        debug_assert_eq!(self.archived.segment_offset(self.segment_size), 0);
        debug_assert!(self.covered >= self.archived);
        let segments: Vec<u64> = self
            .in_flight
            .iter()
            .filter_map(|i| match i {
                Item::Segment { segno, .. } => Some(*segno),
                _ => None,
            })
            .collect();
        debug_assert!(
            segments.len() == self.in_flight.len() || self.in_flight.len() <= 1,
            "only segments go several at a time: {:?}",
            self.in_flight
        );
        debug_assert!(
            segments.windows(2).all(|w| w[1] == w[0] + 1),
            "segments in flight are consecutive: {segments:?}"
        );
    }
}

/// The wait before the attempt after `tries` failures in a row.
pub fn backoff(tries: u32) -> Duration {
    let doublings = tries.saturating_sub(1).min(16);
    (FIRST_BACKOFF * (1 << doublings)).min(MAX_BACKOFF)
}

/// The timeline of the ancestry that wrote the byte at `lsn`.
pub(crate) fn timeline_of(lsn: Lsn, wal: WalView<'_>) -> TimelineId {
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

    fn partial(tli: u32, segno: u64, end: u64) -> Item {
        Item::Partial {
            tli: TimelineId(tli),
            segno,
            end: Lsn(end),
        }
    }

    fn prefix(tli: u32, segno: u64, end: u64) -> Item {
        Item::Prefix {
            tli: TimelineId(tli),
            segno,
            end: Lsn(end),
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
        let mut s = Schedule::new(SEG, Lsn(SEG), None);
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
        let mut s = Schedule::new(SEG, Lsn(SEG), None);
        assert_eq!(
            drain(&mut s, now, wal),
            [
                Item::History(TimelineId(2)),
                Item::History(TimelineId(3)),
                seg(1, 1),
                // The old timeline's last segment as its `.partial`, then the switch segment
                // under the timeline that wrote its end.
                partial(1, 2, 2 * SEG + 0x50000),
                seg(2, 2),
                seg(2, 3),
                partial(2, 4, 4 * SEG + 0x80000),
                seg(3, 4),
                seg(3, 5),
            ]
        );
    }

    #[test]
    fn a_promotion_puts_the_new_history_before_the_next_segment() {
        let now = Instant::now();
        let mut s = Schedule::new(SEG, Lsn(SEG), None);
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
            [
                Item::History(TimelineId(2)),
                partial(1, 3, 3 * SEG + 100),
                seg(2, 3),
                seg(2, 4)
            ]
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
        let mut s = Schedule::new(SEG, Lsn(SEG), None);
        assert_eq!(s.next(t0, wal), Next::Upload(seg(1, 1)));
        assert_eq!(s.next(t0, wal), Next::Busy, "one upload at a time");
        let retry = s.failed(seg(1, 1), t0);
        assert_eq!(retry, t0 + FIRST_BACKOFF);
        // Before the retry is due nothing is offered, not even the next segment.
        assert_eq!(s.next(t0, wal), Next::WaitUntil(retry));
        assert_eq!(s.next(retry, wal), Next::Upload(seg(1, 1)));
        let retry = s.failed(seg(1, 1), retry);
        assert_eq!(s.failures_in_a_row(), 2);
        assert_eq!(
            s.next(retry - Duration::from_millis(1), wal),
            Next::WaitUntil(retry)
        );
        assert_eq!(s.next(retry, wal), Next::Upload(seg(1, 1)));
        assert_eq!(s.uploaded(seg(1, 1)), Some(Lsn(2 * SEG)));
        assert_eq!(s.failures_in_a_row(), 0);
        assert_eq!(drain(&mut s, retry, wal), [seg(1, 2), seg(1, 3), seg(1, 4)]);
    }

    #[test]
    fn a_backlog_goes_several_segments_at_once_and_a_failure_takes_back_those_after_it() {
        let t0 = Instant::now();
        let history = [entry(1, 7 * SEG + 100)];
        let wal = WalView {
            timeline: TimelineId(2),
            history: &history,
            flushed: Lsn(9 * SEG + 5),
        };
        let mut s = Schedule::new(SEG, Lsn(SEG), None);
        assert_eq!(s.next(t0, wal), Next::Upload(Item::History(TimelineId(2))));
        assert!(s.more(wal, 3).is_empty(), "a history file goes alone");
        s.uploaded(Item::History(TimelineId(2)));
        assert_eq!(s.next(t0, wal), Next::Upload(seg(1, 1)));
        assert_eq!(s.more(wal, 3), [seg(1, 2), seg(1, 3), seg(1, 4)]);
        s.check_invariants();
        assert_eq!(s.next(t0, wal), Next::Busy);
        // Outcomes in order: the archived position moves one segment at a time.
        assert_eq!(s.uploaded(seg(1, 1)), Some(Lsn(2 * SEG)));
        assert_eq!(s.uploaded(seg(1, 2)), Some(Lsn(3 * SEG)));
        // The third fails: the fourth is taken back, and only the third is retried.
        let retry = s.failed(seg(1, 3), t0);
        assert_eq!(s.archived(), Lsn(3 * SEG));
        assert_eq!(s.next(retry, wal), Next::Upload(seg(1, 3)));
        assert!(s.more(wal, 3).is_empty(), "a retry goes alone");
        s.uploaded(seg(1, 3));
        // Then a batch again, up to the segment holding the switch: timeline 1's `.partial`
        // goes alone before it.
        assert_eq!(s.next(retry, wal), Next::Upload(seg(1, 4)));
        assert_eq!(s.more(wal, 8), [seg(1, 5), seg(1, 6)]);
        for n in 4..=6 {
            s.uploaded(seg(1, n));
        }
        assert_eq!(
            s.next(retry, wal),
            Next::Upload(partial(1, 7, 7 * SEG + 100))
        );
        assert!(s.more(wal, 3).is_empty());
        s.uploaded(partial(1, 7, 7 * SEG + 100));
        // The switch segment and the next complete one, under timeline 2; 9 is the current.
        assert_eq!(s.next(retry, wal), Next::Upload(seg(2, 7)));
        assert_eq!(s.more(wal, 3), [seg(2, 8)]);
        s.check_invariants();
    }

    #[test]
    fn segments_taken_back_are_offered_again_in_order_without_a_backoff() {
        let t0 = Instant::now();
        let wal = WalView {
            timeline: TimelineId(1),
            history: &[],
            flushed: Lsn(9 * SEG),
        };
        let mut s = Schedule::new(SEG, Lsn(SEG), None);
        assert_eq!(s.next(t0, wal), Next::Upload(seg(1, 1)));
        assert_eq!(
            s.more(wal, 5),
            [seg(1, 2), seg(1, 3), seg(1, 4), seg(1, 5), seg(1, 6)]
        );
        s.uploaded(seg(1, 1));
        s.uploaded(seg(1, 2));
        // The round stopped before it started the rest: they come back from the third on.
        s.take_back();
        s.check_invariants();
        assert_eq!(s.failures_in_a_row(), 0);
        assert_eq!(s.archived(), Lsn(3 * SEG));
        assert_eq!(s.next(t0, wal), Next::Upload(seg(1, 3)));
        assert_eq!(
            s.more(wal, 8),
            [seg(1, 4), seg(1, 5), seg(1, 6), seg(1, 7), seg(1, 8)]
        );
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
        let mut s = Schedule::new(SEG, Lsn(3 * SEG), None);
        assert_eq!(
            drain(&mut s, now, wal),
            [Item::History(TimelineId(2)), seg(2, 3), seg(2, 4)]
        );
    }

    #[test]
    fn a_switch_on_a_segment_boundary_has_no_partial() {
        let now = Instant::now();
        let history = [entry(1, 3 * SEG)];
        let wal = WalView {
            timeline: TimelineId(2),
            history: &history,
            flushed: Lsn(4 * SEG),
        };
        let mut s = Schedule::new(SEG, Lsn(2 * SEG), None);
        assert_eq!(
            drain(&mut s, now, wal),
            [Item::History(TimelineId(2)), seg(1, 2), seg(2, 3)]
        );
    }

    #[test]
    fn archive_timeout_puts_the_durable_prefix_once_its_oldest_byte_waited_that_long() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(10);
        let history = [];
        let wal = |flushed| WalView {
            timeline: TimelineId(1),
            history: &history,
            flushed: Lsn(flushed),
        };
        let mut s = Schedule::new(SEG, Lsn(SEG), Some(timeout));
        // Nothing beyond the archive: nothing to wait for.
        assert_eq!(s.next(t0, wal(SEG)), Next::Idle);
        // WAL first seen at t0 + 1 s is due at t0 + 11 s, however it grows meanwhile.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(s.next(t1, wal(SEG + 100)), Next::WaitUntil(t1 + timeout));
        assert_eq!(
            s.next(t1 + Duration::from_secs(5), wal(SEG + 200)),
            Next::WaitUntil(t1 + timeout)
        );
        let t2 = t1 + timeout;
        assert_eq!(
            s.next(t2, wal(SEG + 300)),
            Next::Upload(prefix(1, 1, SEG + 300))
        );
        assert_eq!(s.uploaded(prefix(1, 1, SEG + 300)), None);
        assert_eq!(s.covered(), Lsn(SEG + 300));
        assert_eq!(s.archived(), Lsn(SEG), "a prefix does not move the hold");
        // Nothing new: idle. New WAL after the prefix was read waits from that read at most.
        assert_eq!(s.next(t2, wal(SEG + 300)), Next::Idle);
        let t3 = t2 + Duration::from_secs(3);
        assert_eq!(s.next(t3, wal(SEG + 400)), Next::WaitUntil(t3 + timeout));
        // A completed segment goes whole at once, without waiting for the timeout.
        assert_eq!(s.next(t3, wal(2 * SEG + 10)), Next::Upload(seg(1, 1)));
        assert_eq!(s.uploaded(seg(1, 1)), Some(Lsn(2 * SEG)));
        assert_eq!(s.covered(), Lsn(2 * SEG));
        // The next segment's bytes have waited since t3 at most: due at t3 + timeout.
        assert_eq!(
            s.next(t3 + Duration::from_secs(1), wal(2 * SEG + 10)),
            Next::WaitUntil(t3 + timeout)
        );
        assert_eq!(
            s.next(t3 + timeout, wal(2 * SEG + 20)),
            Next::Upload(prefix(1, 2, 2 * SEG + 20))
        );
        s.check_invariants();
    }

    #[test]
    fn a_failed_prefix_backs_off_then_puts_what_is_due_then() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(5);
        let history = [];
        let wal = |flushed| WalView {
            timeline: TimelineId(1),
            history: &history,
            flushed: Lsn(flushed),
        };
        let mut s = Schedule::new(SEG, Lsn(SEG), Some(timeout));
        assert_eq!(s.next(t0, wal(SEG + 1)), Next::WaitUntil(t0 + timeout));
        let t1 = t0 + timeout;
        assert_eq!(
            s.next(t1, wal(SEG + 2)),
            Next::Upload(prefix(1, 1, SEG + 2))
        );
        let retry = s.failed(prefix(1, 1, SEG + 2), t1);
        assert_eq!(s.next(t1, wal(SEG + 3)), Next::WaitUntil(retry));
        // At the retry the longer prefix goes, not the one that failed.
        assert_eq!(
            s.next(retry, wal(SEG + 4)),
            Next::Upload(prefix(1, 1, SEG + 4))
        );
        let retry = s.failed(prefix(1, 1, SEG + 4), retry);
        assert_eq!(s.failures_in_a_row(), 2);
        // A segment completed meanwhile goes whole at the retry.
        assert_eq!(s.next(retry, wal(2 * SEG)), Next::Upload(seg(1, 1)));
        s.uploaded(seg(1, 1));
        assert_eq!(s.failures_in_a_row(), 0);
    }

    #[test]
    fn prefixes_follow_a_promotion_under_the_new_timeline() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(1);
        let mut s = Schedule::new(SEG, Lsn(SEG), Some(timeout));
        let none = [];
        let wal1 = WalView {
            timeline: TimelineId(1),
            history: &none,
            flushed: Lsn(SEG + 100),
        };
        assert_eq!(s.next(t0, wal1), Next::WaitUntil(t0 + timeout));
        let t1 = t0 + timeout;
        assert_eq!(s.next(t1, wal1), Next::Upload(prefix(1, 1, SEG + 100)));
        s.uploaded(prefix(1, 1, SEG + 100));
        let after = [entry(1, SEG + 100)];
        let wal2 = WalView {
            timeline: TimelineId(2),
            history: &after,
            flushed: Lsn(SEG + 150),
        };
        let t2 = t1 + timeout;
        assert_eq!(
            drain(&mut s, t2 + timeout, wal2),
            [
                Item::History(TimelineId(2)),
                partial(1, 1, SEG + 100),
                prefix(2, 1, SEG + 150)
            ]
        );
    }

    #[test]
    fn names_are_what_a_restore_parses() {
        let size = 16 << 20;
        for (item, name) in [
            (Item::History(TimelineId(3)), "00000003.history"),
            (seg(3, 0x102), "000000030000000100000002"),
            (
                Item::Partial {
                    tli: TimelineId(3),
                    segno: 0x102,
                    end: Lsn(0x1_0234_5678),
                },
                "000000030000000100000002.partial",
            ),
            (
                Item::Prefix {
                    tli: TimelineId(3),
                    segno: 0x102,
                    end: Lsn(0x1_0234_5678),
                },
                "000000030000000100000002.partial.00345678",
            ),
        ] {
            assert_eq!(item.file_name(size), name);
            assert_eq!(ArchivedFile::parse(name, size), Some(item.archived_file()));
        }
        // Fixed width: prefixes of a segment sort by their end.
        let p = |end| Item::Prefix {
            tli: TimelineId(1),
            segno: 1,
            end: Lsn(end),
        };
        assert!(p(size + 0xF0).file_name(size) < p(size + 0x100).file_name(size));
        assert!(p(size + 1)
            .file_name(size)
            .starts_with(&prefix_stem(TimelineId(1), 1, size)));
    }
}
