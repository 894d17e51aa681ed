//! The archiver's status: `pg_stat_archiver`'s columns and what this archiver adds.

use std::collections::VecDeque;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use wal_types::time::{de_opt_time, ser_opt_time};
use wal_types::Lsn;

/// What `/status` shows as `archiver`. The first six fields are `pg_stat_archiver`'s columns
/// (since this archiver started); the rest say where it is and what is wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiverStatus {
    pub archived_count: u64,
    pub last_archived_wal: Option<String>,
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub last_archived_time: Option<SystemTime>,
    pub failed_count: u64,
    pub last_failed_wal: Option<String>,
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub last_failed_time: Option<SystemTime>,
    /// Every completed segment below it is archived (the durable position storage holds).
    pub archived_lsn: Option<Lsn>,
    /// The archive holds the current timeline's WAL up to here: completed segments and the
    /// last `archive_timeout` upload.
    pub covered_lsn: Option<Lsn>,
    /// Bytes of completed segments not yet archived.
    pub backlog_bytes: u64,
    /// When the oldest completed segment not yet archived was completed (its last byte
    /// flushed); `None` with no backlog. [`ArchiverStatus::backlog_seconds`] is its age.
    #[serde(
        default,
        serialize_with = "ser_opt_time",
        deserialize_with = "de_opt_time"
    )]
    pub backlog_since: Option<SystemTime>,
    /// What waits for the archive is past `archive_max_backlog`: appends are refused and a
    /// relay stops reading from its upstream until it falls.
    #[serde(default)]
    pub backpressure: bool,
    /// The last failure's message, until an upload succeeds.
    pub last_error: Option<String>,
    /// Set when the archive holds an object of the same name with other bytes (it is never
    /// overwritten), names another system, or sits on a store that ignores `If-None-Match`:
    /// archiving stays stuck until a person looks.
    pub alarm: Option<String>,
}

impl ArchiverStatus {
    /// The backlog's age at `now`: how long the oldest completed segment not yet archived
    /// has waited; 0 with no backlog.
    pub fn backlog_seconds(&self, now: SystemTime) -> f64 {
        self.backlog_since
            .and_then(|t| now.duration_since(t).ok())
            .map_or(0.0, |d| d.as_secs_f64())
    }
}

/// When each completed segment not yet archived was completed, so that the backlog has an
/// age as well as a size. The times are the archiver's observations of storage's flushed
/// end: a segment completed before the archiver started counts from its start, and one
/// completed during an upload from the next position change it hears, so the age is at
/// worst a little short.
#[derive(Debug, Default)]
pub(crate) struct BacklogClock {
    /// The end of every completed segment seen and not yet archived, with when it was seen
    /// completed, oldest first.
    completed: VecDeque<(u64, SystemTime)>,
    /// The completed end last seen.
    seen: u64,
}

impl BacklogClock {
    /// Notes the archived position and the flushed end at `now`; returns the completion
    /// time of the oldest segment still waiting.
    pub(crate) fn observe(
        &mut self,
        segment_size: u64,
        archived: Lsn,
        flushed: Lsn,
        now: SystemTime,
    ) -> Option<SystemTime> {
        while self
            .completed
            .front()
            .is_some_and(|(end, _)| *end <= archived.0)
        {
            self.completed.pop_front();
        }
        let complete = flushed.segment_start(segment_size).0;
        let mut end = self.seen.max(archived.0) + segment_size;
        while end <= complete {
            self.completed.push_back((end, now));
            end += segment_size;
        }
        self.seen = self.seen.max(complete);
        self.completed.front().map(|(_, t)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SEG: u64 = 1 << 20;

    #[test]
    fn the_backlog_ages_from_its_oldest_completed_segment() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut c = BacklogClock::default();
        // Segments 1 and 2 complete at start, archived from 1.
        assert_eq!(
            c.observe(SEG, Lsn(SEG), Lsn(3 * SEG + 5), at(0)),
            Some(at(0))
        );
        // Segment 3 completes at 10; nothing archived yet: still the oldest, from 0.
        assert_eq!(c.observe(SEG, Lsn(SEG), Lsn(4 * SEG), at(10)), Some(at(0)));
        // 1 and 2 archived: the oldest waiting is 3, completed at 10.
        assert_eq!(
            c.observe(SEG, Lsn(3 * SEG), Lsn(4 * SEG), at(20)),
            Some(at(10))
        );
        // All archived: no backlog; a segment completing later starts a new age.
        assert_eq!(c.observe(SEG, Lsn(4 * SEG), Lsn(4 * SEG + 9), at(30)), None);
        assert_eq!(
            c.observe(SEG, Lsn(4 * SEG), Lsn(5 * SEG), at(40)),
            Some(at(40))
        );
        let s = ArchiverStatus {
            backlog_since: Some(at(40)),
            ..ArchiverStatus::default()
        };
        assert_eq!(s.backlog_seconds(at(45)), 5.0);
        assert_eq!(ArchiverStatus::default().backlog_seconds(at(45)), 0.0);
    }
}
