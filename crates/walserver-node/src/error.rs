//! The crate's one error type. Every error ends in a message to a person (the binary prints it
//! with its causes joined by ": "), so each variant's text says what failed in words and keeps
//! the error underneath as its source; errors passed on unchanged are `transparent`, so their
//! text and causes are exactly the underlying error's.

use std::path::{Path, PathBuf};

use wal_storage::{Lsn, WalError};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `-c` argument without `=` or without a key.
    #[error("invalid -c argument {arg:?}: expected key=value")]
    InvalidOverride { arg: String },
    /// A `-c` key that names no setting, with the nearest one if one is near.
    #[error("unknown setting {key:?} in -c {key}={value}{}", .near.as_ref().map(|n| format!("; did you mean {n}?")).unwrap_or_default())]
    UnknownSetting {
        key: String,
        value: String,
        near: Option<String>,
    },
    /// A `WALSERVER_*` variable that names no setting, or cannot set one.
    #[error("environment variable {name}{text}")]
    Environment { name: String, text: String },
    /// No `data_dir` in any source.
    #[error("{}", match .file {
        Some(f) => format!("{}: no data_dir; set `data_dir` in it or pass `-c data_dir=DIR`", f.display()),
        None => "no data directory: pass `--config FILE` (a configuration with data_dir) or `-c data_dir=DIR`".to_string(),
    })]
    MissingDataDir { file: Option<PathBuf> },
    /// A key the configuration does not take, said in the file's words (the table, the
    /// nearest key, the keys it takes).
    #[error("invalid configuration{}", in_file(.file.as_deref()))]
    UnknownKey {
        file: Option<PathBuf>,
        #[source]
        source: Message,
    },
    /// A directory `init` will not use because it holds something else.
    #[error("{} is not empty and is not a walserver data directory (it holds {found}); give `walserver init --data-dir` a new or empty directory", .dir.display())]
    NotEmpty { dir: PathBuf, found: String },
    /// A data directory that `walserver init` never made.
    #[error("cannot read the data directory {}: {error}; run `walserver init --data-dir {}` first", .dir.display(), .dir.display())]
    NotInitialized { dir: PathBuf, error: WalError },
    /// The configuration sources could not be merged.
    #[error(transparent)]
    ConfigSource(Box<config::ConfigError>),
    /// The configuration does not parse or does not fit the settings.
    #[error("invalid configuration{}", in_file(.file.as_deref()))]
    InvalidConfig {
        file: Option<PathBuf>,
        #[source]
        source: Box<config::ConfigError>,
    },
    #[error("ssl_cert_file and ssl_key_file must be set together")]
    TlsFilesApart,
    /// A setting whose value is out of its range, in the setting's own words.
    #[error("{0}")]
    Invalid(String),
    /// The `hba` rules.
    #[error(transparent)]
    Hba(#[from] walsender_actor::hba::HbaError),
    /// `synchronous_standby_names` does not parse.
    #[error("{0}")]
    SyncStandbyNames(String),
    #[error("synchronous_commit: {0}")]
    SynchronousCommit(String),
    #[error("invalid {what} address {text:?}")]
    InvalidAddress {
        what: String,
        text: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} address {text:?} resolves to nothing")]
    AddressResolvesToNothing { what: String, text: String },
    #[error("cannot load the TLS certificate")]
    Tls(#[source] protocol_codec::tls::TlsError),

    #[error("cannot initialise {}", .dir.display())]
    InitDataDir {
        dir: PathBuf,
        #[source]
        source: WalError,
    },
    #[error("cannot read the data directory {}", .dir.display())]
    ReadDataDir {
        dir: PathBuf,
        #[source]
        source: WalError,
    },
    #[error("{} marks this node a standby, but primary_conninfo is not set", .signal.display())]
    StandbyWithoutConninfo { signal: PathBuf },
    #[error("invalid primary_conninfo")]
    InvalidConninfo(#[source] Box<walreceiver_actor::ReceiverError>),
    #[error("cannot identify the upstream")]
    IdentifyUpstream(#[source] Box<walreceiver_actor::ReceiverError>),
    #[error("--start-lsn {start} must be between 0/1 and the upstream's flush position {flush}")]
    StartLsnOutOfRange { start: Lsn, flush: Lsn },
    /// The runtime `init_standby` asks the upstream on.
    #[error(transparent)]
    Runtime(std::io::Error),
    /// The walreceiver's configuration or its making of a standby's data directory.
    #[error(transparent)]
    Receiver(Box<walreceiver_actor::ReceiverError>),
    /// Reading the WAL archive failed.
    #[error("reading the WAL archive")]
    Archive(#[source] Box<wal_archive::ArchiveError>),
    /// What `init --from-archive` cannot make from the archive, and why.
    #[error("{0}")]
    FromArchive(String),
    /// Storage, as it said.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// Starting the node.
    #[error(transparent)]
    Node(#[from] supervisor_actor::NodeError),

    #[error("reload refused; the running settings stay")]
    ReloadRefused(#[source] Box<Error>),
    #[error("the supervisor is gone")]
    SupervisorGone(#[source] actix::MailboxError),

    #[error("cannot reach the admin API at {url}")]
    AdminUnreachable {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    #[error("cannot read the admin API's answer")]
    AdminAnswerUnreadable {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    #[error("the admin API answered something that is not the JSON expected: {text}")]
    AdminAnswerNotJson {
        url: String,
        text: String,
        #[source]
        source: serde_json::Error,
    },
    /// An answer that is not a success: the API's `error`, or the whole answer without one.
    #[error("{message}")]
    AdminRefused {
        url: String,
        status: u16,
        message: String,
    },
}

// The large errors underneath are boxed, so that a `Result` of this crate stays small.
impl From<walreceiver_actor::ReceiverError> for Error {
    fn from(e: walreceiver_actor::ReceiverError) -> Error {
        Error::Receiver(Box::new(e))
    }
}

/// The configuration file an invalid configuration came from, as its message says it.
/// A cause that is only words: the text of an error this crate rewrote into the
/// configuration's own terms.
#[derive(Debug)]
pub struct Message(pub String);

impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Message {}

fn in_file(file: Option<&Path>) -> String {
    match file {
        Some(p) => format!(" (file {})", p.display()),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the binary prints: the message, then each cause after ": ".
    fn printed(e: Error) -> String {
        format!("{:#}", anyhow::Error::from(e))
    }

    #[test]
    fn a_failure_says_what_failed_then_why() {
        let io = || std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        assert_eq!(
            printed(Error::InvalidAddress {
                what: "listen".into(),
                text: "x".into(),
                source: io()
            }),
            "invalid listen address \"x\": denied"
        );
        let inner = Error::InvalidAddress {
            what: "listen".into(),
            text: "x".into(),
            source: io(),
        };
        assert_eq!(
            printed(Error::ReloadRefused(Box::new(inner))),
            "reload refused; the running settings stay: invalid listen address \"x\": denied"
        );
    }

    #[test]
    fn passed_on_errors_print_as_themselves() {
        let io = std::io::Error::other("no threads");
        assert_eq!(printed(Error::Runtime(io)), "no threads");
        assert_eq!(
            printed(Error::SynchronousCommit("bad".into())),
            "synchronous_commit: bad"
        );
    }

    #[test]
    fn the_file_an_invalid_configuration_came_from_is_named() {
        let e = |file: Option<&str>| Error::InvalidConfig {
            file: file.map(PathBuf::from),
            source: Box::new(config::ConfigError::Message("bad".into())),
        };
        assert_eq!(printed(e(None)), "invalid configuration: bad");
        assert_eq!(
            printed(e(Some("/c.toml"))),
            "invalid configuration (file /c.toml): bad"
        );
    }
}
