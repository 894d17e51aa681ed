//! The client commands that talk to a running node's admin API (`status`, `promote`,
//! `append`), through `walserver_node::admin`, and the status as people read it.

use anyhow::{bail, Context};
use serde_json::Value;
use walserver_node::admin::{get_json, post_json};
use walserver_node::records::{join_records, RECORDS_CONTENT_TYPE};

/// `walserver status`: the node's status and its replication slots as tables, or `/status`'s
/// JSON as the API gives it (scripts read that document; it stays as it is).
pub fn status(http: &str, json: bool, token: Option<&str>) -> anyhow::Result<()> {
    let v = get_json(http, "/status", token)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let slots = get_json(http, "/slots", token)?;
    print!("{}", render_status(&v, Some(&slots))?);
    Ok(())
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The status as people read it: the node's facts, pg_stat_replication as a table, the
/// walreceiver, and, given `/slots`'s answer, pg_replication_slots as a table.
pub fn render_status(v: &Value, slots: Option<&Value>) -> anyhow::Result<String> {
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
    let cols = [
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
    let rows = table_rows(&v["replication"], &cols);
    out.push_str(&format!("\nreplication ({} walsenders)\n", rows.len()));
    out.push_str(&table(&cols, &rows));
    if let Some(w) = v.get("wal_receiver").filter(|w| !w.is_null()) {
        out.push_str("\nwal_receiver\n");
        if let Some(o) = w.as_object() {
            for (k, val) in o {
                out.push_str(&format!("  {k:<24} {}\n", text(val)));
            }
        }
    }
    if let Some(slots) = slots {
        if !slots.is_array() {
            bail!("unexpected slots document: {slots}");
        }
        // pg_replication_slots' columns that a physical slot fills in.
        let cols = [
            "slot_name",
            "slot_type",
            "temporary",
            "active",
            "restart_lsn",
            "restart_tli",
            "wal_status",
            "safe_wal_size",
        ];
        let rows = table_rows(slots, &cols);
        out.push_str(&format!("\nreplication slots ({})\n", rows.len()));
        out.push_str(&table(&cols, &rows));
    }
    Ok(out)
}

/// The cells of a JSON array of objects, one row per object, in the order of `cols`.
fn table_rows(list: &Value, cols: &[&str]) -> Vec<Vec<String>> {
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|r| cols.iter().map(|c| text(&r[*c])).collect())
                .collect()
        })
        .unwrap_or_default()
}

fn table(cols: &[&str], rows: &[Vec<String>]) -> String {
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
        let t = render_status(&v, Some(&slots)).unwrap();
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
        assert!(!render_status(&v, None).unwrap().contains("slots"));
        assert!(render_status(&Value::Null, None).is_err());
        assert!(render_status(&v, Some(&Value::Null)).is_err());
    }
}
