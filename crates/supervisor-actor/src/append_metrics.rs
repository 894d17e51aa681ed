//! The supervisor's counts of the appends it answers, by durability level, with their latency
//! and their wait for synchronous standbys, as `/metrics` shows them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wal_types::metrics::Histogram;

use crate::durability::Durability;

/// What `/metrics` shows of appends, counted by the supervisor as it answers them, by the
/// durability level each asked for (the node's default when it named none).
#[derive(Debug, Default)]
pub struct AppendMetrics {
    by_level: [LevelCounts; 4],
    /// From the request's arrival to its answer, for appends that succeeded.
    pub latency_seconds: Histogram,
    /// How long acknowledged appends waited for the synchronous standbys, after their local
    /// flush; appends that did not wait (`local`, or no synchronous standbys) are not in it.
    pub sync_wait_seconds: Histogram,
}

#[derive(Debug, Default)]
struct LevelCounts {
    appends: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    failures: AtomicU64,
}

/// The counts of one durability level at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendCounts {
    /// Appends acknowledged (each may hold many records).
    pub appends: u64,
    pub records: u64,
    /// Payload bytes of the records acknowledged.
    pub bytes: u64,
    /// Appends refused or failed, including those durable locally but not confirmed.
    pub failures: u64,
}

impl AppendMetrics {
    pub fn counts(&self, level: Durability) -> AppendCounts {
        let c = &self.by_level[level as usize];
        AppendCounts {
            appends: c.appends.load(Ordering::Relaxed),
            records: c.records.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn acknowledged(
        &self,
        level: Durability,
        records: u64,
        bytes: u64,
        latency: Duration,
    ) {
        let c = &self.by_level[level as usize];
        c.appends.fetch_add(1, Ordering::Relaxed);
        c.records.fetch_add(records, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.latency_seconds.observe(latency);
    }

    pub(crate) fn failed(&self, level: Durability) {
        self.by_level[level as usize]
            .failures
            .fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_are_counted_by_their_level() {
        let m = AppendMetrics::default();
        m.acknowledged(Durability::Local, 2, 300, Duration::from_millis(1));
        m.acknowledged(Durability::Local, 1, 5, Duration::from_millis(2));
        m.failed(Durability::On);
        let local = m.counts(Durability::Local);
        assert_eq!((local.appends, local.records, local.bytes), (2, 3, 305));
        assert_eq!(local.failures, 0);
        assert_eq!(m.counts(Durability::On).failures, 1);
        assert_eq!(m.counts(Durability::On).appends, 0);
        assert_eq!(m.counts(Durability::RemoteApply), AppendCounts::default());
        // Failures are not timed: the histogram counts acknowledged appends only.
        assert_eq!(m.latency_seconds.snapshot().count, 2);
    }

    #[test]
    fn every_level_has_its_own_counts() {
        for (i, d) in Durability::ALL.into_iter().enumerate() {
            assert_eq!(d as usize, i, "{d} indexes the counts");
        }
    }
}
