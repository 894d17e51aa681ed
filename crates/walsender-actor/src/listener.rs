//! The replication listener: accepts TCP connections and starts one [`WalSender`] for each,
//! spreading them over a few arbiters (threads) so that many standbys use every core.

use std::net::SocketAddr;
use std::sync::Arc;

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
struct Accepted(std::io::Result<(TcpStream, SocketAddr)>);

impl Listener {
    /// Starts accepting on `listener`. With no arbiters, connections live on the caller's.
    pub fn start(
        listener: TcpListener,
        shared: Arc<Shared>,
        arbiters: Vec<ArbiterHandle>,
    ) -> std::io::Result<Addr<Listener>> {
        let local_addr = listener.local_addr()?;
        Ok(Listener::create(move |ctx| {
            let accepts = futures_util::stream::unfold(listener, |l| async move {
                let r = l.accept().await;
                Some((Accepted(r), l))
            });
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
        let (stream, peer) = match msg.0 {
            Ok(x) => x,
            Err(e) => {
                // Running out of file descriptors and similar: the next accept may succeed.
                tracing::warn!("accept failed: {e}");
                return;
            }
        };
        let pid = self.next_pid;
        self.next_pid = self.next_pid.wrapping_add(1).max(1);
        let shared = self.shared.clone();
        // The walsender tells the registry of itself when it starts (ConnectionOpened), so that
        // its later events (authenticated, closed) cannot overtake that news.
        if self.arbiters.is_empty() {
            WalSender::new(pid, stream, peer, shared).start();
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
            WalSender::start_in_arbiter(arbiter, move |_| {
                let stream = TcpStream::from_std(std_stream)
                    .expect("a connected socket registers with the arbiter's runtime");
                WalSender::new(pid, stream, peer, shared)
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
