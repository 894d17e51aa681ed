//! Network fault scenarios: a primary and two standbys as processes on hosts of a test
//! network (`fault-harness`: network namespaces, nft, a delaying proxy, signals), under the
//! load tool's appends at durability `on`. Each scenario is judged by the client's
//! acknowledgement log (every acknowledged record on every node, at its LSN, with its hash)
//! and the standbys' WAL compared with the primary's byte for byte; never by server logs.
//! Each writes one row of figures (`fault_harness::report`), under
//! `$CARGO_TARGET_DIR/reliability/` or `WALSERVER_TEST_RELIABILITY_DIR`.
//!
//! Needs root, nftables and iproute2 (`scripts/test.sh` installs nftables when missing). The
//! scenarios run one at a time (a lock), so that their timings are their own.

mod cluster;

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cluster::{Cluster, Options, DEADLINE, TIMEOUT, WRITERS};
use fault_harness::fault;
use fault_harness::proxy::Delay;
use supervisor_actor::NodeStatus;
use wal_storage::Lsn;
use walserver_bench::{acklog, judge};

/// One scenario at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Each request of the load is given up after this long: longer than every fault, so the
/// appends a fault holds are the ones that complete after it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Appends acknowledged after a recovery before a scenario ends: the load flows again, and
/// there is more to verify than the appends the fault held.
const AFTER: usize = 200;

/// A cluster with its load running and 50 appends acknowledged.
fn under_load(label: &str, opts: Options) -> Cluster {
    let mut c = Cluster::start(label, opts);
    c.start_load(REQUEST_TIMEOUT);
    c.wait_more_acks(50, DEADLINE);
    c
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Every (writer, seq) acknowledged so far, and each writer's highest seq.
fn acknowledged(c: &Cluster) -> (HashSet<(usize, u64)>, Vec<Option<u64>>) {
    let log = acklog::read(&c.ack_log).expect("read the ack log");
    let mut last = vec![None; WRITERS];
    let mut all = HashSet::new();
    for e in log {
        if e.writer < WRITERS {
            last[e.writer] = last[e.writer].max(Some(e.seq));
        }
        all.insert((e.writer, e.seq));
    }
    (all, last)
}

/// Acknowledgements that arrived between `from_ms` and `to_ms` for WAL past `durable`, the
/// synchronous standby's end while the fault kept it from the primary: appends acknowledged
/// without it. Answers on their way when the fault began end at or below `durable`, so no
/// grace period is needed to tell them apart.
fn acked_without_sync_standby(
    c: &Cluster,
    from_ms: u64,
    to_ms: u64,
    durable: Lsn,
) -> Option<String> {
    let log = acklog::read(&c.ack_log).expect("read the ack log");
    let bad = judge::acked_beyond(&log, from_ms, to_ms, durable);
    (!bad.is_empty()).then(|| {
        let shown: Vec<_> = bad
            .iter()
            .take(5)
            .map(|e| (e.writer, e.seq, e.end_lsn.to_string(), e.mono_ms))
            .collect();
        format!(
            "{} appends acknowledged past {durable}, all that s1 held, while it was cut off \
             (writer, seq, end, ms): {shown:?}",
            bad.len()
        )
    })
}

/// One cut of the synchronous standby: what went wrong, and how long after the heal the
/// held appends were all acknowledged.
fn cut_sync_standby(c: &mut Cluster, cut_len: Duration) -> (Vec<String>, Option<Duration>) {
    let mut problems = Vec::new();
    let cut = fault::cut(&c.hosts[0], &c.hosts[1]).expect("cut p-s1");
    let cut_at = Instant::now();
    let cut_ms = acklog::mono_ms();
    // The primary writes the appends the cut holds, past everything it acknowledged (answers
    // already on their way when the cut began arrive in the meantime).
    let held_end = c
        .primary
        .wait_status("write appends it cannot acknowledge", cut_len, |s| {
            s.flush_lsn > c.acked_end()
        });
    let (_, before) = acknowledged(c);
    let primary_end = match held_end {
        Ok(s) => s.flush_lsn,
        Err(e) => {
            problems.push(format!("the primary holds no unacknowledged append: {e}"));
            c.primary_flush()
        }
    };
    // The asynchronous standby must receive the held appends while the synchronous one is cut
    // off.
    let left = cut_len.saturating_sub(cut_at.elapsed());
    if let Err(e) = c.s2.wait_status("receive the held appends", left, |s| {
        s.flush_lsn >= primary_end
    }) {
        problems.push(format!(
            "the async standby did not get the held appends: {e}"
        ));
    }
    // The cut lasts its length: the fault's duration, not a wait for an event.
    std::thread::sleep(cut_len.saturating_sub(cut_at.elapsed()));
    let s1_end = c.s1.status().expect("s1's status").flush_lsn;
    let heal_ms = acklog::mono_ms();
    cut.heal().expect("heal");
    let healed = Instant::now();
    problems.extend(acked_without_sync_standby(c, cut_ms, heal_ms, s1_end));
    // Each writer's held append is the one after the last it had acknowledged.
    let held: Vec<(usize, u64)> = before
        .iter()
        .enumerate()
        .map(|(w, s)| (w, s.map_or(0, |s| s + 1)))
        .collect();
    let released = c.acks_wait_until(DEADLINE, |all| held.iter().all(|h| all.contains(h)));
    if released.is_none() {
        let (all, _) = acknowledged(c);
        let missing: Vec<_> = held.iter().filter(|h| !all.contains(h)).collect();
        problems.push(format!(
            "held appends (writer, seq) {missing:?} not acknowledged after the heal"
        ));
    }
    (problems, released.map(|t| t - healed))
}

#[test]
fn sync_standby_cut_off_holds_appends_until_healed() {
    let _serial = serial();
    // Timeouts well past the cut: the stream stalls and resumes, it is not torn down.
    let mut c = under_load(
        "synccut",
        Options {
            timeout: Some(Duration::from_secs(10)),
            ..Options::default()
        },
    );
    let cut_len = Duration::from_secs(2);
    let cycles = 3;
    let mut problems = Vec::new();
    let mut recover = Vec::new();
    for _ in 0..cycles {
        let (p, r) = cut_sync_standby(&mut c, cut_len);
        problems.extend(p);
        recover.extend(r.map(ms));
        c.wait_more_acks(50, DEADLINE);
    }
    c.wait_more_acks(AFTER, DEADLINE);
    let verdict = c.finish().with(problems);
    c.row(
        "sync_standby_cut_off_holds_appends_until_healed",
        &format!("sync standby cut off {}s (timeouts 10s)", cut_len.as_secs()),
        cycles,
        &verdict,
        &recover,
    );
    verdict.assert_ok();
}

#[test]
fn primary_cut_off_past_both_timeouts_streams_again_after_heal() {
    let _serial = serial();
    let mut c = under_load("isolate", Options::default());
    let outage = TIMEOUT * 2 + Duration::from_secs(1);
    let cycles = 2;
    let mut problems = Vec::new();
    let mut recover = Vec::new();
    for cycle in 0..cycles {
        let isolated = fault::isolate(&c.hosts[0]).expect("isolate the primary");
        let at = Instant::now();
        // Both ends must notice: the primary's walsenders end (wal_sender_timeout) and the
        // standbys' walreceivers stop streaming (wal_receiver_timeout).
        if let Err(e) = c.primary.wait_status("drop both walsenders", outage, |s| {
            !s.streams_to("s1") && !s.streams_to("s2")
        }) {
            problems.push(format!("cycle {cycle}: the primary kept a walsender: {e}"));
        }
        if !c.standbys_stop_receiving(outage.saturating_sub(at.elapsed())) {
            problems.push(format!(
                "cycle {cycle}: a standby kept streaming through the cut"
            ));
        }
        std::thread::sleep(outage.saturating_sub(at.elapsed()));
        isolated.heal().expect("heal");
        let healed = Instant::now();
        match c.wait_all_streaming(DEADLINE) {
            Ok(d) => recover.push(ms(d)),
            Err(e) => problems.push(format!("cycle {cycle}: not streaming again: {e}")),
        }
        let (_, acked) = c.wait_more_acks(WRITERS, DEADLINE);
        eprintln!(
            "cycle {cycle}: appends acknowledged again {:?} after the heal",
            acked - healed
        );
    }
    c.wait_more_acks(AFTER, DEADLINE);
    let verdict = c.finish().with(problems);
    c.row(
        "primary_cut_off_past_both_timeouts_streams_again_after_heal",
        &format!("primary cut off from both standbys {}s", outage.as_secs()),
        cycles,
        &verdict,
        &recover,
    );
    verdict.assert_ok();
}

#[test]
fn delay_jitter_and_loss_lose_nothing() {
    let _serial = serial();
    let delay = Delay {
        delay: Duration::from_millis(20),
        jitter: Duration::from_millis(10),
    };
    let mut c = Cluster::start(
        "lossy",
        Options {
            s1_delay: Some(delay),
            ..Options::default()
        },
    );
    let first = c.primary.status().expect("status");
    let pid_of = |s: &NodeStatus| s.sender("s1").map(|r| r.pid);
    let s1_pid = pid_of(&first);
    let _loss = (
        fault::loss(&c.hosts[0], &c.hosts[1], 1).expect("loss p->s1"),
        fault::loss(&c.hosts[1], &c.hosts[0], 1).expect("loss s1->p"),
    );
    c.start_load(REQUEST_TIMEOUT);
    let at = Instant::now();
    let load_for = Duration::from_secs(8);
    c.wait_more_acks(50, DEADLINE);
    std::thread::sleep(load_for.saturating_sub(at.elapsed()));
    let last = c.primary.status().expect("status");
    let still = pid_of(&last) == s1_pid && last.streams_to("s1");
    let forwarded = c.proxy.as_ref().map_or(0, |p| p.forwarded());
    c.wait_more_acks(AFTER, DEADLINE);
    let stopped = Instant::now();
    let verdict = c.finish();
    let caught_up = stopped.elapsed();
    c.row(
        "delay_jitter_and_loss_lose_nothing",
        "s1 link: 20ms ± 10ms delay, 1% loss both ways",
        1,
        &verdict,
        &[ms(caught_up)],
    );
    assert!(forwarded > 0, "nothing went through the proxy");
    assert!(
        still,
        "s1's stream did not last: {s1_pid:?} then {:?}",
        pid_of(&last)
    );
    verdict.assert_ok();
}

#[test]
fn one_way_partitions_fire_the_timeouts_and_heal() {
    let _serial = serial();
    let mut c = under_load("oneway", Options::default());
    let outage = TIMEOUT * 2 + Duration::from_secs(1);
    let mut recover = Vec::new();
    let mut problems = Vec::new();
    for to_standby in [true, false] {
        let (from, to) = if to_standby {
            (&c.hosts[0], &c.hosts[1])
        } else {
            (&c.hosts[1], &c.hosts[0])
        };
        let f = fault::drop_one_way(from, to).expect("one-way drop");
        let at = Instant::now();
        // Primary to standby lost: the standby hears nothing (wal_receiver_timeout). Standby
        // to primary lost: the primary hears no reply (wal_sender_timeout).
        let noticed = if to_standby {
            c.s1.wait_status("stop receiving", outage, |s| !s.receiving())
        } else {
            c.primary
                .wait_status("drop s1's walsender", outage, |s| !s.streams_to("s1"))
        };
        let what = f.describe().to_string();
        if let Err(e) = noticed {
            problems.push(format!("no timeout fired during {what}: {e}"));
        }
        std::thread::sleep(outage.saturating_sub(at.elapsed()));
        f.heal().expect("heal");
        let healed = Instant::now();
        match c.wait_all_streaming(DEADLINE) {
            Ok(d) => recover.push(ms(d)),
            Err(e) => problems.push(format!("not streaming again after {what}: {e}")),
        }
        let (_, acked) = c.wait_more_acks(WRITERS, DEADLINE);
        eprintln!(
            "{what}: appends acknowledged again {:?} after the heal",
            acked - healed
        );
    }
    c.wait_more_acks(AFTER, DEADLINE);
    let verdict = c.finish().with(problems);
    c.row(
        "one_way_partitions_fire_the_timeouts_and_heal",
        &format!("one-way drop p->s1 then s1->p, {}s each", outage.as_secs()),
        2,
        &verdict,
        &recover,
    );
    verdict.assert_ok();
}

#[test]
fn paused_primary_recovers_after_resume() {
    let _serial = serial();
    let mut c = under_load("paused", Options::default());
    let pause = TIMEOUT * 2 + Duration::from_secs(1);
    let cycles = 2;
    let mut problems = Vec::new();
    let mut recover = Vec::new();
    for cycle in 0..cycles {
        c.primary.pause().expect("SIGSTOP");
        let at = Instant::now();
        let pause_ms = acklog::mono_ms();
        if !c.standbys_stop_receiving(pause.saturating_sub(at.elapsed())) {
            problems.push(format!(
                "cycle {cycle}: a standby kept streaming from a stopped primary"
            ));
        }
        std::thread::sleep(pause.saturating_sub(at.elapsed()));
        // Answers the primary wrote before it stopped may still be read by the load; none
        // may be for WAL the synchronous standby did not hold.
        let s1_end = c.s1.status().expect("s1's status").flush_lsn;
        let resume_ms = acklog::mono_ms();
        if let Some(p) = acked_without_sync_standby(&c, pause_ms, resume_ms, s1_end) {
            problems.push(format!("cycle {cycle}: a stopped primary: {p}"));
        }
        c.primary.resume().expect("SIGCONT");
        let resumed = Instant::now();
        match c.wait_all_streaming(DEADLINE) {
            Ok(d) => recover.push(ms(d)),
            Err(e) => problems.push(format!("cycle {cycle}: not streaming again: {e}")),
        }
        let (_, acked) = c.wait_more_acks(WRITERS, DEADLINE);
        eprintln!(
            "cycle {cycle}: appends acknowledged again {:?} after SIGCONT",
            acked - resumed
        );
    }
    c.wait_more_acks(AFTER, DEADLINE);
    let verdict = c.finish().with(problems);
    c.row(
        "paused_primary_recovers_after_resume",
        &format!("primary SIGSTOPped {}s", pause.as_secs()),
        cycles,
        &verdict,
        &recover,
    );
    verdict.assert_ok();
}
