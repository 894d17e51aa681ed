//! Nodes for a bench: an in-process cluster (a primary and K standbys, each on an actix System
//! thread of its own, the embedding path, started with `walserver_node::start_node`), and
//! which executable runs a node as a child process ([`NodeProgram`]; the process itself is
//! [`crate::node::ChildNode`]), whose CPU time and memory the kernel reports apart from the
//! bench's own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use supervisor_actor::{Node, NodeConfig, ShutdownNode};
use wal_storage::Lsn;

use walserver_node::config::{Settings, Sources};

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
    /// Threads for each node's walsenders and walreceiver (`NodeConfig::io_threads`); 0 runs
    /// them on the node's own System thread, beside its supervisor and registry.
    pub io_threads: usize,
    /// `synchronous_commit_overlap` on every node: the primary sends its synchronous standby
    /// each batch once written, while its fdatasync runs, and the standby says it accepts
    /// such WAL (and cuts back a tail its primary lost, at stream start).
    pub commit_overlap: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            standbys: 1,
            sync_names: None,
            fsync: true,
            base_dir: None,
            segment_size: 16 << 20,
            io_threads: 0,
            commit_overlap: false,
        }
    }
}

/// A primary and its standbys running in this process, each node on an actix System thread
/// of its own (as separate processes would be), with its storage threads.
pub struct Cluster {
    pub primary: Node,
    pub standbys: Vec<Node>,
    primary_system: Option<SystemThread>,
    standby_systems: Vec<SystemThread>,
    _dir: tempfile::TempDir,
}

/// Settings as the binary would load them from `key = value` overrides.
fn settings(pairs: &[(&str, String)]) -> anyhow::Result<Settings> {
    Ok(Settings::load(&Sources {
        file: None,
        overrides: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        env: Some(Default::default()),
    })?)
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
        walserver_node::init::init_primary(&data, opts.segment_size)?;
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
            (
                "synchronous_commit_overlap",
                opts.commit_overlap.to_string(),
            ),
        ])?;
        let primary_system = SystemThread::spawn("bench-primary")?;
        let primary = start_node_on(&primary_system.arbiter, &s, &data, |cfg| {
            cfg.storage.fsync = opts.fsync;
            cfg.io_threads = opts.io_threads;
        })
        .context("cannot start the primary")?;
        let mut c = Cluster {
            primary,
            standbys: Vec::new(),
            primary_system: Some(primary_system),
            standby_systems: Vec::new(),
            _dir: dir,
        };
        for i in 0..opts.standbys {
            let data = c._dir.path().join(standby_name(i));
            let system = SystemThread::spawn(&format!("bench-{}", standby_name(i)))?;
            init_standby_dir(c.primary.listen_addr, &data, &standby_name(i), None)?;
            let node = start_standby_with(&system.arbiter, &data, |s| {
                s.fsync = opts.fsync;
                s.io_threads = opts.io_threads;
                s.commit_overlap = opts.commit_overlap;
            })?;
            c.standbys.push(node);
            c.standby_systems.push(system);
        }
        Ok(c)
    }

    /// The primary's System thread, to run tasks beside the node's actors.
    pub fn primary_arbiter(&self) -> Option<&actix_rt::ArbiterHandle> {
        self.primary_system.as_ref().map(|s| &s.arbiter)
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

/// Starts the node `settings` describe on `arbiter` (`adjust` as `walserver_node::start_node`
/// takes it) and waits until it runs.
pub fn start_node_on(
    arbiter: &actix_rt::ArbiterHandle,
    settings: &Settings,
    data: &Path,
    adjust: impl FnOnce(&mut NodeConfig),
) -> anyhow::Result<Node> {
    let start = walserver_node::start_node(settings, data, adjust)?;
    let (tx, rx) = mpsc::channel();
    arbiter.spawn(async move {
        let _ = tx.send(start.await);
    });
    Ok(rx.recv().context("the cluster thread ended")??)
}

/// `walserver init --standby` of `upstream` in `data` (which must not exist), starting at
/// `start` (default: the upstream's current segment); `name` is its application_name.
pub fn init_standby_dir(
    upstream: SocketAddr,
    data: &Path,
    name: &str,
    start: Option<Lsn>,
) -> anyhow::Result<()> {
    let conninfo = format!(
        "host={} port={} user=bench application_name={name}",
        upstream.ip(),
        upstream.port()
    );
    walserver_node::init::init_standby(data, &conninfo, None, start)?;
    Ok(())
}

/// Runs the standby whose data directory `init_standby_dir` made, on `arbiter`.
pub fn start_standby_node(
    arbiter: &actix_rt::ArbiterHandle,
    data: &Path,
    fsync: bool,
    io_threads: usize,
) -> anyhow::Result<Node> {
    start_standby_with(arbiter, data, |s| {
        s.fsync = fsync;
        s.io_threads = io_threads;
    })
}

/// How [`start_standby_with`] runs a standby: the default is fsync on, the walreceiver on the
/// node's own thread, the overlapped commit off.
pub struct StandbyOptions {
    pub fsync: bool,
    pub io_threads: usize,
    pub commit_overlap: bool,
}

/// Runs the standby whose data directory `init_standby_dir` made, on `arbiter`, with the
/// options `adjust` sets.
pub fn start_standby_with(
    arbiter: &actix_rt::ArbiterHandle,
    data: &Path,
    adjust: impl FnOnce(&mut StandbyOptions),
) -> anyhow::Result<Node> {
    let mut o = StandbyOptions {
        fsync: true,
        io_threads: 0,
        commit_overlap: false,
    };
    adjust(&mut o);
    let s = settings(&[
        ("data_dir", data.display().to_string()),
        ("listen", "127.0.0.1:0".into()),
        ("wal_receiver_status_interval", "1".into()),
        ("synchronous_commit_overlap", o.commit_overlap.to_string()),
    ])?;
    start_node_on(arbiter, &s, data, |cfg| {
        cfg.storage.fsync = o.fsync;
        cfg.io_threads = o.io_threads;
    })
}

/// A primary of its own on `arbiter`, in `data` (made here), keeping all its WAL.
pub fn start_primary_on(
    arbiter: &actix_rt::ArbiterHandle,
    data: &Path,
    segment_size: u64,
    max_wal_senders: usize,
) -> anyhow::Result<Node> {
    walserver_node::init::init_primary(data, segment_size)?;
    let s = settings(&[
        ("data_dir", data.display().to_string()),
        ("listen", "127.0.0.1:0".into()),
        ("max_wal_senders", max_wal_senders.to_string()),
        ("wal_keep_size", "1TB".into()),
    ])?;
    start_node_on(arbiter, &s, data, |_| {})
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
        self.standby_systems.clear();
        shutdown(&self.primary);
        self.primary_system.take();
    }
}

/// A free loopback port (bound and released; another process could take it in between,
/// which on loopback is rare enough for a bench), never one this process was given before.
///
/// A port is free again once its probe socket closes, so the kernel may pick it for the next
/// probe: the failover demo once gave two of its nodes the same listen port, and the second
/// could not start. Ports handed out are remembered, and a probe that lands on one of them is
/// tried again (a bounded number of times; the kernel picks among thousands).
pub fn free_port() -> anyhow::Result<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..64 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        // A list of port numbers, consistent between statements.
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    anyhow::bail!("64 probes for a free loopback port found only ports already given out")
}

/// The executable that runs `walserver run` for a node run as a child process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeProgram {
    /// This executable, for a program that is itself a `walserver` (embeds the node).
    ThisExecutable,
    /// A `walserver` executable elsewhere (the `walserver-bench` program's).
    Path(PathBuf),
}

impl NodeProgram {
    /// The `walserver` in the directory of `exe`, where cargo puts both programs.
    pub fn beside(exe: &Path) -> NodeProgram {
        NodeProgram::Path(exe.with_file_name("walserver"))
    }

    /// The executable's path.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        match self {
            NodeProgram::ThisExecutable => {
                std::env::current_exe().context("cannot find this executable")
            }
            NodeProgram::Path(p) => Ok(p.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walserver_program_is_found_beside_the_bench() {
        assert_eq!(
            NodeProgram::beside(Path::new("/opt/ws/bin/walserver-bench")),
            NodeProgram::Path(PathBuf::from("/opt/ws/bin/walserver"))
        );
        assert_eq!(
            NodeProgram::Path("/x/walserver".into()).path().unwrap(),
            PathBuf::from("/x/walserver")
        );
        assert_eq!(
            NodeProgram::ThisExecutable.path().unwrap(),
            std::env::current_exe().unwrap()
        );
    }
}
