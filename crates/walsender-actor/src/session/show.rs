//! `SHOW`: what a walsender answers, and how the values are gathered.
//!
//! The values are the node's: facts of its storage that PostgreSQL 15's clients ask for
//! ([`base_show_values`]), with the configured ones laid over them ([`merge_show_values`]).
//! The supervisor builds the list once per configuration; the session only looks names up in
//! it ([`answer`]), case-insensitively as PostgreSQL does, after the parameters the client set
//! when it connected ([`answer_for`]).

use protocol_codec::client_settings::ClientSettings;
use protocol_codec::pg15_parameters;
use protocol_codec::{results, BackendMessage, ErrorFields, SqlState};
use wal_storage::WalFormat;

use crate::startup::on_off;

/// The answer to `SHOW name` on a connection whose client set `client` and whose socket has
/// `socket` (its keepalive timing, which PostgreSQL shows as the socket has it, whoever set
/// it): the socket's value, else the connection's user (`user`: `session_authorization`), else
/// the client's value if it set one (in PostgreSQL's form, as `ClientSettings` keeps it), else
/// the node's role now (`role`, from [`role_values`]), else the node's configured value from
/// `values`.
pub(super) fn answer_for(
    client: &ClientSettings,
    socket: &[(String, String)],
    user: &[(String, String)],
    role: &[(String, String)],
    values: &[(String, String)],
    name: &str,
) -> Result<Vec<BackendMessage>, ErrorFields> {
    if let Some((canonical, value)) = find(socket, name).or_else(|| find(user, name)) {
        return Ok(results::show(canonical, value));
    }
    // The column is named as PostgreSQL spells the parameter (`DateStyle`), or a custom one
    // as the client first spelt it, as PostgreSQL names a placeholder.
    if let Some(value) = client.get(name) {
        let column = pg15_parameters::spelling(name)
            .or_else(|| find(client.values(), name).map(|(n, _)| n.as_str()))
            .unwrap_or(name);
        return Ok(results::show(column, value));
    }
    match find(role, name) {
        Some((canonical, value)) => Ok(results::show(canonical, value)),
        None => answer(values, name),
    }
}

/// The entry of `values` named `name`, compared as PostgreSQL compares parameter names
/// (case-insensitively).
fn find<'a>(values: &'a [(String, String)], name: &str) -> Option<&'a (String, String)> {
    values.iter().find(|(n, _)| n.eq_ignore_ascii_case(name))
}

/// What SHOW answers for the parameters that follow the node's role, as PostgreSQL 15 answers
/// them: a standby is `in_hot_standby` and its transactions are read-only; a primary whose
/// failover fence is closed (`read_only`) is not a standby, but takes no writes, so its
/// default (and so every) transaction is read-only; any other primary is neither.
pub fn role_values(in_hot_standby: bool, read_only: bool) -> Vec<(String, String)> {
    [
        ("in_hot_standby", in_hot_standby),
        ("default_transaction_read_only", read_only),
        ("transaction_read_only", in_hot_standby || read_only),
    ]
    .into_iter()
    .map(|(name, on)| (name.to_string(), on_off(on).to_string()))
    .collect()
}

/// The SHOW values every walserver node answers, from facts of its storage: what PostgreSQL
/// 15's clients ask for (pg_receivewal: `wal_segment_size`, `data_directory_mode`) and what
/// identifies the server. Configured values are laid over these.
pub fn base_show_values(segment_size: u64, wal_format: WalFormat) -> Vec<(String, String)> {
    let size = if segment_size.is_multiple_of(1 << 30) {
        format!("{}GB", segment_size >> 30)
    } else {
        format!("{}MB", segment_size >> 20)
    };
    [
        ("wal_segment_size", size.as_str()),
        ("data_directory_mode", "0700"),
        ("application_name", ""),
        ("server_version", protocol_codec::SERVER_VERSION),
        ("server_version_num", "150000"),
        ("server_encoding", "SQL_ASCII"),
        ("client_encoding", "SQL_ASCII"),
        ("integer_datetimes", "on"),
        ("TimeZone", "Etc/UTC"),
        ("DateStyle", "ISO, MDY"),
        ("IntervalStyle", "postgres"),
        // What the greeting reports: walserver's users may do all a replication connection can.
        ("is_superuser", "on"),
        ("standard_conforming_strings", "on"),
        ("block_size", "8192"),
        ("wal_block_size", "8192"),
        ("wal_level", "replica"),
        ("wal_format", &wal_format.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// `base` with `overrides` laid over it, names compared case-insensitively.
pub fn merge_show_values(
    base: Vec<(String, String)>,
    overrides: &[(String, String)],
) -> Vec<(String, String)> {
    let mut out = base;
    for (k, v) in overrides {
        match out.iter_mut().find(|(n, _)| n.eq_ignore_ascii_case(k)) {
            Some(slot) => slot.1 = v.clone(),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

/// The answer to `SHOW name`: the value's result set, or 42704 for a name not in `values`.
pub fn answer(values: &[(String, String)], name: &str) -> Result<Vec<BackendMessage>, ErrorFields> {
    match find(values, name) {
        Some((canonical, value)) => Ok(results::show(canonical, value)),
        None => Err(ErrorFields::error(
            SqlState::UNDEFINED_OBJECT,
            format!("unrecognized configuration parameter \"{name}\""),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Vec<(String, String)> {
        merge_show_values(
            base_show_values(16 << 20, WalFormat::Walserver),
            &[
                ("Wal_Segment_Size".into(), "99MB".into()),
                ("extra".into(), "x".into()),
            ],
        )
    }

    #[test]
    fn base_values_name_the_segment_size_and_the_server() {
        let base = base_show_values(1 << 30, WalFormat::Walserver);
        let get = |k: &str| base.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("wal_segment_size"), Some("1GB"));
        assert_eq!(get("server_version"), Some(protocol_codec::SERVER_VERSION));
        let base = base_show_values(16 << 20, WalFormat::Walserver);
        assert_eq!(
            base.iter()
                .find(|(n, _)| n == "wal_segment_size")
                .map(|(_, v)| v.as_str()),
            Some("16MB")
        );
    }

    #[test]
    fn overrides_replace_case_insensitively_and_add_new_names() {
        let v = values();
        let sizes: Vec<_> = v
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("wal_segment_size"))
            .collect();
        assert_eq!(sizes.len(), 1);
        // The canonical name stays; the value is the override's.
        assert_eq!(
            sizes[0],
            &("wal_segment_size".to_string(), "99MB".to_string())
        );
        assert!(v.contains(&("extra".to_string(), "x".to_string())));
    }

    #[test]
    fn the_role_answers_as_postgresql_15_answers_on_a_primary_and_a_standby() {
        let get = |role: &[(String, String)], name: &str| {
            let msgs =
                answer_for(&ClientSettings::default(), &[], &[], role, &values(), name).unwrap();
            let BackendMessage::DataRow(row) = &msgs[1] else {
                panic!("{msgs:?}")
            };
            String::from_utf8(row[0].clone().unwrap().to_vec()).unwrap()
        };
        let names = [
            "in_hot_standby",
            "default_transaction_read_only",
            "transaction_read_only",
        ];
        let primary = role_values(false, false);
        assert_eq!(names.map(|n| get(&primary, n)), ["off", "off", "off"]);
        let standby = role_values(true, false);
        assert_eq!(names.map(|n| get(&standby, n)), ["on", "off", "on"]);
        let fenced = role_values(false, true);
        assert_eq!(names.map(|n| get(&fenced, n)), ["off", "on", "on"]);
        // Any case, as every SHOW.
        assert_eq!(get(&fenced, "Transaction_Read_Only"), "on");
    }

    #[test]
    fn answer_finds_names_case_insensitively_and_refuses_unknown_ones() {
        let v = values();
        let msgs = answer(&v, "WAL_SEGMENT_SIZE").unwrap();
        let BackendMessage::DataRow(row) = &msgs[1] else {
            panic!("{msgs:?}")
        };
        assert_eq!(row[0].as_deref(), Some(&b"99MB"[..]));
        let e = answer(&v, "nonsense").unwrap_err();
        assert_eq!(e.get(ErrorFields::CODE), Some("42704"));
    }
}
