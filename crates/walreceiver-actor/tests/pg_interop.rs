//! Interop with real PostgreSQL 15 (pg-testkit; fails, never skips, without it): a walserver
//! standby of PostgreSQL WAL, made with `fetch_upstream_identity` and `init_standby`, streams
//! from a primary under write load with SCRAM authentication; every completed segment is
//! byte-identical to the primary's, and pg_waldump reads walserver's segments. Relaying from a
//! PostgreSQL standby that is promoted, it follows timeline 2 on the same connection and
//! stores the same history file and segments.

#[path = "receiver/common.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::Receiving;
use pg_testkit::{PgCluster, PgOptions};
use protocol_codec::conninfo::ConnInfo;
use wal_storage::{segment_file_name, Lsn, StorageConfig, SystemId, TimelineId, WalFormat};
use walreceiver_actor::messages::StopReceiver;
use walreceiver_actor::{ReceiverConfig, ReceiverError, StopReason};

/// PostgreSQL's default segment size.
const PG_SEGMENT: u64 = 16 << 20;

fn primary() -> PgCluster {
    let pg = PgCluster::init_primary(
        &PgOptions::default()
            .conf("wal_keep_size = '512MB'")
            .hba("host replication all 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "pa ss'word", "scram-sha-256");
    pg
}

fn conninfo(pg: &PgCluster) -> ConnInfo {
    // sslmode defaults to prefer: the server answers 'N' and the connection goes on in plain.
    ConnInfo::parse(&format!(
        "host=127.0.0.1 port={} user=repl password='pa ss\\'word' connect_timeout=10",
        pg.port()
    ))
    .unwrap()
}

/// Runs SQL on the primary off the test's thread, which the walreceiver shares.
async fn psql(pg: &Arc<PgCluster>, sql: &str) -> String {
    let (pg, sql) = (pg.clone(), sql.to_string());
    tokio::task::spawn_blocking(move || pg.psql(&sql))
        .await
        .unwrap()
}

fn cmp_segment(pg_wal: &Path, ours: &Path, name: &str) {
    let theirs =
        std::fs::read(pg_wal.join(name)).unwrap_or_else(|e| panic!("PostgreSQL's {name}: {e}"));
    let mine = std::fs::read(ours.join(name)).unwrap_or_else(|e| panic!("walserver's {name}: {e}"));
    assert_eq!(theirs.len(), mine.len(), "{name}: sizes differ");
    if let Some(i) = theirs.iter().zip(&mine).position(|(a, b)| a != b) {
        panic!("{name} differs from PostgreSQL's at offset {i:#x}");
    }
}

#[actix_rt::test]
async fn a_walserver_standby_relays_a_postgresql_primary_byte_for_byte() {
    let pg = Arc::new(primary());
    psql(&pg, "CREATE TABLE t (id int, filler text)").await;
    let info = conninfo(&pg);
    let id = walreceiver_actor::fetch_upstream_identity(&info, None, "walserver_init")
        .await
        .unwrap();
    let system_id: SystemId = pg
        .psql("SELECT system_identifier FROM pg_control_system()")
        .parse()
        .unwrap();
    assert_eq!(id.system_id, system_id);
    assert_eq!(id.format, WalFormat::Postgres);
    assert_eq!(id.segment_size, PG_SEGMENT);
    assert_eq!(id.timeline, TimelineId(1));
    assert!(
        id.server_version.starts_with("15."),
        "{}",
        id.server_version
    );
    let start = id.start_lsn();
    assert_eq!(start, id.xlogpos.segment_start(PG_SEGMENT));

    let dir = tempfile::tempdir().unwrap();
    let standby = tokio::task::spawn_blocking({
        let (dir, id) = (dir.path().join("standby"), id.clone());
        // Keep every segment, to compare them all.
        let cfg = StorageConfig {
            wal_keep_size: 1 << 30,
            ..StorageConfig::default()
        };
        move || walreceiver_actor::init_standby(dir, cfg, &id)
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(standby.format(), WalFormat::Postgres);

    let mut r = Receiving::start(
        ReceiverConfig::new(info, Some("walserver_standby")),
        &standby,
    );
    // The stream begins before any load: PostgreSQL answers the first status update.
    assert_eq!(r.streaming().await, (TimelineId(1), start));
    // Write load while it streams: rows, and segment switches so that segments complete.
    // The second round fills more than a segment by itself, so segments complete without a
    // switch too.
    let mut first_id = 0;
    for rows in [20_000, 120_000, 20_000, 20_000] {
        let sql = format!(
            "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series({first_id}, {}) g",
            first_id + rows - 1
        );
        first_id += rows;
        psql(&pg, &sql).await;
        psql(&pg, "SELECT pg_switch_wal()").await;
    }
    psql(
        &pg,
        "INSERT INTO t SELECT g, 'tail' FROM generate_series(1, 1000) g",
    )
    .await;
    let target: Lsn = psql(&pg, "SELECT pg_current_wal_flush_lsn()")
        .await
        .parse()
        .unwrap();
    r.wait_flushed(&standby, TimelineId(1), target).await;
    assert!(!r.has_event(), "one stream only");
    let sql =
        "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'walserver_standby'";
    assert_eq!(psql(&pg, sql).await, "1");

    // Every completed segment is PostgreSQL's, byte for byte.
    let pg_wal = pg.data_dir().join("pg_wal");
    let ours = standby.data_dir().join("pg_wal");
    let first = start.segment_number(PG_SEGMENT);
    let complete_end = target.segment_number(PG_SEGMENT);
    assert!(
        complete_end - first >= 5,
        "{first}..{complete_end}: too few complete segments"
    );
    for segno in first..complete_end {
        cmp_segment(
            &pg_wal,
            &ours,
            &segment_file_name(TimelineId(1), segno, PG_SEGMENT),
        );
    }

    // pg_waldump reads walserver's copies from the stream's start to the last complete
    // segment's end without an error.
    let out = Command::new(pg.bin().tool("pg_waldump"))
        .arg("-p")
        .arg(&ours)
        .args(["-t", "1", "-s"])
        .arg(start.to_string())
        .arg("-e")
        .arg(Lsn(complete_end * PG_SEGMENT).to_string())
        .arg("--stats")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_waldump failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let stats = String::from_utf8_lossy(&out.stdout);
    assert!(stats.contains("Heap"), "{stats}");

    r.addr.send(StopReceiver).await.unwrap();
    assert_eq!(r.stopped().await.reason, StopReason::ShutdownRequested);
}

#[actix_rt::test]
async fn a_fast_shutdown_of_postgresql_is_reported_as_its_controlled_close() {
    let mut pg = primary();
    let info = conninfo(&pg);
    let id = walreceiver_actor::fetch_upstream_identity(&info, None, "walserver_init")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let standby =
        walreceiver_actor::init_standby(dir.path(), StorageConfig::default(), &id).unwrap();
    let mut r = Receiving::start(ReceiverConfig::new(info, None), &standby);
    r.streaming().await;
    // A fast shutdown ends the walsender's copy (after it drains) and closes the connection.
    tokio::task::spawn_blocking(move || {
        pg.stop();
        pg
    })
    .await
    .unwrap();
    // PostgreSQL's WalSndDone: everything sent and confirmed, then "COPY 0" without CopyDone,
    // then the connection closes.
    match r.stopped().await.reason {
        StopReason::Failed(ReceiverError::UpstreamClosed { detail }) => {
            assert!(detail.contains("COPY 0"), "{detail}")
        }
        other => panic!("{other}"),
    }
}

#[actix_rt::test]
async fn follows_a_promoted_postgresql_standby_to_timeline_2() {
    let mut a = primary();
    a.psql("CREATE TABLE t (id int, filler text)");
    // B: a PostgreSQL standby of A, which walserver relays from.
    let b = Arc::new(a.init_standby(&PgOptions::default()));
    let info = conninfo(&b);
    let id = walreceiver_actor::fetch_upstream_identity(&info, None, "walserver_init")
        .await
        .unwrap();
    assert_eq!(id.timeline, TimelineId(1));
    let dir = tempfile::tempdir().unwrap();
    let cfg = StorageConfig {
        wal_keep_size: 1 << 30,
        ..StorageConfig::default()
    };
    let standby = walreceiver_actor::init_standby(dir.path(), cfg, &id).unwrap();
    let mut r = Receiving::start(
        ReceiverConfig::new(info, Some("walserver_cascade")),
        &standby,
    );
    assert_eq!(r.streaming().await.0, TimelineId(1));
    // Load on A crosses a segment; A stops (its fast shutdown sends B everything, ending at
    // a record boundary); B is promoted, after replaying all it received.
    tokio::task::spawn_blocking(move || {
        a.psql("INSERT INTO t SELECT g, repeat('a', 200) FROM generate_series(1, 90000) g");
        a.psql("SELECT pg_switch_wal()");
        a.psql("INSERT INTO t SELECT g, 'more' FROM generate_series(1, 1000) g");
        a.stop();
        a
    })
    .await
    .unwrap();
    let promoted = b.clone();
    tokio::task::spawn_blocking(move || promoted.promote())
        .await
        .unwrap();
    // Timeline 2 takes writes on B and reaches walserver without a reconnect.
    psql(
        &b,
        "INSERT INTO t SELECT g, repeat('b', 200) FROM generate_series(1, 90000) g",
    )
    .await;
    psql(&b, "SELECT pg_switch_wal()").await;
    let target: Lsn = psql(&b, "SELECT pg_current_wal_flush_lsn()")
        .await
        .parse()
        .unwrap();
    r.wait_flushed(&standby, TimelineId(2), target).await;
    // The stream of timeline 2 began at the switch point, with no stop in between.
    let (timeline, switch) = r.streaming().await;
    assert_eq!(timeline, TimelineId(2));
    assert_eq!(standby.timeline(), TimelineId(2));

    // The same history file as PostgreSQL's.
    let pg_wal = b.data_dir().join("pg_wal");
    let ours = standby.data_dir().join("pg_wal");
    cmp_segment(&pg_wal, &ours, "00000002.history");
    assert_eq!(standby.history()[0].switch_lsn, switch);
    // Timeline 1's complete segments before the switch, and timeline 2's from the switch
    // segment (PostgreSQL's copy of it up to the switch point, then timeline 2) on.
    let first = id.start_lsn().segment_number(PG_SEGMENT);
    let switch_seg = switch.segment_number(PG_SEGMENT);
    for segno in first..switch_seg {
        cmp_segment(
            &pg_wal,
            &ours,
            &segment_file_name(TimelineId(1), segno, PG_SEGMENT),
        );
    }
    let complete_end = target.segment_number(PG_SEGMENT);
    assert!(complete_end > switch_seg, "the switch segment completed");
    for segno in switch_seg..complete_end {
        cmp_segment(
            &pg_wal,
            &ours,
            &segment_file_name(TimelineId(2), segno, PG_SEGMENT),
        );
    }
    assert!(
        !r.has_event(),
        "no stop and no other stream: the same connection"
    );
}
