//! A real etcd cluster on hosts of a test network: one member per host, each a [`Process`]
//! inside its host's namespace, listening on the host's address (clients on port 2379, peers
//! on 2380), so that a fault between two hosts is a fault between their members too.
//!
//! The executable is the one `etcd_gateway::testkit` finds (`WALSERVER_TEST_ETCD_BIN`, else
//! `etcd` on `PATH`); a missing etcd fails with its install hint. A member is ready when it
//! logs that it serves clients, which etcd does only once it has joined the cluster through
//! raft (so a quorum exists): an event, not a poll. Members are killed with their
//! [`Process`] guards; data directories live in the directory the caller gives.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::netns::{Host, Request};
use crate::process::Process;
use crate::{Error, Result};

pub const CLIENT_PORT: u16 = 2379;
pub const PEER_PORT: u16 = 2380;
/// Both of etcd's ports, for [`crate::fault::cut_ports`].
pub const PORTS: [u16; 2] = [CLIENT_PORT, PEER_PORT];
/// What etcd 3.4 and 3.5 log (zap) once the member serves clients, after joining the cluster.
const READY_LINE: &str = "serving client traffic";
/// How long a member may take to join. A guess sized for two busy cores.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// Raft's timing, in milliseconds: etcd's defaults (heartbeat 100, election 1000), whose
/// members do not time each other out on busy cores; the leader key's ttl must exceed an etcd
/// election (etcd's lease minimum is 1.5 election timeouts).
const HEARTBEAT_MS: u64 = 100;
const ELECTION_MS: u64 = 1000;

/// One member: its host, its directory and, while it runs, its process.
pub struct Member {
    pub name: String,
    pub host: Host,
    dir: PathBuf,
    process: Option<Process>,
}

impl Member {
    /// `http://ADDR:2379`.
    pub fn client_url(&self) -> String {
        format!("http://{}:{CLIENT_PORT}", self.host.addr)
    }

    fn peer_url(&self) -> String {
        format!("http://{}:{PEER_PORT}", self.host.addr)
    }

    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// SIGKILL and reap; its data stays for [`EtcdCluster::restart`].
    pub fn kill9(&mut self) -> Result<()> {
        if let Some(mut p) = self.process.take() {
            p.kill9()?;
        }
        Ok(())
    }

    /// `/v3/maintenance/status` of this member, asked from its host.
    pub fn status(&self) -> Result<Value> {
        let req = Request {
            timeout: Duration::from_secs(2),
            body: Some(b"{}"),
            ..Request::default()
        };
        let authority = format!("{}:{CLIENT_PORT}", self.host.addr);
        let (code, body) = self
            .host
            .http("POST", &authority, "/v3/maintenance/status", &req)?;
        if code != 200 {
            return Err(Error::Http {
                url: format!("{} /v3/maintenance/status", self.name),
                message: format!("status {code}: {body}"),
            });
        }
        serde_json::from_str(&body).map_err(|e| Error::Json(format!("etcd status: {e}")))
    }
}

/// What starting one member takes (plain data, so members start on threads of their own).
struct Spec {
    etcd: PathBuf,
    initial_cluster: String,
    name: String,
    host: Host,
    dir: PathBuf,
}

impl Spec {
    fn spawn(&self) -> Result<Process> {
        let m = self;
        let client_url = format!("http://{}:{CLIENT_PORT}", m.host.addr);
        let peer_url = format!("http://{}:{PEER_PORT}", m.host.addr);
        let mut cmd = m.host.command(&self.etcd);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(m.dir.join("data"))
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            // Ignored once the data directory exists (a restart rejoins with its own state).
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "walserver-failover-test"])
            .arg("--heartbeat-interval")
            .arg(HEARTBEAT_MS.to_string())
            .arg("--election-timeout")
            .arg(ELECTION_MS.to_string())
            .args(["--logger", "zap", "--log-level", "info"]);
        let log = m.dir.join("etcd.log");
        let mut p = Process::spawn_ready(&m.name, cmd, &log, READY_LINE, START_DEADLINE)?;
        p.quiet_on_failure();
        Ok(p)
    }
}

/// An etcd cluster of one member per host.
pub struct EtcdCluster {
    pub members: Vec<Member>,
    etcd: PathBuf,
    initial_cluster: String,
}

impl EtcdCluster {
    /// Starts one member on each of `hosts`, data under `dir`, and waits until every one
    /// serves.
    pub fn start(hosts: &[Host], dir: &Path) -> Result<EtcdCluster> {
        let etcd = etcd_gateway::testkit::find_etcd().map_err(Error::Invalid)?;
        let mut members = Vec::new();
        for (i, host) in hosts.iter().enumerate() {
            let name = format!("e{i}");
            let mdir = dir.join(&name);
            std::fs::create_dir_all(&mdir).map_err(|e| Error::Io {
                what: format!("create {}", mdir.display()),
                source: e,
            })?;
            members.push(Member {
                name,
                host: host.clone(),
                dir: mdir,
                process: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            etcd,
            initial_cluster,
        };
        // Every member waits for a quorum, so they start together, each on a thread.
        let specs: Vec<Spec> = (0..cluster.members.len())
            .map(|i| cluster.spec(i))
            .collect();
        let started: Vec<Result<Process>> = std::thread::scope(|s| {
            let handles: Vec<_> = specs
                .iter()
                .map(|spec| s.spawn(move || spec.spawn()))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        for (i, p) in started.into_iter().enumerate() {
            cluster.members[i].process = Some(p?);
        }
        Ok(cluster)
    }

    fn spec(&self, i: usize) -> Spec {
        let m = &self.members[i];
        Spec {
            etcd: self.etcd.clone(),
            initial_cluster: self.initial_cluster.clone(),
            name: m.name.clone(),
            host: m.host.clone(),
            dir: m.dir.clone(),
        }
    }

    /// Every member's client URL.
    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// Restarts a killed member on its data directory and waits until it serves again.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        if self.members[i].is_running() {
            return Err(Error::Invalid(format!(
                "{} is already running",
                self.members[i].name
            )));
        }
        let p = self.spec(i).spawn()?;
        self.members[i].process = Some(p);
        Ok(())
    }

    /// The index of the member that leads raft, as the running members report it (they must
    /// agree; an error if none answers or they disagree).
    pub fn leader(&self) -> Result<usize> {
        let mut ids = Vec::new();
        let mut leaders = Vec::new();
        for m in self.members.iter() {
            if !m.is_running() {
                ids.push(None);
                continue;
            }
            match m.status() {
                Ok(s) => {
                    ids.push(s["header"]["member_id"].as_str().map(str::to_string));
                    if let Some(l) = s["leader"].as_str() {
                        leaders.push(l.to_string());
                    }
                }
                Err(_) => ids.push(None),
            }
        }
        leaders.sort();
        leaders.dedup();
        match leaders.as_slice() {
            [one] => ids
                .iter()
                .position(|id| id.as_deref() == Some(one.as_str()))
                .ok_or_else(|| Error::Invalid(format!("the leader {one} is no running member"))),
            [] => Err(Error::Invalid("no etcd member reports a leader".into())),
            many => Err(Error::Invalid(format!(
                "etcd members disagree on the leader: {many:?}"
            ))),
        }
    }
}
