//! The walsender's storage effects, carried out: what [`Session`](crate::session::Session)
//! asks of storage, on the actor's thread for what is in memory and on the tokio blocking pool
//! for what touches files.
//!
//! - [`StorageView`] for [`Wal`]: the memory-only facts and slot bookkeeping the session reads
//!   inline.
//! - [`read`]: an `Output::Read`. WAL that storage still holds in its tail cache is taken from
//!   memory at once; otherwise it is read from the segment files, or only located in them when
//!   the writer sends from files (`sendfile`), on the blocking pool; a range of a segment file
//!   storage already has open is located at once, from memory.
//! - [`run`]: a [`StorageOp`] (a replication command that touches files), blocking;
//!   [`run_blocking`] runs it on the pool and, for `DROP_REPLICATION_SLOT ... WAIT` on a slot in
//!   use, again each time a slot is released until it can be dropped.
//!
//! The walreceiver's `storage_ops` does the same for its own effects.

use std::future::Future;

use bytes::Bytes;
use futures_util::future::{self, Either};
use protocol_codec::{results, BackendMessage, ErrorFields, SqlState};
use wal_storage::{
    HistoryEntry, Lsn, SlotGuard, SlotInfo, SystemId, TimelineId, Wal, WalError, WalPosition,
};

use crate::session::{wal_error_fields, StorageDone, StorageOp, StorageView, WalData};

impl StorageView for Wal {
    fn position(&self) -> WalPosition {
        Wal::position(self)
    }

    fn system_id(&self) -> SystemId {
        Wal::system_id(self)
    }

    fn history(&self) -> Vec<HistoryEntry> {
        Wal::history(self)
    }

    fn slot(&self, name: &str) -> Result<SlotInfo, WalError> {
        Wal::slot(self, name)
    }

    fn acquire_slot(&self, name: &str, pid: u32) -> Result<SlotGuard, WalError> {
        Wal::acquire_slot(self, name, pid)
    }

    fn advance_slot(
        &self,
        name: &str,
        restart_lsn: Lsn,
        restart_tli: TimelineId,
    ) -> Result<(), WalError> {
        Wal::advance_slot(self, name, restart_lsn, restart_tli)
    }

    fn drop_temporary_slot(&self, name: &str) -> Result<(), WalError> {
        // Only a temporary slot is dropped here: dropping a persistent one removes its file.
        match Wal::slot(self, name) {
            Ok(slot) if slot.temporary => Wal::drop_slot(self, name),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn mark_early_sends(&self, tli: TimelineId) -> Option<TimelineId> {
        Wal::mark_early_sends(self, tli)
    }
}

/// Carries out an `Output::Read`: `len` bytes of `timeline` from `start`, as bytes in memory,
/// or (with `sendfile`) as where they lie in a segment file.
///
/// Streaming live reads what was flushed a moment ago: storage keeps it in memory, and taking
/// it at once spares the two thread hand-offs of the blocking pool on every synchronous
/// commit's path. Either way the result is a future, so the actor handles it on a later turn,
/// as it would the pool's.
pub fn read(
    wal: &Wal,
    timeline: TimelineId,
    start: Lsn,
    len: usize,
    sendfile: bool,
) -> impl Future<Output = Result<WalData, WalError>> {
    // Up to the written end: a session asks beyond its flushed end only when it may send
    // early (`crate::overlap`), so every other session gets what `read_cached` would give.
    if let Some(bytes) = wal.read_cached_written(timeline, start, len) {
        return Either::Left(future::ready(Ok(bytes.into())));
    }
    // Catching up from files: after the first range of a segment, storage has the file open
    // and knows its length, so where the next range lies is known without the pool's two
    // thread hand-offs.
    if sendfile {
        if let Some(range) = wal.locate_cached(timeline, start, len) {
            return Either::Left(future::ready(Ok(WalData::File(range))));
        }
    }
    let wal = wal.clone();
    let job = tokio::task::spawn_blocking(move || {
        if sendfile {
            // Catching up: the writer sends the WAL from the segment files, so only where it
            // lies is needed (opening a file is still file I/O).
            wal.locate(timeline, start, len).map(WalData::located)
        } else {
            wal.read(timeline, start, len).map(WalData::from)
        }
    });
    Either::Right(async move { job.await.unwrap_or_else(|e| Err(pool_failed(e))) })
}

/// Runs `op` on the blocking pool. A `DROP_REPLICATION_SLOT ... WAIT` of a slot in use runs
/// again each time a slot is released, until it is dropped or fails.
pub async fn run_blocking(op: StorageOp, wal: Wal) -> StorageDone {
    loop {
        // Subscribed before the attempt, so a release during it is seen.
        let mut releases = wal.slot_releases();
        let (w, o) = (wal.clone(), op.clone());
        let result = tokio::task::spawn_blocking(move || run(o, &w))
            .await
            .unwrap_or_else(|e| StorageDone {
                messages: vec![BackendMessage::ErrorResponse(ErrorFields::error(
                    SqlState::INTERNAL_ERROR,
                    format!("command failed: {e}"),
                ))],
                failed: true,
                temporary_slot: None,
                retry_after_release: false,
            });
        if !result.retry_after_release || releases.changed().await.is_err() {
            return result;
        }
    }
}

/// Runs `op` against storage. Blocking: call it on a blocking pool.
pub fn run(op: StorageOp, wal: &Wal) -> StorageDone {
    let ok = |messages| StorageDone {
        messages,
        failed: false,
        temporary_slot: None,
        retry_after_release: false,
    };
    let err = |mut messages: Vec<BackendMessage>, e: ErrorFields| {
        messages.push(BackendMessage::ErrorResponse(e));
        StorageDone {
            messages,
            failed: true,
            temporary_slot: None,
            retry_after_release: false,
        }
    };
    match op {
        StorageOp::TimelineHistory(tli) => match wal.history_file(tli) {
            Ok(Some(content)) => ok(results::timeline_history(tli, Bytes::from(content))),
            // PostgreSQL sends the RowDescription before it opens the file.
            Ok(None) => err(
                vec![results::timeline_history_description()],
                ErrorFields::error(
                    SqlState::UNDEFINED_FILE,
                    format!(
                        "could not open file \"pg_wal/{}\": No such file or directory",
                        results::timeline_history_filename(tli)
                    ),
                ),
            ),
            Err(e) => err(
                vec![results::timeline_history_description()],
                wal_error_fields(&e),
            ),
        },
        StorageOp::CreateSlot {
            name,
            temporary,
            reserve_wal,
        } => match wal.create_slot(&name, temporary, reserve_wal) {
            // PostgreSQL 15 reports consistent_point 0/0 for physical slots.
            Ok(_) => StorageDone {
                messages: results::create_replication_slot(&name, Lsn::INVALID, None, None),
                failed: false,
                temporary_slot: temporary.then_some(name),
                retry_after_release: false,
            },
            Err(e) => err(Vec::new(), wal_error_fields(&e)),
        },
        StorageOp::DropSlot { name, wait } => match wal.drop_slot(&name) {
            Ok(()) => ok(results::drop_replication_slot()),
            Err(WalError::SlotInUse { .. }) if wait => StorageDone {
                messages: Vec::new(),
                failed: false,
                temporary_slot: None,
                retry_after_release: true,
            },
            Err(e) => err(Vec::new(), wal_error_fields(&e)),
        },
    }
}

/// A WAL read or lookup whose task on the blocking pool failed (it panicked or was cancelled).
fn pool_failed(e: tokio::task::JoinError) -> WalError {
    WalError::Io {
        context: "reading WAL on the blocking pool".into(),
        cause: std::io::Error::other(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;
    use wal_storage::{InitOptions, StorageConfig, WalFormat};

    use super::*;

    fn wal(dir: &tempfile::TempDir) -> Wal {
        let cfg = StorageConfig {
            // Large enough that retention removes nothing the tests write.
            segment_size: 16 << 20,
            fsync: false,
            ..StorageConfig::default()
        };
        Wal::init(
            dir.path(),
            cfg,
            InitOptions::primary(SystemId(42), WalFormat::Walserver),
        )
        .unwrap()
    }

    /// A runtime for the blocking pool; `read` and `run_blocking` are called inside it.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn the_view_drops_only_temporary_slots() {
        let dir = tempfile::tempdir().unwrap();
        let wal = wal(&dir);
        wal.create_slot("kept", false, false).unwrap();
        wal.create_slot("gone", true, false).unwrap();
        StorageView::drop_temporary_slot(&wal, "kept").unwrap();
        StorageView::drop_temporary_slot(&wal, "gone").unwrap();
        assert!(wal.slot("kept").is_ok());
        assert!(matches!(
            wal.slot("gone"),
            Err(WalError::SlotNotFound { .. })
        ));
        assert!(matches!(
            StorageView::drop_temporary_slot(&wal, "never"),
            Err(WalError::SlotNotFound { .. })
        ));
    }

    #[test]
    fn read_takes_the_tail_from_memory_and_older_wal_from_the_files() {
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let wal = wal(&dir);
        let tli = wal.timeline();
        let start = wal.flushed();
        // Far more than storage's tail cache keeps, in batches it caches one by one.
        let mut end = start;
        for i in 0..40u8 {
            let ends = wal
                .append(vec![Bytes::from(vec![i; 60_000])])
                .unwrap()
                .wait()
                .unwrap();
            end = *ends.last().unwrap();
        }
        let last = Lsn(end.0 - 100);
        assert!(wal.read_cached(tli, last, 100).is_some());
        assert!(wal.read_cached(tli, start, 100).is_none());
        rt.block_on(async {
            // The tail: from memory, as bytes, even where the writer sends from files.
            let tail = read(&wal, tli, last, 100, true).await.unwrap();
            let WalData::Bytes(b) = tail else {
                panic!("{tail:?}")
            };
            assert_eq!(b, wal.read(tli, last, 100).unwrap());
            // Older WAL: read from the file, or only located in it for sendfile.
            let old = read(&wal, tli, start, 100, false).await.unwrap();
            let WalData::Bytes(b) = old else {
                panic!("{old:?}")
            };
            assert_eq!(b, wal.read(tli, start, 100).unwrap());
            let located = read(&wal, tli, start, 100, true).await.unwrap();
            assert!(
                matches!(&located, WalData::File(r) if r.len == 100),
                "{located:?}"
            );
            // The same segment again: its file is open and its length known, so where the
            // next range lies is answered at once, without the blocking pool.
            let next = read(&wal, tli, start + 100, 4000, true)
                .now_or_never()
                .expect("located from memory")
                .unwrap();
            let WalData::File(r) = next else {
                panic!("{next:?}")
            };
            let mut buf = vec![0u8; r.len];
            std::os::unix::fs::FileExt::read_exact_at(&*r.file, &mut buf, r.offset).unwrap();
            assert_eq!(buf, wal.read(tli, start + 100, 4000).unwrap());
        });
    }

    #[test]
    fn drop_wait_retries_after_a_release() {
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let wal = wal(&dir);
        wal.create_slot("s", false, false).unwrap();
        let guard = wal.acquire_slot("s", 1).unwrap();
        let op = StorageOp::DropSlot {
            name: "s".into(),
            wait: true,
        };
        // Without waiting there is nothing to report yet: the command asks to run again.
        assert!(run(op.clone(), &wal).retry_after_release);
        rt.block_on(async {
            let dropping = tokio::spawn(run_blocking(op, wal.clone()));
            tokio::task::yield_now().await;
            drop(guard);
            let done = dropping.await.unwrap();
            assert!(!done.failed, "{:?}", done.messages);
            assert!(!done.retry_after_release);
        });
        assert!(matches!(wal.slot("s"), Err(WalError::SlotNotFound { .. })));
    }
}
