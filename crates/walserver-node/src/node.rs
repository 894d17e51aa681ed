//! A node from its settings: the `NodeConfig` a configuration gives (the walsender, walreceiver
//! and synchronous-replication parts of it, and the values SHOW answers), the reloader that
//! re-reads a configuration for SIGHUP and `POST /reload`, and [`start_node`], the one way the
//! server, the demo, the load tool and the tests bring a configured node to life.

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use supervisor_actor::{
    Durability, Node, NodeBuilder, NodeConfig, Reconfigure, RestartPolicy, SyncSettings,
};
use wal_storage::{StorageConfig, Wal};
use walreceiver_actor::ReceiverConfig;
use walsender_actor::hba::HbaRules;
use walsender_actor::session::SessionConfig;
use walsender_actor::startup::AuthSettings;
use walsender_actor::{WalSenderSettings, SERVER_VERSION};

use crate::config::{Settings, Sources};
use crate::init::{StandbySignal, STANDBY_SIGNAL};
use crate::units::{format_duration, format_size};

pub fn resolve_addr(text: &str, what: &str) -> anyhow::Result<SocketAddr> {
    text.to_socket_addrs()
        .with_context(|| format!("invalid {what} address {text:?}"))?
        .next()
        .with_context(|| format!("{what} address {text:?} resolves to nothing"))
}

/// The values SHOW answers, in PostgreSQL's spelling and formatting: the storage's facts
/// (`walsender_actor::session::base_show_values`) and the replication knobs users ask for.
pub fn show_values(
    s: &Settings,
    segment_size: u64,
    wal_format: wal_storage::WalFormat,
) -> Vec<(String, String)> {
    let v = |n: &str, val: String| (n.to_string(), val);
    let knobs = vec![
        v("max_wal_senders", s.max_wal_senders.to_string()),
        v("wal_sender_timeout", format_duration(s.wal_sender_timeout)),
        v("wal_keep_size", format_size(s.wal_keep_size)),
        v(
            "max_slot_wal_keep_size",
            s.max_slot_wal_keep_size.map_or("-1".into(), format_size),
        ),
        v("max_wal_size", format_size(s.max_wal_size)),
        v(
            "synchronous_standby_names",
            s.synchronous_standby_names.clone(),
        ),
        v("synchronous_commit", s.synchronous_commit.clone()),
        v(
            "wal_receiver_timeout",
            format_duration(s.wal_receiver_timeout),
        ),
        v(
            "wal_receiver_status_interval",
            format_duration(s.wal_receiver_status_interval),
        ),
        v(
            "primary_slot_name",
            s.primary_slot_name.clone().unwrap_or_default(),
        ),
        v("cluster_name", s.cluster_name.clone().unwrap_or_default()),
    ];
    walsender_actor::session::merge_show_values(
        walsender_actor::session::base_show_values(segment_size, wal_format),
        &knobs,
    )
}

/// The walsender settings a configuration gives.
pub fn walsender_settings(
    s: &Settings,
    segment_size: u64,
    wal_format: wal_storage::WalFormat,
    tls: bool,
) -> anyhow::Result<WalSenderSettings> {
    Ok(WalSenderSettings {
        auth: Arc::new(AuthSettings {
            hba: HbaRules::from_config(&s.hba)?,
            users: s.users.clone(),
            tls_available: tls,
        }),
        session: Arc::new(SessionConfig {
            wal_sender_timeout: s.wal_sender_timeout,
            show: Arc::new(show_values(s, segment_size, wal_format)),
        }),
        authentication_timeout: s.authentication_timeout,
        close_grace: Duration::from_secs(10),
        server_version: SERVER_VERSION.to_string(),
        in_hot_standby: false,
    })
}

/// The walreceiver's configuration for a standby (the data directory holds `standby.signal`);
/// `None` for a primary.
pub fn receiver_config(s: &Settings, data_dir: &Path) -> anyhow::Result<Option<ReceiverConfig>> {
    let Some(signal) = StandbySignal::read(data_dir)? else {
        return Ok(None);
    };
    let conninfo = s
        .primary_conninfo
        .clone()
        .or(signal.primary_conninfo)
        .with_context(|| {
            format!(
                "{} marks this node a standby, but primary_conninfo is not set",
                data_dir.join(STANDBY_SIGNAL).display()
            )
        })?;
    let mut cfg = ReceiverConfig::parse(&conninfo, s.cluster_name.as_deref())
        .with_context(|| "invalid primary_conninfo".to_string())?;
    cfg.session.slot_name = s
        .primary_slot_name
        .clone()
        .or(signal.primary_slot_name)
        .filter(|n| !n.is_empty());
    cfg.session.wal_receiver_timeout = s.wal_receiver_timeout;
    cfg.session.wal_receiver_status_interval = s.wal_receiver_status_interval;
    Ok(Some(cfg))
}

/// Synchronous replication from the settings.
pub fn sync_settings(s: &Settings) -> anyhow::Result<SyncSettings> {
    let standby_names =
        walsender_actor::syncrep::parse_sync_standby_names(&s.synchronous_standby_names)
            .map_err(anyhow::Error::msg)?;
    let default_durability: Durability = s
        .synchronous_commit
        .parse()
        .map_err(|e: String| anyhow::anyhow!("synchronous_commit: {e}"))?;
    Ok(SyncSettings {
        standby_names,
        default_durability,
        wait_timeout: (!s.synchronous_wait_timeout.is_zero()).then_some(s.synchronous_wait_timeout),
    })
}

/// What a data directory says about itself without opening it for writing.
fn stored_facts(data_dir: &Path) -> anyhow::Result<(u64, wal_storage::WalFormat)> {
    let segment_size = Wal::stored_segment_size(data_dir)
        .with_context(|| format!("cannot read the data directory {}", data_dir.display()))?;
    let format = Wal::stored_format(data_dir)?;
    Ok((segment_size, format))
}

/// The node configuration a settings file gives.
pub fn node_config(s: &Settings, data_dir: &Path) -> anyhow::Result<NodeConfig> {
    let listen = resolve_addr(&s.listen, "listen")?;
    let (segment_size, wal_format) = stored_facts(data_dir)?;
    let tls = match (&s.ssl_cert_file, &s.ssl_key_file) {
        (Some(c), Some(k)) => Some(
            protocol_codec::tls::server_config(c, k).context("cannot load the TLS certificate")?,
        ),
        _ => None,
    };
    let mut cfg = NodeConfig::new(data_dir, listen);
    cfg.storage = StorageConfig {
        segment_size,
        wal_keep_size: s.wal_keep_size,
        max_slot_wal_keep_size: s.max_slot_wal_keep_size,
        max_wal_size: s.max_wal_size,
        ..StorageConfig::default()
    };
    cfg.max_wal_senders = s.max_wal_senders;
    cfg.walsender = walsender_settings(s, segment_size, wal_format, tls.is_some())?;
    cfg.wal_sender_shutdown_timeout = s.wal_sender_shutdown_timeout;
    cfg.tls = tls;
    cfg.standby = receiver_config(s, data_dir)?;
    cfg.standby_signal = Some(data_dir.join(STANDBY_SIGNAL));
    cfg.sync = sync_settings(s)?;
    cfg.restart_policy = RestartPolicy::with_retry_interval(s.wal_retrieve_retry_interval);
    Ok(cfg)
}

/// Re-reads the configuration for a reload (SIGHUP, `POST /reload`).
pub struct Reloader {
    pub sources: Sources,
    pub data_dir: PathBuf,
    /// The settings the node runs with, to say which changes need a restart.
    pub running: Settings,
}

impl Reloader {
    pub fn reconfigure(&self) -> anyhow::Result<Reconfigure> {
        let s = Settings::load(&self.sources)?;
        for (name, changed) in [
            ("listen", s.listen != self.running.listen),
            ("http_listen", s.http_listen != self.running.http_listen),
            ("data_dir", s.data_dir != self.running.data_dir),
            (
                "ssl_cert_file",
                s.ssl_cert_file != self.running.ssl_cert_file,
            ),
            ("ssl_key_file", s.ssl_key_file != self.running.ssl_key_file),
            (
                "wal_retrieve_retry_interval",
                s.wal_retrieve_retry_interval != self.running.wal_retrieve_retry_interval,
            ),
            ("log_level", s.log_level != self.running.log_level),
            ("log_format", s.log_format != self.running.log_format),
        ] {
            if changed {
                tracing::warn!("{name} changed: the new value takes effect at the next restart");
            }
        }
        let (segment_size, wal_format) = stored_facts(&self.data_dir)?;
        let tls = self.running.ssl_cert_file.is_some();
        Ok(Reconfigure {
            walsender: walsender_settings(&s, segment_size, wal_format, tls)?,
            max_wal_senders: s.max_wal_senders,
            receiver: receiver_config(&s, &self.data_dir)?,
            sync: sync_settings(&s)?,
        })
    }

    /// Reloads and applies; errors leave the running settings as they were.
    pub async fn reload(&self, node: &Node) -> anyhow::Result<()> {
        let r = self
            .reconfigure()
            .context("reload refused; the running settings stay")?;
        node.supervisor
            .send(r)
            .await
            .context("the supervisor is gone")?;
        tracing::info!("configuration reloaded");
        Ok(())
    }
}

/// Starts the node `settings` describe, on its data directory `data_dir`, in the current actix
/// System; `adjust` changes what no setting reaches (the load tool turns fsync off and picks
/// I/O threads, the tests pick I/O threads). The configuration is read before the future is
/// returned, so a wrong setting fails here, outside any System; the future is `'static` and
/// `Send`, so it can be spawned on another System's arbiter.
pub fn start_node(
    settings: &Settings,
    data_dir: &Path,
    adjust: impl FnOnce(&mut NodeConfig),
) -> anyhow::Result<impl Future<Output = anyhow::Result<Node>> + Send + 'static> {
    let mut cfg = node_config(settings, data_dir)?;
    adjust(&mut cfg);
    Ok(async move { Ok(NodeBuilder::new(cfg).start().await?) })
}
