//! The session's narrow view of storage, and the storage work it hands back.
//!
//! A session reads only facts storage keeps in memory, through [`StorageView`]: the durable
//! end and its timeline, the system identifier, the timeline history, and the slot table
//! (looking a slot up, holding one for a stream, moving its restart point, dropping a
//! temporary one). None of these touches a file, so the session may call them on the actor's
//! thread. Whatever does touch files is an effect the session returns: a [`StorageOp`] (a
//! command) or `Output::Read` (WAL to read, or to locate in its segment file), which the actor
//! carries out on the blocking pool (`crate::storage_ops`) and reports back as a
//! [`StorageDone`] or a [`WalData`]. The session never holds a `Wal`, so it cannot do file I/O
//! by mistake.

use bytes::Bytes;
use protocol_codec::{BackendMessage, ErrorFields, SqlState};
use wal_storage::{
    HistoryEntry, Lsn, SlotGuard, SlotInfo, SystemId, TimelineId, WalError, WalFileRange,
    WalPosition,
};

/// What a session may ask of storage on the actor's thread. Every method reads or changes
/// memory only; an implementation must not do file I/O or wait on a lock held across I/O.
pub trait StorageView {
    /// The durable end and the timeline it is on.
    fn position(&self) -> WalPosition;
    fn system_id(&self) -> SystemId;
    /// The ancestry of the current timeline, oldest first.
    fn history(&self) -> Vec<HistoryEntry>;
    /// A slot as `READ_REPLICATION_SLOT` shows it.
    fn slot(&self, name: &str) -> Result<SlotInfo, WalError>;
    /// Holds a slot for the stream of walsender `pid` until the guard is dropped; `SlotInUse`
    /// (naming the holder) if it already is.
    fn acquire_slot(&self, name: &str, pid: u32) -> Result<SlotGuard, WalError>;
    /// Moves a slot's restart point on the standby's flush feedback (storage persists it
    /// later, off this thread).
    fn advance_slot(
        &self,
        name: &str,
        restart_lsn: Lsn,
        restart_tli: TimelineId,
    ) -> Result<(), WalError>;
    /// Drops a temporary slot, which lives only in memory. A slot of that name that is not
    /// temporary (another session dropped ours and created a persistent one) is not ours and
    /// stays.
    fn drop_temporary_slot(&self, name: &str) -> Result<(), WalError>;
    /// Asks storage for the durable mark of early sends on `tli` (it writes it off this
    /// thread, then announces a position) and returns the timeline the mark on disk names
    /// now ([`crate::overlap::early_sends_marked`]).
    fn mark_early_sends(&self, tli: TimelineId) -> Option<TimelineId>;
}

/// WAL for the session to cut into messages: read into memory (`Wal::read`, or storage's
/// tail cache), or where it lies in a segment file (`Wal::locate`).
#[derive(Debug)]
pub enum WalData {
    Bytes(Bytes),
    File(WalFileRange),
}

impl From<Bytes> for WalData {
    fn from(b: Bytes) -> WalData {
        WalData::Bytes(b)
    }
}

impl WalData {
    /// What `Wal::locate` found; `None`, nothing to read, is no bytes.
    pub fn located(range: Option<WalFileRange>) -> WalData {
        range.map_or(WalData::Bytes(Bytes::new()), WalData::File)
    }

    pub(super) fn len(&self) -> usize {
        match self {
            WalData::Bytes(b) => b.len(),
            WalData::File(r) => r.len,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `n` bytes (`n <= len`); `self` keeps the rest.
    pub(super) fn split_to(&mut self, n: usize) -> WalData {
        match self {
            WalData::Bytes(b) => WalData::Bytes(b.split_to(n)),
            WalData::File(r) => {
                let head = WalFileRange {
                    file: r.file.clone(),
                    offset: r.offset,
                    len: n,
                };
                r.offset += n as u64;
                r.len -= n;
                WalData::File(head)
            }
        }
    }
}

/// Storage work that does file I/O or fsync, for the actor to run off its thread
/// (`crate::storage_ops::run`) and report with [`Session::on_storage_done`]: the replication
/// commands that touch files.
///
/// [`Session::on_storage_done`]: super::Session::on_storage_done
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageOp {
    /// `TIMELINE_HISTORY`: read a history file.
    TimelineHistory(TimelineId),
    /// `CREATE_REPLICATION_SLOT ... PHYSICAL`: a persistent slot is written and fsynced.
    CreateSlot {
        name: String,
        temporary: bool,
        reserve_wal: bool,
    },
    /// `DROP_REPLICATION_SLOT`: a persistent slot's file is removed.
    DropSlot {
        name: String,
        /// `WAIT`: if the slot is in use, wait until it is released, then drop it.
        wait: bool,
    },
}

/// What a [`StorageOp`] produced: the command's answer.
#[derive(Debug)]
pub struct StorageDone {
    pub messages: Vec<BackendMessage>,
    /// The command failed with an ERROR (the last message is the ErrorResponse).
    pub failed: bool,
    /// A temporary slot this session now owns.
    pub temporary_slot: Option<String>,
    /// The command must run again once a slot is released (`DROP_REPLICATION_SLOT ... WAIT`
    /// on a slot in use); the actor waits for `Wal::slot_releases` and retries.
    pub retry_after_release: bool,
}

/// The ERROR for a storage failure, with PostgreSQL's SQLSTATE and wording where it has one.
pub fn wal_error_fields(e: &WalError) -> ErrorFields {
    let code = match e {
        WalError::SegmentRemoved { .. } => SqlState::UNDEFINED_FILE,
        WalError::SlotNameInvalid { .. } => SqlState::INVALID_NAME,
        WalError::SlotExists { .. } => SqlState::DUPLICATE_OBJECT,
        WalError::SlotNotFound { .. } => SqlState::UNDEFINED_OBJECT,
        WalError::SlotInUse { .. } => SqlState::OBJECT_IN_USE,
        WalError::SlotInvalidated { .. } => SqlState::OBJECT_IN_USE,
        _ => SqlState::INTERNAL_ERROR,
    };
    ErrorFields::error(code, e.to_string())
}
