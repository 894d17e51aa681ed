//! `walserver run` child processes on loopback that keep their ports across restarts (a
//! standby's `primary_conninfo` names its upstream's port), can be killed with SIGKILL and
//! started again on the same data directory, and are killed and reaped on drop, so a failing
//! test leaves no process behind. Each process's log goes to a file beside its data directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use supervisor_actor::NodeStatus;
use wal_storage::Lsn;
use walserver_bench::acklog::NodeRecord;

pub use fault_harness::node::conninfo_at;

/// How long a step that should take moments (a start, a reconnect) may take before the test
/// fails. Generous: two cores are shared with other builds.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A node run as `walserver run`, restartable on its data directory and ports.
pub struct ChildNode {
    pub name: String,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub http: SocketAddr,
    pub log: PathBuf,
    settings: Vec<(String, String)>,
    /// Where standard error goes instead of the log file (`/dev/full`, for a log that cannot
    /// be written).
    stderr: Option<PathBuf>,
    child: Option<Child>,
    /// How many times this node has been started.
    pub starts: u32,
}

impl ChildNode {
    /// A node on the initialised `data_dir`, not yet started; its log is `NAME.log` beside it.
    pub fn new(name: &str, data_dir: &Path, settings: &[(&str, &str)]) -> ChildNode {
        let port = |_| {
            format!(
                "127.0.0.1:{}",
                walserver_bench::cluster::free_port().expect("a free loopback port")
            )
            .parse()
            .expect("address")
        };
        ChildNode {
            name: name.into(),
            data_dir: data_dir.to_path_buf(),
            listen: port(0),
            http: port(1),
            log: data_dir.with_file_name(format!("{name}.log")),
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            stderr: None,
            child: None,
            starts: 0,
        }
    }

    /// Lowers the running process's `RLIMIT_NOFILE` to `n` (soft and hard), with prlimit(2).
    pub fn set_nofile(&self, n: u64) -> anyhow::Result<()> {
        let pid = self.pid().context("the node does not run")?;
        let lim = libc::rlimit {
            rlim_cur: n as libc::rlim_t,
            rlim_max: n as libc::rlim_t,
        };
        // SAFETY: prlimit reads `lim` and writes nothing (the old limit is not asked for).
        let r = unsafe {
            libc::prlimit(
                pid as libc::pid_t,
                libc::RLIMIT_NOFILE,
                &lim,
                std::ptr::null_mut(),
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error()).context("prlimit");
        }
        Ok(())
    }

    /// How many descriptors the process holds (`/proc/PID/fd`).
    pub fn open_fds(&self) -> anyhow::Result<u64> {
        let pid = self.pid().context("the node does not run")?;
        Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64)
    }

    /// Writes the log to `path` (outside the data directory's file system, say).
    pub fn with_log(mut self, path: &Path) -> ChildNode {
        self.log = path.to_path_buf();
        self
    }

    /// Sends standard error to `path` (opened for writing) instead of the log.
    pub fn with_stderr(mut self, path: &Path) -> ChildNode {
        self.stderr = Some(path.to_path_buf());
        self
    }

    pub fn http_str(&self) -> String {
        self.http.to_string()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Starts the process (appending to its log) and waits until its admin API answers.
    pub fn start(&mut self) -> anyhow::Result<()> {
        assert!(self.child.is_none(), "{} already runs", self.name);
        let log_path = self.stderr.as_ref().unwrap_or(&self.log);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        fault_harness::node::wait_for_dir_lock(&self.data_dir, DEADLINE)?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_walserver"));
        cmd.arg("run")
            .arg("-c")
            .arg(format!("data_dir={}", self.data_dir.display()))
            .arg("-c")
            .arg(format!("listen={}", self.listen))
            .arg("-c")
            .arg(format!("http_listen={}", self.http));
        for (k, v) in &self.settings {
            cmd.arg("-c").arg(format!("{k}={v}"));
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .env("NO_COLOR", "1")
            // The nodes refuse unknown WALSERVER_ variables; this one is the row writer's.
            .env_remove(fault_harness::report::DIR_VAR);
        self.child = Some(cmd.spawn().context("run walserver")?);
        self.starts += 1;
        let started = Instant::now();
        loop {
            if walserver_node::admin::get_json(&self.http_str(), "/status", None).is_ok() {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "{} exited with {status} before its admin API answered; its log:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            if started.elapsed() > DEADLINE {
                bail!(
                    "{} did not answer on {} within {DEADLINE:?}",
                    self.name,
                    self.http
                );
            }
            // The process reports its start to no one: a bounded wait for its port.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` to the running process.
    pub fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill with the pid of our own, not yet reaped, child.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// `GET /status`.
    pub fn status(&self) -> anyhow::Result<NodeStatus> {
        Ok(walserver_node::admin::get_status(&self.http_str(), None)?)
    }

    /// The last lines of the node's log, for a failure message.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl ChildNode {
    /// Waits until the node is durable up to `end` (`what` names the wait).
    pub fn wait_flushed(&self, end: Lsn, what: &str) -> anyhow::Result<()> {
        wait_for(what, DEADLINE, Duration::from_millis(5), || {
            (self.status().ok()?.flush_lsn >= end).then_some(())
        })
    }
}

/// Waits until `f` gives `Some`, asking every `every` up to `deadline`; `what` names the wait
/// in the failure. The nodes tell no one outside when they change state (their `/status` is
/// the interface), so this asks, bounded in time.
pub fn wait_for<T>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if started.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        std::thread::sleep(every);
    }
}

/// Where the shorter of two record lists stops being a prefix of the longer, if it does.
pub fn first_difference(a: &[NodeRecord], b: &[NodeRecord]) -> Option<usize> {
    (0..a.len().min(b.len())).find(|&i| a[i] != b[i])
}

/// Asserts that the shorter of two nodes' record lists (`GET /wal?from=earliest`, oldest
/// first) is a prefix of the longer: the same records, timeline by timeline, at the same LSNs
/// with the same bytes (SHA-256). Returns how many records both hold.
pub fn assert_prefix(a_name: &str, a: &[NodeRecord], b_name: &str, b: &[NodeRecord]) -> usize {
    if let Some(i) = first_difference(a, b) {
        panic!(
            "record {i} differs between {a_name} and {b_name}: {:?} and {:?}",
            a[i], b[i]
        );
    }
    a.len().min(b.len())
}

#[test]
fn the_prefix_check_finds_any_difference() {
    let rec = |tl: u32, start: u64, data: &[u8]| NodeRecord {
        timeline: tl,
        start: Lsn(start),
        end: Lsn(start + 24 + data.len() as u64),
        sha256: walserver_bench::acklog::sha256_hex(data),
    };
    let a = vec![rec(1, 100, b"x"), rec(1, 125, b"y"), rec(1, 150, b"z")];
    assert_eq!(first_difference(&a, &a[..2]), None, "a prefix");
    assert_eq!(first_difference(&a[..0], &a), None, "nothing in common");
    let mut b = a.clone();
    b[1] = rec(1, 125, b"Y");
    assert_eq!(first_difference(&a, &b), Some(1), "other bytes");
    b[1] = rec(2, 125, b"y");
    assert_eq!(first_difference(&a, &b), Some(1), "another timeline");
    b[1] = rec(1, 126, b"y");
    assert_eq!(first_difference(&a, &b[..2]), Some(1), "another LSN");
}
