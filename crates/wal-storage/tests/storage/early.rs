//! The overlapped commit's early publication (`Wal::set_publish_written`, feature
//! `failpoints` to hold the fdatasync): a batch of appends is announced as written and
//! readable from memory while its fdatasync runs, never as flushed; a batch whose sync fails
//! leaves nothing readable beyond the flushed end; off, nothing is published before the sync.

use std::time::Duration;

use wal_storage::*;

use crate::common::*;

/// Holds `wal`'s fdatasync until dropped, so that a failed assertion does not leave the
/// writer, and with it the test's end, waiting forever.
struct Held(Wal);

impl Held {
    fn new(wal: &Wal) -> Held {
        wal.failpoints().hold(FP_FSYNC);
        Held(wal.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.failpoints().release(FP_FSYNC);
    }
}

#[test]
fn a_batch_is_readable_from_memory_while_its_fdatasync_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let before = append(&wal, &[payload(1, 100)])[0];
    wal.set_publish_written(true);
    let held = Held::new(&wal);
    let ticket = wal.append(vec![payload(2, 300)]).unwrap();
    let pos = wait_position(&wal, "the written end", |p| p.written > before);
    assert_eq!(pos.flushed, before, "announced as written, not as flushed");
    let tli = wal.timeline();
    let early = wal
        .read_cached_written(tli, before, 1 << 20)
        .expect("the batch in memory");
    assert_eq!(before + early.len() as u64, pos.written);
    assert_eq!(
        wal.read_cached(tli, before, 1 << 20),
        None,
        "nothing beyond the flushed end for an ordinary reader"
    );
    drop(held);
    let end = ticket.wait().unwrap()[0];
    assert_eq!(end, pos.written);
    assert_eq!(wal.flushed(), end);
    assert_eq!(read_range(&wal, tli, before, end), early.to_vec());
}

#[test]
fn a_batch_whose_sync_fails_is_not_readable_afterwards() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let before = append(&wal, &[payload(1, 100)])[0];
    wal.set_publish_written(true);
    let held = Held::new(&wal);
    wal.failpoints().set(FP_FSYNC, libc::EIO);
    let ticket = wal.append(vec![payload(2, 300)]).unwrap();
    wait_position(&wal, "the written end", |p| p.written > before);
    drop(held);
    assert!(ticket.wait().unwrap_err().is_storage_failed());
    let pos = wal.position();
    assert_eq!((pos.written, pos.flushed), (before, before));
    assert_eq!(
        wal.read_cached_written(wal.timeline(), before, 1 << 20),
        None
    );
}

#[test]
fn off_nothing_is_published_before_the_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let before = append(&wal, &[payload(1, 100)])[0];
    let rx = wal.subscribe();
    let held = Held::new(&wal);
    let ticket = wal.append(vec![payload(2, 300)]).unwrap();
    // The writer reaches the held sync after its write.
    assert!(wal
        .failpoints()
        .wait_until_held(FP_FSYNC, Duration::from_secs(20)));
    assert!(wal.written() > before, "written, in memory");
    // The watch holds no written end beyond the flushed one (the announcement of the batch
    // before, which may come just after its answer, carries the same position).
    assert_eq!(
        rx.borrow().written,
        before,
        "nothing published before the sync"
    );
    assert_eq!(
        wal.read_cached_written(wal.timeline(), before, 1 << 20),
        None
    );
    drop(held);
    ticket.wait().unwrap();
}
