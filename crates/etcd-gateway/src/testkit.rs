//! Test support (feature `testkit`): a real etcd, one member ([`EtcdServer`]) or a cluster
//! ([`EtcdCluster`]), on free loopback ports with a temporary data directory, killed and
//! removed on drop.
//!
//! [`EtcdServer::start_secured`] runs one member as a careful deployment does: client TLS
//! with client certificates required (`--client-cert-auth`), certificates from a [`Pki`]
//! made with rcgen, and `auth enable` with a root user; [`EtcdServer::add_user`] adds users
//! whose role is limited to a key prefix.
//!
//! A test that needs etcd fails, never skips, when etcd is missing: the panic says how to
//! install it. Starting waits on the event that matters, a member answering
//! `/v3/maintenance/status` with a leader, retried with a backoff under a deadline and a
//! bounded count; a member that exits first fails the start with its log.

use std::ffi::OsString;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::{Client, Security};

/// How to get etcd when it is missing.
pub const INSTALL_HINT: &str = "etcd is required for etcd-gateway's tests. Install it with \
`apt-get install etcd-server` (Debian/Ubuntu; ./scripts/test.sh does this), or point \
WALSERVER_TEST_ETCD_BIN at an etcd executable.";

/// How long a start may take before it fails. A guess sized for two busy cores: a member
/// answers in well under a second when the machine is idle.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// The most readiness checks per start; with the backoff's cap this outlasts the deadline.
const START_ATTEMPTS: u32 = 400;
/// Fresh ports are tried this many times when one was taken between picking and binding.
const PORT_RETRIES: u32 = 3;

/// Finds the etcd executable: `WALSERVER_TEST_ETCD_BIN`, else `etcd` on `PATH`.
pub fn find_etcd() -> Result<PathBuf, String> {
    find_etcd_in(
        std::env::var_os("WALSERVER_TEST_ETCD_BIN").map(PathBuf::from),
        std::env::var_os("PATH"),
    )
}

fn find_etcd_in(explicit: Option<PathBuf>, path: Option<OsString>) -> Result<PathBuf, String> {
    if let Some(explicit) = explicit {
        return if explicit.is_file() {
            Ok(explicit)
        } else {
            Err(format!(
                "WALSERVER_TEST_ETCD_BIN={} is not a file. {INSTALL_HINT}",
                explicit.display()
            ))
        };
    }
    let found = path
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file());
    found.ok_or_else(|| format!("no etcd on PATH. {INSTALL_HINT}"))
}

/// Timing of the members' raft, in milliseconds.
#[derive(Clone, Copy)]
struct Timing {
    heartbeat_ms: u64,
    election_ms: u64,
}

/// A single member is its own quorum, so short timeouts cost nothing and make etcd's minimum
/// lease TTL (1.5 election timeouts, rounded up to seconds) one second.
const SINGLE: Timing = Timing {
    heartbeat_ms: 25,
    election_ms: 250,
};
/// etcd's defaults for a cluster, whose members must not time each other out on busy cores.
const CLUSTER: Timing = Timing {
    heartbeat_ms: 100,
    election_ms: 1000,
};

/// One etcd member, killed on drop.
#[derive(Debug)]
pub struct EtcdMember {
    name: String,
    client_url: String,
    /// How the testkit's own client reaches the member (root, on a secured one).
    security: Security,
    log: PathBuf,
    child: Option<Child>,
}

impl EtcdMember {
    /// The member's client URL, `http://127.0.0.1:PORT` (`https://` when secured).
    pub fn client_url(&self) -> &str {
        &self.client_url
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A client of this member alone (as root, on a secured member).
    pub fn client(&self) -> Client {
        Client::with_security([&self.client_url], &self.security)
            .expect("a testkit URL and its certificates load")
    }

    /// Kills the member at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The member's log so far (its stderr), for failure messages.
    pub fn log(&self) -> String {
        log_tail(&self.log)
    }

    fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "etcd member {} exited ({status}) while starting; its log:\n{}",
                self.name,
                self.log()
            )),
            _ => None,
        }
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A one-member etcd; derefs to its [`EtcdMember`], killed and removed on drop.
#[derive(Debug)]
pub struct EtcdServer {
    cluster: EtcdCluster,
}

impl EtcdServer {
    /// Starts a one-member cluster and waits until it answers with a leader; panics (with the
    /// install hint when etcd is missing) if it cannot.
    pub fn start() -> EtcdServer {
        EtcdServer::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_start() -> Result<EtcdServer, String> {
        EtcdCluster::try_start_with(1, SINGLE, None).map(|cluster| EtcdServer { cluster })
    }

    /// Starts a one-member cluster with client TLS on `pki`'s certificates, client
    /// certificates required, and authentication on (a `root` user with [`ROOT_PASSWORD`]);
    /// simple tokens expire `auth_token_ttl` after their last use (etcd's default is 300 s).
    pub fn start_secured(pki: &Pki, auth_token_ttl: Option<Duration>) -> EtcdServer {
        let secured = Secured {
            pki: pki.clone(),
            auth_token_ttl,
        };
        let server = EtcdCluster::try_start_with(1, SINGLE, Some(&secured))
            .map(|cluster| EtcdServer { cluster })
            .unwrap_or_else(|e| panic!("{e}"));
        let client = server.client();
        blocking(|| async {
            client
                .call_json(
                    "/v3/auth/user/add",
                    &json!({ "name": "root", "password": ROOT_PASSWORD }),
                )
                .await?;
            client
                .call_json(
                    "/v3/auth/user/grant",
                    &json!({ "user": "root", "role": "root" }),
                )
                .await?;
            client.call_json("/v3/auth/enable", &json!({})).await
        })
        .unwrap_or_else(|e| {
            panic!(
                "cannot enable etcd's authentication: {e}; its log:\n{}",
                server.log()
            )
        });
        server
    }

    /// Adds a user with `password` and, with a `prefix`, a role of its own that may read
    /// and write only the keys under it (as root, on a secured member).
    pub fn add_user(&self, name: &str, password: &str, prefix: Option<&[u8]>) {
        let client = self.client();
        blocking(|| async {
            client
                .call_json(
                    "/v3/auth/user/add",
                    &json!({ "name": name, "password": password }),
                )
                .await?;
            if let Some(prefix) = prefix {
                let role = format!("{name}-role");
                let range = crate::KeyRange::prefix(prefix.to_vec()).to_json();
                client
                    .call_json("/v3/auth/role/add", &json!({ "name": role }))
                    .await?;
                client
                    .call_json(
                        "/v3/auth/role/grant",
                        &json!({ "name": role, "perm": {
                            "permType": "READWRITE",
                            "key": range["key"],
                            "range_end": range["range_end"],
                        } }),
                    )
                    .await?;
                client
                    .call_json(
                        "/v3/auth/user/grant",
                        &json!({ "user": name, "role": role }),
                    )
                    .await?;
            }
            Ok(serde_json::Value::Null)
        })
        .unwrap_or_else(|e| panic!("cannot add etcd user {name}: {e}"));
    }

    /// What a client of this secured member needs: its CA, the client certificate, and
    /// `user`'s credentials (none without a user).
    pub fn security(&self, user: Option<(&str, &str)>) -> Security {
        let mut security = self.cluster.members[0].security.clone();
        security.username = user.map(|(name, _)| name.to_string());
        security.password = user.map(|(_, password)| password.to_string());
        security
    }
}

/// The password of the `root` user of a secured member.
pub const ROOT_PASSWORD: &str = "root-password";

/// Certificates made with rcgen for a secured etcd, in a temporary directory removed on
/// drop: a CA, etcd's server certificate for `127.0.0.1` (usable as a client certificate
/// too, as etcd's gateway presents it to etcd's own gRPC server), and client certificates.
/// Another [`Pki`] is an unknown CA to this one.
#[derive(Clone, Debug)]
pub struct Pki {
    _dir: std::sync::Arc<tempfile::TempDir>,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A client certificate without a subject Common Name.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A client certificate with a Common Name, which etcd 3.4's gateway refuses when it
    /// checks client certificates (the name would not count as the user, as it does over
    /// gRPC, so etcd refuses the request rather than let it seem to).
    pub client_cert_with_cn: PathBuf,
    pub client_key_with_cn: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        Pki::try_new().unwrap_or_else(|e| panic!("cannot make test certificates: {e}"))
    }

    fn try_new() -> Result<Pki, String> {
        use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair};
        let err = |e: rcgen::Error| e.to_string();
        let dir = tempfile::Builder::new()
            .prefix("etcd-testkit-pki-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let write = |name: &str, text: String| -> Result<PathBuf, String> {
            let path = dir.path().join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path)
        };
        let ca_key = KeyPair::generate().map_err(err)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "etcd-testkit CA");
        let ca = ca_params.self_signed(&ca_key).map_err(err)?;
        let issue =
            |name: Option<&str>, sans: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
                let key = KeyPair::generate().map_err(err)?;
                let mut params = CertificateParams::new(sans).map_err(err)?;
                params.distinguished_name = rcgen::DistinguishedName::new();
                if let Some(name) = name {
                    params
                        .distinguished_name
                        .push(rcgen::DnType::CommonName, name);
                }
                params.extended_key_usages = usages;
                let cert = params.signed_by(&key, &ca, &ca_key).map_err(err)?;
                Ok::<_, String>((cert.pem(), key.serialize_pem()))
            };
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let (server_cert, server_key) = issue(
            Some("etcd"),
            vec!["127.0.0.1".into()],
            vec![ServerAuth, ClientAuth],
        )?;
        // No Common Name: etcd's gateway refuses client certificates that have one (see
        // the `client_cert_with_cn` field).
        let (client_cert, client_key) = issue(None, Vec::new(), vec![ClientAuth])?;
        let (named_cert, named_key) = issue(Some("walserver"), Vec::new(), vec![ClientAuth])?;
        Ok(Pki {
            ca: write("ca.pem", ca.pem())?,
            server_cert: write("server.pem", server_cert)?,
            server_key: write("server-key.pem", server_key)?,
            client_cert: write("client.pem", client_cert)?,
            client_key: write("client-key.pem", client_key)?,
            client_cert_with_cn: write("client-cn.pem", named_cert)?,
            client_key_with_cn: write("client-cn-key.pem", named_key)?,
            _dir: std::sync::Arc::new(dir),
        })
    }
}

impl Default for Pki {
    fn default() -> Pki {
        Pki::new()
    }
}

/// How a secured member is started.
struct Secured {
    pki: Pki,
    auth_token_ttl: Option<Duration>,
}

impl Secured {
    /// The testkit's own way in: the CA, the client certificate, and root.
    fn security(&self) -> Security {
        Security {
            cacert: Some(self.pki.ca.clone()),
            cert: Some(self.pki.client_cert.clone()),
            key: Some(self.pki.client_key.clone()),
            username: Some("root".into()),
            password: Some(ROOT_PASSWORD.into()),
        }
    }
}

impl std::ops::Deref for EtcdServer {
    type Target = EtcdMember;
    fn deref(&self) -> &EtcdMember {
        &self.cluster.members[0]
    }
}

impl std::ops::DerefMut for EtcdServer {
    fn deref_mut(&mut self) -> &mut EtcdMember {
        &mut self.cluster.members[0]
    }
}

/// A cluster of etcd members on loopback, all killed and removed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    // Declared before the directory so that the members die before their files go.
    members: Vec<EtcdMember>,
    _dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `size` members and waits until each answers with a leader; panics if it cannot.
    pub fn start(size: usize) -> EtcdCluster {
        EtcdCluster::try_start(size).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_start(size: usize) -> Result<EtcdCluster, String> {
        EtcdCluster::try_start_with(size, CLUSTER, None)
    }

    fn try_start_with(
        size: usize,
        timing: Timing,
        secured: Option<&Secured>,
    ) -> Result<EtcdCluster, String> {
        let etcd = find_etcd()?;
        let mut last = String::new();
        for _ in 0..PORT_RETRIES {
            let cluster = spawn(&etcd, size, timing, secured)?;
            match cluster.wait_ready() {
                Ok(cluster) => return Ok(cluster),
                Err(e) if e.contains("address already in use") => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    pub fn member_mut(&mut self, index: usize) -> &mut EtcdMember {
        &mut self.members[index]
    }

    /// Every member's client URL, in member order.
    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// The index of the member that leads, as the first live member reports it.
    pub fn leader_index(&self) -> Result<usize, String> {
        for member in self.members.iter().filter(|m| m.child.is_some()) {
            let Ok(status) = blocking_status(&member.client()) else {
                continue;
            };
            for (index, other) in self.members.iter().enumerate() {
                if other.child.is_some() {
                    if let Ok(s) = blocking_status(&other.client()) {
                        if s.header.member_id == status.leader {
                            return Ok(index);
                        }
                    }
                }
            }
        }
        Err("no live member reports a leader that answers".into())
    }

    fn wait_ready(mut self) -> Result<EtcdCluster, String> {
        let deadline = Instant::now() + START_DEADLINE;
        let mut backoff = Duration::from_millis(5);
        for index in 0..self.members.len() {
            let client = self.members[index]
                .client()
                .with_request_timeout(Duration::from_millis(500));
            let mut attempt = 0;
            loop {
                if let Some(exit) = self.members[index].exited() {
                    return Err(exit);
                }
                match blocking_status(&client) {
                    Ok(status) if status.leader != 0 => break,
                    _ => {}
                }
                attempt += 1;
                if attempt >= START_ATTEMPTS || Instant::now() >= deadline {
                    return Err(format!(
                        "etcd member {} did not answer with a leader within {:?} ({attempt} \
                         checks); its log:\n{}",
                        self.members[index].name,
                        START_DEADLINE,
                        self.members[index].log()
                    ));
                }
                // Backoff between checks of an external process that has no other signal.
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
        }
        Ok(self)
    }
}

/// Asks `client` for the member's status, blocking.
fn blocking_status(client: &Client) -> crate::Result<crate::Status> {
    blocking(|| client.status())
}

/// Runs `call` to its end, blocking: on an actix-rt runtime of its own, on a thread of its
/// own, because the testkit is called from tests that already run one on their thread (and
/// a runtime cannot be started inside another).
fn blocking<T, F, Fut>(call: F) -> crate::Result<T>
where
    T: Send,
    F: FnOnce() -> Fut + Send,
    Fut: std::future::Future<Output = crate::Result<T>>,
{
    let outcome = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = actix_rt::Runtime::new().map_err(|e| crate::Error::Io {
                    endpoint: String::new(),
                    path: "(testkit runtime)",
                    source: e,
                })?;
                runtime.block_on(call())
            })
            .join()
    });
    outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Picks free loopback ports by binding them all at once (so none repeats), then frees them
/// for etcd; another process may take one in between, which the caller retries.
fn free_ports(count: usize) -> Result<Vec<u16>, String> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot bind a loopback port: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot read a bound port: {e}"))
}

fn spawn(
    etcd: &Path,
    size: usize,
    timing: Timing,
    secured: Option<&Secured>,
) -> Result<EtcdCluster, String> {
    // etcd fsyncs its raft log on every write. On a disk shared with the rest of a test run
    // those fsyncs stalled keepalives for seconds (measured: 2.3 s), long enough to expire the
    // short leases failover tests use; what the tests judge is walserver, not the disk under
    // etcd, so its data goes on tmpfs where there is one.
    let mut builder = tempfile::Builder::new();
    builder.prefix("etcd-testkit-");
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        builder.tempdir_in(shm)
    } else {
        builder.tempdir()
    }
    .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
    let ports = free_ports(2 * size)?;
    let token = dir
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "etcd-testkit".into());
    let peer_url = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
    let initial_cluster: Vec<String> = (0..size).map(|i| format!("m{i}={}", peer_url(i))).collect();
    let initial_cluster = initial_cluster.join(",");
    let mut cluster = EtcdCluster {
        members: Vec::with_capacity(size),
        _dir: dir,
    };
    for i in 0..size {
        let name = format!("m{i}");
        let scheme = if secured.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", ports[2 * i]);
        let mut security_args: Vec<OsString> = Vec::new();
        if let Some(secured) = secured {
            let pki = &secured.pki;
            security_args.extend([
                "--cert-file".into(),
                pki.server_cert.clone().into(),
                "--key-file".into(),
                pki.server_key.clone().into(),
                "--client-cert-auth".into(),
                "--trusted-ca-file".into(),
                pki.ca.clone().into(),
            ]);
            if let Some(ttl) = secured.auth_token_ttl {
                security_args.push("--auth-token-ttl".into());
                security_args.push(ttl.as_secs().max(1).to_string().into());
            }
        }
        let data_dir = cluster._dir.path().join(&name);
        let log = cluster._dir.path().join(format!("{name}.log"));
        let stderr = File::create(&log).map_err(|e| format!("cannot create {log:?}: {e}"))?;
        let child = Command::new(etcd)
            .arg("--name")
            .arg(&name)
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(peer_url(i))
            .arg("--initial-advertise-peer-urls")
            .arg(peer_url(i))
            .arg("--initial-cluster")
            .arg(&initial_cluster)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(&token)
            .arg("--heartbeat-interval")
            .arg(timing.heartbeat_ms.to_string())
            .arg("--election-timeout")
            .arg(timing.election_ms.to_string())
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(&security_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}. {INSTALL_HINT}", etcd.display()))?;
        cluster.members.push(EtcdMember {
            name,
            client_url,
            security: secured.map(Secured::security).unwrap_or_default(),
            log,
            child: Some(child),
        });
    }
    Ok(cluster)
}

/// The last few KiB of a log file.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(4096);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_etcd_fails_with_install_hint() {
        let empty = tempfile::tempdir().expect("tempdir");
        let e = find_etcd_in(None, Some(empty.path().as_os_str().to_owned())).unwrap_err();
        assert!(e.contains("apt-get install etcd-server"), "{e}");
        let e = find_etcd_in(Some(empty.path().join("etcd")), None).unwrap_err();
        assert!(e.contains("WALSERVER_TEST_ETCD_BIN"), "{e}");
    }

    #[test]
    fn finds_etcd_on_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("etcd"), b"").expect("write");
        let found = find_etcd_in(None, Some(dir.path().as_os_str().to_owned())).expect("found");
        assert_eq!(found, dir.path().join("etcd"));
    }
}
