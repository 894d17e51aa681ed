//! The codec's one error type. Authentication, connection strings and TLS configuration have
//! their own errors (in their modules), because they are different concerns with different
//! audiences: a `CodecError` means the peer broke the protocol and the connection is over.

use crate::messages::SqlState;

/// Why bytes could not be turned into a message, or a message into bytes.
///
/// Every decode error means the byte stream can no longer be trusted: the caller answers with
/// FATAL (see [`CodecError::sqlstate`]) and closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The transport failed. `tokio_util::codec` requires this conversion.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),

    /// A startup-phase packet's length is below 8 or above
    /// [`MAX_STARTUP_PACKET_LEN`](crate::MAX_STARTUP_PACKET_LEN).
    #[error("invalid length of startup packet: {len}")]
    StartupPacketLength { len: i64 },

    /// A startup-phase packet with a code we do not know, or the wrong size for its code.
    #[error("invalid startup packet: {reason}")]
    InvalidStartupPacket { reason: String },

    /// A StartupMessage whose `replication` is neither a boolean nor `database` (22023, with
    /// PostgreSQL's hint [`CodecError::REPLICATION_VALUES`]).
    #[error("invalid value for parameter \"replication\": \"{value}\"")]
    InvalidReplicationValue { value: String },

    /// A StartupMessage asking for a protocol major version other than 3. PostgreSQL 15 checks
    /// the version before the packet's layout and answers 0A000 with this text.
    #[error("unsupported frontend protocol {major}.{minor}: server supports 3.0 to 3.0")]
    UnsupportedProtocol { major: u16, minor: u16 },

    /// A typed message whose length field is negative or smaller than the 4 bytes of itself.
    #[error("invalid message length {len} for message type {:?}", char::from(*.tag))]
    InvalidLength { tag: u8, len: i32 },

    /// A typed message longer than the codec's configured maximum.
    #[error("message of type {:?} is {len} bytes, over the limit of {max}", char::from(*.tag))]
    MessageTooLarge { tag: u8, len: usize, max: usize },

    /// A message type this codec does not know for its direction.
    #[error("invalid {direction} message type {:?} ({tag})", char::from(*.tag))]
    UnknownMessageType { tag: u8, direction: &'static str },

    /// A message whose body does not match its type's layout.
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },

    /// A message that cannot be encoded, for example a string holding a NUL byte.
    #[error("cannot encode {what}: {reason}")]
    Encode { what: &'static str, reason: String },

    /// The client pipelined plaintext bytes after its SSLRequest; starting TLS on top of them
    /// would let a man in the middle inject commands (CVE-2021-23214).
    #[error("received unencrypted data after SSL request")]
    PipelinedAfterSslRequest,
}

impl CodecError {
    /// The SQLSTATE a server reports for this error before closing the connection.
    pub fn sqlstate(&self) -> SqlState {
        match self {
            CodecError::Io(_) => SqlState::CONNECTION_FAILURE,
            CodecError::UnsupportedProtocol { .. } => SqlState::FEATURE_NOT_SUPPORTED,
            CodecError::InvalidReplicationValue { .. } => SqlState::INVALID_PARAMETER_VALUE,
            _ => SqlState::PROTOCOL_VIOLATION,
        }
    }

    /// The hint PostgreSQL gives with [`CodecError::InvalidReplicationValue`].
    pub const REPLICATION_VALUES: &'static str =
        "Valid values are: \"false\", 0, \"true\", 1, \"database\".";

    pub(crate) fn malformed(what: &'static str, reason: impl Into<String>) -> CodecError {
        CodecError::Malformed {
            what,
            reason: reason.into(),
        }
    }

    pub(crate) fn encode(what: &'static str, reason: impl Into<String>) -> CodecError {
        CodecError::Encode {
            what,
            reason: reason.into(),
        }
    }
}

/// This crate's result type for codec operations.
pub type Result<T, E = CodecError> = std::result::Result<T, E>;
