//! The messages of PostgreSQL's protocol that a replication connection uses, named by
//! direction as in the PostgreSQL docs: frontend = client to server, backend = server to
//! client. Each type's wire format is written above it.

mod backend;
mod fields;
mod frontend;
mod startup;

pub use backend::{
    AuthRequest, BackendMessage, CommitPoint, FieldDescription, PrimaryKeepalive,
    TransactionStatus, XLogData,
};
pub use fields::{ErrorFields, SqlState};
pub use frontend::{
    parse_password, parse_sasl_initial_response, parse_sasl_response, FrontendMessage,
    HotStandbyFeedback, StandbyStatusUpdate,
};
pub use startup::{
    ensure_nothing_pipelined, ReplicationMode, SslResponse, StartupPacket, CANCEL_REQUEST_CODE,
    GSSENC_REQUEST_CODE, MAX_STARTUP_PACKET_LEN, PROTOCOL_VERSION_3_0, SSL_REQUEST_CODE,
};

/// The FATAL a server sends for a CopyData payload it does not understand during streaming,
/// as PostgreSQL's walsender does (`unexpected message type "x"`, 08P01).
pub fn unexpected_copy_data(payload: &bytes::Bytes) -> ErrorFields {
    let what = match payload.first() {
        Some(b) if b.is_ascii_graphic() => format!("\"{}\"", char::from(*b)),
        Some(b) => format!("{b:#04x}"),
        None => "(empty)".to_string(),
    };
    ErrorFields::fatal(
        SqlState::PROTOCOL_VIOLATION,
        format!("unexpected message type {what}"),
    )
}

#[cfg(test)]
mod tests;
