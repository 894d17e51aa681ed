//! Power loss under automatic failover: three `walserver run` members under `[failover]`
//! (`synchronous_mode = on`, a ttl of 3 s) on one real etcd, each data directory on a
//! `lossyfs` mount of its own, under the load tool's 16 writers following the leader at
//! durability `on`. Each member reaches etcd through a relay of its own, and the others
//! reach it for replication through another (its `advertise_conninfo`), so that a scenario
//! can take a member away from etcd or from its standbys at a moment it chooses.
//!
//! - Cycles of power loss (kill -9, then the mount's crash, as in `power_loss.rs`) of the
//!   leader, of the published synchronous standby, or of both at once, each landed while a
//!   write waits for its sync; the victims start again at once, and the cycle ends when one
//!   leader is followed by both other members and the writers are acknowledged again.
//! - The case the overlapped commit's rules exist for: the leader's syncs are held until its
//!   synchronous standby has made durable a tail the leader has not, then the leader loses
//!   power and starts again at once, before its lease has run out, while the standby is kept
//!   from etcd (so the old leader is the one that may take the next term). It must not resume
//!   its term: it waits for its lease to go, takes a new term and a new timeline at its own
//!   durable end, and the standby's longer tail of the old timeline is cut back to that fork
//!   when its stream starts, counted in its `/status` `commit`.
//! - A failover while a tail is in flight: the leader is cut off from etcd and from its
//!   standbys at once while its writers' appends keep arriving, so it holds WAL no standby
//!   has; the synchronous standby takes the next term; the old leader, given back its links,
//!   follows it and drops its tail past the new timeline's switch point (the supervisor's
//!   fork cut of `FollowLeader`, with the reasoning in `supervisor-actor`'s `fork.rs`).
//!
//! Every scenario runs with the overlapped commit off and on ([`Overlap`]) and ends judged
//! against the client's acknowledgement log ([`assert_judged`]): every acknowledged record on
//! every member exactly once, all byte-identical up to the shortest end. In the cycles with
//! the switch on a [`Reader`] follows each member's `GET /wal`, and every record one was
//! given must be on every member at the end (rule 3: nobody reads past the commit point, also
//! on a primary restarted under failover before it takes a term or follows a leader). CI runs two cycles of
//! each kind of power loss; `WALSERVER_TEST_CHAOS_CYCLES` runs more and `WALSERVER_TEST_CHAOS_SEED` replays the
//! crashes. Needs root (FUSE) and etcd.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use etcd_gateway::testkit::EtcdServer;
use lossyfs::{LossyFs, Options, UnsyncedWatch};
use supervisor_actor::NodeStatus;
use wal_storage::Lsn;
use walserver_node::admin;

use crate::lossy::{
    disk, node_on, power_off, pull_plugs, serial, standby_past_primary, Overlap,
    PRIMARY_SYNC_LATENCY,
};
use crate::node::*;
use crate::reader::Reader;
use crate::relay::Relay;
use crate::{assert_judged, cycles, line, seed, Acks, Load, Rng, SEGMENT};

pub(crate) const MEMBERS: usize = 3;
const WRITERS: usize = 16;
/// The leader key's ttl: short, so that a cycle that waits for a lease takes seconds.
const TTL: Duration = Duration::from_secs(3);

/// The members, their disks and their links. The nodes come first, so that a failing test
/// kills them before it unmounts their data directories.
pub(crate) struct Members {
    pub(crate) nodes: Vec<ChildNode>,
    pub(crate) mounts: Vec<LossyFs>,
    /// Member `i`'s way to etcd.
    pub(crate) etcd_links: Vec<Relay>,
    /// The way to member `i`'s replication port, which it advertises to the others.
    replication_links: Vec<Relay>,
    /// The tails the members cut, across their restarts.
    cuts: TailCuts,
    _etcd: EtcdServer,
}

/// What a scenario gives member `i` beyond the fixture's own: its mount's options and
/// settings of its own.
pub(crate) type Shape = fn(usize) -> (Options, &'static [(&'static str, &'static str)]);

pub(crate) fn name(i: usize) -> String {
    format!("n{i}")
}

impl Members {
    /// `n0` a primary, `n1` and `n2` its standbys, all members under `overlap`; returns once
    /// `n0` leads with a published synchronous standby.
    fn start(dir: &Path, overlap: Overlap) -> Members {
        Members::start_shaped(dir, overlap, |_| (Options::default(), &[]))
    }

    /// As [`Members::start`], each member as `shape` says.
    pub(crate) fn start_shaped(dir: &Path, overlap: Overlap, shape: Shape) -> Members {
        let etcd = EtcdServer::start();
        let etcd_addr = etcd
            .client_url()
            .trim_start_matches("http://")
            .parse()
            .expect("etcd's address");
        let mounts: Vec<LossyFs> = (0..MEMBERS)
            .map(|i| disk(dir, &name(i), shape(i).0))
            .collect();
        let etcd_links: Vec<Relay> = (0..MEMBERS)
            .map(|_| {
                let r = Relay::start("127.0.0.1:0");
                r.set_upstream(etcd_addr);
                r
            })
            .collect();
        let replication_links: Vec<Relay> =
            (0..MEMBERS).map(|_| Relay::start("127.0.0.1:0")).collect();
        let mut nodes: Vec<ChildNode> = Vec::new();
        for i in 0..MEMBERS {
            let data = mounts[i].mountpoint().join("data");
            // A standby is made from its upstream, which must run by then.
            if i == 0 {
                walserver_node::init::init_primary(&data, SEGMENT).expect("init n0");
            } else {
                let upstream = conninfo_at(replication_links[0].addr(), &name(i));
                walserver_node::init::init_standby(&data, &upstream, None, None)
                    .expect("init a standby");
            }
            let etcd_url = format!("http://{}", etcd_links[i].addr());
            let advertised = format!(
                "host=127.0.0.1 port={} user=walserver sslmode=disable",
                replication_links[i].addr().port()
            );
            let node_name = name(i);
            let ttl = format!("{}ms", TTL.as_millis());
            let mut settings = vec![
                // Every member keeps its WAL, so that all compare from the first record.
                ("wal_keep_size", "4GB"),
                ("wal_sender_timeout", "2s"),
                ("wal_receiver_timeout", "2s"),
                ("wal_receiver_status_interval", "1"),
                ("failover.etcd_endpoints", &etcd_url),
                ("failover.cluster_name", "power"),
                ("failover.node_name", &node_name),
                ("failover.ttl", &ttl),
                ("failover.synchronous_mode", "on"),
                ("failover.advertise_conninfo", &advertised),
            ];
            settings.extend_from_slice(shape(i).1);
            let mut node = node_on(dir, &mounts[i], &node_name, &settings, overlap);
            replication_links[i].set_upstream(node.listen);
            node.start()
                .unwrap_or_else(|e| panic!("start {node_name}: {e:#}"));
            nodes.push(node);
        }
        Members {
            nodes,
            mounts,
            etcd_links,
            replication_links,
            cuts: TailCuts::default(),
            _etcd: etcd,
        }
    }

    pub(crate) fn logs(&self) -> String {
        line::logs(&self.nodes)
    }

    /// `r`'s value; its error fails the test with every member's log.
    pub(crate) fn or_logs<T>(&self, r: anyhow::Result<T>) -> T {
        r.unwrap_or_else(|e| panic!("{e:#}\n{}", self.logs()))
    }

    pub(crate) fn status(&self, i: usize) -> anyhow::Result<NodeStatus> {
        self.nodes[i].status()
    }

    /// Whether member `i` runs and says it leads (`/primary` answers 200).
    pub(crate) fn leads(&self, i: usize) -> bool {
        self.nodes[i].is_running()
            && admin::get_text(&self.nodes[i].http_str(), "/primary", None).is_ok()
    }

    /// Waits until exactly one member leads and every other running member streams from it;
    /// which one.
    pub(crate) fn wait_led(&self) -> anyhow::Result<usize> {
        // The members announce an election to nobody outside: asked every 20 ms.
        let leader = wait_for(
            "a single leader",
            DEADLINE,
            Duration::from_millis(20),
            || {
                let leaders: Vec<usize> = (0..MEMBERS).filter(|&i| self.leads(i)).collect();
                match leaders[..] {
                    [one] => Some(one),
                    _ => None,
                }
            },
        )?;
        let others: Vec<String> = (0..MEMBERS)
            .filter(|&i| i != leader && self.nodes[i].is_running())
            .map(name)
            .collect();
        wait_for(
            &format!("n{leader} streaming to {}", others.join(" and ")),
            DEADLINE,
            Duration::from_millis(20),
            || {
                let s = self.status(leader).ok()?;
                others.iter().all(|o| s.streams_to(o)).then_some(())
            },
        )?;
        Ok(leader)
    }

    /// The leader, once the others stream from it ([`Members::wait_led`]), and the
    /// synchronous standby it has published.
    pub(crate) fn wait_led_and_sync(&self) -> anyhow::Result<(usize, usize)> {
        let leader = self.wait_led()?;
        Ok((leader, self.wait_sync(leader)?))
    }

    /// The synchronous standby `leader` has published.
    pub(crate) fn wait_sync(&self, leader: usize) -> anyhow::Result<usize> {
        wait_for(
            &format!("n{leader} to publish a synchronous standby"),
            DEADLINE,
            Duration::from_millis(20),
            || self.published_sync(leader),
        )
    }

    /// The synchronous standby `leader`'s `/cluster` names now, if any.
    pub(crate) fn published_sync(&self, leader: usize) -> Option<usize> {
        let v = admin::get_json(&self.nodes[leader].http_str(), "/cluster", None).ok()?;
        let sync = v["sync_standby"].as_str()?;
        (0..MEMBERS).find(|&i| name(i) == sync)
    }

    /// With no writer left: waits until every member holds the leader's durable end on its
    /// timeline, and that end no longer moves (an append sent before the writers were killed
    /// may still land), and the leader's readers see up to it (a leader started again shows
    /// nothing past what its synchronous standby has confirmed since, `visibility.rs`); the
    /// leader.
    fn settle(&self) -> anyhow::Result<usize> {
        for _ in 0..10 {
            let leader = self.wait_led()?;
            let s = self.status(leader)?;
            let (end, timeline) = (s.flush_lsn, s.timeline);
            for i in (0..MEMBERS).filter(|&i| i != leader) {
                wait_for(
                    &format!("n{i} durable up to the leader's {end} on timeline {timeline}"),
                    DEADLINE,
                    Duration::from_millis(5),
                    || {
                        let s = self.status(i).ok()?;
                        (s.timeline == timeline && s.flush_lsn >= end).then_some(())
                    },
                )?;
            }
            if self.status(leader)?.flush_lsn == end {
                wait_for(
                    &format!("n{leader}'s readers to see its durable end {end}"),
                    DEADLINE,
                    Duration::from_millis(5),
                    || (self.status(leader).ok()?.acknowledged_lsn >= end).then_some(()),
                )?;
                return Ok(leader);
            }
        }
        anyhow::bail!("the leader's durable end kept moving with no writer")
    }

    /// Judges every member against `acks`, after [`Members::settle`].
    pub(crate) fn judge(&self, acks: &[walserver_bench::acklog::AckEntry]) -> String {
        if let Err(e) = self.settle() {
            panic!("the members to converge at the end: {e:#}\n{}", self.logs());
        }
        let nodes: Vec<&ChildNode> = self.nodes.iter().collect();
        assert_judged(&[acks], &nodes).describe().join("; ")
    }

    /// Tails cut back at stream start, summed over the members and their processes: each
    /// running member's count now, and what those that died counted before.
    pub(crate) fn tail_cuts(&mut self) -> u64 {
        self.count_cuts(&[]);
        self.cuts.total()
    }

    /// Counts each running member's tail cuts, just before the members `dying` are killed or
    /// die by themselves: their counts are kept, and their next processes count from 0.
    pub(crate) fn count_cuts(&mut self, dying: &[usize]) {
        for i in 0..MEMBERS {
            if let Ok(s) = self.status(i) {
                self.cuts.saw(i, s.commit.tail_cuts);
            }
        }
        for &i in dying {
            self.cuts.died(i);
        }
    }

    /// Starts member `i` again, panicking with the logs if it cannot.
    pub(crate) fn restart(&mut self, i: usize, what: &str) {
        if let Err(e) = self.nodes[i].start() {
            panic!("{what}: restarting n{i}: {e:#}\n{}", self.logs());
        }
    }
}

/// The load on every member's admin API: the writers follow the leader.
pub(crate) fn load_on(m: &Members, dir: &Path) -> Load {
    let http: Vec<String> = m.nodes.iter().map(|n| n.http_str()).collect();
    let load = Load::start_on(&http.join(","), dir, WRITERS, 1, 128, "on");
    if let Err(e) = load.wait_acks_beyond(50, DEADLINE) {
        panic!("the writers: {e:#}\n{}", m.logs());
    }
    load
}

/// Which members lose power in a cycle.
#[derive(Clone, Copy, Debug)]
enum Victims {
    Leader,
    Sync,
    Both,
}

fn power_loss_cycles(victims: Victims, overlap: Overlap) {
    let _one = serial();
    let n_cycles = cycles(2);
    let seed = seed();
    println!(
        "{victims:?} under failover with overlap {overlap:?}: seed {seed} \
         (WALSERVER_TEST_CHAOS_SEED={seed} replays these crashes)"
    );
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = Members::start(dir.path(), overlap);
    let load = load_on(&m, dir.path());
    // With the switch on, a reader on every member through every power loss: nothing it is
    // given may be taken back (rule 3). With it off a primary restarted under failover serves
    // its flushed end, PostgreSQL's rule, and a tail the next leader lacks is cut when it
    // follows: readers are not held to rule 3 there.
    let readers: Vec<Reader> = match overlap {
        Overlap::On => m.nodes.iter().map(Reader::follow).collect(),
        Overlap::Off => Vec::new(),
    };
    let started = Instant::now();
    let mut lost_writes = 0;
    let mut recover_ms = Vec::new();
    for cycle in 0..n_cycles {
        let (leader, sync) = m.or_logs(m.wait_led_and_sync().context(format!("cycle {cycle}")));
        let before = load.count();
        let t = Instant::now();
        let hit = match victims {
            Victims::Leader => vec![leader],
            Victims::Sync => vec![sync],
            Victims::Both => vec![sync, leader],
        };
        m.count_cuts(&hit);
        let outage = pull_plugs(&mut m.nodes, &mut m.mounts, &hit, &mut rng);
        lost_writes += m.or_logs(outage.context(format!("cycle {cycle}"))).lost;
        for &i in hit.iter().rev() {
            m.restart(i, &format!("cycle {cycle}"));
        }
        m.or_logs(m.wait_led().context(format!("cycle {cycle}")));
        let resumed = load.wait_acks_beyond(before + 16, DEADLINE);
        m.or_logs(resumed.context(format!("cycle {cycle}: appends did not resume")));
        recover_ms.push(t.elapsed().as_millis());
        println!(
            "cycle {cycle}: power lost by {hit:?} (leader n{leader}, synchronous n{sync}); \
             led and acknowledged again after {} ms",
            t.elapsed().as_millis()
        );
    }
    let acks = load.stop();
    let verdict = m.judge(&acks);
    let nodes: Vec<&ChildNode> = m.nodes.iter().collect();
    let read: Vec<usize> = readers
        .into_iter()
        .map(|r| r.assert_survived(&nodes))
        .collect();
    println!("records read on the members, all still there: {read:?}");
    println!(
        "{n_cycles} power losses of {victims:?} under failover with overlap {overlap:?} in \
         {:.1} s (recovery ms {recover_ms:?}): {} appends acknowledged, {lost_writes} \
         unsynced writes lost by the crashes, {} tails cut; {verdict}",
        started.elapsed().as_secs_f64(),
        acks.len(),
        m.tail_cuts(),
    );
}

#[test]
fn the_leader_loses_power() {
    power_loss_cycles(Victims::Leader, Overlap::Off);
}

#[test]
fn the_synchronous_standby_loses_power() {
    power_loss_cycles(Victims::Sync, Overlap::Off);
}

#[test]
fn both_lose_power_at_once() {
    power_loss_cycles(Victims::Both, Overlap::Off);
}

#[test]
fn the_leader_loses_power_with_overlap() {
    power_loss_cycles(Victims::Leader, Overlap::On);
}

#[test]
fn the_synchronous_standby_loses_power_with_overlap() {
    power_loss_cycles(Victims::Sync, Overlap::On);
}

#[test]
fn both_lose_power_at_once_with_overlap() {
    power_loss_cycles(Victims::Both, Overlap::On);
}

/// Where `timeline` began on `node`: the switch point its history file records last.
fn switch_point(node: &ChildNode, timeline: u32) -> anyhow::Result<Lsn> {
    let path = node
        .data_dir
        .join("pg_wal")
        .join(format!("{timeline:08X}.history"));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("read {}: {e}", path.display()))?;
    let last = text
        .lines()
        .rfind(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .ok_or_else(|| anyhow::anyhow!("{} names no switch", path.display()))?;
    let lsn = last
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("{}: {last:?}", path.display()))?;
    lsn.parse()
        .map_err(|e| anyhow::anyhow!("{}: {lsn:?}: {e}", path.display()))
}

/// The case the overlapped commit's rules exist for. The leader's syncs are held: its writer
/// waits in the sync of a batch it has already sent, and the synchronous standby makes that
/// batch durable; the leader, having heard so, acknowledges nothing past its own durable end
/// (rule 1). The standby is then kept from etcd (only the old leader, named in the
/// published record, may take the next term: the third member is not the synchronous
/// standby), and the leader loses power with everything unsynced lost
/// ([`LossyFs::crash_to_synced`]: the lost tail is certain) and starts again at once, while
/// its lease still runs. It must wait for that lease, take a new term and a new timeline at its
/// own durable end, below the standby's; the standby's tail past that fork is cut back when
/// its stream starts and counted in its `/status`; every acknowledged append survives and all
/// members end byte-identical.
#[test]
fn a_leader_that_lost_a_tail_its_standby_holds_comes_back_in_a_new_term() {
    let _one = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = Members::start(dir.path(), Overlap::On);
    let load = load_on(&m, dir.path());
    let started = Instant::now();
    let (leader, sync) = m.or_logs(m.wait_led_and_sync());
    let before = m.status(leader).expect("the leader's status");
    // Early sends on the leader's timeline begin only once its early-send mark naming it is
    // durable, which nothing outside is told, and syncs held before that would keep it from
    // ever being so. So the leader's disk is slow until an early send is seen.
    m.mounts[leader].set_sync_latency(PRIMARY_SYNC_LATENCY);
    let (l, s) = (&m.nodes[leader], &m.nodes[sync]);
    let early = standby_past_primary("an early send on the leader's timeline", l, s, None);
    m.mounts[leader].set_sync_latency(Duration::ZERO);
    m.or_logs(early);
    // Dropped before the members if a wait below fails, so that the held syncs run and the
    // leader can be killed; the power loss ends the hold otherwise.
    let _held = m.mounts[leader].hold_syncs();
    // The leader's first write that waits for its sync, told by its mount as it is recorded.
    assert!(
        UnsyncedWatch::on(&[&m.mounts[leader]]).wait(DEADLINE),
        "timed out after {DEADLINE:?} waiting for a write of n{leader} that waits for its sync\n{}",
        m.logs()
    );
    // From that write on; the mount is asked again with it, since a sync under way when the
    // hold came may have covered that write.
    let tail_end = m.or_logs(standby_past_primary(
        "the synchronous standby durable past the leader's own durable end",
        &m.nodes[leader],
        &m.nodes[sync],
        Some(&m.mounts[leader]),
    ));
    // Rule 1: once the leader has heard the standby's flush past its own durable end, it
    // still acknowledges nothing past that end (its own flush is always required).
    let (own_end, acknowledged) = m.or_logs(wait_for(
        "the leader to hear the standby's flush",
        DEADLINE,
        Duration::from_millis(2),
        || {
            let l = m.status(leader).ok()?;
            let heard = l
                .replication
                .iter()
                .find(|r| r.application_name == name(sync))?
                .flush_lsn?;
            (heard >= tail_end).then_some((l.flush_lsn, l.acknowledged_lsn))
        },
    ));
    assert!(
        acknowledged <= own_end,
        "n{leader} acknowledges up to {acknowledged} with only {own_end} durable on it (rule 1)"
    );
    // The standby loses etcd before the leader goes, so that it cannot campaign.
    m.etcd_links[sync].close();
    m.etcd_links[sync].cut();
    let t = Instant::now();
    let outage = power_off(&mut m.nodes, &mut m.mounts, &[leader], None);
    m.or_logs(outage);
    let restarted_after = t.elapsed();
    m.restart(leader, "the leader after its power loss");
    assert!(
        restarted_after < TTL
            && m.nodes[leader]
                .log_text()
                .contains("this member name's key is still in etcd, on a lease; waiting"),
        "n{leader} was started again {restarted_after:?} after its power loss, not within its \
         lease ({TTL:?}) while its key was still in etcd\n{}",
        m.logs()
    );
    let after = m.or_logs(wait_for(
        &format!("n{leader} to lead again"),
        DEADLINE,
        Duration::from_millis(20),
        || {
            let s = m.status(leader).ok()?;
            (m.leads(leader) && s.timeline > before.timeline).then_some(s)
        },
    ));
    assert!(
        after.term > before.term,
        "n{leader} resumed term {:?}: now {:?}",
        before.term,
        after.term
    );
    let fork = switch_point(&m.nodes[leader], after.timeline.0).expect("the new timeline's fork");
    assert!(
        fork < tail_end,
        "the fork {fork} is not below the tail {tail_end} the standby held"
    );
    m.etcd_links[sync].open();
    m.or_logs(m.wait_led());
    let commit = m.status(sync).expect("the standby's status").commit;
    assert!(
        commit.tail_cuts >= 1 && commit.tail_cut_bytes >= tail_end.0 - fork.0,
        "n{sync} held {} bytes past the fork {fork} and cut {commit:?}\n{}",
        tail_end.0 - fork.0,
        m.logs()
    );
    let before_acks = load.count();
    let resumed = load.wait_acks_beyond(before_acks + 16, DEADLINE);
    m.or_logs(resumed.context("appends did not resume"));
    let acks = load.stop();
    m.judge(&acks);
    println!(
        "n{leader} lost {} bytes its standby n{sync} held and came back {restarted_after:?} \
         after its power loss; it led term {:?} on timeline {} from {fork}; n{sync} cut \
         {commit:?}; {} appends acknowledged, all judged, in {:.1} s",
        tail_end.0 - fork.0,
        after.term,
        after.timeline,
        acks.len(),
        started.elapsed().as_secs_f64()
    );
}

/// A failover while a tail is in flight: the leader is cut off from etcd and then from its
/// standbys while its writers' appends keep arriving, so that it writes (and with the switch
/// off, also syncs) WAL no standby has; the synchronous standby takes the next term at its own
/// end. Given its links back, the old leader follows the new one, and its WAL past the new
/// timeline's switch point is dropped (`FollowLeader`'s cut back to the fork: the new
/// leader's history names that point; nothing past it was acknowledged, because an
/// acknowledgement needs the synchronous standby's flush, which stopped below it).
fn a_cut_off_leader_rejoins_cut_back_to_the_fork(overlap: Overlap) {
    let _one = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Members::start(dir.path(), overlap);
    let load = load_on(&m, dir.path());
    let started = Instant::now();
    let (leader, sync) = m.or_logs(m.wait_led_and_sync());
    let before = m.status(leader).expect("the leader's status");
    // From etcd first: a leader that saw its standby go while it could still reach etcd
    // would unpublish it, and nobody could then take the next term.
    m.etcd_links[leader].close();
    m.etcd_links[leader].cut();
    m.replication_links[leader].close();
    m.replication_links[leader].cut();
    // An append of the test's own, sent now, is written by the cut-off leader and reaches no
    // standby: under the overlapped commit the standby has everything the writers' waiting
    // appends wrote, so without a new one the leader holds no tail. It cannot be
    // acknowledged (no standby can confirm it); if it were, the judge counts it with the
    // rest.
    let mut probe = Acks::default();
    let probed = probe.try_append(&m.nodes[leader], 128, "", Some(Duration::from_secs(1)));
    let standby_end = m.or_logs(wait_for(
        "the synchronous standby to stop streaming",
        DEADLINE,
        Duration::from_millis(5),
        || {
            let s = m.status(sync).ok()?;
            (!s.receiving()).then_some(s.flush_lsn)
        },
    ));
    let tail_end = m.or_logs(wait_for(
        "the cut-off leader to write past its synchronous standby",
        DEADLINE,
        Duration::from_millis(5),
        || {
            let l = m.status(leader).ok()?;
            (l.flush_lsn > standby_end).then_some(l.flush_lsn)
        },
    ));
    let new = m.or_logs(wait_for(
        &format!("n{sync} to take the next term"),
        DEADLINE,
        Duration::from_millis(20),
        || {
            let s = m.status(sync).ok()?;
            (m.leads(sync) && s.timeline > before.timeline).then_some(s)
        },
    ));
    let fork = switch_point(&m.nodes[sync], new.timeline.0).expect("the new timeline's fork");
    let old_end = m.status(leader).expect("the old leader's status").flush_lsn;
    assert!(
        fork < old_end,
        "the old leader holds nothing past the fork {fork} (its end {old_end})"
    );
    m.etcd_links[leader].open();
    m.replication_links[leader].open();
    let led = m.or_logs(m.wait_led());
    assert_eq!(led, sync, "n{sync} took the term; n{led} leads");
    let rejoined = m.status(leader).expect("the old leader's status");
    assert_eq!(
        rejoined.timeline, new.timeline,
        "n{leader} is not on the new timeline"
    );
    let before_acks = load.count();
    let resumed = load.wait_acks_beyond(before_acks + 16, DEADLINE);
    m.or_logs(resumed.context("appends did not resume"));
    let mut acks = load.stop();
    acks.extend(probe.entries().iter().cloned());
    m.judge(&acks);
    println!("overlap {overlap:?}: the cut-off n{leader} answered the test's append {probed:?}");
    println!(
        "overlap {overlap:?}: n{leader} cut off at {tail_end} (its synchronous standby n{sync} \
         at {standby_end}); n{sync} leads timeline {} from {fork}; n{leader} followed it, \
         {} bytes past the fork dropped ({:?}); {} appends acknowledged, all judged, in \
         {:.1} s",
        new.timeline,
        old_end.0 - fork.0,
        rejoined.commit,
        acks.len(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_cut_off_leader_with_a_tail_rejoins_cut_back_to_the_fork() {
    a_cut_off_leader_rejoins_cut_back_to_the_fork(Overlap::Off);
}

#[test]
fn a_cut_off_leader_with_a_tail_rejoins_cut_back_to_the_fork_with_overlap() {
    a_cut_off_leader_rejoins_cut_back_to_the_fork(Overlap::On);
}
