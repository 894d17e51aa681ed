//! Backend messages: what a server sends.

use bytes::{BufMut, Bytes, BytesMut};
use wal_types::{Lsn, PgTimestamp};

use crate::error::{CodecError, Result};
use crate::messages::ErrorFields;
use crate::wire::{put_cstr, write_frame, Body};

/// A message from server to client.
///
/// Format: `Byte1 tag, Int32 len (counts itself and the body), body`:
/// ```text
/// 'R' Authentication           Int32 code, then per code (see AuthRequest)
/// 'S' ParameterStatus          String name, String value
/// 'K' BackendKeyData           Int32 pid, Int32 key
/// 'Z' ReadyForQuery            Byte1 'I' | 'T' | 'E'
/// 'T' RowDescription           Int16 n, n × FieldDescription
/// 'D' DataRow                  Int16 n, n × { Int32 len (-1: NULL), Byte[len] }
/// 'C' CommandComplete          String tag
/// 'I' EmptyQueryResponse       (empty)
/// 'E' ErrorResponse            ErrorFields
/// 'N' NoticeResponse           ErrorFields
/// 'W' CopyBothResponse         Int8 0 (text), Int16 0 (columns): always exactly these 3 bytes
/// 'd' CopyData                 Byte[len - 4]; in replication XLogData or PrimaryKeepalive
/// 'c' CopyDone                 (empty)
/// 'v' NegotiateProtocolVersion Int32 newest version (3 << 16 | minor), Int32 n, n × String
/// ```
/// CopyData with sub-type `'w'` or `'k'` decodes to [`BackendMessage::XLogData`] or
/// [`BackendMessage::PrimaryKeepalive`], walserver's own `'C'` to
/// [`BackendMessage::CommitPoint`]; any other payload stays [`BackendMessage::CopyData`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendMessage {
    Authentication(AuthRequest),
    ParameterStatus {
        name: String,
        value: String,
    },
    BackendKeyData {
        pid: i32,
        key: i32,
    },
    ReadyForQuery(TransactionStatus),
    RowDescription(Vec<FieldDescription>),
    DataRow(Vec<Option<Bytes>>),
    CommandComplete(String),
    EmptyQueryResponse,
    ErrorResponse(ErrorFields),
    NoticeResponse(ErrorFields),
    CopyBothResponse,
    XLogData(XLogData),
    PrimaryKeepalive(PrimaryKeepalive),
    CommitPoint(CommitPoint),
    CopyData(Bytes),
    CopyDone,
    NegotiateProtocolVersion {
        newest_minor: u16,
        unrecognized: Vec<String>,
    },
}

/// An authentication request, the body of `'R'`.
///
/// Format: `Int32 code` followed by
/// ```text
/// 0  Ok
/// 3  CleartextPassword
/// 5  MD5Password     Byte4 salt
/// 10 SASL            { String mechanism }*, Byte1 0
/// 11 SASLContinue    Byte[n] server-first-message
/// 12 SASLFinal       Byte[n] server-final-message
/// ```
/// Kerberos, SCM, GSS and SSPI requests (2, 6, 7, 8, 9) are not supported and do not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthRequest {
    Ok,
    CleartextPassword,
    Md5Password { salt: [u8; 4] },
    Sasl { mechanisms: Vec<String> },
    SaslContinue(Bytes),
    SaslFinal(Bytes),
}

/// The transaction state in ReadyForQuery. A walsender is always `Idle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransactionStatus {
    Idle,
    InTransaction,
    Failed,
}

impl TransactionStatus {
    pub fn byte(self) -> u8 {
        match self {
            TransactionStatus::Idle => b'I',
            TransactionStatus::InTransaction => b'T',
            TransactionStatus::Failed => b'E',
        }
    }
}

/// One column of a RowDescription.
///
/// Format: `String name, Int32 table_oid, Int16 column_id, Int32 type_oid, Int16 type_len,
/// Int32 type_modifier, Int16 format`. Replication results use table 0, column 0, format 0
/// (text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDescription {
    pub name: String,
    pub table_oid: u32,
    pub column_id: i16,
    pub type_oid: u32,
    pub type_len: i16,
    pub type_modifier: i32,
    pub format: i16,
}

/// A chunk of WAL, as the walsender streams it.
///
/// Format (CopyData payload, 25 + n bytes):
/// ```text
/// Byte1 'w', Int64 wal_start, Int64 wal_end, Int64 send_time, Byte[n] data
/// ```
/// `wal_start` is the LSN of `data[0]`; `wal_end` is the server's flush position (on a
/// historic timeline, its switch point). Decoding slices `data` out of the read buffer without
/// copying it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XLogData {
    pub wal_start: Lsn,
    pub wal_end: Lsn,
    pub send_time: PgTimestamp,
    pub data: Bytes,
}

impl XLogData {
    pub const TAG: u8 = b'w';
    /// The payload's fixed part, before the WAL bytes.
    pub const HEADER_LEN: usize = 25;
    /// Everything in front of the WAL bytes on the wire: `'d'`, the length, and the 25 bytes.
    pub const FRAMED_HEADER_LEN: usize = 5 + Self::HEADER_LEN;

    /// The bytes in front of `data` on the wire, for a writer that sends the header and the
    /// WAL from separate buffers (vectored I/O) instead of copying the WAL into one frame.
    /// Fails only if the message would exceed a length field.
    pub fn framed_header(&self) -> Result<[u8; Self::FRAMED_HEADER_LEN]> {
        Self::framed_header_for(
            self.wal_start,
            self.wal_end,
            self.send_time,
            self.data.len(),
        )
    }

    /// The same header for `data_len` bytes of WAL that are not in memory (a writer that sends
    /// them from a file with `sendfile`).
    pub fn framed_header_for(
        wal_start: Lsn,
        wal_end: Lsn,
        send_time: PgTimestamp,
        data_len: usize,
    ) -> Result<[u8; Self::FRAMED_HEADER_LEN]> {
        let len = i32::try_from(4 + Self::HEADER_LEN + data_len)
            .map_err(|_| CodecError::encode("XLogData", "data too long"))?;
        let mut h = [0u8; Self::FRAMED_HEADER_LEN];
        h[0] = BackendMessage::COPY_DATA;
        h[1..5].copy_from_slice(&len.to_be_bytes());
        h[5] = Self::TAG;
        h[6..14].copy_from_slice(&wal_start.0.to_be_bytes());
        h[14..22].copy_from_slice(&wal_end.0.to_be_bytes());
        h[22..30].copy_from_slice(&send_time.0.to_be_bytes());
        Ok(h)
    }
}

/// The walsender's keepalive.
///
/// Format (CopyData payload, exactly 18 bytes; PostgreSQL's walreceiver rejects any other
/// size):
/// ```text
/// Byte1 'k', Int64 wal_end, Int64 send_time, Byte1 reply_requested
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrimaryKeepalive {
    pub wal_end: Lsn,
    pub send_time: PgTimestamp,
    pub reply_requested: bool,
}

impl PrimaryKeepalive {
    pub const TAG: u8 = b'k';
    pub const LEN: usize = 18;
}

/// walserver's report of the overlapped commit's commit point, sent only on a stream whose
/// client set [`crate::ACCEPTS_UNFLUSHED_PARAM`] (PostgreSQL never sends sub-type `'C'`, and
/// a PostgreSQL client is never sent it). `commit_point` is the highest LSN the sender knows
/// to be acknowledged (durable on the primary and on its synchronous quorum); `flushed` is
/// the sender's own durable end. The receiver serves its readers nothing beyond
/// `commit_point`; WAL it holds past it may be cut back at its next stream start.
///
/// Format (CopyData payload, exactly 17 bytes):
/// ```text
/// Byte1 'C', Int64 commit_point, Int64 flushed
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitPoint {
    pub commit_point: Lsn,
    pub flushed: Lsn,
}

impl CommitPoint {
    pub const TAG: u8 = b'C';
    pub const LEN: usize = 17;
}

impl BackendMessage {
    pub const AUTHENTICATION: u8 = b'R';
    pub const PARAMETER_STATUS: u8 = b'S';
    pub const BACKEND_KEY_DATA: u8 = b'K';
    pub const READY_FOR_QUERY: u8 = b'Z';
    pub const ROW_DESCRIPTION: u8 = b'T';
    pub const DATA_ROW: u8 = b'D';
    pub const COMMAND_COMPLETE: u8 = b'C';
    pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
    pub const ERROR_RESPONSE: u8 = b'E';
    pub const NOTICE_RESPONSE: u8 = b'N';
    pub const COPY_BOTH_RESPONSE: u8 = b'W';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';

    /// A short name of the message, for error texts.
    pub fn name(&self) -> &'static str {
        match self {
            BackendMessage::Authentication(_) => "authentication request",
            BackendMessage::ParameterStatus { .. } => "ParameterStatus",
            BackendMessage::BackendKeyData { .. } => "BackendKeyData",
            BackendMessage::ReadyForQuery(_) => "ReadyForQuery",
            BackendMessage::RowDescription(_) => "RowDescription",
            BackendMessage::DataRow(_) => "DataRow",
            BackendMessage::CommandComplete(_) => "CommandComplete",
            BackendMessage::EmptyQueryResponse => "EmptyQueryResponse",
            BackendMessage::ErrorResponse(_) => "ErrorResponse",
            BackendMessage::NoticeResponse(_) => "NoticeResponse",
            BackendMessage::CopyBothResponse => "CopyBothResponse",
            BackendMessage::XLogData(_) => "XLogData",
            BackendMessage::PrimaryKeepalive(_) => "primary keepalive",
            BackendMessage::CommitPoint(_) => "commit point",
            BackendMessage::CopyData(_) => "CopyData",
            BackendMessage::CopyDone => "CopyDone",
            BackendMessage::NegotiateProtocolVersion { .. } => "NegotiateProtocolVersion",
        }
    }

    /// Decodes the body of a message with tag `tag`. `body` is a slice of the read buffer;
    /// XLogData's WAL bytes are sliced from it, not copied.
    pub fn decode(tag: u8, body: Bytes) -> Result<BackendMessage> {
        match tag {
            Self::AUTHENTICATION => decode_auth(body).map(BackendMessage::Authentication),
            Self::PARAMETER_STATUS => {
                let mut b = Body::new(body, "ParameterStatus");
                let name = b.cstr()?;
                let value = b.cstr()?;
                b.finish()?;
                Ok(BackendMessage::ParameterStatus { name, value })
            }
            Self::BACKEND_KEY_DATA => {
                let mut b = Body::new(body, "BackendKeyData");
                let pid = b.i32()?;
                let key = b.i32()?;
                b.finish()?;
                Ok(BackendMessage::BackendKeyData { pid, key })
            }
            Self::READY_FOR_QUERY => {
                let mut b = Body::new(body, "ReadyForQuery");
                let status = match b.u8()? {
                    b'I' => TransactionStatus::Idle,
                    b'T' => TransactionStatus::InTransaction,
                    b'E' => TransactionStatus::Failed,
                    other => {
                        return Err(CodecError::malformed(
                            "ReadyForQuery",
                            format!("unknown transaction status {other:#04x}"),
                        ))
                    }
                };
                b.finish()?;
                Ok(BackendMessage::ReadyForQuery(status))
            }
            Self::ROW_DESCRIPTION => decode_row_description(body),
            Self::DATA_ROW => decode_data_row(body),
            Self::COMMAND_COMPLETE => {
                let mut b = Body::new(body, "CommandComplete");
                let tag = b.cstr()?;
                b.finish()?;
                Ok(BackendMessage::CommandComplete(tag))
            }
            Self::EMPTY_QUERY_RESPONSE => {
                Body::new(body, "EmptyQueryResponse").finish()?;
                Ok(BackendMessage::EmptyQueryResponse)
            }
            Self::ERROR_RESPONSE => {
                decode_fields(body, "ErrorResponse").map(BackendMessage::ErrorResponse)
            }
            Self::NOTICE_RESPONSE => {
                decode_fields(body, "NoticeResponse").map(BackendMessage::NoticeResponse)
            }
            Self::COPY_BOTH_RESPONSE => {
                if body[..] != [0, 0, 0] {
                    return Err(CodecError::malformed(
                        "CopyBothResponse",
                        "expected text format and no columns (0, 0)",
                    ));
                }
                Ok(BackendMessage::CopyBothResponse)
            }
            Self::COPY_DATA => decode_copy_data(body),
            Self::COPY_DONE => {
                Body::new(body, "CopyDone").finish()?;
                Ok(BackendMessage::CopyDone)
            }
            Self::NEGOTIATE_PROTOCOL_VERSION => {
                let mut b = Body::new(body, "NegotiateProtocolVersion");
                let version = b.u32()?;
                if version >> 16 != 3 {
                    return Err(CodecError::malformed(
                        "NegotiateProtocolVersion",
                        format!("major version {} is not 3", version >> 16),
                    ));
                }
                let n = b.i32()?;
                if n < 0 {
                    return Err(CodecError::malformed(
                        "NegotiateProtocolVersion",
                        format!("negative option count {n}"),
                    ));
                }
                // Each option takes at least its terminator, so `remaining` bounds the count.
                let mut unrecognized = Vec::with_capacity((n as usize).min(b.remaining()));
                for _ in 0..n {
                    unrecognized.push(b.cstr()?);
                }
                b.finish()?;
                Ok(BackendMessage::NegotiateProtocolVersion {
                    newest_minor: version as u16,
                    unrecognized,
                })
            }
            tag => Err(CodecError::UnknownMessageType {
                tag,
                direction: "backend",
            }),
        }
    }

    /// Appends the framed message to `dst`. On error `dst` is left as it was. An XLogData's
    /// WAL bytes are copied once, into `dst`.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<()> {
        match self {
            BackendMessage::Authentication(req) => write_frame(dst, Self::AUTHENTICATION, |d| {
                match req {
                    AuthRequest::Ok => d.put_i32(0),
                    AuthRequest::CleartextPassword => d.put_i32(3),
                    AuthRequest::Md5Password { salt } => {
                        d.put_i32(5);
                        d.put_slice(salt);
                    }
                    AuthRequest::Sasl { mechanisms } => {
                        d.put_i32(10);
                        for m in mechanisms {
                            if m.is_empty() {
                                return Err(CodecError::encode(
                                    "AuthenticationSASL",
                                    "empty mechanism name",
                                ));
                            }
                            put_cstr(d, m.as_bytes(), "SASL mechanism")?;
                        }
                        d.put_u8(0);
                    }
                    AuthRequest::SaslContinue(data) => {
                        d.put_i32(11);
                        d.put_slice(data);
                    }
                    AuthRequest::SaslFinal(data) => {
                        d.put_i32(12);
                        d.put_slice(data);
                    }
                }
                Ok(())
            }),
            BackendMessage::ParameterStatus { name, value } => {
                write_frame(dst, Self::PARAMETER_STATUS, |d| {
                    put_cstr(d, name.as_bytes(), "parameter name")?;
                    put_cstr(d, value.as_bytes(), "parameter value")
                })
            }
            BackendMessage::BackendKeyData { pid, key } => {
                write_frame(dst, Self::BACKEND_KEY_DATA, |d| {
                    d.put_i32(*pid);
                    d.put_i32(*key);
                    Ok(())
                })
            }
            BackendMessage::ReadyForQuery(status) => write_frame(dst, Self::READY_FOR_QUERY, |d| {
                d.put_u8(status.byte());
                Ok(())
            }),
            BackendMessage::RowDescription(fields) => {
                write_frame(dst, Self::ROW_DESCRIPTION, |d| {
                    d.put_i16(count(fields.len(), "RowDescription")?);
                    for f in fields {
                        put_cstr(d, f.name.as_bytes(), "column name")?;
                        d.put_u32(f.table_oid);
                        d.put_i16(f.column_id);
                        d.put_u32(f.type_oid);
                        d.put_i16(f.type_len);
                        d.put_i32(f.type_modifier);
                        d.put_i16(f.format);
                    }
                    Ok(())
                })
            }
            BackendMessage::DataRow(values) => write_frame(dst, Self::DATA_ROW, |d| {
                d.put_i16(count(values.len(), "DataRow")?);
                for v in values {
                    match v {
                        None => d.put_i32(-1),
                        Some(v) => {
                            let n = i32::try_from(v.len())
                                .map_err(|_| CodecError::encode("DataRow", "value too long"))?;
                            d.put_i32(n);
                            d.put_slice(v);
                        }
                    }
                }
                Ok(())
            }),
            BackendMessage::CommandComplete(tag) => write_frame(dst, Self::COMMAND_COMPLETE, |d| {
                put_cstr(d, tag.as_bytes(), "command tag")
            }),
            BackendMessage::EmptyQueryResponse => {
                write_frame(dst, Self::EMPTY_QUERY_RESPONSE, |_| Ok(()))
            }
            BackendMessage::ErrorResponse(fields) => {
                write_frame(dst, Self::ERROR_RESPONSE, |d| encode_fields(d, fields))
            }
            BackendMessage::NoticeResponse(fields) => {
                write_frame(dst, Self::NOTICE_RESPONSE, |d| encode_fields(d, fields))
            }
            BackendMessage::CopyBothResponse => write_frame(dst, Self::COPY_BOTH_RESPONSE, |d| {
                d.put_u8(0);
                d.put_i16(0);
                Ok(())
            }),
            BackendMessage::XLogData(x) => {
                let header = x.framed_header()?;
                dst.reserve(header.len() + x.data.len());
                dst.put_slice(&header);
                dst.put_slice(&x.data);
                Ok(())
            }
            BackendMessage::PrimaryKeepalive(k) => write_frame(dst, Self::COPY_DATA, |d| {
                d.put_u8(PrimaryKeepalive::TAG);
                d.put_u64(k.wal_end.0);
                d.put_i64(k.send_time.0);
                d.put_u8(k.reply_requested.into());
                Ok(())
            }),
            BackendMessage::CommitPoint(c) => write_frame(dst, Self::COPY_DATA, |d| {
                d.put_u8(CommitPoint::TAG);
                d.put_u64(c.commit_point.0);
                d.put_u64(c.flushed.0);
                Ok(())
            }),
            BackendMessage::CopyData(data) => write_frame(dst, Self::COPY_DATA, |d| {
                d.put_slice(data);
                Ok(())
            }),
            BackendMessage::CopyDone => write_frame(dst, Self::COPY_DONE, |_| Ok(())),
            BackendMessage::NegotiateProtocolVersion {
                newest_minor,
                unrecognized,
            } => write_frame(dst, Self::NEGOTIATE_PROTOCOL_VERSION, |d| {
                d.put_u32((3 << 16) | u32::from(*newest_minor));
                let n = i32::try_from(unrecognized.len()).map_err(|_| {
                    CodecError::encode("NegotiateProtocolVersion", "too many options")
                })?;
                d.put_i32(n);
                for o in unrecognized {
                    put_cstr(d, o.as_bytes(), "protocol option")?;
                }
                Ok(())
            }),
        }
    }
}

fn count(n: usize, what: &'static str) -> Result<i16> {
    i16::try_from(n).map_err(|_| CodecError::encode(what, format!("{n} columns")))
}

fn decode_auth(body: Bytes) -> Result<AuthRequest> {
    let mut b = Body::new(body, "Authentication");
    let req = match b.i32()? {
        0 => AuthRequest::Ok,
        3 => AuthRequest::CleartextPassword,
        5 => {
            let s = b.bytes(4)?;
            AuthRequest::Md5Password {
                salt: [s[0], s[1], s[2], s[3]],
            }
        }
        10 => {
            let mut mechanisms = Vec::new();
            loop {
                let m = b.cstr()?;
                if m.is_empty() {
                    break;
                }
                mechanisms.push(m);
            }
            AuthRequest::Sasl { mechanisms }
        }
        11 => return Ok(AuthRequest::SaslContinue(b.rest())),
        12 => return Ok(AuthRequest::SaslFinal(b.rest())),
        code => {
            return Err(CodecError::malformed(
                "Authentication",
                format!("unsupported authentication request {code}"),
            ))
        }
    };
    b.finish()?;
    Ok(req)
}

/// The smallest encoded FieldDescription: an empty name's NUL plus 18 bytes of integers.
const MIN_FIELD_LEN: usize = 19;

fn decode_row_description(body: Bytes) -> Result<BackendMessage> {
    let mut b = Body::new(body, "RowDescription");
    let n = b.i16()?;
    if n < 0 {
        return Err(CodecError::malformed(
            "RowDescription",
            format!("negative column count {n}"),
        ));
    }
    let mut fields = Vec::with_capacity((n as usize).min(b.remaining() / MIN_FIELD_LEN));
    for _ in 0..n {
        fields.push(FieldDescription {
            name: b.cstr()?,
            table_oid: b.u32()?,
            column_id: b.i16()?,
            type_oid: b.u32()?,
            type_len: b.i16()?,
            type_modifier: b.i32()?,
            format: b.i16()?,
        });
    }
    b.finish()?;
    Ok(BackendMessage::RowDescription(fields))
}

fn decode_data_row(body: Bytes) -> Result<BackendMessage> {
    let mut b = Body::new(body, "DataRow");
    let n = b.i16()?;
    if n < 0 {
        return Err(CodecError::malformed(
            "DataRow",
            format!("negative column count {n}"),
        ));
    }
    let mut values = Vec::with_capacity((n as usize).min(b.remaining() / 4));
    for _ in 0..n {
        let len = b.i32()?;
        values.push(match len {
            -1 => None,
            len if len < 0 => {
                return Err(CodecError::malformed(
                    "DataRow",
                    format!("invalid value length {len}"),
                ))
            }
            len => Some(b.bytes(len as usize)?),
        });
    }
    b.finish()?;
    Ok(BackendMessage::DataRow(values))
}

fn decode_fields(body: Bytes, what: &'static str) -> Result<ErrorFields> {
    let mut b = Body::new(body, what);
    let mut fields = Vec::new();
    loop {
        let code = b.u8()?;
        if code == 0 {
            break;
        }
        let value = b.cstr_bytes()?;
        fields.push((code, String::from_utf8_lossy(&value).into_owned()));
    }
    b.finish()?;
    Ok(ErrorFields { fields })
}

fn encode_fields(d: &mut BytesMut, fields: &ErrorFields) -> Result<()> {
    for (code, value) in &fields.fields {
        if *code == 0 {
            return Err(CodecError::encode("error field", "field code 0"));
        }
        d.put_u8(*code);
        put_cstr(d, value.as_bytes(), "error field")?;
    }
    d.put_u8(0);
    Ok(())
}

fn decode_copy_data(body: Bytes) -> Result<BackendMessage> {
    match body.first() {
        Some(&XLogData::TAG) => {
            let mut b = Body::new(body, "XLogData");
            let _ = b.u8()?;
            Ok(BackendMessage::XLogData(XLogData {
                wal_start: Lsn(b.u64()?),
                wal_end: Lsn(b.u64()?),
                send_time: PgTimestamp(b.i64()?),
                data: b.rest(),
            }))
        }
        Some(&PrimaryKeepalive::TAG) => {
            if body.len() != PrimaryKeepalive::LEN {
                return Err(CodecError::malformed(
                    "primary keepalive",
                    format!("{} bytes, expected {}", body.len(), PrimaryKeepalive::LEN),
                ));
            }
            let mut b = Body::new(body.slice(1..), "primary keepalive");
            Ok(BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
                wal_end: Lsn(b.u64()?),
                send_time: PgTimestamp(b.i64()?),
                reply_requested: b.u8()? != 0,
            }))
        }
        Some(&CommitPoint::TAG) => {
            if body.len() != CommitPoint::LEN {
                return Err(CodecError::malformed(
                    "commit point",
                    format!("{} bytes, expected {}", body.len(), CommitPoint::LEN),
                ));
            }
            let mut b = Body::new(body.slice(1..), "commit point");
            Ok(BackendMessage::CommitPoint(CommitPoint {
                commit_point: Lsn(b.u64()?),
                flushed: Lsn(b.u64()?),
            }))
        }
        _ => Ok(BackendMessage::CopyData(body)),
    }
}
