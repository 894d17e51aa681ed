//! The `walserver` command.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use walserver::config::{parse_override, Settings, Sources};
use walserver::server::StopMode;

#[derive(Parser)]
#[command(
    name = "walserver",
    version,
    about = "WAL streaming-replication server, wire-compatible with PostgreSQL 15"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Make a new data directory.
    Init {
        #[arg(long)]
        data_dir: PathBuf,
        /// WAL segment size: a power of two from 1MB to 1GB.
        #[arg(long, default_value = "16MB")]
        wal_segment_size: String,
    },
    /// Run a node.
    Run {
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Override a setting: -c key=value (repeatable).
        #[arg(short = 'c', value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// What the first SIGTERM or SIGINT does; a second one is always immediate.
        #[arg(long, value_enum, default_value = "fast")]
        mode: StopMode,
    },
    /// Print a SCRAM-SHA-256 verifier for a password read from standard input, for `[users]`.
    Passwd,
    /// Show a running node's status through its admin API.
    Status {
        /// The admin API address.
        #[arg(long, default_value = "127.0.0.1:8433")]
        http: String,
        /// Print the JSON as the API returns it.
        #[arg(long)]
        json: bool,
        /// Bearer token, if the API requires one (or WALSERVER_HTTP_AUTH_TOKEN).
        #[arg(long, env = "WALSERVER_HTTP_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("walserver: {e:#}");
        std::process::exit(1);
    }
}

fn init_tracing(level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Init {
            data_dir,
            wal_segment_size,
        } => {
            init_tracing("warn");
            let size = walserver::units::parse_size(&wal_segment_size, 1 << 20)
                .map_err(anyhow::Error::msg)?
                .context("wal_segment_size cannot be unlimited")?;
            let id = walserver::init::init_primary(&data_dir, size)?;
            println!(
                "initialised primary data directory {} (system identifier {id})",
                data_dir.display()
            );
            Ok(())
        }
        Command::Run { config, set, mode } => {
            let overrides = set
                .iter()
                .map(|a| parse_override(a))
                .collect::<anyhow::Result<_>>()?;
            let sources = Sources {
                file: config.clone(),
                overrides,
                env: None,
            };
            let settings = Settings::load(&sources)?;
            init_tracing(&settings.log_level);
            walserver::server::run(settings, config.as_deref(), mode)
        }
        Command::Passwd => {
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .context("cannot read the password from standard input")?;
            let password = line.trim_end_matches(['\n', '\r']);
            anyhow::ensure!(!password.is_empty(), "empty password");
            println!("{}", protocol_codec::auth::make_scram_verifier(password));
            Ok(())
        }
        Command::Status { http, json, token } => {
            walserver::cli::status(&http, json, token.as_deref())
        }
    }
}
