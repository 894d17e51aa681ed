//! pg_receivewal as a test runs it: in a directory of its own, started, stopped, killed.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use fault_harness::watch::DirWatch;
use pg_testkit::PgBin;
use wal_storage::{segment_file_name, TimelineId};

use super::DEADLINE;

/// pg_receivewal run against a node, in a directory of its own, with its log beside that
/// directory. It is killed when dropped, and a failing test prints its log, because the
/// temporary directory holding the log is gone by the time anyone could read it.
pub struct Receiver {
    bin: PgBin,
    /// libpq's connection string, given with `-d` (a host list finds the leader).
    conninfo: String,
    root: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

impl Receiver {
    /// A receiver that connects with `conninfo` and will stream with `args` (beyond the
    /// connection options).
    pub fn new(bin: &PgBin, conninfo: &str, args: &[&str]) -> Receiver {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("wal")).unwrap();
        Receiver {
            bin: bin.clone(),
            conninfo: conninfo.to_string(),
            root,
            args: args.iter().map(|a| a.to_string()).collect(),
            child: None,
        }
    }

    pub fn dir(&self) -> PathBuf {
        self.root.path().join("wal")
    }

    pub fn log(&self) -> PathBuf {
        self.root.path().join("pg_receivewal.log")
    }

    /// pg_receivewal with the connection options; `--no-loop` makes any error end it at once
    /// instead of retrying after five seconds, so a failure shows in its log, not as a hang.
    pub fn command(&self) -> Command {
        let mut c = Command::new(self.bin.tool("pg_receivewal"));
        c.arg("-d")
            .arg(&self.conninfo)
            .args(["--no-password", "--no-loop", "--verbose"])
            .arg("-D")
            .arg(self.dir());
        c
    }

    /// Runs pg_receivewal once with `args` to completion (`--create-slot`, say).
    pub fn run_once(&self, args: &[&str]) {
        let out = self.command().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "pg_receivewal {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn start(&mut self) {
        assert!(self.child.is_none(), "pg_receivewal is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        let child = self
            .command()
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start pg_receivewal");
        self.child = Some(child);
    }

    /// Waits until pg_receivewal has completed segment `segno` (the file lost its .partial).
    pub fn wait_for_segment(&self, segno: u64, seg: u64) {
        let path = self
            .dir()
            .join(segment_file_name(TimelineId(1), segno, seg));
        // pg_receivewal completes a segment by renaming it into place: the rename wakes this.
        DirWatch::new(&self.dir())
            .and_then(|w| {
                w.wait_until(
                    &format!("pg_receivewal to complete {}", path.display()),
                    DEADLINE,
                    || path.exists(),
                )
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Ends pg_receivewal with SIGKILL, as a crash would (PostgreSQL's documentation stops it
    /// with SIGINT, the clean way), but never while it zero-fills a new segment file. pg_receivewal creates each segment as a .partial file and pads it to the
    /// full segment size before writing WAL into it; killed in between, it leaves a .partial
    /// file that is neither empty nor full, and a restarted pg_receivewal refuses it ("has N
    /// bytes, should be 0 or S") and cannot resume at all. That is pg_receivewal's own
    /// limitation, which says nothing about the server, so the kill is timed around it: the
    /// process is frozen with SIGSTOP, its files are looked at (frozen, they cannot change),
    /// and it is killed only if no .partial file is short; otherwise it is let go on until
    /// its padding is done, and tried again. Everything else a SIGKILL can leave (a full
    /// .partial file with WAL written part of the way) pg_receivewal resumes from by
    /// streaming that segment again from its start.
    pub fn kill_hard(&mut self, seg: u64) {
        let mut child = self.child.take().expect("pg_receivewal is running");
        let pid = child.id() as libc::pid_t;
        let watch = DirWatch::new(&self.dir()).unwrap_or_else(|e| panic!("{e}"));
        loop {
            // SAFETY: kill(2) and waitpid(2) on our own child, which has not been reaped.
            let stopped = unsafe {
                libc::kill(pid, libc::SIGSTOP);
                let mut status = 0;
                libc::waitpid(pid, &mut status, libc::WUNTRACED) == pid && libc::WIFSTOPPED(status)
            };
            assert!(
                stopped,
                "pg_receivewal ended before it could be killed; its log:\n{}",
                self.log_text()
            );
            if self.short_partials(seg).is_empty() {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break;
            }
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
            // Its writes to the directory wake the wait, which was watching before the
            // process went on.
            watch
                .wait_until(
                    "pg_receivewal to finish padding a segment file",
                    DEADLINE,
                    || self.short_partials(seg).is_empty(),
                )
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }

    /// Stops it the way PostgreSQL's documentation says (SIGINT): it flushes and exits 0.
    pub fn stop(&mut self) {
        let mut child = self.child.take().expect("pg_receivewal is running");
        // SAFETY: kill(2) on our own child, which has not been reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "pg_receivewal: {status:?}\n{}",
            self.log_text()
        );
    }

    /// Fails the test at once, with pg_receivewal's log, if it has ended.
    pub fn assert_running(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let exited = child.try_wait().expect("pg_receivewal's state");
            assert!(exited.is_none(), "pg_receivewal ended: {exited:?}");
        }
    }

    /// .partial files that are neither empty nor a whole segment.
    pub fn short_partials(&self, seg: u64) -> Vec<String> {
        std::fs::read_dir(self.dir())
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                let len = e.metadata().ok()?.len();
                (name.ends_with(".partial") && len != 0 && len != seg).then_some(name)
            })
            .collect()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("pg_receivewal's log:\n{}", self.log_text());
        }
    }
}
