//! The streaming sub-protocol and what ends or refuses a stream, walserver beside a real
//! PostgreSQL 15: client actions in the copy, timeouts, a slot in use, removed WAL,
//! `max_wal_senders`.

use std::net::SocketAddr;

use protocol_codec::auth::make_scram_verifier;
use wal_storage::Lsn;

use crate::common::*;
use crate::compare::{answers, assert_same_answers, auth_start, error_line};

/// What a server answers, in the streaming sub-protocol, to what `act` does right after
/// START_REPLICATION at its current end: every message but WAL and keepalives (an error as its
/// severity, SQLSTATE and text), up to ReadyForQuery, or `closed` when the server closes.
fn copy_answer(addr: SocketAddr, user: &str, act: &dyn Fn(&mut PgConn)) -> Vec<String> {
    use protocol_codec::BackendMessage;
    let mut c = PgConn::connect(addr, user, None).expect("connect");
    let start = c.client.identify_system().expect("IDENTIFY_SYSTEM").xlogpos;
    c.start_replication(start);
    act(&mut c);
    answers(&mut c, &|m| match m {
        BackendMessage::XLogData(_) | BackendMessage::PrimaryKeepalive(_) => None,
        BackendMessage::ErrorResponse(f) => Some(error_line(f)),
        m => Some(format!("{m:?}")),
    })
}

/// The streaming sub-protocol, walserver against a real PostgreSQL 15: the same client actions
/// right after START_REPLICATION get the same answers (CopyDone at once, after a status update
/// or after hot-standby feedback; a query, a CopyFail, or a Terminate in the middle of the
/// copy), and a status update asking for a reply gets a keepalive from both.
#[test]
fn the_streaming_sub_protocol_answers_as_postgresql_15_does() {
    use protocol_codec::messages::{HotStandbyFeedback, PrimaryKeepalive, StandbyStatusUpdate};
    use protocol_codec::{BackendMessage, FrontendMessage};
    use wal_types::PgTimestamp;

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let status = |reply_requested| {
        FrontendMessage::StandbyStatusUpdate(StandbyStatusUpdate {
            write: Lsn::INVALID,
            flush: Lsn::INVALID,
            apply: Lsn::INVALID,
            send_time: PgTimestamp::now(),
            reply_requested,
        })
    };
    let feedback = FrontendMessage::HotStandbyFeedback(HotStandbyFeedback {
        send_time: PgTimestamp::now(),
        xmin: 0,
        xmin_epoch: 0,
        catalog_xmin: 0,
        catalog_xmin_epoch: 0,
    });
    type Act = Box<dyn Fn(&mut PgConn)>;
    let cases: Vec<(&str, Act)> = vec![
        ("CopyDone", Box::new(|c| c.send(FrontendMessage::CopyDone))),
        (
            "a status update, then CopyDone",
            Box::new(move |c| {
                c.send(status(false));
                c.send(FrontendMessage::CopyDone);
            }),
        ),
        (
            "hot-standby feedback, then CopyDone",
            Box::new(move |c| {
                c.send(feedback.clone());
                c.send(FrontendMessage::CopyDone);
            }),
        ),
        (
            "a status update asking for a reply: a keepalive, then CopyDone",
            Box::new(move |c| {
                c.send(status(true));
                loop {
                    match c.recv() {
                        BackendMessage::PrimaryKeepalive(PrimaryKeepalive { .. }) => break,
                        BackendMessage::XLogData(_) => {}
                        other => panic!("before the keepalive: {other:?}"),
                    }
                }
                c.send(FrontendMessage::CopyDone);
            }),
        ),
        (
            "a query during the copy",
            Box::new(|c| c.send(FrontendMessage::Query("IDENTIFY_SYSTEM".into()))),
        ),
        (
            "CopyFail",
            Box::new(|c| c.send(FrontendMessage::CopyFail("giving up".into()))),
        ),
        (
            "Terminate",
            Box::new(|c| c.send(FrontendMessage::Terminate)),
        ),
    ];
    for (what, act) in &cases {
        let theirs = copy_answer(pg.addr(), "postgres", act.as_ref());
        let ours = copy_answer(node.addr(), "u", act.as_ref());
        eprintln!("{what}: {theirs:?}");
        assert_eq!(ours, theirs, "{what}: walserver against PostgreSQL 15");
    }
}

/// The timeouts, walserver against a real PostgreSQL 15, both with `authentication_timeout`
/// and `wal_sender_timeout` at one second: what a client that falls silent receives, and that
/// neither server ends the connection before its timeout. A client silent before its startup
/// packet is closed without a word by both. A client silent while streaming gets one
/// keepalive asking for a reply (at half the timeout), then the close, from both. A client
/// silent in the middle of authentication differs on purpose: PostgreSQL closes without a
/// word (its FATAL goes to its log only), walserver sends that FATAL first, so that the
/// client can say why.
#[test]
fn timeouts_end_connections_as_postgresql_15_does() {
    use protocol_codec::{AuthRequest, BackendMessage};
    use std::time::{Duration, Instant};

    let timeout = Duration::from_secs(1);
    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default()
            .conf("authentication_timeout = '1s'")
            .conf("wal_sender_timeout = '1s'")
            .hba("host replication repl 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "secret", "scram-sha-256");
    let node = TestNode::primary(&format!(
        "authentication_timeout = \"1s\"\nwal_sender_timeout = \"1s\"\n\
         [users]\nrepl = \"{}\"\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"repl\"\nmethod = \"scram-sha-256\"\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"trust\"\n",
        make_scram_verifier("secret")
    ));
    // Everything a silent client receives until the close (WAL aside), and how long after
    // its last step the close came.
    let until_closed = |c: &mut PgConn| -> (Vec<String>, Duration) {
        let since = Instant::now();
        let out = answers(c, &|m| match m {
            BackendMessage::XLogData(_) => None,
            BackendMessage::PrimaryKeepalive(k) => {
                Some(format!("keepalive, reply requested: {}", k.reply_requested))
            }
            BackendMessage::ErrorResponse(f) => Some(error_line(f)),
            m => Some(format!("{m:?}")),
        });
        (out, since.elapsed())
    };

    let before_startup = |addr| until_closed(&mut PgConn::raw(addr));
    let mid_authentication = |addr| {
        let mut c = auth_start(addr, "repl");
        match c.recv() {
            BackendMessage::Authentication(AuthRequest::Sasl { .. }) => {}
            other => panic!("not a SASL request: {other:?}"),
        }
        until_closed(&mut c)
    };
    let streaming = |addr, user| {
        let mut c = PgConn::connect(addr, user, None).expect("connect");
        let start = c.client.identify_system().expect("IDENTIFY_SYSTEM").xlogpos;
        c.start_replication(start);
        until_closed(&mut c)
    };

    let mut took = Vec::new();
    let theirs = before_startup(pg.addr());
    let ours = before_startup(node.addr());
    eprintln!("silent before the startup packet: {theirs:?} {ours:?}");
    assert_eq!(theirs.0, ["closed"]);
    assert_eq!(ours.0, theirs.0);
    took.extend([("before the startup packet", theirs.1, ours.1)]);

    let theirs = mid_authentication(pg.addr());
    let ours = mid_authentication(node.addr());
    eprintln!("silent in authentication: {theirs:?} {ours:?}");
    assert_eq!(theirs.0, ["closed"]);
    assert_eq!(
        ours.0,
        [
            "FATAL 57014 canceling authentication due to timeout",
            "closed"
        ]
    );
    took.extend([("in authentication", theirs.1, ours.1)]);

    let theirs = streaming(pg.addr(), "postgres");
    let ours = streaming(node.addr(), "u");
    eprintln!("silent while streaming: {theirs:?} {ours:?}");
    assert_eq!(theirs.0, ["keepalive, reply requested: true", "closed"]);
    assert_eq!(ours.0, theirs.0);
    took.extend([("while streaming", theirs.1, ours.1)]);

    // A timeout may end a connection late on a busy machine, never early. Each measurement
    // starts once the client's last step is done, a little after the server's clock started,
    // hence the margin.
    for (what, pg_took, ws_took) in took {
        assert!(
            pg_took >= timeout.mul_f32(0.8),
            "PostgreSQL, silent {what}: closed after {pg_took:?}"
        );
        assert!(
            ws_took >= timeout.mul_f32(0.8),
            "walserver, silent {what}: closed after {ws_took:?}"
        );
    }
}

/// A replication slot in use, walserver against a real PostgreSQL 15: while one connection
/// streams from slot `s`, another gets the same answers to streaming from it, dropping it,
/// creating it again and reading it; then `DROP_REPLICATION_SLOT s WAIT` waits until the
/// first connection ends its copy and drops the slot. The holder's process id in the texts is
/// written `PID <holder>`: each server names its own, the one its BackendKeyData gave.
#[test]
fn a_slot_in_use_is_refused_as_postgresql_15_does() {
    use protocol_codec::BackendMessage;

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let run = |addr: SocketAddr, user: &str| -> Vec<String> {
        let mut holder = PgConn::connect(addr, user, None).expect("connect");
        let pid = holder
            .client
            .session()
            .backend_key
            .expect("BackendKeyData")
            .0;
        let start = holder
            .client
            .identify_system()
            .expect("IDENTIFY_SYSTEM")
            .xlogpos;
        holder.query("CREATE_REPLICATION_SLOT s PHYSICAL RESERVE_WAL");
        holder.send(protocol_codec::FrontendMessage::Query(format!(
            "START_REPLICATION SLOT s PHYSICAL {start}"
        )));
        match holder.recv() {
            BackendMessage::CopyBothResponse => {}
            other => panic!("not CopyBothResponse: {other:?}"),
        }
        let name = |m: &BackendMessage| match m {
            BackendMessage::ErrorResponse(f) => {
                Some(error_line(f).replace(&format!("PID {pid}"), "PID <holder>"))
            }
            BackendMessage::RowDescription(_) | BackendMessage::DataRow(_) => None,
            m => Some(format!("{m:?}")),
        };
        let mut other = PgConn::connect(addr, user, None).expect("connect");
        let mut out = Vec::new();
        for q in [
            format!("START_REPLICATION SLOT s PHYSICAL {start}"),
            "DROP_REPLICATION_SLOT s".to_string(),
            "CREATE_REPLICATION_SLOT s PHYSICAL".to_string(),
            "READ_REPLICATION_SLOT s".to_string(),
        ] {
            other.send(protocol_codec::FrontendMessage::Query(q.clone()));
            let q = q.replace(&start.to_string(), "<start>");
            out.push(format!("{q}: {:?}", answers(&mut other, &name)));
        }
        other.send(protocol_codec::FrontendMessage::Query(
            "DROP_REPLICATION_SLOT s WAIT".into(),
        ));
        holder.send(protocol_codec::FrontendMessage::CopyDone);
        out.push(format!(
            "holder's CopyDone: {:?}",
            answers(&mut holder, &|m| match m {
                BackendMessage::XLogData(_) | BackendMessage::PrimaryKeepalive(_) => None,
                m => name(m),
            })
        ));
        out.push(format!(
            "DROP_REPLICATION_SLOT s WAIT: {:?}",
            answers(&mut other, &name)
        ));
        other.send(protocol_codec::FrontendMessage::Query(
            "READ_REPLICATION_SLOT s".into(),
        ));
        out.push(format!(
            "READ_REPLICATION_SLOT s after: {:?}",
            answers(&mut other, &|m| match m {
                BackendMessage::DataRow(r) => Some(format!("{r:?}")),
                m => name(m),
            })
        ));
        out
    };
    assert_same_answers(&run, pg.addr(), node.addr());
}

/// Streaming from WAL that is gone, walserver against a real PostgreSQL 15: both removed the
/// first segments (a checkpoint after a few segment switches on PostgreSQL, retention with
/// `wal_keep_size = 0` on walserver), and START_REPLICATION from their first WAL position gets
/// the same answer from both. Segment file names are written `<segment>`: the two servers'
/// segment sizes differ.
#[test]
fn streaming_from_removed_wal_is_refused_as_postgresql_15_does() {
    use protocol_codec::{BackendMessage, FrontendMessage};

    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default().conf("wal_keep_size = 0"),
    );
    pg.psql("CREATE TABLE t (x int)");
    for _ in 0..3 {
        pg.psql("INSERT INTO t VALUES (1)");
        pg.psql("SELECT pg_switch_wal()");
    }
    pg.psql("CHECKPOINT");
    let seg = 1 << 20;
    let node = TestNode::primary_with_segments(seg, "wal_keep_size = 0\n");
    let first = node.wal().flushed();
    for i in 0..4 {
        node.append(4, (seg / 4) as usize, i);
    }
    node.wal().run_retention().expect("retention");
    let answer = |addr: SocketAddr, user: &str, start: Lsn| {
        let mut c = PgConn::connect(addr, user, None).expect("connect");
        c.send(FrontendMessage::Query(format!("START_REPLICATION {start}")));
        answers(&mut c, &|m| match m {
            BackendMessage::XLogData(_) | BackendMessage::PrimaryKeepalive(_) => None,
            BackendMessage::ErrorResponse(f) => {
                let line = error_line(f);
                Some(match line.find("segment ") {
                    Some(i) => format!("{}segment <segment>{}", &line[..i], &line[i + 32..]),
                    None => line,
                })
            }
            m => Some(format!("{m:?}")),
        })
    };
    let theirs = answer(pg.addr(), "postgres", Lsn(0x100_0000));
    let ours = answer(node.addr(), "u", first);
    eprintln!("pg: {theirs:?}\nws: {ours:?}");
    assert_eq!(ours, theirs);
}

/// `max_wal_senders` reached, walserver against a real PostgreSQL 15, both at one: while one
/// connection is open, the next is refused with the same FATAL by both; once the first has
/// gone, a new one is let in by both.
#[test]
fn max_wal_senders_refuses_as_postgresql_15_does() {
    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default().conf("max_wal_senders = 1"),
    );
    let node = TestNode::primary("max_wal_senders = 1\n");
    let run = |addr: SocketAddr, user: &str| -> Vec<String> {
        let first = PgConn::connect(addr, user, None).expect("the first connection");
        let refused = match PgConn::connect(addr, user, None) {
            Ok(_) => "let in".to_string(),
            Err(m) => match m {
                protocol_codec::BackendMessage::ErrorResponse(f) => error_line(&f),
                other => format!("{other:?}"),
            },
        };
        first.client.close();
        // The first connection's slot is free once its server side has seen the close;
        // a new attempt is let in from then on (the deadline bounds the wait).
        let mut again = String::new();
        wait_until("a connection to be let in after the first one left", || {
            again = match PgConn::connect(addr, user, None) {
                Ok(_) => "let in".to_string(),
                Err(_) => "refused".to_string(),
            };
            again == "let in"
        });
        vec![refused, again]
    };
    let theirs = run(pg.addr(), "postgres");
    let ours = run(node.addr(), "u");
    eprintln!("pg: {theirs:?}\nws: {ours:?}");
    assert_eq!(ours, theirs);
}
