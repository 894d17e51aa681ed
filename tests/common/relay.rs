//! A TCP relay on loopback that a test controls: it forwards each connection it accepts to
//! an upstream set (or changed) at any time, holds new connections while its gate is closed,
//! cuts every live connection on demand, and tells the test the instant it connected each
//! one upstream. Tests put it where a node's upstream (or etcd) is, to take that peer away and
//! give it back at a moment they choose and observe.

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Shared {
    upstream: Mutex<Option<SocketAddr>>,
    /// Whether new connections may go upstream; waited on with `opened`.
    open: Mutex<bool>,
    opened: Condvar,
    /// Both sides of every live connection, for `cut`.
    live: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
}

pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    forwarded: mpsc::Receiver<Instant>,
}

impl Relay {
    /// A relay listening on `listen` (`127.0.0.1:0` for any port), its gate open, with no
    /// upstream yet (a connection accepted meanwhile is closed).
    pub fn start(listen: &str) -> Relay {
        let listener = TcpListener::bind(listen).expect("bind the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let shared = Arc::new(Shared {
            open: Mutex::new(true),
            ..Shared::default()
        });
        let (tx, forwarded) = mpsc::channel();
        let s = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let s = s.clone();
                let tx = tx.clone();
                std::thread::spawn(move || forward(&s, client, &tx));
            }
        });
        Relay {
            addr,
            shared,
            forwarded,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_upstream(&self, upstream: SocketAddr) {
        *lock(&self.shared.upstream) = Some(upstream);
    }

    /// New connections wait (accepted, not yet forwarded) until [`Relay::open`].
    pub fn close(&self) {
        *lock(&self.shared.open) = false;
    }

    /// Lets the connections waiting and all new ones go upstream.
    pub fn open(&self) {
        *lock(&self.shared.open) = true;
        self.shared.opened.notify_all();
    }

    /// Ends every live connection, both ways.
    pub fn cut(&self) {
        for s in lock(&self.shared.live).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// The instant the next connection (after those already reported) was connected
    /// upstream, waiting at most `within`.
    pub fn next_forwarded(&self, within: Duration) -> Instant {
        self.forwarded
            .recv_timeout(within)
            .unwrap_or_else(|_| panic!("no connection forwarded within {within:?}"))
    }

    /// Forgets the connections forwarded so far.
    pub fn drain_forwarded(&self) {
        while self.forwarded.try_recv().is_ok() {}
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.open();
        self.cut();
        // Wakes the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One connection: wait for the gate, connect upstream, copy both ways until either ends.
fn forward(s: &Shared, client: TcpStream, forwarded: &mpsc::Sender<Instant>) {
    {
        let mut open = lock(&s.open);
        while !*open {
            open = s.opened.wait(open).unwrap_or_else(|p| p.into_inner());
        }
    }
    if s.stop.load(Ordering::SeqCst) {
        return;
    }
    let upstream = *lock(&s.upstream);
    let Some(server) = upstream.and_then(|u| TcpStream::connect(u).ok()) else {
        return;
    };
    let _ = forwarded.send(Instant::now());
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    {
        let mut live = lock(&s.live);
        for stream in [&client, &server] {
            if let Ok(clone) = stream.try_clone() {
                live.push(clone);
            }
        }
    }
    let up = std::thread::spawn(move || copy(client, s2));
    copy(server, c2);
    let _ = up.join();
}

/// Copies `from` into `to` until `from` ends or fails (a cut), then ends both.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
