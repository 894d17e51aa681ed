//! Crash and resource faults against real `walserver run` processes on loopback, judged against
//! what the client saw acknowledged: kill -9 of any node of a primary → synchronous standby →
//! cascade chain under writers, a full disk on a primary and on a standby, a log that cannot be
//! written, accept failing with EMFILE, power loss of whole nodes on `lossyfs` mounts (root),
//! of a pair and of three members under `[failover]` on etcd, and nodes killed at the commit
//! path's crash points with their power lost there, as a pair and as members under
//! `[failover]`; and the soak bench at a tiny scale. Each
//! fault scenario but the power losses and crash points writes a row of
//! the reliability table (`walserver-bench reliability-table`, `benches/RELIABILITY.md`).
//!
//! CI runs them short. `WALSERVER_TEST_CHAOS_CYCLES=N` runs N cycles of each;
//! `WALSERVER_TEST_CHAOS_SEED=S` replays the kill order of a run (each run prints its seed).
//! The variables are `WALSERVER_TEST_` ones so the nodes, which refuse unknown `WALSERVER_*`
//! variables, accept them in their environment.

mod accept;
mod crash_points;
mod failover_crash_points;
mod failover_power_loss;
mod full_disk;
mod kill_chain;
mod line;
mod lossy;
mod node;
mod power_loss;
mod reader;
// The relay the other suites put between a node and a peer, here between a member and etcd
// or its standbys; these scenarios do not ask when it connected.
#[path = "../common/relay.rs"]
#[allow(dead_code)]
mod relay;
mod soak;

use std::path::Path;
use std::time::Duration;

use fault_harness::report::{RecoverMs, Row};
use fault_harness::watch::{ExitWatch, LineWatch};
use wal_storage::Lsn;
use walserver_bench::acklog::{self, AckEntry};
use walserver_bench::judge::{self, NodeWal};

use node::{ChaosNode, ChildNode};

/// The cycle count of a scenario: `WALSERVER_TEST_CHAOS_CYCLES`, else `ci`.
pub fn cycles(ci: u64) -> u64 {
    std::env::var("WALSERVER_TEST_CHAOS_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ci)
}

/// splitmix64: a seeded generator small enough to write here, so that a run's kills and
/// crashes are replayed from its seed alone.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The seed: `WALSERVER_TEST_CHAOS_SEED`, else one from the clock (printed, to replay).
pub fn seed() -> u64 {
    std::env::var("WALSERVER_TEST_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

/// Writes a scenario's row of the reliability table (the fault harness's row, into its
/// directory: `$CARGO_TARGET_DIR/reliability`). `recovered` is how many cycles recovered.
#[allow(clippy::too_many_arguments)]
pub fn write_row(
    file: &str,
    fault: &str,
    cycles: u64,
    duration: Duration,
    acknowledged: u64,
    lost: u64,
    recovered: u64,
    recover: &[Duration],
    replay: &str,
) {
    let ms: Vec<f64> = recover.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    let row = Row {
        fault: fault.into(),
        cycles,
        duration_s: duration.as_secs_f64(),
        acknowledged,
        lost,
        recovered: recovered == cycles,
        recover_ms: RecoverMs::of(&ms),
        replay: replay.into(),
    };
    let path = row.write(file).expect("write the reliability row");
    println!("reliability row: {}", path.display());
    if let Err(e) = fault_harness::report::check_published(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        &row,
    ) {
        panic!("{e}");
    }
}

/// Every chaos node is made with 1 MiB segments.
pub const SEGMENT: u64 = 1 << 20;

/// Judges `nodes` against the acknowledged appends of `logs` together ([`judge`]), panicking
/// with every failure; returns the verdict for its figures.
pub fn assert_judged(logs: &[&[AckEntry]], nodes: &[&ChildNode]) -> judge::Verdict {
    let log: Vec<AckEntry> = logs.iter().flat_map(|l| l.iter().cloned()).collect();
    let views: Vec<NodeWal> = nodes
        .iter()
        .map(|n| {
            NodeWal::fetch(&n.name, &n.http_str(), None, &n.data_dir, SEGMENT)
                .unwrap_or_else(|e| panic!("the records of {}: {e:#}", n.name))
        })
        .collect();
    let v = judge::judge(&log, &[], &views);
    assert!(v.is_ok(), "{}", v.describe().join("\n"));
    v
}

/// Appends a test makes itself, one record each through `POST /wal`, kept as the load tool's
/// acknowledgement log keeps them ([`AckEntry`]), so they are checked the same way.
#[derive(Default)]
pub struct Acks {
    acked: Vec<AckEntry>,
    /// Appends tried, acknowledged or not: each gets a payload of its own, so that one whose
    /// answer was lost but which was written is never the same record as a later one.
    tried: u64,
}

/// The writer number of a test's own appends in the log (the load tool's writers count from 0).
const TEST_WRITER: usize = 9999;

impl Acks {
    /// Appends `n` records of `size` bytes to `node` (at its default durability) and logs
    /// each acknowledged one; returns the last end.
    pub fn append(&mut self, node: &ChildNode, n: usize, size: usize) -> anyhow::Result<Lsn> {
        let mut end = Lsn::INVALID;
        for _ in 0..n {
            end = self
                .try_append(node, size, "", None)
                .map_err(|(status, text)| anyhow::anyhow!("HTTP {status}: {text}"))?;
        }
        Ok(end)
    }

    /// One append of one record at `durability` (the node's default if empty), given up after
    /// `timeout`; logged if acknowledged. A refusal is its HTTP status and text (status 0: no
    /// answer).
    pub fn try_append(
        &mut self,
        node: &ChildNode,
        size: usize,
        durability: &str,
        timeout: Option<Duration>,
    ) -> Result<Lsn, (u16, String)> {
        let client =
            walserver_node::admin::AdminClient::with_timeout(&node.http_str(), None, timeout);
        let seq = self.tried;
        self.tried += 1;
        let payload = acklog::payload(TEST_WRITER, seq, 0, size);
        let path = if durability.is_empty() {
            "/wal".to_string()
        } else {
            format!("/wal?durability={durability}")
        };
        let mut resp = client
            .post(&path, "application/octet-stream")
            .send(payload.as_slice())
            .map_err(|e| (0, e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        if !resp.status().is_success() {
            return Err((status, text));
        }
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| (status, e.to_string()))?;
        let end = v["end_lsn"].as_str().and_then(|l| l.parse::<Lsn>().ok());
        let (Some(end), Some(timeline)) = (end, v["timeline"].as_u64()) else {
            return Err((
                status,
                format!("an answer without end_lsn or timeline: {text}"),
            ));
        };
        self.acked.push(AckEntry {
            writer: TEST_WRITER,
            seq,
            timeline: timeline as u32,
            end_lsn: end,
            hashes: vec![acklog::sha256_hex(&payload)],
            // When it was acknowledged, as the load tool's log says it, so that the judge
            // orders it among the writers' appends rather than after them all.
            mono_ms: Some(acklog::mono_ms()),
            ..AckEntry::default()
        });
        Ok(end)
    }

    pub fn count(&self) -> u64 {
        self.acked.len() as u64
    }

    /// The acknowledged appends, as the load tool's log holds them.
    pub fn entries(&self) -> &[AckEntry] {
        &self.acked
    }

    /// How many acknowledged records `node` does not hold, at their LSN with their bytes.
    pub fn lost_on(&self, node: &ChildNode) -> u64 {
        let records = acklog::fetch_records(&node.http_str(), None).expect("the node's records");
        acklog::verify(&self.acked, &records).lost
    }
}

/// The load tool's HTTP writers (`walserver bench append --keep-going --ack-log FILE`) run
/// as a child process against a node until stopped: killed, as a client crashes, which loses
/// at most the log line of an append in flight, never an earlier one.
pub struct Load {
    /// In a cell so that a wait that gives up can ask whether it exited.
    child: std::cell::RefCell<std::process::Child>,
    /// Its exit as an event, opened before anything could reap it.
    exit: ExitWatch,
    /// Its stderr: why it stopped, when it does.
    log: std::path::PathBuf,
    pub ack_log: std::path::PathBuf,
    /// The log's complete lines, counted as it grows and waited for through inotify.
    acks: std::cell::RefCell<LineWatch>,
}

impl Load {
    /// `writers` writers of `batch` records of `size` bytes at `durability` against `node`.
    pub fn start(
        node: &ChildNode,
        dir: &Path,
        writers: usize,
        batch: usize,
        size: usize,
        durability: &str,
    ) -> Load {
        Load::start_on(&node.http_str(), dir, writers, batch, size, durability)
    }

    /// As [`Load::start`], against the admin APIs `http` (comma-separated: the writers follow
    /// whichever of them is the primary).
    pub fn start_on(
        http: &str,
        dir: &Path,
        writers: usize,
        batch: usize,
        size: usize,
        durability: &str,
    ) -> Load {
        let ack_log = dir.join("acks.jsonl");
        // Watched before the writers start, so that no line is written unseen.
        let acks = LineWatch::new(&ack_log).expect("watch the acknowledgement log");
        let log = dir.join("load.log");
        let stderr = std::fs::File::create(&log).expect("the load's log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_walserver"))
            .args(["bench", "append", "--http", http, "--ack-log"])
            .arg(&ack_log)
            .args(["--keep-going", "--request-timeout", "10", "--json"])
            .args(["--writers", &writers.to_string()])
            .args(["--batch", &batch.to_string()])
            .args(["--size", &size.to_string()])
            .args(["--durability", durability])
            .args(["--seconds", "86400"])
            .env_remove(fault_harness::report::DIR_VAR)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("run walserver bench append");
        let exit = ExitWatch::of(child.id()).expect("watch the load tool's exit");
        Load {
            child: std::cell::RefCell::new(child),
            exit,
            log,
            ack_log,
            acks: std::cell::RefCell::new(acks),
        }
    }

    /// The acknowledged appends logged so far (none before the log exists).
    pub fn acks(&self) -> Vec<AckEntry> {
        if !self.ack_log.exists() {
            return Vec::new();
        }
        acklog::read(&self.ack_log).expect("read the acknowledgement log")
    }

    /// How many acknowledged appends the log holds: its complete lines, counted from where
    /// the last call stopped (the log only grows, a whole line per write), so that waiting on
    /// it costs the new bytes only, not a parse of the whole log each time.
    pub fn count(&self) -> usize {
        self.acks
            .borrow_mut()
            .lines()
            .expect("count the acknowledgement log")
    }

    /// Waits until the log holds more than `n` acknowledged appends, woken by its writes
    /// and by the load tool's exit (which ends the wait at once); returns how many, or says
    /// whether the load tool is still running and what it logged.
    pub fn wait_acks_beyond(&self, n: usize, deadline: Duration) -> anyhow::Result<usize> {
        self.acks
            .borrow_mut()
            .wait_lines_or_exit(n + 1, deadline, Some(&self.exit))
            .map_err(|e| {
                let exited = self.child.borrow_mut().try_wait().ok().flatten();
                let why = fault_harness::process::explain("the load tool", exited, &self.log);
                anyhow::anyhow!("waiting for more than {n} acknowledged appends: {e}; {why}")
            })
    }

    /// Stops the writers and returns the log.
    pub fn stop(mut self) -> Vec<AckEntry> {
        let child = self.child.get_mut();
        let _ = child.kill();
        let _ = child.wait();
        self.acks()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let child = self.child.get_mut();
        let _ = child.kill();
        let _ = child.wait();
    }
}
