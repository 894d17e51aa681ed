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
    let (primary, tli, [s1, s2]) = overlapped("", "");
    let base = acknowledged(&primary, b"before", tli, &s2);
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
    let new_tli = assert_forked(&primary, start_tli, base);
    assert_eq!(
        primary.wal().flushed(),
        base,
        "recovery found the durable end"
    );
    let end = append(&primary, b"after the restart", Durability::Local).expect("appended");
    assert_eq!(primary.wal().timeline(), new_tli);
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

    // Past any flush on `tli`: the wait ends when the reopening moves to a new timeline.
    primary.wait_flushed(tli, Lsn(u64::MAX));
    let new_tli = assert_forked(&primary, tli, base);
    let mut end = Lsn(0);
    wait_until("an append after the reopening", || {
        end = append(&primary, b"after the reopening", Durability::Local).unwrap_or(Lsn(0));
        end > base
    });
    assert_eq!(primary.wal().timeline(), new_tli);
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
    let (primary, tli, [s1]) = overlapped("", "");
    let base = acknowledged(&primary, b"acknowledged", tli, &s1);
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
pub(super) fn append_with_sync_held(
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

/// Asserts that `node` went to a new timeline forked from `parent` at `at` (the last entry
/// of its history), and returns the new timeline.
pub(super) fn assert_forked(node: &TestNode, parent: TimelineId, at: Lsn) -> TimelineId {
    let tli = node.wal().timeline();
    assert!(
        tli > parent,
        "resumed timeline {parent}, expected a fork at {at}"
    );
    let fork = node
        .wal()
        .history()
        .last()
        .cloned()
        .expect("a history entry");
    assert_eq!(
        (fork.parent, fork.switch_lsn),
        (parent, at),
        "the fork that began timeline {tli}"
    );
    tli
}

/// Releases the held fdatasync however the test ends, so that a failed assertion does not
/// leave the primary's writer, and with it the node's shutdown, waiting forever.
pub(super) struct Held(wal_storage::Wal);

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

/// The overlapped commit on every node of a chain: a primary, its synchronous standby, and
/// a standby's own cascade.
pub(super) const OVERLAP: &str = "synchronous_commit_overlap = true";

/// The rule tests' start: a primary with the overlapped commit (and `extra` settings) and `N`
/// walserver standbys of it with `standby` settings, named `s1`, `s2`, ..., all streaming;
/// `s1` is the synchronous one, the others asynchronous. Also the primary's timeline.
pub(super) fn overlapped<const N: usize>(
    extra: &str,
    standby: &str,
) -> (TestNode, TimelineId, [TestNode; N]) {
    let primary = TestNode::primary(&format!(
        "synchronous_standby_names = 'FIRST 1 (s1)'\n{OVERLAP}\n{extra}"
    ));
    let tli = primary.wal().timeline();
    let names: [String; N] = std::array::from_fn(|i| format!("s{}", i + 1));
    let standbys = names
        .each_ref()
        .map(|name| standby_of(&primary, name, standby));
    wait_streaming(&primary, &names.each_ref().map(String::as_str));
    (primary, tli, standbys)
}

/// Appends `payload` to `primary`, acknowledged, and waits until `standby` holds it on
/// timeline `tli`; returns its end.
fn acknowledged(primary: &TestNode, payload: &[u8], tli: TimelineId, standby: &TestNode) -> Lsn {
    let end = append(primary, payload, Durability::On).expect("acknowledged");
    standby.wait_flushed(tli, end);
    end
}

/// Rule 3: a standby given WAL past the commit point (the primary's fdatasync is held)
/// passes none of it on, to a cascade or through `GET /wal`, until the commit point covers
/// it; then both get it.
#[test]
fn a_standby_passes_on_nothing_past_the_commit_point_it_was_told() {
    let (primary, tli, [s1]) = overlapped("", OVERLAP);
    let cascade = standby_of(&s1, "c1", OVERLAP);
    wait_streaming(&s1, &["c1"]);
    let base = acknowledged(&primary, b"before", tli, &cascade);
    let told = wait_commit_point(&s1, base);
    assert_eq!(told, base);
    let records_before = s1.http_get_records_count();
    assert_eq!(records_before, primary.http_get_records_count());

    let held = Held(primary.wal().clone());
    primary.wal().failpoints().hold(FP_FSYNC);
    let acked = append_in_background(&primary, b"overlapped", Durability::On);
    // The standby has the append durable, and the primary has heard so (a round trip over
    // the same stream that would carry a new commit point), while its own flush is held.
    let at_s1 = s1.wait_flushed(tli, base + 1);
    wait_until("the primary hears of the standby's flush", || {
        (primary.status().replication.iter())
            .any(|r| r.application_name == "s1" && r.flush_lsn == Some(at_s1.flushed))
    });
    assert_eq!(acked.try_recv().unwrap_err(), TryRecvError::Empty);
    assert_eq!(s1.status().commit.commit_point, Some(base));
    // Nobody on the standby reads past the commit point.
    assert_eq!(s1.http_get_records_count(), records_before);
    assert_eq!(cascade.wal().flushed(), base, "passed on to the cascade");

    drop(held);
    let end = acked
        .recv_timeout(DEADLINE)
        .expect("an answer")
        .expect("acknowledged");
    assert_eq!(end, at_s1.flushed);
    // The commit point moved: the cascade and readers get it.
    cascade.wait_flushed(tli, end);
    assert_eq!(wait_commit_point(&s1, end), end);
    assert_eq!(s1.http_get_records_count(), records_before + 1);
}

/// Rule 4: a standby whose tail (sent early, never acknowledged) is longer than its new
/// upstream's WAL on the same timeline, where that upstream is the timeline's writer (a
/// backup of the primary run as a primary), is cut back to the upstream's end at stream
/// start, counts the cut, and streams on.
#[test]
fn a_longer_unacknowledged_tail_is_cut_back_at_stream_start() {
    let (primary, tli, [s1]) = overlapped("", OVERLAP);
    let base = acknowledged(&primary, b"before", tli, &s1);
    let (primary, backup) = backup_of(primary);
    wait_streaming(&primary, &["s1"]);
    wait_commit_point(&s1, base);

    let held = Held(primary.wal().clone());
    primary.wal().failpoints().hold(FP_FSYNC);
    let _pending = append_in_background(&primary, b"never acknowledged", Durability::On);
    let tail_end = s1.wait_flushed(tli, base + 1).flushed;

    // s1 now streams from the backup, a primary whose WAL on the same timeline ends at the
    // commit point.
    let b = TestNode::start_in(backup, OVERLAP);
    assert_eq!((b.wal().timeline(), b.wal().flushed()), (tli, base));
    s1.reload_with(&format!(
        "{OVERLAP}\nprimary_conninfo = '{}'",
        b.conninfo("s1")
    ));
    wait_streaming(&b, &["s1"]);
    let status = s1.status();
    assert_eq!(status.commit.tail_cuts, 1, "{status:?}");
    assert_eq!(status.commit.tail_cut_bytes, tail_end.0 - base.0);
    assert_eq!(status.commit.tail_cut_refusals, 0);
    assert_eq!(s1.wal().flushed(), base, "cut back to the shared point");
    let metrics = s1.http_get_metrics();
    assert!(
        metrics.contains("walserver_commit_tail_cuts_total 1\n"),
        "{metrics}"
    );
    // It streams on: what the backup makes durable reaches s1.
    drop(held);
    let next = append(&b, b"after", Durability::On).unwrap();
    s1.wait_flushed(tli, next);
    common::cluster::assert_same_wal(&s1, &b, tli, Lsn(1 << 20), next);
}

/// The same tail as above, with a standby as the new upstream (`s2`, asynchronous, behind
/// by that tail): its shorter end is WAL it has not received yet, not a point the histories
/// share, so s1 keeps its tail and counts no cut; s2 refuses the start until it has caught
/// up, and then s1 streams on from it.
#[test]
fn a_tail_longer_than_a_standby_upstream_s_end_is_kept_until_it_catches_up() {
    // s2 is asynchronous: it gets only what the primary flushed.
    let (primary, tli, [s1, s2]) = overlapped("", OVERLAP);
    let base = acknowledged(&primary, b"before", tli, &s2);
    wait_commit_point(&s1, base);

    let held = Held(primary.wal().clone());
    primary.wal().failpoints().hold(FP_FSYNC);
    let pending = append_in_background(&primary, b"sent early", Durability::On);
    let tail_end = s1.wait_flushed(tli, base + 1).flushed;
    assert_eq!(s2.wal().flushed(), base);

    s1.reload_with(&format!(
        "{OVERLAP}\nprimary_conninfo = '{}'",
        s2.conninfo("s1")
    ));
    // s2 refuses the start from s1's end, and s1 tries again.
    wait_until("s1's start refused by s2", || {
        (s1.receiver().restart.last_error)
            .is_some_and(|e| e.contains("ahead of the WAL flush position"))
    });
    let status = s1.status();
    assert_eq!(status.commit.tail_cuts, 0, "{status:?}");
    assert_eq!(status.commit.tail_cut_refusals, 0);
    assert_eq!(s1.wal().flushed(), tail_end, "the tail is kept");

    // The primary flushes the tail (s1 left it, so it acknowledges at its own flush), s2
    // receives it, and s1 streams on from s2 at its own end.
    drop(held);
    primary.reload_with(OVERLAP);
    let acked = pending
        .recv_timeout(DEADLINE)
        .expect("an answer")
        .expect("acknowledged");
    assert_eq!(acked, tail_end);
    wait_streaming(&s2, &["s1"]);
    let next = append(&primary, b"after", Durability::On).unwrap();
    s1.wait_flushed(tli, next);
    common::cluster::assert_same_wal(&s1, &primary, tli, Lsn(1 << 20), next);
    assert_eq!(s1.status().commit.tail_cuts, 0);
}

/// A backup of `primary`: it goes down cleanly, its data directory is copied, and it starts
/// again on the same port and timeline. The copy, run as a primary, resumes the timeline at
/// the end the primary had (a clean shutdown leaves no early-send mark).
fn backup_of(primary: TestNode) -> (TestNode, tempfile::TempDir) {
    let extra = primary.extra_toml();
    let port = primary.addr().port();
    let dir = primary.down(Down::Immediate);
    let backup = tempfile::tempdir().expect("tempdir");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(dir.path().join("data"))
        .arg(backup.path().join("data"))
        .status()
        .expect("cp");
    assert!(copied.success(), "cp -a of the primary's data directory");
    let primary = TestNode::start_listening(dir, &format!("127.0.0.1:{port}"), &extra);
    (primary, backup)
}

/// Rule 4's limit: a standby told a commit point above its new upstream's end refuses to
/// cut (that upstream, a primary, lacks acknowledged WAL), keeps its WAL, and alarms in
/// `/status` and `/metrics`.
#[test]
fn a_cut_below_the_commit_point_is_refused_and_alarmed() {
    let (_primary, s1, backup, end) = s1_told_past_a_backup();
    let b = TestNode::start_in(backup, OVERLAP);
    s1.reload_with(&format!(
        "{OVERLAP}\nprimary_conninfo = '{}'",
        b.conninfo("s1")
    ));
    wait_until("the refusal's alarm", || s1.status().commit.alarm.is_some());
    let status = s1.status();
    assert!(status.commit.tail_cut_refusals >= 1);
    assert_eq!(status.commit.tail_cuts, 0);
    assert_eq!(s1.wal().flushed(), end, "nothing acknowledged was cut");
    let metrics = s1.http_get_metrics();
    assert!(metrics.contains("walserver_commit_alarm 1\n"), "{metrics}");
}

/// Rule 4's refusals start here: the primary, its synchronous standby `s1`, and a backup of
/// the primary taken after the first append (to run as a primary on the same timeline); `s1`
/// holds and was told as the commit point the end of a second one, acknowledged, which the
/// backup lacks.
fn s1_told_past_a_backup() -> (TestNode, TestNode, tempfile::TempDir, Lsn) {
    let (primary, tli, [s1]) = overlapped("", OVERLAP);
    acknowledged(&primary, b"before", tli, &s1);
    let (primary, backup) = backup_of(primary);
    wait_streaming(&primary, &["s1"]);
    let end = append(&primary, b"acknowledged", Durability::On).unwrap();
    assert_eq!(wait_commit_point(&s1, end), end);
    (primary, s1, backup, end)
}

/// Waits until `node` knows a commit point at or past `lsn`; returns it.
fn wait_commit_point(node: &TestNode, lsn: Lsn) -> Lsn {
    let mut c = None;
    wait_until(&format!("a commit point at {lsn}"), || {
        c = node.status().commit.commit_point;
        c.is_some_and(|c| c >= lsn)
    });
    c.expect("waited for")
}

impl TestNode {
    fn http_get_metrics(&self) -> String {
        let (code, body) = common::cluster::http_get_any(self.http_addr, "/metrics");
        assert_eq!(code, 200, "{body}");
        body
    }
}

/// Rule 1's timeline filter: a synchronous standby that reported a flush on the old timeline
/// past the point where this node's new timeline forks from it (it holds a tail sent early
/// that the new timeline does not share) confirms nothing of the new timeline with that
/// report, however high its number: an append there waits for a report made on it.
#[test]
fn a_flush_reported_on_the_old_timeline_releases_nothing_on_the_new_one() {
    let primary = TestNode::primary(&format!(
        "synchronous_standby_names = 'FIRST 1 (s1)'\nsynchronous_wait_timeout = '300ms'\n{OVERLAP}"
    ));
    let old = primary.wal().timeline();
    let mut s1 = streaming_client(&primary, "s1");
    wait_streaming(&primary, &["s1"]);
    // The standby says it holds far more of this timeline than the primary wrote.
    let far = primary.wal().flushed() + (1 << 20);
    s1.reply(far, far, false);
    wait_until("the primary hears of the standby's flush", || {
        (primary.status().replication.iter())
            .any(|r| r.application_name == "s1" && r.flush_lsn == Some(far))
    });
    // On its own timeline the report counts: an append is acknowledged at once.
    append(&primary, b"on the old timeline", Durability::On).expect("acknowledged");

    // A new timeline under the live stream, as a primary that may have sent early starts
    // when it takes up a failover term: its early-send mark, asked for as a walsender does.
    primary.wal().mark_early_sends(old);
    wait_until("the early-send mark", || {
        primary.wal().early_sends_marked() == Some(old)
    });
    let promoted = futures_executor::block_on(
        primary
            .node
            .supervisor
            .send(supervisor_actor::PromoteForTerm { term: 7 }),
    )
    .expect("supervisor")
    .expect("a new timeline");
    assert!(promoted.timeline > old);
    assert!(promoted.switch_lsn < far);
    let e = append(&primary, b"on the new timeline", Durability::On)
        .expect_err("released by a report made on the old timeline");
    assert!(
        matches!(e, AppendError::NotConfirmed { .. }),
        "{e:?}: expected the synchronous wait to time out"
    );
    drop(s1);
}

/// Rule 3 for the primary's own archive: a segment the primary has made durable but its
/// synchronous standby has not (its fdatasync is held) lies past the commit point, so the
/// archiver leaves it alone until the standby's flush moves the commit point over it. An
/// archived object is never replaced, so one archived past the commit point could hold WAL
/// a failover drops.
#[test]
fn the_primary_archives_nothing_past_the_commit_point() {
    let archive = tempfile::tempdir().expect("tempdir");
    let (primary, tli, [s1]) = overlapped(
        &format!(
            "archive_mode = 'on'\narchive_target = \"file://{}\"",
            archive.path().display()
        ),
        OVERLAP,
    );
    let segment_size = primary.wal().segment_size();
    let base = append(&primary, b"before", Durability::On).expect("acknowledged");
    let archiver = |what: &str| primary.http_get("/status")["archiver"][what].clone();
    wait_until("the archiver's hold", || {
        !archiver("archived_lsn").is_null()
    });
    let segment = segment_file_name(tli, base.segment_number(segment_size), segment_size);

    let held = Held(s1.wal().clone());
    s1.wal().failpoints().hold(FP_FSYNC);
    // Enough to complete the segment, durable on the primary at once.
    let acked = {
        let sup = primary.node.supervisor.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let msg = AppendRecords {
                records: (0..20).map(|_| Bytes::from(vec![7u8; 64 << 10])).collect(),
                durability: Some(Durability::On),
            };
            let r = futures_executor::block_on(sup.send(msg)).expect("supervisor");
            let _ = tx.send(r.map(|a| a.end_lsn).map_err(|e| e.to_string()));
        });
        rx
    };
    let boundary = Lsn((base.segment_number(segment_size) + 1) * segment_size);
    primary.wait_flushed(tli, boundary);
    // The archiver has seen the segment complete and decided (or, wrongly, uploaded it):
    // past the commit point, no upload.
    wait_until("the archiver sees the completed segment", || {
        archiver("backlog_bytes").as_u64() >= Some(segment_size)
            || archive.path().join(&segment).exists()
    });
    assert!(
        !archive.path().join(&segment).exists(),
        "archived past the commit point"
    );
    assert!(primary.status().commit.commit_point < Some(boundary));
    assert_eq!(acked.try_recv().unwrap_err(), TryRecvError::Empty);

    let released = std::time::SystemTime::now();
    drop(held);
    acked
        .recv_timeout(DEADLINE)
        .expect("an answer")
        .expect("acknowledged");
    let status = || -> wal_archive::ArchiverStatus {
        serde_json::from_value(primary.http_get("/status")["archiver"].clone())
            .expect("the archiver's status")
    };
    wait_until("the segment archived", || {
        status().last_archived_wal.as_deref() == Some(segment.as_str())
    });
    let status = status();
    assert!(
        status.last_archived_time.is_some_and(|t| t >= released),
        "uploaded before the standby's flush: {status:?}"
    );
}

/// Rule 4 across a restart: the commit point a standby was told is on its disk before its
/// readers are served up to it, so a standby restarted with a tail longer than its new
/// upstream's WAL, whose end lies below that point, refuses the cut and alarms before any
/// upstream has told it a commit point again.
#[test]
fn a_restarted_standby_refuses_to_cut_below_the_commit_point_it_stored() {
    // What s1 shows (and serves its readers up to) is the point it stored.
    let (primary, s1, backup, end) = s1_told_past_a_backup();
    drop(primary);
    let b = TestNode::start_in(backup, OVERLAP);

    let dir = s1.down(Down::Immediate);
    let s1 = TestNode::start_in(
        dir,
        &format!("{OVERLAP}\nprimary_conninfo = '{}'", b.conninfo("s1")),
    );
    wait_until("the refusal's alarm", || s1.status().commit.alarm.is_some());
    let status = s1.status();
    assert!(status.commit.tail_cut_refusals >= 1, "{status:?}");
    assert_eq!(status.commit.tail_cuts, 0);
    assert_eq!(status.commit.commit_point, Some(end));
    assert_eq!(s1.wal().flushed(), end, "nothing acknowledged was cut");
}

/// Rule 5 after a clean shutdown (the mark written after the last flush): a primary that
/// sent early goes on on its timeline, and its standby follows with nothing to cut; the
/// clean start also removes the early-send mark, so a kill before anything more was sent
/// early lets the timeline go on too (`early_mark.rs` has the kill after an early send).
#[test]
fn a_clean_restart_keeps_the_timeline_and_a_killed_one_begins_a_new_one() {
    let (primary, tli, [s1]) = overlapped("", OVERLAP);
    let extra = primary.extra_toml();
    let end = append(&primary, b"before the clean shutdown", Durability::On).unwrap();
    let port = primary.addr().port();
    let listen = format!("127.0.0.1:{port}");
    let restart = |primary: TestNode, how: Down| {
        let dir = primary.down(how);
        TestNode::start_listening(dir, &listen, &extra)
    };

    let primary = restart(primary, Down::Immediate);
    let pos = primary.wal().position();
    assert_eq!(
        (pos.timeline, pos.flushed),
        (tli, end),
        "resumed where it stopped"
    );
    // The standby follows on the same timeline, with nothing to cut.
    wait_streaming(&primary, &["s1"]);
    let next = append(&primary, b"after the clean restart", Durability::On).unwrap();
    s1.wait_flushed(tli, next);
    common::cluster::assert_same_wal(&primary, &s1, tli, Lsn(1 << 20), next);
    assert_eq!(s1.status().commit.tail_cuts, 0);

    // Clean again, then killed before any append: nothing was sent early since the clean
    // start, which removed the early-send mark.
    let primary = restart(primary, Down::Immediate);
    assert_eq!(primary.wal().timeline(), tli);
    assert_eq!(primary.wal().early_sends_marked(), None);
    let primary = restart(primary, Down::Kill);
    let pos = primary.wal().position();
    assert_eq!((pos.timeline, pos.flushed), (tli, next));
}
