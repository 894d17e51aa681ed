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
}
