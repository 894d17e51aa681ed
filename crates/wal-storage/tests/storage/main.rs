//! Integration tests of wal-storage against real files in temporary directories. One target
//! with a module per feature, to keep link times down.

mod common;

mod basic;
#[cfg(feature = "failpoints")]
mod early;
#[cfg(feature = "failpoints")]
mod every_failpoint;
#[cfg(feature = "failpoints")]
mod failpoints;
mod golden;
mod group_commit;
#[cfg(feature = "failpoints")]
mod policy;
#[cfg(feature = "failpoints")]
mod powerloss;
mod recycle;
mod ride;
mod slots;
mod timelines;
mod torn_tail;
