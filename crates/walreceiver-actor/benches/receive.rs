//! Receive throughput of a walserver standby with fsync on, end to end over loopback: from a
//! walserver primary (in its own actix System and thread) that already holds the WAL, and
//! from a real PostgreSQL 15 primary (pg-testkit) whose slot holds it. The clock runs from
//! the walreceiver's start to the standby's durable end reaching the primary's, so it
//! includes connecting, and every byte is fsynced on the standby before it counts.
//!
//! `RECEIVE_BENCH_MIB` sets the amount (default 1024); `RECEIVE_BENCH_IN_FLIGHT_MIB` a
//! comma-separated list of in-flight bounds to compare on the walserver upstream (default
//! `4,32,256`); `RECEIVE_BENCH_PG=0` skips PostgreSQL. Names follow `group/param=value`.

#[path = "../tests/receiver/common.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use pg_testkit::{PgCluster, PgOptions};
use protocol_codec::conninfo::ConnInfo;
use wal_storage::{InitOptions, Lsn, StorageConfig, TimelineId, Wal, WalFormat};
use walreceiver_actor::{ReceiverConfig, StopReason};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The standby side of one run: fsync on, 16 MiB segments, keeping nothing it need not.
fn standby_config() -> StorageConfig {
    StorageConfig::default()
}

fn report(name: &str, bytes: u64, elapsed: Duration) {
    let mb = bytes as f64 / 1e6;
    println!(
        "{name}: {:.0} MiB in {:.2} s = {:.0} MB/s",
        bytes as f64 / (1 << 20) as f64,
        elapsed.as_secs_f64(),
        mb / elapsed.as_secs_f64()
    );
}

/// Streams into `standby` until it is durable up to `end`; returns the time taken.
async fn receive(config: ReceiverConfig, standby: &Wal, end: Lsn) -> Duration {
    let started = Instant::now();
    let mut r = Receiving::start(config, standby);
    r.wait_flushed_within(standby, TimelineId(1), end, Duration::from_secs(600))
        .await;
    let elapsed = started.elapsed();
    r.addr
        .send(walreceiver_actor::messages::StopReceiver)
        .await
        .unwrap();
    loop {
        match r.next_event().await {
            Event::Streaming(_) => {}
            Event::Stopped(s) => {
                assert_eq!(s.reason, StopReason::ShutdownRequested);
                break;
            }
        }
    }
    elapsed
}

async fn from_walserver(mib: u64, bounds: &[u64]) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StorageConfig {
        fsync: false,
        wal_keep_size: 1 << 40,
        ..StorageConfig::default()
    };
    let wal = Wal::init(
        dir.path().join("primary"),
        cfg,
        InitOptions::primary(SYSTEM, WalFormat::Walserver),
    )
    .unwrap();
    // 64 KiB records, 16 MiB per append.
    let record = Bytes::from(vec![0x5a; 64 << 10]);
    for _ in 0..mib / 16 {
        wal.append(vec![record.clone(); 256])
            .unwrap()
            .await
            .unwrap();
    }
    let primary = Primary::start(wal, Access::Trust);
    let end = primary.wal.flushed();
    let bytes = end.0 - (16 << 20);
    for &bound in bounds {
        let standby_dir = dir.path().join(format!("standby-{bound}"));
        let standby = Wal::init(
            &standby_dir,
            standby_config(),
            InitOptions::primary(SYSTEM, WalFormat::Walserver),
        )
        .unwrap();
        let mut config = ReceiverConfig::new(primary.conninfo(""), None);
        config.max_wal_in_flight = (bound << 20) as usize;
        let elapsed = receive(config, &standby, end).await;
        report(
            &format!("receive/upstream=walserver/mib={mib}/in_flight_mib={bound}"),
            bytes,
            elapsed,
        );
        drop(standby);
        let _ = std::fs::remove_dir_all(&standby_dir);
    }
}

async fn from_postgres(mib: u64) {
    let pg = Arc::new(PgCluster::init_primary(
        &PgOptions::default()
            .conf("max_wal_size = '8GB'")
            .conf("checkpoint_timeout = '1h'"),
    ));
    let psql = |sql: String| {
        let pg = pg.clone();
        async move {
            tokio::task::spawn_blocking(move || pg.psql(&sql))
                .await
                .unwrap()
        }
    };
    psql("SELECT pg_create_physical_replication_slot('bench', true)".into()).await;
    let start: Lsn = psql("SELECT restart_lsn FROM pg_replication_slots".into())
        .await
        .parse()
        .unwrap();
    psql("CREATE TABLE b (id int, filler text)".into()).await;
    let target = start.0 + (mib << 20);
    let mut next = 0u64;
    loop {
        let lsn: Lsn = psql("SELECT pg_current_wal_lsn()".into())
            .await
            .parse()
            .unwrap();
        if lsn.0 >= target {
            break;
        }
        psql(format!(
            "INSERT INTO b SELECT g, repeat('y', 500) FROM generate_series({next}, {}) g",
            next + 199_999
        ))
        .await;
        next += 200_000;
    }
    let end: Lsn = psql("SELECT pg_current_wal_flush_lsn()".into())
        .await
        .parse()
        .unwrap();
    let conninfo =
        ConnInfo::parse(&format!("host=127.0.0.1 port={} user=postgres", pg.port())).unwrap();
    let id = walreceiver_actor::fetch_upstream_identity(&conninfo, Some("bench"), "bench")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let standby = walreceiver_actor::init_standby(dir.path(), standby_config(), &id).unwrap();
    let mut config = ReceiverConfig::new(conninfo, None);
    config.session.slot_name = Some("bench".into());
    let elapsed = receive(config, &standby, end).await;
    report(
        &format!("receive/upstream=postgresql/mib={mib}"),
        end.0 - id.start_lsn().0,
        elapsed,
    );
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (a filter) is not supported here.
    let mib = env_u64("RECEIVE_BENCH_MIB", 1024);
    let bounds: Vec<u64> = std::env::var("RECEIVE_BENCH_IN_FLIGHT_MIB")
        .unwrap_or_else(|_| "4,32,256".into())
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .collect();
    let sys = actix::System::new();
    sys.block_on(async {
        from_walserver(mib, &bounds).await;
        if env_u64("RECEIVE_BENCH_PG", 1) != 0 {
            from_postgres(mib).await;
        }
    });
}
