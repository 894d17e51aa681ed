//! Permanent slots through handovers: a slot created by pg_receivewal on the leader and named
//! permanent (`walserver cluster slots add`) is kept by whichever member leads, with its
//! retention, through three switchovers and a kill -9 failover, with `wal_keep_size` 0 on
//! every member; pg_receivewal, stopped before each handover while the leader writes on,
//! resumes on the slot at the new leader through a host list naming every member, and loses
//! no segment: every segment it completed is byte-identical to the leader's copy, and their
//! numbers have no gap.
//!
//! Three `walserver run` children (1 MiB segments) on a real etcd with a ttl of 2 s, so the
//! test takes about 20 s; `WALSERVER_TEST_SLOT_MIB` sets the MiB written while pg_receivewal
//! is stopped at each handover (3 by default).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use etcd_gateway::testkit::EtcdServer;
use pg_testkit::PgBin;
use wal_storage::{parse_segment_file_name, Lsn};
use walserver_bench::node::ChildNode;

use super::binary::{http_of, run, write_config};
use super::common::cluster::*;
use super::common::receivewal::Receiver;
use super::common::*;

const SEG: u64 = 1 << 20;
const SLOT: &str = "s1";

fn mib_per_round() -> usize {
    std::env::var("WALSERVER_TEST_SLOT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// The configuration of member `name`: nothing keeps WAL but slots.
fn member_config(dir: &Path, etcd: &EtcdServer, name: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "wal_keep_size = \"0\"\nwal_sender_timeout = \"5s\"\nwal_receiver_timeout = \"5s\"\n[failover]\netcd_endpoints = [{:?}]\ncluster_name = \"t\"\nnode_name = \"{name}\"\nttl = \"2s\"\n",
            etcd.client_url()
        ),
    )
}

fn walserver(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(args)
        .env_remove("WALSERVER_HTTP_AUTH_TOKEN")
        .output()
        .expect("run walserver");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "walserver {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The slot `SLOT` on `w` as `/slots` shows it, if it has one.
fn slot_on(w: &ChildNode) -> Option<serde_json::Value> {
    let (code, body) = http_get_any(http_of(w), "/slots");
    if code != 200 {
        return None;
    }
    let rows: serde_json::Value = serde_json::from_str(&body).ok()?;
    rows.as_array()?
        .iter()
        .find(|r| r["slot_name"] == SLOT)
        .cloned()
}

fn restart_of(slot: &serde_json::Value) -> Option<Lsn> {
    slot["restart_lsn"].as_str()?.parse().ok()
}

/// The member that answers `/primary` 200, waiting for one other than `not`.
fn wait_leader(members: &[ChildNode], not: Option<usize>) -> usize {
    let mut leader = None;
    wait_until("a member to lead", || {
        leader = (0..members.len()).find(|&i| {
            Some(i) != not
                && members[i].is_running()
                && http_get_any(http_of(&members[i]), "/primary").0 == 200
        });
        leader.is_some()
    });
    leader.expect("a leader")
}

/// Waits until the slot on `leader` has reached its flushed end (pg_receivewal has all of
/// it); that end. pg_receivewal ending meanwhile fails the test at once.
fn wait_caught_up(receiver: &mut Receiver, leader: &ChildNode) -> Lsn {
    let end = leader.status().expect("the leader's status").flush_lsn;
    wait_until("pg_receivewal to confirm the leader's end", || {
        receiver.assert_running();
        slot_on(leader)
            .as_ref()
            .and_then(restart_of)
            .is_some_and(|r| r >= end)
    });
    end
}

/// The completed segments pg_receivewal wrote, by file name.
fn completed(receiver: &Receiver) -> BTreeSet<String> {
    std::fs::read_dir(receiver.dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| parse_segment_file_name(n, SEG).is_some())
        .collect()
}

/// Appends `mib` MiB on the leader through `walserver append`; the leader's flushed end.
fn append_mib(leader: &ChildNode, mib: usize) -> Lsn {
    let http = leader.http.clone();
    let count = (mib * 8).to_string();
    walserver(&[
        "append", "--http", &http, "--count", &count, "--size", "131072", "--batch", "8",
    ]);
    leader.status().expect("the leader's status").flush_lsn
}

/// Every completed segment of pg_receivewal's that `leader` still has is byte-identical to
/// it; the names compared.
fn compare_with(receiver: &Receiver, leader: &ChildNode, data: &Path) -> BTreeSet<String> {
    let mut compared = BTreeSet::new();
    for name in completed(receiver) {
        let ours = data.join("pg_wal").join(&name);
        let Ok(ours) = std::fs::read(&ours) else {
            continue;
        };
        let theirs = std::fs::read(receiver.dir().join(&name)).unwrap();
        assert!(
            theirs == ours,
            "segment {name} differs between pg_receivewal and {}",
            leader.http
        );
        compared.insert(name);
    }
    compared
}

#[test]
fn a_permanent_slot_keeps_its_retention_through_switchovers_and_a_failover() {
    let bin = PgBin::require();
    let etcd = EtcdServer::start();
    let started = std::time::Instant::now();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let names = ["n1", "n2", "n3"];
    walserver_node::init::init_primary(&dirs[0].path().join("data"), SEG).expect("init");
    let mut members = vec![run(&member_config(dirs[0].path(), &etcd, names[0]))];
    wait_leader(&members, None);
    let conninfo = format!("host=127.0.0.1 port={} user=repl", members[0].listen.port());
    for i in 1..3 {
        walserver_node::init::init_standby(&dirs[i].path().join("data"), &conninfo, None, None)
            .expect("init a standby");
        members.push(run(&member_config(dirs[i].path(), &etcd, names[i])));
    }
    let ports: Vec<u16> = members.iter().map(|m| m.listen.port()).collect();
    let data = |i: usize| dirs[i].path().join("data");

    // pg_receivewal makes the slot on the leader (through the host list: the standbys are
    // not read-write), and the slot is named permanent afterwards: the same slot.
    // The host list, with libpq's check that the server takes writes (`in_hot_standby` and
    // `default_transaction_read_only`, which a walserver standby reports as PostgreSQL's
    // does); `--synchronous` flushes and reports each write at once, so the slot follows
    // closely.
    let hosts = vec!["127.0.0.1"; ports.len()].join(",");
    let port_list: Vec<String> = ports.iter().map(u16::to_string).collect();
    let conninfo = format!(
        "host={hosts} port={} user=repl target_session_attrs=read-write",
        port_list.join(",")
    );
    let mut receiver = Receiver::new(
        &bin,
        &conninfo,
        &["--slot", SLOT, "--synchronous", "--status-interval=1"],
    );
    receiver.run_once(&["--create-slot", "--slot", SLOT]);
    let said = walserver(&["cluster", "slots", "add", SLOT, "--http", &members[1].http]);
    assert!(said.contains("is a permanent slot"), "{said}");
    let said = walserver(&["cluster", "slots", "add", SLOT, "--http", &members[2].http]);
    assert!(said.contains("was already"), "{said}");
    let list = walserver(&["cluster", "slots", "list", "--http", &members[0].http]);
    assert!(list.starts_with(SLOT), "{list}");
    receiver.run_once(&["--create-slot", "--if-not-exists", "--slot", SLOT]);

    // The first MiB before pg_receivewal starts: it starts at the leader's current segment
    // (its slot reserves nothing yet), so every segment it completes, it completes while
    // catching up after a handover, when the leader writes nothing and so removes nothing
    // (retention runs at segment switches), and the comparison sees the leader's copy.
    let mut leader = 0;
    append_mib(&members[leader], 1);
    let mut compared = BTreeSet::new();
    receiver.start();
    for round in 0..4 {
        // pg_receivewal has everything the leader flushed; then it stops, and the leader
        // writes on: only the slot (and the standbys' copies of it) keep that WAL.
        let kept_from = wait_caught_up(&mut receiver, &members[leader]);
        compared.extend(compare_with(&receiver, &members[leader], &data(leader)));
        receiver.stop();
        let end = append_mib(&members[leader], mib_per_round());
        for m in members.iter().filter(|m| m.is_running()) {
            m.wait_flushed(end, "every member to have the leader's WAL")
                .expect("the members catch up");
            // Every member's copy holds from pg_receivewal's segment, not beyond its end.
            wait_until(
                "each member's copy of the slot to be at pg_receivewal's end",
                || {
                    slot_on(m).as_ref().and_then(restart_of).is_some_and(|r| {
                        r.segment_number(SEG) == kept_from.segment_number(SEG) && r <= kept_from
                    })
                },
            );
        }

        let old = leader;
        if round < 3 {
            let next = (old + 1) % 3;
            let said = walserver(&[
                "cluster",
                "switchover",
                "--http",
                &members[old].http,
                "--candidate",
                names[next],
            ]);
            assert!(said.starts_with("switchover:"), "{said}");
            leader = wait_leader(&members, Some(old));
            assert_eq!(leader, next);
            // The old leader ends its walsenders while it is demoted: pg_receivewal, which
            // tries the hosts in order, starts once it is a standby.
            wait_until("the old leader to stream from the new one", || {
                http_get_any(http_of(&members[old]), "/replica").0 == 200
            });
        } else {
            members[old].kill9();
            leader = wait_leader(&members, Some(old));
        }

        // The new leader holds the slot at most at pg_receivewal's end, with every segment
        // from there on.
        let slot = slot_on(&members[leader]).expect("the new leader has the slot");
        let restart = restart_of(&slot).expect("the slot holds WAL");
        assert!(restart <= kept_from, "round {round}: {slot}");
        assert_ne!(slot["wal_status"], "lost", "round {round}: {slot}");
        let on_disk: BTreeSet<u64> = std::fs::read_dir(data(leader).join("pg_wal"))
            .unwrap()
            .filter_map(|e| parse_segment_file_name(&e.ok()?.file_name().into_string().ok()?, SEG))
            .map(|(_, s)| s)
            .collect();
        for segno in kept_from.segment_number(SEG)..=end.segment_number(SEG) {
            assert!(
                on_disk.contains(&segno),
                "round {round}: segment {segno} is gone from the new leader ({on_disk:?})"
            );
        }
        eprintln!(
            "round {round}: {} leads at {:?}; the slot at {restart}, pg_receivewal stopped at {kept_from}",
            names[leader],
            started.elapsed()
        );
        // pg_receivewal resumes there, through the same host list.
        receiver.start();
    }
    wait_caught_up(&mut receiver, &members[leader]);
    compared.extend(compare_with(&receiver, &members[leader], &data(leader)));
    receiver.stop();

    // Every completed segment was compared with a leader's copy, and no number is missing.
    let completed = completed(&receiver);
    let missed: Vec<&String> = completed.difference(&compared).collect();
    assert!(
        missed.is_empty(),
        "never compared with a leader: {missed:?}"
    );
    let numbers: BTreeMap<u64, &String> = completed
        .iter()
        .filter_map(|n| Some((parse_segment_file_name(n, SEG)?.1, n)))
        .collect();
    let first = *numbers.keys().next().expect("segments");
    let last = *numbers.keys().last().expect("segments");
    for segno in first..=last {
        assert!(
            numbers.contains_key(&segno),
            "segment {segno} is missing: {numbers:?}"
        );
    }
    assert!(
        last - first + 1 >= 3 * mib_per_round() as u64,
        "pg_receivewal received too little: {numbers:?}"
    );

    // Removed from the configuration, the slot goes from every member; a name that cannot
    // be a slot's is refused with the reason, and so is removing one that is not permanent.
    let http = members[leader].http.clone();
    let said = walserver(&["cluster", "slots", "remove", SLOT, "--http", &http]);
    assert!(said.contains("no longer a permanent slot"), "{said}");
    for m in members.iter().filter(|m| m.is_running()) {
        wait_until("every member to drop the slot", || slot_on(m).is_none());
    }
    for (args, says) in [
        (
            ["cluster", "slots", "add", "Bad-Name", "--http", &http],
            "not a valid replication slot name",
        ),
        (
            [
                "cluster",
                "slots",
                "add",
                "walserver_member_x",
                "--http",
                &http,
            ],
            "the prefix of the members' own slots",
        ),
        (
            ["cluster", "slots", "remove", SLOT, "--http", &http],
            "s1 is not a permanent slot",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
            .args(args)
            .output()
            .expect("run walserver");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(says),
            "{args:?}: {stderr}"
        );
    }
    eprintln!(
        "permanent slot through four handovers: {:?}",
        started.elapsed()
    );
}
