//! A TCP proxy that delays every chunk it forwards by a delay plus or minus a jitter, keeping
//! the order of the bytes: this kernel's tc has no netem, so delay lives in user space. The
//! proxy listens on a host's loopback and connects out from that host, so a node there whose
//! upstream is the proxy's address reaches its upstream over the test network, late.
//!
//! Each direction of each connection is two threads: one reads and stamps each chunk with the
//! time it may leave (never earlier than the chunk before it), the other sleeps until then and
//! writes. The sleep is the fault itself, not a wait for an event.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::netns::Host;
use crate::{Error, Result};

/// Delay and jitter, changeable while the proxy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delay {
    pub delay: Duration,
    /// Each chunk's delay is uniform in `delay ± jitter` (at least zero).
    pub jitter: Duration,
}

struct Shared {
    delay: Mutex<Delay>,
    stop: AtomicBool,
    /// Every socket of every connection, to shut down when the proxy stops.
    sockets: Mutex<Vec<TcpStream>>,
    rng: AtomicU64,
    /// Bytes forwarded, both directions, for tests that want to see traffic pass.
    forwarded: AtomicU64,
}

impl Shared {
    /// A delay for the next chunk, from a xorshift generator (quality is no concern here).
    fn next_delay(&self) -> Duration {
        let d = *self.delay.lock().expect("proxy delay");
        if d.jitter.is_zero() {
            return d.delay;
        }
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        let span = d.jitter.as_micros() as u64 * 2 + 1;
        let offset = (x % span) as i64 - d.jitter.as_micros() as i64;
        let micros = (d.delay.as_micros() as i64 + offset).max(0);
        Duration::from_micros(micros as u64)
    }
}

/// A running delay proxy; stops, closing every connection, when dropped.
pub struct DelayProxy {
    addr: SocketAddr,
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl DelayProxy {
    /// Starts a proxy on `host`'s loopback forwarding to `upstream` (reached from `host`).
    pub fn start(host: &Host, upstream: SocketAddr, delay: Delay) -> Result<DelayProxy> {
        let listener = host
            .run(|| TcpListener::bind("127.0.0.1:0"))?
            .map_err(|e| Error::Io {
                what: "bind the proxy".into(),
                source: e,
            })?;
        let addr = listener.local_addr().map_err(|e| Error::Io {
            what: "the proxy's address".into(),
            source: e,
        })?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15)
            | 1;
        let shared = Arc::new(Shared {
            delay: Mutex::new(delay),
            stop: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
            rng: AtomicU64::new(seed),
            forwarded: AtomicU64::new(0),
        });
        let accept = listener.try_clone().map_err(|e| Error::Io {
            what: "clone the proxy's listener".into(),
            source: e,
        })?;
        let s = shared.clone();
        host.spawn("delay-proxy", move || accept_loop(accept, upstream, s))?;
        Ok(DelayProxy {
            addr,
            listener,
            shared,
        })
    }

    /// The address to connect to, on the host's loopback.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes the delay of chunks read from now on.
    pub fn set_delay(&self, delay: Delay) {
        *self.shared.delay.lock().expect("proxy delay") = delay;
    }

    /// Bytes forwarded so far, both directions together.
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // shutdown(2) on a listening socket wakes a thread blocked in accept (Linux).
        // SAFETY: shutdown on the listener's own open descriptor.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for s in self.shared.sockets.lock().expect("proxy sockets").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = conn else {
            // Accept errors other than the stop (EMFILE and the like) end nothing: back off
            // briefly so that a persistent one does not spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let s = shared.clone();
        // The connection's threads inherit this thread's namespace.
        let _ = std::thread::Builder::new()
            .name("delay-proxy-conn".into())
            .spawn(move || connect(client, upstream, s));
    }
}

fn connect(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    // A bound on connecting to the upstream: the proxy must not hold a connection the test
    // network cannot carry. Ten seconds is a guess, longer than any fault test's timeouts.
    let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(10)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let handles = (
        client.try_clone(),
        server.try_clone(),
        client.try_clone(),
        server.try_clone(),
    );
    let (Ok(client_write), Ok(server_write), Ok(client_kept), Ok(server_kept)) = handles else {
        return;
    };
    {
        let mut socks = shared.sockets.lock().expect("proxy sockets");
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        socks.push(client_kept);
        socks.push(server_kept);
    }
    pump(client, server_write, shared.clone());
    pump(server, client_write, shared);
}

/// Forwards `from` to `to` with the proxy's delay, on two threads.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let s = shared.clone();
    let _ = std::thread::Builder::new()
        .name("delay-proxy-read".into())
        .spawn(move || {
            let mut last = Instant::now();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let due = (Instant::now() + s.next_delay()).max(last);
                        last = due;
                        if tx.send((due, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                }
            }
            // Dropping `tx` tells the writer to pass the end on after the last chunk.
        });
    let _ = std::thread::Builder::new()
        .name("delay-proxy-write".into())
        .spawn(move || {
            while let Ok((due, chunk)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                // Counted before the write, so that a reader who has the bytes sees them
                // counted.
                shared
                    .forwarded
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                if to.write_all(&chunk).is_err() {
                    let _ = to.shutdown(Shutdown::Both);
                    return;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
}
