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
use crossbeam_channel::{unbounded, Sender};
use wal_storage::*;

/// A fixed pool of writer threads, each appending `k` records of `size` bytes (waiting for each
/// to be durable) when told to.
struct Writers {
    jobs: Vec<Sender<u64>>,
    done: crossbeam_channel::Receiver<()>,
}

impl Writers {
    fn new(wal: &Wal, n: usize, size: usize) -> Writers {
        let (done_tx, done) = unbounded();
        let jobs = (0..n)
            .map(|_| {
                let (tx, rx) = unbounded::<u64>();
                let wal = wal.clone();
                let done_tx = done_tx.clone();
                let payload = Bytes::from(vec![0x5Au8; size]);
                std::thread::spawn(move || {
                    for k in rx {
                        for _ in 0..k {
                            wal.append(vec![payload.clone()]).unwrap().wait().unwrap();
                        }
                        done_tx.send(()).unwrap();
                    }
                });
                tx
            })
            .collect();
        Writers { jobs, done }
    }

    /// Runs `total` appends spread over the writers and returns the elapsed time.
    fn run(&self, total: u64) -> Duration {
        let n = self.jobs.len() as u64;
        let start = Instant::now();
        for (i, tx) in self.jobs.iter().enumerate() {
            let k = total / n + u64::from((i as u64) < total % n);
            tx.send(k).unwrap();
        }
        for _ in 0..n {
            self.done.recv().unwrap();
        }
        start.elapsed()
    }
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
            let pool = Writers::new(&wal, writers, size);
            let appends = Arc::new(AtomicU64::new(0));
            let busy = Arc::new(AtomicU64::new(0));
            let fsyncs_before = wal.fsync_count();
            group.throughput(Throughput::Bytes(size as u64));
            group.bench_function(format!("writers={writers}/size={size}"), |b| {
                b.iter_custom(|iters| {
                    let t = pool.run(iters);
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
            drop(pool);
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

criterion_group!(benches, raw_fdatasync, append, read_stream);
criterion_main!(benches);
