//! The admin API's `/metrics`: the node's facts in the OpenMetrics text format, for the
//! questions operators ask: which role and timeline, how far behind each standby is, how
//! appends and fsyncs perform, how much WAL slots hold back, whether storage fails or the disk
//! fills, who is connected and who failed to log in, and the process itself (CPU, memory,
//! descriptors, start time, build).
//!
//! The facts are kept by the crates that own them (storage's fsync latency and errors,
//! the supervisor's appends, the walsenders' startup phase, the registry's and the
//! walreceiver's status rows); this module reads them at one moment into `Families` and
//! lets the Prometheus project's client, `prometheus-client`, write the exposition (HELP and
//! TYPE lines, escaping, counters' `_total`, histograms' cumulative buckets, `# EOF`). Names
//! follow Prometheus' conventions: the `walserver_` prefix (the standard `process_` series
//! aside), base units (seconds, bytes) in the name, `_total` on counters. Labels are stable
//! across reconnects (`application_name`, `slot_name`, fixed value sets), never a connection
//! number. The list is in the README's "Metrics" section, which a test holds to this output.

mod process;

use std::time::SystemTime;

use actix::Addr;
use failover_actor::{FailoverActor, FailoverMetrics, GetFailoverMetrics};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use supervisor_actor::{AppendCounts, Durability, GetNodeStatus, Node, NodeRole, NodeStatus};
use wal_archive::ArchiverStatus;
use wal_storage::{Lsn, SlotInfo, StorageErrorKind, StorageState};
use wal_types::metrics::HistogramSnapshot;
use walsender_actor::status::{WalSenderState, WalSenderStatus};

/// The `Content-Type` of the OpenMetrics text format, which Prometheus scrapes natively.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Everything `/metrics` shows, read at one moment.
pub struct Snapshot {
    pub status: NodeStatus,
    pub slots: Vec<SlotInfo>,
    /// `None` if `statvfs` on the data directory failed.
    pub disk_free_bytes: Option<u64>,
    /// `None` if `/proc/self` could not be read.
    pub process: Option<process::ProcessStats>,
    /// `None` without automatic failover.
    pub failover: Option<FailoverMetrics>,
    /// `None` without archiving.
    pub archiver: Option<ArchiverStatus>,
    pub now: SystemTime,
}

/// Reads the node's metrics and writes them in the text format. The free space on the data
/// directory and the process's figures are system calls and `/proc` reads that may block, so
/// they run on the blocking pool, never on this thread.
pub async fn render(
    node: &Node,
    failover: Option<Addr<FailoverActor>>,
    archiver: Option<ArchiverStatus>,
) -> anyhow::Result<String> {
    let status = node.supervisor.send(GetNodeStatus).await??;
    let failover = match failover {
        Some(actor) => Some(actor.send(GetFailoverMetrics).await?),
        None => None,
    };
    let wal = node.wal.clone();
    let (disk_free_bytes, process) = actix_web::web::block(move || {
        let disk = wal
            .disk_free_bytes()
            .inspect_err(|e| tracing::debug!("statvfs of the data directory failed: {e}"))
            .ok();
        let process = process::ProcessStats::read()
            .inspect_err(|e| tracing::debug!("reading /proc/self failed: {e}"))
            .ok();
        (disk, process)
    })
    .await?;
    let snapshot = Snapshot {
        status,
        slots: node.wal.slots(),
        disk_free_bytes,
        process,
        failover,
        archiver,
        now: SystemTime::now(),
    };
    write(node, &snapshot)
}

/// The text of `snapshot` and of the node's counters.
pub fn write(node: &Node, s: &Snapshot) -> anyhow::Result<String> {
    let mut out = Families::default();
    node_families(&mut out, s);
    receiver_families(&mut out, s);
    standby_families(&mut out, s);
    append_families(&mut out, node);
    slot_families(&mut out, s);
    storage_families(&mut out, node, s);
    connection_families(&mut out, node, s);
    failover_families(&mut out, s);
    archive_families(&mut out, s);
    process_families(&mut out, s);
    out.encode()
}

fn node_families(out: &mut Families, s: &Snapshot) {
    let st = &s.status;
    out.family(
        "walserver_role",
        Kind::Gauge,
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
    out.family("walserver_timeline", Kind::Gauge, "The current timeline.");
    out.sample("walserver_timeline", &[], st.timeline.0);
    out.family(
        "walserver_flush_lsn_bytes",
        Kind::Gauge,
        "The durable end of WAL on the current timeline, as a byte position.",
    );
    out.sample("walserver_flush_lsn_bytes", &[], st.flush_lsn.0);
    out.family(
        "walserver_wal_senders",
        Kind::Gauge,
        "Connected walsenders (every state).",
    );
    out.sample("walserver_wal_senders", &[], st.replication.len());
}

/// The walreceiver's states, as `pg_stat_wal_receiver.status` names them, and `stopped`
/// while none runs (between restarts, or after promotion).
const RECEIVER_STATES: [&str; 5] = ["starting", "streaming", "waiting", "stopping", "stopped"];

fn receiver_families(out: &mut Families, s: &Snapshot) {
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
        Kind::Gauge,
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
        out.family(name, Kind::Gauge, help);
        if let Some(l) = value {
            out.sample(name, &[], l.0);
        }
    }
    let name = "walserver_walreceiver_archive_alarm";
    out.family(
        name,
        Kind::Gauge,
        "1 while the walreceiver is stopped because the archive it would fill a gap from \
         belongs to another system.",
    );
    out.sample(name, &[], u8::from(info.archive_alarm.is_some()));
    let name = "walserver_walreceiver_last_message_age_seconds";
    out.family(
        name,
        Kind::Gauge,
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

fn standby_families(out: &mut Families, s: &Snapshot) {
    let flushed = s.status.flush_lsn;
    let rows = one_row_per_application(&s.status.replication);
    let mut per_standby = |name: &str, help: &str, value: &dyn Fn(&WalSenderStatus) -> Value| {
        out.family(name, Kind::Gauge, help);
        for (r, _) in &rows {
            let app = [("application_name", r.application_name.as_str())];
            out.sample(name, &app, value(r));
        }
    };
    per_standby(
        "walserver_standby_sent_lsn_bytes",
        "The end of the WAL sent to the standby.",
        &|r| r.sent_lsn.unwrap_or_default().0.into(),
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
            &|r| flushed.saturating_sub(of(r).0.unwrap_or_default()).into(),
        );
        per_standby(
            &format!("walserver_standby_{pos}_lag_seconds"),
            &format!(
                "pg_stat_replication's {pos}_lag: how long WAL took to be confirmed at \
                 {pos} (0 when caught up and idle)."
            ),
            &|r| of(r).1.unwrap_or_default().as_secs_f64().into(),
        );
    }
    per_standby(
        "walserver_standby_sync_priority",
        "The standby's priority in synchronous_standby_names (0: not a candidate).",
        &|r| r.sync_priority.into(),
    );
    let name = "walserver_standby_connections";
    out.family(
        name,
        Kind::Gauge,
        "Walsender connections with this application_name (more than 1: the other \
         walserver_standby_ metrics show the one furthest behind).",
    );
    for (r, n) in &rows {
        let app = [("application_name", r.application_name.as_str())];
        out.sample(name, &app, *n);
    }
    let name = "walserver_standby_sync_state";
    out.family(
        name,
        Kind::Gauge,
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

fn append_families(out: &mut Families, node: &Node) {
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
        out.family(name, Kind::Counter, help);
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

fn slot_families(out: &mut Families, s: &Snapshot) {
    let flushed = s.status.flush_lsn;
    let slot = |i: &SlotInfo| [("slot_name", i.name.clone())];
    let name = "walserver_slot_retained_bytes";
    out.family(
        name,
        Kind::Gauge,
        "WAL kept for the slot: from its restart_lsn to the flushed end (0 when it holds none).",
    );
    for i in &s.slots {
        let held = i.restart_lsn.map_or(0, |r| flushed.saturating_sub(r));
        out.sample_owned(name, &slot(i), held);
    }
    let name = "walserver_slot_active";
    out.family(
        name,
        Kind::Gauge,
        "1 while a connection streams from the slot.",
    );
    for i in &s.slots {
        out.sample_owned(name, &slot(i), u8::from(i.active));
    }
    let name = "walserver_slot_wal_status";
    out.family(
        name,
        Kind::Gauge,
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

fn storage_families(out: &mut Families, node: &Node, s: &Snapshot) {
    let m = node.wal.metrics();
    let name = "walserver_storage_errors_total";
    out.family(
        name,
        Kind::Counter,
        "Failed storage operations, by kind (open, read, write, directory, fsync; \
         enospc: the disk or a quota is full, whatever the operation).",
    );
    for kind in StorageErrorKind::ALL {
        out.sample(name, &[("kind", kind.as_str())], m.errors(kind));
    }
    let name = "walserver_disk_free_bytes";
    out.family(
        name,
        Kind::Gauge,
        "Bytes free for writing on the data directory's file system.",
    );
    if let Some(free) = s.disk_free_bytes {
        out.sample(name, &[], free);
    }
    out.family(
        "walserver_fsyncs_total",
        Kind::Counter,
        "fsync and fdatasync calls made by storage.",
    );
    out.sample("walserver_fsyncs_total", &[], node.wal.fsync_count());
    out.histogram(
        "walserver_fsync_duration_seconds",
        "Time each fsync and fdatasync of storage took.",
        &m.fsync_seconds.snapshot(),
    );
    let health = &s.status.storage;
    let name = "walserver_storage_state";
    out.family(
        name,
        Kind::Gauge,
        "Storage's state, one series per state with 1 for the current one: ok; full (the \
         disk or a quota is full, writes that need new space are refused); failed (a sync \
         failed, writes are refused until storage is reopened); restarting (being reopened).",
    );
    let states = StorageState::ALL.map(StorageState::as_str);
    out.one_hot(name, &[], ("state", health.state.as_str()), &states);
    let name = "walserver_storage_restarts_total";
    out.family(
        name,
        Kind::Counter,
        "Times storage was reopened after a failed sync, and writes resumed.",
    );
    out.sample(name, &[], health.restarts);
    let name = "walserver_storage_restart_failures_total";
    out.family(
        name,
        Kind::Counter,
        "Reopenings of failed storage that failed (each is tried again later).",
    );
    out.sample(name, &[], health.failed_restarts);
    let commit = &s.status.commit;
    for (name, help, value) in [
        (
            "walserver_commit_tail_cuts_total",
            "Tails cut back at a stream start (WAL past the commit point) or past a new leader's fork.",
            commit.tail_cuts,
        ),
        (
            "walserver_commit_tail_cut_bytes_total",
            "Bytes of WAL those cuts dropped.",
            commit.tail_cut_bytes,
        ),
        (
            "walserver_commit_tail_cut_refusals_total",
            "Cuts refused because the upstream or leader shares less history than the commit point.",
            commit.tail_cut_refusals,
        ),
    ] {
        out.family(name, Kind::Counter, help);
        out.sample(name, &[], value);
    }
    let name = "walserver_commit_alarm";
    out.family(
        name,
        Kind::Gauge,
        "1 while the walreceiver is stopped because its upstream lacks acknowledged WAL.",
    );
    out.sample(name, &[], u64::from(commit.alarm.is_some()));
}

fn connection_families(out: &mut Families, node: &Node, s: &Snapshot) {
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
        Kind::Gauge,
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
        Kind::Counter,
        "Connections refused for their credentials or by an hba rule (SQLSTATE class 28).",
    );
    out.sample(name, &[], startup.authentication_failures());
}

/// Automatic failover's families, on a node with a `[failover]` table: what an alert on "no
/// leader", "etcd unreachable" or "failing over too often" needs.
fn failover_families(out: &mut Families, s: &Snapshot) {
    let Some(f) = &s.failover else {
        return;
    };
    for (name, help, value) in [
        (
            "walserver_failover_leader",
            "1 while this member leads with its fence granted (it may acknowledge appends).",
            Value::from(u8::from(f.leading)),
        ),
        (
            "walserver_failover_paused",
            "1 while automatic failover is paused cluster-wide.",
            u8::from(f.paused).into(),
        ),
    ] {
        out.family(name, Kind::Gauge, help);
        out.sample(name, &[], value);
    }
    let name = "walserver_failover_term";
    out.family(
        name,
        Kind::Gauge,
        "The latest leadership term this member knows of (the etcd revision that created \
         the leader key).",
    );
    if let Some(term) = f.term {
        out.sample(name, &[], term);
    }
    let name = "walserver_failover_lease_remaining_seconds";
    out.family(
        name,
        Kind::Gauge,
        "On the leader: seconds before it stops acknowledging unless a renewal is confirmed.",
    );
    if let Some(left) = f.lease_remaining_seconds {
        out.sample(name, &[], left);
    }
    let name = "walserver_failover_ttl_seconds";
    out.family(
        name,
        Kind::Gauge,
        "The leader key's lease (failover's ttl): a dead leader is replaced within about this.",
    );
    out.sample(name, &[], f.ttl_seconds);
    let name = "walserver_failover_etcd_contact_age_seconds";
    out.family(
        name,
        Kind::Gauge,
        "Seconds since etcd last answered this member (a renewal or a watch event).",
    );
    if let Some(age) = f.since_etcd_contact_seconds {
        out.sample(name, &[], age);
    }
    let name = "walserver_failover_etcd_errors_total";
    out.family(
        name,
        Kind::Counter,
        "Failed etcd calls by kind (connect, timeout, io, status, credentials, \
         lease_not_found, malformed, watch, settings).",
    );
    for (kind, n) in &f.etcd_errors {
        out.sample(name, &[("kind", kind)], *n);
    }
    let name = "walserver_failover_terms_taken_total";
    out.family(
        name,
        Kind::Counter,
        "Terms this member took up (promotions, or leading again), by reason: bootstrap, \
         failover, switchover, restart.",
    );
    for reason in ["bootstrap", "failover", "switchover", "restart"] {
        let n = f
            .terms_taken
            .iter()
            .find(|(r, _)| r == reason)
            .map_or(0, |(_, n)| *n);
        out.sample(name, &[("reason", reason)], n);
    }
    let name = "walserver_failover_synchronous_standby";
    out.family(
        name,
        Kind::Gauge,
        "1 for the member published in etcd as the synchronous standby (synchronous_mode on \
         or strict).",
    );
    if let Some(standby) = &f.sync_standby {
        out.sample(name, &[("node_name", standby)], 1u8);
    }
}

/// The archiver's families, on a node with `archive_mode` on or always: what an alert on "the
/// archive falls behind", "archiving fails" or "the archive holds foreign bytes" needs.
fn archive_families(out: &mut Families, s: &Snapshot) {
    let Some(a) = &s.archiver else {
        return;
    };
    for (name, help, value) in [
        (
            "walserver_archive_archived_total",
            "Files archived since the archiver started (pg_stat_archiver's archived_count).",
            Value::from(a.archived_count),
        ),
        (
            "walserver_archive_failed_total",
            "Failed attempts to archive a file since the archiver started (pg_stat_archiver's \
             failed_count); each is retried after a backoff.",
            a.failed_count.into(),
        ),
    ] {
        out.family(name, Kind::Counter, help);
        out.sample(name, &[], value);
    }
    for (name, help, value) in [
        (
            "walserver_archive_backlog_bytes",
            "Bytes of completed segments not yet archived.",
            Value::from(a.backlog_bytes),
        ),
        (
            "walserver_archive_backlog_seconds",
            "How long the oldest completed segment not yet archived has waited; 0 with no \
             backlog.",
            a.backlog_seconds(s.now).into(),
        ),
        (
            "walserver_archive_alarm",
            "1 while archiving waits for a person: the archive holds other bytes under a name \
             being archived (never overwritten), names another system, or its store ignores \
             If-None-Match.",
            u8::from(a.alarm.is_some()).into(),
        ),
        (
            "walserver_archive_backpressure",
            "1 while what waits for the archive is past archive_max_backlog (appends refused, a \
             relay paused).",
            u8::from(a.backpressure).into(),
        ),
    ] {
        out.family(name, Kind::Gauge, help);
        out.sample(name, &[], value);
    }
    let name = "walserver_archive_archived_lsn_bytes";
    out.family(
        name,
        Kind::Gauge,
        "Every completed segment below this LSN is archived (the durable archived position).",
    );
    if let Some(lsn) = a.archived_lsn {
        out.sample(name, &[], lsn.0);
    }
}

fn process_families(out: &mut Families, s: &Snapshot) {
    out.family(
        "walserver_build",
        Kind::Info,
        "The walserver build: its version and the commit it was built from.",
    );
    out.info(
        "walserver_build",
        &[
            ("version", env!("CARGO_PKG_VERSION")),
            ("commit", env!("WALSERVER_COMMIT")),
        ],
    );
    let Some(p) = &s.process else {
        return;
    };
    for (name, kind, help, value) in [
        (
            "process_cpu_seconds_total",
            Kind::Counter,
            "User and system CPU time spent, in seconds.",
            Value::from(p.cpu_seconds),
        ),
        (
            "process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory size in bytes.",
            p.resident_bytes.into(),
        ),
        (
            "process_virtual_memory_bytes",
            Kind::Gauge,
            "Virtual memory size in bytes.",
            p.virtual_bytes.into(),
        ),
        (
            "process_open_fds",
            Kind::Gauge,
            "Open file descriptors.",
            p.open_fds.into(),
        ),
        (
            "process_max_fds",
            Kind::Gauge,
            "The limit on open file descriptors (RLIMIT_NOFILE's soft limit).",
            p.max_fds.into(),
        ),
        (
            "process_threads",
            Kind::Gauge,
            "Threads of the process.",
            p.threads.into(),
        ),
        (
            "process_start_time_seconds",
            Kind::Gauge,
            "When the process started, in seconds since the Unix epoch.",
            p.start_time_seconds.into(),
        ),
    ] {
        out.family(name, kind, help);
        out.sample(name, &[], value);
    }
}

/// A family's type, as the exposition names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
    Histogram,
    Info,
}

/// A sample's value. Counts and byte positions stay integers, so that they are written
/// exactly (an LSN does not fit an f64's 53 bits).
#[derive(Clone, Debug)]
enum Value {
    Int(u64),
    Float(f64),
    Histogram(HistogramSnapshot),
    Info,
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(v)
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Value {
        Value::Int(v as u64)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(u64::from(v))
    }
}

impl From<u8> for Value {
    fn from(v: u8) -> Value {
        Value::Int(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

/// One family: its name (a counter's with `_total`, as its samples are named), help, type
/// and samples, each with its labels.
#[derive(Debug)]
struct Family {
    name: String,
    help: String,
    kind: Kind,
    samples: Vec<(Vec<(String, String)>, Value)>,
}

/// Every family of one scrape, in the order they are written. They are read from the node
/// first and handed to the client as a collector, because the node's facts arrive by message
/// (and from the blocking pool), not from metric objects the client could own.
#[derive(Debug, Default)]
struct Families(Vec<Family>);

impl Families {
    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        self.0.push(Family {
            name: name.to_owned(),
            help: help.to_owned(),
            kind,
            samples: Vec::new(),
        });
    }

    /// A sample of the family declared last, which must be `name`'s.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Into<Value>) {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), escape_label(v)))
            .collect();
        let family = self
            .0
            .last_mut()
            .filter(|f| f.name == name)
            .expect("a sample follows the declaration of its family");
        family.samples.push((labels, value.into()));
    }

    fn sample_owned(&mut self, name: &str, labels: &[(&str, String)], value: impl Into<Value>) {
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
        self.family(name, Kind::Histogram, help);
        self.sample(name, &[], Value::Histogram(h.clone()));
    }

    fn info(&mut self, name: &str, labels: &[(&str, &str)]) {
        self.sample(name, labels, Value::Info);
    }

    /// The exposition, written by `prometheus-client`.
    fn encode(self) -> anyhow::Result<String> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .map_err(|_| anyhow::anyhow!("the metrics could not be written"))?;
        Ok(text)
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        for f in &self.0 {
            // OpenMetrics names a counter's family without the `_total` its samples carry
            // (the client adds it), and an info's without `_info`.
            let (name, ty) = match f.kind {
                Kind::Gauge => (f.name.as_str(), MetricType::Gauge),
                Kind::Counter => (
                    f.name.strip_suffix("_total").unwrap_or(&f.name),
                    MetricType::Counter,
                ),
                Kind::Histogram => (f.name.as_str(), MetricType::Histogram),
                Kind::Info => (f.name.as_str(), MetricType::Info),
            };
            let mut metric = encoder.encode_descriptor(name, &f.help, None, ty)?;
            for (labels, value) in &f.samples {
                if let Value::Info = value {
                    metric.encode_info(labels)?;
                } else if labels.is_empty() {
                    // A family encoder with no labels would write `name{}`.
                    encode_value(&mut metric, f.kind, value)?;
                } else {
                    encode_value(&mut metric.encode_family(labels)?, f.kind, value)?;
                }
            }
        }
        Ok(())
    }
}

fn encode_value(m: &mut MetricEncoder, kind: Kind, value: &Value) -> std::fmt::Result {
    match (kind, value) {
        (Kind::Counter, Value::Int(v)) => m.encode_counter::<NoLabelSet, _, f64>(v, None),
        (Kind::Counter, Value::Float(v)) => m.encode_counter::<NoLabelSet, _, f64>(v, None),
        // A gauge is an i64 to the client; no position or count here comes near 2^63, and
        // one that did is shown as the largest rather than failing the whole scrape.
        (_, Value::Int(v)) => m.encode_gauge(&i64::try_from(*v).unwrap_or(i64::MAX)),
        (_, Value::Float(v)) => m.encode_gauge(v),
        (_, Value::Histogram(h)) => {
            m.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &bucket_counts(h), None)
        }
        (_, Value::Info) => Ok(()),
    }
}

/// A label value as the text format quotes it: backslash, double quote and newline escaped.
/// `prometheus-client` 0.24 writes label values as given, and `application_name` is the
/// client's to choose: unescaped, a quote in it would end the value and forge the rest.
fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The snapshot's cumulative buckets as the client takes them: the count of each bucket
/// alone, ending with `+Inf` (`f64::MAX` to the client).
fn bucket_counts(h: &HistogramSnapshot) -> Vec<(f64, u64)> {
    let mut below = 0;
    let mut out: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .map(|&(le, cumulative)| {
            let n = cumulative.saturating_sub(below);
            below = cumulative.max(below);
            (le, n)
        })
        .collect();
    out.push((f64::MAX, h.count.saturating_sub(below)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(f: Families) -> String {
        f.encode().expect("the families are written")
    }

    #[test]
    fn label_values_are_escaped() {
        let mut f = Families::default();
        f.family("m", Kind::Gauge, "Help.");
        f.sample("m", &[("a", "x\"y\\z\nw")], 1u64);
        assert_eq!(
            written(f),
            "# HELP m Help.\n# TYPE m gauge\nm{a=\"x\\\"y\\\\z\\nw\"} 1\n# EOF\n"
        );
    }

    #[test]
    fn a_histogram_writes_cumulative_buckets_sum_and_count() {
        let mut f = Families::default();
        let h = HistogramSnapshot {
            buckets: vec![(0.001, 1), (0.5, 3)],
            count: 4,
            sum_seconds: 2.5,
        };
        f.histogram("x_seconds", "Help.", &h);
        assert_eq!(
            written(f),
            "# HELP x_seconds Help.\n# TYPE x_seconds histogram\n\
             x_seconds_sum 2.5\nx_seconds_count 4\n\
             x_seconds_bucket{le=\"0.001\"} 1\nx_seconds_bucket{le=\"0.5\"} 3\n\
             x_seconds_bucket{le=\"+Inf\"} 4\n# EOF\n"
        );
    }

    #[test]
    fn counters_keep_total_on_samples_and_integers_stay_exact() {
        let mut f = Families::default();
        f.family("walserver_x_total", Kind::Counter, "Xs.");
        f.sample("walserver_x_total", &[("kind", "a")], 3u64);
        f.family("walserver_lsn_bytes", Kind::Gauge, "An LSN.");
        f.sample("walserver_lsn_bytes", &[], (1u64 << 60) + 1);
        f.family("walserver_build", Kind::Info, "Build.");
        f.info("walserver_build", &[("version", "1")]);
        assert_eq!(
            written(f),
            "# HELP walserver_x Xs.\n# TYPE walserver_x counter\n\
             walserver_x_total{kind=\"a\"} 3\n\
             # HELP walserver_lsn_bytes An LSN.\n# TYPE walserver_lsn_bytes gauge\n\
             walserver_lsn_bytes 1152921504606846977\n\
             # HELP walserver_build Build.\n# TYPE walserver_build info\n\
             walserver_build_info{version=\"1\"} 1\n# EOF\n"
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
