//! Codec micro-benchmarks: XLogData decode and encode at PostgreSQL's page size and at its
//! largest send size (`MAX_SEND_SIZE`, 128 KiB), in bytes per second, and standby status
//! updates in messages per second. Names follow `group/op/param=value`.
//!
//! Run: `cargo bench -p protocol-codec --bench codec`; see benches/README.md at the root.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use protocol_codec::messages::{StandbyStatusUpdate, XLogData};
use protocol_codec::{BackendMessage, ClientCodec, FrontendMessage, ServerCodec};
use tokio_util::codec::{Decoder, Encoder};
use wal_types::{Lsn, PgTimestamp};

fn xlogdata(size: usize) -> BackendMessage {
    BackendMessage::XLogData(XLogData {
        wal_start: Lsn(0x100_0000),
        wal_end: Lsn(0x200_0000),
        send_time: PgTimestamp(849_331_599_209_587),
        data: Bytes::from(vec![0xA5; size]),
    })
}

fn bench_xlogdata(c: &mut Criterion) {
    let mut g = c.benchmark_group("xlogdata");
    for size in [8192usize, 128 * 1024] {
        let msg = xlogdata(size);
        g.throughput(Throughput::Bytes(size as u64));

        let mut encoded = BytesMut::new();
        msg.encode(&mut encoded).unwrap();
        let mut codec = ClientCodec::new();
        g.bench_function(format!("decode/size={size}"), |b| {
            b.iter_batched_ref(
                || encoded.clone(),
                |buf| black_box(codec.decode(buf).unwrap()),
                BatchSize::SmallInput,
            )
        });

        let mut out = BytesMut::with_capacity(size + 64);
        let mut codec = ServerCodec::new();
        g.bench_function(format!("encode/size={size}"), |b| {
            b.iter(|| {
                out.clear();
                codec.encode(black_box(&msg), &mut out).unwrap();
                black_box(out.len())
            })
        });

        let BackendMessage::XLogData(x) = &msg else {
            unreachable!()
        };
        g.bench_function(format!("encode_header_only/size={size}"), |b| {
            b.iter(|| black_box(black_box(x).framed_header().unwrap()))
        });
    }
    g.finish();
}

fn bench_status_update(c: &mut Criterion) {
    let mut g = c.benchmark_group("standby_status_update");
    g.throughput(Throughput::Elements(1));
    let msg = FrontendMessage::StandbyStatusUpdate(StandbyStatusUpdate {
        write: Lsn(0x150_12F0),
        flush: Lsn(0x150_12F0),
        apply: Lsn(0),
        send_time: PgTimestamp(849_331_599_209_587),
        reply_requested: false,
    });
    let mut encoded = BytesMut::new();
    msg.encode(&mut encoded).unwrap();
    let mut codec = ServerCodec::new();
    g.bench_function("decode", |b| {
        b.iter_batched_ref(
            || encoded.clone(),
            |buf| black_box(codec.decode(buf).unwrap()),
            BatchSize::SmallInput,
        )
    });
    let mut out = BytesMut::with_capacity(64);
    let mut codec = ClientCodec::new();
    g.bench_function("encode", |b| {
        b.iter(|| {
            out.clear();
            codec.encode(black_box(&msg), &mut out).unwrap();
            black_box(out.len())
        })
    });
    g.finish();
}

criterion_group!(benches, bench_xlogdata, bench_status_update);
criterion_main!(benches);
