//! Every fail point, driven by an operation that really passes it (feature `failpoints`). For
//! each: the request fails with an error naming the operation and the path, the failure is
//! counted under its kind, everything acknowledged before is read back byte for byte, and the
//! storage recovers: the same `Wal` goes on once the point is cleared (where that is the
//! contract), and a reopen succeeds and takes new appends.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use wal_storage::*;

use crate::common::*;

/// What a case's operation appends successfully is added here, so it can be read back.
type Acked = Vec<Bytes>;

/// One fail point and an operation through it, on a `Wal` just reopened over acknowledged
/// records (so its writer has no segment open yet and its pointer is exact).
struct Case {
    point: &'static str,
    /// What the operation is, for failure messages.
    what: &'static str,
    /// Runs before the point is set.
    setup: fn(&Wal),
    op: fn(&Wal, &mut Acked) -> Result<()>,
    /// Substrings the error must hold: the operation and the path.
    expect: &'static [&'static str],
    kind: StorageErrorKind,
    /// After the point is cleared the same `Wal` runs `op` again and appends. Not after a
    /// failed fsync (of WAL, a segment or a directory): the kernel may have dropped the dirty
    /// pages, so only a reopen, which reads back what is on disk, can say what is durable.
    continues: bool,
    /// The slots there are at the end.
    slots: &'static [&'static str],
}

fn nothing(_: &Wal) {}

fn slot_s(wal: &Wal) {
    wal.create_slot("s", false, true).unwrap();
}

fn append_one(wal: &Wal, acked: &mut Acked) -> Result<()> {
    let p = payload(1000 + acked.len() as u64, 300);
    wal.append(vec![p.clone()])?.wait()?;
    acked.push(p);
    Ok(())
}

/// Appends records over three segments, so that at least one segment is preallocated (made,
/// zero-filled, synced, linked into `pg_wal`) after the point was set: the writer asks for the
/// next segment only when it opens one.
fn append_across_segments(wal: &Wal, acked: &mut Acked) -> Result<()> {
    let n = acked.len() as u64;
    let ps: Vec<Bytes> = (0..3).map(|i| payload(2000 + n + i, 900 << 10)).collect();
    wal.append(ps.clone())?.wait()?;
    acked.extend(ps);
    Ok(())
}

fn create_slot(wal: &Wal, _: &mut Acked) -> Result<()> {
    wal.create_slot("s", false, true).map(drop)
}

fn drop_slot(wal: &Wal, _: &mut Acked) -> Result<()> {
    wal.drop_slot("s")
}

fn read_back(wal: &Wal, acked: &mut Acked) -> Result<()> {
    let got = wal.read_records(wal.timeline(), Lsn(SEG), usize::MAX)?;
    assert_eq!(
        got.len(),
        acked.len(),
        "a read that succeeds reads everything"
    );
    Ok(())
}

fn locate(wal: &Wal, _: &mut Acked) -> Result<()> {
    wal.locate(wal.timeline(), Lsn(SEG), 100)?
        .expect("acknowledged WAL lies in a file");
    Ok(())
}

fn history_file(wal: &Wal, _: &mut Acked) -> Result<()> {
    wal.history_file(wal.timeline()).map(drop)
}

fn retention(wal: &Wal, _: &mut Acked) -> Result<()> {
    wal.run_retention()
}

fn promote(wal: &Wal, _: &mut Acked) -> Result<()> {
    wal.promote("test").map(drop)
}

fn store_history(wal: &Wal, _: &mut Acked) -> Result<()> {
    let bytes = format_history(&[HistoryEntry {
        parent: TimelineId(1),
        switch_lsn: Lsn(SEG),
        reason: "upstream".into(),
    }]);
    wal.store_history_file(TimelineId(5), bytes)
}

const SLOTS_NONE: &[&str] = &[];
const SLOTS_S: &[&str] = &["s"];

fn cases() -> Vec<Case> {
    use StorageErrorKind::*;
    let case = |point, what, op, expect, kind, continues| Case {
        point,
        what,
        setup: nothing,
        op,
        expect,
        kind,
        continues,
        slots: SLOTS_NONE,
    };
    let slot_case = |point, expect, kind| Case {
        slots: SLOTS_S,
        ..case(point, "creating a slot", create_slot, expect, kind, true)
    };
    vec![
        case(
            FP_WRITE,
            "an append",
            append_one,
            &["writing WAL segment 000000010000000000000001"],
            Write,
            true,
        ),
        case(
            FP_FSYNC,
            "an append",
            append_one,
            &["fdatasync of WAL segment 000000010000000000000001"],
            Fsync,
            false,
        ),
        case(
            FP_POINTER,
            "the first append after open",
            append_one,
            &["writing", "/flush_pointer"],
            Write,
            true,
        ),
        case(
            FP_PREALLOC,
            "a segment switch",
            append_across_segments,
            &[
                "preallocating WAL segment",
                "zero-filling",
                "/tmp/0000000100000000000000",
            ],
            Write,
            true,
        ),
        case(
            FP_LINK,
            "a segment switch",
            append_across_segments,
            &[
                "preallocating WAL segment",
                "linking into place",
                "/tmp/0000000100000000000000",
            ],
            Directory,
            true,
        ),
        case(
            FP_OPEN,
            "the first append after open",
            append_one,
            &["opening", "/pg_wal/000000010000000000000001"],
            Open,
            true,
        ),
        case(
            FP_READ,
            "reading records",
            read_back,
            &["reading", "/pg_wal/000000010000000000000001"],
            Read,
            true,
        ),
        case(
            FP_READ,
            "locating WAL for sendfile",
            locate,
            &["reading the size of", "/pg_wal/000000010000000000000001"],
            Read,
            true,
        ),
        case(
            FP_READ,
            "reading a history file",
            history_file,
            &["reading", "/pg_wal/00000001.history"],
            Read,
            true,
        ),
        case(
            FP_READDIR,
            "retention",
            retention,
            &["listing", "/pg_wal"],
            Read,
            true,
        ),
        case(
            FP_READDIR,
            "a promotion",
            promote,
            &["listing", "/pg_wal"],
            Read,
            true,
        ),
        case(
            FP_ATOMIC,
            "storing a history file",
            store_history,
            &[
                "writing",
                "/pg_wal/00000005.history",
                "/tmp/00000005.history.tmp",
            ],
            Write,
            true,
        ),
        case(
            FP_CREATE,
            "a promotion",
            promote,
            &[
                "writing",
                "/pg_wal/00000002.history",
                "creating",
                "/tmp/00000002.history.tmp",
            ],
            Open,
            true,
        ),
        case(
            FP_RENAME,
            "a promotion",
            promote,
            &[
                "writing",
                "/pg_wal/00000002.history",
                "renaming",
                "/tmp/00000002.history.tmp",
            ],
            Directory,
            true,
        ),
        case(
            FP_DIRSYNC,
            "a promotion",
            promote,
            &["writing", "/pg_wal/00000002.history", "syncing", "/pg_wal"],
            Fsync,
            false,
        ),
        // The history file is written (its own points pass); the switch segment is not.
        case(
            FP_WRITE,
            "a promotion",
            promote,
            &[
                "creating switch segment 000000020000000000000001",
                "writing",
                "/tmp/000000020000000000000001.switch",
            ],
            Write,
            true,
        ),
        case(
            FP_FSYNC,
            "a promotion",
            promote,
            &[
                "creating switch segment 000000020000000000000001",
                "syncing",
                "/tmp/000000020000000000000001.switch",
            ],
            Fsync,
            false,
        ),
        slot_case(FP_ATOMIC, &["writing", "/slots/s", "/tmp/s.tmp"], Write),
        slot_case(
            FP_CREATE,
            &["writing", "/slots/s", "creating", "/tmp/s.tmp"],
            Open,
        ),
        slot_case(
            FP_RENAME,
            &["writing", "/slots/s", "renaming", "/tmp/s.tmp"],
            Directory,
        ),
        // The file was renamed into place before the directory's fsync failed, and is removed
        // again, so the failed creation does not come back at the next open.
        Case {
            continues: false,
            slots: SLOTS_NONE,
            ..slot_case(
                FP_DIRSYNC,
                &["writing", "/slots/s", "syncing", "/slots"],
                Fsync,
            )
        },
        Case {
            setup: slot_s,
            ..case(
                FP_REMOVE,
                "dropping a slot",
                drop_slot,
                &["removing", "/slots/s"],
                Directory,
                true,
            )
        },
        Case {
            setup: slot_s,
            ..case(
                FP_DIRSYNC,
                "dropping a slot",
                drop_slot,
                &["removing", "/slots/s", "syncing", "/slots"],
                Fsync,
                false,
            )
        },
    ]
}

/// The records of the current timeline, which must be `acked`.
fn assert_intact(wal: &Wal, acked: &Acked, context: &str) {
    let got: Vec<Bytes> = records(wal, wal.timeline(), Lsn(SEG))
        .into_iter()
        .map(|r| r.payload)
        .collect();
    assert!(
        got == *acked,
        "{context}: {} records read back, {} acknowledged, or their bytes differ",
        got.len(),
        acked.len()
    );
}

/// `err` holds every part of `expect` (those starting with `/` are paths in the data
/// directory `dir`) and the injected error.
fn assert_says(label: &str, err: &str, dir: &Path, expect: &[&str]) {
    for part in expect.iter().chain(&["os error 5"]) {
        let part = match part.starts_with('/') {
            true => format!("{}{part}", dir.display()),
            false => part.to_string(),
        };
        assert!(
            err.contains(&part),
            "{label}: {err:?} does not say {part:?}"
        );
    }
}

fn slot_names(wal: &Wal) -> BTreeSet<String> {
    wal.slots().into_iter().map(|s| s.name).collect()
}

fn run(case: &Case) {
    let label = format!("{} during {}", case.point, case.what);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut acked: Acked = vec![payload(1, 100), payload(2, 5000)];
    append(&init_primary(dir, WalFormat::Walserver), &acked);

    let wal = Wal::open(dir, cfg()).unwrap();
    (case.setup)(&wal);
    let before = wal.metrics().errors(case.kind);
    wal.failpoints().set(case.point, libc::EIO);
    let result = (case.op)(&wal, &mut acked);
    wal.failpoints().clear(case.point);
    let err = match result {
        Ok(()) => panic!("{label}: succeeded"),
        Err(e) => e.to_string(),
    };
    assert_says(&label, &err, dir, case.expect);
    assert!(
        wal.metrics().errors(case.kind) > before,
        "{label}: no {} error counted",
        case.kind.as_str()
    );
    assert_intact(&wal, &acked, &label);
    if case.continues {
        // A failed write or sync of WAL leaves storage failed until it is reopened (the
        // failure policy, `health.rs`); after any other failure this does nothing.
        wal.restart()
            .unwrap_or_else(|e| panic!("{label}: restart: {e}"));
        (case.op)(&wal, &mut acked).unwrap_or_else(|e| panic!("{label}: again: {e}"));
        append_one(&wal, &mut acked).unwrap_or_else(|e| panic!("{label}: append: {e}"));
    }
    drop(wal);

    let wal = Wal::open(dir, cfg()).unwrap_or_else(|e| panic!("{label}: reopen: {e}"));
    assert_intact(&wal, &acked, &format!("{label}, reopened"));
    let slots: BTreeSet<String> = case.slots.iter().map(|s| s.to_string()).collect();
    assert_eq!(slot_names(&wal), slots, "{label}, reopened");
    takes_appends_and_keeps_them(wal, dir, &mut acked, &label);
}

/// `wal` takes a new append, and a reopen reads back everything acknowledged.
fn takes_appends_and_keeps_them(wal: Wal, dir: &Path, acked: &mut Acked, label: &str) {
    append_one(&wal, acked).unwrap_or_else(|e| panic!("{label}: append: {e}"));
    drop(wal);
    let wal = Wal::open(dir, cfg()).unwrap_or_else(|e| panic!("{label}: reopen: {e}"));
    assert_intact(
        &wal,
        acked,
        &format!("{label}, after an append and a reopen"),
    );
}

#[test]
fn every_point_fails_its_operation_keeps_durable_data_and_recovers() {
    let cases = cases();
    for case in &cases {
        run(case);
    }
    // Every point is driven by at least one operation (the lock, only taken at open, is in
    // the table of the next test).
    let driven: BTreeSet<&str> = cases.iter().map(|c| c.point).chain([FP_LOCK]).collect();
    let all: BTreeSet<&str> = FAILPOINTS.iter().copied().collect();
    assert_eq!(driven, all);
}

/// Plants what makes recovery remove a leftover and zero a torn tail.
fn leftovers(dir: &Path, end: Lsn) {
    std::fs::write(dir.join("tmp/leftover.tmp"), b"x").unwrap();
    patch(dir, TimelineId(1), end + 100, |b| {
        b[..8].copy_from_slice(b"garbage!")
    });
}

/// One fail point at open: recovery fails with an error naming the operation and the path,
/// and opens once the point is cleared.
struct OpenCase {
    point: &'static str,
    expect: &'static [&'static str],
    /// Plants leftovers for recovery to clean up.
    plant: bool,
}

#[test]
fn every_point_recovery_passes_fails_open_until_cleared() {
    let cases = [
        OpenCase {
            point: FP_READ,
            expect: &["looking for", "/control"],
            plant: false,
        },
        OpenCase {
            point: FP_OPEN,
            expect: &["opening", "/walserver.lock"],
            plant: false,
        },
        OpenCase {
            point: FP_LOCK,
            expect: &["locking", "/walserver.lock"],
            plant: false,
        },
        OpenCase {
            point: FP_CREATE,
            expect: &["creating", "/tmp"],
            plant: false,
        },
        OpenCase {
            point: FP_READDIR,
            expect: &["listing", "/tmp"],
            plant: false,
        },
        OpenCase {
            point: FP_REMOVE,
            expect: &["removing", "/tmp/leftover.tmp"],
            plant: true,
        },
        OpenCase {
            point: FP_POINTER,
            expect: &["writing", "/flush_pointer"],
            plant: false,
        },
        OpenCase {
            point: FP_WRITE,
            expect: &["zeroing the tail of", "/pg_wal/000000010000000000000001"],
            plant: true,
        },
        OpenCase {
            point: FP_FSYNC,
            expect: &["zeroing the tail of", "/pg_wal/000000010000000000000001"],
            plant: true,
        },
        OpenCase {
            point: FP_DIRSYNC,
            expect: &["syncing", "/pg_wal"],
            plant: false,
        },
    ];
    for case in &cases {
        let label = format!("{} at open", case.point);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut acked: Acked = vec![payload(1, 100), payload(2, 5000)];
        let end = *append(&init_primary(dir, WalFormat::Walserver), &acked)
            .last()
            .unwrap();
        if case.plant {
            leftovers(dir, end);
        }
        let fp = Arc::new(Failpoints::default());
        fp.set(case.point, libc::EIO);
        let err = match Wal::open_with_failpoints(dir, cfg(), fp.clone()) {
            Ok(_) => panic!("{label}: opened"),
            Err(e) => e.to_string(),
        };
        assert_says(&label, &err, dir, case.expect);
        fp.clear(case.point);
        let wal = Wal::open_with_failpoints(dir, cfg(), fp)
            .unwrap_or_else(|e| panic!("{label}: open after clearing: {e}"));
        assert_eq!(wal.flushed(), end, "{label}");
        if case.plant {
            assert!(!dir.join("tmp/leftover.tmp").exists(), "{label}");
            // Zeroed by this open or, when only its sync failed, by the failed one.
            let seg = std::fs::read(segment_path(dir, TimelineId(1), end)).unwrap();
            let at = (end + 100).segment_offset(SEG) as usize;
            assert_eq!(
                &seg[at..at + 8],
                &[0; 8],
                "{label}: the torn tail is zeroed"
            );
        }
        assert_intact(&wal, &acked, &label);
        takes_appends_and_keeps_them(wal, dir, &mut acked, &label);
    }
}

/// Retention's removal of a segment fails: the segments stay (readers were already told they
/// are removed), and the next run removes them.
#[test]
fn failed_retention_removal_is_redone_by_the_next_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Without recycling, so that every retired segment is removed, not renamed into the pool.
    let cfg = StorageConfig {
        wal_keep_size: 0,
        wal_recycle: false,
        ..cfg()
    };
    let wal = Wal::init(
        dir,
        cfg.clone(),
        InitOptions::primary(SystemId(7), WalFormat::Walserver),
    )
    .unwrap();
    // The slot holds every segment while they are written.
    wal.create_slot("s", false, true).unwrap();
    let mut acked = Acked::new();
    append_across_segments(&wal, &mut acked).unwrap();
    let end = wal.flushed();
    let first = segment_path(dir, TimelineId(1), Lsn(SEG));
    assert!(first.exists());
    // Set before the slot lets go, so that no retention run, ours or the background's, can
    // remove a segment while the point is set.
    wal.failpoints().set(FP_REMOVE, libc::EIO);
    wal.advance_slot("s", end, TimelineId(1)).unwrap();
    let before = wal.metrics().errors(StorageErrorKind::Directory);
    let err = wal.run_retention().unwrap_err().to_string();
    assert_says(
        "retention",
        &err,
        dir,
        &["removing", "/pg_wal/00000001000000000000000"],
    );
    assert!(wal.metrics().errors(StorageErrorKind::Directory) > before);
    assert!(first.exists(), "nothing was removed");
    wal.failpoints().clear(FP_REMOVE);
    wal.run_retention().unwrap();
    assert!(!first.exists(), "the next run removed it");
    // The newest segment holds the end: its records are still read back.
    let tail_seg = Lsn(end.0 - 1).segment_start(SEG);
    assert!(wal.oldest_retained() <= tail_seg);
    append_one(&wal, &mut acked).unwrap();
    drop(wal);
    let wal = Wal::open(dir, cfg).unwrap();
    let last = records(&wal, TimelineId(1), end);
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].payload, acked[acked.len() - 1]);
}

/// A slot's restart point is persisted in the background and at a clean stop, where no
/// request waits for it: a failure there keeps the old point on disk (which retains more, never
/// less), and the next persistence stores the new one.
#[test]
fn failed_slot_persistence_keeps_the_old_restart_point() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let wal = init_primary(dir, WalFormat::Walserver);
    wal.create_slot("s", false, true).unwrap();
    let mut acked = Acked::new();
    append_across_segments(&wal, &mut acked).unwrap();
    let end = wal.flushed();
    let fp = wal.failpoints().clone();
    fp.set(FP_ATOMIC, libc::EIO);
    // Into another segment: persisting is due, in the background and again at the stop.
    wal.advance_slot("s", end, TimelineId(1)).unwrap();
    drop(wal);
    fp.clear(FP_ATOMIC);
    let wal = Wal::open(dir, cfg()).unwrap();
    assert_eq!(
        wal.slot("s").unwrap().restart_lsn,
        Some(Lsn(SEG)),
        "the failed write left the old point"
    );
    assert_intact(&wal, &acked, "after a failed slot write");
    wal.advance_slot("s", end, TimelineId(1)).unwrap();
    drop(wal);
    let wal = Wal::open(dir, cfg()).unwrap();
    assert_eq!(wal.slot("s").unwrap().restart_lsn, Some(end));
}
