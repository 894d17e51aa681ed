//! The `walserver` command.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use walserver::server::StopMode;
use walserver_node::config::{parse_override, Settings, Sources};
use walserver_node::logging::LogFormat;

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
    /// Make a new data directory: a primary's, or with --standby a standby's that adopts its
    /// upstream's system identifier, timeline history and kind of WAL.
    Init {
        /// The data directory to make; it must not exist or be empty.
        #[arg(long)]
        data_dir: PathBuf,
        /// WAL segment size of a new primary: a power of two from 1MB to 1GB. A standby takes
        /// its upstream's.
        #[arg(long, default_value = "16MB")]
        wal_segment_size: String,
        /// Make a standby of the upstream named by --primary-conninfo.
        #[arg(long, requires = "primary_conninfo")]
        standby: bool,
        /// libpq connection string of the upstream (key=value or postgresql:// URI).
        #[arg(long)]
        primary_conninfo: Option<String>,
        /// Start at this slot's restart point (and stream through it).
        #[arg(long)]
        primary_slot_name: Option<String>,
        /// Start here instead of at the start of the upstream's current segment.
        #[arg(long)]
        start_lsn: Option<wal_storage::Lsn>,
        /// Make a primary from the WAL archive (archive_target, from --config or -c), up to
        /// the end of its newest timeline or the --target-* given; with --standby, a standby
        /// of --primary-conninfo restored as far as the archive and the upstream both go,
        /// which streams from there.
        #[arg(long, conflicts_with = "start_lsn")]
        from_archive: bool,
        /// With --from-archive: keep every record that ends at or before this LSN.
        #[arg(long, requires = "from_archive", conflicts_with = "standby")]
        target_lsn: Option<wal_storage::Lsn>,
        /// With --from-archive: keep what the archive shows was durable at or before this
        /// time, YYYY-MM-DD HH:MM:SS.ffffff+00 (UTC): up to the end of the last object stored
        /// by then, so within one segment (or one archive_timeout prefix) of the time.
        #[arg(long, requires = "from_archive", conflicts_with = "standby")]
        target_time: Option<String>,
        /// With --from-archive: restore this timeline (default: the archive's newest).
        #[arg(long, requires = "from_archive")]
        target_timeline: Option<u32>,
        /// With --from-archive: TOML configuration file naming archive_target.
        #[arg(long, requires = "from_archive")]
        config: Option<PathBuf>,
        /// With --from-archive: override a setting, -c key=value (repeatable).
        #[arg(short = 'c', value_name = "KEY=VALUE", requires = "from_archive")]
        set: Vec<String>,
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
    /// Promote a standby through its admin API: it stops following, starts the next timeline
    /// and takes appends.
    Promote {
        /// The admin API address.
        #[arg(long, default_value = "127.0.0.1:8433")]
        http: String,
        /// Bearer token, if the API requires one (or WALSERVER_HTTP_AUTH_TOKEN).
        #[arg(long, env = "WALSERVER_HTTP_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Make a node whose WAL forked from its new upstream's history follow it: drop the
    /// divergent tail (saying how much), and mark the node a standby. Run with the node stopped.
    Rejoin {
        /// The stopped node's data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// The new upstream.
        #[arg(long)]
        primary_conninfo: String,
        /// The replication slot to stream from on the new upstream, if any.
        #[arg(long)]
        primary_slot_name: Option<String>,
    },
    /// Append records through a node's admin API: records from standard input (one per line,
    /// or the whole input with --raw), or --count generated records of --size bytes.
    Append {
        /// The admin API address.
        #[arg(long, default_value = "127.0.0.1:8433")]
        http: String,
        /// Append this many generated records instead of reading standard input.
        #[arg(long)]
        count: Option<usize>,
        /// Size in bytes of each generated record (with --count).
        #[arg(long, default_value_t = 100)]
        size: usize,
        /// local, remote_write, on (remote flush) or remote_apply; default: the node's
        /// synchronous_commit.
        #[arg(long)]
        durability: Option<String>,
        /// Records per request.
        #[arg(long, default_value_t = 256)]
        batch: usize,
        /// Take all of standard input as one record.
        #[arg(long)]
        raw: bool,
        /// Bearer token, if the API requires one (or WALSERVER_HTTP_AUTH_TOKEN).
        #[arg(long, env = "WALSERVER_HTTP_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// A cluster in one process: a primary, a synchronous standby and a cascading one; appends
    /// for a few seconds, shows the status, promotes, shows the others following.
    Demo {
        /// How long to append.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// Print a SCRAM-SHA-256 verifier for a password read from standard input, for `[users]`.
    Passwd,
    /// Load tools, run by the `walserver-bench` program: `append` and `stream` loads with
    /// latency percentiles and plots, `catchup` (a discarding protocol client), `wait-lsn`
    /// (times a standby catching up); `walserver bench --help` lists them all.
    // The load tool parses its own arguments, `--help` included.
    #[command(disable_help_flag = true)]
    Bench {
        /// The load tool's subcommand and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Automatic failover: list the cluster's members, switch over, fail over, pause and
    /// resume automatic action, show the history of terms, through one member's admin API.
    #[command(subcommand)]
    Cluster(walserver::cluster::ClusterCommand),
    /// PostgreSQL's restore_command: fetch the file %f from the archive (archive_target),
    /// check it against its checksum and write it to %p whole. Exits 1 if the archive does not
    /// have it, 200 (PostgreSQL then stops recovery) if it is damaged or unreadable.
    RestoreWal {
        /// TOML configuration file naming archive_target; data_dir is not needed.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Override a setting: -c key=value (repeatable).
        #[arg(short = 'c', value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Also fetch the next N segments in the background into pg_wal/.walserver-prefetch,
        /// checked, for the next calls to take (as WAL-G does); 0 turns it off.
        #[arg(long, value_name = "N", default_value_t = 0)]
        prefetch: u32,
        /// Be the background fetch of --prefetch, for segments of this many bytes: fetch the N
        /// segments after %f into the spool beside %p, and write nothing to %p.
        #[arg(long, hide = true, value_name = "BYTES", requires = "prefetch")]
        prefetch_worker: Option<u64>,
        /// The file's name in the archive (%f).
        file: String,
        /// Where to write it (%p).
        path: PathBuf,
    },
    /// The WAL archive (archive_target): list its timelines, segments and gaps, or verify
    /// every object's checksum and each timeline's continuity.
    Archive {
        #[command(subcommand)]
        command: walserver::archive::ArchiveCommand,
        /// TOML configuration file naming archive_target; data_dir is not needed.
        #[arg(long, global = true)]
        config: Option<PathBuf>,
        /// Override a setting: -c key=value (repeatable).
        #[arg(short = 'c', value_name = "KEY=VALUE", global = true)]
        set: Vec<String>,
    },
    /// Show a running node's status through its admin API.
    Status {
        /// The admin API address.
        #[arg(long, default_value = "127.0.0.1:8433")]
        http: String,
        /// Print the JSON as the API returns it.
        #[arg(long)]
        json: bool,
        /// Every column of the tables, whole (wider than 100 columns).
        #[arg(long)]
        wide: bool,
        /// Bearer token, if the API requires one (or WALSERVER_HTTP_AUTH_TOKEN).
        #[arg(long, env = "WALSERVER_HTTP_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

/// The crash point a test's node dies at (`wal_storage::crash`): `POINT[:PASS]`.
const CRASH_AT_VAR: &str = "WALSERVER_TEST_CRASH_AT";

/// Arms the crash point [`CRASH_AT_VAR`] names, if any.
fn arm_crash_point() -> anyhow::Result<()> {
    match std::env::var_os(CRASH_AT_VAR) {
        Some(spec) => arm_crash_point_at(&spec.to_string_lossy()),
        None => Ok(()),
    }
}

#[cfg(feature = "failpoints")]
fn arm_crash_point_at(spec: &str) -> anyhow::Result<()> {
    let names: Vec<&str> = (wal_storage::FAILPOINTS.iter().copied())
        .chain(walsender_actor::overlap::CRASH_POINTS.iter().copied())
        .chain([walreceiver_actor::CRASH_REPLY])
        .collect();
    match wal_storage::crash::parse(spec) {
        Some((point, pass)) if names.contains(&point) => {
            wal_storage::crash::arm(point, pass);
            Ok(())
        }
        _ => anyhow::bail!("{CRASH_AT_VAR}={spec}: not POINT[:PASS] with POINT one of {names:?}"),
    }
}

/// A build without the `failpoints` feature has no crash points and refuses the variable, so
/// that a test never waits for a death that cannot come.
#[cfg(not(feature = "failpoints"))]
fn arm_crash_point_at(spec: &str) -> anyhow::Result<()> {
    anyhow::bail!("{CRASH_AT_VAR}={spec}: this build has no crash points (feature `failpoints`)")
}

fn main() {
    if let Err(e) = arm_crash_point() {
        eprintln!("walserver: {e:#}");
        std::process::exit(1);
    }
    let cli = Cli::parse();
    let code = match cli.command {
        // restore_command's exit status is a contract with PostgreSQL, not just 0 or 1.
        Command::RestoreWal {
            config,
            set,
            prefetch,
            prefetch_worker: Some(segment_size),
            file,
            path,
        } => {
            // In the background, with no one to read a message: a fetch that fails leaves the
            // file to the next call, which reads the archive itself.
            let _ = (|| {
                let target = archive_target(config, &set)?;
                walserver::restore::prefetch(&target, &file, &path, prefetch, segment_size)
            })();
            0
        }
        Command::RestoreWal {
            config,
            set,
            prefetch,
            file,
            path,
            ..
        } => restore_wal(config, &set, prefetch, &file, &path),
        command => match run(command) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("walserver: {e:#}");
                1
            }
        },
    };
    std::process::exit(code);
}

/// The sources of settings that `--config` and `-c` name, with the process environment.
fn sources(config: Option<PathBuf>, set: &[String]) -> anyhow::Result<Sources> {
    let overrides = set
        .iter()
        .map(|a| parse_override(a))
        .collect::<walserver_node::Result<_>>()?;
    Ok(Sources {
        file: config,
        overrides,
        env: None,
    })
}

/// The archive named by the configuration file and `-c` overrides of an archive command
/// (`restore-wal`, `archive`, `init --from-archive`), which need no data directory.
fn archive_target(
    config: Option<PathBuf>,
    set: &[String],
) -> anyhow::Result<wal_archive::ArchiveTarget> {
    let settings = Settings::load_without_data_dir(&sources(config, set)?)?;
    Ok(walserver_node::archive::archive_target(&settings)?)
}

fn restore_wal(
    config: Option<PathBuf>,
    set: &[String],
    prefetch: u32,
    file: &str,
    path: &Path,
) -> i32 {
    use walserver::restore::{restore_wal_prefetching, Restored, EXIT_FAILED, EXIT_MISSING};
    let restored = (|| {
        let target = archive_target(config.clone(), set)?;
        restore_wal_prefetching(&target, file, path, prefetch)
    })();
    match restored {
        Ok((Restored::Written(_), start)) => {
            if let Some(segment_size) = start {
                start_prefetch(config.as_deref(), set, prefetch, segment_size, file, path);
            }
            0
        }
        // PostgreSQL asks for files that do not exist as a matter of course: no message.
        Ok((Restored::Missing, _)) => EXIT_MISSING,
        Err(e) => {
            eprintln!("walserver restore-wal: cannot restore {file}: {e:#}");
            EXIT_FAILED
        }
    }
}

/// Starts `walserver restore-wal --prefetch-worker` for the `count` segments after `file`,
/// detached (its own process group, no output) so that PostgreSQL goes on at once. One that
/// cannot start costs only speed.
fn start_prefetch(
    config: Option<&Path>,
    set: &[String],
    count: u32,
    segment_size: u64,
    file: &str,
    path: &Path,
) {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut c = std::process::Command::new(exe);
    c.arg("restore-wal");
    if let Some(config) = config {
        c.arg("--config").arg(config);
    }
    for s in set {
        c.arg("-c").arg(s);
    }
    c.args(["--prefetch", &count.to_string()])
        .args(["--prefetch-worker", &segment_size.to_string()])
        .arg(file)
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let _ = c.spawn();
}

/// Sets up logging to standard error: `level` is a `log_level` filter (PostgreSQL's level names
/// or tracing's), overridden by `RUST_LOG` when that is set and valid. Colours only when
/// standard error is a terminal and `NO_COLOR` is not set, so that piped and collected logs
/// carry no escape codes.
fn init_tracing(level: &str, format: LogFormat) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = match EnvFilter::try_from_default_env() {
        Ok(f) => f,
        Err(_) => {
            let directives =
                walserver_node::logging::filter_directives(level).map_err(anyhow::Error::msg)?;
            EnvFilter::try_new(&directives)
                .with_context(|| format!("invalid log_level {level:?}"))?
        }
    };
    // A log line that cannot be written (standard error on a full disk) is lost, never a
    // panic: tracing-subscriber reports such a failure with `eprintln!`, which panics when
    // standard error fails too, and so killed whichever thread logged (the WAL writer's, the
    // supervisor's).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Init {
            data_dir,
            from_archive: true,
            standby: true,
            primary_conninfo: Some(conninfo),
            primary_slot_name,
            config,
            set,
            ..
        } => {
            init_tracing("warn", LogFormat::Text)?;
            let target = archive_target(config, &set)?;
            let r = walserver_node::from_archive::init_standby_from_archive(
                &data_dir,
                &target,
                &conninfo,
                primary_slot_name.as_deref(),
            )?;
            println!(
                "initialised standby data directory {} from the archive (system identifier {}): WAL of timeline {} from {} to {}, {} objects read; it streams from there",
                data_dir.display(),
                r.system_id,
                r.timeline.0,
                r.start,
                r.end,
                r.objects,
            );
            Ok(())
        }
        Command::Init {
            data_dir,
            from_archive: false,
            standby: true,
            primary_conninfo: Some(conninfo),
            primary_slot_name,
            start_lsn,
            ..
        } => {
            init_tracing("warn", LogFormat::Text)?;
            let id = walserver_node::init::init_standby(
                &data_dir,
                &conninfo,
                primary_slot_name.as_deref(),
                start_lsn,
            )?;
            println!(
                "initialised standby data directory {} (system identifier {}, timeline {}, {} WAL from {}, starting at {})",
                data_dir.display(),
                id.system_id,
                id.start_timeline().0,
                id.format,
                id.server_version,
                id.start_lsn()
            );
            Ok(())
        }
        Command::Init {
            data_dir,
            from_archive: true,
            target_lsn,
            target_time,
            target_timeline,
            config,
            set,
            ..
        } => {
            init_tracing("warn", LogFormat::Text)?;
            let target = archive_target(config, &set)?;
            let to = walserver_node::from_archive::RecoveryTarget {
                lsn: target_lsn,
                time: target_time,
                timeline: target_timeline.map(wal_storage::TimelineId),
            };
            let r = walserver_node::from_archive::init_from_archive(&data_dir, &target, &to)?;
            println!(
                "initialised primary data directory {} from the archive (system identifier {}): WAL of timeline {} from {} to {}, {} objects read{}",
                data_dir.display(),
                r.system_id,
                r.timeline.0,
                r.start,
                r.end,
                r.objects,
                r.new_timeline
                    .map(|t| format!("; it goes on as timeline {}", t.0))
                    .unwrap_or_default()
            );
            Ok(())
        }
        Command::Init {
            data_dir,
            wal_segment_size,
            ..
        } => {
            init_tracing("warn", LogFormat::Text)?;
            let size = walserver_node::units::parse_size(&wal_segment_size, 1 << 20)
                .map_err(anyhow::Error::msg)?
                .context("wal_segment_size cannot be unlimited")?;
            let id = walserver_node::init::init_primary(&data_dir, size)?;
            println!(
                "initialised primary data directory {} (system identifier {id})",
                data_dir.display()
            );
            Ok(())
        }
        Command::Run { config, set, mode } => {
            let sources = sources(config, &set)?;
            let settings = Settings::load(&sources)?;
            init_tracing(&settings.log_level, settings.log_format)?;
            walserver::server::run(settings, sources, mode)
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
        Command::Bench { args } => Err(walserver::bench::exec(args)),
        Command::Demo { seconds } => {
            init_tracing("warn", LogFormat::Text)?;
            walserver::demo::run(seconds)
        }
        Command::Promote { http, token } => walserver::cli::promote(&http, token.as_deref()),
        Command::Rejoin {
            data_dir,
            primary_conninfo,
            primary_slot_name,
        } => {
            init_tracing("warn", LogFormat::Text)?;
            walserver::rejoin::rejoin(&data_dir, &primary_conninfo, primary_slot_name.as_deref())
        }
        Command::Append {
            http,
            count,
            size,
            durability,
            batch,
            raw,
            token,
        } => walserver::cli::append(
            &http,
            count,
            size,
            durability.as_deref(),
            batch,
            raw,
            token.as_deref(),
        ),
        Command::Status {
            http,
            json,
            wide,
            token,
        } => walserver::cli::status(&http, json, wide, token.as_deref()),
        Command::Cluster(cmd) => walserver::cluster::run(cmd),
        Command::Archive {
            command,
            config,
            set,
        } => {
            let target = archive_target(config, &set)?;
            walserver::archive::run(&target, &command)
        }
        Command::RestoreWal { .. } => unreachable!("main runs restore-wal itself"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option and argument of every command, the load tools' included (`walserver
    /// bench` runs `walserver-bench`, whose commands are the library's), says what it is in
    /// `--help`.
    #[test]
    fn every_cli_option_has_help_text() {
        use clap::CommandFactory;
        fn missing(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    out.push(format!("{path} --{}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    out.push(format!("{path} {} (the command)", sub.get_name()));
                }
                missing(sub, &format!("{path} {}", sub.get_name()), out);
            }
        }
        let mut out = Vec::new();
        missing(&Cli::command(), "walserver", &mut out);
        let bench = clap::Command::new("bench").about("the load tools");
        let bench = <walserver_bench::BenchCommand as clap::Subcommand>::augment_subcommands(bench);
        missing(&bench, "walserver bench", &mut out);
        assert!(out.is_empty(), "without help text: {out:#?}");
    }
}
