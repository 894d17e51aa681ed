//! `GET /metrics`: every family an operator's dashboard needs is present, in valid
//! OpenMetrics text, with values that match what the test did, on a primary with a
//! synchronous standby and on that standby; and the README's table lists exactly the
//! families the two show.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};

use bytes::Bytes;
use supervisor_actor::{AppendRecords, Durability};
use wal_storage::{Lsn, TimelineId};

use crate::common::*;

/// The labels a family may carry: stable names, never a connection number.
const ALLOWED_LABELS: &[&str] = &[
    "role",
    "state",
    "application_name",
    "sync_state",
    "durability",
    "le",
    "slot_name",
    "wal_status",
    "kind",
    "version",
    "commit",
];

/// A parsed scrape: each sample by its name and labels (`name{a="x",b="y"}` as written).
pub(crate) struct Scrape {
    samples: BTreeMap<String, f64>,
    text: String,
}

impl Scrape {
    pub(crate) fn get(&self, key: &str) -> f64 {
        *self
            .samples
            .get(key)
            .unwrap_or_else(|| panic!("no sample {key} in\n{}", self.text))
    }

    /// The families, each by the name its samples carry.
    pub(crate) fn family_names(&self) -> BTreeSet<String> {
        metric_families(&self.text)
    }
}

pub(crate) fn scrape(node: &TestNode) -> Scrape {
    let mut response = String::new();
    let mut sock = std::net::TcpStream::connect(node.http_addr).unwrap();
    write!(sock, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    sock.read_to_string(&mut response).unwrap();
    let (head, text) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.contains("application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    parse(text)
}

/// Parses OpenMetrics text strictly: every line is a comment (`# HELP name text`,
/// `# TYPE name kind`) or `name{labels} value`, and the last is `# EOF`; each family has one
/// HELP and one TYPE before its samples; a counter's samples are `name_total`, an info's
/// `name_info`, a histogram's `_bucket` (with `le`), `_sum` and `_count`, a gauge's its own
/// name.
fn parse(text: &str) -> Scrape {
    let body = text
        .strip_suffix("# EOF\n")
        .unwrap_or_else(|| panic!("the exposition does not end with # EOF:\n{text}"));
    let mut help = BTreeSet::new();
    let mut types = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, h) = rest.split_once(' ').expect("HELP name text");
            assert!(!h.is_empty(), "{line}");
            assert!(help.insert(name.to_string()), "two HELP lines for {name}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                ["gauge", "counter", "histogram", "info"].contains(&kind),
                "{line}"
            );
            assert!(help.contains(name), "TYPE before HELP for {name}");
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "{line}"
            );
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "unexpected line {line:?}"
        );
        let (key, value) = line.rsplit_once(' ').expect("name value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match key.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').expect("labels end with }")),
            None => (key, ""),
        };
        assert!(
            name.starts_with("walserver_") || name.starts_with("process_"),
            "{line}"
        );
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        for pair in split_labels(labels) {
            let (k, v) = pair.split_once('=').expect("label=value");
            assert!(ALLOWED_LABELS.contains(&k), "label {k} in {line}");
            assert!(
                v.starts_with('"') && v.ends_with('"') && v.len() >= 2,
                "{line}"
            );
        }
        let kind_of = |family: &str| types.get(family).map(String::as_str);
        let family = if kind_of(name) == Some("gauge") {
            name
        } else {
            [
                ("_total", "counter"),
                ("_info", "info"),
                ("_bucket", "histogram"),
                ("_sum", "histogram"),
                ("_count", "histogram"),
            ]
            .iter()
            .find_map(|(suffix, kind)| {
                name.strip_suffix(suffix)
                    .filter(|f| kind_of(f) == Some(*kind))
            })
            .unwrap_or_else(|| panic!("sample {name} has no HELP and TYPE of its kind"))
        };
        assert!(help.contains(family));
        if name.ends_with("_bucket") && family != name {
            assert!(labels.contains("le=\""), "{line}");
        }
        assert!(
            samples.insert(key.to_string(), value).is_none(),
            "duplicate series {key}"
        );
    }
    Scrape {
        samples,
        text: text.to_string(),
    }
}

/// Splits `a="x",b="y"` at the commas between pairs (a value may hold an escaped quote or a
/// comma).
fn split_labels(labels: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in labels.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&labels[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < labels.len() {
        out.push(&labels[start..]);
    }
    out
}

fn append(node: &TestNode, records: &[usize], durability: Durability) -> Lsn {
    let msg = AppendRecords {
        records: records.iter().map(|&n| Bytes::from(vec![7u8; n])).collect(),
        durability: Some(durability),
    };
    futures_executor::block_on(node.node.supervisor.send(msg))
        .expect("supervisor")
        .expect("append")
        .end_lsn
}

#[test]
fn metrics_answer_the_operators_questions() {
    let primary = TestNode::primary(
        "synchronous_standby_names = 's1'\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"bad\"\nmethod = \"reject\"\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"trust\"\n",
    );
    let standby = TestNode::standby_of(primary.addr(), "s1", "");
    wait_until("s1 streaming", || {
        primary.status().replication.iter().any(|r| {
            r.application_name == "s1"
                && r.state == walsender_actor::status::WalSenderState::Streaming
        })
    });
    // A slot that holds WAL from before the appends, on a connection left open (a walsender
    // in the startup state).
    let mut slot_conn = PgConn::connect(primary.addr(), "u", None).unwrap();
    slot_conn.query("CREATE_REPLICATION_SLOT keep PHYSICAL RESERVE_WAL");
    // A refused login.
    let refused = PgConn::connect(primary.addr(), "bad", None).err().unwrap();
    assert_eq!(sqlstate(&refused), "28000");

    append(&primary, &[100], Durability::Local);
    append(&primary, &[60, 40], Durability::Local);
    let end = append(&primary, &[10, 10, 10], Durability::On);
    standby.wait_flushed(TimelineId(1), end);

    let m = scrape(&primary);
    assert_eq!(m.get(r#"walserver_role{role="primary"}"#), 1.0);
    assert_eq!(m.get(r#"walserver_role{role="standby"}"#), 0.0);
    assert_eq!(m.get("walserver_timeline"), 1.0);
    assert_eq!(m.get("walserver_flush_lsn_bytes"), end.0 as f64);
    // Appends by durability level: the counts are the appends made.
    assert_eq!(m.get(r#"walserver_appends_total{durability="local"}"#), 2.0);
    assert_eq!(m.get(r#"walserver_appends_total{durability="on"}"#), 1.0);
    assert_eq!(
        m.get(r#"walserver_appends_total{durability="remote_write"}"#),
        0.0
    );
    assert_eq!(
        m.get(r#"walserver_append_records_total{durability="local"}"#),
        3.0
    );
    assert_eq!(
        m.get(r#"walserver_append_records_total{durability="on"}"#),
        3.0
    );
    assert_eq!(
        m.get(r#"walserver_append_bytes_total{durability="local"}"#),
        200.0
    );
    assert_eq!(
        m.get(r#"walserver_append_bytes_total{durability="on"}"#),
        30.0
    );
    assert_eq!(
        m.get(r#"walserver_append_failures_total{durability="on"}"#),
        0.0
    );
    assert_eq!(m.get("walserver_append_duration_seconds_count"), 3.0);
    assert_eq!(
        m.get(r#"walserver_append_duration_seconds_bucket{le="+Inf"}"#),
        3.0
    );
    assert!(m.get("walserver_append_duration_seconds_sum") > 0.0);
    // Only the `on` append waited for the synchronous standby.
    assert_eq!(m.get("walserver_append_sync_wait_seconds_count"), 1.0);
    // The synchronous standby confirmed the last append before it was acknowledged.
    let s1 = |f: &str| format!(r#"walserver_standby_{f}{{application_name="s1"}}"#);
    assert_eq!(m.get(&s1("flush_lag_bytes")), 0.0);
    assert_eq!(m.get(&s1("write_lag_bytes")), 0.0);
    assert!(m.get(&s1("replay_lag_bytes")) <= end.0 as f64);
    assert_eq!(m.get(&s1("sent_lsn_bytes")), end.0 as f64);
    assert_eq!(m.get(&s1("connections")), 1.0);
    for lag in ["write", "flush", "replay"] {
        assert!(m.get(&s1(&format!("{lag}_lag_seconds"))) >= 0.0);
    }
    assert_eq!(
        m.get(r#"walserver_standby_sync_state{application_name="s1",sync_state="sync"}"#),
        1.0
    );
    assert_eq!(
        m.get(r#"walserver_standby_sync_state{application_name="s1",sync_state="async"}"#),
        0.0
    );
    assert_eq!(m.get(&s1("sync_priority")), 1.0);
    // The slot holds everything appended since it was made.
    let slots = primary.http_get("/slots");
    let restart: Lsn = slots[0]["restart_lsn"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        m.get(r#"walserver_slot_retained_bytes{slot_name="keep"}"#),
        (end.0 - restart.0) as f64
    );
    assert!(end.0 - restart.0 >= 230);
    assert_eq!(
        m.get(r#"walserver_slot_wal_status{slot_name="keep",wal_status="reserved"}"#),
        1.0
    );
    assert_eq!(
        m.get(r#"walserver_slot_wal_status{slot_name="keep",wal_status="lost"}"#),
        0.0
    );
    assert_eq!(m.get(r#"walserver_slot_active{slot_name="keep"}"#), 0.0);
    // Storage: no failures, room on the disk, fsyncs timed.
    for kind in ["write", "fsync", "enospc"] {
        assert_eq!(
            m.get(&format!(
                r#"walserver_storage_errors_total{{kind="{kind}"}}"#
            )),
            0.0
        );
    }
    assert!(m.get("walserver_disk_free_bytes") > 0.0);
    let fsyncs = m.get("walserver_fsync_duration_seconds_count");
    assert!(fsyncs >= 3.0, "one fdatasync per append at least: {fsyncs}");
    assert!(m.get("walserver_fsyncs_total") >= fsyncs);
    // Connections: the standby streams, the slot's connection waits for commands, the
    // refused login was counted.
    assert_eq!(m.get(r#"walserver_connections{state="streaming"}"#), 1.0);
    assert_eq!(m.get(r#"walserver_connections{state="startup"}"#), 1.0);
    assert_eq!(m.get(r#"walserver_connections{state="catchup"}"#), 0.0);
    assert!(m.get(r#"walserver_connections{state="authenticating"}"#) <= 1.0);
    assert_eq!(m.get("walserver_wal_senders"), 2.0);
    assert_eq!(m.get("walserver_authentication_failures_total"), 1.0);
    assert!(!m.text.contains("pid="), "{}", m.text);

    // The standby: its role and walreceiver, caught up with the primary's end.
    let mut sm = scrape(&standby);
    wait_until("the walreceiver's flush to show", || {
        sm = scrape(&standby);
        sm.samples
            .get("walserver_walreceiver_flushed_lsn_bytes")
            .is_some_and(|&v| v == end.0 as f64)
    });
    assert_eq!(sm.get(r#"walserver_role{role="standby"}"#), 1.0);
    assert_eq!(
        sm.get(r#"walserver_walreceiver_state{state="streaming"}"#),
        1.0
    );
    assert_eq!(
        sm.get(r#"walserver_walreceiver_state{state="stopped"}"#),
        0.0
    );
    assert_eq!(
        sm.get("walserver_walreceiver_received_lsn_bytes"),
        end.0 as f64
    );
    assert_eq!(
        sm.get("walserver_walreceiver_upstream_end_lsn_bytes"),
        end.0 as f64
    );
    let age = sm.get("walserver_walreceiver_last_message_age_seconds");
    assert!((0.0..DEADLINE.as_secs_f64()).contains(&age), "{age}");
    assert_eq!(sm.get("walserver_flush_lsn_bytes"), end.0 as f64);
    // The primary alone has no walreceiver families.
    assert!(!m.text.contains("walserver_walreceiver_"));
    // The process: the build, and the standard series of a running process.
    assert_eq!(
        m.get(&format!(
            r#"walserver_build_info{{version="{}",commit="{}"}}"#,
            env!("CARGO_PKG_VERSION"),
            m.text
                .split(r#"commit=""#)
                .nth(1)
                .and_then(|r| r.split('"').next())
                .expect("a commit label")
        )),
        1.0
    );
    assert!(m.get("process_open_fds") >= 3.0);
    assert!(m.get("process_open_fds") <= m.get("process_max_fds"));
    assert!(m.get("process_resident_memory_bytes") > 0.0);
    assert!(m.get("process_cpu_seconds_total") > 0.0);
    assert!(m.get("process_start_time_seconds") > 1.6e9);
    // The README's table names every family the two nodes show, and nothing else.
    let shown: BTreeSet<String> = m
        .family_names()
        .union(&sm.family_names())
        .cloned()
        .collect();
    // The failover families show only under a `[failover]` table: the cluster target's
    // failover test holds them to the table; the archive's show only with archiving on, and
    // `archive.rs` holds them to it.
    let listed: BTreeSet<String> = readme_metric_names()
        .into_iter()
        .filter(|n| !n.starts_with("walserver_failover_") && !n.starts_with("walserver_archive_"))
        .collect();
    assert_eq!(
        listed.difference(&shown).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "in the README's Metrics table but not in /metrics"
    );
    assert_eq!(
        shown.difference(&listed).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "in /metrics but not in the README's Metrics table"
    );
    drop(slot_conn);
}

#[test]
fn the_parser_refuses_what_prometheus_would() {
    let ok = "# HELP walserver_x X.\n# TYPE walserver_x gauge\nwalserver_x{state=\"a,b\"} 1\n\
              # HELP walserver_y Y.\n# TYPE walserver_y counter\nwalserver_y_total 2\n# EOF\n";
    assert_eq!(parse(ok).get(r#"walserver_x{state="a,b"}"#), 1.0);
    assert_eq!(parse(ok).get("walserver_y_total"), 2.0);
    for bad in [
        "walserver_x 1\n# EOF\n",
        "# HELP walserver_x X.\n# TYPE walserver_x gauge\nwalserver_x{pid=\"3\"} 1\n# EOF\n",
        "# HELP walserver_x X.\n# TYPE walserver_x counter\nwalserver_x 1\n# EOF\n",
        "# HELP walserver_x X.\n# TYPE walserver_x gauge\nwalserver_x_total 1\n# EOF\n",
        "# HELP walserver_x X.\n# TYPE walserver_x gauge\nwalserver_x 1\nwalserver_x 2\n# EOF\n",
        "# HELP walserver_x X.\n# TYPE walserver_x gauge\nwalserver_x 1\n",
    ] {
        assert!(std::panic::catch_unwind(|| parse(bad)).is_err(), "{bad}");
    }
}

/// Connections in the startup phase are bounded: with `MAX_AUTHENTICATING` connected and
/// silent (each counted from its accept, as the metric shows), the next gets FATAL 53300
/// "sorry, too many clients already" and is closed at once, as PostgreSQL refuses clients past
/// its limit; once one of the silent ones leaves, a new connection is let in and
/// authenticated.
#[test]
fn connections_past_the_startup_phase_limit_are_refused_until_one_leaves() {
    use walsender_actor::MAX_AUTHENTICATING;
    let node = TestNode::primary("");
    let authenticating =
        |node: &TestNode| scrape(node).get(r#"walserver_connections{state="authenticating"}"#);
    let mut silent: Vec<std::net::TcpStream> = (0..MAX_AUTHENTICATING)
        .map(|_| std::net::TcpStream::connect(node.addr()).expect("connect"))
        .collect();
    wait_until("every silent connection to be counted", || {
        authenticating(&node) == MAX_AUTHENTICATING as f64
    });

    let mut refused = PgConn::raw(node.addr());
    let m = refused.recv();
    assert_eq!(sqlstate(&m), "53300", "{m:?}");
    assert_eq!(message(&m), "sorry, too many clients already");
    assert!(refused.closed());
    assert_eq!(authenticating(&node), MAX_AUTHENTICATING as f64);

    drop(silent.pop());
    wait_until("the one that left to be uncounted", || {
        authenticating(&node) == (MAX_AUTHENTICATING - 1) as f64
    });
    let mut c = PgConn::connect(node.addr(), "u", None).expect("let in once one has left");
    c.query("IDENTIFY_SYSTEM");
    drop(silent);
    wait_until("the silent ones to be uncounted", || {
        authenticating(&node) == 0.0
    });
}
