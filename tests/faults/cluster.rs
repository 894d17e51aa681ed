//! A primary and two standbys as `walserver run` processes, each on a host of its own in a
//! test network, under the load tool's appends at durability `on`; and the checks every
//! scenario ends with: the load's acknowledgement log against every node, and the standbys'
//! WAL against the primary's, byte for byte.
//!
//! `s1` is the synchronous standby (`FIRST 1 (s1)`), `s2` an asynchronous one. Timeouts are
//! short (`wal_sender_timeout` and `wal_receiver_timeout` 2 s) so that the scenarios can
//! outlast them in seconds.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fault_harness::node::{status, HTTP};
use fault_harness::proxy::{Delay, DelayProxy};
use fault_harness::report::{RecoverMs, Row};
use fault_harness::watch::LineWatch;
use fault_harness::{Host, Net, Process, WalNode};
use walserver_bench::acklog;

/// How long a scenario waits for something that should happen soon.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// The timeouts the scenarios outlast (unless [`Options::timeout`] says otherwise).
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Concurrent writers of the load (each with one append in flight).
pub const WRITERS: usize = 4;
const SEGMENT: u64 = 1 << 20;

/// The `walserver` binary cargo built for this test target.
pub fn walserver_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_walserver"))
}

/// How to build the cluster.
#[derive(Default)]
pub struct Options {
    /// Put a delaying proxy between `s1` and the primary (on `s1`'s host).
    pub s1_delay: Option<Delay>,
    /// `wal_sender_timeout` and `wal_receiver_timeout` on every node, instead of [`TIMEOUT`].
    pub timeout: Option<Duration>,
}

/// The cluster. Fields drop in order: the load, the nodes, the proxy, the network, the files.
pub struct Cluster {
    load: Option<Process>,
    pub primary: WalNode,
    pub s1: WalNode,
    pub s2: WalNode,
    pub proxy: Option<DelayProxy>,
    /// Kept for its namespaces, deleted when the cluster is dropped.
    _net: Net,
    pub hosts: [Host; 3],
    pub ack_log: PathBuf,
    pub acks: LineWatch,
    pub started: Instant,
    /// Kept (not removed) when the test fails, for its logs and data directories.
    dir: Option<tempfile::TempDir>,
}

impl Cluster {
    /// A primary and two streaming standbys, named after `label`.
    pub fn start(label: &str, opts: Options) -> Cluster {
        fault_harness::fault::check_tools().expect("the fault tools");
        let started = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix(&format!("walserver-faults-{label}-"))
            .tempdir()
            .expect("tempdir");
        let mut net = Net::new(label).expect("test network");
        let hosts = [
            net.add_host("p").expect("host"),
            net.add_host("s1").expect("host"),
            net.add_host("s2").expect("host"),
        ];
        let bin = walserver_bin();
        let timeout = format!("\"{}s\"", opts.timeout.unwrap_or(TIMEOUT).as_secs());
        let mut primary = WalNode::primary(
            &hosts[0],
            &bin,
            &dir.path().join("p"),
            "p",
            &["--wal-segment-size", "1MB"],
            &format!(
                "synchronous_standby_names = \"FIRST 1 (s1)\"\nwal_sender_timeout = {timeout}\n\
                 wal_keep_size = \"1GB\"\n"
            ),
        )
        .expect("primary");
        primary.start().expect("start the primary");
        let standby_extra = format!(
            "wal_receiver_timeout = {timeout}\nwal_receiver_status_interval = \"1s\"\n\
             wal_sender_timeout = {timeout}\n"
        );
        let proxy = opts
            .s1_delay
            .map(|d| DelayProxy::start(&hosts[1], primary.listen_addr(), d).expect("delay proxy"));
        let s1_upstream = match &proxy {
            Some(p) => fault_harness::node::conninfo_at(p.addr(), "s1"),
            None => primary.conninfo("s1"),
        };
        let mut s1 = WalNode::standby(
            &hosts[1],
            &bin,
            &dir.path().join("s1"),
            "s1",
            &s1_upstream,
            &standby_extra,
        )
        .expect("s1");
        let mut s2 = WalNode::standby(
            &hosts[2],
            &bin,
            &dir.path().join("s2"),
            "s2",
            &primary.conninfo("s2"),
            &standby_extra,
        )
        .expect("s2");
        s1.start().expect("start s1");
        s2.start().expect("start s2");
        let ack_log = dir.path().join("acks.jsonl");
        let acks = LineWatch::new(&ack_log).expect("watch the ack log");
        let c = Cluster {
            load: None,
            primary,
            s1,
            s2,
            proxy,
            _net: net,
            hosts,
            ack_log,
            acks,
            started,
            dir: Some(dir),
        };
        c.wait_all_streaming(DEADLINE)
            .expect("both standbys stream");
        c
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the cluster's directory").path()
    }

    /// Waits until the primary streams to both standbys and both receive; the time it took.
    pub fn wait_all_streaming(&self, deadline: Duration) -> fault_harness::Result<Duration> {
        let t = Instant::now();
        self.primary
            .wait_status("stream to s1 and s2", deadline, |s| {
                status::streams_to(s, "s1") && status::streams_to(s, "s2")
            })?;
        for s in [&self.s1, &self.s2] {
            let left = deadline.saturating_sub(t.elapsed());
            s.wait_status("receive from the primary", left, status::receiving)?;
        }
        Ok(t.elapsed())
    }

    /// Whether both standbys' walreceivers stop streaming within `deadline`.
    pub fn standbys_stop_receiving(&self, deadline: Duration) -> bool {
        let t = Instant::now();
        [&self.s1, &self.s2].iter().all(|s| {
            let left = deadline.saturating_sub(t.elapsed());
            s.wait_status("stop receiving", left, |st| !status::receiving(st))
                .is_ok()
        })
    }

    /// Starts the load: `walserver bench append` on the primary's host against its admin
    /// API, WRITERS writers at durability `on`, every acknowledgement in the log, going on past
    /// errors, each request given up after `request_timeout`.
    pub fn start_load(&mut self, request_timeout: Duration) {
        let mut cmd = self.primary.host.command(walserver_bin());
        cmd.args(["bench", "append", "--http", HTTP, "--ack-log"])
            .arg(&self.ack_log)
            .args(["--keep-going", "--request-timeout"])
            .arg(format!("{}", request_timeout.as_secs_f64()))
            .args(["--writers", &WRITERS.to_string(), "--size", "100"])
            .args(["--durability", "on", "--seconds", "600"]);
        let log = self.dir().join("load.log");
        self.load = Some(Process::spawn("load", cmd, &log).expect("start the load"));
    }

    /// Waits until `n` more appends than now are acknowledged; returns the count and when.
    pub fn wait_more_acks(&mut self, n: usize, deadline: Duration) -> (usize, Instant) {
        let now = self.acks.lines().expect("ack log");
        let count = self
            .acks
            .wait_lines(now + n, deadline)
            .unwrap_or_else(|e| panic!("the load's appends: {e}"));
        (count, Instant::now())
    }

    /// Waits, woken by each new acknowledgement, until `done` holds of the set of
    /// acknowledged (writer, seq); when it did, or `None` after `deadline`.
    pub fn acks_wait_until(
        &mut self,
        deadline: Duration,
        done: impl Fn(&HashSet<(usize, u64)>) -> bool,
    ) -> Option<Instant> {
        let start = Instant::now();
        let mut seen = HashSet::new();
        let mut read = 0;
        loop {
            let log = acklog::read(&self.ack_log).expect("read the ack log");
            for e in &log[read.min(log.len())..] {
                seen.insert((e.writer, e.seq));
            }
            read = log.len();
            if done(&seen) {
                return Some(Instant::now());
            }
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero() || self.acks.wait_lines(read + 1, left).is_err() {
                return None;
            }
        }
    }

    /// Acknowledged appends so far.
    pub fn acked(&mut self) -> usize {
        self.acks.lines().expect("ack log")
    }

    /// Stops the load (SIGKILL: an append in flight is simply not acknowledged, and the log
    /// holds whole lines only).
    pub fn stop_load(&mut self) {
        if let Some(mut p) = self.load.take() {
            p.kill9().expect("stop the load");
        }
    }

    /// The primary's flushed end now.
    pub fn primary_flush(&self) -> u64 {
        status::flush_lsn(&self.primary.status().expect("primary status")).expect("flush_lsn")
    }

    /// Stops the load, waits for the standbys to hold everything acknowledged, and checks
    /// every node against the acknowledgement log and each standby's WAL against the
    /// primary's. Returns (acknowledged records, records lost on the worst node).
    pub fn finish(&mut self) -> Verdict {
        self.stop_load();
        let log = acklog::read(&self.ack_log).expect("read the ack log");
        let last = log.iter().map(|e| e.end_lsn.0).max().unwrap_or(0);
        let records: u64 = log.iter().map(|e| e.hashes.len() as u64).sum();
        let mut lost = 0;
        let mut problems = Vec::new();
        let primary_end = self.primary_flush();
        for node in [&self.primary, &self.s1, &self.s2] {
            // A standby may lag; what the client was told is durable must reach it.
            if let Err(e) = node.wait_status("hold every acknowledged append", DEADLINE, |s| {
                status::flush_lsn(s).is_some_and(|f| f >= last.max(primary_end))
            }) {
                problems.push(e.to_string());
            }
            let path = self.ack_log.clone();
            let report = node
                .host
                .run(move || acklog::verify_node(&path, HTTP, None))
                .expect("enter the node's namespace")
                .unwrap_or_else(|e| panic!("verify {}: {e:#}", node.name));
            if report.lost > 0 || report.found != records {
                problems.push(format!(
                    "{}: {} of {records} acknowledged records found, {} lost: {:?}",
                    node.name, report.found, report.lost, report.lost_examples
                ));
            }
            lost = lost.max(records - report.found.min(records));
        }
        for standby in [&self.s1, &self.s2] {
            if let Err(e) = same_wal(&self.primary.data_dir(), &standby.data_dir(), primary_end) {
                problems.push(format!("{}: {e}", standby.name));
            }
        }
        Verdict {
            appends: log.len() as u64,
            records,
            lost,
            problems,
        }
    }

    /// Writes the scenario's row; the replay command names the test.
    pub fn row(&self, scenario: &str, fault: &str, cycles: u64, v: &Verdict, recover: &[f64]) {
        let row = Row {
            fault: fault.to_string(),
            cycles,
            duration_s: self.started.elapsed().as_secs_f64(),
            acknowledged: v.records,
            lost: v.lost,
            recovered: v.problems.is_empty(),
            recover_ms: RecoverMs::of(recover),
            replay: format!("cargo test --test faults {scenario} -- --exact"),
        };
        let path = row.write(scenario).expect("write the row");
        eprintln!(
            "{scenario}: {}",
            serde_json::to_string(&row).unwrap_or_default()
        );
        eprintln!("row written to {}", path.display());
        if let Err(e) = fault_harness::report::check_published(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
            &row,
        ) {
            panic!("{e}");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                eprintln!("the cluster's files are kept in {}", dir.keep().display());
            }
        }
    }
}

/// What [`Cluster::finish`] found.
pub struct Verdict {
    pub appends: u64,
    pub records: u64,
    pub lost: u64,
    /// Everything that did not hold, in words; empty when all is well.
    pub problems: Vec<String>,
}

impl Verdict {
    /// The verdict with the scenario's own findings added.
    pub fn with(mut self, problems: Vec<String>) -> Verdict {
        self.problems.extend(problems);
        self
    }

    pub fn assert_ok(&self) {
        assert!(self.appends > 0, "the load had no append acknowledged");
        assert!(self.problems.is_empty(), "{}", self.problems.join("\n"));
    }
}

/// Compares the standby's WAL files with the primary's, byte for byte, from the standby's
/// first segment to `end` (both have flushed that far).
fn same_wal(primary: &Path, standby: &Path, end: u64) -> Result<(), String> {
    let names = |dir: &Path| -> Vec<(u64, String)> {
        let mut v: Vec<(u64, String)> = std::fs::read_dir(dir.join("pg_wal"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        wal_storage::parse_segment_file_name(&name, SEGMENT)
                            .map(|(_, segno)| (segno, name))
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let ours = names(standby);
    let Some(&(first, _)) = ours.first() else {
        return Err("no WAL segments".into());
    };
    let mut compared = 0u64;
    for (segno, name) in ours.iter().filter(|(s, _)| s * SEGMENT < end) {
        let want = ((end - segno * SEGMENT).min(SEGMENT)) as usize;
        let read = |dir: &Path| {
            std::fs::read(dir.join("pg_wal").join(name)).map_err(|e| format!("read {name}: {e}"))
        };
        let (a, b) = (read(primary)?, read(standby)?);
        if a.len() < want || b.len() < want {
            return Err(format!("{name} is shorter than {want} bytes"));
        }
        if let Some(i) = a[..want].iter().zip(&b[..want]).position(|(x, y)| x != y) {
            return Err(format!(
                "{name} differs from the primary's at offset {i:#x}"
            ));
        }
        compared += want as u64;
    }
    if compared == 0 || first * SEGMENT >= end {
        return Err(format!("nothing to compare below {end:#x}"));
    }
    Ok(())
}
