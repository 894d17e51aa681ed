//! A latency histogram with fixed buckets, cheap enough to update on every fsync and append:
//! one relaxed atomic add per bucket hit, the count and the sum. The crates that own a fact
//! (storage for fsyncs, the supervisor for appends) keep the histogram; the admin API reads a
//! [`HistogramSnapshot`] and writes it in Prometheus' text format.
//!
//! Every latency histogram uses the same bounds, [`LATENCY_BUCKETS`], so that dashboards can
//! compare them and the bounds are written once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds, in seconds, of the latency buckets: from 50 µs (a fast NVMe fdatasync) to
/// 10 s (a synchronous standby far behind); slower observations land only in `+Inf`.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// Observations of a duration, counted into fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One counter per bound and one for `+Inf`; each counts only its own bucket (the
    /// snapshot makes them cumulative).
    buckets: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

/// A histogram at one moment, as Prometheus shows it: cumulative counts per upper bound.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, observations at or below it)`, in increasing order, without
    /// `+Inf` (whose count is [`HistogramSnapshot::count`]).
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(LATENCY_BUCKETS)
    }
}

impl Histogram {
    /// A histogram with these upper bounds in seconds, which must increase.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        // The first bound at or above the value; `le` is inclusive in Prometheus.
        let i = self.bounds.partition_point(|&b| b < secs);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts so far. The count is the sum of the buckets read, so `+Inf` always equals
    /// it; the sum may include an observation being made at the same moment.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut total = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (i, &bound) in self.bounds.iter().enumerate() {
            total += self.buckets[i].load(Ordering::Relaxed);
            buckets.push((bound, total));
        }
        total += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        HistogramSnapshot {
            buckets,
            count: total,
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_inclusive() {
        static BOUNDS: &[f64] = &[0.001, 0.01, 0.1];
        let h = Histogram::new(BOUNDS);
        assert_eq!(h.snapshot().count, 0);
        h.observe(Duration::from_micros(500)); // <= 0.001
        h.observe(Duration::from_millis(1)); // exactly on a bound: that bucket
        h.observe(Duration::from_millis(50)); // <= 0.1
        h.observe(Duration::from_secs(3)); // only +Inf
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(0.001, 2), (0.01, 2), (0.1, 3)]);
        assert_eq!(s.count, 4);
        assert!((s.sum_seconds - 3.0515).abs() < 1e-9, "{}", s.sum_seconds);
    }

    #[test]
    fn the_default_uses_the_latency_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.buckets.len(), LATENCY_BUCKETS.len());
        assert!(s.buckets.iter().all(|&(_, n)| n == 0));
        assert_eq!(s.count, 1);
    }
}
