//! Tickets waited on through the position watch (`Ticket::ride`): the writer answers a round of
//! requests, then announces the position, for every round that answered one, so a rider is
//! never left waiting; and a ticket awaited as it is finds the position already in the watch.

use std::time::Duration;

use bytes::Bytes;
use wal_storage::*;

use crate::common::*;

/// Runs `f` on a current-thread runtime, failing after a deadline instead of hanging when
/// an announcement never comes.
fn within_deadline<T>(f: impl std::future::Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), f)
            .await
            .expect("the ride was never answered")
    })
}

#[test]
fn a_ridden_append_is_answered_and_the_watch_already_holds_its_end() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    for i in 0..50 {
        let ends = within_deadline(
            wal.append(vec![payload(i, 200)])
                .unwrap()
                .ride(&mut wal.subscribe()),
        )
        .unwrap();
        let end = ends[0];
        assert_eq!(wal.flushed(), end);
        assert_eq!(wal.subscribe().borrow().flushed, end);
    }
}

#[test]
fn one_receiver_serves_a_series_of_tickets_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    // Sixteen at once, so that several share a batch and some are answered by a later round
    // than the announcement the receiver has already seen: each is answered all the same.
    let mut pos = wal.subscribe();
    let tickets: Vec<_> = (0..16)
        .map(|i| wal.append(vec![payload(i, 300)]).unwrap())
        .collect();
    let ends = within_deadline(async {
        let mut ends = Vec::new();
        for t in tickets {
            ends.push(t.ride(&mut pos).await.unwrap()[0]);
        }
        ends
    });
    assert!(ends.windows(2).all(|w| w[0] < w[1]), "{ends:?}");
    assert_eq!(*ends.last().unwrap(), wal.flushed());
}

#[test]
fn a_request_refused_outside_a_batch_is_announced_as_well() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let end = append(&wal, &[payload(1, 100)])[0];
    // A write with a gap fails its checks before it joins a batch, and nothing else is
    // staged: only the writer's owed announcement wakes its rider.
    let err = within_deadline(
        wal.write(end + 8, Bytes::from_static(b"x"))
            .unwrap()
            .ride(&mut wal.subscribe()),
    )
    .unwrap_err();
    assert!(matches!(err, WalError::Gap { .. }), "{err}");
    // And storage goes on as before.
    let next = append(&wal, &[payload(2, 100)])[0];
    assert!(next > end);
}

#[test]
fn a_ticket_awaited_as_it_is_sees_its_end_in_the_watch() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let position = wal.subscribe();
    for i in 0..50 {
        let end = wal.append(vec![payload(i, 100)]).unwrap().wait().unwrap()[0];
        // The announcement may come a moment later; the value is there before the answer.
        assert_eq!(position.borrow().flushed, end);
    }
}

#[cfg(feature = "failpoints")]
#[test]
fn a_failed_sync_is_announced_to_its_riders() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let before = append(&wal, &[payload(1, 100)])[0];
    wal.failpoints().set(FP_FSYNC, libc::EIO);
    let err = within_deadline(
        wal.append(vec![payload(2, 100)])
            .unwrap()
            .ride(&mut wal.subscribe()),
    )
    .unwrap_err();
    assert!(err.is_storage_failed(), "{err}");
    // A failed batch does not move the position, and the rider still heard of it.
    assert_eq!(wal.subscribe().borrow().flushed, before);
}

#[cfg(feature = "failpoints")]
#[test]
fn a_write_refused_by_a_full_disk_is_announced_to_its_rider() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Postgres);
    wal.failpoints().set(FP_PREALLOC, libc::ENOSPC);
    let chunk = SEG * 3 / 4;
    let mut end = wal.flushed();
    let refused = within_deadline(async {
        for i in 0..4 {
            match wal
                .write(end, payload(i, chunk as usize))
                .unwrap()
                .ride(&mut wal.subscribe())
                .await
            {
                Ok(e) => end = e,
                Err(e) => return Some(e),
            }
        }
        None
    });
    let err = refused.expect("a write that needs a new segment is refused");
    assert!(err.is_disk_full(), "{err}");
}
