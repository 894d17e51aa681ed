//! The `walserver-bench` command: the load tool. `walserver bench ARGS` runs it with ARGS in
//! its own place, and sets `WALSERVER_BIN` to itself. Its `stream` and `soak` loads run their
//! nodes as `walserver run` of a `walserver` executable: `--walserver`, `WALSERVER_BIN`, or the
//! one beside this program.

use std::path::PathBuf;

use clap::Parser;
use walserver_bench::{BenchCommand, NodeProgram};

#[derive(Parser)]
#[command(
    name = "walserver-bench",
    version,
    about = "Load tools for walserver (and PostgreSQL 15), also run as `walserver bench`"
)]
struct Cli {
    /// The `walserver` executable a `stream` load runs its primary with; default: the one
    /// beside this program.
    #[arg(long, env = "WALSERVER_BIN", global = true)]
    walserver: Option<PathBuf>,
    #[command(subcommand)]
    command: BenchCommand,
}

fn main() {
    let cli = Cli::parse();
    let program = match cli.walserver {
        Some(path) => Ok(NodeProgram::Path(path)),
        None => std::env::current_exe().map(|exe| NodeProgram::beside(&exe)),
    };
    let result = match program {
        Ok(program) => walserver_bench::run(cli.command, &program),
        Err(e) => Err(anyhow::Error::new(e).context("cannot find this executable")),
    };
    if let Err(e) = result {
        eprintln!("walserver-bench: {e:#}");
        std::process::exit(1);
    }
}
