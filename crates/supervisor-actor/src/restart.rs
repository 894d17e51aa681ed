//! The walreceiver's restart policy, as data, and its state.
//!
//! A lost stream is resumed at once: the first retry after a failure has no delay, because
//! the common cause (the upstream restarted, a connection dropped) is usually over by the
//! time the walreceiver has stopped. Further retries back off exponentially with jitter, to
//! a cap that depends on the failure: failures that fix themselves (a refused or broken
//! connection, an upstream shutting down) are retried often, so a standby resumes within
//! about the cap of the upstream coming back; failures that need an operator (another system
//! identifier, a fork, a refused password) are retried rarely, so they do not become a storm.
//! The count resets once a stream has been healthy for `stable_after`.

use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use wal_types::time::ser_opt_time;
use walreceiver_actor::ReceiverError;

/// How the supervisor restarts a failed walreceiver.
#[derive(Clone, Debug, PartialEq)]
pub struct RestartPolicy {
    /// Backoff for failures that fix themselves: the second retry waits this long.
    pub transient_base: Duration,
    /// The longest wait between retries of such failures. It bounds how long a standby takes
    /// to notice its upstream is back: 100 ms is a guess that keeps that under PostgreSQL's
    /// 5 s by far while a down upstream sees at most ~10 connection attempts a second.
    pub transient_cap: Duration,
    /// Backoff for failures that need an operator.
    pub persistent_base: Duration,
    pub persistent_cap: Duration,
    /// A stream that lasted this long counts as healthy: the next failure starts afresh.
    pub stable_after: Duration,
    /// Each delay is drawn from `[delay × (1 − jitter), delay]`, so standbys of one upstream
    /// do not retry in lockstep.
    pub jitter: f64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            transient_base: Duration::from_millis(10),
            transient_cap: Duration::from_millis(100),
            persistent_base: Duration::from_secs(1),
            persistent_cap: Duration::from_secs(30),
            stable_after: Duration::from_secs(10),
            jitter: 0.5,
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
        | ReceiverError::InvalidConnInfo { .. }
        | ReceiverError::Authentication { .. }
        | ReceiverError::Tls { .. }
        | ReceiverError::Storage { .. } => true,
        // Refused logins (28xxx), a missing slot (42704), removed WAL (58P01): an operator's
        // matter. A shutting-down upstream (57P01) and the like fix themselves.
        ReceiverError::Upstream { sqlstate, .. } => {
            sqlstate.starts_with("28") || sqlstate == "42704" || sqlstate == "58P01"
        }
        _ => false,
    }
}

/// Where the restart policy stands, shown in `/status` even while no walreceiver runs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RestartState {
    /// Failures since the last healthy stream.
    pub attempts: u32,
    /// The last failure, as text.
    pub last_error: Option<String>,
    /// When the next walreceiver starts, if one is waiting to.
    #[serde(serialize_with = "ser_opt_time")]
    pub next_retry_at: Option<SystemTime>,
    #[serde(skip)]
    streaming_since: Option<Instant>,
}

impl RestartState {
    pub fn on_streaming(&mut self, now: Instant) {
        self.streaming_since = Some(now);
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
