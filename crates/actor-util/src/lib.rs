//! actor-util: the few pieces both of walserver's connection actors need, kept below both so
//! that neither depends on the other for them.
//!
//! - [`DeadlineTimer`]: one actix timer kept at a state machine's earliest deadline (the
//!   walsender's keepalives, `wal_sender_timeout` and shutdown deadline; the walreceiver's
//!   status interval and `wal_receiver_timeout`).
//! - [`Io`]: a byte stream in either direction, plain TCP or TLS, as both ends of a
//!   replication connection hold it once the startup phase is over.
//! - [`relayed`]: a watch published by another thread (storage's position) through one relay
//!   task per actix thread, so that each value wakes the thread once instead of once per
//!   subscriber.
//! - [`set_int_option`], [`set_option`] and [`get_int_option`]: socket options (the
//!   walsender's `TCP_CORK`, the walreceiver's `SO_RCVLOWAT`, the walsender listener's
//!   `TCP_CONGESTION`, both ends' keepalives: [`set_keepalive_timing`] over
//!   [`KEEPALIVE_TIMING`]).
//!
//! What it does not own: any protocol (that is `protocol-codec`'s), any state machine, and any
//! decision about when to wake; the state machines say when, this crate only keeps the timer
//! and passes on the wake-ups of a watch.

mod relay;
mod sockopt;
mod timer;

pub use relay::relayed;

pub use sockopt::{
    get_int_option, set_int_option, set_keepalive_timing, set_option, KEEPALIVE_TIMING,
};

pub use timer::DeadlineTimer;

use tokio::io::{AsyncRead, AsyncWrite};

/// A byte stream in either direction: plain TCP or TLS, the same type for both ends.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
