//! Filling a gap from the archive: what a standby does when its upstream has already removed
//! the WAL it needs (the upstream's 58P01), as PostgreSQL's standby does with
//! `restore_command` before it retries streaming.
//!
//! [`fill`] reads whole segments of the node's timeline from the archive, from the end of
//! what storage holds, through `ArchiveTarget::get` (so every byte matched its checksum
//! sidecar), and hands each to storage with `Wal::write`, the call that writes streamed WAL,
//! waiting until it is durable before it fetches the next. It stops at the first segment the
//! archive lacks, or at the point where the upstream's history says this timeline ends: WAL
//! an old leader wrote on the timeline past its fork must never be taken, so the segment that
//! holds the switch point is read from the promotion's `.partial` (or from the next
//! timeline's segment of the same number, PostgreSQL's copy) and written only up to it.
//!
//! Before any of that it reads the archive's identity (`wal_archive::IDENTITY_FILE`): an
//! archive that names another system holds WAL under this node's names that is not this
//! node's, and is refused ([`ReceiverError::OtherSystemArchive`]); one that names none
//! (PostgreSQL's `archive_command` writes none) is read as before.
//!
//! It is blocking (archive reads, durable waits): the actor runs it on the blocking pool and
//! retries streaming when it returns. Each fill either moves storage's end forward or fails
//! with [`ReceiverError::ArchiveGap`], so a refused start is retried at most once per fill and
//! never in a loop without progress.

use bytes::Bytes;
use wal_archive::{ArchiveError, ArchiveTarget};
use wal_storage::{parse_history, segment_file_name, Lsn, TimelineId, Wal};

use crate::error::ReceiverError;

/// What a fill added to storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filled {
    pub timeline: TimelineId,
    pub from: Lsn,
    pub to: Lsn,
    pub segments: u32,
}

/// Fills storage's timeline from the archive, from its written end up to the first segment the
/// archive lacks or to the timeline's switch point in the history of `upstream_tli` (when
/// storage holds that history file). Blocking.
pub fn fill(
    archive: &ArchiveTarget,
    wal: &Wal,
    upstream_tli: TimelineId,
) -> Result<Filled, ReceiverError> {
    match archive.check_system(wal.system_id()) {
        Ok(_) => {}
        Err(ArchiveError::OtherSystem {
            archive,
            theirs,
            ours,
        }) => {
            return Err(ReceiverError::OtherSystemArchive {
                archive,
                theirs,
                ours,
            })
        }
        Err(e) => {
            return Err(ReceiverError::Archive {
                message: e.to_string(),
            })
        }
    }
    let seg = wal.segment_size();
    let pos = wal.position();
    let tli = pos.timeline;
    let from = pos.written;
    let limit = switch_point(wal, tli, upstream_tli)?;
    let mut end = from;
    let mut segments = 0;
    let mut lacking = None;
    while limit.is_none_or(|l| end < l) {
        let segno = end.0 / seg;
        let seg_start = segno * seg;
        let name = segment_file_name(tli, segno, seg);
        let mut bytes = get(archive, &name)?;
        if let (None, Some(l)) = (bytes.as_ref(), limit) {
            if l.0 < seg_start + seg {
                // The segment the timeline ends in: the promotion archived its prefix.
                bytes = get(archive, &format!("{name}.partial"))?;
                if bytes.is_none() {
                    let child = next_timeline(wal, tli, upstream_tli)?;
                    bytes = get(archive, &segment_file_name(child, segno, seg))?;
                }
            }
        }
        let Some(bytes) = bytes else {
            lacking = Some(name);
            break;
        };
        if bytes.len() as u64 != seg {
            return Err(ReceiverError::Archive {
                message: format!("{name} holds {} bytes, not a segment's {seg}", bytes.len()),
            });
        }
        let stop = limit.map_or(seg_start + seg, |l| l.0.min(seg_start + seg));
        let data =
            Bytes::from(bytes).slice((end.0 - seg_start) as usize..(stop - seg_start) as usize);
        wal.write(end, data)
            .and_then(|t| t.wait())
            .map_err(|e| ReceiverError::storage(e, tli))?;
        end = Lsn(stop);
        segments += 1;
    }
    if segments == 0 {
        return Err(ReceiverError::ArchiveGap {
            lsn: from,
            segment: lacking.unwrap_or_else(|| segment_file_name(tli, from.0 / seg, seg)),
        });
    }
    Ok(Filled {
        timeline: tli,
        from,
        to: end,
        segments,
    })
}

fn get(archive: &ArchiveTarget, name: &str) -> Result<Option<Vec<u8>>, ReceiverError> {
    archive.get(name).map_err(|e| ReceiverError::Archive {
        message: e.to_string(),
    })
}

/// Where `tli` ends in the stored history of `upstream_tli`; `None` while the upstream is on
/// `tli` itself (or its history is not stored yet), when the timeline has no end.
fn switch_point(
    wal: &Wal,
    tli: TimelineId,
    upstream_tli: TimelineId,
) -> Result<Option<Lsn>, ReceiverError> {
    Ok(history(wal, tli, upstream_tli)?.and_then(|entries| {
        entries
            .iter()
            .find(|e| e.parent == tli)
            .map(|e| e.switch_lsn)
    }))
}

/// The timeline that begins where `tli` ends, in the history of `upstream_tli`.
fn next_timeline(
    wal: &Wal,
    tli: TimelineId,
    upstream_tli: TimelineId,
) -> Result<TimelineId, ReceiverError> {
    let entries = history(wal, tli, upstream_tli)?.unwrap_or_default();
    let i = entries.iter().position(|e| e.parent == tli);
    Ok(i.and_then(|i| entries.get(i + 1))
        .map_or(upstream_tli, |e| e.parent))
}

fn history(
    wal: &Wal,
    tli: TimelineId,
    upstream_tli: TimelineId,
) -> Result<Option<Vec<wal_storage::HistoryEntry>>, ReceiverError> {
    if upstream_tli <= tli {
        return Ok(None);
    }
    let Some(text) = wal
        .history_file(upstream_tli)
        .map_err(|e| ReceiverError::storage(e, tli))?
    else {
        return Ok(None);
    };
    parse_history(&text)
        .map(Some)
        .map_err(|e| ReceiverError::storage(e, tli))
}
