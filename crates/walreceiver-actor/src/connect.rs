//! Opening a replication connection to an upstream, as libpq does for PostgreSQL's
//! walreceiver: TCP, SSL negotiation by `sslmode`, the startup packet with
//! `replication=true`, authentication (trust, cleartext, md5, SCRAM-SHA-256 with the server's
//! signature checked), then the server's parameters up to the first ReadyForQuery.
//!
//! Also a tiny simple-query client over such a connection, for the one-shot conversations of
//! [`crate::fetch_upstream_identity`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use protocol_codec::auth::{ChannelBindingMode, ClientAuthenticator};
use protocol_codec::conninfo::ConnInfo;
use protocol_codec::tls::{self, SslMode};
use protocol_codec::{BackendMessage, ClientCodec, FrontendMessage, StartupPacket};
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
    /// The ParameterStatus values the server sent, in order.
    pub params: Vec<(String, String)>,
    pub tls: bool,
    pub peer: SocketAddr,
}

impl Connection {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
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
    let tls_config = tls::client_config(mode, info.sslrootcert.as_deref())?;
    match mode {
        SslMode::Disable => attempt(info, application_name, None).await,
        // allow: plaintext first, TLS only if the server refuses plaintext.
        SslMode::Allow => match attempt(info, application_name, None).await {
            Err(ReceiverError::Upstream { .. }) => {
                attempt(info, application_name, tls_config.as_ref()).await
            }
            other => other,
        },
        // prefer: TLS first; plaintext if the server says 'N' (handled inside) or the TLS
        // handshake fails.
        SslMode::Prefer => {
            match attempt(info, application_name, tls_config.as_ref()).await {
                Err(ReceiverError::Tls { message }) => {
                    tracing::info!("TLS with the upstream failed ({message}); trying without TLS (sslmode=prefer)");
                    attempt(info, application_name, None).await
                }
                other => other,
            }
        }
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            attempt(info, application_name, tls_config.as_ref()).await
        }
    }
}

/// One connection attempt; with `tls` it sends SSLRequest first.
async fn attempt(
    info: &ConnInfo,
    application_name: &str,
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
    let mut io: Box<dyn Io> = Box::new(stream);
    let mut encrypted = false;
    if let Some(config) = tls {
        let mut req = BytesMut::new();
        StartupPacket::SslRequest.encode(&mut req)?;
        write_all(&mut io, &req).await?;
        // Exactly one byte: anything the server sent after 'S' and before the TLS handshake
        // would be plaintext injected into the encrypted session (CVE-2021-23214's client side).
        let mut answer = [0u8; 1];
        io.read_exact(&mut answer)
            .await
            .map_err(|e| ReceiverError::Io {
                message: format!("reading the answer to SSLRequest: {e}"),
            })?;
        match answer[0] {
            b'S' => {
                let name = tls::server_name(host)?;
                let stream = TlsConnector::from(config.clone())
                    .connect(name, io)
                    .await
                    .map_err(|e| ReceiverError::Tls {
                        message: e.to_string(),
                    })?;
                io = Box::new(stream);
                encrypted = true;
            }
            b'N' if info.sslmode.requires_tls() => {
                return Err(ReceiverError::Tls {
                    message: format!(
                        "server does not support SSL, but SSL was required (sslmode={})",
                        info.sslmode.as_str()
                    ),
                })
            }
            b'N' => {}
            // PostgreSQL before 9.x could answer with an ErrorResponse here.
            other => {
                return Err(ReceiverError::protocol(format!(
                    "received invalid response to SSL negotiation: {:?}",
                    char::from(other)
                )))
            }
        }
    }
    let user = info
        .user
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "postgres".to_string());
    let mut params = vec![
        ("user".to_string(), user.clone()),
        (
            "database".to_string(),
            info.dbname
                .clone()
                .unwrap_or_else(|| "replication".to_string()),
        ),
        ("replication".to_string(), "true".to_string()),
        ("application_name".to_string(), application_name.to_string()),
    ];
    if let Some(o) = &info.options {
        params.push(("options".to_string(), o.clone()));
    }
    let mut buf = BytesMut::new();
    StartupPacket::startup(params).encode(&mut buf)?;
    write_all(&mut io, &buf).await?;

    // Without the server certificate's hash at hand, SCRAM over TLS uses `n,,` when the server
    // offers -PLUS (PostgreSQL refuses `y,,` then as a possible downgrade) and `y,,` otherwise.
    let binding = if encrypted {
        ChannelBindingMode::TlsWithoutBinding
    } else {
        ChannelBindingMode::NoTls
    };
    let mut auth = ClientAuthenticator::new(&user, info.password.as_deref(), binding);
    let mut rbuf = BytesMut::with_capacity(1024);
    let mut server_params = Vec::new();
    let mut authenticated = false;
    loop {
        match read_message(&mut io, &mut rbuf).await? {
            BackendMessage::Authentication(req) => {
                if authenticated {
                    return Err(ReceiverError::protocol(
                        "authentication request after AuthenticationOk",
                    ));
                }
                if req == protocol_codec::AuthRequest::Ok {
                    authenticated = true;
                }
                if let Some(reply) = auth.step(&req)? {
                    let mut out = BytesMut::new();
                    reply.encode(&mut out)?;
                    write_all(&mut io, &out).await?;
                }
            }
            BackendMessage::ParameterStatus { name, value } => server_params.push((name, value)),
            BackendMessage::BackendKeyData { .. }
            | BackendMessage::NoticeResponse(_)
            | BackendMessage::NegotiateProtocolVersion { .. } => {}
            BackendMessage::ErrorResponse(e) => return Err(ReceiverError::upstream(&e)),
            BackendMessage::ReadyForQuery(_) if authenticated => {
                return Ok(Connection {
                    io,
                    leftover: rbuf,
                    params: server_params,
                    tls: encrypted,
                    peer,
                })
            }
            other => {
                return Err(ReceiverError::protocol(format!(
                    "unexpected {} during connection startup",
                    crate::query::describe(&other)
                )))
            }
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
