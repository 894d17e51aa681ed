//! What the writers of a `bench append` load share, whichever way they append (an in-process
//! cluster or `POST /wal`): the statistics each append is recorded in, and the budget (a time,
//! a number of bytes) that tells them when to stop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::report;

/// What the writers have done so far.
pub(crate) struct Stats {
    pub(crate) total: Histogram<u64>,
    pub(crate) interval: Histogram<u64>,
    pub(crate) appends: u64,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
}

impl Stats {
    pub(crate) fn new() -> Stats {
        Stats {
            total: report::latency_histogram(),
            interval: report::latency_histogram(),
            appends: 0,
            records: 0,
            bytes: 0,
            errors: 0,
            first_error: None,
        }
    }

    pub(crate) fn ok(&mut self, latency: Duration, records: usize, bytes: usize) {
        report::record(&mut self.total, latency);
        report::record(&mut self.interval, latency);
        self.appends += 1;
        self.records += records as u64;
        self.bytes += bytes as u64;
    }

    pub(crate) fn err(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }
}

/// When the writers stop: after a time or a byte budget.
pub(crate) struct Budget {
    deadline: Option<Instant>,
    bytes: Option<u64>,
    issued: AtomicU64,
    pub(crate) stop: AtomicBool,
}

impl Budget {
    /// A budget that ends at `deadline`, after `bytes`, or at whichever comes first.
    pub(crate) fn new(deadline: Option<Instant>, bytes: Option<u64>) -> Budget {
        Budget {
            deadline,
            bytes,
            issued: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// Claims `n` bytes; false once the budget is spent or the time is up.
    pub(crate) fn take(&self, n: u64) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return false;
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        match self.bytes {
            Some(limit) => self.issued.fetch_add(n, Ordering::Relaxed) < limit,
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Budget;

    #[test]
    fn a_byte_budget_stops_the_writers() {
        let b = Budget::new(None, Some(250));
        let taken = (0..10).filter(|_| b.take(100)).count();
        assert_eq!(taken, 3);
    }
}
