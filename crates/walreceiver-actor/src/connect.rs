//! Opening a replication connection to an upstream, as libpq does for PostgreSQL's
//! walreceiver: TCP, SSL negotiation by `sslmode`, the startup packet with
//! `replication=true`, authentication (trust, cleartext, md5, SCRAM-SHA-256 with the server's
//! signature checked), then the server's parameters up to the first ReadyForQuery. The rules
//! of that exchange, and which attempts an `sslmode` makes, are protocol-codec's
//! [`ClientHandshake`] and [`client::next_attempt`]; this file does the socket and TLS I/O
//! around them (the TLS configuration's root certificate is read on the blocking pool).
//!
//! Also a tiny simple-query client over such a connection, for the one-shot conversations of
//! [`crate::fetch_upstream_identity`].

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use protocol_codec::auth::ChannelBindingMode;
use protocol_codec::client::{
    self, AttemptFailure, ClientHandshake, Encryption, Established, StartupConfig, StartupError,
    Step,
};
use protocol_codec::conninfo::ConnInfo;
use protocol_codec::tls::{self, SslMode};
use protocol_codec::{BackendMessage, ClientCodec, FrontendMessage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::TlsConnector;
use tokio_util::codec::Decoder;

/// A byte stream in either direction, plain TCP or TLS: the same type for both ends.
pub use actor_util::Io;

use crate::error::ReceiverError;
use crate::query::{QueryResult, ResultCollector};

/// An authenticated replication connection, idle (after its first ReadyForQuery).
pub struct Connection {
    pub io: Box<dyn Io>,
    /// Bytes already read after the ReadyForQuery (normally none).
    pub leftover: BytesMut,
    /// What the startup phase learnt: the ParameterStatus values, BackendKeyData, whether
    /// TLS is up.
    pub session: Established,
    pub peer: SocketAddr,
    /// The TCP socket under `io` (and under its TLS, if any), open as long as `io` is: for
    /// socket options set while streaming.
    pub(crate) fd: Option<RawFd>,
}

impl Connection {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.session.param(name)
    }

    /// Sends `messages` and flushes.
    pub async fn send(&mut self, messages: &[FrontendMessage]) -> Result<(), ReceiverError> {
        let mut buf = BytesMut::new();
        for m in messages {
            m.encode(&mut buf)?;
        }
        write_all(&mut self.io, &buf).await
    }

    /// Reads one message.
    pub async fn recv(&mut self) -> Result<BackendMessage, ReceiverError> {
        read_message(&mut self.io, &mut self.leftover).await
    }

    /// Runs one replication command and collects its answer.
    pub async fn simple_query(&mut self, query: &str) -> Result<QueryResult, ReceiverError> {
        self.send(&[FrontendMessage::Query(query.to_string())])
            .await?;
        let mut c = ResultCollector::default();
        loop {
            let msg = self.recv().await?;
            if let Some(r) = c.feed(msg)? {
                return Ok(r);
            }
        }
    }

    /// Says goodbye (Terminate) and closes, ignoring errors: the conversation is over.
    pub async fn close(mut self) {
        let _ = self.send(&[FrontendMessage::Terminate]).await;
        let _ = self.io.shutdown().await;
    }
}

/// How long to wait for the whole connection setup: libpq's `connect_timeout` (0 or absent
/// waits forever, and values below 2 s count as 2 s), else `fallback`.
pub fn setup_timeout(info: &ConnInfo, fallback: Option<Duration>) -> Option<Duration> {
    match info.connect_timeout {
        Some(0) | None => fallback,
        Some(s) => Some(Duration::from_secs(u64::from(s.max(2)))),
    }
}

/// Connects to the upstream `info` names, within `timeout` if given.
pub async fn connect(
    info: &ConnInfo,
    application_name: &str,
    timeout: Option<Duration>,
) -> Result<Connection, ReceiverError> {
    match timeout {
        None => connect_inner(info, application_name).await,
        Some(t) => match tokio::time::timeout(t, connect_inner(info, application_name)).await {
            Ok(r) => r,
            Err(_) => Err(ReceiverError::Connect {
                addr: address(info),
                message: format!("timeout expired after {} ms", t.as_millis()),
            }),
        },
    }
}

fn address(info: &ConnInfo) -> String {
    format!("{}:{}", info.host_or_default(), info.port)
}

async fn connect_inner(
    info: &ConnInfo,
    application_name: &str,
) -> Result<Connection, ReceiverError> {
    let mode = info.sslmode;
    let tls_config = match info.sslrootcert.clone() {
        // Reading the root certificate is file I/O: on the blocking pool, not the actor's
        // thread.
        Some(root) if mode != SslMode::Disable => {
            tokio::task::spawn_blocking(move || tls::client_config(mode, Some(&root)))
                .await
                .map_err(|e| ReceiverError::Tls {
                    message: format!("loading sslrootcert failed: {e}"),
                })??
        }
        // Without a root certificate nothing is read.
        root => tls::client_config(mode, root.as_deref())?,
    };
    let mut encryption = client::first_attempt(mode);
    loop {
        let err = match attempt(info, application_name, encryption, tls_config.as_ref()).await {
            Ok(conn) => return Ok(conn),
            Err(e) => e,
        };
        let failure = match &err {
            ReceiverError::Upstream { .. } => AttemptFailure::ServerError,
            ReceiverError::Tls { .. } => AttemptFailure::Tls,
            _ => AttemptFailure::Other,
        };
        match client::next_attempt(mode, encryption, failure) {
            Some(next) => {
                if failure == AttemptFailure::Tls {
                    tracing::info!(
                        "TLS with the upstream failed ({err}); trying without TLS (sslmode={mode})"
                    );
                }
                encryption = next;
            }
            None => return Err(err),
        }
    }
}

/// What the walreceiver sends in its startup packet, as libpq's walreceiver does.
fn startup_config(info: &ConnInfo, application_name: &str) -> StartupConfig {
    let user = info
        .user
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "postgres".to_string());
    let database = info.dbname.as_deref().unwrap_or("replication");
    let mut config = StartupConfig {
        user,
        password: info.password.clone(),
        params: Vec::new(),
        sslmode: info.sslmode,
        channel_binding: info.channel_binding,
    }
    .param("database", database)
    .param("replication", "true")
    .param("application_name", application_name);
    if let Some(o) = &info.options {
        config = config.param("options", o);
    }
    config
}

/// One connection attempt: the socket and TLS I/O around [`ClientHandshake`].
async fn attempt(
    info: &ConnInfo,
    application_name: &str,
    encryption: Encryption,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<Connection, ReceiverError> {
    let host = info.host_or_default();
    let connect_err = |e: std::io::Error| ReceiverError::Connect {
        addr: address(info),
        message: e.to_string(),
    };
    let stream = TcpStream::connect((host, info.port))
        .await
        .map_err(connect_err)?;
    let _ = stream.set_nodelay(true);
    let peer = stream.peer_addr().map_err(connect_err)?;
    let fd = stream.as_raw_fd();
    let mut io: Box<dyn Io> = Box::new(stream);
    let mut handshake = ClientHandshake::new(startup_config(info, application_name), encryption);
    let mut rbuf = BytesMut::with_capacity(1024);
    let mut step = handshake.start().map_err(startup_error)?;
    loop {
        let next = match step {
            Step::ReadSslAnswer { send } => {
                write_all(&mut io, &send).await?;
                // Exactly one byte, as the handshake demands.
                let mut answer = [0u8; 1];
                io.read_exact(&mut answer)
                    .await
                    .map_err(|e| ReceiverError::Io {
                        message: format!("reading the answer to SSLRequest: {e}"),
                    })?;
                handshake.on_ssl_answer(answer[0])
            }
            Step::StartTls => {
                let Some(config) = tls else {
                    return Err(ReceiverError::Tls {
                        message: "the server accepted SSL, but no TLS configuration is at hand"
                            .into(),
                    });
                };
                let name = tls::server_name(host)?;
                let stream = TlsConnector::from(config.clone())
                    .connect(name, io)
                    .await
                    .map_err(|e| ReceiverError::Tls {
                        message: e.to_string(),
                    })?;
                // SCRAM binds to the certificate the server presented (SCRAM-SHA-256-PLUS when
                // it is offered), as libpq does: a man in the middle who terminates TLS with
                // another certificate cannot complete the exchange.
                let binding = match stream.get_ref().1.peer_certificates() {
                    Some([leaf, ..]) => {
                        ChannelBindingMode::TlsServerEndPoint(tls::tls_server_end_point(leaf))
                    }
                    _ => ChannelBindingMode::TlsWithoutBinding,
                };
                io = Box::new(stream);
                handshake.tls_started(binding)
            }
            Step::ReadMessage { send } => {
                if !send.is_empty() {
                    write_all(&mut io, &send).await?;
                }
                let msg = read_message(&mut io, &mut rbuf).await?;
                handshake.on_message(msg)
            }
            Step::Ready(established) => {
                return Ok(Connection {
                    io,
                    leftover: rbuf,
                    session: established,
                    peer,
                    fd: Some(fd),
                })
            }
        };
        step = next.map_err(startup_error)?;
    }
}

fn startup_error(e: StartupError) -> ReceiverError {
    match e {
        StartupError::Server(fields) => ReceiverError::upstream(&fields),
        StartupError::SslRequired(_) => ReceiverError::Tls {
            message: e.to_string(),
        },
        StartupError::Auth(a) => a.into(),
        StartupError::Codec(c) => c.into(),
        StartupError::InvalidSslAnswer(_) | StartupError::Protocol(_) => {
            ReceiverError::protocol(e.to_string())
        }
    }
}

async fn write_all(io: &mut Box<dyn Io>, bytes: &[u8]) -> Result<(), ReceiverError> {
    let io_err = |e: std::io::Error| ReceiverError::Io {
        message: e.to_string(),
    };
    io.write_all(bytes).await.map_err(io_err)?;
    io.flush().await.map_err(io_err)
}

/// Reads until one message decodes. Cancel-safe: bytes read stay in `buf`.
async fn read_message(
    io: &mut Box<dyn Io>,
    buf: &mut BytesMut,
) -> Result<BackendMessage, ReceiverError> {
    loop {
        if let Some(m) = ClientCodec::new().decode(buf)? {
            return Ok(m);
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(8192);
        }
        let n = io.read_buf(buf).await.map_err(|e| ReceiverError::Io {
            message: e.to_string(),
        })?;
        if n == 0 {
            return Err(ReceiverError::UpstreamClosed {
                detail: String::new(),
            });
        }
    }
}
