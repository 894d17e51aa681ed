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
//! back at its next stream start) and the primary starts a new timeline at every start. A
//! [`Reader`] follows each node's `GET /wal` through every cycle, and at the end every record
//! either was given must be on both nodes: nobody read past the commit point (rule 3), which
//! no power loss takes back. Each run prints the appends acknowledged, the tails the standby
//! cut and the timelines the primary made. CI runs a few cycles; `WALSERVER_TEST_CHAOS_CYCLES`
//! runs more and `WALSERVER_TEST_CHAOS_SEED` replays a run's kills and crashes. Needs root (a
//! FUSE mount).

use std::path::Path;
use std::time::Instant;

use lossyfs::{LossyFs, Options};
use wal_storage::Lsn;

use crate::lossy::{disk, pull_plugs, serial, Overlap};
use crate::node::*;
use crate::reader::Reader;
use crate::{assert_judged, cycles, line, seed, Load, Rng, SEGMENT};

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
struct Pair {
    nodes: [ChildNode; 2],
    mounts: [LossyFs; 2],
}

impl Pair {
    fn start(dir: &Path, overlap: Overlap) -> Pair {
        let mounts = [
            disk(dir, "primary", Options::default()),
            disk(dir, "standby", Options::default()),
        ];
        let pdata = mounts[0].mountpoint().join("data");
        walserver_node::init::init_primary(&pdata, SEGMENT).expect("init the primary");
        // Both keep all their WAL, so that the two can be compared from the first record.
        let keep = ("wal_keep_size", "4GB");
        let mut settings = vec![keep, ("synchronous_standby_names", SYNC)];
        settings.extend(overlap.settings());
        // The logs live outside the lossy mounts: a crash must not take what explains it.
        let mut p = child_node("primary", &pdata, &settings).with_log(&dir.join("primary.log"));
        p.start().expect("start the primary");
        let sdata = mounts[1].mountpoint().join("data");
        walserver_node::init::init_standby(&sdata, &conninfo_at(p.listen, SYNC), None, None)
            .expect("init the standby");
        let mut settings = vec![keep, ("wal_receiver_status_interval", "1")];
        settings.extend(overlap.settings());
        let mut s = child_node("standby", &sdata, &settings).with_log(&dir.join("standby.log"));
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

    fn logs(&self) -> String {
        line::logs(&self.nodes)
    }
}

fn power_loss_cycles(victims: Victims, overlap: Overlap) {
    let _one = serial();
    let n_cycles = cycles(3);
    let seed = seed();
    println!(
        "{victims:?} with overlap {overlap:?}: seed {seed} (WALSERVER_TEST_CHAOS_SEED={seed} \
         replays these crashes)"
    );
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pair = Pair::start(dir.path(), overlap);
    pair.converge().expect("the pair to stream");
    let load = Load::start(&pair.nodes[0], dir.path(), WRITERS, 1, 128, "on");
    if let Err(e) = load.wait_acks_beyond(50, DEADLINE) {
        let client = std::fs::read_to_string(dir.path().join("load.log")).unwrap_or_default();
        let tail: String = client.lines().rev().take(20).collect::<Vec<_>>().join("\n");
        panic!("the writers: {e:#}\n--- load ---\n{tail}\n{}", pair.logs());
    }

    // Readers on both nodes from the first record to the last, through every power loss.
    let readers = [
        Reader::follow(&pair.nodes[0]),
        Reader::follow(&pair.nodes[1]),
    ];
    let first_timeline = pair.nodes[0]
        .status()
        .expect("the primary's status")
        .timeline;
    let started = Instant::now();
    let mut lost_writes = 0;
    // The standby's tail cuts, counted in /status since its process started.
    let (mut tail_cuts, mut cuts_seen) = (0, 0);
    for cycle in 0..n_cycles {
        let before = load.count();
        let t = Instant::now();
        let hit: &[usize] = match victims {
            Victims::Primary => &[0],
            Victims::Standby => &[1],
            Victims::Both => &[1, 0],
        };
        match pull_plugs(&mut pair.nodes, &mut pair.mounts, hit, &mut rng) {
            Ok(o) => lost_writes += o.lost,
            Err(e) => panic!("cycle {cycle}: {e:#}\n{}", pair.logs()),
        }
        for &i in hit.iter().rev() {
            if let Err(e) = pair.nodes[i].start() {
                panic!(
                    "cycle {cycle}: restarting {} after its power loss: {e:#}\n{}",
                    pair.nodes[i].name,
                    pair.logs()
                );
            }
        }
        if let Err(e) = pair.converge() {
            panic!("cycle {cycle}: {e:#}\n{}", pair.logs());
        }
        if let Err(e) = load.wait_acks_beyond(before + 16, DEADLINE) {
            panic!(
                "cycle {cycle}: appends did not resume: {e:#}\n{}",
                pair.logs()
            );
        }
        let commit = pair.nodes[1].status().expect("the standby's status").commit;
        if hit.contains(&1) {
            cuts_seen = 0;
        }
        tail_cuts += commit.tail_cuts - cuts_seen.min(commit.tail_cuts);
        cuts_seen = commit.tail_cuts;
        if overlap == Overlap::Off {
            assert_eq!(
                commit.tail_cuts, 0,
                "cycle {cycle}: a cut with the switch off"
            );
        }
        println!(
            "cycle {cycle}: power back after {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    let acks = load.stop();
    pair.settle().expect("the pair to converge at the end");
    let [p, s] = &pair.nodes;
    let verdict = assert_judged(&[&acks], &[p, s]);
    let [on_primary, on_standby] = readers;
    let (read_p, read_s) = (on_primary.count(), on_standby.count());
    on_primary.assert_survived(&[p, s]);
    on_standby.assert_survived(&[p, s]);
    let timelines = p.status().expect("the primary's status").timeline.0 - first_timeline.0;
    println!(
        "{n_cycles} power losses of {victims:?} with overlap {overlap:?} in {:.1} s: {} appends \
         acknowledged, {} unsynced writes lost by the crashes, {tail_cuts} tails cut, \
         {timelines} timelines made, {read_p} and {read_s} records read on the primary and \
         the standby; {}",
        started.elapsed().as_secs_f64(),
        acks.len(),
        lost_writes,
        verdict.describe().join("; ")
    );
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
