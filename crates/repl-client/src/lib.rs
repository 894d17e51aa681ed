//! repl-client: a small blocking client of PostgreSQL 15's physical replication protocol, on
//! `std::net::TcpStream` (optionally rustls), for integration tests and load tools that talk
//! to walserver or to PostgreSQL itself.
//!
//! What it owns: one socket and its buffers. [`ReplClient::connect_with`] runs the startup
//! phase with protocol-codec's sans-I/O [`ClientHandshake`] (the same rules the walreceiver
//! applies: SSL negotiation, every authentication method the codec has, the order of the
//! greeting), then [`ReplClient::send`] and [`ReplClient::recv`] move typed messages, with
//! helpers for a simple query, IDENTIFY_SYSTEM, START_REPLICATION and standby status
//! updates; a read timeout ([`ReplClient::set_read_timeout`]) or a deadline
//! ([`ReplClient::recv_before`]) bounds each wait. [`ReplClient::raw`] is a connected socket
//! with nothing sent, for tests that speak the startup phase themselves (malformed packets,
//! clients that stop halfway).
//!
//! What it does not own: retries, `sslmode` fallbacks between attempts (one call is one
//! attempt), async I/O (the walreceiver has its own driver around the same handshake), or
//! any decision about what to do with the WAL.
//!
//! Reads go into a fixed scratch buffer and are appended to the message buffer: one copy at
//! memory speed, no `unsafe`, and XLogData's bytes stay zero-copy slices of the buffer.
//!
//! Errors are one enum, [`Error`]; a server's ErrorResponse stays whole in
//! [`Error::Server`], so callers can check its SQLSTATE.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use protocol_codec::auth::ChannelBindingMode;
use protocol_codec::client::{ClientHandshake, Encryption, Established, StartupConfig, Step};
use protocol_codec::messages::StandbyStatusUpdate;
use protocol_codec::tls::{self, SslMode};
use protocol_codec::{BackendMessage, ClientCodec, ErrorFields, FrontendMessage, SqlState};
use protocol_codec::{CodecError, StartupPacket};
use rustls::ClientConfig;
use tokio_util::codec::{Decoder, Encoder};
use wal_types::{Lsn, PgTimestamp};

pub use protocol_codec::client::StartupError;

/// How much one read asks the socket for.
const READ_CHUNK: usize = 256 << 10;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    /// The server's ErrorResponse, during the startup or in answer to a command.
    #[error("the server reported {0}")]
    Server(ErrorFields),
    /// The startup phase failed on our side or by a server breaking its rules.
    #[error("connection startup failed: {0}")]
    Startup(StartupError),
    #[error("TLS failed: {0}")]
    Tls(String),
    /// Nothing arrived within the read timeout.
    #[error("no message within the read timeout")]
    Timeout,
    #[error("the server closed the connection")]
    Closed,
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// Bytes that do not decode, or a message that does not encode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A message the call did not expect at that point.
    #[error("unexpected {0}")]
    Unexpected(String),
}

impl Error {
    /// The server's error fields, if the server ended the call.
    pub fn server_error(&self) -> Option<&ErrorFields> {
        match self {
            Error::Server(f) => Some(f),
            _ => None,
        }
    }

    /// The server's SQLSTATE, if the server ended the call.
    pub fn sqlstate(&self) -> Option<SqlState> {
        self.server_error().and_then(ErrorFields::code)
    }

    fn from_read(e: io::Error) -> Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout,
            io::ErrorKind::UnexpectedEof => Error::Closed,
            _ => Error::Io(e),
        }
    }
}

impl From<StartupError> for Error {
    fn from(e: StartupError) -> Error {
        match e {
            StartupError::Server(f) => Error::Server(f),
            other => Error::Startup(other),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// TLS for a connection: SSLRequest first, then a rustls handshake.
#[derive(Clone)]
pub struct TlsOptions {
    pub config: Arc<ClientConfig>,
    /// The name to check the certificate against (and for SNI).
    pub server_name: String,
    /// What a server's `'N'` means (the end for require and the verify modes).
    pub sslmode: SslMode,
    /// What SCRAM binds to; `None` binds to the certificate the server presented
    /// (SCRAM-SHA-256-PLUS when offered).
    pub channel_binding: Option<ChannelBindingMode>,
}

impl TlsOptions {
    /// The configuration for `sslmode` with root certificate `root` (read from its file).
    pub fn new(
        sslmode: SslMode,
        root: Option<&std::path::Path>,
        server_name: &str,
    ) -> Result<TlsOptions> {
        let config = tls::client_config(sslmode, root)
            .map_err(|e| Error::Tls(e.to_string()))?
            .ok_or_else(|| Error::Tls("sslmode=disable has no TLS configuration".into()))?;
        Ok(TlsOptions {
            config,
            server_name: server_name.to_string(),
            sslmode,
            channel_binding: None,
        })
    }
}

/// Everything [`ReplClient::connect_with`] needs.
#[derive(Clone)]
pub struct ConnectOptions {
    /// The startup packet's parameters and the password.
    pub startup: StartupConfig,
    /// The socket's read timeout, kept after the startup; `None` waits forever.
    pub read_timeout: Option<Duration>,
    pub tls: Option<TlsOptions>,
}

impl ConnectOptions {
    /// A physical replication connection (`replication=true`) in plaintext.
    pub fn new(user: &str, password: Option<&str>, application_name: &str) -> ConnectOptions {
        ConnectOptions {
            startup: StartupConfig::replication(user, password, application_name),
            read_timeout: None,
            tls: None,
        }
    }

    /// Adds a startup parameter (`database`, `options`, ...).
    pub fn param(mut self, name: &str, value: &str) -> ConnectOptions {
        self.startup = self.startup.param(name, value);
        self
    }

    pub fn read_timeout(mut self, timeout: Duration) -> ConnectOptions {
        self.read_timeout = Some(timeout);
        self
    }

    pub fn tls(mut self, tls: TlsOptions) -> ConnectOptions {
        self.startup.sslmode = tls.sslmode;
        self.tls = Some(tls);
        self
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// IDENTIFY_SYSTEM's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemIdentity {
    pub system_id: String,
    pub timeline: u32,
    pub xlogpos: Lsn,
    pub dbname: Option<String>,
}

/// One replication connection, blocking.
pub struct ReplClient {
    stream: Stream,
    buf: BytesMut,
    scratch: Box<[u8]>,
    out: BytesMut,
    codec: ClientCodec,
    session: Established,
}

impl std::fmt::Debug for ReplClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplClient")
            .field("peer", &self.tcp().peer_addr().ok())
            .field("session", &self.session)
            .field("buffered", &self.buf.len())
            .finish()
    }
}

impl ReplClient {
    /// Connects in plaintext and logs in as `user` with `application_name`.
    pub fn connect(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        user: &str,
        password: Option<&str>,
        application_name: &str,
    ) -> Result<ReplClient> {
        ReplClient::connect_with(addr, &ConnectOptions::new(user, password, application_name))
    }

    /// Connects and runs the startup phase as `options` say, up to ReadyForQuery.
    pub fn connect_with(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        options: &ConnectOptions,
    ) -> Result<ReplClient> {
        let mut c = ReplClient::raw(addr)?;
        c.set_read_timeout(options.read_timeout)?;
        c.handshake(options)?;
        Ok(c)
    }

    /// A connected socket (TCP_NODELAY), nothing sent.
    pub fn raw(addr: impl ToSocketAddrs + std::fmt::Debug) -> Result<ReplClient> {
        let connect = |source| Error::Connect {
            addr: format!("{addr:?}"),
            source,
        };
        let stream = TcpStream::connect(&addr).map_err(connect)?;
        stream.set_nodelay(true).map_err(connect)?;
        Ok(ReplClient {
            stream: Stream::Plain(stream),
            buf: BytesMut::with_capacity(READ_CHUNK),
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
            out: BytesMut::new(),
            codec: ClientCodec::new(),
            session: Established::default(),
        })
    }

    fn handshake(&mut self, options: &ConnectOptions) -> Result<()> {
        let encryption = if options.tls.is_some() {
            Encryption::Tls
        } else {
            Encryption::Plain
        };
        let mut h = ClientHandshake::new(options.startup.clone(), encryption);
        let mut step = h.start()?;
        loop {
            step = match step {
                Step::ReadSslAnswer { send } => {
                    self.send_raw(&send)?;
                    // Exactly one byte: nothing sent before the TLS handshake may be taken
                    // as if it came through it.
                    let mut answer = [0u8; 1];
                    self.stream
                        .read_exact(&mut answer)
                        .map_err(Error::from_read)?;
                    h.on_ssl_answer(answer[0])?
                }
                Step::StartTls => {
                    let binding = self.start_tls(options.tls.as_ref())?;
                    h.tls_started(binding)?
                }
                Step::ReadMessage { send } => {
                    if !send.is_empty() {
                        self.send_raw(&send)?;
                    }
                    let m = self.recv()?;
                    h.on_message(m)?
                }
                Step::Ready(session) => {
                    self.session = session;
                    return Ok(());
                }
            };
        }
    }

    fn start_tls(&mut self, options: Option<&TlsOptions>) -> Result<ChannelBindingMode> {
        let options =
            options.ok_or_else(|| Error::Tls("the server accepted SSL unasked".into()))?;
        let name = tls::server_name(&options.server_name).map_err(|e| Error::Tls(e.to_string()))?;
        let mut session = rustls::ClientConnection::new(options.config.clone(), name)
            .map_err(|e| Error::Tls(e.to_string()))?;
        let placeholder = self.placeholder()?;
        let Stream::Plain(mut tcp) = std::mem::replace(&mut self.stream, placeholder) else {
            return Err(Error::Tls("TLS is already up".into()));
        };
        while session.is_handshaking() {
            session
                .complete_io(&mut tcp)
                .map_err(|e| Error::Tls(e.to_string()))?;
        }
        let end_point = session
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| tls::tls_server_end_point(c));
        self.stream = Stream::Tls(Box::new(rustls::StreamOwned::new(session, tcp)));
        Ok(match (&options.channel_binding, end_point) {
            (Some(b), _) => b.clone(),
            (None, Some(hash)) => ChannelBindingMode::TlsServerEndPoint(hash),
            (None, None) => ChannelBindingMode::TlsWithoutBinding,
        })
    }

    /// A second handle on the same socket, to stand in while TLS takes the first.
    fn placeholder(&self) -> Result<Stream> {
        Ok(Stream::Plain(self.stream.tcp().try_clone()?))
    }

    /// What the startup phase learnt: ParameterStatus values, BackendKeyData, the SASL
    /// mechanism, whether TLS is up.
    pub fn session(&self) -> &Established {
        &self.session
    }

    /// The last value the server reported for parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.session.param(name)
    }

    /// The underlying socket, for socket options and shutdown.
    pub fn tcp(&self) -> &TcpStream {
        self.stream.tcp()
    }

    /// How long a read may wait; `None` forever. A read that times out is [`Error::Timeout`].
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        Ok(self.tcp().set_read_timeout(timeout)?)
    }

    /// Sends one message.
    pub fn send(&mut self, m: &FrontendMessage) -> Result<()> {
        self.out.clear();
        self.codec.encode(m, &mut self.out)?;
        let out = std::mem::take(&mut self.out);
        let r = self.send_raw(&out);
        self.out = out;
        r
    }

    /// Sends a startup-phase packet (for a connection from [`ReplClient::raw`]).
    pub fn send_startup(&mut self, p: &StartupPacket) -> Result<()> {
        let mut out = BytesMut::new();
        p.encode(&mut out)?;
        self.send_raw(&out)
    }

    /// Sends bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()?;
        Ok(())
    }

    /// The next message from the server.
    pub fn recv(&mut self) -> Result<BackendMessage> {
        loop {
            if let Some(m) = self.codec.decode(&mut self.buf)? {
                return Ok(m);
            }
            if self.fill()? == 0 {
                return Err(Error::Closed);
            }
        }
    }

    /// The next message, if it arrives before `deadline`; [`Error::Timeout`] otherwise. The
    /// read timeout set before is restored afterwards.
    pub fn recv_before(&mut self, deadline: Instant) -> Result<BackendMessage> {
        let saved = self.tcp().read_timeout()?;
        let result = self.recv_by(deadline);
        self.set_read_timeout(saved)?;
        result
    }

    fn recv_by(&mut self, deadline: Instant) -> Result<BackendMessage> {
        loop {
            if let Some(m) = self.codec.decode(&mut self.buf)? {
                return Ok(m);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            self.set_read_timeout(Some(left))?;
            if self.fill()? == 0 {
                return Err(Error::Closed);
            }
        }
    }

    /// One read from the socket into the buffer; 0 at the end of the stream.
    fn fill(&mut self) -> Result<usize> {
        let n = self
            .stream
            .read(&mut self.scratch)
            .map_err(Error::from_read)?;
        self.buf.extend_from_slice(&self.scratch[..n]);
        Ok(n)
    }

    /// Reads until the server closes the connection: `Ok(())` at its end (or a reset), the
    /// error otherwise (a timeout while it stays open). What arrives meanwhile is kept for
    /// [`ReplClient::recv`].
    pub fn wait_closed(&mut self) -> Result<()> {
        loop {
            match self.fill() {
                Ok(0) | Err(Error::Closed) => return Ok(()),
                Ok(_) => {}
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Runs a simple query; returns its messages up to ReadyForQuery (not included). An
    /// ErrorResponse is among them: an ERROR ends the command, not the connection.
    pub fn simple_query(&mut self, query: &str) -> Result<Vec<BackendMessage>> {
        self.send(&FrontendMessage::Query(query.to_string()))?;
        let mut out = Vec::new();
        loop {
            match self.recv()? {
                BackendMessage::ReadyForQuery(_) => return Ok(out),
                m => out.push(m),
            }
        }
    }

    /// IDENTIFY_SYSTEM: the server's system identifier, timeline and WAL position (the
    /// flushed end on walserver; on a PostgreSQL standby, what it has received and flushed
    /// or replayed).
    pub fn identify_system(&mut self) -> Result<SystemIdentity> {
        let msgs = self.simple_query("IDENTIFY_SYSTEM")?;
        let mut row = None;
        for m in msgs {
            match m {
                BackendMessage::DataRow(r) => row = Some(r),
                BackendMessage::ErrorResponse(e) => return Err(Error::Server(e)),
                _ => {}
            }
        }
        let row = row.ok_or_else(|| Error::Unexpected("IDENTIFY_SYSTEM without a row".into()))?;
        let field = |i: usize| -> Option<String> {
            let b: Bytes = row.get(i).cloned().flatten()?;
            Some(std::str::from_utf8(&b).ok()?.to_string())
        };
        let bad = |what: &str| Error::Unexpected(format!("IDENTIFY_SYSTEM row: bad {what}"));
        Ok(SystemIdentity {
            system_id: field(0).ok_or_else(|| bad("systemid"))?,
            timeline: field(1)
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| bad("timeline"))?,
            xlogpos: field(2)
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| bad("xlogpos"))?,
            dbname: field(3),
        })
    }

    /// START_REPLICATION at `start` (on `timeline` if given); returns once
    /// CopyBothResponse arrived. Then [`ReplClient::recv`] yields XLogData and keepalives.
    pub fn start_replication(&mut self, start: Lsn, timeline: Option<u32>) -> Result<()> {
        let q = match timeline {
            Some(t) => format!("START_REPLICATION {start} TIMELINE {t}"),
            None => format!("START_REPLICATION {start}"),
        };
        self.send(&FrontendMessage::Query(q))?;
        loop {
            match self.recv()? {
                BackendMessage::CopyBothResponse => return Ok(()),
                BackendMessage::ErrorResponse(e) => return Err(Error::Server(e)),
                BackendMessage::NoticeResponse(_) => {}
                other => {
                    return Err(Error::Unexpected(format!(
                        "{} before CopyBothResponse",
                        other.name()
                    )))
                }
            }
        }
    }

    /// A standby status update, sent now.
    pub fn standby_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        apply: Lsn,
        reply_requested: bool,
    ) -> Result<()> {
        self.send(&FrontendMessage::StandbyStatusUpdate(StandbyStatusUpdate {
            write,
            flush,
            apply,
            send_time: PgTimestamp::now(),
            reply_requested,
        }))
    }

    /// Says goodbye (Terminate); errors are ignored, the conversation is over.
    pub fn close(mut self) {
        let _ = self.send(&FrontendMessage::Terminate);
    }
}
