//! walreceiver-actor's integration tests over real sockets: one target, a module per theme.

mod common;
mod failures;
mod streaming;
mod tls;
