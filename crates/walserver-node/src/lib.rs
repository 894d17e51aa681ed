//! walserver-node: a walserver node as its configuration describes it, for every program that
//! starts one or talks to one: `walserver` itself (`run`, `demo`, the CLI clients), the load
//! tool (`walserver-bench`) and the integration tests.
//!
//! It owns the configuration ([`config`]: a TOML file, `WALSERVER_*` variables and `-c`
//! overrides, with PostgreSQL's units in [`units`] and its log level names in [`logging`];
//! the `[failover]` table and the failover actor's configuration it gives in [`failover`]),
//! data directories as `walserver init` makes them ([`init`]), the `NodeConfig` a
//! configuration gives, the reloader, and [`start_node`], the one function that brings a
//! configured node to life ([`node`]). It also owns the two things the admin API's server
//! and its clients must agree on: the body format of many records ([`records`]) and the
//! client itself ([`admin`]).
//!
//! It does not own the admin API's server, signals, or the commands' output: those are the
//! `walserver` binary's. The actors and storage live in their own crates; this crate only
//! turns settings into their configuration. Its errors are one [`Error`] ([`error`]), whose
//! variants say in words what failed and keep the error underneath as their source, since every
//! error ends in a message to a person: the binary prints the message and its causes.

pub mod admin;
pub mod config;
pub mod error;
pub mod failover;
pub mod init;
pub mod logging;
pub mod node;
pub mod records;
pub mod units;

pub use error::{Error, Message, Result};
pub use node::start_node;
