//! A standby whose `primary_conninfo` names several hosts, as libpq takes them: the hosts are
//! tried in order, a host that refuses the connection is passed over, and
//! `target_session_attrs` decides which server to settle on (a primary for `read-write`, a
//! standby for `standby`, the first that answers for `any`, a standby if there is one for
//! `prefer-standby`), and a standby given both members follows the one promoted. And the
//! replication connection's TCP keepalives, on both of its ends, and their timing.

use std::net::SocketAddr;

use crate::common::*;
use crate::{KEEP, TL1};

/// A port on 127.0.0.1 that refuses connections for as long as the returned socket lives: the
/// socket holds the port bound without listening, so no other test can take it meanwhile.
fn refusing_port() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let addr = socket.local_addr().expect("address");
    (socket, addr)
}

/// A standby of the first host of `hosts` that suits `attrs`.
fn standby_of_any(hosts: &[SocketAddr], attrs: &str, name: &str) -> TestNode {
    let ports: Vec<String> = hosts.iter().map(|a| a.port().to_string()).collect();
    let list: Vec<&str> = hosts.iter().map(|_| "127.0.0.1").collect();
    let conninfo = format!(
        "host={} port={} user=walserver sslmode=disable application_name={name} target_session_attrs={attrs}",
        list.join(","),
        ports.join(",")
    );
    TestNode::standby_from(&conninfo, KEEP)
}

#[test]
fn a_host_list_is_tried_in_order_and_target_session_attrs_choose_the_server() {
    let primary = TestNode::primary(KEEP);
    let middle = TestNode::standby_of(primary.addr(), "middle", KEEP);
    let end = primary.append(3, 100, 1);
    middle.wait_flushed(TL1, end);
    let (_held, dead) = refusing_port();

    for (attrs, hosts, expected, who) in [
        (
            "read-write",
            vec![dead, middle.addr(), primary.addr()],
            primary.addr(),
            "the primary",
        ),
        (
            "primary",
            vec![middle.addr(), primary.addr()],
            primary.addr(),
            "the primary",
        ),
        (
            "standby",
            vec![dead, primary.addr(), middle.addr()],
            middle.addr(),
            "the standby",
        ),
        (
            "read-only",
            vec![primary.addr(), middle.addr()],
            middle.addr(),
            "the standby",
        ),
        (
            "any",
            vec![dead, middle.addr(), primary.addr()],
            middle.addr(),
            "the first that answers",
        ),
        (
            "prefer-standby",
            vec![primary.addr(), middle.addr()],
            middle.addr(),
            "the standby",
        ),
        (
            "prefer-standby",
            vec![dead, primary.addr()],
            primary.addr(),
            "no standby: the primary",
        ),
    ] {
        let name = format!("s_{}", attrs.replace('-', "_"));
        let standby = standby_of_any(&hosts, attrs, &name);
        let info = standby.wait_receiver(&format!("{attrs}: streaming from {who}"), |_| true);
        let status = info.status.expect("a status while streaming");
        assert_eq!(
            (status.sender_host.as_deref(), status.sender_port),
            (Some("127.0.0.1"), Some(expected.port())),
            "{attrs} over {hosts:?}: should stream from {who} ({expected})"
        );
        standby.wait_flushed(TL1, end);
    }
}

#[test]
fn a_host_list_where_no_server_suits_is_refused_naming_every_host() {
    let primary = TestNode::primary(KEEP);
    let (_held, dead) = refusing_port();
    let conninfo = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=walserver sslmode=disable target_session_attrs=standby",
        dead.port(),
        primary.addr().port()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let e = walserver_node::init::init_standby(&dir.path().join("data"), &conninfo, None, None)
        .expect_err("no host is a standby");
    // What the CLI prints: the error and its causes.
    let text = format!("{:#}", anyhow::Error::from(e));
    for want in [
        format!("127.0.0.1:{}: ", dead.port()),
        format!(
            "127.0.0.1:{}: server is not in hot standby mode",
            primary.addr().port()
        ),
    ] {
        assert!(text.contains(&want), "{want:?} in {text}");
    }
}

/// One IPv4 TCP socket of `/proc/net/tcp`: its local and remote ports, its state (1:
/// established) and its timer (`tr`: 2 while the keepalive timer runs on an idle connection,
/// 0 when no timer does, 1 while data waits for acknowledgement).
struct Socket {
    local: u16,
    remote: u16,
    state: u8,
    timer: u8,
}

fn tcp_sockets() -> Vec<Socket> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
    let hex = |a: &str| u8::from_str_radix(a.split(':').next()?, 16).ok();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some(Socket {
                local: port(f.get(1)?)?,
                remote: port(f.get(2)?)?,
                state: hex(f.get(3)?)?,
                timer: hex(f.get(5)?)?,
            })
        })
        .collect()
}

/// The timer of the socket from port `local` to port `remote`.
fn tcp_timer(local: u16, remote: u16) -> Option<u8> {
    tcp_sockets()
        .into_iter()
        .find(|s| s.local == local && s.remote == remote)
        .map(|s| s.timer)
}

#[test]
fn replication_connections_carry_tcp_keepalives_on_both_ends() {
    let primary = TestNode::primary(KEEP);
    let standby = TestNode::standby_of(primary.addr(), "ka", KEEP);
    let end = primary.append(1, 100, 1);
    standby.wait_flushed(TL1, end);
    let p = primary.addr().port();
    // The standby's socket has keepalives as libpq's default says, and the primary's end
    // of it has them as PostgreSQL's postmaster gives every connection. Wait out any data in
    // flight: the keepalive timer shows only on an idle connection.
    let receiver_port = || {
        tcp_sockets()
            .into_iter()
            .find(|s| s.remote == p && s.state == 1)
            .map(|s| s.local)
    };
    wait_until("both ends of the stream idle, under keepalive", || {
        receiver_port().is_some_and(|r| tcp_timer(r, p) == Some(2) && tcp_timer(p, r) == Some(2))
    });

    // A client that does not ask for keepalives has none on its end, while the server's end
    // of its connection has them: the check tells the two apart.
    let c = PgConn::connect(primary.addr(), "u", None).expect("connect");
    let mine = c.stream.local_addr().expect("address").port();
    wait_until(
        "the server's end of a plain client's connection under keepalive",
        || tcp_timer(p, mine) == Some(2),
    );
    assert_eq!(tcp_timer(mine, p), Some(0), "the plain client's own end");
}

/// The node's `tcp_keepalives_*` and `tcp_user_timeout` reach every accepted connection's
/// socket (SHOW reads them back from it, as PostgreSQL's SHOW does), and a client's own
/// `-c tcp_keepalives_idle=...` wins for its connection. A reload reaches the open
/// connections too, except the values their clients set; a value the reload leaves out (or
/// sets to 0) goes back to the system's, as in PostgreSQL.
#[test]
fn the_nodes_keepalive_timing_reaches_its_connections_and_a_client_may_set_its_own() {
    let node = TestNode::primary(
        "tcp_keepalives_idle = \"30s\"\ntcp_keepalives_interval = 5\n\
         tcp_keepalives_count = 4\ntcp_user_timeout = \"20s\"\n",
    );
    let show = |c: &mut PgConn, name: &str| -> String {
        let out = c.query(&format!("SHOW {name}"));
        match &out[1] {
            protocol_codec::BackendMessage::DataRow(r) => {
                String::from_utf8_lossy(r[0].as_deref().unwrap_or_default()).into_owned()
            }
            other => panic!("SHOW {name}: {other:?}"),
        }
    };
    // The four as SHOW gives them: idle, interval, count, user timeout.
    let timing = |c: &mut PgConn| -> Vec<String> {
        [
            "tcp_keepalives_idle",
            "tcp_keepalives_interval",
            "tcp_keepalives_count",
            "tcp_user_timeout",
        ]
        .iter()
        .map(|n| show(c, n))
        .collect()
    };
    let mut plain = PgConn::connect(node.addr(), "u", None).expect("connect");
    assert_eq!(timing(&mut plain), ["30", "5", "4", "20000"]);

    let mut own = PgConn::raw(node.addr());
    own.send_startup(protocol_codec::StartupPacket::startup([
        ("user", "u"),
        ("replication", "true"),
        ("options", "-c tcp_keepalives_idle=7"),
    ]));
    own.until_ready();
    assert_eq!(show(&mut own, "tcp_keepalives_idle"), "7");
    assert_eq!(show(&mut own, "tcp_keepalives_count"), "4");

    node.reload_with("tcp_keepalives_idle = \"45s\"\ntcp_keepalives_count = 6\n");
    wait_until("the reload to reach the open connection", || {
        show(&mut plain, "tcp_keepalives_idle") == "45"
    });
    let system = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
            .expect("the system's keepalive setting")
            .trim()
            .to_string()
    };
    assert_eq!(
        timing(&mut plain),
        [
            "45".into(),
            system("tcp_keepalive_intvl"),
            "6".into(),
            "0".into()
        ]
    );
    // The client's own idle time stays; the rest follows the node.
    assert_eq!(show(&mut own, "tcp_keepalives_idle"), "7");
    assert_eq!(show(&mut own, "tcp_keepalives_count"), "6");
}

/// The case host lists are for: standby C lists both members, the primary A first, with
/// `target_session_attrs=read-write`. A stops and B, A's other standby, is promoted: C tries A
/// (gone), passes over nothing else, settles on B as the new primary, follows it onto timeline
/// 2 and receives what B writes there, with no configuration changed.
#[test]
fn a_standby_given_both_members_follows_the_promoted_one() {
    let a = TestNode::primary(KEEP);
    let b = TestNode::standby_of(a.addr(), "b", KEEP);
    let c = standby_of_any(&[a.addr(), b.addr()], "read-write", "c");
    let first = a.append(3, 100, 1);
    b.wait_flushed(TL1, first);
    let info = c.wait_receiver("C streaming from A", |_| true);
    assert_eq!(
        info.status.and_then(|s| s.sender_port),
        Some(a.addr().port())
    );
    c.wait_flushed(TL1, first);

    a.shutdown(false);
    drop(a);
    b.promote().expect("promote B");
    let after = b.append(3, 100, 2);
    let info = c.wait_receiver("C streaming from B, the new primary", |r| {
        r.status.as_ref().and_then(|s| s.sender_port) == Some(b.addr().port())
    });
    assert!(info.status.is_some());
    c.wait_flushed(crate::TL2, after);
    assert_eq!(c.wal().timeline(), crate::TL2);
}

/// `hostaddr` is connected to as given, the host's name not used to connect (it is for TLS and
/// the password file): a standby whose `host` is another loopback address, where nothing
/// listens, and whose `hostaddr` is the primary's streams from the primary, as one given only
/// `hostaddr` does. (Both addresses are loopback, so nothing leaves the machine either way.)
#[test]
fn hostaddr_is_connected_to_instead_of_the_host() {
    let primary = TestNode::primary(KEEP);
    let end = primary.append(2, 100, 1);
    for (name, addressing) in [
        (
            "by_addr_and_name",
            "host=nowhere.invalid hostaddr=127.0.0.1",
        ),
        ("by_addr", "hostaddr=127.0.0.1"),
    ] {
        let conninfo = format!(
            "{addressing} port={} user=walserver sslmode=disable application_name={name}",
            primary.addr().port()
        );
        let standby = TestNode::standby_from(&conninfo, KEEP);
        standby.wait_receiver(&format!("{addressing}: streaming"), |_| true);
        standby.wait_flushed(TL1, end);
    }
}
