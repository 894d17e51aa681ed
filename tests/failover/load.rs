//! The load tool's leader-following and its log, against real nodes without automatic failover
//! (a primary and a standby on hosts of a test network, the load on a third): given the
//! standby first, every writer finds the primary; a primary killed under the load leaves
//! appends that are indeterminate, never acknowledged; `verify` finds every acknowledged one
//! on the restarted primary and catches one that is not there.

use fault_harness::node::AdminAt;
use fault_harness::watch::LineWatch;
use fault_harness::{Net, Process, WalNode};
use walserver_bench::acklog::{self, AckEntry};

use crate::cluster::{walserver_bin, DEADLINE, TOKEN};

#[test]
fn the_load_finds_the_primary_and_logs_what_it_cannot_know() {
    let _serial = crate::serial();
    fault_harness::fault::check_tools().expect("the fault tools");
    let dir = tempfile::Builder::new()
        .prefix("walserver-failover-load-")
        .tempdir()
        .expect("tempdir");
    let mut net = Net::new("load").expect("test network");
    let (hp, hs, hc) = (
        net.add_host("p").expect("host"),
        net.add_host("s").expect("host"),
        net.add_host("c").expect("host"),
    );
    let admin = AdminAt::Network {
        token: TOKEN.to_string(),
    };
    let bin = walserver_bin();
    let mut p = WalNode::primary_with(
        &hp,
        &bin,
        &dir.path().join("p"),
        "p",
        &["--wal-segment-size", "1MB"],
        "synchronous_standby_names = \"FIRST 1 (s)\"\nwal_keep_size = \"1GB\"\n",
        &admin,
    )
    .expect("primary");
    p.start().expect("start p");
    let mut s = WalNode::standby_with(
        &hs,
        &bin,
        &dir.path().join("s"),
        "s",
        &p.conninfo("s"),
        "wal_receiver_status_interval = \"1s\"\n",
        &admin,
    )
    .expect("standby");
    s.start().expect("start s");
    p.wait_status("stream to s", DEADLINE, |st| st.streams_to("s"))
        .expect("s streams");

    let ack_log = dir.path().join("acks.jsonl");
    let mut acks = LineWatch::new(&ack_log).expect("watch");
    let mut cmd = hc.command(&bin);
    // The standby first: its 409 must send every writer to the primary.
    cmd.args(["bench", "append", "--http"])
        .arg(format!("{},{}", s.http(), p.http()))
        .args(["--token", TOKEN, "--ack-log"])
        .arg(&ack_log)
        .args(["--keep-going", "--request-timeout", "2", "--writers", "3"])
        .args(["--size", "64", "--durability", "on", "--seconds", "600"]);
    let mut load = Process::spawn("load", cmd, &dir.path().join("load.log")).expect("load");
    acks.wait_lines_or_exit(100, DEADLINE, Some(load.exit_watch()))
        .unwrap_or_else(|e| panic!("appends acknowledged: {e}; {}", load.explain()));

    // kill -9 under the load: whatever was in flight is not acknowledged.
    p.kill9().expect("kill p");
    p.start().expect("restart p");
    p.wait_status("stream to s again", DEADLINE, |st| st.streams_to("s"))
        .expect("s streams again");
    let before = acks.lines().expect("count");
    acks.wait_lines_or_exit(before + 100, DEADLINE, Some(load.exit_watch()))
        .unwrap_or_else(|e| {
            panic!(
                "appends acknowledged after the restart: {e}; {}",
                load.explain()
            )
        });
    load.kill9().expect("stop the load");

    let log = acklog::read(&ack_log).expect("read");
    let indeterminate = acklog::read_indeterminate(&ack_log).expect("read");
    assert!(
        log.iter().all(|e| e.node.as_deref() == Some(p.http())),
        "an append was acknowledged by another endpoint than the primary"
    );
    assert!(
        log.iter().all(|e| e.mono_ms.is_some()),
        "an acknowledgement without its time"
    );
    let writers: std::collections::HashSet<usize> = log.iter().map(|e| e.writer).collect();
    assert_eq!(writers.len(), 3, "not every writer found the primary");
    let verify = |path: &std::path::Path| {
        let (path, http) = (path.to_path_buf(), p.http().to_string());
        hc.run(move || acklog::verify_node(&path, &http, Some(TOKEN)))
            .expect("enter the client's namespace")
            .expect("verify")
    };
    let r = verify(&ack_log);
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(r.found, r.records, "{r:?}");
    assert_eq!(r.indeterminate, indeterminate.len() as u64);
    assert_eq!(r.indeterminate_partial, 0, "{r:?}");
    // No acknowledged append is also logged as indeterminate.
    let acked: std::collections::HashSet<(usize, u64)> =
        log.iter().map(|e| (e.writer, e.seq)).collect();
    assert!(
        indeterminate
            .iter()
            .all(|i| !acked.contains(&(i.writer, i.seq))),
        "an append is both acknowledged and indeterminate"
    );
    eprintln!(
        "{} acknowledged, {} indeterminate ({} on the primary), {} records checked",
        log.len(),
        r.indeterminate,
        r.indeterminate_present,
        r.found
    );

    // The check itself: one acknowledgement the node does not hold (a copy of the log with
    // one entry's hash changed) is caught.
    let forged = dir.path().join("forged.jsonl");
    let mut entries: Vec<AckEntry> = log.clone();
    entries[log.len() / 2].hashes[0] = acklog::sha256_hex(b"never appended");
    let text: String = entries
        .iter()
        .map(|e| serde_json::to_string(e).expect("json") + "\n")
        .collect();
    std::fs::write(&forged, text).expect("write");
    let r = verify(&forged);
    assert_eq!(r.lost, 1, "a forged acknowledgement was not caught: {r:?}");
    drop(s);
}
