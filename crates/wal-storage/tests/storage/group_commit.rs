//! Group commit is real: many concurrent writers share fdatasyncs. A counted property: the
//! writer thread counts every fsync it makes.

use std::sync::{Arc, Barrier};

use wal_storage::*;

use crate::common::*;

#[test]
fn sixty_four_writers_share_fsyncs() {
    // On the real disk (not tmpfs), with real fsync: an fdatasync takes long enough for the
    // other writers' requests to queue behind it.
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    const WRITERS: usize = 64;
    const EACH: usize = 40;
    let barrier = Arc::new(Barrier::new(WRITERS + 1));
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let wal = wal.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let mut ends = Vec::new();
                for i in 0..EACH {
                    let p = payload((w * EACH + i) as u64, 128);
                    ends.push(wal.append(vec![p]).unwrap().wait().unwrap()[0]);
                }
                ends
            })
        })
        .collect();
    let before = wal.fsync_count();
    barrier.wait();
    let mut all: Vec<Lsn> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let fsyncs = wal.fsync_count() - before;
    let appends = (WRITERS * EACH) as u64;
    assert!(
        fsyncs * 16 <= appends,
        "{fsyncs} fsyncs for {appends} appends: more than one per 16"
    );
    // Every append got its own place in the WAL, and all are readable.
    all.sort();
    all.dedup();
    assert_eq!(all.len(), WRITERS * EACH);
    assert_eq!(records(&wal, TimelineId(1), Lsn(SEG)).len(), WRITERS * EACH);
    println!("{appends} appends, {fsyncs} fsyncs");
}
