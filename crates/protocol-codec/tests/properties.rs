//! Property tests: encode then decode is the identity for every message and command, and
//! decoding arbitrary bytes never panics and never buffers past the codec's limit.

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use protocol_codec::command::{parse_command, ReplicationCommand};
use protocol_codec::messages::{
    parse_sasl_initial_response, CommitPoint, FieldDescription, HotStandbyFeedback,
    PrimaryKeepalive, StandbyStatusUpdate, TransactionStatus, XLogData, CANCEL_REQUEST_CODE,
    GSSENC_REQUEST_CODE, SSL_REQUEST_CODE,
};
use protocol_codec::{
    AuthRequest, BackendMessage, ClientCodec, CodecError, ErrorFields, FrontendMessage,
    ServerCodec, StartupCodec, StartupPacket, MAX_STARTUP_PACKET_LEN,
};
use tokio_util::codec::{Decoder, Encoder};
use wal_types::{Lsn, PgTimestamp, TimelineId};

/// A string without NUL bytes, as every protocol string must be.
fn text() -> impl Strategy<Value = String> {
    "[^\u{0}]{0,16}"
}

fn nonempty_text() -> impl Strategy<Value = String> {
    "[^\u{0}]{1,16}"
}

fn blob() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

fn lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn)
}

fn ts() -> impl Strategy<Value = PgTimestamp> {
    any::<i64>().prop_map(PgTimestamp)
}

fn auth_request() -> impl Strategy<Value = AuthRequest> {
    prop_oneof![
        Just(AuthRequest::Ok),
        Just(AuthRequest::CleartextPassword),
        any::<[u8; 4]>().prop_map(|salt| AuthRequest::Md5Password { salt }),
        vec(nonempty_text(), 0..3).prop_map(|mechanisms| AuthRequest::Sasl { mechanisms }),
        blob().prop_map(AuthRequest::SaslContinue),
        blob().prop_map(AuthRequest::SaslFinal),
    ]
}

fn field() -> impl Strategy<Value = FieldDescription> {
    (
        text(),
        any::<u32>(),
        any::<i16>(),
        any::<u32>(),
        any::<i16>(),
        any::<i32>(),
        any::<i16>(),
    )
        .prop_map(
            |(name, table_oid, column_id, type_oid, type_len, type_modifier, format)| {
                FieldDescription {
                    name,
                    table_oid,
                    column_id,
                    type_oid,
                    type_len,
                    type_modifier,
                    format,
                }
            },
        )
}

fn error_fields() -> impl Strategy<Value = ErrorFields> {
    vec((1u8.., text()), 0..6).prop_map(|fields| ErrorFields { fields })
}

/// CopyData payloads that are not one of the typed sub-messages of `typed`.
fn other_copy_data(typed: &'static [u8]) -> impl Strategy<Value = Bytes> {
    blob().prop_filter("typed sub-message", move |b| {
        b.first().is_none_or(|t| !typed.contains(t))
    })
}

fn backend_message() -> impl Strategy<Value = BackendMessage> {
    prop_oneof![
        auth_request().prop_map(BackendMessage::Authentication),
        (text(), text()).prop_map(|(name, value)| BackendMessage::ParameterStatus { name, value }),
        (any::<i32>(), any::<i32>())
            .prop_map(|(pid, key)| BackendMessage::BackendKeyData { pid, key }),
        prop_oneof![
            Just(TransactionStatus::Idle),
            Just(TransactionStatus::InTransaction),
            Just(TransactionStatus::Failed)
        ]
        .prop_map(BackendMessage::ReadyForQuery),
        vec(field(), 0..4).prop_map(BackendMessage::RowDescription),
        vec(option::of(blob()), 0..4).prop_map(BackendMessage::DataRow),
        text().prop_map(BackendMessage::CommandComplete),
        Just(BackendMessage::EmptyQueryResponse),
        error_fields().prop_map(BackendMessage::ErrorResponse),
        error_fields().prop_map(BackendMessage::NoticeResponse),
        Just(BackendMessage::CopyBothResponse),
        (lsn(), lsn(), ts(), blob()).prop_map(|(wal_start, wal_end, send_time, data)| {
            BackendMessage::XLogData(XLogData {
                wal_start,
                wal_end,
                send_time,
                data,
            })
        }),
        (lsn(), ts(), any::<bool>()).prop_map(|(wal_end, send_time, reply_requested)| {
            BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
                wal_end,
                send_time,
                reply_requested,
            })
        }),
        (lsn(), lsn()).prop_map(|(commit_point, flushed)| {
            BackendMessage::CommitPoint(CommitPoint {
                commit_point,
                flushed,
            })
        }),
        other_copy_data(b"wkC").prop_map(BackendMessage::CopyData),
        Just(BackendMessage::CopyDone),
        (any::<u16>(), vec(text(), 0..3)).prop_map(|(newest_minor, unrecognized)| {
            BackendMessage::NegotiateProtocolVersion {
                newest_minor,
                unrecognized,
            }
        }),
    ]
}

fn frontend_message() -> impl Strategy<Value = FrontendMessage> {
    prop_oneof![
        text().prop_map(FrontendMessage::Query),
        blob().prop_map(FrontendMessage::PasswordMessage),
        (text(), option::of(blob())).prop_map(|(mechanism, data)| {
            FrontendMessage::SaslInitialResponse { mechanism, data }
        }),
        blob().prop_map(FrontendMessage::SaslResponse),
        (lsn(), lsn(), lsn(), ts(), any::<bool>()).prop_map(
            |(write, flush, apply, send_time, reply_requested)| {
                FrontendMessage::StandbyStatusUpdate(StandbyStatusUpdate {
                    write,
                    flush,
                    apply,
                    send_time,
                    reply_requested,
                })
            }
        ),
        (ts(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(send_time, xmin, xmin_epoch, catalog_xmin, catalog_xmin_epoch)| {
                FrontendMessage::HotStandbyFeedback(HotStandbyFeedback {
                    send_time,
                    xmin,
                    xmin_epoch,
                    catalog_xmin,
                    catalog_xmin_epoch,
                })
            }
        ),
        other_copy_data(b"rh").prop_map(FrontendMessage::CopyData),
        Just(FrontendMessage::CopyDone),
        text().prop_map(FrontendMessage::CopyFail),
        Just(FrontendMessage::Terminate),
        (
            prop::sample::select(FrontendMessage::EXTENDED_QUERY.to_vec()),
            prop::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(tag, body)| FrontendMessage::ExtendedQuery {
                tag,
                body: body.into()
            }),
        Just(FrontendMessage::Sync),
        Just(FrontendMessage::Flush),
        prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| FrontendMessage::FunctionCall(b.into())),
    ]
}

fn startup_packet() -> impl Strategy<Value = StartupPacket> {
    let special = [SSL_REQUEST_CODE, GSSENC_REQUEST_CODE, CANCEL_REQUEST_CODE];
    prop_oneof![
        Just(StartupPacket::SslRequest),
        Just(StartupPacket::GssEncRequest),
        (any::<i32>(), any::<i32>())
            .prop_map(|(pid, key)| StartupPacket::CancelRequest { pid, key }),
        // Version 3 most of the time (the packets a server reads on), any other now and then.
        (
            prop_oneof![3 => (Just(3u16), any::<u16>()), 1 => any::<(u16, u16)>()],
            vec((nonempty_text(), text()), 0..5)
        )
            .prop_filter("a request code", move |(p, _)| {
                !special.contains(&(((p.0 as u32) << 16 | p.1 as u32) as i32))
            })
            .prop_map(|(protocol, params)| StartupPacket::Startup { protocol, params }),
    ]
}

proptest! {
    #[test]
    fn backend_messages_round_trip(msgs in vec(backend_message(), 1..5)) {
        let mut buf = BytesMut::new();
        for m in &msgs {
            ServerCodec::new().encode(m, &mut buf).unwrap();
        }
        let mut codec = ClientCodec::new();
        for m in &msgs {
            let got = codec.decode(&mut buf).unwrap();
            prop_assert_eq!(got.as_ref(), Some(m));
        }
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn frontend_messages_round_trip(msgs in vec(frontend_message(), 1..5)) {
        let mut buf = BytesMut::new();
        for m in &msgs {
            ClientCodec::new().encode(m, &mut buf).unwrap();
        }
        let mut codec = ServerCodec::new();
        for m in &msgs {
            let got = codec.decode(&mut buf).unwrap().unwrap();
            match (m, &got) {
                // The server cannot tell SASL messages from passwords: it decodes the raw body.
                (
                    FrontendMessage::SaslInitialResponse { mechanism, data },
                    FrontendMessage::PasswordMessage(raw),
                ) => {
                    let (m2, d2) = parse_sasl_initial_response(raw).unwrap();
                    prop_assert_eq!(&m2, mechanism);
                    prop_assert_eq!(&d2, data);
                }
                (FrontendMessage::SaslResponse(b), FrontendMessage::PasswordMessage(raw)) => {
                    prop_assert_eq!(b, raw);
                }
                _ => prop_assert_eq!(&got, m),
            }
        }
        prop_assert!(buf.is_empty());
    }

    /// Every packet round-trips, but for a StartupMessage of another major version than 3,
    /// which the decoder refuses for its version (as PostgreSQL 15 does), whatever it holds.
    #[test]
    fn startup_packets_round_trip(p in startup_packet()) {
        let mut buf = BytesMut::new();
        match StartupCodec.encode(p.clone(), &mut buf) {
            Ok(()) => match &p {
                StartupPacket::Startup { protocol, .. } if protocol.0 != 3 => {
                    let e = StartupCodec.decode(&mut buf).unwrap_err();
                    prop_assert!(
                        matches!(e, CodecError::UnsupportedProtocol { major, minor }
                            if (major, minor) == *protocol),
                        "{:?}", e
                    );
                }
                _ => {
                    prop_assert_eq!(StartupCodec.decode(&mut buf).unwrap(), Some(p));
                    prop_assert!(buf.is_empty());
                }
            },
            // Only a packet over the 10 000-byte cap may fail to encode, and it leaves nothing.
            Err(_) => prop_assert!(buf.is_empty()),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_or_overbuffer(data in vec(any::<u8>(), 0..2048), max in 0usize..4096) {
        let bound = |input: usize| 2 * input.max(max + 5) + 64;
        let mut src = BytesMut::from(&data[..]);
        while let Ok(Some(_)) = ServerCodec::with_max_message_len(max).decode(&mut src) {}
        prop_assert!(src.capacity() <= bound(data.len()), "capacity {}", src.capacity());
        let mut src = BytesMut::from(&data[..]);
        while let Ok(Some(_)) = ClientCodec::with_max_message_len(max).decode(&mut src) {}
        prop_assert!(src.capacity() <= bound(data.len()), "capacity {}", src.capacity());
        let mut src = BytesMut::from(&data[..]);
        while let Ok(Some(_)) = StartupCodec.decode(&mut src) {}
        prop_assert!(src.capacity() <= 2 * data.len().max(MAX_STARTUP_PACKET_LEN) + 64);
    }

    /// Random bytes after a valid frame header: the body parsers see garbage of every shape.
    #[test]
    fn garbage_bodies_never_panic(tag in any::<u8>(), body in vec(any::<u8>(), 0..256)) {
        let mut framed = vec![tag];
        framed.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        framed.extend_from_slice(&body);
        let _ = ServerCodec::new().decode(&mut BytesMut::from(&framed[..]));
        let _ = ClientCodec::new().decode(&mut BytesMut::from(&framed[..]));
    }
}

/// An identifier as a client might write it: bare when that reads back the same, else quoted.
fn ident(name: &str, quote_always: bool) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if bare && !quote_always {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Writes a command with random surface syntax: keyword case, spacing, quoting, legacy or
/// parenthesised slot options, an optional PHYSICAL and a trailing semicolon.
fn render(cmd: &ReplicationCommand, style: u32) -> String {
    let bit = |n: u32| style & (1 << n) != 0;
    let kw = |k: &str| {
        if bit(0) {
            k.to_ascii_lowercase()
        } else {
            k.to_string()
        }
    };
    let sp = if bit(1) { "  \t" } else { " " };
    let q = bit(2);
    let mut out = match cmd {
        ReplicationCommand::IdentifySystem => kw("IDENTIFY_SYSTEM"),
        ReplicationCommand::Show { name } => {
            // Dotted parts where the name splits into non-empty ones, else one quoted name.
            let target = if name.split('.').any(str::is_empty) {
                ident(name, true)
            } else {
                let parts: Vec<String> = name.split('.').map(|p| ident(p, q)).collect();
                parts.join(".")
            };
            format!("{}{sp}{target}", kw("SHOW"))
        }
        ReplicationCommand::TimelineHistory { timeline } => {
            format!("{}{sp}{timeline}", kw("TIMELINE_HISTORY"))
        }
        ReplicationCommand::CreateReplicationSlot {
            slot_name,
            temporary,
            reserve_wal,
        } => {
            let mut s = format!(
                "{}{sp}{}",
                kw("CREATE_REPLICATION_SLOT"),
                ident(slot_name, q)
            );
            if *temporary {
                s += &format!("{sp}{}", kw("TEMPORARY"));
            }
            s += &format!("{sp}{}", kw("PHYSICAL"));
            match (*reserve_wal, bit(3)) {
                (true, false) => s += &format!("{sp}{}", kw("RESERVE_WAL")),
                (true, true) => s += &format!("{sp}( {}{sp})", kw("RESERVE_WAL")),
                (false, true) => s += &format!("{sp}({} false)", kw("RESERVE_WAL")),
                (false, false) => {}
            }
            s
        }
        ReplicationCommand::ReadReplicationSlot { slot_name } => {
            format!("{}{sp}{}", kw("READ_REPLICATION_SLOT"), ident(slot_name, q))
        }
        ReplicationCommand::DropReplicationSlot { slot_name, wait } => {
            let mut s = format!("{}{sp}{}", kw("DROP_REPLICATION_SLOT"), ident(slot_name, q));
            if *wait {
                s += &format!("{sp}{}", kw("WAIT"));
            }
            s
        }
        ReplicationCommand::StartReplication {
            slot_name,
            start,
            timeline,
        } => {
            let mut s = kw("START_REPLICATION");
            if let Some(slot) = slot_name {
                s += &format!("{sp}{}{sp}{}", kw("SLOT"), ident(slot, q));
            }
            if bit(3) {
                s += &format!("{sp}{}", kw("PHYSICAL"));
            }
            let lsn = if bit(4) {
                format!("{:X}/{:08X}", start.0 >> 32, start.0 as u32)
            } else {
                start.to_string()
            };
            s += &format!("{sp}{lsn}");
            if let Some(t) = timeline {
                s += &format!("{sp}{}{sp}{t}", kw("TIMELINE"));
            }
            s
        }
        other => other.to_string(),
    };
    if bit(5) {
        out.push(';');
    }
    if bit(6) {
        out = format!("\n {out} \n");
    }
    out
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z_][a-z0-9_]{0,10}", "[^\u{0}]{1,12}"]
}

fn command() -> impl Strategy<Value = ReplicationCommand> {
    let tli = (1u32..).prop_map(TimelineId);
    prop_oneof![
        Just(ReplicationCommand::IdentifySystem),
        vec("[a-z_][a-z0-9_]{0,10}|[^\u{0}]{1,8}", 1..3)
            .prop_map(|p| ReplicationCommand::Show { name: p.join(".") }),
        tli.clone()
            .prop_map(|timeline| ReplicationCommand::TimelineHistory { timeline }),
        (name(), any::<bool>(), any::<bool>()).prop_map(|(slot_name, temporary, reserve_wal)| {
            ReplicationCommand::CreateReplicationSlot {
                slot_name,
                temporary,
                reserve_wal,
            }
        }),
        name().prop_map(|slot_name| ReplicationCommand::ReadReplicationSlot { slot_name }),
        (name(), any::<bool>()).prop_map(|(slot_name, wait)| {
            ReplicationCommand::DropReplicationSlot { slot_name, wait }
        }),
        (option::of(name()), any::<u64>(), option::of(tli)).prop_map(
            |(slot_name, start, timeline)| {
                ReplicationCommand::StartReplication {
                    slot_name,
                    start: Lsn(start),
                    timeline,
                }
            }
        ),
    ]
}

proptest! {
    #[test]
    fn commands_round_trip(cmd in command(), style in any::<u32>()) {
        prop_assert_eq!(parse_command(&cmd.to_string()), Ok(cmd.clone()));
        let text = render(&cmd, style);
        prop_assert_eq!(parse_command(&text), Ok(cmd), "{:?}", text);
    }

    #[test]
    fn command_parser_never_panics(text in "\\PC{0,64}") {
        let _ = parse_command(&text);
    }

    #[test]
    fn command_parser_never_panics_near_keywords(
        kw in prop_oneof![
            Just("START_REPLICATION"),
            Just("CREATE_REPLICATION_SLOT"),
            Just("DROP_REPLICATION_SLOT"),
            Just("SHOW"),
            Just("TIMELINE_HISTORY"),
        ],
        rest in "[ a-zA-Z0-9_/();,'\".=]{0,40}",
    ) {
        let _ = parse_command(&format!("{kw} {rest}"));
    }
}
