//! The result sets PostgreSQL 15 answers replication commands with, byte for byte as the
//! captures in `testdata/pg15-captures` show them.
//!
//! Each function returns the messages of one answer (RowDescription, DataRow, and
//! CommandComplete where PostgreSQL sends one there); the caller sends ReadyForQuery after
//! them. All values are in text format. Column shapes, as PostgreSQL 15 sends them:
//!
//! | command | columns (type oid / typlen / typmod) |
//! |---|---|
//! | IDENTIFY_SYSTEM | systemid text, timeline int4 (23/4/-1), xlogpos text, dbname text |
//! | SHOW x | x text |
//! | TIMELINE_HISTORY | filename text, content text, both with typmod **0** (25/-1/0) |
//! | CREATE_REPLICATION_SLOT | slot_name, consistent_point, snapshot_name, output_plugin: text |
//! | READ_REPLICATION_SLOT | slot_type text, restart_lsn text, restart_tli int8 (20/8/-1) |
//! | end of timeline | next_tli int8, next_tli_startpos text |
//!
//! text is 25/-1/-1 unless noted; table oid, column number and format are 0 everywhere.

use bytes::Bytes;
use wal_types::{Lsn, SystemId, TimelineId};

use crate::messages::{BackendMessage, FieldDescription};

pub const TEXT_OID: u32 = 25;
pub const INT4_OID: u32 = 23;
pub const INT8_OID: u32 = 20;

fn column(name: &str, type_oid: u32, type_len: i16, type_modifier: i32) -> FieldDescription {
    FieldDescription {
        name: name.to_string(),
        table_oid: 0,
        column_id: 0,
        type_oid,
        type_len,
        type_modifier,
        format: 0,
    }
}

fn text(name: &str) -> FieldDescription {
    column(name, TEXT_OID, -1, -1)
}

fn int4(name: &str) -> FieldDescription {
    column(name, INT4_OID, 4, -1)
}

fn int8(name: &str) -> FieldDescription {
    column(name, INT8_OID, 8, -1)
}

fn value(v: impl ToString) -> Option<Bytes> {
    Some(Bytes::from(v.to_string()))
}

fn complete(tag: &str) -> BackendMessage {
    BackendMessage::CommandComplete(tag.to_string())
}

/// IDENTIFY_SYSTEM: one row; `dbname` is NULL on a physical replication connection.
pub fn identify_system(
    system_id: SystemId,
    timeline: TimelineId,
    xlogpos: Lsn,
    dbname: Option<&str>,
) -> Vec<BackendMessage> {
    vec![
        BackendMessage::RowDescription(vec![
            text("systemid"),
            int4("timeline"),
            text("xlogpos"),
            text("dbname"),
        ]),
        BackendMessage::DataRow(vec![
            value(system_id),
            value(timeline),
            value(xlogpos),
            dbname.and_then(value),
        ]),
        complete("IDENTIFY_SYSTEM"),
    ]
}

/// SHOW: one text column named after the setting (in its canonical spelling, such as
/// `TimeZone`), one row.
pub fn show(name: &str, value_text: &str) -> Vec<BackendMessage> {
    vec![
        BackendMessage::RowDescription(vec![text(name)]),
        BackendMessage::DataRow(vec![value(value_text)]),
        complete("SHOW"),
    ]
}

/// The name of a timeline's history file, `%08X.history`.
pub fn timeline_history_filename(timeline: TimelineId) -> String {
    format!("{:08X}.history", timeline.0)
}

/// TIMELINE_HISTORY's RowDescription alone. PostgreSQL sends it before it opens the file, so
/// a missing file is this followed by ERROR 58P01.
pub fn timeline_history_description() -> BackendMessage {
    BackendMessage::RowDescription(vec![
        column("filename", TEXT_OID, -1, 0),
        column("content", TEXT_OID, -1, 0),
    ])
}

/// TIMELINE_HISTORY: the file's name and its raw bytes.
pub fn timeline_history(timeline: TimelineId, content: Bytes) -> Vec<BackendMessage> {
    vec![
        timeline_history_description(),
        BackendMessage::DataRow(vec![
            value(timeline_history_filename(timeline)),
            Some(content),
        ]),
        complete("TIMELINE_HISTORY"),
    ]
}

/// CREATE_REPLICATION_SLOT. For a physical slot PostgreSQL 15 reports `consistent_point` 0/0
/// (even with RESERVE_WAL) and NULL snapshot and plugin.
pub fn create_replication_slot(
    slot_name: &str,
    consistent_point: Lsn,
    snapshot_name: Option<&str>,
    output_plugin: Option<&str>,
) -> Vec<BackendMessage> {
    vec![
        BackendMessage::RowDescription(vec![
            text("slot_name"),
            text("consistent_point"),
            text("snapshot_name"),
            text("output_plugin"),
        ]),
        BackendMessage::DataRow(vec![
            value(slot_name),
            value(consistent_point),
            snapshot_name.and_then(value),
            output_plugin.and_then(value),
        ]),
        complete("CREATE_REPLICATION_SLOT"),
    ]
}

/// What READ_REPLICATION_SLOT reports about an existing slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadSlot {
    /// `physical` (a logical slot is refused with 0A000 before this point).
    pub slot_type: String,
    /// NULL when the slot reserves no WAL.
    pub restart_lsn: Option<Lsn>,
    /// NULL when `restart_lsn` is.
    pub restart_tli: Option<TimelineId>,
}

/// READ_REPLICATION_SLOT: one row, all NULL for a slot that does not exist (not an error).
pub fn read_replication_slot(slot: Option<&ReadSlot>) -> Vec<BackendMessage> {
    let row = match slot {
        None => vec![None, None, None],
        Some(s) => vec![
            value(&s.slot_type),
            s.restart_lsn.and_then(value),
            s.restart_tli.and_then(value),
        ],
    };
    vec![
        BackendMessage::RowDescription(vec![
            text("slot_type"),
            text("restart_lsn"),
            int8("restart_tli"),
        ]),
        BackendMessage::DataRow(row),
        complete("READ_REPLICATION_SLOT"),
    ]
}

/// DROP_REPLICATION_SLOT: no rows.
pub fn drop_replication_slot() -> Vec<BackendMessage> {
    vec![complete("DROP_REPLICATION_SLOT")]
}

/// The end of a historic timeline's stream, sent after both sides' CopyDone: where the next
/// timeline starts. [`end_of_streaming`] follows it.
pub fn end_of_timeline(next_tli: TimelineId, next_tli_startpos: Lsn) -> Vec<BackendMessage> {
    vec![
        BackendMessage::RowDescription(vec![int8("next_tli"), text("next_tli_startpos")]),
        BackendMessage::DataRow(vec![value(next_tli), value(next_tli_startpos)]),
    ]
}

/// What closes a START_REPLICATION once copy mode has ended: two CommandCompletes, both
/// required by libpq's walreceiver (`libpqrcv_endstreaming`). ReadyForQuery follows.
pub fn end_of_streaming() -> Vec<BackendMessage> {
    vec![complete("START_STREAMING"), complete("START_REPLICATION")]
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;

    use super::*;
    use crate::test_util::hex;

    /// The messages encode to exactly `expected` (hex, one message per string).
    fn check(messages: Vec<BackendMessage>, expected: &[&str]) {
        let mut out = BytesMut::new();
        for m in &messages {
            m.encode(&mut out).unwrap();
        }
        let want: Vec<u8> = expected.iter().flat_map(|h| hex(h)).collect();
        assert_eq!(out.to_vec(), want, "{messages:?}");
    }

    // The vectors are pg_receivewal-scram.1.jsonl's server messages.

    #[test]
    fn identify_system_matches_postgresql_15() {
        check(
            identify_system(
                SystemId(7713831534704266365),
                TimelineId(1),
                Lsn(0x15012F0),
                None,
            ),
            &[
                "540000006f000473797374656d69640000000000000000000019ffffffffffff000074696d656c696e6500000000000000000000170004ffffffff0000786c6f67706f730000000000000000000019ffffffffffff000064626e616d650000000000000000000019ffffffffffff0000",
                "440000003300040000001337373133383331353334373034323636333635000000013100000009302f31353031324630ffffffff",
                "43000000144944454e544946595f53595354454d00",
            ],
        );
    }

    #[test]
    fn show_matches_postgresql_15() {
        check(
            show("data_directory_mode", "0700"),
            &[
                "540000002c0001646174615f6469726563746f72795f6d6f64650000000000000000000019ffffffffffff0000",
                "440000000e00010000000430373030",
                "430000000953484f5700",
            ],
        );
    }

    #[test]
    fn create_replication_slot_matches_postgresql_15() {
        check(
            create_replication_slot("capslot", Lsn(0), None, None),
            &[
                "54000000850004736c6f745f6e616d650000000000000000000019ffffffffffff0000636f6e73697374656e745f706f696e740000000000000000000019ffffffffffff0000736e617073686f745f6e616d650000000000000000000019ffffffffffff00006f75747075745f706c7567696e0000000000000000000019ffffffffffff0000",
                "4400000020000400000007636170736c6f7400000003302f30ffffffffffffffff",
                "430000001c4352454154455f5245504c49434154494f4e5f534c4f5400",
            ],
        );
    }

    #[test]
    fn shapes() {
        let Some(BackendMessage::RowDescription(cols)) = timeline_history(
            TimelineId(2),
            Bytes::from_static(b"1\t0/5046A00\tno recovery target specified\n"),
        )
        .into_iter()
        .next() else {
            panic!()
        };
        assert!(cols
            .iter()
            .all(|c| c.type_oid == TEXT_OID && c.type_modifier == 0));
        assert_eq!(
            timeline_history_filename(TimelineId(0x1A)),
            "0000001A.history"
        );

        let missing = read_replication_slot(None);
        assert_eq!(missing[1], BackendMessage::DataRow(vec![None, None, None]));
        let slot = ReadSlot {
            slot_type: "physical".into(),
            restart_lsn: Some(Lsn(0x100_0000)),
            restart_tli: Some(TimelineId(1)),
        };
        let found = read_replication_slot(Some(&slot));
        assert_eq!(
            found[1],
            BackendMessage::DataRow(vec![
                Some(Bytes::from_static(b"physical")),
                Some(Bytes::from_static(b"0/1000000")),
                Some(Bytes::from_static(b"1")),
            ])
        );
        let eot = end_of_timeline(TimelineId(2), Lsn(0x5046A00));
        let BackendMessage::RowDescription(cols) = &eot[0] else {
            panic!()
        };
        assert_eq!((cols[0].type_oid, cols[0].type_len), (INT8_OID, 8));
        assert_eq!(
            end_of_streaming(),
            vec![
                BackendMessage::CommandComplete("START_STREAMING".into()),
                BackendMessage::CommandComplete("START_REPLICATION".into()),
            ]
        );
    }
}
