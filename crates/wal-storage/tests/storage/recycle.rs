//! Segment recycling (`wal_recycle`, on by default): retention hands segments nobody holds to
//! preallocation instead of removing them. What is checked, on the disk and on tmpfs (whose
//! new segments are made differently, with `fallocate`): recycling happens; every record reads
//! back; a recovery that scans from an older flush pointer stops at the real end, not at an
//! old record of a recycled file; a range held for `sendfile` keeps its bytes while its
//! segment is retired and other segments are recycled around it; and with `wal_recycle` off
//! nothing is recycled and retired segments are removed.

use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;
use wal_storage::*;

use crate::common::*;

/// A data directory on tmpfs (`/dev/shm`).
fn on_tmpfs() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    assert!(
        shm.is_dir(),
        "/dev/shm is missing: these tests need a tmpfs there"
    );
    tempfile::tempdir_in(shm).unwrap()
}

/// A data directory on the disk the build runs on (the target directory's file system).
fn on_disk() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// 1 MiB segments and no `wal_keep_size`: every finished segment is retired at once.
fn keep_nothing() -> StorageConfig {
    StorageConfig {
        wal_keep_size: 0,
        ..cfg()
    }
}

fn init(dir: &Path) -> Wal {
    init_with(dir, keep_nothing())
}

fn init_with(dir: &Path, cfg: StorageConfig) -> Wal {
    Wal::init(
        dir,
        cfg,
        InitOptions::primary(SystemId(7), WalFormat::Walserver),
    )
    .unwrap()
}

/// Twelve segments of records, one append per segment or so: the payloads and their ends.
fn twelve_segments(wal: &Wal) -> (Vec<Bytes>, Vec<Lsn>) {
    let payloads: Vec<Bytes> = (0..200).map(|i| payload(i, 60_000)).collect();
    let mut ends = Vec::new();
    for chunk in payloads.chunks(16) {
        ends.extend(append(wal, chunk));
    }
    assert!(ends.last().unwrap().0 > 11 * SEG);
    (payloads, ends)
}

#[test]
fn recycled_segments_hold_old_bytes_that_never_pass_for_wal_on_tmpfs() {
    old_bytes_never_pass_for_wal(on_tmpfs());
}

#[test]
fn recycled_segments_hold_old_bytes_that_never_pass_for_wal_on_disk() {
    old_bytes_never_pass_for_wal(on_disk());
}

#[test]
fn a_range_held_for_sendfile_keeps_its_bytes_while_its_segment_is_retired_on_tmpfs() {
    held_range_keeps_its_bytes(on_tmpfs());
}

#[test]
fn a_range_held_for_sendfile_keeps_its_bytes_while_its_segment_is_retired_on_disk() {
    held_range_keeps_its_bytes(on_disk());
}

#[test]
fn with_wal_recycle_off_retired_segments_are_removed_not_recycled() {
    let tmp = on_disk();
    let wal = init_with(
        tmp.path(),
        StorageConfig {
            wal_recycle: false,
            ..keep_nothing()
        },
    );
    let (_, ends) = twelve_segments(&wal);
    let end = *ends.last().unwrap();
    assert_eq!(wal.segments_recycled(), 0);
    // Retention runs in the background at each segment switch; run it once more here so
    // that every retired segment is gone when the directory is listed.
    wal.run_retention().unwrap();
    let segments = std::fs::read_dir(tmp.path().join("pg_wal"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            parse_segment_file_name(&name.to_string_lossy(), SEG).is_some()
        })
        .count();
    // The segment being written and the ones preallocated ahead of it; never the eleven and
    // more that were filled and retired.
    assert!(
        segments <= 4,
        "{segments} segment files are still in pg_wal"
    );
    // And the new segments read as zeros past the end, as made anew.
    let cur = segment_path(tmp.path(), TimelineId(1), end);
    let bytes = std::fs::read(&cur).unwrap();
    assert!(bytes[end.segment_offset(SEG) as usize..]
        .iter()
        .all(|&b| b == 0));
}

fn old_bytes_never_pass_for_wal(tmp: tempfile::TempDir) {
    let wal = init(tmp.path());
    let (payloads, ends) = twelve_segments(&wal);
    let end = *ends.last().unwrap();
    assert!(
        wal.segments_recycled() >= 4,
        "only {} segments were recycled",
        wal.segments_recycled()
    );
    // What is retained reads back whole: the records of the last segment (retention, in the
    // background, may still be removing older ones).
    let last_seg = Lsn(end.0 / SEG * SEG);
    let first = ends.iter().position(|&e| e >= last_seg).unwrap() + 1;
    let from = ends[first - 1];
    let got = records(&wal, TimelineId(1), from);
    assert!(!got.is_empty());
    assert_eq!(got.len(), payloads.len() - first);
    assert!(got
        .iter()
        .zip(&payloads[first..])
        .all(|(r, p)| r.payload == *p));
    // The segment being written is a recycled one: past the end it still holds an old
    // segment's records, each CRC-valid at its old position.
    let cur = segment_path(tmp.path(), TimelineId(1), end);
    let bytes = std::fs::read(&cur).unwrap();
    let tail = &bytes[end.segment_offset(SEG) as usize..];
    assert!(
        tail.iter().any(|&b| b != 0),
        "the current segment was not a recycled one"
    );
    drop(wal);
    // The worst an old file can hold: a CRC-valid record right at the end. Copy the last
    // record there, as if a recycled file's old record had happened to start at that offset.
    let seg_start = Lsn(end.0 / SEG * SEG);
    let last = ends[ends.len() - 2];
    assert!(last >= seg_start && end.0 + (end.0 - last.0) < seg_start.0 + SEG);
    let (from_off, to_off) = (
        last.segment_offset(SEG) as usize,
        end.segment_offset(SEG) as usize,
    );
    let mut bytes = bytes;
    bytes.copy_within(from_off..to_off, to_off);
    std::fs::write(&cur, &bytes).unwrap();
    // Reopen as after a crash whose flush pointer was last stored at the first record end in
    // the end's segment: recovery scans forward from there and must stop where the new
    // records stop.
    let vouched = *ends.iter().find(|&&e| e > seg_start).unwrap();
    assert!(vouched < end);
    set_flush_pointer(tmp.path(), TimelineId(1), vouched);
    let wal = Wal::open(tmp.path(), keep_nothing()).unwrap();
    assert_eq!(wal.flushed(), end);
    let got = records(&wal, TimelineId(1), from);
    assert_eq!(got.len(), payloads.len() - first);
    // And new records append after the end and read back, also across another reopen.
    let more: Vec<Bytes> = (500..510).map(|i| payload(i, 40_000)).collect();
    let more_ends = append(&wal, &more);
    let more_end = *more_ends.last().unwrap();
    assert!(more_end.segment_number(SEG) == end.segment_number(SEG));
    drop(wal);
    let wal = Wal::open(tmp.path(), keep_nothing()).unwrap();
    assert_eq!(wal.flushed(), more_end);
    let got = records(&wal, TimelineId(1), end);
    assert_eq!(got.len(), more.len());
    assert!(got.iter().zip(&more).all(|(r, p)| r.payload == *p));
}

fn held_range_keeps_its_bytes(tmp: tempfile::TempDir) {
    let wal = init(tmp.path());
    let tli = TimelineId(1);
    // A slot holds the first segment until a range of it is located.
    wal.create_slot("hold", false, true).unwrap();
    let payloads: Vec<Bytes> = (0..40).map(|i| payload(i, 60_000)).collect();
    let ends = append(&wal, &payloads);
    assert!(ends.last().unwrap().0 > 3 * SEG);
    // A range in the first segment, as a walsender holds it in its queue.
    let at = ends[2];
    let range = wal.locate(tli, at, 100_000).unwrap().unwrap();
    wal.drop_slot("hold").unwrap();
    let mut before = vec![0u8; range.len];
    range.file.read_exact_at(&mut before, range.offset).unwrap();
    // Many more segments: the first is retired, the others are recycled one after another.
    let recycled_before = wal.segments_recycled();
    for i in 0..10 {
        let more: Vec<Bytes> = (0..20)
            .map(|j| payload(1000 + i * 20 + j, 60_000))
            .collect();
        append(&wal, &more);
    }
    assert!(
        wal.oldest_retained() > at,
        "the held segment was not retired"
    );
    assert!(
        wal.segments_recycled() >= recycled_before + 4,
        "too few segments were recycled to tell"
    );
    let mut after = vec![0u8; range.len];
    range.file.read_exact_at(&mut after, range.offset).unwrap();
    assert!(before == after, "a held range's bytes changed under it");
    // A reader arriving now is told the segment is gone.
    let err = wal.locate(tli, at, 100).unwrap_err();
    assert!(matches!(err, WalError::SegmentRemoved { .. }), "{err}");
}
