//! The walserver node as a program: the HTTP admin API, signal handling, and the commands of
//! the `walserver` binary (`run`, `demo`, `status`, `promote`, `append`, `rejoin`; `init` and
//! `passwd` are a few lines of `main.rs`, and `bench` is `walserver-bench`'s). The actors live
//! in the workspace crates; a node's configuration, its data directories and the admin API's
//! client live in `walserver-node`, which this crate wires together with the admin API.
//!
//! An application that embeds a node (with `supervisor_actor::NodeBuilder`) mounts the node's
//! admin API in its own actix-web `App` with [`http::configure`].

pub mod cli;
pub mod demo;
pub mod http;
pub mod metrics;
pub mod rejoin;
pub mod server;
