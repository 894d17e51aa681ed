//! kill -9 of a random node of a chain: a primary, its synchronous standby, and a cascade
//! (a standby of the standby), three `walserver run` processes on loopback, under the load
//! tool's four writers at `on`. Each cycle picks a node with a seeded generator, kills it with
//! SIGKILL, starts it again on its data directory and waits until the chain has converged
//! (all three streaming, and the cascade durable up to what the primary had made durable once
//! they were). Afterwards, against the client's acknowledgement log: no acknowledged append
//! is missing on the primary, on the synchronous standby (which must hold every append
//! acknowledged at `on`) or on the cascade; and the three nodes hold the same records at the
//! same LSNs, timeline by timeline.

use std::time::Instant;

use wal_storage::Lsn;
use walserver_bench::acklog;

use crate::node::*;
use crate::{assert_judged, cycles, line, seed, write_row, Load, Rng};

const SYNC: &str = "s1";
const CASCADE: &str = "c1";

/// The chain: `[primary, synchronous standby, cascade]`.
struct Chain {
    nodes: [ChildNode; 3],
}

impl Chain {
    fn start(dir: &std::path::Path) -> Chain {
        let pdata = dir.join("primary");
        walserver_node::init::init_primary(&pdata, 1 << 20).expect("init the primary");
        // Every node keeps all its WAL, so the three can be compared from the first record.
        let keep = ("wal_keep_size", "4GB");
        let mut p = child_node(
            "primary",
            &pdata,
            &[keep, ("synchronous_standby_names", SYNC)],
        );
        p.start().expect("start the primary");
        let standby = |name: &str, upstream: &ChildNode, app: &str| {
            let data = dir.join(name);
            walserver_node::init::init_standby(
                &data,
                &conninfo_at(upstream.listen, app),
                None,
                None,
            )
            .expect("init a standby");
            let mut n = child_node(name, &data, &[keep, ("wal_receiver_status_interval", "1")]);
            n.start().expect("start a standby");
            n
        };
        let s = standby("standby", &p, SYNC);
        let c = standby("cascade", &s, CASCADE);
        Chain { nodes: [p, s, c] }
    }

    /// Waits until the chain has converged ([`line::converge`]).
    fn converge(&self) -> anyhow::Result<Lsn> {
        line::converge(&self.nodes, &[SYNC, CASCADE])
    }

    fn settle(&self) -> anyhow::Result<Lsn> {
        line::settle(&self.nodes, &[SYNC, CASCADE])
    }

    fn logs(&self) -> String {
        line::logs(&self.nodes)
    }
}

#[test]
fn kill_9_of_any_node_of_a_sync_chain_loses_no_acknowledged_append() {
    let run_started = Instant::now();
    let n_cycles = cycles(10);
    let seed = seed();
    println!("seed {seed} (WALSERVER_TEST_CHAOS_SEED={seed} replays this kill order)");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut chain = Chain::start(dir.path());
    chain.converge().expect("the chain to stream");
    let load = Load::start(&chain.nodes[0], dir.path(), 4, 4, 128, "on");
    load.wait_acks_beyond(0, DEADLINE)
        .expect("the writers to be acknowledged");

    let mut recover = Vec::new();
    let mut kills = [0u32; 3];
    for cycle in 0..n_cycles {
        let victim = (rng.next_u64() % 3) as usize;
        kills[victim] += 1;
        let acked_before = load.count();
        let t = Instant::now();
        chain.nodes[victim].kill9();
        if let Err(e) = chain.nodes[victim].start() {
            panic!(
                "cycle {cycle}: restarting {}: {e:#}\n{}",
                chain.nodes[victim].name,
                chain.logs()
            );
        }
        match chain.converge() {
            Ok(_) => recover.push(t.elapsed()),
            Err(e) => panic!("cycle {cycle}: {e:#}\n{}", chain.logs()),
        }
        // The writers go on by themselves after a kill: new acknowledgements arrive (a few,
        // so that every kill lands in the middle of appends).
        if let Err(e) = load.wait_acks_beyond(acked_before + 8, DEADLINE) {
            panic!(
                "cycle {cycle}: appends did not resume: {e:#}\n{}",
                chain.logs()
            );
        }
        println!(
            "cycle {cycle}: killed {}, converged after {:.0} ms",
            chain.nodes[victim].name,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    let acks = load.stop();
    let end = chain.settle().expect("the chain to converge at the end");

    // Against the client's log: nothing acknowledged is missing on any node. The synchronous
    // standby must hold it all, since `on` acknowledges only what it has made durable.
    let mut lost = 0;
    let mut records = Vec::new();
    for n in &chain.nodes {
        let r = acklog::fetch_records(&n.http_str(), None).expect("a node's records");
        let v = acklog::verify(&acks, &r);
        assert_eq!(
            v.unverifiable, 0,
            "{}: acknowledged records below its oldest",
            n.name
        );
        println!(
            "{}: {} of {} acknowledged records found, {} lost",
            n.name, v.found, v.records, v.lost
        );
        lost = lost.max(v.lost);
        assert_eq!(
            v.lost, 0,
            "{} lost acknowledged appends (seed {seed}): {:?}",
            n.name, v.lost_examples
        );
        records.push(r);
    }
    // The same records at the same LSNs, timeline by timeline; with the writers stopped and the
    // cascade at the primary's end, all three hold the same list.
    let [p, s, c] = [&records[0], &records[1], &records[2]];
    let [np, ns, nc] = &chain.nodes;
    assert_judged(&[&acks], &[np, ns, nc]);
    assert_prefix("primary", p, "standby", s);
    assert_prefix("standby", s, "cascade", c);
    assert_eq!(
        p.last().map(|r| r.end),
        Some(end),
        "the primary's last record"
    );
    assert_eq!(
        (p.len(), s.len()),
        (c.len(), c.len()),
        "record counts differ"
    );
    println!(
        "{n_cycles} cycles ({} primary, {} standby, {} cascade kills), {} appends acknowledged, \
         {} records on each node",
        kills[0],
        kills[1],
        kills[2],
        acks.len(),
        p.len()
    );
    write_row(
        "kill9-sync-chain",
        "kill -9 of a random node of primary → sync standby → cascade, 4 writers at on",
        n_cycles,
        run_started.elapsed(),
        acks.len() as u64,
        lost,
        recover.len() as u64,
        &recover,
        &format!(
            "WALSERVER_TEST_CHAOS_SEED={seed} WALSERVER_TEST_CHAOS_CYCLES={n_cycles} \
             cargo test --test chaos kill_9"
        ),
    );
}
