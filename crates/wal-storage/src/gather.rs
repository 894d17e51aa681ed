//! When the writer waits for more appends before it commits a batch.
//!
//! Group commit takes whatever is queued when the writer wakes. With clients that each wait
//! for their append before sending the next (every synchronous writer does), that splits: the
//! first request to come back wakes the writer alone, the others arrive a few microseconds
//! later, find it inside an fdatasync, and wait for it and then for their own. From then on
//! the groups alternate, each paying two syncs per commit, and neither merges again. Measured
//! on disks whose fdatasync takes 1 ms (lossyfs), 16 synchronous writers went one batch of 1
//! and one of 15, alternately, on the primary and on its standby.
//!
//! So when the writer wakes shortly after a larger batch of appends than it now holds, it
//! waits, at most about one sync's time, for as many appends as that batch had; the wait ends
//! the moment they are there. The waiting is bounded by what it can save: a lone append that
//! waits in vain pays at most one sync's time, while a split costs every append of the smaller
//! group one sync's time on every commit. It applies only to a batch of appends alone: raw
//! writes (a standby's stream) and control operations go at once. This is PostgreSQL's
//! `commit_delay` with its `commit_siblings` learned from the last batch instead of set.

use std::time::{Duration, Instant};

/// The longest wait, whatever the last sync took. A guess: above a network-attached volume's
/// 1 ms fdatasync with room, and short enough that a stalled disk's long sync cannot make
/// later batches wait long.
const MAX_WAIT: Duration = Duration::from_millis(2);

/// What the writer remembers of its last batch of appends.
#[derive(Debug, Default)]
pub(crate) struct Gather {
    /// How many append requests the last batch with appends held.
    appends: usize,
    /// When that batch was durable, and how long its write and sync took.
    ended: Option<(Instant, Duration)>,
}

impl Gather {
    /// The last batch of appends, `appends` requests, took `took` and was durable at `now`.
    pub(crate) fn committed(&mut self, appends: usize, took: Duration, now: Instant) {
        if appends > 0 {
            self.appends = appends;
            self.ended = Some((now, took));
        }
    }

    /// Until when a batch that the writer woke for at `woke`, and that holds `appends`
    /// append requests and nothing else, waits for more; `None` to commit it now.
    ///
    /// It waits only right after a larger batch of appends: when the writer woke within two
    /// of that batch's sync times of its end (its appenders are coming back), not after a
    /// pause (a lone append after a quiet spell goes at once).
    pub(crate) fn wait_until(&self, appends: usize, woke: Instant) -> Option<Instant> {
        let (ended, took) = self.ended?;
        if appends == 0 || appends >= self.appends {
            return None;
        }
        if woke.saturating_duration_since(ended) > took * 2 {
            return None;
        }
        Some(woke + took.min(MAX_WAIT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_for_as_many_as_the_last_batch_right_after_it() {
        let t0 = Instant::now();
        let mut g = Gather::default();
        assert_eq!(g.wait_until(1, t0), None, "nothing to learn from yet");
        g.committed(16, MS, t0);
        let woke = t0 + MS / 5;
        assert_eq!(g.wait_until(1, woke), Some(woke + MS));
        assert_eq!(g.wait_until(15, woke), Some(woke + MS));
        assert_eq!(g.wait_until(16, woke), None, "as many as before: go");
        assert_eq!(g.wait_until(0, woke), None, "not a batch of appends");
    }

    #[test]
    fn a_quiet_spell_or_a_smaller_last_batch_means_no_wait() {
        let t0 = Instant::now();
        let mut g = Gather::default();
        g.committed(16, MS, t0);
        assert_eq!(
            g.wait_until(1, t0 + 3 * MS),
            None,
            "woke long after the last batch"
        );
        g.committed(1, MS, t0 + 3 * MS);
        assert_eq!(g.wait_until(1, t0 + 3 * MS), None);
        // A batch without appends teaches nothing.
        g.committed(0, 10 * MS, t0 + 4 * MS);
        assert_eq!(g.wait_until(1, t0 + 4 * MS), None);
    }

    #[test]
    fn a_slow_sync_is_waited_for_at_most_max_wait() {
        let t0 = Instant::now();
        let mut g = Gather::default();
        g.committed(8, 50 * MS, t0);
        let woke = t0 + MS;
        assert_eq!(g.wait_until(2, woke), Some(woke + MAX_WAIT));
    }
}
