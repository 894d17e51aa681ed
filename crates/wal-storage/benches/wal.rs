//! wal-storage benchmarks: group-commit append throughput, the raw fdatasync latency it is
//! built on, and streaming reads. Results and how to compare them are in benches/README.md.
//!
//! `WAL_BENCH_READ_MIB` sets the size of the read stream (default 1024, i.e. 1 GiB).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use wal_storage::*;

/// Runs `total` appends of `size` bytes from `writers` concurrent tasks on one current-thread
/// runtime (as actors on one actix arbiter would), each task awaiting every append before the
/// next, and returns the elapsed time.
fn run_appends(
    rt: &tokio::runtime::Runtime,
    wal: &Wal,
    writers: usize,
    size: usize,
    total: u64,
) -> Duration {
    let payload = Bytes::from(vec![0x5Au8; size]);
    let n = writers as u64;
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let k = total / n + u64::from(i < total % n);
                let wal = wal.clone();
                let payload = payload.clone();
                tokio::task::spawn(async move {
                    for _ in 0..k {
                        wal.append(vec![payload.clone()]).unwrap().await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("append");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    let mut summary = Vec::new();
    for writers in [1usize, 16, 64] {
        for size in [128usize, 4096, 65536] {
            let tmp = tempfile::tempdir().unwrap();
            let cfg = StorageConfig::default();
            let wal = Wal::init(
                tmp.path(),
                cfg,
                InitOptions::primary(SystemId(1), WalFormat::Walserver),
            )
            .unwrap();
            let rt = runtime();
            let appends = Arc::new(AtomicU64::new(0));
            let busy = Arc::new(AtomicU64::new(0));
            let fsyncs_before = wal.fsync_count();
            group.throughput(Throughput::Bytes(size as u64));
            group.bench_function(format!("writers={writers}/size={size}"), |b| {
                b.iter_custom(|iters| {
                    let t = run_appends(&rt, &wal, writers, size, iters);
                    appends.fetch_add(iters, Ordering::Relaxed);
                    busy.fetch_add(t.as_nanos() as u64, Ordering::Relaxed);
                    t
                })
            });
            let n = appends.load(Ordering::Relaxed);
            if n == 0 {
                // Filtered out on the command line.
                continue;
            }
            let fsyncs = wal.fsync_count() - fsyncs_before;
            let rate = n as f64 / (busy.load(Ordering::Relaxed) as f64 / 1e9);
            summary.push(format!(
                "append/writers={writers}/size={size}: {rate:.0} appends/s, {fsyncs} fsyncs for {n} appends = {:.4} fsyncs/append (1 per {:.1})",
                fsyncs as f64 / n as f64,
                n as f64 / fsyncs.max(1) as f64
            ));
        }
    }
    group.finish();
    for line in summary {
        println!("{line}");
    }
}

/// The floor under every commit: pwrite of 4 KiB into a preallocated, zeroed file plus
/// fdatasync.
fn raw_fdatasync(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("file");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    const SIZE: u64 = 16 << 20;
    f.write_all_at(&vec![0u8; SIZE as usize], 0).unwrap();
    f.sync_all().unwrap();
    let block = vec![0xA5u8; 4096];
    let mut off = 0;
    let mut group = c.benchmark_group("fdatasync");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(4));
    group.bench_function("pwrite=4096", |b| {
        b.iter(|| {
            f.write_all_at(&block, off).unwrap();
            f.sync_data().unwrap();
            off = (off + 4096) % SIZE;
        })
    });
    group.finish();
}

fn read_stream(c: &mut Criterion) {
    let mib: u64 = std::env::var("WAL_BENCH_READ_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let total = mib << 20;
    let tmp = tempfile::tempdir().unwrap();
    let cfg = StorageConfig {
        fsync: false,
        wal_keep_size: 2 * total,
        ..StorageConfig::default()
    };
    let wal = Wal::init(
        tmp.path(),
        cfg,
        InitOptions::primary(SystemId(1), WalFormat::Postgres),
    )
    .unwrap();
    let start = wal.flushed();
    let chunk = Bytes::from(vec![0x3Cu8; 8 << 20]);
    let mut pos = start;
    let mut pending = Vec::new();
    while pos.0 - start.0 < total {
        pending.push(wal.write(pos, chunk.clone()).unwrap());
        pos = pos + chunk.len() as u64;
    }
    for t in pending {
        t.wait().unwrap();
    }
    let end = wal.flushed();
    let tli = wal.timeline();
    let mut group = c.benchmark_group("read");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Bytes(end.0 - start.0));
    // 128 KiB per read: PostgreSQL's MAX_SEND_SIZE, what a walsender asks for.
    group.bench_function(format!("stream/mib={mib}/chunk=131072"), |b| {
        b.iter(|| {
            let mut p = start;
            while p < end {
                let buf = wal.read(tli, p, 128 << 10).unwrap();
                p = p + buf.len() as u64;
                std::hint::black_box(&buf);
            }
        })
    });
    group.finish();
}

/// The group-commit figure (the gain of batching many writers into one fdatasync), measured in pairs so that both sides see the same disk: appends/s of 64
/// writers of 128 B against one writer waiting for each fsync, alternating one second each.
fn group_commit_ratio(_: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let wal = Wal::init(
        tmp.path(),
        StorageConfig::default(),
        InitOptions::primary(SystemId(1), WalFormat::Walserver),
    )
    .unwrap();
    let rt = runtime();
    let rate = |writers: usize| {
        let f0 = wal.fsync_count();
        let mut n = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(1) {
            run_appends(&rt, &wal, writers, 128, 64 * 16);
            n += 64 * 16;
        }
        (
            n as f64 / start.elapsed().as_secs_f64(),
            n as f64 / (wal.fsync_count() - f0) as f64,
        )
    };
    let mut ratios = Vec::new();
    for round in 0..5 {
        let (one, _) = rate(1);
        let (many, per_fsync) = rate(64);
        ratios.push(many / one);
        println!(
            "group commit round {round}: 1 writer {one:.0} appends/s, 64 writers {many:.0} appends/s ({per_fsync:.1} appends per fsync): ratio {:.1}",
            many / one
        );
    }
    ratios.sort_by(|a, b| a.total_cmp(b));
    println!("group commit ratio, median of 5 pairs: {:.1}", ratios[2]);
}

criterion_group!(
    benches,
    raw_fdatasync,
    append,
    read_stream,
    group_commit_ratio
);
criterion_main!(benches);
