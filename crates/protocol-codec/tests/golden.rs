//! Golden tests against real PostgreSQL 15 traffic: the captures in
//! `testdata/pg15-captures` (see its README) are replayed through our codecs.
//!
//! Each direction of a capture is reassembled into one byte stream. Reads over 4 KiB were cut
//! to their first 4 KiB when captured, so the stream has holes of known length. The walk
//! keeps exact message boundaries across holes (a message's length is in its header, which
//! is usually in a kept part), decodes every message whose bytes are all known, and checks
//! that re-encoding gives the identical bytes. When a header itself falls into a hole, the
//! walk resynchronises on the next XLogData or keepalive header (`'d'`, a plausible length,
//! `'w'`/`'k'`) in known bytes; XLogData positions must then continue to increase, and within
//! a synchronised stretch each XLogData must start where the previous one ended.

use std::ops::Range;
use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use protocol_codec::command::{parse_command, ReplicationCommand};
use protocol_codec::messages::{
    parse_sasl_initial_response, ReplicationMode, SslResponse, StartupPacket,
};
use protocol_codec::results::{self, ReadSlot};
use protocol_codec::{
    AuthRequest, BackendMessage, ClientCodec, FrontendMessage, ServerCodec, StartupCodec,
};
use tokio_util::codec::{Decoder, Encoder};
use wal_types::{Lsn, SystemId, TimelineId};

fn capture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/pg15-captures")
        .join(name)
}

/// One direction of a capture: the bytes, with the cut parts zero-filled, and the ranges
/// that were kept.
struct Stream {
    data: Vec<u8>,
    known: Vec<Range<usize>>,
}

impl Stream {
    fn load(name: &str, dir: &str) -> Stream {
        let text = std::fs::read_to_string(capture_path(name)).expect("capture file");
        let mut s = Stream {
            data: Vec::new(),
            known: Vec::new(),
        };
        for line in text.lines() {
            let r: serde_json::Value = serde_json::from_str(line).expect("capture line");
            if r["dir"] != dir {
                continue;
            }
            let kept = hex(r["hex"].as_str().unwrap());
            let len = r["len"].as_u64().unwrap() as usize;
            assert!(kept.len() <= len);
            let start = s.data.len();
            s.data.extend_from_slice(&kept);
            s.data.resize(start + len, 0);
            match s.known.last_mut() {
                Some(last) if last.end == start => last.end = start + kept.len(),
                _ => s.known.push(start..start + kept.len()),
            }
        }
        s
    }

    fn is_known(&self, r: Range<usize>) -> bool {
        let i = self.known.partition_point(|k| k.end <= r.start);
        self.known
            .get(i)
            .is_some_and(|k| k.start <= r.start && r.end <= k.end)
    }

    fn i32_at(&self, at: usize) -> i32 {
        i32::from_be_bytes(self.data[at..at + 4].try_into().unwrap())
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_be_bytes(self.data[at..at + 8].try_into().unwrap())
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A decoded message and the exact bytes it came from.
struct Seen<M> {
    msg: M,
    raw: Vec<u8>,
}

/// The header of an XLogData, from a whole message or from the kept start of a cut one.
#[derive(Clone, Copy, Debug)]
struct XLogHeader {
    wal_start: u64,
    wal_end: u64,
    data_len: u64,
    /// Which stream (CopyBothResponse) it belongs to.
    stream: usize,
    /// Which synchronised stretch of the walk it belongs to.
    stretch: usize,
}

struct Walk<M> {
    messages: Vec<Seen<M>>,
    xlog: Vec<XLogHeader>,
    /// Messages whose body was partly cut (counted, not decoded).
    partial: usize,
    resyncs: usize,
    /// CopyBothResponses seen: each starts a new stream of XLogData.
    streams: usize,
}

/// Walks typed messages from `pos`. `decode` and `encode` are one codec's two halves.
fn walk<M: std::fmt::Debug>(
    s: &Stream,
    mut pos: usize,
    mut decode: impl FnMut(&mut BytesMut) -> Result<Option<M>, protocol_codec::CodecError>,
    mut encode: impl FnMut(&M, &mut BytesMut),
) -> Walk<M> {
    let mut w = Walk {
        messages: Vec::new(),
        xlog: Vec::new(),
        partial: 0,
        resyncs: 0,
        streams: 0,
    };
    while pos + 5 <= s.data.len() {
        if !s.is_known(pos..pos + 5) {
            match resync(s, pos, w.xlog.last()) {
                Some(p) => {
                    pos = p;
                    w.resyncs += 1;
                    continue;
                }
                None => break,
            }
        }
        let len = s.i32_at(pos + 1);
        assert!(len >= 4, "bad length {len} at {pos}");
        let end = pos + 1 + len as usize;
        if s.data[pos] == b'd' && s.data[pos + 5] == b'w' && s.is_known(pos..pos + 30) {
            let h = XLogHeader {
                wal_start: s.u64_at(pos + 6),
                wal_end: s.u64_at(pos + 14),
                data_len: len as u64 - 29,
                stream: w.streams,
                stretch: w.resyncs,
            };
            w.xlog.push(h);
        }
        if end <= s.data.len() && s.is_known(pos..end) {
            let raw = s.data[pos..end].to_vec();
            let mut buf = BytesMut::from(&raw[..]);
            let msg = decode(&mut buf)
                .unwrap_or_else(|e| panic!("decode at {pos}: {e}: {raw:02x?}"))
                .expect("a whole message");
            assert!(buf.is_empty(), "decoder left bytes at {pos}");
            let mut again = BytesMut::new();
            encode(&msg, &mut again);
            assert_eq!(&again[..], &raw[..], "re-encoding {msg:?}");
            if raw == b"W\0\0\0\x07\0\0\0" {
                w.streams += 1;
            }
            w.messages.push(Seen { msg, raw });
        } else if end <= s.data.len() {
            w.partial += 1;
        }
        pos = end;
    }
    w
}

/// Whether a plausible backend message header starts at `p` (its first 30 bytes known):
/// a known type with a sane length, and for CopyData an XLogData or keepalive header.
fn plausible_at(s: &Stream, p: usize, last: Option<&XLogHeader>) -> bool {
    if !s.is_known(p..p + 30) {
        return s.is_known(p..p + 5) && s.data[p] == b'c' && s.i32_at(p + 1) == 4;
    }
    let len = s.i32_at(p + 1);
    match s.data[p] {
        b'd' => match s.data[p + 5] {
            b'k' => len == 22,
            b'w' => {
                let (start, end) = (s.u64_at(p + 6), s.u64_at(p + 14));
                (29..=29 + 131072).contains(&len)
                    && start <= end
                    && last.is_none_or(|l| start > l.wal_start)
            }
            _ => false,
        },
        b'c' => len == 4,
        b'W' => len == 7,
        b'Z' => len == 5,
        b'C' | b'T' | b'D' | b'E' | b'N' | b'S' => (4..1 << 16).contains(&len),
        _ => false,
    }
}

/// The next position after `pos` where messages can be followed again, or `None`: a
/// plausible header at the start of a kept read, or an XLogData or keepalive header anywhere
/// in kept bytes.
fn resync(s: &Stream, pos: usize, last: Option<&XLogHeader>) -> Option<usize> {
    for r in &s.known {
        if r.end <= pos {
            continue;
        }
        let from = r.start.max(pos + 1);
        if from == r.start && plausible_at(s, from, last) {
            return Some(from);
        }
        for p in from..r.end.saturating_sub(30) {
            if s.data[p] == b'd' && plausible_at(s, p, last) {
                return Some(p);
            }
        }
    }
    None
}

fn backend_label(m: &BackendMessage) -> String {
    match m {
        BackendMessage::Authentication(a) => match a {
            AuthRequest::Ok => "R0".into(),
            AuthRequest::Sasl { .. } => "R10".into(),
            AuthRequest::SaslContinue(_) => "R11".into(),
            AuthRequest::SaslFinal(_) => "R12".into(),
            other => format!("{other:?}"),
        },
        BackendMessage::ParameterStatus { name, .. } => format!("S:{name}"),
        BackendMessage::BackendKeyData { .. } => "K".into(),
        BackendMessage::ReadyForQuery(_) => "Z".into(),
        BackendMessage::RowDescription(f) => format!("T:{}", f[0].name),
        BackendMessage::DataRow(_) => "D".into(),
        BackendMessage::CommandComplete(t) => format!("C:{t}"),
        BackendMessage::CopyBothResponse => "W".into(),
        BackendMessage::XLogData(_) => "w".into(),
        BackendMessage::PrimaryKeepalive(_) => "k".into(),
        BackendMessage::CopyDone => "c".into(),
        other => format!("{other:?}"),
    }
}

fn frontend_label(m: &FrontendMessage) -> String {
    match m {
        FrontendMessage::Query(q) => format!("Q:{q}"),
        FrontendMessage::PasswordMessage(_) => "p".into(),
        FrontendMessage::StandbyStatusUpdate(_) => "r".into(),
        FrontendMessage::HotStandbyFeedback(_) => "h".into(),
        FrontendMessage::CopyDone => "c".into(),
        FrontendMessage::Terminate => "X".into(),
        other => format!("{other:?}"),
    }
}

/// Everything one capture shows, decoded.
struct Session {
    startup: StartupPacket,
    server: Walk<BackendMessage>,
    client: Walk<FrontendMessage>,
}

fn replay(name: &str) -> Session {
    let session = replay_inner(name);
    eprintln!(
        "{name}: server {} messages, {} cut, {} XLogData headers, {} resyncs; client {} messages",
        session.server.messages.len(),
        session.server.partial,
        session.server.xlog.len(),
        session.server.resyncs,
        session.client.messages.len()
    );
    session
}

fn replay_inner(name: &str) -> Session {
    let c2s = Stream::load(name, "c2s");
    let s2c = Stream::load(name, "s2c");

    // The client's startup phase: SSLRequest, then (after 'N') the StartupMessage.
    let mut src = BytesMut::from(&c2s.data[..]);
    assert_eq!(
        StartupCodec.decode(&mut src).unwrap(),
        Some(StartupPacket::SslRequest)
    );
    let startup = StartupCodec
        .decode(&mut src)
        .unwrap()
        .expect("StartupMessage");
    let used = c2s.data.len() - src.len();
    let mut again = BytesMut::new();
    StartupCodec.encode(startup.clone(), &mut again).unwrap();
    assert_eq!(&again[..], &c2s.data[8..used]);

    let mut answer = BytesMut::from(&s2c.data[..1]);
    assert_eq!(
        SslResponse::decode(&mut answer).unwrap(),
        Some(SslResponse::Refuse)
    );

    let mut client_codec = ClientCodec::new();
    let server = walk(
        &s2c,
        1,
        |b| client_codec.decode(b),
        |m, out| ServerCodec::new().encode(m, out).unwrap(),
    );
    let mut server_codec = ServerCodec::new();
    let client = walk(
        &c2s,
        used,
        |b| server_codec.decode(b),
        |m, out| ClientCodec::new().encode(m, out).unwrap(),
    );
    assert_eq!(client.resyncs, 0, "client streams are never cut");
    assert_eq!(client.partial, 0);
    Session {
        startup,
        server,
        client,
    }
}

impl Session {
    fn server_labels(&self) -> Vec<String> {
        self.server
            .messages
            .iter()
            .map(|m| backend_label(&m.msg))
            .collect()
    }

    /// The server's messages without the streaming traffic (XLogData, keepalives) and the
    /// greeting's ParameterStatus set.
    fn server_script(&self) -> Vec<String> {
        self.server_labels()
            .into_iter()
            .filter(|l| !matches!(l.as_str(), "w" | "k") && !l.starts_with("S:"))
            .collect()
    }

    fn client_script(&self) -> Vec<String> {
        self.client
            .messages
            .iter()
            .map(|m| frontend_label(&m.msg))
            .filter(|l| !matches!(l.as_str(), "r" | "h"))
            .collect()
    }

    fn count_client(&self, label: &str) -> usize {
        self.client
            .messages
            .iter()
            .filter(|m| frontend_label(&m.msg) == label)
            .count()
    }

    /// Checks what every capture shares: the startup packet, SCRAM, the greeting, the
    /// queries' syntax, and the result sets against our `results` functions.
    fn check_common(&self, application_name: &str) {
        assert_eq!(self.startup.user(), Some("repl"));
        assert_eq!(self.startup.database(), Some("replication"));
        assert_eq!(self.startup.application_name(), Some(application_name));
        assert_eq!(
            self.startup.replication().unwrap(),
            ReplicationMode::Physical
        );

        // SASLInitialResponse with libpq's empty user name, then the client-final message.
        let FrontendMessage::PasswordMessage(first) = &self.client.messages[0].msg else {
            panic!("no SASLInitialResponse")
        };
        let (mechanism, data) = parse_sasl_initial_response(first).unwrap();
        assert_eq!(mechanism, "SCRAM-SHA-256");
        assert!(data.unwrap().starts_with(b"n,,n=,r="));
        let FrontendMessage::PasswordMessage(fin) = &self.client.messages[1].msg else {
            panic!("no SASLResponse")
        };
        assert!(fin.starts_with(b"c=biws,r="));

        let labels = self.server_labels();
        assert_eq!(&labels[..4], ["R10", "R11", "R12", "R0"]);
        let params: Vec<&str> = labels[4..17].iter().map(|l| &l[2..]).collect();
        assert_eq!(
            params,
            [
                "application_name",
                "client_encoding",
                "DateStyle",
                "default_transaction_read_only",
                "in_hot_standby",
                "integer_datetimes",
                "IntervalStyle",
                "is_superuser",
                "server_encoding",
                "server_version",
                "session_authorization",
                "standard_conforming_strings",
                "TimeZone"
            ]
        );
        assert_eq!(&labels[17..19], ["K", "Z"]);

        // Every query a PostgreSQL 15 client sent parses as a supported replication command.
        for m in &self.client.messages {
            if let FrontendMessage::Query(q) = &m.msg {
                let cmd = parse_command(q).unwrap();
                assert!(cmd.refusal().is_none(), "{q} -> {cmd:?}");
            }
        }
        self.check_result_sets();
    }

    /// Rebuilds every captured result set with `results` from the values it carries and
    /// compares the bytes.
    fn check_result_sets(&self) {
        let msgs = &self.server.messages;
        let mut checked = 0;
        for (i, m) in msgs.iter().enumerate() {
            let BackendMessage::RowDescription(fields) = &m.msg else {
                continue;
            };
            let BackendMessage::DataRow(row) = &msgs[i + 1].msg else {
                panic!("RowDescription without DataRow")
            };
            let text = |i: usize| -> Option<String> {
                row[i]
                    .as_ref()
                    .map(|v| String::from_utf8(v.to_vec()).unwrap())
            };
            let lsn = |i: usize| text(i).map(|t| t.parse::<Lsn>().unwrap());
            let tli = |i: usize| text(i).map(|t| TimelineId(t.parse().unwrap()));
            let expected = match fields[0].name.as_str() {
                "systemid" => results::identify_system(
                    SystemId(text(0).unwrap().parse().unwrap()),
                    tli(1).unwrap(),
                    lsn(2).unwrap(),
                    text(3).as_deref(),
                ),
                "slot_name" => results::create_replication_slot(
                    &text(0).unwrap(),
                    lsn(1).unwrap(),
                    text(2).as_deref(),
                    text(3).as_deref(),
                ),
                "slot_type" => {
                    let slot = text(0).map(|slot_type| ReadSlot {
                        slot_type,
                        restart_lsn: lsn(1),
                        restart_tli: tli(2),
                    });
                    results::read_replication_slot(slot.as_ref())
                }
                "filename" => {
                    let t = text(0).unwrap();
                    let tli = u32::from_str_radix(t.trim_end_matches(".history"), 16).unwrap();
                    results::timeline_history(TimelineId(tli), row[1].clone().unwrap())
                }
                "next_tli" => {
                    let mut v = results::end_of_timeline(tli(0).unwrap(), lsn(1).unwrap());
                    v.extend(results::end_of_streaming());
                    v
                }
                name => results::show(name, &text(0).unwrap()),
            };
            let mut ours = BytesMut::new();
            for e in &expected {
                ServerCodec::new().encode(e, &mut ours).unwrap();
            }
            let theirs: Vec<u8> = msgs[i..i + expected.len()]
                .iter()
                .flat_map(|m| m.raw.clone())
                .collect();
            assert_eq!(&ours[..], &theirs[..], "result set {}", fields[0].name);
            checked += 1;
        }
        assert!(checked > 0);
    }

    /// Within a stream, XLogData move forward, and within a synchronised stretch each starts
    /// where the previous ended. No XLogData reaches past the end it reports.
    fn check_wal_continuity(&self) -> usize {
        let x = &self.server.xlog;
        for pair in x.windows(2) {
            if pair[0].stream != pair[1].stream {
                continue;
            }
            if pair[0].stretch == pair[1].stretch {
                assert_eq!(
                    pair[1].wal_start,
                    pair[0].wal_start + pair[0].data_len,
                    "{pair:?}"
                );
            } else {
                assert!(pair[1].wal_start > pair[0].wal_start, "{pair:?}");
            }
        }
        for h in x {
            assert!(h.wal_start + h.data_len <= h.wal_end, "{h:?}");
        }
        x.len()
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn pg_receivewal_create_slot() {
    let s = replay("pg_receivewal-scram.1.jsonl");
    s.check_common("pg_receivewal");
    assert_eq!(s.server.partial + s.server.resyncs, 0);
    assert_eq!(
        s.server_script(),
        strings(&[
            "R10",
            "R11",
            "R12",
            "R0",
            "K",
            "Z",
            "T:data_directory_mode",
            "D",
            "C:SHOW",
            "Z",
            "T:systemid",
            "D",
            "C:IDENTIFY_SYSTEM",
            "Z",
            "T:slot_name",
            "D",
            "C:CREATE_REPLICATION_SLOT",
            "Z",
        ])
    );
    assert_eq!(
        s.client_script(),
        strings(&[
            "p",
            "p",
            "Q:SHOW data_directory_mode",
            "Q:IDENTIFY_SYSTEM",
            "Q:CREATE_REPLICATION_SLOT \"capslot\" PHYSICAL",
            "X",
        ])
    );
    assert_eq!(
        parse_command("CREATE_REPLICATION_SLOT \"capslot\" PHYSICAL").unwrap(),
        ReplicationCommand::CreateReplicationSlot {
            slot_name: "capslot".into(),
            temporary: false,
            reserve_wal: false
        }
    );
}

#[test]
fn pg_receivewal_streaming() {
    let s = replay("pg_receivewal-scram.2.jsonl");
    s.check_common("pg_receivewal");
    let script = s.server_script();
    assert_eq!(
        script,
        strings(&[
            "R10",
            "R11",
            "R12",
            "R0",
            "K",
            "Z",
            "T:data_directory_mode",
            "D",
            "C:SHOW",
            "Z",
            "T:systemid",
            "D",
            "C:IDENTIFY_SYSTEM",
            "Z",
            "T:wal_segment_size",
            "D",
            "C:SHOW",
            "Z",
            "T:systemid",
            "D",
            "C:IDENTIFY_SYSTEM",
            "Z",
            "T:slot_type",
            "D",
            "C:READ_REPLICATION_SLOT",
            "Z",
            "T:systemid",
            "D",
            "C:IDENTIFY_SYSTEM",
            "Z",
            "W",
        ])
    );
    assert_eq!(
        s.client_script(),
        strings(&[
            "p",
            "p",
            "Q:SHOW data_directory_mode",
            "Q:IDENTIFY_SYSTEM",
            "Q:SHOW wal_segment_size",
            "Q:IDENTIFY_SYSTEM",
            "Q:READ_REPLICATION_SLOT capslot",
            "Q:IDENTIFY_SYSTEM",
            "Q:START_REPLICATION SLOT \"capslot\" 0/1000000 TIMELINE 1",
        ])
    );
    // The CopyBothResponse is exactly W, length 7, 0, 0.
    let w = s
        .server
        .messages
        .iter()
        .find(|m| m.msg == BackendMessage::CopyBothResponse)
        .unwrap();
    assert_eq!(w.raw, b"W\0\0\0\x07\0\0\0");
    // pg_receivewal's status updates: flush reported (it has a slot), apply 0.
    let updates: Vec<_> = s
        .client
        .messages
        .iter()
        .filter_map(|m| match m.msg {
            FrontendMessage::StandbyStatusUpdate(u) => Some(u),
            _ => None,
        })
        .collect();
    assert_eq!(updates.len(), s.count_client("r"));
    assert!(updates.len() >= 3);
    assert!(updates.iter().all(|u| u.apply == Lsn(0)));
    assert_eq!(updates[0].write, Lsn(0x100_0000));
    assert!(updates.windows(2).all(|p| p[0].write <= p[1].write));
    // The stream starts at the segment boundary it asked for.
    let xlog = s.check_wal_continuity();
    // 43 XLogData headers survive the capture's 4 KiB cut; the rest lie in cut bytes.
    assert!(xlog >= 40, "only {xlog} XLogData headers seen");
    assert_eq!(s.server.xlog[0].wal_start, 0x100_0000);
}

#[test]
fn postgresql_standby_streaming() {
    let s = replay("pg15-standby-from-primary.1.jsonl");
    s.check_common("standby_a");
    assert_eq!(
        s.server_script(),
        strings(&[
            "R10",
            "R11",
            "R12",
            "R0",
            "K",
            "Z",
            "T:systemid",
            "D",
            "C:IDENTIFY_SYSTEM",
            "Z",
            "W"
        ])
    );
    let script = s.client_script();
    assert_eq!(script[..3], strings(&["p", "p", "Q:IDENTIFY_SYSTEM"]));
    assert!(script[3].starts_with("Q:START_REPLICATION "), "{script:?}");
    assert_eq!(script.last().unwrap(), "X");
    // The walreceiver's feedback: status updates and hot standby feedback (xmin 0: off).
    assert!(s.count_client("r") > 10);
    let hs: Vec<_> = s
        .client
        .messages
        .iter()
        .filter_map(|m| match m.msg {
            FrontendMessage::HotStandbyFeedback(h) => Some(h),
            _ => None,
        })
        .collect();
    assert!(!hs.is_empty());
    assert!(hs.iter().all(|h| h.xmin == 0 && h.catalog_xmin == 0));
    // Keepalives would be decoded as exactly 18-byte payloads (the codec refuses any other
    // size), but none of the captures keeps one whole: they all sit in cut reads.
    assert!(s
        .server
        .messages
        .iter()
        .all(|m| !matches!(m.msg, BackendMessage::PrimaryKeepalive(_)) || m.raw.len() == 5 + 18));
    assert!(s.check_wal_continuity() >= 5);
}

#[test]
fn cascade_timeline_switch() {
    let s = replay("pg15-cascade-timeline-switch.1.jsonl");
    s.check_common("standby_b");
    assert_eq!(
        s.server_script(),
        strings(&[
            "R10",
            "R11",
            "R12",
            "R0",
            "K",
            "Z",
            "T:systemid",
            "D",
            "C:IDENTIFY_SYSTEM",
            "Z",
            "W",
            "c",
            "T:next_tli",
            "D",
            "C:START_STREAMING",
            "C:START_REPLICATION",
            "Z",
            "T:filename",
            "D",
            "C:TIMELINE_HISTORY",
            "Z",
            "T:systemid",
            "D",
            "C:IDENTIFY_SYSTEM",
            "Z",
            "W",
        ])
    );
    assert_eq!(
        s.client_script(),
        strings(&[
            "p",
            "p",
            "Q:IDENTIFY_SYSTEM",
            "Q:START_REPLICATION 0/5000000 TIMELINE 1",
            "c",
            "Q:TIMELINE_HISTORY 2",
            "Q:IDENTIFY_SYSTEM",
            "Q:START_REPLICATION 0/5000000 TIMELINE 2",
            "X",
        ])
    );
    // The promotion shows up as a ParameterStatus between the end of streaming and Z.
    assert!(s.server_labels().contains(&"S:in_hot_standby".to_string()));
    // The history file content is the raw bytes, and the end-of-timeline row points at it.
    let history = s
        .server
        .messages
        .iter()
        .find_map(|m| match &m.msg {
            BackendMessage::DataRow(r)
                if r.len() == 2 && r[0].as_deref() == Some(b"00000002.history") =>
            {
                r[1].clone()
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(
        history,
        Bytes::from_static(b"1\t0/5046A00\tno recovery target specified\n")
    );
    // A historic stream's XLogData report the switch point as their end.
    let tl1: Vec<_> = s.server.xlog.iter().filter(|x| x.stream == 1).collect();
    assert!(!tl1.is_empty());
    assert!(tl1.iter().all(|x| x.wal_end == 0x5046A00), "{tl1:?}");
    // Timeline 2 restarts at the segment start the client asked for.
    let tl2: Vec<_> = s.server.xlog.iter().filter(|x| x.stream == 2).collect();
    assert_eq!(tl2[0].wal_start, 0x500_0000);
    // Two XLogData at the very end of the capture are whole and decode with their WAL.
    let whole: Vec<_> = s
        .server
        .messages
        .iter()
        .filter_map(|m| match &m.msg {
            BackendMessage::XLogData(x) => Some(x),
            _ => None,
        })
        .collect();
    assert!(!whole.is_empty());
    assert!(whole
        .iter()
        .all(|x| x.data.len() as u64 + x.wal_start.0 <= x.wal_end.0));
    s.check_wal_continuity();
}
