//! What a walreceiver shows about itself: the facts of PostgreSQL's `pg_stat_wal_receiver`,
//! with its column names. LSNs serialize as `X/X` and times as pg_stat_replication's rows
//! show theirs.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use wal_storage::{Lsn, TimelineId};
use wal_types::time::{de_opt_time, ser_opt_time};

/// `pg_stat_wal_receiver.status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReceiverState {
    /// Connecting, authenticating, identifying the upstream, fetching history files.
    Starting,
    /// In a COPY stream, receiving WAL.
    Streaming,
    /// Between streams: a timeline ended and the next one is being followed, or a gap the
    /// upstream no longer has is being filled from the archive.
    Waiting,
    /// Asked to stop.
    Stopping,
}

/// One walreceiver's row of `pg_stat_wal_receiver`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiverStatus {
    pub status: ReceiverState,
    /// Where the current (or last) stream began, and on which timeline.
    pub receive_start_lsn: Option<Lsn>,
    pub receive_start_tli: Option<TimelineId>,
    /// The end of the WAL handed to storage (written, maybe not yet durable).
    pub written_lsn: Option<Lsn>,
    /// The end of the durable WAL, reported to the upstream as flushed.
    pub flushed_lsn: Option<Lsn>,
    /// The timeline of `flushed_lsn`.
    pub received_tli: Option<TimelineId>,
    /// The send time the upstream put on its last message, and when it arrived.
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub last_msg_send_time: Option<SystemTime>,
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub last_msg_receipt_time: Option<SystemTime>,
    /// The last WAL end the upstream reported (XLogData and keepalives), and its send time.
    pub latest_end_lsn: Option<Lsn>,
    #[serde(serialize_with = "ser_opt_time", deserialize_with = "de_opt_time")]
    pub latest_end_time: Option<SystemTime>,
    pub slot_name: Option<String>,
    pub sender_host: Option<String>,
    pub sender_port: Option<u16>,
    /// `primary_conninfo` without the password.
    pub conninfo: String,
}

impl ReceiverStatus {
    pub fn new(conninfo: String, slot_name: Option<String>) -> ReceiverStatus {
        ReceiverStatus {
            status: ReceiverState::Starting,
            receive_start_lsn: None,
            receive_start_tli: None,
            written_lsn: None,
            flushed_lsn: None,
            received_tli: None,
            last_msg_send_time: None,
            last_msg_receipt_time: None,
            latest_end_lsn: None,
            latest_end_time: None,
            slot_name,
            sender_host: None,
            sender_port: None,
            conninfo,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn json_uses_pg_stat_wal_receiver_names() {
        let mut st = ReceiverStatus::new("host=a port=5432 user=r".into(), Some("s1".into()));
        st.status = ReceiverState::Streaming;
        st.receive_start_lsn = Some(Lsn(0x100_0000));
        st.receive_start_tli = Some(TimelineId(2));
        st.flushed_lsn = Some(Lsn(0x1_0000_0060));
        st.last_msg_receipt_time =
            Some(SystemTime::UNIX_EPOCH + Duration::from_micros(1_796_000_000_123_456));
        let v = serde_json::to_value(&st).unwrap();
        assert_eq!(v["status"], "streaming");
        assert_eq!(v["receive_start_lsn"], "0/1000000");
        assert_eq!(v["receive_start_tli"], 2);
        assert_eq!(v["flushed_lsn"], "1/60");
        assert_eq!(v["written_lsn"], serde_json::Value::Null);
        assert_eq!(v["last_msg_receipt_time"], "2026-11-30 00:53:20.123456+00");
        assert_eq!(v["slot_name"], "s1");
        assert_eq!(v["conninfo"], "host=a port=5432 user=r");
    }
}
