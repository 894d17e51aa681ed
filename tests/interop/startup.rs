//! The startup phase beside a real PostgreSQL 15: what it refuses, and how a client's
//! parameters are read and reported back.

use std::net::SocketAddr;

use crate::common::*;
use crate::compare::{answer_line, answers, error_line};

/// The startup phase's refusals, walserver against a real PostgreSQL 15: the same bytes get
/// the same FATAL (severity, SQLSTATE and text), then the close. A StartupMessage of protocol
/// 4.0; eight bytes of a code that is no request and no version 3; a second SSLRequest after
/// the first was answered `N`. (A packet of an impossible length differs on purpose:
/// PostgreSQL closes without a word, walserver says why first.)
#[test]
fn the_startup_phase_refuses_as_postgresql_15_does() {
    use protocol_codec::{BackendMessage, StartupPacket};

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let encode = |p: StartupPacket| {
        let mut b = bytes::BytesMut::new();
        p.encode(&mut b).expect("encodes");
        b.to_vec()
    };
    let v4 = encode(StartupPacket::Startup {
        protocol: (4, 0),
        params: vec![
            ("user".into(), "postgres".into()),
            ("replication".into(), "true".into()),
        ],
    });
    let ssl_request = encode(StartupPacket::SslRequest);
    let maybe = encode(StartupPacket::startup([
        ("user", "postgres"),
        ("replication", "maybe"),
    ]));
    let cases: [(&str, Vec<Vec<u8>>); 4] = [
        ("a StartupMessage of protocol 4.0", vec![v4]),
        (
            "eight bytes of no known code",
            vec![vec![0, 0, 0, 8, 0x00, 0xbc, 0x61, 0x4e]],
        ),
        (
            "a second SSLRequest",
            vec![ssl_request.clone(), ssl_request],
        ),
        ("replication=maybe", vec![maybe]),
    ];
    let answer = |addr: SocketAddr, sends: &[Vec<u8>]| -> (String, bool) {
        let mut c = PgConn::raw(addr);
        for (i, bytes) in sends.iter().enumerate() {
            c.send_raw(bytes);
            if i + 1 < sends.len() {
                // An SSLRequest's answer is one byte, outside the message framing.
                let mut b = [0u8; 1];
                std::io::Read::read_exact(&mut c.stream, &mut b).expect("the SSL answer");
                assert_eq!(b[0], b'N', "no TLS on either server");
            }
        }
        let m = c.recv();
        let BackendMessage::ErrorResponse(f) = &m else {
            panic!("not an error: {m:?}")
        };
        (error_line(f), c.closed())
    };
    for (what, sends) in &cases {
        let theirs = answer(pg.addr(), sends);
        let ours = answer(node.addr(), sends);
        eprintln!("{what}: {theirs:?}");
        assert!(theirs.1, "{what}: PostgreSQL closed the connection");
        assert_eq!(ours, theirs, "{what}: walserver against PostgreSQL 15");
    }
}

/// The names to `SHOW` after a startup packet with these parameters.
type ShowsFor = dyn Fn(&[(&str, &str)]) -> Vec<String>;

/// Each case's startup packet (`user`, `replication=true`, then the case's parameters) sent to
/// PostgreSQL (as `postgres`) and to walserver (as `u`), then, if the server took it, `SHOW`
/// of each name `shown` gives for the case; every message `name` names compared. Returns the
/// cases whose answers differ.
fn startup_cases_differ<'a>(
    pg: SocketAddr,
    node: SocketAddr,
    cases: &[(&'a str, Vec<(&str, &str)>)],
    shown: &ShowsFor,
    name: &dyn Fn(&protocol_codec::BackendMessage) -> Option<String>,
) -> Vec<&'a str> {
    let answer = |addr: SocketAddr, user: &str, params: &[(&str, &str)]| -> Vec<String> {
        let mut c = PgConn::raw(addr);
        let mut all = vec![("user", user), ("replication", "true")];
        all.extend(params.iter().cloned());
        c.send_startup(protocol_codec::StartupPacket::startup(all));
        let mut out = answers(&mut c, name);
        if out.last().map(String::as_str) == Some("closed") {
            return out;
        }
        for n in shown(params) {
            let q = format!("SHOW {n}");
            c.send(protocol_codec::FrontendMessage::Query(q.clone()));
            out.push(q);
            out.extend(answers(&mut c, name));
        }
        out
    };
    let mut differ = Vec::new();
    for (what, params) in cases {
        let theirs = answer(pg, "postgres", params);
        let ours = answer(node, "u", params);
        eprintln!("{what}:\n  pg: {theirs:?}\n  ws: {ours:?}");
        assert!(
            theirs.iter().any(|m| m.starts_with("Authentication")),
            "{what}: PostgreSQL authenticated the client first"
        );
        if ours != theirs {
            differ.push(*what);
        }
    }
    differ
}

/// The configuration parameters a client sets when it connects (the startup packet's
/// `options`, as `PGOPTIONS` or `options=` in a conninfo passes them, and the other startup
/// parameters), walserver against a real PostgreSQL 15: the same packets get the same answer,
/// the FATAL after AuthenticationOk for a parameter that is unknown, one a client may not set,
/// a malformed `options` or a bad `wal_sender_timeout`, and otherwise the same SHOW answers
/// (the client's `wal_sender_timeout` in PostgreSQL's form, its `application_name`, a custom
/// parameter, the primary's role). Then a client that set `wal_sender_timeout=1s` on a node whose own is a minute
/// is ended for its silence by its own timeout.
#[test]
fn client_parameters_are_read_as_postgresql_15_reads_them() {
    use protocol_codec::{BackendMessage, StartupPacket};
    use std::time::{Duration, Instant};

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("wal_sender_timeout = \"1min\"");
    let name = |m: &BackendMessage| match m {
        BackendMessage::ParameterStatus { .. } => None,
        m => answer_line(m),
    };
    let shown = |_: &[(&str, &str)]| {
        [
            "wal_sender_timeout",
            "application_name",
            "my.setting",
            "tcp_keepalives_idle",
            "tcp_keepalives_interval",
            "tcp_keepalives_count",
            "tcp_user_timeout",
            "in_hot_standby",
            "transaction_read_only",
            "default_transaction_read_only",
        ]
        .map(String::from)
        .to_vec()
    };
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "options setting wal_sender_timeout, application_name and a custom parameter",
            vec![(
                "options",
                "-c wal_sender_timeout=1500 --application-name=from\\ options -cmy.setting=on",
            )],
        ),
        (
            "application_name in the packet after one in options",
            vec![
                (
                    "options",
                    "-c application_name=opt -c my.setting=1 -c my.setting=2",
                ),
                ("application_name", "param"),
            ],
        ),
        (
            "wal_sender_timeout as a startup parameter, in hours",
            vec![("wal_sender_timeout", "2h"), ("my.setting", "x")],
        ),
        (
            "parameters walserver has no use for",
            vec![
                (
                    "options",
                    "-c statement_timeout=0 -c DateStyle=ISO -c work_mem=1MB",
                ),
                ("TimeZone", "UTC"),
                ("extra_float_digits", "3"),
                ("my.setting", "1"),
            ],
        ),
        (
            "the connection's keepalive timing",
            vec![(
                "options",
                "-c tcp_keepalives_idle=1500ms -c tcp_keepalives_interval=1min -c tcp_keepalives_count=3 -c tcp_user_timeout=2s",
            )],
        ),
        (
            "a keepalive count with a unit",
            vec![("options", "-c tcp_keepalives_count=3s")],
        ),
        (
            "a negative keepalive idle time",
            vec![("tcp_keepalives_idle", "-3")],
        ),
        ("an unknown parameter", vec![("options", "-c nosuch=1")]),
        ("an unknown startup parameter", vec![("nosuch", "1")]),
        (
            "a parameter read at server start",
            vec![("options", "-c shared_buffers=1MB")],
        ),
        (
            "a parameter of the configuration file",
            vec![("options", "-c wal_keep_size=1")],
        ),
        ("a parameter fixed at build", vec![("server_version", "1")]),
        ("an unknown switch", vec![("options", "-x")]),
        (
            "a word that is no switch",
            vec![("options", "-c wal_sender_timeout=3s extra")],
        ),
        (
            "a switch without a value",
            vec![("options", "-c wal_sender_timeout")],
        ),
        ("a bad custom name", vec![("options", "-c my..setting=1")]),
        (
            "a wal_sender_timeout that is no number",
            vec![("options", "-c wal_sender_timeout=abc")],
        ),
        (
            "a wal_sender_timeout of an unknown unit",
            vec![("options", "-c wal_sender_timeout=5x")],
        ),
        (
            "a negative wal_sender_timeout",
            vec![("options", "-c wal_sender_timeout=-5")],
        ),
        (
            "a wal_sender_timeout beyond an integer",
            vec![("options", "-c wal_sender_timeout=9999999999")],
        ),
    ];
    let differ = startup_cases_differ(pg.addr(), node.addr(), &cases, &shown, &name);
    assert!(
        differ.is_empty(),
        "walserver differs from PostgreSQL 15 on: {differ:?}"
    );

    // The client's timeout is the one that holds: silent while streaming, it gets a keepalive
    // asking for a reply, then the close, a second or so later rather than a minute.
    let mut c = PgConn::raw(node.addr());
    c.send_startup(StartupPacket::startup([
        ("user", "u"),
        ("replication", "true"),
        ("options", "-c wal_sender_timeout=1s"),
    ]));
    c.until_ready();
    let start = c.client.identify_system().expect("IDENTIFY_SYSTEM").xlogpos;
    c.start_replication(start);
    let since = Instant::now();
    let out = answers(&mut c, &|m| match m {
        BackendMessage::XLogData(_) => None,
        BackendMessage::PrimaryKeepalive(k) => {
            Some(format!("keepalive, reply requested: {}", k.reply_requested))
        }
        m => Some(format!("{m:?}")),
    });
    let took = since.elapsed();
    assert_eq!(out, ["keepalive, reply requested: true", "closed"]);
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(20),
        "closed after {took:?}"
    );
}

/// The values a client sets when it connects, read and reported back as PostgreSQL 15 reads and
/// reports them: the ParameterStatus of the greeting (a walsender for physical replication has
/// the encoding `SQL_ASCII`; a client's `client_encoding`, `DateStyle`, `IntervalStyle`,
/// `TimeZone`, `standard_conforming_strings`, `default_transaction_read_only` and
/// `application_name` in PostgreSQL's form), SHOW of what the client set (booleans as on/off,
/// sizes and times in their largest whole unit, floating-point values as C's `%g`, enum
/// aliases), and the FATAL for a value PostgreSQL refuses, walserver against a real PostgreSQL
/// 15 with the same packets.
#[test]
fn client_values_are_reported_as_postgresql_15_reports_them() {
    use protocol_codec::BackendMessage;

    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default().conf("timezone = 'Etc/UTC'"),
    );
    let node = TestNode::primary("");
    let name = |m: &BackendMessage| match m {
        // Not the same for both: the server's version and the user's name.
        BackendMessage::ParameterStatus { name, .. }
            if name == "server_version" || name == "session_authorization" =>
        {
            None
        }
        BackendMessage::ParameterStatus { name, value } => Some(format!("{name}={value}")),
        // PostgreSQL's LOG lines, which `client_min_messages=debug` lets through to the client.
        BackendMessage::NoticeResponse(_) => None,
        // SHOW's column is the parameter's name as PostgreSQL spells it.
        BackendMessage::RowDescription(fields) => Some(format!(
            "columns {:?}",
            fields.iter().map(|f| &f.name).collect::<Vec<_>>()
        )),
        m => answer_line(m),
    };
    // SHOW of what the greeting reports, then of every parameter the case sets.
    let shown = |params: &[(&str, &str)]| {
        let mut shown: Vec<String> = [
            "client_encoding",
            "server_encoding",
            "DateStyle",
            "TimeZone",
            "IntervalStyle",
            "standard_conforming_strings",
            "application_name",
            "is_superuser",
        ]
        .map(String::from)
        .to_vec();
        for (n, v) in params {
            if *n == "options" {
                // What each switch sets (`-c name=value`, `-S 4096` is work_mem, ...); if
                // walserver reads a switch as the wrong parameter, PostgreSQL's SHOW of that
                // parameter differs.
                let set = protocol_codec::client_settings::split_options(v).unwrap_or_default();
                shown.extend(set.into_iter().map(|(n, _)| n));
            } else {
                shown.push(n.to_string());
            }
        }
        shown
    };
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("nothing set", vec![]),
        ("an encoding's alias", vec![("client_encoding", "latin1")]),
        ("an encoding's other spelling", vec![("client_encoding", "utf-8")]),
        ("UNICODE, kept for old drivers", vec![("client_encoding", "UNICODE")]),
        ("no such encoding", vec![("client_encoding", "foo")]),
        ("libpq's auto, which only libpq reads", vec![("client_encoding", "auto")]),
        ("a date style", vec![("DateStyle", "sql, dmy")]),
        ("German, which sets its order", vec![("DateStyle", "German")]),
        (
            "a date style over the one before it",
            vec![("options", "-c DateStyle=German"), ("DateStyle", "ymd")],
        ),
        ("conflicting date styles", vec![("DateStyle", "iso,sql")]),
        ("an unknown date style", vec![("DateStyle", "bogus")]),
        ("a date style without commas", vec![("DateStyle", "ISO MDY")]),
        ("a time zone", vec![("TimeZone", "Europe/Berlin")]),
        ("an interval style in capitals", vec![("IntervalStyle", "ISO_8601")]),
        ("an unknown interval style", vec![("IntervalStyle", "x")]),
        (
            "booleans and application_name",
            vec![
                ("standard_conforming_strings", "of"),
                ("default_transaction_read_only", "TRUE"),
                ("application_name", "é x"),
            ],
        ),
        ("not a boolean", vec![("enable_seqscan", "maybe")]),
        (
            "sizes, times and numbers",
            vec![(
                "options",
                "-c work_mem=4096 -c temp_buffers=100 -c statement_timeout=60000 -c vacuum_cost_delay=1.5ms -c seq_page_cost=1.23456789 -c extra_float_digits=0x3 -c cursor_tuple_fraction=1e-5",
            )],
        ),
        (
            "enum aliases",
            vec![(
                "options",
                "-c synchronous_commit=TRUE -c wal_compression=on -c client_min_messages=debug",
            )],
        ),
        (
            "the server's other switches",
            vec![(
                "options",
                "-S 4096 -e -fs -tpa -d 3 -T -W 0 -- ",
            )],
        ),
        ("a switch a client may not give", vec![("options", "-B 128")]),
        ("a switch of the configuration file", vec![("options", "-F")]),
        ("switches clustered", vec![("options", "-eP -ftx")]),
        ("an unknown -f letter", vec![("options", "-fx")]),
        ("an unknown -t name", vec![("options", "-tzz")]),
        ("a debug level beyond 5", vec![("options", "-d 6")]),
        ("a word after --", vec![("options", "-e -- extra")]),
        ("an integer out of range", vec![("extra_float_digits", "9")]),
        ("a size below its least", vec![("temp_buffers", "1kB")]),
        ("a size in a unit not spelt so", vec![("work_mem", "5KB")]),
        ("a time out of range", vec![("vacuum_cost_delay", "200")]),
        ("a negative cost", vec![("seq_page_cost", "-1")]),
        ("a number beyond a double", vec![("statement_timeout", "1e400")]),
    ];
    let differ = startup_cases_differ(pg.addr(), node.addr(), &cases, &shown, &name);
    assert!(
        differ.is_empty(),
        "walserver differs from PostgreSQL 15 on: {differ:?}"
    );
}
