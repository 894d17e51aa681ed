//! `walserver bench stream`: catch-up of K standbys from a primary that already holds G GiB.
//!
//! The primary runs as a child process (`walserver run`, of the executable [`NodeProgram`]
//! names), so its CPU time
//! and memory are read from `/proc/PID` apart from the clients'. It is filled through
//! `POST /wal` first; then the clients start at the first segment and the clock runs until
//! each has the whole range. The clients are one of:
//!
//! - `walserver`: in-process walserver standbys (`init --standby` at the first segment, then
//!   a node whose walreceiver streams into its own storage, fsync on unless `--no-fsync`);
//!   done when the standby's flushed position reaches the primary's end;
//! - `codec`: plain protocol-codec clients that discard what they receive (one thread each);
//! - `pg-receivewal`: PostgreSQL's `pg_receivewal` processes with `--endpos`, through physical
//!   slots made before the fill so they start at the beginning.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use wal_storage::Lsn;

use walserver_node::admin::AdminClient;
use walserver_node::records::{join_records, RECORDS_CONTENT_TYPE};

use crate::cluster::{self, NodeProgram, SystemThread};
use crate::node::ChildNode;
use crate::report::{self, Panel, Series};
use crate::sys;
use repl_client::ReplClient;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Client {
    Walserver,
    Codec,
    PgReceivewal,
}

#[derive(clap::Args, Debug, Clone)]
pub struct StreamArgs {
    /// WAL the primary holds before the standbys start, in GiB.
    #[arg(long, default_value_t = 1.0)]
    pub gib: f64,
    /// Standbys catching up at once (1 = catch-up, more = fan-out; up to 64).
    #[arg(long, default_value_t = 1)]
    pub standbys: usize,
    /// What catches up: `walserver` standbys, `pg-receivewal` processes, or `codec` clients
    /// that decode the stream and discard it.
    #[arg(long, value_enum, default_value = "walserver")]
    pub client: Client,
    /// Record size of the fill.
    #[arg(long, default_value_t = 65536)]
    pub record_size: usize,
    /// Where the primary's directory goes (default the system's temporary directory).
    #[arg(long)]
    pub primary_dir: Option<PathBuf>,
    /// Where the standbys' (or pg_receivewal's) directories go, e.g. /dev/shm.
    #[arg(long)]
    pub standby_dir: Option<PathBuf>,
    /// Turn fdatasync off on walserver standbys.
    #[arg(long)]
    pub no_fsync: bool,
    /// Pass `--synchronous` to pg_receivewal (flush after each write, as a standby would).
    #[arg(long)]
    pub synchronous: bool,
    /// Catch up this many times from the same primary (fresh standbys each time).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// PostgreSQL's programs (for pg-receivewal); default $WALSERVER_PG_BIN or
    /// /usr/lib/postgresql/15/bin.
    #[arg(long)]
    pub pg_bin: Option<PathBuf>,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Write throughput and lag over time (of the last run) to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

#[derive(Serialize, Clone)]
pub struct StandbyResult {
    pub name: String,
    pub seconds: f64,
    pub mb_per_s: f64,
}

#[derive(Serialize, Clone, Default)]
pub struct StreamSample {
    pub t: f64,
    /// WAL sent to all standbys together over the interval (from the primary's `/status`).
    pub sent_mb_per_s: f64,
    /// The most-behind standby's distance to the end, by its confirmed flush (or sent, for
    /// clients that confirm nothing) position.
    pub lag_bytes: u64,
}

#[derive(Serialize)]
pub struct RunResult {
    pub seconds: f64,
    /// Everything sent (all standbys) over the wall time.
    pub aggregate_mb_per_s: f64,
    pub standbys: Vec<StandbyResult>,
    /// CPU time of the primary process over the run.
    pub primary_cpu_s: f64,
    pub primary_cpu_ms_per_mb: f64,
    /// The primary's resident memory before the clients connected, and its peak during the
    /// run (sampled every 100 ms).
    pub primary_rss_before: Option<u64>,
    pub primary_rss_peak: Option<u64>,
    pub memory_per_walsender: Option<u64>,
    pub samples: Vec<StreamSample>,
}

#[derive(Serialize)]
pub struct StreamReport {
    pub client: Client,
    pub standbys: usize,
    pub fsync: bool,
    pub bytes_per_standby: u64,
    pub fill_seconds: f64,
    pub fill_mb_per_s: f64,
    pub runs: Vec<RunResult>,
    /// Peak RSS of this process, which runs the in-process standbys or codec clients.
    pub clients_peak_rss: Option<u64>,
}

fn pg_bin(args: &StreamArgs) -> PathBuf {
    args.pg_bin.clone().unwrap_or_else(|| {
        std::env::var_os("WALSERVER_PG_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
    })
}

fn temp_in(base: Option<&Path>, prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    let mut b = tempfile::Builder::new();
    b.prefix(prefix);
    Ok(match base {
        Some(d) => b.tempdir_in(d)?,
        None => b.tempdir()?,
    })
}

/// Fills the primary through `POST /wal` (local durability, ~4 MiB per request) until it
/// holds `bytes` past `start`; returns the flushed end.
fn fill(http: &str, bytes: u64, record_size: usize) -> anyhow::Result<Lsn> {
    let per_body = ((4 << 20) / record_size).max(1);
    let record = vec![0x5au8; record_size];
    let body = join_records(std::iter::repeat_n(record.as_slice(), per_body));
    let client = AdminClient::new(http, None);
    let mut sent = 0u64;
    let mut end = Lsn::INVALID;
    while sent < bytes {
        let mut resp = client
            .post("/wal?durability=local", RECORDS_CONTENT_TYPE)
            .send(body.as_slice())
            .context("fill: POST /wal failed")?;
        if !resp.status().is_success() {
            return Err(anyhow::anyhow!("http status: {}", resp.status().as_u16()))
                .context("fill: POST /wal failed");
        }
        let v: serde_json::Value = serde_json::from_str(&resp.body_mut().read_to_string()?)?;
        end = v["end_lsn"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .context("fill: no end_lsn in the answer")?;
        sent += (per_body * record_size) as u64;
    }
    Ok(end)
}

/// Sent and confirmed positions of the primary's walsenders, from `/status`.
fn walsender_positions(http: &str) -> Vec<(Lsn, Lsn)> {
    let Ok(status) = walserver_node::admin::get_status(http, None) else {
        return Vec::new();
    };
    status
        .replication
        .iter()
        .filter_map(|r| {
            let sent = r.sent_lsn?;
            let flush = r.flush_lsn.filter(|f| f.is_valid()).unwrap_or(sent);
            Some((sent, flush))
        })
        .collect()
}

/// One running client; `finished` is set once it has the whole range.
enum Running {
    Thread(std::thread::JoinHandle<anyhow::Result<f64>>),
    Process(std::process::Child),
}

pub fn run(args: StreamArgs, program: &NodeProgram) -> anyhow::Result<()> {
    let report = measure(&args, program)?;
    if let (Some(path), Some(last)) = (&args.plot, report.runs.last()) {
        plot(&report, last, path)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", summary(&report));
    }
    Ok(())
}

pub fn measure(args: &StreamArgs, program: &NodeProgram) -> anyhow::Result<StreamReport> {
    anyhow::ensure!(
        (1..=64).contains(&args.standbys),
        "--standbys must be 1 to 64"
    );
    let segment_size: u64 = 16 << 20;
    let primary_tmp = temp_in(args.primary_dir.as_deref(), "walserver-bench-primary-")?;
    let data = primary_tmp.path().join("data");
    walserver_node::init::init_primary(&data, segment_size)?;
    let primary = ChildNode::spawn(
        program,
        &data,
        &[
            ("max_wal_senders", (args.standbys + 4).to_string()),
            ("wal_keep_size", "1TB".into()),
            ("wal_sender_timeout", "0".into()),
        ],
    )?;
    let http = primary.http.to_string();
    let start = Lsn(segment_size);
    let slots: Vec<String> = (0..args.standbys * args.runs)
        .map(|i| format!("bench_{i}"))
        .collect();
    if args.client == Client::PgReceivewal {
        let mut c = ReplClient::connect(
            ("127.0.0.1", primary.listen.port()),
            "bench",
            None,
            "walserver-bench",
        )?;
        for s in &slots {
            let answer =
                c.simple_query(&format!("CREATE_REPLICATION_SLOT {s} PHYSICAL RESERVE_WAL"))?;
            for m in answer {
                if let protocol_codec::BackendMessage::ErrorResponse(e) = m {
                    bail!("cannot create slot {s}: {}", e.message().unwrap_or(""));
                }
            }
        }
    }
    let bytes = (args.gib * (1u64 << 30) as f64) as u64;
    let t = Instant::now();
    let bar = report::progress_bar(1, "fill", args.json);
    bar.set_message(format!(
        "filling the primary with {}",
        report::human_bytes(bytes)
    ));
    bar.enable_steady_tick(Duration::from_millis(200));
    let end = fill(&http, bytes, args.record_size)?;
    bar.finish_and_clear();
    let fill_seconds = t.elapsed().as_secs_f64();
    let per_standby = end.0 - start.0;
    let mut runs = Vec::new();
    for run in 0..args.runs {
        let slots = &slots[run * args.standbys..(run + 1) * args.standbys];
        runs.push(one_run(args, &primary, start, end, slots)?);
    }
    Ok(StreamReport {
        client: args.client,
        standbys: args.standbys,
        fsync: !args.no_fsync,
        bytes_per_standby: per_standby,
        fill_seconds,
        fill_mb_per_s: per_standby as f64 / fill_seconds / 1e6,
        runs,
        clients_peak_rss: sys::peak_rss(None),
    })
}

fn one_run(
    args: &StreamArgs,
    primary: &ChildNode,
    start: Lsn,
    end: Lsn,
    slots: &[String],
) -> anyhow::Result<RunResult> {
    let k = args.standbys;
    let dirs = temp_in(args.standby_dir.as_deref(), "walserver-bench-standbys-")?;
    let names: Vec<String> = (0..k).map(cluster::standby_name).collect();
    let http = primary.http.to_string();
    let port = primary.listen.port();
    // Set up what can be set up before the clock: standby directories (init --standby
    // connects to the primary), the System that will run them.
    let system = match args.client {
        Client::Walserver => {
            for n in &names {
                cluster::init_standby_dir(primary.listen, &dirs.path().join(n), n, Some(start))?;
            }
            Some(SystemThread::spawn("bench-standbys")?)
        }
        _ => None,
    };
    let bar = report::progress_bar(((end.0 - start.0) * k as u64) >> 20, "MiB", args.json);
    let rss_before = sys::rss(primary.pid());
    let cpu0 = primary.pid().and_then(sys::process_cpu).unwrap_or_default();
    let t0 = Instant::now();
    let mut running = Vec::new();
    let mut nodes = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match args.client {
            Client::Walserver => {
                let sys = system.as_ref().expect("made above");
                let data = dirs.path().join(name);
                let node = cluster::start_standby_node(&sys.arbiter, &data, !args.no_fsync, 1)?;
                let mut pos = node.wal.subscribe();
                running.push(Running::Thread(std::thread::spawn(move || {
                    futures_executor::block_on(pos.wait_for(|p| p.flushed >= end))
                        .map_err(|_| anyhow::anyhow!("the standby closed its storage"))?;
                    Ok(t0.elapsed().as_secs_f64())
                })));
                nodes.push(node);
            }
            Client::Codec => {
                let name = name.clone();
                running.push(Running::Thread(
                    std::thread::Builder::new()
                        .name(format!("bench-client-{i}"))
                        .spawn(move || {
                            let mut c =
                                ReplClient::connect(("127.0.0.1", port), "bench", None, &name)?;
                            crate::client::catchup(&mut c, start, end, None)?;
                            Ok(t0.elapsed().as_secs_f64())
                        })?,
                ));
            }
            Client::PgReceivewal => {
                let dir = dirs.path().join(name);
                std::fs::create_dir_all(&dir)?;
                let mut cmd = Command::new(pg_bin(args).join("pg_receivewal"));
                cmd.args(["-h", "127.0.0.1", "-U", "bench", "-n", "--no-password"])
                    .arg("-p")
                    .arg(port.to_string())
                    .arg("-D")
                    .arg(&dir)
                    .arg("--slot")
                    .arg(&slots[i])
                    // pg_receivewal stops once it has received WAL past --endpos
                    // (PostgreSQL 15 compares endpos < received): one byte short of the end.
                    .arg("--endpos")
                    .arg(Lsn(end.0 - 1).to_string())
                    .env("PGAPPNAME", name)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    // Its notes ("not renaming ... segment is not complete") would bury the
                    // report; a failure shows in its exit status.
                    .stderr(Stdio::null());
                if args.synchronous {
                    cmd.arg("--synchronous");
                }
                let child = cmd.spawn().context("cannot run pg_receivewal")?;
                running.push(Running::Process(child));
            }
        }
    }
    // Sample until every client is done.
    let mut done: Vec<Option<f64>> = vec![None; k];
    let mut samples = Vec::new();
    let mut rss_peak = rss_before;
    let mut last_sent = 0u64;
    let mut last_t = 0.0;
    let mut errors = Vec::new();
    while done.iter().any(Option::is_none) {
        std::thread::sleep(Duration::from_millis(20));
        for (i, r) in running.iter_mut().enumerate() {
            if done[i].is_some() {
                continue;
            }
            match r {
                Running::Thread(h) if h.is_finished() => {
                    let h = std::mem::replace(h, std::thread::spawn(|| Ok(0.0)));
                    match h.join() {
                        Ok(Ok(s)) => done[i] = Some(s),
                        Ok(Err(e)) => {
                            errors.push(format!("{}: {e:#}", names[i]));
                            done[i] = Some(f64::NAN)
                        }
                        Err(_) => {
                            errors.push(format!("{}: panicked", names[i]));
                            done[i] = Some(f64::NAN)
                        }
                    }
                }
                Running::Process(child) => {
                    if let Some(status) = child.try_wait()? {
                        if !status.success() {
                            errors
                                .push(format!("{}: pg_receivewal exited with {status}", names[i]));
                        }
                        done[i] = Some(t0.elapsed().as_secs_f64());
                    }
                }
                Running::Thread(_) => {}
            }
        }
        let t = t0.elapsed().as_secs_f64();
        if t - last_t >= report::SAMPLE_INTERVAL.as_secs_f64() {
            if let Some(r) = sys::rss(primary.pid()) {
                rss_peak = rss_peak.max(Some(r));
            }
            let pos = walsender_positions(&http);
            let sent: u64 = pos.iter().map(|(s, _)| s.0.saturating_sub(start.0)).sum();
            let finished = done.iter().filter(|d| d.is_some()).count();
            let sent_total = sent + (finished as u64) * (end.0 - start.0);
            let lag = pos
                .iter()
                .map(|(_, f)| end.0.saturating_sub(f.0))
                .max()
                .unwrap_or(0);
            let sample = StreamSample {
                t,
                sent_mb_per_s: sent_total.saturating_sub(last_sent) as f64 / (t - last_t) / 1e6,
                lag_bytes: lag,
            };
            bar.set_position(sent_total >> 20);
            bar.set_message(format!("{:.0} MB/s", sample.sent_mb_per_s));
            samples.push(sample);
            last_sent = last_sent.max(sent_total);
            last_t = t;
        }
        if t0.elapsed() > Duration::from_secs(1800) {
            bail!("the standbys did not catch up within 30 minutes");
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu1 = primary.pid().and_then(sys::process_cpu).unwrap_or_default();
    bar.finish_and_clear();
    for n in &nodes {
        cluster::shutdown(n);
    }
    drop(system);
    if !errors.is_empty() {
        bail!("clients failed: {}", errors.join("; "));
    }
    let bytes = end.0 - start.0;
    let standbys: Vec<StandbyResult> = names
        .iter()
        .zip(&done)
        .map(|(n, s)| {
            let s = s.unwrap_or(f64::NAN);
            StandbyResult {
                name: n.clone(),
                seconds: s,
                mb_per_s: bytes as f64 / s / 1e6,
            }
        })
        .collect();
    let cpu = (cpu1 - cpu0).as_secs_f64();
    let total_mb = bytes as f64 * k as f64 / 1e6;
    Ok(RunResult {
        seconds: wall,
        aggregate_mb_per_s: total_mb / wall,
        standbys,
        primary_cpu_s: cpu,
        primary_cpu_ms_per_mb: cpu * 1000.0 / total_mb,
        primary_rss_before: rss_before,
        primary_rss_peak: rss_peak,
        memory_per_walsender: rss_before
            .zip(rss_peak)
            .map(|(b, p)| p.saturating_sub(b) / k as u64),
        samples,
    })
}

pub fn summary(r: &StreamReport) -> String {
    let mut out = format!(
        "stream: {} {:?} standby(s) (fsync {}), {} each from a walserver primary (child process); fill {:.1} s ({:.0} MB/s)\n",
        r.standbys,
        r.client,
        if r.fsync { "on" } else { "off" },
        report::human_bytes(r.bytes_per_standby),
        r.fill_seconds,
        r.fill_mb_per_s
    );
    if r.client != Client::PgReceivewal {
        out.push_str(&format!(
            "  peak RSS of this process ({} in-process): {}\n",
            match r.client {
                Client::Walserver => "the standbys",
                _ => "the clients",
            },
            r.clients_peak_rss.map_or("-".into(), report::human_bytes)
        ));
    }
    for (i, run) in r.runs.iter().enumerate() {
        let rates: Vec<f64> = run.standbys.iter().map(|s| s.mb_per_s).collect();
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates.iter().copied().fold(0.0, f64::max);
        out.push_str(&format!(
            "  run {}: {:.2} s, aggregate {:.0} MB/s; per standby {:.0}..{:.0} MB/s; primary CPU {:.2} s = {:.2} ms per MB sent; primary RSS {} -> peak {} ({} per walsender)\n",
            i + 1,
            run.seconds,
            run.aggregate_mb_per_s,
            min,
            max,
            run.primary_cpu_s,
            run.primary_cpu_ms_per_mb,
            run.primary_rss_before.map_or("-".into(), report::human_bytes),
            run.primary_rss_peak.map_or("-".into(), report::human_bytes),
            run.memory_per_walsender.map_or("-".into(), report::human_bytes),
        ));
        if run.standbys.len() > 1 && run.standbys.len() <= 16 {
            let per: Vec<String> = run
                .standbys
                .iter()
                .map(|s| format!("{} {:.0}", s.name, s.mb_per_s))
                .collect();
            out.push_str(&format!("    MB/s: {}\n", per.join(", ")));
        }
    }
    out
}

fn plot(r: &StreamReport, run: &RunResult, path: &Path) -> anyhow::Result<()> {
    let panels = [
        Panel {
            title: "WAL sent by the primary (all standbys)",
            y_label: "MB/s",
            series: vec![Series {
                name: "MB/s",
                points: run.samples.iter().map(|s| (s.t, s.sent_mb_per_s)).collect(),
            }],
        },
        Panel {
            title: "lag of the most-behind standby to the end",
            y_label: "MiB",
            series: vec![Series {
                name: "MiB",
                points: run
                    .samples
                    .iter()
                    .map(|s| (s.t, s.lag_bytes as f64 / (1 << 20) as f64))
                    .collect(),
            }],
        },
    ];
    report::plot_svg(
        path,
        &format!(
            "walserver bench stream: {} {:?} standby(s), {}",
            r.standbys,
            r.client,
            report::human_bytes(r.bytes_per_standby)
        ),
        &panels,
    )
}
