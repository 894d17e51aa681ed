//! `walserver run` child processes on loopback ([`ChildNode`], the load tool's, as every suite
//! runs nodes) that keep their ports across restarts (a standby's `primary_conninfo` names its
//! upstream's port), can be killed with SIGKILL and started again on the same data directory,
//! and are killed and reaped on drop, so a failing test leaves no process behind. Each
//! process's log goes to a file beside its data directory.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use fault_harness::watch::DirWatch;
use walserver_bench::acklog::NodeRecord;
use walserver_bench::node::{Output, Ready};

pub use fault_harness::node::conninfo_at;
pub use walserver_bench::node::ChildNode;

/// How long a step that should take moments (a start, a reconnect) may take before the test
/// fails. Generous: two cores are shared with other builds.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A node of this target's `walserver` on `data_dir` with loopback ports of its own and
/// `settings`, not started; its log is `NAME.log` beside the data directory, written by the
/// node itself (a scenario that times log lines reads them as they are written, with no copy
/// in between), so it is ready when its admin API answers.
pub fn child_node(name: &str, data_dir: &Path, settings: &[(&str, &str)]) -> ChildNode {
    let mut n = ChildNode::on_loopback(
        name,
        Path::new(env!("CARGO_BIN_EXE_walserver")),
        data_dir,
        settings,
    )
    .expect("loopback ports for a node");
    n.output(Output::File(data_dir.with_file_name(format!("{name}.log"))))
        .ready(Ready::AdminAnswers);
    n
}

/// What the chaos scenarios set and ask of a node beyond the [`ChildNode`] itself.
pub trait ChaosNode {
    /// Writes the log (the node's standard error) to `path`: outside the data directory's
    /// file system, say, or `/dev/full`, a log that cannot be written.
    fn with_log(self, path: &Path) -> Self;
    fn http_str(&self) -> String;
    /// The whole log so far (empty if it cannot be read).
    fn log_text(&self) -> String;
    /// The log's length in bytes now (0 if it cannot be read): where the lines of a start
    /// still to come begin.
    fn log_len(&self) -> u64;
    /// The log from byte `from` on (empty if it cannot be read).
    fn log_since(&self, from: u64) -> String;
    /// Waits until `fact` holds, asking it now and after each write to a file in the log's
    /// directory (the node writes its log there itself, so a line it writes wakes the wait),
    /// up to `deadline`; `what` names the wait in the failure.
    fn wait_log(
        &self,
        what: &str,
        deadline: Duration,
        fact: impl FnMut() -> bool,
    ) -> anyhow::Result<()>;
}

impl ChaosNode for ChildNode {
    fn with_log(mut self, path: &Path) -> ChildNode {
        self.output(Output::File(path.to_path_buf()));
        self
    }

    fn http_str(&self) -> String {
        self.http.clone()
    }

    fn log_text(&self) -> String {
        self.log_path()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    fn log_len(&self) -> u64 {
        self.log_path()
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len())
    }

    fn log_since(&self, from: u64) -> String {
        let read = |p: &Path| -> std::io::Result<String> {
            let mut f = std::fs::File::open(p)?;
            f.seek(SeekFrom::Start(from))?;
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes)?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        self.log_path()
            .and_then(|p| read(p).ok())
            .unwrap_or_default()
    }

    fn wait_log(
        &self,
        what: &str,
        deadline: Duration,
        fact: impl FnMut() -> bool,
    ) -> anyhow::Result<()> {
        let dir = (self.log_path())
            .and_then(Path::parent)
            .ok_or_else(|| anyhow::anyhow!("{} logs to no file", self.name))?;
        // Made before the first look, so that a line written after it wakes the wait.
        let watch = DirWatch::new(dir)?;
        Ok(watch.wait_until(what, deadline, fact)?)
    }
}

/// Waits until `f` gives `Some`, asking every `every` up to `deadline`; `what` names the wait
/// in the failure. The nodes tell no one outside when they change state (their `/status` is
/// the interface), so this asks, bounded in time.
pub fn wait_for<T>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if started.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        std::thread::sleep(every);
    }
}

/// Where the shorter of two record lists stops being a prefix of the longer, if it does.
pub fn first_difference(a: &[NodeRecord], b: &[NodeRecord]) -> Option<usize> {
    (0..a.len().min(b.len())).find(|&i| a[i] != b[i])
}

/// Asserts that the shorter of two nodes' record lists (`GET /wal?from=earliest`, oldest
/// first) is a prefix of the longer: the same records, timeline by timeline, at the same LSNs
/// with the same bytes (SHA-256). Returns how many records both hold.
pub fn assert_prefix(a_name: &str, a: &[NodeRecord], b_name: &str, b: &[NodeRecord]) -> usize {
    if let Some(i) = first_difference(a, b) {
        panic!(
            "record {i} differs between {a_name} and {b_name}: {:?} and {:?}",
            a[i], b[i]
        );
    }
    a.len().min(b.len())
}

#[test]
fn the_prefix_check_finds_any_difference() {
    use wal_storage::Lsn;
    let rec = |tl: u32, start: u64, data: &[u8]| NodeRecord {
        timeline: tl,
        start: Lsn(start),
        end: Lsn(start + 24 + data.len() as u64),
        sha256: walserver_bench::acklog::sha256_hex(data),
    };
    let a = vec![rec(1, 100, b"x"), rec(1, 125, b"y"), rec(1, 150, b"z")];
    assert_eq!(first_difference(&a, &a[..2]), None, "a prefix");
    assert_eq!(first_difference(&a[..0], &a), None, "nothing in common");
    let mut b = a.clone();
    b[1] = rec(1, 125, b"Y");
    assert_eq!(first_difference(&a, &b), Some(1), "other bytes");
    b[1] = rec(2, 125, b"y");
    assert_eq!(first_difference(&a, &b), Some(1), "another timeline");
    b[1] = rec(1, 126, b"y");
    assert_eq!(first_difference(&a, &b[..2]), Some(1), "another LSN");
}

/// Tails cut back at stream start, summed over nodes and over each node's processes: a node's
/// `/status` counts what its running process cut (`commit.tail_cuts`, from 0 at each start),
/// so what a process had counted is kept when it goes ([`TailCuts::died`]).
#[derive(Debug, Default)]
pub struct TailCuts {
    /// Per node: what its processes that are gone counted, and what the running one had
    /// counted at the last look.
    nodes: Vec<(u64, u64)>,
}

impl TailCuts {
    /// Node `i`'s running process has counted `counted` cuts. A count below the last one
    /// is a process started since without [`TailCuts::died`] told: the last one is kept.
    pub fn saw(&mut self, i: usize, counted: u64) {
        let node = self.node(i);
        if counted < node.1 {
            node.0 += node.1;
        }
        node.1 = counted;
    }

    /// Node `i`'s process is gone, or is about to be killed with nothing started since the
    /// last look: its count at that look is kept, and the next process counts from 0.
    pub fn died(&mut self, i: usize) {
        let node = self.node(i);
        node.0 += std::mem::take(&mut node.1);
    }

    pub fn total(&self) -> u64 {
        self.nodes.iter().map(|(gone, now)| gone + now).sum()
    }

    fn node(&mut self, i: usize) -> &mut (u64, u64) {
        if self.nodes.len() <= i {
            self.nodes.resize(i + 1, (0, 0));
        }
        &mut self.nodes[i]
    }
}

#[test]
fn tail_cuts_add_up_over_each_node_s_processes() {
    let mut cuts = TailCuts::default();
    cuts.saw(0, 1);
    cuts.saw(0, 2);
    assert_eq!(cuts.total(), 2, "one process's count is not added twice");
    cuts.died(0);
    assert_eq!(cuts.total(), 2, "a killed process's count stays");
    cuts.saw(0, 3);
    assert_eq!(cuts.total(), 5, "the next process counts from 0");
    cuts.saw(2, 4);
    cuts.saw(2, 1);
    assert_eq!(
        cuts.total(),
        10,
        "a count that went down is a new process's"
    );
    cuts.died(2);
    cuts.died(2);
    assert_eq!(cuts.total(), 10, "a death told twice adds nothing");
}
