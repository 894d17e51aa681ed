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

/// The position watch wakes its subscribers for durable WAL only: every position it delivers
/// has the flushed end at the written end (for a primary's appends both are the batch's end).
/// A watch that also announced a batch between its write and its fdatasync, as it once did,
/// woke every walsender and walreceiver of the node for nothing just before the fdatasync of
/// each synchronous commit; on the real disk the subscriber sees such a position within a
/// few appends.
#[test]
fn the_position_watch_announces_durable_wal_only() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    const APPENDS: usize = 200;
    let mut rx = wal.subscribe();
    rx.borrow_and_update();
    let watcher = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut seen = Vec::new();
            // Bounded: at most a few announcements per append, and storage is dropped after
            // the last one, which ends `changed()`.
            for _ in 0..APPENDS * 4 {
                let next = tokio::time::timeout(std::time::Duration::from_secs(10), rx.changed());
                match next.await {
                    Ok(Ok(())) => seen.push(*rx.borrow_and_update()),
                    // The storage was dropped (after the last append), or a deadline passed.
                    _ => break,
                }
            }
            seen
        })
    });
    let mut last = Lsn(0);
    for i in 0..APPENDS {
        last = append(&wal, &[payload(i as u64, 64)])[0];
    }
    drop(wal);
    let seen = watcher.join().unwrap();
    assert_eq!(
        seen.last().map(|p| p.flushed),
        Some(last),
        "the watch announced the last durable end"
    );
    let early: Vec<_> = seen.iter().filter(|p| p.written != p.flushed).collect();
    assert!(
        early.is_empty(),
        "{} of {} announced positions had WAL written but not yet durable, e.g. {:?}",
        early.len(),
        seen.len(),
        early.first()
    );
}
