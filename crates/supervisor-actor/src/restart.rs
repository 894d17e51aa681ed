//! The walreceiver's restart policy, as data, and its state.
//!
//! A lost stream is resumed at once: the first retry after a failure has no delay, because
//! the common cause (the upstream restarted, a connection dropped) is usually over by the
//! time the walreceiver has stopped. Further retries back off exponentially with jitter, to
//! a cap that depends on the failure: failures that fix themselves (a refused or broken
//! connection, an upstream shutting down) are retried often, so a standby resumes within
//! about the cap of the upstream coming back; failures that need an operator (another system
//! identifier, a fork, a refused password) are retried rarely, so they do not become a storm.
//! The count resets once a stream has been healthy for `stable_after`. A full disk on this
//! node is its own case: it ends when space is freed, which nothing announces, so it is
//! retried on a short backoff capped at `disk_full_cap`; a walreceiver stopped by a storage
//! failure waits instead for storage to be back, which is an event.
//!
//! Storage itself is restarted by the same kind of schedule ([`StorageRestarts`]): the first
//! reopening at once, then backoff from `storage_base` to `storage_cap`, the count reset once
//! storage has stayed healthy for `stable_after`.
//!
//! The log follows a run of failures (from the first failure after a stream to the next
//! stream) rather than each attempt: the first failure is logged, then at most one summary per
//! `summary_interval` (how many attempts since when, and the last error), and the stream that
//! ends the run says how long it lasted. An upstream down for an hour so costs about 120 lines,
//! not one or two per attempt.

use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use wal_types::time::{de_opt_time, ser_opt_time};
use walreceiver_actor::ReceiverError;

/// How the supervisor restarts a failed walreceiver.
#[derive(Clone, Debug, PartialEq)]
pub struct RestartPolicy {
    /// Backoff for failures that fix themselves: the second retry waits this long.
    pub transient_base: Duration,
    /// The longest wait between retries of such failures (`wal_retrieve_retry_interval`). It
    /// bounds how long a standby takes to notice its upstream is back: 100 ms is a guess that
    /// keeps that under PostgreSQL's 5 s by far while a down upstream sees at most ~10
    /// connection attempts a second.
    pub transient_cap: Duration,
    /// Backoff for failures that need an operator.
    pub persistent_base: Duration,
    pub persistent_cap: Duration,
    /// The longest wait between retries after this node's disk was full: 1 s is a guess that
    /// resumes a standby within about a second of space returning while a full disk costs at
    /// most one connection to the upstream a second.
    pub disk_full_cap: Duration,
    /// Backoff of storage restarts after a failed sync: the second reopening waits this long.
    pub storage_base: Duration,
    /// The longest wait between reopenings of failed storage: 2 s is a guess, short enough
    /// that a node resumes soon after a transient fault, long enough that a disk that keeps
    /// failing costs a few log lines a minute, not a storm.
    pub storage_cap: Duration,
    /// A stream (or storage) healthy this long counts as healthy: the next failure starts afresh.
    pub stable_after: Duration,
    /// Each delay is drawn from `[delay × (1 − jitter), delay]`, so standbys of one upstream
    /// do not retry in lockstep.
    pub jitter: f64,
    /// During a run of failures, at most one log line per this long after the first: 30 s is a
    /// guess, often enough to see that a standby is still trying, rare enough to read.
    pub summary_interval: Duration,
}

impl RestartPolicy {
    /// The policy with `wal_retrieve_retry_interval` as the cap of the backoff of failures
    /// that fix themselves; failures that need an operator are never retried more often.
    pub fn with_retry_interval(interval: Duration) -> RestartPolicy {
        let mut p = RestartPolicy::default();
        p.transient_cap = interval;
        p.persistent_cap = p.persistent_cap.max(interval);
        p
    }

    /// The schedule as `/status` shows it.
    pub fn schedule(&self) -> RetrySchedule {
        let ms = |d: Duration| d.as_millis() as u64;
        RetrySchedule {
            first_retry_ms: 0,
            backoff_from_ms: ms(self.transient_base),
            wal_retrieve_retry_interval_ms: ms(self.transient_cap),
            operator_failure_backoff_from_ms: ms(self.persistent_base),
            operator_failure_retry_interval_ms: ms(self.persistent_cap),
            disk_full_retry_interval_ms: ms(self.disk_full_cap),
            jitter: self.jitter,
            summary_log_interval_ms: ms(self.summary_interval),
        }
    }
}

/// The restart policy in `/status`: a failed walreceiver is retried at once, then after
/// `backoff_from_ms`, doubling up to `wal_retrieve_retry_interval_ms` (for failures that need
/// an operator: from `operator_failure_backoff_from_ms` up to
/// `operator_failure_retry_interval_ms`), each wait shortened by up to `jitter` of itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetrySchedule {
    pub first_retry_ms: u64,
    pub backoff_from_ms: u64,
    pub wal_retrieve_retry_interval_ms: u64,
    pub operator_failure_backoff_from_ms: u64,
    pub operator_failure_retry_interval_ms: u64,
    /// The cap of the backoff after this node's disk was full.
    pub disk_full_retry_interval_ms: u64,
    pub jitter: f64,
    /// While failures go on, at most one log line per this long.
    pub summary_log_interval_ms: u64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            transient_base: Duration::from_millis(10),
            transient_cap: Duration::from_millis(100),
            persistent_base: Duration::from_secs(1),
            persistent_cap: Duration::from_secs(30),
            disk_full_cap: Duration::from_secs(1),
            storage_base: Duration::from_millis(50),
            storage_cap: Duration::from_secs(2),
            stable_after: Duration::from_secs(10),
            jitter: 0.5,
            summary_interval: Duration::from_secs(30),
        }
    }
}

/// Whether waiting can fix a failure.
pub fn is_persistent(e: &ReceiverError) -> bool {
    match e {
        ReceiverError::SystemIdMismatch { .. }
        | ReceiverError::FormatMismatch { .. }
        | ReceiverError::UpstreamBehind { .. }
        | ReceiverError::NotInUpstreamHistory { .. }
        | ReceiverError::Forked { .. }
        | ReceiverError::TimelineClash { .. }
        | ReceiverError::BelowCommitPoint { .. }
        | ReceiverError::WroteAsPrimary { .. }
        | ReceiverError::InvalidConnInfo { .. }
        | ReceiverError::Authentication { .. }
        | ReceiverError::Tls { .. }
        | ReceiverError::Storage { .. }
        | ReceiverError::ArchiveGap { .. }
        | ReceiverError::OtherSystemArchive { .. } => true,
        // Refused logins (28xxx), a missing slot (42704), removed WAL (58P01): an operator's
        // matter. A shutting-down upstream (57P01) and the like fix themselves.
        ReceiverError::Upstream { sqlstate, .. } => {
            sqlstate.starts_with("28") || sqlstate == "42704" || sqlstate == "58P01"
        }
        _ => false,
    }
}

/// Where the restart policy stands, shown in `/status` even while no walreceiver runs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RestartState {
    /// Failures since the last healthy stream.
    pub attempts: u32,
    /// The last failure, as text.
    pub last_error: Option<String>,
    /// When the next walreceiver starts, if one is waiting to.
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub next_retry_at: Option<SystemTime>,
    /// When the current run of failures began: the first failure since the last stream.
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub failing_since: Option<SystemTime>,
    /// Failures in the current run (unlike `attempts`, reset by any stream).
    #[serde(skip)]
    failures_in_run: u32,
    /// When the last line about this run of failures was logged.
    #[serde(skip)]
    last_logged: Option<Instant>,
    #[serde(skip)]
    streaming_since: Option<Instant>,
}

/// What to log about a failure: see the module's story.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureLog {
    /// The first failure of a run: log it as it is.
    First,
    /// A summary is due: `attempts` failures since `since`.
    StillFailing { attempts: u32, since: SystemTime },
    /// Nothing: a line was logged less than `summary_interval` ago.
    Quiet,
}

/// A run of failures a stream ended: `attempts` failures since `since`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveredRun {
    pub attempts: u32,
    pub since: SystemTime,
}

impl RestartState {
    /// A walreceiver streams: the run of failures, if any, is over, and returned.
    pub fn on_streaming(&mut self, now: Instant) -> Option<RecoveredRun> {
        self.streaming_since = Some(now);
        let since = self.failing_since.take()?;
        let attempts = std::mem::take(&mut self.failures_in_run);
        Some(RecoveredRun { attempts, since })
    }

    /// Counts a failure in the current run and says what to log about it.
    pub fn log_failure(&mut self, policy: &RestartPolicy, now: Instant) -> FailureLog {
        let since = *self.failing_since.get_or_insert_with(SystemTime::now);
        self.failures_in_run = self.failures_in_run.saturating_add(1);
        let due = self
            .last_logged
            .is_none_or(|t| now.saturating_duration_since(t) >= policy.summary_interval);
        if !due {
            return FailureLog::Quiet;
        }
        self.last_logged = Some(now);
        if self.failures_in_run == 1 {
            FailureLog::First
        } else {
            FailureLog::StillFailing {
                attempts: self.failures_in_run,
                since,
            }
        }
    }

    /// A walreceiver failed: how long to wait before the next one.
    pub fn on_failed(
        &mut self,
        policy: &RestartPolicy,
        error: &ReceiverError,
        now: Instant,
        random: f64,
    ) -> Duration {
        if let Some(since) = self.streaming_since.take() {
            if now.saturating_duration_since(since) >= policy.stable_after {
                self.attempts = 0;
            }
        }
        self.last_error = Some(error.to_string());
        let delay = if self.attempts == 0 {
            Duration::ZERO
        } else {
            let (base, cap) = if is_persistent(error) {
                (policy.persistent_base, policy.persistent_cap)
            } else if matches!(error, ReceiverError::DiskFull { .. }) {
                (policy.transient_base, policy.disk_full_cap)
            } else {
                (policy.transient_base, policy.transient_cap)
            };
            let exp = base.saturating_mul(1u32 << (self.attempts - 1).min(20));
            let full = exp.min(cap);
            full.mul_f64(1.0 - policy.jitter * random.clamp(0.0, 1.0))
        };
        self.attempts = self.attempts.saturating_add(1);
        self.next_retry_at = Some(SystemTime::now() + delay);
        delay
    }

    /// A walreceiver was started (the retry happened).
    pub fn on_started(&mut self) {
        self.next_retry_at = None;
    }
}

/// Where the restarts of failed storage stand: see the module's story.
#[derive(Clone, Debug, Default)]
pub struct StorageRestarts {
    /// Reopenings since storage was last healthy for `stable_after`.
    pub attempts: u32,
    /// Since when storage has been healthy, if it is.
    healthy_since: Option<Instant>,
}

impl StorageRestarts {
    /// Storage failed (or a reopening did): how long to wait before the next reopening.
    pub fn on_failed(&mut self, policy: &RestartPolicy, now: Instant, random: f64) -> Duration {
        if let Some(since) = self.healthy_since.take() {
            if now.saturating_duration_since(since) >= policy.stable_after {
                self.attempts = 0;
            }
        }
        let delay = if self.attempts == 0 {
            Duration::ZERO
        } else {
            let exp = policy
                .storage_base
                .saturating_mul(1u32 << (self.attempts - 1).min(20));
            exp.min(policy.storage_cap)
                .mul_f64(1.0 - policy.jitter * random.clamp(0.0, 1.0))
        };
        self.attempts = self.attempts.saturating_add(1);
        delay
    }

    /// Storage is healthy again.
    pub fn on_healthy(&mut self, now: Instant) {
        self.healthy_since.get_or_insert(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> ReceiverError {
        ReceiverError::Connect {
            addr: "x".into(),
            message: "refused".into(),
        }
    }

    fn mismatch() -> ReceiverError {
        ReceiverError::SystemIdMismatch {
            local: wal_storage::SystemId(1),
            upstream: wal_storage::SystemId(2),
        }
    }

    #[test]
    fn first_retry_is_immediate_then_backoff_to_a_cap() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        let now = Instant::now();
        let delays: Vec<_> = (0..10)
            .map(|_| s.on_failed(&p, &refused(), now, 0.0))
            .collect();
        assert_eq!(delays[0], Duration::ZERO);
        assert_eq!(delays[1], Duration::from_millis(10));
        assert_eq!(delays[2], Duration::from_millis(20));
        assert_eq!(delays[4], Duration::from_millis(80));
        assert!(
            delays[5..].iter().all(|d| *d == p.transient_cap),
            "{delays:?}"
        );
    }

    #[test]
    fn a_full_disk_is_retried_on_a_short_backoff_capped_near_a_second() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        let full = ReceiverError::DiskFull {
            message: "the disk is full".into(),
        };
        let now = Instant::now();
        let delays: Vec<_> = (0..12).map(|_| s.on_failed(&p, &full, now, 0.0)).collect();
        assert_eq!(
            &delays[..3],
            &[Duration::ZERO, p.transient_base, p.transient_base * 2]
        );
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(1)),
            "{delays:?}"
        );
        assert_eq!(delays[11], p.disk_full_cap);
        // Other storage errors still wait for an operator.
        let other = ReceiverError::Storage {
            message: "bad file".into(),
        };
        assert!(is_persistent(&other) && !is_persistent(&full));
    }

    #[test]
    fn storage_restarts_back_off_and_reset_after_a_healthy_period() {
        let p = RestartPolicy::default();
        let mut s = StorageRestarts::default();
        let t0 = Instant::now();
        let delays: Vec<_> = (0..10).map(|_| s.on_failed(&p, t0, 0.0)).collect();
        assert_eq!(
            &delays[..3],
            &[Duration::ZERO, p.storage_base, p.storage_base * 2]
        );
        assert_eq!(delays[9], p.storage_cap);
        // Healthy, but not for long: the backoff goes on.
        s.on_healthy(t0);
        assert!(s.on_failed(&p, t0 + Duration::from_secs(1), 0.0) > Duration::ZERO);
        s.on_healthy(t0);
        assert_eq!(s.on_failed(&p, t0 + p.stable_after, 0.0), Duration::ZERO);
    }

    #[test]
    fn operator_failures_back_off_slowly() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        let now = Instant::now();
        let delays: Vec<_> = (0..8)
            .map(|_| s.on_failed(&p, &mismatch(), now, 0.0))
            .collect();
        assert_eq!(delays[0], Duration::ZERO);
        assert_eq!(delays[1], Duration::from_secs(1));
        assert_eq!(delays[7], p.persistent_cap);
        assert!(s
            .last_error
            .as_deref()
            .unwrap()
            .contains("system identifier"));
    }

    #[test]
    fn jitter_shortens_within_bounds() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        let now = Instant::now();
        s.on_failed(&p, &refused(), now, 0.0);
        for _ in 0..6 {
            s.on_failed(&p, &refused(), now, 0.0);
        }
        let d = s.on_failed(&p, &refused(), now, 1.0);
        assert_eq!(d, p.transient_cap.mul_f64(0.5));
    }

    #[test]
    fn the_default_schedule_is_the_setting_left_out() {
        let p = RestartPolicy::with_retry_interval(Duration::from_millis(100));
        assert_eq!(p, RestartPolicy::default());
        let p = RestartPolicy::with_retry_interval(Duration::from_secs(5));
        let mut s = RestartState::default();
        let now = Instant::now();
        let delays: Vec<_> = (0..12)
            .map(|_| s.on_failed(&p, &refused(), now, 0.0))
            .collect();
        // The first retries stay quick; the setting is where the backoff stops.
        assert_eq!(
            &delays[..3],
            &[
                Duration::ZERO,
                Duration::from_millis(10),
                Duration::from_millis(20)
            ]
        );
        assert_eq!(delays[11], Duration::from_secs(5));
        let sched = p.schedule();
        assert_eq!(sched.wal_retrieve_retry_interval_ms, 5000);
        assert_eq!(sched.first_retry_ms, 0);
        assert_eq!(sched.operator_failure_retry_interval_ms, 30_000);
        let p = RestartPolicy::with_retry_interval(Duration::from_secs(60));
        assert_eq!(p.persistent_cap, Duration::from_secs(60));
    }

    #[test]
    fn a_run_of_failures_logs_its_first_then_a_summary_per_interval() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        let t0 = Instant::now();
        let mut logged = Vec::new();
        // Ten failures a second for 95 seconds.
        for i in 0..950u32 {
            let now = t0 + Duration::from_millis(100 * u64::from(i));
            match s.log_failure(&p, now) {
                FailureLog::Quiet => {}
                other => logged.push((i, other)),
            }
        }
        assert_eq!(logged.len(), 4, "{logged:?}");
        assert_eq!(logged[0], (0, FailureLog::First));
        assert!(matches!(
            logged[1],
            (300, FailureLog::StillFailing { attempts: 301, .. })
        ));
        let run = s
            .on_streaming(t0 + Duration::from_secs(100))
            .expect("a run ended");
        assert_eq!(run.attempts, 950);
        assert_eq!(s.on_streaming(t0 + Duration::from_secs(101)), None);
        // A new run starts with its own count.
        assert_eq!(
            s.log_failure(&p, t0 + Duration::from_secs(200)),
            FailureLog::First
        );
        assert!(s.failing_since.is_some());
        // An upstream that flaps (streams, fails at once) cannot flood the log either: the
        // first failure of a run still waits for the interval.
        s.on_streaming(t0 + Duration::from_secs(201));
        assert_eq!(
            s.log_failure(&p, t0 + Duration::from_secs(202)),
            FailureLog::Quiet
        );
    }

    #[test]
    fn a_stable_stream_resets_the_count() {
        let p = RestartPolicy::default();
        let mut s = RestartState::default();
        let t0 = Instant::now();
        for _ in 0..5 {
            s.on_failed(&p, &refused(), t0, 0.0);
        }
        s.on_streaming(t0);
        // A short stream does not reset it.
        assert!(s.on_failed(&p, &refused(), t0 + Duration::from_secs(1), 0.0) > Duration::ZERO);
        s.on_streaming(t0);
        assert_eq!(
            s.on_failed(&p, &refused(), t0 + p.stable_after, 0.0),
            Duration::ZERO
        );
        assert_eq!(s.attempts, 1);
    }
}
