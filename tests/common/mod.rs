//! Helpers shared by walserver's integration tests: a node running in-process on its own
//! actix System thread, and a small blocking replication-protocol client over a real socket.
#![allow(dead_code)]

pub mod cluster;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use protocol_codec::auth::ClientAuthenticator;
use protocol_codec::messages::{StandbyStatusUpdate, TransactionStatus};
use protocol_codec::{BackendMessage, ClientCodec, FrontendMessage, StartupCodec, StartupPacket};
use supervisor_actor::{Node, ShutdownNode};
use tokio_util::codec::{Decoder, Encoder};
use wal_storage::{Lsn, PgTimestamp, Wal};
use walserver_node::config::{Settings, Sources};

/// How long a test waits for something that should happen at once before it fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A walserver node running in this process, configured from TOML text like the binary.
pub struct TestNode {
    pub dir: tempfile::TempDir,
    pub node: Node,
    pub settings: Settings,
    pub http_addr: SocketAddr,
    system: Option<actix_rt::System>,
    thread: Option<JoinHandle<()>>,
}

impl TestNode {
    /// A new primary with `extra` TOML lines (listen and http_listen are chosen here).
    pub fn primary(extra: &str) -> TestNode {
        TestNode::primary_with_segments(1 << 20, extra)
    }

    /// A new primary whose WAL segments are `segment_size` bytes.
    pub fn primary_with_segments(segment_size: u64, extra: &str) -> TestNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        walserver_node::init::init_primary(&data, segment_size).expect("init");
        TestNode::start_in(dir, extra)
    }

    /// Starts a node on an existing data directory `DIR/data`.
    pub fn start_in(dir: tempfile::TempDir, extra: &str) -> TestNode {
        TestNode::start_listening(dir, "127.0.0.1:0", extra)
    }

    /// Starts a node on `DIR/data` whose replication port listens on `listen`.
    pub fn start_listening(dir: tempfile::TempDir, listen: &str, extra: &str) -> TestNode {
        let data = dir.path().join("data");
        let toml = format!(
            "data_dir = {:?}\nlisten = {listen:?}\nhttp_listen = \"127.0.0.1:0\"\n{extra}",
            data.display().to_string()
        );
        let path = dir.path().join("walserver.toml");
        std::fs::write(&path, toml).expect("write config");
        let settings = Settings::load(&Sources {
            file: Some(path),
            overrides: vec![],
            env: Some(Default::default()),
        })
        .expect("config");
        let start = walserver_node::start_node(&settings, &data, |cfg| cfg.io_threads = 2)
            .expect("node config");
        let (tx, rx) = mpsc::channel();
        let s2 = settings.clone();
        let thread = std::thread::spawn(move || {
            let system = actix_rt::System::new();
            let sys = actix_rt::System::current();
            system.block_on(async move {
                let node = start.await.expect("node start");
                let http = walserver::http::serve(&s2, "127.0.0.1:0".parse().unwrap(), &node, None)
                    .expect("http");
                tx.send((node, http, sys)).unwrap();
            });
            system.run().ok();
        });
        let (node, http_addr, system) = rx.recv_timeout(DEADLINE).expect("node did not start");
        TestNode {
            dir,
            node,
            settings,
            http_addr,
            system: Some(system),
            thread: Some(thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.node.listen_addr
    }

    pub fn wal(&self) -> &Wal {
        &self.node.wal
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Appends `n` records of `size` bytes (content derived from `seed`); returns the end.
    pub fn append(&self, n: usize, size: usize, seed: u8) -> Lsn {
        let payloads = (0..n)
            .map(|i| Bytes::from(vec![seed.wrapping_add(i as u8); size]))
            .collect();
        let ends = self
            .wal()
            .append(payloads)
            .expect("append")
            .wait()
            .expect("durable");
        *ends.last().unwrap()
    }

    /// Asks the node to shut down and waits until it has.
    pub fn shutdown(&self, immediate: bool) {
        futures_executor::block_on(self.node.supervisor.send(ShutdownNode { immediate }))
            .expect("shutdown");
    }

    /// Sends shutdown without waiting for it to finish.
    pub fn start_shutdown(&self, immediate: bool) {
        self.node.supervisor.do_send(ShutdownNode { immediate });
    }

    pub fn http_get(&self, path: &str) -> serde_json::Value {
        walserver_node::admin::get_json(&self.http_addr.to_string(), path, None).expect("http get")
    }

    /// Stops the node's System and returns its data directory for reuse.
    pub fn stop(mut self) -> tempfile::TempDir {
        self.halt();
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }

    fn halt(&mut self) {
        if let Some(s) = self.system.take() {
            s.stop();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A blocking client of the replication protocol on a real socket.
pub struct PgConn {
    pub stream: TcpStream,
    buf: BytesMut,
}

impl PgConn {
    /// Connects and authenticates (`replication=true`).
    pub fn connect(
        addr: SocketAddr,
        user: &str,
        password: Option<&str>,
    ) -> Result<PgConn, BackendMessage> {
        let mut c = PgConn::raw(addr);
        c.send_startup(StartupPacket::startup([
            ("user", user),
            ("replication", "true"),
            ("application_name", "testclient"),
        ]));
        c.authenticate(user, password)?;
        Ok(c)
    }

    /// A connected socket, nothing sent.
    pub fn raw(addr: SocketAddr) -> PgConn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        stream.set_nodelay(true).unwrap();
        PgConn {
            stream,
            buf: BytesMut::new(),
        }
    }

    pub fn send_startup(&mut self, p: StartupPacket) {
        let mut out = BytesMut::new();
        StartupCodec.encode(p, &mut out).unwrap();
        self.stream.write_all(&out).unwrap();
    }

    /// Runs authentication to ReadyForQuery; an ErrorResponse is returned as the error.
    pub fn authenticate(
        &mut self,
        user: &str,
        password: Option<&str>,
    ) -> Result<(), BackendMessage> {
        let mut auth = ClientAuthenticator::new(
            user,
            password,
            protocol_codec::auth::ChannelBindingMode::NoTls,
        );
        loop {
            match self.recv() {
                BackendMessage::Authentication(req) => {
                    if let Some(reply) = auth.step(&req).expect("client auth") {
                        self.send(reply);
                    }
                }
                BackendMessage::ReadyForQuery(_) => return Ok(()),
                e @ BackendMessage::ErrorResponse(_) => return Err(e),
                _ => {}
            }
        }
    }

    pub fn send(&mut self, m: FrontendMessage) {
        let mut out = BytesMut::new();
        ClientCodec::new().encode(m, &mut out).unwrap();
        self.stream.write_all(&out).unwrap();
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// The next message; panics at the deadline.
    pub fn recv(&mut self) -> BackendMessage {
        self.try_recv()
            .unwrap_or_else(|e| panic!("no message: {e}"))
    }

    /// The next message, or why there is none (closed, timed out).
    pub fn try_recv(&mut self) -> Result<BackendMessage, String> {
        loop {
            match ClientCodec::new().decode(&mut self.buf) {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => {}
                Err(e) => return Err(format!("decode: {e}")),
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("connection closed".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }

    /// True once the server has closed the connection (reads end), within the deadline.
    pub fn closed(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Sends a query and collects the messages up to ReadyForQuery.
    pub fn query(&mut self, q: &str) -> Vec<BackendMessage> {
        self.send(FrontendMessage::Query(q.into()));
        self.until_ready()
    }

    pub fn until_ready(&mut self) -> Vec<BackendMessage> {
        let mut out = Vec::new();
        loop {
            let m = self.recv();
            let done = matches!(m, BackendMessage::ReadyForQuery(TransactionStatus::Idle));
            out.push(m);
            if done {
                return out;
            }
        }
    }

    /// Starts streaming at `start` and returns once CopyBothResponse arrived.
    pub fn start_replication(&mut self, start: Lsn) {
        self.send(FrontendMessage::Query(format!("START_REPLICATION {start}")));
        loop {
            match self.recv() {
                BackendMessage::CopyBothResponse => return,
                BackendMessage::ErrorResponse(e) => panic!("START_REPLICATION failed: {e:?}"),
                _ => {}
            }
        }
    }

    /// Receives XLogData until `end`, checking contiguity; returns the bytes.
    pub fn receive_until(&mut self, start: Lsn, end: Lsn) -> Vec<u8> {
        let mut data = Vec::new();
        let mut at = start;
        while at < end {
            match self.recv() {
                BackendMessage::XLogData(x) => {
                    assert_eq!(x.wal_start, at, "XLogData not contiguous");
                    at = at + x.data.len() as u64;
                    data.extend_from_slice(&x.data);
                }
                BackendMessage::PrimaryKeepalive(_) => {}
                other => panic!("unexpected message while streaming: {other:?}"),
            }
        }
        data
    }

    pub fn reply(&mut self, write: Lsn, flush: Lsn, reply_requested: bool) {
        self.send(FrontendMessage::StandbyStatusUpdate(StandbyStatusUpdate {
            write,
            flush,
            apply: Lsn::INVALID,
            send_time: PgTimestamp::now(),
            reply_requested,
        }));
    }
}

/// The SQLSTATE of an ErrorResponse.
pub fn sqlstate(m: &BackendMessage) -> String {
    match m {
        BackendMessage::ErrorResponse(f) => f.get(b'C').unwrap_or("").to_string(),
        other => panic!("expected an ErrorResponse, got {other:?}"),
    }
}

/// The message text of an ErrorResponse.
pub fn message(m: &BackendMessage) -> String {
    match m {
        BackendMessage::ErrorResponse(f) => f.message().unwrap_or("").to_string(),
        other => panic!("expected an ErrorResponse, got {other:?}"),
    }
}

/// Waits for `cond` to hold, checking each time `wake` returns (an event), up to the deadline.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    // Polling a condition in a test is the fallback for facts with no event to wait on (a
    // file written by another process); the interval is short and the deadline bounds it.
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads a file as root or through the postgres user, whichever works.
pub fn read_file(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}
