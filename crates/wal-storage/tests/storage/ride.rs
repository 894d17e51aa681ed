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

/// The position watch never goes back to a value older than the state it publishes, also
/// while another thread publishes a change of the commit point as the writer completes a
/// batch: the overlapped commit sets a primary's own on the supervisor's thread after each
/// flush, and a standby's told point is stored and published on the background thread. A
/// publication that took the position before the writer's batch and put it into the watch
/// after would hide the batch's flushed end: its announcement already made, a waiter riding
/// the watch would never see its end, and with one client nothing else would publish again.
///
/// Each round holds the watch (a borrow) while both publish, so that both wait for it with
/// their work done: the writer has moved the flushed end, and the other thread has asked to
/// publish. Whichever goes first, the watch must end with the flushed end. A round in which
/// the writer was still announcing the last batch (it then waits for the watch before it
/// takes the new one) is let go and not counted.
#[test]
fn a_commit_point_published_beside_the_writer_never_hides_its_flushed_end() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let position = wal.subscribe();
    let mut counted = 0;
    for i in 1..=60u64 {
        let before = wal.position().flushed;
        let held = position.borrow();
        let (asked_tx, asked) = std::sync::mpsc::channel();
        let publisher = {
            let wal = wal.clone();
            std::thread::spawn(move || {
                let _ = asked_tx.send(());
                wal.set_own_commit_point(Some(Lsn(i)));
            })
        };
        asked.recv().unwrap();
        let ticket = wal.append(vec![payload(i, 100)]).unwrap();
        // The writer moves the state, then waits for the watch this thread holds.
        let deadline = std::time::Instant::now() + Duration::from_millis(200);
        let mut moved = false;
        while !moved && std::time::Instant::now() < deadline {
            moved = wal.position().flushed != before;
            std::thread::yield_now();
        }
        drop(held);
        let end = ticket.wait().unwrap()[0];
        publisher.join().unwrap();
        if !moved {
            continue;
        }
        counted += 1;
        let seen = *position.borrow();
        assert!(
            seen.flushed >= end,
            "round {i}: the watch holds flushed end {} after an append to {end} was answered",
            seen.flushed
        );
        assert_eq!(seen, wal.position(), "round {i}");
    }
    assert!(
        counted >= 10,
        "only {counted} rounds met the writer in time"
    );
}
