//! wal-storage: how walserver keeps WAL on disk.
//!
//! (The full story is written once the crate is complete.)

mod config;
mod error;
mod files;
mod format;
mod history;
mod io;
mod naming;
mod segments;
mod slots;
mod wal;
mod writer;

pub use wal_types::{Lsn, PgTimestamp, SystemId, TimelineId};

pub use config::{StorageConfig, WalFormat, DEFAULT_MAX_RECORD_SIZE, DEFAULT_SEGMENT_SIZE};
pub use error::{Result, WalError};
pub use format::{Record, SegmentHeader, RECORD_HEADER_SIZE, SEGMENT_HEADER_SIZE};
pub use history::{format_history, parse_history, HistoryEntry};
#[cfg(feature = "failpoints")]
pub use io::Failpoints;
pub use io::{FP_ATOMIC, FP_FSYNC, FP_POINTER, FP_PREALLOC, FP_WRITE};
pub use naming::{
    history_file_name, parse_history_file_name, parse_segment_file_name, segment_file_name,
};
pub use slots::{validate_slot_name, SlotInfo, WalStatus};
pub use wal::{
    AppendTicket, InitOptions, RecordReader, RecoveryReport, SlotGuard, Ticket, Wal, WalPosition,
    WriteTicket,
};
