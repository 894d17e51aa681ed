//! The overlapped commit (`synchronous_commit_overlap = true`) end to end, with the
//! primary's fdatasync held at storage's fail point: the synchronous walserver standby gets
//! the append and makes it durable while the primary's sync runs, the asynchronous one does
//! not, readers on the primary see nothing beyond the commit point, and the append is
//! acknowledged only once the primary's own flush is done; and a primary that lost a tail its
//! standby holds starts a new timeline at its durable end when it comes back (rule 5).

use std::sync::mpsc::TryRecvError;

use common::cluster::Down;
use wal_storage::{segment_file_name, Lsn, TimelineId, FP_FSYNC};

use super::*;

#[test]
fn a_synchronous_standby_makes_an_append_durable_while_the_primary_s_fdatasync_runs() {
    let primary = TestNode::primary(
        "synchronous_standby_names = 'FIRST 1 (s1)'\nsynchronous_commit_overlap = true",
    );
    // Rule 5 starts every start of such a primary on a new timeline, its first included.
    let tli = primary.wal().timeline();
    let s1 = standby_of(&primary, "s1", "");
    let s2 = standby_of(&primary, "s2", "");
    wait_streaming(&primary, &["s1", "s2"]);
    let base = append(&primary, b"before", Durability::On).unwrap();
    s2.wait_flushed(tli, base);
    let records_before = primary.http_get_records_count();

    let (held, acked) = append_with_sync_held(&primary, b"overlapped");
    // The standby has it durable while the primary's own flush has not returned.
    let at_s1 = s1.wait_flushed(tli, base + 1);
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
    s2.wait_flushed(tli, end);
    assert_eq!(primary.http_get_records_count(), records_before + 1);
}

/// The case rule 5 exists for: the synchronous standby makes an append durable while the
/// primary's fdatasync runs, the primary dies before its own flush returns and loses what it
/// wrote (the bytes past its last sync are zeroed, as a power loss leaves a file that was
/// preallocated), and starts again. It must start a new timeline at its durable end before it
/// takes an append, so that the standby's longer copy of the old timeline is a fork, never
/// the prefix of different bytes at the same LSNs; nothing acknowledged is lost.
#[test]
fn a_primary_that_lost_a_tail_its_standby_holds_restarts_on_a_new_timeline() {
    let Tail {
        primary,
        s1,
        tli: start_tli,
        base,
        held_end,
    } = a_tail_the_primary_failed_to_sync();

    let extra = primary.extra_toml();
    let segment_size = primary.wal().segment_size();
    let dir = primary.down(Down::Kill);
    lose_unsynced(
        &dir.path().join("data"),
        start_tli,
        segment_size,
        base,
        held_end,
    );
    let port = std::fs::read_to_string(dir.path().join("port")).expect("the port");
    let primary = TestNode::start_listening(dir, &format!("127.0.0.1:{}", port.trim()), &extra);

    // Before any append: a new timeline whose history forks at the durable end.
    let pos = primary.wal().position();
    assert!(
        pos.timeline > start_tli,
        "the restarted primary resumed {start_tli}"
    );
    assert_eq!(pos.flushed, base, "recovery found the durable end");
    let fork = primary
        .wal()
        .history()
        .last()
        .cloned()
        .expect("a history entry");
    assert_eq!((fork.parent, fork.switch_lsn), (start_tli, base));
    let end = append(&primary, b"after the restart", Durability::Local).expect("appended");
    assert_eq!(primary.wal().position().timeline, pos.timeline);
    assert!(end > base);
    // The acknowledged append is where it was, on the old timeline below the fork.
    let records = primary
        .wal()
        .read_records(start_tli, Lsn(segment_size), usize::MAX)
        .expect("read the old timeline");
    assert!(records.iter().any(|r| &r.payload[..] == b"acknowledged"));

    standby_sees_the_fork(&primary, &s1, base, end, held_end);
}

/// Rule 5 without a restart of the process: the primary's fdatasync fails after the
/// synchronous standby made the append durable, and the supervisor reopens storage past its
/// last good sync, dropping what the standby holds. It must go on on a new timeline from
/// there, not resume the old one.
#[test]
fn a_primary_whose_storage_reopens_after_a_failed_sync_goes_on_on_a_new_timeline() {
    let Tail {
        primary,
        s1,
        tli,
        base,
        held_end,
    } = a_tail_the_primary_failed_to_sync();
    // The reopening's own syncs succeed (one that comes before this retries on backoff).
    primary.wal().failpoints().clear(FP_FSYNC);

    let pos = primary.wait_flushed(tli, Lsn(u64::MAX));
    assert!(pos.timeline > tli, "storage reopened on {tli}");
    let fork = primary
        .wal()
        .history()
        .last()
        .cloned()
        .expect("a history entry");
    assert_eq!((fork.parent, fork.switch_lsn), (tli, base));
    let mut end = Lsn(0);
    wait_until("an append after the reopening", || {
        end = append(&primary, b"after the reopening", Durability::Local).unwrap_or(Lsn(0));
        end > base
    });
    assert_eq!(primary.wal().timeline(), pos.timeline);
    standby_sees_the_fork(&primary, &s1, base, end, held_end);
}

/// The standby holds the old timeline up to `held` past the primary's fork at `fork`: it
/// must never take the new timeline's bytes as a continuation. Until standbys cut such a tail
/// back at stream start, it refuses with the fork; once they do, it follows byte for byte up
/// to the primary's `end`.
fn standby_sees_the_fork(primary: &TestNode, s1: &TestNode, fork: Lsn, end: Lsn, held: Lsn) {
    let new_tli = primary.wal().timeline();
    let mut why = String::new();
    wait_until("the standby to see the fork", || {
        let info = s1.receiver();
        why = info.restart.last_error.clone().unwrap_or_default();
        why.contains("forked") || s1.wal().timeline() == new_tli
    });
    if s1.wal().timeline() == new_tli {
        s1.wait_flushed(new_tli, end);
        common::cluster::assert_same_wal(primary, s1, new_tli, fork, end);
    } else {
        assert!(why.contains(&fork.to_string()), "{why}");
        assert_eq!(s1.wal().flushed(), held, "a refused standby keeps its WAL");
    }
}

/// A primary with the overlapped commit and its synchronous standby `s1`, after an append
/// acknowledged at `base` on timeline `tli` and one more that `s1` made durable (up to
/// `held_end`) while the primary's fdatasync was held, and which then failed: not
/// acknowledged, and not durable on the primary.
struct Tail {
    primary: TestNode,
    s1: TestNode,
    tli: TimelineId,
    base: Lsn,
    held_end: Lsn,
}

fn a_tail_the_primary_failed_to_sync() -> Tail {
    let primary = TestNode::primary(
        "synchronous_standby_names = 'FIRST 1 (s1)'\nsynchronous_commit_overlap = true",
    );
    let tli = primary.wal().timeline();
    let s1 = standby_of(&primary, "s1", "");
    wait_streaming(&primary, &["s1"]);
    let base = append(&primary, b"acknowledged", Durability::On).expect("acknowledged");
    s1.wait_flushed(tli, base);
    let (held, lost) = append_with_sync_held(&primary, b"never durable on the primary");
    let at_s1 = s1.wait_flushed(tli, base + 1);
    assert_eq!(at_s1.timeline, tli);
    primary.wal().failpoints().set(FP_FSYNC, libc::EIO);
    drop(held);
    let answer = lost.recv_timeout(DEADLINE).expect("an answer");
    assert!(
        answer.is_err(),
        "acknowledged without its own flush: {answer:?}"
    );
    Tail {
        primary,
        s1,
        tli,
        base,
        held_end: at_s1.flushed,
    }
}

/// What a power loss takes from the primary's segments: every byte of timeline `tli` in
/// `[from, to)`, which the node wrote but never synced, back to the zeros the preallocated
/// segment held.
fn lose_unsynced(data: &std::path::Path, tli: TimelineId, segment_size: u64, from: Lsn, to: Lsn) {
    use std::os::unix::fs::FileExt;
    let mut at = from.0;
    while at < to.0 {
        let segno = at / segment_size;
        let offset = at % segment_size;
        let n = (segment_size - offset).min(to.0 - at);
        let path = data
            .join("pg_wal")
            .join(segment_file_name(tli, segno, segment_size));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        file.write_all_at(&vec![0u8; n as usize], offset)
            .expect("zero the unsynced bytes");
        file.sync_data().expect("sync");
        at += n;
    }
}

/// Holds the primary's fdatasync and appends `payload` (`Durability::On`) in the background;
/// returns once the sync is held, with the guard that releases it and the append's answer to
/// come.
fn append_with_sync_held(
    primary: &TestNode,
    payload: &'static [u8],
) -> (Held, std::sync::mpsc::Receiver<Result<Lsn, String>>) {
    let held = Held(primary.wal().clone());
    primary.wal().failpoints().hold(FP_FSYNC);
    let answer = append_in_background(primary, payload, Durability::On);
    assert!(
        primary
            .wal()
            .failpoints()
            .wait_until_held(FP_FSYNC, DEADLINE),
        "the primary's fdatasync was never reached"
    );
    (held, answer)
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
