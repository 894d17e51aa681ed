//! Nodes for a bench: an in-process cluster (a primary and K standbys on one actix System
//! thread, the embedding path) and a node run as a child process (`walserver run`), whose
//! CPU time and memory the kernel reports apart from the bench's own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use supervisor_actor::{Node, NodeBuilder, NodeConfig, ShutdownNode};
use wal_storage::Lsn;

use crate::config::{Settings, Sources};

/// The application_name of standby `i` (0-based): `s1`, `s2`, ...
pub fn standby_name(i: usize) -> String {
    format!("s{}", i + 1)
}

/// How to build an in-process cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub standbys: usize,
    /// `synchronous_standby_names` of the primary; `FIRST 1 (s1)` when there are standbys.
    pub sync_names: Option<String>,
    /// fdatasync on every node (off only to see what the disk costs).
    pub fsync: bool,
    /// Where the nodes' temporary directories go (the system's temporary directory if `None`).
    pub base_dir: Option<PathBuf>,
    pub segment_size: u64,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            standbys: 1,
            sync_names: None,
            fsync: true,
            base_dir: None,
            segment_size: 16 << 20,
        }
    }
}

/// A primary and its standbys running in this process on one actix System thread.
pub struct Cluster {
    pub primary: Node,
    pub standbys: Vec<Node>,
    system: actix_rt::System,
    arbiter: actix_rt::ArbiterHandle,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// Settings as the binary would load them from `key = value` overrides.
fn settings(pairs: &[(&str, String)]) -> anyhow::Result<Settings> {
    Settings::load(&Sources {
        file: None,
        overrides: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        env: Some(Default::default()),
    })
}

fn temp_dir(base: Option<&Path>, prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    let mut b = tempfile::Builder::new();
    b.prefix(prefix);
    match base {
        Some(dir) => b.tempdir_in(dir),
        None => b.tempdir(),
    }
    .context("cannot create a temporary directory")
}

impl Cluster {
    pub fn start(opts: &ClusterOptions) -> anyhow::Result<Cluster> {
        let dir = temp_dir(opts.base_dir.as_deref(), "walserver-bench-")?;
        let data = dir.path().join("primary");
        crate::init::init_primary(&data, opts.segment_size)?;
        let sync = opts.sync_names.clone().unwrap_or_else(|| {
            if opts.standbys > 0 {
                "FIRST 1 (s1)".into()
            } else {
                String::new()
            }
        });
        let s = settings(&[
            ("data_dir", data.display().to_string()),
            ("listen", "127.0.0.1:0".into()),
            ("synchronous_standby_names", sync),
            ("max_wal_senders", (opts.standbys + 4).to_string()),
            ("wal_keep_size", "1024".into()),
        ])?;
        let mut cfg = crate::server::node_config(&s, &data)?;
        cfg.storage.fsync = opts.fsync;
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("bench-cluster".into())
            .spawn(move || {
                let system = actix_rt::System::new();
                system.block_on(async move {
                    let node = NodeBuilder::new(cfg).start().await;
                    let _ =
                        tx.send(node.map(|n| {
                            (n, actix_rt::System::current(), actix_rt::Arbiter::current())
                        }));
                });
                let _ = system.run();
            })?;
        let (primary, system, arbiter) = rx
            .recv()
            .context("the cluster thread ended")?
            .context("cannot start the primary")?;
        let mut c = Cluster {
            primary,
            standbys: Vec::new(),
            system,
            arbiter,
            thread: Some(thread),
            _dir: dir,
        };
        for i in 0..opts.standbys {
            let data = c._dir.path().join(standby_name(i));
            let node = c.start_standby(&data, &standby_name(i), opts.fsync, None)?;
            c.standbys.push(node);
        }
        Ok(c)
    }

    /// Makes a standby of the primary in `data` (which must not exist), starting at `start`
    /// (default: the primary's current segment), and runs it on the cluster's thread.
    pub fn start_standby(
        &self,
        data: &Path,
        name: &str,
        fsync: bool,
        start: Option<Lsn>,
    ) -> anyhow::Result<Node> {
        start_standby_on(
            &self.arbiter,
            self.primary.listen_addr,
            data,
            name,
            fsync,
            start,
        )
    }

    /// Starts a node on the cluster's thread.
    pub fn start_node(&self, cfg: NodeConfig) -> anyhow::Result<Node> {
        start_node_on(&self.arbiter, cfg)
    }

    /// Waits until every standby streams from the primary.
    pub fn wait_streaming(&self, timeout: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        let want = self.standbys.len();
        loop {
            let rows = futures_executor::block_on(
                self.primary
                    .registry
                    .send(walsender_actor::messages::GetReplicationStatus),
            )?;
            let streaming = rows
                .iter()
                .filter(|r| r.state == walsender_actor::status::WalSenderState::Streaming)
                .count();
            if streaming >= want {
                return Ok(());
            }
            if started.elapsed() > timeout {
                bail!("only {streaming} of {want} standbys streaming after {timeout:?}");
            }
            // Start-up of nodes this bench made: a short bounded wait, not event discovery.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn start_node_on(arbiter: &actix_rt::ArbiterHandle, cfg: NodeConfig) -> anyhow::Result<Node> {
    let (tx, rx) = mpsc::channel();
    arbiter.spawn(async move {
        let _ = tx.send(NodeBuilder::new(cfg).start().await);
    });
    Ok(rx.recv().context("the cluster thread ended")??)
}

/// `walserver init --standby` of `upstream` in `data`, then the node started on `arbiter`.
pub fn start_standby_on(
    arbiter: &actix_rt::ArbiterHandle,
    upstream: SocketAddr,
    data: &Path,
    name: &str,
    fsync: bool,
    start: Option<Lsn>,
) -> anyhow::Result<Node> {
    let conninfo = format!(
        "host={} port={} user=bench application_name={name}",
        upstream.ip(),
        upstream.port()
    );
    crate::init::init_standby(data, &conninfo, None, start)?;
    let s = settings(&[
        ("data_dir", data.display().to_string()),
        ("listen", "127.0.0.1:0".into()),
        ("wal_receiver_status_interval", "1".into()),
    ])?;
    let mut cfg = crate::server::node_config(&s, data)?;
    cfg.storage.fsync = fsync;
    cfg.io_threads = 1;
    start_node_on(arbiter, cfg)
}

/// An actix System on its own thread, to run nodes away from the caller's thread.
pub struct SystemThread {
    pub arbiter: actix_rt::ArbiterHandle,
    system: actix_rt::System,
    thread: Option<JoinHandle<()>>,
}

impl SystemThread {
    pub fn spawn(name: &str) -> anyhow::Result<SystemThread> {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let system = actix_rt::System::new();
                let _ = tx.send((actix_rt::System::current(), actix_rt::Arbiter::current()));
                let _ = system.run();
            })?;
        let (system, arbiter) = rx.recv().context("the system thread ended")?;
        Ok(SystemThread {
            arbiter,
            system,
            thread: Some(thread),
        })
    }
}

impl Drop for SystemThread {
    fn drop(&mut self) {
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Asks a node to shut down (immediately: a bench has nothing to drain) and waits.
pub fn shutdown(node: &Node) {
    let _ = futures_executor::block_on(node.supervisor.send(ShutdownNode { immediate: true }));
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in &self.standbys {
            shutdown(s);
        }
        shutdown(&self.primary);
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A free loopback port (bound and released; another process could take it in between,
/// which on loopback is rare enough for a bench).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A node run as a child process: `walserver run` of this executable.
pub struct ChildNode {
    pub child: Child,
    pub listen: SocketAddr,
    pub http: SocketAddr,
    pub data_dir: PathBuf,
}

impl ChildNode {
    /// Runs `walserver run` on `data_dir` with `-c` settings, and waits for its admin API.
    pub fn spawn(data_dir: &Path, settings: &[(&str, String)]) -> anyhow::Result<ChildNode> {
        let listen: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let mut cmd = Command::new(exe);
        cmd.arg("run")
            .arg("-c")
            .arg(format!("data_dir={}", data_dir.display()))
            .arg("-c")
            .arg(format!("listen={listen}"))
            .arg("-c")
            .arg(format!("http_listen={http}"))
            .arg("-c")
            .arg("log_level=warn");
        for (k, v) in settings {
            cmd.arg("-c").arg(format!("{k}={v}"));
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        let child = cmd.spawn().context("cannot run walserver")?;
        let mut node = ChildNode {
            child,
            listen,
            http,
            data_dir: data_dir.to_path_buf(),
        };
        let started = Instant::now();
        loop {
            if crate::cli::get_json(&http.to_string(), "/status", None).is_ok() {
                return Ok(node);
            }
            if let Some(status) = node.child.try_wait()? {
                bail!("walserver run exited with {status} before its admin API answered");
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("walserver run did not answer on {http} within 30 s");
            }
            // Waiting for a process this bench started to listen: bounded, not discovery.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        // SIGQUIT: an immediate shutdown (a bench's node has nothing worth draining); then
        // wait so no zombie is left.
        // SAFETY: kill with a pid of our own child and a valid signal number.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGQUIT) };
        let _ = self.child.wait();
    }
}
