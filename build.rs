//! Records the commit the binary is built from, for `/metrics`' `walserver_build_info`:
//! `git rev-parse` where the source is a git checkout, else `unknown` (a source tarball).
//! `WALSERVER_COMMIT` in the environment wins, for builds that know better.
//!
//! The script reruns when HEAD or the branch it names moves, found through git rather than
//! assumed at `.git/HEAD`: in a linked worktree `.git` is a file, and a path that does not
//! exist makes cargo rerun the script, and so rebuild the whole package, on every build.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    out.status.success().then(|| text.trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=WALSERVER_COMMIT");
    let mut watched = false;
    let branch = git(&["rev-parse", "--symbolic-full-name", "HEAD"]);
    let refs = ["HEAD", "packed-refs"]
        .into_iter()
        .map(str::to_owned)
        .chain(branch.filter(|b| b.starts_with("refs/")));
    for name in refs {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
                watched = true;
            }
        }
    }
    if !watched {
        // Not a git checkout: nothing can move the commit but the environment.
        println!("cargo:rerun-if-changed=build.rs");
    }
    let commit = std::env::var("WALSERVER_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    println!(
        "cargo:rustc-env=WALSERVER_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
}
