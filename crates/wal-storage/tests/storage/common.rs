//! Helpers shared by the test modules.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use wal_storage::*;

pub const SEG: u64 = 1 << 20;

/// 1 MiB segments, and retention that keeps everything unless a test says otherwise.
pub fn cfg() -> StorageConfig {
    StorageConfig {
        segment_size: SEG,
        wal_keep_size: 1 << 40,
        ..StorageConfig::default()
    }
}

pub fn init_primary(dir: &Path, format: WalFormat) -> Wal {
    Wal::init(dir, cfg(), InitOptions::primary(SystemId(7), format)).unwrap()
}

/// A deterministic payload for record `i`: its length varies, its bytes name it.
pub fn payload(i: u64, len: usize) -> Bytes {
    let mut v = Vec::with_capacity(len);
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    Bytes::from(v)
}

pub fn append(wal: &Wal, payloads: &[Bytes]) -> Vec<Lsn> {
    wal.append(payloads.to_vec()).unwrap().wait().unwrap()
}

/// All records of `tli` from `from` to the readable end.
pub fn records(wal: &Wal, tli: TimelineId, from: Lsn) -> Vec<Record> {
    wal.read_records(tli, from, usize::MAX).unwrap()
}

/// Every byte of `tli` in `[from, to)`, through `read`.
pub fn read_range(wal: &Wal, tli: TimelineId, from: Lsn, to: Lsn) -> Vec<u8> {
    let mut out = Vec::new();
    let mut pos = from;
    while pos < to {
        let b = wal.read(tli, pos, (to.0 - pos.0) as usize).unwrap();
        assert!(!b.is_empty(), "read returned nothing at {pos} before {to}");
        out.extend_from_slice(&b);
        pos = pos + b.len() as u64;
    }
    out
}

/// Overwrites both flush pointer slots with `end` (format in files.rs), as if the node had
/// crashed when the pointer vouched only for WAL up to `end`.
pub fn set_flush_pointer(dir: &Path, tli: TimelineId, end: Lsn) {
    let mut slot = [0u8; 36];
    slot[0..4].copy_from_slice(b"WSFP");
    slot[4..6].copy_from_slice(&1u16.to_le_bytes());
    slot[8..16].copy_from_slice(&1_000_000u64.to_le_bytes());
    slot[16..20].copy_from_slice(&tli.0.to_le_bytes());
    slot[24..32].copy_from_slice(&end.0.to_le_bytes());
    let crc = crc32c::crc32c(&slot[0..32]);
    slot[32..36].copy_from_slice(&crc.to_le_bytes());
    let mut file = vec![0u8; 1024];
    file[..36].copy_from_slice(&slot);
    file[512..548].copy_from_slice(&slot);
    std::fs::write(dir.join("flush_pointer"), file).unwrap();
}

pub fn segment_path(dir: &Path, tli: TimelineId, lsn: Lsn) -> std::path::PathBuf {
    dir.join("pg_wal")
        .join(segment_file_name(tli, lsn.segment_number(SEG), SEG))
}

/// Applies `f` to the bytes of the segment file holding `lsn`, at `lsn`'s offset.
pub fn patch(dir: &Path, tli: TimelineId, lsn: Lsn, f: impl FnOnce(&mut [u8])) {
    let path = segment_path(dir, tli, lsn);
    let mut bytes = std::fs::read(&path).unwrap();
    let off = lsn.segment_offset(SEG) as usize;
    f(&mut bytes[off..]);
    std::fs::write(&path, bytes).unwrap();
}

/// Waits, woken by the position watch, until `cond` holds; panics after a deadline.
pub fn wait_position(wal: &Wal, what: &str, cond: impl Fn(&WalPosition) -> bool) -> WalPosition {
    let mut rx = wal.subscribe();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|p| cond(p)))
            .await
            .map(|r| *r.expect("storage is open"))
    })
    .unwrap_or_else(|_| panic!("timed out waiting for {what}; at {:?}", wal.position()))
}
