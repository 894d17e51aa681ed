//! The replication listener: accepts TCP connections and starts one [`WalSender`] for each,
//! spreading them over a few arbiters (threads) so that many standbys use every core.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::net::{TcpListener, TcpStream};

use crate::messages::*;
use crate::shared::{Authenticating, Shared};
use crate::WalSender;

pub struct Listener {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    arbiters: Vec<ArbiterHandle>,
    next_arbiter: usize,
    next_pid: u32,
    /// The system's congestion control, if the listener was given an unpaced one
    /// ([`unpace_listener`]).
    system_congestion: Option<Vec<u8>>,
    /// Connections refused since the last one let in ([`MAX_AUTHENTICATING`]).
    refused: u64,
}

/// The most connections in the startup phase at once (TLS, the startup packet,
/// authentication); the one past it gets FATAL 53300 "sorry, too many clients already" and
/// is closed at once, as PostgreSQL answers when it has as many processes as it allows. A
/// connection that says nothing holds its descriptor until `authentication_timeout`, so
/// without a bound anyone who can reach the port could take every file descriptor the
/// process may open, and storage could not open its next segment. Authenticated connections
/// are bounded by `max_wal_senders`. The number is a guess: far above what standbys starting
/// at once need, far below the usual limit of 1 024 descriptors.
pub const MAX_AUTHENTICATING: u64 = 256;

/// The FATAL a connection past [`MAX_AUTHENTICATING`] gets, as bytes, sent before anything
/// is read (the startup packet included), as PostgreSQL's postmaster does when it cannot
/// start a backend.
fn too_many_clients() -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    let fatal = protocol_codec::BackendMessage::ErrorResponse(protocol_codec::ErrorFields::fatal(
        protocol_codec::SqlState::TOO_MANY_CONNECTIONS,
        "sorry, too many clients already",
    ));
    // An ErrorResponse of a constant text always encodes.
    let _ = fatal.encode(&mut b);
    b.to_vec()
}

#[derive(Message)]
#[rtype(result = "()")]
struct Accepted {
    result: std::io::Result<(TcpStream, SocketAddr)>,
    /// After a failed accept: how long the listener waits before it accepts again.
    backoff: Option<Duration>,
}

/// The first wait after a failed accept, and the longest. An accept fails when the process or
/// the system is out of file descriptors or memory; it keeps failing until a connection
/// closes, so accepting again at once would spin and flood the log. Waiting, doubling up to a
/// second, lets the next accept succeed soon after room appears while writing at most one line a
/// second. Both numbers are guesses.
const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(1);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The wait after a failed accept, given the wait after the previous one (`None` if the accept
/// before succeeded).
fn next_accept_backoff(previous: Option<Duration>) -> Duration {
    match previous {
        None => ACCEPT_BACKOFF_FIRST,
        Some(d) => (d * 2).min(ACCEPT_BACKOFF_MAX),
    }
}

impl Listener {
    /// Starts accepting on `listener`. With no arbiters, connections live on the caller's.
    pub fn start(
        listener: TcpListener,
        shared: Arc<Shared>,
        arbiters: Vec<ArbiterHandle>,
    ) -> std::io::Result<Addr<Listener>> {
        let local_addr = listener.local_addr()?;
        let system_congestion = unpace_listener(&listener);
        Ok(Listener::create(move |ctx| {
            let accepts = futures_util::stream::unfold(
                (listener, None::<Duration>),
                |(l, backoff)| async move {
                    if let Some(wait) = backoff {
                        tokio::time::sleep(wait).await;
                    }
                    let result = l.accept().await;
                    let backoff = match result {
                        Ok(_) => None,
                        Err(_) => Some(next_accept_backoff(backoff)),
                    };
                    Some((Accepted { result, backoff }, (l, backoff)))
                },
            );
            ctx.add_message_stream(accepts);
            Listener {
                shared,
                local_addr,
                arbiters,
                next_arbiter: 0,
                next_pid: 1,
                system_congestion,
                refused: 0,
            }
        }))
    }
}

impl Actor for Listener {
    type Context = Context<Self>;
}

impl Handler<Accepted> for Listener {
    type Result = ();

    fn handle(&mut self, msg: Accepted, _: &mut Context<Self>) {
        let (stream, peer) = match msg.result {
            Ok(x) => x,
            Err(e) => {
                // Running out of file descriptors and similar: a later accept may succeed.
                let wait = msg.backoff.unwrap_or(ACCEPT_BACKOFF_FIRST);
                tracing::warn!(
                    "accepting a replication connection failed: {e}; trying again in {} ms",
                    wait.as_millis()
                );
                return;
            }
        };
        let authenticating = self.shared.metrics.authenticating();
        if authenticating >= MAX_AUTHENTICATING {
            if self.refused == 0 {
                tracing::warn!(
                    "refusing replication connections: {authenticating} are in the startup phase, the most allowed at once"
                );
            }
            self.refused += 1;
            // A new socket's send buffer is empty, so the message goes out whole or not at
            // all; either way the connection closes when `stream` drops.
            let _ = stream.try_write(&too_many_clients());
            return;
        }
        if self.refused > 0 {
            tracing::info!(
                "accepting replication connections again, after refusing {}",
                self.refused
            );
            self.refused = 0;
        }
        // Counted here, not when the walsender starts on its arbiter, so that a burst of
        // connections cannot all pass the check above before any of them is counted.
        let counted = Authenticating::start(&self.shared);
        keep_system_choice_off_host(&stream, peer, self.system_congestion.as_deref());
        // As PostgreSQL's postmaster does for every TCP connection: the kernel's keepalives
        // (at the system's timing) find a peer whose host has gone, which would otherwise
        // hold a walsender, and a max_wal_senders slot, while it waits for a command.
        if let Err(e) = actor_util::set_int_option(&stream, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)
        {
            tracing::debug!(%peer, "could not turn TCP keepalives on: {e}");
        }
        // Their timing (tcp_keepalives_*) is the handshake's to set: it keeps the socket's own
        // values for a later reload.
        let pid = self.next_pid;
        self.next_pid = self.next_pid.wrapping_add(1).max(1);
        let shared = self.shared.clone();
        // The walsender announces itself to the registry from its own context, so its later
        // messages (registration, close) can never overtake that announcement.
        if self.arbiters.is_empty() {
            WalSender::accepted(pid, Some(stream), peer, shared, Some(counted)).start();
        } else {
            let arbiter = &self.arbiters[self.next_arbiter % self.arbiters.len()];
            self.next_arbiter += 1;
            // A tokio socket belongs to the runtime that registered it; move it as a std
            // socket and register it again on the walsender's arbiter.
            let std_stream = match stream.into_std() {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("cannot hand over a connection: {e}");
                    return;
                }
            };
            WalSender::start_in_arbiter(arbiter, move |_| match TcpStream::from_std(std_stream) {
                Ok(stream) => WalSender::accepted(pid, Some(stream), peer, shared, Some(counted)),
                Err(e) => {
                    // Out of resources: the walsender stops at once and the socket closes.
                    tracing::warn!(%peer, "cannot register a connection with its arbiter: {e}");
                    WalSender::new(pid, None, peer, shared)
                }
            });
        }
    }
}

impl Handler<StopAccepting> for Listener {
    type Result = ();

    fn handle(&mut self, _: StopAccepting, ctx: &mut Context<Self>) {
        // Stopping drops the accept stream and with it the listening socket.
        ctx.stop();
    }
}

impl Handler<GetListenAddr> for Listener {
    type Result = MessageResult<GetListenAddr>;

    fn handle(&mut self, _: GetListenAddr, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.local_addr)
    }
}

/// Congestion controls that do not pace, tried in order: CUBIC, then Reno (always built in).
const UNPACED: [&[u8]; 2] = [b"cubic", b"reno"];

/// Makes connections from this host unpaced: the listening socket gets a congestion control
/// that does not pace, which accepted connections inherit from their first packet; a
/// connection from another host is given the system's choice back on accept
/// ([`keep_system_choice_off_host`]). Returns that choice if the listener's was changed.
///
/// Why: BBR, a common system default, paces every connection; when the sender outruns its
/// pacing rate it arms a timer per burst, and on a virtual machine each arming is a trip to
/// the hypervisor. A walsender sending catch-up WAL with `sendfile` outruns it all the time:
/// on a 2-CPU VM whose default was BBR, one catch-up of 1 GiB over loopback into the codec
/// client ran at 2.3-2.7 GB/s, the walsender using 0.32-0.39 ms of CPU per MB; with CUBIC on
/// both ends at 8.0-9.3 GB/s and 0.07-0.10 ms per MB. Pacing protects the queues of a network
/// path; loopback has none. It must be chosen before the connection exists: a connection
/// switched away from BBR later keeps pacing (the kernel does not undo what BBR's start set).
/// Failing to set it only costs speed.
fn unpace_listener(listener: &TcpListener) -> Option<Vec<u8>> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(listener);
    let system = congestion_control(fd)?;
    if UNPACED.contains(&system.as_slice()) {
        return None;
    }
    UNPACED
        .iter()
        .any(|name| set_congestion_control(fd, name))
        .then_some(system)
}

/// Gives a connection from another host the system's congestion control back (see
/// [`unpace_listener`]); a loopback peer keeps the unpaced one.
fn keep_system_choice_off_host(stream: &TcpStream, peer: SocketAddr, system: Option<&[u8]>) {
    let Some(system) = system else { return };
    if peer.ip().to_canonical().is_loopback() {
        return;
    }
    if !set_congestion_control(std::os::fd::AsRawFd::as_raw_fd(stream), system) {
        tracing::debug!(%peer, "could not give a remote peer the system's congestion control");
    }
}

/// Whether the socket `fd` (open, owned by the caller) took congestion control `name`.
fn set_congestion_control(fd: std::os::fd::RawFd, name: &[u8]) -> bool {
    actor_util::set_option(&fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name).is_ok()
}

/// The socket's congestion control's name, `None` if it cannot be read.
fn congestion_control(fd: std::os::fd::RawFd) -> Option<Vec<u8>> {
    let mut buf = [0u8; 16];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `fd` is an open socket its caller owns; `buf` and `len` are live and sized.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    let name = &buf[..(len as usize).min(buf.len())];
    Some(name.split(|&b| b == 0).next().unwrap_or(name).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_accepts_wait_longer_each_time_up_to_a_second() {
        let mut waits = Vec::new();
        let mut backoff = None;
        for _ in 0..14 {
            let next = next_accept_backoff(backoff);
            waits.push(next.as_millis());
            backoff = Some(next);
        }
        assert_eq!(
            waits,
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1000, 1000, 1000]
        );
        // A success in between starts the schedule again.
        assert_eq!(next_accept_backoff(None), ACCEPT_BACKOFF_FIRST);
    }

    fn name_of(fd: std::os::fd::RawFd) -> String {
        String::from_utf8(congestion_control(fd).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn loopback_peers_are_unpaced_from_their_first_packet_others_keep_the_system_choice() {
        use std::os::fd::AsRawFd;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        // Start from BBR where this kernel has it, so the change is seen whatever the default.
        let _ = set_congestion_control(listener.as_raw_fd(), b"bbr");
        let system = name_of(listener.as_raw_fd());
        let kept = unpace_listener(&listener);
        let unpaced = name_of(listener.as_raw_fd());
        assert!(unpaced == "cubic" || unpaced == "reno", "{unpaced}");
        assert_eq!(kept.is_some(), system != unpaced);
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, peer) = listener.accept().await.unwrap();
        // Born unpaced, and a loopback peer keeps it.
        assert_eq!(name_of(accepted.as_raw_fd()), unpaced);
        keep_system_choice_off_host(&accepted, peer, kept.as_deref());
        assert_eq!(name_of(accepted.as_raw_fd()), unpaced);
        // Said to come from elsewhere: the system's choice again.
        keep_system_choice_off_host(
            &accepted,
            "192.0.2.7:5000".parse().unwrap(),
            kept.as_deref(),
        );
        assert_eq!(name_of(accepted.as_raw_fd()), system);
    }
}
