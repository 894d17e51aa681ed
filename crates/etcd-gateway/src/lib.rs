//! etcd-gateway: a small blocking client of etcd's v3 JSON gateway, on `std::net::TcpStream`.
//!
//! etcd serves its v3 API twice: as gRPC, and as HTTP+JSON under `/v3/...` through its
//! built-in grpc-gateway (what Patroni uses). Both etcd 3.4 (Debian bookworm's `etcd-server`
//! is 3.4.23) and 3.5+ serve `/v3/`. This crate speaks the JSON one, because the gRPC client
//! crate (`etcd-client`) generates its code with `protoc` at build time, which a fresh
//! machine lacks, and walserver must build (`cargo run --release -- demo`) on a fresh clone.
//! The JSON gateway needs nothing beyond HTTP/1.1 and serde_json.
//!
//! What it owns: the gateway's wire format, from the socket up.
//! - HTTP (`http`): one POST per connection, a response framed by `Content-Length`, by chunked
//!   encoding, or by the connection's end; written here rather than taken from an HTTP crate
//!   so that the crate owns the socket: every read is bounded by the call's deadline, and a
//!   watch is ended from another thread by shutting its socket down.
//! - JSON (`wire`, `types`): keys and values are base64, int64 fields (revisions, lease IDs,
//!   TTLs, member IDs) are JSON strings, zero values are left out, errors are
//!   `{"error", "code", "message"}` with an HTTP status ([`Error::Status`]).
//! - Streams (`watch`, and the keepalive in `client`): one JSON object per line,
//!   `{"result": ...}` or `{"error": ...}`, in a chunked body that stays open.
//!
//! The calls ([`Client`]): [`Client::range`] (one key or a [`KeyRange::prefix`]),
//! [`Client::put`] (optionally on a lease), [`Client::delete_range`], [`Client::txn`]
//! (comparisons on value, version, create/mod revision and lease; then put, range and delete
//! operations; [`TxnResponse::succeeded`] says which branch ran), [`Client::lease_grant`],
//! [`Client::lease_keepalive`] (one renewal), [`Client::lease_revoke`],
//! [`Client::lease_time_to_live`], [`Client::compact`], [`Client::status`] and
//! [`Client::watch`] (events through a callback or [`Client::watch_channel`]; the end of the
//! stream and a compacted start revision are errors, a dropped [`Watch`] delivers nothing
//! more). Every answer carries etcd's
//! [`Header`], whose `revision` callers can use as a term.
//!
//! Each call is blocking and bounded: by the client's request timeout (connect, send and the
//! whole answer) and per connection attempt by its connect timeout. Run calls on a thread of
//! their own or a blocking pool, never on an actor's thread. With several endpoints a call
//! starts at the one that last accepted a connection and goes on to the next when a
//! connection cannot be made; a request that was sent is never resent, because it may have
//! been applied ([`Error::Connect`] means nothing was sent).
//!
//! What it does not own: elections, leader keys, terms or fencing; retries beyond connection
//! failover; keeping a lease alive on a timer; TLS and authentication. Those belong to the
//! caller. One fact it passes on: a keepalive's answer is no proof that a lease still holds a
//! key (etcd 3.4 could renew a revoked lease), so a holder confirms with a [`Txn`] comparing
//! the key's value and lease.
//!
//! Errors are one enum, [`Error`]. Nothing unwraps data from the network: a bad answer is
//! [`Error::Malformed`].
//!
//! With the `testkit` feature, the `testkit` module runs a real etcd (one member or a cluster) for
//! tests.

mod client;
mod error;
mod http;
mod types;
mod watch;
mod wire;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use client::{Client, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};
pub use error::{Error, Result};
pub use types::{
    Compare, CompareOp, CompareTarget, DeleteResponse, Header, KeyRange, KeyValue, Lease, LeaseId,
    LeaseTimeToLive, Op, OpResponse, PutResponse, RangeResponse, Status, Txn, TxnResponse,
};
pub use watch::{Event, EventKind, Watch, WatchBatch, WatchRequest};
