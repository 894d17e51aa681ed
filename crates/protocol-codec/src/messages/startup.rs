//! The untyped startup phase: the first packets a client sends, before any message has a type
//! byte.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{CodecError, Result};
use crate::wire::{patch_len, put_cstr, Body};

/// PostgreSQL's `MAX_STARTUP_PACKET_LENGTH`: a startup packet longer than this is refused
/// before it is buffered.
pub const MAX_STARTUP_PACKET_LEN: usize = 10_000;

/// The protocol version PostgreSQL 15 speaks, 3.0.
pub const PROTOCOL_VERSION_3_0: (u16, u16) = (3, 0);

/// The request codes that share the version field (`1234.5678` and neighbours).
pub const CANCEL_REQUEST_CODE: i32 = (1234 << 16) | 5678;
pub const SSL_REQUEST_CODE: i32 = (1234 << 16) | 5679;
pub const GSSENC_REQUEST_CODE: i32 = (1234 << 16) | 5680;

/// A packet of the startup phase, client to server.
///
/// Format:
/// ```text
/// StartupMessage  Int32 len, Int32 version (major << 16 | minor), { String key, String value }*, Byte1 0
/// SSLRequest      Int32 8,   Int32 80877103
/// GSSENCRequest   Int32 8,   Int32 80877104
/// CancelRequest   Int32 16,  Int32 80877102, Int32 pid, Int32 key
/// ```
/// `len` counts itself; it must be at least 8 and at most [`MAX_STARTUP_PACKET_LEN`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartupPacket {
    Startup {
        protocol: (u16, u16),
        params: Vec<(String, String)>,
    },
    SslRequest,
    GssEncRequest,
    CancelRequest {
        pid: i32,
        key: i32,
    },
}

/// What the `replication` startup parameter asks for: `true`/`on`/`yes`/`1` a physical
/// replication connection, `database` a logical one, a false word or no parameter a normal one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicationMode {
    /// `true`, `on`, `yes`, `1`: a physical walsender, the only kind walserver serves.
    Physical,
    /// `database`: a logical walsender.
    Logical,
    /// `false`, `off`, `no`, `0`, or no parameter at all: a normal backend.
    Off,
}

/// The protocol request a PostgreSQL 15 server goes on with: major version 3 (any minor, which
/// it negotiates down); any other is [`CodecError::UnsupportedProtocol`].
fn require_version_3((major, minor): (u16, u16)) -> Result<()> {
    if major != 3 {
        return Err(CodecError::UnsupportedProtocol { major, minor });
    }
    Ok(())
}

/// A boolean as PostgreSQL's `parse_bool` reads one: any case, `true`, `yes`, `false`, `no`
/// or a prefix of one of them (`t`, `ye`, `f`, ...), `on`, `off` or `of`, `1`, `0`.
fn parse_pg_bool(v: &str) -> Option<bool> {
    let lower = v.to_ascii_lowercase();
    let prefix_of = |word: &str| !lower.is_empty() && word.starts_with(lower.as_str());
    match lower.as_bytes().first()? {
        b't' if prefix_of("true") => Some(true),
        b'f' if prefix_of("false") => Some(false),
        b'y' if prefix_of("yes") => Some(true),
        b'n' if prefix_of("no") => Some(false),
        // A lone `o` is neither.
        b'o' if lower == "on" => Some(true),
        b'o' if lower.len() >= 2 && prefix_of("off") => Some(false),
        b'1' if lower.len() == 1 => Some(true),
        b'0' if lower.len() == 1 => Some(false),
        _ => None,
    }
}

impl StartupPacket {
    /// A 3.0 StartupMessage with these parameters.
    pub fn startup<K: Into<String>, V: Into<String>>(
        params: impl IntoIterator<Item = (K, V)>,
    ) -> StartupPacket {
        StartupPacket::Startup {
            protocol: PROTOCOL_VERSION_3_0,
            params: params
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The value of a StartupMessage parameter. PostgreSQL applies parameters in order, so a
    /// repeated key's last value wins.
    pub fn param(&self, key: &str) -> Option<&str> {
        match self {
            StartupPacket::Startup { params, .. } => params
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str()),
            _ => None,
        }
    }

    pub fn user(&self) -> Option<&str> {
        self.param("user")
    }

    pub fn database(&self) -> Option<&str> {
        self.param("database")
    }

    pub fn application_name(&self) -> Option<&str> {
        self.param("application_name")
    }

    /// The `replication` parameter, parsed as PostgreSQL's backend does (case-insensitive
    /// boolean words, or `database`). Any other value is the error PostgreSQL reports as
    /// `invalid value for parameter "replication": "x"`.
    pub fn replication(&self) -> Result<ReplicationMode> {
        let Some(v) = self.param("replication") else {
            return Ok(ReplicationMode::Off);
        };
        // As PostgreSQL reads it: exactly `database`, or a boolean as its `parse_bool` takes one.
        if v == "database" {
            return Ok(ReplicationMode::Logical);
        }
        match parse_pg_bool(v) {
            Some(true) => Ok(ReplicationMode::Physical),
            Some(false) => Ok(ReplicationMode::Off),
            None => Err(CodecError::InvalidReplicationValue {
                value: v.to_string(),
            }),
        }
    }

    /// Protocol options (`_pq_.` parameters) this server does not know. PostgreSQL 15 knows
    /// none, so that is all of them; they go into NegotiateProtocolVersion.
    pub fn unknown_protocol_options(&self) -> Vec<String> {
        match self {
            StartupPacket::Startup { params, .. } => params
                .iter()
                .filter(|(k, _)| k.starts_with("_pq_."))
                .map(|(k, _)| k.clone())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// What a PostgreSQL 15 server says to this StartupMessage's protocol request:
    /// `Ok(None)` to go on, `Ok(Some(msg))` to send a NegotiateProtocolVersion first (minor
    /// version above 0, or `_pq_.` options) and go on, or an error for a major version other
    /// than 3 ([`CodecError::UnsupportedProtocol`]; [`StartupPacket::decode`] already refuses
    /// those).
    pub fn protocol_negotiation(&self) -> Result<Option<crate::messages::BackendMessage>> {
        let StartupPacket::Startup { protocol, .. } = self else {
            return Ok(None);
        };
        require_version_3(*protocol)?;
        let unrecognized = self.unknown_protocol_options();
        if protocol.1 == 0 && unrecognized.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            crate::messages::BackendMessage::NegotiateProtocolVersion {
                newest_minor: 0,
                unrecognized,
            },
        ))
    }

    /// Decodes one packet from `src`, leaving any later bytes in it. `Ok(None)` means more
    /// bytes are needed. The length is checked before anything is buffered.
    pub fn decode(src: &mut BytesMut) -> Result<Option<StartupPacket>> {
        if src.len() < 4 {
            return Ok(None);
        }
        let len = i32::from_be_bytes([src[0], src[1], src[2], src[3]]);
        if len < 8 || len as usize > MAX_STARTUP_PACKET_LEN {
            return Err(CodecError::StartupPacketLength { len: len.into() });
        }
        let len = len as usize;
        if src.len() < len {
            src.reserve(len - src.len());
            return Ok(None);
        }
        let packet = src.split_to(len).freeze();
        Self::parse(packet.slice(4..)).map(Some)
    }

    fn parse(packet: Bytes) -> Result<StartupPacket> {
        let len = packet.len();
        let mut body = Body::new(packet, "startup packet");
        let code = body.i32()?;
        let exact = |want: usize, name: &str| -> Result<()> {
            if len != want {
                return Err(CodecError::InvalidStartupPacket {
                    reason: format!("{name} of {} bytes, expected {}", len + 4, want + 4),
                });
            }
            Ok(())
        };
        match code {
            SSL_REQUEST_CODE => {
                exact(4, "SSLRequest")?;
                Ok(StartupPacket::SslRequest)
            }
            GSSENC_REQUEST_CODE => {
                exact(4, "GSSENCRequest")?;
                Ok(StartupPacket::GssEncRequest)
            }
            CANCEL_REQUEST_CODE => {
                exact(12, "CancelRequest")?;
                let pid = body.i32()?;
                let key = body.i32()?;
                Ok(StartupPacket::CancelRequest { pid, key })
            }
            _ => {
                let protocol = ((code as u32 >> 16) as u16, code as u16);
                // PostgreSQL refuses another major version before it reads the parameters,
                // so a packet of a later protocol is refused for its version, not its layout.
                require_version_3(protocol)?;
                let mut params = Vec::new();
                loop {
                    if body.remaining() == 0 {
                        return Err(CodecError::InvalidStartupPacket {
                            reason:
                                "invalid startup packet layout: expected terminator as last byte"
                                    .into(),
                        });
                    }
                    let key = body.cstr()?;
                    if key.is_empty() {
                        if body.remaining() != 0 {
                            return Err(CodecError::InvalidStartupPacket {
                                reason:
                                    "invalid startup packet layout: expected terminator as last byte"
                                        .into(),
                            });
                        }
                        break;
                    }
                    let value = body.cstr()?;
                    params.push((key, value));
                }
                Ok(StartupPacket::Startup { protocol, params })
            }
        }
    }

    /// Appends the packet to `dst` (the client side).
    pub fn encode(&self, dst: &mut BytesMut) -> Result<()> {
        let start = dst.len();
        dst.put_i32(0);
        let written = self.encode_body(dst).and_then(|()| {
            if dst.len() - start > MAX_STARTUP_PACKET_LEN {
                return Err(CodecError::encode(
                    "startup packet",
                    format!("longer than {MAX_STARTUP_PACKET_LEN} bytes"),
                ));
            }
            patch_len(dst, start, "startup packet")
        });
        if written.is_err() {
            dst.truncate(start);
        }
        written
    }

    fn encode_body(&self, dst: &mut BytesMut) -> Result<()> {
        match self {
            StartupPacket::SslRequest => dst.put_i32(SSL_REQUEST_CODE),
            StartupPacket::GssEncRequest => dst.put_i32(GSSENC_REQUEST_CODE),
            StartupPacket::CancelRequest { pid, key } => {
                dst.put_i32(CANCEL_REQUEST_CODE);
                dst.put_i32(*pid);
                dst.put_i32(*key);
            }
            StartupPacket::Startup { protocol, params } => {
                dst.put_u16(protocol.0);
                dst.put_u16(protocol.1);
                for (k, v) in params {
                    if k.is_empty() {
                        return Err(CodecError::encode("startup packet", "empty parameter name"));
                    }
                    put_cstr(dst, k.as_bytes(), "startup parameter name")?;
                    put_cstr(dst, v.as_bytes(), "startup parameter value")?;
                }
                dst.put_u8(0);
            }
        }
        Ok(())
    }
}

/// The server's one-byte answer to SSLRequest or GSSENCRequest: `'S'` (TLS handshake follows)
/// or `'N'` (go on in plaintext). It has no type byte and no length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslResponse {
    Accept,
    Refuse,
}

impl SslResponse {
    pub fn byte(self) -> u8 {
        match self {
            SslResponse::Accept => b'S',
            SslResponse::Refuse => b'N',
        }
    }

    /// Reads the answer byte (the client side). A server too old to understand SSLRequest
    /// answers with an ErrorResponse (`'E'`), which is reported as an error here.
    pub fn decode(src: &mut BytesMut) -> Result<Option<SslResponse>> {
        let Some(&b) = src.first() else {
            return Ok(None);
        };
        let answer = match b {
            b'S' => SslResponse::Accept,
            b'N' => SslResponse::Refuse,
            other => {
                return Err(CodecError::malformed(
                    "SSL response",
                    format!("expected 'S' or 'N', got byte {other:#04x}"),
                ))
            }
        };
        let _ = src.split_to(1);
        Ok(Some(answer))
    }
}

/// The check a server makes after reading an SSLRequest and before answering `'S'`: the read
/// buffer must be empty. Bytes already there were sent in plaintext before the handshake and
/// would be taken as if they came through TLS (CVE-2021-23214); the connection must be closed.
pub fn ensure_nothing_pipelined(read_buffer: &[u8]) -> Result<()> {
    if read_buffer.is_empty() {
        Ok(())
    } else {
        Err(CodecError::PipelinedAfterSslRequest)
    }
}
