//! kill -9 at named places of the commit's path: the pair of the power-loss scenarios
//! ([`Run`]: a primary and its synchronous standby as `walserver run` processes on `lossyfs`
//! mounts, 16 writers, a reader on each node), where a node dies by itself at a crash point
//! (`wal_storage::crash`, armed by `WALSERVER_TEST_CRASH_AT=POINT:PASS` in a build with
//! `failpoints`: `std::process::abort`, nothing cleaned up, nobody answered), its mount then
//! loses what was not synced, and it starts again. The points, each where a rule of the
//! overlapped commit could break:
//!
//! - the primary after a write, before its fdatasync (`wal_storage::fsync::err`): nothing
//!   of the batch may have been acknowledged (rule 1: the primary's own flush is required);
//! - the primary after an early send reached the standby, before its own flush returned
//!   (`walsender_actor::sent_early::crash`, with the switch on only, as only then is anything
//!   sent early): the standby holds a tail the primary loses, which the primary's new
//!   timeline makes a fork (rule 5) and the standby cuts back (rule 4);
//! - the standby after its flush, before its reply (`walreceiver_actor::reply::crash`),
//!   with the primary's power lost at once too: the standby may hold durable WAL its
//!   primary lost and never heard of;
//! - the primary after the commit point moved, before the clients were answered
//!   (`walsender_actor::release::crash`): the appends are acknowledged to no one, and are
//!   kept.
//!
//! Each point runs with the switch on and, where it is reached, off. After the last cycle
//! the judge of every scenario ([`Run::finish`]): every acknowledged append on both nodes
//! exactly once, both byte-identical up to the shorter end, and nothing a reader was given
//! taken back. CI runs two deaths per point; `WALSERVER_TEST_CHAOS_CYCLES` runs more. The
//! same points under `[failover]` are `failover_crash_points.rs`, which arms and waits for
//! its deaths through the functions here.

use std::time::Instant;

use lossyfs::Options;
use wal_storage::FP_FSYNC;
use walreceiver_actor::CRASH_REPLY;
use walsender_actor::overlap::{CRASH_RELEASE, CRASH_SENT_EARLY};

use crate::lossy::{serial, Overlap, PRIMARY_SYNC_LATENCY};
use crate::node::{ChaosNode, ChildNode, DEADLINE};
use crate::power_loss::Run;
use crate::{cycles, Rng};

/// The variable the `walserver` binary arms its crash point from.
pub(crate) const CRASH_AT: &str = "WALSERVER_TEST_CRASH_AT";

/// The node that dies at a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dies {
    Primary,
    /// The standby at the point, and the primary's power at once after it.
    StandbyThenPrimary,
}

impl Dies {
    /// The node armed with the crash point.
    fn armed(self) -> usize {
        match self {
            Dies::Primary => 0,
            Dies::StandbyThenPrimary => 1,
        }
    }

    /// The nodes whose power goes, the armed one first.
    fn hit(self) -> &'static [usize] {
        match self {
            Dies::Primary => &[0],
            Dies::StandbyThenPrimary => &[1, 0],
        }
    }
}

/// The pass that dies: beyond what a start passes (a few syncs at most), near enough that a
/// cycle stays short.
pub(crate) fn pass(rng: &mut Rng) -> u64 {
    20 + rng.next_u64() % 40
}

/// Arms `node` to die at the `pass`-th passing of `point` by a clean restart (SIGTERM, then
/// a start with [`CRASH_AT`]), so that the only death of the cycle is at the point; returns
/// where the new start's lines begin in its log, which is kept across starts.
pub(crate) fn restart_armed(node: &mut ChildNode, point: &str, pass: u64) -> anyhow::Result<u64> {
    node.env(CRASH_AT, &format!("{point}:{pass}"));
    node.signal(libc::SIGTERM)?;
    node.wait_exit()?;
    let from = node.log_len();
    node.start()?;
    Ok(from)
}

/// The line an armed node writes as it dies.
pub(crate) fn death_line(point: &str, pass: u64) -> String {
    format!("crash point {point}: pass {pass}")
}

/// Waits until `node`, armed by [`restart_armed`] (its start's lines from `from`), says it
/// dies at the point, woken by its log's writes. The power goes at the moment of the death:
/// the caller pulls the plug as soon as this returns, which comes before the node's threads
/// are gone. A thread of the node inside an fsync of the mount keeps it from dying until the
/// sync answers, and the pulled plug makes that answer a failure that made nothing durable.
pub(crate) fn said_it_dies(
    node: &ChildNode,
    from: u64,
    point: &str,
    pass: u64,
) -> anyhow::Result<()> {
    let line = death_line(point, pass);
    node.wait_log(&line, DEADLINE, || node.log_since(from).contains(&line))
}

/// After the plug is pulled: waits for the death [`said_it_dies`] announced and disarms the
/// node for its next start.
pub(crate) fn died(
    node: &mut ChildNode,
    said: anyhow::Result<()>,
) -> anyhow::Result<std::process::ExitStatus> {
    let exit = said.and_then(|()| node.wait_exit());
    node.env_remove(CRASH_AT);
    exit
}

fn crash_point_cycles(point: &str, dies: Dies, overlap: Overlap) {
    let _one = serial();
    let n_cycles = cycles(2);
    let (armed, hit) = (dies.armed(), dies.hit());
    let what = format!("deaths at {point}");
    let options = [
        Options {
            sync_latency: PRIMARY_SYNC_LATENCY,
        },
        Options::default(),
    ];
    let mut run = Run::start(&what, overlap, options, |_, _| {});
    for cycle in 0..n_cycles {
        let before = run.load.count();
        let t = Instant::now();
        let pass = pass(&mut run.rng);
        let node = &mut run.pair.nodes[armed];
        let from = match restart_armed(node, point, pass) {
            Ok(from) => from,
            Err(e) => panic!("cycle {cycle}: restarting {} armed: {e:#}", node.name),
        };
        let said = said_it_dies(node, from, point, pass);
        for &i in hit {
            run.pair.mounts[i].pull_plug();
        }
        // The primary's power goes with the standby's.
        if dies == Dies::StandbyThenPrimary {
            run.pair.nodes[0].kill9();
        }
        let node = &mut run.pair.nodes[armed];
        let name = node.name.clone();
        match died(node, said) {
            Ok(status) => println!("cycle {cycle}: {name} died at {point}: {status}"),
            Err(e) => panic!(
                "cycle {cycle}: {name} never died at {point} pass {pass}: {e:#}\n{}",
                run.pair.logs()
            ),
        }
        for &i in hit {
            run.crash(i, cycle);
        }
        if dies == Dies::Primary {
            run.hold_back_the_standby(cycle);
            run.recover(&[], cycle, before);
        } else {
            run.recover(hit, cycle, before);
        }
        println!(
            "cycle {cycle}: back after {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    // Before its sync and while its sync runs, the primary holds a write it has not synced:
    // a death there that its power loss found nothing to take from would prove nothing.
    if [FP_FSYNC, CRASH_SENT_EARLY].contains(&point) {
        assert!(
            run.at_risk > 0,
            "no death at {point} left an unsynced write\n{}",
            run.pair.logs()
        );
    }
    run.finish(&what, n_cycles);
}

#[test]
fn the_primary_killed_between_its_write_and_its_fdatasync_loses_no_acknowledged_append() {
    crash_point_cycles(FP_FSYNC, Dies::Primary, Overlap::Off);
}

#[test]
fn the_primary_killed_between_its_write_and_its_fdatasync_with_the_overlapped_commit() {
    crash_point_cycles(FP_FSYNC, Dies::Primary, Overlap::On);
}

#[test]
fn the_primary_killed_after_an_early_send_before_its_own_flush_loses_no_acknowledged_append() {
    crash_point_cycles(CRASH_SENT_EARLY, Dies::Primary, Overlap::On);
}

#[test]
fn the_standby_killed_between_its_flush_and_its_reply_loses_no_acknowledged_append() {
    crash_point_cycles(CRASH_REPLY, Dies::StandbyThenPrimary, Overlap::Off);
}

#[test]
fn the_standby_killed_between_its_flush_and_its_reply_with_the_overlapped_commit() {
    crash_point_cycles(CRASH_REPLY, Dies::StandbyThenPrimary, Overlap::On);
}

#[test]
fn the_primary_killed_after_the_commit_point_moved_before_answering_loses_nothing() {
    crash_point_cycles(CRASH_RELEASE, Dies::Primary, Overlap::Off);
}

#[test]
fn the_primary_killed_after_the_commit_point_moved_with_the_overlapped_commit() {
    crash_point_cycles(CRASH_RELEASE, Dies::Primary, Overlap::On);
}
