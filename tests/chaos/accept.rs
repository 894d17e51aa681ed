//! Accept errors: a node whose `RLIMIT_NOFILE` is lowered to a little above what it uses is sent connections to its replication
//! port until `accept` fails with EMFILE. The node must stay up, its log must not be flooded
//! (the listener waits 1 ms after a failed accept, doubling up to 1 s, so a fault of D seconds
//! writes about 10 + D lines), and once the connections close, new ones are accepted: a
//! standby killed during the fault connects again and streams what is appended after it.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::node::*;
use crate::{assert_judged, cycles, write_row, Acks};

/// Descriptors the node may open beyond those it holds at rest: enough for the standby's
/// connection, the admin API's requests and a new segment file, few enough that some dozens
/// of connections exhaust them (a guess). The limit is set on the running process, since how
/// many descriptors a node needs at rest depends on the machine (an event loop per core).
const HEADROOM: u64 = 64;

/// How long each fault is held once the first accept has failed.
const HOLD: Duration = Duration::from_secs(3);

/// The line the replication listener logs for each failed accept.
const ACCEPT_FAILED: &str = "accepting a replication connection failed";

fn accept_failures(log: &str) -> usize {
    log.lines().filter(|l| l.contains(ACCEPT_FAILED)).count()
}

/// Lines of `log` about failed accepts that are past the first `skip` of them.
fn failures_since(node: &ChildNode, skip: usize) -> usize {
    let text = node.log_text();
    accept_failures(&text).saturating_sub(skip)
}

#[test]
fn accept_errors_back_off_and_the_node_accepts_again_afterwards() {
    let run_started = Instant::now();
    let n_cycles = cycles(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let pdata = dir.path().join("primary");
    walserver_node::init::init_primary(&pdata, 1 << 20).expect("init");
    // The connections the test opens never send a startup packet; the node must keep them for
    // the whole fault rather than time them out, so authentication_timeout is long.
    let mut primary = child_node(
        "primary",
        &pdata,
        &[
            ("log_level", "info"),
            ("authentication_timeout", "600"),
            ("wal_keep_size", "64MB"),
        ],
    );
    primary.start().expect("start the primary");
    let sdata = dir.path().join("standby");
    walserver_node::init::init_standby(&sdata, &conninfo_at(primary.listen, "s1"), None, None)
        .expect("init the standby");
    let mut standby = child_node("standby", &sdata, &[("wal_receiver_status_interval", "1")]);
    standby.start().expect("start the standby");
    let at_rest = primary.open_fds().expect("the primary's descriptors");
    let nofile = at_rest + HEADROOM;
    primary
        .set_nofile(nofile)
        .expect("lower the primary's RLIMIT_NOFILE");
    println!("the primary holds {at_rest} descriptors at rest; RLIMIT_NOFILE is now {nofile}");
    let mut acks = Acks::default();

    let mut recover = Vec::new();
    let mut recovered = 0;
    for cycle in 0..n_cycles {
        let before = failures_since(&primary, 0);
        // Exhaust the node's descriptors: connect until it logs a failed accept (or give up
        // after far more connections than the limit allows).
        let mut held: Vec<TcpStream> = Vec::new();
        let exhausted = wait_for(
            "the node's first failed accept",
            DEADLINE,
            Duration::from_millis(1),
            || {
                if failures_since(&primary, before) > 0 {
                    return Some(Instant::now());
                }
                assert!(
                    held.len() < 4 * nofile as usize,
                    "{} connections and no failed accept",
                    held.len()
                );
                held.push(TcpStream::connect(primary.listen).expect("connect"));
                None
            },
        )
        .expect("accept to fail");
        // The standby is killed during the fault: when it comes back, it needs a new accept.
        standby.kill9();
        // Hold the fault for its duration, with connections always waiting to be accepted:
        // a new one every 50 ms (a pace, not a wait for an event), so every accept the
        // listener tries fails, even when the node closes a file of its own and one waiting
        // connection takes the descriptor.
        while exhausted.elapsed() < HOLD {
            // The listen backlog holds about 128 waiting connections; at this pace it does
            // not fill within the hold.
            held.push(
                TcpStream::connect_timeout(&primary.listen, Duration::from_secs(5))
                    .expect("connect during the fault"),
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let lines = failures_since(&primary, before);
        let held_for = exhausted.elapsed().as_secs_f64();
        assert!(
            primary.running(),
            "the node died out of descriptors; its log:\n{}",
            primary.log_tail()
        );
        // 1, 2, 4, ... 512 ms (10 lines in about a second), then one a second; three of slack
        // for the accepts that succeed while the held connections are being made.
        let bound = 10 + held_for.ceil() as usize + 3;
        assert!(
            lines >= 8,
            "cycle {cycle}: only {lines} failed accepts in {held_for:.1} s: the fault did not hold"
        );
        assert!(
            lines <= bound,
            "cycle {cycle}: {lines} failed-accept lines in {held_for:.1} s (at most {bound}): \
             the listener does not back off"
        );
        println!(
            "cycle {cycle}: {} connections held, {lines} failed-accept lines in {held_for:.1} s",
            held.len()
        );

        // Lift the fault and time until the standby streams again and holds a new append.
        drop(held);
        let lifted = Instant::now();
        let standby_back = standby.start();
        let ok = standby_back.is_ok()
            && wait_for(
                "the standby to stream again",
                DEADLINE,
                Duration::from_millis(5),
                || primary.status().ok()?.streams_to("s1").then_some(()),
            )
            .is_ok();
        assert!(
            ok,
            "cycle {cycle}: no new connection accepted after the fault: {standby_back:?}\n\
             primary's log:\n{}",
            primary.log_tail()
        );
        let end = acks
            .append(&primary, 16, 100)
            .expect("append after the fault");
        standby
            .wait_flushed(end, "the standby to hold the new append")
            .expect("the standby streams after the fault");
        recover.push(lifted.elapsed());
        recovered += 1;
    }
    let lost = acks.lost_on(&standby) + acks.lost_on(&primary);
    assert_eq!(lost, 0, "acknowledged appends are missing");
    assert_judged(&[acks.entries()], &[&primary, &standby]);
    write_row(
        "accept-emfile",
        &format!("accept fails with EMFILE (RLIMIT_NOFILE {nofile}: {HEADROOM} above its use at rest), held {HOLD:?}"),
        n_cycles,
        run_started.elapsed(),
        acks.count(),
        lost,
        recovered,
        &recover,
        &format!("WALSERVER_TEST_CHAOS_CYCLES={n_cycles} cargo test --test chaos accept_errors"),
    );
}
