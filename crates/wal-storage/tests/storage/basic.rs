//! Layout, init/open, the byte-stream and record APIs, reads and flush notifications.

use std::time::Duration;

use bytes::Bytes;
use wal_storage::*;

use crate::common::*;

#[test]
fn init_creates_the_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let wal = init_primary(&dir, WalFormat::Walserver);
    assert_eq!(wal.system_id(), SystemId(7));
    assert_eq!(wal.format(), WalFormat::Walserver);
    assert_eq!(wal.timeline(), TimelineId(1));
    // A new primary starts at the start of segment 1, never at 0/0.
    assert_eq!(wal.flushed(), Lsn(SEG));
    assert_eq!(wal.oldest_retained(), Lsn(SEG));
    assert!(wal.history().is_empty());
    assert_eq!(wal.history_file(TimelineId(1)).unwrap(), None);
    for f in [
        "control",
        "flush_pointer",
        "walserver.lock",
        "pg_wal",
        "slots",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
    let end = append(&wal, &[Bytes::from_static(b"hello")])[0];
    // Segment header (24 bytes), record header (16) and payload padded to 8.
    assert_eq!(end, Lsn(SEG + 24 + 16 + 8));
    drop(wal);
    for e in std::fs::read_dir(dir.join("pg_wal")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            parse_segment_file_name(&name, SEG).is_some()
                || parse_history_file_name(&name).is_some(),
            "pg_wal holds {name}"
        );
    }
}

#[test]
fn init_and_open_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(matches!(
        Wal::open(dir, cfg()),
        Err(WalError::NotInitialized { .. })
    ));
    let bad = StorageConfig {
        segment_size: 3 << 20,
        ..cfg()
    };
    assert!(matches!(
        Wal::init(
            dir,
            bad,
            InitOptions::primary(SystemId(1), WalFormat::Walserver)
        ),
        Err(WalError::InvalidConfig(_))
    ));
    let wal = init_primary(dir, WalFormat::Walserver);
    // A second user of the same directory is refused while the first holds it.
    let err = Wal::open(dir, cfg()).unwrap_err();
    assert!(matches!(err, WalError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("in use"), "{err}");
    drop(wal);
    assert!(matches!(
        Wal::init(
            dir,
            cfg(),
            InitOptions::primary(SystemId(1), WalFormat::Walserver)
        ),
        Err(WalError::AlreadyInitialized { .. })
    ));
    let other_size = StorageConfig {
        segment_size: 2 << 20,
        ..cfg()
    };
    assert!(matches!(
        Wal::open(dir, other_size),
        Err(WalError::SegmentSizeMismatch { stored: SEG, .. })
    ));
    Wal::open(dir, cfg()).unwrap();
}

#[test]
fn unknown_control_version_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    drop(init_primary(tmp.path(), WalFormat::Walserver));
    let path = tmp.path().join("control");
    let text = std::fs::read_to_string(&path).unwrap();
    let body = text
        .split_once('\n')
        .unwrap()
        .1
        .replace("\"version\": 1", "\"version\": 9");
    let header = format!(
        "walserver-control crc32c={:08x}\n",
        crc32c::crc32c(body.as_bytes())
    );
    std::fs::write(&path, header + &body).unwrap();
    let err = Wal::open(tmp.path(), cfg()).unwrap_err();
    assert!(
        matches!(
            err,
            WalError::UnknownVersion {
                found: 9,
                supported: 1,
                ..
            }
        ),
        "{err}"
    );
    // A damaged control file is an error too, not a guess.
    std::fs::write(&path, b"walserver-control crc32c=00000000\n{}").unwrap();
    assert!(matches!(
        Wal::open(tmp.path(), cfg()),
        Err(WalError::BadFile { .. })
    ));
}

#[test]
fn records_survive_reopen_and_decode() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let payloads: Vec<Bytes> = (0..200)
        .map(|i| payload(i, (i as usize * 997) % 30_000))
        .collect();
    let mut ends = Vec::new();
    for chunk in payloads.chunks(7) {
        ends.extend(append(&wal, chunk));
    }
    assert!(wal.flushed() > Lsn(3 * SEG), "must span segments");
    assert_eq!(wal.flushed(), *ends.last().unwrap());
    let check = |wal: &Wal| {
        let recs = records(wal, TimelineId(1), Lsn(SEG));
        assert_eq!(recs.len(), payloads.len());
        for (i, r) in recs.iter().enumerate() {
            assert_eq!(r.payload, payloads[i], "record {i}");
            assert_eq!(r.end, ends[i]);
        }
    };
    check(&wal);
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(wal.flushed(), *ends.last().unwrap());
    assert_eq!(wal.recovery_report().end, *ends.last().unwrap());
    assert_eq!(wal.recovery_report().discarded_bytes, 0);
    check(&wal);
    // From a segment start, the reader finds the first record that begins in that segment.
    let third = records(&wal, TimelineId(1), Lsn(3 * SEG));
    let first = ends.iter().position(|&e| e > Lsn(3 * SEG)).unwrap() + 1;
    assert_eq!(third[0].payload, payloads[first]);
}

/// A reader asked for a position past the end, even one at the edge of the LSN space (as a
/// client of `GET /wal?from=` may ask), gets `BeyondEnd`, not a panic.
#[test]
fn record_reader_beyond_the_end_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let end = append(&wal, &[payload(1, 100)])[0];
    for from in [
        end + 8,
        Lsn(u64::MAX - 3),
        Lsn::MAX,
        Lsn::MAX.segment_start(SEG),
    ] {
        let mut r = wal.record_reader(TimelineId(1), from).unwrap();
        let err = r.next_record().unwrap_err();
        assert!(matches!(err, WalError::BeyondEnd { .. }), "{from}: {err}");
    }
}

#[test]
fn record_size_and_format_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let small = StorageConfig {
        max_record_size: 1000,
        ..cfg()
    };
    let wal = Wal::init(
        tmp.path(),
        small,
        InitOptions::primary(SystemId(1), WalFormat::Walserver),
    )
    .unwrap();
    let err = wal
        .append(vec![
            Bytes::from(vec![0u8; 10]),
            Bytes::from(vec![0u8; 1001]),
        ])
        .unwrap_err();
    assert!(
        matches!(
            err,
            WalError::RecordTooLarge {
                size: 1001,
                max: 1000
            }
        ),
        "{err}"
    );
    assert_eq!(wal.written(), Lsn(SEG), "nothing written");
    append(&wal, &[Bytes::from(vec![1u8; 1000])]);

    let tmp = tempfile::tempdir().unwrap();
    let pg = init_primary(tmp.path(), WalFormat::Postgres);
    assert!(matches!(
        pg.append(vec![Bytes::from_static(b"x")]),
        Err(WalError::WrongFormat { .. })
    ));
    assert!(matches!(
        pg.promote("test"),
        Err(WalError::PromotionNotSupported)
    ));
    assert!(pg.record_reader(TimelineId(1), Lsn(SEG)).is_err());
}

/// A standby of walserver records writes its upstream's bytes raw. Each batch costs one
/// fdatasync (the flush pointer moves only when the end enters a new segment, as for appends);
/// the flushed end published stops at the pointer or the end of the last complete record,
/// which is what recovery finds again after a crash; a clean stop keeps the exact end, even
/// inside a record; after a crash, recovery scans past the pointer and keeps every complete
/// record written, dropping only the partial one at the end, which the walreceiver streams
/// again and which had not been published as flushed.
#[test]
fn raw_walserver_records_cost_one_fsync_per_batch_and_recover_by_scanning() {
    let tmp = tempfile::tempdir().unwrap();
    let src = init_primary(&tmp.path().join("upstream"), WalFormat::Walserver);
    let ends = append(&src, &(0..20).map(|i| payload(i, 300)).collect::<Vec<_>>());
    let bytes = Bytes::from(read_range(
        &src,
        TimelineId(1),
        Lsn(SEG),
        *ends.last().unwrap(),
    ));
    drop(src);
    let dir = tmp.path().join("standby");
    let wal = init_primary(&dir, WalFormat::Walserver);
    // Batches ending mid-record; the last one inside record 11.
    let cut = |lsn: Lsn| (lsn.0 - SEG) as usize;
    let mid = cut(ends[10]) + 100;
    let mut pieces: Vec<usize> = (0..10).map(|i| cut(ends[i]) - 5 + i).collect();
    pieces[0] = 0;
    pieces.push(mid);
    let pointer = Lsn(SEG) + pieces[1] as u64;
    let mut fsyncs = Vec::new();
    for w in pieces.windows(2) {
        let before = wal.fsync_count();
        let written = Lsn(SEG) + w[1] as u64;
        let flushed = wal
            .write(Lsn(SEG) + w[0] as u64, bytes.slice(w[0]..w[1]))
            .unwrap()
            .wait()
            .unwrap();
        fsyncs.push(wal.fsync_count() - before);
        let record_end = ends.iter().copied().filter(|&e| e <= written).max();
        let expected = record_end.unwrap_or(pointer).max(pointer);
        assert_eq!(flushed, expected, "batch ending at {written}");
        assert_eq!(
            wal.position().flushed,
            expected,
            "batch ending at {written}"
        );
        assert_eq!(wal.written(), written);
    }
    // The first batch also stores the pointer in the new segment; each later one fsyncs its
    // segment once. The background thread's preallocation of the next segments (a file and
    // a directory fsync each, at most two segments) may land in any batch.
    let later: u64 = fsyncs[1..].iter().sum();
    let batches = fsyncs.len() as u64 - 1;
    assert!(
        later <= batches + 4,
        "fsyncs per batch: {fsyncs:?} (two per batch would be {})",
        2 * batches
    );
    assert_eq!(
        wal.flushed(),
        ends[10],
        "the partial record is not published"
    );
    assert_eq!(wal.written(), Lsn(SEG) + mid as u64);
    // Nothing beyond it is served: not from the files, not from the tail cache (which holds
    // the batch), so a cascading walsender sends only what this node cannot lose.
    assert!(matches!(
        wal.read(TimelineId(1), ends[10] + 1, 1),
        Err(WalError::BeyondEnd { .. })
    ));
    assert!(wal
        .read(TimelineId(1), ends[10], 1 << 20)
        .unwrap()
        .is_empty());
    assert!(wal
        .locate(TimelineId(1), ends[10], 1 << 20)
        .unwrap()
        .is_none());
    assert!(wal.read_cached(TimelineId(1), ends[10], 1 << 20).is_none());
    let mut pos = ends[9];
    for _ in 0..pieces.len() {
        match wal.read_cached(TimelineId(1), pos, 1 << 20) {
            Some(b) => pos = pos + b.len() as u64,
            None => break,
        }
    }
    assert_eq!(pos, ends[10], "the tail cache serves up to the flushed end");
    drop(wal);
    let wal = Wal::open(&dir, cfg()).unwrap();
    assert_eq!(
        wal.flushed(),
        Lsn(SEG) + mid as u64,
        "a clean stop keeps the exact end"
    );
    drop(wal);
    // A crash after the last batch: the pointer vouches for the first batch's end only.
    set_flush_pointer(&dir, TimelineId(1), Lsn(SEG) + pieces[1] as u64);
    let wal = Wal::open(&dir, cfg()).unwrap();
    assert_eq!(
        wal.flushed(),
        ends[10],
        "every complete record written is kept"
    );
    assert_eq!(
        read_range(&wal, TimelineId(1), Lsn(SEG), ends[10]),
        &bytes[..cut(ends[10])]
    );
    assert_eq!(records(&wal, TimelineId(1), Lsn(SEG)).len(), 11);
}

/// On tmpfs, segments are preallocated with fallocate instead of written zeros: they still
/// read as zeros past the end, so records append, reopen and scan as anywhere else.
#[test]
fn preallocated_segments_on_tmpfs_read_as_zeros() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return; // No tmpfs here: the written-zeros path is what every other test covers.
    }
    let tmp = tempfile::tempdir_in(shm).unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    // Enough to fill the first segment and start the next two (preallocated ahead).
    let payloads: Vec<Bytes> = (0..40).map(|i| payload(i, 60_000)).collect();
    let ends = append(&wal, &payloads);
    let end = *ends.last().unwrap();
    assert!(end.0 > 3 * SEG);
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(wal.flushed(), end);
    assert_eq!(wal.recovery_report().discarded_bytes, 0);
    let got = records(&wal, TimelineId(1), Lsn(SEG));
    assert_eq!(got.len(), payloads.len());
    assert!(got.iter().zip(&payloads).all(|(r, p)| r.payload == *p));
    // The next segment, preallocated, holds nothing but zeros.
    let next = segment_path(tmp.path(), TimelineId(1), Lsn((end.0 / SEG + 1) * SEG));
    if next.exists() {
        assert!(std::fs::read(&next).unwrap().iter().all(|b| *b == 0));
    }
}

#[test]
fn byte_stream_writes_and_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Postgres);
    let data = payload(1, (2 * SEG + 5000) as usize);
    let start = Lsn(SEG);
    // Written in pieces that cross segment boundaries.
    let mut pos = 0;
    let mut tickets = Vec::new();
    for n in [10, 70_000, (SEG as usize) - 3, 300_000, 1] {
        tickets.push(
            wal.write(start + pos as u64, data.slice(pos..pos + n))
                .unwrap(),
        );
        pos += n;
    }
    for t in tickets {
        t.wait().unwrap();
    }
    let end = start + pos as u64;
    assert_eq!(wal.flushed(), end);
    assert_eq!(read_range(&wal, TimelineId(1), start, end), &data[..pos]);
    // A read stops at the segment end and at the flushed end; at the end it is empty.
    assert_eq!(
        wal.read(TimelineId(1), Lsn(2 * SEG - 10), 100)
            .unwrap()
            .len(),
        10
    );
    assert!(wal.read(TimelineId(1), end, 100).unwrap().is_empty());
    assert!(matches!(
        wal.read(TimelineId(1), end + 1, 100),
        Err(WalError::BeyondEnd { .. })
    ));
    assert!(matches!(
        wal.read(TimelineId(9), end, 100),
        Err(WalError::UnknownTimeline(_))
    ));
    // `read_into` appends what `read` returns to a kept buffer, and leaves it as it was on an
    // error; one buffer serves reads one after another.
    let mut buf = bytes::BytesMut::from(&b"kept"[..]);
    for at in [start, Lsn(2 * SEG - 10), start + 70_010] {
        let want = wal.read(TimelineId(1), at, 1 << 20).unwrap();
        buf.truncate(4);
        assert_eq!(
            wal.read_into(TimelineId(1), at, 1 << 20, &mut buf).unwrap(),
            want.len()
        );
        assert_eq!(&buf[..4], b"kept");
        assert_eq!(&buf[4..], &want[..]);
    }
    buf.truncate(4);
    assert_eq!(wal.read_into(TimelineId(1), end, 100, &mut buf).unwrap(), 0);
    assert!(matches!(
        wal.read_into(TimelineId(1), end + 1, 100, &mut buf),
        Err(WalError::BeyondEnd { .. })
    ));
    assert_eq!(&buf[..], b"kept");

    // A gap is an error.
    let err = wal
        .write(end + 8, Bytes::from_static(b"x"))
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(matches!(err, WalError::Gap { .. }), "{err}");
    // An overlap with equal bytes writes only the new suffix.
    let more = payload(2, 100);
    let mut overlapping = data[pos - 50..pos].to_vec();
    overlapping.extend_from_slice(&more);
    let durable = wal
        .write(Lsn(end.0 - 50), Bytes::from(overlapping))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(durable, end + 100);
    assert_eq!(read_range(&wal, TimelineId(1), end, end + 100), &more[..]);
    // An overlap with different bytes is an error naming where they differ.
    let mut differing = more[..].to_vec();
    differing[40] ^= 1;
    let err = wal
        .write(end, Bytes::from(differing))
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(
        matches!(err, WalError::OverlapMismatch { at, .. } if at == end + 40),
        "{err}"
    );
    // Overlap entirely within the batch being staged: the second write repeats the first.
    let a = wal
        .write(end + 100, Bytes::from_static(b"abcdefgh"))
        .unwrap();
    let b = wal
        .write(end + 104, Bytes::from_static(b"efghijkl"))
        .unwrap();
    a.wait().unwrap();
    assert_eq!(b.wait().unwrap(), end + 112);
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(wal.flushed(), end + 112);
    assert_eq!(
        read_range(&wal, TimelineId(1), end + 100, end + 112),
        b"abcdefghijkl"
    );
}

#[test]
fn subscribers_hear_every_flush() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let mut rx = wal.subscribe();
    assert_eq!(rx.borrow().flushed, Lsn(SEG));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        for i in 0..20 {
            let end = *wal
                .append(vec![payload(i, 100)])
                .unwrap()
                .await
                .unwrap()
                .last()
                .unwrap();
            let pos =
                tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|p| p.flushed >= end))
                    .await
                    .expect("flush notification")
                    .unwrap();
            assert!(pos.written >= pos.flushed);
            assert_eq!(pos.timeline, TimelineId(1));
        }
    });
}

#[test]
fn standby_layout_from_upstream() {
    let tmp = tempfile::tempdir().unwrap();
    let hist = b"1\t0/4025A50\tno recovery target specified\n".to_vec();
    let wal = Wal::init(
        tmp.path(),
        StorageConfig {
            segment_size: 16 << 20,
            ..StorageConfig::default()
        },
        InitOptions {
            system_id: SystemId(42),
            format: WalFormat::Postgres,
            timeline: TimelineId(2),
            start_lsn: Some(Lsn(0x5000000)),
            history: parse_history(&hist).unwrap(),
            history_files: vec![(TimelineId(2), hist.clone())],
            role: Role::Standby,
        },
    )
    .unwrap();
    assert_eq!(wal.flushed(), Lsn(0x5000000));
    assert_eq!(wal.history_file(TimelineId(2)).unwrap(), Some(hist));
    assert_eq!(wal.timeline_end(TimelineId(1)), Some(Lsn(0x4025A50)));
    assert_eq!(wal.timeline_end(TimelineId(2)), None);
    // Not segment-aligned: refused.
    let tmp2 = tempfile::tempdir().unwrap();
    let mut opts = InitOptions::primary(SystemId(1), WalFormat::Postgres);
    opts.start_lsn = Some(Lsn(SEG + 8));
    assert!(Wal::init(tmp2.path(), cfg(), opts).is_err());
}

/// The bytes a located range holds, read from its file.
fn range_bytes(r: &WalFileRange) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; r.len];
    r.file.read_exact_at(&mut buf, r.offset).unwrap();
    buf
}

/// `locate_cached` answers from memory exactly what `locate` finds, but only once storage has
/// the segment's file open and has seen its length; for anything else (a segment not opened
/// yet, the end, beyond it, an unknown timeline) it says nothing and `locate` has the answer.
#[test]
fn locate_cached_answers_what_locate_found_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    // A little over two segments.
    let payloads: Vec<Bytes> = (0..40).map(|i| payload(i, 60_000)).collect();
    let end = *append(&wal, &payloads).last().unwrap();
    assert!(end.0 > 3 * SEG);
    drop(wal);
    // Reopened: the files recovery read may be open, but their lengths were never asked.
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    let tli = TimelineId(1);
    let first = Lsn(SEG);
    assert!(wal.locate_cached(tli, first, 100).is_none());
    // A read opens the file without asking its length: still nothing known.
    wal.read(tli, first, 100).unwrap();
    assert!(wal.locate_cached(tli, first, 100).is_none());
    let r = wal.locate(tli, first, 100).unwrap().unwrap();
    assert_eq!((r.offset, r.len), (0, 100));
    // The rest of the segment is now known, to its end and no further.
    for (at, len) in [
        (first + 1000, 5000),
        (Lsn(2 * SEG - 10), 100),
        (first, 1 << 30),
    ] {
        let cached = wal.locate_cached(tli, at, len).expect("the file is open");
        let located = wal.locate(tli, at, len).unwrap().unwrap();
        assert_eq!((cached.offset, cached.len), (located.offset, located.len));
        assert_eq!(range_bytes(&cached), wal.read(tli, at, len).unwrap());
    }
    assert_eq!(
        wal.locate_cached(tli, first, 1 << 30).unwrap().len,
        SEG as usize
    );
    // The next segment's file has not been located yet.
    let second = Lsn(2 * SEG);
    assert!(wal.locate_cached(tli, second, 100).is_none());
    wal.locate(tli, second, 100).unwrap().unwrap();
    assert_eq!(
        range_bytes(&wal.locate_cached(tli, second + 7, 300).unwrap()),
        wal.read(tli, second + 7, 300).unwrap()
    );
    // Never to or past the flushed end, even in a file known to be longer.
    let last = Lsn(end.0 - 10);
    wal.locate(tli, last, 1).unwrap().unwrap();
    assert_eq!(wal.locate_cached(tli, last, 1000).unwrap().len, 10);
    assert!(wal.locate_cached(tli, end, 100).is_none());
    assert!(wal.locate_cached(tli, end + 1, 100).is_none());
    assert!(matches!(
        wal.locate(tli, end + 1, 100),
        Err(WalError::BeyondEnd { .. })
    ));
    assert!(wal.locate_cached(TimelineId(9), first, 100).is_none());
    assert!(wal.locate_cached(tli, first, 0).is_none());
}
