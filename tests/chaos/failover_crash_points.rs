//! kill -9 at the commit path's crash points under automatic failover: the points of
//! `crash_points.rs` with the three members of `failover_power_loss.rs` on etcd
//! ([`Members`]: `synchronous_mode = on`, lossyfs mounts, the load tool's 16 writers following
//! the leader). The leader dies at its points (after a write before its fdatasync, after an
//! early send before its own flush, after the commit point moved before the answer), the
//! published synchronous member at its own (after its flush before its reply, the leader's
//! power lost at once with it); the mount of each loses what was not synced, and the members
//! start again and settle as failover makes them: the synchronous member takes the next term,
//! or the old leader takes one. Every second death of the leader (the second, the fourth, ...)
//! loses everything the leader had not synced and keeps the synchronous member from etcd and
//! paused until the restarted leader, the only member then allowed to campaign, leads and has
//! written past the member's end: the case rule 5 exists for, where a leader that resumed its
//! timeline would put other bytes under the member's tail. The leader's disk is the slow one
//! of `crash_points.rs` ([`PRIMARY_SYNC_LATENCY`]), moved to whichever member leads at each death.
//!
//! The third member is `nofailover`: it never leads and is never the synchronous standby, so
//! that the member armed at a point is the one the point is meant for, whichever of the other
//! two leads. A member is armed by a clean restart; the leader's while the synchronous member
//! is kept from etcd, so that the leader takes its term back, and the synchronous member's
//! while nobody else could replace it. Judged as every scenario ([`Members::judge`]), with a
//! reader on every member with the switch on. CI runs two deaths per point;
//! `WALSERVER_TEST_CHAOS_CYCLES` runs more. Needs root (FUSE) and etcd.

use std::time::{Duration, Instant};

use anyhow::Context;
use lossyfs::Options;
use wal_storage::FP_FSYNC;
use walreceiver_actor::CRASH_REPLY;
use walsender_actor::overlap::{CRASH_RELEASE, CRASH_SENT_EARLY};

use crate::crash_points::{death_line, died, pass, restart_armed, said_it_dies};
use crate::failover_power_loss::{load_on, name, Members};
use crate::lossy::{serial, Overlap, PRIMARY_SYNC_LATENCY};
use crate::node::*;
use crate::reader::Reader;
use crate::{cycles, seed, Rng};

/// Who dies at a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dies {
    Leader,
    /// The synchronous member at the point, and the leader's power at once after it.
    SyncThenLeader,
}

/// The third member never leads and is never the synchronous standby.
fn shape(i: usize) -> (Options, &'static [(&'static str, &'static str)]) {
    match i {
        0 | 1 => (Options::default(), &[]),
        _ => (Options::default(), &[("failover.nofailover", "true")]),
    }
}

/// Arms `armed` (the `leader` or the synchronous member `sync`) to die at `point` on `pass`
/// by a clean restart ([`restart_armed`]), and returns once it has its role back, or has
/// already died at the point, with where its start's lines begin in its log. A leader's
/// clean stop gives up its lease, so the synchronous member is kept from etcd meanwhile: the
/// leader is then the only member that may take the next term. The synchronous member's
/// restart leaves no other member to publish in its place.
fn arm(
    m: &mut Members,
    armed: usize,
    leader: usize,
    sync: usize,
    point: &str,
    pass: u64,
) -> anyhow::Result<u64> {
    if armed == leader {
        m.etcd_links[sync].close();
        m.etcd_links[sync].cut();
    }
    let from = restart_armed(&mut m.nodes[armed], point, pass)?;
    let line = death_line(point, pass);
    let dead = |m: &Members| m.nodes[armed].log_since(from).contains(&line);
    if armed == leader {
        let back = wait_for(
            &format!("n{leader} to lead again"),
            DEADLINE,
            Duration::from_millis(20),
            || (m.leads(leader) || dead(m)).then_some(()),
        );
        m.etcd_links[sync].open();
        back?;
    } else {
        // Published, and counted by the leader, again.
        wait_for(
            &format!("n{leader} to count on n{sync} again"),
            DEADLINE,
            Duration::from_millis(20),
            || {
                let s = m.status(leader).ok()?;
                let counted = s
                    .replication
                    .iter()
                    .any(|r| r.application_name == name(sync) && r.sync_state == "sync");
                let published = m.published_sync(leader) == Some(sync);
                (dead(m) || (counted && published)).then_some(())
            },
        )?;
    }
    Ok(from)
}

/// How many more cycles a scenario whose point lies between a write and its sync may run for
/// a death that leaves a write unsynced: a guess, as each such death misses only when a 20 ms
/// sync beats the process's end.
const EXTRA_FOR_RISK: u64 = 4;

fn failover_crash_point_cycles(point: &str, dies: Dies, overlap: Overlap) {
    let _one = serial();
    let n_cycles = cycles(2);
    let seed = seed();
    println!(
        "deaths at {point} under failover with overlap {overlap:?}: seed {seed} \
         (WALSERVER_TEST_CHAOS_SEED={seed} replays these deaths)"
    );
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = Members::start_shaped(dir.path(), overlap, shape);
    let load = load_on(&m, dir.path());
    // As in failover_power_loss.rs: readers are held to rule 3 with the switch on only.
    let readers: Vec<Reader> = match overlap {
        Overlap::On => m.nodes.iter().map(Reader::follow).collect(),
        Overlap::Off => Vec::new(),
    };
    let started = Instant::now();
    let (mut lost_writes, mut at_risk, mut resumed_alone) = (0, 0, 0);
    // A death between a write and its sync usually leaves that write unsynced, but the sync
    // runs on another thread and may finish before the process is gone; until one death has
    // left a write at risk, up to `EXTRA_FOR_RISK` more cycles are run.
    let needs_risk = [FP_FSYNC, CRASH_SENT_EARLY].contains(&point);
    let mut cycle = 0;
    while cycle < n_cycles || (needs_risk && at_risk == 0 && cycle < n_cycles + EXTRA_FOR_RISK) {
        let c = format!("cycle {cycle}");
        let (leader, sync) = m.or_logs(m.wait_led_and_sync().context(c.clone()));
        // The leader's disk takes `crash_points.rs`'s primary's sync latency, the others
        // none, so that a standby's report of a batch sent early usually comes before the
        // leader's own flush returns.
        for (i, mount) in m.mounts.iter().enumerate() {
            let slow = if i == leader {
                PRIMARY_SYNC_LATENCY
            } else {
                Duration::ZERO
            };
            mount.set_sync_latency(slow);
        }
        let before = load.count();
        let t = Instant::now();
        let (armed, hit) = match dies {
            Dies::Leader => (leader, vec![leader]),
            Dies::SyncThenLeader => (sync, vec![sync, leader]),
        };
        let pass = pass(&mut rng);
        // Arming restarts the armed member, and its armed process dies at the point: the
        // tails each process cut are counted before it goes (an armed process that dies
        // before arming returns is not asked, having barely started).
        m.count_cuts(&[armed]);
        let from = arm(&mut m, armed, leader, sync, point, pass);
        let from = m.or_logs(from.context(format!("{c}: arming n{armed}")));
        m.count_cuts(&hit);
        let said = said_it_dies(&m.nodes[armed], from, point, pass);
        for &i in &hit {
            m.mounts[i].pull_plug();
        }
        // The case rule 5 exists for: only the old leader may take the next term.
        let alone = dies == Dies::Leader && cycle % 2 == 1;
        if alone {
            m.etcd_links[sync].close();
            m.etcd_links[sync].cut();
        }
        if dies == Dies::SyncThenLeader {
            m.nodes[leader].kill9();
        }
        match died(&mut m.nodes[armed], said) {
            Ok(status) => println!("{c}: n{armed} died at {point}: {status}"),
            Err(e) => panic!(
                "{c}: n{armed} never died at {point} pass {pass}: {e:#}\n{}",
                m.logs()
            ),
        }
        // Where only the old leader may come back, everything it had not synced is lost
        // ([`lossyfs::LossyFs::crash_to_synced`]), so that a tail it sent early is certainly
        // one the synchronous member holds and it lacks.
        for &i in &hit {
            let crash_seed = rng.next_u64();
            let crashed = match alone {
                true => m.mounts[i].crash_to_synced(),
                false => m.mounts[i].crash(crash_seed),
            };
            match crashed {
                Ok(r) => {
                    println!("{c}: n{i} crashed: {r:?}");
                    lost_writes += r.writes_lost;
                    at_risk += r.writes;
                }
                Err(e) => panic!("{c}: crash n{i}: {e}"),
            }
        }
        if alone {
            resumed_alone += 1;
            resume_alone(&mut m, leader, sync, &c);
        } else {
            for &i in hit.iter().rev() {
                m.restart(i, &c);
            }
        }
        let now = m.or_logs(m.wait_led().context(c.clone()));
        let resumed = load.wait_acks_beyond(before + 16, DEADLINE);
        m.or_logs(resumed.context(format!("{c}: appends did not resume")));
        println!(
            "{c}: n{armed} died at pass {pass} (leader n{leader}, synchronous n{sync}); n{now} \
             leads, acknowledged again after {} ms",
            t.elapsed().as_millis()
        );
        cycle += 1;
    }
    if needs_risk {
        assert!(
            at_risk > 0,
            "no death at {point} left an unsynced write\n{}",
            m.logs()
        );
    }
    let acks = load.stop();
    let verdict = m.judge(&acks);
    let nodes: Vec<&ChildNode> = m.nodes.iter().collect();
    let read: Vec<usize> = readers
        .into_iter()
        .map(|r| r.assert_survived(&nodes))
        .collect();
    println!(
        "{cycle} deaths at {point} under failover with overlap {overlap:?} in {:.1} s \
         ({resumed_alone} taken back by the old leader alone): {} appends acknowledged, \
         {lost_writes} of {at_risk} unsynced writes lost by the crashes, {} tails cut, \
         records read {read:?}; {verdict}",
        started.elapsed().as_secs_f64(),
        acks.len(),
        m.tail_cuts(),
    );
}

/// The old leader, dead at its point, starts again while the synchronous member is kept
/// from etcd and paused: it waits for its lease, takes the next term, and writes past the
/// member's end before the member may connect, so that a resumed timeline would put other
/// bytes under the member's tail (rule 5 says it starts a new one; the member then cuts its
/// tail back at its stream start, rule 4).
fn resume_alone(m: &mut Members, leader: usize, sync: usize, c: &str) {
    let sync_end = m.or_logs(m.status(sync).context(format!("{c}: n{sync}'s status")));
    let sync_end = sync_end.flush_lsn;
    let paused = m.nodes[sync].pause();
    m.or_logs(paused.context(format!("{c}: pausing n{sync}")));
    m.restart(leader, c);
    // The leader's durable end is told only by its `/status`, which announces nothing: it
    // is asked, up to the deadline.
    let past = wait_for(
        &format!("n{leader} to lead again past n{sync}'s end {sync_end}"),
        DEADLINE,
        Duration::from_millis(20),
        || (m.leads(leader) && m.status(leader).ok()?.flush_lsn > sync_end).then_some(()),
    );
    m.or_logs(past.context(c.to_string()));
    let resumed = m.nodes[sync].resume();
    m.or_logs(resumed.context(format!("{c}: resuming n{sync}")));
    m.etcd_links[sync].open();
}

#[test]
fn the_leader_killed_between_its_write_and_its_fdatasync_under_failover() {
    failover_crash_point_cycles(FP_FSYNC, Dies::Leader, Overlap::Off);
}

#[test]
fn the_leader_killed_between_its_write_and_its_fdatasync_under_failover_with_overlap() {
    failover_crash_point_cycles(FP_FSYNC, Dies::Leader, Overlap::On);
}

#[test]
fn the_leader_killed_after_an_early_send_before_its_own_flush_under_failover() {
    failover_crash_point_cycles(CRASH_SENT_EARLY, Dies::Leader, Overlap::On);
}

#[test]
fn the_synchronous_member_killed_between_its_flush_and_its_reply_under_failover() {
    failover_crash_point_cycles(CRASH_REPLY, Dies::SyncThenLeader, Overlap::Off);
}

#[test]
fn the_synchronous_member_killed_between_its_flush_and_its_reply_under_failover_with_overlap() {
    failover_crash_point_cycles(CRASH_REPLY, Dies::SyncThenLeader, Overlap::On);
}

#[test]
fn the_leader_killed_after_the_commit_point_moved_under_failover() {
    failover_crash_point_cycles(CRASH_RELEASE, Dies::Leader, Overlap::Off);
}

#[test]
fn the_leader_killed_after_the_commit_point_moved_under_failover_with_overlap() {
    failover_crash_point_cycles(CRASH_RELEASE, Dies::Leader, Overlap::On);
}
