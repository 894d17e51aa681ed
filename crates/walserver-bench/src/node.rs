//! `walserver run` as a child process: the one type that runs a node outside the process that
//! drives it, for the load tool's own nodes, the fault harness (inside a network namespace,
//! through [`ChildNode::pre_exec`]) and every scenario suite.
//!
//! A node is made stopped ([`ChildNode::new`]) on an initialised data directory, with its
//! arguments (`--config FILE` and/or `-c key=value`), and started, killed and started again on
//! the same directory and ports. Its output goes where [`Output`] says: captured into a log
//! file whose lines can be waited for (readiness is a line, an event), written straight to a
//! file (a log that cannot be written, `/dev/full`), or left to the caller's terminal. It is
//! ready when [`Ready`] says: a log line, or its admin API answering where no line can be
//! read. Dropping it kills and reaps it; while a test panics, it prints the end of its log.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use supervisor_actor::NodeStatus;
use wal_storage::Lsn;

/// What `walserver run` logs once its admin API listens (after the replication listener is
/// bound): the line that says a node serves.
pub const READY_LINE: &str = "admin API listening";
/// How long a start, a stop or a wait for a line may take (generous: two cores are shared
/// with builds).
pub const DEADLINE: Duration = Duration::from_secs(60);
/// How much of a log a failure shows (its end).
const LOG_TAIL: usize = 16 * 1024;

/// Where a node's output goes.
#[derive(Clone, Debug)]
pub enum Output {
    /// Standard output and error piped, copied line by line into the file (appended across
    /// restarts), and each line offered to [`ChildNode::wait_line`].
    Captured(PathBuf),
    /// Standard error opened straight on the file (`/dev/full`, for a log that cannot be
    /// written); standard output discarded.
    File(PathBuf),
    /// The caller's own standard error (the load tool's terminal); standard output discarded.
    Inherit,
}

/// When a started node counts as serving.
#[derive(Clone, Debug)]
pub enum Ready {
    /// A line of its captured output containing this text.
    Line(String),
    /// Its admin API answering `GET /status`, asked from this process (a node whose output
    /// cannot be read); asked every 5 ms, as the process tells no one else it started.
    AdminAnswers,
    /// At once: the caller waits for the lines it needs ([`ChildNode::wait_line`]).
    Spawned,
}

/// A hook run in the child between fork and exec (entering a network namespace, say). It
/// must call only async-signal-safe functions.
pub type PreExec = Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>;

/// A walserver node run as `walserver run`, restartable on its data directory and ports.
pub struct ChildNode {
    pub name: String,
    program: PathBuf,
    pub data_dir: PathBuf,
    /// The replication address, and the admin API's (`HOST:PORT`), as configured.
    pub listen: SocketAddr,
    pub http: String,
    /// The admin API's bearer token, if it requires one.
    pub token: Option<String>,
    /// The arguments after `run`.
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    env_remove: Vec<String>,
    output: Output,
    ready: Ready,
    pre_exec: Option<PreExec>,
    child: Option<Child>,
    /// The lines of the current process's captured output, until both pipes close.
    lines: Option<mpsc::Receiver<String>>,
    /// Every line read so far through [`ChildNode::wait_line`] and [`ChildNode::wait_exit`].
    pub log_lines: Vec<String>,
    paused: bool,
    /// How many times this node has been started.
    pub starts: u32,
}

impl ChildNode {
    /// A node of `program` on `data_dir`, not started: its output captured into
    /// `NAME.log` beside the data directory, ready at [`READY_LINE`].
    pub fn new(name: &str, program: &Path, data_dir: &Path) -> ChildNode {
        ChildNode {
            name: name.to_string(),
            program: program.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            http: String::new(),
            token: None,
            args: Vec::new(),
            env: vec![("NO_COLOR".into(), "1".into())],
            env_remove: vec![crate::reliability::DIR_VAR.to_string()],
            output: Output::Captured(data_dir.with_file_name(format!("{name}.log"))),
            ready: Ready::Line(READY_LINE.to_string()),
            pre_exec: None,
            child: None,
            lines: None,
            log_lines: Vec::new(),
            paused: false,
            starts: 0,
        }
    }

    /// A node on loopback ports of its own (`listen`, `http_listen`), with `settings` as `-c
    /// key=value` after `data_dir`.
    pub fn on_loopback(
        name: &str,
        program: &Path,
        data_dir: &Path,
        settings: &[(&str, &str)],
    ) -> anyhow::Result<ChildNode> {
        let mut n = ChildNode::new(name, program, data_dir);
        n.listen = SocketAddr::from(([127, 0, 0, 1], crate::cluster::free_port()?));
        n.http = format!("127.0.0.1:{}", crate::cluster::free_port()?);
        n.setting("data_dir", &data_dir.display().to_string());
        n.setting("listen", &n.listen.to_string());
        n.setting("http_listen", &n.http.clone());
        for (k, v) in settings {
            n.setting(k, v);
        }
        Ok(n)
    }

    /// The load tool's node: [`ChildNode::on_loopback`] of `program`, logging warnings to the
    /// tool's own terminal, ready when its admin API answers; started.
    pub fn spawn(
        program: &crate::NodeProgram,
        data_dir: &Path,
        settings: &[(&str, String)],
    ) -> anyhow::Result<ChildNode> {
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let name = data_dir
            .file_name()
            .map_or("walserver".into(), |n| n.to_string_lossy().into_owned());
        let mut n = ChildNode::on_loopback(&name, &program.path()?, data_dir, &settings)?;
        n.setting("log_level", "warn");
        n.output = Output::Inherit;
        n.ready = Ready::AdminAnswers;
        n.start()?;
        Ok(n)
    }

    /// Adds `-c key=value`.
    pub fn setting(&mut self, key: &str, value: &str) -> &mut ChildNode {
        self.args.push("-c".into());
        self.args.push(format!("{key}={value}").into());
        self
    }

    /// Adds `--config FILE`.
    pub fn config_file(&mut self, path: &Path) -> &mut ChildNode {
        self.args.push("--config".into());
        self.args.push(path.into());
        self
    }

    /// Sets `key` in the node's environment.
    pub fn env(&mut self, key: &str, value: &str) -> &mut ChildNode {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
        self
    }

    /// Removes `key` from the node's environment.
    pub fn env_remove(&mut self, key: &str) -> &mut ChildNode {
        self.env.retain(|(k, _)| k != key);
        self.env_remove.push(key.into());
        self
    }

    pub fn output(&mut self, output: Output) -> &mut ChildNode {
        self.output = output;
        self
    }

    pub fn ready(&mut self, ready: Ready) -> &mut ChildNode {
        self.ready = ready;
        self
    }

    pub fn pre_exec(&mut self, hook: PreExec) -> &mut ChildNode {
        self.pre_exec = Some(hook);
        self
    }

    /// The executable run.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The log file, when the output goes to one.
    pub fn log_path(&self) -> Option<&Path> {
        match &self.output {
            Output::Captured(p) | Output::File(p) => Some(p),
            Output::Inherit => None,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether a process was started and not yet killed or seen to exit.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process still runs (an exit is reaped here).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Starts `walserver run ARGS` and waits until it is ready.
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("{} already runs", self.name);
        }
        // Once a data directory exists, a start must find its lock free (see
        // `wait_for_dir_lock`); a node run on a configuration file names its own directory.
        wait_for_dir_lock(&self.data_dir, DEADLINE)?;
        let mut cmd = Command::new(&self.program);
        cmd.arg("run").args(&self.args).stdin(Stdio::null());
        for k in &self.env_remove {
            cmd.env_remove(k);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(hook) = self.pre_exec.clone() {
            use std::os::unix::process::CommandExt;
            // SAFETY: the hook is documented to call only async-signal-safe functions.
            unsafe {
                cmd.pre_exec(move || hook());
            }
        }
        match &self.output {
            Output::Captured(_) => {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            Output::File(p) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("open {}", p.display()))?;
                cmd.stdout(Stdio::null()).stderr(f);
            }
            Output::Inherit => {
                cmd.stdout(Stdio::null());
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot run walserver ({})", self.program.display()))?;
        self.starts += 1;
        self.paused = false;
        if let Output::Captured(log) = &self.output {
            self.lines = Some(capture(&self.name, &mut child, log)?);
        }
        self.child = Some(child);
        match self.ready.clone() {
            Ready::Line(needle) => self.wait_line(&needle).map(|_| ()),
            Ready::AdminAnswers => self.wait_admin(),
            Ready::Spawned => Ok(()),
        }
    }

    fn wait_admin(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if walserver_node::admin::get_text(&self.http, "/status", self.token.as_deref()).is_ok()
            {
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

    /// Waits for a line of the captured output containing `needle` (among those not read
    /// yet) and returns it; an error if the process closes its output first, or after
    /// [`DEADLINE`].
    pub fn wait_line(&mut self, needle: &str) -> anyhow::Result<String> {
        let Some(lines) = &self.lines else {
            bail!("{}: no output to read {needle:?} from", self.name);
        };
        let start = Instant::now();
        loop {
            let left = DEADLINE.saturating_sub(start.elapsed());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    self.log_lines.push(line.clone());
                    if line.contains(needle) {
                        return Ok(line);
                    }
                }
                Err(e) => bail!(
                    "{}: no line with {needle:?} ({e}); the end of its log:\n{}",
                    self.name,
                    self.log_tail()
                ),
            }
        }
    }

    /// Waits for the process to exit (its output closing is the event, when captured), up to
    /// [`DEADLINE`]; the lines it printed meanwhile join [`ChildNode::log_lines`].
    pub fn wait_exit(&mut self) -> anyhow::Result<ExitStatus> {
        let start = Instant::now();
        if let Some(lines) = &self.lines {
            loop {
                match lines.recv_timeout(DEADLINE.saturating_sub(start.elapsed())) {
                    Ok(line) => self.log_lines.push(line),
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        bail!("{} did not exit within {DEADLINE:?}", self.name)
                    }
                }
            }
        }
        let Some(child) = self.child.as_mut() else {
            bail!("{} does not run", self.name);
        };
        loop {
            if let Some(s) = child.try_wait()? {
                self.child = None;
                return Ok(s);
            }
            if start.elapsed() > DEADLINE {
                bail!("{} did not exit within {DEADLINE:?}", self.name);
            }
            // The output closed but the exit is not reaped yet (or the output is not
            // captured): a bounded wait for a process already on its way out.
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Sends `signal` to the running process.
    pub fn signal(&self, signal: libc::c_int) -> anyhow::Result<()> {
        let Some(pid) = self.pid() else {
            bail!("{} does not run", self.name);
        };
        // SAFETY: kill with our own child's pid, not yet reaped, and a signal number.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("signal {signal} to {}", self.name));
        }
        Ok(())
    }

    /// SIGKILL and reap; the data directory stays for [`ChildNode::start`].
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused = false;
        // Whatever the process printed last stays readable in its log file.
        self.lines = None;
    }

    /// SIGSTOP, returning once the process has stopped (its sockets stay open, unanswered).
    pub fn pause(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGSTOP)?;
        self.paused = true;
        self.wait_state(libc::WSTOPPED, "stop")
    }

    /// SIGCONT after [`ChildNode::pause`], returning once the process runs again.
    pub fn resume(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGCONT)?;
        self.paused = false;
        self.wait_state(libc::WCONTINUED, "continue")
    }

    /// Waits for the kernel to report that the child stopped or continued (`which`), or
    /// exited; the report is left in place (`WNOWAIT`), so the exit can still be reaped.
    fn wait_state(&self, which: libc::c_int, what: &str) -> anyhow::Result<()> {
        let Some(pid) = self.pid() else {
            bail!("{} does not run", self.name);
        };
        // SAFETY: waitid on our own, not yet reaped, child with a zeroed siginfo to fill.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                which | libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("wait for {} to {what}", self.name));
        }
        Ok(())
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

    /// `GET /status` from this process, read into the type the server writes.
    pub fn status(&self) -> anyhow::Result<NodeStatus> {
        Ok(walserver_node::admin::get_status(
            &self.http,
            self.token.as_deref(),
        )?)
    }

    /// Waits until the node is durable up to `end` (`what` names the wait), asking its
    /// `/status` every 5 ms: the node tells no one outside when it flushed.
    pub fn wait_flushed(&self, end: Lsn, what: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if self.status().is_ok_and(|s| s.flush_lsn >= end) {
                return Ok(());
            }
            if started.elapsed() > DEADLINE {
                bail!(
                    "{}: timed out after {DEADLINE:?} waiting for {what}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The end of the log, for a failure message (empty when the output is not in a file).
    pub fn log_tail(&self) -> String {
        self.log_path().map(log_tail).unwrap_or_default()
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        if self.paused {
            let _ = self.signal(libc::SIGCONT);
        }
        let was_running = self.child.is_some();
        self.kill9();
        if was_running && std::thread::panicking() {
            if let Output::Captured(log) = &self.output {
                eprintln!(
                    "----- {} ({}), end of its log -----\n{}\n----- end of {} -----",
                    self.name,
                    log.display(),
                    log_tail(log),
                    self.name
                );
            }
        }
    }
}

/// The last 16 KiB of the file at `path`.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let from = text.len().saturating_sub(LOG_TAIL);
    String::from_utf8_lossy(&text[from..]).into_owned()
}

/// Copies the child's piped output into `log` (appended), a thread per pipe; every line also
/// goes to the receiver returned, which disconnects once both pipes close (the exit).
fn capture(name: &str, child: &mut Child, log: &Path) -> anyhow::Result<mpsc::Receiver<String>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open {}", log.display()))?;
    let file = Arc::new(Mutex::new(file));
    let (tx, rx) = mpsc::channel();
    let pipes: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ];
    for pipe in pipes.into_iter().flatten() {
        let (file, tx) = (file.clone(), tx.clone());
        std::thread::Builder::new()
            .name(format!("{name}-log"))
            .spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(mut f) = file.lock() {
                        let _ = writeln!(f, "{line}");
                    }
                    // The receiver may be gone (the node was killed): the copy goes on.
                    let _ = tx.send(line);
                }
            })
            .context("spawn a log thread")?;
    }
    Ok(rx)
}

/// Waits, up to `deadline`, until no process holds the lock of the data directory `data` (if
/// it has one yet). A test that starts a program (psql, walserver, pg_receivewal) gives the
/// forked child, until its exec, a copy of every descriptor the test process has open: the
/// lock that `init` took in the test process (or that a node just stopped held) included. A
/// node started in that window finds its directory Locked and exits. A blocking lock returns as
/// soon as that copy is closed; the deadline only guards against a real holder.
pub fn wait_for_dir_lock(data: &Path, deadline: Duration) -> anyhow::Result<()> {
    let Ok(f) = std::fs::OpenOptions::new()
        .write(true)
        .open(data.join("walserver.lock"))
    else {
        return Ok(());
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f.lock().and_then(|()| f.unlock()));
    });
    match rx.recv_timeout(deadline) {
        Ok(r) => r.with_context(|| format!("lock {}", data.join("walserver.lock").display())),
        Err(_) => bail!("another process holds the lock of {}", data.display()),
    }
}
