//! wal-storage: how walserver keeps WAL on disk.
//!
//! This crate owns a node's data directory, except its configuration: the segment files, the
//! timeline history files, the control data, the flush pointer and the replication slots. It
//! takes WAL in (raw bytes at given LSNs, or walserver records it frames itself), makes it
//! durable with group commit, tells subscribers how far it is durable, serves any retained
//! range of any timeline in the node's history, switches timelines, and removes WAL that
//! nothing needs any more. It knows nothing of sockets, actix or the replication protocol: its
//! callers are actors that use a [`Wal`] handle, its notifications are `tokio::sync` channels
//! that need no runtime, and its blocking work happens on two threads of its own.
//!
//! # Layout
//!
//! ```text
//! DATA/walserver.lock   held with an exclusive lock while a process uses the directory
//! DATA/control          control data: JSON body + CRC32C, replaced atomically (files.rs)
//! DATA/flush_pointer    durable end of the current timeline: two CRC'd slots updated in place (files.rs)
//! DATA/pg_wal/          only segment files (TTTTTTTTXXXXXXXXYYYYYYYY) and TTTTTTTT.history files
//! DATA/slots/NAME       one file per persistent physical slot, replaced atomically (slots.rs)
//! DATA/archive_status   the archived position while archiving is on, replaced atomically (archived.rs)
//! DATA/commit_point     a standby's told commit point: two CRC'd slots updated in place (told.rs)
//! DATA/tmp/             temp files of atomic replacements and preallocation; emptied at open
//! ```
//!
//! Segment and history files are named and formatted as PostgreSQL names and formats them
//! (`naming.rs`, `history.rs`), so relayed PostgreSQL WAL compares with pg_receivewal's output
//! byte for byte. Every file is written whole elsewhere and renamed (or linked) into place, so
//! `pg_wal` never holds a partial or temporary file.
//!
//! # What is stored
//!
//! A node stores one of two kinds of WAL ([`WalFormat`]), fixed at init. *Relayed PostgreSQL
//! WAL* is stored byte for byte and never parsed. *walserver WAL* is a stream of walserver
//! records in segments that begin with a segment header; its format is written down in
//! `format.rs`: `| len | crc32c | start LSN | payload | padding |` records, 8-byte aligned,
//! spanning segments by skipping the next segment's 24-byte header. A new primary's WAL starts
//! at the start of segment 1 (0/1000000 with 16 MiB segments, since 0/0 means "no position" to
//! PostgreSQL); its first record is at 0/1000018.
//!
//! # Writing: group commit
//!
//! [`Wal::write`] and [`Wal::append`] send a request over an unbounded crossbeam channel (a
//! bounded send could block an actor's thread) to the writer thread and return a [`Ticket`].
//! The writer takes what is queued as one batch (right after a larger batch of appends it
//! waits, at most about one sync's time, for as many, so that synchronous appenders coming
//! back a few microseconds apart do not split into groups that each pay a sync: `gather.rs`),
//! writes it with one `pwritev` (received
//! buffers are written as they arrived, not copied), makes one `fdatasync` per segment file
//! touched, stores the flush pointer when needed, keeps a copy of the batch if it is small
//! (`tail.rs`: [`Wal::read_cached`] serves a reader at the end from memory), puts the new
//! [`WalPosition`] into a watch channel, completes every ticket and then announces the
//! position (wakes the watch's receivers): once per round of answers, failures and refusals
//! included, so that a ticket may be waited on through the watch ([`Ticket::ride`]) and cost
//! its thread no wake-up beyond the announcement's. Segment files are
//! created zero-filled to full size by the background thread before they are needed, so the
//! hot path never extends a file (and fdatasync journals no size change); with `wal_recycle`
//! on (the default) a segment nobody holds any more is recycled as a later one instead of
//! being removed and made anew (its old bytes never validate at the new place: records and
//! segment headers carry their own LSN). `writer.rs` has the details, including what a
//! failed batch leaves behind; `background.rs` the preallocation and recycling.
//!
//! # Crash safety
//!
//! After a kill -9 or a power loss at any moment, [`Wal::open`] must find the end of durable
//! WAL, every write reported durable must be there byte for byte, and a torn or half-written
//! tail must be cut and never served. The reasoning:
//!
//! - A ticket resolves only after the fdatasync of every segment file its bytes went to. Data
//!   that was acknowledged is therefore on disk; the question at open is only where it ends.
//! - Raw bytes (a standby's byte stream, and all relayed PostgreSQL WAL) carry no framing
//!   walserver can check, so their end is recorded: after a batch's data fdatasync the writer
//!   stores `(timeline, end LSN, sequence number)` with a CRC in the flush pointer file, in the
//!   slot not holding the newest value, and fdatasyncs it; only then are tickets completed. A
//!   torn pointer write damages one slot only, whose CRC fails; open takes the valid slot with
//!   the highest sequence. The data is synced before the pointer, so the pointer never vouches
//!   for bytes that are not durable.
//! - walserver records check themselves (CRC, their own start LSN), so a batch of appends, or
//!   of a standby's raw bytes of walserver records, need not store the pointer; it does so
//!   only when the batch ends in another segment than the pointer names (or after a
//!   truncation or recovery, or while open would find no scan start at or below it). At open,
//!   the scan starts at a record boundary at or below the pointer, found through the
//!   `rem_len` of the newest segment header below it, and goes forward record by record while
//!   records validate. The end is `max(pointer, end of valid records)`: the pointer covers a
//!   standby whose durable end is in the middle of a record, the scan covers records written
//!   after the pointer was last stored. The scan is contiguous from a durable point, so a
//!   record that reached the disk while an earlier one did not is never counted.
//! - So a crash may take back the partial record at the end of a standby's raw bytes (they
//!   arrive cut anywhere). The writer therefore publishes as flushed only what open would find
//!   again: for such bytes, the pointer or the end of the last complete record, whichever is
//!   later (`scan.rs`'s `RecordEnds` follows open's scan batch by batch, reading each record
//!   once, from memory). The rest is durable and counted as `written`; it is published once
//!   its record is complete. Walsenders (cascades) send, and a walreceiver reports upstream,
//!   only the published flushed end, so the flushed end never moves back across a crash and
//!   nothing is sent downstream that the node could lose.
//! - A record that fails to validate below the pointer is corruption in the middle of durable
//!   WAL, and open fails with [`WalError::Corruption`]; it does not silently cut.
//! - Having found the end, open (`recovery.rs`) stores it in the pointer marked *exact* (so a crash during the
//!   cut redoes the same cut), zeroes the rest of the end's segment, removes the timeline's
//!   later segment files and fsyncs, before accepting writes. Otherwise a later, shorter write
//!   could leave an old CRC-valid, never-acknowledged record right behind it, and a later scan
//!   would accept it (a "phantom"). For the same reason a failed batch's bytes are zeroed by the
//!   next successful one, and [`Wal::truncate_to`] stores an exact pointer before it cuts.
//! - Control data, slots and history files change by write-to-temp, fsync, rename, fsync the
//!   directory (`durable.rs`): a crash leaves the old or the new file. A timeline switch writes the history file
//!   and the new switch segment first and the control file last, which is the commit point.
//!
//! The kill -9 test in `tests/crash/main.rs` exercises all of this with a real child process
//! for both kinds of WAL; the torn-tail table and the fault tests cover the rest. A kill -9
//! loses nothing the kernel was given, so a power loss is simulated apart from it: under the
//! `failpoints` feature a recorder in `io.rs` (`powerloss.rs`, which writes its model down;
//! the directory part is `powerloss-model`'s, shared with lossyfs) sees every file and
//! directory operation, and `tests/storage/powerloss.rs` pulls the plug
//! at a seeded moment, rewrites the directory into one state a power loss could leave
//! (unsynced writes lost or cut, directory changes not fsynced through their directory
//! undone), and checks every acknowledged record. This holds only because every file
//! operation goes through `Io`, which a unit test in `io.rs` checks.
//!
//! # Failures
//!
//! A failed fsync or fdatasync is never retried and trusted: the kernel may have dropped the
//! pages it could not write and marked them clean. The writer then refuses every request
//! ([`WalError::StorageFailed`]) with the flushed end held at the last good sync, and says so
//! on the health watch ([`Wal::subscribe_health`]); its owner reopens storage with
//! [`Wal::restart`], which runs open's recovery with that end as the exact durable end, under
//! the same handle. A full disk is backpressure ([`WalError::DiskFull`], state `full`): the
//! batch fails, writes that fit in the current segment go on, and writes resume once space
//! is freed. `health.rs` writes the policy down.
//!
//! # Timelines
//!
//! [`Wal::promote`] starts timeline N+1 at the end of the last complete record at or below the
//! durable end (a standby's end may be mid-record), writes `0000000N+1.history` listing every
//! ancestor, and makes the new timeline's first segment a copy of the old one up to the switch
//! point, as PostgreSQL does. The control file that then makes N+1 current also records the
//! node's [`Role`] as primary: the role and the timeline change in one atomic write. A
//! primary made a standby ([`Wal::set_role`]) records its durable end with the role, in the
//! same write ([`Wal::primary_end`]): WAL it wrote as a primary, which the overlapped commit's
//! cut at a stream start never drops; only an explicit cut below it ends it. Reads of a timeline resolve each LSN to the file of the timeline
//! in its history that covers it, preferring the newest timeline's copy of a switch segment
//! (`segments.rs`). [`Wal::follow_timeline`] does the standby's side and detects forks; both
//! run on the writer thread (`timeline.rs`).
//!
//! # Retention and slots
//!
//! At each segment switch the background thread removes every segment below the oldest one
//! needed by a slot or by `wal_keep_size` (never the current one), invalidating slots that
//! would hold more than `max_slot_wal_keep_size`. The arithmetic and `wal_status` follow
//! PostgreSQL 15 exactly; `slots.rs` writes the rules down. Retention writes the slots that
//! moved before it removes anything, and keeps WAL from the oldest restart point a slot's
//! file holds: a crash brings a slot back as its file says, so its WAL must still be there.
//! While archiving is on, the durable archived position holds every segment not yet archived
//! as well (`archived.rs`, PostgreSQL's `.ready`/`.done`), whatever the slots and
//! `wal_keep_size` say. What waits for the archive is bounded instead of filling the disk:
//! past `archive_max_backlog` the archiver closes storage's archive gate, `append` refuses
//! with `WalError::ArchiveBacklog`, and relays stop reading until it opens.
//! [`Wal::slot_moves`] announces a slot made or dropped and a restart point that entered
//! another segment, the granularity retention counts in, so that a copy of a slot kept on
//! another node (failover's permanent slots) can follow it.
//!
//! # What this crate does not do
//!
//! It does not parse PostgreSQL WAL, speak the replication protocol, decide durability levels
//! or synchronous replication, or log on its own beyond warnings about cut tails, invalidated
//! slots and failed background work (through `tracing`); [`Wal::recovery_report`] returns what
//! open found for the binary to log.
//!
//! # Modules
//!
//! Each module imports only modules below it in this order, never one that imports it back:
//!
//! ```text
//! metrics, powerloss, crash ← io                             counters; power loss; crash points
//! kind, naming, tail, io ← error ← config, history, format   types, names, formats, file ops
//! health                                                     the state of the failure policy
//! io ← durable ← files ← slots, archived, told, clean, early small durable files, slot rules
//! io ← segments ← scan ← staged                             segment files, record boundaries
//! files, slots, segments, tail, told, early ← state          Inner, positions, reads
//! state ← background, reader                                 prealloc, retention; records
//! state, background, scan, staged, clean ← writer ← timeline group commit; promote, truncate
//! state, scan, files, slots, told, early, background ← recovery init, open, tail scan, report
//! recovery, writer, timeline, reader, clean, early ← wal     the `Wal` handle
//! ```
//!
//! [`durable`] is public: the standby signal and the supervisor's removal of it use the same
//! rule for small durable files as storage does.
//!
//! **Invariants:** `flushed <= written` and the flushed end of a timeline never moves back,
//! not even across a crash, except by an explicit [`Wal::truncate_to`] (or
//! [`Wal::truncate_beyond`], which decides on the writer's thread); the flushed end
//! published is never beyond what open finds again; nothing is readable beyond the flushed
//! end, except that under the overlapped commit [`Wal::read_cached_written`] serves the batch
//! whose fdatasync runs (for synchronous walserver standbys, which cut back what was never
//! acknowledged); a timeline's WAL below its switch point never changes. Under the overlapped
//! commit a node also holds the commit point it knows ([`CommitBound`]: its own on a primary,
//! in memory only; told by the upstream on a standby, published only once it is durable in
//! `DATA/commit_point` (`told.rs`), so a restarted standby still knows it, and never lowered
//! except by the fork cut, [`Wal::truncate_beyond`], to the cut, before it cuts), published with
//! the position ([`WalPosition::committed`], [`WalPosition::sendable`]) for its readers to
//! stop at, and the early-send mark (`early.rs`): the timeline on which it may have sent WAL
//! past its durable end, named only once durable ([`Wal::mark_early_sends`]).

mod archived;
mod background;
mod clean;
mod config;
#[cfg(feature = "failpoints")]
pub mod crash;
pub mod durable;
mod early;
mod error;
mod files;
mod format;
mod gather;
mod health;
mod history;
mod io;
mod kind;
mod metrics;
mod naming;
#[cfg(feature = "failpoints")]
mod powerloss;
mod reader;
mod recovery;
mod recycle;
mod scan;
mod segments;
mod slots;
mod staged;
mod state;
mod tail;
mod timeline;
mod told;
mod wal;
mod writer;

pub use wal_types::{Lsn, PgTimestamp, SystemId, TimelineId};

pub use archived::ArchiveBacklog;
pub use config::{StorageConfig, DEFAULT_MAX_RECORD_SIZE, DEFAULT_SEGMENT_SIZE};
pub use error::{Result, WalError};
pub use format::{Record, SegmentHeader, RECORD_HEADER_SIZE, SEGMENT_HEADER_SIZE};
pub use health::{StorageHealth, StorageState};
pub use history::{departs_from, describe_line, format_history, parse_history, HistoryEntry};
#[cfg(feature = "failpoints")]
pub use io::Failpoints;
pub use io::{
    FAILPOINTS, FP_ATOMIC, FP_CREATE, FP_DIRSYNC, FP_FSYNC, FP_LINK, FP_LOCK, FP_OPEN, FP_POINTER,
    FP_PREALLOC, FP_READ, FP_READDIR, FP_REMOVE, FP_RENAME, FP_WRITE,
};
pub use kind::{Role, WalFormat};
pub use metrics::{disk_free_bytes, StorageErrorKind, StorageMetrics};
pub use naming::{
    history_file_name, parse_history_file_name, parse_segment_file_name, segment_file_name,
};
#[cfg(feature = "failpoints")]
pub use powerloss::{CrashReport, PowerLoss};
pub use reader::RecordReader;
pub use recovery::{InitOptions, RecoveryReport};
pub use segments::WalFileRange;
pub use slots::{validate_slot_name, SlotInfo, WalStatus};
pub use state::{CommitBound, WalPosition};
pub use wal::{AppendTicket, SlotGuard, Ticket, Wal, WeakWal, WriteTicket};
