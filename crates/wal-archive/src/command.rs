//! `archive_command`: PostgreSQL's contract, so WAL-G, pgBackRest and barman-cloud archive
//! walserver's WAL unchanged.
//!
//! The command runs through `sh -c` with `%p` replaced by the path of a file holding the
//! object's bytes, `%f` by the object's name and `%%` by `%`, as PostgreSQL substitutes them
//! (unquoted: a path with spaces needs quotes in the command, as there). Exit status 0 means
//! the file is durably stored; anything else is a failure, retried with the archiver's
//! backoff, the same file again. The command must itself refuse to overwrite an object with
//! other contents (the tools named do); it gets no checksum sidecar, since each tool keeps
//! its own.
//!
//! The file is written into a staging directory the node owns (`DATA/archive_staging`), read
//! from storage and never opened in `pg_wal` behind storage's back, and removed after the
//! command ends. A command cannot be listed or read back, so with one there are no
//! `archive_timeout` prefixes to supersede (the node refuses the combination) and restore
//! goes through the tool's own `restore_command`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{ArchiveError, Result};
use crate::target::Put;

/// How much of a failed command's standard error the status and the log show. A guess:
/// enough for a tool's one-line reason, small enough for `/status`.
const STDERR_TAIL: usize = 512;

/// An `archive_command` and where it finds its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveCommand {
    pub command: String,
    /// A directory of the node's own for the files `%p` names; made when missing.
    pub staging: PathBuf,
}

impl ArchiveCommand {
    /// Writes `bytes` to the staging directory as `name` and runs the command on it.
    /// Blocking: run it on a blocking pool.
    pub fn put(&self, name: &str, bytes: &[u8]) -> Result<Put> {
        let fail = |what: &str, path: &Path| {
            let context = format!("archiving {name}: {what} {}", path.display());
            move |e| ArchiveError::io(context, e)
        };
        fs::create_dir_all(&self.staging).map_err(fail("creating", &self.staging))?;
        let path = self.staging.join(name);
        fs::write(&path, bytes).map_err(fail("writing", &path))?;
        let line = substitute(&self.command, &path, name);
        let output = Command::new("/bin/sh")
            .arg("-c")
            .arg(&line)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        let _ = fs::remove_file(&path);
        let output = output.map_err(fail("running archive_command on", &path))?;
        if output.status.success() {
            return Ok(Put::Stored);
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail = tail(stderr.trim_end(), STDERR_TAIL);
        Err(ArchiveError::Command {
            name: name.to_string(),
            status: output.status.to_string(),
            stderr: tail.to_string(),
        })
    }
}

/// `command` with `%p`, `%f` and `%%` replaced, as PostgreSQL's archiver does; any other
/// `%` is kept as it is.
fn substitute(command: &str, path: &Path, name: &str) -> String {
    let mut out = String::with_capacity(command.len() + 64);
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('p') => out.push_str(&path.to_string_lossy()),
            Some('f') => out.push_str(name),
            Some('%') => out.push('%'),
            _ => {
                out.push('%');
                continue;
            }
        }
        chars.next();
    }
    out
}

/// The last `max` bytes of `text`, cut at a character boundary.
fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_postgres_s() {
        let p = Path::new("/d/archive_staging/000000010000000000000001");
        assert_eq!(
            substitute("cp %p /a/%f && echo 100%% %x %", p, "000000010000000000000001"),
            "cp /d/archive_staging/000000010000000000000001 /a/000000010000000000000001 && echo 100% %x %"
        );
    }

    #[test]
    fn exit_zero_stores_and_anything_else_fails_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let cmd = ArchiveCommand {
            command: format!("cp %p {}/%f && sync {}/%f", out.display(), out.display()),
            staging: dir.path().join("staging"),
        };
        // The destination does not exist yet: cp fails, and says why.
        let e = cmd.put("00000002.history", b"h").unwrap_err();
        assert!(
            matches!(&e, ArchiveError::Command { name, stderr, .. }
                if name == "00000002.history" && stderr.contains("out")),
            "{e}"
        );
        fs::create_dir(&out).unwrap();
        assert_eq!(cmd.put("00000002.history", b"h").unwrap(), Put::Stored);
        assert_eq!(fs::read(out.join("00000002.history")).unwrap(), b"h");
        // The staged copy is gone either way.
        assert_eq!(fs::read_dir(dir.path().join("staging")).unwrap().count(), 0);
    }
}
