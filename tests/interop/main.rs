//! Interop tests: real PostgreSQL 15 client programs (pg_receivewal, psql, libpq) against a
//! walserver primary. They fail, never skip, when PostgreSQL 15 is missing.
//!
//! One module a concern: `receivewal` (pg_receivewal streams and resumes), `libpq` (psql and
//! libpq clients), and the side-by-side tests, which send a real PostgreSQL 15 and walserver
//! the same input and require the same answers: `streaming`, `auth`, `commands`, `startup`,
//! with the reading of answers they share in `compare`.

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod commands;
mod compare;
mod libpq;
mod receivewal;
mod startup;
mod streaming;
