//! Clusters of walserver nodes over real sockets on 127.0.0.1: a primary, a standby and a
//! standby cascading from it; promotion and timeline following without a reconnect; the old
//! primary refused for its fork until it rejoins; and the supervisor's lessons (start requests
//! are never lost and never wait for a fixed retry interval; an upstream restarted many times
//! loses no byte); reading records across a promotion and as they arrive; the CLI clients run
//! as commands; the log an operator reads; automatic failover's endpoints and `walserver
//! cluster`, without failover and with it on a real etcd; a permanent slot through
//! switchovers and a failover, with pg_receivewal on it.

mod bench;
mod binary;
mod cli;
#[path = "../common/mod.rs"]
mod common;
mod failover;
mod hosts;
mod lessons;
mod logs;
mod members;
mod records;
mod slots;

use std::process::Command;

use common::cluster::*;
use common::*;
use supervisor_actor::{AppendError, NodeRole, PromoteError};
use wal_storage::{Lsn, TimelineId};
use walserver_node::init::StandbySignal;

const TL1: TimelineId = TimelineId(1);
const TL2: TimelineId = TimelineId(2);
const KEEP: &str = "wal_keep_size = \"64MB\"\n";

/// Appends `mib` MiB on `node` in records of 16 KiB (through storage, as the tests of the
/// primary do); returns the end.
fn append_mib(node: &TestNode, mib: usize, seed: u8) -> Lsn {
    let mut end = Lsn::INVALID;
    for i in 0..mib * 8 {
        end = node.append(8, 16 << 10, seed.wrapping_add(i as u8));
    }
    end
}

/// Runs `walserver rejoin` on a stopped node's data directory and returns what it printed.
fn rejoin_cli(data_dir: &std::path::Path, conninfo: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .arg("rejoin")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--primary-conninfo")
        .arg(conninfo)
        .output()
        .expect("run walserver rejoin");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "walserver rejoin failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A cascade through a promotion and a rejoin: a primary P, standbys A and C of P, a standby B of A. Everything appended
/// on P is byte-identical on all four; A is promoted and B follows timeline 2 on the same
/// connection and keeps receiving what A takes; C, re-pointed at A by a reload, follows too;
/// P, restarted as a standby of A, is refused for its fork (the error names the fork LSN)
/// until `walserver rejoin` drops its divergent tail, and then follows A byte for byte.
/// Appends on standbys are refused. With the overlapped commit too: P was never told a
/// commit point, and what it wrote as a primary is its floor (rule 4), so the refusal is an
/// alarm, holds across a restart, and nothing is cut until the rejoin.
#[test]
fn a_cascade_promotes_follows_and_the_old_primary_rejoins() {
    cascade_and_rejoin(false);
}

#[test]
fn a_cascade_promotes_follows_and_the_old_primary_rejoins_with_the_overlapped_commit() {
    cascade_and_rejoin(true);
}

fn cascade_and_rejoin(overlap: bool) {
    // Every node keeps its WAL, so it can be compared from the start.
    let conf = format!("{KEEP}synchronous_commit_overlap = {overlap}\n");
    let p = TestNode::primary(&conf);
    let start = p.wal().flushed();
    let a = TestNode::standby_of(p.addr(), "a", &conf);
    let b = TestNode::standby_of(a.addr(), "b", &conf);
    let c = TestNode::standby_of(p.addr(), "c", &conf);

    // Standbys refuse appends, through the supervisor and through the admin API.
    assert!(matches!(
        a.append_records(1, 10, 0),
        Err(AppendError::Standby)
    ));
    let (code, body) = http_post(b.http_addr, "/wal", b"record");
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("standby"),
        "{body}"
    );
    // A primary refuses promotion.
    assert!(matches!(p.promote(), Err(PromoteError::NotStandby)));

    let end = append_mib(&p, 3, 1);
    a.wait_flushed(TL1, end);
    b.wait_flushed(TL1, end);
    c.wait_flushed(TL1, end);
    for (name, n) in [("A", &a), ("B", &b), ("C", &c)] {
        assert_eq!(n.wal().system_id(), p.wal().system_id(), "{name}");
        assert_same_wal(&p, n, TL1, start, end);
        assert!(assert_same_segments(&p, n, TL1, start, end) >= 2, "{name}");
    }
    let a_info = a.wait_receiver("A to stream from P", |_| true);
    let b_info = b.wait_receiver("B to stream from A", |_| true);
    let status = b_info.status.as_ref().unwrap();
    assert_eq!(
        status.sender_port,
        Some(a.addr().port()),
        "B cascades from A"
    );
    assert_eq!(
        a_info.status.as_ref().unwrap().sender_port,
        Some(p.addr().port())
    );
    // A's walsender to B shows in A's replication status.
    assert_eq!(a.status().replication.len(), 1);
    assert_eq!(a.status().replication[0].application_name, "b");

    // Promote A through its admin API.
    let (code, promoted) = http_post(a.http_addr, "/promote", b"");
    assert_eq!(code, 200, "{promoted}");
    assert_eq!(promoted["timeline"], 2);
    let switch: Lsn = promoted["switch_lsn"].as_str().unwrap().parse().unwrap();
    assert_eq!(switch, end, "A had received everything P wrote");
    let a_status = a.status();
    assert_eq!(a_status.role, NodeRole::Primary);
    assert_eq!(a_status.timeline, TL2);
    assert!(a_status.wal_receiver.is_none());
    assert!(!a.data_dir().join("standby.signal").exists());
    assert!(matches!(a.promote(), Err(PromoteError::NotStandby)));

    // B follows timeline 2 with the walreceiver it had, and receives what A now takes.
    b.wait_flushed(TL2, switch);
    let appended = a.append_records(64, 16 << 10, 7).expect("append on A");
    assert_eq!(appended.timeline, TL2);
    let a_end = append_mib(&a, 1, 8);
    b.wait_flushed(TL2, a_end);
    let b_after = b.wait_receiver("B to stream timeline 2", |i| {
        i.status.as_ref().unwrap().received_tli == Some(TL2)
    });
    assert_eq!(
        b_after.pid, b_info.pid,
        "B reconnected instead of following on the same connection"
    );
    assert_eq!(b_after.restart.attempts, 0, "B's walreceiver never failed");
    assert_eq!(b.status().timeline, TL2);
    assert_same_history(&a, &b, TL2);
    assert_same_wal(&a, &b, TL1, start, switch);
    assert_same_wal(&a, &b, TL2, switch, a_end);
    assert!(assert_same_segments(&a, &b, TL2, switch, a_end) >= 1);

    // C, re-pointed at A by a reload (before P writes anything A does not have), follows
    // timeline 2 from A.
    c.reload_with(&format!("{conf}primary_conninfo = {:?}\n", a.conninfo("c")));
    c.wait_flushed(TL2, a_end);
    let info = c.wait_receiver("C to stream from A", |i| {
        i.status.as_ref().unwrap().sender_port == Some(a.addr().port())
    });
    assert_eq!(info.status.unwrap().received_tli, Some(TL2));
    assert_same_history(&a, &c, TL2);
    assert_same_wal(&a, &c, TL2, switch, a_end);

    // P goes on as a primary of timeline 1 for a while: its WAL forks from A's history.
    let p_end = p.append(4, 10_000, 99);
    assert!(p_end > switch);
    let p_dir = p.down(Down::Immediate);
    let p_data = p_dir.path().join("data");
    StandbySignal {
        primary_conninfo: Some(a.conninfo("p")),
        primary_slot_name: None,
        standby_since: None,
    }
    .write(&p_data)
    .unwrap();
    let p = TestNode::start_in(p_dir, &conf);
    // Refused, with the fork LSN named in /status; nothing of P's WAL is dropped.
    let mut last_error = String::new();
    wait_until("P to be refused for its fork", || {
        let s = p.http_get("/status");
        last_error = s["wal_receiver"]["last_error"]
            .as_str()
            .unwrap_or("")
            .to_string();
        last_error.contains("forked")
    });
    assert!(
        last_error.contains(&switch.to_string()),
        "the error does not name the fork LSN {switch}: {last_error}"
    );
    let status = p.status();
    assert_eq!(status.role, NodeRole::Standby);
    assert_eq!((status.timeline, status.flush_lsn), (TL1, p_end));
    assert!(status.wal_receiver.unwrap().restart.attempts >= 1);
    let p = if overlap {
        assert_tail_kept_and_alarmed(&p);
        // Restarted once more, it still refuses: the floor is on disk.
        let p = TestNode::start_in(p.down(Down::Immediate), &conf);
        wait_until("P to be refused again", || {
            p.status().commit.alarm.is_some()
        });
        assert_eq!(p.status().flush_lsn, p_end);
        assert_tail_kept_and_alarmed(&p);
        p
    } else {
        p
    };

    // `walserver rejoin` drops the divergent tail and says how much.
    let p_dir = p.down(Down::Immediate);
    let said = rejoin_cli(&p_dir.path().join("data"), &a.conninfo("p"));
    let dropped = p_end.0 - switch.0;
    assert!(
        said.contains(&format!("dropped {dropped} bytes")),
        "rejoin did not say it dropped {dropped} bytes: {said}"
    );
    let p = TestNode::start_in(p_dir, &conf);
    let a_end = a.append_records(32, 1000, 9).unwrap().end_lsn;
    p.wait_flushed(TL2, a_end);
    b.wait_flushed(TL2, a_end);
    let info = p.wait_receiver("P to stream from A", |_| true);
    assert_eq!(info.status.unwrap().sender_port, Some(a.addr().port()));
    assert_same_history(&a, &p, TL2);
    assert_same_wal(&a, &p, TL1, start, switch);
    assert_same_wal(&a, &p, TL2, switch, a_end);
    assert_same_wal(&a, &b, TL2, switch, a_end);
    c.wait_flushed(TL2, a_end);
    assert_same_wal(&a, &c, TL2, switch, a_end);
    assert!(assert_same_segments(&a, &p, TL2, switch, a_end) >= 1);
    // The old primary is a standby now: it refuses appends.
    let (code, _) = http_post(p.http_addr, "/wal", b"record");
    assert_eq!(code, 409);
}

/// Two standbys of one primary promoted apart at the same point both make a timeline 2: the
/// same number and switch point, other WAL after it. One pointed at the other is refused
/// before anything is cut or streamed (the error names both histories' lines and is the
/// commit alarm), and `walserver rejoin` refuses too; its WAL stays as it was.
#[test]
fn a_timeline_of_one_number_made_apart_is_refused_not_followed() {
    let p = TestNode::primary(KEEP);
    let a = TestNode::standby_of(p.addr(), "a", KEEP);
    let c = TestNode::standby_of(p.addr(), "c", KEEP);
    let end = append_mib(&p, 1, 1);
    a.wait_flushed(TL1, end);
    c.wait_flushed(TL1, end);
    drop(p);
    for n in [&a, &c] {
        let (code, promoted) = http_post(n.http_addr, "/promote", b"");
        assert_eq!(code, 200, "{promoted}");
        assert_eq!(
            (
                promoted["timeline"].as_u64(),
                promoted["switch_lsn"].as_str()
            ),
            (Some(2), Some(end.to_string().as_str()))
        );
    }
    // Each takes appends of its own on its timeline 2; A more than C, so that C, streaming
    // from A, would take A's bytes after its own.
    let a_end = append_mib(&a, 2, 30);
    let c_end = append_mib(&c, 1, 60);
    assert!(a_end > c_end);
    let c_dir = c.down(Down::Immediate);
    let c_data = c_dir.path().join("data");
    StandbySignal {
        primary_conninfo: Some(a.conninfo("c")),
        primary_slot_name: None,
        standby_since: None,
    }
    .write(&c_data)
    .unwrap();
    let c = TestNode::start_in(c_dir, KEEP);
    let mut last_error = String::new();
    wait_until("C to be refused for a timeline made apart", || {
        let s = c.http_get("/status");
        last_error = s["wal_receiver"]["last_error"]
            .as_str()
            .unwrap_or("")
            .to_string();
        last_error.contains("made apart")
    });
    assert!(
        last_error.contains("promoted by walserver at "),
        "the error does not give the histories' lines: {last_error}"
    );
    let status = c.status();
    assert_eq!(
        (status.timeline, status.flush_lsn),
        (TL2, c_end),
        "C's WAL is as it was"
    );
    assert!(
        status
            .commit
            .alarm
            .as_deref()
            .unwrap_or("")
            .contains("made apart"),
        "{:?}",
        status.commit
    );
    // Nor does `walserver rejoin` cut it to A's.
    let c_dir = c.down(Down::Immediate);
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .arg("rejoin")
        .arg("--data-dir")
        .arg(c_dir.path().join("data"))
        .arg("--primary-conninfo")
        .arg(a.conninfo("c"))
        .output()
        .expect("run walserver rejoin");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "rejoin went on: {said}");
    assert!(said.contains("made apart"), "{said}");
}

/// An old primary's refused cut under the overlapped commit: alarmed in `/status` and
/// `/metrics`, nothing cut.
fn assert_tail_kept_and_alarmed(p: &TestNode) {
    let commit = p.status().commit;
    let alarm = commit.alarm.as_deref().unwrap_or_default();
    assert!(alarm.contains("rejoin"), "{commit:?}");
    assert_eq!(
        (commit.tail_cuts, commit.tail_cut_bytes),
        (0, 0),
        "{commit:?}"
    );
    assert!(commit.tail_cut_refusals >= 1, "{commit:?}");
    let (code, metrics) = http_get_any(p.http_addr, "/metrics");
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains("walserver_commit_alarm 1\n"), "{metrics}");
    assert_eq!(
        metric_value(&metrics, "walserver_commit_tail_cuts_total"),
        Some(0.0)
    );
}
