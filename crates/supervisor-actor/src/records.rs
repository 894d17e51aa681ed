//! Reading a node's walserver records as an application does: in LSN order from a given LSN,
//! across timeline switches, as they become durable.
//!
//! A subscription is a stream. It reads records on the blocking pool (storage reads are
//! `pread`s), in batches, up to the durable end; at the end it waits on storage's flush watch,
//! so a subscriber hears of new records as soon as they are durable and nobody polls. When the
//! timeline it reads has ended (a promotion here or upstream), it says so with
//! [`RecordEvent::TimelineSwitch`] and goes on with the next timeline.
//!
//! WAL is dropped in place only when a node follows a leader whose history forked from its
//! own (a live demotion). A subscription that had already given records beyond the fork
//! ends with [`WalError::ReadWalDropped`] when it sees the end of its timeline move below
//! what it gave, instead of going on from a position inside the other history.
//!
//! [`check_records_start`] tells a reader, before it subscribes, whether it can start where it
//! asks: the WAL there may have been removed, or the position may be inside a record. A reader
//! that started inside a record would decode its payload as a record header and report damage
//! that is not there, so an API answers these mistakes first, as errors of the request.

use std::collections::VecDeque;

use bytes::Bytes;
use futures_util::Stream;
use serde::Serialize;
use wal_storage::{Lsn, TimelineId, Wal, WalError};

/// What a record subscription yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordEvent {
    Record {
        timeline: TimelineId,
        /// Where the record starts, and where the next one starts.
        start: Lsn,
        end: Lsn,
        payload: Bytes,
    },
    /// The stream moves from timeline `from` to `to` at `at`: records after this are on `to`.
    TimelineSwitch {
        from: TimelineId,
        to: TimelineId,
        at: Lsn,
    },
}

/// Where a reader asks to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordsFrom {
    /// At this LSN: a record boundary or a segment start.
    Lsn(Lsn),
    /// At the oldest record still kept.
    Earliest,
}

/// What [`check_records_start`] found about a start position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordsStart {
    /// Reading can start at this LSN.
    At(Lsn),
    /// The WAL there was removed by retention; the oldest LSN kept is `oldest`.
    Removed { oldest: Lsn },
    /// The position is inside a record. `record` is where that record starts and `next` where
    /// the next one does, where the node knows them (a record continued from an earlier
    /// segment has no start in this one; the last record a standby holds may be incomplete).
    NotABoundary {
        record: Option<Lsn>,
        next: Option<Lsn>,
    },
    /// The position is beyond the durable end of WAL, `flushed`.
    AheadOfFlush { flushed: Lsn },
}

/// Whether a reader can start reading records at `from` (see [`RecordsStart`]); errors are
/// the storage's own (the node stores relayed PostgreSQL WAL, or the WAL before `from` in its
/// segment is damaged). Reads up to one segment to find the record boundaries before `from`,
/// on the blocking pool.
pub async fn check_records_start(wal: Wal, from: RecordsFrom) -> Result<RecordsStart, WalError> {
    tokio::task::spawn_blocking(move || check_start(&wal, from))
        .await
        .unwrap_or_else(|e| {
            Err(WalError::Io {
                context: "checking where to read records on the blocking pool".into(),
                cause: std::io::Error::other(e.to_string()),
            })
        })
}

fn check_start(wal: &Wal, from: RecordsFrom) -> Result<RecordsStart, WalError> {
    let oldest = wal.oldest_retained();
    let from = match from {
        RecordsFrom::Earliest => oldest,
        RecordsFrom::Lsn(lsn) => lsn,
    };
    let seg_start = from.segment_start(wal.segment_size());
    // A reader on relayed PostgreSQL WAL is refused whatever the position.
    let mut reader = wal.record_reader(timeline_of(wal, from), seg_start)?;
    if from < oldest {
        return Ok(RecordsStart::Removed { oldest });
    }
    let flushed = wal.flushed();
    if from > flushed {
        return Ok(RecordsStart::AheadOfFlush { flushed });
    }
    if from == seg_start {
        return Ok(RecordsStart::At(from));
    }
    // Walk the segment's records from its start: `from` is a boundary only if one starts
    // there (or the last complete one ends there).
    let mut record = None;
    while let Some(r) = reader.next_record()? {
        if r.start == from {
            return Ok(RecordsStart::At(from));
        }
        if r.start > from {
            return Ok(RecordsStart::NotABoundary {
                record,
                next: Some(r.start),
            });
        }
        if r.end > from {
            return Ok(RecordsStart::NotABoundary {
                record: Some(r.start),
                next: Some(r.end),
            });
        }
        record = Some(r.start);
    }
    if reader.position() == from {
        return Ok(RecordsStart::At(from));
    }
    Ok(RecordsStart::NotABoundary {
        record: None,
        next: None,
    })
}

/// How far a subscription goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Follow {
    /// Stop at the durable end as it was when the subscription started.
    UntilCurrentEnd,
    /// Keep going as new records become durable, until the subscriber drops the stream.
    Forever,
}

/// Records per blocking read: enough to amortise the hop to the blocking pool, few enough
/// that a subscriber sees the first records at once. A guess.
const BATCH: usize = 256;

struct State {
    wal: Wal,
    watch: tokio::sync::watch::Receiver<wal_storage::WalPosition>,
    /// Records are given only up to here when it holds an LSN
    /// ([`subscribe_acknowledged_records`]).
    visible: Option<tokio::sync::watch::Receiver<Option<Lsn>>>,
    timeline: TimelineId,
    position: Lsn,
    /// The end of the last record given, to notice WAL dropped under the subscription.
    read_to: Lsn,
    /// Where the stream stops, for [`Follow::UntilCurrentEnd`].
    stop_at: Option<Lsn>,
    buffered: VecDeque<RecordEvent>,
    done: bool,
}

/// The timeline of the node's history that holds `lsn`.
fn timeline_of(wal: &Wal, lsn: Lsn) -> TimelineId {
    wal.history()
        .iter()
        .find(|e| lsn < e.switch_lsn)
        .map_or(wal.timeline(), |e| e.parent)
}

/// The timeline after `tli` in the node's history, and where it starts.
fn next_timeline(wal: &Wal, tli: TimelineId) -> Option<(TimelineId, Lsn)> {
    let history = wal.history();
    let i = history.iter().position(|e| e.parent == tli)?;
    let next = history.get(i + 1).map_or(wal.timeline(), |e| e.parent);
    Some((next, history[i].switch_lsn))
}

/// Where the WAL of `tli` ends on this node: the flushed end on the current timeline, the
/// switch point on an older one.
fn end_of(wal: &Wal, tli: TimelineId) -> Lsn {
    if tli == wal.timeline() {
        return wal.flushed();
    }
    next_timeline(wal, tli).map_or(Lsn(u64::MAX), |(_, at)| at)
}

/// Subscribes to the node's records from `from`, which must be a record boundary or a
/// segment start (a new standby's first segment begins mid-record; the reader skips to the
/// first record that starts in it).
pub fn subscribe_records(
    wal: Wal,
    from: Lsn,
    follow: Follow,
) -> impl Stream<Item = Result<RecordEvent, WalError>> {
    subscribe(wal, None, from, follow)
}

/// As [`subscribe_records`], but while `gate` holds an LSN (the acknowledged end, where it is
/// not the local flush) each record is given only once the gate has reached its end.
pub(crate) fn subscribe_acknowledged_records(
    wal: Wal,
    gate: tokio::sync::watch::Receiver<Option<Lsn>>,
    from: Lsn,
    follow: Follow,
) -> impl Stream<Item = Result<RecordEvent, WalError>> {
    subscribe(wal, Some(gate), from, follow)
}

fn subscribe(
    wal: Wal,
    visible: Option<tokio::sync::watch::Receiver<Option<Lsn>>>,
    from: Lsn,
    follow: Follow,
) -> impl Stream<Item = Result<RecordEvent, WalError>> {
    // Not through the thread's relay: the stream may be polled on another thread than the one
    // that made it, and a relay lives only as long as its own thread's runtime.
    let watch = wal.subscribe();
    let end = match visible.as_ref().and_then(|v| *v.borrow()) {
        Some(v) => wal.flushed().min(v),
        None => wal.flushed(),
    };
    let state = State {
        timeline: timeline_of(&wal, from),
        stop_at: (follow == Follow::UntilCurrentEnd).then_some(end),
        visible,
        wal,
        watch,
        position: from,
        read_to: Lsn::INVALID,
        buffered: VecDeque::new(),
        done: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.buffered.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.done {
                return None;
            }
            if st.stop_at.is_some_and(|s| st.position >= s) {
                return None;
            }
            let end = end_of(&st.wal, st.timeline);
            if st.read_to > end {
                st.done = true;
                let e = WalError::ReadWalDropped {
                    read_to: st.read_to,
                    end,
                };
                return Some((Err(e), st));
            }
            // Mark the watch as seen before reading, so a flush that lands during the read
            // wakes the wait below instead of being missed.
            st.watch.borrow_and_update();
            let visible_end = st.visible.as_mut().and_then(|v| *v.borrow_and_update());
            let (wal, tli, pos) = (st.wal.clone(), st.timeline, st.position);
            let batch = tokio::task::spawn_blocking(move || -> Result<(Vec<_>, Lsn), WalError> {
                let mut reader = wal.record_reader(tli, pos)?;
                let mut out = Vec::new();
                while out.len() < BATCH {
                    match reader.next_record()? {
                        Some(r) => out.push(r),
                        None => break,
                    }
                }
                Ok((out, reader.position()))
            })
            .await;
            let (records, next) = match batch {
                Ok(Ok(x)) => x,
                Ok(Err(e)) => {
                    st.done = true;
                    return Some((Err(e), st));
                }
                Err(e) => {
                    st.done = true;
                    let e = WalError::Io {
                        context: "reading records on the blocking pool".into(),
                        cause: std::io::Error::other(e.to_string()),
                    };
                    return Some((Err(e), st));
                }
            };
            let mut held_back = false;
            let mut given = 0;
            for r in records {
                if st.stop_at.is_some_and(|s| r.end > s) {
                    st.done = true;
                    break;
                }
                if visible_end.is_some_and(|v| r.end > v) {
                    // Durable here but not acknowledged yet: read again once it is.
                    held_back = true;
                    break;
                }
                given += 1;
                st.position = r.end;
                st.read_to = r.end;
                st.buffered.push_back(RecordEvent::Record {
                    timeline: tli,
                    start: r.start,
                    end: r.end,
                    payload: r.payload,
                });
            }
            if given > 0 || st.done {
                continue;
            }
            if held_back {
                if st.stop_at.is_some() {
                    return None;
                }
                // Only the acknowledged end can let the next record out (a cut of the WAL
                // moves it too): a local flush alone is no reason to read again.
                let moved = match &mut st.visible {
                    Some(v) => v.changed().await.is_ok(),
                    None => false,
                };
                if !moved {
                    return None;
                }
                continue;
            }
            st.position = st.position.max(next);
            // Nothing more on this timeline for now: has it ended?
            if tli != st.wal.timeline() {
                if let Some((to, at)) = next_timeline(&st.wal, tli) {
                    if st.position >= at {
                        st.timeline = to;
                        st.buffered
                            .push_back(RecordEvent::TimelineSwitch { from: tli, to, at });
                        continue;
                    }
                }
            }
            if st.stop_at.is_some() {
                return None;
            }
            // Wait for more durable WAL (or a timeline switch).
            if !wait_for_more(&mut st).await {
                return None;
            }
        }
    })
}

/// Waits for more durable WAL, a timeline switch, or more acknowledged WAL; `false` once
/// storage or the acknowledged end is gone.
async fn wait_for_more(st: &mut State) -> bool {
    match &mut st.visible {
        None => st.watch.changed().await.is_ok(),
        Some(v) => tokio::select! {
            r = st.watch.changed() => r.is_ok(),
            r = v.changed() => r.is_ok(),
        },
    }
}
