//! The walserver node as a program: the HTTP admin API, automatic failover's actor beside the
//! node and its endpoints ([`failover`]), signal handling, and the commands of the `walserver`
//! binary (`run`, `demo`, `status`, `promote`, `append`, `rejoin`, `cluster`, `restore-wal`, `archive`; `init` and
//! `passwd` are a few lines of `main.rs`). The actors live in the workspace crates; a node's
//! configuration, its data directories and the admin API's client live in `walserver-node`,
//! which this crate wires together with the admin API.
//!
//! The load tool is not part of this crate: `walserver bench` runs the `walserver-bench`
//! program in its place ([`mod@bench`]), so the server links none of the tool's dependencies.
//!
//! An application that embeds a node (with `supervisor_actor::NodeBuilder`) mounts the node's
//! admin API in its own actix-web `App` with [`http::configure`].

pub mod archive;
pub mod bench;
pub mod cli;
pub mod cluster;
pub mod demo;
pub mod demo_failover;
pub mod failover;
pub mod http;
pub mod metrics;
pub mod rejoin;
pub mod restore;
pub mod server;
