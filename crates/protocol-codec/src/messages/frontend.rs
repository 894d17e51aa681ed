//! Frontend messages: what a client sends after the startup packet.

use bytes::{BufMut, Bytes, BytesMut};
use wal_types::{Lsn, PgTimestamp};

use crate::error::{CodecError, Result};
use crate::wire::{put_cstr, write_frame, Body};

/// A message from client to server after the startup phase.
///
/// Format: `Byte1 tag, Int32 len (counts itself and the body), body`:
/// ```text
/// 'Q' Query              String query
/// 'p' PasswordMessage    raw body; its layout depends on the authentication exchange:
///                          cleartext or md5:     String password
///                          SASLInitialResponse:  String mechanism, Int32 n (-1: none), Byte[n]
///                          SASLResponse:         Byte[len - 4]
/// 'd' CopyData           Byte[len - 4]; in replication, one of the payloads below
/// 'c' CopyDone           (empty)
/// 'f' CopyFail           String reason
/// 'X' Terminate          (empty)
/// 'P' 'B' 'D' 'E' 'C'    Parse, Bind, Describe, Execute, Close: the extended query protocol,
///                        which a replication connection refuses; kept whole, unread
/// 'S' Sync               (empty)
/// 'H' Flush              (empty)
/// 'F' FunctionCall       kept whole, unread (refused too)
/// ```
/// A server cannot tell the three `'p'` layouts apart without knowing where authentication
/// stands, so it decodes every `'p'` as [`FrontendMessage::PasswordMessage`] and interprets
/// it with [`parse_password`], [`parse_sasl_initial_response`] or [`parse_sasl_response`].
/// [`FrontendMessage::SaslInitialResponse`] and [`FrontendMessage::SaslResponse`] exist for
/// the client side to encode; they decode as `PasswordMessage`.
///
/// CopyData payloads with a known replication sub-type decode to their own variants
/// ([`StandbyStatusUpdate`], [`HotStandbyFeedback`]); any other payload stays
/// [`FrontendMessage::CopyData`], so the server can answer it (PostgreSQL: FATAL 08P01
/// `unexpected message type "x"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrontendMessage {
    Query(String),
    PasswordMessage(Bytes),
    SaslInitialResponse {
        mechanism: String,
        data: Option<Bytes>,
    },
    SaslResponse(Bytes),
    StandbyStatusUpdate(StandbyStatusUpdate),
    HotStandbyFeedback(HotStandbyFeedback),
    CopyData(Bytes),
    CopyDone,
    CopyFail(String),
    Terminate,
    /// A message of the extended query protocol (`tag` is one of [`Self::EXTENDED_QUERY`]).
    ExtendedQuery {
        tag: u8,
        body: Bytes,
    },
    Sync,
    Flush,
    FunctionCall(Bytes),
}

/// The standby's report of how far it has written, flushed and applied WAL.
///
/// Format (CopyData payload, 34 bytes):
/// ```text
/// Byte1 'r', Int64 write, Int64 flush, Int64 apply, Int64 send_time, Byte1 reply_requested
/// ```
/// pg_receivewal sends flush 0 without a slot, and apply 0 always.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandbyStatusUpdate {
    pub write: Lsn,
    pub flush: Lsn,
    pub apply: Lsn,
    pub send_time: PgTimestamp,
    /// The standby asks for an immediate keepalive in return.
    pub reply_requested: bool,
}

impl StandbyStatusUpdate {
    pub const TAG: u8 = b'r';
    pub const LEN: usize = 34;
}

/// The standby's oldest transaction ids, so the primary can hold back vacuum.
///
/// Format (CopyData payload, 25 bytes):
/// ```text
/// Byte1 'h', Int64 send_time, Int32 xmin, Int32 xmin_epoch, Int32 catalog_xmin, Int32 catalog_xmin_epoch
/// ```
/// The xid/epoch pairs are separate Int32s (neon reads each pair as one Int64 and must rotate
/// it). A standby with `hot_standby_feedback = off` sends zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotStandbyFeedback {
    pub send_time: PgTimestamp,
    pub xmin: u32,
    pub xmin_epoch: u32,
    pub catalog_xmin: u32,
    pub catalog_xmin_epoch: u32,
}

impl HotStandbyFeedback {
    pub const TAG: u8 = b'h';
    pub const LEN: usize = 25;
}

impl FrontendMessage {
    pub const QUERY: u8 = b'Q';
    pub const PASSWORD: u8 = b'p';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const COPY_FAIL: u8 = b'f';
    pub const TERMINATE: u8 = b'X';
    /// Parse, Bind, Describe, Execute and Close.
    pub const EXTENDED_QUERY: [u8; 5] = [b'P', b'B', b'D', b'E', b'C'];
    pub const SYNC: u8 = b'S';
    pub const FLUSH: u8 = b'H';
    pub const FUNCTION_CALL: u8 = b'F';

    /// A cleartext password message (also used for md5: pass the `md5...` hash).
    pub fn password(password: &str) -> FrontendMessage {
        let mut b = BytesMut::with_capacity(password.len() + 1);
        b.put_slice(password.as_bytes());
        b.put_u8(0);
        FrontendMessage::PasswordMessage(b.freeze())
    }

    /// The message's type byte on the wire.
    pub fn tag(&self) -> u8 {
        match self {
            FrontendMessage::Query(_) => Self::QUERY,
            FrontendMessage::PasswordMessage(_)
            | FrontendMessage::SaslInitialResponse { .. }
            | FrontendMessage::SaslResponse(_) => Self::PASSWORD,
            FrontendMessage::StandbyStatusUpdate(_)
            | FrontendMessage::HotStandbyFeedback(_)
            | FrontendMessage::CopyData(_) => Self::COPY_DATA,
            FrontendMessage::CopyDone => Self::COPY_DONE,
            FrontendMessage::CopyFail(_) => Self::COPY_FAIL,
            FrontendMessage::Terminate => Self::TERMINATE,
            FrontendMessage::ExtendedQuery { tag, .. } => *tag,
            FrontendMessage::Sync => Self::SYNC,
            FrontendMessage::Flush => Self::FLUSH,
            FrontendMessage::FunctionCall(_) => Self::FUNCTION_CALL,
        }
    }

    /// Decodes the body of a message with tag `tag`. `body` is a slice of the read buffer;
    /// CopyData payloads are sliced from it, not copied.
    pub fn decode(tag: u8, body: Bytes) -> Result<FrontendMessage> {
        match tag {
            Self::QUERY => {
                let mut b = Body::new(body, "Query");
                let query = b.cstr()?;
                b.finish()?;
                Ok(FrontendMessage::Query(query))
            }
            Self::PASSWORD => Ok(FrontendMessage::PasswordMessage(body)),
            Self::COPY_DATA => decode_copy_data(body),
            Self::COPY_DONE => {
                Body::new(body, "CopyDone").finish()?;
                Ok(FrontendMessage::CopyDone)
            }
            Self::COPY_FAIL => {
                let mut b = Body::new(body, "CopyFail");
                let reason = b.cstr()?;
                b.finish()?;
                Ok(FrontendMessage::CopyFail(reason))
            }
            Self::TERMINATE => {
                Body::new(body, "Terminate").finish()?;
                Ok(FrontendMessage::Terminate)
            }
            tag if Self::EXTENDED_QUERY.contains(&tag) => {
                Ok(FrontendMessage::ExtendedQuery { tag, body })
            }
            Self::SYNC => {
                Body::new(body, "Sync").finish()?;
                Ok(FrontendMessage::Sync)
            }
            Self::FLUSH => {
                Body::new(body, "Flush").finish()?;
                Ok(FrontendMessage::Flush)
            }
            Self::FUNCTION_CALL => Ok(FrontendMessage::FunctionCall(body)),
            tag => Err(CodecError::UnknownMessageType {
                tag,
                direction: "frontend",
            }),
        }
    }

    /// Appends the framed message to `dst`. On error `dst` is left as it was.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<()> {
        match self {
            FrontendMessage::Query(q) => {
                write_frame(dst, Self::QUERY, |d| put_cstr(d, q.as_bytes(), "Query"))
            }
            FrontendMessage::PasswordMessage(raw) | FrontendMessage::SaslResponse(raw) => {
                write_frame(dst, Self::PASSWORD, |d| {
                    d.put_slice(raw);
                    Ok(())
                })
            }
            FrontendMessage::SaslInitialResponse { mechanism, data } => {
                write_frame(dst, Self::PASSWORD, |d| {
                    put_cstr(d, mechanism.as_bytes(), "SASL mechanism")?;
                    match data {
                        None => d.put_i32(-1),
                        Some(data) => {
                            let n = i32::try_from(data.len()).map_err(|_| {
                                CodecError::encode("SASLInitialResponse", "data too long")
                            })?;
                            d.put_i32(n);
                            d.put_slice(data);
                        }
                    }
                    Ok(())
                })
            }
            FrontendMessage::StandbyStatusUpdate(s) => write_frame(dst, Self::COPY_DATA, |d| {
                d.put_u8(StandbyStatusUpdate::TAG);
                d.put_u64(s.write.0);
                d.put_u64(s.flush.0);
                d.put_u64(s.apply.0);
                d.put_i64(s.send_time.0);
                d.put_u8(s.reply_requested.into());
                Ok(())
            }),
            FrontendMessage::HotStandbyFeedback(h) => write_frame(dst, Self::COPY_DATA, |d| {
                d.put_u8(HotStandbyFeedback::TAG);
                d.put_i64(h.send_time.0);
                d.put_u32(h.xmin);
                d.put_u32(h.xmin_epoch);
                d.put_u32(h.catalog_xmin);
                d.put_u32(h.catalog_xmin_epoch);
                Ok(())
            }),
            FrontendMessage::CopyData(data) => write_frame(dst, Self::COPY_DATA, |d| {
                d.put_slice(data);
                Ok(())
            }),
            FrontendMessage::CopyDone => write_frame(dst, Self::COPY_DONE, |_| Ok(())),
            FrontendMessage::CopyFail(reason) => write_frame(dst, Self::COPY_FAIL, |d| {
                put_cstr(d, reason.as_bytes(), "CopyFail")
            }),
            FrontendMessage::Terminate => write_frame(dst, Self::TERMINATE, |_| Ok(())),
            FrontendMessage::ExtendedQuery { tag, body } => write_frame(dst, *tag, |d| {
                d.put_slice(body);
                Ok(())
            }),
            FrontendMessage::Sync => write_frame(dst, Self::SYNC, |_| Ok(())),
            FrontendMessage::Flush => write_frame(dst, Self::FLUSH, |_| Ok(())),
            FrontendMessage::FunctionCall(body) => write_frame(dst, Self::FUNCTION_CALL, |d| {
                d.put_slice(body);
                Ok(())
            }),
        }
    }
}

fn decode_copy_data(body: Bytes) -> Result<FrontendMessage> {
    match body.first() {
        Some(&StandbyStatusUpdate::TAG) => {
            if body.len() != StandbyStatusUpdate::LEN {
                return Err(CodecError::malformed(
                    "standby status update",
                    format!(
                        "{} bytes, expected {}",
                        body.len(),
                        StandbyStatusUpdate::LEN
                    ),
                ));
            }
            let mut b = Body::new(body.slice(1..), "standby status update");
            Ok(FrontendMessage::StandbyStatusUpdate(StandbyStatusUpdate {
                write: Lsn(b.u64()?),
                flush: Lsn(b.u64()?),
                apply: Lsn(b.u64()?),
                send_time: PgTimestamp(b.i64()?),
                reply_requested: b.u8()? != 0,
            }))
        }
        Some(&HotStandbyFeedback::TAG) => {
            if body.len() != HotStandbyFeedback::LEN {
                return Err(CodecError::malformed(
                    "hot standby feedback",
                    format!("{} bytes, expected {}", body.len(), HotStandbyFeedback::LEN),
                ));
            }
            let mut b = Body::new(body.slice(1..), "hot standby feedback");
            Ok(FrontendMessage::HotStandbyFeedback(HotStandbyFeedback {
                send_time: PgTimestamp(b.i64()?),
                xmin: b.u32()?,
                xmin_epoch: b.u32()?,
                catalog_xmin: b.u32()?,
                catalog_xmin_epoch: b.u32()?,
            }))
        }
        _ => Ok(FrontendMessage::CopyData(body)),
    }
}

/// A cleartext or md5 PasswordMessage body: one string that fills the message exactly
/// (PostgreSQL: `invalid password packet size`).
pub fn parse_password(body: &Bytes) -> Result<String> {
    let mut b = Body::new(body.clone(), "password packet");
    let password = b.cstr()?;
    b.finish()?;
    Ok(password)
}

/// A SASLInitialResponse body: the mechanism the client chose and its first message (`None`
/// when the client sent length -1).
pub fn parse_sasl_initial_response(body: &Bytes) -> Result<(String, Option<Bytes>)> {
    let mut b = Body::new(body.clone(), "SASLInitialResponse");
    let mechanism = b.cstr()?;
    let n = b.i32()?;
    let data = match n {
        -1 => None,
        n if n < 0 => {
            return Err(CodecError::malformed(
                "SASLInitialResponse",
                format!("invalid data length {n}"),
            ))
        }
        n => Some(b.bytes(n as usize)?),
    };
    b.finish()?;
    Ok((mechanism, data))
}

/// A SASLResponse body: the raw SASL message.
pub fn parse_sasl_response(body: &Bytes) -> Result<Bytes> {
    Ok(body.clone())
}
