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
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

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

    #[error("invalid replication slot name {name:?}: slot names may contain only lower case letters, numbers and underscores, 1 to 63 characters")]
    SlotNameInvalid { name: String },

    #[error("replication slot \"{name}\" already exists")]
    SlotExists { name: String },

    #[error("replication slot \"{name}\" does not exist")]
    SlotNotFound { name: String },

    #[error("replication slot \"{name}\" is active")]
    SlotInUse { name: String },

    #[error(
        "replication slot \"{name}\" was invalidated: its WAL exceeded max_slot_wal_keep_size"
    )]
    SlotInvalidated { name: String },

    #[error("the WAL writer has stopped")]
    Closed,
}

impl WalError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> WalError {
        WalError::Io {
            context: context.into(),
            source,
        }
    }

    /// True for "No space left on device": the write failed, nothing durable was lost, and the
    /// same write can succeed once space is freed.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, WalError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC))
    }

    /// A copy for handing one failure to many waiters. `io::Error` is not `Clone`, so the copy
    /// keeps the kind, the OS error code and the message.
    pub(crate) fn duplicate(&self) -> WalError {
        match self {
            WalError::Io { context, source } => WalError::Io {
                context: context.clone(),
                source: match source.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(source.kind(), source.to_string()),
                },
            },
            other => WalError::Io {
                context: "WAL write failed".into(),
                source: io::Error::other(other.to_string()),
            },
        }
    }
}
