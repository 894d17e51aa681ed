//! The node's configuration: a TOML file, then `WALSERVER_*` environment variables, then
//! `-c key=value` overrides, each later source winning. Knob names follow PostgreSQL's where
//! PostgreSQL has one, and keep its units (see `units`). Nothing is ignored: a key no table
//! takes (top level or nested, as in an `[[hba]]` rule), a `-c` key and a `WALSERVER_*`
//! variable that name no setting are errors naming them, with the closest name when one is near.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use walsender_actor::hba::HbaRuleSettings;

use crate::archive::{ArchiveSettings, ARCHIVE_KEYS};
use crate::error::{Error, Message, Result};
use crate::failover::{FailoverSettings, FAILOVER_KEYS};
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
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
    "tcp_user_timeout",
    "wal_keep_size",
    "max_slot_wal_keep_size",
    "max_wal_size",
    "wal_recycle",
    "archive_mode",
    "archive_target",
    "archive_timeout",
    "archive_command",
    "archive_max_backlog",
    "archive_compression",
    "archive_compression_level",
    "archive",
    "synchronous_standby_names",
    "synchronous_commit",
    "synchronous_wait_timeout",
    "synchronous_commit_overlap",
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
    "failover",
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
    /// The TCP keepalive timing of accepted replication connections, as PostgreSQL's: how long
    /// a connection is idle before the first probe and between probes (bare numbers are
    /// seconds), how many unanswered probes drop it, and how long sent data may go
    /// unacknowledged (bare numbers are milliseconds). 0, the default, keeps the system's.
    #[serde(default, deserialize_with = "units::duration_s")]
    pub tcp_keepalives_idle: Duration,
    #[serde(default, deserialize_with = "units::duration_s")]
    pub tcp_keepalives_interval: Duration,
    #[serde(default)]
    pub tcp_keepalives_count: u32,
    #[serde(default, deserialize_with = "units::duration_ms")]
    pub tcp_user_timeout: Duration,
    /// WAL kept for standbys without slots. Bare numbers are megabytes.
    #[serde(default, deserialize_with = "units::size_mb")]
    pub wal_keep_size: u64,
    /// The most WAL a slot may hold back; -1 (the default) is unlimited.
    #[serde(default, deserialize_with = "units::size_mb_or_unlimited")]
    pub max_slot_wal_keep_size: Option<u64>,
    /// Past this much retained WAL a slot's `wal_status` turns from reserved to extended.
    #[serde(default = "default_max_wal_size", deserialize_with = "units::size_mb")]
    pub max_wal_size: u64,
    /// A segment file nobody needs any more becomes a later segment instead of being removed
    /// (PostgreSQL's `wal_recycle`); off suits copy-on-write file systems.
    #[serde(default = "default_wal_recycle")]
    pub wal_recycle: bool,
    /// `archive_mode`: `off`, `on` (a primary archives) or `always` (every node archives).
    #[serde(default = "default_archive_mode")]
    pub archive_mode: String,
    /// `archive_target`: the archive as a URL, `file:///path`.
    #[serde(default)]
    pub archive_target: Option<String>,
    /// `archive_command`: PostgreSQL's shell command with `%p` and `%f`, instead of
    /// `archive_target`.
    #[serde(default)]
    pub archive_command: Option<String>,
    /// `archive_max_backlog`: past this much WAL waiting for the archive a primary refuses
    /// appends and a relay stops reading from its upstream; 0 (the default) is unbounded.
    /// Bare numbers are bytes.
    #[serde(default, deserialize_with = "units::size_bytes")]
    pub archive_max_backlog: u64,
    /// `archive_timeout`: the current segment's durable prefix is archived at least this
    /// often; 0 (the default) turns it off. Bare numbers are seconds, as in PostgreSQL.
    #[serde(default, deserialize_with = "units::duration_s")]
    pub archive_timeout: Duration,
    /// `archive_compression`: how archived objects are stored, `none` or `zstd`.
    #[serde(default = "default_archive_compression")]
    pub archive_compression: String,
    /// `archive_compression_level`: zstd's level (`wal_archive::ZSTD_LEVELS`, negative ones
    /// its fast levels); its default when unset.
    #[serde(default)]
    pub archive_compression_level: Option<i32>,
    /// The object store of an `s3://` archive_target.
    #[serde(default)]
    pub archive: Option<ArchiveSettings>,
    #[serde(default)]
    pub synchronous_standby_names: String,
    #[serde(default = "default_synchronous_commit")]
    pub synchronous_commit: String,
    /// After this long an append still waiting for synchronous standbys fails; 0 waits forever.
    #[serde(default, deserialize_with = "units::duration_ms")]
    pub synchronous_wait_timeout: Duration,
    /// The overlapped commit: synchronous walserver standbys get WAL while this node's
    /// fdatasync runs, and an append is acknowledged once durable here and on the quorum.
    /// On by default; off is PostgreSQL's rule: only durable WAL is sent. Read at start.
    #[serde(default = "default_true")]
    pub synchronous_commit_overlap: bool,
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
    pub hba: Vec<HbaRuleSettings>,
    /// User name to password verifier (`SCRAM-SHA-256$...` from `walserver passwd`, or `md5...`).
    #[serde(default)]
    pub users: BTreeMap<String, String>,
    /// Automatic failover on etcd; without the table the node keeps the role its data
    /// directory gives it.
    #[serde(default)]
    pub failover: Option<FailoverSettings>,
}

fn default_listen() -> String {
    supervisor_actor::DEFAULT_LISTEN.to_string()
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
fn default_archive_mode() -> String {
    "off".into()
}
fn default_archive_compression() -> String {
    "none".into()
}

fn default_wal_recycle() -> bool {
    wal_storage::StorageConfig::default().wal_recycle
}
fn default_true() -> bool {
    true
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

/// The prefix of the environment variables that set settings: `WALSERVER_<KEY>`.
pub const ENV_PREFIX: &str = "WALSERVER_";

/// `WALSERVER_*` variables that are not settings. The project's own tools read them, and they
/// are often exported in the shell the server runs in, so they are not mistakes:
/// `WALSERVER_PG_BIN` (where PostgreSQL 15's programs are, for the interop tests,
/// `scripts/test.sh` and the benches), `WALSERVER_BIN` (the `walserver` executable the load
/// tool runs) and `WALSERVER_COMMIT` (the commit a build records for `/metrics`; cargo also
/// sets it for every process it runs from the package, the tests' nodes among them). Every
/// other `WALSERVER_*` variable must name a setting.
pub const NON_SETTING_VARS: &[&str] = &["WALSERVER_PG_BIN", "WALSERVER_BIN", "WALSERVER_COMMIT"];

/// Variables starting with this are test harnesses' own, never settings.
pub const TEST_VAR_PREFIX: &str = "WALSERVER_TEST_";

/// The keys that are tables, which no `-c` or variable sets whole.
const TABLES: &[&str] = &["hba", "users", "failover", "archive"];

/// Whether `-c key=value` may set `key`: a top-level setting, `failover.KEY` or
/// `archive.KEY`.
fn settable(key: &str) -> bool {
    if let Some(k) = key.strip_prefix("failover.") {
        return FAILOVER_KEYS.contains(&k);
    }
    if let Some(k) = key.strip_prefix("archive.") {
        return ARCHIVE_KEYS.contains(&k);
    }
    KEYS.contains(&key)
}

/// Splits `key=value` from the command line.
pub fn parse_override(arg: &str) -> Result<(String, String)> {
    match arg.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(Error::InvalidOverride {
            arg: arg.to_string(),
        }),
    }
}

/// The setting an environment variable sets, `None` if it is not a `WALSERVER_*` setting
/// variable at all, and an error for a `WALSERVER_*` variable that names no setting: a
/// misspelt variable must not leave the setting at its default unnoticed.
fn env_setting(name: &str) -> Result<Option<String>> {
    let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
        return Ok(None);
    };
    if NON_SETTING_VARS.contains(&name) || name.starts_with(TEST_VAR_PREFIX) {
        return Ok(None);
    }
    let key = rest.to_ascii_lowercase();
    match key.as_str() {
        "hba" => Err(env_error(name, ": [[hba]] rules cannot come from the environment; write them in the configuration file".into())),
        "users" => Err(env_error(name, ": [users] cannot come from the environment; write it in the configuration file".into())),
        "failover" => Err(env_error(name, format!(": [failover] is a table; set its keys one by one, as {ENV_PREFIX}FAILOVER_NODE_NAME"))),
        k if k.strip_prefix("failover_").is_some_and(|f| FAILOVER_KEYS.contains(&f)) => {
            Ok(Some(format!("failover.{}", &k["failover_".len()..])))
        }
        "archive" => Err(env_error(name, format!(": [archive] is a table; set its keys one by one, as {ENV_PREFIX}ARCHIVE_ENDPOINT"))),
        k if KEYS.contains(&k) => Ok(Some(key)),
        k if k.strip_prefix("archive_").is_some_and(|a| ARCHIVE_KEYS.contains(&a)) => {
            Ok(Some(format!("archive.{}", &k["archive_".len()..])))
        }
        _ => {
            let known: Vec<String> = KEYS
                .iter()
                .filter(|k| !TABLES.contains(k))
                .map(|k| format!("{ENV_PREFIX}{}", k.to_ascii_uppercase()))
                .chain(
                    FAILOVER_KEYS
                        .iter()
                        .map(|k| format!("{ENV_PREFIX}FAILOVER_{}", k.to_ascii_uppercase())),
                )
                .chain(
                    ARCHIVE_KEYS
                        .iter()
                        .map(|k| format!("{ENV_PREFIX}ARCHIVE_{}", k.to_ascii_uppercase())),
                )
                .chain(NON_SETTING_VARS.iter().map(|v| v.to_string()))
                .collect();
            match closest(&name.to_ascii_uppercase(), known.iter().map(String::as_str)) {
                Some(near) => Err(env_error(name, format!(" names no setting; did you mean {near}?"))),
                None => Err(env_error(name, format!(
                    " names no setting: {ENV_PREFIX}<KEY> sets a key of the configuration file, and the only other {ENV_PREFIX} variables are {} and {TEST_VAR_PREFIX}*",
                    NON_SETTING_VARS.join(", ")
                ))),
            }
        }
    }
}

/// The process's environment. `std::env::vars` would panic on a variable that is not UTF-8;
/// such a variable is skipped, unless it would set a setting, which is an error.
fn env_error(name: &str, text: String) -> Error {
    Error::Environment {
        name: name.to_string(),
        text,
    }
}

fn process_env() -> Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    for (name, value) in std::env::vars_os() {
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => {
                env.insert(name, value);
            }
            (Ok(name), Err(_)) if env_setting(&name)?.is_some() => {
                return Err(env_error(&name, " is not valid UTF-8".into()));
            }
            _ => {}
        }
    }
    Ok(env)
}

/// The known name nearest to a misspelt one, if one is near enough to be what was meant: at
/// most two edits away, or a quarter of the name for long names.
fn closest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    known
        .into_iter()
        .map(|k| (edit_distance(name, k), k))
        .filter(|&(d, _)| d > 0 && d < name.len() && d <= (name.len() / 4).max(2))
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

/// Levenshtein distance in bytes (names here are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let next = (diag + usize::from(x != y))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Says serde's "unknown field" (from `deny_unknown_fields`, at the top level or in a nested
/// table) in the configuration file's words: the key, the table it is in (`[[hba]] rule 2`),
/// the closest key that table takes, and the keys it takes. `None` for any other error.
fn unknown_key_message(e: &config::ConfigError) -> Option<String> {
    let (msg, path) = match e {
        config::ConfigError::At { error, key, .. } => match error.as_ref() {
            config::ConfigError::Message(m) => (m.as_str(), key.as_deref()),
            _ => return None,
        },
        config::ConfigError::Message(m) => (m.as_str(), None),
        _ => return None,
    };
    let (field, expected) = msg.strip_prefix("unknown field `")?.split_once('`')?;
    // serde lists the expected keys in backquotes: "`a`", "`a` or `b`", "one of `a`, `b`, ...".
    let keys: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let table = match path {
        None | Some("") => "the configuration".to_string(),
        Some(p) => match p.strip_suffix(']').and_then(|p| p.rsplit_once('[')) {
            Some((t, i)) if !t.contains('[') => {
                let n = i.parse::<usize>().ok()? + 1;
                let what = if t == "hba" { "rule" } else { "table" };
                format!("[[{t}]] {what} {n}")
            }
            _ => format!("[{p}]"),
        },
    };
    let mut text = format!("unknown key `{field}` in {table}");
    if let Some(near) = closest(field, keys.iter().copied()) {
        text.push_str(&format!("; did you mean `{near}`?"));
    }
    if keys.is_empty() {
        text.push_str(" (it takes no keys)");
    } else if keys.len() <= 8 {
        let list: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
        text.push_str(&format!(" (expected one of {})", list.join(", ")));
    } else {
        text.push_str(" (configs/primary.toml and configs/standby.toml describe every key)");
    }
    Some(text)
}

impl Settings {
    pub fn load(sources: &Sources) -> Result<Settings> {
        Settings::load_from(sources, true)
    }

    /// Loads the settings of a command that reads only the archive (`restore-wal`,
    /// `archive`): as [`Settings::load`], but `data_dir` may be absent, since a host that
    /// restores PostgreSQL's WAL need not run a node.
    pub fn load_without_data_dir(sources: &Sources) -> Result<Settings> {
        Settings::load_from(sources, false)
    }

    fn load_from(sources: &Sources, need_data_dir: bool) -> Result<Settings> {
        let mut b = config::Config::builder();
        if !need_data_dir {
            b = b
                .set_default("data_dir", "")
                .map_err(|e| Error::ConfigSource(Box::new(e)))?;
        }
        if let Some(path) = &sources.file {
            b = b.add_source(
                config::File::from(path.as_path())
                    .format(config::FileFormat::Toml)
                    .required(true),
            );
        }
        let env: BTreeMap<String, String> = match &sources.env {
            Some(m) => m.clone(),
            None => process_env()?,
        };
        for (name, value) in env {
            if let Some(key) = env_setting(&name)? {
                b = b
                    .set_override(key, value)
                    .map_err(|e| Error::ConfigSource(Box::new(e)))?;
            }
        }
        for (k, v) in &sources.overrides {
            if !settable(k) {
                let known: Vec<String> = KEYS
                    .iter()
                    .filter(|k| !TABLES.contains(k))
                    .map(|k| k.to_string())
                    .chain(FAILOVER_KEYS.iter().map(|k| format!("failover.{k}")))
                    .chain(ARCHIVE_KEYS.iter().map(|k| format!("archive.{k}")))
                    .collect();
                return Err(Error::UnknownSetting {
                    key: k.clone(),
                    value: v.clone(),
                    near: closest(k, known.iter().map(String::as_str)).map(str::to_string),
                });
            }
            b = b
                .set_override(k.as_str(), v.as_str())
                .map_err(|e| Error::ConfigSource(Box::new(e)))?;
        }
        let invalid = |source: config::ConfigError| Error::InvalidConfig {
            file: sources.file.clone(),
            source: Box::new(source),
        };
        let built = b.build().map_err(invalid)?;
        if let Err(config::ConfigError::NotFound(_)) = built.get::<config::Value>("data_dir") {
            return Err(Error::MissingDataDir {
                file: sources.file.clone(),
            });
        }
        let settings: Settings =
            built
                .try_deserialize()
                .map_err(|e| match unknown_key_message(&e) {
                    Some(text) => Error::UnknownKey {
                        file: sources.file.clone(),
                        source: Message(text),
                    },
                    None => invalid(e),
                })?;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<()> {
        if self.ssl_cert_file.is_some() != self.ssl_key_file.is_some() {
            return Err(Error::TlsFilesApart);
        }
        if self.max_wal_senders == 0 {
            tracing::warn!("max_wal_senders = 0: no standby can connect");
        }
        logging::filter_directives(&self.log_level).map_err(Error::Invalid)?;
        if self.wal_retrieve_retry_interval.is_zero() {
            return Err(Error::Invalid(
                "wal_retrieve_retry_interval must be more than 0".into(),
            ));
        }
        walsender_actor::hba::HbaRules::from_settings(&self.hba)?;
        crate::archive::archive_config(self)?;
        if let Some(f) = &self.failover {
            f.validate(
                &self.listen,
                &self.http_listen,
                self.cluster_name.as_deref(),
                &self.synchronous_standby_names,
            )?;
        }
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
pub(crate) mod tests {
    use super::*;

    /// Loads `toml` from a file with `env` and `-c` overrides.
    pub(crate) fn load(
        toml: &str,
        env: &[(&str, &str)],
        overrides: &[(&str, &str)],
    ) -> anyhow::Result<Settings> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml)?;
        // As the binary sees it: an anyhow error whose causes are the load error's sources.
        Ok(Settings::load(&Sources {
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
        })?)
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
        // The walkthrough's members (README, "A three-member cluster, step by step"), which
        // scripts/walkthrough.sh starts as shipped.
        for n in 1..=3 {
            let path = dir.join(format!("cluster/node{n}.toml"));
            let s = Settings::load(&Sources {
                file: Some(path.clone()),
                overrides: vec![],
                env: Some(Default::default()),
            })
            .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            assert!(
                s.data_dir.ends_with(format!("data/node{n}")),
                "{:?}",
                s.data_dir
            );
            let failover = s.failover.as_ref().expect("a [failover] table");
            assert_eq!(failover.node_name, format!("node{n}"));
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
        assert!(documented.contains("[archive]"));
        for key in ARCHIVE_KEYS {
            assert!(
                documented.contains(&format!("# {key} = ")),
                "[archive] {key} is not documented in configs/"
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
        assert!(s.wal_recycle);
    }

    #[test]
    fn wal_recycle_takes_postgres_booleans() {
        for (text, want) in [
            ("off", false),
            ("on", true),
            ("false", false),
            ("true", true),
        ] {
            let s = load("data_dir = \"/d\"", &[], &[("wal_recycle", text)]).unwrap();
            assert_eq!(s.wal_recycle, want, "-c wal_recycle={text}");
            let s = load("data_dir = \"/d\"", &[("WALSERVER_WAL_RECYCLE", text)], &[]).unwrap();
            assert_eq!(s.wal_recycle, want, "WALSERVER_WAL_RECYCLE={text}");
        }
        let s = load("data_dir = \"/d\"\nwal_recycle = false", &[], &[]).unwrap();
        assert!(!s.wal_recycle);
        assert!(load("data_dir = \"/d\"", &[], &[("wal_recycle", "sometimes")]).is_err());
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
        let e = load("data_dir = \"/d\"", &[], &[("max_wal_sender", "1")]).unwrap_err();
        assert!(
            e.to_string().ends_with("did you mean max_wal_senders?"),
            "{e}"
        );
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
    fn variables_that_are_not_settings_are_not_errors() {
        // The project's tools and test harnesses read these; a shell that exports them for
        // the tests can still run the server.
        let s = load(
            "data_dir = \"/d\"",
            &[
                ("WALSERVER_TEST_PG_BIN", "/x"),
                ("WALSERVER_PG_BIN", "/usr/lib/postgresql/15/bin"),
                ("WALSERVER_BIN", "/usr/bin/walserver"),
                ("WALSERVER_COMMIT", "0123456789ab"),
                ("PATH", "/bin"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(s.data_dir, PathBuf::from("/d"));
    }

    #[test]
    fn a_misspelt_environment_variable_is_an_error() {
        let e = load(
            "data_dir = \"/d\"",
            &[("WALSERVER_WAL_SENDER_TIMOUT", "5s")],
            &[],
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "environment variable WALSERVER_WAL_SENDER_TIMOUT names no setting; did you mean WALSERVER_WAL_SENDER_TIMEOUT?"
        );
        let e = load("data_dir = \"/d\"", &[("WALSERVER_PG_BINN", "/x")], &[]).unwrap_err();
        assert!(
            e.to_string().ends_with("did you mean WALSERVER_PG_BIN?"),
            "{e}"
        );
        // Nothing near: the message says what WALSERVER_ variables there are.
        let e = load("data_dir = \"/d\"", &[("WALSERVER_XYZZY", "1")], &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "environment variable WALSERVER_XYZZY names no setting: WALSERVER_<KEY> sets a key of the configuration file, and the only other WALSERVER_ variables are WALSERVER_PG_BIN, WALSERVER_BIN, WALSERVER_COMMIT and WALSERVER_TEST_*"
        );
        // The tables are settings, but not ones a variable can hold.
        let e = load("data_dir = \"/d\"", &[("WALSERVER_HBA", "x")], &[]).unwrap_err();
        assert!(e.to_string().contains("WALSERVER_HBA"), "{e}");
        assert!(e.to_string().contains("[[hba]]"), "{e}");
    }

    #[test]
    fn a_misspelt_key_in_a_nested_table_is_an_error() {
        // A misspelt `type` would make the second rule a plain `host` rule that lets a
        // connection without TLS in.
        let e = load(
            r#"data_dir = "/d"
[[hba]]
address = "127.0.0.1"
user = "all"
method = "trust"
[[hba]]
typ = "hostssl"
address = "all"
user = "all"
method = "scram-sha-256"
"#,
            &[],
            &[],
        )
        .unwrap_err();
        assert_eq!(
            format!("{e:#}").split_once("): ").map(|(_, m)| m),
            Some("unknown key `typ` in [[hba]] rule 2; did you mean `type`? (expected one of `type`, `address`, `user`, `method`)"),
            "{e:#}"
        );
        // At the top level the message has the same shape.
        let e = load("data_dir = \"/d\"\nwal_sender_timout = 5", &[], &[]).unwrap_err();
        assert!(
            format!("{e:#}").contains(
                "unknown key `wal_sender_timout` in the configuration; did you mean `wal_sender_timeout`?"
            ),
            "{e:#}"
        );
    }

    #[test]
    fn a_missing_data_dir_says_how_to_give_one() {
        let e = Settings::load(&Sources {
            file: None,
            overrides: vec![],
            env: Some(Default::default()),
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "no data directory: pass `--config FILE` (a configuration with data_dir) or `-c data_dir=DIR`"
        );
        let e = load("listen = \"x\"", &[], &[]).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("no data_dir; set `data_dir` in it or pass `-c data_dir=DIR`"),
            "{e}"
        );
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
