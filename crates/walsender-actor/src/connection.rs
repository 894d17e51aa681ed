//! The startup phase on a real socket: the async driver around [`crate::startup::Handshake`].
//!
//! It reads startup packets and authentication messages, writes the answers, upgrades to TLS
//! when asked, and registers the walsender. It always listens for shutdown and for its
//! deadline (`authentication_timeout`) too, so a client that connects and says nothing, or
//! stops halfway through SCRAM, costs nothing once either comes.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use bytes::BytesMut;
use protocol_codec::client_settings::TcpKeepalives;
use protocol_codec::{
    BackendMessage, CodecError, ErrorFields, FrontendMessage, ServerCodec, SqlState, StartupCodec,
    StartupPacket,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::codec::Decoder;

use crate::messages::RegisterWalSender;
use crate::session::{admin_shutdown, ShutdownMode};
use crate::shared::{ServerTls, Shared};
use crate::startup::{greeting, ClientIdentity, Handshake, Step};
use crate::status::{SharedStatus, WalSenderStatus};
use crate::writer::FileSocket;

/// A byte stream in either direction: plain TCP or TLS (shared with the walreceiver).
pub use actor_util::Io;

/// A connection that finished its startup phase.
pub struct Established {
    pub io: Box<dyn Io>,
    /// A duplicate of the socket's descriptor when the connection is plain TCP, for sending
    /// WAL straight from segment files; `None` under TLS, which must encrypt every byte.
    pub file_socket: Option<FileSocket>,
    /// Bytes the client sent after its last authentication message, already read.
    pub leftover: BytesMut,
    pub identity: ClientIdentity,
    pub status: SharedStatus,
    /// What SHOW answers for the socket's keepalive parameters: the socket's own values, as
    /// PostgreSQL's show hooks read them.
    pub socket_show: Vec<(String, String)>,
    /// The socket's keepalive timing, kept so that a reload reaches it.
    pub keepalive: KeepaliveTiming,
}

/// The keepalive timing of one connection's socket, so that a reload of the node's
/// `tcp_keepalives_*` and `tcp_user_timeout` reaches it, as PostgreSQL applies a reload to its
/// open connections, except for the values their clients set themselves.
pub struct KeepaliveTiming {
    /// A duplicate of the TCP socket's descriptor (the socket itself is inside the
    /// connection's I/O, perhaps under TLS); `None` until the startup phase ends, or if it could
    /// not be duplicated, when a reload reaches new connections only.
    socket: Option<OwnedFd>,
    /// The socket's values when it was accepted (the system's), in
    /// [`actor_util::KEEPALIVE_TIMING`]'s order: what an unset or 0 value means, as PostgreSQL
    /// restores the socket's own default for 0; `None` where the socket could not say.
    defaults: [Option<u32>; 4],
    /// What the client set (`-c tcp_keepalives_idle=...`): a reload leaves these.
    client: TcpKeepalives,
    /// The node's timing last applied.
    node: TcpKeepalives,
}

impl KeepaliveTiming {
    /// The timing of a socket just accepted: its own values, and the node's `node`.
    fn accepted(socket: &impl AsRawFd, node: TcpKeepalives) -> KeepaliveTiming {
        KeepaliveTiming {
            socket: None,
            defaults: keepalive_values(socket),
            client: TcpKeepalives::default(),
            node,
        }
    }

    /// The value each option should have: the client's, else the node's, else the socket's
    /// default (0 also meaning the default, from either); `None` leaves the option alone.
    fn effective(&self) -> [Option<u32>; 4] {
        let (client, node) = (self.client.values(), self.node.values());
        std::array::from_fn(|i| match client[i] {
            Some(v) if v > 0 => Some(v),
            Some(_) => self.defaults[i],
            None => node[i].filter(|v| *v > 0).or(self.defaults[i]),
        })
    }

    /// Sets the effective timing on `socket`; a failure names the option the kernel refused.
    fn set_on(&self, socket: &impl AsRawFd) -> Result<(), (&'static str, std::io::Error)> {
        actor_util::set_keepalive_timing(socket, self.effective())
    }

    /// Applies the node's timing after a reload, if it changed; returns what SHOW answers for
    /// the socket's values then.
    pub fn reload(&mut self, node: &TcpKeepalives) -> Option<Vec<(String, String)>> {
        if self.node == *node {
            return None;
        }
        self.node = *node;
        let socket = self.socket.as_ref()?;
        if let Err((what, e)) = self.set_on(socket) {
            tracing::warn!("could not set {what} of the reloaded tcp_keepalives_*: {e}");
        }
        Some(tcp_keepalive_show(socket))
    }
}

/// The socket's keepalive timing as it stands, in [`actor_util::KEEPALIVE_TIMING`]'s order;
/// `None` where the socket cannot say.
fn keepalive_values(socket: &impl AsRawFd) -> [Option<u32>; 4] {
    actor_util::KEEPALIVE_TIMING.map(|(opt, _)| {
        actor_util::get_int_option(socket, libc::IPPROTO_TCP, opt)
            .ok()
            .and_then(|v| u32::try_from(v).ok())
    })
}

/// How a startup phase ended without a walsender.
#[derive(Debug)]
pub enum Ended {
    /// A FATAL was sent (or the client left, or asked to cancel); nothing more to do.
    Closed,
}

enum Phase {
    Startup,
    Messages,
}

/// Runs the startup phase of one connection.
pub async fn handshake(
    stream: TcpStream,
    peer: SocketAddr,
    pid: u32,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<Option<ShutdownMode>>,
) -> Result<Established, Ended> {
    let settings = shared.settings();
    let deadline = tokio::time::Instant::now() + settings.authentication_timeout;
    let _ = stream.set_nodelay(true);
    // The socket's descriptor, owned by `io` from here on (under TLS too), and the plain
    // socket's, `None` once TLS wraps it.
    let tcp_fd = stream.as_raw_fd();
    let mut plain_fd = Some(tcp_fd);
    let mut keepalive = node_keepalives(&stream, settings.tcp_keepalives, peer);
    let mut io: Box<dyn Io> = Box::new(stream);
    let mut buf = BytesMut::with_capacity(1024);
    let mut machine = Handshake::new(settings.auth.clone(), peer.ip());
    let mut phase = Phase::Startup;
    loop {
        let item = tokio::select! {
            biased;
            _ = shutdown.wait_for(Option::is_some) => {
                return fail(&mut io, admin_shutdown()).await;
            }
            _ = tokio::time::sleep_until(deadline) => {
                if machine.startup_received() {
                    return fail(&mut io, ErrorFields::fatal(SqlState::QUERY_CANCELED, "canceling authentication due to timeout")).await;
                }
                // PostgreSQL closes a connection that never sent a startup packet silently.
                return Err(Ended::Closed);
            }
            item = read_item(&mut io, &mut buf, &phase) => item,
        };
        let step = match item {
            Ok(Some(Item::Packet(p))) => machine.on_packet(p),
            Ok(Some(Item::Message(m))) => machine.on_message(m),
            Ok(Some(Item::Unexpected(tag))) => machine.on_unexpected_message(tag),
            // The client left.
            Ok(None) => return Err(Ended::Closed),
            Err(e) => {
                tracing::debug!(%peer, "bad startup traffic: {e}");
                return fail(&mut io, ErrorFields::fatal(e.sqlstate(), e.to_string())).await;
            }
        };
        match step {
            Step::SslAnswer(b'S') => {
                let (tls, channel_binding) =
                    start_tls(io, &buf, &shared, &mut shutdown, deadline, peer).await?;
                io = tls;
                machine.tls_started(channel_binding);
                plain_fd = None;
            }
            Step::SslAnswer(answer) => write(&mut io, &[answer]).await?,
            Step::Send(msgs) => {
                phase = Phase::Messages;
                send(&mut io, &msgs).await?;
            }
            Step::Fatal(f) => {
                if f.code().is_some_and(|c| c.as_str().starts_with("28")) {
                    shared.metrics.authentication_failed();
                }
                return fail(&mut io, f).await;
            }
            Step::Close => return Err(Ended::Closed),
            Step::Refused(msgs, f) => {
                send(&mut io, &msgs).await?;
                return fail(&mut io, f).await;
            }
            Step::Authenticated(msgs, identity) => {
                send(&mut io, &msgs).await?;
                let socket_show = apply_client_keepalives(&mut keepalive, tcp_fd, &identity, peer);
                let status = match register(&shared, pid, &identity, peer).await {
                    Ok(status) => status,
                    Err(refusal) => return fail(&mut io, refusal).await,
                };
                let hello = greeting(
                    &identity,
                    &settings.server_version,
                    settings.in_hot_standby,
                    settings.read_only,
                    pid as i32,
                    rand_key(pid),
                );
                send(&mut io, &hello).await?;
                // Only now, for a connection that will stream, the duplicate descriptor for
                // sendfile; without it the writer reads WAL into memory, as under TLS.
                let file_socket = plain_fd.and_then(|fd| sendfile_socket(fd, peer));
                return Ok(Established {
                    io,
                    file_socket,
                    leftover: buf,
                    identity,
                    status,
                    socket_show,
                    keepalive,
                });
            }
        }
    }
}

/// The node's keepalive timing on a socket just accepted (the listener turned keepalives on),
/// over the socket's own values, which a reload to 0 restores.
fn node_keepalives(stream: &TcpStream, node: TcpKeepalives, peer: SocketAddr) -> KeepaliveTiming {
    let keepalive = KeepaliveTiming::accepted(stream, node);
    if let Err((what, e)) = keepalive.set_on(stream) {
        tracing::warn!(%peer, "could not set {what} of tcp_keepalives_*: {e}");
    }
    keepalive
}

/// Answers an SSLRequest with `S` and runs the TLS handshake, within the same shutdown and
/// deadline as the rest of the startup phase; returns the encrypted stream and the
/// certificate's channel binding data. Bytes pipelined behind the SSLRequest are refused, as
/// PostgreSQL refuses them: they would be read as plaintext inside the encrypted session.
async fn start_tls(
    mut io: Box<dyn Io>,
    buf: &BytesMut,
    shared: &Shared,
    shutdown: &mut watch::Receiver<Option<ShutdownMode>>,
    deadline: tokio::time::Instant,
    peer: SocketAddr,
) -> Result<(Box<dyn Io>, Option<Vec<u8>>), Ended> {
    if let Err(e) = protocol_codec::messages::ensure_nothing_pipelined(buf) {
        return fail(
            &mut io,
            ErrorFields::fatal(SqlState::PROTOCOL_VIOLATION, e.to_string()),
        )
        .await;
    }
    let Some(ServerTls {
        acceptor,
        channel_binding,
    }) = shared.tls.clone()
    else {
        return Err(Ended::Closed);
    };
    write(&mut io, b"S").await?;
    let tls = tokio::select! {
        _ = shutdown.wait_for(Option::is_some) => return Err(Ended::Closed),
        _ = tokio::time::sleep_until(deadline) => return Err(Ended::Closed),
        r = acceptor.accept(io) => r,
    };
    match tls {
        Ok(s) => Ok((Box::new(s), channel_binding)),
        Err(e) => {
            tracing::info!(%peer, "TLS handshake failed: {e}");
            Err(Ended::Closed)
        }
    }
}

/// Sets the keepalive timing the client asked for on the TCP socket `tcp_fd`, and keeps a
/// duplicate of its descriptor so that a reload reaches it; returns what SHOW answers for the
/// socket's keepalive parameters.
fn apply_client_keepalives(
    keepalive: &mut KeepaliveTiming,
    tcp_fd: RawFd,
    identity: &ClientIdentity,
    peer: SocketAddr,
) -> Vec<(String, String)> {
    // SAFETY: `tcp_fd` belongs to the TcpStream inside the connection's I/O, which the caller
    // holds alive.
    let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(tcp_fd) };
    keepalive.client = identity.settings.tcp_keepalives;
    if let Err((what, e)) = keepalive.set_on(&socket) {
        tracing::debug!(%peer, "could not set the client's {what}: {e}");
    }
    let socket_show = tcp_keepalive_show(&socket);
    keepalive.socket = socket
        .try_clone_to_owned()
        .inspect_err(
            |e| tracing::debug!(%peer, "a reload will not reach this connection's keepalives: {e}"),
        )
        .ok();
    socket_show
}

/// Registers the walsender with the registry; refused with the FATAL to send when
/// `max_wal_senders` are already running, or when the registry is gone (the node is shutting
/// down).
async fn register(
    shared: &Shared,
    pid: u32,
    identity: &ClientIdentity,
    peer: SocketAddr,
) -> Result<SharedStatus, ErrorFields> {
    let status =
        WalSenderStatus::new(pid, &identity.user, &identity.application_name, peer).shared();
    match shared
        .registry
        .send(RegisterWalSender {
            pid,
            status: status.clone(),
        })
        .await
    {
        Ok(Ok(())) => Ok(status),
        Ok(Err(too_many)) => Err(ErrorFields::fatal(
            SqlState::TOO_MANY_CONNECTIONS,
            format!(
                "number of requested standby connections exceeds max_wal_senders (currently {})",
                too_many.max_wal_senders
            ),
        )),
        Err(_) => Err(admin_shutdown()),
    }
}

/// A duplicate of the plain TCP socket `fd` for sending WAL with sendfile, or `None` (the
/// writer then reads WAL into memory).
fn sendfile_socket(fd: RawFd, peer: SocketAddr) -> Option<FileSocket> {
    // SAFETY: `fd` belongs to the TcpStream inside the connection's I/O, which the caller
    // holds alive.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    FileSocket::duplicate(&fd)
        .inspect_err(|e| tracing::debug!(%peer, "no sendfile for this connection: {e}"))
        .ok()
}

enum Item {
    Packet(StartupPacket),
    Message(FrontendMessage),
    /// The type byte of a message that is not a PasswordMessage, where only one belongs;
    /// refused at once, as PostgreSQL refuses it, without reading the rest.
    Unexpected(u8),
}

/// The largest password or SASL message read during authentication (the body's length):
/// PostgreSQL's `PG_MAX_AUTH_TOKEN_LENGTH`. Kept small because the client is not known yet.
const MAX_AUTH_MESSAGE_LEN: usize = 65535;

/// Reads until one item decodes. Cancel-safe: bytes read stay in `buf`.
async fn read_item(
    io: &mut Box<dyn Io>,
    buf: &mut BytesMut,
    phase: &Phase,
) -> Result<Option<Item>, CodecError> {
    loop {
        let item = match phase {
            Phase::Startup => StartupCodec.decode(buf)?.map(Item::Packet),
            Phase::Messages => match buf.first() {
                Some(&tag) if tag != FrontendMessage::PASSWORD => Some(Item::Unexpected(tag)),
                _ => ServerCodec::with_max_message_len(MAX_AUTH_MESSAGE_LEN)
                    .decode(buf)?
                    .map(Item::Message),
            },
        };
        if item.is_some() {
            return Ok(item);
        }
        if io.read_buf(buf).await? == 0 {
            return Ok(None);
        }
    }
}

async fn write(io: &mut Box<dyn Io>, bytes: &[u8]) -> Result<(), Ended> {
    match io.write_all(bytes).await {
        Ok(()) => io.flush().await.map_err(|_| Ended::Closed),
        Err(_) => Err(Ended::Closed),
    }
}

async fn send(io: &mut Box<dyn Io>, msgs: &[BackendMessage]) -> Result<(), Ended> {
    let mut out = BytesMut::new();
    for m in msgs {
        if m.encode(&mut out).is_err() {
            return Err(Ended::Closed);
        }
    }
    write(io, &out).await
}

/// Sends a FATAL and closes.
async fn fail<T>(io: &mut Box<dyn Io>, fields: ErrorFields) -> Result<T, Ended> {
    let _ = send(io, &[BackendMessage::ErrorResponse(fields)]).await;
    let _ = io.shutdown().await;
    Err(Ended::Closed)
}

/// The BackendKeyData secret. walserver ignores cancel requests, so it need not be secret,
/// only different per connection (PostgreSQL's walreceiver names temporary slots after it).
fn rand_key(pid: u32) -> i32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (nanos ^ pid.rotate_left(16)) as i32
}

/// SHOW's values of the keepalive parameters: what the socket has, as plain numbers (seconds,
/// a count, milliseconds), as PostgreSQL shows them; 0 where the socket cannot say.
fn tcp_keepalive_show(socket: &impl AsRawFd) -> Vec<(String, String)> {
    let names = [
        "tcp_keepalives_idle",
        "tcp_keepalives_interval",
        "tcp_keepalives_count",
        "tcp_user_timeout",
    ];
    names
        .into_iter()
        .zip(keepalive_values(socket))
        .map(|(n, v)| (n.to_string(), v.unwrap_or(0).to_string()))
        .collect()
}
