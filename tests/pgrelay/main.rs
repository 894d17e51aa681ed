//! walserver relaying real PostgreSQL 15: a walserver standby of a
//! PostgreSQL primary under write load, and a real PostgreSQL standby streaming from that
//! walserver standby, ending with the primary's rows; the PostgreSQL primary restarted, with
//! the time from it accepting connections again to walserver streaming again measured; and
//! the relaying standby refusing promotion and appends; PostgreSQL's point-in-time recovery
//! from a relay's archive (`pitr.rs`); pgBackRest as a relay's `archive_command`
//! (`pgbackrest.rs`). They fail, never skip, when PostgreSQL 15 (or pgBackRest) is missing.

#[path = "../common/mod.rs"]
mod common;
mod pgbackrest;
mod pitr;

use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use pg_testkit::{PgCluster, PgOptions};
use supervisor_actor::{AppendError, PromoteError};
use wal_storage::{segment_file_name, Lsn, TimelineId, WalError, WalFormat};

const TL1: TimelineId = TimelineId(1);
/// PostgreSQL's default segment size, which the walserver standby adopts.
const PG_SEGMENT: u64 = 16 << 20;

/// A PostgreSQL primary that keeps its WAL (to compare segments) and a table to fill.
fn pg_primary() -> PgCluster {
    let pg = PgCluster::init_primary(&PgOptions::default().conf("wal_keep_size = '1GB'"));
    pg.psql("CREATE TABLE t (id int, filler text)");
    pg
}

/// A walserver standby of `pg`, made as `walserver init --standby` makes one.
fn walserver_standby_of(pg: &PgCluster) -> TestNode {
    let conninfo = format!(
        "{} application_name=walserver connect_timeout=10",
        pg.conninfo("postgres", None)
    );
    let node = TestNode::standby_from(&conninfo, "wal_keep_size = \"1GB\"\n");
    assert_eq!(node.wal().format(), WalFormat::Postgres);
    node
}

/// Inserts `rows` rows from `first` (about 250 bytes of WAL each).
fn write_load(pg: &PgCluster, first: i64, rows: i64) {
    pg.psql(&format!(
        "INSERT INTO t SELECT g, repeat(md5(g::text), 6) FROM generate_series({first}, {}) g",
        first + rows - 1
    ));
}

fn flush_lsn(pg: &PgCluster) -> Lsn {
    pg.psql("SELECT pg_current_wal_flush_lsn()")
        .parse()
        .expect("an LSN")
}

/// Every segment that walserver completed in `[from, to)` equals PostgreSQL's, byte for byte.
fn assert_same_segments_as_postgres(pg: &PgCluster, node: &TestNode, from: Lsn, to: Lsn) -> u64 {
    let first = from.segment_number(PG_SEGMENT);
    let end = to.segment_number(PG_SEGMENT);
    for segno in first..end {
        let name = segment_file_name(TL1, segno, PG_SEGMENT);
        let theirs = read_file(&pg.data_dir().join("pg_wal").join(&name));
        let ours = read_file(&node.data_dir().join("pg_wal").join(&name));
        assert_eq!(theirs.len(), ours.len(), "{name}: sizes differ");
        if let Some(i) = theirs.iter().zip(&ours).position(|(a, b)| a != b) {
            panic!("{name} differs from PostgreSQL's at offset {i:#x}");
        }
    }
    end - first
}

/// The rows of `t`, summarised.
fn rows(pg: &PgCluster) -> String {
    pg.psql("SELECT count(*), sum(id), sum(length(filler)) FROM t")
}

/// Waits until the PostgreSQL standby has replayed up to `target`.
fn wait_replayed(standby: &PgCluster, target: Lsn) {
    wait_until(
        &format!("the PostgreSQL standby to replay {target}"),
        || {
            let replayed: Lsn = standby
                .psql("SELECT pg_last_wal_replay_lsn()")
                .parse()
                .expect("an LSN");
            replayed >= target
        },
    );
}

/// Whether PostgreSQL accepts replication connections at `addr` now (what `pg_isready`
/// asks): a completed login, not just a TCP connection, which a starting server also takes.
fn accepts(addr: std::net::SocketAddr) -> bool {
    PgConn::try_connect(addr, "postgres").is_some()
}

/// PostgreSQL primary → walserver standby W → PostgreSQL standby R. W streams from the
/// primary under write load, its completed segments are PostgreSQL's byte for byte; R, made by
/// pg_basebackup from the primary and pointed at W, streams from W and ends with the primary's
/// rows. Then the primary is restarted (pg_ctl stop -m fast, start): W streams again within
/// the restart policy's cap of the primary accepting connections, with no gap (segments across
/// the restart still equal PostgreSQL's), and R catches up through W.
#[test]
fn a_postgresql_standby_streams_through_walserver_and_survives_a_primary_restart() {
    let mut pg = pg_primary();
    let w = walserver_standby_of(&pg);
    let start = w.wal().flushed();
    let before = w.wait_receiver("walserver to stream from PostgreSQL", |_| true);
    assert_eq!(before.status.as_ref().unwrap().sender_port, Some(pg.port()));

    // Write load while W streams.
    let mut next = 0;
    for n in [10_000, 70_000] {
        write_load(&pg, next, n);
        next += n;
    }
    let target = flush_lsn(&pg);
    w.wait_flushed(TL1, target);

    // A real PostgreSQL standby of W.
    let r = pg.init_standby(
        &PgOptions::default()
            .conf("wal_retrieve_retry_interval = '100ms'")
            .primary_conninfo(format!(
                "host=127.0.0.1 port={} user=postgres application_name=pg_standby",
                w.addr().port()
            )),
    );
    assert_eq!(r.psql("SELECT pg_is_in_recovery()"), "t");
    for n in [30_000, 20_000] {
        write_load(&pg, next, n);
        next += n;
    }
    let target = flush_lsn(&pg);
    w.wait_flushed(TL1, target);
    wait_replayed(&r, target);
    assert_eq!(rows(&r), rows(&pg));
    assert_eq!(
        r.psql("SELECT status, sender_port FROM pg_stat_wal_receiver"),
        format!("streaming|{}", w.addr().port()),
        "R streams from walserver, not from the primary"
    );
    assert!(
        w.status()
            .replication
            .iter()
            .any(|s| s.application_name == "pg_standby"),
        "walserver's pg_stat_replication shows the PostgreSQL standby"
    );

    // The primary restarted, fast. The shutdown checkpoint streams to W before the primary
    // goes; then W's walreceiver retries until it accepts again.
    pg.stop();
    // Nothing more can arrive: a fast shutdown sent W everything and waited for it.
    let down_at = w.wal().flushed();
    let pg_addr = pg.addr();
    let (accepted_at, streaming_at, after) = std::thread::scope(|scope| {
        let probe = scope.spawn(|| {
            let t = Instant::now();
            while !accepts(pg_addr) {
                assert!(
                    t.elapsed() < DEADLINE,
                    "PostgreSQL did not accept connections"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            Instant::now()
        });
        pg.start();
        let accepted_at = probe.join().expect("probe");
        let after = w.wait_receiver("walserver to stream from the restarted primary", |i| {
            i.pid != before.pid
        });
        (accepted_at, Instant::now(), after)
    });
    let took = streaming_at.saturating_duration_since(accepted_at);
    eprintln!(
        "PostgreSQL primary restarted: walserver streaming again {took:?} after it accepted connections (walreceiver attempts {})",
        after.restart.attempts
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    let resumed_at = after.status.as_ref().unwrap().receive_start_lsn.unwrap();
    assert!(
        resumed_at <= down_at && resumed_at >= down_at.segment_start(PG_SEGMENT),
        "walserver resumed at {resumed_at}, its WAL ended at {down_at}"
    );

    // No gap: more load, then every completed segment, across the restart, is PostgreSQL's.
    for n in [70_000, 10_000] {
        write_load(&pg, next, n);
        next += n;
    }
    pg.psql("SELECT pg_switch_wal()");
    pg.psql("INSERT INTO t VALUES (-1, 'tail')");
    let target = flush_lsn(&pg);
    w.wait_flushed(TL1, target);
    let compared = assert_same_segments_as_postgres(&pg, &w, start, target);
    assert!(compared >= 3, "only {compared} segments compared");
    wait_replayed(&r, target);
    assert_eq!(rows(&r), rows(&pg));
}

/// A standby that relays PostgreSQL WAL refuses promotion and appends, saying why.
#[test]
fn a_standby_relaying_postgresql_refuses_promotion_and_appends() {
    let pg = pg_primary();
    let w = walserver_standby_of(&pg);
    w.wait_receiver("walserver to stream from PostgreSQL", |_| true);

    match w.promote() {
        Err(PromoteError::Storage(WalError::PromotionNotSupported)) => {}
        other => panic!("promotion of a PostgreSQL relay: {other:?}"),
    }
    let (code, body) = http_post(w.http_addr, "/promote", b"");
    assert_eq!(code, 409, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("relayed PostgreSQL WAL"), "{error}");

    assert!(matches!(
        w.append_records(1, 10, 0),
        Err(AppendError::RelayedPostgresWal)
    ));
    let (code, body) = http_post(w.http_addr, "/wal", b"record");
    assert_eq!(code, 409, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("relays PostgreSQL WAL"), "{error}");
    // Nor does it decode PostgreSQL WAL as records: GET /wal is refused before any body.
    for from in ["earliest".to_string(), w.wal().flushed().to_string()] {
        let (status, text) = http_get_any(w.http_addr, &format!("/wal?from={from}"));
        assert_eq!(status, 409, "from={from}: {text}");
        let body: serde_json::Value = serde_json::from_str(&text).expect("a JSON error");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains("walserver-format"), "{error}");
    }

    // Still a standby that streams: the refusals changed nothing.
    pg.psql("INSERT INTO t VALUES (1, 'after the refusals')");
    w.wait_flushed(TL1, flush_lsn(&pg));
    assert_eq!(w.status().role, supervisor_actor::NodeRole::Standby);
}

/// A walserver standby given a host list of a PostgreSQL 15 primary and its PostgreSQL
/// standby settles where `target_session_attrs` says, from what the real servers report
/// (`in_hot_standby`): `read-write` passes over the PostgreSQL standby listed first and
/// streams from the primary; `standby` passes over the primary listed first and streams from
/// the PostgreSQL standby.
#[test]
fn a_host_list_of_postgresql_servers_settles_where_target_session_attrs_says() {
    let pg = pg_primary();
    let pg_standby = PgCluster::init_standby_from(&pg, None, &PgOptions::default());
    assert_eq!(pg_standby.psql("SELECT pg_is_in_recovery()"), "t");
    write_load(&pg, 0, 1_000);
    let target = flush_lsn(&pg);
    for (attrs, first, second, expected) in [
        ("read-write", &pg_standby, &pg, pg.port()),
        ("standby", &pg, &pg_standby, pg_standby.port()),
    ] {
        let conninfo = format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres application_name=w_{} target_session_attrs={attrs}",
            first.port(),
            second.port(),
            attrs.replace('-', "_"),
        );
        let w = TestNode::standby_from(&conninfo, "wal_keep_size = \"1GB\"\n");
        let info = w.wait_receiver(&format!("{attrs}: streaming"), |_| true);
        assert_eq!(
            info.status.as_ref().and_then(|s| s.sender_port),
            Some(expected),
            "{attrs}: the server it settled on"
        );
        wait_replayed(&pg_standby, target);
        w.wait_flushed(TL1, target);
    }
}

/// A walserver standby of a real PostgreSQL 15 primary that asks for a SCRAM password, whose
/// `primary_conninfo` has no password but a `passfile` (as `pg_basebackup -R` writes one): it
/// finds the password there, matching the file's `replication` database entry as a PostgreSQL
/// standby does whatever its `dbname`, and streams. The same file readable by others is
/// ignored, as libpq ignores it, and the standby cannot be made; a wrong password in it is
/// refused with libpq's note that it came from the file.
#[test]
fn a_standby_finds_its_password_in_a_password_file() {
    use std::os::unix::fs::PermissionsExt;

    let pg = PgCluster::init_primary(
        &PgOptions::default()
            .conf("wal_keep_size = '1GB'")
            .hba("host replication repl 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "s3cr:t", "scram-sha-256");
    pg.psql("CREATE TABLE t (id int, filler text)");
    let files = tempfile::tempdir().unwrap();
    let passfile = files.path().join("pgpass");
    std::fs::write(
        &passfile,
        format!(
            "# the entry for the standby\n127.0.0.1:{}:postgres:repl:wrong\n*:{}:replication:repl:s3cr\\:t\n",
            pg.port(),
            pg.port()
        ),
    )
    .unwrap();
    // With a dbname, as a hand-written primary_conninfo may have: a physical replication
    // connection still matches the file's `replication` entry, not the `postgres` one above
    // it, as PostgreSQL's walreceiver matches it.
    let conninfo = format!(
        "host=127.0.0.1 port={} user=repl dbname=postgres passfile={} application_name=w_passfile",
        pg.port(),
        passfile.display()
    );

    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let refused =
        walserver_node::init::init_standby(&dir.path().join("data"), &conninfo, None, None)
            .expect_err("a password file others may read is ignored");
    let text = format!("{:#}", anyhow::Error::from(refused));
    eprintln!("with the file readable by others: {text}");
    assert!(text.contains("password"), "{text}");

    let wrong = files.path().join("wrong");
    std::fs::write(&wrong, format!("*:{}:*:repl:nope\n", pg.port())).unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let refused = walserver_node::init::init_standby(
        &dir.path().join("data"),
        &conninfo.replace(
            &passfile.display().to_string(),
            &wrong.display().to_string(),
        ),
        None,
        None,
    )
    .expect_err("a wrong password is refused");
    let text = format!("{:#}", anyhow::Error::from(refused));
    eprintln!("with a wrong password in the file: {text}");
    assert!(text.contains("28P01"), "{text}");
    assert!(
        text.contains(&format!(
            "password retrieved from file \"{}\"",
            wrong.display()
        )),
        "{text}"
    );

    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    let w = TestNode::standby_from(&conninfo, "wal_keep_size = \"1GB\"\n");
    w.wait_receiver("streaming with the password from the file", |_| true);
    write_load(&pg, 0, 100);
    w.wait_flushed(TL1, flush_lsn(&pg));
}
