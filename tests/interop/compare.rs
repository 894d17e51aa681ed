//! How the side-by-side tests read what a server answers, so that walserver's answers and a
//! real PostgreSQL 15's compare line by line.

use std::net::SocketAddr;

use crate::common::*;

/// An ErrorResponse as the side-by-side tests compare it: severity, SQLSTATE and text.
pub(crate) fn error_line(f: &protocol_codec::ErrorFields) -> String {
    format!(
        "{} {} {}",
        f.get(b'S').unwrap_or("?"),
        f.get(b'C').unwrap_or("?"),
        f.get(b'M').unwrap_or("?")
    )
}

/// What a server sends until ReadyForQuery (included) or its close (`closed`), each message
/// as `name` names it, those it names `None` left out.
pub(crate) fn answers(
    c: &mut PgConn,
    name: &dyn Fn(&protocol_codec::BackendMessage) -> Option<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        match c.try_recv() {
            Ok(m) => {
                out.extend(name(&m));
                if matches!(m, protocol_codec::BackendMessage::ReadyForQuery(_)) {
                    return out;
                }
            }
            Err(_) => {
                assert!(c.closed(), "neither a message nor the close: {out:?}");
                out.push("closed".into());
                return out;
            }
        }
    }
}

/// A replication connection's StartupMessage for `user`, sent.
pub(crate) fn auth_start(addr: SocketAddr, user: &str) -> PgConn {
    let mut c = PgConn::raw(addr);
    c.send_startup(protocol_codec::StartupPacket::startup([
        ("user", user),
        ("replication", "true"),
    ]));
    c
}

/// Runs each case against PostgreSQL and walserver (`answer` gives what a server ends it
/// with) and fails naming every case where the two differ, after printing all of them.
pub(crate) fn side_by_side<A>(
    cases: &[(&str, &str, A)],
    answer: &dyn Fn(SocketAddr, &str, &A) -> Vec<String>,
    pg: SocketAddr,
    ws: SocketAddr,
) {
    let mut differ = Vec::new();
    for (what, user, act) in cases {
        let theirs = answer(pg, user, act);
        let ours = answer(ws, user, act);
        eprintln!("{what}:\n  pg: {theirs:?}\n  ws: {ours:?}");
        if ours != theirs {
            differ.push(*what);
        }
    }
    assert!(
        differ.is_empty(),
        "walserver differs from PostgreSQL 15 on: {differ:?}"
    );
}

/// A frontend message's bytes on the wire.
pub(crate) fn frame(m: protocol_codec::FrontendMessage) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    m.encode(&mut b).expect("encodes");
    b.to_vec()
}

/// `run` against PostgreSQL (as `postgres`) and walserver (as `u`): the same lines from both,
/// printed side by side.
pub(crate) fn assert_same_answers(
    run: &dyn Fn(SocketAddr, &str) -> Vec<String>,
    pg: SocketAddr,
    node: SocketAddr,
) {
    let theirs = run(pg, "postgres");
    let ours = run(node, "u");
    for (t, o) in theirs.iter().zip(&ours) {
        eprintln!("pg: {t}\nws: {o}");
    }
    assert_eq!(ours, theirs);
}

/// A message as the startup-parameter tests compare it: a row, an error with its hint and
/// detail, anything else by its name; the messages whose contents differ between the servers
/// (key data, row descriptions, command tags) left out.
pub(crate) fn answer_line(m: &protocol_codec::BackendMessage) -> Option<String> {
    use protocol_codec::BackendMessage;
    match m {
        BackendMessage::BackendKeyData { .. }
        | BackendMessage::RowDescription(_)
        | BackendMessage::CommandComplete(_) => None,
        BackendMessage::DataRow(r) => Some(format!("{r:?}")),
        BackendMessage::ErrorResponse(f) => Some(format!(
            "{} HINT {} DETAIL {}",
            error_line(f),
            f.get(b'H').unwrap_or("-"),
            f.get(b'D').unwrap_or("-")
        )),
        m => Some(format!("{m:?}")),
    }
}
