//! The one error type of the crate.

use std::io;
use std::path::PathBuf;

use wal_types::{Lsn, TimelineId};

use crate::kind::WalFormat;

pub type Result<T, E = WalError> = std::result::Result<T, E>;

/// Everything that can go wrong in wal-storage.
///
/// The server maps these to SQLSTATEs at the network edge: `SegmentRemoved` is PostgreSQL's 58P01,
/// `SlotNameInvalid` 42602, `SlotExists` 42710, `SlotNotFound` 42704 and `SlotInUse` 55006.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// A file operation failed. The text says what was done and how it failed; the
    /// `io::Error` is part of the text and not a separate source, so that a chain of causes
    /// printed by the binary says it once.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },

    /// The file system holding the data directory is full (ENOSPC), or the quota is (EDQUOT).
    /// Nothing durable was lost and nothing is restarted: the write that met it fails, later
    /// ones that need no new space succeed, and all succeed again once space is freed.
    #[error("the disk is full: {context} ({}): {cause}; writes resume once space is freed", path.display())]
    DiskFull {
        context: String,
        path: PathBuf,
        cause: io::Error,
    },

    /// A sync failed (or a write in a way that leaves storage unsure what the disk holds), so
    /// storage stopped acknowledging: nothing beyond the last good sync is durable or sent.
    /// It is reopened, and the tail verified, by its owner's restart policy
    /// ([`Wal::restart`](crate::Wal::restart)); until then every write fails with this.
    #[error("storage failed and is restarting: {reason}")]
    StorageFailed { reason: String },

    /// The archive is behind by more than `archive_max_backlog` (`archived.rs`): nothing was
    /// written, and the same append succeeds once archiving catches up.
    #[error("cannot append: the archive is behind: {backlog} bytes wait for it, past archive_max_backlog ({bound}); appends resume once archiving catches up")]
    ArchiveBacklog { backlog: u64, bound: u64 },

    #[error("invalid storage configuration: {0}")]
    InvalidConfig(String),

    #[error("data directory {} is in use by another process (lock file {} is locked)", dir.display(), lock.display())]
    Locked { dir: PathBuf, lock: PathBuf },

    #[error("{} is not a walserver data directory (no control file)", dir.display())]
    NotInitialized { dir: PathBuf },

    #[error("{} already holds a walserver data directory", dir.display())]
    AlreadyInitialized { dir: PathBuf },

    #[error("{} has format version {found}, this walserver understands version {supported}", path.display())]
    UnknownVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    #[error("{} is damaged: {reason}", path.display())]
    BadFile { path: PathBuf, reason: String },

    #[error("the data directory was made with wal_segment_size {stored}, but the configuration says {configured}")]
    SegmentSizeMismatch { configured: u64, stored: u64 },

    #[error("WAL corruption in segment {segment} at offset {offset:#x}: {reason}")]
    Corruption {
        segment: String,
        offset: u64,
        reason: String,
    },

    #[error("write at {start} leaves a gap: the WAL of timeline {timeline} ends at {end}")]
    Gap {
        timeline: TimelineId,
        start: Lsn,
        end: Lsn,
    },

    #[error("write at {start} overlaps stored WAL with different bytes at {at}")]
    OverlapMismatch { start: Lsn, at: Lsn },

    #[error("{op} needs walserver-format WAL, but this node stores {format}")]
    WrongFormat { op: &'static str, format: WalFormat },

    #[error("cannot append at {end}: it is in the middle of a record received from upstream (the last complete record ends at {record_end}); promote this node first")]
    NotAtRecordBoundary { end: Lsn, record_end: Lsn },

    #[error("record of {size} bytes exceeds the maximum record size of {max} bytes")]
    RecordTooLarge { size: usize, max: usize },

    #[error("promotion is not supported on a node that stores relayed PostgreSQL WAL (walserver cannot append records to it)")]
    PromotionNotSupported,

    #[error("this node's WAL forked from the new timeline: it holds WAL up to {local_end}, beyond the switch point {fork_lsn}; rejoin (truncate to {fork_lsn}) before following")]
    Forked { fork_lsn: Lsn, local_end: Lsn },

    #[error("cannot follow the timeline switch at {switch_lsn} yet: the old timeline is flushed only up to {flushed}; receive the rest of the old timeline first")]
    BehindSwitchPoint { switch_lsn: Lsn, flushed: Lsn },

    #[error("invalid timeline history: {0}")]
    InvalidHistory(String),

    #[error("timeline {0} is not in this node's history")]
    UnknownTimeline(TimelineId),

    #[error("requested starting point {requested} on timeline {timeline} is ahead of the WAL flush position {end}")]
    BeyondEnd {
        timeline: TimelineId,
        requested: Lsn,
        end: Lsn,
    },

    #[error("requested WAL segment {segment} has already been removed")]
    SegmentRemoved { segment: String },

    #[error("cannot truncate to {lsn}: {reason}")]
    BadTruncate { lsn: Lsn, reason: String },

    #[error("the WAL this reader had read up to {read_to} was dropped: the node now follows a history that forked from it at {end}; read again from a record at or before {end}")]
    ReadWalDropped { read_to: Lsn, end: Lsn },

    #[error("invalid replication slot name {name:?}: slot names may contain only lower case letters, numbers and underscores, 1 to 63 characters")]
    SlotNameInvalid { name: String },

    #[error("replication slot \"{name}\" already exists")]
    SlotExists { name: String },

    #[error("replication slot \"{name}\" does not exist")]
    SlotNotFound { name: String },

    #[error("replication slot \"{name}\" is active for PID {pid}")]
    SlotInUse { name: String, pid: u32 },

    #[error(
        "replication slot \"{name}\" was invalidated: its WAL exceeded max_slot_wal_keep_size"
    )]
    SlotInvalidated { name: String },

    #[error("the WAL writer has stopped")]
    Closed,
}

impl WalError {
    pub(crate) fn io(context: impl Into<String>, cause: io::Error) -> WalError {
        WalError::Io {
            context: context.into(),
            cause,
        }
    }

    /// True for a full disk or quota (ENOSPC, EDQUOT): the write failed, nothing durable was
    /// lost, and the same write can succeed once space is freed.
    pub fn is_disk_full(&self) -> bool {
        match self {
            WalError::DiskFull { .. } => true,
            WalError::Io { cause, .. } => is_full_errno(cause),
            _ => false,
        }
    }

    /// True for an append refused while the archive is behind ([`WalError::ArchiveBacklog`]).
    pub fn is_archive_backlog(&self) -> bool {
        matches!(self, WalError::ArchiveBacklog { .. })
    }

    /// True once storage has failed and is being restarted ([`WalError::StorageFailed`]).
    pub fn is_storage_failed(&self) -> bool {
        matches!(self, WalError::StorageFailed { .. })
    }

    /// A copy for handing one failure to many waiters. `io::Error` is not `Clone`, so the copy
    /// keeps the kind, the OS error code and the message.
    pub(crate) fn duplicate(&self) -> WalError {
        match self {
            WalError::Io { context, cause } => WalError::Io {
                context: context.clone(),
                cause: copy_io(cause),
            },
            WalError::DiskFull {
                context,
                path,
                cause,
            } => WalError::DiskFull {
                context: context.clone(),
                path: path.clone(),
                cause: copy_io(cause),
            },
            WalError::StorageFailed { reason } => WalError::StorageFailed {
                reason: reason.clone(),
            },
            other => WalError::Io {
                context: "WAL write failed".into(),
                cause: io::Error::other(other.to_string()),
            },
        }
    }
}

/// ENOSPC or EDQUOT: a full file system or a full quota.
pub(crate) fn is_full_errno(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

fn copy_io(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}
