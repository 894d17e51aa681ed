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
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actor_util::{set_int_option, set_keepalive_timing};
use bytes::BytesMut;
use protocol_codec::auth::ChannelBindingMode;
use protocol_codec::client::{
    self, AttemptFailure, ClientHandshake, Encryption, Established, StartupConfig, StartupError,
    Step,
};
use protocol_codec::conninfo::{ConnInfo, Keepalives, Target, TargetSessionAttrs};
use protocol_codec::passfile;
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
    /// The host and port of the connection string this connection reached.
    pub target: Target,
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

/// Connects to the upstream `info` names, as libpq does: each host of its list in order
/// (`timeout`, if given, for each), settling on the first that suits its
/// `target_session_attrs`; with `prefer-standby`, a second pass takes any server if no host
/// was a standby. A host that cannot be reached (the TCP connection fails or times out) or
/// does not suit leaves the next one to try; any other failure ends the attempt at once, as
/// libpq does not try further hosts once a server has answered.
pub async fn connect(
    info: &ConnInfo,
    application_name: &str,
    timeout: Option<Duration>,
) -> Result<Connection, ReceiverError> {
    let targets = info.targets()?;
    let tls_config = tls_config(info).await?;
    let attrs = info.target_session_attrs;
    let passes = if attrs == TargetSessionAttrs::PreferStandby {
        2
    } else {
        1
    };
    let mut failures = Vec::new();
    for pass in 0..passes {
        for target in &targets {
            let attempt = connect_to(info, target, application_name, tls_config.as_ref());
            let result = match timeout {
                None => attempt.await,
                Some(t) => tokio::time::timeout(t, attempt).await.unwrap_or_else(|_| {
                    Err(ReceiverError::Connect {
                        addr: target.to_string(),
                        message: format!("timeout expired after {} ms", t.as_millis()),
                    })
                }),
            };
            let why = match result {
                Ok(conn) => match attrs.check(
                    conn.param("in_hot_standby"),
                    conn.param("default_transaction_read_only"),
                    passes == 2 && pass == 0,
                ) {
                    Ok(()) => return Ok(conn),
                    Err(why) => {
                        conn.close().await;
                        why.to_string()
                    }
                },
                Err(ReceiverError::Connect { message, .. }) => message,
                Err(e) => return Err(e),
            };
            if targets.len() > 1 {
                tracing::info!(upstream = %target, "not connecting to this host: {why}");
            }
            failures.push((target, why));
        }
    }
    // One host: the last reason it gave (prefer-standby's second pass over it, if any).
    Err(match (&targets[..], &failures[..]) {
        ([one], [.., (_, why)]) => ReceiverError::Connect {
            addr: one.to_string(),
            message: why.clone(),
        },
        _ => ReceiverError::Connect {
            addr: format!("any of {} hosts", targets.len()),
            message: failures
                .iter()
                .map(|(target, why)| format!("{target}: {why}"))
                .collect::<Vec<_>>()
                .join("; "),
        },
    })
}

/// The TLS configuration `info` asks for; reading its root certificate is file I/O, so it
/// happens on the blocking pool, not the actor's thread.
async fn tls_config(info: &ConnInfo) -> Result<Option<Arc<ClientConfig>>, ReceiverError> {
    let mode = info.sslmode;
    Ok(match info.sslrootcert.clone() {
        Some(root) if mode != SslMode::Disable => {
            tokio::task::spawn_blocking(move || tls::client_config(mode, Some(&root)))
                .await
                .map_err(|e| ReceiverError::Tls {
                    message: format!("loading sslrootcert failed: {e}"),
                })??
        }
        // Without a root certificate nothing is read.
        root => tls::client_config(mode, root.as_deref())?,
    })
}

/// Connects to one host, with the attempts its `sslmode` makes (`prefer` tries TLS, then
/// without).
async fn connect_to(
    info: &ConnInfo,
    target: &Target,
    application_name: &str,
    tls_config: Option<&Arc<ClientConfig>>,
) -> Result<Connection, ReceiverError> {
    let mut startup = startup_config(info, application_name);
    let mut password_file = None;
    if startup.password.is_none() {
        if let Some((password, file)) = password_from_file(info, target, &startup).await {
            startup.password = Some(password);
            password_file = Some(file);
        }
    }
    let mode = info.sslmode;
    let mut encryption = client::first_attempt(mode);
    loop {
        let err = match attempt(info, target, &startup, encryption, tls_config).await {
            Ok(conn) => return Ok(conn),
            Err(e) => from_password_file(e, password_file.as_deref()),
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
                        upstream = %target,
                        "TLS with the upstream failed ({err}); trying without TLS (sslmode={mode})"
                    );
                }
                encryption = next;
            }
            None => return Err(err),
        }
    }
}

/// A refused password that came from the password file says so, as libpq's message does, so
/// that the operator looks there rather than at the conninfo.
fn from_password_file(e: ReceiverError, file: Option<&std::path::Path>) -> ReceiverError {
    match (e, file) {
        (
            ReceiverError::Upstream {
                severity,
                sqlstate,
                message,
                detail,
            },
            Some(file),
        ) if sqlstate == "28P01" => ReceiverError::Upstream {
            severity,
            message: format!(
                "{message}; password retrieved from file \"{}\"",
                file.display()
            ),
            sqlstate,
            detail,
        },
        (e, _) => e,
    }
}

/// The password for `target` from libpq's password file (the conninfo's `passfile`, else
/// `PGPASSFILE`, else `~/.pgpass`), read on the blocking pool. As libpq: a file that does not
/// exist gives nothing; one its group or others may read is ignored with a warning; the
/// database a physical replication connection matches is [`REPLICATION_DATABASE`], whatever
/// the conninfo's `dbname`. Returns the password and the file it came from.
async fn password_from_file(
    info: &ConnInfo,
    target: &Target,
    startup: &StartupConfig,
) -> Option<(String, PathBuf)> {
    let path = info
        .passfile
        .clone()
        .or_else(|| std::env::var_os("PGPASSFILE").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass")))?;
    let (host, port) = (target.host.clone(), target.port);
    let user = startup.user.clone();
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&path).ok().filter(|m| m.is_file())?;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                "password file \"{}\" has group or world access; permissions should be u=rw (0600) or less",
                path.display()
            );
            return None;
        }
        let contents = std::fs::read_to_string(&path)
            .inspect_err(|e| tracing::warn!("could not read password file \"{}\": {e}", path.display()))
            .ok()?;
        passfile::find_password(&contents, &host, port, REPLICATION_DATABASE, &user)
            .map(|p| (p, path))
    })
    .await
    .ok()
    .flatten()
}

/// The database of a physical replication connection, whatever the conninfo's `dbname` says:
/// PostgreSQL's walreceiver passes `dbname=replication` after the conninfo, so that it wins,
/// since the server ignores the database in replication mode and the password file is
/// matched against this name.
const REPLICATION_DATABASE: &str = "replication";

/// What the walreceiver sends in its startup packet, as libpq's walreceiver does. The user is
/// the conninfo's (which `PGUSER` may have given, [`ConnInfo::parse_with_env`]), else the login
/// name (`USER`); an empty password counts as none, so that the password file is read.
fn startup_config(info: &ConnInfo, application_name: &str) -> StartupConfig {
    let user = info
        .user
        .clone()
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "postgres".to_string());
    let mut config = StartupConfig {
        user,
        password: info.password.clone().filter(|p| !p.is_empty()),
        params: Vec::new(),
        sslmode: info.sslmode,
        channel_binding: info.channel_binding,
    }
    .param("database", REPLICATION_DATABASE)
    .param("replication", "true")
    .param("application_name", application_name)
    // This walreceiver cuts back at stream start what its upstream never acknowledged, so a
    // walserver upstream with the overlapped commit may send it WAL before its own fdatasync
    // ends; PostgreSQL keeps the custom parameter as a placeholder and ignores it.
    .param(protocol_codec::ACCEPTS_UNFLUSHED_PARAM, "on");
    if let Some(o) = &info.options {
        config = config.param("options", o);
    }
    config
}

/// One connection attempt: the socket and TLS I/O around [`ClientHandshake`].
async fn attempt(
    info: &ConnInfo,
    target: &Target,
    startup: &StartupConfig,
    encryption: Encryption,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<Connection, ReceiverError> {
    let host = target.host.as_str();
    let connect_err = |e: std::io::Error| ReceiverError::Connect {
        addr: target.to_string(),
        message: e.to_string(),
    };
    // `hostaddr` is connected to as it is; the host's name is then for TLS and the password
    // file only, as in libpq.
    let stream = match target.addr {
        Some(ip) => TcpStream::connect(SocketAddr::new(ip, target.port)).await,
        None => TcpStream::connect((host, target.port)).await,
    }
    .map_err(connect_err)?;
    let _ = stream.set_nodelay(true);
    set_keepalives(&stream, &info.keepalives).map_err(|e| ReceiverError::Connect {
        addr: target.to_string(),
        message: e,
    })?;
    let peer = stream.peer_addr().map_err(connect_err)?;
    let fd = stream.as_raw_fd();
    let mut io: Box<dyn Io> = Box::new(stream);
    let mut handshake = ClientHandshake::new(startup.clone(), encryption);
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
                    target: target.clone(),
                    fd: Some(fd),
                })
            }
        };
        step = next.map_err(startup_error)?;
    }
}

/// Sets the connection's TCP keepalives as libpq does: `SO_KEEPALIVE` unless `keepalives=0`,
/// then each timing the connection string gives. A standby then learns that an upstream's
/// host has gone (powered off, cut off) from the kernel, where a socket would otherwise wait
/// on a connection no one will ever answer until `wal_receiver_timeout`. A value the kernel
/// refuses fails the connection with libpq's words.
pub(crate) fn set_keepalives(socket: &impl AsRawFd, k: &Keepalives) -> Result<(), String> {
    if !k.on {
        return Ok(());
    }
    let failed = |what: &str, e: std::io::Error| format!("setsockopt({what}) failed: {e}");
    set_int_option(socket, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)
        .map_err(|e| failed("SO_KEEPALIVE", e))?;
    set_keepalive_timing(socket, k.timing.values()).map_err(|(what, e)| failed(what, e))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn get(socket: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        actor_util::get_int_option(socket, level, name).expect("getsockopt")
    }

    fn socket() -> std::net::TcpStream {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap()
    }

    #[test]
    fn keepalives_reach_the_socket_as_the_connection_string_says() {
        let info = ConnInfo::parse(
            "keepalives_idle=7 keepalives_interval=3 keepalives_count=4 tcp_user_timeout=9000",
        )
        .unwrap();
        let s = socket();
        set_keepalives(&s, &info.keepalives).unwrap();
        assert_eq!(get(&s, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(&s, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 7);
        assert_eq!(get(&s, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), 3);
        assert_eq!(get(&s, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), 4);
        assert_eq!(get(&s, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 9000);

        // On by default, with the system's timing; off with keepalives=0.
        let s = socket();
        let idle = get(&s, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE);
        set_keepalives(&s, &ConnInfo::default().keepalives).unwrap();
        assert_eq!(get(&s, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(&s, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), idle);
        let s = socket();
        set_keepalives(&s, &ConnInfo::parse("keepalives=0").unwrap().keepalives).unwrap();
        assert_eq!(get(&s, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);

        // A value the kernel refuses fails the connection, naming the option.
        let e = set_keepalives(
            &socket(),
            &ConnInfo::parse("keepalives_idle=0").unwrap().keepalives,
        )
        .unwrap_err();
        assert!(e.starts_with("setsockopt(TCP_KEEPIDLE) failed: "), "{e}");
    }
}
