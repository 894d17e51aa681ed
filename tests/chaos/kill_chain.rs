//! kill -9 of a random node of a chain: a primary, its synchronous standby, and a cascade
//! (a standby of the standby), three `walserver run` processes on loopback, under the load
//! tool's four writers at `on`. Each cycle picks a node with a seeded generator, kills it with
//! SIGKILL, starts it again on its data directory and waits until the chain has converged
//! (all three streaming, and the cascade durable up to what the primary had made durable once
//! they were). Afterwards, against the client's acknowledgement log: no acknowledged append
//! is missing on the primary, on the synchronous standby (which must hold every append
//! acknowledged at `on`) or on the cascade; and the three nodes hold the same records at the
//! same LSNs, timeline by timeline.

use std::time::{Duration, Instant};

use wal_storage::Lsn;
use walserver_bench::acklog;

use crate::node::*;
use crate::{assert_judged, cycles, write_row, Load};

/// splitmix64: a seeded generator small enough to write here, so a run's kill order is
/// replayed from its seed alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The seed: `WALSERVER_TEST_CHAOS_SEED`, else one from the clock (printed, to replay).
fn seed() -> u64 {
    std::env::var("WALSERVER_TEST_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

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

    /// Waits until the chain has converged and returns the primary's durable end it reached:
    /// the primary streams to the synchronous standby, which streams to the cascade, each
    /// walreceiver streams, and then the cascade is durable up to the primary's flush
    /// position as it was once all three streamed.
    fn converge(&self) -> anyhow::Result<Lsn> {
        let [p, s, c] = &self.nodes;
        let target = wait_for(
            "all three nodes streaming",
            DEADLINE,
            Duration::from_millis(5),
            || {
                let ps = p.status().ok()?;
                let ss = s.status().ok()?;
                let cs = c.status().ok()?;
                let all = ps.streams_to(SYNC)
                    && ss.streams_to(CASCADE)
                    && ss.receiving()
                    && cs.receiving();
                all.then_some(ps.flush_lsn)
            },
        )?;
        wait_for(
            &format!("the cascade durable up to the primary's {target}"),
            DEADLINE,
            Duration::from_millis(5),
            || (c.status().ok()?.flush_lsn >= target).then_some(target),
        )
    }

    /// Converges with no writer left: until the primary's durable end no longer moves past
    /// the converged position (an append already sent when the writers were killed may still
    /// land), a few rounds at most.
    fn settle(&self) -> anyhow::Result<Lsn> {
        for _ in 0..10 {
            let end = self.converge()?;
            if self.nodes[0].status()?.flush_lsn == end {
                return Ok(end);
            }
        }
        anyhow::bail!("the primary's durable end kept moving with no writer")
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {} ---\n{}\n", n.name, n.log_tail()))
            .collect()
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
        let victim = (rng.next() % 3) as usize;
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
