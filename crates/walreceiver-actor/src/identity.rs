//! Making a standby: what a new standby's data directory adopts from its upstream.
//!
//! [`fetch_upstream_identity`] asks the upstream who it is (IDENTIFY_SYSTEM), its segment size
//! (SHOW wal_segment_size), every history file of its timeline's ancestry (TIMELINE_HISTORY),
//! and, when a slot is named, where the slot holds WAL from (READ_REPLICATION_SLOT), over one
//! short replication connection. [`init_standby`] turns the answer into a data directory whose
//! WAL begins at the start of the upstream's current segment (or of the slot's restart
//! segment), as pg_receivewal and PostgreSQL's walreceiver round their start points down.

use std::path::Path;

use protocol_codec::command::ReplicationCommand;
use protocol_codec::conninfo::ConnInfo;
use serde::Serialize;
use wal_storage::{
    parse_history, HistoryEntry, InitOptions, Lsn, Role, StorageConfig, SystemId, TimelineId, Wal,
    WalFormat,
};

use crate::connect::{connect, setup_timeout, Connection};
use crate::error::ReceiverError;
use crate::query;

/// The suffix walserver's walsender puts on `server_version` (see
/// [`protocol_codec::SERVER_VERSION`]); any other server is PostgreSQL.
pub const WALSERVER_VERSION_SUFFIX: &str = "(walserver)";

/// What a new standby adopts from its upstream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UpstreamIdentity {
    pub system_id: SystemId,
    /// The upstream's current timeline.
    pub timeline: TimelineId,
    /// The upstream's flush position when asked.
    pub xlogpos: Lsn,
    pub segment_size: u64,
    /// walserver records, or PostgreSQL WAL.
    pub format: WalFormat,
    pub server_version: String,
    /// The history files of timelines 2 up to `timeline`, byte for byte.
    #[serde(skip)]
    pub history_files: Vec<(TimelineId, Vec<u8>)>,
    /// The ancestry of `timeline`, oldest first (empty on timeline 1).
    pub history: Vec<HistoryEntry>,
    /// The named slot's restart LSN and timeline, if it reserves WAL.
    pub slot_restart: Option<(Lsn, TimelineId)>,
}

impl UpstreamIdentity {
    /// Where a new standby's WAL starts: the start of the segment of the slot's restart LSN,
    /// or else of the upstream's flush position (never 0/0, which means "no position").
    pub fn start_lsn(&self) -> Lsn {
        let from = self.slot_restart.map_or(self.xlogpos, |(lsn, _)| lsn);
        from.segment_start(self.segment_size)
            .max(Lsn(self.segment_size))
    }

    /// The timeline that holds [`UpstreamIdentity::start_lsn`], and its ancestry. A start on
    /// an older timeline than the upstream's (a slot behind a switch) starts there, and the
    /// walreceiver follows the switch as it streams.
    pub fn start_timeline(&self) -> (TimelineId, Vec<HistoryEntry>) {
        let start = self.start_lsn();
        // A timeline's switch segment belongs to the new timeline too (it is copied there), so
        // a start at the segment that holds a switch point may start on the new timeline.
        match self
            .history
            .iter()
            .position(|e| start < e.switch_lsn.segment_start(self.segment_size))
        {
            Some(i) => (self.history[i].parent, self.history[..i].to_vec()),
            None => (self.timeline, self.history.clone()),
        }
    }

    /// How [`Wal::init`] makes the standby's data directory.
    pub fn init_options(&self) -> InitOptions {
        let (timeline, history) = self.start_timeline();
        InitOptions {
            system_id: self.system_id,
            format: self.format,
            timeline,
            start_lsn: Some(self.start_lsn()),
            history,
            history_files: self.history_files.clone(),
            role: Role::Standby,
        }
    }
}

/// Asks the upstream `conninfo` names who it is; see the module docs. `slot_name` is
/// `primary_slot_name`, if any. `connect_timeout` in `conninfo` bounds the connection setup.
pub async fn fetch_upstream_identity(
    conninfo: &ConnInfo,
    slot_name: Option<&str>,
    application_name: &str,
) -> Result<UpstreamIdentity, ReceiverError> {
    let mut conn = connect(conninfo, application_name, setup_timeout(conninfo, None)).await?;
    let result = identify(&mut conn, slot_name).await;
    conn.close().await;
    result
}

async fn identify(
    conn: &mut Connection,
    slot_name: Option<&str>,
) -> Result<UpstreamIdentity, ReceiverError> {
    let server_version = conn.param("server_version").unwrap_or_default().to_string();
    let format = if server_version
        .trim_end()
        .ends_with(WALSERVER_VERSION_SUFFIX)
    {
        walserver_format(conn).await?
    } else {
        WalFormat::Postgres
    };
    let id = query::identify_system(
        &conn
            .simple_query(&ReplicationCommand::IdentifySystem.to_string())
            .await?,
    )?;
    let show = ReplicationCommand::Show {
        name: "wal_segment_size".into(),
    };
    let size_text = query::show(&conn.simple_query(&show.to_string()).await?)?;
    let segment_size = query::parse_size(&size_text)
        .filter(|s| s.is_power_of_two())
        .ok_or_else(|| {
            ReceiverError::protocol(format!("invalid wal_segment_size {size_text:?}"))
        })?;
    let mut history_files = Vec::new();
    for t in 2..=id.timeline.0 {
        let timeline = TimelineId(t);
        let r = conn
            .simple_query(&ReplicationCommand::TimelineHistory { timeline }.to_string())
            .await?;
        history_files.push((timeline, query::timeline_history(&r, timeline)?.to_vec()));
    }
    let history = match history_files.last() {
        Some((t, bytes)) => parse_history(bytes)
            .map_err(|e| ReceiverError::protocol(format!("history file of timeline {t}: {e}")))?,
        None => Vec::new(),
    };
    let slot_restart = match slot_name {
        None => None,
        Some(name) => {
            let r = conn
                .simple_query(
                    &ReplicationCommand::ReadReplicationSlot {
                        slot_name: name.to_string(),
                    }
                    .to_string(),
                )
                .await?;
            if r.rows
                .first()
                .and_then(|row| row.first())
                .is_none_or(Option::is_none)
            {
                return Err(ReceiverError::Upstream {
                    severity: "ERROR".into(),
                    sqlstate: "42704".into(),
                    message: format!("replication slot \"{name}\" does not exist"),
                    detail: None,
                });
            }
            query::read_replication_slot(&r)?
        }
    };
    Ok(UpstreamIdentity {
        system_id: id.system_id,
        timeline: id.timeline,
        xlogpos: id.xlogpos,
        segment_size,
        format,
        server_version,
        history_files,
        history,
        slot_restart,
    })
}

/// A walserver upstream's kind of WAL: `SHOW wal_format` if it answers (a walserver standby
/// that relays PostgreSQL WAL says `postgresql`), else walserver records.
async fn walserver_format(conn: &mut Connection) -> Result<WalFormat, ReceiverError> {
    let show = ReplicationCommand::Show {
        name: "wal_format".into(),
    };
    match conn.simple_query(&show.to_string()).await {
        Ok(r) => match query::show(&r)?.as_str() {
            "postgresql" => Ok(WalFormat::Postgres),
            "walserver" => Ok(WalFormat::Walserver),
            other => Err(ReceiverError::protocol(format!(
                "unknown wal_format {other:?}"
            ))),
        },
        Err(e) if e.sqlstate() == Some("42704") => Ok(WalFormat::Walserver),
        Err(e) => Err(e),
    }
}

/// Creates a standby's data directory in `dir` from `identity`: its system identifier, kind
/// of WAL, segment size (overriding `cfg`'s), history files and start. Blocking (it fsyncs):
/// call it on a blocking thread from async code.
pub fn init_standby(
    dir: impl AsRef<Path>,
    mut cfg: StorageConfig,
    identity: &UpstreamIdentity,
) -> Result<Wal, ReceiverError> {
    cfg.segment_size = identity.segment_size;
    Wal::init(dir, cfg, identity.init_options()).map_err(|e| ReceiverError::Storage {
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(
        xlogpos: u64,
        history: Vec<(u32, u64)>,
        slot: Option<(u64, u32)>,
    ) -> UpstreamIdentity {
        let history: Vec<HistoryEntry> = history
            .into_iter()
            .map(|(p, s)| HistoryEntry {
                parent: TimelineId(p),
                switch_lsn: Lsn(s),
                reason: "promoted".into(),
            })
            .collect();
        UpstreamIdentity {
            system_id: SystemId(42),
            timeline: TimelineId(history.len() as u32 + 1),
            xlogpos: Lsn(xlogpos),
            segment_size: 16 << 20,
            format: WalFormat::Postgres,
            server_version: "15.18".into(),
            history_files: Vec::new(),
            history,
            slot_restart: slot.map(|(l, t)| (Lsn(l), TimelineId(t))),
        }
    }

    #[test]
    fn our_walsender_is_told_from_postgresql() {
        assert!(protocol_codec::SERVER_VERSION.ends_with(WALSERVER_VERSION_SUFFIX));
    }

    #[test]
    fn starts_at_the_segment_of_the_flush_position_or_the_slot() {
        let id = identity(0x5046A30, vec![], None);
        assert_eq!(id.start_lsn(), Lsn(0x500_0000));
        assert_eq!(id.start_timeline(), (TimelineId(1), vec![]));
        let id = identity(0x5046A30, vec![], Some((0x3000128, 1)));
        assert_eq!(id.start_lsn(), Lsn(0x300_0000));
        // Never 0/0.
        assert_eq!(identity(0x28, vec![], None).start_lsn(), Lsn(0x100_0000));
    }

    #[test]
    fn a_start_behind_a_switch_starts_on_the_old_timeline() {
        let id = identity(
            0x9000000,
            vec![(1, 0x4025A50), (2, 0x7000000)],
            Some((0x3000000, 1)),
        );
        let (tli, history) = id.start_timeline();
        assert_eq!(tli, TimelineId(1));
        assert!(history.is_empty());
        let id = identity(
            0x9000000,
            vec![(1, 0x4025A50), (2, 0x7000000)],
            Some((0x4000000, 1)),
        );
        // The switch segment holds both timelines; the newer one may start there.
        assert_eq!(id.start_timeline().0, TimelineId(2));
        let id = identity(0x9000000, vec![(1, 0x4025A50), (2, 0x7000000)], None);
        assert_eq!(id.start_timeline(), (TimelineId(3), id.history.clone()));
        let opts = id.init_options();
        assert_eq!(opts.start_lsn, Some(Lsn(0x900_0000)));
        assert_eq!(opts.timeline, TimelineId(3));
    }
}
