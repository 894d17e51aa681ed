//! Faults injected at named points (feature `failpoints`): a full disk or an I/O error fails
//! the write that meets it, keeps what is durable, and later writes succeed once it clears.

use bytes::Bytes;
use wal_storage::*;

use crate::common::*;

#[test]
fn disk_full_during_write_fails_that_write_only() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let a = append(&wal, &[payload(1, 100)])[0];
    wal.failpoints().set(FP_WRITE, libc::ENOSPC);
    let err = wal
        .append(vec![payload(2, 100)])
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(err.is_disk_full(), "{err}");
    assert!(err.to_string().contains("No space left on device"), "{err}");
    assert_eq!(wal.flushed(), a, "nothing durable moved");
    assert_eq!(wal.written(), a);
    wal.failpoints().clear(FP_WRITE);
    let b = append(&wal, &[payload(3, 100)])[0];
    assert!(b > a);
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    let recs = records(&wal, TimelineId(1), Lsn(SEG));
    let got: Vec<Bytes> = recs.into_iter().map(|r| r.payload).collect();
    assert_eq!(got, vec![payload(1, 100), payload(3, 100)]);
}

#[test]
fn failed_fsync_leaves_no_phantom_records() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    append(&wal, &[payload(1, 100)]);
    // The batch reaches the file but its fdatasync fails: both records are refused...
    wal.failpoints().set(FP_FSYNC, libc::EIO);
    let err = wal
        .append(vec![payload(2, 200), payload(3, 200)])
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(!err.is_disk_full());
    assert!(err.is_storage_failed(), "{err}");
    wal.failpoints().clear_all();
    // A failed sync is not retried: storage is reopened first.
    wal.restart().unwrap().expect("storage had failed");
    // ... and a record of the first one's length written in its place is not followed by the
    // second, which was left CRC-valid on disk.
    append(&wal, &[payload(4, 200)]);
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    let got: Vec<Bytes> = records(&wal, TimelineId(1), Lsn(SEG))
        .into_iter()
        .map(|r| r.payload)
        .collect();
    assert_eq!(got, vec![payload(1, 100), payload(4, 200)]);
}

#[test]
fn disk_full_during_preallocation() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Postgres);
    let first = payload(1, 1000);
    wal.write(Lsn(SEG), first.clone()).unwrap().wait().unwrap();
    wal.failpoints().set(FP_PREALLOC, libc::ENOSPC);
    // Spans four segments: at least one must be preallocated while the disk is full.
    let big = payload(2, 4 * SEG as usize);
    let err = wal
        .write(Lsn(SEG + 1000), big.clone())
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(err.is_disk_full(), "{err}");
    assert_eq!(wal.flushed(), Lsn(SEG + 1000));
    // No partial preallocation is left in pg_wal or tmp.
    for d in ["pg_wal", "tmp"] {
        for e in std::fs::read_dir(tmp.path().join(d)).unwrap() {
            let e = e.unwrap();
            assert_eq!(e.metadata().unwrap().len(), SEG, "{:?}", e.file_name());
        }
    }
    wal.failpoints().clear(FP_PREALLOC);
    let end = wal
        .write(Lsn(SEG + 1000), big.clone())
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(end, Lsn(SEG + 1000 + 4 * SEG));
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(wal.flushed(), end);
    assert_eq!(
        read_range(&wal, TimelineId(1), Lsn(SEG), Lsn(SEG + 1000)),
        &first[..]
    );
    assert_eq!(
        read_range(&wal, TimelineId(1), Lsn(SEG + 1000), end),
        &big[..]
    );
}

#[test]
fn failed_flush_pointer_fails_raw_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Postgres);
    wal.write(Lsn(SEG), payload(1, 500))
        .unwrap()
        .wait()
        .unwrap();
    wal.failpoints().set(FP_POINTER, libc::EIO);
    assert!(wal
        .write(Lsn(SEG + 500), payload(2, 500))
        .unwrap()
        .wait()
        .is_err());
    assert_eq!(wal.flushed(), Lsn(SEG + 500));
    wal.failpoints().clear(FP_POINTER);
    // The pointer is synced in place: a failure there is not retried and trusted either.
    wal.restart().unwrap().expect("storage had failed");
    // The refused bytes are not vouched for: the caller sends them again.
    let end = wal
        .write(Lsn(SEG + 500), payload(3, 500))
        .unwrap()
        .wait()
        .unwrap();
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(wal.flushed(), end);
    assert_eq!(
        read_range(&wal, TimelineId(1), Lsn(SEG + 500), end),
        &payload(3, 500)[..]
    );
}

#[test]
fn failed_promotion_keeps_the_old_timeline() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    append(&wal, &[payload(1, 100)]);
    wal.failpoints().set(FP_ATOMIC, libc::ENOSPC);
    assert!(wal.promote("x").unwrap_err().is_disk_full());
    assert_eq!(wal.timeline(), TimelineId(1));
    append(&wal, &[payload(2, 100)]);
    wal.failpoints().clear_all();
    let (tli, _) = wal.promote("y").unwrap();
    assert_eq!(tli, TimelineId(2));
}

/// `/metrics` counts storage failures by kind: a full disk apart from other write errors,
/// and a failed fdatasync as `fsync`.
#[test]
fn failed_operations_are_counted_by_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    append(&wal, &[payload(1, 100)]);
    let m = wal.metrics();
    assert!(m.fsync_seconds.snapshot().count > 0, "fsyncs are timed");
    for kind in StorageErrorKind::ALL {
        assert_eq!(m.errors(kind), 0, "{}", kind.as_str());
    }
    let cases = [
        (FP_WRITE, libc::ENOSPC, StorageErrorKind::Enospc),
        (FP_FSYNC, libc::EIO, StorageErrorKind::Fsync),
        (FP_WRITE, libc::EIO, StorageErrorKind::Write),
    ];
    for (i, (point, errno, kind)) in cases.into_iter().enumerate() {
        let before = StorageErrorKind::ALL.map(|k| m.errors(k));
        wal.failpoints().set(point, errno);
        let _ = wal
            .append(vec![payload(2 + i as u64, 100)])
            .unwrap()
            .wait()
            .unwrap_err();
        wal.failpoints().clear_all();
        // A failed sync or write is recovered from by a restart; a full disk needs none.
        assert_eq!(wal.restart().unwrap().is_some(), errno == libc::EIO);
        for (k, was) in StorageErrorKind::ALL.into_iter().zip(before) {
            let grew = m.errors(k) > was;
            assert_eq!(grew, k == kind, "{point} errno {errno}: {}", k.as_str());
        }
    }
    // A small durable file (here a promotion's history file) failing counts as a write.
    let writes = m.errors(StorageErrorKind::Write);
    wal.failpoints().set(FP_ATOMIC, libc::EIO);
    assert!(wal.promote("x").is_err());
    wal.failpoints().clear_all();
    assert!(m.errors(StorageErrorKind::Write) > writes);
}

/// A sender that locates range after range of one segment has the file's length read once:
/// with every read failing after the first range, later ranges of that file are still
/// located, while the next segment's file, whose length was never read, fails as it should.
#[test]
fn locate_reads_a_segments_length_once() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let payloads: Vec<Bytes> = (0..30).map(|i| payload(i, 60_000)).collect();
    append(&wal, &payloads);
    let tli = TimelineId(1);
    wal.locate(tli, Lsn(SEG), 100).unwrap().unwrap();
    wal.failpoints().set(FP_READ, libc::EIO);
    for at in [Lsn(SEG) + 100, Lsn(SEG) + 500_000, Lsn(2 * SEG - 1)] {
        let r = wal.locate(tli, at, 128 << 10).unwrap().unwrap();
        assert_eq!(r.offset, at.segment_offset(SEG));
    }
    let err = wal.locate(tli, Lsn(2 * SEG), 100).unwrap_err();
    assert!(err.to_string().contains("reading the size of"), "{err}");
    wal.failpoints().clear(FP_READ);
    wal.locate(tli, Lsn(2 * SEG), 100).unwrap().unwrap();
}
