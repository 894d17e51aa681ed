//! Crash points: a whole process dies at a named place, as `kill -9` would land there, for the
//! tests that restart a node from what such a death leaves (`tests/chaos/crash_points.rs`).
//!
//! Fail points ([`Failpoints`](crate::Failpoints)) make one `Wal`'s operations fail inside a
//! test's own process; a node run as a process of its own cannot be reached that way. A crash
//! point is process-wide instead: the binary arms at most one ([`arm`]) at its start, and the
//! code that passes a point tells it so ([`reached`]); the armed pass calls
//! `std::process::abort`, which runs no destructor, flushes nothing and answers no one. Every
//! storage fail point is also a crash point, passed just before its operation (so
//! `wal_storage::fsync::err` is "written, not yet synced"); the crates above name their own
//! (`walsender_actor::overlap::CRASH_*`, `walreceiver_actor::CRASH_REPLY`) and are built with
//! them only under their `failpoints` feature, as this module is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The armed point and the pass (from 1) at which the process dies.
static ARMED: OnceLock<(String, u64)> = OnceLock::new();
/// How many times the armed point has been passed.
static PASSES: AtomicU64 = AtomicU64::new(0);

/// Arms `point`: its `pass`-th passing (from 1) aborts the process. Only the first arming of a
/// process counts; whether this one did.
pub fn arm(point: &str, pass: u64) -> bool {
    ARMED.set((point.to_string(), pass.max(1))).is_ok()
}

/// The armed point and pass, if any.
pub fn armed() -> Option<(&'static str, u64)> {
    ARMED.get().map(|(p, n)| (p.as_str(), *n))
}

/// Passes `point`: aborts the process if it is the armed point's armed pass.
#[inline]
pub fn reached(point: &str) {
    let Some((armed, pass)) = ARMED.get() else {
        return;
    };
    if armed == point && PASSES.fetch_add(1, Ordering::Relaxed) + 1 == *pass {
        // Said on standard error, unbuffered, so that the node's log tells why it ended.
        eprintln!("crash point {point}: pass {pass}, aborting the process");
        std::process::abort();
    }
}

/// Parses `POINT:PASS` (or `POINT`, the first pass), the form the binary takes.
pub fn parse(spec: &str) -> Option<(&str, u64)> {
    match spec.rsplit_once(':') {
        Some((point, pass)) if !point.ends_with(':') => Some((point, pass.parse().ok()?)),
        _ => Some((spec, 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_spec_names_a_point_and_a_pass() {
        assert_eq!(parse("a::b::crash:7"), Some(("a::b::crash", 7)));
        assert_eq!(parse("a::b::crash"), Some(("a::b::crash", 1)));
        assert_eq!(parse("a::b::crash:x"), None);
    }
}
