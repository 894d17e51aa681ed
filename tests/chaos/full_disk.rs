//! A full disk, on the primary and on a standby, with and without synchronous replication.
//! The full node's data directory is on a 64 MiB tmpfs (unmounted on drop, also when the test
//! fails) that a ballast file fills while the load tool's writers append. Then: appends fail
//! with `507 Insufficient Storage` and an error that says the disk is full; what is
//! already durable is still served (the full node's records are readable, a standby of a full
//! primary still streams and holds everything the primary made durable); and once the
//! ballast is removed, appends are acknowledged again by themselves, which is timed. Judged
//! against the client's acknowledgement log: nothing acknowledged is missing afterwards.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fault_harness::tmpfs::Tmpfs;
use walserver_bench::acklog;

use crate::node::*;
use crate::{assert_judged, cycles, write_row, Acks, Load};

const DISK: u64 = 64 << 20;

/// Which node's disk fills up.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Full {
    Primary,
    Standby,
}

/// Fills the file system of `path` with a file there, until a write fails with ENOSPC.
/// Returns the bytes written by this call. Bounded: the disk is `DISK` bytes.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the ballast");
    let chunk = vec![0u8; 64 << 10];
    let mut written = 0u64;
    for _ in 0..(2 * DISK / chunk.len() as u64) {
        match f.write_all(&chunk) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("write the ballast: {e}"),
        }
    }
    // The last, partial chunk: single bytes until the file system has none left.
    for _ in 0..chunk.len() {
        match f.write_all(&[0]) {
            Ok(()) => written += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return written,
            Err(e) => panic!("write the ballast: {e}"),
        }
    }
    panic!("{} never filled up", path.display());
}

/// Whether an answer to a refused append is the clear, retryable "disk full" one.
fn is_disk_full_answer(status: u16, text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    status == 507
        && (t.contains("no space") || t.contains("disk is full") || t.contains("disk full"))
}

/// Dropped in this order: the nodes (killed), then the tmpfs (unmounted), then the
/// directory it was mounted in.
struct Setup {
    primary: ChildNode,
    standby: ChildNode,
    _disk: Tmpfs,
    ballast: PathBuf,
    _dir: tempfile::TempDir,
}

fn setup(full: Full, sync: bool) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let disk = Tmpfs::mount(&dir.path().join("disk"), DISK).expect("mount a tmpfs");
    let on_disk = |node: Full, name: &str| {
        if node == full {
            disk.path().join(name)
        } else {
            dir.path().join(name)
        }
    };
    // The full node keeps little WAL, so the load alone does not fill its 64 MiB; the other
    // keeps all of it, so every acknowledged append can be checked there.
    let keep = |node: Full| if node == full { "16MB" } else { "4GB" };
    let pdata = on_disk(Full::Primary, "primary");
    walserver_node::init::init_primary(&pdata, 1 << 20).expect("init the primary");
    // The logs are kept off the small disk: the test reads them, and a log that cannot be
    // written is a fault of its own (`an_unwritable_log_is_not_a_crash`).
    let mut primary = child_node(
        "primary",
        &pdata,
        &[
            ("wal_keep_size", keep(Full::Primary)),
            ("synchronous_standby_names", if sync { "s1" } else { "" }),
        ],
    )
    .with_log(&dir.path().join("primary.log"));
    primary.start().expect("start the primary");
    let sdata = on_disk(Full::Standby, "standby");
    walserver_node::init::init_standby(&sdata, &conninfo_at(primary.listen, "s1"), None, None)
        .expect("init the standby");
    let mut standby = child_node(
        "standby",
        &sdata,
        &[
            ("wal_keep_size", keep(Full::Standby)),
            ("wal_receiver_status_interval", "1"),
        ],
    )
    .with_log(&dir.path().join("standby.log"));
    standby.start().expect("start the standby");
    let ballast = disk.path().join("ballast");
    Setup {
        primary,
        standby,
        _disk: disk,
        ballast,
        _dir: dir,
    }
}

impl Setup {
    fn logs(&self) -> String {
        [&self.primary, &self.standby]
            .iter()
            .map(|n| format!("--- {} ---\n{}\n", n.name, n.log_tail()))
            .collect()
    }

    /// Waits until the standby streams and is durable up to the primary's end.
    fn caught_up(&self) -> anyhow::Result<()> {
        let target = self.primary.status()?.flush_lsn;
        wait_for(
            &format!("the standby streaming and durable up to {target}"),
            DEADLINE,
            Duration::from_millis(5),
            || {
                let s = self.standby.status().ok()?;
                (s.receiving() && s.flush_lsn >= target).then_some(())
            },
        )
    }
}

/// Lines of a node's log saying a write found no space.
fn no_space_lines(node: &ChildNode) -> usize {
    let log = node.log_text();
    log.matches("No space left on device").count()
}

/// One cycle: fill the disk, check what a full disk must and must not do, free it and time
/// until appends are acknowledged again (with a full asynchronous standby, until it has caught
/// up, since the primary's appends never stopped).
fn one_cycle(
    s: &Setup,
    load: &Load,
    acks: &mut Acks,
    (full, sync): (Full, bool),
    cycle: u64,
) -> Duration {
    let durability = if sync { "on" } else { "local" };
    let probe_timeout = Some(Duration::from_secs(2));
    let no_space_before = no_space_lines(&s.standby);
    let filled = fill(&s.ballast);
    println!("cycle {cycle}: {full:?} disk full (sync: {sync}): {filled} bytes of ballast");
    match full {
        Full::Primary => {
            // Appends go on into the current segment until a new one is needed: probe until
            // one fails, topping the ballast up in case the node freed a segment meanwhile.
            let (status, text) = wait_for(
                "an append to fail on the full primary",
                DEADLINE,
                Duration::from_millis(1),
                || match acks.try_append(&s.primary, 4096, durability, probe_timeout) {
                    Ok(_) => {
                        fill(&s.ballast);
                        None
                    }
                    Err(e) => Some(e),
                },
            )
            .expect("appends to fail on a full disk");
            println!("a full primary answers an append with HTTP {status}: {text}");
            assert!(
                is_disk_full_answer(status, &text),
                "a full primary answered an append with {status} {text:?}: not a clear \
                 retryable disk-full error\n{}",
                s.logs()
            );
            // What the primary made durable is still served: its standby streams and holds
            // all of it, and the primary's own records are readable.
            s.caught_up().unwrap_or_else(|e| {
                panic!("{e:#}: the full primary stopped serving\n{}", s.logs())
            });
            acklog::fetch_records(&s.primary.http_str(), None)
                .expect("a full primary's records are readable");
        }
        Full::Standby => {
            // The standby fails to write what it receives. It says so in its log; the test
            // waits for that only to know the fault has struck, woken by the log's writes.
            s.standby
                .wait_log("the standby to run out of space", DEADLINE, || {
                    no_space_lines(&s.standby) > no_space_before
                })
                .unwrap_or_else(|e| panic!("{e:#}\n{}", s.logs()));
            // Its status, flush position included, reads whole.
            s.standby
                .status()
                .expect("a full standby answers /status with its flush position");
            acklog::fetch_records(&s.standby.http_str(), None)
                .expect("a full standby's records are readable");
            let probe = acks.try_append(&s.primary, 4096, durability, probe_timeout);
            if sync {
                // A synchronous standby that cannot write holds appends at `on`: none is
                // acknowledged while its disk is full.
                let (status, text) = probe.expect_err(
                    "an append acknowledged at on while its synchronous standby's disk is full",
                );
                println!("with a full synchronous standby an append gets {status}: {text}");
            } else {
                probe.expect("the primary takes appends while an asynchronous standby is full");
            }
        }
    }

    // Space returns: appends are acknowledged again without anyone's help.
    let acked = load.count();
    std::fs::remove_file(&s.ballast).expect("remove the ballast");
    let freed = Instant::now();
    load.wait_acks_beyond(acked, DEADLINE)
        .unwrap_or_else(|e| panic!("{e:#}: appends did not resume\n{}", s.logs()));
    let resumed = freed.elapsed();
    s.caught_up()
        .unwrap_or_else(|e| panic!("{e:#}: the standby did not catch up\n{}", s.logs()));
    let caught_up = freed.elapsed();
    println!(
        "cycle {cycle}: after the ballast went, appends resumed in {:.0} ms, the standby caught \
         up in {:.0} ms",
        resumed.as_secs_f64() * 1e3,
        caught_up.as_secs_f64() * 1e3
    );
    if full == Full::Standby && !sync {
        caught_up
    } else {
        resumed
    }
}

fn full_disk(full: Full, sync: bool) {
    let run_started = Instant::now();
    let s = setup(full, sync);
    let durability = if sync { "on" } else { "local" };
    let work = s._dir.path().join("load");
    std::fs::create_dir_all(&work).expect("the load's directory");
    let load = Load::start(&s.primary, &work, 2, 1, 512, durability);
    load.wait_acks_beyond(0, DEADLINE)
        .expect("the writers to be acknowledged");
    s.caught_up().expect("the standby to stream");
    let mut acks = Acks::default();
    let n_cycles = cycles(1);
    let mut recover = Vec::new();
    for cycle in 0..n_cycles {
        recover.push(one_cycle(&s, &load, &mut acks, (full, sync), cycle));
    }
    acks.try_append(&s.primary, 4096, durability, None)
        .expect("an append after the disk has room again");
    let log = load.stop();
    s.caught_up().expect("the standby to catch up at the end");

    // Nothing acknowledged is missing: on the node that kept all its WAL, every record is
    // checked; on the one that kept 16 MB, what it still has.
    let mut lost = 0;
    for n in [&s.primary, &s.standby] {
        let records = acklog::fetch_records(&n.http_str(), None).expect("records");
        let v = acklog::verify(&log, &records);
        println!(
            "{}: {} of {} acknowledged records found, {} lost, {} older than it keeps",
            n.name, v.found, v.records, v.lost, v.unverifiable
        );
        let keeps_all = (n.name == "primary") != (full == Full::Primary);
        if keeps_all {
            assert_eq!(v.unverifiable, 0, "{} keeps all its WAL", n.name);
        }
        assert_eq!(
            v.lost, 0,
            "{} lost acknowledged appends: {:?}",
            n.name, v.lost_examples
        );
        lost += v.lost + acks.lost_on(n);
    }
    assert_judged(&[&log, acks.entries()], &[&s.primary, &s.standby]);
    let which = match full {
        Full::Primary => "primary",
        Full::Standby => "standby",
    };
    let mode = if sync { "sync" } else { "async" };
    write_row(
        &format!("full-disk-{which}-{mode}"),
        &format!(
            "full disk (64 MiB tmpfs) on the {which}, {} replication, writers at {durability}",
            if sync { "synchronous" } else { "asynchronous" }
        ),
        n_cycles,
        run_started.elapsed(),
        log.len() as u64 + acks.count(),
        lost,
        recover.len() as u64,
        &recover,
        &format!(
            "WALSERVER_TEST_CHAOS_CYCLES={n_cycles} cargo test --test chaos full_disk_on_the_{which}_{mode}"
        ),
    );
}

#[test]
fn full_disk_on_the_primary_async() {
    full_disk(Full::Primary, false);
}

#[test]
fn full_disk_on_the_primary_sync() {
    full_disk(Full::Primary, true);
}

#[test]
fn full_disk_on_the_standby_async() {
    full_disk(Full::Standby, false);
}

#[test]
fn full_disk_on_the_standby_sync() {
    full_disk(Full::Standby, true);
}

/// A node whose standard error cannot be written (`/dev/full` answers every write with
/// ENOSPC, as a log on a full disk does) keeps running, takes appends and streams them:
/// losing log lines must not cost a thread.
#[test]
fn an_unwritable_log_is_not_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pdata = dir.path().join("primary");
    walserver_node::init::init_primary(&pdata, 1 << 20).expect("init the primary");
    let mut primary =
        child_node("primary", &pdata, &[("log_level", "debug")]).with_log(Path::new("/dev/full"));
    primary.start().expect("a node logging to /dev/full starts");
    let sdata = dir.path().join("standby");
    walserver_node::init::init_standby(&sdata, &conninfo_at(primary.listen, "s1"), None, None)
        .expect("init the standby");
    let mut standby =
        child_node("standby", &sdata, &[("log_level", "debug")]).with_log(Path::new("/dev/full"));
    standby
        .start()
        .expect("a standby logging to /dev/full starts");
    let mut acks = Acks::default();
    let end = acks
        .append(&primary, 200, 256)
        .expect("appends on a node whose log cannot be written");
    standby
        .wait_flushed(end, "the standby to hold the appends")
        .expect("streaming from a node whose log cannot be written");
    // A restart of the standby logs more (connections, the walreceiver's start).
    standby.kill9();
    standby.start().expect("the standby restarts");
    let end = acks.append(&primary, 50, 256).expect("more appends");
    standby
        .wait_flushed(end, "the restarted standby to hold the appends")
        .expect("streaming after the restart");
    assert!(primary.running() && standby.running());
    assert_eq!(acks.lost_on(&primary) + acks.lost_on(&standby), 0);
    assert_judged(&[acks.entries()], &[&primary, &standby]);
}
