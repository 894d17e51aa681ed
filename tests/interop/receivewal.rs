//! pg_receivewal against a walserver primary: it streams segments byte-identical to
//! walserver's, with or without a slot, synchronous or not, and resumes with no gap after a
//! SIGKILL.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pg_testkit::PgBin;
use wal_storage::{segment_file_name, Lsn, TimelineId, Wal};

use crate::common::receivewal::Receiver;
use crate::common::*;

/// Every completed segment pg_receivewal wrote is byte-identical to walserver's.
fn compare_segments(node: &TestNode, dir: &Path) -> usize {
    let mut compared = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.len() != 24 || name.ends_with(".partial") {
            continue;
        }
        let theirs = read_file(&dir.join(&name));
        let ours = read_file(&node.data_dir().join("pg_wal").join(&name));
        assert!(
            theirs == ours,
            "segment {name} differs between pg_receivewal and walserver"
        );
        compared += 1;
    }
    compared
}

/// Appends one MiB (8 records of 128 KiB) and waits until it is durable.
fn append_one_mib(wal: &Wal, seed: u8) -> Lsn {
    let payloads = (0..8)
        .map(|i| bytes::Bytes::from(vec![seed.wrapping_add(i); 128 << 10]))
        .collect();
    let ends = wal.append(payloads).unwrap().wait().unwrap();
    *ends.last().unwrap()
}

/// An appender on its own thread: one MiB at a time until it is told to stop and its WAL
/// reaches `target`. It also stops at a cap, so a test that fails while it runs does not fill
/// the disk.
struct Appender {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Lsn>>,
}

impl Appender {
    fn start(wal: Wal, target: Lsn) -> Appender {
        const CAP_MIB: usize = 512;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut end = wal.flushed();
            for i in 0..CAP_MIB {
                if end >= target && flag.load(Ordering::Relaxed) {
                    break;
                }
                end = append_one_mib(&wal, i as u8);
            }
            end
        });
        Appender {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the appends and returns the end of the last one.
    fn finish(mut self) -> Lsn {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().expect("appender")
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The ways operators run pg_receivewal, each tested through a SIGKILL.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ReceiveMode {
    /// No slot: the server keeps WAL for it through `wal_keep_size`.
    Plain,
    /// `--create-slot --slot S` once, then streaming with `--slot S`: the slot keeps its WAL.
    Slot,
    /// `--slot S --synchronous`: it fsyncs what it writes at once and reports it as flushed.
    Synchronous,
}

const SLOT: &str = "recv1";

/// pg_receivewal in `mode` streams at least 64 MiB of `seg`-byte segments while records are
/// appended, is killed with SIGKILL part of the way and restarted, and ends with every segment
/// from the first it streamed to the last completed, each byte-identical to walserver's: it
/// resumed with no gap.
fn pg_receivewal_streams_and_resumes_after_sigkill(mode: ReceiveMode, seg: u64) {
    const STREAM: u64 = 64 << 20;
    let bin = PgBin::require();
    // The server keeps every segment, so that all of pg_receivewal's can be compared with
    // its own at the end; a slot would let go of those pg_receivewal has flushed.
    let node = TestNode::primary_with_segments(seg, "wal_keep_size = \"1GB\"");
    // Some WAL before it starts, so that it starts inside the WAL, not at its beginning.
    for i in 0..2 {
        append_one_mib(node.wal(), i);
    }
    let mut args = vec![];
    if mode != ReceiveMode::Plain {
        args.extend(["--slot", SLOT]);
    }
    if mode == ReceiveMode::Synchronous {
        args.push("--synchronous");
    }
    let conninfo = format!("host=127.0.0.1 port={} user=repl", node.addr().port());
    let mut recv = Receiver::new(&bin, &conninfo, &args);
    if mode != ReceiveMode::Plain {
        recv.run_once(&["--create-slot", "--slot", SLOT]);
        assert_eq!(node.http_get("/slots")[0]["slot_name"], SLOT);
    }
    // pg_receivewal starts at the beginning of the segment holding the server's end of WAL.
    let first = node.wal().flushed().segment_number(seg);
    recv.start();
    let slot_holds_wal = || node.http_get("/slots")[0]["restart_lsn"].is_string();
    match mode {
        ReceiveMode::Plain => wait_until("pg_receivewal to stream", || {
            node.http_get("/status")["replication"][0]["state"] == "streaming"
        }),
        // Its first status report makes the slot hold WAL from where it started.
        ReceiveMode::Slot | ReceiveMode::Synchronous => {
            wait_until("the slot to hold WAL", slot_holds_wal)
        }
    }
    // Enough that the completed segments from the first hold at least 64 MiB.
    let appender = Appender::start(node.wal().clone(), Lsn(first * seg + STREAM));
    let per_16_mib = (16 << 20) / seg;
    recv.wait_for_segment(first + per_16_mib, seg);
    // Killed while records are appended, and restarted at once.
    recv.kill_hard(seg);
    if mode != ReceiveMode::Plain {
        // The walsender of the killed process lets go of the slot once it sees the connection
        // close; a new pg_receivewal that came sooner would be refused with "slot is active".
        wait_until("the slot to be released", || {
            node.http_get("/slots")[0]["active"] == false
        });
    }
    recv.start();
    // The appends go on until the restarted pg_receivewal has streamed another 16 MiB.
    recv.wait_for_segment(first + 2 * per_16_mib, seg);
    if mode != ReceiveMode::Plain {
        assert_eq!(
            node.http_get("/status")["replication"][0]["slot_name"],
            SLOT
        );
    }
    let end = appender.finish();
    let last = end.segment_number(seg) - 1;
    recv.wait_for_segment(last, seg);
    if mode == ReceiveMode::Synchronous {
        // It reports its fsynced position as flush, and the slot follows it.
        wait_until("pg_receivewal to report flush", || {
            node.http_get("/status")["replication"][0]["flush_lsn"]
                == serde_json::json!(end.to_string())
        });
        wait_until("the slot to advance", || {
            node.http_get("/slots")[0]["restart_lsn"] == serde_json::json!(end.to_string())
        });
    }
    recv.kill_hard(seg);
    // Every segment from the first to the last completed one is there, and equal: no gap.
    let listing: Vec<_> = std::fs::read_dir(recv.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    for segno in first..=last {
        let name = segment_file_name(TimelineId(1), segno, seg);
        assert!(
            recv.dir().join(&name).exists(),
            "pg_receivewal has no {name}: {listing:?}"
        );
    }
    assert!(
        (last + 1 - first) * seg >= STREAM,
        "streamed only segments {first}..={last}"
    );
    let compared = compare_segments(&node, &recv.dir());
    assert_eq!(compared as u64, last + 1 - first, "{listing:?}");
}

/// PostgreSQL's default 16 MiB segments, no slot.
#[test]
fn pg_receivewal_streams_identical_segments_and_resumes_after_sigkill() {
    pg_receivewal_streams_and_resumes_after_sigkill(ReceiveMode::Plain, 16 << 20);
}

#[test]
fn pg_receivewal_with_a_created_slot_streams_identical_segments_and_resumes_after_sigkill() {
    pg_receivewal_streams_and_resumes_after_sigkill(ReceiveMode::Slot, 1 << 20);
}

#[test]
fn pg_receivewal_synchronous_reports_flush_and_resumes_after_sigkill() {
    pg_receivewal_streams_and_resumes_after_sigkill(ReceiveMode::Synchronous, 2 << 20);
}
