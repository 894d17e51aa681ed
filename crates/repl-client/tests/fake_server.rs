//! The client against a scripted server in a thread on 127.0.0.1, built from protocol-codec's
//! server-side codecs: the login and its greeting, IDENTIFY_SYSTEM, a stream of XLogData much
//! larger than one read, status updates, a refused login with its SQLSTATE, a server that
//! says nothing (the read timeout) and one that hangs up.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use protocol_codec::messages::{TransactionStatus, XLogData};
use protocol_codec::{
    results, AuthRequest, BackendMessage, ErrorFields, FrontendMessage, ServerCodec, SqlState,
    StartupCodec, StartupPacket,
};
use repl_client::{ConnectOptions, Error, ReplClient};
use tokio_util::codec::{Decoder, Encoder};
use wal_types::{Lsn, PgTimestamp, SystemId, TimelineId};

/// The server's end of one connection.
struct Peer {
    s: TcpStream,
    buf: BytesMut,
}

impl Peer {
    fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 8192];
        match self.s.read(&mut tmp) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                true
            }
        }
    }

    fn startup(&mut self) -> StartupPacket {
        loop {
            if let Some(p) = StartupCodec.decode(&mut self.buf).unwrap() {
                return p;
            }
            assert!(self.fill(), "client left before its startup packet");
        }
    }

    fn recv(&mut self) -> Option<FrontendMessage> {
        loop {
            if let Some(m) = ServerCodec::new().decode(&mut self.buf).unwrap() {
                return Some(m);
            }
            if !self.fill() {
                return None;
            }
        }
    }

    fn send(&mut self, msgs: &[BackendMessage]) {
        let mut out = BytesMut::new();
        for m in msgs {
            ServerCodec::new().encode(m, &mut out).unwrap();
        }
        self.s.write_all(&out).unwrap();
    }

    fn greet(&mut self) {
        self.send(&[
            BackendMessage::Authentication(AuthRequest::Ok),
            BackendMessage::ParameterStatus {
                name: "server_version".into(),
                value: "15.0 (fake)".into(),
            },
            BackendMessage::BackendKeyData { pid: 4242, key: 1 },
            BackendMessage::ReadyForQuery(TransactionStatus::Idle),
        ]);
    }
}

/// Runs `script` on the first connection to a new listener.
fn serve(script: impl FnOnce(Peer) + Send + 'static) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        script(Peer {
            s,
            buf: BytesMut::new(),
        })
    });
    (addr, t)
}

const WAL: usize = 4 << 20;
const CHUNK: usize = 128 << 10;

#[test]
fn login_identify_and_stream() {
    let (addr, server) = serve(|mut p| {
        let startup = p.startup();
        assert_eq!(startup.user(), Some("u"));
        assert_eq!(startup.application_name(), Some("fake-test"));
        assert_eq!(startup.param("replication"), Some("true"));
        assert_eq!(startup.param("options"), Some("-c a=b"));
        p.greet();
        assert_eq!(
            p.recv(),
            Some(FrontendMessage::Query("IDENTIFY_SYSTEM".into()))
        );
        let mut answer = results::identify_system(SystemId(7), TimelineId(3), Lsn(0x1000), None);
        answer.push(BackendMessage::ReadyForQuery(TransactionStatus::Idle));
        p.send(&answer);
        assert_eq!(
            p.recv(),
            Some(FrontendMessage::Query(
                "START_REPLICATION 0/1000 TIMELINE 3".into()
            ))
        );
        p.send(&[BackendMessage::CopyBothResponse]);
        let mut at = 0x1000u64;
        for i in 0..WAL / CHUNK {
            p.send(&[BackendMessage::XLogData(XLogData {
                wal_start: Lsn(at),
                wal_end: Lsn(at + CHUNK as u64),
                send_time: PgTimestamp(0),
                data: Bytes::from(vec![i as u8; CHUNK]),
            })]);
            at += CHUNK as u64;
        }
        let Some(FrontendMessage::StandbyStatusUpdate(u)) = p.recv() else {
            panic!("expected a status update")
        };
        assert_eq!(u.flush, Lsn(at));
        assert!(u.reply_requested);
        assert_eq!(p.recv(), Some(FrontendMessage::Terminate));
    });
    let options = ConnectOptions::new("u", None, "fake-test")
        .param("options", "-c a=b")
        .read_timeout(Duration::from_secs(30));
    let mut c = ReplClient::connect_with(addr, &options).unwrap();
    assert_eq!(c.param("server_version"), Some("15.0 (fake)"));
    assert_eq!(c.session().backend_key, Some((4242, 1)));
    assert!(!c.session().tls);
    let id = c.identify_system().unwrap();
    assert_eq!(id.system_id, "7");
    assert_eq!(id.timeline, 3);
    assert_eq!(id.xlogpos, Lsn(0x1000));
    assert_eq!(id.dbname, None);
    c.start_replication(id.xlogpos, Some(id.timeline)).unwrap();
    let mut at = id.xlogpos;
    let mut chunks = 0;
    while at < Lsn(0x1000 + WAL as u64) {
        let BackendMessage::XLogData(x) = c.recv().unwrap() else {
            panic!("expected XLogData")
        };
        assert_eq!(x.wal_start, at);
        assert_eq!(x.data.len(), CHUNK);
        assert!(x.data.iter().all(|&b| b == chunks as u8));
        at = at + x.data.len() as u64;
        chunks += 1;
    }
    c.standby_status(at, at, Lsn::INVALID, true).unwrap();
    c.close();
    server.join().unwrap();
}

#[test]
fn a_refused_login_keeps_the_servers_error() {
    let (addr, server) = serve(|mut p| {
        p.startup();
        p.send(&[BackendMessage::ErrorResponse(ErrorFields::fatal(
            SqlState::INVALID_PASSWORD,
            "password authentication failed for user \"u\"",
        ))]);
    });
    let err = ReplClient::connect(addr, "u", None, "t").err().unwrap();
    assert_eq!(err.sqlstate(), Some(SqlState::INVALID_PASSWORD));
    assert_eq!(
        err.server_error().and_then(ErrorFields::message),
        Some("password authentication failed for user \"u\"")
    );
    server.join().unwrap();
}

#[test]
fn the_handshakes_order_rules_apply() {
    let (addr, server) = serve(|mut p| {
        p.startup();
        // ReadyForQuery before AuthenticationOk.
        p.send(&[BackendMessage::ReadyForQuery(TransactionStatus::Idle)]);
    });
    let err = ReplClient::connect(addr, "u", None, "t").err().unwrap();
    assert!(matches!(err, Error::Startup(_)), "{err:?}");
    assert!(err.to_string().contains("before AuthenticationOk"), "{err}");
    server.join().unwrap();
}

#[test]
fn silence_is_a_timeout_and_a_hang_up_is_closed() {
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (addr, server) = serve(move |mut p| {
        p.startup();
        // Say nothing until the client has given up.
        let _ = done_rx.recv();
    });
    let options = ConnectOptions::new("u", None, "t").read_timeout(Duration::from_millis(200));
    let err = ReplClient::connect_with(addr, &options).err().unwrap();
    assert!(matches!(err, Error::Timeout), "{err:?}");
    done_tx.send(()).unwrap();
    server.join().unwrap();

    // A deadline: the greeting arrives, then nothing; the read timeout is kept.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (addr, server) = serve(move |mut p| {
        p.startup();
        p.greet();
        let _ = done_rx.recv();
    });
    let mut c = ReplClient::connect(addr, "u", None, "t").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let deadline = Instant::now() + Duration::from_millis(200);
    let err = c.recv_before(deadline).unwrap_err();
    assert!(matches!(err, Error::Timeout), "{err:?}");
    assert!(Instant::now() >= deadline);
    assert_eq!(
        c.tcp().read_timeout().unwrap(),
        Some(Duration::from_secs(30))
    );
    done_tx.send(()).unwrap();
    server.join().unwrap();

    let (addr, server) = serve(|mut p| {
        p.startup();
        p.greet();
        assert_eq!(p.recv(), Some(FrontendMessage::Query("SHOW x".into())));
        // Hang up without an answer.
    });
    let mut c = ReplClient::connect(addr, "u", None, "t").unwrap();
    let err = c.simple_query("SHOW x").unwrap_err();
    assert!(matches!(err, Error::Closed), "{err:?}");
    server.join().unwrap();
}

#[test]
fn raw_connections_speak_the_startup_phase_themselves() {
    let (addr, server) = serve(|mut p| {
        let startup = p.startup();
        assert_eq!(startup.user(), Some("raw"));
        p.send(&[BackendMessage::Authentication(
            AuthRequest::CleartextPassword,
        )]);
        // Then the server ends the connection.
    });
    let mut c = ReplClient::raw(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.send_startup(&StartupPacket::startup([("user", "raw")]))
        .unwrap();
    assert_eq!(
        c.recv().unwrap(),
        BackendMessage::Authentication(AuthRequest::CleartextPassword)
    );
    c.wait_closed().unwrap();
    server.join().unwrap();
}
