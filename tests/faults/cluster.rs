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

use fault_harness::node::HTTP;
use fault_harness::proxy::{Delay, DelayProxy};
use fault_harness::report::{RecoverMs, Row};
use fault_harness::watch::LineWatch;
use fault_harness::{Host, Net, Process, WalNode};
use wal_storage::Lsn;
use walserver_bench::acklog;
use walserver_bench::judge::{judge, NodeWal};

/// How long a scenario waits for something that should happen soon.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// The timeouts the scenarios outlast (unless [`Options::timeout`] says otherwise).
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Concurrent writers of the load (each with one append in flight).
pub const WRITERS: usize = 4;
pub const SEGMENT: u64 = 1 << 20;

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
                s.streams_to("s1") && s.streams_to("s2")
            })?;
        for s in [&self.s1, &self.s2] {
            let left = deadline.saturating_sub(t.elapsed());
            s.wait_status("receive from the primary", left, |s| s.receiving())?;
        }
        Ok(t.elapsed())
    }

    /// Whether both standbys' walreceivers stop streaming within `deadline`.
    pub fn standbys_stop_receiving(&self, deadline: Duration) -> bool {
        let t = Instant::now();
        [&self.s1, &self.s2].iter().all(|s| {
            let left = deadline.saturating_sub(t.elapsed());
            s.wait_status("stop receiving", left, |st| !st.receiving())
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
        let load = self.load.as_ref().map(Process::exit_watch);
        let more = self.acks.wait_lines_or_exit(now + n, deadline, load);
        let count = more.unwrap_or_else(|e| {
            let why = self
                .load
                .as_mut()
                .map_or("no load runs".into(), |p| p.explain());
            panic!("the load's appends: {e}; {why}")
        });
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
            if left.is_zero() {
                return None;
            }
            // A load that exited writes no more: the wait ends then, not at the deadline.
            let load = self.load.as_ref().map(Process::exit_watch);
            if (self.acks)
                .wait_lines_or_exit(read + 1, left, load)
                .is_err()
            {
                return None;
            }
        }
    }

    /// Stops the load (SIGKILL: an append in flight is simply not acknowledged, and the log
    /// holds whole lines only).
    pub fn stop_load(&mut self) {
        if let Some(mut p) = self.load.take() {
            p.kill9().expect("stop the load");
        }
    }

    /// The end of the last acknowledged append so far.
    pub fn acked_end(&self) -> Lsn {
        acklog::read(&self.ack_log)
            .expect("read the ack log")
            .iter()
            .map(|e| e.end_lsn)
            .max()
            .unwrap_or(Lsn(0))
    }

    /// The primary's flushed end now.
    pub fn primary_flush(&self) -> Lsn {
        self.primary.status().expect("primary status").flush_lsn
    }

    /// Stops the load, waits for the standbys to hold everything acknowledged, and judges the
    /// cluster ([`judge`]): every acknowledged record once on every node, the standbys' WAL
    /// byte for byte the primary's, the same history files.
    pub fn finish(&mut self) -> Verdict {
        self.stop_load();
        let log = acklog::read(&self.ack_log).expect("read the ack log");
        let indeterminate = acklog::read_indeterminate(&self.ack_log).expect("indeterminate log");
        let last = log.iter().map(|e| e.end_lsn).max().unwrap_or(Lsn(0));
        let mut problems = Vec::new();
        let primary_end = self.primary_flush();
        let mut views = Vec::new();
        for node in [&self.primary, &self.s1, &self.s2] {
            // A standby may lag; what the client was told is durable must reach it.
            if let Err(e) = node.wait_status("hold every acknowledged append", DEADLINE, |s| {
                s.flush_lsn >= last.max(primary_end)
            }) {
                problems.push(e.to_string());
            }
            let (name, data) = (node.name.clone(), node.data_dir());
            let view = node
                .host
                .run(move || NodeWal::fetch(&name, HTTP, None, &data, SEGMENT))
                .expect("enter the node's namespace")
                .unwrap_or_else(|e| panic!("the records of {}: {e:#}", node.name));
            views.push(view);
        }
        let judged = judge(&log, &indeterminate, &views);
        for (name, r) in &judged.nodes {
            if r.found != judged.records {
                problems.push(format!(
                    "{name}: {} of {} acknowledged records found ({} older than it keeps)",
                    r.found, judged.records, r.unverifiable
                ));
            }
        }
        problems.extend(judged.describe());
        Verdict {
            appends: judged.appends,
            records: judged.records,
            lost: judged.lost,
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
