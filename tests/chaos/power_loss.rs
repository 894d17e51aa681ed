//! Whole-node power loss: a primary and its synchronous standby as `walserver run` processes,
//! each data directory on a `lossyfs` mount of its own, under the load tool's 16 writers at
//! `on`. A power loss of a node is kill -9, then the mount's crash (everything not fsynced
//! lost, or kept as a prefix torn at any byte, chosen by a seed), then the node started again
//! on what survived. Each power loss lands while a write waits for its sync (the mounts hold
//! syncs until one does). A cycle takes out the primary, the standby, or both at once, and waits
//! until the pair streams again and the writers are acknowledged again. At the end, against
//! the client's acknowledgement log ([`assert_judged`]): every acknowledged record on both
//! nodes exactly once, both byte-identical up to the shorter end.
//!
//! Each scenario runs with the commit rule as a parameter ([`Overlap`]): off, and the
//! overlapped commit on both nodes, where the standby may hold a tail the primary lost (cut
//! back at its next stream start) and the primary starts a new timeline at a start after it
//! sent early (its early-send mark names its timeline). With the switch on, every other cycle
//! that takes the primary alone (the first among them) lands its power loss where rule 5
//! matters ([`lose_a_tail_the_standby_holds`]) and keeps the standby paused until the
//! restarted primary has written past the standby's end ([`Run::hold_back_the_standby`]):
//! a primary that resumed its timeline would put other bytes under the standby's tail, which
//! the judge finds, where a power loss at the primary's first unsynced write often leaves the
//! standby no tail, and a standby that connects at once cuts its tail back to the primary's
//! end (rule 4) before anything is written over it. A
//! [`Reader`] follows each node's `GET /wal` through every cycle, and at the end every record
//! either was given must be on both nodes: nobody read past the commit point (rule 3), which
//! no power loss takes back. Each run prints the appends acknowledged, the tails the standby
//! cut and the timelines the primary made. CI runs a few cycles; `WALSERVER_TEST_CHAOS_CYCLES`
//! runs more and `WALSERVER_TEST_CHAOS_SEED` replays a run's kills and crashes. Needs root (a
//! FUSE mount).

use std::path::Path;
use std::time::{Duration, Instant};

use lossyfs::{LossyFs, Options, UnsyncedWatch};
use wal_storage::Lsn;

use crate::lossy::{
    disk, node_on, power_off, pull_plugs, serial, standby_past_primary, Outage, Overlap,
    PRIMARY_SYNC_LATENCY,
};
use crate::node::*;
use crate::reader::Reader;
use crate::{assert_judged, cycles, line, seed, Acks, Load, Rng, SEGMENT};

const SYNC: &str = "s1";

/// The load: as many writers as the request asks, small records, so a cycle is short.
const WRITERS: usize = 16;

/// Which nodes lose power in a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victims {
    Primary,
    Standby,
    Both,
}

/// The pair. The nodes come before the mounts, so a failing test kills the processes before
/// it unmounts their data directories.
pub(crate) struct Pair {
    pub(crate) nodes: [ChildNode; 2],
    pub(crate) mounts: [LossyFs; 2],
}

impl Pair {
    /// Starts the pair on mounts with `options` (the primary's, the standby's); `prepare`
    /// sees each node before its first start.
    fn start(
        dir: &Path,
        overlap: Overlap,
        options: [Options; 2],
        mut prepare: impl FnMut(usize, &mut ChildNode),
    ) -> Pair {
        let [po, so] = options;
        let mounts = [disk(dir, "primary", po), disk(dir, "standby", so)];
        let pdata = mounts[0].mountpoint().join("data");
        walserver_node::init::init_primary(&pdata, SEGMENT).expect("init the primary");
        // Both keep all their WAL, so that the two can be compared from the first record.
        let keep = ("wal_keep_size", "4GB");
        let settings = [keep, ("synchronous_standby_names", SYNC)];
        let mut p = node_on(dir, &mounts[0], "primary", &settings, overlap);
        prepare(0, &mut p);
        p.start().expect("start the primary");
        let sdata = mounts[1].mountpoint().join("data");
        walserver_node::init::init_standby(&sdata, &conninfo_at(p.listen, SYNC), None, None)
            .expect("init the standby");
        let settings = [keep, ("wal_receiver_status_interval", "1")];
        let mut s = node_on(dir, &mounts[1], "standby", &settings, overlap);
        prepare(1, &mut s);
        s.start().expect("start the standby");
        Pair {
            nodes: [p, s],
            mounts,
        }
    }

    /// Waits until the pair has converged ([`line::converge`]).
    fn converge(&self) -> anyhow::Result<Lsn> {
        line::converge(&self.nodes, &[SYNC])
    }

    fn settle(&self) -> anyhow::Result<Lsn> {
        line::settle(&self.nodes, &[SYNC])
    }

    pub(crate) fn logs(&self) -> String {
        line::logs(&self.nodes)
    }
}

/// A scenario on the pair under the writers, from its start to its judgement: the
/// pair, the load, a [`Reader`] on each node, the seeded generator of its crashes, and what it
/// counts. Fields drop in order: the writers and the nodes go before the mounts and the
/// directory.
pub(crate) struct Run {
    pub(crate) load: Load,
    /// The test's own appends ([`Run::hold_back_the_standby`]), judged with the writers'.
    own: Acks,
    readers: [Reader; 2],
    pub(crate) pair: Pair,
    pub(crate) rng: Rng,
    overlap: Overlap,
    first_timeline: u32,
    started: Instant,
    /// Unsynced writes the crashes took back, and those they found.
    pub(crate) lost_writes: usize,
    pub(crate) at_risk: usize,
    /// The standby's tail cuts, across its restarts.
    cuts: TailCuts,
    _dir: tempfile::TempDir,
}

impl Run {
    /// Starts the pair ([`Pair::start`]), the writers, and the readers once appends are
    /// acknowledged; `what` names the scenario in its seed line.
    pub(crate) fn start(
        what: &str,
        overlap: Overlap,
        options: [Options; 2],
        prepare: impl FnMut(usize, &mut ChildNode),
    ) -> Run {
        let seed = seed();
        println!(
            "{what} with overlap {overlap:?}: seed {seed} (WALSERVER_TEST_CHAOS_SEED={seed} \
             replays these crashes)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let pair = Pair::start(dir.path(), overlap, options, prepare);
        pair.converge().expect("the pair to stream");
        let load = Load::start(&pair.nodes[0], dir.path(), WRITERS, 1, 128, "on");
        if let Err(e) = load.wait_acks_beyond(50, DEADLINE) {
            panic!("the writers: {e:#}\n{}", pair.logs());
        }
        // Readers on both nodes from the first record to the last, through every fault.
        let readers = [
            Reader::follow(&pair.nodes[0]),
            Reader::follow(&pair.nodes[1]),
        ];
        let first_timeline = pair.nodes[0]
            .status()
            .expect("the primary's status")
            .timeline
            .0;
        Run {
            load,
            own: Acks::default(),
            readers,
            pair,
            rng: Rng(seed),
            overlap,
            first_timeline,
            started: Instant::now(),
            lost_writes: 0,
            at_risk: 0,
            cuts: TailCuts::default(),
            _dir: dir,
        }
    }

    /// The power loss of node `i`'s mount, whose node no longer runs: what was not synced is
    /// lost or torn, as the next seed of the run decides.
    pub(crate) fn crash(&mut self, i: usize, cycle: u64) {
        let crash_seed = self.rng.next_u64();
        match self.pair.mounts[i].crash(crash_seed) {
            Ok(r) => {
                self.lost_writes += r.writes_lost;
                self.at_risk += r.writes;
                println!(
                    "cycle {cycle}: {} crashed (seed {crash_seed}): {r:?}",
                    self.pair.nodes[i].name
                );
            }
            Err(e) => panic!("cycle {cycle}: crash {}: {e}", self.pair.nodes[i].name),
        }
    }

    /// Starts the primary again with its standby paused until the primary has written past
    /// the standby's end, so that whatever tail the standby kept of the primary's lost WAL
    /// overlaps the primary's new WAL by the time the standby connects: resumed on its old
    /// timeline, the primary would have put other bytes at those LSNs (rule 5 exists for
    /// this). A standby that connected at once would cut its tail back to the primary's end
    /// on the same timeline (rule 4) before anything was written over it, and hide a
    /// resumed timeline.
    ///
    /// The writers cannot take the primary past that end by themselves: each has one append
    /// in flight, which waits for the paused standby, so they write 16 records, and the
    /// standby's tail is often as long (each such cycle waited for their 10 s request
    /// timeout). The test appends one record longer than the gap itself, at `local`, which
    /// the primary acknowledges once it alone holds it durably.
    pub(crate) fn hold_back_the_standby(&mut self, cycle: u64) {
        let [p, s] = &mut self.pair.nodes;
        let standby_end = match s.status() {
            Ok(st) => st.flush_lsn,
            Err(e) => panic!("cycle {cycle}: the standby's status: {e:#}"),
        };
        if let Err(e) = s.pause().and_then(|()| p.start()) {
            panic!("cycle {cycle}: restarting the primary: {e:#}");
        }
        let primary_end = match p.status() {
            Ok(st) => st.flush_lsn,
            Err(e) => panic!("cycle {cycle}: the restarted primary's status: {e:#}"),
        };
        let gap = standby_end.0.saturating_sub(primary_end.0) as usize + 1;
        match self.own.try_append(p, gap, "local", Some(DEADLINE)) {
            Ok(end) => assert!(
                end > standby_end,
                "cycle {cycle}: an append of {gap} bytes at {primary_end} ended at {end}, not \
                 past the standby's end {standby_end}"
            ),
            Err((status, text)) => panic!(
                "cycle {cycle}: the primary's own append: HTTP {status}: {text}\n{}",
                self.pair.logs()
            ),
        }
        if let Err(e) = self.pair.nodes[1].resume() {
            panic!("cycle {cycle}: resuming the standby: {e:#}");
        }
    }

    /// Starts the nodes `hit` again (the last first), waits until the pair streams again and
    /// the writers have more than `before + 16` acknowledgements, and counts the standby's
    /// tail cuts.
    pub(crate) fn recover(&mut self, hit: &[usize], cycle: u64, before: usize) {
        let pair = &mut self.pair;
        for &i in hit.iter().rev() {
            if let Err(e) = pair.nodes[i].start() {
                panic!(
                    "cycle {cycle}: restarting {}: {e:#}\n{}",
                    pair.nodes[i].name,
                    pair.logs()
                );
            }
        }
        if let Err(e) = pair.converge() {
            panic!("cycle {cycle}: {e:#}\n{}", pair.logs());
        }
        if let Err(e) = self.load.wait_acks_beyond(before + 16, DEADLINE) {
            panic!(
                "cycle {cycle}: appends did not resume: {e:#}\n{}",
                pair.logs()
            );
        }
        let commit = pair.nodes[1].status().expect("the standby's status").commit;
        self.cuts.saw(1, commit.tail_cuts);
        if self.overlap == Overlap::Off {
            assert_eq!(
                commit.tail_cuts, 0,
                "cycle {cycle}: a cut with the switch off"
            );
        }
    }

    /// Counts the standby's tail cuts just before the nodes `dying` lose power: if it is one
    /// of them, its count is kept and its next process counts from 0.
    pub(crate) fn count_cuts(&mut self, dying: &[usize]) {
        if let Ok(s) = self.pair.nodes[1].status() {
            self.cuts.saw(1, s.commit.tail_cuts);
        }
        if dying.contains(&1) {
            self.cuts.died(1);
        }
    }

    /// Stops the writers, waits for the pair to settle and judges it: the acknowledgement
    /// log against both nodes ([`assert_judged`]), and every record a reader was given
    /// against both nodes ([`Reader::assert_survived`]). Prints what the run counted.
    pub(crate) fn finish(self, what: &str, n_cycles: u64) {
        let acks = self.load.stop();
        let pair = &self.pair;
        pair.settle().expect("the pair to converge at the end");
        let [p, s] = &pair.nodes;
        let verdict = assert_judged(&[&acks, self.own.entries()], &[p, s]);
        let [on_primary, on_standby] = self.readers;
        let read = [
            on_primary.assert_survived(&[p, s]),
            on_standby.assert_survived(&[p, s]),
        ];
        let timeline = p.status().expect("the primary's status").timeline.0;
        println!(
            "{n_cycles} {what} with overlap {:?} in {:.1} s: {} appends acknowledged, {} \
             unsynced writes lost by the crashes, {} tails cut, {} timelines made, {} and {} \
             records read on the primary and the standby; {}",
            self.overlap,
            self.started.elapsed().as_secs_f64(),
            acks.len(),
            self.lost_writes,
            self.cuts.total(),
            timeline - self.first_timeline,
            read[0],
            read[1],
            verdict.describe().join("; ")
        );
    }
}

/// The primary's power loss at the moment rule 5 exists for: its syncs are held until its
/// standby has made durable a batch sent early that the primary has not, then everything the
/// primary had not synced is lost ([`LossyFs::crash_to_synced`]), so that the standby
/// certainly holds a tail the primary lacks.
fn lose_a_tail_the_standby_holds(pair: &mut Pair) -> anyhow::Result<Outage> {
    let [p, s] = &pair.nodes;
    let disk = &pair.mounts[0];
    let ahead = |what: &str| standby_past_primary(what, p, s, Some(disk)).map(|_| ());
    // Early sends on a timeline begin only once the primary's early-send mark naming it is
    // durable (just after a restart it may not be yet), which nothing outside is told: the
    // primary's disk is slow until the standby has been seen durable past it, which only an
    // early send allows, and only then are its syncs held. Held before the mark was durable,
    // they would keep it from ever being so.
    disk.set_sync_latency(PRIMARY_SYNC_LATENCY);
    // Dropped on the way out, which ends the hold if the plug was not pulled: a node with a
    // thread in a held sync cannot be killed.
    let mut hold = None;
    let held = ahead("an early send on the primary's timeline").and_then(|()| {
        hold = Some(disk.hold_syncs());
        anyhow::ensure!(
            UnsyncedWatch::on(&[disk]).wait(DEADLINE),
            "timed out after {DEADLINE:?} waiting for a write of the primary that waits for \
             its sync"
        );
        // Asked with the mount, since a sync under way when the hold came may have covered
        // the write.
        ahead("the standby durable past the primary's durable end")
    });
    disk.set_sync_latency(Duration::ZERO);
    held?;
    power_off(&mut pair.nodes, &mut pair.mounts, &[0], None)
}

fn power_loss_cycles(victims: Victims, overlap: Overlap) {
    let _one = serial();
    let n_cycles = cycles(3);
    let what = format!("power losses of {victims:?}");
    let mut run = Run::start(&what, overlap, Default::default(), |_, _| {});
    for cycle in 0..n_cycles {
        let before = run.load.count();
        let t = Instant::now();
        let hit: &[usize] = match victims {
            Victims::Primary => &[0],
            Victims::Standby => &[1],
            Victims::Both => &[1, 0],
        };
        let tail_case = victims == Victims::Primary && cycle % 2 == 0;
        run.count_cuts(hit);
        let pair = &mut run.pair;
        let outage = match overlap {
            Overlap::On if tail_case => lose_a_tail_the_standby_holds(pair),
            _ => pull_plugs(&mut pair.nodes, &mut pair.mounts, hit, &mut run.rng),
        };
        match outage {
            Ok(o) => {
                run.lost_writes += o.lost;
                run.at_risk += o.at_risk;
            }
            Err(e) => panic!("cycle {cycle}: {e:#}\n{}", pair.logs()),
        }
        // Every other cycle that takes the primary alone holds its standby back until the
        // primary has written past it, the others let the standby connect at once.
        if tail_case {
            run.hold_back_the_standby(cycle);
            run.recover(&[], cycle, before);
        } else {
            run.recover(hit, cycle, before);
        }
        println!(
            "cycle {cycle}: power back after {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    run.finish(&what, n_cycles);
}

#[test]
fn power_loss_of_the_primary_loses_no_acknowledged_append() {
    power_loss_cycles(Victims::Primary, Overlap::Off);
}

#[test]
fn power_loss_of_the_synchronous_standby_loses_no_acknowledged_append() {
    power_loss_cycles(Victims::Standby, Overlap::Off);
}

#[test]
fn power_loss_of_both_at_once_loses_no_acknowledged_append() {
    power_loss_cycles(Victims::Both, Overlap::Off);
}

#[test]
fn power_loss_of_the_primary_with_the_overlapped_commit_loses_no_acknowledged_append() {
    power_loss_cycles(Victims::Primary, Overlap::On);
}

#[test]
fn power_loss_of_the_synchronous_standby_with_the_overlapped_commit_loses_no_acknowledged_append() {
    power_loss_cycles(Victims::Standby, Overlap::On);
}

#[test]
fn power_loss_of_both_at_once_with_the_overlapped_commit_loses_no_acknowledged_append() {
    power_loss_cycles(Victims::Both, Overlap::On);
}
