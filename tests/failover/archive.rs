//! The archive through failovers: with [`Options::archive`](crate::cluster::Options) every
//! member runs `archive_mode = on` to one SeaweedFS bucket on the client host (bound only to
//! that host's address), with `archive_timeout = 1` so that the archive covers the last
//! acknowledged append within a second. [`Cluster::judge_archive`] is the check after the
//! faults: the leader's archive covers its WAL, `walserver archive verify` passes, and a node
//! made from the archive alone (`walserver init --from-archive`, on the client host) holds
//! every acknowledged record, with WAL and history files byte-identical to the leader's.

use pg_testkit::{SeaweedServer, SEAWEED_ACCESS_KEY_ID, SEAWEED_SECRET_ACCESS_KEY};
use wal_archive::ArchiverStatus;
use walserver_bench::acklog;
use walserver_bench::judge::{judge, NodeWal};

use crate::cluster::{walserver_bin, Cluster, DEADLINE, SEGMENT, TOKEN};
use fault_harness::node::AdminAt;
use fault_harness::WalNode;

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
        let end = node.status().map_err(|e| e.to_string())?.flush_lsn;
        // The backlog drains: every completed segment, then the prefix archive_timeout puts.
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
