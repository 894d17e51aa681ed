//! The `[failover]` table, typed.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How synchronous replication and failover go together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SynchronousMode {
    /// Asynchronous replication; failover takes the most advanced healthy standby within
    /// `maximum_lag_on_failover`.
    #[default]
    Off,
    /// The leader picks one synchronous standby and publishes it before its acknowledgements
    /// count; only that standby may be promoted. With no standby left, appends fall back to
    /// asynchronous (and the published choice is cleared first).
    On,
    /// As `on`, but with no synchronous standby left appends wait rather than fall back.
    Strict,
}

/// Automatic failover for one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverConfig {
    /// etcd's client URLs (`http://host:2379`, `https://host:2379`), tried in turn.
    pub etcd_endpoints: Vec<String>,
    /// TLS files and credentials for etcd; the default is plain HTTP without a user.
    pub etcd_security: etcd_gateway::Security,
    /// The cluster's name: every key lives under `/walserver/<cluster_name>/`.
    pub cluster_name: String,
    /// This node's name in the cluster (unique); also its `application_name` upstream.
    pub node_name: String,
    /// The leader key's lease (Patroni's default is 30 s; walserver's 10 s).
    pub ttl: Duration,
    /// A standby further behind the last known leader position than this may not be promoted.
    pub maximum_lag_on_failover: u64,
    pub synchronous_mode: SynchronousMode,
    /// This node never becomes the leader.
    pub nofailover: bool,
    /// Among equally advanced candidates the higher priority wins; 0 never becomes leader.
    pub priority: u32,
    /// How other members reach this node's replication port: a libpq conninfo
    /// (`host=... port=... user=...`).
    pub conninfo: String,
    /// How other members and operators reach this node's admin API (`http://host:port`).
    pub api_url: String,
    /// Member slots (Patroni's `use_slots`): the leader keeps a physical replication slot for
    /// every other member and the members stream through theirs, so that the WAL a member
    /// behind or down still needs stays on the leader. Off, the actor touches no slot.
    pub use_slots: bool,
    /// How long the leader keeps the slot of a member whose key is gone; `None` is
    /// [`DEFAULT_MEMBER_SLOT_GRACE_TTLS`] times the ttl.
    pub member_slot_grace: Option<Duration>,
    /// The archive a member's walreceiver fills a gap from when the leader it follows has
    /// already removed the WAL it needs (a member behind a new leader's promotion point);
    /// `None` without `archive_target`.
    pub archive: Option<wal_archive::ArchiveTarget>,
    /// The session settings of the walreceiver this member starts when it follows a leader:
    /// the node's own `wal_receiver_timeout`, `wal_receiver_status_interval` and
    /// `synchronous_commit_overlap`. Its slot name is ignored: [`FailoverConfig::follow_config`]
    /// picks the slot per leader.
    pub receiver_session: walreceiver_actor::session::SessionConfig,
}

impl FailoverConfig {
    /// The defaults for everything but where etcd and this node are.
    pub fn new(
        etcd_endpoints: Vec<String>,
        cluster_name: impl Into<String>,
        node_name: impl Into<String>,
        conninfo: impl Into<String>,
        api_url: impl Into<String>,
    ) -> FailoverConfig {
        FailoverConfig {
            etcd_endpoints,
            etcd_security: etcd_gateway::Security::default(),
            cluster_name: cluster_name.into(),
            node_name: node_name.into(),
            ttl: DEFAULT_TTL,
            maximum_lag_on_failover: DEFAULT_MAXIMUM_LAG_ON_FAILOVER,
            synchronous_mode: SynchronousMode::Off,
            nofailover: false,
            priority: 1,
            conninfo: conninfo.into(),
            api_url: api_url.into(),
            use_slots: true,
            member_slot_grace: None,
            archive: None,
            receiver_session: walreceiver_actor::session::SessionConfig::default(),
        }
    }

    /// The walreceiver's configuration for following the leader whose conninfo is
    /// `conninfo`: named by this member's node name (the leader's synchronous standby choice
    /// names it so), with this member's session settings and archive, through `slot` on the
    /// leader.
    pub fn follow_config(
        &self,
        conninfo: &str,
        slot: Option<String>,
    ) -> Result<walreceiver_actor::ReceiverConfig, walreceiver_actor::ReceiverError> {
        let mut upstream = walreceiver_actor::ReceiverConfig::parse(conninfo, None)?;
        upstream.application_name = self.node_name.clone();
        upstream.archive = self.archive.clone();
        upstream.session = walreceiver_actor::session::SessionConfig {
            slot_name: slot,
            ..self.receiver_session.clone()
        };
        Ok(upstream)
    }

    /// A client of etcd as the settings say (endpoints, TLS, user). Reads the TLS files
    /// (blocking file I/O of a few kilobytes, once, before the actor runs).
    pub fn etcd_client(&self) -> Result<etcd_gateway::Client, etcd_gateway::Error> {
        etcd_gateway::Client::with_security(&self.etcd_endpoints, &self.etcd_security)
    }

    /// How long the slot of a member whose key is gone is kept.
    pub fn member_slot_grace(&self) -> Duration {
        self.member_slot_grace
            .unwrap_or(self.ttl.saturating_mul(DEFAULT_MEMBER_SLOT_GRACE_TTLS))
    }
}

/// The leader keeps a departed member's slot this many ttls. A guess: long enough for a
/// restart, a reboot or a short network partition (the member's key goes one ttl after it
/// stops renewing), short enough that a removed member's slot does not hold WAL for long;
/// `max_slot_wal_keep_size` bounds what any slot holds meanwhile.
pub const DEFAULT_MEMBER_SLOT_GRACE_TTLS: u32 = 10;

/// The leader key's lease when the configuration names none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// Patroni's default, 1 MiB.
pub const DEFAULT_MAXIMUM_LAG_ON_FAILOVER: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_followed_leader_is_streamed_from_with_this_members_own_session_settings() {
        let mut config = FailoverConfig::new(
            vec!["http://127.0.0.1:2379".into()],
            "main",
            "n2",
            "host=127.0.0.1 port=5433 user=repl",
            "http://127.0.0.1:8433",
        );
        config.receiver_session.wal_receiver_timeout = Duration::from_millis(1500);
        config.receiver_session.wal_receiver_status_interval = Duration::from_millis(200);
        config.receiver_session.commit_overlap = true;
        config.receiver_session.slot_name = Some("not_this_one".into());

        let upstream = config
            .follow_config(
                "host=10.0.0.1 port=5432 user=repl",
                Some("walserver_n2".into()),
            )
            .unwrap();
        assert_eq!(upstream.application_name, "n2");
        assert_eq!(
            upstream.session.wal_receiver_timeout,
            Duration::from_millis(1500)
        );
        assert_eq!(
            upstream.session.wal_receiver_status_interval,
            Duration::from_millis(200)
        );
        assert!(upstream.session.commit_overlap);
        assert_eq!(upstream.session.slot_name.as_deref(), Some("walserver_n2"));

        let upstream = config.follow_config("host=10.0.0.1", None).unwrap();
        assert_eq!(upstream.session.slot_name, None);
        assert!(config.follow_config("host='unterminated", None).is_err());
    }
}
