//! The crate's one error type.

/// What can go wrong while archiving.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// `archive_target` is not a URL this build can archive to.
    #[error("archive_target {target:?} is not supported: {reason}")]
    BadTarget { target: String, reason: String },
    /// A file operation on the archive failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The archive already holds an object of this name with other contents. It is never
    /// overwritten: either another cluster archives to the same place or the archive was
    /// damaged, and either needs a person.
    #[error("{object} is already in the archive with different contents; it is not overwritten")]
    Mismatch { object: String },
    /// The archive names another database system than this node's: its WAL is not this
    /// node's to add to, or to restore from. Never crossed; it needs a person (another
    /// cluster's `archive_target`, or a prefix reused).
    #[error(
        "the archive {archive} belongs to system {theirs}, not to system {ours}: refusing to mix \
         the WAL of two systems (give each cluster its own archive_target)"
    )]
    OtherSystem {
        archive: String,
        theirs: wal_types::SystemId,
        ours: wal_types::SystemId,
    },
    /// The object store does not honour `If-None-Match: *`: a second conditional create of
    /// one name succeeded. Every put here creates first and reads only when the create
    /// fails, so on such a store a retry or a second writer would replace an object; nothing
    /// is archived there, and it needs a person (another store, or its setting).
    #[error(
        "the object store of {archive} ignores If-None-Match: * (a second create of the probe \
         object {probe} succeeded): an object there could be overwritten, so nothing is \
         archived to it"
    )]
    NoCreateIfAbsent { archive: String, probe: String },
    /// An archived object does not match its checksum sidecar, or its sidecar is missing or
    /// unreadable. Its bytes are never handed out.
    #[error("{name} in the archive is corrupt: {reason}")]
    Corrupt { name: String, reason: String },
    /// `archive_command` ended with a status other than 0: the file is not archived.
    #[error("archive_command failed for {name} ({status}): {stderr}")]
    Command {
        name: String,
        status: String,
        stderr: String,
    },
    /// The target cannot do this (an `archive_command` cannot be listed or read back).
    #[error("{0}")]
    Unsupported(String),
    /// A request to an object store failed (after the store client's own retries).
    #[error("{context}: {source}")]
    Store {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `archive_compression` is not one this build knows.
    #[error("archive_compression must be none or zstd, not {0:?}")]
    BadCompression(String),
    /// `archive_compression_level` is not one `archive_compression` takes.
    #[error("archive_compression_level {level} is refused: {reason}")]
    BadCompressionLevel { level: i32, reason: String },
    /// Reading the node's own WAL failed.
    #[error("reading WAL to archive: {0}")]
    Storage(#[from] wal_storage::WalError),
}

impl ArchiveError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> ArchiveError {
        ArchiveError::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = ArchiveError> = std::result::Result<T, E>;
