//! The node's configuration: a TOML file, then `WALSERVER_*` environment variables, then
//! `-c key=value` overrides, each later source winning. Knob names follow PostgreSQL's where
//! PostgreSQL has one, and keep its units (see `units`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use walsender_actor::hba::HbaRuleConfig;

use crate::logging::{self, LogFormat};
use crate::units;

/// Every top-level key, for the environment filter and for the test that checks the example
/// configs document each one.
pub const KEYS: &[&str] = &[
    "data_dir",
    "listen",
    "http_listen",
    "http_auth_token",
    "max_wal_senders",
    "authentication_timeout",
    "wal_sender_timeout",
    "wal_sender_shutdown_timeout",
    "wal_keep_size",
    "max_slot_wal_keep_size",
    "max_wal_size",
    "synchronous_standby_names",
    "synchronous_commit",
    "synchronous_wait_timeout",
    "primary_conninfo",
    "primary_slot_name",
    "wal_receiver_timeout",
    "wal_receiver_status_interval",
    "wal_retrieve_retry_interval",
    "cluster_name",
    "ssl_cert_file",
    "ssl_key_file",
    "log_level",
    "log_format",
    "hba",
    "users",
];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The data directory made by `walserver init`.
    pub data_dir: PathBuf,
    /// Address of the replication protocol listener.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Address of the HTTP admin API.
    #[serde(default = "default_http_listen")]
    pub http_listen: String,
    /// Bearer token the admin API requires; mandatory when `http_listen` is not loopback.
    #[serde(default)]
    pub http_auth_token: Option<String>,
    #[serde(default = "default_max_wal_senders")]
    pub max_wal_senders: usize,
    /// How long a client may take to finish startup and authentication.
    #[serde(
        default = "default_authentication_timeout",
        deserialize_with = "units::duration_s"
    )]
    pub authentication_timeout: Duration,
    /// A standby silent this long is disconnected; 0 disables. Bare numbers are milliseconds.
    #[serde(
        default = "default_wal_sender_timeout",
        deserialize_with = "units::duration_ms"
    )]
    pub wal_sender_timeout: Duration,
    /// How long a fast shutdown waits for standbys to confirm the WAL sent to them.
    #[serde(
        default = "default_wal_sender_shutdown_timeout",
        deserialize_with = "units::duration_ms"
    )]
    pub wal_sender_shutdown_timeout: Duration,
    /// WAL kept for standbys without slots. Bare numbers are megabytes.
    #[serde(default, deserialize_with = "units::size_mb")]
    pub wal_keep_size: u64,
    /// The most WAL a slot may hold back; -1 (the default) is unlimited.
    #[serde(default, deserialize_with = "units::size_mb_or_unlimited")]
    pub max_slot_wal_keep_size: Option<u64>,
    /// Past this much retained WAL a slot's `wal_status` turns from reserved to extended.
    #[serde(default = "default_max_wal_size", deserialize_with = "units::size_mb")]
    pub max_wal_size: u64,
    #[serde(default)]
    pub synchronous_standby_names: String,
    #[serde(default = "default_synchronous_commit")]
    pub synchronous_commit: String,
    /// After this long an append still waiting for synchronous standbys fails; 0 waits forever.
    #[serde(default, deserialize_with = "units::duration_ms")]
    pub synchronous_wait_timeout: Duration,
    /// libpq connection string of the upstream (standbys only).
    #[serde(default)]
    pub primary_conninfo: Option<String>,
    #[serde(default)]
    pub primary_slot_name: Option<String>,
    #[serde(
        default = "default_wal_receiver_timeout",
        deserialize_with = "units::duration_ms"
    )]
    pub wal_receiver_timeout: Duration,
    #[serde(
        default = "default_wal_receiver_status_interval",
        deserialize_with = "units::duration_s"
    )]
    pub wal_receiver_status_interval: Duration,
    /// The longest wait between a standby's attempts to reach an upstream that is down; the
    /// first retries are quicker. Bare numbers are milliseconds.
    #[serde(
        default = "default_wal_retrieve_retry_interval",
        deserialize_with = "units::duration_ms"
    )]
    pub wal_retrieve_retry_interval: Duration,
    /// The application_name this node's walreceiver uses upstream.
    #[serde(default)]
    pub cluster_name: Option<String>,
    /// PEM certificate chain; with `ssl_key_file` it turns TLS on for both listeners.
    #[serde(default)]
    pub ssl_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub ssl_key_file: Option<PathBuf>,
    /// A level or a tracing filter such as `warning,walsender_actor=debug1`, in PostgreSQL's
    /// level names or tracing's (see `logging`); `RUST_LOG` wins.
    #[serde(default = "default_log_level")]
    pub log_level: String,
    /// `text` or `json` log lines.
    #[serde(default)]
    pub log_format: LogFormat,
    /// Access rules, first match wins; none means loopback is trusted and all else refused.
    #[serde(default)]
    pub hba: Vec<HbaRuleConfig>,
    /// User name to password verifier (`SCRAM-SHA-256$...` from `walserver passwd`, or `md5...`).
    #[serde(default)]
    pub users: BTreeMap<String, String>,
}

fn default_listen() -> String {
    "127.0.0.1:5433".into()
}
fn default_http_listen() -> String {
    "127.0.0.1:8433".into()
}
// The defaults of knobs the libraries also have are the libraries' own, so that a node
// built in code and one built from a file start alike.
fn default_node() -> supervisor_actor::NodeConfig {
    supervisor_actor::NodeConfig::new(PathBuf::new(), ([127, 0, 0, 1], 0).into())
}
fn default_max_wal_senders() -> usize {
    default_node().max_wal_senders
}
fn default_authentication_timeout() -> Duration {
    default_node().walsender.authentication_timeout
}
fn default_wal_sender_timeout() -> Duration {
    default_node().walsender.session.wal_sender_timeout
}
fn default_wal_sender_shutdown_timeout() -> Duration {
    default_node().wal_sender_shutdown_timeout
}
fn default_max_wal_size() -> u64 {
    wal_storage::StorageConfig::default().max_wal_size
}
fn default_synchronous_commit() -> String {
    "on".into()
}
fn default_wal_receiver_timeout() -> Duration {
    walreceiver_actor::session::SessionConfig::default().wal_receiver_timeout
}
fn default_wal_receiver_status_interval() -> Duration {
    walreceiver_actor::session::SessionConfig::default().wal_receiver_status_interval
}
fn default_wal_retrieve_retry_interval() -> Duration {
    supervisor_actor::RestartPolicy::default().transient_cap
}
fn default_log_level() -> String {
    "info".into()
}

/// Where the settings come from.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    pub file: Option<PathBuf>,
    /// `-c key=value` pairs, in order.
    pub overrides: Vec<(String, String)>,
    /// `WALSERVER_*` variables; `None` reads the process environment.
    pub env: Option<BTreeMap<String, String>>,
}

/// Splits `key=value` from the command line.
pub fn parse_override(arg: &str) -> anyhow::Result<(String, String)> {
    match arg.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => bail!("invalid -c argument {arg:?}: expected key=value"),
    }
}

impl Settings {
    pub fn load(sources: &Sources) -> anyhow::Result<Settings> {
        let mut b = config::Config::builder();
        if let Some(path) = &sources.file {
            b = b.add_source(
                config::File::from(path.as_path())
                    .format(config::FileFormat::Toml)
                    .required(true),
            );
        }
        let env: BTreeMap<String, String> = match &sources.env {
            Some(m) => m.clone(),
            None => std::env::vars().collect(),
        };
        for (name, value) in env {
            let Some(key) = name.strip_prefix("WALSERVER_") else {
                continue;
            };
            let key = key.to_ascii_lowercase();
            if KEYS.contains(&key.as_str()) && key != "hba" && key != "users" {
                b = b.set_override(key, value)?;
            } else {
                tracing::warn!("ignoring environment variable {name}: no setting {key:?}");
            }
        }
        for (k, v) in &sources.overrides {
            if !KEYS.contains(&k.as_str()) {
                bail!("unknown setting {k:?} in -c {k}={v}");
            }
            b = b.set_override(k.as_str(), v.as_str())?;
        }
        let settings: Settings =
            b.build()
                .and_then(|c| c.try_deserialize())
                .with_context(|| match &sources.file {
                    Some(p) => format!("invalid configuration (file {})", p.display()),
                    None => "invalid configuration".to_string(),
                })?;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.ssl_cert_file.is_some() != self.ssl_key_file.is_some() {
            bail!("ssl_cert_file and ssl_key_file must be set together");
        }
        if self.max_wal_senders == 0 {
            tracing::warn!("max_wal_senders = 0: no standby can connect");
        }
        logging::filter_directives(&self.log_level).map_err(anyhow::Error::msg)?;
        if self.wal_retrieve_retry_interval.is_zero() {
            bail!("wal_retrieve_retry_interval must be more than 0");
        }
        walsender_actor::hba::HbaRules::from_config(&self.hba)?;
        Ok(())
    }

    /// The data directory, relative paths taken from the config file's directory so a config
    /// can travel with its data.
    pub fn resolve_data_dir(&self, config_file: Option<&Path>) -> PathBuf {
        if self.data_dir.is_absolute() {
            return self.data_dir.clone();
        }
        match config_file.and_then(|f| f.parent()) {
            Some(dir) if !dir.as_os_str().is_empty() => dir.join(&self.data_dir),
            _ => self.data_dir.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(
        toml: &str,
        env: &[(&str, &str)],
        overrides: &[(&str, &str)],
    ) -> anyhow::Result<Settings> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml)?;
        Settings::load(&Sources {
            file: Some(path),
            overrides: overrides
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            env: Some(
                env.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
        })
    }

    #[test]
    fn the_example_configs_load_and_document_every_key() {
        // The example configurations live at the top of the workspace.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let mut documented = String::new();
        for name in ["primary.toml", "standby.toml"] {
            let path = dir.join(name);
            let s = Settings::load(&Sources {
                file: Some(path.clone()),
                overrides: vec![],
                env: Some(Default::default()),
            })
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert!(s.data_dir.to_string_lossy().contains("data"));
            documented.push_str(&std::fs::read_to_string(&path).unwrap());
        }
        for key in KEYS {
            let key = if *key == "hba" {
                "[[hba]]"
            } else if *key == "users" {
                "[users]"
            } else {
                key
            };
            assert!(
                documented.contains(key),
                "{key} is not documented in configs/"
            );
        }
    }

    #[test]
    fn defaults() {
        let s = load("data_dir = \"/d\"", &[], &[]).unwrap();
        assert_eq!(s.listen, "127.0.0.1:5433");
        assert_eq!(s.http_listen, "127.0.0.1:8433");
        assert_eq!(s.wal_sender_timeout, Duration::from_secs(60));
        assert_eq!(s.wal_receiver_status_interval, Duration::from_secs(10));
        assert_eq!(s.max_slot_wal_keep_size, None);
        assert_eq!(s.max_wal_senders, 10);
    }

    #[test]
    fn env_then_overrides_win() {
        let s = load(
            "data_dir = \"/d\"\nwal_sender_timeout = \"5s\"\nmax_wal_senders = 3",
            &[
                ("WALSERVER_WAL_SENDER_TIMEOUT", "7s"),
                ("WALSERVER_MAX_WAL_SENDERS", "4"),
            ],
            &[("max_wal_senders", "5")],
        )
        .unwrap();
        assert_eq!(s.wal_sender_timeout, Duration::from_secs(7));
        assert_eq!(s.max_wal_senders, 5);
    }

    #[test]
    fn units_keep_postgres_base_units() {
        let s = load(
            "data_dir = \"/d\"\nwal_sender_timeout = 1500\nwal_receiver_status_interval = 2\nwal_keep_size = 64",
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(s.wal_sender_timeout, Duration::from_millis(1500));
        assert_eq!(s.wal_receiver_status_interval, Duration::from_secs(2));
        assert_eq!(s.wal_keep_size, 64 << 20);
        let s = load(
            "data_dir = \"/d\"",
            &[],
            &[("max_slot_wal_keep_size", "1GB")],
        )
        .unwrap();
        assert_eq!(s.max_slot_wal_keep_size, Some(1 << 30));
    }

    #[test]
    fn mistakes_are_clear_errors() {
        let e = load("data_dir = \"/d\"\nwal_sender_timout = 5", &[], &[]).unwrap_err();
        assert!(format!("{e:#}").contains("wal_sender_timout"), "{e:#}");
        let e = load("data_dir = \"/d\"", &[], &[("nonsense", "1")]).unwrap_err();
        assert!(e.to_string().contains("nonsense"));
        let e = load(
            "data_dir = \"/d\"\nwal_sender_timeout = \"5 fortnights\"",
            &[],
            &[],
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("fortnights"), "{e:#}");
        let e = load(
            "data_dir = \"/d\"\n[[hba]]\naddress = \"nowhere\"\nuser = \"all\"\nmethod = \"trust\"",
            &[],
            &[],
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("nowhere"), "{e:#}");
        assert!(
            load("listen = \"x\"", &[], &[]).is_err(),
            "data_dir is required"
        );
    }

    #[test]
    fn log_level_takes_postgresql_names_and_refuses_unknown_ones() {
        for level in [
            "warning",
            "debug3",
            "notice",
            "log",
            "info,walsender_actor=debug1",
        ] {
            let s = load("data_dir = \"/d\"", &[], &[("log_level", level)]).unwrap();
            assert_eq!(s.log_level, level);
        }
        for bad in ["verbose", "warnings", "info,walsender_actor=chatty"] {
            let e = load("data_dir = \"/d\"", &[], &[("log_level", bad)]).unwrap_err();
            let text = format!("{e:#}");
            assert!(
                text.contains("log_level") && text.contains("debug5"),
                "{text}"
            );
        }
        let s = load("data_dir = \"/d\"\nlog_format = \"json\"", &[], &[]).unwrap();
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(
            load("data_dir = \"/d\"", &[], &[]).unwrap().log_format,
            LogFormat::Text
        );
        assert!(load("data_dir = \"/d\"\nlog_format = \"xml\"", &[], &[]).is_err());
    }

    #[test]
    fn wal_retrieve_retry_interval_caps_the_backoff_and_defaults_to_todays_schedule() {
        let s = load("data_dir = \"/d\"", &[], &[]).unwrap();
        assert_eq!(s.wal_retrieve_retry_interval, Duration::from_millis(100));
        let s = load(
            "data_dir = \"/d\"\nwal_retrieve_retry_interval = \"5s\"",
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(s.wal_retrieve_retry_interval, Duration::from_secs(5));
        let s = load(
            "data_dir = \"/d\"\nwal_retrieve_retry_interval = 250",
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(
            s.wal_retrieve_retry_interval,
            Duration::from_millis(250),
            "bare numbers are milliseconds, as in PostgreSQL"
        );
        let e = load(
            "data_dir = \"/d\"\nwal_retrieve_retry_interval = 0",
            &[],
            &[],
        )
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("wal_retrieve_retry_interval"),
            "{e:#}"
        );
    }

    #[test]
    fn unknown_environment_variables_are_ignored() {
        let s = load(
            "data_dir = \"/d\"",
            &[("WALSERVER_TEST_PG_BIN", "/x"), ("PATH", "/bin")],
            &[],
        )
        .unwrap();
        assert_eq!(s.data_dir, PathBuf::from("/d"));
    }

    #[test]
    fn hba_and_users_from_toml() {
        let s = load(
            r#"data_dir = "/d"
[users]
repl = "SCRAM-SHA-256$4096:c2FsdA==$a:b"
[[hba]]
address = "10.0.0.0/8"
user = "repl"
method = "scram-sha-256"
"#,
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(s.hba.len(), 1);
        assert!(s.users["repl"].starts_with("SCRAM-SHA-256$"));
    }
}
