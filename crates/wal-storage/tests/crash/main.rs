//! The kill -9 test: a child process (this test binary, re-executed with `WAL_CRASH_CHILD`)
//! writes through the real API and prints every acknowledged write after its ticket resolves;
//! the parent SIGKILLs it at random moments, reopens the data directory, and checks that every
//! acknowledged byte is there, identical, and that nothing beyond the recovered end is served.
//!
//! Three modes, each with its own data directory: walserver records (four writer threads,
//! records of varied sizes, some spanning segments), raw bytes in PostgreSQL format (one
//! writer pipelining writes, whose durable end only the flush pointer knows), and a standby of
//! walserver records: the raw bytes of an upstream's records, as a walreceiver hands them to
//! storage, cut anywhere (inside record and segment headers too). In that mode the child also
//! prints every flushed position storage publishes (what a walreceiver reports upstream and
//! cascading walsenders send up to), and the parent checks that the recovered end is at or
//! beyond each of them: the flushed end never moves back, even across a kill -9. A fourth
//! mode writes walserver records as the first does, with retention on: a slot the parent
//! moves to what it has checked keeps the rest, and every segment below it is recycled as a
//! later one (`wal_recycle`), so the child writes over old segments' bytes and is killed
//! while doing so; the parent checks every acknowledged record it has not checked yet, and
//! that no old record ever turns up again as new.
//!
//! It is a test target of its own because it forks: a child holds copies of the parent's file
//! descriptors, among them other tests' data directory locks, until it execs, which would make
//! their reopen fail now and then with `Locked`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use wal_storage::*;

#[path = "../storage/common.rs"]
#[allow(dead_code)]
mod common;

use common::*;

const KILLS_PER_MODE: usize = 50;

/// The byte stored at LSN `x` in raw mode; never zero, so zeroed bytes cannot pass for data.
fn stream_byte(x: u64) -> u8 {
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 | 1
}

/// The payload of record `id`: the id, then a pattern derived from it.
fn record_payload(id: u64, len: usize) -> Bytes {
    let mut v = Vec::with_capacity(len.max(8));
    v.extend_from_slice(&id.to_le_bytes());
    let k = id.wrapping_mul(31) as u8;
    v.extend((8..len.max(8)).map(|i| k ^ (i as u8)));
    Bytes::from(v)
}

fn record_payload_ok(p: &[u8]) -> Option<u64> {
    let id = u64::from_le_bytes(p.get(..8)?.try_into().ok()?);
    (record_payload(id, p.len())[..] == *p).then_some(id)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn crash_cfg() -> StorageConfig {
    cfg()
}

/// The recycling mode's configuration: nothing kept beyond what the slot holds.
fn recycling_cfg() -> StorageConfig {
    StorageConfig {
        wal_keep_size: 0,
        ..cfg()
    }
}

/// The slot through which the parent keeps the WAL it has not checked yet, in recycling mode.
const CHECKED_SLOT: &str = "checked";

/// The child's side. A no-op unless re-executed by the parent with `WAL_CRASH_CHILD` set.
#[test]
fn child_entry_point() {
    let Some(mode) = std::env::var_os("WAL_CRASH_CHILD") else {
        return;
    };
    let dir = std::env::var("WAL_CRASH_DIR").expect("WAL_CRASH_DIR");
    let seed: u64 = std::env::var("WAL_CRASH_SEED")
        .expect("WAL_CRASH_SEED")
        .parse()
        .unwrap();
    let cfg = if mode == "recycling" {
        recycling_cfg()
    } else {
        crash_cfg()
    };
    wait_for_dir_lock(Path::new(&dir));
    let wal = Wal::open(&dir, cfg).expect("child opens the WAL");
    if mode == "records" || mode == "recycling" {
        let recycling = mode == "recycling";
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let wal = wal.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(seed.wrapping_mul(t + 7) | 1);
                    for counter in 0u64.. {
                        let n = 1 + rng.below(3);
                        let mut ids = Vec::new();
                        let mut payloads = Vec::new();
                        for k in 0..n {
                            let id = (seed << 24) | (t << 20) | (counter * 4 + k);
                            let len = if rng.below(10) == 0 {
                                100_000 + rng.below(200_000)
                            } else {
                                rng.below(30_000)
                            };
                            ids.push(id);
                            payloads.push(record_payload(id, len as usize));
                        }
                        let ends = wal.append(payloads).unwrap().wait().unwrap();
                        let mut out = std::io::stdout().lock();
                        for (id, end) in ids.iter().zip(ends) {
                            writeln!(out, "A {id} {}", end.0).unwrap();
                        }
                        if recycling {
                            // How many segments this child made from recycled files so far.
                            writeln!(out, "C {}", wal.segments_recycled()).unwrap();
                        }
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    } else if mode == "standby" {
        standby_child(&wal, Path::new(&dir), seed);
    } else {
        let mut rng = Rng(seed | 1);
        let mut pos = wal.flushed();
        let mut tickets = std::collections::VecDeque::new();
        loop {
            while tickets.len() < 8 {
                let len = 1 + rng.below(150_000);
                let data: Vec<u8> = (pos.0..pos.0 + len).map(stream_byte).collect();
                tickets.push_back(wal.write(pos, Bytes::from(data)).unwrap());
                pos = pos + len;
            }
            let end = tickets.pop_front().unwrap().wait().unwrap();
            let mut out = std::io::stdout().lock();
            writeln!(out, "R {}", end.0).unwrap();
            out.flush().unwrap();
        }
    }
}

/// The upstream's data directory of the standby mode, beside the standby's.
fn upstream_dir(standby: &Path) -> std::path::PathBuf {
    standby.with_file_name("standby-upstream")
}

/// Waits until no process holds `dir`'s lock, then leaves it for `Wal::open` to take.
///
/// The tests of this binary run in parallel in one parent process, and each parent reopens its
/// directory between kills to check it. If a sibling test spawns its child while this test's
/// parent holds the directory open, the sibling's forked child holds a copy of the lock's
/// descriptor (and so the `flock`) until it execs, which on a busy machine took long enough
/// for this child to find the directory `Locked` (once in about a dozen runs under load).
/// The copy goes at that exec, and no new one can appear: the parent has closed its WAL
/// before starting this child and opens it again only after killing it. So a blocking lock
/// waits for exactly that exec (the parent's 30 s deadline for acknowledgements bounds it).
fn wait_for_dir_lock(dir: &Path) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("walserver.lock"))
        .expect("child opens the lock file");
    f.lock().expect("child waits for the directory's lock");
    f.unlock().expect("child releases the directory's lock");
}

/// The standby mode's child: appends records to an upstream (a primary of its own), reads
/// them back as bytes and writes those to the standby at their LSNs in pieces of random
/// length, pipelining up to 8 writes as a walreceiver does; a thread prints every flushed
/// position the standby publishes.
fn standby_child(wal: &Wal, dir: &Path, seed: u64) {
    wait_for_dir_lock(&upstream_dir(dir));
    let upstream = Wal::open(upstream_dir(dir), crash_cfg()).expect("child opens the upstream");
    let mut watch = wal.subscribe();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async move {
            loop {
                let flushed = watch.borrow_and_update().flushed;
                let mut out = std::io::stdout().lock();
                writeln!(out, "F {}", flushed.0).unwrap();
                out.flush().unwrap();
                drop(out);
                if watch.changed().await.is_err() {
                    break;
                }
            }
        });
    });
    let mut rng = Rng(seed | 1);
    let mut pos = wal.flushed();
    let mut record = seed << 24;
    let mut tickets = std::collections::VecDeque::new();
    loop {
        while tickets.len() < 8 {
            // Now and then a few bytes only, so that pieces end inside headers.
            let len = if rng.below(4) == 0 {
                1 + rng.below(24)
            } else {
                1 + rng.below(64 << 10)
            };
            while upstream.flushed() < pos + len {
                let payloads: Vec<Bytes> = (0..1 + rng.below(4))
                    .map(|_| {
                        record += 1;
                        let n = if rng.below(10) == 0 {
                            20_000 + rng.below(200_000)
                        } else {
                            rng.below(3_000)
                        };
                        record_payload(record, n as usize)
                    })
                    .collect();
                upstream.append(payloads).unwrap().wait().unwrap();
            }
            let data = read_range(&upstream, TimelineId(1), pos, pos + len);
            tickets.push_back(wal.write(pos, Bytes::from(data)).unwrap());
            pos = pos + len;
        }
        tickets.pop_front().unwrap().wait().unwrap();
    }
}

/// Runs one child until it is killed; returns the acknowledged lines.
fn run_child(dir: &Path, mode: &str, seed: u64, rng: &mut Rng, iteration: usize) -> Vec<String> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_entry_point",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("WAL_CRASH_CHILD", mode)
        .env("WAL_CRASH_DIR", dir)
        .env("WAL_CRASH_SEED", seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut acks = Vec::new();
        loop {
            let mut line = String::new();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                // A line cut by the kill was never fully printed: not an acknowledgement.
                Ok(_) if !line.ends_with('\n') => break,
                Ok(_)
                    if line.starts_with("A ")
                        || line.starts_with("R ")
                        || line.starts_with("F ")
                        || line.starts_with("C ") =>
                {
                    acks.push(line.trim_end().to_string());
                    let _ = tx.send(());
                }
                Ok(_) => {}
            }
        }
        acks
    });
    if iteration % 5 == 4 {
        // Now and then kill at any moment, acknowledged writes or not (even during open).
        std::thread::sleep(Duration::from_micros(rng.below(30_000)));
    } else {
        let want = 1 + rng.below(40);
        let deadline = Instant::now() + Duration::from_secs(30);
        for _ in 0..want {
            let left = deadline.saturating_duration_since(Instant::now());
            if rx.recv_timeout(left).is_err() {
                let status = child.try_wait();
                let _ = child.kill();
                panic!("child in {mode} mode stopped acknowledging (exit status {status:?})");
            }
        }
        // A random moment after the last acknowledgement we waited for.
        std::thread::sleep(Duration::from_micros(rng.below(3_000)));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap()
}

/// What the parent has checked so far of one mode's WAL: every byte from the start to the end
/// recovered at the last check, and the records found there. A check compares that prefix
/// with what the reopened WAL now holds byte for byte (one memcmp, where parsing it again
/// would cost most of the test's time in a debug build), then checks only the WAL beyond it.
#[derive(Default)]
struct Checked {
    bytes: Vec<u8>,
    records: HashMap<u64, Lsn>,
}

impl Checked {
    fn end(&self) -> Lsn {
        Lsn(SEG + self.bytes.len() as u64)
    }

    /// Reopens the WAL (recovering it as a restart would) and checks that what was checked
    /// before is unchanged and the recovered end has not moved back. Returns the WAL and the
    /// bytes beyond the old end, which the caller checks and then hands to `extend`.
    fn reopen(&self, dir: &Path) -> (Wal, Vec<u8>) {
        let wal = Wal::open(dir, crash_cfg()).unwrap();
        let end = wal.flushed();
        assert!(
            end >= self.end(),
            "the recovered end moved back from {} to {end}",
            self.end()
        );
        let all = read_all(&wal, end);
        // Slice equality is a memcmp; the byte-by-byte search runs only to report a failure.
        if all[..self.bytes.len()] != self.bytes[..] {
            let i = all
                .iter()
                .zip(&self.bytes)
                .position(|(now, then)| now != then)
                .unwrap_or_default();
            panic!(
                "the byte at {} changed after it was recovered",
                Lsn(SEG + i as u64)
            );
        }
        // Nothing is served beyond the recovered end.
        assert!(wal.read(TimelineId(1), end, 100).unwrap().is_empty());
        assert!(matches!(
            wal.read(TimelineId(1), end + 1, 1),
            Err(WalError::BeyondEnd { .. })
        ));
        let new = all[self.bytes.len()..].to_vec();
        (wal, new)
    }

    fn extend(&mut self, new: Vec<u8>) {
        self.bytes.extend_from_slice(&new);
    }
}

/// Every byte from the start of the WAL to `end`.
fn read_all(wal: &Wal, end: Lsn) -> Vec<u8> {
    let mut out = Vec::with_capacity((end.0 - SEG) as usize);
    let mut pos = Lsn(SEG);
    while pos < end {
        let b = wal.read(TimelineId(1), pos, 1 << 20).unwrap();
        assert!(!b.is_empty(), "nothing readable at {pos} below {end}");
        out.extend_from_slice(&b);
        pos = pos + b.len() as u64;
    }
    out
}

fn verify_records(dir: &Path, checked: &mut Checked, acked: &HashMap<u64, Lsn>) -> Lsn {
    let (wal, new) = checked.reopen(dir);
    // The records beyond what was checked; the checked end is the end of a record, because
    // recovery ends walserver WAL at a record boundary.
    check_new_records(&wal, checked.end(), &mut checked.records, acked);
    checked.extend(new);
    wal.flushed()
}

/// Reads the records from `from` (a record boundary) to the flushed end: each is whole and
/// seen for the first time (in recycling mode an old record of a recycled segment read as new
/// would repeat an id), and goes into `records`; then every acknowledged record must be there
/// at its end.
fn check_new_records(
    wal: &Wal,
    from: Lsn,
    records: &mut HashMap<u64, Lsn>,
    acked: &HashMap<u64, Lsn>,
) {
    let mut reader = wal.record_reader(TimelineId(1), from).unwrap();
    while let Some(r) = reader.next_record().unwrap() {
        let id = record_payload_ok(&r.payload)
            .unwrap_or_else(|| panic!("damaged record at {}", r.start));
        assert!(
            records.insert(id, r.end).is_none(),
            "record {id} twice, the second at {}",
            r.start
        );
    }
    assert_eq!(
        reader.position(),
        wal.flushed(),
        "records end at the flushed end"
    );
    for (id, end) in acked {
        assert_eq!(
            records.get(id),
            Some(end),
            "acknowledged record {id} ending at {end} lost"
        );
    }
}

/// Nothing is left beyond `end` in its segment file, if there is one.
fn assert_nothing_beyond(dir: &Path, end: Lsn) {
    let path = segment_path(dir, TimelineId(1), end);
    if let Ok(bytes) = std::fs::read(&path) {
        assert!(
            bytes[end.segment_offset(SEG) as usize..]
                .iter()
                .all(|&b| b == 0),
            "old bytes are left beyond the end at {end}"
        );
    }
}

/// What the parent has checked of the recycling mode's WAL: its end (a record boundary, where
/// the slot is) and every record found so far, by id.
#[derive(Default)]
struct CheckedRecycling {
    end: Lsn,
    records: HashMap<u64, Lsn>,
    /// Kills after which recovery found a recycled segment ahead of the end: a preallocated
    /// segment holding old bytes, which recovery removes.
    saw_recycled: usize,
    /// Segments the children made from recycled files, as they reported.
    recycled: u64,
}

/// Checks the recycling mode after a kill: the recovered end has not moved back; the records
/// beyond what was checked are whole, each seen for the first time (an old record of a
/// recycled segment would repeat an id); every acknowledged record is there at its end; and
/// nothing is left beyond the end in its segment. Then moves the slot to the new end, so that
/// the next child may recycle everything below it.
fn verify_recycling(dir: &Path, checked: &mut CheckedRecycling, acked: &HashMap<u64, Lsn>) {
    let wal = Wal::open(dir, recycling_cfg()).unwrap();
    let end = wal.flushed();
    assert!(
        end >= checked.end,
        "the recovered end moved back from {} to {end}",
        checked.end
    );
    assert!(
        wal.oldest_retained() <= checked.end,
        "WAL the slot holds was removed"
    );
    if !wal.recovery_report().removed_segments.is_empty() {
        checked.saw_recycled += 1;
    }
    check_new_records(&wal, checked.end, &mut checked.records, acked);
    assert_nothing_beyond(dir, end);
    wal.advance_slot(CHECKED_SLOT, end, TimelineId(1)).unwrap();
    drop(wal); // A clean stop persists the slot.
    checked.end = end;
}

fn verify_raw(dir: &Path, checked: &mut Checked, acked_end: Lsn) -> Lsn {
    let (wal, new) = checked.reopen(dir);
    let end = wal.flushed();
    assert!(
        end >= acked_end,
        "acknowledged end {acked_end} but recovered only {end}"
    );
    let from = checked.end().0;
    for (i, &byte) in new.iter().enumerate() {
        let x = from + i as u64;
        assert_eq!(byte, stream_byte(x), "byte at {} of {end}", Lsn(x));
    }
    // Nothing beyond the end is left in the file either.
    assert_nothing_beyond(dir, end);
    checked.extend(new);
    end
}

/// Checks the standby mode's WAL after a kill: the recovered end is at or beyond every
/// flushed position the child saw published, and the bytes are the upstream's.
fn verify_standby(dir: &Path, checked: &mut Checked, reported: Lsn) -> Lsn {
    let (wal, new) = checked.reopen(dir);
    let end = wal.flushed();
    assert!(
        end >= reported,
        "the standby published {reported} as flushed, but after the kill it recovered only {end}"
    );
    let upstream = Wal::open(upstream_dir(dir), crash_cfg()).unwrap();
    let theirs = read_range(&upstream, TimelineId(1), checked.end(), end);
    if let Some(i) = new.iter().zip(&theirs).position(|(a, b)| a != b) {
        panic!(
            "the standby's byte at {} differs from its upstream's",
            checked.end() + i as u64
        );
    }
    checked.extend(new);
    end
}

/// A seed for the parent's choices, from the clock; odd, as the generator needs. Printed by
/// each test, so that a failure can be replayed.
fn test_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1
}

#[test]
fn kill_minus_nine_loses_nothing_acknowledged() {
    let seed = test_seed();
    println!("kill -9 test seed {seed}");
    let mut rng = Rng(seed);
    let tmp = tempfile::tempdir().unwrap();
    let started = Instant::now();
    for (mode, format) in [
        ("records", WalFormat::Walserver),
        ("raw", WalFormat::Postgres),
        ("standby", WalFormat::Walserver),
    ] {
        let dir = tmp.path().join(mode);
        drop(Wal::init(&dir, crash_cfg(), InitOptions::primary(SystemId(1), format)).unwrap());
        if mode == "standby" {
            let opts = InitOptions::primary(SystemId(1), format);
            drop(Wal::init(upstream_dir(&dir), crash_cfg(), opts).unwrap());
        }
        let mut reported = Lsn(SEG);
        let mut acked_records: HashMap<u64, Lsn> = HashMap::new();
        let mut checked = Checked::default();
        let mut acked_end = Lsn(SEG);
        let mut kills_with_acks = 0;
        for i in 0..KILLS_PER_MODE {
            let child_seed = (i as u64 + 1) * 1000 + (seed % 1000);
            let lines = run_child(&dir, mode, child_seed, &mut rng, i);
            if !lines.is_empty() {
                kills_with_acks += 1;
            }
            for line in lines {
                let f: Vec<&str> = line.split(' ').collect();
                match f[0] {
                    "A" => {
                        acked_records.insert(f[1].parse().unwrap(), Lsn(f[2].parse().unwrap()));
                    }
                    "F" => reported = reported.max(Lsn(f[1].parse().unwrap())),
                    _ => acked_end = acked_end.max(Lsn(f[1].parse().unwrap())),
                }
            }
            let end = match mode {
                "records" => verify_records(&dir, &mut checked, &acked_records),
                "raw" => verify_raw(&dir, &mut checked, acked_end),
                _ => verify_standby(&dir, &mut checked, reported),
            };
            acked_end = acked_end.max(end);
        }
        assert!(
            kills_with_acks >= KILLS_PER_MODE / 2,
            "too few kills saw acknowledged writes"
        );
        println!(
            "{mode}: {KILLS_PER_MODE} kills ({kills_with_acks} after acknowledgements), {} acknowledged records, WAL end {acked_end}",
            acked_records.len()
        );
    }
    println!("kill -9 test took {:?}", started.elapsed());
}

/// The recycling mode: walserver records written over recycled segments on the disk, killed
/// at random moments (see the module's comment).
#[test]
fn kill_minus_nine_over_recycled_segments_loses_nothing_acknowledged() {
    let seed = test_seed();
    println!("kill -9 recycling test seed {seed}");
    let mut rng = Rng(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("recycling");
    let wal = Wal::init(
        &dir,
        recycling_cfg(),
        InitOptions::primary(SystemId(1), WalFormat::Walserver),
    )
    .unwrap();
    wal.create_slot(CHECKED_SLOT, false, true).unwrap();
    let mut checked = CheckedRecycling {
        end: wal.flushed(),
        ..Default::default()
    };
    drop(wal);
    let mut acked: HashMap<u64, Lsn> = HashMap::new();
    let mut kills_with_acks = 0;
    // Past the planned kills, more (up to twice as many again) only while too little was
    // recycled to tell: on a busy machine the children write less between kills (two
    // segments made from recycled files in one run of about a dozen with three CPU hogs).
    let enough = |c: &CheckedRecycling| c.recycled >= 3 && c.saw_recycled >= 1;
    let mut kills = 0;
    for i in 0..KILLS_PER_MODE * 3 {
        if i >= KILLS_PER_MODE && enough(&checked) {
            break;
        }
        kills += 1;
        let child_seed = (i as u64 + 1) * 1000 + (seed % 1000);
        let lines = run_child(&dir, "recycling", child_seed, &mut rng, i);
        if !lines.is_empty() {
            kills_with_acks += 1;
        }
        let mut recycled = 0;
        for line in lines {
            let f: Vec<&str> = line.split(' ').collect();
            if f[0] == "C" {
                recycled = f[1].parse().unwrap();
            } else {
                acked.insert(f[1].parse().unwrap(), Lsn(f[2].parse().unwrap()));
            }
        }
        checked.recycled += recycled;
        verify_recycling(&dir, &mut checked, &acked);
        // Records below the slot were checked; only the newer ones need checking again.
        acked.retain(|_, end| *end > checked.end);
    }
    assert!(
        kills_with_acks >= kills / 2,
        "too few kills saw acknowledged writes"
    );
    // The children wrote over recycled segments, and were killed with one ahead of the end.
    assert!(
        enough(&checked),
        "too little recycling to tell after {kills} kills: {} segments made from recycled files, {} kills with one ahead of the end",
        checked.recycled,
        checked.saw_recycled
    );
    println!(
        "recycling: {kills} kills ({kills_with_acks} after acknowledgements, {} with a recycled segment ahead), {} segments made from recycled files, {} records, WAL end {}",
        checked.saw_recycled,
        checked.recycled,
        checked.records.len(),
        checked.end
    );
}
