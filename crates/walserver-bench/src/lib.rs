//! walserver-bench: load tools for people who measure, as the `walserver-bench` program, which
//! `walserver bench` runs (the same subcommands and flags).
//!
//! - `append`: N writers appending records at a durability level, against an in-process
//!   cluster (the embedding path) or a running node's `POST /wal`; throughput, latency
//!   percentiles from an HDR histogram, fsyncs per append, peak RSS, replication lag over time;
//!   the in-process cluster runs the overlapped commit with `--commit-overlap`.
//!   Given several admin APIs, its writers follow the leader (`GET /primary`); appends whose
//!   outcome is unknown are logged as indeterminate, never as acknowledged.
//! - `stream`: catch-up of one or K standbys (walserver standbys, plain codec clients or
//!   pg_receivewal) from a primary holding G GiB; per-standby MB/s and the primary's CPU time
//!   per MB sent.
//! - `catchup`: a plain blocking client (`repl-client`) that streams a WAL range from any server that
//!   speaks PostgreSQL 15's protocol and discards it.
//! - `verify`: checks a node against the acknowledgement log an `append --ack-log` load wrote
//!   ([`acklog`]): every acknowledged record at its position, on its timeline, with its hash;
//!   and how many indeterminate appends the node holds. Every scenario suite ends with
//!   [`judge::judge`], which checks the log against all nodes at once: each record once on
//!   each node, the WAL byte-identical timeline by timeline, the same history files, and no
//!   acknowledgement on an old term.
//! - `wait-lsn`: times another process (a standby) until its IDENTIFY_SYSTEM position
//!   reaches an LSN; `benches/compare-postgres.sh` uses it on both PostgreSQL and walserver.
//! - `soak`: steady appends for minutes with a standby restarted at an interval, sampling
//!   every node's resident memory and descriptors ([`soak`]).
//! - `reliability-table`: the markdown table of the fault scenarios' rows ([`reliability`]);
//!   `failover-table`, the same for the automatic-failover scenarios ([`failover_table`]).
//!
//! It reaches walserver only through public interfaces: nodes are configured and started
//! with `walserver-node` (settings, `init`, `start_node`), in process on actix System threads
//! of their own ([`cluster`]) or as a `walserver run` child process ([`node::ChildNode`], the
//! one type every test suite and the fault harness run nodes with too; [`NodeProgram`] says
//! which executable); running nodes are driven through the admin API's client and its
//! records body format, and the replication protocol through `repl-client` ([`ReplClient`]).
//! What the kernel says about CPU and memory is read in [`sys`]; percentiles, the time series,
//! the progress bar and the SVG plots are [`report`]'s.
//!
//! It owns no part of the server: it depends on `walserver-node`, never on the `walserver`
//! package, and the server does not link it: the `walserver` binary's `bench` command
//! replaces itself with this crate's program, so the server builds without the histogram,
//! plotting and progress-bar crates. The `walserver` package's tests use this crate as a
//! library. Errors are `anyhow` with context, as a command's are: each ends in a message to a
//! person.

pub mod acklog;
mod append;
mod client;
pub mod cluster;
pub mod failover_table;
mod follow;
pub mod judge;
pub mod latency;
mod load;
pub mod node;
pub mod reliability;
pub mod report;
pub mod soak;
mod stream;
pub mod sys;

pub use append::{AppendArgs, AppendReport};
pub use client::{catchup, wait_lsn, WaitReport};
pub use cluster::NodeProgram;
pub use repl_client::ReplClient;
pub use stream::{Client, StreamArgs, StreamReport};

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use wal_storage::Lsn;

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Append load: N writers, record size, durability level, for a time or a volume.
    Append(AppendArgs),
    /// Stream load: catch-up of 1..64 standbys from a primary holding G GiB.
    Stream(StreamArgs),
    /// Steady appends for minutes with a standby restarted at an interval; samples every
    /// node's resident memory and open descriptors into a CSV and an SVG plot.
    Soak(soak::SoakArgs),
    /// The markdown table of the reliability rows the fault scenarios wrote.
    ReliabilityTable {
        /// The directory of rows (default `$CARGO_TARGET_DIR/reliability`, else
        /// `target/reliability`).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The machine named in the heading (default: CPU model, cores and kernel).
        #[arg(long)]
        machine: Option<String>,
        /// A markdown file whose text follows the table (how the rows were made, findings).
        #[arg(long)]
        notes: Option<PathBuf>,
    },
    /// The markdown table of the failover scenarios' rows.
    FailoverTable {
        /// The directory of rows (default `$CARGO_TARGET_DIR/failover`, else
        /// `target/failover`).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The machine named in the heading (default: CPU model, cores and kernel).
        #[arg(long)]
        machine: Option<String>,
        /// A markdown file whose text follows the table.
        #[arg(long)]
        notes: Option<PathBuf>,
    },
    /// Stream [start, end) from a walserver or PostgreSQL server and discard it.
    Catchup {
        /// The server's host.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// The server's replication port.
        #[arg(long, default_value_t = 5433)]
        port: u16,
        /// The replication user.
        #[arg(long, default_value = "postgres")]
        user: String,
        /// Where to start (a segment boundary, as PostgreSQL's clients ask).
        #[arg(long)]
        start: Lsn,
        /// Where to stop; defaults to the server's flush position (IDENTIFY_SYSTEM).
        #[arg(long)]
        end: Option<Lsn>,
        /// The connection's `application_name` (what `pg_stat_replication` and `/status`
        /// show), so a script can tell this client from one that has just left.
        #[arg(long, default_value = "walserver-bench")]
        application_name: String,
        /// Print one JSON object instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Check that a node holds every append an `append --ack-log` load was acknowledged:
    /// each record at its position with its hash. Fails if one is missing.
    Verify {
        /// The acknowledgement log.
        #[arg(long)]
        ack_log: std::path::PathBuf,
        /// The node's admin API (HOST:PORT).
        #[arg(long)]
        http: String,
        /// Bearer token of the node's admin API, if it requires one.
        #[arg(long, env = "WALSERVER_HTTP_AUTH_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print one JSON object instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Draw latency distributions (files of `MICROSECONDS [COUNT]` lines, as
    /// `append --latency-out` writes) as cumulative curves in one SVG.
    LatencyPlot {
        /// One curve: `NAME=FILE` (repeat for several).
        #[arg(long = "series", required = true)]
        series: Vec<String>,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
        /// The plot's title.
        #[arg(long, default_value = "commit latency")]
        title: String,
    },
    /// Wait until a server's IDENTIFY_SYSTEM position reaches an LSN, and say how long it
    /// took (timing a standby that catches up, from outside).
    WaitLsn {
        /// The server's host.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// The server's replication port.
        #[arg(long)]
        port: u16,
        /// The replication user.
        #[arg(long, default_value = "postgres")]
        user: String,
        /// The LSN to wait for.
        #[arg(long)]
        target: Lsn,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 600.0)]
        timeout: f64,
        /// Milliseconds between two IDENTIFY_SYSTEM.
        #[arg(long, default_value_t = 2)]
        interval_ms: u64,
        /// Print one JSON object instead of a sentence.
        #[arg(long)]
        json: bool,
    },
}

/// How a table command finds and draws its rows: the failover and the reliability tables are
/// the same command over different rows.
struct TableSource<R> {
    /// What the rows are, for the error when there are none.
    what: &'static str,
    default_dir: fn(&std::path::Path) -> PathBuf,
    read_rows: fn(&std::path::Path) -> anyhow::Result<Vec<R>>,
    render: fn(&[R], &str, &str) -> String,
}

/// Prints the table of the rows in `dir` (by default `source`'s directory under the working
/// directory), for the machine (given, or this one) and today, then the text of `notes`.
fn print_table<R>(
    source: TableSource<R>,
    dir: Option<PathBuf>,
    machine: Option<String>,
    notes: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let dir = match dir {
        Some(d) => d,
        None => (source.default_dir)(&std::env::current_dir()?),
    };
    let rows = (source.read_rows)(&dir)?;
    anyhow::ensure!(!rows.is_empty(), "no {} in {}", source.what, dir.display());
    let machine = machine.unwrap_or_else(reliability::machine);
    print!(
        "{}",
        (source.render)(&rows, &machine, &reliability::today_utc())
    );
    if let Some(path) = notes {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        print!("\n{text}");
    }
    Ok(())
}

/// Runs a load; `program` is the `walserver` that runs a node as a child process (`stream`).
pub fn run(cmd: BenchCommand, program: &NodeProgram) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Append(args) => append::run(args),
        BenchCommand::LatencyPlot { series, out, title } => {
            let mut curves = Vec::new();
            for s in &series {
                let (name, file) = s
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--series takes NAME=FILE, not {s:?}"))?;
                curves.push((name.to_string(), latency::read(std::path::Path::new(file))?));
            }
            latency::plot(&out, &title, &curves)?;
            println!("wrote {}", out.display());
            Ok(())
        }
        BenchCommand::Stream(args) => stream::run(args, program),
        BenchCommand::Soak(args) => soak::run(args, program),
        BenchCommand::ReliabilityTable {
            dir,
            machine,
            notes,
        } => print_table(
            TableSource {
                what: "reliability rows",
                default_dir: reliability::default_dir,
                read_rows: reliability::read_rows,
                render: reliability::render,
            },
            dir,
            machine,
            notes.as_deref(),
        ),
        BenchCommand::FailoverTable {
            dir,
            machine,
            notes,
        } => print_table(
            TableSource {
                what: "failover rows",
                default_dir: failover_table::default_dir,
                read_rows: failover_table::read_rows,
                render: failover_table::render,
            },
            dir,
            machine,
            notes.as_deref(),
        ),
        BenchCommand::Catchup {
            host,
            port,
            user,
            start,
            end,
            application_name,
            json,
        } => {
            let password = std::env::var("PGPASSWORD").ok();
            let mut c = ReplClient::connect(
                (host.as_str(), port),
                &user,
                password.as_deref(),
                &application_name,
            )?;
            let end = match end {
                Some(e) => e,
                None => c.identify_system().context("IDENTIFY_SYSTEM")?.xlogpos,
            };
            let (bytes, secs) = catchup(&mut c, start, end, None)?;
            let mbps = bytes as f64 / secs / 1e6;
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "bytes": bytes, "seconds": secs, "mb_per_s": mbps })
                );
            } else {
                println!("streamed {bytes} bytes in {secs:.3} s: {mbps:.0} MB/s");
            }
            Ok(())
        }
        BenchCommand::Verify {
            ack_log,
            http,
            token,
            json,
        } => {
            let r = acklog::verify_node(&ack_log, &http, token.as_deref())?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{} acknowledged records in {} appends: {} found, {} lost, {} older than the node keeps",
                    r.records, r.appends, r.found, r.lost, r.unverifiable
                );
                println!(
                    "{} indeterminate appends: {} present on the node, {} torn (some records only)",
                    r.indeterminate, r.indeterminate_present, r.indeterminate_partial
                );
                for e in &r.lost_examples {
                    println!("  lost: {e}");
                }
            }
            anyhow::ensure!(r.lost == 0, "{} acknowledged records are missing", r.lost);
            anyhow::ensure!(
                r.indeterminate_partial == 0,
                "{} indeterminate appends are on the node only in part",
                r.indeterminate_partial
            );
            Ok(())
        }
        BenchCommand::WaitLsn {
            host,
            port,
            user,
            target,
            timeout,
            interval_ms,
            json,
        } => {
            let r = wait_lsn(
                &host,
                port,
                &user,
                target,
                Duration::from_secs_f64(timeout),
                Duration::from_millis(interval_ms),
            )?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "reached {} after {:.3} s (connected after {:.3} s; {} from {} in {:.3} s: {:.0} MB/s)",
                    r.target,
                    r.reached_s,
                    r.connected_s,
                    report::human_bytes(r.window_bytes),
                    r.first_lsn,
                    r.reached_s - r.first_s,
                    r.window_mb_per_s
                );
            }
            Ok(())
        }
    }
}
