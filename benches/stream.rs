//! End-to-end streaming over loopback, in process: a walserver primary (its own actix System
//! thread) already holds the WAL, and each iteration streams all of it from the first segment.
//!
//! - `stream/catchup/size=N`: a new walserver standby (`init --standby` at the first segment,
//!   not timed) is started and timed until its durable end reaches the primary's. Its storage
//!   is in the system's temporary directory with fsync on; `STREAM_BENCH_DIR=/dev/shm` puts it
//!   on tmpfs, `STREAM_BENCH_FSYNC=0` turns fsync off.
//! - `stream/send/size=N`: a plain protocol-codec client that discards what it receives: the
//!   walsender and loopback alone.
//!
//! Throughput is WAL bytes. `cargo bench --bench stream`, and to compare against a baseline
//! `-- --save-baseline before` then `-- --baseline before`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use wal_storage::Lsn;
use walserver_bench::cluster::{self, SystemThread};
use walserver_bench::{catchup, ReplClient};

const SEGMENT: u64 = 16 << 20;

fn env_flag(name: &str, default: bool) -> bool {
    std::env::var(name).map_or(default, |v| v != "0")
}

fn stream(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let standby_base = std::env::var_os("STREAM_BENCH_DIR").map(std::path::PathBuf::from);
    let fsync = env_flag("STREAM_BENCH_FSYNC", true);
    let primary_sys = SystemThread::spawn("bench-primary").expect("system");
    let primary =
        cluster::start_primary_on(&primary_sys.arbiter, &dir.path().join("p"), SEGMENT, 8)
            .expect("primary");
    let start = Lsn(SEGMENT);
    let mut group = c.benchmark_group("stream");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(8));
    let record = Bytes::from(vec![0x5au8; 64 << 10]);
    let mut filled_mib = 0;
    for mib in [64u64, 256] {
        // 64 KiB records, 16 MiB per append, up to `mib` past the first segment.
        while filled_mib < mib {
            primary
                .wal
                .append(vec![record.clone(); 256])
                .expect("append")
                .wait()
                .expect("durable");
            filled_mib += 16;
        }
        let end = primary.wal.flushed();
        let bytes = end.0 - start.0;
        group.throughput(Throughput::Bytes(bytes));
        group.bench_function(BenchmarkId::new("send", format!("size={mib}MiB")), |b| {
            let port = primary.listen_addr.port();
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut client =
                        ReplClient::connect(("127.0.0.1", port), "bench", None, "walserver-bench")
                            .expect("connect");
                    let (_, secs) = catchup(&mut client, start, end, None).expect("stream");
                    total += Duration::from_secs_f64(secs);
                }
                total
            })
        });
        group.bench_function(BenchmarkId::new("catchup", format!("size={mib}MiB")), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for i in 0..iters {
                    let tmp = match &standby_base {
                        Some(base) => tempfile::tempdir_in(base),
                        None => tempfile::tempdir(),
                    }
                    .expect("standby dir");
                    let data = tmp.path().join("s");
                    let name = format!("catchup{i}");
                    cluster::init_standby_dir(primary.listen_addr, &data, &name, Some(start))
                        .expect("init standby");
                    let sys = SystemThread::spawn("bench-standby").expect("system");
                    let t = Instant::now();
                    let node =
                        cluster::start_standby_node(&sys.arbiter, &data, fsync, 0).expect("start");
                    let mut pos = node.wal.subscribe();
                    futures_executor::block_on(pos.wait_for(|p| p.flushed >= end))
                        .expect("standby storage open");
                    total += t.elapsed();
                    cluster::shutdown(&node);
                    drop(sys);
                }
                total
            })
        });
    }
    group.finish();
    cluster::shutdown(&primary);
}

criterion_group!(benches, stream);
criterion_main!(benches);
