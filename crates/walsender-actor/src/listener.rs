//! The replication listener: accepts TCP connections and starts one [`WalSender`] for each,
//! spreading them over a few arbiters (threads) so that many standbys use every core.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::net::{TcpListener, TcpStream};

use crate::messages::*;
use crate::shared::Shared;
use crate::WalSender;

pub struct Listener {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    arbiters: Vec<ArbiterHandle>,
    next_arbiter: usize,
    next_pid: u32,
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
        let pid = self.next_pid;
        self.next_pid = self.next_pid.wrapping_add(1).max(1);
        let shared = self.shared.clone();
        // The walsender announces itself to the registry from its own context, so its later
        // messages (registration, close) can never overtake that announcement.
        if self.arbiters.is_empty() {
            WalSender::new(pid, Some(stream), peer, shared).start();
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
                Ok(stream) => WalSender::new(pid, Some(stream), peer, shared),
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
}
