//! Replication lag as PostgreSQL's walsender measures it (`LagTracker` in walsender.c).
//!
//! Each time WAL is sent, the walsender records a sample (LSN, time). When the standby reports
//! that it has written, flushed or applied up to some LSN, the lag for that position is the time
//! elapsed since the newest sample at or below the reported LSN was recorded. Between samples
//! the time is interpolated, so a standby that is stuck shows a lag that keeps growing. Once a
//! standby has fully applied everything in two consecutive replies, the lags are cleared, so an
//! idle, caught-up standby shows no lag rather than a stale one.

use std::time::Duration;

use wal_storage::Lsn;

/// PostgreSQL's `LAG_TRACKER_BUFFER_SIZE`.
const BUFFER_SIZE: usize = 8192;

/// The three positions a standby reports, as PostgreSQL's `SyncRepWaitMode` numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LagKind {
    Write = 0,
    Flush = 1,
    Apply = 2,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Sample {
    lsn: Lsn,
    /// Microseconds on any monotonic-enough clock the caller uses consistently; 0 means "none".
    time: i64,
}

/// Lag samples for one walsender.
pub struct LagTracker {
    last_lsn: Lsn,
    buffer: Box<[Sample]>,
    write_head: usize,
    read_heads: [usize; 3],
    last_read: [Sample; 3],
}

impl Default for LagTracker {
    fn default() -> Self {
        LagTracker {
            last_lsn: Lsn::INVALID,
            buffer: vec![Sample::default(); BUFFER_SIZE].into_boxed_slice(),
            write_head: 0,
            read_heads: [0; 3],
            last_read: [Sample::default(); 3],
        }
    }
}

impl LagTracker {
    /// Records that WAL up to `lsn` was sent at `now_us`.
    pub fn record_sent(&mut self, lsn: Lsn, now_us: i64) {
        if lsn <= self.last_lsn {
            return;
        }
        self.last_lsn = lsn;
        let mut next = (self.write_head + 1) % BUFFER_SIZE;
        if self.read_heads.contains(&next) {
            // The buffer is full. PostgreSQL rewinds by one slot and overwrites the newest
            // sample, which lowers the sampling rate unevenly but keeps memory fixed.
            next = self.write_head;
            self.write_head = (self.write_head + BUFFER_SIZE - 1) % BUFFER_SIZE;
        }
        self.buffer[self.write_head] = Sample { lsn, time: now_us };
        self.write_head = next;
    }

    /// The lag for a reported position, or `None` if nothing can be said (PostgreSQL's -1).
    pub fn read(&mut self, kind: LagKind, lsn: Lsn, now_us: i64) -> Option<Duration> {
        let h = kind as usize;
        let mut time = 0i64;
        while self.read_heads[h] != self.write_head && self.buffer[self.read_heads[h]].lsn <= lsn {
            time = self.buffer[self.read_heads[h]].time;
            self.last_read[h] = self.buffer[self.read_heads[h]];
            self.read_heads[h] = (self.read_heads[h] + 1) % BUFFER_SIZE;
        }
        // Everything sent has been processed: forget the last sample, so that the start of the
        // next burst is not interpolated against a stale one.
        if self.read_heads[h] == self.write_head {
            self.last_read[h].time = 0;
        }
        if time > now_us {
            return None;
        }
        if time == 0 {
            if self.read_heads[h] == self.write_head {
                return None;
            }
            let next = self.buffer[self.read_heads[h]];
            let prev = self.last_read[h];
            if prev.time != 0 {
                if lsn < prev.lsn || prev.time > next.time || next.lsn <= prev.lsn {
                    return None;
                }
                let fraction = (lsn.0 - prev.lsn.0) as f64 / (next.lsn.0 - prev.lsn.0) as f64;
                time = prev.time + ((next.time - prev.time) as f64 * fraction) as i64;
            } else {
                // Only a future sample: report the lag it would have if it were reached now.
                time = next.time;
            }
        }
        Some(Duration::from_micros(
            now_us.saturating_sub(time).max(0) as u64
        ))
    }
}

/// The three lags a walsender shows, with PostgreSQL's rule for clearing them.
#[derive(Default)]
pub struct StandbyLags {
    tracker: LagTracker,
    fully_applied_last_time: bool,
    pub write_lag: Option<Duration>,
    pub flush_lag: Option<Duration>,
    pub replay_lag: Option<Duration>,
}

impl StandbyLags {
    pub fn record_sent(&mut self, lsn: Lsn, now_us: i64) {
        self.tracker.record_sent(lsn, now_us);
    }

    /// Updates the lags from a standby reply; `sent` is what this walsender has sent so far.
    pub fn on_reply(&mut self, write: Lsn, flush: Lsn, apply: Lsn, sent: Lsn, now_us: i64) {
        let w = self.tracker.read(LagKind::Write, write, now_us);
        let f = self.tracker.read(LagKind::Flush, flush, now_us);
        let a = self.tracker.read(LagKind::Apply, apply, now_us);
        // Two consecutive fully-applied replies mean the standby is idle and caught up; the
        // second one comes from its status interval, a good moment to drop stale lags.
        let mut clear = false;
        if apply == sent {
            clear = self.fully_applied_last_time;
            self.fully_applied_last_time = true;
        } else {
            self.fully_applied_last_time = false;
        }
        if w.is_some() || clear {
            self.write_lag = w;
        }
        if f.is_some() || clear {
            self.flush_lag = f;
        }
        if a.is_some() || clear {
            self.replay_lag = a;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1000;

    #[test]
    fn lag_is_time_since_the_sample_was_sent() {
        let mut t = LagTracker::default();
        t.record_sent(Lsn(100), 10 * MS);
        t.record_sent(Lsn(200), 20 * MS);
        assert_eq!(
            t.read(LagKind::Flush, Lsn(100), 25 * MS),
            Some(Duration::from_millis(15))
        );
        assert_eq!(
            t.read(LagKind::Flush, Lsn(200), 30 * MS),
            Some(Duration::from_millis(10))
        );
        // Each kind has its own read head.
        assert_eq!(
            t.read(LagKind::Write, Lsn(200), 30 * MS),
            Some(Duration::from_millis(10))
        );
        // Nothing left to measure.
        assert_eq!(t.read(LagKind::Flush, Lsn(200), 40 * MS), None);
    }

    #[test]
    fn stuck_standby_shows_growing_interpolated_lag() {
        let mut t = LagTracker::default();
        t.record_sent(Lsn(100), 10 * MS);
        t.record_sent(Lsn(300), 30 * MS);
        assert_eq!(
            t.read(LagKind::Apply, Lsn(100), 40 * MS),
            Some(Duration::from_millis(30))
        );
        // Halfway to the next sample: the time is interpolated to 20 ms.
        assert_eq!(
            t.read(LagKind::Apply, Lsn(200), 50 * MS),
            Some(Duration::from_millis(30))
        );
        assert_eq!(
            t.read(LagKind::Apply, Lsn(200), 90 * MS),
            Some(Duration::from_millis(70))
        );
    }

    #[test]
    fn a_future_sample_only_gives_its_hypothetical_lag() {
        let mut t = LagTracker::default();
        t.record_sent(Lsn(100), 10 * MS);
        assert_eq!(
            t.read(LagKind::Write, Lsn(50), 15 * MS),
            Some(Duration::from_millis(5))
        );
    }

    #[test]
    fn full_buffer_keeps_working() {
        let mut t = LagTracker::default();
        for i in 1..=(3 * BUFFER_SIZE as u64) {
            t.record_sent(Lsn(i * 10), i as i64 * MS);
        }
        let lag = t.read(
            LagKind::Flush,
            Lsn(3 * BUFFER_SIZE as u64 * 10),
            1_000_000 * MS,
        );
        assert!(lag.is_some());
        assert_eq!(t.read(LagKind::Flush, Lsn(u64::MAX), 1_000_000 * MS), None);
    }

    #[test]
    fn lags_clear_after_two_fully_applied_replies() {
        let mut l = StandbyLags::default();
        l.record_sent(Lsn(100), 10 * MS);
        l.on_reply(Lsn(100), Lsn(100), Lsn(100), Lsn(100), 12 * MS);
        assert_eq!(l.replay_lag, Some(Duration::from_millis(2)));
        l.on_reply(Lsn(100), Lsn(100), Lsn(100), Lsn(100), 20 * MS);
        assert_eq!(l.replay_lag, None);
        assert_eq!(l.flush_lag, None);
        assert_eq!(l.write_lag, None);
    }

    #[test]
    fn lags_are_kept_while_standby_is_behind() {
        let mut l = StandbyLags::default();
        l.record_sent(Lsn(100), 10 * MS);
        l.record_sent(Lsn(200), 20 * MS);
        l.on_reply(Lsn(200), Lsn(100), Lsn(0), Lsn(200), 25 * MS);
        assert_eq!(l.write_lag, Some(Duration::from_millis(5)));
        assert_eq!(l.flush_lag, Some(Duration::from_millis(15)));
        // Nothing new to measure for write: the old value stays.
        l.on_reply(Lsn(200), Lsn(100), Lsn(0), Lsn(200), 30 * MS);
        assert_eq!(l.write_lag, Some(Duration::from_millis(5)));
    }
}
