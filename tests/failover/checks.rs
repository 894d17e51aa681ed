//! What the scenarios measure from the client's acknowledgement log alone, as plain functions
//! over its entries (each unit-tested below on logs that break the property, so a check that
//! cannot fail would show here). Whether an old term acknowledged anything is the judge's
//! (`walserver_bench::judge`), as for every suite.
//!
//! Times are the log's `mono_ms` (the machine's monotonic clock, read by the load when each
//! answer arrived) and the test's own [`acklog::mono_ms`] at the moment of a fault.

use walserver_bench::acklog::AckEntry;

/// The entries ordered by when their answers arrived (entries without a time last).
fn by_time(log: &[AckEntry]) -> Vec<&AckEntry> {
    let mut v: Vec<&AckEntry> = log.iter().collect();
    v.sort_by_key(|e| e.mono_ms.unwrap_or(u64::MAX));
    v
}

/// The leader changes the log shows: the distinct timelines acknowledged, less one.
pub fn promotions(log: &[AckEntry]) -> u64 {
    let mut t: Vec<u32> = log.iter().map(|e| e.timeline).collect();
    t.sort_unstable();
    t.dedup();
    t.len().saturating_sub(1) as u64
}

/// The first acknowledgement (by arrival) on a timeline above `timeline`, at or after
/// `since_ms`.
pub fn first_on_newer(log: &[AckEntry], timeline: u32, since_ms: u64) -> Option<&AckEntry> {
    by_time(log)
        .into_iter()
        .find(|e| e.timeline > timeline && e.mono_ms.is_some_and(|t| t >= since_ms))
}

/// The last acknowledgement's arrival time.
pub fn last_ack_ms(log: &[AckEntry]) -> Option<u64> {
    log.iter().filter_map(|e| e.mono_ms).max()
}

/// The longest gap between consecutive acknowledgements arriving within `[from_ms, to_ms]`
/// (counting from `from_ms` and up to the first acknowledgement after `to_ms`), in ms.
pub fn longest_pause(log: &[AckEntry], from_ms: u64, to_ms: u64) -> u64 {
    let mut times: Vec<u64> = log.iter().filter_map(|e| e.mono_ms).collect();
    times.sort_unstable();
    let mut prev = from_ms;
    let mut longest = 0;
    for t in times.into_iter().filter(|&t| t >= from_ms) {
        longest = longest.max(t - prev);
        prev = t;
        if t > to_ms {
            break;
        }
    }
    longest
}

/// The most times one line may appear in a node's log within any minute of a scenario. A
/// guess with room: a kill -9 cycle (a few seconds at a short ttl) logs each of its state
/// changes once per node, so a line per cycle stays well below this, while a line per retry
/// (every 100 ms to 2 s) goes far above it.
pub const MAX_REPEATS_A_MINUTE: usize = 30;

/// A tracing text line's time (its RFC 3339 prefix, `2026-12-06T04:40:48.563730Z`) in
/// seconds since the Unix epoch, and the rest of the line with every run of digits (with the
/// hex digits, dots, colons and slashes of times and LSNs beside them) as `#`, so that lines
/// that differ only in counts, times or positions read as one.
fn timed_shape(line: &str) -> Option<(f64, String)> {
    let (time, rest) = line.split_once(' ')?;
    let (date, clock) = time.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut c = clock.split(':');
    let (h, min, sec) = (
        c.next()?.parse::<f64>().ok()?,
        c.next()?.parse::<f64>().ok()?,
        c.next()?.parse::<f64>().ok()?,
    );
    // Days since the epoch of a proleptic Gregorian date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let at = days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec;
    let mut shape = String::new();
    for word in rest.split_inclusive(|c: char| !(c.is_ascii_hexdigit() || "./:".contains(c))) {
        let (body, tail) = match word.char_indices().last() {
            Some((i, c)) if !(c.is_ascii_hexdigit() || "./:".contains(c)) => word.split_at(i),
            _ => (word, ""),
        };
        if body.chars().any(|c| c.is_ascii_digit()) {
            shape.push('#');
        } else {
            shape.push_str(body);
        }
        shape.push_str(tail);
    }
    Some((at, shape.trim().to_string()))
}

/// The lines of `log` that appear more than `max` times within some minute, each with the
/// most times it appears within one.
pub fn repeated_within_a_minute(log: &str, max: usize) -> Vec<(String, usize)> {
    let mut by_shape: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for (at, shape) in log.lines().filter_map(timed_shape) {
        by_shape.entry(shape).or_default().push(at);
    }
    let mut repeated = Vec::new();
    for (shape, mut times) in by_shape {
        times.sort_by(f64::total_cmp);
        let mut most = 0;
        let mut first = 0;
        for (last, t) in times.iter().enumerate() {
            while t - times[first] >= 60.0 {
                first += 1;
            }
            most = most.max(last - first + 1);
        }
        if most > max {
            repeated.push((shape, most));
        }
    }
    repeated
}

/// The lines of `log` with Rust `Debug` text in them (`Some(..)`, `Lsn(..)`, a struct).
pub fn debug_text(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            ["Some(", "Lsn(", "TimelineId(", "Instant {", "tv_sec"]
                .iter()
                .any(|leak| l.contains(leak))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal_storage::Lsn;
    use walserver_bench::acklog::{sha256_hex, verify, NodeRecord};

    fn ack(seq: u64, timeline: u32, at: u64) -> AckEntry {
        AckEntry {
            writer: (seq % 2) as usize,
            seq,
            timeline,
            end_lsn: Lsn(0x1000 + seq * 0x100),
            hashes: vec![sha256_hex(&seq.to_le_bytes())],
            mono_ms: Some(at),
            node: Some(format!("n{timeline}")),
            term: None,
        }
    }

    #[test]
    fn failover_time_and_pauses() {
        let log = vec![
            ack(0, 1, 100),
            ack(1, 1, 200),
            ack(2, 2, 3_200),
            ack(3, 2, 3_300),
        ];
        assert_eq!(promotions(&log), 1);
        let first = first_on_newer(&log, 1, 150).expect("a new leader's ack");
        assert_eq!(first.mono_ms, Some(3_200));
        assert!(first_on_newer(&log, 2, 0).is_none());
        assert_eq!(longest_pause(&log, 150, 3_250), 3_000);
        assert_eq!(longest_pause(&log, 0, 150), 100);
        assert_eq!(last_ack_ms(&log), Some(3_300));
    }

    /// The end-state check is the load tool's verify: a node missing one acknowledged append
    /// (deleted here from what the node holds) is caught, and so is one the log holds that the
    /// node never had.
    #[test]
    fn a_deleted_acknowledgement_is_caught() {
        let log: Vec<AckEntry> = (0..5).map(|s| ack(s, 1, s * 10)).collect();
        let records: Vec<NodeRecord> = log
            .iter()
            .map(|e| NodeRecord {
                timeline: e.timeline,
                start: Lsn(e.end_lsn.0 - 0x80),
                end: e.end_lsn,
                sha256: e.hashes[0].clone(),
            })
            .collect();
        assert_eq!(verify(&log, &records).lost, 0);
        let mut missing = records.clone();
        missing.remove(2);
        assert_eq!(verify(&log, &missing).lost, 1);
        let mut extra = log.clone();
        extra.push(ack(9, 1, 90));
        assert_eq!(verify(&extra, &records).lost, 1);
    }

    /// A line repeated with other numbers counts as one line; more than the bound within a
    /// minute is found, the same count spread over more than a minute is not; Debug text is
    /// found.
    #[test]
    fn repeated_lines_and_debug_text_are_found() {
        let line = |secs: u32, n: u32| {
            format!(
                "2026-12-06T23:{:02}:{:02}.{:06}Z  WARN failover_actor::actor: failover: renewal failed; retrying failures={n} lsn=0/{n:X}A0 error=\"timed out\"",
                secs / 60,
                secs % 60,
                n
            )
        };
        // 31 in 30 seconds: over the bound.
        let burst: Vec<String> = (0..31).map(|i| line(i, i + 1)).collect();
        let found = repeated_within_a_minute(&burst.join("\n"), 30);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].1, 31);
        assert!(found[0].0.contains("failures=# lsn=# error="), "{found:?}");
        // 31 in five minutes, ten seconds apart: at most 6 within a minute.
        let spread: Vec<String> = (0..31).map(|i| line(i * 10, i + 1)).collect();
        assert!(repeated_within_a_minute(&spread.join("\n"), 30).is_empty());
        assert_eq!(repeated_within_a_minute(&spread.join("\n"), 5)[0].1, 6);
        // Across midnight the times still count up.
        let midnight =
            "2026-12-06T23:59:59.000000Z  INFO x: a\n2026-12-07T00:00:01.000000Z  INFO x: a";
        assert_eq!(repeated_within_a_minute(midnight, 1)[0].1, 2);
        let log = "2026-12-06T00:00:00.000000Z  INFO x: fork=Some(Lsn(0/10229F8))\n2026-12-06T00:00:00.000000Z  INFO x: fork=0/10229F8";
        assert_eq!(debug_text(log), vec![log.lines().next().unwrap()]);
    }
}
