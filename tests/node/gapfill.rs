//! A standby whose upstream has already removed the WAL it needs fills the gap from the
//! archive, then streams: a primary archives to a directory with `wal_keep_size = 0`, so
//! retention removes each segment once archived; a standby stopped meanwhile comes back
//! behind the primary's oldest segment. A gap the archive lacks too stays an error that
//! `/status` names, and the node goes on answering. An archive of another system fills
//! nothing, however well its names fit.

use std::path::Path;
use std::time::{Duration, Instant};

use fault_harness::node::conninfo_at;
use wal_storage::{segment_file_name, Lsn, TimelineId};

use crate::common::*;

const SEG: u64 = 1 << 20;

/// A primary archiving to `archive` that keeps no segment it need not keep.
fn primary(archive: &Path) -> TestNode {
    TestNode::primary(&format!(
        "archive_mode = \"on\"\narchive_target = \"file://{}\"\nwal_keep_size = 0\n",
        archive.display()
    ))
}

/// The settings of a standby of `primary` that reads `archive` (and does not archive); it
/// keeps its segments, so that the test can compare them.
fn standby_settings(primary: &TestNode, archive: &Path) -> String {
    format!(
        "primary_conninfo = {:?}\narchive_target = \"file://{}\"\nwal_keep_size = 64\n",
        conninfo_at(primary.addr(), "s1"),
        archive.display()
    )
}

/// A standby of `primary` that streamed from it and was stopped; returns its directory and
/// the end of its WAL.
fn stopped_standby(primary: &TestNode, archive: &Path) -> (tempfile::TempDir, Lsn) {
    stopped_standby_after(primary, archive, 8)
}

/// As [`stopped_standby`], after `records` appends of 32 KiB on `primary`.
fn stopped_standby_after(
    primary: &TestNode,
    archive: &Path,
    records: usize,
) -> (tempfile::TempDir, Lsn) {
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_standby(
        &dir.path().join("data"),
        &conninfo_at(primary.addr(), "s1"),
        None,
        None,
    )
    .expect("init the standby");
    let standby = TestNode::start_in(dir, &standby_settings(primary, archive));
    let end = primary.append(records, 32 << 10, 1);
    wait_until("the standby to receive", || standby.wal().flushed() >= end);
    let end = standby.wal().flushed();
    (standby.stop(), end)
}

/// Appends past several segments on `primary` until its oldest segment is beyond `end`:
/// archived, then removed.
fn remove_past(primary: &TestNode, end: Lsn) {
    for seed in 2..8 {
        primary.append(32, 32 << 10, seed);
    }
    wait_until(
        "the primary to archive and remove the standby's next segment",
        || primary.wal().oldest_retained().segment_number(SEG) > end.segment_number(SEG) + 1,
    );
}

#[test]
fn a_standby_fills_its_gap_from_the_archive_then_streams() {
    let archive = tempfile::tempdir().unwrap();
    let primary = primary(archive.path());
    let (dir, end) = stopped_standby(&primary, archive.path());
    remove_past(&primary, end);
    let standby = TestNode::start_in(dir, &standby_settings(&primary, archive.path()));
    // Streaming resumes after the gap: WAL appended now reaches the standby.
    let last = primary.append(8, 32 << 10, 9);
    wait_until("the standby to fill its gap and stream", || {
        standby.wal().flushed() >= last
    });
    assert_same_wal(&standby, &primary, archive.path(), end, last);
}

/// The standby's WAL from `from`'s segment to `last` is the primary's, byte for byte: the
/// segments the primary removed as the archive holds them (which the archiver checked
/// against the primary's own), the rest as the primary still has them.
fn assert_same_wal(standby: &TestNode, primary: &TestNode, archive: &Path, from: Lsn, last: Lsn) {
    let target = wal_archive::ArchiveTarget::Directory(archive.into());
    let tli = TimelineId(1);
    for segno in from.segment_number(SEG)..last.segment_number(SEG) {
        let name = segment_file_name(tli, segno, SEG);
        let ours = read_file(&standby.data_dir().join("pg_wal").join(&name));
        // The primary's archiver goes on meanwhile, and retention after it: a segment gone
        // from the primary is in the archive.
        let theirs = match std::fs::read(primary.data_dir().join("pg_wal").join(&name)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                target.get(&name).unwrap().expect("archived")
            }
            Err(e) => panic!("read the primary's {name}: {e}"),
        };
        assert!(ours == theirs, "{name} differs from the primary's");
    }
    let from = Lsn(last.segment_number(SEG) * SEG);
    let len = (last.0 - from.0) as usize;
    assert_eq!(
        standby.wal().read(tli, from, len).unwrap(),
        primary.wal().read(tli, from, len).unwrap(),
        "the current segment differs"
    );
}

/// `init --from-archive --standby`: a standby made from the archive of a primary that has
/// already removed its first segments holds them as the archive does, and streams from the
/// primary where the archive ends.
#[test]
fn a_standby_restored_from_the_archive_streams_from_where_it_ends() {
    let archive = tempfile::tempdir().unwrap();
    let primary = primary(archive.path());
    let end = primary.append(100, 32 << 10, 1);
    wait_until(
        "the primary to archive and remove its first segment",
        || primary.wal().oldest_retained().segment_number(SEG) > 1,
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args([
            "init",
            "--data-dir",
            data.to_str().unwrap(),
            "--from-archive",
        ])
        .args(["--standby", "--primary-conninfo"])
        .arg(conninfo_at(primary.addr(), "s1"))
        .arg("-c")
        .arg(format!(
            "archive_target=file://{}",
            archive.path().display()
        ))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains("initialised standby data directory"),
        "{said}"
    );
    let standby = TestNode::start_in(dir, &standby_settings(&primary, archive.path()));
    assert_eq!(standby.status().role, supervisor_actor::NodeRole::Standby);
    let last = primary.append(8, 32 << 10, 9);
    wait_until("the restored standby to stream", || {
        standby.wal().flushed() >= last
    });
    // From the first segment, which only the archive still has.
    assert_eq!(standby.wal().oldest_retained(), Lsn(SEG));
    assert!(end.segment_number(SEG) > 2, "{end}");
    assert_same_wal(&standby, &primary, archive.path(), Lsn(SEG), last);
}

#[test]
fn a_gap_the_archive_also_lacks_is_an_error_in_status() {
    let archive = tempfile::tempdir().unwrap();
    let primary = primary(archive.path());
    let (dir, end) = stopped_standby(&primary, archive.path());
    remove_past(&primary, end);
    // The segment the standby needs next is lost from the archive too.
    let lost = segment_file_name(TimelineId(1), end.segment_number(SEG), SEG);
    std::fs::remove_file(archive.path().join(&lost)).unwrap();
    let standby = TestNode::start_in(dir, &standby_settings(&primary, archive.path()));
    let expected = format!("the archive lacks segment {lost}");
    wait_until("the gap in /status", || {
        standby.http_get("/status").to_string().contains(&expected)
    });
    assert_eq!(
        standby.wal().flushed(),
        end,
        "nothing was taken past the gap"
    );
}

/// An archive that names another system holds WAL under the same names: a standby whose
/// `archive_target` points there takes nothing from it, neither to fill its gap nor (under
/// `archive_mode = on`) to let its hold go, and says so in `/status` and `/metrics`; pointed
/// at its own archive, it fills the gap and streams.
#[test]
fn a_standby_takes_nothing_from_another_system_s_archive_and_alarms() {
    let archive = tempfile::tempdir().unwrap();
    let primary = primary(archive.path());
    // Past two segments, so that the standby's hold has whole segments to follow.
    let (dir, end) = stopped_standby_after(&primary, archive.path(), 80);
    assert!(end.segment_number(SEG) >= 3, "{end}");
    remove_past(&primary, end);
    // Another system's archive: its identity names another system; its objects are this
    // primary's, so that only the identity tells them apart (a fill from it would succeed).
    let ours = primary.wal().system_id();
    let theirs = wal_types::SystemId(ours.0 ^ 0x5a5a);
    let foreign = tempfile::tempdir().unwrap();
    wal_archive::ArchiveTarget::Directory(foreign.path().into())
        .claim(theirs)
        .expect("name the other system");
    for entry in std::fs::read_dir(archive.path()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        // The primary's archiver may still be at work: its temporary files come and go.
        if name.starts_with('.') || name.starts_with(wal_archive::IDENTITY_FILE) {
            continue;
        }
        std::fs::copy(archive.path().join(&name), foreign.path().join(&name)).unwrap();
    }
    let settings = |archive: &Path| {
        format!(
            "{}archive_mode = \"on\"\n",
            standby_settings(&primary, archive)
        )
    };
    let standby = TestNode::start_in(dir, &settings(foreign.path()));
    let receiver_said = format!("belongs to system {theirs}, not to this node's system {ours}");
    let archiver_said = format!("belongs to system {theirs}, not to system {ours}");
    let says =
        |alarm: &serde_json::Value, what: &str| alarm.as_str().is_some_and(|a| a.contains(what));
    wait_until(
        "the walreceiver's and the archiver's alarms in /status",
        || {
            let status = standby.http_get("/status");
            says(&status["wal_receiver"]["archive_alarm"], &receiver_said)
                && says(&status["archiver"]["alarm"], &archiver_said)
        },
    );
    let m = crate::metrics::scrape(&standby);
    assert_eq!(m.get("walserver_walreceiver_archive_alarm"), 1.0);
    assert_eq!(m.get("walserver_archive_alarm"), 1.0);
    // The alarm holds while the walreceiver retries. Each retry's stream starts before the
    // upstream refuses the removed WAL (as PostgreSQL's walsender refuses it, from the
    // read), so an alarm cleared when a stream starts would blink at every retry.
    let attempts = |status: &serde_json::Value| {
        status["wal_receiver"]["attempts"]
            .as_u64()
            .expect("restart attempts in /status")
    };
    let first = attempts(&standby.http_get("/status"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = standby.http_get("/status");
        assert!(
            says(&status["wal_receiver"]["archive_alarm"], &receiver_said),
            "the alarm went while the walreceiver retried: {status:#}"
        );
        if attempts(&status) >= first + 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the walreceiver did not retry twice in 30 s: {status:#}"
        );
    }
    assert_eq!(standby.wal().flushed(), end, "nothing was filled from it");
    let held = standby.wal().archived().expect("a standby under on holds");
    assert!(
        held < end.segment_start(SEG),
        "the hold followed another system's archive to {held}"
    );
    // Once the node's WAL passes the gap, the walreceiver's alarm goes, in the same process:
    // without its identity the other archive reads as one that names no system, and its
    // objects are this primary's, so the next retry fills the gap from it.
    for entry in std::fs::read_dir(foreign.path()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.starts_with(wal_archive::IDENTITY_FILE) {
            std::fs::remove_file(foreign.path().join(name)).unwrap();
        }
    }
    wait_until(
        "the walreceiver's alarm to go once the WAL passes the gap",
        || {
            standby.wal().flushed() > end
                && standby.http_get("/status")["wal_receiver"]["archive_alarm"].is_null()
        },
    );
    let dir = standby.stop();

    let standby = TestNode::start_in(dir, &settings(archive.path()));
    let last = primary.append(8, 32 << 10, 9);
    wait_until("the standby to fill its gap from its own archive", || {
        standby.wal().flushed() >= last
    });
    assert_same_wal(&standby, &primary, archive.path(), end, last);
    wait_until("the alarms to clear", || {
        let status = standby.http_get("/status");
        status["wal_receiver"]["archive_alarm"].is_null() && status["archiver"]["alarm"].is_null()
    });
    let m = crate::metrics::scrape(&standby);
    assert_eq!(m.get("walserver_walreceiver_archive_alarm"), 0.0);
}
