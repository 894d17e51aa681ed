//! A walreceiver's configuration, with PostgreSQL's knob names.

use protocol_codec::conninfo::ConnInfo;
use wal_archive::ArchiveTarget;

use crate::error::ReceiverError;
use crate::session::SessionConfig;

/// The default bound on WAL received but not yet durable. A guess that leaves storage's group
/// commit whole batches to work with (its writer takes up to a few MiB per fsync) while
/// bounding a walreceiver's memory; the bench in `benches/receive.rs` measures it.
pub const DEFAULT_MAX_WAL_IN_FLIGHT: usize = 32 << 20;

/// Everything a walreceiver needs to know, fixed for its lifetime: a reload that changes any
/// of it stops the walreceiver and starts a new one.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// `primary_conninfo`, parsed.
    pub conninfo: ConnInfo,
    /// Sent in the startup packet: the conninfo's, else `cluster_name`, else `walreceiver`.
    pub application_name: String,
    /// `primary_slot_name`, the timeouts and the apply reporting.
    pub session: SessionConfig,
    /// The most WAL received but not yet durable, in bytes; reading the socket pauses above
    /// it. At most 4 GiB.
    pub max_wal_in_flight: usize,
    /// The archive a gap is filled from when the upstream has already removed the WAL this
    /// node needs (`gap.rs`); `None` leaves such a gap an error.
    pub archive: Option<ArchiveTarget>,
}

impl ReceiverConfig {
    /// The defaults of PostgreSQL 15 (`wal_receiver_timeout` 60 s,
    /// `wal_receiver_status_interval` 10 s, no slot) for `conninfo`.
    pub fn new(conninfo: ConnInfo, cluster_name: Option<&str>) -> ReceiverConfig {
        let application_name = conninfo
            .application_name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| cluster_name.filter(|n| !n.is_empty()).map(str::to_string))
            .unwrap_or_else(|| "walreceiver".to_string());
        ReceiverConfig {
            conninfo,
            application_name,
            session: SessionConfig::default(),
            max_wal_in_flight: DEFAULT_MAX_WAL_IN_FLIGHT,
            archive: None,
        }
    }

    /// [`ReceiverConfig::new`] from a `primary_conninfo` string (key=value or URI), with what
    /// it leaves out taken from this process's environment as libpq takes it (`PGHOST`,
    /// `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGSSLMODE`, ...: [`protocol_codec::conninfo::ENV_DEFAULTS`]),
    /// as PostgreSQL's walreceiver, through libpq, does.
    pub fn parse(
        primary_conninfo: &str,
        cluster_name: Option<&str>,
    ) -> Result<ReceiverConfig, ReceiverError> {
        Ok(ReceiverConfig::new(
            ConnInfo::parse_with_env(primary_conninfo, |var| std::env::var(var).ok())?,
            cluster_name,
        ))
    }

    pub(crate) fn max_wal_in_flight(&self) -> usize {
        self.max_wal_in_flight.clamp(1, u32::MAX as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_name_defaults_as_postgres_does() {
        let c = ReceiverConfig::parse("host=h port=5433 user=r", None).unwrap();
        assert_eq!(c.application_name, "walreceiver");
        let c = ReceiverConfig::parse("host=h user=r", Some("node_b")).unwrap();
        assert_eq!(c.application_name, "node_b");
        let c =
            ReceiverConfig::parse("host=h user=r application_name=mine", Some("node_b")).unwrap();
        assert_eq!(c.application_name, "mine");
        assert!(matches!(
            ReceiverConfig::parse("host=h bogus=1", None),
            Err(ReceiverError::InvalidConnInfo { .. })
        ));
    }
}
