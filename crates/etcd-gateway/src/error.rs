//! The crate's one error enum.

use std::io;

/// What can go wrong talking to etcd through its gateway.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An endpoint given to [`crate::Client::new`] is not `http://host:port`,
    /// `https://host:port` or `host:port`.
    #[error("invalid etcd endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        endpoint: String,
        reason: &'static str,
    },

    /// A TLS file or credential setting cannot be used: unreadable, not PEM, a certificate
    /// without its key, a user without a password.
    #[error("etcd security settings: {0}")]
    TlsSetup(String),

    /// TLS with etcd failed: its certificate is not signed by the CA given or is for another
    /// name, or etcd refused this client's certificate. `reason` says which. Retrying does not
    /// help; the request was not applied.
    #[error("TLS with etcd at {endpoint} failed: {reason}")]
    Tls {
        endpoint: String,
        reason: String,
        #[source]
        source: io::Error,
    },

    /// etcd refused the user name or password (`POST /v3/auth/authenticate`).
    #[error("etcd refused the password of user {user:?}: {message}")]
    AuthFailed { user: String, message: String },

    /// No endpoint accepted a connection. Nothing was sent, so the call can be retried.
    #[error("no etcd endpoint reachable (tried {tried}): {source}")]
    Connect {
        tried: String,
        #[source]
        source: io::Error,
    },

    /// The call's deadline passed. The request may or may not have been applied.
    #[error("etcd request to {endpoint}{path} timed out after {after_ms} ms")]
    Timeout {
        endpoint: String,
        path: &'static str,
        after_ms: u128,
    },

    /// The connection failed after the request was (partly) sent: the request may or may not
    /// have been applied, so it is not resent to another endpoint.
    #[error("etcd connection to {endpoint} failed during {path}: {source}")]
    Io {
        endpoint: String,
        path: &'static str,
        #[source]
        source: io::Error,
    },

    /// The gateway answered with an HTTP error status and, usually, etcd's own error as JSON
    /// (`{"error", "code", "message"}`; `code` is the gRPC status code).
    #[error("etcd answered {path} with HTTP {status} (grpc code {code}): {message}")]
    Status {
        path: &'static str,
        status: u16,
        code: i64,
        message: String,
    },

    /// The lease does not exist (never granted, revoked, or expired).
    #[error("etcd lease {id} not found (revoked or expired)")]
    LeaseNotFound { id: i64 },

    /// The answer was not what the gateway sends: bad HTTP, bad JSON, bad base64, a number that
    /// does not parse, or more bytes than the limit.
    #[error("malformed answer from etcd for {path}: {reason}")]
    Malformed { path: &'static str, reason: String },

    /// The watch stream ended (the server closed it, or the member went away). Events after
    /// the last delivered revision may be missed: watch again from the next revision.
    #[error("etcd watch stream ended")]
    WatchEnded,

    /// The watch's start revision has been compacted away; events before `compact_revision`
    /// are gone. Read the current state and watch again from its revision.
    #[error("etcd watch start revision compacted; oldest available is {compact_revision}")]
    Compacted { compact_revision: i64 },

    /// The server canceled the watch for another reason.
    #[error("etcd canceled the watch: {reason}")]
    WatchCanceled { reason: String },
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is, for counting them (`/metrics`): a few stable names,
/// never the text of one error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorKind {
    /// No endpoint could be reached.
    Connect,
    /// A call's deadline passed.
    Timeout,
    /// A connection failed after the request went out.
    Io,
    /// etcd answered with an error status (a refused transaction's compare is no error).
    Status,
    /// TLS failed, or etcd refused the password: a setting to fix.
    Credentials,
    /// The lease is gone.
    LeaseNotFound,
    /// An answer the gateway does not send.
    Malformed,
    /// A watch ended, was compacted away or was canceled.
    Watch,
    /// A setting this client was given cannot be used.
    Settings,
}

impl ErrorKind {
    /// Every kind, in the order of the enum.
    pub const ALL: [ErrorKind; 9] = [
        ErrorKind::Connect,
        ErrorKind::Timeout,
        ErrorKind::Io,
        ErrorKind::Status,
        ErrorKind::Credentials,
        ErrorKind::LeaseNotFound,
        ErrorKind::Malformed,
        ErrorKind::Watch,
        ErrorKind::Settings,
    ];

    /// The kind's name, as a metric label shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Io => "io",
            ErrorKind::Status => "status",
            ErrorKind::Credentials => "credentials",
            ErrorKind::LeaseNotFound => "lease_not_found",
            ErrorKind::Malformed => "malformed",
            ErrorKind::Watch => "watch",
            ErrorKind::Settings => "settings",
        }
    }
}

impl Error {
    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidEndpoint { .. } | Error::TlsSetup(_) => ErrorKind::Settings,
            Error::Tls { .. } | Error::AuthFailed { .. } => ErrorKind::Credentials,
            Error::Connect { .. } => ErrorKind::Connect,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Io { .. } => ErrorKind::Io,
            Error::Status { .. } => ErrorKind::Status,
            Error::LeaseNotFound { .. } => ErrorKind::LeaseNotFound,
            Error::Malformed { .. } => ErrorKind::Malformed,
            Error::WatchEnded | Error::Compacted { .. } | Error::WatchCanceled { .. } => {
                ErrorKind::Watch
            }
        }
    }

    /// Whether etcd refused this client's certificate or credentials, or this client refused
    /// etcd's certificate: a setting to fix, which no retry mends.
    pub fn is_refused_credentials(&self) -> bool {
        matches!(self, Error::Tls { .. } | Error::AuthFailed { .. })
    }

    pub(crate) fn malformed(path: &'static str, reason: impl Into<String>) -> Error {
        Error::Malformed {
            path,
            reason: reason.into(),
        }
    }
}
