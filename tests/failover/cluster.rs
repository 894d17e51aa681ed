//! A failover cluster on a test network: three hosts, each with an etcd member and a
//! `walserver run` node under `[failover]`, a client host for the load, and optionally a
//! cascading standby without `[failover]` on a host of its own; and the checks every scenario
//! ends with, judged from the client's acknowledgement log.
//!
//! The nodes' admin APIs listen on their hosts' addresses (with a bearer token), so that the
//! load on the client host reaches every member and follows the leader (`walserver bench
//! append --http n0,n1,n2`). `n0` is made a primary (`walserver init`), `n1` and `n2`
//! standbys of it; from then on etcd decides who leads. Timeouts are short: the leader key's
//! ttl is [`ttl`] (3 s unless `WALSERVER_TEST_FAILOVER_TTL_MS` says otherwise, to fit CI) and the replication timeouts 2 s.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fault_harness::etcd::EtcdCluster;
use fault_harness::node::AdminAt;
use fault_harness::report::RecoverMs;
use fault_harness::watch::LineWatch;
use fault_harness::{Host, Net, Process, Request, WalNode};
use supervisor_actor::NodeStatus;
use walserver_bench::acklog::{self, AckEntry};
use walserver_bench::judge::{judge, NodeWal};

/// The leader key's ttl by default: short, so that a failover fits in a CI run.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3);

/// The leader key's ttl of every scenario: [`DEFAULT_TTL`], or `WALSERVER_TEST_FAILOVER_TTL_MS`
/// (walserver's own default of 10 s, say, for a measurement beside Patroni's).
pub fn ttl() -> Duration {
    match std::env::var("WALSERVER_TEST_FAILOVER_TTL_MS") {
        Ok(ms) => Duration::from_millis(
            ms.parse()
                .expect("WALSERVER_TEST_FAILOVER_TTL_MS must be a number of milliseconds"),
        ),
        Err(_) => DEFAULT_TTL,
    }
}
/// How long a scenario waits for something that should happen soon (a guess for two busy
/// cores running three etcd members and four nodes).
pub const DEADLINE: Duration = Duration::from_secs(45);
/// Concurrent writers of the load.
pub const WRITERS: usize = 4;
/// The admin APIs' token.
pub const TOKEN: &str = "failover-test-token";
/// Each request of the load is given up after this long (then it is indeterminate, and the
/// writer looks for the leader): below the ttl, so a paused primary does not hold the load.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one `/primary` probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
pub const MEMBERS: usize = 3;
/// The nodes' WAL segment size (`walserver init --wal-segment-size 1MB`).
pub const SEGMENT: u64 = 1 << 20;

/// The `walserver` binary cargo built for this test target.
pub fn walserver_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_walserver"))
}

/// How to build the cluster.
pub struct Options {
    pub ttl: Duration,
    /// `synchronous_mode` of every member: `on` unless a scenario says otherwise, so that an
    /// acknowledged append is on the one standby that may be promoted.
    pub synchronous_mode: &'static str,
    /// Add a standby without `[failover]` (`x`) whose upstream is the member `n1`.
    pub cascade: bool,
    /// Every member archives under `archive_mode = on` to a SeaweedFS on the client host
    /// (`archive.rs`).
    pub archive: bool,
    /// The load's record size in bytes.
    pub record_size: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ttl: ttl(),
            synchronous_mode: "on",
            cascade: false,
            archive: false,
            record_size: 100,
        }
    }
}

/// The cluster. Fields drop in order: the load, the nodes, etcd, the network, the files.
pub struct Cluster {
    load: Option<Process>,
    pub nodes: Vec<WalNode>,
    pub cascade: Option<WalNode>,
    /// The archive's store, with [`Options::archive`].
    pub archive: Option<pg_testkit::SeaweedServer>,
    pub etcd: EtcdCluster,
    _net: Net,
    pub hosts: Vec<Host>,
    pub client: Host,
    pub ack_log: PathBuf,
    pub acks: LineWatch,
    /// The name the cluster was started with.
    pub label: String,
    record_size: usize,
    pub started: Instant,
    /// Kept (not removed) when the test fails, for its logs and data directories.
    dir: Option<tempfile::TempDir>,
}

/// The `[failover]` table and the timeouts of member `name`, and its archiving
/// (`archive`: top-level lines and a table, see `archive.rs`).
fn member_toml(
    name: &str,
    label: &str,
    etcd: &[String],
    opts: &Options,
    archive: &(String, String),
) -> String {
    let endpoints: Vec<String> = etcd.iter().map(|u| format!("{u:?}")).collect();
    format!(
        "wal_sender_timeout = \"2s\"\nwal_receiver_timeout = \"2s\"\n\
         wal_receiver_status_interval = \"1s\"\nwal_keep_size = \"1GB\"\n{}\
         [failover]\netcd_endpoints = [{}]\ncluster_name = {label:?}\nnode_name = {name:?}\n\
         ttl = \"{}ms\"\nsynchronous_mode = {:?}\n{}",
        archive.0,
        endpoints.join(", "),
        opts.ttl.as_millis(),
        opts.synchronous_mode,
        archive.1,
    )
}

impl Cluster {
    /// Three members streaming from the leader `n0`, named after `label` (short: it names
    /// namespaces and the etcd cluster).
    pub fn start(label: &str, opts: Options) -> Cluster {
        fault_harness::fault::check_tools().expect("the fault tools");
        let started = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix(&format!("walserver-failover-{label}-"))
            .tempdir()
            .expect("tempdir");
        let mut net = Net::new(label).expect("test network");
        let hosts: Vec<Host> = (0..MEMBERS)
            .map(|i| net.add_host(&format!("n{i}")).expect("host"))
            .collect();
        let client = net.add_host("c").expect("client host");
        let cascade_host = opts
            .cascade
            .then(|| net.add_host("x").expect("cascade host"));
        let etcd = EtcdCluster::start(&hosts, &dir.path().join("etcd")).expect("etcd");
        let archive = opts.archive.then(|| {
            pg_testkit::SeaweedServer::start_in(client.addr, client.enter_hook())
                .unwrap_or_else(|e| panic!("SeaweedFS on the client host: {e}"))
        });
        let archiving = archive
            .as_ref()
            .map(|s| crate::archive::member_toml(s, label))
            .unwrap_or_default();
        // Each member lists its own etcd member first.
        let urls = etcd.client_urls();
        let endpoints = |i: usize| -> Vec<String> {
            let mut v = vec![urls[i].clone()];
            v.extend(
                urls.iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, u)| u.clone()),
            );
            v
        };
        let bin = walserver_bin();
        let admin = AdminAt::Network {
            token: TOKEN.to_string(),
        };
        let mut n0 = WalNode::primary_with(
            &hosts[0],
            &bin,
            &dir.path().join("n0"),
            "n0",
            &["--wal-segment-size", "1MB"],
            &member_toml("n0", label, &endpoints(0), &opts, &archiving),
            &admin,
        )
        .expect("n0");
        n0.start().expect("start n0");
        let mut nodes = vec![n0];
        for (i, host) in hosts.iter().enumerate().skip(1) {
            let name = format!("n{i}");
            let node = WalNode::standby_with(
                host,
                &bin,
                &dir.path().join(&name),
                &name,
                &nodes[0].conninfo(&name),
                &member_toml(&name, label, &endpoints(i), &opts, &archiving),
                &admin,
            )
            .expect("standby member");
            nodes.push(node);
        }
        let ack_log = dir.path().join("acks.jsonl");
        let acks = LineWatch::new(&ack_log).expect("watch the ack log");
        let mut c = Cluster {
            load: None,
            nodes,
            cascade: None,
            archive,
            etcd,
            _net: net,
            hosts,
            client,
            ack_log,
            acks,
            label: label.to_string(),
            record_size: opts.record_size,
            started,
            dir: Some(dir),
        };
        c.wait_leader(DEADLINE, None).expect("n0 leads");
        for i in 1..MEMBERS {
            c.nodes[i].start().expect("start a standby member");
        }
        c.wait_members_follow(0, DEADLINE)
            .expect("both standbys stream from n0");
        if let Some(host) = cascade_host {
            let mut x = WalNode::standby_with(
                &host,
                &bin,
                &c.dir().join("x"),
                "x",
                &c.nodes[1].conninfo("x"),
                "wal_receiver_timeout = \"2s\"\nwal_receiver_status_interval = \"1s\"\n",
                &admin,
            )
            .expect("cascade standby");
            x.start().expect("start the cascade");
            c.nodes[1]
                .wait_status("stream to x", DEADLINE, |s| s.streams_to("x"))
                .expect("the cascade streams from n1");
            c.cascade = Some(x);
        }
        c
    }

    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the cluster's directory").path()
    }

    /// Whether member `i` says it leads: `GET /primary` answers 200 (asked from the client
    /// host, with a short timeout so that a paused member is a "no").
    pub fn is_leader(&self, i: usize) -> bool {
        matches!(self.primary_answer(i), Ok((200, _)))
    }

    /// Member `i`'s answer to `GET /primary`.
    fn primary_answer(&self, i: usize) -> fault_harness::Result<(u16, String)> {
        let req = Request {
            timeout: PROBE_TIMEOUT,
            token: Some(TOKEN),
            ..Request::default()
        };
        self.client
            .http("GET", self.nodes[i].http(), "/primary", &req)
    }

    /// The running members that say they lead.
    pub fn leaders(&self) -> Vec<usize> {
        (0..MEMBERS)
            .filter(|&i| self.nodes[i].is_running() && self.is_leader(i))
            .collect()
    }

    /// Waits until exactly one member leads (and it is not `not`); which one. Asks every
    /// 50 ms: the cluster tells nobody outside when it has elected (a guess, fine enough to
    /// see a failover of seconds).
    pub fn wait_leader(&self, deadline: Duration, not: Option<usize>) -> Result<usize, String> {
        let start = Instant::now();
        loop {
            let l = self.leaders();
            if let [one] = l.as_slice() {
                if Some(*one) != not {
                    return Ok(*one);
                }
            }
            if start.elapsed() > deadline {
                let answers: Vec<String> = (0..MEMBERS)
                    .filter(|&i| self.nodes[i].is_running())
                    .map(|i| format!("n{i}: {:?}", self.primary_answer(i)))
                    .collect();
                return Err(format!(
                    "no single new leader within {deadline:?} (leaders now: {l:?}, not \
                     {not:?}); GET /primary: {answers:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every other running member streams from `leader`; the time it took.
    pub fn wait_members_follow(
        &self,
        leader: usize,
        deadline: Duration,
    ) -> Result<Duration, String> {
        let t = Instant::now();
        for i in (0..MEMBERS).filter(|&i| i != leader && self.nodes[i].is_running()) {
            let name = self.nodes[i].name.clone();
            let left = deadline.saturating_sub(t.elapsed());
            self.nodes[leader]
                .wait_status(&format!("stream to {name}"), left, |s| s.streams_to(&name))
                .map_err(|e| e.to_string())?;
        }
        Ok(t.elapsed())
    }

    /// `/status` of member `i`, or `None` if it does not answer.
    pub fn status_of(&self, i: usize) -> Option<NodeStatus> {
        self.nodes[i].status().ok()
    }

    /// Starts the load on the client host: WRITERS writers at durability `on` against every
    /// member, following the leader, every acknowledgement in the log.
    pub fn start_load(&mut self) {
        let endpoints: Vec<&str> = self.nodes.iter().map(|n| n.http()).collect();
        let mut cmd = self.client.command(walserver_bin());
        cmd.args(["bench", "append", "--http", &endpoints.join(",")])
            .args(["--token", TOKEN, "--ack-log"])
            .arg(&self.ack_log)
            .args(["--keep-going", "--request-timeout"])
            .arg(format!("{}", REQUEST_TIMEOUT.as_secs_f64()))
            .args(["--writers", &WRITERS.to_string(), "--size"])
            .arg(self.record_size.to_string())
            .args(["--durability", "on", "--seconds", "3600"]);
        let log = self.dir().join("load.log");
        self.load = Some(Process::spawn("load", cmd, &log).expect("start the load"));
    }

    /// Stops the load (SIGKILL: the logs hold whole lines only).
    pub fn stop_load(&mut self) {
        if let Some(mut p) = self.load.take() {
            p.kill9().expect("stop the load");
        }
    }

    /// Waits until `n` more appends than now are acknowledged; if they are not, says whether
    /// the load tool is still running and what it logged last.
    pub fn wait_more_acks(&mut self, n: usize, deadline: Duration) -> Result<(), String> {
        let now = self.acks.lines().map_err(|e| e.to_string())?;
        let load = self.load.as_ref().map(Process::exit_watch);
        self.acks
            .wait_lines_or_exit(now + n, deadline, load)
            .map(|_| ())
            .map_err(|e| {
                let why = self
                    .load
                    .as_mut()
                    .map_or("no load runs".into(), |p| p.explain());
                format!("the load's appends: {e}; {why}")
            })
    }

    /// The acknowledgement log so far.
    pub fn log(&self) -> Vec<AckEntry> {
        acklog::read(&self.ack_log).expect("read the ack log")
    }

    /// Waits, woken by each new acknowledgement, for the first one (in the log's order) that
    /// satisfies `want`; `None` after `deadline`.
    pub fn wait_ack(
        &mut self,
        deadline: Duration,
        want: impl Fn(&AckEntry) -> bool,
    ) -> Option<AckEntry> {
        let start = Instant::now();
        let mut read = 0;
        loop {
            let log = self.log();
            if let Some(e) = log[read.min(log.len())..].iter().find(|e| want(e)) {
                return Some(e.clone());
            }
            read = log.len();
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

    /// The highest timeline acknowledged so far.
    pub fn acked_timeline(&self) -> u32 {
        self.log().iter().map(|e| e.timeline).max().unwrap_or(0)
    }

    /// Stops the load and judges the end state ([`judge`]) over the leader (waited for), every
    /// other running node and the cascade: every acknowledged append once on each, at its
    /// LSN, on its timeline, with its hash; their WAL byte for byte alike, timeline by
    /// timeline; the same history files; nothing acknowledged on an old term. All must be on
    /// the leader's timeline with its history file; and how many indeterminate appends the
    /// leader holds.
    pub fn finish(&mut self) -> Verdict {
        self.stop_load();
        let log = self.log();
        let indeterminate = acklog::read_indeterminate(&self.ack_log).expect("indeterminate log");
        let mut v = Verdict {
            appends: log.len() as u64,
            records: log.iter().map(|e| e.hashes.len() as u64).sum(),
            indeterminate: indeterminate.len() as u64,
            ..Verdict::default()
        };
        let leader = match self.wait_leader(DEADLINE, None) {
            Ok(l) => l,
            Err(e) => {
                v.problems.push(e);
                // What the log alone shows (an acknowledgement on an old term) still counts.
                v.problems
                    .extend(judge(&log, &indeterminate, &[]).describe());
                return v;
            }
        };
        let leader_status = self.nodes[leader].status().expect("the leader's status");
        let (end, timeline) = (leader_status.flush_lsn, leader_status.timeline);
        let mut checked: Vec<&WalNode> = vec![&self.nodes[leader]];
        checked.extend(
            self.nodes
                .iter()
                .enumerate()
                .filter(|(i, n)| *i != leader && n.is_running())
                .map(|(_, n)| n),
        );
        checked.extend(self.cascade.iter());
        let mut views = Vec::new();
        for node in checked {
            if let Err(e) = node.wait_status("hold the leader's WAL", DEADLINE, |s| {
                s.flush_lsn >= end && s.timeline == timeline
            }) {
                v.problems.push(e.to_string());
            }
            let (name, http, data) = (node.name.clone(), node.http().to_string(), node.data_dir());
            let fetched = node
                .host
                .run(move || NodeWal::fetch(&name, &http, Some(TOKEN), &data, SEGMENT))
                .expect("enter the node's namespace");
            match fetched {
                Ok(view) => views.push(view),
                Err(e) => v
                    .problems
                    .push(format!("the records of {}: {e:#}", node.name)),
            }
        }
        let judged = judge(&log, &indeterminate, &views);
        for (name, r) in &judged.nodes {
            if r.found != judged.records {
                v.problems.push(format!(
                    "{name}: {} of {} acknowledged records found ({} older than it keeps)",
                    r.found, judged.records, r.unverifiable
                ));
            }
        }
        v.lost = judged.lost;
        v.indeterminate_present = judged
            .node(&self.nodes[leader].name)
            .map_or(0, |r| r.indeterminate_present);
        v.problems.extend(judged.describe());
        v.timeline = u64::from(timeline.0);
        if let Err(e) = self.same_history(leader, timeline.0) {
            v.problems.push(e);
        }
        v.leader = leader;
        v
    }

    /// Every running node (the cascade too) has the leader's history file of `timeline`, byte
    /// for byte (timeline 1 has none).
    fn same_history(&self, leader: usize, timeline: u32) -> Result<(), String> {
        if timeline <= 1 {
            return Ok(());
        }
        let name = format!("{timeline:08X}.history");
        let read = |n: &WalNode| std::fs::read(n.data_dir().join("pg_wal").join(&name));
        let want = read(&self.nodes[leader]).map_err(|e| format!("the leader's {name}: {e}"))?;
        for n in self
            .nodes
            .iter()
            .filter(|n| n.is_running())
            .chain(self.cascade.iter())
        {
            match read(n) {
                Ok(got) if got == want => {}
                Ok(_) => return Err(format!("{}: {name} differs from the leader's", n.name)),
                Err(e) => return Err(format!("{}: {name}: {e}", n.name)),
            }
        }
        Ok(())
    }

    /// Writes the scenario's row to `$CARGO_TARGET_DIR/failover/`; the replay command names
    /// the test (and `env`, the variables that sized the run).
    pub fn row(
        &self,
        scenario: &str,
        fault: &str,
        cycles: u64,
        v: &Verdict,
        m: &Measured,
        env: &str,
    ) {
        self.row_in(scenario, scenario, fault, cycles, v, m, env)
    }

    /// As [`Cluster::row`], kept under `file` (a second row of one scenario, run with other
    /// settings) rather than under the scenario's name.
    #[allow(clippy::too_many_arguments)]
    pub fn row_in(
        &self,
        file: &str,
        scenario: &str,
        fault: &str,
        cycles: u64,
        v: &Verdict,
        m: &Measured,
        env: &str,
    ) {
        let row = walserver_bench::failover_table::FailoverRow {
            fault: fault.to_string(),
            cycles,
            duration_s: self.started.elapsed().as_secs_f64(),
            acknowledged: v.records,
            lost: v.lost,
            indeterminate: v.indeterminate,
            indeterminate_present: v.indeterminate_present,
            old_term_acks: m.old_term_acks,
            promotions: m.promotions,
            failover_ms: RecoverMs::of(&m.failover_ms),
            pause_ms: m.pause_ms,
            passed: v.problems.is_empty(),
            replay: format!("{env}cargo test --test failover {scenario} -- --exact")
                .trim_start()
                .to_string(),
        };
        let path = row.write(file).expect("write the row");
        eprintln!(
            "{scenario}: {}",
            serde_json::to_string(&row).unwrap_or_default()
        );
        eprintln!("row written to {}", path.display());
        // The suite keeps its published table current: a scenario it runs must have a row.
        let table = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/FAILOVER.md");
        let text = std::fs::read_to_string(&table).unwrap_or_default();
        assert!(
            walserver_bench::reliability::published_replay(&text, &row.replay),
            "{} has no row for {scenario} ({}): run it and render the table again, as the notes \
             under the table say",
            table.display(),
            row.replay
        );
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

/// The writer number of [`probe_append`]'s appends (the load's writers count from 0).
pub const PROBE_WRITER: usize = 1000;

/// What one [`probe_append`] was answered.
#[derive(Debug)]
pub struct Probe {
    /// The HTTP status, or the transport error.
    pub answer: Result<(u16, String), String>,
    /// When the answer (or the error) came ([`acklog::mono_ms`]).
    pub at_ms: u64,
}

/// One append of the test's own, sent from `client` to the admin API `http` at `durability`
/// with `seq` (unique per test) as writer [`PROBE_WRITER`], given `timeout` to be answered.
/// An acknowledgement goes into the ack log at `ack_log` like the load's (one line, one write,
/// opened for appending), so every check of the log counts it and the end state must hold it.
pub fn probe_append(
    client: &Host,
    http: &str,
    ack_log: &Path,
    seq: u64,
    durability: &str,
    timeout: Duration,
) -> Probe {
    let payload = acklog::payload(PROBE_WRITER, seq, 0, 100);
    let req = Request {
        timeout,
        token: Some(TOKEN),
        body: Some(&payload),
        content_type: Some("application/octet-stream"),
    };
    let answer = client
        .http("POST", http, &format!("/wal?durability={durability}"), &req)
        .map_err(|e| e.to_string());
    let at_ms = acklog::mono_ms();
    if let Ok((200, body)) = &answer {
        let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let entry = AckEntry {
            writer: PROBE_WRITER,
            seq,
            timeline: v["timeline"].as_u64().unwrap_or(0) as u32,
            end_lsn: v["end_lsn"]
                .as_str()
                .and_then(|l| l.parse().ok())
                .unwrap_or_default(),
            hashes: vec![acklog::sha256_hex(&payload)],
            mono_ms: Some(at_ms),
            node: Some(http.to_string()),
            term: v["term"].as_u64(),
        };
        let mut line = serde_json::to_vec(&entry).expect("an entry is JSON");
        line.push(b'\n');
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(ack_log)
            .expect("open the ack log");
        std::io::Write::write_all(&mut f, &line).expect("log the probe's acknowledgement");
    }
    Probe { answer, at_ms }
}

/// What a scenario measured beyond the end state.
#[derive(Default)]
pub struct Measured {
    /// Acknowledgements of an older timeline received after the first of a newer one.
    pub old_term_acks: u64,
    /// Leader changes seen (timelines acknowledged beyond the first).
    pub promotions: u64,
    /// Per cycle: from the fault to the first acknowledgement by the new leader.
    pub failover_ms: Vec<f64>,
    /// The longest pause between two acknowledgements, where the scenario measures it.
    pub pause_ms: Option<f64>,
}

/// What [`Cluster::finish`] found.
#[derive(Default)]
pub struct Verdict {
    pub appends: u64,
    pub records: u64,
    pub lost: u64,
    pub indeterminate: u64,
    pub indeterminate_present: u64,
    pub leader: usize,
    pub timeline: u64,
    /// Everything that did not hold, in words; empty when all is well.
    pub problems: Vec<String>,
}

impl Verdict {
    pub fn with(mut self, problems: Vec<String>) -> Verdict {
        self.problems.extend(problems);
        self
    }

    pub fn assert_ok(&self) {
        assert!(self.appends > 0, "the load had no append acknowledged");
        assert!(self.problems.is_empty(), "{}", self.problems.join("\n"));
    }
}
