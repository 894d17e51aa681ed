//! Rule 5's mark end to end: with `synchronous_commit_overlap` on, a killed primary begins a
//! new timeline at its next start only if it may have sent a synchronous walserver standby
//! WAL it did not hold durably (storage's early-send mark names its timeline). One whose
//! standbys all keep the flushed limit (asynchronous ones, pg_receivewal, PostgreSQL)
//! resumes its timeline as PostgreSQL does, and what those standbys see does not change.

use common::cluster::Down;
use wal_storage::Lsn;

use super::overlap::{append_with_sync_held, assert_forked, overlapped, OVERLAP};
use super::*;

/// Kills `primary` (its System stops, nothing is shut down cleanly) and starts it again on
/// the same data directory and port.
fn kill_and_restart(primary: TestNode) -> TestNode {
    let extra = primary.extra_toml();
    let listen = format!("127.0.0.1:{}", primary.addr().port());
    let dir = primary.down(Down::Kill);
    TestNode::start_listening(dir, &listen, &extra)
}

/// No synchronous standby: the asynchronous walserver standby (which could cut back, but
/// is not waited for) is sent only flushed WAL, no mark is written, and after a kill the
/// primary goes on on its timeline; the standby streams on with nothing to cut.
#[test]
fn a_killed_primary_that_sent_nothing_early_resumes_its_timeline() {
    let primary = TestNode::primary(OVERLAP);
    let tli = primary.wal().timeline();
    let s2 = standby_of(&primary, "s2", OVERLAP);
    wait_streaming(&primary, &["s2"]);
    let mut end = Lsn(0);
    for i in 0..20u8 {
        end = append(&primary, &[i; 100], Durability::On).expect("appended");
    }
    s2.wait_flushed(tli, end);
    assert_eq!(primary.wal().early_sends_marked(), None);

    let primary = kill_and_restart(primary);
    let pos = primary.wal().position();
    assert_eq!(
        (pos.timeline, pos.flushed),
        (tli, end),
        "a primary that sent nothing early began a new timeline"
    );
    assert!(primary.wal().history().is_empty(), "no history file");
    wait_streaming(&primary, &["s2"]);
    let next = append(&primary, b"after the kill", Durability::On).expect("appended");
    s2.wait_flushed(tli, next);
    common::cluster::assert_same_wal(&primary, &s2, tli, Lsn(1 << 20), next);
    assert_eq!(s2.status().commit.tail_cuts, 0);
}

/// A synchronous walserver standby was sent an append while the primary's fdatasync ran
/// (the mark went to disk first): after a kill the primary begins a new timeline at its
/// durable end, though everything sent was acknowledged, and the standby follows it.
#[test]
fn a_killed_primary_that_sent_early_begins_a_new_timeline() {
    let (primary, tli, [s1]) = overlapped("", OVERLAP);
    let base = append(&primary, b"before", Durability::On).expect("acknowledged");
    let (held, acked) = append_with_sync_held(&primary, b"sent early");
    let early = s1.wait_flushed(tli, base + 1).flushed;
    assert_eq!(primary.wal().flushed(), base, "the primary's sync is held");
    assert_eq!(primary.wal().early_sends_marked(), Some(tli));
    drop(held);
    let end = acked
        .recv_timeout(DEADLINE)
        .expect("an answer")
        .expect("acknowledged");
    assert_eq!(end, early);

    let primary = kill_and_restart(primary);
    let new_tli = assert_forked(&primary, tli, end);
    wait_streaming(&primary, &["s1"]);
    let next = append(&primary, b"after the kill", Durability::On).expect("acknowledged");
    s1.wait_flushed(new_tli, next);
    common::cluster::assert_same_wal(&primary, &s1, new_tli, end, next);
}
