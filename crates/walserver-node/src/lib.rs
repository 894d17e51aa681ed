//! walserver-node: a walserver node as its configuration describes it, for every program that
//! starts one or talks to one: `walserver` itself (`run`, `demo`, the CLI clients), the load
//! tool (`walserver-bench`) and the integration tests.
//!
//! It owns the configuration ([`config`]: a TOML file, `WALSERVER_*` variables and `-c`
//! overrides, with PostgreSQL's units in [`units`] and its log level names in [`logging`];
//! the `[failover]` table and the failover actor's configuration it gives in [`failover`];
//! the `archive_*` settings and the `[archive]` table, and the archiver they start, in [`archive`]),
//! data directories as `walserver init` makes them ([`init`], and from the WAL archive to a
//! recovery target, [`from_archive`]), the `NodeConfig` a
//! configuration gives, the reloader (it applies what a running node can take and names the
//! settings that wait for a restart, as PostgreSQL does its `postmaster` parameters), and
//! [`start_node`], the one function that brings a
//! configured node to life ([`node`]). It also owns the two things the admin API's server
//! and its clients must agree on: the body format of many records ([`records`]) and the
//! client itself ([`admin`]).
//!
//! It does not own the admin API's server, signals, or the commands' output: those are the
//! `walserver` binary's. The actors and storage live in their own crates; this crate only
//! turns settings into their configuration.
//!
//! # Settings and Config
//!
//! One naming rule holds across the workspace. A `*Settings` type holds what someone outside
//! the code chose, in the words they chose it in: an operator in the configuration file, a
//! `WALSERVER_*` variable or `-c`, a client in its startup packet; a running node keeps them in
//! that shape where a reload replaces them whole ([`config::Settings`],
//! [`failover::FailoverSettings`], `walsender_actor::hba::HbaRuleSettings`,
//! `protocol_codec::client_settings::ClientSettings`, the walsenders' `WalSenderSettings` and
//! `AuthSettings`, the supervisor's `SyncSettings`). A `*Config` type is what one component is
//! built with and keeps for its life; changing it means building the component again
//! (`wal_storage::StorageConfig`, `supervisor_actor::NodeConfig`, the walreceiver's
//! `ReceiverConfig`, each side's `SessionConfig`, `failover_actor::FailoverConfig`,
//! `protocol_codec::client::StartupConfig`, the admin API's `HttpConfig`). [`node`] turns the
//! configuration's `Settings` into the others, a function named for what it makes
//! (`node_config`, `receiver_config`, `walsender_settings`, `sync_settings`). Its errors are one [`Error`] ([`error`]), whose
//! variants say in words what failed and keep the error underneath as their source, since every
//! error ends in a message to a person: the binary prints the message and its causes.

pub mod admin;
pub mod archive;
pub mod config;
pub mod error;
pub mod failover;
pub mod from_archive;
pub mod init;
pub mod logging;
pub mod node;
pub mod records;
pub mod units;

pub use error::{Error, Message, Result};
pub use node::start_node;
