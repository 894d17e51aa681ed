//! Integration tests of a walserver primary over real sockets on 127.0.0.1: the walsender's
//! protocol behaviour, the seed lessons (CopyDone while waiting for WAL, shutdown heard in
//! every state, the fast-shutdown drain), bad input, limits and the admin API.

mod archive;
#[path = "../common/mod.rs"]
mod common;
mod fence;
mod gapfill;
mod metrics;
mod restore;
#[cfg(feature = "failpoints")]
mod storage;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::*;
use protocol_codec::auth::make_scram_verifier;
use protocol_codec::messages::{HotStandbyFeedback, PrimaryKeepalive};
use protocol_codec::{BackendMessage, FrontendMessage, StartupPacket};
use wal_storage::{Lsn, PgTimestamp};

#[test]
fn identify_system_show_and_errors_keep_the_connection() {
    let node = TestNode::primary("");
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    let out = c.query("IDENTIFY_SYSTEM");
    let BackendMessage::DataRow(row) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(
        row[0].as_deref(),
        Some(node.wal().system_id().to_string().as_bytes())
    );
    assert_eq!(
        row[2].as_deref(),
        Some(node.wal().flushed().to_string().as_bytes())
    );
    let out = c.query("SHOW wal_segment_size");
    let BackendMessage::DataRow(row) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(row[0].as_deref(), Some(&b"1MB"[..]));
    assert_eq!(sqlstate(&c.query("SHOW no_such_thing")[0]), "42704");
    assert_eq!(sqlstate(&c.query("SELECT 1")[0]), "0A000");
    // PostgreSQL 15 takes unknown words for SQL; a replication command that does not parse is a
    // syntax error.
    assert_eq!(sqlstate(&c.query("FOO BAR")[0]), "0A000");
    assert_eq!(sqlstate(&c.query("START_REPLICATION SLOT")[0]), "42601");
    let ahead = node.wal().flushed() + 0x100;
    let out = c.query(&format!("START_REPLICATION {ahead}"));
    assert_eq!(out[0], BackendMessage::CopyBothResponse);
    assert_eq!(sqlstate(&out[1]), "XX000");
    // Still usable after every error.
    assert!(matches!(
        c.query("IDENTIFY_SYSTEM")[1],
        BackendMessage::DataRow(_)
    ));
}

/// The 2017 walsender bug (fca85f8ef157): a client that ends the copy while the walsender
/// waits for WAL that does not exist yet must get the end of the copy at once.
#[test]
fn copy_done_while_waiting_for_wal_is_answered_at_once() {
    let node = TestNode::primary("");
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    let end = node.wal().flushed();
    c.start_replication(end);
    let t = Instant::now();
    c.send(FrontendMessage::CopyDone);
    assert_eq!(c.recv(), BackendMessage::CopyDone);
    assert_eq!(
        c.recv(),
        BackendMessage::CommandComplete("START_STREAMING".into())
    );
    assert_eq!(
        c.recv(),
        BackendMessage::CommandComplete("START_REPLICATION".into())
    );
    assert!(matches!(c.recv(), BackendMessage::ReadyForQuery(_)));
    let delay = t.elapsed();
    eprintln!("CopyDone while waiting for WAL answered in {delay:?}");
    // The same connection runs the next command.
    assert!(matches!(
        c.query("IDENTIFY_SYSTEM")[1],
        BackendMessage::DataRow(_)
    ));
    // And can stream again.
    let end2 = node.append(3, 100, 1);
    c.start_replication(end);
    assert_eq!(c.receive_until(end, end2).len() as u64, end2.0 - end.0);
}

#[test]
fn streams_appended_wal_byte_for_byte() {
    let node = TestNode::primary("wal_keep_size = \"64MB\"");
    let start = node.wal().flushed();
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.start_replication(start);
    let mut end = start;
    for i in 0..20u8 {
        end = node.append(10, 30_000, i);
    }
    let got = c.receive_until(start, end);
    let stored = read_wal(&node, start, end);
    assert_eq!(got.len(), stored.len());
    assert!(got == stored, "streamed bytes differ from stored bytes");
}

fn read_wal(node: &TestNode, start: Lsn, end: Lsn) -> Vec<u8> {
    let wal = node.wal();
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let b = wal
            .read(wal.timeline(), at, (end.0 - at.0) as usize)
            .unwrap();
        assert!(!b.is_empty());
        at = at + b.len() as u64;
        out.extend_from_slice(&b);
    }
    out
}

/// Shutdown is heard in every state of a connection. Immediate: every connection gets FATAL
/// 57P01 at once, a streaming one after the WAL already on its way. Fast: those not streaming
/// get it at once too.
#[test]
fn shutdown_is_heard_in_every_state() {
    for immediate in [true, false] {
        let verifier = make_scram_verifier("secret");
        let node = TestNode::primary(&format!(
            "wal_keep_size = \"64MB\"\n[users]\nrepl = \"{verifier}\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"repl\"\nmethod = \"scram-sha-256\"\n[[hba]]\naddress = \"all\"\nuser = \"all\"\nmethod = \"trust\"\n"
        ));
        // Streaming: a client in the middle of a large catch-up, with WAL in flight. It is
        // the immediate shutdown's case (a fast one drains it, see
        // fast_shutdown_drains_then_ends_the_copy).
        let streaming = immediate.then(|| streaming_a_catch_up(&node));
        // Waiting for the startup packet.
        let mut silent = PgConn::raw(node.addr());
        // Mid-authentication: the SASL request has arrived, the client says no more.
        let mut mid_auth = PgConn::raw(node.addr());
        mid_auth.send_startup(StartupPacket::startup([
            ("user", "repl"),
            ("replication", "true"),
        ]));
        assert!(matches!(mid_auth.recv(), BackendMessage::Authentication(_)));
        // Idle between commands.
        let idle = PgConn::connect(node.addr(), "u", None).unwrap();
        // Waiting for WAL that does not exist yet.
        let mut waiting = PgConn::connect(node.addr(), "u", None).unwrap();
        waiting.start_replication(node.wal().flushed());
        // The registry must know of the silent connection before shutdown starts.
        let expected = if immediate { 5 } else { 4 };
        wait_until("connections registered", || {
            futures_executor::block_on(
                node.node
                    .registry
                    .send(walsender_actor::messages::CountConnections),
            )
            .unwrap()
                >= expected
        });
        let t = Instant::now();
        node.start_shutdown(immediate);
        let mut conns = vec![("idle", idle), ("mid-auth", mid_auth)];
        if immediate {
            conns.push(("waiting for WAL", waiting));
        } else {
            // A streaming connection drains in a fast shutdown; it confirms at once here.
            let end = node.wal().flushed();
            loop {
                match waiting.recv() {
                    BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
                        reply_requested: true,
                        ..
                    }) => waiting.reply(end, end, false),
                    BackendMessage::CommandComplete(tag) => {
                        assert_eq!(tag, "COPY 0");
                        break;
                    }
                    _ => {}
                }
            }
            assert!(waiting.closed());
        }
        for (what, mut c) in conns {
            let m = c.recv();
            assert_eq!(sqlstate(&m), "57P01", "{what}");
            assert_eq!(
                message(&m),
                "terminating connection due to administrator command",
                "{what}"
            );
            assert!(c.closed(), "{what} still open");
        }
        let m = silent.recv();
        assert_eq!(sqlstate(&m), "57P01", "waiting for the startup packet");
        assert!(silent.closed());
        if let Some((mut c, mut at)) = streaming {
            // The WAL already queued arrives whole and in order, then the FATAL, then the end.
            let m = loop {
                match c.recv() {
                    BackendMessage::XLogData(x) => {
                        assert_eq!(x.wal_start, at, "XLogData not contiguous");
                        at = at + x.data.len() as u64;
                    }
                    BackendMessage::PrimaryKeepalive(_) => {}
                    other => break other,
                }
            };
            assert_eq!(sqlstate(&m), "57P01", "streaming");
            assert_eq!(
                message(&m),
                "terminating connection due to administrator command",
                "streaming"
            );
            assert!(c.closed(), "streaming still open");
            assert!(
                at < node.wal().flushed(),
                "the catch-up was over before the shutdown"
            );
        }
        eprintln!(
            "shutdown (immediate={immediate}) reached every connection in {:?}",
            t.elapsed()
        );
    }
}

/// A client streaming a catch-up of 16 MiB that has read its first XLogData and then stopped
/// reading, once the walsender has filled everything between them (its queue and both
/// sockets' buffers) and stopped sending: WAL is in flight and the walsender's queue is full.
/// Returns the connection and where its next XLogData starts.
fn streaming_a_catch_up(node: &TestNode) -> (PgConn, Lsn) {
    let start = node.wal().flushed();
    for i in 0..16u8 {
        node.append(8, 128 << 10, i);
    }
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    // A small receive buffer, set before streaming starts, keeps the kernel from taking in
    // tens of MiB on the client's behalf (tcp_rmem may allow 32 MiB).
    let size: libc::c_int = 64 << 10;
    // SAFETY: setsockopt on a socket this test owns, with a pointer to a live c_int.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&c.stream),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &size as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt SO_RCVBUF");
    c.start_replication(start);
    let at = loop {
        match c.recv() {
            BackendMessage::XLogData(x) => {
                assert_eq!(x.wal_start, start);
                break start + x.data.len() as u64;
            }
            BackendMessage::PrimaryKeepalive(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    // The walsender's sent position stops moving once nothing more fits; there is no event
    // for "the socket is full", so the registry's view is read until it holds still.
    let sent = || node.http_get("/status")["replication"][0]["sent_lsn"].clone();
    let mut last = serde_json::Value::Null;
    let mut still = 0;
    wait_until(
        "the walsender to stop sending to a client that does not read",
        || {
            let now = sent();
            if now == last {
                still += 1;
            } else {
                still = 0;
                last = now;
            }
            still >= 10
        },
    );
    (c, at)
}

#[test]
fn fast_shutdown_drains_then_ends_the_copy() {
    let node = TestNode::primary("wal_sender_shutdown_timeout = \"20s\"");
    let start = node.wal().flushed();
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.start_replication(start);
    let end = node.append(50, 20_000, 7);
    // Do not read yet: the walsender must still send everything flushed after shutdown.
    node.start_shutdown(false);
    let mut at = start;
    let mut confirmed = false;
    loop {
        match c.recv() {
            BackendMessage::XLogData(x) => {
                assert_eq!(x.wal_start, at);
                at = at + x.data.len() as u64;
            }
            BackendMessage::PrimaryKeepalive(k) if k.reply_requested => {
                // As pg_receivewal without a slot: write position, flush 0.
                c.reply(at, Lsn::INVALID, false);
                confirmed = true;
            }
            BackendMessage::PrimaryKeepalive(_) => {}
            BackendMessage::CommandComplete(tag) => {
                assert_eq!(tag, "COPY 0");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(confirmed);
    assert_eq!(at, end, "everything flushed was sent before the copy ended");
    assert!(c.closed());
}

#[test]
fn fast_shutdown_does_not_wait_past_its_deadline_for_a_silent_standby() {
    let node = TestNode::primary("wal_sender_shutdown_timeout = \"300ms\"");
    let start = node.wal().flushed();
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.start_replication(start);
    node.append(5, 1000, 1);
    let t = Instant::now();
    node.shutdown(false);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "shutdown did not wait for the standby: {took:?}"
    );
    // The client gets its WAL, an unanswered keepalive and then FATAL 57P01.
    loop {
        match c.recv() {
            BackendMessage::ErrorResponse(f) => {
                assert_eq!(f.get(b'C'), Some("57P01"));
                break;
            }
            BackendMessage::XLogData(_) | BackendMessage::PrimaryKeepalive(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    eprintln!("fast shutdown with a silent standby took {took:?} (deadline 300ms)");
}

#[test]
fn keepalive_then_timeout_for_a_silent_standby() {
    let node = TestNode::primary("wal_sender_timeout = \"600ms\"");
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    let t = Instant::now();
    c.start_replication(node.wal().flushed());
    let m = c.recv();
    assert!(
        matches!(
            m,
            BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
                reply_requested: true,
                ..
            })
        ),
        "{m:?}"
    );
    let ping = t.elapsed();
    assert!(c.closed(), "the walsender did not end a silent connection");
    let gone = t.elapsed();
    assert!(
        ping >= Duration::from_millis(250) && gone >= Duration::from_millis(550),
        "{ping:?} {gone:?}"
    );
}

#[test]
fn max_wal_senders_is_enforced() {
    let node = TestNode::primary("max_wal_senders = 2");
    let _a = PgConn::connect(node.addr(), "u", None).unwrap();
    let _b = PgConn::connect(node.addr(), "u", None).unwrap();
    let err = PgConn::connect(node.addr(), "u", None)
        .err()
        .expect("third connection refused");
    assert_eq!(sqlstate(&err), "53300");
    assert!(message(&err).contains("max_wal_senders (currently 2)"));
}

#[test]
fn authentication_rules_and_passwords() {
    let verifier = make_scram_verifier("secret");
    let node = TestNode::primary(&format!(
        "[users]\nrepl = \"{verifier}\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"bad\"\nmethod = \"reject\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n"
    ));
    PgConn::connect(node.addr(), "repl", Some("secret")).expect("right password");
    assert_eq!(
        sqlstate(
            &PgConn::connect(node.addr(), "repl", Some("wrong"))
                .err()
                .unwrap()
        ),
        "28P01"
    );
    assert_eq!(
        sqlstate(
            &PgConn::connect(node.addr(), "nobody", Some("secret"))
                .err()
                .unwrap()
        ),
        "28P01"
    );
    let e = PgConn::connect(node.addr(), "bad", Some("x"))
        .err()
        .unwrap();
    assert_eq!(sqlstate(&e), "28000");
    assert!(
        message(&e).contains("walserver's hba rules reject replication connection"),
        "{}",
        message(&e)
    );
    // A non-replication connection.
    let mut c = PgConn::raw(node.addr());
    c.send_startup(StartupPacket::startup([
        ("user", "repl"),
        ("database", "postgres"),
    ]));
    assert_eq!(sqlstate(&c.recv()), "0A000");
}

#[test]
fn a_client_that_never_finishes_startup_is_dropped_at_authentication_timeout() {
    let node = TestNode::primary("authentication_timeout = \"300ms\"");
    let mut c = PgConn::raw(node.addr());
    let t = Instant::now();
    assert!(c.closed());
    assert!(t.elapsed() >= Duration::from_millis(250));
}

/// Hostile input costs only its own connection, and a stream beside it goes on.
#[test]
fn bad_input_costs_only_its_connection() {
    let node = TestNode::primary("authentication_timeout = \"2s\"\nmax_wal_senders = 300");
    let start = node.wal().flushed();
    let mut stream = PgConn::connect(node.addr(), "u", None).unwrap();
    stream.start_replication(start);

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\x16\x03\x01garbage garbage garbage".to_vec()),
        (
            "length -1",
            (-1i32)
                .to_be_bytes()
                .into_iter()
                .chain(196608i32.to_be_bytes())
                .collect(),
        ),
        (
            "2 GiB length",
            (i32::MAX)
                .to_be_bytes()
                .into_iter()
                .chain(196608i32.to_be_bytes())
                .collect(),
        ),
        ("startup over 10000 bytes", {
            let mut p = 20_000i32.to_be_bytes().to_vec();
            p.extend(196608i32.to_be_bytes());
            p.extend(vec![b'a'; 19_992]);
            p
        }),
    ];
    for (what, bytes) in cases {
        let mut c = PgConn::raw(node.addr());
        c.send_raw(&bytes);
        // Either an ErrorResponse then close, or a close: never a hang, never a crash.
        let _ = c.try_recv();
        assert!(c.closed(), "{what}: connection not closed");
    }
    // A StartupMessage of protocol 4.0: refused for its version with PostgreSQL 15's text and
    // SQLSTATE (0A000), then closed.
    let mut c = PgConn::raw(node.addr());
    c.send_startup(StartupPacket::Startup {
        protocol: (4, 0),
        params: vec![
            ("user".into(), "u".into()),
            ("replication".into(), "true".into()),
        ],
    });
    let m = c.recv();
    assert_eq!(sqlstate(&m), "0A000", "{m:?}");
    assert_eq!(
        message(&m),
        "unsupported frontend protocol 4.0: server supports 3.0 to 3.0"
    );
    assert!(c.closed());
    // After authentication: a bad length, and an unknown message type mid-copy.
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.send_raw(&[b'Q', 0xff, 0xff, 0xff, 0xff]);
    assert_eq!(sqlstate(&c.recv()), "08P01");
    assert!(c.closed());
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.start_replication(start);
    c.send_raw(&[b'Q', 0, 0, 0, 9, b'X', b'Y', b'Z', b'W', 0]);
    assert_eq!(sqlstate(&c.recv()), "08P01");
    assert!(c.closed());
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.start_replication(start);
    c.send(FrontendMessage::CopyData(bytes::Bytes::from_static(
        b"zzzz",
    )));
    assert_eq!(sqlstate(&c.recv()), "08P01");
    // A message type no protocol version has ('@'), well framed, in the middle of the copy:
    // FATAL protocol_violation, as PostgreSQL's walsender answers it, and the close.
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.start_replication(start);
    c.send_raw(&[b'@', 0, 0, 0, 8, 1, 2, 3, 4]);
    let m = c.recv();
    assert_eq!(sqlstate(&m), "08P01", "{m:?}");
    let BackendMessage::ErrorResponse(f) = &m else {
        unreachable!("sqlstate() accepts only an ErrorResponse")
    };
    assert_eq!(f.get(b'S'), Some("FATAL"), "{m:?}");
    assert_eq!(message(&m), "invalid standby message type \"@\"");
    assert!(
        c.closed(),
        "an unknown message type left the connection open"
    );

    // 200 connections at once, each saying nothing, then leaving.
    let crowd: Vec<_> = (0..200).map(|_| PgConn::raw(node.addr())).collect();
    let end = node.append(20, 10_000, 3);
    let got = stream.receive_until(start, end);
    assert_eq!(
        got.len() as u64,
        end.0 - start.0,
        "the stream beside the bad clients kept going"
    );
    drop(crowd);
    // The server is still healthy.
    assert!(matches!(
        PgConn::connect(node.addr(), "u", None)
            .unwrap()
            .query("IDENTIFY_SYSTEM")[1],
        BackendMessage::DataRow(_)
    ));
}

/// A standby that stops reading costs bounded memory: the walsender reads WAL only while its
/// queue has room.
#[test]
fn a_standby_that_stops_reading_costs_bounded_memory() {
    let node = TestNode::primary("wal_keep_size = \"256MB\"");
    let start = node.wal().flushed();
    for i in 0..32u8 {
        node.append(4, 1 << 20, i);
    }
    let end = node.wal().flushed();
    let before = rss_kib();
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.stream.set_nodelay(true).unwrap();
    c.start_replication(start);
    // Let the walsender fill its queue and the socket buffers, with no reading: wait until
    // the registry reports what it has sent and it stops moving.
    let sent = || -> u64 {
        let v = node.http_get("/status");
        v["replication"][0]["sent_lsn"]
            .as_str()
            .and_then(|s| s.parse::<Lsn>().ok())
            .map_or(0, |l| l.0)
    };
    let mut last = 0;
    let mut stable = 0;
    wait_until(
        "the walsender to stop sending to a client that does not read",
        || {
            let s = sent();
            if s == last && s > start.0 {
                stable += 1;
            } else {
                stable = 0;
                last = s;
            }
            stable >= 20
        },
    );
    let in_flight = last - start.0;
    let grown = rss_kib().saturating_sub(before);
    eprintln!(
        "stalled client: {in_flight} bytes sent of {}; RSS grew by {grown} KiB",
        end.0 - start.0
    );
    assert!(
        in_flight < 64 << 20,
        "the walsender kept sending to a client that does not read: {in_flight}"
    );
    assert!(grown < 64 << 10, "memory grew by {grown} KiB");
    // Reading again, the client gets everything.
    let got = c.receive_until(start, end);
    assert_eq!(got.len() as u64, end.0 - start.0);
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn status_slots_and_metrics() {
    let node = TestNode::primary("");
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.query("CREATE_REPLICATION_SLOT s1 PHYSICAL RESERVE_WAL");
    let start = node.wal().flushed();
    c.send(FrontendMessage::Query(format!(
        "START_REPLICATION SLOT s1 {start}"
    )));
    assert_eq!(c.recv(), BackendMessage::CopyBothResponse);
    let end = node.append(3, 100, 0);
    c.receive_until(start, end);
    c.reply(end, end, false);
    wait_until("status shows the reply", || {
        node.http_get("/status")["replication"][0]["flush_lsn"]
            == serde_json::json!(end.to_string())
    });
    let s = node.http_get("/status");
    assert_eq!(s["role"], "primary");
    assert_eq!(s["wal_format"], "walserver");
    assert_eq!(s["replication"][0]["state"], "streaming");
    assert_eq!(s["replication"][0]["application_name"], "testclient");
    let slots = node.http_get("/slots");
    assert_eq!(slots[0]["slot_name"], "s1");
    assert_eq!(slots[0]["active"], true);
    // The holder's process id, as its BackendKeyData gave it (pg_replication_slots.active_pid).
    let pid = c.client.session().backend_key.expect("BackendKeyData").0;
    assert_eq!(slots[0]["active_pid"], pid);
    assert_eq!(slots[0]["restart_lsn"], serde_json::json!(end.to_string()));
    assert_eq!(slots[0]["wal_status"], "reserved");
    let mut metrics = String::new();
    let mut sock = std::net::TcpStream::connect(node.http_addr).unwrap();
    write!(sock, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    sock.read_to_string(&mut metrics).unwrap();
    assert!(
        metrics.contains(&format!("walserver_flush_lsn_bytes {}", end.0)),
        "{metrics}"
    );
    let _ = BytesMut::new();
}

/// Hot standby feedback ('h') is recorded and shown as pg_stat_replication shows it: the
/// standby's xmin as backend_xmin (with its epoch), the message's send time as reply_time; an
/// xmin of 0 (the standby holds none) clears it, as PostgreSQL clears the walsender's xmin.
#[test]
fn hot_standby_feedback_is_shown_in_status() {
    let node = TestNode::primary("");
    let mut c = PgConn::connect(node.addr(), "u", None).unwrap();
    c.start_replication(node.wal().flushed());
    let feedback = |xmin: u32, xmin_epoch: u32| HotStandbyFeedback {
        send_time: PgTimestamp::now(),
        xmin,
        xmin_epoch,
        catalog_xmin: 0,
        catalog_xmin_epoch: 0,
    };
    let row = || node.http_get("/status")["replication"][0].clone();
    let h = feedback(1234, 7);
    c.send(FrontendMessage::HotStandbyFeedback(h));
    wait_until("status to show the standby's xmin", || {
        row()["backend_xmin"] == 1234
    });
    let r = row();
    assert_eq!(r["backend_xmin_epoch"], 7, "{r}");
    assert_eq!(
        r["reply_time"],
        walsender_actor::status::format_time(h.send_time.to_system_time()),
        "{r}"
    );
    c.send(FrontendMessage::HotStandbyFeedback(feedback(0, 0)));
    wait_until("status to clear the standby's xmin", || {
        row()["backend_xmin"].is_null()
    });
    assert!(row()["backend_xmin_epoch"].is_null());
    // Feedback is only a report: the stream goes on.
    let start = node.wal().flushed();
    let end = node.append(2, 100, 9);
    assert_eq!(c.receive_until(start, end).len() as u64, end.0 - start.0);
}

/// The README's main command: the demo runs a cluster, promotes, restores from its archive, and
/// exits 0.
#[test]
fn the_demo_runs_and_exits_zero() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(["demo", "--seconds", "1"])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("standby2 follows: timeline 2"), "{stdout}");
    assert!(
        stdout.contains("identical to the primary's; the last record"),
        "{stdout}"
    );
    assert!(stdout.contains("| standby1 "), "{stdout}");
    assert!(stdout.contains("quorum"), "{stdout}");
}

/// `walserver bench` runs the `walserver-bench` program; where there is none (neither beside
/// the executable nor on PATH) it fails with the command that builds it. The executable is
/// a hard link in a directory of its own, so nothing stands beside it.
#[test]
fn bench_without_its_program_says_how_to_build_it() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temporary directory");
    let exe = dir.path().join("walserver");
    std::fs::hard_link(env!("CARGO_BIN_EXE_walserver"), &exe).expect("link walserver");
    let out = std::process::Command::new(&exe)
        .args(["bench", "append", "--help"])
        .env("PATH", dir.path())
        .output()
        .expect("run walserver bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("cargo build -p walserver-bench"),
        "no hint on building the load tool: {stderr}"
    );
}

/// DROP_REPLICATION_SLOT on a slot in use: 55006 at once, or with WAIT, the drop happens as
/// soon as its user releases it (woken by the release, not by polling).
#[test]
fn drop_replication_slot_wait_waits_for_the_release() {
    let node = TestNode::primary("");
    let mut user = PgConn::connect(node.addr(), "u", None).unwrap();
    user.query("CREATE_REPLICATION_SLOT s1 PHYSICAL RESERVE_WAL");
    let start = node.wal().flushed();
    user.send(FrontendMessage::Query(format!(
        "START_REPLICATION SLOT s1 {start}"
    )));
    assert_eq!(user.recv(), BackendMessage::CopyBothResponse);
    let mut dropper = PgConn::connect(node.addr(), "u", None).unwrap();
    let out = dropper.query("DROP_REPLICATION_SLOT s1");
    assert_eq!(sqlstate(&out[0]), "55006");
    dropper.send(FrontendMessage::Query(
        "DROP_REPLICATION_SLOT s1 WAIT".into(),
    ));
    // Nothing yet: the slot is still in use.
    dropper
        .stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(dropper.try_recv().is_err(), "dropped a slot in use");
    dropper.stream.set_read_timeout(Some(DEADLINE)).unwrap();
    // The user ends its stream: the slot is released and the drop completes.
    user.send(FrontendMessage::CopyDone);
    assert_eq!(
        dropper.recv(),
        BackendMessage::CommandComplete("DROP_REPLICATION_SLOT".into())
    );
    assert!(matches!(dropper.recv(), BackendMessage::ReadyForQuery(_)));
    assert!(node.wal().slot("s1").is_err());
}

/// The registry hears of a connection (accepted), of its walsender (authenticated) and of its
/// close from two threads: the listener's and the walsender's arbiter. Whatever the order they
/// run in, every authenticated walsender is in pg_stat_replication, and a connection that
/// closed at once leaves nothing behind that a shutdown would wait for.
#[test]
fn every_connection_is_registered_whatever_the_order_of_its_events() {
    let node = TestNode::primary("max_wal_senders = 100");
    // Connections that close at once, before their walsender has done anything. Each counts
    // as in the startup phase from its accept until its walsender has seen the close, and
    // more than 256 of those at once would refuse the next connection: so all must be seen.
    for _ in 0..300 {
        drop(std::net::TcpStream::connect(node.addr()).unwrap());
    }
    wait_until("the closed connections to leave the startup phase", || {
        metrics::scrape(&node).get(r#"walserver_connections{state="authenticating"}"#) == 0.0
    });
    // Walsenders that authenticate at once (trust) and stay.
    let conns: Vec<PgConn> = (0..40)
        .map(|_| PgConn::connect(node.addr(), "u", None).unwrap())
        .collect();
    wait_until("every walsender in pg_stat_replication", || {
        node.http_get("/status")["replication"]
            .as_array()
            .is_some_and(|r| r.len() == conns.len())
    });
    drop(conns);
    let (tx, rx) = std::sync::mpsc::channel();
    let supervisor = node.node.supervisor.clone();
    std::thread::spawn(move || {
        let _ = futures_executor::block_on(
            supervisor.send(supervisor_actor::ShutdownNode { immediate: false }),
        );
        let _ = tx.send(());
    });
    rx.recv_timeout(DEADLINE)
        .expect("the shutdown waited for connections that had closed");
}

/// The admin API bound beyond loopback without a token is refused at start, with a reason.
#[test]
fn a_public_admin_api_without_a_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    walserver_node::init::init_primary(&data, 1 << 20).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(["run", "-c"])
        .arg(format!("data_dir={}", data.display()))
        .args(["-c", "listen=127.0.0.1:0", "-c", "http_listen=0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("http_auth_token"), "{err}");
}

/// With a token, the admin API answers only requests that carry it.
#[test]
fn the_admin_api_checks_its_bearer_token() {
    let node = TestNode::primary("http_auth_token = \"s3cret\"");
    let url = format!("http://{}/status", node.http_addr);
    let status = |token: Option<&str>| {
        let mut req = ureq::get(&url).config().http_status_as_error(false).build();
        if let Some(t) = token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        req.call().unwrap().status().as_u16()
    };
    assert_eq!(status(None), 401);
    assert_eq!(status(Some("wrong")), 401);
    assert_eq!(status(Some("s3cret")), 200);
}
