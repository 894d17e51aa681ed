//! Replication commands and the messages beside simple queries, answered as PostgreSQL 15
//! answers them.

use std::net::SocketAddr;

use crate::common::*;
use crate::compare::{answers, assert_same_answers, error_line};

/// Replication commands PostgreSQL 15 cannot parse, or whose names no slot or parameter has,
/// walserver against a real PostgreSQL 15: the same SQLSTATE and words, and no position (its
/// replication command parser sends none, unlike its SQL parser), the session going on.
#[test]
fn bad_replication_commands_are_answered_as_postgresql_15_answers_them() {
    use protocol_codec::BackendMessage;

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let commands = [
        "IDENTIFY_SYSTEM x",
        "SHOW",
        "SHOW a!",
        "SHOW \"é\" x",
        "SHOW \"\"",
        "SHOW \"wal_segment_size",
        "TIMELINE_HISTORY 0",
        "TIMELINE_HISTORY x",
        "TIMELINE_HISTORY 1 2",
        "START_REPLICATION",
        "START_REPLICATION SLOT 0/0",
        "START_REPLICATION 0/0 TIMELINE",
        "START_REPLICATION 0/0; x",
        "START_REPLICATION SLOT \"\" 0/0",
        "CREATE_REPLICATION_SLOT s",
        "CREATE_REPLICATION_SLOT \"\" PHYSICAL",
        "CREATE_REPLICATION_SLOT s PHYSICAL ()",
        "CREATE_REPLICATION_SLOT s PHYSICAL (TWO_PHASE)",
        "CREATE_REPLICATION_SLOT s PHYSICAL (RESERVE_WAL maybe)",
        "CREATE_REPLICATION_SLOT s PHYSICAL (RESERVE_WAL, RESERVE_WAL)",
        "CREATE_REPLICATION_SLOT s PHYSICAL TWO_PHASE",
        "DROP_REPLICATION_SLOT \"\"",
        "DROP_REPLICATION_SLOT \"s",
        "DROP_REPLICATION_SLOT 's",
        "DROP_REPLICATION_SLOT s NOW",
    ];
    let run = |addr: SocketAddr, user: &str| -> Vec<String> {
        let mut c = PgConn::connect(addr, user, None).expect("connect");
        let mut out = Vec::new();
        for q in commands {
            c.send(protocol_codec::FrontendMessage::Query(q.into()));
            out.push(q.to_string());
            out.extend(answers(&mut c, &|m| match m {
                BackendMessage::ErrorResponse(f) => Some(format!(
                    "{} POSITION {}",
                    error_line(f),
                    f.get(b'P').unwrap_or("-")
                )),
                BackendMessage::ReadyForQuery(_) => Some("ReadyForQuery".into()),
                _ => None,
            }));
        }
        out
    };
    assert_same_answers(&run, pg.addr(), node.addr());
}

/// Messages of the protocol beside the simple query, walserver against a real PostgreSQL 15:
/// the extended query protocol is refused with an ERROR and everything up to the client's Sync
/// skipped (a query in between included), a function call is refused, a Flush or Sync alone is
/// harmless, and an unknown message type ends the connection with PostgreSQL's words.
#[test]
fn messages_beside_simple_queries_are_answered_as_postgresql_15_answers_them() {
    use bytes::Bytes;
    use protocol_codec::{BackendMessage, FrontendMessage};

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let extended = |tag: u8, body: &'static [u8]| FrontendMessage::ExtendedQuery {
        tag,
        body: Bytes::from_static(body),
    };
    let steps: Vec<(&str, Vec<FrontendMessage>)> = vec![
        (
            "Parse, Bind, Execute, a query, Sync",
            vec![
                extended(b'P', b"\0IDENTIFY_SYSTEM\0\0\0"),
                extended(b'B', b"\0\0\0\0\0\0\0\0"),
                extended(b'E', b"\0\0\0\0\0"),
                FrontendMessage::Query("IDENTIFY_SYSTEM".into()),
                FrontendMessage::Sync,
            ],
        ),
        (
            "a function call",
            vec![FrontendMessage::FunctionCall(Bytes::from_static(
                b"\0\0\0\x01\0\0\0\0\0\0",
            ))],
        ),
        (
            "Flush, then a query",
            vec![
                FrontendMessage::Flush,
                FrontendMessage::Query("SHOW data_directory_mode".into()),
            ],
        ),
        ("Sync alone", vec![FrontendMessage::Sync]),
        ("an unknown type", vec![extended(b'z', b"")]),
    ];
    let run = |addr: SocketAddr, user: &str| -> Vec<String> {
        let mut c = PgConn::connect(addr, user, None).expect("connect");
        let mut out = Vec::new();
        for (what, messages) in &steps {
            out.push(what.to_string());
            for m in messages {
                c.send(m.clone());
            }
            out.extend(answers(&mut c, &|m| match m {
                BackendMessage::ErrorResponse(f) => Some(error_line(f)),
                BackendMessage::RowDescription(_) => None,
                m => Some(format!("{m:?}")),
            }));
        }
        out
    };
    assert_same_answers(&run, pg.addr(), node.addr());
}
