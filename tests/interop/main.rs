//! Interop tests with real PostgreSQL 15 client programs against a walserver primary.

#[path = "../common/mod.rs"]
mod common;
