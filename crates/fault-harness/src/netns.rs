//! Test networks made of network namespaces: a bridge in a namespace of its own and one
//! namespace per host, joined by veth pairs, with addresses from 10.213.0.0/16 that exist
//! only inside them. Nothing is created in, or changed about, the namespace the test runs in:
//! the test reaches a host by running a thread or a command inside the host's namespace
//! ([`Host::run`], [`Host::command`]).
//!
//! Every namespace is named `wsf-<pid>-<n>-<what>`; a [`Net`] deletes its own when dropped
//! (killing whatever still runs in them), and the first `Net` of a process deletes those of
//! processes that no longer exist (a test killed before its guards ran).

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Once};

use crate::{Error, Result};

/// The prefix of every namespace this crate makes.
const PREFIX: &str = "wsf-";

static NEXT_NET: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();

/// Runs `cmd`, failing with its stderr when it exits non-zero.
pub(crate) fn run_cmd(cmd: &mut Command) -> Result<String> {
    let what = format!("{cmd:?}");
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| Error::Io {
        what: format!("run {what}"),
        source: e,
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            command: what,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String> {
    run_cmd(Command::new("ip").args(args))
}

/// A network namespace this crate made, open so that threads and children can enter it.
#[derive(Debug)]
pub struct Namespace {
    pub name: String,
    file: File,
}

impl Namespace {
    fn create(name: &str) -> Result<Arc<Namespace>> {
        ip(&["netns", "add", name])?;
        let path = format!("/run/netns/{name}");
        let file = File::open(&path).map_err(|e| Error::Io {
            what: format!("open {path}"),
            source: e,
        })?;
        Ok(Arc::new(Namespace {
            name: name.to_string(),
            file,
        }))
    }

    /// Moves the calling thread into this namespace (sockets it opens from then on, and
    /// threads it spawns, belong to the namespace).
    fn enter(&self) -> std::io::Result<()> {
        // SAFETY: setns with an open namespace file descriptor; it changes only this thread.
        if unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Kills every process in namespace `name` and deletes it; errors are ignored, as this runs
/// in drops and sweeps.
fn destroy(name: &str) {
    if let Ok(pids) = ip(&["netns", "pids", name]) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: kill with a pid the kernel listed in this test's namespace.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = ip(&["netns", "del", name]);
}

/// Deletes the namespaces of processes of this crate that have ended without cleaning up.
fn sweep_stale() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            destroy(name);
        }
    }
}

/// A test network: a bridge (in its own namespace) and hosts attached to it.
pub struct Net {
    prefix: String,
    subnet: u8,
    bridge: Arc<Namespace>,
    hosts: Vec<Arc<Namespace>>,
}

impl Net {
    /// A new, empty network whose namespaces are named after `label` (keep it short).
    pub fn new(label: &str) -> Result<Net> {
        SWEEP.call_once(sweep_stale);
        let n = NEXT_NET.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{PREFIX}{}-{n}-{label}", std::process::id());
        let bridge = Namespace::create(&format!("{prefix}-br"))?;
        let net = Net {
            prefix,
            // Distinct subnets per network only make logs easier to read: the networks are
            // isolated from one another anyway.
            subnet: (n % 256) as u8,
            bridge,
            hosts: Vec::new(),
        };
        let br = net.bridge.name.as_str();
        ip(&["-n", br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", br, "link", "set", "br0", "up"])?;
        Ok(net)
    }

    /// Adds a host named `name`: its own namespace, loopback up, and `eth0` on the bridge with
    /// the next address of the network's /24.
    pub fn add_host(&mut self, name: &str) -> Result<Host> {
        let index = self.hosts.len();
        if index >= 250 {
            return Err(Error::Invalid("at most 250 hosts on a network".into()));
        }
        let ns = Namespace::create(&format!("{}-{name}", self.prefix))?;
        self.hosts.push(ns.clone());
        let addr = Ipv4Addr::new(10, 213, self.subnet, index as u8 + 1);
        let br = self.bridge.name.as_str();
        let port = format!("v{index}");
        ip(&[
            "-n", br, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
            &ns.name,
        ])?;
        ip(&["-n", br, "link", "set", &port, "master", "br0", "up"])?;
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns.name, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(Host {
            name: name.to_string(),
            addr,
            ns,
        })
    }

    /// The CIDR block of this network's addresses.
    pub fn cidr(&self) -> String {
        format!("10.213.{}.0/24", self.subnet)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            destroy(&h.name);
        }
        destroy(&self.bridge.name);
    }
}

/// One host of a [`Net`]: a namespace with an address on the bridge. Cheap to clone; the
/// namespace lives until its `Net` is dropped.
#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    pub addr: Ipv4Addr,
    pub(crate) ns: Arc<Namespace>,
}

impl Host {
    /// The namespace's name, as `ip netns` knows it.
    pub fn netns(&self) -> &str {
        &self.ns.name
    }

    /// Runs `f` on a new thread inside this host's namespace and returns what it returns.
    /// Sockets opened there stay in the namespace after the thread ends.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        std::thread::scope(|s| {
            s.spawn(|| {
                self.ns.enter().map_err(|e| Error::Io {
                    what: format!("enter namespace {}", self.ns.name),
                    source: e,
                })?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Spawns a long-lived thread inside this host's namespace (for servers such as the
    /// delaying proxy); threads it spawns are in the namespace too.
    pub fn spawn<T: Send + 'static>(
        &self,
        name: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<std::thread::JoinHandle<Result<T>>> {
        let ns = self.ns.clone();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                ns.enter().map_err(|e| Error::Io {
                    what: format!("enter namespace {}", ns.name),
                    source: e,
                })?;
                Ok(f())
            })
            .map_err(|e| Error::Io {
                what: "spawn a thread".into(),
                source: e,
            })
    }

    /// A command that runs inside this host's namespace (it enters the namespace between fork
    /// and exec, so its pid is the program's own, for signals).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        // The tests' own variable is not for the programs they run (walserver lets
        // WALSERVER_TEST_ variables through, but they are none of its business).
        cmd.env_remove(crate::report::DIR_VAR);
        let ns = self.ns.clone();
        // SAFETY: the closure calls only setns, which is async-signal-safe, on a descriptor
        // the Arc keeps open for as long as the Command exists.
        unsafe {
            cmd.pre_exec(move || ns.enter());
        }
        cmd
    }

    /// A hook that enters this host's namespace, for a child between fork and exec (what
    /// [`Host::command`] installs), so that a [`walserver_bench::node::ChildNode`] runs here.
    pub fn enter_hook(&self) -> walserver_bench::node::PreExec {
        let ns = self.ns.clone();
        // setns, which is async-signal-safe, on a descriptor the Arc keeps open.
        std::sync::Arc::new(move || ns.enter())
    }

    /// Runs `program args` in this host's namespace to completion; its stdout, or an error
    /// with its stderr.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        run_cmd(self.command(program).args(args))
    }

    /// GETs `path` from an HTTP server reachable from this host (such as a node's admin API on
    /// the host's loopback): the status code and the body. `timeout` bounds the whole
    /// exchange, so a paused server cannot hold the test.
    pub fn http_get(
        &self,
        authority: &str,
        path: &str,
        timeout: std::time::Duration,
    ) -> Result<(u16, String)> {
        self.http(
            "GET",
            authority,
            path,
            &Request {
                timeout,
                ..Request::default()
            },
        )
    }

    /// Sends `method path` (GET or POST) to an HTTP server reachable from this host, as
    /// `req` says: the status code and the body.
    pub fn http(
        &self,
        method: &str,
        authority: &str,
        path: &str,
        req: &Request<'_>,
    ) -> Result<(u16, String)> {
        let url = format!("http://{authority}{path}");
        let fail = |e: ureq::Error| Error::Http {
            url: url.clone(),
            message: e.to_string(),
        };
        self.run(|| {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_global(Some(req.timeout))
                .http_status_as_error(false)
                .build()
                .into();
            let bearer = req.token.map(|t| format!("Bearer {t}"));
            let mut resp = match method {
                "GET" => {
                    let mut r = agent.get(&url);
                    if let Some(b) = &bearer {
                        r = r.header("Authorization", b);
                    }
                    r.call().map_err(fail)?
                }
                "POST" => {
                    let mut r = agent.post(&url).header(
                        "Content-Type",
                        req.content_type.unwrap_or("application/json"),
                    );
                    if let Some(b) = &bearer {
                        r = r.header("Authorization", b);
                    }
                    r.send(req.body.unwrap_or(b"")).map_err(fail)?
                }
                other => return Err(Error::Invalid(format!("HTTP method {other}"))),
            };
            let status = resp.status().as_u16();
            let body = resp.body_mut().read_to_string().map_err(fail)?;
            Ok((status, body))
        })?
    }
}

/// How [`Host::http`] sends a request.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Bounds the whole exchange.
    pub timeout: std::time::Duration,
    /// A bearer token for `Authorization`.
    pub token: Option<&'a str>,
    /// A POST's body and its type (JSON unless said).
    pub body: Option<&'a [u8]>,
    pub content_type: Option<&'a str>,
}

impl Default for Request<'_> {
    fn default() -> Self {
        Request {
            timeout: std::time::Duration::from_secs(5),
            token: None,
            body: None,
            content_type: None,
        }
    }
}
