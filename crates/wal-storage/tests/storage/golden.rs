//! The golden segment files in `testdata/` freeze the on-disk record format.
//!
//! They were generated once by `build_golden` below (run with `WAL_STORAGE_BLESS=1` to
//! regenerate after a deliberate format change, and say so in the commit). With 1 MiB segments
//! the files would be mostly padding, so only the used prefixes are stored:
//!
//! - `golden-seg1.bin`: the first 4 KiB of segment `000000010000000000000001`: its header and
//!   four small records, then the start of a record that spans into segment 2.
//! - `golden-seg2.bin`: the first 1 KiB of segment `000000010000000000000002`: its header
//!   (with `rem_len` covering the spanning record's continuation), the end of that record and
//!   one more record.

use std::path::PathBuf;

use bytes::Bytes;
use wal_storage::*;

use crate::common::*;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

fn golden_payloads() -> Vec<Bytes> {
    let small = vec![
        Bytes::from_static(b"hello"),
        Bytes::new(),
        Bytes::from((0u8..100).collect::<Vec<u8>>()),
        Bytes::from_static(b"walserver golden record"),
    ];
    let used: u64 = 24
        + small
            .iter()
            .map(|p| (16 + p.len() as u64).div_ceil(8) * 8)
            .sum::<u64>();
    // Ends 304 bytes (a multiple of 8) into segment 2's body.
    let span = (SEG - used - 16 + 304) as usize;
    let mut all = small;
    all.push(Bytes::from(
        (0..span).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
    ));
    all.push(Bytes::from_static(b"after the span"));
    all
}

/// Writes the golden records through the real API and returns the two segment prefixes.
fn build_golden() -> (Vec<u8>, Vec<u8>, Vec<Lsn>) {
    let tmp = tempfile::tempdir().unwrap();
    let c = StorageConfig {
        fsync: false,
        ..cfg()
    };
    let wal = Wal::init(
        tmp.path(),
        c,
        InitOptions::primary(SystemId(1), WalFormat::Walserver),
    )
    .unwrap();
    let ends = append(&wal, &golden_payloads());
    drop(wal);
    let seg1 = std::fs::read(segment_path(tmp.path(), TimelineId(1), Lsn(SEG))).unwrap();
    let seg2 = std::fs::read(segment_path(tmp.path(), TimelineId(1), Lsn(2 * SEG))).unwrap();
    (seg1[..4096].to_vec(), seg2[..1024].to_vec(), ends)
}

#[test]
fn golden_segments_are_rebuilt_byte_for_byte() {
    let (seg1, seg2, ends) = build_golden();
    if std::env::var_os("WAL_STORAGE_BLESS").is_some() {
        std::fs::write(testdata("golden-seg1.bin"), &seg1).unwrap();
        std::fs::write(testdata("golden-seg2.bin"), &seg2).unwrap();
    }
    assert_eq!(
        seg1,
        std::fs::read(testdata("golden-seg1.bin")).unwrap(),
        "segment 1 changed"
    );
    assert_eq!(
        seg2,
        std::fs::read(testdata("golden-seg2.bin")).unwrap(),
        "segment 2 changed"
    );
    assert_eq!(
        ends[0],
        Lsn(SEG + 24 + 24),
        "the first record follows the segment header"
    );
    assert_eq!(ends[5], Lsn(2 * SEG + 24 + 304 + 32));
}

/// Decodes the golden bytes by the format written in format.rs, independently of the crate.
#[test]
fn golden_segments_decode_by_the_documented_format() {
    let seg1 = std::fs::read(testdata("golden-seg1.bin")).unwrap();
    let seg2 = std::fs::read(testdata("golden-seg2.bin")).unwrap();
    let u32_at = |b: &[u8], i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let header = |b: &[u8], start: u64, rem: u32| {
        assert_eq!(&b[0..4], b"WALS");
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), 1);
        assert_eq!(u16::from_le_bytes([b[6], b[7]]), 0);
        assert_eq!(u64_at(b, 8), start);
        assert_eq!(u32_at(b, 16), rem);
        assert_eq!(u32_at(b, 20), crc32c::crc32c(&b[..20]));
    };
    let payloads = golden_payloads();
    header(&seg1, SEG, 0);
    let mut off = 24;
    for p in &payloads[..4] {
        let len = u32_at(&seg1, off) as usize;
        assert_eq!(len, p.len());
        assert_eq!(
            u64_at(&seg1, off + 8),
            SEG + off as u64,
            "record names its own start"
        );
        let body = &seg1[off + 16..off + 16 + len];
        assert_eq!(body, &p[..]);
        let mut crc_input = seg1[off..off + 4].to_vec();
        crc_input.extend_from_slice(&seg1[off + 8..off + 16]);
        crc_input.extend_from_slice(body);
        assert_eq!(u32_at(&seg1, off + 4), crc32c::crc32c(&crc_input));
        let padded = (16 + len).div_ceil(8) * 8;
        assert!(
            seg1[off + 16 + len..off + padded].iter().all(|&b| b == 0),
            "zero padding"
        );
        off += padded;
    }
    // The spanning record starts here; its continuation in segment 2 is 304 bytes.
    assert_eq!(u32_at(&seg1, off) as usize, payloads[4].len());
    header(&seg2, 2 * SEG, 304);
    let next = 24 + 304;
    assert_eq!(u32_at(&seg2, next) as usize, payloads[5].len());
    assert_eq!(u64_at(&seg2, next + 8), 2 * SEG + next as u64);
    assert_eq!(&seg2[next + 16..next + 16 + 14], b"after the span");
    assert!(seg2[next + 32..].iter().all(|&b| b == 0));
}

/// The crate's own reader decodes the golden prefix stored on a standby.
#[test]
fn golden_segment_decodes_through_the_reader() {
    let seg1 = std::fs::read(testdata("golden-seg1.bin")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = InitOptions::primary(SystemId(1), WalFormat::Walserver);
    opts.start_lsn = Some(Lsn(SEG));
    let wal = Wal::init(tmp.path(), cfg(), opts).unwrap();
    wal.write(Lsn(SEG), Bytes::from(seg1))
        .unwrap()
        .wait()
        .unwrap();
    let recs = records(&wal, TimelineId(1), Lsn(SEG));
    assert_eq!(
        recs.len(),
        4,
        "the spanning record is incomplete in the prefix"
    );
    for (r, p) in recs.iter().zip(golden_payloads()) {
        assert_eq!(r.payload, p);
    }
}
