//! The overlapped commit (`synchronous_commit_overlap = true`) end to end, with the
//! primary's fdatasync held at storage's fail point: the synchronous walserver standby gets
//! the append and makes it durable while the primary's sync runs, the asynchronous one does
//! not, readers on the primary see nothing beyond the commit point, and the append is
//! acknowledged only once the primary's own flush is done.

use std::sync::mpsc::TryRecvError;

use wal_storage::{TimelineId, FP_FSYNC};

use super::*;

#[test]
fn a_synchronous_standby_makes_an_append_durable_while_the_primary_s_fdatasync_runs() {
    let primary = TestNode::primary(
        "synchronous_standby_names = 'FIRST 1 (s1)'\nsynchronous_commit_overlap = true",
    );
    let s1 = standby_of(&primary, "s1", "");
    let s2 = standby_of(&primary, "s2", "");
    wait_streaming(&primary, &["s1", "s2"]);
    let base = append(&primary, b"before", Durability::On).unwrap();
    s2.wait_flushed(TimelineId(1), base);
    let records_before = primary.http_get_records_count();

    let held = Held(primary.wal().clone());
    primary.wal().failpoints().hold(FP_FSYNC);
    let acked = append_in_background(&primary, b"overlapped", Durability::On);
    assert!(
        primary
            .wal()
            .failpoints()
            .wait_until_held(FP_FSYNC, DEADLINE),
        "the primary's fdatasync was never reached"
    );
    // The standby has it durable while the primary's own flush has not returned.
    let at_s1 = s1.wait_flushed(TimelineId(1), base + 1);
    assert_eq!(primary.wal().flushed(), base, "the primary's sync is held");
    assert!(at_s1.flushed > base);
    // Not acknowledged: the commit point needs the primary's flush too.
    assert_eq!(acked.try_recv().unwrap_err(), TryRecvError::Empty);
    // Nobody reads past the commit point on the primary.
    assert_eq!(primary.http_get_records_count(), records_before);
    // The asynchronous standby is sent only what the primary flushed.
    assert_eq!(s2.wal().flushed(), base);

    drop(held);
    let end = acked
        .recv_timeout(DEADLINE)
        .expect("an answer")
        .expect("acknowledged");
    assert_eq!(end, at_s1.flushed, "the standby held exactly the append");
    s2.wait_flushed(TimelineId(1), end);
    assert_eq!(primary.http_get_records_count(), records_before + 1);
}

/// Releases the held fdatasync however the test ends, so that a failed assertion does not
/// leave the primary's writer, and with it the node's shutdown, waiting forever.
struct Held(wal_storage::Wal);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.failpoints().release(FP_FSYNC);
    }
}

impl TestNode {
    /// How many records `GET /wal` gives from the start: what readers on this node see.
    fn http_get_records_count(&self) -> usize {
        let (code, body) = common::cluster::http_get_any(self.http_addr, "/wal?from=earliest");
        assert_eq!(code, 200, "{body}");
        body.lines().filter(|l| !l.trim().is_empty()).count()
    }
}
