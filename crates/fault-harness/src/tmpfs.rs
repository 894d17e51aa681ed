//! A small tmpfs, for a disk that fills up: mounted on a directory the test names, unmounted
//! when dropped. Its source name (`wsf-<pid>-<n>`) marks it as this crate's, so that the
//! mounts of a test process that died before unmounting are swept by the next one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

use crate::netns::run_cmd;
use crate::{Error, Result};

static NEXT: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();

/// A mounted tmpfs.
#[derive(Debug)]
pub struct Tmpfs {
    path: PathBuf,
    mounted: bool,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_bytes` on `path` (created if missing).
    pub fn mount(path: &Path, size_bytes: u64) -> Result<Tmpfs> {
        SWEEP.call_once(sweep_stale);
        std::fs::create_dir_all(path).map_err(|e| Error::Io {
            what: format!("create {}", path.display()),
            source: e,
        })?;
        let source = format!(
            "wsf-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run_cmd(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o"])
                .arg(format!("size={size_bytes}"))
                .arg(&source)
                .arg(path),
        )?;
        Ok(Tmpfs {
            path: path.to_path_buf(),
            mounted: true,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unmounts now (lazily if something still holds it open).
    pub fn unmount(mut self) -> Result<()> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<()> {
        if !self.mounted {
            return Ok(());
        }
        self.mounted = false;
        let r = run_cmd(Command::new("umount").arg(&self.path));
        if r.is_err() {
            run_cmd(Command::new("umount").arg("-l").arg(&self.path))?;
        }
        Ok(())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

/// Unmounts tmpfs mounts of this crate whose process has ended.
fn sweep_stale() {
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return;
    };
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(source), Some(target)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some(pid) = source
            .strip_prefix("wsf-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run_cmd(Command::new("umount").arg("-l").arg(target));
        }
    }
}
