//! The client commands that talk to a running node's admin API (`status`, `promote`,
//! `append`), through `walserver_node::admin`, and the status as people read it.

use anyhow::{bail, Context};
use serde_json::Value;
use walserver_node::admin::{get_json, post_json};
use walserver_node::records::{join_records, RECORDS_CONTENT_TYPE};

/// `walserver status`: the node's status and its replication slots as tables (the columns an
/// operator reads first, in 100 columns; every column with `wide`), or `/status`'s JSON as the
/// API gives it (scripts read that document; it stays as it is).
pub fn status(http: &str, json: bool, wide: bool, token: Option<&str>) -> anyhow::Result<()> {
    let v = get_json(http, "/status", token)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let slots = get_json(http, "/slots", token)?;
    print!("{}", render_status(&v, Some(&slots), wide)?);
    Ok(())
}

/// The width the status fits in without `--wide`: a terminal's, with room to spare.
pub const NARROW_WIDTH: usize = 100;

/// The longest name or text cell of the narrow tables; longer ones are cut, with `~` at
/// the cut (the wide tables and `--json` show them whole).
const NARROW_CELL: usize = 24;

fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        // A lag: a Duration, serialised as seconds and nanoseconds, shown as PostgreSQL shows
        // an interval.
        Value::Object(o) if o.len() == 2 && o.contains_key("secs") && o.contains_key("nanos") => {
            let secs = o["secs"].as_u64().unwrap_or(0);
            let micros = o["nanos"].as_u64().unwrap_or(0) / 1000;
            format!(
                "{:02}:{:02}:{:02}.{micros:06}",
                secs / 3600,
                secs / 60 % 60,
                secs % 60
            )
        }
        other => other.to_string(),
    }
}

/// `s` cut to `max` characters, the last one a `~` when it was cut.
fn clip(s: String, max: usize) -> String {
    if s.chars().count() <= max {
        return s;
    }
    let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
    cut.push('~');
    cut
}

/// The status as people read it: the node's facts, pg_stat_replication as a table, the
/// walreceiver, and, given `/slots`'s answer, pg_replication_slots as a table. Narrow (not
/// `wide`), the tables have the columns an operator reads first, long names and texts are cut
/// and the status fits [`NARROW_WIDTH`] columns for any name and any LSN below 10000/0.
pub fn render_status(v: &Value, slots: Option<&Value>, wide: bool) -> anyhow::Result<String> {
    if !v.is_object() {
        bail!("unexpected status document: {v}");
    }
    let mut out = String::new();
    for key in [
        "role",
        "system_identifier",
        "timeline",
        "flush_lsn",
        "wal_format",
    ] {
        out.push_str(&format!("{key:<18} {}\n", text(&v[key])));
    }
    // Storage's state, and what made it other than ok (cut when narrow: `--json` has it all).
    if let Some(s) = v.get("storage").filter(|s| s.is_object()) {
        let mut line = format!("{:<18} {}", "storage", text(&s["state"]));
        if let Some(e) = s.get("error").filter(|e| !e.is_null()) {
            line.push_str(&format!(" since {}: {}", text(&s["since"]), text(e)));
        }
        out.push_str(&if wide { line } else { clip(line, NARROW_WIDTH) });
        out.push('\n');
    }
    // The failover service's line: whether this node is a member, the term and the leader.
    if let Some(f) = v.get("failover").filter(|f| f.is_object()) {
        let line = format!("{:<18} {}", "failover", failover_line(f));
        out.push_str(&if wide { line } else { clip(line, NARROW_WIDTH) });
        out.push('\n');
    }
    // The archiver's line: pg_stat_archiver's counts, where it is, and what is wrong.
    if let Some(a) = v.get("archiver").filter(|a| a.is_object()) {
        let mut line = format!(
            "{:<18} archived {} (last {}), failed {}, archived_lsn {}, backlog {} bytes",
            "archiver",
            text(&a["archived_count"]),
            text(&a["last_archived_wal"]),
            text(&a["failed_count"]),
            text(&a["archived_lsn"]),
            text(&a["backlog_bytes"]),
        );
        if let Some(secs) = a.get("backlog_seconds").and_then(|s| s.as_f64()) {
            line.push_str(&format!(" ({secs:.0} s)"));
        }
        for key in ["alarm", "last_error"] {
            if let Some(e) = a.get(key).filter(|e| !e.is_null()) {
                line.push_str(&format!("; {key}: {}", text(e)));
                break;
            }
        }
        out.push_str(&if wide { line } else { clip(line, NARROW_WIDTH) });
        out.push('\n');
    }
    let wide_cols = [
        "pid",
        "application_name",
        "client_addr",
        "state",
        "sent_lsn",
        "write_lsn",
        "flush_lsn",
        "replay_lsn",
        "write_lag",
        "flush_lag",
        "replay_lag",
        "sync_priority",
        "sync_state",
        "reply_time",
        "backend_xmin",
    ];
    let narrow_cols = [
        "application_name",
        "state",
        "sent_lsn",
        "flush_lsn",
        "flush_lag",
        "sync_state",
    ];
    let cols: &[&str] = if wide { &wide_cols } else { &narrow_cols };
    let rows = table_rows(&v["replication"], cols, wide);
    out.push_str(&format!("\nreplication ({} walsenders)\n", rows.len()));
    out.push_str(&table(cols, &rows));
    if let Some(w) = v.get("wal_receiver").filter(|w| !w.is_null()) {
        out.push_str("\nwal_receiver\n");
        if let Some(o) = w.as_object() {
            for (k, val) in o {
                let line = format!("  {k:<24} {}", text(val));
                let line = if wide { line } else { clip(line, NARROW_WIDTH) };
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    if let Some(slots) = slots {
        if !slots.is_array() {
            bail!("unexpected slots document: {slots}");
        }
        // pg_replication_slots' columns that a physical slot fills in.
        let wide_cols = [
            "slot_name",
            "slot_type",
            "temporary",
            "active",
            "restart_lsn",
            "restart_tli",
            "wal_status",
            "safe_wal_size",
        ];
        let narrow_cols = [
            "slot_name",
            "active",
            "restart_lsn",
            "wal_status",
            "safe_wal_size",
        ];
        let cols: &[&str] = if wide { &wide_cols } else { &narrow_cols };
        let rows = table_rows(slots, cols, wide);
        out.push_str(&format!("\nreplication slots ({})\n", rows.len()));
        out.push_str(&table(cols, &rows));
    }
    Ok(out)
}

/// `/status`'s `failover` in words: the state (with the reason when not a member, and since
/// when), then the term and the leader as this node knows them, and a pause.
fn failover_line(f: &Value) -> String {
    let state = f["state"].as_str().unwrap_or("");
    let mut line = state.replace('_', " ");
    if let Some(reason) = f["reason"].as_str() {
        line.push_str(&format!(": {reason}"));
    }
    if let Some(since) = f["since"].as_str() {
        line.push_str(&format!(" (since {since})"));
    }
    if !f["term"].is_null() {
        line.push_str(&format!(", term {}", text(&f["term"])));
    }
    match f["leader"].as_str() {
        Some(leader) => line.push_str(&format!(", leader {leader}")),
        None => line.push_str(", no leader"),
    }
    if f["paused"] == Value::Bool(true) {
        line.push_str(", paused");
    }
    line
}

/// The cells of a JSON array of objects, one row per object, in the order of `cols`; cut
/// to [`NARROW_CELL`] unless `wide`.
fn table_rows(list: &Value, cols: &[&str], wide: bool) -> Vec<Vec<String>> {
    let cell = |v: &Value| {
        if wide {
            text(v)
        } else {
            clip(text(v), NARROW_CELL)
        }
    };
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|r| cols.iter().map(|c| cell(&r[*c])).collect())
                .collect()
        })
        .unwrap_or_default()
}

/// A table: the header, a rule, the rows; each column as wide as its widest cell.
pub(crate) fn table(cols: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            rows.iter()
                .map(|r| r[i].len())
                .max()
                .unwrap_or(0)
                .max(c.len())
        })
        .collect();
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join(" | ")
            .trim_end()
            .to_string()
            + "\n"
    };
    let mut out = line(cols.to_vec());
    out.push_str(
        &widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("-+-"),
    );
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// `walserver promote`.
pub fn promote(http: &str, token: Option<&str>) -> anyhow::Result<()> {
    let v = post_json(http, "/promote", token, "application/json", b"")?;
    println!(
        "promoted: timeline {} starts at {}",
        text(&v["timeline"]),
        text(&v["switch_lsn"])
    );
    Ok(())
}

/// `walserver append`.
pub fn append(
    http: &str,
    count: Option<usize>,
    size: usize,
    durability: Option<&str>,
    batch: usize,
    raw: bool,
    token: Option<&str>,
) -> anyhow::Result<()> {
    use std::io::Read;
    let records: Vec<Vec<u8>> = match count {
        Some(n) => (0..n)
            .map(|i| {
                let mut r = format!("record {i} ").into_bytes();
                r.resize(size.max(r.len()), b'.');
                r.truncate(size);
                r
            })
            .collect(),
        None => {
            let mut input = Vec::new();
            std::io::stdin()
                .read_to_end(&mut input)
                .context("cannot read standard input")?;
            if raw {
                vec![input]
            } else {
                input
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(<[u8]>::to_vec)
                    .collect()
            }
        }
    };
    anyhow::ensure!(!records.is_empty(), "nothing to append");
    let path = match durability {
        Some(d) => format!("/wal?durability={d}"),
        None => "/wal".to_string(),
    };
    let started = std::time::Instant::now();
    let mut last = Value::Null;
    for chunk in records.chunks(batch.max(1)) {
        let body = join_records(chunk.iter().map(Vec::as_slice));
        last = post_json(http, &path, token, RECORDS_CONTENT_TYPE, &body)?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "appended {} records ({} bytes) in {secs:.3} s; end LSN {} on timeline {} ({})",
        records.len(),
        records.iter().map(Vec::len).sum::<usize>(),
        text(&last["end_lsn"]),
        text(&last["timeline"]),
        text(&last["durability"])
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cells of the table row under `header` whose first cell is `first`, by column name.
    fn cells<'a>(t: &'a str, header: &str, first: &str) -> Vec<(&'a str, &'a str)> {
        let split = |l: &'a str| l.split('|').map(str::trim).collect::<Vec<_>>();
        let mut lines = t.lines().skip_while(|l| !l.starts_with(header));
        let names = split(
            lines
                .next()
                .unwrap_or_else(|| panic!("no {header} in\n{t}")),
        );
        let row = lines
            .map(split)
            .find(|r| r[0] == first)
            .unwrap_or_else(|| panic!("no row {first} under {header} in\n{t}"));
        names.into_iter().zip(row).collect()
    }

    #[test]
    fn renders_a_table() {
        let v: Value = serde_json::json!({
            "role": "primary", "system_identifier": "7", "timeline": 1, "flush_lsn": "0/1000000",
            "wal_format": "walserver",
            "replication": [{"pid": 3, "application_name": "s1", "state": "streaming", "sent_lsn": "0/1000000",
                              "write_lag": null, "sync_state": "async", "sync_priority": 0,
                              "reply_time": "2026-11-30 00:53:20.123456+00", "backend_xmin": 1234}]
        });
        let slots: Value = serde_json::json!([
            {"slot_name": "standby_slot", "plugin": null, "slot_type": "physical", "temporary": false,
             "active": true, "restart_lsn": "0/1000000", "restart_tli": 1, "wal_status": "reserved",
             "safe_wal_size": null},
            {"slot_name": "unused", "plugin": null, "slot_type": "physical", "temporary": false,
             "active": false, "restart_lsn": null, "restart_tli": null, "wal_status": null,
             "safe_wal_size": null}
        ]);
        let t = render_status(&v, Some(&slots), true).unwrap();
        assert!(t.contains("primary"));
        let walsender = cells(&t, "pid ", "3");
        assert!(walsender.contains(&("application_name", "s1")), "{t}");
        assert!(walsender.contains(&("state", "streaming")), "{t}");
        assert!(
            walsender.contains(&("reply_time", "2026-11-30 00:53:20.123456+00")),
            "{t}"
        );
        assert!(walsender.contains(&("backend_xmin", "1234")), "{t}");
        assert!(t.contains("\nreplication slots (2)\n"), "{t}");
        let slot = cells(&t, "slot_name ", "standby_slot");
        for cell in [
            ("slot_type", "physical"),
            ("active", "true"),
            ("restart_lsn", "0/1000000"),
            ("restart_tli", "1"),
            ("wal_status", "reserved"),
        ] {
            assert!(slot.contains(&cell), "{cell:?} in\n{t}");
        }
        let unused = cells(&t, "slot_name ", "unused");
        assert!(unused.contains(&("active", "false")), "{t}");
        assert!(unused.contains(&("restart_lsn", "")), "{t}");
        // Without slots (the demo's in-process status) there is no slots table.
        assert!(!render_status(&v, None, true).unwrap().contains("slots"));
        assert!(render_status(&Value::Null, None, true).is_err());
        assert!(render_status(&v, Some(&Value::Null), true).is_err());
    }

    #[test]
    fn shows_the_archiver_s_line() {
        let mut v: Value = serde_json::json!({
            "role": "primary", "system_identifier": "7", "timeline": 1, "flush_lsn": "0/3000010",
            "wal_format": "walserver", "replication": [],
            "archiver": {"archived_count": 2, "last_archived_wal": "000000010000000000000002",
                         "failed_count": 1, "archived_lsn": "0/3000000", "backlog_bytes": 0,
                         "last_error": null, "alarm": null}
        });
        let t = render_status(&v, None, true).unwrap();
        assert!(
            t.contains("archiver           archived 2 (last 000000010000000000000002), failed 1, archived_lsn 0/3000000, backlog 0 bytes\n"),
            "{t}"
        );
        // Narrow, the line is cut to the width like the others.
        let t = render_status(&v, None, false).unwrap();
        let line = t.lines().find(|l| l.starts_with("archiver")).unwrap();
        assert!(
            line.starts_with(
                "archiver           archived 2 (last 000000010000000000000002), failed 1"
            ),
            "{t}"
        );
        assert!(line.chars().count() <= NARROW_WIDTH, "{t}");
        // The backlog's age, in seconds, when /status gives it.
        v["archiver"]["backlog_bytes"] = 1048576.into();
        v["archiver"]["backlog_seconds"] = 12.4.into();
        let t = render_status(&v, None, true).unwrap();
        assert!(t.contains("backlog 1048576 bytes (12 s)\n"), "{t}");
        v["archiver"]["alarm"] = "000000010000000000000003 differs".into();
        let t = render_status(&v, None, true).unwrap();
        assert!(
            t.contains("; alarm: 000000010000000000000003 differs\n"),
            "{t}"
        );
        v.as_object_mut().unwrap().remove("archiver");
        assert!(!render_status(&v, None, true).unwrap().contains("archiver"));
    }

    /// The failover line: the state, why a node is not a member and since when, the term, the
    /// leader, a pause; none without failover.
    #[test]
    fn shows_the_failover_line() {
        let mut v: Value = serde_json::json!({
            "role": "standby", "system_identifier": "7", "timeline": 2, "flush_lsn": "0/3000010",
            "wal_format": "walserver", "replication": [],
            "failover": {"state": "not_joined", "reason": "cannot join the cluster in etcd: connection refused",
                         "since": "2026-12-06 04:30:00.000000+00", "leader": null, "term": null,
                         "paused": false}
        });
        let t = render_status(&v, None, true).unwrap();
        assert!(
            t.contains("failover           not joined: cannot join the cluster in etcd: connection refused (since 2026-12-06 04:30:00.000000+00), no leader\n"),
            "{t}"
        );
        v["failover"] = serde_json::json!({"state": "leading", "reason": null, "since": null,
                                            "leader": "n1", "term": 12, "paused": true});
        let t = render_status(&v, None, true).unwrap();
        assert!(
            t.contains("failover           leading, term 12, leader n1, paused\n"),
            "{t}"
        );
        v.as_object_mut().unwrap().remove("failover");
        assert!(!render_status(&v, None, true).unwrap().contains("failover"));
    }

    /// Without `--wide` the status fits in 100 columns, with the widest values it shows: the
    /// longest state and sync state, LSNs of nine hex digits, lags, and names and a conninfo
    /// far longer than a line, which are cut.
    #[test]
    fn the_narrow_status_fits_in_100_columns() {
        let long = "a_very_long_application_name_that_goes_on_and_on".to_string();
        let lsn = "FFFF/FFFFFFFF";
        let lag = serde_json::json!({"secs": 86399, "nanos": 999_999_000});
        let v: Value = serde_json::json!({
            "role": "standby", "system_identifier": "7447010192781234567", "timeline": 4_000_000_000u64,
            "flush_lsn": lsn, "wal_format": "postgresql",
            "replication": [{"pid": 123456, "application_name": long, "client_addr": "2001:db8::1",
                             "state": "streaming", "sent_lsn": lsn, "write_lsn": lsn, "flush_lsn": lsn,
                             "replay_lsn": lsn, "write_lag": lag, "flush_lag": lag, "replay_lag": lag,
                             "sync_priority": 100, "sync_state": "potential",
                             "reply_time": "2026-11-30 00:53:20.123456+00", "backend_xmin": null}],
            "wal_receiver": {"pid": 1, "conninfo": format!("host=replica.example.com port=5432 user=replicator application_name={long}"),
                             "status": "streaming", "slot_name": long},
        });
        let slots: Value = serde_json::json!([
            {"slot_name": long, "plugin": null, "slot_type": "physical", "temporary": false,
             "active": true, "restart_lsn": lsn, "restart_tli": 1, "wal_status": "unreserved",
             "safe_wal_size": -1_073_741_824i64}
        ]);
        let t = render_status(&v, Some(&slots), false).unwrap();
        let widest = t.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(widest <= NARROW_WIDTH, "{widest} columns:\n{t}");
        // The operator's first columns are there; the cut names say they were cut.
        let walsender = cells(&t, "application_name ", &clip(long.clone(), NARROW_CELL));
        assert!(walsender.contains(&("flush_lag", "23:59:59.999999")), "{t}");
        assert!(walsender.contains(&("sync_state", "potential")), "{t}");
        assert!(t.contains("~"), "{t}");
        // --wide shows everything, whole.
        let wide = render_status(&v, Some(&slots), true).unwrap();
        assert!(
            wide.contains(&long) && wide.contains("backend_xmin"),
            "{wide}"
        );
        assert!(wide.lines().any(|l| l.chars().count() > NARROW_WIDTH));
    }
}
