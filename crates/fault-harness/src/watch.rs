//! Waiting for files, woken by inotify: a test waits for a load's acknowledgement log to
//! reach a number of lines, or for a fact about the files of a directory another process
//! writes (a segment renamed into place), without polling them.

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
        let mut pfd = libc::pollfd {
            fd: self.inotify.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
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
        let start = Instant::now();
        loop {
            let have = self.lines()?;
            if have >= n {
                return Ok(have);
            }
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "{} has {have} lines, not {n}, after {deadline:?}",
                    self.path.display()
                )));
            }
            self.dir.wait_event(left)?;
        }
    }
}

fn io_error(what: &str) -> Error {
    Error::Io {
        what: what.to_string(),
        source: std::io::Error::last_os_error(),
    }
}
