//! Processes inside a host's namespace: their output goes to a log file (printed when the test
//! panics), a line of it can be waited for (readiness is an event, not a sleep), and they can
//! be killed with SIGKILL, paused with SIGSTOP and resumed. A [`Process`] is killed and reaped
//! when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::watch::ExitWatch;
use crate::{Error, Result};

/// How much of a log a failing test prints (its end).
const LOG_TAIL: usize = 16 * 1024;
/// How many lines of its log [`explain`] quotes: a guess at enough for an error with its
/// causes and what came just before it, short enough to read in a panic message.
const EXPLAIN_LINES: usize = 20;

/// Lines a process printed, shared with the threads that read its output.
#[derive(Default)]
struct Watch {
    /// Patterns someone waits for, with where to say the line was seen.
    waiters: Vec<(String, mpsc::Sender<String>)>,
    /// Output pipes still open; at zero the waiters are dropped, which tells them the line
    /// will never come.
    open_pipes: usize,
}

/// A child process with its output captured to a file.
pub struct Process {
    pub name: String,
    child: Child,
    log: PathBuf,
    watch: Arc<Mutex<Watch>>,
    /// Ends (its sender dropped) when both output pipes are closed: the process has exited
    /// or closed them.
    eof: mpsc::Receiver<()>,
    /// Its exit as an event, opened while it cannot have been reaped, so that its pid names
    /// it and no later process.
    exit: ExitWatch,
    paused: bool,
    /// Whether a test that panics prints the end of this process's log (see
    /// [`Process::quiet_on_failure`]).
    print_on_panic: bool,
}

impl Process {
    /// Spawns `cmd` (stdin closed, stdout and stderr to `log`, appended, so that a restarted
    /// process's log follows its predecessor's).
    pub fn spawn(name: &str, cmd: Command, log: &Path) -> Result<Process> {
        Process::spawn_watched(name, cmd, log, Arc::new(Mutex::new(Watch::default())))
    }

    fn spawn_watched(
        name: &str,
        mut cmd: Command,
        log: &Path,
        watch: Arc<Mutex<Watch>>,
    ) -> Result<Process> {
        let io = |what: String| move |e| Error::Io { what, source: e };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io(format!("open {}", log.display())))?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io(format!("spawn {name}: {cmd:?}")))?;
        let exit = match ExitWatch::of(child.id()) {
            Ok(exit) => exit,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        let file = Arc::new(Mutex::new(file));
        let (eof_tx, eof) = mpsc::channel();
        watch.lock().expect("log watch").open_pipes = 2;
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("piped"));
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().expect("piped"));
        // The guard exists before the reading threads, so that the child is killed if one
        // of them cannot be started.
        let process = Process {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            watch: watch.clone(),
            eof,
            exit,
            paused: false,
            print_on_panic: true,
        };
        for pipe in [out, err] {
            let (watch, file, eof_tx) = (watch.clone(), file.clone(), eof_tx.clone());
            std::thread::Builder::new()
                .name(format!("{name}-log"))
                .spawn(move || copy_lines(pipe, &file, &watch, eof_tx))
                .map_err(io("spawn a log thread".into()))?;
        }
        Ok(process)
    }

    /// Keeps this process's log out of a failing test's output (it stays in its file): for
    /// helpers such as etcd, whose chatter would bury the nodes' logs.
    pub fn quiet_on_failure(&mut self) {
        self.print_on_panic = false;
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Waits until the process prints a line containing `pattern` (a line printed from now
    /// on), up to `deadline`; an error if it exits first or the deadline passes.
    pub fn wait_for_line(&mut self, pattern: &str, deadline: Duration) -> Result<String> {
        let (tx, rx) = mpsc::channel();
        {
            let mut w = self.watch.lock().expect("log watch");
            // With both pipes closed nothing more can be printed: dropping `tx` says so.
            if w.open_pipes > 0 {
                w.waiters.push((pattern.to_string(), tx));
            }
        }
        self.wait_line(rx, pattern, deadline)
    }

    /// Waits for the line a waiter registered with `rx` is told of.
    fn wait_line(
        &mut self,
        rx: mpsc::Receiver<String>,
        pattern: &str,
        deadline: Duration,
    ) -> Result<String> {
        match rx.recv_timeout(deadline) {
            Ok(line) => Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(Error::Timeout(format!(
                "{} did not print {pattern:?} within {deadline:?}; the end of {}:\n{}",
                self.name,
                self.log.display(),
                self.log_tail()
            ))),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.wait_exit(deadline).ok();
                Err(Error::Exited(format!(
                    "{} exited ({}) before printing {pattern:?}; the end of {}:\n{}",
                    self.name,
                    status.map(|s| s.to_string()).unwrap_or_default(),
                    self.log.display(),
                    self.log_tail()
                )))
            }
        }
    }

    /// Spawns `cmd` and waits until it prints a line containing `ready`.
    pub fn spawn_ready(
        name: &str,
        cmd: Command,
        log: &Path,
        ready: &str,
        deadline: Duration,
    ) -> Result<Process> {
        // The waiter is in the watch before the process starts, so the line cannot be
        // printed before anyone listens for it.
        let (tx, rx) = mpsc::channel();
        let pending = Arc::new(Mutex::new(Watch {
            waiters: vec![(ready.to_string(), tx)],
            open_pipes: 0,
        }));
        let mut p = Process::spawn_watched(name, cmd, log, pending)?;
        p.wait_line(rx, ready, deadline)?;
        Ok(p)
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) -> Result<()> {
        // SAFETY: kill with our own child's pid (not yet reaped: `child` is not waited for
        // until drop or `wait_exit`) and a signal number.
        if unsafe { libc::kill(self.child.id() as libc::pid_t, signal) } != 0 {
            return Err(Error::Io {
                what: format!("signal {signal} to {}", self.name),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// SIGKILL, then waits for the exit.
    pub fn kill9(&mut self) -> Result<ExitStatus> {
        self.signal(libc::SIGKILL)?;
        self.wait_exit(Duration::from_secs(30))
    }

    /// SIGSTOP, returning once the process has stopped (its sockets stay open, unanswered).
    pub fn pause(&mut self) -> Result<()> {
        self.signal(libc::SIGSTOP)?;
        self.paused = true;
        self.wait_state(libc::WSTOPPED, "stop")
    }

    /// SIGCONT after [`Process::pause`], returning once the process runs again.
    pub fn resume(&mut self) -> Result<()> {
        self.signal(libc::SIGCONT)?;
        self.paused = false;
        self.wait_state(libc::WCONTINUED, "continue")
    }

    /// Waits for the kernel to report that the child stopped or continued (`which`), or
    /// exited; the report is left in place (`WNOWAIT`), so the exit can still be reaped.
    fn wait_state(&self, which: libc::c_int, what: &str) -> Result<()> {
        // SAFETY: waitid on our own, not yet reaped, child with a zeroed siginfo to fill.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                self.child.id() as libc::id_t,
                &mut info,
                which | libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r != 0 {
            return Err(Error::Io {
                what: format!("wait for {} to {what}", self.name),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Waits until the process exits (its output pipes closing is the event), up to
    /// `deadline`.
    pub fn wait_exit(&mut self, deadline: Duration) -> Result<ExitStatus> {
        let start = Instant::now();
        // Both pipes close when the process exits, once its last lines are in the log (or a
        // child it left holds them: then the deadline below still bounds the wait).
        let _ = self.eof.recv_timeout(deadline);
        if !self.exit.wait(deadline.saturating_sub(start.elapsed())) {
            return Err(Error::Timeout(format!(
                "{} did not exit within {deadline:?}",
                self.name
            )));
        }
        self.child.wait().map_err(|e| Error::Io {
            what: format!("wait for {}", self.name),
            source: e,
        })
    }

    /// Its exit as an event ([`ExitWatch`]): a wait for what it should write can end when it
    /// exits ([`crate::watch::LineWatch::wait_lines_or_exit`]).
    pub fn exit_watch(&self) -> &ExitWatch {
        &self.exit
    }

    /// The end of the log, for a failure message.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Why a process that should be making progress may not be, for a failure message:
    /// whether it exited (and how), and the end of its log ([`explain`]).
    pub fn explain(&mut self) -> String {
        let exited = self.child.try_wait().ok().flatten();
        explain(&self.name, exited, &self.log)
    }
}

/// `name`'s exit status if it has exited (`None`: still running), and the last lines of its
/// log at `log`: a wait for what a child should produce (a load's acknowledgements) that
/// gives up says why, where otherwise the cause would be in that log only.
pub fn explain(name: &str, exited: Option<ExitStatus>, log: &Path) -> String {
    let state = match exited {
        Some(status) => format!("{name} exited ({status})"),
        None => format!("{name} is still running"),
    };
    let tail = log_tail(log);
    let mut last: Vec<&str> = tail.lines().rev().take(EXPLAIN_LINES).collect();
    last.reverse();
    format!(
        "{state}; the end of {}:\n{}",
        log.display(),
        last.join("\n")
    )
}

/// The last 16 KiB of the file at `path`.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let from = text.len().saturating_sub(LOG_TAIL);
    String::from_utf8_lossy(&text[from..]).into_owned()
}

fn copy_lines(
    pipe: Box<dyn Read + Send>,
    file: &Mutex<std::fs::File>,
    watch: &Mutex<Watch>,
    _eof: mpsc::Sender<()>,
) {
    let mut reader = BufReader::new(pipe);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => {
                let mut w = watch.lock().expect("log watch");
                w.open_pipes = w.open_pipes.saturating_sub(1);
                if w.open_pipes == 0 {
                    w.waiters.clear();
                }
                return;
            }
            Ok(_) => {}
        }
        if let Ok(mut f) = file.lock() {
            let _ = f.write_all(line.as_bytes());
        }
        let mut w = watch.lock().expect("log watch");
        w.waiters.retain(|(pattern, tx)| {
            if line.contains(pattern.as_str()) {
                let _ = tx.send(line.trim_end().to_string());
                false
            } else {
                true
            }
        });
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.paused {
            let _ = self.signal(libc::SIGCONT);
        }
        let _ = self.signal(libc::SIGKILL);
        let _ = self.child.wait();
        if std::thread::panicking() && self.print_on_panic {
            eprintln!(
                "----- {} ({}), end of its log -----\n{}\n----- end of {} -----",
                self.name,
                self.log.display(),
                self.log_tail(),
                self.name
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_gives_the_exit_status_and_the_last_twenty_lines_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("child.log");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "seq 1 30; exit 3"]);
        let mut p = Process::spawn("child", cmd, &log).expect("spawn sh");
        p.wait_exit(Duration::from_secs(30)).expect("sh exits");
        let why = p.explain();
        assert!(why.starts_with("child exited (exit status: 3);"), "{why}");
        let last: Vec<String> = (11..=30).map(|i| i.to_string()).collect();
        assert!(why.ends_with(&format!(":\n{}", last.join("\n"))), "{why}");
    }
}
