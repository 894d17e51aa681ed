//! wal-storage: how walserver keeps WAL on disk (being built under the foundation issue).
//!
//! It re-exports the shared vocabulary of `wal-types` so that users of storage need one import.

pub use wal_types::{Lsn, PgTimestamp, SystemId, TimelineId};
