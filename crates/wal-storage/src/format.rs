//! walserver's record format: segment headers and records, and a scanner that decodes them.
//!
//! A walserver-format WAL is one byte stream addressed by LSN and cut into segments. Every
//! segment begins with a segment header; records follow one another, 8-byte aligned, and may
//! span segments, their bytes simply skipping the next segment's header. The headers are part of
//! the stream: a standby stores them byte for byte like everything else.
//!
//! Format of a segment header (24 bytes, little-endian, at offset 0 of every segment):
//!
//! ```text
//! | magic u32 "WALS" | version u16 = 1 | flags u16 = 0 | segment start LSN u64 | rem_len u32 | crc32c u32 |
//!                                                                                               ^ of bytes 0..20
//! ```
//!
//! `rem_len` is the number of bytes at the start of this segment's body that continue a record
//! begun in an earlier segment (including that record's padding); it may exceed the body when a
//! record spans the whole segment. It lets a reader that starts at a segment start find the first
//! record boundary, like PostgreSQL's `xlp_rem_len`. The start LSN rejects a stale header.
//!
//! Format of a record (8-byte aligned):
//!
//! ```text
//! | len u32 | crc32c u32 | start LSN u64 | payload (len bytes) | zero padding to a multiple of 8 |
//! ```
//!
//! The CRC covers `len`, the start LSN and the payload, in that order (not the CRC field). The
//! start LSN is where the record's `len` field sits; it rejects a stale record that happens to be
//! CRC-valid at another position. A record's **end LSN** is the position after its padding, which
//! is where the next record starts, except that when it is a segment start the next record starts
//! after that segment's header. The first record of a fresh WAL that starts at 0/1000000 is at
//! 0/1000018.
//!
//! The end of WAL on a scan is the first position where a header does not validate: a zero or
//! bad segment header, a record whose CRC or start LSN is wrong, or a length beyond the maximum
//! record size.

use bytes::{Bytes, BytesMut};
use wal_types::Lsn;

use crate::Result;

pub(crate) const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"WALS");
pub(crate) const SEGMENT_VERSION: u16 = 1;
pub const SEGMENT_HEADER_SIZE: u64 = 24;
pub const RECORD_HEADER_SIZE: u64 = 16;
pub(crate) const ALIGN: u64 = 8;

pub(crate) fn align_up(n: u64) -> u64 {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

/// Bytes a record of `payload_len` occupies in the stream, not counting segment headers.
pub(crate) fn record_stream_len(payload_len: usize) -> u64 {
    align_up(RECORD_HEADER_SIZE + payload_len as u64)
}

/// A decoded segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub start: Lsn,
    pub rem_len: u32,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_SIZE as usize] {
        let mut b = [0u8; SEGMENT_HEADER_SIZE as usize];
        b[0..4].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&0u16.to_le_bytes());
        b[8..16].copy_from_slice(&self.start.0.to_le_bytes());
        b[16..20].copy_from_slice(&self.rem_len.to_le_bytes());
        let crc = crc32c::crc32c(&b[0..20]);
        b[20..24].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header expected at `expected_start`.
    pub fn decode(b: &[u8], expected_start: Lsn) -> std::result::Result<SegmentHeader, String> {
        if b.len() < SEGMENT_HEADER_SIZE as usize {
            return Err("short segment header".into());
        }
        if b[..SEGMENT_HEADER_SIZE as usize].iter().all(|&x| x == 0) {
            return Err("zeroed segment header".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let crc = crc32c::crc32c(&b[0..20]);
        if u32_at(20) != crc {
            return Err("segment header CRC mismatch".into());
        }
        if u32_at(0) != SEGMENT_MAGIC {
            return Err(format!("bad segment magic {:#x}", u32_at(0)));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != SEGMENT_VERSION {
            return Err(format!("unknown segment header version {version}"));
        }
        let start = Lsn(u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")));
        if start != expected_start {
            return Err(format!(
                "segment header names start {start}, expected {expected_start} (stale file?)"
            ));
        }
        Ok(SegmentHeader {
            start,
            rem_len: u32_at(16),
        })
    }
}

fn record_crc(len: u32, start: Lsn, payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &start.0.to_le_bytes());
    crc32c::crc32c_append(crc, payload)
}

/// Frames records into the stream at a running position, inserting segment headers.
#[derive(Clone, Debug)]
pub(crate) struct Framer {
    pub(crate) segment_size: u64,
    pub(crate) pos: Lsn,
}

impl Framer {
    /// Appends one framed record to `out` (which holds the stream bytes ending at `self.pos`) and
    /// returns its end LSN.
    pub(crate) fn push(&mut self, out: &mut Vec<u8>, payload: &[u8]) -> Lsn {
        if self.pos.segment_offset(self.segment_size) == 0 {
            self.segment_header(out, 0);
        }
        let start = self.pos;
        let len =
            u32::try_from(payload.len()).expect("record size is checked against the u32 limit");
        let mut header = [0u8; RECORD_HEADER_SIZE as usize];
        header[0..4].copy_from_slice(&len.to_le_bytes());
        header[4..8].copy_from_slice(&record_crc(len, start, payload).to_le_bytes());
        header[8..16].copy_from_slice(&start.0.to_le_bytes());
        let total = record_stream_len(payload.len());
        let pad = [0u8; ALIGN as usize];
        let pad_len = (total - RECORD_HEADER_SIZE - payload.len() as u64) as usize;
        let mut left = total;
        for part in [&header[..], payload, &pad[..pad_len]] {
            let mut part = part;
            while !part.is_empty() {
                if self.pos.segment_offset(self.segment_size) == 0 {
                    self.segment_header(out, left);
                }
                let room = self.segment_size - self.pos.segment_offset(self.segment_size);
                let n = (part.len() as u64).min(room) as usize;
                out.extend_from_slice(&part[..n]);
                part = &part[n..];
                self.pos = self.pos + n as u64;
                left -= n as u64;
            }
        }
        self.pos
    }

    fn segment_header(&mut self, out: &mut Vec<u8>, rem_len: u64) {
        let h = SegmentHeader {
            start: self.pos,
            rem_len: u32::try_from(rem_len).expect("records are at most 1 GiB"),
        };
        out.extend_from_slice(&h.encode());
        self.pos = self.pos + SEGMENT_HEADER_SIZE;
    }
}

/// Where a scanner finds stream bytes. `read_at` returns at least one byte if any exist at
/// `lsn`, and an empty buffer at the end of what is available.
pub(crate) trait ByteSource {
    fn read_at(&mut self, lsn: Lsn, max_len: usize) -> Result<Bytes>;
}

/// A record decoded from the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub start: Lsn,
    pub end: Lsn,
    pub payload: Bytes,
}

/// Why a scan stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StopKind {
    /// The source has no more bytes.
    Incomplete,
    /// Zeroed bytes where a header should be: never written.
    Zeroed,
    /// A header that does not validate.
    Invalid(String),
}

/// The first position where the stream stops holding valid records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stop {
    /// Where the failing header (segment or record) begins.
    pub at: Lsn,
    /// The position by which the failing item would have been complete had it been written. A
    /// failure below a known-durable position is corruption, not a torn tail.
    pub complete_by: Lsn,
    pub kind: StopKind,
}

/// Outcome of one scanner step.
#[derive(Debug)]
pub(crate) enum Scan {
    Record(Record),
    Stop(Stop),
}

/// Decodes records from a [`ByteSource`].
pub(crate) struct Scanner<S> {
    src: S,
    segment_size: u64,
    max_record: u64,
    pos: Lsn,
    /// True until the first record boundary is found when starting at a segment start.
    seeking: bool,
    chunk: Bytes,
    chunk_start: Lsn,
}

/// How much a scanner reads from its source at a time. A guess: large enough to make per-call
/// overhead negligible, small enough not to matter for memory.
const SCAN_CHUNK: usize = 256 << 10;

impl<S: ByteSource> Scanner<S> {
    /// Starts at `pos`, which must be a record boundary or a segment start. At a segment start the
    /// scanner skips the continuation of a record begun earlier (the header's `rem_len`).
    pub(crate) fn new(src: S, segment_size: u64, max_record: usize, pos: Lsn) -> Scanner<S> {
        Scanner {
            src,
            segment_size,
            max_record: max_record as u64,
            seeking: pos.segment_offset(segment_size) == 0,
            pos,
            chunk: Bytes::new(),
            chunk_start: pos,
        }
    }

    /// The position after the last record returned (or the start).
    pub(crate) fn position(&self) -> Lsn {
        self.pos
    }

    pub(crate) fn source(&self) -> &S {
        &self.src
    }

    /// Returns up to `n` bytes of the stream at `at`, contiguous and within one segment, reading
    /// the source as needed. Fewer bytes mean the source ended.
    fn bytes_at(&mut self, at: Lsn, n: usize) -> Result<Bytes> {
        let chunk_end = self.chunk_start + self.chunk.len() as u64;
        // `at` may be anything a caller asked for (the source refuses it if it is beyond the
        // end), so the sum is checked.
        let in_chunk = at
            .checked_add(n as u64)
            .is_some_and(|end| at >= self.chunk_start && end <= chunk_end);
        if in_chunk {
            let off = (at.0 - self.chunk_start.0) as usize;
            return Ok(self.chunk.slice(off..off + n));
        }
        let mut out = BytesMut::new();
        let mut cur = at;
        while out.len() < n {
            let chunk_end = self.chunk_start + self.chunk.len() as u64;
            if cur >= self.chunk_start && cur < chunk_end {
                let off = (cur.0 - self.chunk_start.0) as usize;
                let take = (n - out.len()).min(self.chunk.len() - off);
                if out.is_empty() && take == n {
                    return Ok(self.chunk.slice(off..off + n));
                }
                out.extend_from_slice(&self.chunk[off..off + take]);
                cur = cur + take as u64;
                continue;
            }
            let want = SCAN_CHUNK.max(n - out.len());
            let got = self.src.read_at(cur, want)?;
            if got.is_empty() {
                break;
            }
            self.chunk = got;
            self.chunk_start = cur;
        }
        Ok(out.freeze())
    }

    fn stop(&self, at: Lsn, complete_by: Lsn, kind: StopKind) -> Scan {
        Scan::Stop(Stop {
            at,
            complete_by,
            kind,
        })
    }

    /// Reads the segment header at `self.pos` (a segment start) and checks `rem_len`.
    fn segment_header(
        &mut self,
        expect_rem: Option<u64>,
    ) -> Result<std::result::Result<u64, Scan>> {
        let at = self.pos;
        let b = self.bytes_at(at, SEGMENT_HEADER_SIZE as usize)?;
        let complete_by = at + SEGMENT_HEADER_SIZE;
        if b.len() < SEGMENT_HEADER_SIZE as usize {
            return Ok(Err(self.stop(at, complete_by, StopKind::Incomplete)));
        }
        match SegmentHeader::decode(&b, at) {
            Ok(h) => {
                if let Some(expect) = expect_rem {
                    if h.rem_len as u64 != expect {
                        let why = format!(
                            "segment header rem_len {} does not match the {expect} bytes left of the record",
                            h.rem_len
                        );
                        return Ok(Err(self.stop(at, complete_by, StopKind::Invalid(why))));
                    }
                }
                Ok(Ok(h.rem_len as u64))
            }
            Err(_) if b.iter().all(|&x| x == 0) => {
                Ok(Err(self.stop(at, complete_by, StopKind::Zeroed)))
            }
            Err(why) => Ok(Err(self.stop(at, complete_by, StopKind::Invalid(why)))),
        }
    }

    /// Returns the next record, or where and why the valid stream stops.
    pub(crate) fn next(&mut self) -> Result<Scan> {
        let seg = self.segment_size;
        let body = seg - SEGMENT_HEADER_SIZE;
        // Find a record boundary.
        loop {
            if self.pos.segment_offset(seg) != 0 {
                break;
            }
            let rem = match self.segment_header(if self.seeking { None } else { Some(0) })? {
                Ok(rem) => rem,
                Err(stop) => return Ok(stop),
            };
            if !self.seeking {
                self.pos = self.pos + SEGMENT_HEADER_SIZE;
                break;
            }
            if rem >= body {
                self.pos = self.pos + seg;
                if rem == body {
                    self.seeking = false;
                }
                continue;
            }
            self.pos = self.pos + SEGMENT_HEADER_SIZE + rem;
            self.seeking = false;
        }
        self.seeking = false;
        let start = self.pos;

        // The first 8 bytes (len, crc) never straddle a segment: positions are 8-aligned.
        let head = self.bytes_at(start, 8)?;
        if head.len() < 8 {
            return Ok(self.stop(start, start + RECORD_HEADER_SIZE, StopKind::Incomplete));
        }
        let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        let total = align_up(RECORD_HEADER_SIZE + len as u64);
        let header_end = self.stream_end(start, RECORD_HEADER_SIZE);
        if len as u64 > self.max_record {
            let kind = if len == 0 && crc == 0 {
                StopKind::Zeroed
            } else {
                StopKind::Invalid(format!("record length {len} exceeds the maximum"))
            };
            return Ok(self.stop(start, header_end, kind));
        }
        let record_end = self.stream_end(start, total);

        // Collect the rest of the record, skipping segment headers.
        let mut parts: Vec<Bytes> = Vec::new();
        let mut cur = start + 8;
        let mut left = total - 8;
        while left > 0 {
            if cur.segment_offset(seg) == 0 {
                self.pos = cur;
                match self.segment_header(Some(left))? {
                    Ok(_) => {}
                    Err(Scan::Stop(s)) => {
                        // A bad continuation header fails the record that spans it.
                        self.pos = start;
                        return Ok(self.stop(start, record_end.max(s.complete_by), s.kind));
                    }
                    Err(other) => return Ok(other),
                }
                cur = cur + SEGMENT_HEADER_SIZE;
            }
            let room = seg - cur.segment_offset(seg);
            let n = left.min(room) as usize;
            let b = self.bytes_at(cur, n)?;
            if b.len() < n {
                self.pos = start;
                let kind = if parts.is_empty() && b.iter().all(|&x| x == 0) && head[..] == [0; 8] {
                    StopKind::Zeroed
                } else {
                    StopKind::Incomplete
                };
                return Ok(self.stop(start, record_end, kind));
            }
            cur = cur + n as u64;
            left -= n as u64;
            parts.push(b);
        }
        self.pos = start;
        // parts hold: lsn (8 bytes), payload, padding; possibly split anywhere.
        let rest: Bytes = if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            let mut m = BytesMut::with_capacity((total - 8) as usize);
            for p in &parts {
                m.extend_from_slice(p);
            }
            m.freeze()
        };
        let lsn = Lsn(u64::from_le_bytes(rest[0..8].try_into().expect("8 bytes")));
        let payload = rest.slice(8..8 + len as usize);
        if len == 0 && crc == 0 && lsn.0 == 0 {
            return Ok(self.stop(start, header_end, StopKind::Zeroed));
        }
        if lsn != start {
            let why = format!("record at {start} names start {lsn} (stale record?)");
            return Ok(self.stop(start, header_end, StopKind::Invalid(why)));
        }
        if record_crc(len, start, &payload) != crc {
            return Ok(self.stop(
                start,
                record_end,
                StopKind::Invalid("record CRC mismatch".into()),
            ));
        }
        self.pos = cur;
        Ok(Scan::Record(Record {
            start,
            end: cur,
            payload,
        }))
    }

    /// The stream position after `n` record bytes starting at `from`, counting the segment
    /// headers they skip.
    fn stream_end(&self, from: Lsn, n: u64) -> Lsn {
        let seg = self.segment_size;
        let mut pos = from;
        let mut left = n;
        loop {
            if pos.segment_offset(seg) == 0 && left > 0 {
                pos = pos + SEGMENT_HEADER_SIZE;
            }
            let room = seg - pos.segment_offset(seg);
            if left <= room {
                return pos + left;
            }
            pos = pos + room;
            left -= room;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An in-memory stream starting at `base`.
    pub(crate) struct MemSource {
        pub base: Lsn,
        pub data: Vec<u8>,
        /// Largest read returned at once, to exercise chunk joins.
        pub max_read: usize,
    }

    impl ByteSource for MemSource {
        fn read_at(&mut self, lsn: Lsn, max_len: usize) -> Result<Bytes> {
            let off = (lsn.0 - self.base.0) as usize;
            if off >= self.data.len() {
                return Ok(Bytes::new());
            }
            let n = max_len.min(self.max_read).min(self.data.len() - off);
            Ok(Bytes::copy_from_slice(&self.data[off..off + n]))
        }
    }

    const SEG: u64 = 1 << 20;

    fn frame(base: Lsn, payloads: &[Vec<u8>]) -> (Vec<u8>, Vec<Lsn>) {
        let mut f = Framer {
            segment_size: SEG,
            pos: base,
        };
        let mut out = Vec::new();
        let ends = payloads.iter().map(|p| f.push(&mut out, p)).collect();
        (out, ends)
    }

    fn scan_all(src: MemSource, from: Lsn) -> (Vec<Record>, Stop) {
        let mut s = Scanner::new(src, SEG, 4 << 20, from);
        let mut out = Vec::new();
        loop {
            match s.next().unwrap() {
                Scan::Record(r) => out.push(r),
                Scan::Stop(stop) => return (out, stop),
            }
        }
    }

    #[test]
    fn segment_header_roundtrip_and_checks() {
        let h = SegmentHeader {
            start: Lsn(SEG),
            rem_len: 40,
        };
        let b = h.encode();
        assert_eq!(&b[0..4], b"WALS");
        assert_eq!(SegmentHeader::decode(&b, Lsn(SEG)), Ok(h));
        assert!(SegmentHeader::decode(&b, Lsn(2 * SEG)).is_err());
        for i in 0..24 {
            let mut bad = b;
            bad[i] ^= 0x10;
            assert!(SegmentHeader::decode(&bad, Lsn(SEG)).is_err(), "byte {i}");
        }
        assert!(SegmentHeader::decode(&[0; 24], Lsn(SEG)).is_err());
    }

    #[test]
    fn record_bytes_are_as_documented() {
        let (out, ends) = frame(Lsn(SEG), &[b"abc".to_vec()]);
        // Segment header, then the record at 0/100018.
        assert_eq!(out.len(), 24 + 24);
        let rec = &out[24..];
        assert_eq!(&rec[0..4], &3u32.to_le_bytes());
        assert_eq!(&rec[8..16], &(SEG + 24).to_le_bytes());
        assert_eq!(&rec[16..19], b"abc");
        assert_eq!(&rec[19..24], &[0; 5]);
        let mut crc_input = Vec::new();
        crc_input.extend_from_slice(&3u32.to_le_bytes());
        crc_input.extend_from_slice(&(SEG + 24).to_le_bytes());
        crc_input.extend_from_slice(b"abc");
        assert_eq!(&rec[4..8], &crc32c::crc32c(&crc_input).to_le_bytes());
        assert_eq!(ends, vec![Lsn(SEG + 48)]);
    }

    #[test]
    fn records_roundtrip_across_segments() {
        let payloads: Vec<Vec<u8>> = (0..40)
            .map(|i| vec![i as u8; (i * 7919) % 120_000])
            .collect();
        let base = Lsn(SEG);
        let (data, ends) = frame(base, &payloads);
        assert!(data.len() as u64 > 2 * SEG, "test must span segments");
        for max_read in [usize::MAX, 4096, 13] {
            let (recs, stop) = scan_all(
                MemSource {
                    base,
                    data: data.clone(),
                    max_read,
                },
                base,
            );
            assert_eq!(recs.len(), payloads.len());
            for (i, r) in recs.iter().enumerate() {
                assert_eq!(&r.payload[..], &payloads[i][..]);
                assert_eq!(r.end, ends[i]);
            }
            assert_eq!(stop.kind, StopKind::Incomplete);
        }
    }

    #[test]
    fn scan_from_segment_start_skips_continuation() {
        let payloads: Vec<Vec<u8>> = (0..30).map(|i| vec![i as u8; 100_000]).collect();
        let base = Lsn(SEG);
        let (data, ends) = frame(base, &payloads);
        let second = Lsn(2 * SEG);
        let off = (second.0 - base.0) as usize;
        let (recs, _) = scan_all(
            MemSource {
                base: second,
                data: data[off..].to_vec(),
                max_read: usize::MAX,
            },
            second,
        );
        // The first record found is the first one that starts in the second segment.
        let first_idx = ends.iter().position(|&e| e > second).unwrap() + 1;
        assert_eq!(recs[0].start, ends[first_idx - 1]);
        assert_eq!(recs.len(), payloads.len() - first_idx);
    }

    #[test]
    fn record_larger_than_a_segment() {
        let payloads = vec![vec![7u8; 3 * SEG as usize], b"after".to_vec()];
        let base = Lsn(SEG);
        let (data, ends) = frame(base, &payloads);
        let (recs, _) = scan_all(
            MemSource {
                base,
                data: data.clone(),
                max_read: usize::MAX,
            },
            base,
        );
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].payload, Bytes::from_static(b"after"));
        // From the start of the third segment, the whole body is continuation.
        let third = Lsn(3 * SEG);
        let off = (third.0 - base.0) as usize;
        let (recs, _) = scan_all(
            MemSource {
                base: third,
                data: data[off..].to_vec(),
                max_read: usize::MAX,
            },
            third,
        );
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].end, ends[1]);
    }

    #[test]
    fn damage_stops_the_scan() {
        let payloads: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8 + 1; 50]).collect();
        let base = Lsn(SEG);
        let (data, ends) = frame(base, &payloads);
        let check = |data: Vec<u8>, survivors: usize, zeroed: bool| {
            let (recs, stop) = scan_all(
                MemSource {
                    base,
                    data,
                    max_read: usize::MAX,
                },
                base,
            );
            assert_eq!(recs.len(), survivors);
            assert_eq!(
                stop.at,
                if survivors == 0 {
                    Lsn(SEG + 24)
                } else {
                    ends[survivors - 1]
                }
            );
            assert_eq!(stop.kind == StopKind::Zeroed, zeroed, "{:?}", stop.kind);
        };
        // Cut mid-record.
        check(data[..data.len() - 10].to_vec(), 4, false);
        // Flipped bit in the last record's payload.
        let mut d = data.clone();
        let n = d.len();
        d[n - 20] ^= 1;
        check(d, 4, false);
        // Zeroed tail.
        let mut d = data.clone();
        d.extend_from_slice(&[0; 64]);
        check(d, 5, true);
        // Garbage after the end.
        let mut d = data.clone();
        d.extend_from_slice(&[0xAB; 64]);
        check(d, 5, false);
        // A stale record (right bytes, wrong position) is rejected.
        let mut d = data.clone();
        let first = d[24..24 + 72].to_vec();
        d.extend_from_slice(&first);
        check(d, 5, false);
    }
}
