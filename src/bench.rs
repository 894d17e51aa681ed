//! `walserver bench`: the load tool is a program of its own, `walserver-bench`, so that the
//! server links none of what only the tool needs (an HDR histogram, SVG plots, a progress
//! bar). The command finds that program beside this executable, where cargo builds both, or
//! else on `PATH`, and replaces this process with it. Replacing rather than spawning keeps the
//! process id, signals and exit status the load's own: a script or test that stops the load
//! by its pid stops the load, and leaves no orphan behind.
//!
//! The load tool's `stream` and `soak` loads run their nodes as `walserver run` children; the
//! tool is told to run this very executable (`WALSERVER_BIN`), as it did when it was linked in.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The load tool's program name.
pub const PROGRAM: &str = "walserver-bench";

/// The `walserver-bench` program for the `walserver` at `exe`: the one in the same directory,
/// else the first on `path` (a `PATH` value), else none. Only executable files count, so a
/// stray file of that name is passed over as a shell would pass it over.
pub fn find(exe: &Path, path: Option<&OsStr>) -> Option<PathBuf> {
    let beside = exe.with_file_name(PROGRAM);
    let on_path = path
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(PROGRAM));
    std::iter::once(beside).chain(on_path).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Runs `walserver-bench ARGS` in place of this process; returns only if that fails.
pub fn exec(args: Vec<OsString>) -> anyhow::Error {
    let exe = match std::env::current_exe().context("cannot find the walserver executable") {
        Ok(exe) => exe,
        Err(e) => return e,
    };
    let Some(program) = find(&exe, std::env::var_os("PATH").as_deref()) else {
        return anyhow::anyhow!(
            "`walserver bench` runs the load tool {PROGRAM}, which is neither beside {} nor on \
             PATH: build it with `cargo build -p {PROGRAM}` (with `--release` for measurements)",
            exe.display()
        );
    };
    let e = std::process::Command::new(&program)
        .args(args)
        .env("WALSERVER_BIN", &exe)
        .exec();
    anyhow::Error::new(e).context(format!("cannot run {}", program.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make(path: &Path, mode: u32) {
        std::fs::create_dir_all(path.parent().expect("a file in a directory"))
            .expect("make the directory");
        std::fs::write(path, "#!/bin/sh\n").expect("write the program");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .expect("set the mode");
    }

    /// The program beside the executable wins over one on `PATH`, a file without an execute
    /// bit is passed over, and with neither there is none.
    #[test]
    fn finds_the_program_beside_then_on_path() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let exe = dir.path().join("bin/walserver");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let path = std::env::join_paths([&a, &b]).expect("a PATH value");
        let check = |expected: Option<PathBuf>| {
            assert_eq!(find(&exe, Some(&path)), expected);
        };
        check(None);
        make(&a.join(PROGRAM), 0o644);
        check(None);
        make(&b.join(PROGRAM), 0o755);
        check(Some(b.join(PROGRAM)));
        make(&exe.with_file_name(PROGRAM), 0o755);
        check(Some(exe.with_file_name(PROGRAM)));
        assert_eq!(find(&dir.path().join("walserver"), None), None);
    }
}
