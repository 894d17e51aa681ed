//! The `[failover]` table: automatic failover on etcd, in the configuration's words, and the
//! failover actor's configuration it gives once the node's listeners are bound.
//!
//! Without the table a node is what it always was: its own role, its fence open. With it the
//! node joins the cluster `cluster_name` in etcd under the name `node_name`, and tells the
//! others how to reach it (`advertise_conninfo` for replication, `advertise_http` for its admin
//! API). Those two default to the node's own listeners; a wildcard address (`0.0.0.0`, `::`)
//! says nothing about where the node can be reached, so it needs the advertised address
//! spelled out.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use failover_actor::{FailoverConfig, SynchronousMode};
use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};
use crate::units;

/// Every key of `[failover]`, for `-c failover.KEY=VALUE` and `WALSERVER_FAILOVER_KEY`.
pub const FAILOVER_KEYS: &[&str] = &[
    "etcd_endpoints",
    "cluster_name",
    "node_name",
    "ttl",
    "maximum_lag_on_failover",
    "synchronous_mode",
    "nofailover",
    "priority",
    "advertise_conninfo",
    "advertise_http",
    "use_slots",
    "member_slot_grace",
    "etcd_cacert",
    "etcd_cert",
    "etcd_key",
    "etcd_username",
    "etcd_password",
];

/// The user of the default `advertise_conninfo`: the user the other members connect as to
/// stream from this node, when the table names no conninfo. The test harnesses' user, too.
pub const DEFAULT_REPLICATION_USER: &str = "walserver";

/// The shortest `ttl` taken. A guess at a floor below which the leader renews so often (a
/// third of the ttl) that one slow etcd round trip or a garbage-collecting pause costs it the
/// lease.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// The longest `ttl` taken: a dead primary is replaced no sooner than its lease runs out, and
/// beyond this the wait is surely a typo (`10min` for `10s`). A guess.
pub const MAX_TTL: Duration = Duration::from_secs(3600);

/// The `[failover]` table as written.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailoverSettings {
    /// etcd's client URLs (`http://host:2379`, `https://host:2379` or `host:2379`): a list, or
    /// one string of comma-separated ones (as an environment variable or `-c` gives it). A
    /// `host:port` is spoken to over TLS when `etcd_cacert` is set.
    #[serde(deserialize_with = "endpoints")]
    pub etcd_endpoints: Vec<String>,
    /// The cluster's name: every key lives under `/walserver/<cluster_name>/`.
    pub cluster_name: String,
    /// This node's name in the cluster, unique in it; also its `application_name` upstream.
    pub node_name: String,
    /// The leader key's lease. Bare numbers are seconds.
    #[serde(default = "default_ttl", deserialize_with = "units::duration_s")]
    pub ttl: Duration,
    /// A standby further behind than this is not promoted. Bare numbers are bytes.
    #[serde(
        default = "default_maximum_lag_on_failover",
        deserialize_with = "units::size_bytes"
    )]
    pub maximum_lag_on_failover: u64,
    #[serde(default)]
    pub synchronous_mode: SynchronousMode,
    /// This node never becomes the leader.
    #[serde(default)]
    pub nofailover: bool,
    /// Among equally advanced candidates the higher wins; 0 never becomes the leader.
    #[serde(default = "default_priority")]
    pub priority: u32,
    /// How the other members reach this node's replication port (a libpq conninfo); default
    /// `host=<listen's address> port=<its port> user=walserver`.
    #[serde(default)]
    pub advertise_conninfo: Option<String>,
    /// How the other members and operators reach this node's admin API; default
    /// `http://<http_listen>` (`https://` with a certificate).
    #[serde(default)]
    pub advertise_http: Option<String>,
    /// Member slots: the leader keeps a replication slot for every other member (Patroni's
    /// `use_slots`).
    #[serde(default = "default_use_slots")]
    pub use_slots: bool,
    /// How long the leader keeps the slot of a member whose key is gone; default ten ttls.
    /// Bare numbers are seconds.
    #[serde(default, deserialize_with = "optional_duration_s")]
    pub member_slot_grace: Option<Duration>,
    /// PEM file of the CA certificates that sign etcd's server certificates (etcd's
    /// `--trusted-ca-file` on the server side; Patroni's `etcd3.cacert`). Needed for
    /// `https://` endpoints. Relative paths are from the working directory.
    #[serde(default)]
    pub etcd_cacert: Option<PathBuf>,
    /// PEM file of this node's client certificate, for etcd's `--client-cert-auth`; its
    /// subject must have no Common Name, which etcd's JSON gateway refuses.
    #[serde(default)]
    pub etcd_cert: Option<PathBuf>,
    /// PEM file of the private key of `etcd_cert`.
    #[serde(default)]
    pub etcd_key: Option<PathBuf>,
    /// The etcd user (with `auth enable`), whose role should allow `/walserver/<cluster_name>/`.
    #[serde(default)]
    pub etcd_username: Option<String>,
    #[serde(default)]
    pub etcd_password: Option<Password>,
}

/// A password from the settings, hidden from their debug output so that a dump of the
/// settings never shows it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Password(pub String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

fn default_ttl() -> Duration {
    failover_actor::DEFAULT_TTL
}
fn default_maximum_lag_on_failover() -> u64 {
    failover_actor::DEFAULT_MAXIMUM_LAG_ON_FAILOVER
}
fn default_priority() -> u32 {
    1
}
fn default_use_slots() -> bool {
    true
}
fn optional_duration_s<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Duration>, D::Error> {
    units::duration_s(d).map(Some)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ListOrText {
    List(Vec<String>),
    Text(String),
}

/// A list of strings, or one string of comma-separated items; blanks around items dropped.
fn endpoints<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<String>, D::Error> {
    let items = match ListOrText::deserialize(d)? {
        ListOrText::List(l) => l,
        ListOrText::Text(t) => t.split(',').map(str::to_string).collect(),
    };
    Ok(items
        .into_iter()
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty())
        .collect())
}

/// Whether `text` is a `host:port` whose host is a wildcard address.
fn is_wildcard(text: &str) -> bool {
    text.parse::<SocketAddr>()
        .is_ok_and(|a| a.ip().is_unspecified())
}

/// A name that goes into etcd keys and into `application_name`: letters, digits, `_`, `-`
/// and `.`, at most 63 bytes (PostgreSQL's identifier length).
fn check_name(key: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(invalid(format!("failover.{key} must not be empty")));
    }
    if name.len() > 63 {
        return Err(invalid(format!(
            "failover.{key} {name:?} is longer than 63 bytes"
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(invalid(format!(
            "failover.{key} {name:?} contains {c:?}: use letters, digits, '_', '-' and '.'"
        )));
    }
    Ok(())
}

fn invalid(text: String) -> Error {
    Error::Invalid(text)
}

/// `http://host:port` from `host:port` or a URL; the path and trailing `/` dropped.
fn http_url(text: &str, tls: bool) -> String {
    if text.starts_with("http://") || text.starts_with("https://") {
        text.trim_end_matches('/').to_string()
    } else {
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://{text}")
    }
}

impl FailoverSettings {
    /// Checks the table against the node's other settings: `listen` and `http_listen` (for
    /// the advertised defaults), `cluster_name` (the `application_name` upstream) and
    /// `synchronous_standby_names` (which the failover actor sets under `synchronous_mode`).
    pub fn validate(
        &self,
        listen: &str,
        http_listen: &str,
        application_name: Option<&str>,
        synchronous_standby_names: &str,
    ) -> Result<()> {
        if self.etcd_endpoints.is_empty() {
            return Err(invalid(
                "failover.etcd_endpoints is empty: give etcd's client URLs, as a list or comma-separated (\"http://10.0.0.1:2379,http://10.0.0.2:2379\")".into(),
            ));
        }
        self.etcd_client()?;
        check_name("cluster_name", &self.cluster_name)?;
        check_name("node_name", &self.node_name)?;
        if self.use_slots && failover_actor::member_slot_name(&self.node_name).is_none() {
            return Err(invalid(format!(
                "failover.node_name {:?} is too long for its replication slot ({}<name>, at most 63 bytes; an upper-case letter, '_', '-' and '.' count two): shorten it, or set failover.use_slots = false",
                self.node_name,
                failover_actor::MEMBER_SLOT_PREFIX
            )));
        }
        if !(MIN_TTL..=MAX_TTL).contains(&self.ttl) {
            return Err(invalid(format!(
                "failover.ttl {} is out of range: from {} to {}",
                units::format_duration(self.ttl),
                units::format_duration(MIN_TTL),
                units::format_duration(MAX_TTL)
            )));
        }
        if let Some(name) = application_name.filter(|n| *n != self.node_name) {
            return Err(invalid(format!(
                "cluster_name {name:?} differs from failover.node_name {:?}: under failover the node's name upstream is its node_name; leave cluster_name unset",
                self.node_name
            )));
        }
        if self.synchronous_mode != SynchronousMode::Off
            && !synchronous_standby_names.trim().is_empty()
        {
            return Err(invalid(
                "synchronous_standby_names is set, but failover.synchronous_mode chooses the synchronous standby: set one or the other".into(),
            ));
        }
        match &self.advertise_conninfo {
            Some(c) => {
                walreceiver_actor::ReceiverConfig::parse(c, None).map_err(|e| {
                    invalid(format!("failover.advertise_conninfo {c:?} is invalid: {e}"))
                })?;
            }
            None if is_wildcard(listen) => {
                return Err(invalid(format!(
                    "listen {listen} is a wildcard address, which does not say where the other members reach this node: set failover.advertise_conninfo (\"host=10.0.0.5 port=5433 user={DEFAULT_REPLICATION_USER}\")"
                )))
            }
            None => {}
        }
        match &self.advertise_http {
            Some(h) => {
                let url = http_url(h, false);
                let rest = url.split_once("://").map_or("", |(_, r)| r);
                if rest.rsplit_once(':').is_none_or(|(host, port)| {
                    host.is_empty() || host.contains('/') || port.parse::<u16>().is_err()
                }) {
                    return Err(invalid(format!(
                        "failover.advertise_http {h:?} is not host:port or http://host:port"
                    )));
                }
            }
            None if is_wildcard(http_listen) => {
                return Err(invalid(format!(
                    "http_listen {http_listen} is a wildcard address, which does not say where the other members reach this node's admin API: set failover.advertise_http (\"http://10.0.0.5:8433\")"
                )))
            }
            None => {}
        }
        Ok(())
    }

    /// How the node reaches etcd: TLS files and credentials.
    pub fn etcd_security(&self) -> etcd_gateway::Security {
        etcd_gateway::Security {
            cacert: self.etcd_cacert.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            username: self.etcd_username.clone(),
            password: self.etcd_password.as_ref().map(|p| p.0.clone()),
        }
    }

    /// A client of the cluster's etcd, as the failover actor will make it. Reads the TLS
    /// files (blocking file I/O of a few kilobytes), so a missing or unreadable one is an
    /// error of the configuration, at start or reload.
    pub fn etcd_client(&self) -> Result<etcd_gateway::Client> {
        let https = self
            .etcd_endpoints
            .iter()
            .any(|e| e.starts_with("https://"));
        if https && self.etcd_cacert.is_none() {
            return Err(invalid(
                "failover.etcd_endpoints has https:// endpoints: set failover.etcd_cacert to the CA certificate that signs etcd's certificates".into(),
            ));
        }
        etcd_gateway::Client::with_security(&self.etcd_endpoints, &self.etcd_security()).map_err(
            |e| match e {
                etcd_gateway::Error::InvalidEndpoint { .. } => {
                    invalid(format!("failover.etcd_endpoints: {e}"))
                }
                e => invalid(format!(
                    "failover.etcd_cacert, etcd_cert, etcd_key, etcd_username, etcd_password: {e}"
                )),
            },
        )
    }

    /// The failover actor's configuration, given where the node's listeners are actually
    /// bound (so that a port 0 in the settings is the port picked) and whether the admin API
    /// serves TLS.
    pub fn failover_config(
        &self,
        listen: SocketAddr,
        http: SocketAddr,
        tls: bool,
    ) -> FailoverConfig {
        let conninfo = self.advertise_conninfo.clone().unwrap_or_else(|| {
            format!(
                "host={} port={} user={DEFAULT_REPLICATION_USER}",
                listen.ip(),
                listen.port()
            )
        });
        let api_url = http_url(
            &self
                .advertise_http
                .clone()
                .unwrap_or_else(|| http.to_string()),
            tls,
        );
        let mut cfg = FailoverConfig::new(
            self.etcd_endpoints.clone(),
            &self.cluster_name,
            &self.node_name,
            conninfo,
            api_url,
        );
        cfg.ttl = self.ttl;
        cfg.maximum_lag_on_failover = self.maximum_lag_on_failover;
        cfg.synchronous_mode = self.synchronous_mode;
        cfg.nofailover = self.nofailover;
        cfg.priority = self.priority;
        cfg.use_slots = self.use_slots;
        cfg.member_slot_grace = self.member_slot_grace;
        cfg.etcd_security = self.etcd_security();
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    const BASE: &str = "[failover]\netcd_endpoints = [\"http://127.0.0.1:2379\"]\ncluster_name = \"main\"\nnode_name = \"n1\"\n";

    /// Loads `toml` (after `data_dir`) with `env` and `-c` overrides; the error as printed.
    fn load(
        toml: &str,
        env: &[(&str, &str)],
        overrides: &[(&str, &str)],
    ) -> std::result::Result<Settings, String> {
        crate::config::tests::load(&format!("data_dir = \"/d\"\n{toml}"), env, overrides)
            .map_err(|e| format!("{e:#}"))
    }

    fn failover(toml: &str) -> FailoverSettings {
        load(toml, &[], &[])
            .unwrap_or_else(|e| panic!("{e}"))
            .failover
            .expect("a [failover] table")
    }

    fn refused(toml: &str, env: &[(&str, &str)], overrides: &[(&str, &str)]) -> String {
        match load(toml, env, overrides) {
            Ok(s) => panic!("accepted: {:?}", s.failover),
            Err(e) => e,
        }
    }

    #[test]
    fn without_the_table_there_is_no_failover() {
        assert_eq!(load("", &[], &[]).unwrap().failover, None);
    }

    #[test]
    fn defaults_and_the_actor_s_configuration() {
        let f = failover(BASE);
        assert_eq!(f.ttl, Duration::from_secs(10));
        assert_eq!(f.maximum_lag_on_failover, 1 << 20);
        assert_eq!(f.synchronous_mode, SynchronousMode::Off);
        assert!(!f.nofailover);
        assert_eq!(f.priority, 1);
        assert!(f.use_slots, "member slots by default");
        assert_eq!(f.member_slot_grace, None);
        // The advertised addresses come from the bound listeners, port 0 resolved.
        let cfg = f.failover_config(
            "127.0.0.1:6001".parse().unwrap(),
            "127.0.0.1:7001".parse().unwrap(),
            false,
        );
        assert_eq!(cfg.conninfo, "host=127.0.0.1 port=6001 user=walserver");
        assert_eq!(cfg.api_url, "http://127.0.0.1:7001");
        assert_eq!(cfg.etcd_endpoints, vec!["http://127.0.0.1:2379"]);
        assert_eq!(
            (cfg.cluster_name.as_str(), cfg.node_name.as_str()),
            ("main", "n1")
        );
        assert_eq!(cfg.ttl, Duration::from_secs(10));
        let tls = f.failover_config(
            "127.0.0.1:6001".parse().unwrap(),
            "127.0.0.1:7001".parse().unwrap(),
            true,
        );
        assert_eq!(tls.api_url, "https://127.0.0.1:7001");
    }

    #[test]
    fn every_key_as_written() {
        let f = failover(
            r#"[failover]
etcd_endpoints = "http://10.0.0.1:2379, 10.0.0.2:2379"
cluster_name = "prod-1"
node_name = "db.a_1"
ttl = 30
maximum_lag_on_failover = 4096
synchronous_mode = "strict"
nofailover = true
priority = 7
advertise_conninfo = "host=10.0.0.5 port=5433 user=repl"
advertise_http = "10.0.0.5:8433"
use_slots = false
member_slot_grace = "5min"
"#,
        );
        assert_eq!(
            f.etcd_endpoints,
            vec!["http://10.0.0.1:2379", "10.0.0.2:2379"]
        );
        assert_eq!(f.ttl, Duration::from_secs(30), "bare numbers are seconds");
        assert_eq!(f.maximum_lag_on_failover, 4096, "bare numbers are bytes");
        assert_eq!(f.synchronous_mode, SynchronousMode::Strict);
        assert!(f.nofailover);
        assert_eq!(f.priority, 7);
        let cfg = f.failover_config(
            "0.0.0.0:5433".parse().unwrap(),
            "0.0.0.0:8433".parse().unwrap(),
            false,
        );
        assert_eq!(cfg.conninfo, "host=10.0.0.5 port=5433 user=repl");
        assert_eq!(cfg.api_url, "http://10.0.0.5:8433");
        assert_eq!(cfg.synchronous_mode, SynchronousMode::Strict);
        assert_eq!((cfg.priority, cfg.nofailover), (7, true));
        assert_eq!(cfg.maximum_lag_on_failover, 4096);
        assert!(!cfg.use_slots);
        assert_eq!(cfg.member_slot_grace, Some(Duration::from_secs(300)));
        let f = failover(&format!(
            "{BASE}ttl = \"1min\"\nmaximum_lag_on_failover = \"16MB\"\nsynchronous_mode = \"on\""
        ));
        assert_eq!(f.ttl, Duration::from_secs(60));
        assert_eq!(f.maximum_lag_on_failover, 16 << 20);
        assert_eq!(f.synchronous_mode, SynchronousMode::On);
    }

    /// The etcd security keys, as Patroni's `etcd3` section names them, reach the failover
    /// actor's client; the password from the environment, as a deployment keeps it out of the
    /// file.
    #[test]
    fn etcd_security_keys_reach_the_failover_actor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        // Any certificate parses as a CA file; this one is made for the test.
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["etcd".to_string()])
            .and_then(|p| p.self_signed(&key))
            .expect("certificate");
        std::fs::write(&ca, cert.pem()).expect("write the CA");
        let s = load(
            &format!(
                "{BASE}etcd_cacert = {:?}
etcd_username = \"walserver\"\n",
                ca.display()
            )
            .replace("http://127.0.0.1:2379", "127.0.0.1:2379"),
            &[("WALSERVER_FAILOVER_ETCD_PASSWORD", "from-env")],
            &[],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let f = s.failover.expect("a [failover] table");
        let cfg = f.failover_config(
            "127.0.0.1:6001".parse().unwrap(),
            "127.0.0.1:7001".parse().unwrap(),
            false,
        );
        assert_eq!(cfg.etcd_security.cacert.as_deref(), Some(ca.as_path()));
        assert_eq!(cfg.etcd_security.username.as_deref(), Some("walserver"));
        assert_eq!(cfg.etcd_security.password.as_deref(), Some("from-env"));
        let shown = format!("{f:?} {cfg:?}");
        assert!(
            !shown.contains("from-env") && shown.contains("<hidden>"),
            "{shown}"
        );
        // With a CA, a bare host:port is spoken to over TLS.
        let client = f.etcd_client().expect("a client");
        assert_eq!(client.current_endpoint(), "https://127.0.0.1:2379");
    }

    #[test]
    fn environment_and_overrides_set_failover_keys() {
        let s = load(
            BASE,
            &[
                ("WALSERVER_FAILOVER_TTL", "20s"),
                ("WALSERVER_FAILOVER_NODE_NAME", "from-env"),
                ("WALSERVER_FAILOVER_NOFAILOVER", "true"),
            ],
            &[
                ("failover.node_name", "from-c"),
                ("failover.etcd_endpoints", "http://a:1,http://b:2"),
                ("failover.priority", "3"),
            ],
        )
        .unwrap();
        let f = s.failover.unwrap();
        assert_eq!(f.ttl, Duration::from_secs(20));
        assert_eq!(f.node_name, "from-c", "-c wins over the environment");
        assert!(f.nofailover);
        assert_eq!(f.priority, 3);
        assert_eq!(f.etcd_endpoints, vec!["http://a:1", "http://b:2"]);
        // The whole table from the environment and -c, with no table in the file.
        let s = load(
            "",
            &[("WALSERVER_FAILOVER_ETCD_ENDPOINTS", "127.0.0.1:2379")],
            &[("failover.cluster_name", "c"), ("failover.node_name", "n")],
        )
        .unwrap();
        assert_eq!(s.failover.unwrap().node_name, "n");
    }

    #[test]
    fn mistakes_are_clear_errors() {
        type Pairs<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(&str, Pairs, Pairs, &[&str])] = &[
            (
                "[failover]\netcd_endpoints = []\ncluster_name = \"c\"\nnode_name = \"n\"",
                &[],
                &[],
                &["failover.etcd_endpoints is empty"],
            ),
            (
                "[failover]\netcd_endpoints = \"https://e:2379\"\ncluster_name = \"c\"\nnode_name = \"n\"",
                &[],
                &[],
                &["https://", "failover.etcd_cacert"],
            ),
            (
                BASE,
                &[],
                &[("failover.etcd_cacert", "/nonexistent/ca.pem")],
                &["failover.etcd_cacert", "/nonexistent/ca.pem"],
            ),
            (
                BASE,
                &[],
                &[("failover.etcd_username", "walserver")],
                &["etcd_password", "a user name without a password"],
            ),
            (
                "[failover]\netcd_endpoints = \"e\"\ncluster_name = \"c\"\nnode_name = \"n\"",
                &[],
                &[],
                &["failover.etcd_endpoints", "port"],
            ),
            (
                "[failover]\netcd_endpoints = \"e:1\"\nnode_name = \"n\"",
                &[],
                &[],
                &["cluster_name"],
            ),
            (BASE, &[], &[("failover.node_name", "a/b")], &["failover.node_name", "'/'"]),
            (BASE, &[], &[("failover.node_name", "")], &["failover.node_name must not be empty"]),
            (
                BASE,
                &[],
                &[("failover.node_name", "Node-With-A-Long-Name-For-Its-Slot")],
                &["too long for its replication slot", "use_slots = false"],
            ),
            (BASE, &[], &[("failover.ttl", "1s")], &["failover.ttl 1s is out of range"]),
            (BASE, &[], &[("failover.ttl", "10 fortnights")], &["fortnights"]),
            (BASE, &[], &[("failover.maximum_lag_on_failover", "-1")], &["-1"]),
            (BASE, &[], &[("failover.synchronous_mode", "sometimes")], &["sometimes"]),
            (BASE, &[], &[("failover.priority", "-2")], &["priority"]),
            (BASE, &[], &[("failover.nofailover", "maybe")], &["nofailover"]),
            (
                &format!("{BASE}node_nam = \"x\""),
                &[],
                &[],
                &["unknown key `node_nam` in [failover]; did you mean `node_name`?"],
            ),
            (BASE, &[], &[("failover.tl", "1s")], &["did you mean failover.ttl?"]),
            (
                BASE,
                &[("WALSERVER_FAILOVER_TTLL", "1s")],
                &[],
                &["WALSERVER_FAILOVER_TTLL names no setting; did you mean WALSERVER_FAILOVER_TTL?"],
            ),
            (BASE, &[("WALSERVER_FAILOVER", "x")], &[], &["[failover] is a table"]),
            (
                BASE,
                &[],
                &[("listen", "0.0.0.0:5433")],
                &["wildcard", "failover.advertise_conninfo"],
            ),
            (
                BASE,
                &[],
                &[("http_listen", "[::]:8433")],
                &["wildcard", "failover.advertise_http"],
            ),
            (
                BASE,
                &[],
                &[("failover.advertise_conninfo", "host=h port=notaport")],
                &["failover.advertise_conninfo"],
            ),
            (
                BASE,
                &[],
                &[("failover.advertise_http", "http://h")],
                &["failover.advertise_http \"http://h\" is not host:port"],
            ),
            (
                BASE,
                &[],
                &[("cluster_name", "other")],
                &["cluster_name \"other\" differs from failover.node_name \"n1\""],
            ),
            (
                BASE,
                &[],
                &[
                    ("failover.synchronous_mode", "on"),
                    ("synchronous_standby_names", "ANY 1 (a)"),
                ],
                &["set one or the other"],
            ),
        ];
        for (toml, env, overrides, wanted) in cases {
            let e = refused(toml, env, overrides);
            for w in *wanted {
                assert!(
                    e.contains(w),
                    "{toml:?} {env:?} {overrides:?}: {e:?} lacks {w:?}"
                );
            }
        }
        // A wildcard listener is fine once the advertised address is given.
        let s = load(
            BASE,
            &[],
            &[
                ("listen", "0.0.0.0:5433"),
                (
                    "failover.advertise_conninfo",
                    "host=10.1.1.1 port=5433 user=r",
                ),
            ],
        );
        assert!(s.is_ok(), "{s:?}");
        // The same cluster_name as node_name is not a contradiction.
        assert!(load(BASE, &[], &[("cluster_name", "n1")]).is_ok());
    }

    #[test]
    fn under_failover_the_name_upstream_is_the_node_name() {
        let dir = tempfile::tempdir().unwrap();
        crate::init::init_primary(dir.path(), 1 << 20).unwrap();
        crate::init::StandbySignal {
            primary_conninfo: Some("host=127.0.0.1 port=5433 user=r".into()),
            primary_slot_name: None,
            standby_since: None,
        }
        .write(dir.path())
        .unwrap();
        let s = load(BASE, &[], &[]).unwrap();
        let r = crate::node::receiver_config(&s, dir.path())
            .unwrap()
            .expect("a standby");
        assert_eq!(r.application_name, "n1");
    }
}
