//! protocol-codec: PostgreSQL 15's streaming-replication protocol, bytes in and typed messages
//! out and back, for both ends of a connection: the server side (walserver's walsender) and
//! the client side (walserver's walreceiver).
//!
//! What it owns:
//! - [`messages`]: every message a physical replication connection uses, named by direction
//!   (frontend = client to server, backend = server to client), with the wire format written
//!   above each type, including the CopyData payloads of streaming (XLogData, keepalive,
//!   standby status update, hot standby feedback).
//! - [`codec`]: `tokio_util::codec` framing: [`StartupCodec`] for the untyped startup phase,
//!   then [`ServerCodec`] / [`ClientCodec`]. Lengths are checked before anything is buffered.
//! - [`command`]: the replication command language (IDENTIFY_SYSTEM, START_REPLICATION, ...).
//! - [`results`]: the result sets PostgreSQL 15 answers those commands with, byte for byte.
//! - [`auth`]: trust, cleartext, md5 and SCRAM-SHA-256, server and client side.
//! - [`client`]: the client's startup phase (SSL negotiation, startup packet, authentication,
//!   up to ReadyForQuery) as a sans-I/O state machine, with libpq's `sslmode` attempts.
//! - [`tls`]: rustls configurations for both sides, with libpq's `sslmode` meanings.
//! - [`conninfo`]: libpq connection strings (`key=value` and `postgresql://` URIs), and
//!   [`passfile`]: libpq's password file, where one without a password finds it.
//! - [`client_settings`]: the configuration parameters a client sets in its startup packet
//!   (`options` and the other parameters), read and refused as PostgreSQL 15 does, against
//!   its table of parameters ([`pg15_parameters`]); each value read by its kind and written in
//!   PostgreSQL's form by [`parameter_values`].
//!
//! What it does not own: sockets, timers, actors, or any decision about what to answer. There
//! is no network I/O here; callers drive the codecs and [`client::ClientHandshake`] over
//! their own transport. The one file I/O is [`tls`]'s: [`tls::server_config`] and
//! [`tls::client_config`] (with a root certificate) read PEM files, so callers on an async
//! runtime build configurations off their event loop. The server's startup state machine
//! (which hba rule applies, what to answer) is the walsender's.
//!
//! A server reads the startup phase with [`StartupCodec`] and then switches to
//! [`ServerCodec`] (with `tokio_util::codec::Framed`, `map_codec` keeps the read buffer):
//!
//! ```
//! use bytes::BytesMut;
//! use protocol_codec::messages::{ReplicationMode, TransactionStatus};
//! use protocol_codec::{BackendMessage, FrontendMessage, ServerCodec, StartupCodec, StartupPacket};
//! use tokio_util::codec::{Decoder, Encoder};
//!
//! // What a client sent: a StartupMessage, then a query.
//! let mut input = BytesMut::new();
//! StartupCodec
//!     .encode(StartupPacket::startup([("user", "repl"), ("replication", "true")]), &mut input)
//!     .unwrap();
//! FrontendMessage::Query("IDENTIFY_SYSTEM".into()).encode(&mut input).unwrap();
//!
//! let startup = StartupCodec.decode(&mut input).unwrap().unwrap();
//! assert_eq!(startup.replication().unwrap(), ReplicationMode::Physical);
//! let mut codec = ServerCodec::new();
//! let query = codec.decode(&mut input).unwrap().unwrap();
//! assert_eq!(query, FrontendMessage::Query("IDENTIFY_SYSTEM".into()));
//!
//! let mut output = BytesMut::new();
//! codec
//!     .encode(BackendMessage::ReadyForQuery(TransactionStatus::Idle), &mut output)
//!     .unwrap();
//! assert_eq!(&output[..], b"Z\0\0\0\x05I");
//! ```
//!
//! Errors, one type per concern, because each is reported to a different audience:
//! [`CodecError`] (the peer broke the protocol: FATAL 08P01 and close),
//! [`command::CommandError`] (a bad command: ERROR 42601/42602 and the session goes on),
//! [`auth::AuthError`] (FATAL 28P01/28000/08P01, without telling the client why),
//! [`tls::TlsError`] and [`conninfo::ConnInfoError`] (local configuration, for the operator).
//! Each knows its SQLSTATE where one applies.
//!
//! Invariants: decoding never panics on input bytes and never allocates more than the
//! configured limit for one message; XLogData's WAL bytes are never copied on decode (they are
//! `Bytes` slices of the read buffer) and copied once on encode.

pub mod auth;
pub mod client;
pub mod client_settings;
pub mod codec;
pub mod command;
pub mod conninfo;
mod error;
pub mod messages;
pub mod parameter_values;
pub mod passfile;
pub mod pg15_parameters;
pub mod results;
#[cfg(test)]
mod test_util;
mod text_values;
pub mod tls;
mod wire;

pub use codec::{ClientCodec, ServerCodec, SslResponseCodec, StartupCodec};
pub use error::{CodecError, Result};
pub use messages::{
    AuthRequest, BackendMessage, ErrorFields, FrontendMessage, SqlState, StartupPacket,
    MAX_STARTUP_PACKET_LEN,
};

/// The `server_version` walserver reports in its ParameterStatus and SHOW. PostgreSQL 15's
/// pg_receivewal refuses a server newer than itself, and its clients switch behaviour on the
/// major version, so walserver presents itself as PostgreSQL 15; the `(walserver)` suffix is
/// how a walserver upstream is told from a PostgreSQL one.
pub const SERVER_VERSION: &str = "15.0 (walserver)";

/// The startup parameter by which walserver's walreceiver says it takes WAL its upstream
/// has written but not yet made durable, and cuts back at stream start what was never
/// acknowledged (the overlapped commit). A name with a dot is a custom parameter, which
/// PostgreSQL 15 keeps as a placeholder, so the same startup packet works against both; a
/// walserver walsender sends such WAL only to a synchronous standby that set it to `on`.
pub const ACCEPTS_UNFLUSHED_PARAM: &str = "walserver.accept_unflushed";
