//! Helpers for tests of several nodes: standbys made as `walserver init --standby` makes them,
//! waiting for WAL positions (an event: storage's watch channel) and for walreceiver status
//! (polled: the supervisor tells no one outside), comparing WAL across nodes timeline by
//! timeline, and restarting a node on its data directory and port.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use supervisor_actor::{
    AppendError, AppendRecords, Appended, GetNodeStatus, NodeStatus, Promote, PromoteError,
    Promoted, Reconfigure, ShutdownNode, WalReceiverInfo,
};
use wal_storage::{segment_file_name, Lsn, TimelineId, WalPosition};
use walreceiver_actor::ReceiverState;
use walserver_node::config::Sources;
use walserver_node::node::Reloader;

use fault_harness::node::conninfo_at;

use super::{TestNode, DEADLINE};

/// How a node is taken down before a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Down {
    /// `ShutdownNode { immediate: true }`: every walsender ends with FATAL 57P01.
    Immediate,
    /// The node's actix System is stopped: its sockets close without a word, as when the
    /// process is killed.
    Kill,
}

impl TestNode {
    /// A new standby of the node listening on `upstream`, made with `init_standby` (which
    /// writes `standby.signal`) and started with `extra` TOML lines.
    pub fn standby_of(upstream: SocketAddr, name: &str, extra: &str) -> TestNode {
        TestNode::standby_from(&conninfo_at(upstream, name), extra)
    }

    /// A new standby whose `primary_conninfo` is `conninfo`, made with `init_standby` and
    /// started with `extra` TOML lines.
    pub fn standby_from(conninfo: &str, extra: &str) -> TestNode {
        let dir = tempfile::tempdir().expect("tempdir");
        walserver_node::init::init_standby(&dir.path().join("data"), conninfo, None, None)
            .unwrap_or_else(|e| panic!("init_standby from {conninfo:?}: {e:#}"));
        TestNode::start_in(dir, extra)
    }

    /// The `primary_conninfo` of this node, for its standbys.
    pub fn conninfo(&self, application_name: &str) -> String {
        conninfo_at(self.addr(), application_name)
    }

    /// The node's status, as `/status` shows it, asked of the supervisor.
    pub fn status(&self) -> NodeStatus {
        futures_executor::block_on(self.node.supervisor.send(GetNodeStatus))
            .expect("supervisor")
            .expect("status")
    }

    /// The application_name of every walsender connection, as pg_stat_replication lists them.
    pub fn application_names(&self) -> Vec<String> {
        self.status()
            .replication
            .iter()
            .map(|r| r.application_name.clone())
            .collect()
    }

    /// The walreceiver part of the status; panics on a primary.
    pub fn receiver(&self) -> WalReceiverInfo {
        self.status()
            .wal_receiver
            .expect("this node has no walreceiver: it is a primary")
    }

    /// Waits until the walreceiver streams and `also` holds of its status; returns the status.
    /// The supervisor reports streaming to no one outside, so this polls its status (a cheap
    /// message) every millisecond, up to the deadline.
    pub fn wait_receiver(
        &self,
        what: &str,
        also: impl Fn(&WalReceiverInfo) -> bool,
    ) -> WalReceiverInfo {
        let start = Instant::now();
        loop {
            let info = self.receiver();
            let streaming = info
                .status
                .as_ref()
                .is_some_and(|s| s.status == ReceiverState::Streaming)
                && info.pid.is_some();
            if streaming && also(&info) {
                return info;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {what}; the walreceiver: {}",
                serde_json::to_string(&info).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until storage is durable up to `lsn` on timeline `tli` (or has moved on to a
    /// later timeline), woken by storage's own position channel.
    pub fn wait_flushed(&self, tli: TimelineId, lsn: Lsn) -> WalPosition {
        let mut rx = self.wal().subscribe();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let reached = rt.block_on(async {
            tokio::time::timeout(
                DEADLINE,
                rx.wait_for(|p| p.timeline > tli || (p.timeline == tli && p.flushed >= lsn)),
            )
            .await
            .map(|r| r.map(|p| *p))
        });
        match reached {
            Ok(Ok(p)) => p,
            _ => panic!(
                "{} did not reach {lsn} on timeline {tli}: it is at {:?}; status: {}",
                self.data_dir().display(),
                self.wal().position(),
                serde_json::to_string(&self.status()).unwrap_or_default()
            ),
        }
    }

    /// Runs `f` while the node's System thread, where the supervisor runs, is held busy:
    /// messages sent to the supervisor meanwhile wait in its mailbox, in order, and are
    /// handled once `f` returns.
    pub fn with_supervisor_held(&self, f: impl FnOnce()) {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let system = self.system.as_ref().expect("the node runs");
        assert!(system.arbiter().spawn_fn(move || {
            let _ = held_tx.send(());
            let _ = release_rx.recv_timeout(DEADLINE);
        }));
        held_rx
            .recv_timeout(DEADLINE)
            .expect("the System thread to be held");
        f();
        let _ = release_tx.send(());
    }

    /// Appends through the supervisor, as `POST /wal` and embedding applications do.
    pub fn append_records(&self, n: usize, size: usize, seed: u8) -> Result<Appended, AppendError> {
        let records = (0..n)
            .map(|i| Bytes::from(vec![seed.wrapping_add(i as u8); size]))
            .collect();
        futures_executor::block_on(self.node.supervisor.send(AppendRecords {
            records,
            durability: None,
        }))
        .expect("supervisor")
    }

    pub fn promote(&self) -> Result<Promoted, PromoteError> {
        futures_executor::block_on(self.node.supervisor.send(Promote)).expect("supervisor")
    }

    /// The extra TOML this node was started with (what follows the lines the harness writes).
    pub fn extra_toml(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("walserver.toml"))
            .expect("read the node's configuration");
        text.lines().skip(3).map(|l| format!("{l}\n")).collect()
    }

    /// Takes the node down as `how` says and starts a new node on the same data directory,
    /// replication port and configuration. Returns it and when it began accepting (its
    /// listener is bound before the start returns, so this is a late bound).
    pub fn restart(self, how: Down) -> (TestNode, Instant) {
        let extra = self.extra_toml();
        let dir = self.down(how);
        let listen = format!("127.0.0.1:{}", self_port(&dir));
        let node = TestNode::start_listening(dir, &listen, &extra);
        let accepting = Instant::now();
        (node, accepting)
    }

    /// Takes the node down as `how` says and hands back its directory, with the port it
    /// listened on remembered in `DIR/port`.
    pub fn down(self, how: Down) -> tempfile::TempDir {
        let port = self.addr().port();
        if how == Down::Immediate {
            futures_executor::block_on(self.node.supervisor.send(ShutdownNode { immediate: true }))
                .expect("shutdown");
        }
        let dir = self.stop();
        wait_unlocked(&dir.path().join("data"));
        std::fs::write(dir.path().join("port"), port.to_string()).expect("remember the port");
        dir
    }

    /// Re-reads the node's configuration file after replacing its extra lines with `extra`,
    /// and applies it as `POST /reload` and SIGHUP do (the binary's Reloader).
    pub fn reload_with(&self, extra: &str) {
        let reconfigure = self.reconfigure_with(extra);
        futures_executor::block_on(self.node.supervisor.send(reconfigure)).expect("supervisor");
    }

    /// What a reload with `extra` as the configuration's extra lines sends the supervisor.
    pub fn reconfigure_with(&self, extra: &str) -> Reconfigure {
        let path = self.dir.path().join("walserver.toml");
        let text = std::fs::read_to_string(&path).expect("read the node's configuration");
        let head: String = text.lines().take(3).map(|l| format!("{l}\n")).collect();
        std::fs::write(&path, format!("{head}{extra}")).expect("write the node's configuration");
        let reloader = Reloader {
            sources: Sources {
                file: Some(path),
                overrides: vec![],
                env: Some(Default::default()),
            },
            data_dir: self.data_dir(),
            running: self.settings.clone(),
        };
        reloader.reconfigure().expect("reload").0
    }
}

/// Waits until no thread of a stopped node holds its data directory's lock. The System's
/// arbiters (the admin API's worker among them, which holds a `Node`) end after the System's
/// own thread, and nothing reports when but the lock's release itself: a blocking lock on a
/// thread of its own, so that the deadline bounds the wait, is woken by it and lets go at
/// once for the next node.
fn wait_unlocked(data_dir: &Path) {
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(data_dir.join("walserver.lock"))
        .expect("open the data directory's lock file");
    let (taken, released) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = lock.lock();
        // Closing the file lets the lock go before anyone hears it was taken.
        drop(lock);
        let _ = taken.send(result);
    });
    match released.recv_timeout(DEADLINE) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("locking {}: {e}", data_dir.display()),
        Err(_) => panic!("the stopped node still holds {}", data_dir.display()),
    }
}

fn self_port(dir: &tempfile::TempDir) -> u16 {
    std::fs::read_to_string(dir.path().join("port"))
        .expect("the port the node listened on")
        .trim()
        .parse()
        .expect("a port number")
}

/// Asserts that two nodes hold the same bytes of timeline `tli` in `[start, end)`.
pub fn assert_same_wal(a: &TestNode, b: &TestNode, tli: TimelineId, start: Lsn, end: Lsn) {
    let mut at = start;
    while at < end {
        let want = ((end.0 - at.0) as usize).min(1 << 20);
        let x = a.wal().read(tli, at, want).expect("read the first node");
        assert!(!x.is_empty(), "nothing to read on timeline {tli} at {at}");
        let y = b
            .wal()
            .read(tli, at, x.len())
            .expect("read the second node");
        assert_eq!(x.len(), y.len(), "short read on timeline {tli} at {at}");
        if let Some(i) = x.iter().zip(y.iter()).position(|(p, q)| p != q) {
            panic!("WAL of timeline {tli} differs at {}", at + i as u64);
        }
        at = at + x.len() as u64;
    }
}

/// Asserts that every segment file of timeline `tli` that lies wholly in `[start, end)` is
/// byte-identical on both nodes, and returns how many were compared.
pub fn assert_same_segments(
    a: &TestNode,
    b: &TestNode,
    tli: TimelineId,
    start: Lsn,
    end: Lsn,
) -> usize {
    let seg = a.wal().segment_size();
    let first = start.0.div_ceil(seg);
    let mut compared = 0;
    for segno in first.. {
        if (segno + 1) * seg > end.0 {
            break;
        }
        let name = segment_file_name(tli, segno, seg);
        let x = read_segment(&a.data_dir(), &name);
        let y = read_segment(&b.data_dir(), &name);
        assert_eq!(x.len(), y.len(), "{name}: sizes differ");
        if let Some(i) = x.iter().zip(y.iter()).position(|(p, q)| p != q) {
            panic!("segment {name} differs at offset {i:#x}");
        }
        compared += 1;
    }
    compared
}

fn read_segment(data_dir: &Path, name: &str) -> Vec<u8> {
    let path = data_dir.join("pg_wal").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Asserts that both nodes store the same history file of `tli`.
pub fn assert_same_history(a: &TestNode, b: &TestNode, tli: TimelineId) {
    let x = a.wal().history_file(tli).expect("read history");
    let y = b.wal().history_file(tli).expect("read history");
    assert!(x.is_some(), "no history file of timeline {tli}");
    assert_eq!(x, y, "history files of timeline {tli} differ");
}

impl super::PgConn {
    /// Connects and logs in as `user` without a password (`replication=true`); `None` if the
    /// server refuses the connection or the login, or closes it (a server still starting
    /// answers FATAL 57P03): what `pg_isready` tells as "accepting connections".
    pub fn try_connect(addr: SocketAddr, user: &str) -> Option<super::PgConn> {
        let options = repl_client::ConnectOptions::new(user, None, "probe").read_timeout(DEADLINE);
        repl_client::ReplClient::connect_with(addr, &options)
            .ok()
            .map(super::PgConn::wrap)
    }
}

/// POSTs `body` to the admin API at `http` and returns the status code and the JSON answer.
pub fn http_post(http: SocketAddr, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
    let url = format!("http://{http}{path}");
    let req = ureq::post(&url)
        .header("Content-Type", "application/octet-stream")
        .config()
        .http_status_as_error(false)
        .build();
    let mut resp = req.send(body).expect("admin API");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().expect("answer");
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, json)
}

/// GETs `path` from the admin API at `http`, whatever the status: the status code and the
/// body as text.
pub fn http_get_any(http: SocketAddr, path: &str) -> (u16, String) {
    let mut resp = ureq::get(&format!("http://{http}{path}"))
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .expect("admin API");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().expect("answer");
    (status, text)
}
