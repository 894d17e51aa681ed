//! The archive through failovers: with [`Options::archive`](crate::cluster::Options) every
//! member runs `archive_mode = on` to one SeaweedFS bucket on the client host (bound only to
//! that host's address), with `archive_timeout = 1` so that the archive covers the last
//! acknowledged append within a second. [`Cluster::judge_archive`] is the check after the
//! faults: the leader's archive covers its WAL, `walserver archive verify` passes, every
//! segment, history file and `.partial` of the leader's path is there under its name
//! (`files_of_the_path`), and a node made from the archive alone (`walserver init
//! --from-archive`, on the client host) holds every acknowledged record, with WAL and
//! history files byte-identical to the leader's.
//!
//! [`wait_behind`] serves `kill_9_of_the_primary_with_its_archive_behind`, the failover the
//! archive must survive whole: the store is stopped (SIGSTOP: it answers nothing, as a store
//! that hangs) while leaders complete whole segments they cannot upload and are killed one
//! after another, then it resumes. Each new leader goes on where the archive ends, not where
//! it was promoted: the old timelines' segments it holds up to its switch point, their
//! `.partial`s and history files. `WALSERVER_TEST_ARCHIVE_BEHIND_CYCLES` sets the stops of
//! the store (1 by default), each over [`KILLS_PER_STOP`] kills.

use pg_testkit::{SeaweedServer, SEAWEED_ACCESS_KEY_ID, SEAWEED_SECRET_ACCESS_KEY};
use wal_archive::ArchiverStatus;
use walserver_bench::acklog;
use walserver_bench::judge::{judge, NodeWal};

use crate::cluster::{walserver_bin, Cluster, DEADLINE, SEGMENT, TOKEN};
use fault_harness::node::AdminAt;
use fault_harness::WalNode;
use wal_storage::{parse_history, segment_file_name};
use wal_types::{Lsn, TimelineId};

/// The archive's place in the bucket: one prefix per cluster label.
fn target(server: &SeaweedServer, label: &str) -> String {
    format!("s3://{}/{label}", server.bucket())
}

/// A member's archiving: its top-level lines and its `[archive]` table.
pub fn member_toml(server: &SeaweedServer, label: &str) -> (String, String) {
    (
        format!(
            "archive_mode = \"on\"\narchive_target = {:?}\narchive_timeout = 1\n",
            target(server, label)
        ),
        format!(
            "[archive]\nendpoint = {:?}\nallow_http = true\naccess_key_id = {SEAWEED_ACCESS_KEY_ID:?}\n\
             secret_access_key = {SEAWEED_SECRET_ACCESS_KEY:?}\n",
            server.endpoint()
        ),
    )
}

/// The same archive as `-c` arguments, for `walserver archive` and `init --from-archive`.
fn settings(server: &SeaweedServer, label: &str) -> Vec<String> {
    [
        format!("archive_target={}", target(server, label)),
        format!("archive.endpoint={}", server.endpoint()),
        "archive.allow_http=true".into(),
        format!("archive.access_key_id={SEAWEED_ACCESS_KEY_ID}"),
        format!("archive.secret_access_key={SEAWEED_SECRET_ACCESS_KEY}"),
    ]
    .into_iter()
    .flat_map(|s| ["-c".to_string(), s])
    .collect()
}

/// What the archive lacks of the files PostgreSQL's archiver would have put on the way to
/// `leader`'s WAL up to `end` (its flushed end, the whole archive's span since the cluster's
/// first segment): each whole segment below `end`'s under the name of the timeline that
/// wrote its last byte, each timeline's history file, and at each switch point inside a
/// segment the old timeline's `.partial` of it. `archive verify` checks the archive against
/// its own history files; this checks it against the leader's WAL, so a missing end of the
/// newest timeline is found too, named.
fn files_of_the_path(
    server: &SeaweedServer,
    label: &str,
    leader: &WalNode,
    end: Lsn,
) -> Vec<String> {
    let tli = match leader.status() {
        Ok(s) => s.timeline,
        Err(e) => return vec![format!("the leader's status: {e}")],
    };
    let history = if tli.0 > 1 {
        let path = leader
            .data_dir()
            .join("pg_wal")
            .join(format!("{:08X}.history", tli.0));
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| parse_history(&text).map_err(|e| e.to_string()))
        {
            Ok(h) => h,
            Err(e) => return vec![format!("{}: {e}", path.display())],
        }
    } else {
        Vec::new()
    };
    let mut wanted: Vec<String> = (2..=tli.0).map(|t| format!("{t:08X}.history")).collect();
    // The timeline that wrote the last byte of segment `segno` names it.
    let namer = |segno: u64| -> TimelineId {
        history
            .iter()
            .find(|h| h.switch_lsn.0 >= (segno + 1) * SEGMENT)
            .map_or(tli, |h| h.parent)
    };
    let first = Lsn(SEGMENT).segment_number(SEGMENT);
    wanted.extend(
        (first..end.segment_number(SEGMENT))
            .map(|segno| segment_file_name(namer(segno), segno, SEGMENT)),
    );
    wanted.extend(
        history
            .iter()
            .filter(|h| h.switch_lsn.segment_offset(SEGMENT) != 0)
            .map(|h| {
                let segno = h.switch_lsn.segment_number(SEGMENT);
                format!("{}.partial", segment_file_name(h.parent, segno, SEGMENT))
            }),
    );
    wanted
        .iter()
        .filter_map(|name| match server.get_raw(&format!("{label}/{name}")) {
            Ok(Some(_)) => None,
            Ok(None) => Some(format!("the archive lacks {name}")),
            Err(e) => Some(format!("the archive's {name}: {e}")),
        })
        .collect()
}

/// Waits until the archive covers `node`'s WAL up to its flushed end as this is called (the
/// backlog drained: every completed segment, then the prefix `archive_timeout` puts); that end.
pub fn wait_covered(node: &WalNode) -> Result<Lsn, String> {
    let end = node.status().map_err(|e| e.to_string())?.flush_lsn;
    node.wait_json(
        "/status",
        &format!("the archive to cover the leader's WAL up to {end}"),
        DEADLINE,
        |v| {
            serde_json::from_value::<ArchiverStatus>(v["archiver"].clone())
                .ok()
                .and_then(|a| a.covered_lsn)
                .is_some_and(|c| c >= end)
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(end)
}

impl Cluster {
    /// What is wrong with the archive after the scenario (none without one); call it after
    /// [`Cluster::finish`], once the load has stopped.
    pub fn judge_archive(&self) -> Vec<String> {
        let Some(server) = &self.archive else {
            return Vec::new();
        };
        match self.judge_archive_in(server, &self.label) {
            Ok(problems) => problems,
            Err(e) => vec![format!("the archive: {e}")],
        }
    }

    fn judge_archive_in(&self, server: &SeaweedServer, label: &str) -> Result<Vec<String>, String> {
        let mut problems = Vec::new();
        let leader = self.wait_leader(DEADLINE, None)?;
        let node = &self.nodes[leader];
        let end = wait_covered(node)?;
        problems.extend(files_of_the_path(server, label, node, end));
        let args = settings(server, label);
        let verify = self
            .client
            .command(walserver_bin())
            .args(["archive", "verify"])
            .args(&args)
            .output()
            .map_err(|e| format!("run walserver archive verify: {e}"))?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&verify.stdout),
            String::from_utf8_lossy(&verify.stderr)
        );
        if !verify.status.success() {
            problems.push(format!("walserver archive verify failed: {said}"));
        }
        eprintln!("walserver archive verify:\n{said}");

        // A node made from the archive alone, on the client host.
        let mut init = vec!["--from-archive".to_string()];
        init.extend(args);
        let init: Vec<&str> = init.iter().map(String::as_str).collect();
        let mut restored = WalNode::primary_with(
            &self.client,
            &walserver_bin(),
            &self.dir().join("restored"),
            "restored",
            &init,
            "wal_keep_size = \"1GB\"\n",
            &AdminAt::Loopback,
        )
        .map_err(|e| format!("walserver init --from-archive: {e}"))?;
        restored
            .start()
            .map_err(|e| format!("start the restored node: {e}"))?;
        let log = self.log();
        let indeterminate = acklog::read_indeterminate(&self.ack_log).map_err(|e| e.to_string())?;
        let mut views = Vec::new();
        for (n, token) in [(node, Some(TOKEN)), (&restored, None)] {
            let (name, http, data) = (n.name.clone(), n.http().to_string(), n.data_dir());
            let view = n
                .host
                .run(move || NodeWal::fetch(&name, &http, token, &data, SEGMENT))
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("the records of {}: {e:#}", n.name))?;
            views.push(view);
        }
        let judged = judge(&log, &indeterminate, &views);
        match judged.node("restored") {
            Some(r) if r.found == judged.records => {}
            Some(r) => problems.push(format!(
                "restored from the archive: {} of {} acknowledged records found",
                r.found, judged.records
            )),
            None => problems.push("the judge did not see the restored node".into()),
        }
        problems.extend(judged.describe());
        Ok(problems)
    }
}

/// Leaders killed while the store is stopped, one after another: the second new leader
/// finds two timelines the archive lacks the ends of.
pub const KILLS_PER_STOP: usize = 2;

/// Whole segments each leader completes, while the store is stopped, before it is killed.
pub const BEHIND_SEGMENTS: u64 = 2;

/// The archive of `c`'s leader `leader` once it has completed [`BEHIND_SEGMENTS`] more whole
/// segments than it held when this was called (the store stopped before then, so the
/// archive has none of them): the archived position it holds, or what went wrong.
pub fn wait_behind(c: &Cluster, leader: usize) -> Result<Lsn, String> {
    let node = &c.nodes[leader];
    let from = node.status().map_err(|e| e.to_string())?.flush_lsn;
    let want = Lsn(from.segment_start(SEGMENT).0 + BEHIND_SEGMENTS * SEGMENT);
    node.wait_status(
        &format!("WAL up to {want}, {BEHIND_SEGMENTS} segments past {from}"),
        DEADLINE,
        |s| s.flush_lsn >= want,
    )
    .map_err(|e| e.to_string())?;
    let status = node.get_json("/status").map_err(|e| e.to_string())?;
    let archiver = serde_json::from_value::<ArchiverStatus>(status["archiver"].clone())
        .map_err(|e| format!("n{leader}'s archiver status: {e}"))?;
    // None: this node has not yet looked at the archive since it started (its look waits
    // for the stopped store), so it counts nothing as archived.
    let archived = archiver.archived_lsn.unwrap_or(Lsn(0));
    if archived.0 + BEHIND_SEGMENTS * SEGMENT <= want.0 {
        Ok(archived)
    } else {
        Err(format!(
            "n{leader}'s archive is not {BEHIND_SEGMENTS} segments behind its WAL ({want}): \
             archived up to {archived}, so the store did not hold its uploads"
        ))
    }
}
