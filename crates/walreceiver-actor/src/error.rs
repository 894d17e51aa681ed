//! The crate's one error type, and why a walreceiver stopped.

use protocol_codec::auth::AuthError;
use protocol_codec::conninfo::ConnInfoError;
use protocol_codec::tls::TlsError;
use protocol_codec::{CodecError, ErrorFields};
use serde::Serialize;
use wal_storage::{Lsn, SystemId, TimelineId, WalError, WalFormat};

/// Everything that ends a walreceiver's connection other than a requested stop, and
/// everything that can make [`crate::fetch_upstream_identity`] fail.
///
/// It is `Clone` and serializable because it travels: in the stop event to the supervisor and
/// from there into `/status` as the last error. Errors of other crates are kept as text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReceiverError {
    #[error("invalid primary_conninfo: {message}")]
    InvalidConnInfo { message: String },

    #[error("could not connect to the upstream at {addr}: {message}")]
    Connect { addr: String, message: String },

    #[error("TLS with the upstream failed: {message}")]
    Tls { message: String },

    /// A failure on our side of authentication: no password to give, an unsupported method,
    /// or a server that could not prove it knows the password (SCRAM).
    #[error("authentication with the upstream failed: {message}")]
    Authentication { message: String },

    /// An ErrorResponse from the upstream: a refused login (28P01), a start point it no longer
    /// has (58P01), a slot that does not exist (42704), a shutdown (57P01), ...
    #[error("the upstream reported {severity}: {message} (SQLSTATE {sqlstate}){}", detail.as_ref().map(|d| format!("; DETAIL: {d}")).unwrap_or_default())]
    Upstream {
        severity: String,
        sqlstate: String,
        message: String,
        detail: Option<String>,
    },

    #[error("database system identifier differs between the upstream and this node: the upstream's is {upstream}, this node's is {local}")]
    SystemIdMismatch { local: SystemId, upstream: SystemId },

    #[error("the upstream serves {upstream} WAL, but this node stores {local} WAL")]
    FormatMismatch {
        local: WalFormat,
        upstream: WalFormat,
    },

    #[error("the upstream's highest timeline {upstream} is behind this node's timeline {local}")]
    UpstreamBehind {
        local: TimelineId,
        upstream: TimelineId,
    },

    #[error(
        "this node's timeline {local} is not in the history of the upstream's timeline {upstream}"
    )]
    NotInUpstreamHistory {
        local: TimelineId,
        upstream: TimelineId,
    },

    /// This node holds WAL on `timeline` beyond the point where the upstream switched away
    /// from it: the histories diverged, and only an explicit rejoin can repair that.
    #[error("this node's WAL forked from the upstream's history: timeline {timeline} ends at {fork_lsn} upstream, but this node holds WAL up to {local_end}; rejoin (truncate to {fork_lsn}) before following")]
    Forked {
        timeline: TimelineId,
        fork_lsn: Lsn,
        local_end: Lsn,
    },

    /// The upstream's timeline does not descend from this node's, though it names it: the two
    /// hold a timeline of one number made apart (an operator promoted a standby while the
    /// old primary, restarted, began a timeline of its own), whose WAL may differ at the same
    /// LSNs. Nothing is cut or streamed: no point of this node's timeline is known to be the
    /// upstream's.
    #[error("this node's timeline {timeline} is not the upstream's, though they share its number: this node's history says {local}, the upstream's {upstream}; the two were made apart and their WAL may differ at the same LSNs, so nothing is streamed: make this node again from the upstream (walserver init --standby)")]
    TimelineClash {
        timeline: TimelineId,
        local: String,
        upstream: String,
    },

    /// The overlapped commit's rule 4 refused to cut this node's tail: the upstream shares
    /// its history only up to `shared`, below the commit point this node was told, so it
    /// lacks WAL that was acknowledged; cutting would destroy the only copy here.
    #[error("refusing to cut this node's WAL on timeline {timeline} back to {shared}, the point the upstream's history shares with it: WAL up to the commit point {commit_point} was acknowledged, and this node holds it (up to {local_end}); the upstream lacks acknowledged WAL")]
    BelowCommitPoint {
        timeline: TimelineId,
        shared: Lsn,
        commit_point: Lsn,
        local_end: Lsn,
    },

    /// Rule 4 refused to cut WAL this node wrote as a primary (`Wal::primary_end`): the
    /// upstream's history forked from it at `shared`, and the tail past that may hold appends
    /// this node acknowledged. Only an explicit rejoin drops it.
    #[error("this node's WAL forked from the upstream's history: the upstream shares timeline {timeline} up to {shared}, but this node holds WAL up to {local_end}, written up to {primary_end} while it was a primary and possibly acknowledged; refusing to cut it (rule 4 of the overlapped commit): run `walserver rejoin` to drop it and follow")]
    WroteAsPrimary {
        timeline: TimelineId,
        shared: Lsn,
        primary_end: Lsn,
        local_end: Lsn,
    },

    #[error("terminating walreceiver due to timeout: no message from the upstream for {timeout_ms} ms (wal_receiver_timeout)")]
    Timeout { timeout_ms: u64 },

    /// The upstream closed the connection, or ended streaming without a next timeline (a
    /// walsender's controlled shutdown ends the copy with CommandComplete and closes).
    #[error("the upstream closed the connection{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    UpstreamClosed { detail: String },

    #[error("protocol violation by the upstream: {message}")]
    Protocol { message: String },

    #[error("connection to the upstream failed: {message}")]
    Io { message: String },

    #[error("local storage failed: {message}")]
    Storage { message: String },

    /// This node's disk (or quota) is full: what fitted was written; the rest is received
    /// again once space is freed, so the owner retries soon.
    #[error("on this node, {message}")]
    DiskFull { message: String },

    /// This node's storage failed a sync and is being restarted by the owner; streaming
    /// resumes from the durable end once it is back.
    #[error("on this node, {message}")]
    StorageRestarting { message: String },

    /// The upstream has removed the WAL at `lsn` and the archive lacks it too: no source
    /// holds it, and only an operator (a new base, a rejoin) can repair that.
    #[error("the upstream has already removed the WAL at {lsn} and the archive lacks segment {segment}: this standby cannot continue from either")]
    ArchiveGap { lsn: Lsn, segment: String },

    /// The archive that would fill a gap names another database system: its segments have
    /// this node's names and another system's WAL, so nothing is taken from it. An alarm:
    /// `archive_target` names the wrong archive, and only a person can say which is right.
    #[error("the archive {archive} belongs to system {theirs}, not to this node's system {ours}: no gap is filled from it (archive_target must name this cluster's archive)")]
    OtherSystemArchive {
        archive: String,
        theirs: SystemId,
        ours: SystemId,
    },

    /// Reading the archive for a gap failed: unreachable, or an object that did not match
    /// its checksum.
    #[error("filling a gap from the archive failed: {message}")]
    Archive { message: String },
}

impl ReceiverError {
    /// The SQLSTATE the upstream reported, for errors that came from it.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ReceiverError::Upstream { sqlstate, .. } => Some(sqlstate),
            _ => None,
        }
    }

    pub(crate) fn protocol(message: impl Into<String>) -> ReceiverError {
        ReceiverError::Protocol {
            message: message.into(),
        }
    }

    pub(crate) fn upstream(fields: &ErrorFields) -> ReceiverError {
        ReceiverError::Upstream {
            severity: fields.severity().unwrap_or("ERROR").to_string(),
            sqlstate: fields.get(ErrorFields::CODE).unwrap_or("XX000").to_string(),
            message: fields.message().unwrap_or("(no message)").to_string(),
            detail: fields.get(ErrorFields::DETAIL).map(str::to_string),
        }
    }

    /// A storage error met while `timeline` was being received (a fork keeps its fields).
    pub(crate) fn storage(e: WalError, timeline: TimelineId) -> ReceiverError {
        match e {
            WalError::Forked {
                fork_lsn,
                local_end,
            } => ReceiverError::Forked {
                timeline,
                fork_lsn,
                local_end,
            },
            e if e.is_disk_full() => ReceiverError::DiskFull {
                message: e.to_string(),
            },
            e if e.is_storage_failed() => ReceiverError::StorageRestarting {
                message: e.to_string(),
            },
            other => ReceiverError::Storage {
                message: other.to_string(),
            },
        }
    }
}

impl From<CodecError> for ReceiverError {
    fn from(e: CodecError) -> ReceiverError {
        match e {
            CodecError::Io(e) => ReceiverError::Io {
                message: e.to_string(),
            },
            other => ReceiverError::protocol(other.to_string()),
        }
    }
}

impl From<AuthError> for ReceiverError {
    fn from(e: AuthError) -> ReceiverError {
        match e {
            AuthError::Codec(c) => c.into(),
            other => ReceiverError::Authentication {
                message: other.to_string(),
            },
        }
    }
}

impl From<TlsError> for ReceiverError {
    fn from(e: TlsError) -> ReceiverError {
        ReceiverError::Tls {
            message: e.to_string(),
        }
    }
}

impl From<ConnInfoError> for ReceiverError {
    fn from(e: ConnInfoError) -> ReceiverError {
        ReceiverError::InvalidConnInfo {
            message: e.to_string(),
        }
    }
}

/// Why a walreceiver stopped, as its owner is told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", content = "error", rename_all = "snake_case")]
pub enum StopReason {
    /// [`crate::messages::StopReceiver`] asked for it (shutdown, promotion, reconfiguration).
    ShutdownRequested,
    /// Anything else; the owner's restart policy decides what happens next.
    Failed(ReceiverError),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::ShutdownRequested => f.write_str("stop requested"),
            StopReason::Failed(e) => e.fmt(f),
        }
    }
}
