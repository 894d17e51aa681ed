//! Storage configuration: the knobs of [`StorageConfig`] and their checks.

use crate::{Result, WalError};

/// PostgreSQL's default `wal_segment_size`.
pub const DEFAULT_SEGMENT_SIZE: u64 = 16 << 20;
/// PostgreSQL's bounds on `wal_segment_size`.
pub const MIN_SEGMENT_SIZE: u64 = 1 << 20;
pub const MAX_SEGMENT_SIZE: u64 = 1 << 30;

/// The default maximum payload of one walserver record. This is a guess at "large enough for any
/// single application write while a batch still fits comfortably in memory": a record is held in
/// memory whole by the writer and by every reader, so the bound is a memory bound too.
pub const DEFAULT_MAX_RECORD_SIZE: usize = 16 << 20;
/// The hard ceiling, so that lengths fit the u32 fields of the record and segment headers.
pub const MAX_RECORD_SIZE_LIMIT: usize = 1 << 30;

/// How storage behaves. The knob names follow PostgreSQL's where one exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageConfig {
    /// `wal_segment_size`: a power of two from 1 MiB to 1 GiB. Fixed at init; `open` refuses a
    /// different value.
    pub segment_size: u64,
    /// The largest payload `append` accepts, in bytes.
    pub max_record_size: usize,
    /// `wal_keep_size` in bytes: WAL kept behind the flushed end even if no slot needs it.
    pub wal_keep_size: u64,
    /// `max_slot_wal_keep_size` in bytes; `None` is PostgreSQL's -1 (slots may hold any amount).
    pub max_slot_wal_keep_size: Option<u64>,
    /// `max_wal_size` in bytes. Storage has no checkpoints; it is used only to tell a slot's
    /// `wal_status` "reserved" from "extended", as PostgreSQL does.
    pub max_wal_size: u64,
    /// Make writes durable with fdatasync/fsync. Only tests and benches on throwaway directories
    /// turn this off; with it off nothing is crash-safe.
    pub fsync: bool,
    /// `wal_recycle`: a segment file nobody needs any more becomes a later segment instead of
    /// being removed, so that a new segment costs a rename rather than 16 MiB of zeros written
    /// and flushed (PostgreSQL's knob of the same name, on by default there too). Off suits a
    /// copy-on-write file system, where overwriting a file's blocks allocates new ones anyway.
    pub wal_recycle: bool,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            segment_size: DEFAULT_SEGMENT_SIZE,
            max_record_size: DEFAULT_MAX_RECORD_SIZE,
            wal_keep_size: 0,
            max_slot_wal_keep_size: None,
            max_wal_size: 1 << 30,
            fsync: true,
            wal_recycle: true,
        }
    }
}

impl StorageConfig {
    /// Checks the values, with an error that names the knob.
    pub fn validate(&self) -> Result<()> {
        let s = self.segment_size;
        if !s.is_power_of_two() || !(MIN_SEGMENT_SIZE..=MAX_SEGMENT_SIZE).contains(&s) {
            return Err(WalError::InvalidConfig(format!(
                "wal_segment_size must be a power of two between 1 MiB and 1 GiB, got {s} bytes"
            )));
        }
        if self.max_record_size == 0 || self.max_record_size > MAX_RECORD_SIZE_LIMIT {
            return Err(WalError::InvalidConfig(format!(
                "max_record_size must be between 1 byte and 1 GiB, got {} bytes",
                self.max_record_size
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_size_rules() {
        let check = |size: u64, ok: bool| {
            let cfg = StorageConfig {
                segment_size: size,
                ..StorageConfig::default()
            };
            assert_eq!(cfg.validate().is_ok(), ok, "segment size {size}");
        };
        check(16 << 20, true);
        check(1 << 20, true);
        check(1 << 30, true);
        check(512 << 10, false);
        check(2 << 30, false);
        check(3 << 20, false);
        check(0, false);
        let msg = StorageConfig {
            segment_size: 3 << 20,
            ..StorageConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(msg.contains("wal_segment_size"), "{msg}");
    }

    #[test]
    fn record_size_rules() {
        let cfg = |max_record_size| StorageConfig {
            max_record_size,
            ..StorageConfig::default()
        };
        assert!(cfg(0).validate().is_err());
        assert!(cfg(1).validate().is_ok());
        assert!(cfg(MAX_RECORD_SIZE_LIMIT + 1).validate().is_err());
        assert!(StorageConfig::default().validate().is_ok());
    }
}
