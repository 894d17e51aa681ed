//! Records the commit the binary is built from, for `/metrics`' `walserver_build_info`:
//! `git rev-parse` where the source is a git checkout, else `unknown` (a source tarball).
//! `WALSERVER_COMMIT` in the environment wins, for builds that know better.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=WALSERVER_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let commit = std::env::var("WALSERVER_COMMIT").ok().or_else(|| {
        let out = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().to_owned())
    });
    println!(
        "cargo:rustc-env=WALSERVER_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
}
