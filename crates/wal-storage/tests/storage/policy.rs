//! The storage failure policy (feature `failpoints`): a failed sync stops acknowledging until
//! storage is reopened by `Wal::restart`, with the flushed end held at the last good sync; a
//! full disk is backpressure that clears by itself.

use std::error::Error as _;

use bytes::Bytes;
use wal_storage::*;

use crate::common::*;

/// The error as a binary prints it with its causes (anyhow's `{:#}`).
fn chain(e: &WalError) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// The payloads of every record a fresh open of `dir` finds.
fn stored_payloads(dir: &std::path::Path) -> Vec<Bytes> {
    let wal = Wal::open(dir, cfg()).unwrap();
    records(&wal, TimelineId(1), Lsn(SEG))
        .into_iter()
        .map(|r| r.payload)
        .collect()
}

#[test]
fn a_failed_fsync_stops_acknowledging_until_storage_is_reopened() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let a = append(&wal, &[payload(1, 100)])[0];
    let mut position = wal.subscribe();
    position.borrow_and_update();
    let mut health = wal.subscribe_health();
    assert_eq!(health.borrow_and_update().state, StorageState::Ok);

    wal.failpoints().set(FP_FSYNC, libc::EIO);
    let err = wal
        .append(vec![payload(2, 100), payload(3, 100)])
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(err.is_storage_failed(), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with("storage failed and is restarting: fdatasync of WAL segment")
            && text.contains("Input/output error")
            && text.contains(&format!("nothing beyond {a} was acknowledged")),
        "{text}"
    );
    // The failure was an event, and the flushed end never moved past the last good sync.
    assert!(health.has_changed().unwrap());
    let h = wal.health();
    assert_eq!(h.state, StorageState::Failed);
    assert_eq!(
        h.path.as_deref(),
        Some(segment_path(tmp.path(), TimelineId(1), a).as_path())
    );
    assert!(h.error.as_deref().unwrap().contains("fdatasync"), "{h:?}");
    assert_eq!(wal.flushed(), a);
    assert_eq!(position.borrow_and_update().flushed, a);
    assert!(wal.read_cached(TimelineId(1), a, 1 << 20).is_none());
    // Every later write is refused at once, even with the fault gone: a failed sync is not
    // retried and trusted.
    wal.failpoints().clear(FP_FSYNC);
    assert!(wal
        .append(vec![payload(4, 10)])
        .unwrap_err()
        .is_storage_failed());
    assert!(wal
        .write(a, Bytes::from_static(b"x"))
        .unwrap_err()
        .is_storage_failed());
    assert!(wal.promote("x").unwrap_err().is_storage_failed());
    // Reads of what is durable go on.
    assert_eq!(records(&wal, TimelineId(1), Lsn(SEG)).len(), 1);

    // A reopening while syncs still fail fails too (zeroing the failed batch's bytes needs a
    // sync), and storage stays failed with that error.
    wal.failpoints().set(FP_FSYNC, libc::EIO);
    let again = wal.restart().unwrap_err();
    assert!(chain(&again).contains("Input/output error"), "{again}");
    let h = wal.health();
    assert_eq!(
        (h.state, h.restarts, h.failed_restarts),
        (StorageState::Failed, 0, 1)
    );
    assert!(wal
        .append(vec![payload(4, 10)])
        .unwrap_err()
        .is_storage_failed());

    wal.failpoints().clear(FP_FSYNC);
    let report = wal.restart().unwrap().expect("storage had failed");
    assert_eq!(report.end, a, "reopened at the last good sync");
    let h = wal.health();
    assert_eq!((h.state, h.restarts, h.error), (StorageState::Ok, 1, None));
    assert_eq!(wal.restart().unwrap(), None, "nothing to do when healthy");

    // Writes resume on the same handle; the position channel taken before the failure goes on.
    let c = append(&wal, &[payload(5, 100)])[0];
    assert!(c > a);
    assert!(position.has_changed().unwrap());
    assert_eq!(position.borrow_and_update().flushed, c);
    // Fail points set on the handle still apply to the new opening.
    wal.failpoints().set(FP_FSYNC, libc::EIO);
    assert!(wal
        .append(vec![payload(6, 10)])
        .unwrap()
        .wait()
        .unwrap_err()
        .is_storage_failed());
    wal.failpoints().clear_all();
    wal.restart().unwrap().expect("failed again");
    assert_eq!(wal.health().restarts, 2);
    drop(wal);
    // Everything acknowledged is there, and nothing that was refused.
    assert_eq!(
        stored_payloads(tmp.path()),
        vec![payload(1, 100), payload(5, 100)]
    );
}

#[test]
fn a_slot_in_use_stays_in_use_across_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    wal.create_slot("s", false, true).unwrap();
    let guard = wal.acquire_slot("s", 7).unwrap();
    wal.failpoints().set(FP_FSYNC, libc::EIO);
    let _ = wal.append(vec![payload(1, 10)]).unwrap().wait();
    wal.failpoints().clear_all();
    wal.restart().unwrap().expect("storage had failed");
    assert!(matches!(
        wal.acquire_slot("s", 7),
        Err(WalError::SlotInUse { .. })
    ));
    drop(guard);
    assert!(
        wal.acquire_slot("s", 7).is_ok(),
        "released in the new opening"
    );
}

/// Appends records of three quarters of a segment until one is refused; returns the end of
/// the last one taken and the refusal. The fail point is set before the writer enters the
/// second segment, so the third cannot be made (whether the second could depends on how far
/// the background thread got since open).
fn fill_until_refused(wal: &Wal) -> (Lsn, WalError, Vec<Bytes>) {
    let size = SEG as usize * 3 / 4;
    let mut taken = Vec::new();
    let mut end = wal.flushed();
    for i in 0..4 {
        let p = payload(10 + i, size);
        match wal.append(vec![p.clone()]).unwrap().wait() {
            Ok(ends) => {
                end = ends[0];
                taken.push(p);
            }
            Err(e) => return (end, e, taken),
        }
    }
    panic!("four records of 3/4 of a segment all fit while segments could not be made");
}

#[test]
fn appends_that_fit_in_the_segment_succeed_while_preallocation_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    wal.failpoints().set(FP_PREALLOC, libc::ENOSPC);
    let (end, err, mut taken) = fill_until_refused(&wal);
    // The refused record would have ended in the next segment, which could not be made; the
    // message says so once, naming the file.
    assert!(err.is_disk_full(), "{err}");
    let next = end.segment_number(SEG) + 1;
    let path = tmp
        .path()
        .join("pg_wal")
        .join(segment_file_name(TimelineId(1), next, SEG));
    let text = chain(&err);
    assert!(
        text.starts_with(&format!(
            "the disk is full: preallocating WAL segment {}",
            segment_file_name(TimelineId(1), next, SEG)
        )) && text.contains(&format!("({}): ", path.display())),
        "{text}"
    );
    assert_eq!(text.matches("No space left on device").count(), 1, "{text}");
    let h = wal.health();
    assert_eq!(h.state, StorageState::Full);
    assert_eq!(h.path.as_deref(), Some(path.as_path()));
    assert_eq!(wal.flushed(), end);
    // Records that fit in the current segment are taken meanwhile (at least a quarter of it
    // is left); the disk is still full for the next one.
    let small = append(&wal, &[payload(3, 100), payload(4, 100)]);
    assert!(small[1].segment_number(SEG) == next - 1 && small[1] > end);
    taken.extend([payload(3, 100), payload(4, 100)]);
    assert_eq!(wal.health().state, StorageState::Full);
    // Space returns: the refused record goes in, with no restart.
    wal.failpoints().clear(FP_PREALLOC);
    let big = payload(99, SEG as usize * 3 / 4);
    let e = append(&wal, std::slice::from_ref(&big))[0];
    assert_eq!(e.segment_number(SEG), next);
    taken.push(big);
    let h = wal.health();
    assert_eq!((h.state, h.restarts), (StorageState::Ok, 0));
    drop(wal);
    assert_eq!(stored_payloads(tmp.path()), taken);
}

/// A standby's raw bytes meet a full disk the same way: what fits is written, the rest is
/// refused and sent again later.
#[test]
fn raw_writes_are_refused_on_a_full_disk_and_resume_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Postgres);
    wal.failpoints().set(FP_PREALLOC, libc::ENOSPC);
    let chunk = SEG * 3 / 4;
    let mut end = wal.flushed();
    let mut refused = None;
    for i in 0..4 {
        match wal.write(end, payload(i, chunk as usize)).unwrap().wait() {
            Ok(e) => end = e,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let err = refused.expect("a write that needs a new segment is refused");
    assert!(err.is_disk_full(), "{err}");
    assert_eq!(wal.health().state, StorageState::Full);
    assert_eq!(wal.flushed(), end);
    assert_eq!(
        wal.write(end, payload(7, 1000)).unwrap().wait().unwrap(),
        end + 1000,
        "bytes that fit in the current segment are taken"
    );
    wal.failpoints().clear_all();
    let done = wal
        .write(end + 1000, payload(8, chunk as usize))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(done, end + 1000 + chunk);
    assert_eq!(wal.health().state, StorageState::Ok);
}

/// A control operation writes and syncs files too: a promotion whose history file cannot be
/// written fails storage under the same policy as a batch, and the node promotes once storage
/// is reopened. A request that makes no sense fails alone and leaves storage as it was.
#[test]
fn a_failed_promotion_write_fails_storage_until_it_is_reopened() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let a = append(&wal, &[payload(1, 100)])[0];

    let bad = wal.truncate_to(Lsn(a.0 + (1 << 20))).unwrap_err();
    assert!(!bad.is_storage_failed(), "{bad}");
    assert_eq!(wal.health().state, StorageState::Ok);

    wal.failpoints().set(FP_ATOMIC, libc::EIO);
    let err = wal.promote("test").unwrap_err();
    wal.failpoints().clear(FP_ATOMIC);
    assert!(err.is_storage_failed(), "{err}");
    assert_eq!(wal.health().state, StorageState::Failed);
    assert!(wal
        .append(vec![payload(2, 10)])
        .unwrap_err()
        .is_storage_failed());

    wal.restart().unwrap();
    assert_eq!(wal.health().state, StorageState::Ok);
    let (tli, _) = wal.promote("test").unwrap();
    assert_eq!(tli, TimelineId(2));
    append(&wal, &[payload(3, 10)]);
    drop(wal);
    assert_eq!(stored_payloads(tmp.path())[0], payload(1, 100));
}
