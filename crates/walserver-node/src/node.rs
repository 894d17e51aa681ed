//! A node from its settings: the `NodeConfig` a configuration gives (the walsender, walreceiver
//! and synchronous-replication parts of it, the values SHOW answers, and under `[failover]` a
//! closed fence), the reloader that re-reads a configuration for SIGHUP and `POST /reload`,
//! and [`start_node`], the one way the server, the demo, the load tool and the tests bring a
//! configured node to life.

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use protocol_codec::client_settings::TcpKeepalives;
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
use crate::error::{Error, Result};
use crate::init::{StandbySignal, STANDBY_SIGNAL};
use crate::units::{format_duration, format_size};

pub fn resolve_addr(text: &str, what: &str) -> Result<SocketAddr> {
    text.to_socket_addrs()
        .map_err(|source| Error::InvalidAddress {
            what: what.to_string(),
            text: text.to_string(),
            source,
        })?
        .next()
        .ok_or_else(|| Error::AddressResolvesToNothing {
            what: what.to_string(),
            text: text.to_string(),
        })
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
            "wal_recycle",
            if s.wal_recycle { "on" } else { "off" }.into(),
        ),
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
) -> Result<WalSenderSettings> {
    Ok(WalSenderSettings {
        auth: Arc::new(AuthSettings {
            hba: HbaRules::from_settings(&s.hba)?,
            users: s.users.clone(),
            tls_available: tls,
        }),
        session: Arc::new(SessionConfig {
            wal_sender_timeout: s.wal_sender_timeout,
            show: Arc::new(show_values(s, segment_size, wal_format)),
            commit_overlap: s.synchronous_commit_overlap,
        }),
        authentication_timeout: s.authentication_timeout,
        close_grace: Duration::from_secs(10),
        server_version: SERVER_VERSION.to_string(),
        // The role is the supervisor's: it sets both when it starts the node.
        in_hot_standby: false,
        read_only: false,
        tcp_keepalives: TcpKeepalives {
            idle: seconds(s.tcp_keepalives_idle),
            interval: seconds(s.tcp_keepalives_interval),
            count: Some(s.tcp_keepalives_count).filter(|c| *c > 0),
            user_timeout: u32::try_from(s.tcp_user_timeout.as_millis())
                .ok()
                .filter(|ms| *ms > 0),
        },
    })
}

/// A keepalive time in whole seconds, as the socket takes it (at least one); `None` for 0.
fn seconds(d: Duration) -> Option<u32> {
    (!d.is_zero()).then(|| u32::try_from(d.as_secs().max(1)).unwrap_or(u32::MAX))
}

/// The walreceiver's configuration for a standby (the control data's role and
/// `standby.signal` say which, by `StandbySignal::if_standby`); `None` for a primary.
pub fn receiver_config(s: &Settings, data_dir: &Path) -> Result<Option<ReceiverConfig>> {
    let Some(signal) = StandbySignal::if_standby(data_dir)? else {
        return Ok(None);
    };
    let conninfo = s
        .primary_conninfo
        .clone()
        .or(signal.primary_conninfo)
        .ok_or_else(|| Error::StandbyWithoutConninfo {
            signal: data_dir.join(STANDBY_SIGNAL),
        })?;
    // Under failover the node's name upstream is its node name (validation refuses a
    // different cluster_name), so the leader's synchronous standby choice names it.
    let application_name = s
        .cluster_name
        .as_deref()
        .or(s.failover.as_ref().map(|f| f.node_name.as_str()));
    let mut cfg = ReceiverConfig::parse(&conninfo, application_name)
        .map_err(|e| Error::InvalidConninfo(Box::new(e)))?;
    cfg.session.slot_name = s
        .primary_slot_name
        .clone()
        .or(signal.primary_slot_name)
        .filter(|n| !n.is_empty());
    cfg.session.wal_receiver_timeout = s.wal_receiver_timeout;
    cfg.session.wal_receiver_status_interval = s.wal_receiver_status_interval;
    cfg.session.commit_overlap = s.synchronous_commit_overlap;
    // When the upstream has removed WAL this node needs, the walreceiver fills the gap from
    // the archive.
    cfg.archive = crate::archive::gap_archive(s)?;
    Ok(Some(cfg))
}

/// Synchronous replication from the settings.
pub fn sync_settings(s: &Settings) -> Result<SyncSettings> {
    let standby_names =
        walsender_actor::syncrep::parse_sync_standby_names(&s.synchronous_standby_names)
            .map_err(Error::SyncStandbyNames)?;
    let default_durability: Durability = s
        .synchronous_commit
        .parse()
        .map_err(Error::SynchronousCommit)?;
    Ok(SyncSettings {
        standby_names,
        default_durability,
        wait_timeout: (!s.synchronous_wait_timeout.is_zero()).then_some(s.synchronous_wait_timeout),
    })
}

/// What a data directory says about itself without opening it for writing.
fn stored_facts(data_dir: &Path) -> Result<(u64, wal_storage::WalFormat)> {
    let segment_size = Wal::stored_segment_size(data_dir).map_err(|e| match e {
        wal_storage::WalError::NotInitialized { .. } => Error::NotInitialized {
            dir: data_dir.to_path_buf(),
            error: e,
        },
        source => Error::ReadDataDir {
            dir: data_dir.to_path_buf(),
            source,
        },
    })?;
    let format = Wal::stored_format(data_dir)?;
    Ok((segment_size, format))
}

/// The node configuration a settings file gives.
pub fn node_config(s: &Settings, data_dir: &Path) -> Result<NodeConfig> {
    let listen = resolve_addr(&s.listen, "listen")?;
    let (segment_size, wal_format) = stored_facts(data_dir)?;
    let (tls, tls_channel_binding) = match (&s.ssl_cert_file, &s.ssl_key_file) {
        (Some(c), Some(k)) => (
            Some(protocol_codec::tls::server_config(c, k).map_err(Error::Tls)?),
            protocol_codec::tls::server_end_point(c).map_err(Error::Tls)?,
        ),
        _ => (None, None),
    };
    let mut cfg = NodeConfig::new(data_dir, listen);
    cfg.storage = StorageConfig {
        segment_size,
        wal_keep_size: s.wal_keep_size,
        max_slot_wal_keep_size: s.max_slot_wal_keep_size,
        max_wal_size: s.max_wal_size,
        wal_recycle: s.wal_recycle,
        ..StorageConfig::default()
    };
    cfg.max_wal_senders = s.max_wal_senders;
    cfg.walsender = walsender_settings(s, segment_size, wal_format, tls.is_some())?;
    cfg.wal_sender_shutdown_timeout = s.wal_sender_shutdown_timeout;
    cfg.tls = tls;
    cfg.tls_channel_binding = tls_channel_binding;
    cfg.standby = receiver_config(s, data_dir)?;
    cfg.standby_signal = Some(data_dir.join(STANDBY_SIGNAL));
    cfg.sync = sync_settings(s)?;
    cfg.restart_policy = RestartPolicy::with_retry_interval(s.wal_retrieve_retry_interval);
    if s.failover.is_some() {
        // Under failover the node acknowledges nothing until its failover actor holds the
        // leader key and grants the fence (`walserver run` starts the actor beside it).
        cfg.fence = supervisor_actor::Fence::closed();
    }
    Ok(cfg)
}

/// The settings a reload read a new value of but cannot apply, as PostgreSQL's
/// `postmaster`-context parameters: the running values stay until the next restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingRestart(pub Vec<&'static str>);

impl PendingRestart {
    /// What the log and the reload's answer say of each, in PostgreSQL's words.
    pub fn messages(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|name| {
                format!("parameter \"{name}\" cannot be changed without restarting the server")
            })
            .collect()
    }
}

/// Re-reads the configuration for a reload (SIGHUP, `POST /reload`).
pub struct Reloader {
    pub sources: Sources,
    pub data_dir: PathBuf,
    /// The settings the node started with. Those a reload cannot change (the ones it names
    /// as pending a restart) run with these values until the next start, so every reload
    /// compares with these, never with a previous reload's file: a setting changed, reloaded,
    /// changed back and reloaded again is pending after the first reload only. The settings
    /// a reload does apply are compared where they run (the supervisor's `Reconfigure`).
    pub running: Settings,
}

impl Reloader {
    /// What the supervisor is to apply, and the settings whose change waits for a restart
    /// (each logged as a warning).
    pub fn reconfigure(&self) -> Result<(Reconfigure, PendingRestart)> {
        let mut s = Settings::load(&self.sources)?;
        let mut pending = PendingRestart::default();
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
            ("[failover]", s.failover != self.running.failover),
            ("archive_mode", s.archive_mode != self.running.archive_mode),
            (
                "archive_target",
                s.archive_target != self.running.archive_target,
            ),
            (
                "archive_command",
                s.archive_command != self.running.archive_command,
            ),
            (
                "archive_max_backlog",
                s.archive_max_backlog != self.running.archive_max_backlog,
            ),
            (
                "archive_compression",
                s.archive_compression != self.running.archive_compression,
            ),
            (
                "archive_compression_level",
                s.archive_compression_level != self.running.archive_compression_level,
            ),
            ("[archive]", s.archive != self.running.archive),
            (
                "archive_timeout",
                s.archive_timeout != self.running.archive_timeout,
            ),
            (
                "synchronous_commit_overlap",
                s.synchronous_commit_overlap != self.running.synchronous_commit_overlap,
            ),
        ] {
            if changed {
                pending.0.push(name);
            }
        }
        for message in pending.messages() {
            tracing::warn!("{message}: the running value stays until then");
        }
        // Whether a failover actor runs was decided at start: it still chooses the upstream,
        // and names this node to it, when the file no longer has [failover], and does not when
        // the file has it now.
        s.failover = self.running.failover.clone();
        let (segment_size, wal_format) = stored_facts(&self.data_dir)?;
        let tls = self.running.ssl_cert_file.is_some();
        // Under failover the failover actor chooses the upstream (the leader): a reload must
        // not point the walreceiver back at the one the configuration or standby.signal named.
        let receiver = if s.failover.is_some() {
            if s.primary_conninfo != self.running.primary_conninfo {
                tracing::warn!("primary_conninfo changed: under [failover] the upstream is the leader, and a reload does not change it");
            }
            None
        } else {
            receiver_config(&s, &self.data_dir)?
        };
        let mut walsender = walsender_settings(&s, segment_size, wal_format, tls)?;
        // Storage was told at start whether to publish written WAL early; the walsenders
        // and the walreceiver keep the rule it was told.
        Arc::make_mut(&mut walsender.session).commit_overlap =
            self.running.synchronous_commit_overlap;
        // The archive is read by the archiver and by the walreceiver's gap fill, and both keep
        // the one they started with: a new upstream must not fill gaps from an archive the
        // archiver does not write.
        let archive = crate::archive::gap_archive(&self.running)?;
        let receiver = receiver.map(|mut r| {
            r.session.commit_overlap = self.running.synchronous_commit_overlap;
            r.archive = archive;
            r
        });
        let apply = Reconfigure {
            walsender,
            max_wal_senders: s.max_wal_senders,
            receiver,
            sync: sync_settings(&s)?,
        };
        Ok((apply, pending))
    }

    /// Reloads and applies; errors leave the running settings as they were. Returns the
    /// settings whose change waits for a restart.
    pub async fn reload(&self, node: &Node) -> Result<PendingRestart> {
        let (apply, pending) = self
            .reconfigure()
            .map_err(|e| Error::ReloadRefused(Box::new(e)))?;
        node.supervisor
            .send(apply)
            .await
            .map_err(Error::SupervisorGone)?;
        tracing::info!("configuration reloaded");
        Ok(pending)
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
) -> Result<impl Future<Output = Result<Node>> + Send + 'static> {
    let mut cfg = node_config(settings, data_dir)?;
    adjust(&mut cfg);
    Ok(async move { Ok(NodeBuilder::new(cfg).start().await?) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Sources;

    fn settings(data_dir: &Path) -> Settings {
        Settings::load(&Sources {
            file: None,
            overrides: vec![("data_dir".into(), data_dir.display().to_string())],
            env: Some(Default::default()),
        })
        .unwrap()
    }

    /// A node built in code and one built from a file that sets nothing start alike.
    #[test]
    fn the_builder_s_defaults_are_the_file_s() {
        let dir = tempfile::tempdir().unwrap();
        crate::init::init_primary(dir.path(), 1 << 20).unwrap();
        let s = settings(dir.path());
        let file = node_config(&s, dir.path()).unwrap();
        let mut builder = NodeBuilder::primary(dir.path());
        let code = builder.config_mut();
        assert_eq!(code.listen, file.listen);
        assert_eq!(code.max_wal_senders, file.max_wal_senders);
        assert_eq!(
            code.walsender.authentication_timeout,
            file.walsender.authentication_timeout
        );
        assert_eq!(
            code.walsender.session.wal_sender_timeout,
            file.walsender.session.wal_sender_timeout
        );
        assert_eq!(
            code.wal_sender_shutdown_timeout,
            file.wal_sender_shutdown_timeout
        );
        assert_eq!(code.storage.wal_keep_size, file.storage.wal_keep_size);
        assert_eq!(
            code.storage.max_slot_wal_keep_size,
            file.storage.max_slot_wal_keep_size
        );
        assert_eq!(code.storage.max_wal_size, file.storage.max_wal_size);
        assert_eq!(code.storage.wal_recycle, file.storage.wal_recycle);
        assert_eq!(code.sync, file.sync);
        assert!(code.standby.is_none() && file.standby.is_none());

        // A standby's walreceiver settings.
        let conninfo = "host=127.0.0.1 port=5433 user=r";
        StandbySignal {
            primary_conninfo: Some(conninfo.into()),
            primary_slot_name: None,
            standby_since: None,
        }
        .write(dir.path())
        .unwrap();
        let file = receiver_config(&s, dir.path()).unwrap().expect("a standby");
        let mut builder = NodeBuilder::standby(dir.path(), conninfo).unwrap();
        let code = builder.config_mut().standby.clone().expect("a standby");
        assert_eq!(code.session, file.session);
        assert_eq!(code.application_name, file.application_name);
        assert_eq!(code.max_wal_in_flight, file.max_wal_in_flight);
    }

    /// A standby's data directory whose `standby.signal` names an upstream on port 5433.
    fn standby_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        crate::init::init_primary(dir.path(), 1 << 20).unwrap();
        StandbySignal {
            primary_conninfo: Some("host=127.0.0.1 port=5433 user=r".into()),
            primary_slot_name: None,
            standby_since: None,
        }
        .write(dir.path())
        .unwrap();
        dir
    }

    /// Settings of the node on `data_dir` from `overrides` alone.
    fn overrides(data_dir: &Path, overrides: &[(&str, &str)]) -> Sources {
        Sources {
            file: None,
            overrides: [("data_dir", data_dir.to_str().unwrap())]
                .iter()
                .chain(overrides)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            env: Some(Default::default()),
        }
    }

    /// A reload of a standby re-reads its upstream, but not under failover, where the
    /// failover actor has pointed it at the leader.
    #[test]
    fn a_reload_under_failover_leaves_the_upstream_alone() {
        let dir = standby_dir();
        let reloader = |extra: &[(&str, &str)]| {
            let sources = overrides(dir.path(), extra);
            let running = Settings::load(&sources).unwrap();
            Reloader {
                sources,
                data_dir: dir.path().to_path_buf(),
                running,
            }
        };
        let (plain, _) = reloader(&[]).reconfigure().unwrap();
        assert!(
            plain.receiver.is_some(),
            "a standby's reload re-reads its upstream"
        );
        let under = reloader(&[
            ("failover.etcd_endpoints", "127.0.0.1:2379"),
            ("failover.cluster_name", "c"),
            ("failover.node_name", "n"),
        ])
        .reconfigure()
        .unwrap()
        .0;
        assert!(under.receiver.is_none());
    }

    /// A setting that waits for a restart is pending while the file's value differs from the
    /// one the node started with: changed and reloaded it is, changed back and reloaded it is
    /// not.
    #[test]
    fn a_restart_setting_changed_back_is_no_longer_pending() {
        let dir = standby_dir();
        let mut reloader = Reloader {
            sources: overrides(dir.path(), &[("wal_retrieve_retry_interval", "5s")]),
            data_dir: dir.path().to_path_buf(),
            running: Settings::load(&overrides(dir.path(), &[])).unwrap(),
        };
        let (_, pending) = reloader.reconfigure().unwrap();
        assert_eq!(pending, PendingRestart(vec!["wal_retrieve_retry_interval"]));
        reloader.sources = overrides(dir.path(), &[]);
        let (_, pending) = reloader.reconfigure().unwrap();
        assert_eq!(pending, PendingRestart::default());
    }

    /// `[failover]` runs as the node started until a restart: a reload of a file without it
    /// still leaves the upstream to the failover actor, and one of a file that has it now
    /// still re-reads the upstream; both say it waits for a restart.
    #[test]
    fn a_reload_follows_the_running_failover_not_the_file_s() {
        let dir = standby_dir();
        let failover = [
            ("failover.etcd_endpoints", "127.0.0.1:2379"),
            ("failover.cluster_name", "c"),
            ("failover.node_name", "n"),
        ];
        let reloader = |started: &[(&str, &str)], file: &[(&str, &str)]| Reloader {
            sources: overrides(dir.path(), file),
            data_dir: dir.path().to_path_buf(),
            running: Settings::load(&overrides(dir.path(), started)).unwrap(),
        };
        let (removed, pending) = reloader(&failover, &[]).reconfigure().unwrap();
        assert!(
            removed.receiver.is_none(),
            "a reload pointed a failover member's walreceiver at the file's upstream"
        );
        assert_eq!(pending, PendingRestart(vec!["[failover]"]));
        let (added, pending) = reloader(&[], &failover).reconfigure().unwrap();
        let receiver = added
            .receiver
            .expect("the upstream re-read without failover");
        assert_ne!(
            receiver.application_name, "n",
            "named as the failover member it is not yet"
        );
        assert_eq!(pending, PendingRestart(vec!["[failover]"]));
    }

    /// The archive is a restart setting for the walreceiver's gap fill as for the archiver: a
    /// reload that changes it with the upstream gives the new walreceiver the running
    /// archive, and names the setting as pending a restart.
    #[test]
    fn a_reload_keeps_the_running_archive_and_says_it_waits_for_a_restart() {
        let dir = standby_dir();
        let sources = |conninfo: &str, archive: &str| {
            let extra = [("primary_conninfo", conninfo), ("archive_target", archive)];
            overrides(dir.path(), &extra)
        };
        let running =
            Settings::load(&sources("host=127.0.0.1 port=5433 user=r", "file:///a")).unwrap();
        let reloader = |conninfo: &str, archive: &str| Reloader {
            sources: sources(conninfo, archive),
            data_dir: dir.path().to_path_buf(),
            running: running.clone(),
        };

        let (same, pending) = reloader("host=127.0.0.1 port=5433 user=r", "file:///a")
            .reconfigure()
            .unwrap();
        assert_eq!(pending, PendingRestart::default());
        let started = same.receiver.expect("a standby").archive;
        assert!(started.is_some());

        let (apply, pending) = reloader("host=127.0.0.1 port=5434 user=r", "file:///b")
            .reconfigure()
            .unwrap();
        let receiver = apply.receiver.expect("a standby");
        assert_eq!(receiver.conninfo.port, [5434], "the new upstream applies");
        assert_eq!(
            receiver.archive, started,
            "the gap fill kept the running archive"
        );
        assert_eq!(pending, PendingRestart(vec!["archive_target"]));
        assert_eq!(
            pending.messages(),
            ["parameter \"archive_target\" cannot be changed without restarting the server"]
        );
    }
}
