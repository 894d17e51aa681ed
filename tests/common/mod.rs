//! Helpers shared by walserver's integration tests: a node running in-process on its own
//! actix System thread, and a small blocking replication-protocol client over a real socket.
#![allow(dead_code)]

pub mod cluster;
pub mod receivewal;
pub mod relay;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_codec::messages::TransactionStatus;
use protocol_codec::{BackendMessage, FrontendMessage, StartupPacket};
use repl_client::{ConnectOptions, ReplClient};
use supervisor_actor::{Node, ShutdownNode};
use wal_storage::{Lsn, Wal};
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
        fault_harness::node::wait_for_dir_lock(&data, DEADLINE).expect("the data directory's lock");
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

/// A blocking client of the replication protocol on a real socket: repl-client's
/// `ReplClient`, with the tests' deadline as its read timeout and panics for failures a test
/// does not expect.
pub struct PgConn {
    pub client: ReplClient,
    /// A second handle on the client's socket, for socket options (they are the socket's,
    /// whichever handle sets them).
    pub stream: TcpStream,
}

impl PgConn {
    /// Connects and authenticates (`replication=true`); an ErrorResponse is returned as the
    /// error.
    pub fn connect(
        addr: SocketAddr,
        user: &str,
        password: Option<&str>,
    ) -> Result<PgConn, BackendMessage> {
        PgConn::connect_as(addr, user, password, "testclient")
    }

    /// [`PgConn::connect`] with `application_name`.
    pub fn connect_as(
        addr: SocketAddr,
        user: &str,
        password: Option<&str>,
        application_name: &str,
    ) -> Result<PgConn, BackendMessage> {
        let options = ConnectOptions::new(user, password, application_name).read_timeout(DEADLINE);
        match ReplClient::connect_with(addr, &options) {
            Ok(c) => Ok(PgConn::wrap(c)),
            Err(repl_client::Error::Server(e)) => Err(BackendMessage::ErrorResponse(e)),
            Err(e) => panic!("connect: {e}"),
        }
    }

    /// A connected socket, nothing sent.
    pub fn raw(addr: SocketAddr) -> PgConn {
        let c = ReplClient::raw(addr).expect("connect");
        c.set_read_timeout(Some(DEADLINE)).unwrap();
        PgConn::wrap(c)
    }

    pub fn wrap(client: ReplClient) -> PgConn {
        let stream = client.tcp().try_clone().expect("a second socket handle");
        PgConn { client, stream }
    }

    pub fn send_startup(&mut self, p: StartupPacket) {
        self.client.send_startup(&p).unwrap();
    }

    pub fn send(&mut self, m: FrontendMessage) {
        self.client.send(&m).unwrap();
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.client.send_raw(bytes).unwrap();
    }

    /// The next message; panics at the deadline.
    pub fn recv(&mut self) -> BackendMessage {
        self.try_recv()
            .unwrap_or_else(|e| panic!("no message: {e}"))
    }

    /// The next message, or why there is none (closed, timed out).
    pub fn try_recv(&mut self) -> Result<BackendMessage, String> {
        self.client.recv().map_err(|e| e.to_string())
    }

    /// True once the server has closed the connection (reads end), within the deadline.
    pub fn closed(&mut self) -> bool {
        self.client.wait_closed().is_ok()
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
        self.client
            .start_replication(start, None)
            .unwrap_or_else(|e| panic!("START_REPLICATION failed: {e}"));
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
        self.client
            .standby_status(write, flush, Lsn::INVALID, reply_requested)
            .unwrap();
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

/// Waits for `cond` to hold, checking it every 10 ms, and fails the test naming `what` after
/// [`DEADLINE`]. Polling is the fallback for facts with no event a test can wait on (a file
/// another process writes, a row of `/status`); the interval is short and the deadline
/// bounds it.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads a file as root or through the postgres user, whichever works.
pub fn read_file(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// The metric names the README's "Metrics" table lists, one per backquoted name in the
/// first column of each row.
pub fn readme_metric_names() -> std::collections::BTreeSet<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = readme
        .split("\n## Metrics\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the README has a Metrics section");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .flat_map(|row| {
            let first_cell = row.split(" |").next().unwrap_or_default();
            first_cell
                .split(", ")
                .map(|n| n.trim_matches('`').to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The value of one sample of a `/metrics` text, by its name and labels as written
/// (`name{a="x"}`); `None` if the scrape has no such sample.
pub fn metric_value(text: &str, key: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The families of a `/metrics` text, each by the name its samples carry (a counter's with
/// `_total`), as the README's table names them.
pub fn metric_families(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| match kind {
            "counter" => format!("{name}_total"),
            "info" => format!("{name}_info"),
            _ => name.to_string(),
        })
        .collect()
}
