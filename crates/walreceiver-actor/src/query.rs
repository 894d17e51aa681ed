//! Replication commands from the client's side: collecting a command's result set, and reading
//! the rows PostgreSQL 15 answers with (IDENTIFY_SYSTEM, TIMELINE_HISTORY, SHOW,
//! READ_REPLICATION_SLOT, and the next-timeline row that ends a historic stream).
//!
//! Rows are read by column position, as libpq's walreceiver does, after checking the number
//! of columns; values are text. A value that does not parse is the upstream's protocol
//! violation, never a panic.

use bytes::Bytes;
use protocol_codec::messages::FieldDescription;
use protocol_codec::BackendMessage;
use wal_storage::{Lsn, SystemId, TimelineId};

use crate::error::ReceiverError;

/// What one command answered, up to its ReadyForQuery.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryResult {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<Bytes>>>,
    /// The CommandComplete tags, in order (START_REPLICATION's end has two).
    pub tags: Vec<String>,
}

/// Gathers the messages of one command's answer.
#[derive(Debug, Default)]
pub struct ResultCollector {
    result: QueryResult,
    error: Option<ReceiverError>,
}

impl ResultCollector {
    /// Takes one message. `Ok(Some(result))` at ReadyForQuery. An ERROR is returned at the
    /// ReadyForQuery that follows it (the connection stays usable), a FATAL at once (the
    /// upstream closes after it). ParameterStatus and NoticeResponse may come at any time and
    /// are skipped.
    pub fn feed(&mut self, msg: BackendMessage) -> Result<Option<QueryResult>, ReceiverError> {
        match msg {
            BackendMessage::RowDescription(fields) => {
                self.result.columns = fields
                    .into_iter()
                    .map(|f: FieldDescription| f.name)
                    .collect();
            }
            BackendMessage::DataRow(values) => self.result.rows.push(values),
            BackendMessage::CommandComplete(tag) => self.result.tags.push(tag),
            BackendMessage::EmptyQueryResponse
            | BackendMessage::ParameterStatus { .. }
            | BackendMessage::NoticeResponse(_) => {}
            BackendMessage::ReadyForQuery(_) => {
                return match self.error.take() {
                    Some(e) => Err(e),
                    None => Ok(Some(std::mem::take(&mut self.result))),
                }
            }
            BackendMessage::ErrorResponse(e) if e.is_fatal() => {
                return Err(ReceiverError::upstream(&e))
            }
            BackendMessage::ErrorResponse(e) => self.error = Some(ReceiverError::upstream(&e)),
            other => {
                return Err(ReceiverError::protocol(format!(
                    "unexpected {} in a command's result",
                    describe(&other)
                )))
            }
        }
        Ok(None)
    }
}

/// A short name of a message for error texts.
pub(crate) fn describe(msg: &BackendMessage) -> &'static str {
    msg.name()
}

impl QueryResult {
    /// The single row of a command that answers one, with at least `columns` values.
    fn single_row(&self, command: &str, columns: usize) -> Result<&[Option<Bytes>], ReceiverError> {
        match self.rows.as_slice() {
            [row] if row.len() >= columns => Ok(row),
            rows => Err(ReceiverError::protocol(format!(
                "could not receive the result of {command}: got {} rows with {} fields, expected 1 row with {columns} or more fields",
                rows.len(),
                rows.first().map_or(0, Vec::len)
            ))),
        }
    }
}

fn text<'a>(value: &'a Option<Bytes>, what: &str) -> Result<&'a str, ReceiverError> {
    let bytes = value
        .as_ref()
        .ok_or_else(|| ReceiverError::protocol(format!("{what} is NULL")))?;
    std::str::from_utf8(bytes).map_err(|_| ReceiverError::protocol(format!("{what} is not text")))
}

fn parse<T: std::str::FromStr>(value: &Option<Bytes>, what: &str) -> Result<T, ReceiverError> {
    let s = text(value, what)?;
    s.trim()
        .parse()
        .map_err(|_| ReceiverError::protocol(format!("invalid {what} {s:?}")))
}

fn timeline(value: &Option<Bytes>, what: &str) -> Result<TimelineId, ReceiverError> {
    let tli: u32 = parse(value, what)?;
    if tli == 0 {
        return Err(ReceiverError::protocol(format!("invalid {what} 0")));
    }
    Ok(TimelineId(tli))
}

/// IDENTIFY_SYSTEM's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemIdentity {
    pub system_id: SystemId,
    pub timeline: TimelineId,
    /// The upstream's current flush position.
    pub xlogpos: Lsn,
}

pub fn identify_system(r: &QueryResult) -> Result<SystemIdentity, ReceiverError> {
    let row = r.single_row("IDENTIFY_SYSTEM", 3)?;
    Ok(SystemIdentity {
        system_id: parse(&row[0], "system identifier")?,
        timeline: timeline(&row[1], "timeline")?,
        xlogpos: parse(&row[2], "xlogpos")?,
    })
}

/// TIMELINE_HISTORY's row: the file's raw bytes, after checking that its name is the one of
/// the timeline asked for.
pub fn timeline_history(r: &QueryResult, tli: TimelineId) -> Result<Bytes, ReceiverError> {
    let row = r.single_row("TIMELINE_HISTORY", 2)?;
    let name = text(&row[0], "history file name")?;
    if wal_storage::parse_history_file_name(name) != Some(tli) {
        return Err(ReceiverError::protocol(format!(
            "TIMELINE_HISTORY {tli} answered with file {name:?}"
        )));
    }
    row[1]
        .clone()
        .ok_or_else(|| ReceiverError::protocol("history file content is NULL"))
}

/// The row that ends a historic timeline's stream: the next timeline and where it starts.
/// `None` when the stream ended without one.
pub fn next_timeline(r: &QueryResult) -> Result<Option<(TimelineId, Lsn)>, ReceiverError> {
    if r.rows.is_empty() {
        return Ok(None);
    }
    let row = r.single_row("the end of streaming", 2)?;
    Ok(Some((
        timeline(&row[0], "next_tli")?,
        parse(&row[1], "next_tli_startpos")?,
    )))
}

/// SHOW's single value.
pub fn show(r: &QueryResult) -> Result<String, ReceiverError> {
    let row = r.single_row("SHOW", 1)?;
    Ok(text(&row[0], "setting")?.to_string())
}

/// READ_REPLICATION_SLOT's row: the slot's restart LSN and timeline, `None` when the slot does
/// not exist or reserves no WAL.
pub fn read_replication_slot(r: &QueryResult) -> Result<Option<(Lsn, TimelineId)>, ReceiverError> {
    let row = r.single_row("READ_REPLICATION_SLOT", 3)?;
    match (&row[1], &row[2]) {
        (Some(_), Some(_)) => Ok(Some((
            parse(&row[1], "restart_lsn")?,
            timeline(&row[2], "restart_tli")?,
        ))),
        _ => Ok(None),
    }
}

/// A size as SHOW prints it (`16MB`, `1GB`, `8192`, `64kB`), in bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..digits].parse().ok()?;
    let unit = match text[digits..].trim() {
        "" | "B" => 1,
        "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol_codec::messages::TransactionStatus;
    use protocol_codec::{results, ErrorFields, SqlState};

    fn collect(msgs: Vec<BackendMessage>) -> Result<QueryResult, ReceiverError> {
        let mut c = ResultCollector::default();
        for m in msgs {
            if let Some(r) = c.feed(m)? {
                return Ok(r);
            }
        }
        panic!("no ReadyForQuery");
    }

    fn with_ready(mut msgs: Vec<BackendMessage>) -> Vec<BackendMessage> {
        msgs.push(BackendMessage::ReadyForQuery(TransactionStatus::Idle));
        msgs
    }

    #[test]
    fn reads_what_walsender_results_build() {
        let r = collect(with_ready(results::identify_system(
            SystemId(7713831534704266365),
            TimelineId(2),
            Lsn(0x5046A30),
            None,
        )))
        .unwrap();
        assert_eq!(
            identify_system(&r).unwrap(),
            SystemIdentity {
                system_id: SystemId(7713831534704266365),
                timeline: TimelineId(2),
                xlogpos: Lsn(0x5046A30),
            }
        );
        let content = Bytes::from_static(b"1\t0/5046A00\tno recovery target specified\n");
        let r = collect(with_ready(results::timeline_history(
            TimelineId(2),
            content.clone(),
        )))
        .unwrap();
        assert_eq!(timeline_history(&r, TimelineId(2)).unwrap(), content);
        assert!(timeline_history(&r, TimelineId(3)).is_err());

        let mut end = results::end_of_timeline(TimelineId(2), Lsn(0x5046A00));
        end.extend(results::end_of_streaming());
        // PostgreSQL slips a ParameterStatus in before ReadyForQuery at a promotion.
        end.push(BackendMessage::ParameterStatus {
            name: "in_hot_standby".into(),
            value: "off".into(),
        });
        let r = collect(with_ready(end)).unwrap();
        assert_eq!(
            next_timeline(&r).unwrap(),
            Some((TimelineId(2), Lsn(0x5046A00)))
        );
        assert_eq!(r.tags, ["START_STREAMING", "START_REPLICATION"]);

        let r = collect(with_ready(results::show("wal_segment_size", "16MB"))).unwrap();
        assert_eq!(show(&r).unwrap(), "16MB");

        let r = collect(with_ready(results::read_replication_slot(None))).unwrap();
        assert_eq!(read_replication_slot(&r).unwrap(), None);
        let slot = results::ReadSlot {
            slot_type: "physical".into(),
            restart_lsn: Some(Lsn(0x3000128)),
            restart_tli: Some(TimelineId(1)),
        };
        let r = collect(with_ready(results::read_replication_slot(Some(&slot)))).unwrap();
        assert_eq!(
            read_replication_slot(&r).unwrap(),
            Some((Lsn(0x3000128), TimelineId(1)))
        );
    }

    #[test]
    fn errors_and_garbage_are_errors() {
        let e = collect(with_ready(vec![
            results::timeline_history_description(),
            BackendMessage::ErrorResponse(ErrorFields::error(
                SqlState::UNDEFINED_FILE,
                "could not open file",
            )),
        ]))
        .unwrap_err();
        assert_eq!(e.sqlstate(), Some("58P01"));
        // A FATAL needs no ReadyForQuery: the upstream closes after it.
        let mut c = ResultCollector::default();
        let e = c
            .feed(BackendMessage::ErrorResponse(ErrorFields::fatal(
                SqlState::ADMIN_SHUTDOWN,
                "terminating connection due to administrator command",
            )))
            .unwrap_err();
        assert_eq!(e.sqlstate(), Some("57P01"));
        let bad = QueryResult {
            columns: vec![],
            rows: vec![vec![
                Some(Bytes::from_static(b"x")),
                Some(Bytes::from_static(b"1")),
                None,
            ]],
            tags: vec![],
        };
        assert!(matches!(
            identify_system(&bad),
            Err(ReceiverError::Protocol { .. })
        ));
        assert!(matches!(
            identify_system(&QueryResult::default()),
            Err(ReceiverError::Protocol { .. })
        ));
        let mut c = ResultCollector::default();
        assert!(c.feed(BackendMessage::CopyDone).is_err());
    }

    #[test]
    fn sizes_as_show_prints_them() {
        assert_eq!(parse_size("16MB"), Some(16 << 20));
        assert_eq!(parse_size("1GB"), Some(1 << 30));
        assert_eq!(parse_size("64kB"), Some(64 << 10));
        assert_eq!(parse_size("8192"), Some(8192));
        assert_eq!(parse_size("16 MB"), Some(16 << 20));
        assert_eq!(parse_size("MB"), None);
        assert_eq!(parse_size("16XB"), None);
    }
}
