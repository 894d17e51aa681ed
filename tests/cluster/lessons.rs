//! The supervisor's lessons from PostgreSQL's walreceiver history: a walreceiver start request is
//! state that cannot be lost while the previous walreceiver is still stopping (the 2017 race,
//! a4d1ce095bb); no start request waits for a fixed retry interval (PostgreSQL's 5 s); and an
//! upstream killed and brought back again and again costs no byte.

use std::time::{Duration, Instant, SystemTime};

use protocol_codec::BackendMessage;

use super::common::cluster::*;
use super::common::*;
use super::{KEEP, TL1};

/// How long a standby may take to stream again once its upstream accepts connections: a
/// deadline for the test, far above the restart policy's 100 ms cap and far below
/// PostgreSQL's 5 s retry interval.
const RESUME_DEADLINE: Duration = Duration::from_secs(2);

/// Two reloads that change `primary_conninfo`, back to back: the second arrives while the
/// walreceiver the first one stopped is still stopping (both reloads are queued while the
/// supervisor is held busy, so the stop event of the walreceiver the first one stops can only
/// come after the second). The request is kept: exactly one walreceiver starts, at once, with
/// the newest configuration.
#[test]
fn a_start_request_made_while_the_walreceiver_stops_is_kept() {
    let u1 = TestNode::primary(KEEP);
    let u2 = TestNode::standby_of(u1.addr(), "u2", KEEP);
    let s = TestNode::standby_of(u1.addr(), "s", "");
    let end = u1.append(16, 1000, 1);
    s.wait_flushed(TL1, end);
    let before = s.wait_receiver("S to stream from U1", |_| true);

    let to_u2 = s.reconfigure_with(&format!(
        "primary_conninfo = {:?}\n",
        u2.conninfo("s-via-u2")
    ));
    let back_to_u1 = s.reconfigure_with(&format!(
        "primary_conninfo = {:?}\n",
        u1.conninfo("s-again")
    ));
    let t = Instant::now();
    s.with_supervisor_held(|| {
        s.node.supervisor.do_send(to_u2);
        s.node.supervisor.do_send(back_to_u1);
    });
    let after = s.wait_receiver("S to stream with the second configuration", |i| {
        i.status.as_ref().unwrap().sender_port == Some(u1.addr().port()) && i.pid != before.pid
    });
    let took = t.elapsed();
    eprintln!("two reloads while the walreceiver stopped: streaming again after {took:?}");
    assert_eq!(
        after.pid.unwrap(),
        before.pid.unwrap() + 1,
        "one walreceiver, and only one, started after the two requests"
    );
    assert!(took < RESUME_DEADLINE, "{took:?}");
    // It streams under the newest configuration's name.
    let end = u1.append(16, 1000, 2);
    s.wait_flushed(TL1, end);
    let names = u1.application_names();
    assert!(names.contains(&"s-again".to_string()), "{names:?}");
    assert!(!names.contains(&"s".to_string()), "{names:?}");

    // The race PostgreSQL lost, literally: the upstream dies (the walreceiver fails and
    // reports it) while a request to start one for another upstream is pending. Whichever of
    // the two the supervisor hears first, a walreceiver streams from the new upstream.
    u2.wait_flushed(TL1, end);
    let before = s.wait_receiver("S to stream from U1", |_| true);
    let to_u2 = s.reconfigure_with(&format!(
        "primary_conninfo = {:?}\n",
        u2.conninfo("s-via-u2")
    ));
    let t = Instant::now();
    s.with_supervisor_held(|| {
        drop(u1.down(Down::Kill));
        s.node.supervisor.do_send(to_u2);
    });
    let after = s.wait_receiver("S to stream from U2 after U1 died", |i| {
        i.status.as_ref().unwrap().sender_port == Some(u2.addr().port())
    });
    let took = t.elapsed();
    eprintln!("upstream died during a reload: streaming from the new upstream after {took:?}");
    assert!(after.pid > before.pid);
    assert!(took < RESUME_DEADLINE, "{took:?}");
    s.wait_flushed(TL1, end);
}

/// An upstream shut down immediately and started again on its data directory and port: the
/// standby streams again within the restart policy's cap of the upstream accepting. And a
/// walreceiver backing off after failures that need an operator (an upstream of another
/// system, retried a second or more apart) starts at once when a reload names the right
/// upstream, before its pending retry would have fired.
#[test]
fn no_start_request_waits_for_a_fixed_retry_interval() {
    let u = TestNode::primary(KEEP);
    let start = u.wal().flushed();
    let s = TestNode::standby_of(u.addr(), "s", KEEP);
    let end = u.append(16, 1000, 1);
    s.wait_flushed(TL1, end);
    let before = s.wait_receiver("S to stream", |_| true);

    let (u, accepting) = u.restart(Down::Immediate);
    let after = s.wait_receiver("S to stream from the restarted upstream", |i| {
        i.pid != before.pid
    });
    let took = accepting.elapsed();
    eprintln!(
        "walserver upstream restarted: streaming again {took:?} after it accepted (walreceiver attempts {})",
        after.restart.attempts
    );
    assert!(took < RESUME_DEADLINE, "{took:?}");
    let end = u.append(16, 1000, 2);
    s.wait_flushed(TL1, end);
    assert_same_wal(&u, &s, TL1, start, end);

    // An upstream of another system: refused, and retried with the slow backoff of failures
    // that need an operator.
    let foreign = TestNode::primary("");
    s.reload_with(&format!(
        "{KEEP}primary_conninfo = {:?}\n",
        foreign.conninfo("s")
    ));
    let mut pending = None;
    wait_until("S to back off from the foreign upstream", || {
        let info = s.receiver();
        let refused = info
            .restart
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("system identifier"));
        pending = info.restart.next_retry_at;
        refused && info.pid.is_none() && info.restart.attempts >= 2
    });
    let pending = pending.expect("a retry is scheduled");
    assert!(
        pending > SystemTime::now() + Duration::from_millis(200),
        "the retry after an operator's failure should be far off: {pending:?}"
    );
    let t = Instant::now();
    s.reload_with(&format!("{KEEP}primary_conninfo = {:?}\n", u.conninfo("s")));
    let info = s.wait_receiver("S to stream from the right upstream again", |i| {
        i.status.as_ref().unwrap().sender_port == Some(u.addr().port())
    });
    let streaming_at = SystemTime::now();
    eprintln!(
        "reload during an operator-failure backoff: streaming after {:?}",
        t.elapsed()
    );
    assert!(
        streaming_at < pending,
        "the reload waited for the pending retry"
    );
    assert_eq!(info.restart.attempts, 0, "a new upstream starts afresh");
}

/// The upstream killed (its System stopped: sockets closed without a word) or shut down
/// immediately, alternately, and started again on its data directory and port, 20 times in a
/// row, with records appended before each kill, so most kills land while the standby is
/// receiving. Each time streaming resumes within the deadline, and in the end the standby's WAL
/// equals the primary's byte for byte: nothing missing, nothing written twice.
#[test]
fn an_upstream_killed_20_times_loses_no_byte() {
    let mut u = TestNode::primary(KEEP);
    let start = u.wal().flushed();
    let s = TestNode::standby_of(u.addr(), "s", KEEP);
    let mut pid = s.wait_receiver("S to stream", |_| true).pid;
    let mut times = Vec::new();
    for i in 0..20u8 {
        u.append(8, 32 << 10, i);
        let how = if i % 2 == 0 {
            Down::Kill
        } else {
            Down::Immediate
        };
        let (restarted, accepting) = u.restart(how);
        u = restarted;
        let info = s.wait_receiver(&format!("S to stream after restart {i} ({how:?})"), |x| {
            x.pid != pid
        });
        let took = accepting.elapsed();
        assert!(took < RESUME_DEADLINE, "restart {i}: {took:?}");
        times.push(took);
        pid = info.pid;
    }
    let end = u.append(8, 1000, 99);
    s.wait_flushed(TL1, end);
    assert_same_wal(&u, &s, TL1, start, end);
    let segments = assert_same_segments(&u, &s, TL1, start, end);
    assert!(segments >= 4, "only {segments} complete segments compared");
    times.sort();
    eprintln!(
        "20 upstream restarts: streaming again after min {:?}, median {:?}, max {:?} of the upstream accepting",
        times[0], times[10], times[19]
    );
}

/// The admin API is one of the supervisor's children: status shows it, it still answers while
/// a fast shutdown drains the walsenders (an operator can watch the drain), and it stops once
/// the walsenders have ended.
#[test]
fn the_admin_api_answers_during_the_drain_and_stops_after_it() {
    let node = TestNode::primary("wal_sender_shutdown_timeout = \"20s\"");
    assert_eq!(
        node.http_get("/status")["services"],
        serde_json::json!([{"name": "admin API", "state": "running", "last_error": null}])
    );
    let start = node.wal().flushed();
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.start_replication(start);
    let end = node.append(5, 1000, 1);
    let t = Instant::now();
    node.start_shutdown(false);
    // The drain asks the standby to confirm what it was sent; until it does, shutdown waits.
    let mut at = start;
    loop {
        match c.recv() {
            BackendMessage::XLogData(x) => at = x.wal_start + x.data.len() as u64,
            BackendMessage::PrimaryKeepalive(k) if k.reply_requested && at == end => break,
            // Asked before the walsender knew of the last append: answer, as standbys do, so
            // that it asks again once it has sent everything.
            BackendMessage::PrimaryKeepalive(k) if k.reply_requested => c.reply(at, at, false),
            BackendMessage::PrimaryKeepalive(_) => {}
            other => panic!(
                "unexpected {other:?} after {:?}: at {at}, start {start}, end {end}",
                t.elapsed()
            ),
        }
    }
    let during = node.http_get("/status");
    assert_eq!(
        during["replication"].as_array().map(Vec::len),
        Some(1),
        "the draining walsender is in /status: {during}"
    );
    c.reply(end, end, false);
    match c.recv() {
        BackendMessage::CommandComplete(tag) => assert_eq!(tag, "COPY 0"),
        other => panic!("unexpected {other:?}"),
    }
    let http = node.http_addr.to_string();
    wait_until("the admin API to stop after the drain", || {
        walserver_node::admin::get_json(&http, "/status", None).is_err()
    });
}
