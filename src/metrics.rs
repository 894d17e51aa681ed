//! The admin API's `/metrics`: the node's facts in Prometheus' text exposition format
//! (version 0.0.4), for the questions operators ask: which role and timeline, how far behind
//! each standby is, how appends and fsyncs perform, how much WAL slots hold back, whether
//! storage fails or the disk fills, who is connected and who failed to log in.
//!
//! The facts are kept by the crates that own them (storage's fsync latency and errors,
//! the supervisor's appends, the walsenders' startup phase, the registry's and the
//! walreceiver's status rows); this module only reads and writes them down. Names follow
//! Prometheus' conventions: the `walserver_` prefix, base units (seconds, bytes) in the
//! name, `_total` on counters, one `# HELP` and `# TYPE` per family. Labels are stable
//! across reconnects (`application_name`, `slot_name`, fixed value sets), never a
//! connection number. The list is in the README's "Metrics" section.

use std::fmt::{Display, Write as _};
use std::time::SystemTime;

use supervisor_actor::{AppendCounts, Durability, GetNodeStatus, Node, NodeRole, NodeStatus};
use wal_storage::{Lsn, SlotInfo, StorageErrorKind};
use wal_types::metrics::HistogramSnapshot;
use walsender_actor::status::{WalSenderState, WalSenderStatus};

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// Everything `/metrics` shows, read at one moment.
pub struct Snapshot {
    pub status: NodeStatus,
    pub slots: Vec<SlotInfo>,
    /// `None` if `statvfs` on the data directory failed.
    pub disk_free_bytes: Option<u64>,
    pub now: SystemTime,
}

/// Reads the node's metrics and writes them in the text format. The free space on the data
/// directory is a system call that may block, so it runs on the blocking pool, never on
/// this thread.
pub async fn render(node: &Node) -> anyhow::Result<String> {
    let status = node.supervisor.send(GetNodeStatus).await??;
    let wal = node.wal.clone();
    let disk_free_bytes = actix_web::web::block(move || wal.disk_free_bytes())
        .await
        .ok()
        .and_then(|r| {
            r.inspect_err(|e| tracing::debug!("statvfs of the data directory failed: {e}"))
                .ok()
        });
    let snapshot = Snapshot {
        status,
        slots: node.wal.slots(),
        disk_free_bytes,
        now: SystemTime::now(),
    };
    Ok(write(node, &snapshot))
}

/// The text of `snapshot` and of the node's counters.
pub fn write(node: &Node, s: &Snapshot) -> String {
    let mut out = Text::default();
    node_families(&mut out, s);
    receiver_families(&mut out, s);
    standby_families(&mut out, s);
    append_families(&mut out, node);
    slot_families(&mut out, s);
    storage_families(&mut out, node, s);
    connection_families(&mut out, node, s);
    out.0
}

fn node_families(out: &mut Text, s: &Snapshot) {
    let st = &s.status;
    out.family(
        "walserver_role",
        "gauge",
        "1 for the node's role (primary or standby), 0 for the other.",
    );
    let role = match st.role {
        NodeRole::Primary => "primary",
        NodeRole::Standby => "standby",
    };
    out.one_hot(
        "walserver_role",
        &[],
        ("role", role),
        &["primary", "standby"],
    );
    out.family("walserver_timeline", "gauge", "The current timeline.");
    out.sample("walserver_timeline", &[], st.timeline.0);
    out.family(
        "walserver_flush_lsn_bytes",
        "gauge",
        "The durable end of WAL on the current timeline, as a byte position.",
    );
    out.sample("walserver_flush_lsn_bytes", &[], st.flush_lsn.0);
    out.family(
        "walserver_wal_senders",
        "gauge",
        "Connected walsenders (every state).",
    );
    out.sample("walserver_wal_senders", &[], st.replication.len());
}

/// The walreceiver's states, as `pg_stat_wal_receiver.status` names them, and `stopped`
/// while none runs (between restarts, or after promotion).
const RECEIVER_STATES: [&str; 5] = ["starting", "streaming", "waiting", "stopping", "stopped"];

fn receiver_families(out: &mut Text, s: &Snapshot) {
    let Some(info) = &s.status.wal_receiver else {
        return;
    };
    let state = match (&info.pid, &info.status) {
        (Some(_), Some(st)) => receiver_state_name(st.status),
        (Some(_), None) => "starting",
        (None, _) => "stopped",
    };
    out.family(
        "walserver_walreceiver_state",
        "gauge",
        "1 for the walreceiver's state, 0 for the others.",
    );
    out.one_hot(
        "walserver_walreceiver_state",
        &[],
        ("state", state),
        &RECEIVER_STATES,
    );
    let st = info.status.as_ref();
    let lsn = |f: fn(&walreceiver_actor::ReceiverStatus) -> Option<Lsn>| st.and_then(f);
    for (name, help, value) in [
        (
            "walserver_walreceiver_received_lsn_bytes",
            "The end of the WAL received from upstream and handed to storage.",
            lsn(|r| r.written_lsn),
        ),
        (
            "walserver_walreceiver_flushed_lsn_bytes",
            "The end of the received WAL that is durable, as reported upstream.",
            lsn(|r| r.flushed_lsn),
        ),
        (
            "walserver_walreceiver_upstream_end_lsn_bytes",
            "The end of WAL the upstream last reported (in XLogData or a keepalive).",
            lsn(|r| r.latest_end_lsn),
        ),
    ] {
        out.family(name, "gauge", help);
        if let Some(l) = value {
            out.sample(name, &[], l.0);
        }
    }
    let name = "walserver_walreceiver_last_message_age_seconds";
    out.family(
        name,
        "gauge",
        "Seconds since the last message from upstream arrived.",
    );
    if let Some(t) = st.and_then(|r| r.last_msg_receipt_time) {
        let age = s.now.duration_since(t).unwrap_or_default();
        out.sample(name, &[], age.as_secs_f64());
    }
}

fn receiver_state_name(s: walreceiver_actor::ReceiverState) -> &'static str {
    use walreceiver_actor::ReceiverState::*;
    match s {
        Starting => "starting",
        Streaming => "streaming",
        Waiting => "waiting",
        Stopping => "stopping",
    }
}

/// `sync_state`'s values, as `pg_stat_replication` shows them.
const SYNC_STATES: [&str; 4] = ["async", "potential", "sync", "quorum"];

fn standby_families(out: &mut Text, s: &Snapshot) {
    let flushed = s.status.flush_lsn;
    let rows = one_row_per_application(&s.status.replication);
    let mut per_standby = |name: &str, help: &str, value: &dyn Fn(&WalSenderStatus) -> String| {
        out.family(name, "gauge", help);
        for (r, _) in &rows {
            let app = [("application_name", r.application_name.as_str())];
            out.sample(name, &app, value(r));
        }
    };
    per_standby(
        "walserver_standby_sent_lsn_bytes",
        "The end of the WAL sent to the standby.",
        &|r| r.sent_lsn.unwrap_or_default().0.to_string(),
    );
    // Bytes behind this node's flushed end; a position the standby has not reported yet
    // counts as 0, so a new standby shows its whole distance.
    type Pos = fn(&WalSenderStatus) -> (Option<Lsn>, Option<std::time::Duration>);
    let positions: [(&str, Pos); 3] = [
        ("write", |r| (r.write_lsn, r.write_lag)),
        ("flush", |r| (r.flush_lsn, r.flush_lag)),
        ("replay", |r| (r.replay_lsn, r.replay_lag)),
    ];
    for (pos, of) in positions {
        per_standby(
            &format!("walserver_standby_{pos}_lag_bytes"),
            &format!("WAL on this node the standby has not confirmed at {pos}, in bytes."),
            &|r| {
                flushed
                    .saturating_sub(of(r).0.unwrap_or_default())
                    .to_string()
            },
        );
        per_standby(
            &format!("walserver_standby_{pos}_lag_seconds"),
            &format!(
                "pg_stat_replication's {pos}_lag: how long WAL took to be confirmed at \
                 {pos} (0 when caught up and idle)."
            ),
            &|r| of(r).1.unwrap_or_default().as_secs_f64().to_string(),
        );
    }
    per_standby(
        "walserver_standby_sync_priority",
        "The standby's priority in synchronous_standby_names (0: not a candidate).",
        &|r| r.sync_priority.to_string(),
    );
    let name = "walserver_standby_connections";
    out.family(
        name,
        "gauge",
        "Walsender connections with this application_name (more than 1: the other \
         walserver_standby_ metrics show the one furthest behind).",
    );
    for (r, n) in &rows {
        let app = [("application_name", r.application_name.as_str())];
        out.sample(name, &app, n);
    }
    let name = "walserver_standby_sync_state";
    out.family(
        name,
        "gauge",
        "1 for the standby's sync_state (async, potential, sync, quorum), 0 for the others.",
    );
    for (r, _) in &rows {
        let app = [("application_name", r.application_name.as_str())];
        out.one_hot(name, &app, ("sync_state", &r.sync_state), &SYNC_STATES);
    }
}

/// The rows to show, one per `application_name` with how many connections share it: a
/// series is named by its labels, and two connections of one name (a standby reconnecting
/// before its old connection timed out, two clients that did not set a name) must not make
/// two series with the same labels. The row shown is the one furthest behind, so an alert on
/// lag still fires.
fn one_row_per_application(rows: &[WalSenderStatus]) -> Vec<(&WalSenderStatus, usize)> {
    let mut by_name: std::collections::BTreeMap<&str, (&WalSenderStatus, usize)> =
        std::collections::BTreeMap::new();
    for r in rows {
        by_name
            .entry(&r.application_name)
            .and_modify(|(shown, n)| {
                *n += 1;
                if r.flush_lsn.unwrap_or_default() < shown.flush_lsn.unwrap_or_default() {
                    *shown = r;
                }
            })
            .or_insert((r, 1));
    }
    by_name.into_values().collect()
}

/// Which of an [`AppendCounts`] a counter family shows.
type CountOf = fn(&AppendCounts) -> u64;

fn append_families(out: &mut Text, node: &Node) {
    let m = &node.append_metrics;
    let counts: Vec<_> = Durability::ALL
        .iter()
        .map(|&d| (d.to_string(), m.counts(d)))
        .collect();
    let families: [(&str, &str, CountOf); 4] = [
        (
            "walserver_appends_total",
            "Appends acknowledged, by the durability level they asked for.",
            |c| c.appends,
        ),
        (
            "walserver_append_records_total",
            "Records in acknowledged appends, by durability level.",
            |c| c.records,
        ),
        (
            "walserver_append_bytes_total",
            "Payload bytes of acknowledged appends, by durability level.",
            |c| c.bytes,
        ),
        (
            "walserver_append_failures_total",
            "Appends refused or failed (including those durable locally but not \
             confirmed by the synchronous standbys in time), by durability level.",
            |c| c.failures,
        ),
    ];
    for (name, help, get) in families {
        out.family(name, "counter", help);
        for (level, c) in &counts {
            out.sample(name, &[("durability", level)], get(c));
        }
    }
    out.histogram(
        "walserver_append_duration_seconds",
        "Time from an append's arrival to its acknowledgement, including the synchronous wait.",
        &m.latency_seconds.snapshot(),
    );
    out.histogram(
        "walserver_append_sync_wait_seconds",
        "Time acknowledged appends waited for synchronous standbys after their local flush.",
        &m.sync_wait_seconds.snapshot(),
    );
}

fn slot_families(out: &mut Text, s: &Snapshot) {
    let flushed = s.status.flush_lsn;
    let slot = |i: &SlotInfo| [("slot_name", i.name.clone())];
    let name = "walserver_slot_retained_bytes";
    out.family(
        name,
        "gauge",
        "WAL kept for the slot: from its restart_lsn to the flushed end (0 when it holds none).",
    );
    for i in &s.slots {
        let held = i.restart_lsn.map_or(0, |r| flushed.saturating_sub(r));
        out.sample_owned(name, &slot(i), held);
    }
    let name = "walserver_slot_active";
    out.family(name, "gauge", "1 while a connection streams from the slot.");
    for i in &s.slots {
        out.sample_owned(name, &slot(i), u8::from(i.active));
    }
    let name = "walserver_slot_wal_status";
    out.family(
        name,
        "gauge",
        "1 for the slot's wal_status (reserved, extended, unreserved, lost; \
         none before it reserves WAL), 0 for the others.",
    );
    for i in &s.slots {
        let status = i.wal_status.map_or("none", |w| w.as_str());
        let values = ["reserved", "extended", "unreserved", "lost", "none"];
        let slot = [("slot_name", i.name.as_str())];
        out.one_hot(name, &slot, ("wal_status", status), &values);
    }
}

fn storage_families(out: &mut Text, node: &Node, s: &Snapshot) {
    let m = node.wal.metrics();
    let name = "walserver_storage_errors_total";
    out.family(
        name,
        "counter",
        "Failed storage operations, by kind (open, read, write, directory, fsync; \
         enospc: the disk or a quota is full, whatever the operation).",
    );
    for kind in StorageErrorKind::ALL {
        out.sample(name, &[("kind", kind.as_str())], m.errors(kind));
    }
    let name = "walserver_disk_free_bytes";
    out.family(
        name,
        "gauge",
        "Bytes free for writing on the data directory's file system.",
    );
    if let Some(free) = s.disk_free_bytes {
        out.sample(name, &[], free);
    }
    out.family(
        "walserver_fsyncs_total",
        "counter",
        "fsync and fdatasync calls made by storage.",
    );
    out.sample("walserver_fsyncs_total", &[], node.wal.fsync_count());
    out.histogram(
        "walserver_fsync_duration_seconds",
        "Time each fsync and fdatasync of storage took.",
        &m.fsync_seconds.snapshot(),
    );
}

fn connection_families(out: &mut Text, node: &Node, s: &Snapshot) {
    let count = |state: WalSenderState| {
        s.status
            .replication
            .iter()
            .filter(|r| r.state == state)
            .count() as u64
    };
    let name = "walserver_connections";
    out.family(
        name,
        "gauge",
        "Replication connections by state: authenticating (the startup phase), \
         then pg_stat_replication's startup, catchup, streaming, stopping.",
    );
    let startup = &node.shared.metrics;
    out.sample(
        name,
        &[("state", "authenticating")],
        startup.authenticating(),
    );
    for (state, label) in [
        (WalSenderState::Startup, "startup"),
        (WalSenderState::Catchup, "catchup"),
        (WalSenderState::Streaming, "streaming"),
        (WalSenderState::Stopping, "stopping"),
    ] {
        out.sample(name, &[("state", label)], count(state));
    }
    let name = "walserver_authentication_failures_total";
    out.family(
        name,
        "counter",
        "Connections refused for their credentials or by an hba rule (SQLSTATE class 28).",
    );
    out.sample(name, &[], startup.authentication_failures());
}

/// The text being written.
#[derive(Default)]
struct Text(String);

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape_label(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    fn sample_owned(&mut self, name: &str, labels: &[(&str, String)], value: impl Display) {
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.sample(name, &labels, value);
    }

    /// A gauge over a fixed set of values: one sample per value of `current`'s label, 1 for
    /// `current`'s value and 0 for the others, so that each series exists while the node
    /// runs and a change of state is a change of value, not a new series.
    fn one_hot(
        &mut self,
        name: &str,
        fixed: &[(&str, &str)],
        current: (&str, &str),
        values: &[&str],
    ) {
        let (label, now) = current;
        for value in values {
            let mut labels = fixed.to_vec();
            labels.push((label, value));
            self.sample(name, &labels, u8::from(*value == now));
        }
    }

    fn histogram(&mut self, name: &str, help: &str, h: &HistogramSnapshot) {
        self.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        for (le, n) in &h.buckets {
            self.sample(&bucket, &[("le", &le.to_string())], n);
        }
        self.sample(&bucket, &[("le", "+Inf")], h.count);
        self.sample(&format!("{name}_sum"), &[], h.sum_seconds);
        self.sample(&format!("{name}_count"), &[], h.count);
    }
}

/// A label value as the text format quotes it: backslash, double quote and newline escaped.
fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// HELP text escapes backslash and newline (not quotes).
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut t = Text::default();
        t.sample("m", &[("a", "x\"y\\z\nw")], 1);
        assert_eq!(t.0, "m{a=\"x\\\"y\\\\z\\nw\"} 1\n");
    }

    #[test]
    fn a_histogram_writes_cumulative_buckets_sum_and_count() {
        let mut t = Text::default();
        let h = HistogramSnapshot {
            buckets: vec![(0.001, 1), (0.5, 3)],
            count: 4,
            sum_seconds: 2.5,
        };
        t.histogram("x_seconds", "Help.", &h);
        assert_eq!(
            t.0,
            "# HELP x_seconds Help.\n# TYPE x_seconds histogram\n\
             x_seconds_bucket{le=\"0.001\"} 1\nx_seconds_bucket{le=\"0.5\"} 3\n\
             x_seconds_bucket{le=\"+Inf\"} 4\nx_seconds_sum 2.5\nx_seconds_count 4\n"
        );
    }

    fn row(app: &str, flush: u64) -> WalSenderStatus {
        let mut r = WalSenderStatus::new(1, "u", app, "127.0.0.1:1".parse().unwrap());
        r.flush_lsn = Some(Lsn(flush));
        r
    }

    #[test]
    fn connections_of_one_application_name_show_as_one_the_furthest_behind() {
        let rows = [row("b", 10), row("a", 50), row("a", 20), row("a", 30)];
        let shown = one_row_per_application(&rows);
        let got: Vec<_> = shown
            .iter()
            .map(|(r, n)| (r.application_name.as_str(), r.flush_lsn.unwrap().0, *n))
            .collect();
        assert_eq!(got, vec![("a", 20, 3), ("b", 10, 1)]);
    }
}
