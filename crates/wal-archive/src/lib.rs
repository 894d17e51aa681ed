//! wal-archive: continuous archiving of a node's WAL.
//!
//! The [`Archiver`] actor copies every completed segment, under PostgreSQL's file name
//! (`TTTTTTTTXXXXXXXXYYYYYYYY`), every timeline history file of the node's ancestry, at a
//! promotion the old timeline's last segment as `NAME.partial` (its bytes up to the switch
//! point, then zeros to the segment's size, PostgreSQL's shape), and with `archive_timeout`
//! the current segment's durable prefix as `NAME.partial.EEEEEEEE` (E: the end's offset in
//! the segment, 8 hex digits, so names sort by end; the bytes from the segment's start,
//! unpadded), to an archive ([`ArchiveTarget`]: a directory, `file:///path`, an
//! S3-compatible bucket, `s3://bucket/prefix`, through the `object_store` crate (`s3.rs`),
//! stored as they are or zstd-compressed under `NAME.zst` ([`Compression`]), or an
//! `archive_command` with PostgreSQL's `%p` / `%f` contract, [`ArchiveCommand`]).
//! [`ArchivedFile`] parses these names for a restore. Both kinds of
//! WAL (walserver records and relayed PostgreSQL WAL) are bytes to it. It runs beside the
//! node's other actors, started by the node when `archive_mode` is `on` or `always`, and is
//! stopped in the node's shutdown order with [`StopArchiver`]; its peer is storage, which it
//! reads only through `Wal`'s reader API and whose retention it holds.
//!
//! The contract is PostgreSQL's archiver's, with WAL-G's and pgBackRest's checks:
//!
//! - Order: in LSN order, none skipped, a timeline's history file before any segment of it
//!   (`schedule.rs`, a pure machine with time passed in). A failure is retried with backoff,
//!   the same file again, and shows in [`ArchiverStatus`].
//! - Retention: storage keeps every segment not yet archived, whatever `wal_keep_size` or a
//!   slot says, through a durable archived position (`Wal::set_archived`, PostgreSQL's
//!   `.ready`/`.done`). The archiver takes the hold before its first upload and moves it
//!   only after the object is durable, so a kill -9 at any moment loses nothing: at worst a
//!   segment is put again, and finds its own bytes there.
//! - Objects: created only if absent, durable before they count, never overwritten, each
//!   with a CRC32C sidecar of its bytes for a restore to check (`target.rs`). An object of
//!   the same name and other bytes is an alarm; archiving stops there until a person looks.
//!   An S3 store must honour `If-None-Match: *` for that: before its first upload an
//!   archiver creates a probe object twice and removes it, and archives nothing to a store
//!   whose second create succeeds ([`ArchiveError::NoCreateIfAbsent`], an alarm).
//!   The one removal: an `archive_timeout` prefix once a longer one, the `.partial` or the
//!   whole segment is durable in the archive (a crash between leaves one behind, which the
//!   next put of that segment removes; a reader takes the longest).
//! - Identity: an archive holds one system's WAL. The first archiver names its system
//!   identifier in [`IDENTITY_FILE`] (created only if absent, `identity.rs`); every
//!   archiver reads it before its first upload, and one of another system archives nothing
//!   there ([`ArchiveError::OtherSystem`], an alarm as a mismatch is).
//! - Cost: the archive is listed when archiving starts and after a failure, not per upload;
//!   between those the archiver keeps the names it put and removed (`known.rs`), and lists
//!   again when a put finds an object it did not know of (another node writes there too).
//!   A standby under `on` asks for the few names it follows instead of listing.
//!
//! - Failover: under `archive_mode = on` a standby does not archive but keeps its WAL until
//!   the archive has it, looking at the archive (its names) each time one of its own
//!   segments completes, rather than trusting what a leader says it archived; a cut of its
//!   WAL brings the hold back to the cut. Promoted, it goes on from there, a segment or two
//!   behind the archive's end, and each put compares with what is there: every segment of
//!   every timeline is archived once, with the old timeline's `.partial`, and no gap.
//!   Under automatic failover a primary starts an upload only while it holds the leader's
//!   fence ([`Archiver::start_fenced`]): a leader that lost its lease stops adding to the
//!   archive its successor writes, and an upload of its that was already running can only
//!   find its own bytes there or put the same bytes first.
//!
//! File I/O runs on the blocking pool, one job at a time: the actor's thread only decides.
//! With a backlog, one job (a round) puts up to `ROUND_SEGMENTS` consecutive segments through
//! `UPLOADS_IN_FLIGHT` threads, each taking the next segment as soon as it has put its last
//! (one segment's compression overlaps others' requests and the store's work), and stores
//! the archived position each time the segments that succeeded in order reach further, so
//! retention and the backlog gate move a segment at a time; after a failure, a stop or the
//! loss of the leader's fence it starts no further segment.
//! An S3 target's requests run on a runtime of the target's own (`s3.rs`), which the
//! blocking job waits for, so an upload is still one job that returns to the actor once;
//! an object larger than `multipart_part_size` goes as a multipart upload, invisible until
//! its complete, which carries the same create-only condition.
//!
//! Restore reads the archive back through the same [`ArchiveTarget`] (`read.rs`): `get`
//! hands out an object only after it matched its sidecar (a missing object is `None`, a
//! damaged one an error naming it; a compressed one decompressed), `list` shows the
//! files, and [`ArchivedFile`] parses
//! PostgreSQL's names, partial segments included. The CLI's `restore-wal`, `archive list |
//! verify` and `init --from-archive` are built on these.
//!
//! Later steps add backpressure beside these types.

mod actor;
mod catalog;
mod command;
mod compression;
mod error;
mod identity;
mod known;
mod messages;
mod read;
mod s3;
mod schedule;
mod status;
mod target;

pub use actor::{ArchiveConfig, ArchiveMode, Archiver};
pub use catalog::{Catalog, Gap, Missing, Piece, Plan, TimelineFiles};
pub use command::ArchiveCommand;
pub use compression::{Compression, DEFAULT_ZSTD_LEVEL, ZSTD_LEVELS};
pub use error::{ArchiveError, Result};
pub use identity::IDENTITY_FILE;
pub use messages::{GetArchiverStatus, StopArchiver};
pub use read::{ArchivedFile, Checksum, ObjectInfo, SIDECAR_SUFFIX};
pub use s3::{S3Options, S3Target, DEFAULT_PART_SIZE, MIN_PART_SIZE, PARALLEL_PARTS};
#[cfg(feature = "failpoints")]
pub use s3::{FAILPOINT_HOLD_ENV, FAILPOINT_HOLD_LINE};
pub use schedule::{
    backoff, prefix_stem, Item, Next, Schedule, WalView, FIRST_BACKOFF, MAX_BACKOFF,
};
pub use status::ArchiverStatus;
pub use target::{sidecar, ArchiveTarget, Put, PROBE_PREFIX};

#[cfg(test)]
mod actor_tests;
#[cfg(test)]
mod careless;
