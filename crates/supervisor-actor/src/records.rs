//! Reading a node's walserver records as an application does: in LSN order from a given LSN,
//! across timeline switches, as they become durable.
//!
//! A subscription is a stream. It reads records on the blocking pool (storage reads are
//! `pread`s), in batches, up to the durable end; at the end it waits on storage's flush watch,
//! so a subscriber hears of new records as soon as they are durable and nobody polls. When the
//! timeline it reads has ended (a promotion here or upstream), it says so with
//! [`RecordEvent::TimelineSwitch`] and goes on with the next timeline.

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
    timeline: TimelineId,
    position: Lsn,
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

/// Subscribes to the node's records from `from`, which must be a record boundary or a
/// segment start (a new standby's first segment begins mid-record; the reader skips to the
/// first record that starts in it).
pub fn subscribe_records(
    wal: Wal,
    from: Lsn,
    follow: Follow,
) -> impl Stream<Item = Result<RecordEvent, WalError>> {
    let watch = wal.subscribe();
    let state = State {
        timeline: timeline_of(&wal, from),
        stop_at: (follow == Follow::UntilCurrentEnd).then(|| wal.flushed()),
        wal,
        watch,
        position: from,
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
            // Mark the watch as seen before reading, so a flush that lands during the read
            // wakes the wait below instead of being missed.
            st.watch.borrow_and_update();
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
                        source: std::io::Error::other(e.to_string()),
                    };
                    return Some((Err(e), st));
                }
            };
            if !records.is_empty() {
                for r in records {
                    if st.stop_at.is_some_and(|s| r.end > s) {
                        st.done = true;
                        break;
                    }
                    st.position = r.end;
                    st.buffered.push_back(RecordEvent::Record {
                        timeline: tli,
                        start: r.start,
                        end: r.end,
                        payload: r.payload,
                    });
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
            if st.watch.changed().await.is_err() {
                return None;
            }
        }
    })
}
