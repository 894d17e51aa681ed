//! Automatic failover on etcd, end to end: three `walserver run` members under `[failover]`
//! and a three-member etcd, each member with its etcd member on a host of its own (a network
//! namespace, `fault-harness`), the load on a client host following the leader (`walserver
//! bench append --http n0,n1,n2 --ack-log`) at durability `on` with `synchronous_mode = on`.
//! Every scenario is judged only from the client's acknowledgement log: every acknowledged
//! record on the final leader and every other node at its LSN, on its timeline, with its hash;
//! no acknowledgement of an old timeline received after the first of a new one; the failover
//! time from the fault to the first acknowledgement by the new leader; all nodes on one
//! timeline with the same history file. Never by server logs.
//!
//! The leader key's ttl is 3 s (`cluster::ttl`, `WALSERVER_TEST_FAILOVER_TTL_MS` for another), short to fit CI; the replication timeouts 2 s.
//! `WALSERVER_TEST_FAILOVER_CYCLES` sets the kill -9 cycles (5 by default; 20 or more for a
//! longer run) and `WALSERVER_TEST_FAILOVER_CONTROL_SECS` the control run's length (30 s by
//! default). Each scenario writes one row (`walserver_bench::failover_table`) under
//! `$CARGO_TARGET_DIR/failover/`, from which `walserver-bench failover-table` renders
//! `benches/FAILOVER.md`. `load` tests the load tool itself against nodes without failover.
//! `kill_9_of_the_primary_repeated` also archives (`archive.rs`): after its kills the
//! archive verifies, and a node restored from it alone holds every acknowledged record.
//! `kill_9_of_the_primary_with_its_archive_behind` kills leaders while the archive's store is
//! stopped, with whole segments not yet uploaded, and judges the archive the same way.
//!
//! Needs root, nftables, iproute2, etcd and SeaweedFS (`scripts/test.sh` installs them when
//! missing).
//! The scenarios run one at a time (a lock), so that their timings are their own.

mod archive;
mod checks;
mod cluster;
mod load;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use archive::{wait_behind, wait_covered, BEHIND_SEGMENTS, KILLS_PER_STOP};
use cluster::{ttl, Cluster, Measured, Options, Verdict, DEADLINE, DEFAULT_TTL, MEMBERS};
use fault_harness::{etcd, fault};
use walserver_bench::acklog::mono_ms;

static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Appends acknowledged after the last fault before a scenario ends.
const AFTER: usize = 100;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A cluster with its load running and 50 appends acknowledged.
fn under_load(label: &str, opts: Options) -> Cluster {
    let synchronous = opts.synchronous_mode != "off";
    let mut c = Cluster::start(label, opts);
    c.start_load();
    c.wait_more_acks(50, DEADLINE)
        .unwrap_or_else(|e| panic!("the load runs: {e}"));
    if synchronous {
        // Only a standby published as synchronous may be promoted: until the leader has
        // published one, a fault leaves the cluster without a candidate, by design.
        let leader = c.wait_leader(DEADLINE, None).expect("a leader");
        c.nodes[leader]
            .wait_json(
                "/cluster",
                "a published synchronous standby",
                DEADLINE,
                |v| v["sync_standby"].is_string(),
            )
            .expect("the leader publishes a synchronous standby");
    }
    c
}

/// The old-term acknowledgements and the promotions, measured from the log into `m`; the
/// judge of [`Cluster::finish`] fails the scenario for an old-term acknowledgement.
fn judge_log(c: &Cluster, m: &mut Measured) {
    let log = c.log();
    m.old_term_acks = walserver_bench::judge::old_term_after_new(&log).0;
    m.promotions = checks::promotions(&log);
}

/// One failover after `fault` has been applied at `t0`: waits for the first acknowledgement
/// on a timeline above `timeline`; its delay from `t0` in ms.
fn wait_failover(c: &mut Cluster, timeline: u32, t0: u64) -> Result<f64, String> {
    c.wait_ack(DEADLINE + ttl() * 3, |e| {
        e.timeline > timeline && e.mono_ms.is_some_and(|t| t >= t0)
    })
    .and_then(|e| e.mono_ms)
    .map(|t| (t - t0) as f64)
    .ok_or_else(|| format!("no append acknowledged on a timeline above {timeline}"))
}

/// A cluster under load whose members archive to SeaweedFS, with records of 16 KiB: a
/// megabyte or more of WAL per leader, so that each timeline has whole 1 MiB segments (64
/// appends each, a second or so) as well as its `.partial`.
fn archiving_under_load(label: &str) -> Cluster {
    under_load(
        label,
        Options {
            archive: true,
            record_size: 16 << 10,
            ..Options::default()
        },
    )
}

/// The end of a scenario of `kills` kills of the leader under [`archiving_under_load`]: more
/// appends, the log's measures into `m`, one leader change per kill, then the end state
/// ([`Cluster::finish`]) and the archive ([`Cluster::judge_archive`]: the backlog drains,
/// the archive verifies, and a node made from it alone holds every acknowledged record).
fn judge_kills(
    c: &mut Cluster,
    m: &mut Measured,
    mut problems: Vec<String>,
    kills: u64,
) -> Verdict {
    let _ = c.wait_more_acks(AFTER, DEADLINE);
    judge_log(c, m);
    if m.promotions != kills {
        problems.push(format!(
            "{} leader changes seen for {kills} kills",
            m.promotions
        ));
    }
    let v = c.finish().with(problems);
    v.with(c.judge_archive())
}

/// Kills `leader` with kill -9 and waits for the first acknowledgement on a newer timeline
/// (its delay from the kill into `m`); then restarts the killed node, which must rejoin as a
/// standby, and waits until every member follows the new leader. Returns the new leader.
fn kill_and_rejoin(c: &mut Cluster, m: &mut Measured, leader: usize) -> Result<usize, String> {
    let timeline = c.acked_timeline();
    let t0 = mono_ms();
    c.nodes[leader].kill9().expect("kill -9 the leader");
    m.failover_ms.push(wait_failover(c, timeline, t0)?);
    c.nodes[leader].start().expect("restart the killed node");
    let new = c.wait_leader(DEADLINE, Some(leader))?;
    c.wait_members_follow(new, DEADLINE)
        .map_err(|e| format!("the members do not follow n{new}: {e}"))?;
    Ok(new)
}

#[test]
fn kill_9_of_the_primary_repeated() {
    let _serial = serial();
    let cycles = env_u64("WALSERVER_TEST_FAILOVER_CYCLES", 5);
    // Every member archives to SeaweedFS: the archive must stay whole through the kills.
    let mut c = archiving_under_load("kill");
    let mut m = Measured::default();
    let mut problems = Vec::new();
    for cycle in 0..cycles {
        let leader = match c.wait_leader(DEADLINE, None) {
            Ok(l) => l,
            Err(e) => {
                problems.push(format!("cycle {cycle}: {e}"));
                break;
            }
        };
        c.wait_more_acks(20, DEADLINE)
            .unwrap_or_else(|e| panic!("the load flows: {e}"));
        let new = match kill_and_rejoin(&mut c, &mut m, leader) {
            Ok(new) => new,
            Err(e) => {
                problems.push(format!("cycle {cycle}: {e}"));
                break;
            }
        };
        eprintln!(
            "cycle {cycle}: n{leader} killed, n{new} leads, first ack after {:?} ms",
            m.failover_ms.last()
        );
    }
    let v = judge_kills(&mut c, &mut m, problems, cycles);
    // Another ttl is another row beside the default's.
    let scenario = "kill_9_of_the_primary_repeated";
    let (file, ttl_env) = if ttl() == DEFAULT_TTL {
        (scenario.to_string(), String::new())
    } else {
        (
            format!("{scenario}_ttl_{}ms", ttl().as_millis()),
            format!("WALSERVER_TEST_FAILOVER_TTL_MS={} ", ttl().as_millis()),
        )
    };
    c.row_in(
        &file,
        scenario,
        &format!(
            "kill -9 of the primary, restarted as a standby (ttl {}s)",
            ttl().as_secs_f64()
        ),
        cycles,
        &v,
        &m,
        &format!("{ttl_env}WALSERVER_TEST_FAILOVER_CYCLES={cycles} "),
    );
    v.assert_ok();
    // What an operator reads after the failovers: no line more than a bounded number of
    // times a minute on any member, and no Rust Debug text.
    for node in &c.nodes {
        let path = node.log_path();
        let log = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let repeated = checks::repeated_within_a_minute(&log, checks::MAX_REPEATS_A_MINUTE);
        assert!(repeated.is_empty(), "{}: {repeated:#?}", node.name);
        let leaks = checks::debug_text(&log);
        assert!(leaks.is_empty(), "{}: {leaks:#?}", node.name);
    }
}

#[test]
fn kill_9_of_the_primary_with_its_archive_behind() {
    let _serial = serial();
    let cycles = env_u64("WALSERVER_TEST_ARCHIVE_BEHIND_CYCLES", 1);
    let mut c = archiving_under_load("behind");
    let mut m = Measured::default();
    let mut problems = Vec::new();
    let kills = cycles * KILLS_PER_STOP as u64;
    'cycles: for cycle in 0..cycles {
        // The archive has caught up before the store stops (after the last cycle's failovers
        // too), so what it lacks at each kill is what the stop held back.
        if let Err(e) = c
            .wait_leader(DEADLINE, None)
            .and_then(|l| wait_covered(&c.nodes[l]))
        {
            problems.push(format!("cycle {cycle}: the archive does not catch up: {e}"));
            break;
        }
        c.archive
            .as_ref()
            .expect("the cluster archives")
            .pause()
            .expect("stop the store");
        for kill in 0..KILLS_PER_STOP {
            let step = format!("cycle {cycle}, kill {kill}");
            let leader = match c.wait_leader(DEADLINE, None) {
                Ok(l) => l,
                Err(e) => {
                    problems.push(format!("{step}: {e}"));
                    break 'cycles;
                }
            };
            let archived = match wait_behind(&c, leader) {
                Ok(a) => a,
                Err(e) => {
                    problems.push(format!("{step}: {e}"));
                    break 'cycles;
                }
            };
            let new = match kill_and_rejoin(&mut c, &mut m, leader) {
                Ok(new) => new,
                Err(e) => {
                    problems.push(format!("{step}: {e}"));
                    break 'cycles;
                }
            };
            eprintln!(
                "{step}: n{leader} killed with its archive at {archived}, n{new} leads, \
                 first ack after {:?} ms",
                m.failover_ms.last()
            );
        }
        c.archive
            .as_ref()
            .expect("the cluster archives")
            .resume()
            .expect("continue the store");
    }
    // A cycle that broke off left the store stopped; the judge reads the archive.
    if let Some(store) = &c.archive {
        store.resume().expect("continue the store");
    }
    let v = judge_kills(&mut c, &mut m, problems, kills);
    c.row(
        "kill_9_of_the_primary_with_its_archive_behind",
        &format!(
            "kill -9 of the primary {KILLS_PER_STOP} times in a row with the archive's store \
             stopped ({BEHIND_SEGMENTS} segments behind at each kill), then resumed"
        ),
        kills,
        &v,
        &m,
        &format!("WALSERVER_TEST_ARCHIVE_BEHIND_CYCLES={cycles} "),
    );
    v.assert_ok();
}

/// Faults that depose the leader without killing it: it must stop acknowledging before the
/// new leader starts, and rejoin as its standby once the fault is lifted.
fn deposed_leader(label: &str, fault_name: &str, pause: bool) {
    let _serial = serial();
    let mut c = under_load(label, Options::default());
    let mut m = Measured::default();
    let mut problems = Vec::new();
    let leader = c.wait_leader(DEADLINE, None).expect("a leader");
    let timeline = c.acked_timeline();
    let t0 = mono_ms();
    let at = Instant::now();
    let mut in_flight = None;
    let cut = if pause {
        c.nodes[leader].pause().expect("SIGSTOP");
        // An append sent to the stopped leader waits in its socket and is read when it
        // resumes, long after a new leader took over: at durability `local` only the fence
        // stands between it and an acknowledgement on the old timeline.
        let (client, http, log) = (
            c.client.clone(),
            c.nodes[leader].http().to_string(),
            c.ack_log.clone(),
        );
        in_flight = Some(std::thread::spawn(move || {
            cluster::probe_append(&client, &http, &log, 0, "local", DEADLINE)
        }));
        None
    } else {
        let host = &c.hosts[leader];
        let mut f: Option<fault::Fault> = None;
        for (i, other) in c.hosts.iter().enumerate() {
            if i != leader {
                let g = fault::cut_ports(host, other, &etcd::PORTS).expect("cut etcd's ports");
                f = Some(match f {
                    Some(f) => f.and(g),
                    None => g,
                });
            }
        }
        f
    };
    match wait_failover(&mut c, timeline, t0) {
        Ok(ms) => m.failover_ms.push(ms),
        Err(e) => problems.push(e),
    }
    let first_new_ms = m.failover_ms.first().map(|ms| t0 + *ms as u64);
    let new = c.wait_leader(DEADLINE, Some(leader));
    if !pause {
        // The deposed leader is still running, cut off from etcd: an append sent to it now, at
        // durability `local` (so that no synchronous standby can hold it), must be refused.
        let p = cluster::probe_append(
            &c.client,
            c.nodes[leader].http(),
            &c.ack_log,
            0,
            "local",
            cluster::REQUEST_TIMEOUT,
        );
        eprintln!("an append to the deposed leader: {p:?}");
        if matches!(p.answer, Ok((200, _))) {
            problems.push(format!("the deposed leader acknowledged an append: {p:?}"));
        }
    }
    // The fault lasts past the ttl whatever the failover took: its length, not a wait.
    std::thread::sleep((ttl() + Duration::from_secs(1)).saturating_sub(at.elapsed()));
    let _ = c.wait_more_acks(50, DEADLINE);
    if pause {
        c.nodes[leader].resume().expect("SIGCONT");
    }
    if let Some(probe) = in_flight {
        let p = probe.join().expect("the probe's thread");
        eprintln!("the append sent to the stopped leader: {p:?}");
        if first_new_ms.is_none_or(|t| p.at_ms < t) {
            problems.push(format!(
                "the append sent to the stopped leader was answered before the new leader's \
                 first acknowledgement, so it was not held through the failover: {p:?}"
            ));
        }
        if matches!(p.answer, Ok((200, _))) {
            problems.push(format!(
                "the resumed old leader acknowledged the append it held: {p:?}"
            ));
        }
    }
    if let Some(f) = cut {
        f.heal().expect("heal");
    }
    match new {
        Ok(new) => {
            if let Err(e) = c.wait_members_follow(new, DEADLINE) {
                problems.push(format!(
                    "the deposed n{leader} does not stream from n{new}: {e}"
                ));
            }
        }
        Err(e) => problems.push(e),
    }
    let _ = c.wait_more_acks(AFTER, DEADLINE);
    judge_log(&c, &mut m);
    if m.promotions != 1 {
        problems.push(format!("{} leader changes, not 1", m.promotions));
    }
    let v = c.finish().with(problems);
    c.row(label_scenario(label), fault_name, 1, &v, &m, "");
    v.assert_ok();
}

fn label_scenario(label: &str) -> &'static str {
    match label {
        "etcdcut" => "primary_cut_off_from_etcd",
        "stopped" => "primary_stopped_longer_than_the_ttl",
        _ => "unknown",
    }
}

#[test]
fn primary_cut_off_from_etcd() {
    deposed_leader(
        "etcdcut",
        "the primary cut off from etcd (ports 2379, 2380), replication open",
        false,
    );
}

#[test]
fn primary_stopped_longer_than_the_ttl() {
    deposed_leader(
        "stopped",
        "the primary SIGSTOPped past the ttl, then resumed",
        true,
    );
}

#[test]
fn etcd_leader_killed_and_quorum_lost() {
    let _serial = serial();
    let mut c = under_load("etcd", Options::default());
    let mut m = Measured::default();
    let mut problems = Vec::new();
    let leader = c.wait_leader(DEADLINE, None).expect("a leader");
    let term = c.status_of(leader).map(|s| s.term);
    let timeline = c.acked_timeline();

    // The etcd leader dies: etcd elects another; walserver's leader and term stay.
    let e = c.etcd.leader().expect("etcd's leader");
    c.etcd.members[e].kill9().expect("kill etcd's leader");
    let elected = Instant::now();
    loop {
        match c.etcd.leader() {
            Ok(l) if l != e => break,
            _ if elected.elapsed() > DEADLINE => {
                problems.push("etcd elected no new leader".into());
                break;
            }
            // etcd announces its election to nobody outside: ask again shortly.
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    // Watch for twice the ttl: the observation's length.
    std::thread::sleep(ttl() * 2);
    c.wait_more_acks(50, DEADLINE)
        .unwrap_or_else(|e| panic!("appends go on: {e}"));
    let now = c.leaders();
    if now != [leader] {
        problems.push(format!(
            "etcd's leader change moved the leader: {now:?}, was n{leader}"
        ));
    }
    let term_now = c.status_of(leader).map(|s| s.term);
    if term_now != term {
        problems.push(format!("the term changed: {term:?} -> {term_now:?}"));
    }
    if c.acked_timeline() != timeline {
        problems.push("an append was acknowledged on a new timeline".into());
    }
    c.etcd.restart(e).expect("restart the etcd member");

    // Two members die: no quorum. The leader must stop acknowledging within the ttl.
    let victims: Vec<usize> = (0..MEMBERS).filter(|&i| i != leader).collect();
    let t0 = mono_ms();
    for &v in &victims {
        c.etcd.members[v].kill9().expect("kill an etcd member");
    }
    std::thread::sleep(ttl() + Duration::from_secs(2));
    let log = c.log();
    let last = checks::last_ack_ms(&log).unwrap_or(0);
    // The leader's fence closes a margin before its lease can expire, counted from a renewal
    // sent before `t0`: an answer that arrives after `t0 + ttl` was released too late, or
    // spent longer on its way than that margin, either of which fails.
    let limit = t0 + ttl().as_millis() as u64;
    let stopped_after = last.saturating_sub(t0);
    m.failover_ms.push(stopped_after as f64);
    if last > limit {
        problems.push(format!(
            "appends acknowledged {stopped_after} ms after etcd lost its quorum (ttl {} ms)",
            ttl().as_millis()
        ));
    }
    if !c.leaders().is_empty() {
        problems.push(format!(
            "{:?} still say they lead without a quorum",
            c.leaders()
        ));
    }
    for &v in &victims {
        c.etcd.restart(v).expect("restart an etcd member");
    }
    if let Err(e) = c.wait_leader(DEADLINE, None) {
        problems.push(format!("no leader once etcd is back: {e}"));
    }
    let _ = c.wait_more_acks(AFTER, DEADLINE);
    judge_log(&c, &mut m);
    let v = c.finish().with(problems);
    c.row(
        "etcd_leader_killed_and_quorum_lost",
        "etcd's leader killed (no failover), then two etcd members killed (acks stop within the ttl; time = last ack after the quorum loss)",
        2,
        &v,
        &m,
        "",
    );
    v.assert_ok();
}

#[test]
fn switchover_loses_nothing() {
    let _serial = serial();
    let mut c = under_load("switch", Options::default());
    let mut m = Measured::default();
    let mut problems = Vec::new();
    let leader = c.wait_leader(DEADLINE, None).expect("a leader");
    let candidate = (leader + 1) % MEMBERS;
    let timeline = c.acked_timeline();
    let t0 = mono_ms();
    let body = format!("{{\"candidate\":\"n{candidate}\"}}");
    match c.nodes[leader].request("POST", "/switchover", Some(body.as_bytes())) {
        Ok((200, _)) => {}
        Ok((code, text)) => problems.push(format!("POST /switchover: {code} {text}")),
        Err(e) => problems.push(format!("POST /switchover: {e}")),
    }
    match wait_failover(&mut c, timeline, t0) {
        Ok(ms) => m.failover_ms.push(ms),
        Err(e) => problems.push(e),
    }
    match c.wait_leader(DEADLINE, Some(leader)) {
        Ok(new) if new == candidate => {
            if let Err(e) = c.wait_members_follow(new, DEADLINE) {
                problems.push(format!("the members do not follow n{new}: {e}"));
            }
        }
        Ok(new) => problems.push(format!("n{new} leads, not the candidate n{candidate}")),
        Err(e) => problems.push(e),
    }
    let _ = c.wait_more_acks(AFTER, DEADLINE);
    let log = c.log();
    m.pause_ms = Some(checks::longest_pause(
        &log,
        t0,
        t0 + m.failover_ms.first().copied().unwrap_or(0.0) as u64,
    ) as f64);
    judge_log(&c, &mut m);
    let v = c.finish().with(problems);
    c.row(
        "switchover_loses_nothing",
        "POST /switchover to the next member",
        1,
        &v,
        &m,
        "",
    );
    v.assert_ok();
}

#[test]
fn cascade_and_demoted_primary_follow_the_new_leader() {
    let _serial = serial();
    let mut c = under_load(
        "cascade",
        Options {
            cascade: true,
            ..Options::default()
        },
    );
    let mut m = Measured::default();
    let mut problems = Vec::new();
    let leader = c.wait_leader(DEADLINE, None).expect("a leader");
    let timeline = c.acked_timeline();
    let t0 = mono_ms();
    c.nodes[leader].kill9().expect("kill -9 the leader");
    match wait_failover(&mut c, timeline, t0) {
        Ok(ms) => m.failover_ms.push(ms),
        Err(e) => problems.push(e),
    }
    c.nodes[leader].start().expect("restart the old leader");
    match c.wait_leader(DEADLINE, Some(leader)) {
        Ok(new) => {
            if let Err(e) = c.wait_members_follow(new, DEADLINE) {
                problems.push(format!("the old leader does not stream from n{new}: {e}"));
            }
        }
        Err(e) => problems.push(e),
    }
    let _ = c.wait_more_acks(AFTER, DEADLINE);
    judge_log(&c, &mut m);
    // finish() checks the cascade too: every acknowledged record, the leader's timeline and
    // history file.
    let v = c.finish().with(problems);
    c.row(
        "cascade_and_demoted_primary_follow_the_new_leader",
        "kill -9 of the primary with a cascade (no [failover]) under n1; the old primary restarted",
        1,
        &v,
        &m,
        "",
    );
    v.assert_ok();
}

#[test]
fn control_run_without_faults_promotes_nobody() {
    let _serial = serial();
    let secs = env_u64("WALSERVER_TEST_FAILOVER_CONTROL_SECS", 30);
    let mut c = under_load("control", Options::default());
    let mut m = Measured::default();
    let mut problems = Vec::new();
    let leader = c.wait_leader(DEADLINE, None).expect("a leader");
    let term = c.status_of(leader).map(|s| s.term);
    // The run's length is the observation.
    std::thread::sleep(Duration::from_secs(secs));
    if c.leaders() != [leader] {
        problems.push(format!(
            "the leader moved: {:?}, was n{leader}",
            c.leaders()
        ));
    }
    let term_now = c.status_of(leader).map(|s| s.term);
    if term_now != term {
        problems.push(format!("the term changed: {term:?} -> {term_now:?}"));
    }
    judge_log(&c, &mut m);
    if m.promotions != 0 {
        problems.push(format!("{} promotions without a fault", m.promotions));
    }
    let v = c.finish().with(problems);
    c.row(
        "control_run_without_faults_promotes_nobody",
        &format!("no fault, {secs}s"),
        1,
        &v,
        &m,
        &format!("WALSERVER_TEST_FAILOVER_CONTROL_SECS={secs} "),
    );
    v.assert_ok();
}
