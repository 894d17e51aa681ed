//! `tokio_util::codec` framing for both ends of a connection.
//!
//! A connection starts in the untyped startup phase ([`StartupCodec`]); after the server has
//! accepted the StartupMessage both sides switch to typed messages: the server reads with
//! [`ServerCodec`] and the client with [`ClientCodec`]. With `tokio_util::codec::Framed` the
//! switch is `Framed::map_codec`, which keeps the read buffer.
//!
//! Every length is checked before anything is buffered for it: a negative length, one
//! smaller than the length field itself, or one over the codec's maximum is an error, so a
//! hostile peer cannot make us reserve memory it never sends beyond the read-ahead a client
//! chose ([`ClientCodec::with_read_ahead`], none by default).

use bytes::{BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::{CodecError, Result};
use crate::messages::{BackendMessage, FrontendMessage, SslResponse, StartupPacket};

/// The startup phase, server side: decodes [`StartupPacket`]s and encodes the one-byte
/// [`SslResponse`]. The client side encodes [`StartupPacket`]s with it too.
///
/// After decoding an `SslRequest` the server must check that the read buffer is empty before
/// it answers `'S'` ([`crate::messages::ensure_nothing_pipelined`]); the decoder leaves any
/// bytes after the packet in the buffer so the check can see them.
#[derive(Clone, Copy, Debug, Default)]
pub struct StartupCodec;

impl Decoder for StartupCodec {
    type Item = StartupPacket;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<StartupPacket>> {
        StartupPacket::decode(src)
    }
}

impl Encoder<StartupPacket> for StartupCodec {
    type Error = CodecError;

    fn encode(&mut self, item: StartupPacket, dst: &mut BytesMut) -> Result<()> {
        item.encode(dst)
    }
}

impl Encoder<SslResponse> for StartupCodec {
    type Error = CodecError;

    fn encode(&mut self, item: SslResponse, dst: &mut BytesMut) -> Result<()> {
        dst.put_u8(item.byte());
        Ok(())
    }
}

/// The client's reader for the one-byte answer to SSLRequest or GSSENCRequest.
#[derive(Clone, Copy, Debug, Default)]
pub struct SslResponseCodec;

impl Decoder for SslResponseCodec {
    type Item = SslResponse;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<SslResponse>> {
        SslResponse::decode(src)
    }
}

/// Splits one typed message off `src`: its tag and its body as a zero-copy slice.
///
/// Format: `Byte1 tag, Int32 len, Byte[len - 4] body`; `len` counts itself.
///
/// When the next message is incomplete, `src` gets room for the rest of it, or for
/// `read_ahead` bytes if that is more, so that the next read may take several messages at
/// once; room is only ever made for a length already checked against `max_body_len`.
fn split_frame(
    src: &mut BytesMut,
    max_body_len: usize,
    read_ahead: usize,
) -> Result<Option<(u8, Bytes)>> {
    if src.len() < 5 {
        make_room(src, 5 - src.len(), read_ahead);
        return Ok(None);
    }
    let tag = src[0];
    let len = i32::from_be_bytes([src[1], src[2], src[3], src[4]]);
    if len < 4 {
        return Err(CodecError::InvalidLength { tag, len });
    }
    let body_len = len as usize - 4;
    if body_len > max_body_len {
        return Err(CodecError::MessageTooLarge {
            tag,
            len: body_len,
            max: max_body_len,
        });
    }
    let total = 5 + body_len;
    if src.len() < total {
        make_room(src, total - src.len(), read_ahead);
        return Ok(None);
    }
    let frame = src.split_to(total).freeze();
    Ok(Some((tag, frame.slice(5..))))
}

/// Leaves `src` room for at least `need` more bytes: the room it has if that is enough, else
/// a new buffer with room for `need` or `read_ahead` bytes, whichever is more. Reusing the
/// room it has matters: the messages split off before share its allocation, so growing it
/// would copy what is buffered into a new one.
fn make_room(src: &mut BytesMut, need: usize, read_ahead: usize) {
    let spare = src.capacity() - src.len();
    if spare < need {
        src.reserve(need.max(read_ahead));
    }
}

/// The server's codec after startup: decodes [`FrontendMessage`]s, encodes
/// [`BackendMessage`]s.
///
/// The default maximum body length is [`ServerCodec::DEFAULT_MAX_MESSAGE_LEN`], 1 MiB. A
/// walsender's clients send only short messages: queries of a few dozen bytes, 34-byte status
/// updates, SASL messages of about a hundred bytes (PostgreSQL caps most client messages at
/// 10 000 bytes and authentication tokens at 65 535). 1 MiB leaves room for long queries and
/// bounds what one connection can make the server buffer.
#[derive(Clone, Copy, Debug)]
pub struct ServerCodec {
    max_message_len: usize,
}

impl ServerCodec {
    pub const DEFAULT_MAX_MESSAGE_LEN: usize = 1 << 20;

    pub fn new() -> ServerCodec {
        ServerCodec {
            max_message_len: Self::DEFAULT_MAX_MESSAGE_LEN,
        }
    }

    /// The largest message body (excluding tag and length) the decoder accepts.
    pub fn with_max_message_len(max_message_len: usize) -> ServerCodec {
        ServerCodec { max_message_len }
    }

    pub fn max_message_len(&self) -> usize {
        self.max_message_len
    }
}

impl Default for ServerCodec {
    fn default() -> ServerCodec {
        ServerCodec::new()
    }
}

impl Decoder for ServerCodec {
    type Item = FrontendMessage;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<FrontendMessage>> {
        match split_frame(src, self.max_message_len, 0)? {
            Some((tag, body)) => FrontendMessage::decode(tag, body).map(Some),
            None => Ok(None),
        }
    }
}

impl Encoder<BackendMessage> for ServerCodec {
    type Error = CodecError;

    fn encode(&mut self, item: BackendMessage, dst: &mut BytesMut) -> Result<()> {
        item.encode(dst)
    }
}

impl Encoder<&BackendMessage> for ServerCodec {
    type Error = CodecError;

    fn encode(&mut self, item: &BackendMessage, dst: &mut BytesMut) -> Result<()> {
        item.encode(dst)
    }
}

/// The client's codec after startup: decodes [`BackendMessage`]s, encodes
/// [`FrontendMessage`]s.
///
/// The default maximum body length is [`ClientCodec::DEFAULT_MAX_MESSAGE_LEN`], 64 MiB.
/// PostgreSQL sends at most 128 KiB of WAL per XLogData (`MAX_SEND_SIZE`) and replication
/// result sets are small (a history file is the largest), so 64 MiB is far above anything a
/// real upstream sends while still bounding what a hostile one can make us buffer. libpq
/// itself allows up to 1 GiB; raise the limit with [`ClientCodec::with_max_message_len`] if an
/// upstream ever needs it.
///
/// By default the decoder asks for room for one message at a time, so a reader such as
/// `FramedRead` reads each message in two calls (its header, then the rest).
/// [`ClientCodec::with_read_ahead`] lets one read take many messages, for a receiver that
/// streams WAL.
#[derive(Clone, Copy, Debug)]
pub struct ClientCodec {
    max_message_len: usize,
    read_ahead: usize,
}

impl ClientCodec {
    pub const DEFAULT_MAX_MESSAGE_LEN: usize = 64 << 20;

    pub fn new() -> ClientCodec {
        ClientCodec {
            max_message_len: Self::DEFAULT_MAX_MESSAGE_LEN,
            read_ahead: 0,
        }
    }

    /// The largest message body (excluding tag and length) the decoder accepts.
    pub fn with_max_message_len(max_message_len: usize) -> ClientCodec {
        ClientCodec {
            max_message_len,
            read_ahead: 0,
        }
    }

    /// When a message is incomplete and the buffer has no room for the rest of it, the new
    /// buffer has room for `read_ahead` bytes (or the rest of the message, if more): a reader
    /// then takes whatever the socket holds, up to that, in one call. The bytes buffered
    /// beyond the message being decoded are at most `read_ahead`.
    pub fn with_read_ahead(self, read_ahead: usize) -> ClientCodec {
        ClientCodec { read_ahead, ..self }
    }

    pub fn max_message_len(&self) -> usize {
        self.max_message_len
    }
}

impl Default for ClientCodec {
    fn default() -> ClientCodec {
        ClientCodec::new()
    }
}

impl Decoder for ClientCodec {
    type Item = BackendMessage;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BackendMessage>> {
        match split_frame(src, self.max_message_len, self.read_ahead)? {
            Some((tag, body)) => BackendMessage::decode(tag, body).map(Some),
            None => Ok(None),
        }
    }
}

impl Encoder<FrontendMessage> for ClientCodec {
    type Error = CodecError;

    fn encode(&mut self, item: FrontendMessage, dst: &mut BytesMut) -> Result<()> {
        item.encode(dst)
    }
}

impl Encoder<&FrontendMessage> for ClientCodec {
    type Error = CodecError;

    fn encode(&mut self, item: &FrontendMessage, dst: &mut BytesMut) -> Result<()> {
        item.encode(dst)
    }
}

#[cfg(test)]
mod tests {
    use bytes::BufMut;
    use wal_types::{Lsn, PgTimestamp};

    use super::*;
    use crate::messages::XLogData;

    /// Decodes `wire` the way `FramedRead` does (decode; if nothing, make room for one byte
    /// and read), with a peer that always has more to send than there is room: each read
    /// fills the room. Returns the messages and the number of reads.
    fn decode_all(mut codec: ClientCodec, wire: &[u8]) -> (Vec<BackendMessage>, usize) {
        let (mut src, mut at, mut reads, mut out) = (BytesMut::with_capacity(8192), 0, 0, vec![]);
        loop {
            while let Some(m) = codec.decode(&mut src).unwrap() {
                out.push(m);
            }
            if at == wire.len() {
                return (out, reads);
            }
            src.reserve(1);
            let n = (src.capacity() - src.len()).min(wire.len() - at);
            src.put_slice(&wire[at..at + n]);
            at += n;
            reads += 1;
        }
    }

    #[test]
    fn read_ahead_takes_many_messages_per_read_and_decodes_the_same() {
        const CHUNK: usize = 128 << 10;
        let mut wire = BytesMut::new();
        let sent: Vec<BackendMessage> = (0..32u64)
            .map(|i| {
                BackendMessage::XLogData(XLogData {
                    wal_start: Lsn(i * CHUNK as u64),
                    wal_end: Lsn(0),
                    send_time: PgTimestamp(0),
                    data: Bytes::from(vec![i as u8; CHUNK]),
                })
            })
            .collect();
        for m in &sent {
            m.encode(&mut wire).unwrap();
        }
        let (plain, plain_reads) = decode_all(ClientCodec::new(), &wire);
        let (ahead, ahead_reads) = decode_all(ClientCodec::new().with_read_ahead(1 << 20), &wire);
        assert_eq!(plain, sent);
        assert_eq!(ahead, sent);
        // One message at a time: a read for its header, one for the rest.
        assert!(plain_reads >= 2 * sent.len(), "{plain_reads} reads");
        // 4 MiB in rooms of 1 MiB, plus a short read where a message is cut at a room's end.
        assert!(ahead_reads <= 2 * 4 + 1, "{ahead_reads} reads");
    }

    #[test]
    fn read_ahead_never_makes_room_for_a_length_over_the_limit() {
        let mut codec = ClientCodec::with_max_message_len(1024).with_read_ahead(1 << 20);
        let mut src = BytesMut::from(&b"d\x7f\xff\xff\xff"[..]);
        assert!(codec.decode(&mut src).is_err());
        assert!(src.capacity() < 1 << 20, "room made for a rejected message");
    }
}
