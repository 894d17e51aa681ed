//! etcd-gateway: a small async client of etcd's v3 JSON gateway, on `awc`.
//!
//! etcd serves its v3 API twice: as gRPC, and as HTTP+JSON under `/v3/...` through its
//! built-in grpc-gateway (what Patroni uses). Both etcd 3.4 (Debian bookworm's `etcd-server`
//! is 3.4.23) and 3.5+ serve `/v3/`. This crate speaks the JSON one, because the gRPC client
//! crate (`etcd-client`) generates its code with `protoc` at build time, which a fresh
//! machine lacks, and walserver must build (`cargo run --release -- demo`) on a fresh clone.
//! The JSON gateway needs nothing beyond an HTTP/1.1 client and serde_json.
//!
//! The HTTP client is `awc`, actix's own (it shares actix-http with the admin API's
//! actix-web), because the user is a failover actor on an actix arbiter: every call is a
//! future on that arbiter's actix-rt/tokio thread, which the actor awaits in `ctx.spawn` or
//! `ctx.wait` without blocking its thread, and a call or a watch is cancelled by dropping it,
//! which drops its connection.
//!
//! What it owns: the gateway's wire format, above HTTP.
//! - Transport (`http`): one POST per call through `awc`, every wait under the call's
//!   deadline (`tokio::time::timeout_at`, on actix-rt's tokio); a failed connect (awc's
//!   `SendRequestError::Connect`) is the one failure that means nothing was sent.
//! - JSON (`wire`, `types`): keys and values are base64, int64 fields (revisions, lease IDs,
//!   TTLs, member IDs) are JSON strings, zero values are left out, errors are
//!   `{"error", "code", "message"}` with an HTTP status ([`Error::Status`]).
//! - Streams (`watch`, and the keepalive in `client`): one JSON object per line,
//!   `{"result": ...}` or `{"error": ...}`, in a chunked body that stays open; lines are
//!   framed here, whatever the chunks.
//!
//! The calls ([`Client`]): [`Client::range`] (one key or a [`KeyRange::prefix`]),
//! [`Client::put`] (optionally on a lease), [`Client::delete_range`], [`Client::txn`]
//! (comparisons on value, version, create/mod revision and lease; then put, range and delete
//! operations; [`TxnResponse::succeeded`] says which branch ran), [`Client::lease_grant`],
//! [`Client::lease_keepalive`] (one renewal), [`Client::lease_revoke`],
//! [`Client::lease_time_to_live`], [`Client::compact`], [`Client::status`] and
//! [`Client::watch`] (a [`Watch`] is a `Stream` of [`WatchBatch`]es; the end of the stream, a
//! compacted start revision and a cancellation are its one last error, and a dropped
//! [`Watch`] has closed its connection). Every answer carries etcd's [`Header`], whose
//! `revision` callers can use as a term.
//!
//! Each call is bounded: by the client's request timeout (connect, send and the whole answer)
//! and per connection attempt by its connect timeout. The futures must run on actix-rt (an
//! arbiter, `actix_rt::System` or `#[actix_rt::test]`); they are not `Send`, the [`Client`]
//! is. With several endpoints a call starts at the one that last accepted a connection and
//! goes on to the next when a connection cannot be made; a request that was sent is never
//! resent, because it may have been applied ([`Error::Connect`] means nothing was sent).
//!
//! Security (`security`, `auth`): `https://` endpoints through awc's rustls connector (the
//! `ring` provider, trusting only the CA file given), a client certificate for etcd's
//! `--client-cert-auth`, and a user's password for etcd's `auth enable`, all in one
//! [`Security`] given to [`Client::with_security`]. A handshake that fails is
//! [`Error::Tls`] saying why (etcd's certificate not signed by that CA, or for another name;
//! etcd refusing this client's certificate), a refused password is [`Error::AuthFailed`];
//! [`Error::is_refused_credentials`] tells both from etcd being away, and
//! [`Client::check_access`] asks once. The auth token is kept and renewed here: a call etcd
//! refuses for its token (expired, or unknown to etcd) was not applied, and is sent once more
//! with a new token, to the same endpoint.
//!
//! What it does not own: elections, leader keys, terms or fencing; retries beyond connection
//! failover and a refused token; keeping a lease alive on a timer. Those belong to the
//! caller. One fact it passes on: a keepalive's answer is no proof that a lease still holds a
//! key (etcd 3.4 could renew a revoked lease), so a holder confirms with a [`Txn`] comparing
//! the key's value and lease.
//!
//! Errors are one enum, [`Error`]. Nothing unwraps data from the network: a bad answer is
//! [`Error::Malformed`].
//!
//! With the `testkit` feature, the `testkit` module runs a real etcd (one member or a cluster)
//! for tests; it is blocking (it waits for processes), and runs its own status checks on a
//! runtime of their own.

mod auth;
mod client;
mod error;
mod http;
mod security;
mod types;
mod watch;
mod wire;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use client::{Client, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};
pub use error::{Error, ErrorKind, Result};
pub use security::Security;
pub use types::{
    Compare, CompareOp, CompareTarget, DeleteResponse, Header, KeyRange, KeyValue, Lease, LeaseId,
    LeaseTimeToLive, Op, OpResponse, PutResponse, RangeResponse, Status, Txn, TxnResponse,
};
pub use watch::{Event, EventKind, Watch, WatchBatch, WatchRequest};
