//! The walreceiver's storage effects, carried out: what [`Session`](crate::session::Session)
//! needs of storage, from memory on the actor's thread or with file I/O on the tokio blocking
//! pool.
//!
//! - [`LocalWal::of`]: the snapshot a session begins with, taken from memory.
//! - [`run`]: a [`StorageOp`] (history files, following a timeline), blocking;
//!   [`run_blocking`] runs it on the pool.
//!
//! WAL itself goes to storage with `Wal::write`, which only queues it for storage's writer
//! thread, so the actor calls it inline. The walsender's `storage_ops` does the same for its
//! own effects.

use std::future::Future;

use bytes::Bytes;
use wal_storage::{Wal, WalError};

use crate::session::{LocalWal, StorageDone, StorageOp};

impl LocalWal {
    /// What `wal` holds now, streaming to start at its durable end. Memory only: no I/O.
    pub fn of(wal: &Wal) -> LocalWal {
        let pos = wal.position();
        LocalWal {
            system_id: wal.system_id(),
            timeline: pos.timeline,
            flushed: pos.flushed,
            written: pos.flushed,
            commit_point: match pos.commit {
                wal_storage::CommitBound::Told(c) => Some(c),
                _ => None,
            },
            primary_end: wal.primary_end(),
            history: wal.history(),
        }
    }

    /// What `wal` holds after a fill from the archive, streaming to start at its written
    /// end: a filled segment can end inside a record, whose start the upstream may no longer
    /// have, while every byte written is durable (the fill waited for it). Memory only.
    pub fn after_fill(wal: &Wal) -> LocalWal {
        let pos = wal.position();
        LocalWal {
            written: pos.written,
            ..LocalWal::of(wal)
        }
    }
}

/// Runs `op` against storage. Blocking: call it on a blocking pool.
pub fn run(op: StorageOp, wal: &Wal) -> Result<StorageDone, WalError> {
    match op {
        StorageOp::ReadHistoryFiles(tlis) => tlis
            .into_iter()
            .map(|t| Ok((t, wal.history_file(t)?.map(Bytes::from))))
            .collect::<Result<_, WalError>>()
            .map(StorageDone::HistoryFiles),
        StorageOp::StoreHistoryFile { timeline, content } => wal
            .store_history_file(timeline, content.to_vec())
            .map(|()| StorageDone::HistoryStored(timeline)),
        StorageOp::FollowTimeline {
            timeline,
            history,
            switch,
        } => wal
            .follow_timeline(timeline, history.to_vec(), switch)
            .map(|()| StorageDone::Followed { timeline, switch }),
        StorageOp::CutBack { timeline, to } => {
            // Only the timeline the session decided on: a storage that moved on meanwhile
            // is the next connection's to judge.
            if wal.timeline() != timeline {
                return Err(WalError::BadTruncate {
                    lsn: to,
                    reason: format!("storage left timeline {timeline}"),
                });
            }
            let bytes = wal.truncate_to(to)?;
            wal.metrics().count_tail_cut(bytes);
            Ok(StorageDone::CutBack { to, bytes })
        }
    }
}

/// Runs `op` on the blocking pool; a task that panicked or was cancelled is a storage error.
pub fn run_blocking(
    op: StorageOp,
    wal: Wal,
) -> impl Future<Output = Result<StorageDone, WalError>> {
    let job = tokio::task::spawn_blocking(move || run(op, &wal));
    async move {
        job.await.unwrap_or_else(|e| {
            Err(WalError::Io {
                context: "storage work on the blocking pool".into(),
                cause: std::io::Error::other(e.to_string()),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use wal_storage::{
        format_history, HistoryEntry, InitOptions, StorageConfig, SystemId, TimelineId, WalFormat,
    };

    use super::*;

    #[test]
    fn history_files_are_stored_and_read_back_and_a_timeline_followed() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::init(
            dir.path(),
            StorageConfig {
                fsync: false,
                ..StorageConfig::default()
            },
            InitOptions::primary(SystemId(7), WalFormat::Walserver),
        )
        .unwrap();
        let local = LocalWal::of(&wal);
        assert_eq!(local.system_id, SystemId(7));
        assert_eq!(local.timeline, TimelineId(1));
        assert_eq!(local.flushed, wal.flushed());
        let switch = wal.flushed();
        let history = Bytes::from(format_history(&[HistoryEntry {
            parent: TimelineId(1),
            switch_lsn: switch,
            reason: "test".into(),
        }]));
        let missing = run(StorageOp::ReadHistoryFiles(vec![TimelineId(2)]), &wal).unwrap();
        assert_eq!(
            missing,
            StorageDone::HistoryFiles(vec![(TimelineId(2), None)])
        );
        let stored = run(
            StorageOp::StoreHistoryFile {
                timeline: TimelineId(2),
                content: history.clone(),
            },
            &wal,
        )
        .unwrap();
        assert_eq!(stored, StorageDone::HistoryStored(TimelineId(2)));
        let read = run(StorageOp::ReadHistoryFiles(vec![TimelineId(2)]), &wal).unwrap();
        assert_eq!(
            read,
            StorageDone::HistoryFiles(vec![(TimelineId(2), Some(history.clone()))])
        );
        let op = StorageOp::FollowTimeline {
            timeline: TimelineId(2),
            history,
            switch,
        };
        let followed = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(async { run_blocking(op, wal.clone()).await })
            .unwrap();
        assert_eq!(
            followed,
            StorageDone::Followed {
                timeline: TimelineId(2),
                switch
            }
        );
        assert_eq!(LocalWal::of(&wal).timeline, TimelineId(2));
    }
}
