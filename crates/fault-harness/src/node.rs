//! `walserver run` on a [`Host`]: the load tool's [`ChildNode`], entering the host's network
//! namespace before it runs, with the host's addresses. Its directory holds the data directory
//! (`data/`), the configuration (`walserver.toml`) and the log (`walserver.log`, appended to
//! across restarts). The replication port listens on the host's address, port 5433; the
//! admin API on the host's loopback, port 8433, where only threads and commands inside the
//! host's namespace reach it (so it needs no token): [`WalNode::get_json`], or a command
//! from [`Host::command`] (the load tool: `walserver bench append --http 127.0.0.1:8433`).
//! Members of a cluster ([`AdminAt::Network`]) serve it on the host's address instead, with
//! a bearer token, so that the other hosts reach it.
//! Readiness is the log line the server prints once its admin API listens.
//!
//! For a disk that fills up, mount a [`crate::tmpfs::Tmpfs`] on `dir/data` before making the
//! node (`walserver init` takes an empty directory): the log and the configuration stay
//! outside it, on the real disk.

use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use supervisor_actor::NodeStatus;

pub use walserver_bench::node::{wait_for_dir_lock, ChildNode, Output, READY_LINE};

use crate::netns::{run_cmd, Host};
use crate::{Error, Result};

/// The replication port of every node (each host has an address of its own).
pub const PG_PORT: u16 = 5433;
/// The admin API's address inside a host's namespace.
pub const HTTP: &str = "127.0.0.1:8433";
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a node's admin API listens.
#[derive(Clone, Debug, Default)]
pub enum AdminAt {
    /// The host's loopback ([`HTTP`]), reached only from inside the host, without a token.
    #[default]
    Loopback,
    /// The host's address on the test network, port 8433, so that other hosts (the other
    /// members of a cluster, a load that follows the leader) reach it; walserver then requires
    /// a bearer token.
    Network { token: String },
}

/// A walserver node inside a host's namespace: the [`ChildNode`] that runs it, and the host
/// its admin API is reached from.
pub struct WalNode {
    pub name: String,
    pub host: Host,
    dir: PathBuf,
    http: String,
    token: Option<String>,
    node: ChildNode,
}

impl WalNode {
    fn new(
        host: &Host,
        bin: &Path,
        dir: &Path,
        name: &str,
        extra: &str,
        admin: &AdminAt,
    ) -> Result<WalNode> {
        let (http, token) = match admin {
            AdminAt::Loopback => (HTTP.to_string(), None),
            AdminAt::Network { token } => (format!("{}:8433", host.addr), Some(token.clone())),
        };
        let data = dir.join("data");
        let mut child = ChildNode::new(name, bin, &data);
        child.listen = SocketAddr::V4(SocketAddrV4::new(host.addr, PG_PORT));
        child.http = http.clone();
        child.token = token.clone();
        child.config_file(&dir.join("walserver.toml"));
        child.output(Output::Captured(dir.join("walserver.log")));
        child.pre_exec(host.enter_hook());
        let node = WalNode {
            name: name.to_string(),
            host: host.clone(),
            dir: dir.to_path_buf(),
            http,
            token,
            node: child,
        };
        let token_line = match &node.token {
            Some(t) => format!("http_auth_token = {t:?}\n"),
            None => String::new(),
        };
        std::fs::create_dir_all(dir).map_err(|e| Error::Io {
            what: format!("create {}", dir.display()),
            source: e,
        })?;
        // Replication connections come over the test network from 10.213.0.0/16 (or through
        // a proxy on a host's loopback); the hba rules trust exactly those.
        let toml = format!(
            "data_dir = {data:?}\nlisten = \"{addr}:{PG_PORT}\"\nhttp_listen = {http:?}\n\
             {token_line}{extra}\n\
             [[hba]]\naddress = \"10.213.0.0/16\"\nuser = \"all\"\nmethod = \"trust\"\n\
             [[hba]]\naddress = \"127.0.0.1\"\nuser = \"all\"\nmethod = \"trust\"\n",
            data = node.data_dir().display().to_string(),
            addr = host.addr,
            http = node.http,
        );
        std::fs::write(node.config_path(), toml).map_err(|e| Error::Io {
            what: "write the node's configuration".into(),
            source: e,
        })?;
        Ok(node)
    }

    /// Makes a primary's data directory in `dir/data` (`walserver init`, with `init_args`
    /// such as `--wal-segment-size 1MB`) and its configuration with `extra` TOML lines. Not
    /// started: see [`WalNode::start`].
    pub fn primary(
        host: &Host,
        bin: &Path,
        dir: &Path,
        name: &str,
        init_args: &[&str],
        extra: &str,
    ) -> Result<WalNode> {
        WalNode::primary_with(host, bin, dir, name, init_args, extra, &AdminAt::Loopback)
    }

    /// [`WalNode::primary`] with its admin API where `admin` says.
    pub fn primary_with(
        host: &Host,
        bin: &Path,
        dir: &Path,
        name: &str,
        init_args: &[&str],
        extra: &str,
        admin: &AdminAt,
    ) -> Result<WalNode> {
        let node = WalNode::new(host, bin, dir, name, extra, admin)?;
        node.init(&[], init_args)?;
        Ok(node)
    }

    /// Makes a standby's data directory (`walserver init --standby`, run on `host`, of the
    /// upstream `primary_conninfo` names) and its configuration. Not started.
    pub fn standby(
        host: &Host,
        bin: &Path,
        dir: &Path,
        name: &str,
        primary_conninfo: &str,
        extra: &str,
    ) -> Result<WalNode> {
        WalNode::standby_with(
            host,
            bin,
            dir,
            name,
            primary_conninfo,
            extra,
            &AdminAt::Loopback,
        )
    }

    /// [`WalNode::standby`] with its admin API where `admin` says.
    pub fn standby_with(
        host: &Host,
        bin: &Path,
        dir: &Path,
        name: &str,
        primary_conninfo: &str,
        extra: &str,
        admin: &AdminAt,
    ) -> Result<WalNode> {
        let node = WalNode::new(host, bin, dir, name, extra, admin)?;
        node.init(&["--standby"], &["--primary-conninfo", primary_conninfo])?;
        Ok(node)
    }

    /// The admin API's address (`HOST:PORT`), as reached from the node's host.
    pub fn http(&self) -> &str {
        &self.http
    }

    /// The admin API's bearer token, if it requires one.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// `walserver init BEFORE --data-dir DIR/data AFTER`, run on the node's host.
    fn init(&self, before: &[&str], after: &[&str]) -> Result<()> {
        let mut cmd = self.host.command(self.node.program());
        cmd.arg("init")
            .args(before)
            .arg("--data-dir")
            .arg(self.data_dir());
        run_cmd(cmd.args(after)).map(|_| ())
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("walserver.toml")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("walserver.log")
    }

    /// The replication address on the test network.
    pub fn listen_addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.host.addr, PG_PORT))
    }

    /// A `primary_conninfo` for a standby of this node.
    pub fn conninfo(&self, application_name: &str) -> String {
        conninfo_at(self.listen_addr(), application_name)
    }

    /// Starts `walserver run --config` and waits until it serves.
    pub fn start(&mut self) -> Result<()> {
        self.node.start().map_err(node_error)
    }

    /// The node's process.
    pub fn process(&mut self) -> &mut ChildNode {
        &mut self.node
    }

    pub fn is_running(&self) -> bool {
        self.node.is_running()
    }

    /// SIGKILL and reap; the data directory stays for [`WalNode::start`].
    pub fn kill9(&mut self) -> Result<()> {
        self.node.kill9();
        Ok(())
    }

    /// SIGSTOP.
    pub fn pause(&mut self) -> Result<()> {
        self.node.pause().map_err(node_error)
    }

    /// SIGCONT.
    pub fn resume(&mut self) -> Result<()> {
        self.node.resume().map_err(node_error)
    }

    /// kill -9, then a start on the same data directory and configuration.
    pub fn restart(&mut self) -> Result<()> {
        self.kill9()?;
        self.start()
    }

    /// `method path` to the node's admin API (with its token), from the node's host: the
    /// status code and the body, whatever the status.
    pub fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<(u16, String)> {
        let req = crate::netns::Request {
            timeout: HTTP_TIMEOUT,
            token: self.token.as_deref(),
            body,
            content_type: None,
        };
        self.host.http(method, &self.http, path, &req)
    }

    /// GET `path` from the node's admin API, as JSON.
    pub fn get_json(&self, path: &str) -> Result<Value> {
        let (status, body) = self.request("GET", path, None)?;
        if status != 200 {
            return Err(Error::Http {
                url: format!("{} {path}", self.name),
                message: format!("status {status}: {body}"),
            });
        }
        serde_json::from_str(&body).map_err(|e| Error::Json(format!("{} {path}: {e}", self.name)))
    }

    /// The node's `/status`, read into the type the server writes it from.
    pub fn status(&self) -> Result<NodeStatus> {
        let (code, body) = self.request("GET", "/status", None)?;
        if code != 200 {
            return Err(Error::Http {
                url: format!("{} /status", self.name),
                message: format!("status {code}: {body}"),
            });
        }
        serde_json::from_str(&body).map_err(|e| Error::Json(format!("{} /status: {e}", self.name)))
    }

    /// Asks `/status` until `ready` holds of it or `deadline` passes, and returns the status
    /// that satisfied it. The server announces none of these states to anyone outside, so
    /// this asks every 20 ms (a guess: often enough to time a recovery to tens of
    /// milliseconds, rarely enough to cost nothing). Failed requests (a node restarting or
    /// paused) count as "not yet".
    pub fn wait_status(
        &self,
        what: &str,
        deadline: Duration,
        ready: impl Fn(&NodeStatus) -> bool,
    ) -> Result<NodeStatus> {
        wait_until(&self.name, what, deadline, || match self.status() {
            Ok(s) if ready(&s) => Ok(s),
            Ok(s) => Err(serde_json::to_string(&s).unwrap_or_default()),
            Err(e) => Err(e.to_string()),
        })
    }

    /// [`WalNode::wait_status`] for the JSON of any `path` of the admin API.
    pub fn wait_json(
        &self,
        path: &str,
        what: &str,
        deadline: Duration,
        ready: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        wait_until(&self.name, what, deadline, || match self.get_json(path) {
            Ok(v) if ready(&v) => Ok(v),
            Ok(v) => Err(v.to_string()),
            Err(e) => Err(e.to_string()),
        })
    }
}

/// Calls `attempt` every 20 ms until it gives `Ok`, or `deadline` passes: then the error names
/// `node`, `what` was awaited and the last answer.
fn wait_until<T>(
    node: &str,
    what: &str,
    deadline: Duration,
    mut attempt: impl FnMut() -> std::result::Result<T, String>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        let last = match attempt() {
            Ok(v) => return Ok(v),
            Err(last) => last,
        };
        if start.elapsed() > deadline {
            return Err(Error::Timeout(format!(
                "{node}: {what} within {deadline:?}; last status: {last}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the node's process could not do, as this crate's error.
fn node_error(e: impl std::fmt::Display) -> Error {
    Error::Exited(format!("{e:#}"))
}

/// A `primary_conninfo` for an upstream at `addr`.
pub fn conninfo_at(addr: SocketAddr, application_name: &str) -> String {
    format!(
        "host={} port={} user=walserver sslmode=disable application_name={application_name}",
        addr.ip(),
        addr.port()
    )
}
