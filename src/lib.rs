//! The walserver node as a program: configuration, the HTTP admin API, and the commands of
//! the `walserver` binary (`init`, `run`, `passwd`, `status`). The actors live in the
//! workspace crates; this crate wires them together from a configuration file.

pub mod bench;
pub mod cli;
pub mod config;
pub mod demo;
pub mod http;
pub mod init;
pub mod server;
pub mod units;
