//! `walserver bench soak`: steady appends for minutes against a primary and a standby run as
//! `walserver run` child processes, the standby restarted at a fixed interval, while the
//! resident memory (`VmRSS`) and open descriptors (`/proc/PID/fd`) of every node are sampled
//! once a second. What it leaves: a CSV of the samples, an SVG plot of both over time, and a
//! summary of each node's first, last and largest values: a leak shows as a line that climbs
//! across restarts instead of levelling off.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use walserver_node::admin::AdminClient;
use walserver_node::records::{join_records, RECORDS_CONTENT_TYPE};

use crate::cluster::{init_standby_dir, NodeProgram};
use crate::node::ChildNode;
use crate::report::{self, Panel, Series};
use crate::sys;

#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// How long to run, in seconds (default ten minutes).
    #[arg(long, default_value_t = 600.0)]
    pub seconds: f64,
    /// Restart the standby this often, in seconds.
    #[arg(long, default_value_t = 30.0)]
    pub restart_every: f64,
    /// Seconds between two samples of every node.
    #[arg(long, default_value_t = 1.0)]
    pub sample_every: f64,
    /// Concurrent writers appending to the primary through `POST /wal`.
    #[arg(long, default_value_t = 2)]
    pub writers: usize,
    /// Record size in bytes.
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Records per append.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Make the standby synchronous (`FIRST 1 (s1)`) and append at `on`: appends then wait
    /// while it restarts.
    #[arg(long)]
    pub sync: bool,
    /// Where the nodes' data directories go (a temporary directory under it).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The CSV of samples (`t_s,node,pid,rss_bytes,fds`).
    #[arg(long, default_value = "soak.csv")]
    pub csv: PathBuf,
    /// The SVG plot of resident memory and descriptors over time.
    #[arg(long, default_value = "soak.svg")]
    pub plot: PathBuf,
    /// Print the report as JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// One reading of one node.
#[derive(Clone, Debug, Serialize)]
pub struct SoakSample {
    pub t_s: f64,
    pub node: String,
    pub pid: u32,
    pub rss_bytes: u64,
    pub fds: u64,
}

/// A node's first, last and largest readings.
#[derive(Clone, Debug, Serialize)]
pub struct NodeSummary {
    pub node: String,
    pub samples: usize,
    pub rss_start: u64,
    pub rss_end: u64,
    pub rss_max: u64,
    pub fds_start: u64,
    pub fds_end: u64,
    pub fds_max: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    pub seconds: f64,
    /// When each standby restart finished (its admin API answered again), in seconds.
    pub restarts_s: Vec<f64>,
    pub appends: u64,
    pub append_errors: u64,
    pub first_error: Option<String>,
    pub nodes: Vec<NodeSummary>,
    pub samples: Vec<SoakSample>,
}

/// The nodes' names in the samples.
pub const PRIMARY: &str = "primary";
pub const STANDBY: &str = "standby";

/// A node's resident memory and open descriptors, or `None` once it is gone.
fn sample(pid: u32) -> Option<(u64, u64)> {
    let rss = sys::rss(Some(pid))?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

/// Writers appending to `http` until `stop`; they count successes and failures and go on
/// after a failure (a soak measures the nodes, not one append).
fn spawn_writers(
    args: &SoakArgs,
    http: &str,
    stop: &Arc<AtomicBool>,
    appends: &Arc<AtomicU64>,
    errors: &Arc<std::sync::Mutex<(u64, Option<String>)>>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
    let record = vec![b's'; args.size];
    let body = Arc::new(join_records(std::iter::repeat_n(
        record.as_slice(),
        args.batch.max(1),
    )));
    let path = if args.sync {
        "/wal?durability=on"
    } else {
        "/wal?durability=local"
    };
    let mut handles = Vec::new();
    for i in 0..args.writers {
        let (stop, appends, errors, body) =
            (stop.clone(), appends.clone(), errors.clone(), body.clone());
        let client = AdminClient::new(http, None);
        handles.push(
            std::thread::Builder::new()
                .name(format!("soak-writer-{i}"))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let r = client
                            .post(path, RECORDS_CONTENT_TYPE)
                            .send(body.as_slice());
                        match r {
                            Ok(mut resp) if resp.status().is_success() => {
                                let _ = resp.body_mut().read_to_string();
                                appends.fetch_add(1, Ordering::Relaxed);
                            }
                            other => {
                                let text = match other {
                                    Ok(mut resp) => format!(
                                        "HTTP {}: {}",
                                        resp.status(),
                                        resp.body_mut().read_to_string().unwrap_or_default()
                                    ),
                                    Err(e) => e.to_string(),
                                };
                                let mut e = errors.lock().unwrap_or_else(|p| p.into_inner());
                                e.0 += 1;
                                e.1.get_or_insert(text);
                                drop(e);
                                // A failing primary is not hammered: a short pause (a guess)
                                // before the next try.
                                std::thread::sleep(Duration::from_millis(50));
                            }
                        }
                    }
                })?,
        );
    }
    Ok(handles)
}

/// Runs the soak and gathers its samples.
pub fn measure(args: &SoakArgs, program: &NodeProgram) -> anyhow::Result<SoakReport> {
    anyhow::ensure!(args.seconds > 0.0, "--seconds must be positive");
    anyhow::ensure!(args.restart_every > 0.0, "--restart-every must be positive");
    anyhow::ensure!(args.sample_every > 0.0, "--sample-every must be positive");
    let mut b = tempfile::Builder::new();
    b.prefix("walserver-soak-");
    let tmp = match &args.dir {
        Some(d) => b.tempdir_in(d),
        None => b.tempdir(),
    }
    .context("cannot create the soak's directory")?;
    let pdata = tmp.path().join("primary");
    walserver_node::init::init_primary(&pdata, 16 << 20)?;
    let sync_names = if args.sync { "FIRST 1 (s1)" } else { "" };
    let primary = ChildNode::spawn(
        program,
        &pdata,
        &[
            ("synchronous_standby_names", sync_names.into()),
            // Two segments are kept beyond what the standby needs: the soak's WAL is removed
            // as it goes, so the disk does not fill in ten minutes.
            ("wal_keep_size", "64MB".into()),
        ],
    )?;
    let sdata = tmp.path().join("standby");
    init_standby_dir(primary.listen, &sdata, "s1", None)?;
    let standby_settings = [("wal_receiver_status_interval", "1".to_string())];
    let mut standby = Some(ChildNode::spawn(program, &sdata, &standby_settings)?);

    let stop = Arc::new(AtomicBool::new(false));
    let appends = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(std::sync::Mutex::new((0u64, None)));
    let writers = spawn_writers(args, &primary.http.to_string(), &stop, &appends, &errors)?;

    let bar = report::progress_bar(args.seconds.ceil() as u64, "s", args.json);
    let started = Instant::now();
    let total = Duration::from_secs_f64(args.seconds);
    let every = Duration::from_secs_f64(args.sample_every);
    let restart_every = Duration::from_secs_f64(args.restart_every);
    let mut next_sample = Duration::ZERO;
    let mut next_restart = restart_every;
    let mut samples = Vec::new();
    let mut restarts = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        while started.elapsed() < total {
            let now = started.elapsed();
            if now >= next_restart {
                // Immediate shutdown (dropping the child) and a start on the same directory.
                drop(standby.take());
                standby = Some(ChildNode::spawn(program, &sdata, &standby_settings)?);
                restarts.push(started.elapsed().as_secs_f64());
                next_restart += restart_every;
            }
            if now >= next_sample {
                let t = started.elapsed().as_secs_f64();
                let nodes = [(PRIMARY, Some(&primary)), (STANDBY, standby.as_ref())];
                for (name, node) in nodes {
                    let Some(node) = node else { continue };
                    let Some(pid) = node.pid() else { continue };
                    if let Some((rss, fds)) = sample(pid) {
                        samples.push(SoakSample {
                            t_s: t,
                            node: name.into(),
                            pid,
                            rss_bytes: rss,
                            fds,
                        });
                    }
                }
                next_sample += every;
                bar.set_position(now.as_secs());
            }
            // The next thing to do is due at a known time: wait for it (a timer, not a poll).
            let due = next_sample.min(next_restart).min(total);
            std::thread::sleep(due.saturating_sub(started.elapsed()));
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.join();
    }
    bar.finish_and_clear();
    result?;
    // The primary must still answer: a soak that ends with a dead primary is a failure.
    walserver_node::admin::get_status(&primary.http, None)
        .context("the primary does not answer /status at the end of the soak")?;
    let (append_errors, first_error) = {
        let e = errors.lock().unwrap_or_else(|p| p.into_inner());
        (e.0, e.1.clone())
    };
    let nodes = [PRIMARY, STANDBY]
        .iter()
        .filter_map(|n| summarise(n, &samples))
        .collect();
    Ok(SoakReport {
        seconds: started.elapsed().as_secs_f64(),
        restarts_s: restarts,
        appends: appends.load(Ordering::Relaxed),
        append_errors,
        first_error,
        nodes,
        samples,
    })
}

fn summarise(node: &str, samples: &[SoakSample]) -> Option<NodeSummary> {
    let mine: Vec<&SoakSample> = samples.iter().filter(|s| s.node == node).collect();
    let (first, last) = (mine.first()?, mine.last()?);
    Some(NodeSummary {
        node: node.into(),
        samples: mine.len(),
        rss_start: first.rss_bytes,
        rss_end: last.rss_bytes,
        rss_max: mine.iter().map(|s| s.rss_bytes).max().unwrap_or(0),
        fds_start: first.fds,
        fds_end: last.fds,
        fds_max: mine.iter().map(|s| s.fds).max().unwrap_or(0),
    })
}

/// Writes the samples as CSV.
pub fn write_csv(path: &std::path::Path, samples: &[SoakSample]) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
    );
    writeln!(f, "t_s,node,pid,rss_bytes,fds")?;
    for s in samples {
        writeln!(
            f,
            "{:.3},{},{},{},{}",
            s.t_s, s.node, s.pid, s.rss_bytes, s.fds
        )?;
    }
    f.flush()?;
    Ok(())
}

/// Plots resident memory (MiB) and descriptors of every node over time.
pub fn plot(path: &std::path::Path, r: &SoakReport) -> anyhow::Result<()> {
    let series = |f: fn(&SoakSample) -> f64| -> Vec<Series<'static>> {
        [PRIMARY, STANDBY]
            .iter()
            .map(|n| Series {
                name: n,
                points: r
                    .samples
                    .iter()
                    .filter(|s| s.node == *n)
                    .map(|s| (s.t_s, f(s)))
                    .collect(),
            })
            .collect()
    };
    let panels = [
        Panel {
            title: "resident memory (VmRSS)",
            y_label: "MiB",
            series: series(|s| s.rss_bytes as f64 / (1 << 20) as f64),
        },
        Panel {
            title: "open file descriptors",
            y_label: "descriptors",
            series: series(|s| s.fds as f64),
        },
    ];
    let title = format!(
        "soak: {:.0} s, standby restarted {} times",
        r.seconds,
        r.restarts_s.len()
    );
    report::plot_svg(path, &title, &panels)
}

pub fn summary(r: &SoakReport) -> String {
    let mut out = format!(
        "soak of {:.0} s: {} appends ({} failed), standby restarted {} times\n",
        r.seconds,
        r.appends,
        r.append_errors,
        r.restarts_s.len()
    );
    if let Some(e) = &r.first_error {
        out.push_str(&format!("first append error: {e}\n"));
    }
    for n in &r.nodes {
        out.push_str(&format!(
            "{:8} rss {} -> {} (max {}), fds {} -> {} (max {}), {} samples\n",
            n.node,
            report::human_bytes(n.rss_start),
            report::human_bytes(n.rss_end),
            report::human_bytes(n.rss_max),
            n.fds_start,
            n.fds_end,
            n.fds_max,
            n.samples
        ));
    }
    out
}

pub fn run(args: SoakArgs, program: &NodeProgram) -> anyhow::Result<()> {
    let r = measure(&args, program)?;
    write_csv(&args.csv, &r.samples)?;
    plot(&args.plot, &r)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", summary(&r));
        println!(
            "samples in {}, plot in {}",
            args.csv.display(),
            args.plot.display()
        );
    }
    if r.appends == 0 {
        bail!(
            "no append succeeded: {}",
            r.first_error.as_deref().unwrap_or("unknown error")
        );
    }
    Ok(())
}
