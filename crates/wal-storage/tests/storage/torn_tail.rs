//! The corruption table (after etcd's repair_test.go): damage the tail of a WAL the way a crash
//! can, reopen, count the records that survive, then append and reopen again to prove no
//! phantom record comes back.

use std::path::Path;

use bytes::Bytes;
use wal_storage::*;

use crate::common::*;

const N: u64 = 10;

/// Ten records; the last spans into the next segment. The flush pointer is then set to vouch
/// only for the first five, as after a crash in the middle of unconfirmed appends.
fn build(dir: &Path) -> (Vec<Bytes>, Vec<Lsn>) {
    let wal = init_primary(dir, WalFormat::Walserver);
    let mut payloads: Vec<Bytes> = (0..N - 1)
        .map(|i| payload(i, 1000 + 37 * i as usize))
        .collect();
    // Fill most of the segment so that the last record crosses into the next one.
    let used = 24
        + payloads
            .iter()
            .map(|p| (16 + p.len() as u64).div_ceil(8) * 8)
            .sum::<u64>();
    payloads.push(payload(N - 1, (SEG - used) as usize + 500));
    let mut ends = Vec::new();
    for p in &payloads {
        ends.extend(append(&wal, std::slice::from_ref(p)));
    }
    assert!(
        ends[N as usize - 1] > Lsn(2 * SEG),
        "last record spans segments"
    );
    assert!(ends[N as usize - 2] < Lsn(2 * SEG));
    drop(wal);
    set_flush_pointer(dir, TimelineId(1), ends[4]);
    (payloads, ends)
}

fn start_of(i: usize, ends: &[Lsn]) -> Lsn {
    if i == 0 {
        Lsn(SEG + 24)
    } else {
        ends[i - 1]
    }
}

/// Reopens, checks the survivors, appends one record, reopens, checks again.
fn check(dir: &Path, payloads: &[Bytes], survivors: usize) {
    let wal = Wal::open(dir, cfg()).unwrap();
    let recs = records(&wal, TimelineId(1), Lsn(SEG));
    assert_eq!(
        recs.len(),
        survivors,
        "survivors; report {:?}",
        wal.recovery_report()
    );
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.payload, payloads[i]);
    }
    let end = recs.last().map(|r| r.end).unwrap_or(Lsn(SEG + 24));
    assert_eq!(wal.flushed(), end);
    // The new record has the length of the first one cut, so a stale record after it would
    // line up exactly: the phantom case.
    let new = payload(99, payloads.get(survivors).map_or(10, |p| p.len()));
    append(&wal, std::slice::from_ref(&new));
    drop(wal);
    let wal = Wal::open(dir, cfg()).unwrap();
    let recs = records(&wal, TimelineId(1), Lsn(SEG));
    assert_eq!(recs.len(), survivors + 1, "a cut record came back");
    assert_eq!(recs.last().unwrap().payload, new);
}

#[test]
fn clean_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, _) = build(tmp.path());
    check(tmp.path(), &p, N as usize);
}

#[test]
fn cut_mid_record() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, ends) = build(tmp.path());
    // Record 8 is torn: its second half and everything after never reached the disk.
    let mid = start_of(8, &ends) + 600;
    patch(tmp.path(), TimelineId(1), mid, |b| b.fill(0));
    std::fs::remove_file(segment_path(tmp.path(), TimelineId(1), Lsn(2 * SEG))).unwrap();
    check(tmp.path(), &p, 8);
}

#[test]
fn garbage_after_the_end() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, ends) = build(tmp.path());
    patch(tmp.path(), TimelineId(1), ends[9], |b| b[..4096].fill(0xAB));
    check(tmp.path(), &p, N as usize);
}

#[test]
fn zeroed_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, ends) = build(tmp.path());
    patch(tmp.path(), TimelineId(1), start_of(7, &ends), |b| b.fill(0));
    std::fs::remove_file(segment_path(tmp.path(), TimelineId(1), Lsn(2 * SEG))).unwrap();
    check(tmp.path(), &p, 7);
}

#[test]
fn flipped_bit_in_the_last_record() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, ends) = build(tmp.path());
    patch(tmp.path(), TimelineId(1), start_of(8, &ends) + 100, |b| {
        b[0] ^= 0x04
    });
    check(tmp.path(), &p, 8);
}

#[test]
fn tail_spanning_into_the_next_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, _) = build(tmp.path());
    // The continuation of record 9 in the next segment is lost.
    patch(tmp.path(), TimelineId(1), Lsn(2 * SEG) + 30, |b| {
        b[..200].fill(0)
    });
    check(tmp.path(), &p, 9);
    // Losing the next segment's header does the same.
    let tmp = tempfile::tempdir().unwrap();
    let (p, _) = build(tmp.path());
    patch(tmp.path(), TimelineId(1), Lsn(2 * SEG), |b| b[3] ^= 1);
    check(tmp.path(), &p, 9);
}

#[test]
fn stale_records_after_a_cut_do_not_come_back() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, ends) = build(tmp.path());
    // Record 6 is damaged; 7 and 8 behind it are intact but were never vouched for. They must
    // be cut with it, and stay cut after a record of 6's length is written in its place.
    patch(tmp.path(), TimelineId(1), start_of(6, &ends) + 40, |b| {
        b[0] ^= 0xFF
    });
    check(tmp.path(), &p, 6);
}

#[test]
fn damage_below_the_durable_end_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, ends) = build(tmp.path());
    patch(tmp.path(), TimelineId(1), start_of(2, &ends) + 20, |b| {
        b[0] ^= 1
    });
    let err = Wal::open(tmp.path(), cfg()).unwrap_err();
    assert!(matches!(err, WalError::Corruption { .. }), "{err}");
    assert!(
        err.to_string().contains("000000010000000000000001"),
        "{err}"
    );
}

#[test]
fn raw_bytes_beyond_the_flush_pointer_are_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Postgres);
    let data = payload(5, 300_000);
    wal.write(Lsn(SEG), data.clone()).unwrap().wait().unwrap();
    drop(wal);
    // As if the last 100 000 bytes were written but the crash came before the pointer moved.
    let vouched = Lsn(SEG + 200_000);
    set_flush_pointer(tmp.path(), TimelineId(1), vouched);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(wal.flushed(), vouched);
    assert_eq!(wal.recovery_report().discarded_bytes, 100_000);
    assert_eq!(
        read_range(&wal, TimelineId(1), Lsn(SEG), vouched),
        &data[..200_000]
    );
    assert!(wal.read(TimelineId(1), vouched, 10).unwrap().is_empty());
    // The cut bytes are gone from the file, so a shorter write cannot expose them.
    wal.write(vouched, Bytes::from_static(b"tail"))
        .unwrap()
        .wait()
        .unwrap();
    drop(wal);
    let bytes = std::fs::read(segment_path(tmp.path(), TimelineId(1), Lsn(SEG))).unwrap();
    assert_eq!(&bytes[200_000..200_004], b"tail");
    assert!(bytes[200_004..].iter().all(|&b| b == 0));
}
