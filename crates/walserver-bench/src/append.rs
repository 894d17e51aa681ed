//! `walserver bench append`: N writers appending records of S bytes at a durability level,
//! against an in-process cluster (the embedding path: `AppendRecords` to the primary's
//! supervisor) or a running node's `POST /wal`, following the leader among several
//! (`follow`).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use serde::Serialize;
use supervisor_actor::{AppendRecords, Durability, Node};
use walsender_actor::status::WalSenderStatus;

use walserver_node::admin::{get_status, get_text};
use walserver_node::records::join_records;

use crate::acklog::AckLog;
use crate::cluster::{Cluster, ClusterOptions};
use crate::follow::{Endpoints, HttpWriter};
use crate::load::{Budget, Stats};
use crate::report::{self, Percentiles, Sample};
use crate::sys;

#[derive(clap::Args, Debug, Clone)]
pub struct AppendArgs {
    /// Concurrent writers, each waiting for its append before sending the next.
    #[arg(long, default_value_t = 1)]
    pub writers: usize,
    /// Record size in bytes.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Records per append (one `AppendRecords` or one `POST /wal`).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// local, remote_write, on (remote flush) or remote_apply.
    #[arg(long, default_value = "on")]
    pub durability: String,
    /// Run this long (default 10 s unless --bytes is given).
    #[arg(long, conflicts_with = "bytes")]
    pub seconds: Option<f64>,
    /// Stop after appending this much payload (`1GB`, `64MB`, bytes).
    #[arg(long)]
    pub bytes: Option<String>,
    /// A running node's admin API (HOST:PORT): append through `POST /wal`. Repeat it (or give
    /// a comma-separated list) for the members of a cluster: each writer follows the leader,
    /// moving to the endpoint whose `GET /primary` answers 200 when an append fails.
    #[arg(long, value_delimiter = ',', conflicts_with = "cluster")]
    pub http: Vec<String>,
    /// Start an in-process cluster of a primary and this many standbys (the default is 1),
    /// the first synchronous, on free loopback ports in temporary directories.
    #[arg(long)]
    pub cluster: Option<usize>,
    /// `synchronous_standby_names` of the in-process primary (default `FIRST 1 (s1)`).
    #[arg(long)]
    pub sync_names: Option<String>,
    /// Where the in-process cluster's directories go (e.g. /dev/shm); default the system's
    /// temporary directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Turn fdatasync off on the in-process nodes (to see what the disk costs).
    #[arg(long)]
    pub no_fsync: bool,
    /// `synchronous_commit_overlap` on the in-process nodes: the primary sends its
    /// synchronous standby each batch once written, while its own fdatasync runs, and
    /// acknowledges at the commit point (its own flush and the standby's).
    #[arg(long, conflicts_with = "http")]
    pub commit_overlap: bool,
    /// Threads that run the in-process writers (tasks on current-thread runtimes).
    #[arg(long, default_value_t = 1)]
    pub writer_threads: usize,
    /// Run the in-process writers as tasks on the primary's own System thread, as an
    /// embedding application's actors would be, instead of on threads of their own.
    #[arg(long)]
    pub writers_in_node: bool,
    /// Threads for each in-process node's walsenders and walreceiver (0: on the node's own
    /// System thread, beside its supervisor and registry).
    #[arg(long, default_value_t = 0)]
    pub io_threads: usize,
    /// Process ids of the remote nodes, for their peak RSS (from /proc).
    #[arg(long = "pid")]
    pub pids: Vec<u32>,
    /// Write every acknowledged append (writer, sequence number, timeline, end LSN, SHA-256 of
    /// each record, when and by whom) to this file, one JSON line each, for `walserver-bench
    /// verify`; appends whose outcome is unknown go to FILE.indeterminate. Records are then
    /// unique (writer, sequence and index, then filler) instead of all alike.
    #[arg(long, requires = "http")]
    pub ack_log: Option<PathBuf>,
    /// Go on after a failed append (counting it) instead of stopping the writer: after a
    /// pause that starts at 10 ms and doubles to 200 ms while appends keep failing. Fault tests
    /// run their load so.
    #[arg(long, requires = "http")]
    pub keep_going: bool,
    /// Give up on one `POST /wal` after this many seconds (an error, so with `--keep-going`
    /// the writer tries again); default: wait as long as it takes.
    #[arg(long, requires = "http")]
    pub request_timeout: Option<f64>,
    /// Bearer token of the node's admin API, if it requires one (or WALSERVER_HTTP_AUTH_TOKEN).
    #[arg(long, env = "WALSERVER_HTTP_AUTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print one JSON object (with the time series) instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Write every append's latency to this file (`MICROSECONDS COUNT` lines, as the
    /// histogram holds them), for `latency-plot`.
    #[arg(long)]
    pub latency_out: Option<PathBuf>,
    /// Write latency and replication lag over time to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

#[derive(Serialize)]
pub struct PeakRss {
    pub node: String,
    pub bytes: Option<u64>,
}

#[derive(Serialize, Default)]
pub struct LagSummary {
    pub max_bytes: Option<u64>,
    pub mean_bytes: Option<f64>,
    pub last_bytes: Option<u64>,
    pub max_flush_lag_ms: Option<f64>,
}

#[derive(Serialize)]
pub struct AppendReport {
    pub target: String,
    pub standbys: Option<usize>,
    /// `synchronous_commit_overlap` on the in-process nodes.
    pub commit_overlap: bool,
    pub writers: usize,
    pub size: usize,
    pub batch: usize,
    pub durability: String,
    pub seconds: f64,
    pub appends: u64,
    pub records: u64,
    pub bytes: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub appends_per_s: f64,
    pub records_per_s: f64,
    pub mb_per_s: f64,
    pub latency: Percentiles,
    /// fsync/fdatasync calls on the primary per append (every fsync storage makes).
    pub fsyncs_per_append: Option<f64>,
    /// The same on the synchronous standby (in-process clusters only).
    pub standby_fsyncs_per_append: Option<f64>,
    /// The commit point the synchronous standby was last told in its stream (in-process
    /// clusters only): set only under the overlapped commit, where the primary carries it.
    pub standby_told_commit_point: Option<String>,
    pub peak_rss: Vec<PeakRss>,
    pub lag: LagSummary,
    pub samples: Vec<Sample>,
}

/// Where the appends go and how lag and fsyncs are read.
enum Target {
    Cluster(Box<Cluster>),
    Http { url: String, token: Option<String> },
}

/// One reading of replication: the primary's flushed end and the most-behind standby.
struct LagReading {
    lag_bytes: Option<u64>,
    flush_lag_ms: Option<f64>,
}

impl Target {
    fn fsyncs(&self) -> (Option<u64>, Option<u64>) {
        match self {
            Target::Cluster(c) => (
                Some(c.primary.wal.fsync_count()),
                c.standbys.first().map(|s| s.wal.fsync_count()),
            ),
            Target::Http { url, token } => (remote_fsyncs(url, token.as_deref()), None),
        }
    }

    fn standby_told_commit_point(&self) -> Option<wal_storage::Lsn> {
        match self {
            Target::Cluster(c) => match c.standbys.first()?.wal.position().commit {
                wal_storage::CommitBound::Told(c) => Some(c),
                _ => None,
            },
            Target::Http { .. } => None,
        }
    }

    fn lag(&self) -> LagReading {
        match self {
            Target::Cluster(c) => lag_of_node(&c.primary),
            Target::Http { url, token } => match get_status(url, token.as_deref()) {
                Ok(s) => lag_of_rows(s.flush_lsn, &s.replication),
                Err(_) => LagReading {
                    lag_bytes: None,
                    flush_lag_ms: None,
                },
            },
        }
    }
}

fn lag_of_node(node: &Node) -> LagReading {
    let rows = futures_executor::block_on(
        node.registry
            .send(walsender_actor::messages::GetReplicationStatus),
    )
    .unwrap_or_default();
    lag_of_rows(node.wal.flushed(), &rows)
}

/// The largest flush lag, in bytes behind `flushed` and in time, of the walsender rows.
fn lag_of_rows(flushed: wal_storage::Lsn, rows: &[WalSenderStatus]) -> LagReading {
    LagReading {
        lag_bytes: rows
            .iter()
            .map(|r| flushed.saturating_sub(r.flush_lsn.unwrap_or_default()))
            .max(),
        flush_lag_ms: rows
            .iter()
            .filter_map(|r| r.flush_lag)
            .map(|d| d.as_secs_f64() * 1000.0)
            .reduce(f64::max),
    }
}

fn remote_fsyncs(url: &str, token: Option<&str>) -> Option<u64> {
    let text = get_text(url, "/metrics", token).ok()?;
    parse_metric(&text, "walserver_fsyncs_total")
}

/// The value of an unlabelled metric in Prometheus text.
fn parse_metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// One writer of the in-process path: appends and waits, until the budget is spent.
async fn writer_loop(
    sup: actix::Addr<supervisor_actor::Supervisor>,
    stats: Arc<Mutex<Stats>>,
    budget: Arc<Budget>,
    payload: Bytes,
    batch: usize,
    durability: Durability,
) {
    let bytes = payload.len() * batch;
    while budget.take(bytes as u64) {
        let msg = AppendRecords {
            records: vec![payload.clone(); batch],
            durability: Some(durability),
        };
        let t = Instant::now();
        let r = sup.send(msg).await;
        let lat = t.elapsed();
        let mut s = stats.lock().expect("stats lock");
        match r {
            Ok(Ok(_)) => s.ok(lat, batch, bytes),
            Ok(Err(e)) => s.err(e.to_string()),
            Err(e) => {
                s.err(e.to_string());
                budget.stop.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// Writers of the in-process path: tasks sending `AppendRecords` to the primary's supervisor,
/// on current-thread runtimes of their own, or (`--writers-in-node`) on the primary's own
/// System thread, as an embedding application's actors would be. The handles end when every
/// writer has.
fn spawn_cluster_writers(
    args: &AppendArgs,
    cluster: &Cluster,
    durability: Durability,
    stats: &Arc<Mutex<Stats>>,
    budget: &Arc<Budget>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
    let payload = Bytes::from(vec![b'x'; args.size]);
    let batch = args.batch.max(1);
    let sup = cluster.primary.supervisor.clone();
    let new_writer = || {
        writer_loop(
            sup.clone(),
            stats.clone(),
            budget.clone(),
            payload.clone(),
            batch,
            durability,
        )
    };
    if args.writers_in_node {
        let arbiter = cluster
            .primary_arbiter()
            .context("the primary's thread is gone")?;
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..args.writers {
            let w = new_writer();
            let tx = tx.clone();
            arbiter.spawn(async move {
                w.await;
                let _ = tx.send(());
            });
        }
        drop(tx);
        let n = args.writers;
        let waiter = std::thread::Builder::new()
            .name("bench-writers-wait".into())
            .spawn(move || {
                for _ in 0..n {
                    if rx.recv().is_err() {
                        break;
                    }
                }
            })?;
        return Ok(vec![waiter]);
    }
    let threads = args.writer_threads.clamp(1, args.writers.max(1));
    let mut handles = Vec::new();
    for t in 0..threads {
        let n = args.writers / threads + usize::from(t < args.writers % threads);
        let writers: Vec<_> = (0..n).map(|_| new_writer()).collect();
        let h = std::thread::Builder::new()
            .name(format!("bench-writers-{t}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime");
                let local = tokio::task::LocalSet::new();
                for w in writers {
                    local.spawn_local(w);
                }
                rt.block_on(local);
            })?;
        handles.push(h);
    }
    Ok(handles)
}

/// Writers of the HTTP path: one thread and one keep-alive connection each, each following
/// the leader among `urls` on its own.
fn spawn_http_writers(
    args: &AppendArgs,
    urls: &[String],
    durability: &str,
    token: Option<&str>,
    stats: &Arc<Mutex<Stats>>,
    budget: &Arc<Budget>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
    let batch = args.batch.max(1);
    let record = vec![b'x'; args.size];
    let same_body: Arc<Vec<u8>> =
        Arc::new(join_records(std::iter::repeat_n(record.as_slice(), batch)));
    let ack_log = match &args.ack_log {
        Some(path) => Some(Arc::new(AckLog::create(path)?)),
        None => None,
    };
    let timeout = args.request_timeout.map(Duration::from_secs_f64);
    let path = format!("/wal?durability={durability}");
    let mut handles = Vec::new();
    for writer in 0..args.writers {
        let w = HttpWriter {
            writer,
            endpoints: Endpoints::new(urls.to_vec(), token, timeout),
            path: path.clone(),
            size: args.size,
            batch,
            same_body: same_body.clone(),
            ack_log: ack_log.clone(),
            keep_going: args.keep_going,
        };
        let (stats, budget) = (stats.clone(), budget.clone());
        handles.push(
            std::thread::Builder::new()
                .name(format!("bench-writer-{writer}"))
                .spawn(move || w.run(&stats, &budget))?,
        );
    }
    Ok(handles)
}

pub fn run(args: AppendArgs) -> anyhow::Result<()> {
    let report = measure(&args)?;
    if let Some(path) = &args.plot {
        plot(&report, path)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", summary(&report));
        if let Some(path) = &args.plot {
            println!("plot written to {}", path.display());
        }
    }
    if report.appends == 0 {
        bail!(
            "no append succeeded: {}",
            report.first_error.as_deref().unwrap_or("unknown error")
        );
    }
    Ok(())
}

/// Runs the load and gathers the report.
pub fn measure(args: &AppendArgs) -> anyhow::Result<AppendReport> {
    anyhow::ensure!(args.writers > 0, "--writers must be at least 1");
    let durability: Durability = args.durability.parse().map_err(anyhow::Error::msg)?;
    let byte_limit = args
        .bytes
        .as_deref()
        .map(|b| walserver_node::units::parse_size(b, 1).map_err(anyhow::Error::msg))
        .transpose()?
        .flatten();
    let seconds = args
        .seconds
        .unwrap_or(if byte_limit.is_some() { 0.0 } else { 10.0 });
    let target = match args.http.first() {
        Some(url) => Target::Http {
            url: url.clone(),
            token: args.token.clone(),
        },
        None => {
            let opts = ClusterOptions {
                standbys: args.cluster.unwrap_or(1),
                sync_names: args.sync_names.clone(),
                fsync: !args.no_fsync,
                base_dir: args.dir.clone(),
                io_threads: args.io_threads,
                commit_overlap: args.commit_overlap,
                ..ClusterOptions::default()
            };
            let c = Cluster::start(&opts).context("cannot start the in-process cluster")?;
            c.wait_streaming(Duration::from_secs(30))?;
            Target::Cluster(Box::new(c))
        }
    };
    let stats = Arc::new(Mutex::new(Stats::new()));
    let (fsync0, sfsync0) = target.fsyncs();
    let started = Instant::now();
    let budget = Arc::new(Budget::new(
        (seconds > 0.0).then(|| started + Duration::from_secs_f64(seconds)),
        byte_limit,
    ));
    let handles = match &target {
        Target::Cluster(c) => spawn_cluster_writers(args, c, durability, &stats, &budget)?,
        Target::Http { token, .. } => spawn_http_writers(
            args,
            &args.http,
            &durability.to_string(),
            token.as_deref(),
            &stats,
            &budget,
        )?,
    };
    let (bar_len, unit) = match byte_limit {
        Some(b) => (b / (1 << 20), "MiB"),
        None => ((seconds * 10.0) as u64, "×100ms"),
    };
    let bar = report::progress_bar(bar_len.max(1), unit, args.json);
    let mut samples = Vec::new();
    let (mut last_appends, mut last_bytes, mut last_t) = (0u64, 0u64, 0.0f64);
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(report::SAMPLE_INTERVAL);
        let t = started.elapsed().as_secs_f64();
        let lag = target.lag();
        let (appends, bytes, p) = {
            let mut s = stats.lock().expect("stats lock");
            let p = Percentiles::of(&s.interval);
            s.interval.reset();
            (s.appends, s.bytes, p)
        };
        let dt = (t - last_t).max(1e-6);
        let sample = Sample {
            t,
            appends_per_s: (appends - last_appends) as f64 / dt,
            mb_per_s: (bytes - last_bytes) as f64 / dt / 1e6,
            p50_ms: p.p50_ms,
            p99_ms: p.p99_ms,
            max_ms: p.max_ms,
            lag_bytes: lag.lag_bytes,
            flush_lag_ms: lag.flush_lag_ms,
        };
        bar.set_position(match byte_limit {
            Some(_) => bytes / (1 << 20),
            None => (t * 10.0) as u64,
        });
        bar.set_message(format!(
            "{:.0} appends/s {:.1} MB/s p99 {:.2} ms lag {}",
            sample.appends_per_s,
            sample.mb_per_s,
            sample.p99_ms,
            sample.lag_bytes.map_or("-".into(), report::human_bytes)
        ));
        samples.push(sample);
        (last_appends, last_bytes, last_t) = (appends, bytes, t);
    }
    for h in handles {
        let _ = h.join();
    }
    let elapsed = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let (fsync1, sfsync1) = target.fsyncs();
    let s = stats.lock().expect("stats lock");
    let per_append = |a: Option<u64>, b: Option<u64>| {
        a.zip(b)
            .filter(|_| s.appends > 0)
            .map(|(a, b)| b.saturating_sub(a) as f64 / s.appends as f64)
    };
    let lags: Vec<u64> = samples.iter().filter_map(|x| x.lag_bytes).collect();
    let lag = LagSummary {
        max_bytes: lags.iter().copied().max(),
        mean_bytes: (!lags.is_empty()).then(|| lags.iter().sum::<u64>() as f64 / lags.len() as f64),
        last_bytes: lags.last().copied(),
        max_flush_lag_ms: samples
            .iter()
            .filter_map(|x| x.flush_lag_ms)
            .reduce(f64::max),
    };
    let peak_rss = match &target {
        Target::Cluster(c) => vec![PeakRss {
            node: format!(
                "this process (primary and {} standbys in-process)",
                c.standbys.len()
            ),
            bytes: sys::peak_rss(None),
        }],
        Target::Http { .. } => args
            .pids
            .iter()
            .map(|p| PeakRss {
                node: format!("pid {p}"),
                bytes: sys::peak_rss(Some(*p)),
            })
            .collect(),
    };
    if let Some(path) = &args.latency_out {
        crate::latency::write_histogram(&s.total, path)?;
    }
    Ok(AppendReport {
        target: match &target {
            Target::Cluster(_) => "cluster".into(),
            Target::Http { .. } => format!("http {}", args.http.join(",")),
        },
        standbys: match &target {
            Target::Cluster(c) => Some(c.standbys.len()),
            Target::Http { .. } => None,
        },
        commit_overlap: args.commit_overlap,
        writers: args.writers,
        size: args.size,
        batch: args.batch.max(1),
        durability: durability.to_string(),
        seconds: elapsed,
        appends: s.appends,
        records: s.records,
        bytes: s.bytes,
        errors: s.errors,
        first_error: s.first_error.clone(),
        appends_per_s: s.appends as f64 / elapsed,
        records_per_s: s.records as f64 / elapsed,
        mb_per_s: s.bytes as f64 / elapsed / 1e6,
        latency: Percentiles::of(&s.total),
        fsyncs_per_append: per_append(fsync0, fsync1),
        standby_fsyncs_per_append: per_append(sfsync0, sfsync1),
        standby_told_commit_point: target.standby_told_commit_point().map(|c| c.to_string()),
        peak_rss,
        lag,
        samples,
    })
}

/// The report for people.
pub fn summary(r: &AppendReport) -> String {
    let mut out = String::new();
    let l = &r.latency;
    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
    out.push_str(&format!(
        "append: {} writers, {} B records x {} per append, durability {}, target {}{}\n",
        r.writers,
        r.size,
        r.batch,
        r.durability,
        r.target,
        r.standbys.map_or(String::new(), |k| format!(
            " (primary + {k} standbys{})",
            if r.commit_overlap {
                ", overlapped commit"
            } else {
                ""
            }
        ))
    ));
    out.push_str(&format!(
        "  {:.1} s: {} appends, {} records, {}; {} errors\n",
        r.seconds,
        r.appends,
        r.records,
        report::human_bytes(r.bytes),
        r.errors
    ));
    out.push_str(&format!(
        "  throughput  {:.0} appends/s, {:.0} records/s, {:.2} MB/s\n",
        r.appends_per_s, r.records_per_s, r.mb_per_s
    ));
    out.push_str(&format!(
        "  latency ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}  (mean {:.3})\n",
        l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, l.mean_ms
    ));
    out.push_str(&format!(
        "  fsyncs per append: primary {}, sync standby {}\n",
        opt(r.fsyncs_per_append),
        opt(r.standby_fsyncs_per_append)
    ));
    for p in &r.peak_rss {
        out.push_str(&format!(
            "  peak RSS of {}: {}\n",
            p.node,
            p.bytes.map_or("-".into(), report::human_bytes)
        ));
    }
    out.push_str(&format!(
        "  replication lag (sampled every 100 ms): max {}, mean {}, last {}; max flush_lag {} ms\n",
        r.lag.max_bytes.map_or("-".into(), report::human_bytes),
        r.lag
            .mean_bytes
            .map_or("-".into(), |m| report::human_bytes(m as u64)),
        r.lag.last_bytes.map_or("-".into(), report::human_bytes),
        opt(r.lag.max_flush_lag_ms)
    ));
    if let Some(e) = &r.first_error {
        out.push_str(&format!("  first error: {e}\n"));
    }
    out
}

fn plot(r: &AppendReport, path: &std::path::Path) -> anyhow::Result<()> {
    use report::{Panel, Series};
    let pts = |f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        r.samples
            .iter()
            .filter_map(|s| Some((s.t, f(s)?)))
            .collect()
    };
    let panels = [
        Panel {
            title: "append latency per 100 ms",
            y_label: "ms",
            series: vec![
                Series {
                    name: "p50",
                    points: pts(&|s| (s.appends_per_s > 0.0).then_some(s.p50_ms)),
                },
                Series {
                    name: "p99",
                    points: pts(&|s| (s.appends_per_s > 0.0).then_some(s.p99_ms)),
                },
                Series {
                    name: "max",
                    points: pts(&|s| (s.appends_per_s > 0.0).then_some(s.max_ms)),
                },
            ],
        },
        Panel {
            title: "throughput",
            y_label: "appends/s",
            series: vec![Series {
                name: "appends/s",
                points: pts(&|s| Some(s.appends_per_s)),
            }],
        },
        Panel {
            title: "replication lag (most-behind standby)",
            y_label: "KiB",
            series: vec![Series {
                name: "flush lag KiB",
                points: pts(&|s| s.lag_bytes.map(|b| b as f64 / 1024.0)),
            }],
        },
    ];
    report::plot_svg(
        path,
        &format!(
            "walserver bench append: {} writers, {} B, {}",
            r.writers, r.size, r.durability
        ),
        &panels,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_metrics_and_lag_text() {
        let text = "# HELP walserver_fsyncs_total x\n# TYPE walserver_fsyncs_total counter\nwalserver_fsyncs_total 42\nwalserver_fsyncs_totalx 1\n";
        assert_eq!(parse_metric(text, "walserver_fsyncs_total"), Some(42));
        assert_eq!(parse_metric(text, "nothing"), None);
        // `/status` as a node writes it, read back typed.
        let row = |flush: &str, lag: serde_json::Value| {
            let mut r = serde_json::to_value(WalSenderStatus::new(
                1,
                "u",
                "s",
                "127.0.0.1:1".parse().unwrap(),
            ))
            .unwrap();
            r["flush_lsn"] = flush.into();
            r["flush_lag"] = lag;
            serde_json::from_value::<WalSenderStatus>(r).unwrap()
        };
        let rows = [
            row("0/1F00000", "00:00:00.002000".into()),
            row("0/2000000", serde_json::Value::Null),
        ];
        let l = lag_of_rows("0/2000000".parse().unwrap(), &rows);
        assert_eq!(l.lag_bytes, Some(0x100000));
        assert_eq!(l.flush_lag_ms, Some(2.0));
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: AppendArgs,
    }

    /// A short run against an in-process primary and one synchronous standby: every append
    /// is counted once, in the histogram too, and each cost at least one fsync somewhere.
    #[test]
    fn runs_against_an_in_process_cluster() {
        use clap::Parser;
        let cli = Cli::try_parse_from([
            "bench",
            "--cluster",
            "1",
            "--writers",
            "4",
            "--size",
            "64",
            "--bytes",
            "64kB",
        ])
        .unwrap();
        let r = measure(&cli.args).unwrap();
        assert_eq!(r.errors, 0, "{:?}", r.first_error);
        assert!(r.appends >= 1000, "{}", r.appends);
        assert_eq!(r.latency.count, r.appends);
        assert_eq!(r.records * 64, r.bytes);
        assert!(r.fsyncs_per_append.unwrap() > 0.0);
        assert!(r.standby_fsyncs_per_append.unwrap() > 0.0);
        assert_eq!(r.durability, "on");
        assert!(summary(&r).contains("p99.9"));
        assert!(!r.commit_overlap);
        assert_eq!(r.standby_told_commit_point, None, "the switch is off");
    }

    /// The same with `--commit-overlap`: the nodes run the overlapped commit, so the primary
    /// tells its standby the commit point in the stream (only then), and the commit point
    /// it told covers the appends acknowledged.
    #[test]
    fn runs_an_in_process_cluster_with_the_overlapped_commit() {
        use clap::Parser;
        let cli = Cli::try_parse_from([
            "bench",
            "--cluster",
            "1",
            "--commit-overlap",
            "--writers",
            "4",
            "--size",
            "64",
            "--bytes",
            "16kB",
        ])
        .unwrap();
        let r = measure(&cli.args).unwrap();
        assert_eq!(r.errors, 0, "{:?}", r.first_error);
        assert!(r.appends >= 250, "{}", r.appends);
        assert!(r.commit_overlap);
        let told: wal_storage::Lsn = r
            .standby_told_commit_point
            .as_deref()
            .expect("the standby was told a commit point")
            .parse()
            .unwrap();
        assert!(told > wal_storage::Lsn(0), "{told}");
        assert!(summary(&r).contains("overlapped commit"));
    }

    #[test]
    fn http_endpoints_repeat_or_come_as_a_list() {
        use clap::Parser;
        let cli = Cli::try_parse_from([
            "bench",
            "--http",
            "10.0.0.1:8433",
            "--http",
            "10.0.0.2:8433,10.0.0.3:8433",
        ])
        .unwrap();
        assert_eq!(
            cli.args.http,
            ["10.0.0.1:8433", "10.0.0.2:8433", "10.0.0.3:8433"]
        );
        assert!(Cli::try_parse_from(["bench", "--ack-log", "x"]).is_err());
    }
}
