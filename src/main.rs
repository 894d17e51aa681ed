//! The `walserver` binary. Its subcommands arrive with the walsender issue.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("walserver: no subcommands exist yet; see README.md")
}
