//! Waiting for files, woken by inotify: a test waits for a load's acknowledgement log to
//! reach a number of lines, or for a fact about the files of a directory another process
//! writes (a segment renamed into place), without polling them. The process that writes a
//! file can be watched beside it ([`ExitWatch`], a pidfd), so that a wait for lines it will
//! never write ends when it exits, not at the wait's deadline.

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The changes in one directory (a file made, written, closed, renamed in or out, removed),
/// as inotify reports them.
pub struct DirWatch {
    inotify: OwnedFd,
}

impl DirWatch {
    /// Watches `dir`, which must exist.
    pub fn new(dir: &Path) -> Result<DirWatch> {
        // SAFETY: inotify_init1 returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return Err(io_error("inotify_init1"));
        }
        // SAFETY: fd is the descriptor just returned, owned from here on.
        let inotify = unsafe { OwnedFd::from_raw_fd(fd) };
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::Invalid(format!("{} has a NUL byte", dir.display())))?;
        // SAFETY: a valid inotify descriptor and a NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(
                inotify.as_raw_fd(),
                c.as_ptr(),
                libc::IN_MODIFY
                    | libc::IN_CREATE
                    | libc::IN_CLOSE_WRITE
                    | libc::IN_MOVED_TO
                    | libc::IN_MOVED_FROM
                    | libc::IN_DELETE,
            )
        };
        if wd < 0 {
            return Err(io_error(&format!("watch {}", dir.display())));
        }
        Ok(DirWatch { inotify })
    }

    /// Waits until `fact` holds, asking it now and again after each change in the directory,
    /// up to `deadline`; `what` names the wait in the error.
    pub fn wait_until(
        &self,
        what: &str,
        deadline: Duration,
        mut fact: impl FnMut() -> bool,
    ) -> Result<()> {
        let start = Instant::now();
        while !fact() {
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Timeout(format!("{what} after {deadline:?}")));
            }
            self.wait_event(left)?;
        }
        Ok(())
    }

    /// Blocks until the directory reports a change or `timeout` passes, and drains the
    /// events.
    fn wait_event(&self, timeout: Duration) -> Result<()> {
        self.wait_event_or_exit(timeout, None)
    }

    /// As [`DirWatch::wait_event`], and also returns when the process `exit` watches has
    /// exited.
    fn wait_event_or_exit(&self, timeout: Duration, exit: Option<&ExitWatch>) -> Result<()> {
        let watched = |fd: &OwnedFd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let mut pfds: Vec<libc::pollfd> = std::iter::once(&self.inotify)
            .chain(exit.map(|e| &e.pidfd))
            .map(watched)
            .collect();
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: a buffer of valid pollfds, with its length.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(Error::Io {
                what: "poll inotify".into(),
                source: e,
            });
        }
        let mut buf = [0u8; 4096];
        // SAFETY: reading into a buffer of its length from our descriptor (non-blocking).
        while unsafe { libc::read(self.inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) }
            > 0
        {}
        Ok(())
    }
}

/// Counts the lines of a file as it grows (complete lines only: a line counts once its
/// newline is written).
pub struct LineWatch {
    path: PathBuf,
    dir: DirWatch,
    offset: u64,
    lines: usize,
}

impl LineWatch {
    /// Watches `path` (which may not exist yet: its directory is watched).
    pub fn new(path: &Path) -> Result<LineWatch> {
        Ok(LineWatch {
            path: path.to_path_buf(),
            dir: DirWatch::new(path.parent().unwrap_or(Path::new(".")))?,
            offset: 0,
            lines: 0,
        })
    }

    /// The complete lines in the file now.
    pub fn lines(&mut self) -> Result<usize> {
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => {
                return Err(Error::Io {
                    what: format!("open {}", self.path.display()),
                    source: e,
                })
            }
        };
        let io = |e| Error::Io {
            what: "read the watched file".to_string(),
            source: e,
        };
        f.seek(SeekFrom::Start(self.offset)).map_err(io)?;
        let mut rest = Vec::new();
        f.read_to_end(&mut rest).map_err(io)?;
        // Only up to the last newline: a line being written is counted when it is whole.
        if let Some(last) = rest.iter().rposition(|&b| b == b'\n') {
            self.lines += rest[..=last].iter().filter(|&&b| b == b'\n').count();
            self.offset += last as u64 + 1;
        }
        Ok(self.lines)
    }

    /// Waits until the file has at least `n` lines, up to `deadline`; returns the count.
    pub fn wait_lines(&mut self, n: usize, deadline: Duration) -> Result<usize> {
        self.wait_lines_or_exit(n, deadline, None)
    }

    /// As [`LineWatch::wait_lines`], and gives up at once, with [`Error::Exited`], when the
    /// process `writer` watches (the one that writes the file) has exited short of `n`
    /// lines: the lines it wrote before it exited still count.
    pub fn wait_lines_or_exit(
        &mut self,
        n: usize,
        deadline: Duration,
        writer: Option<&ExitWatch>,
    ) -> Result<usize> {
        let start = Instant::now();
        loop {
            // Asked before the count, so that a writer that exits in between has its last
            // lines counted by the time its exit is believed.
            let exited = writer.is_some_and(ExitWatch::exited);
            let have = self.lines()?;
            if have >= n {
                return Ok(have);
            }
            if exited {
                return Err(Error::Exited(format!(
                    "{} has {have} lines, not {n}: its writer exited after {:?}",
                    self.path.display(),
                    start.elapsed()
                )));
            }
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "{} has {have} lines, not {n}, after {deadline:?}",
                    self.path.display()
                )));
            }
            self.dir.wait_event_or_exit(left, writer)?;
        }
    }
}

/// A process's exit as an event a wait can take beside a file's changes: a pidfd, readable
/// once the process has exited.
pub struct ExitWatch {
    pidfd: OwnedFd,
}

impl ExitWatch {
    /// Watches the process `pid`, a child of this process not reaped yet (so that the pid
    /// still names it, even once it has exited).
    pub fn of(pid: u32) -> Result<ExitWatch> {
        let pid = libc::pid_t::try_from(pid)
            .map_err(|_| Error::Invalid(format!("{pid} is not a process id")))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor (close-on-exec)
        // or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io_error(&format!("pidfd_open({pid})")));
        }
        let fd = i32::try_from(fd).map_err(|_| Error::Invalid(format!("descriptor {fd}")))?;
        // SAFETY: fd is the descriptor just returned, owned from here on.
        Ok(ExitWatch {
            pidfd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Whether the process has exited (asked without waiting).
    pub fn exited(&self) -> bool {
        self.wait(Duration::ZERO)
    }

    /// Waits up to `timeout` for the process to exit; whether it has.
    pub fn wait(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            let mut pfd = libc::pollfd {
                fd: self.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let left = timeout.saturating_sub(start.elapsed());
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r > 0 {
                return true;
            }
            // Interrupted by a signal: asked again for what is left; otherwise time is up.
            let interrupted =
                r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
            if !interrupted || start.elapsed() >= timeout {
                return false;
            }
        }
    }
}

fn io_error(what: &str) -> Error {
    Error::Io {
        what: what.to_string(),
        source: std::io::Error::last_os_error(),
    }
}
