//! `walserver init --from-archive`: a primary's data directory made from the WAL archive, up to
//! a recovery target in PostgreSQL's words, or a standby's (`--standby`), which then streams
//! from its upstream where the archive ends.
//!
//! The target timeline (`--target-timeline`, else the newest the archive has) gives the path
//! through the timelines (`wal_archive::Catalog::plan`): its ancestors' segments below each
//! switch point, its own after, then its longest prefix. The directory starts at the path's
//! first archived segment on the timeline that covers it, every object is read checked
//! against its sidecar, its bytes are written through storage as a standby's are, and at each
//! switch point storage follows the next timeline with its history file, as a standby does.
//!
//! `--target-lsn L` keeps every record that ends at or before L (an acknowledged append's LSN
//! is its end, so the append acknowledged at L is kept and none after it), and stops on the
//! timeline L lies on. The cut falls on a record boundary: storage publishes only whole
//! records of bytes written to it, and the rest is cut with `truncate_to` after reading the
//! records back. A gap in the archive below the target is refused, never crossed.
//!
//! `--target-time T` keeps what the archive shows was durable at or before T. walserver
//! records carry no time (a record is its length, CRC, LSN and payload), so the marks are
//! the archive's own: every object on the restore's path was stored after its bytes were
//! durable on the node that stored it, so its stored time (`ArchiveTarget::stored_at`, the
//! file's modification time or S3's `Last-Modified`) bounds when everything up to its end
//! was durable. The restore goes to the largest end among the objects stored at or before T
//! (then as `--target-lsn`), so it holds nothing made durable after T, and of what was
//! durable before T it may miss up to one mark's spacing: a segment, or with
//! `archive_timeout` the WAL since the last prefix kept (a prefix is removed once a longer
//! one or its whole segment is stored, so older WAL is marked by segments only). The
//! times are the store's clock (a directory's: this host's). PostgreSQL WAL, whose commit
//! records carry times, is restored by PostgreSQL itself through `walserver restore-wal`;
//! this command makes only walserver-format data directories.
//!
//! The archive names its system (`wal_archive::IDENTITY_FILE`); a primary's restore keeps
//! that identifier (a new one only for an archive that names none), as PostgreSQL's
//! point-in-time recovery keeps its own, so the restored node may go on archiving there.
//!
//! A standby's restore (`init --from-archive --standby --primary-conninfo C`) adopts the
//! upstream's identity as `init --standby` does, refusing an archive that names another
//! system than the upstream's, restores the upstream's timeline to the archive's end or the upstream's
//! flushed end, whichever is first, cut on a record boundary, and writes `standby.signal`;
//! it never starts a timeline, so its WAL stays a prefix of the upstream's. The archive
//! must agree with the upstream on what it can show: the segment size, walserver records,
//! and the timeline's history (every switch point). Running, the walreceiver streams from
//! the restored end, and if the upstream has already removed that WAL, fills the gap from
//! the archive when the node names it (`gap.rs`).
//!
//! A primary's restore that stops before the end of the archive's WAL, or on a timeline older than the
//! archive's newest, ends by starting a new timeline, as PostgreSQL ends a point-in-time
//! recovery: otherwise the restored node would append under names the archive already holds
//! with other bytes. When that new timeline's number is already taken in the archive the
//! restore is refused before anything is written.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use wal_archive::{ArchiveError, ArchiveTarget, Catalog, Plan};
use wal_storage::{
    history_file_name, InitOptions, Lsn, Role, StorageConfig, SystemId, TimelineId, Wal, WalFormat,
};
use walreceiver_actor::UpstreamIdentity;

use crate::error::{Error, Result};
use crate::init::{
    check_new_data_dir, create_private_dir, new_system_id, upstream_identity, StandbySignal,
};

/// PostgreSQL's recovery target vocabulary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryTarget {
    pub lsn: Option<Lsn>,
    /// `--target-time`, as `YYYY-MM-DD HH:MM:SS.ffffff+00` (UTC, as `walserver status`
    /// shows times); see the module's story for what it keeps.
    pub time: Option<String>,
    pub timeline: Option<TimelineId>,
}

/// What a restore made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    pub system_id: SystemId,
    /// The timeline restored to, and where its WAL ends.
    pub timeline: TimelineId,
    pub end: Lsn,
    /// Where the directory's WAL starts.
    pub start: Lsn,
    /// The new timeline the node continues on, when the restore ended on one.
    pub new_timeline: Option<TimelineId>,
    /// How many archived objects were read.
    pub objects: usize,
}

/// How a restored node runs.
enum RestoreAs {
    /// With the archive's system identifier (a new one if it names none); a restore that
    /// ends early goes on as a new timeline.
    Primary,
    /// As a standby of the upstream `identity` describes, which `signal` names.
    Standby {
        identity: Box<UpstreamIdentity>,
        signal: StandbySignal,
    },
}

/// Makes a primary's data directory in `dir` from the archive `target` up to `to`.
pub fn init_from_archive(
    dir: &Path,
    target: &ArchiveTarget,
    to: &RecoveryTarget,
) -> Result<Restored> {
    restore(dir, target, to, RestoreAs::Primary)
}

/// Makes a standby's data directory in `dir` from the archive `target`: the upstream
/// `primary_conninfo` names is asked for its identity, its timeline is restored as far as
/// both the archive and the upstream go, and the standby streams from there when it runs.
pub fn init_standby_from_archive(
    dir: &Path,
    target: &ArchiveTarget,
    primary_conninfo: &str,
    slot: Option<&str>,
) -> Result<Restored> {
    check_new_data_dir(dir)?;
    let identity = Box::new(upstream_identity(primary_conninfo, slot)?);
    let signal = StandbySignal {
        primary_conninfo: Some(primary_conninfo.to_string()),
        primary_slot_name: slot.map(str::to_string),
        standby_since: None,
    };
    let to = RecoveryTarget {
        timeline: Some(identity.timeline),
        ..RecoveryTarget::default()
    };
    restore(dir, target, &to, RestoreAs::Standby { identity, signal })
}

fn restore(
    dir: &Path,
    target: &ArchiveTarget,
    to: &RecoveryTarget,
    restore_as: RestoreAs,
) -> Result<Restored> {
    let upstream = match &restore_as {
        RestoreAs::Primary => None,
        RestoreAs::Standby { identity, .. } => Some(identity.as_ref()),
    };
    let time = match &to.time {
        Some(text) => Some(wal_types::time::parse_time(text).ok_or_else(|| {
            refuse(format!(
                "--target-time {text:?} is not a time as YYYY-MM-DD HH:MM:SS.ffffff+00 (UTC)"
            ))
        })?),
        None => None,
    };
    check_new_data_dir(dir)?;
    // The system the archive names (`wal_archive::IDENTITY_FILE`): a standby's upstream must
    // be that system, and a primary's restore keeps its identifier, as PostgreSQL's
    // point-in-time recovery keeps its own, so the restored node may archive into the same
    // archive on its new timeline.
    let archived_system = match upstream {
        Some(id) => target.check_system(id.system_id).map_err(|e| match e {
            other @ ArchiveError::OtherSystem { .. } => refuse(format!(
                "the upstream's WAL cannot come from this archive: {other}"
            )),
            e => archive(e),
        })?,
        None => target.system_id().map_err(archive)?,
    };
    let objects = target.list().map_err(archive)?;
    let seg = target
        .segment_size(&objects)
        .map_err(archive)?
        .ok_or_else(|| refuse("the archive holds no WAL segment".into()))?;
    let catalog = Catalog::new(&objects, seg);
    let newest = catalog
        .newest_timeline()
        .ok_or_else(|| refuse("the archive holds no WAL".into()))?;
    let tli = to.timeline.unwrap_or(newest);
    let history = target.history(tli).map_err(archive)?.ok_or_else(|| {
        refuse(format!(
            "the archive has no history file of timeline {}",
            tli.0
        ))
    })?;
    if let Some(id) = upstream {
        check_upstream(id, seg, &history)?;
    }
    let plan = catalog.plan(tli, &history);
    let (start, plan_end) = match (plan.start(), plan.end()) {
        (Some(s), Some(e)) => (s, e),
        _ => {
            return Err(refuse(format!(
                "the archive holds no WAL of timeline {}",
                tli.0
            )))
        }
    };
    // Where the restore stops, and on which timeline of the path.
    let stop = to.lsn.map_or(plan_end, |l| l.min(plan_end));
    let stop = match time {
        Some(t) => stop.min(durable_by(
            target,
            &plan,
            t,
            to.time.as_deref().unwrap_or(""),
        )?),
        None => stop,
    };
    // A standby never holds WAL its upstream lacks.
    let stop = upstream.map_or(stop, |id| stop.min(id.xlogpos));
    if stop <= start {
        return Err(refuse(format!(
            "the upstream's WAL ends at {stop}, before the archive's WAL of timeline {} starts at {start}",
            tli.0
        )));
    }
    if let Some(l) = to.lsn {
        if l < start {
            return Err(refuse(format!(
                "--target-lsn {l} is before the archive's WAL of timeline {}, which starts at {start}",
                tli.0
            )));
        }
    }
    if let Some(gap) = plan.gaps.iter().find(|g| g.from * seg < stop.0) {
        return Err(refuse(format!(
            "the archive lacks {} .. {} below the target; `walserver archive verify` shows every gap",
            gap.first, gap.last
        )));
    }
    let path = timelines_on_path(tli, &history);
    let stop_tli = path
        .iter()
        .find(|(_, end)| end.is_none_or(|e| stop < e))
        .map_or(tli, |(t, _)| *t);
    // A standby follows its upstream's timelines; only a primary goes on as a new one.
    let ends_early = upstream.is_none() && (stop < plan_end || stop_tli < newest);
    if ends_early && catalog.timelines.contains_key(&stop_tli.next()) {
        return Err(refuse(format!(
            "a restore to {stop} on timeline {} must go on as timeline {}, which the archive already has; \
             choose a target on timeline {} (--target-timeline) or restore into another archive",
            stop_tli.0,
            stop_tli.next().0,
            newest.0
        )));
    }

    let first = target_get(target, &plan.pieces[0].name)?;
    if !first.starts_with(b"WALS") {
        return Err(refuse(format!(
            "{} does not hold walserver records; restore PostgreSQL WAL with PostgreSQL \
             (restore_command = 'walserver restore-wal --config FILE %f %p')",
            plan.pieces[0].name
        )));
    }
    let start_tli = path
        .iter()
        .find(|(_, end)| end.is_none_or(|e| start < e))
        .map_or(tli, |(t, _)| *t);
    let ancestry = history
        .iter()
        .take_while(|h| h.parent != start_tli)
        .cloned()
        .collect();
    let system_id = upstream
        .map(|id| id.system_id)
        .or(archived_system)
        .unwrap_or_else(new_system_id);
    let cfg = StorageConfig {
        segment_size: seg,
        // Retention must not remove what the restore wrote a moment ago; the node's own
        // settings apply once it runs.
        wal_keep_size: u64::MAX / 2,
        ..StorageConfig::default()
    };
    let opts = InitOptions {
        system_id,
        format: WalFormat::Walserver,
        timeline: start_tli,
        start_lsn: Some(start),
        history: ancestry,
        history_files: Vec::new(),
        role: match restore_as {
            RestoreAs::Primary => Role::Primary,
            RestoreAs::Standby { .. } => Role::Standby,
        },
    };
    // Made beside `dir` and renamed into place whole, so that a restore that fails (a
    // damaged object met halfway) or a crash leaves no half-restored data directory that
    // `walserver run` would take for a node.
    let staging = staging_dir(dir)?;
    create_private_dir(&staging)?;
    let made = (|| {
        let wal = Wal::init(&staging, cfg, opts).map_err(|source| Error::InitDataDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let objects = write_path(&wal, target, &plan, &path, stop, first)?;
        let end = cut_to_record(&wal, stop)?;
        let new_timeline = if ends_early {
            let reason = format!("restored from the archive to {end}");
            Some(wal.promote(&reason)?.0)
        } else {
            None
        };
        if let RestoreAs::Standby { signal, .. } = &restore_as {
            signal.write(&staging)?;
        }
        Ok((objects, end, new_timeline))
    })();
    let (objects, end, new_timeline) = match made {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    // A rename replaces an empty directory, and fails on one that is not empty.
    std::fs::rename(&staging, dir)
        .and_then(|()| sync_parent(dir))
        .map_err(|e| {
            refuse(format!(
                "moving the restored data directory {} into place as {}: {e}",
                staging.display(),
                dir.display()
            ))
        })?;
    Ok(Restored {
        system_id,
        timeline: stop_tli,
        end,
        start,
        new_timeline,
        objects,
    })
}

/// The largest end among the plan's objects stored at or before `time`: everything below it
/// was durable by then (see the module's story). `text` is the time as given, for messages.
fn durable_by(
    target: &ArchiveTarget,
    plan: &Plan,
    time: std::time::SystemTime,
    text: &str,
) -> Result<Lsn> {
    let mut best = None;
    for piece in &plan.pieces {
        let stored = target.stored_at(&piece.name).map_err(archive)?;
        if stored.is_some_and(|at| at <= time) {
            best = best.max(Some(piece.end));
        }
    }
    best.ok_or_else(|| {
        refuse(format!(
            "--target-time {text}: no object of the archive's WAL of timeline {} was stored at or before it, \
             so nothing is known to have been durable by then",
            plan.timeline.0
        ))
    })
}

/// Refuses an archive that cannot hold the upstream's WAL: another segment size, PostgreSQL
/// WAL, or another history of the timeline (the archive records no system identifier, so
/// these are what can be compared).
fn check_upstream(
    id: &UpstreamIdentity,
    seg: u64,
    history: &[wal_storage::HistoryEntry],
) -> Result<()> {
    if id.format != WalFormat::Walserver {
        return Err(refuse(
            "the upstream relays PostgreSQL WAL; make its standby with `walserver init --standby` \
             (it fills a gap from the archive as it streams)"
                .into(),
        ));
    }
    if id.segment_size != seg {
        return Err(refuse(format!(
            "the archive's segments are {seg} bytes, the upstream's {}: not the upstream's archive",
            id.segment_size
        )));
    }
    let points = |h: &[wal_storage::HistoryEntry]| -> Vec<(TimelineId, Lsn)> {
        h.iter().map(|e| (e.parent, e.switch_lsn)).collect()
    };
    if points(history) != points(&id.history) {
        return Err(refuse(format!(
            "the archive's history of timeline {} differs from the upstream's: not the upstream's archive",
            id.timeline.0
        )));
    }
    Ok(())
}

/// `.NAME.restoring` beside `dir`, emptied of what an earlier restore left there.
fn staging_dir(dir: &Path) -> Result<PathBuf> {
    let name = dir
        .file_name()
        .ok_or_else(|| refuse(format!("{} names no directory", dir.display())))?;
    let staging = dir.with_file_name(format!(".{}.restoring", name.to_string_lossy()));
    match std::fs::remove_dir_all(&staging) {
        Ok(()) => Ok(staging),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(staging),
        Err(e) => Err(refuse(format!(
            "removing {}, left by an earlier restore: {e}",
            staging.display()
        ))),
    }
}

fn sync_parent(dir: &Path) -> std::io::Result<()> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(parent)?.sync_all()
}

/// The timelines of `tli`'s path with the end of each one's range (the last has none).
fn timelines_on_path(
    tli: TimelineId,
    history: &[wal_storage::HistoryEntry],
) -> Vec<(TimelineId, Option<Lsn>)> {
    history
        .iter()
        .map(|h| (h.parent, Some(h.switch_lsn)))
        .chain([(tli, None)])
        .collect()
}

/// Writes the plan's bytes below `stop` into `wal`, following each switch point on the way;
/// `first` is the first piece's bytes, already read. Returns how many objects were read.
fn write_path(
    wal: &Wal,
    target: &ArchiveTarget,
    plan: &Plan,
    path: &[(TimelineId, Option<Lsn>)],
    stop: Lsn,
    first: Vec<u8>,
) -> Result<usize> {
    let seg = plan.segment_size;
    let mut read = 0;
    let mut first = Some(first);
    for piece in &plan.pieces {
        let piece_start = Lsn(piece.segno * seg);
        if piece_start >= stop {
            break;
        }
        let bytes = match first.take() {
            Some(b) => b,
            None => target_get(target, &piece.name)?,
        };
        read += 1;
        let bytes = Bytes::from(bytes);
        let end = piece.end.min(stop);
        let mut at = piece_start.max(wal.flushed().max(wal.written()));
        while at < end {
            // The current timeline's switch point, if it falls before this piece's end.
            let current = wal.timeline();
            let switch = path
                .iter()
                .position(|(t, _)| *t == current)
                .and_then(|i| path[i].1.map(|e| (e, path[i + 1].0)));
            let upto = match switch {
                Some((s, _)) if s < end => s,
                _ => end,
            };
            if at < upto {
                let from = (at.0 - piece_start.0) as usize;
                let to = (upto.0 - piece_start.0) as usize;
                let slice = bytes.get(from..to).ok_or_else(|| {
                    refuse(format!(
                        "{} holds {} bytes, fewer than its place in the WAL needs",
                        piece.name,
                        bytes.len()
                    ))
                })?;
                wal.write(at, bytes.slice_ref(slice))?.wait()?;
                at = upto;
            }
            if let Some((s, next)) = switch {
                // At the switch point the next timeline is followed even when the target is
                // exactly there: the target's timeline is the one that begins at it.
                if at == s {
                    let name = history_file_name(next);
                    let file = target_get(target, &name)?;
                    wal.follow_timeline(next, file, s)?;
                }
            }
        }
    }
    Ok(read)
}

/// Cuts the restored WAL back to the end of the last record that ends at or before `stop`,
/// and returns that end.
fn cut_to_record(wal: &Wal, stop: Lsn) -> Result<Lsn> {
    let tli = wal.timeline();
    let seg = wal.segment_size();
    // The timeline's first record boundary that storage can find: its switch point, or the
    // start of the directory's WAL (a segment start, which a reader may begin at).
    let from = wal
        .history()
        .last()
        .map_or(wal.oldest_retained(), |h| h.switch_lsn)
        .max(wal.oldest_retained());
    let mut reader = wal.record_reader(tli, from)?;
    // A switch point is a record's end; a segment start is none, since a record begun
    // before it may go on into it.
    let mut end = (from.segment_offset(seg) != 0).then_some(from);
    while let Some(rec) = reader.next_record()? {
        if rec.end > stop {
            break;
        }
        end = Some(rec.end);
    }
    let end = end.ok_or_else(|| {
        refuse(format!(
            "no record of the archive's WAL ends at or before {stop}: its first one starting after {from} ends later"
        ))
    })?;
    let end = end.min(wal.flushed());
    if wal.flushed() != end || wal.written() != end {
        wal.truncate_to(end)?;
    }
    Ok(end)
}

fn target_get(target: &ArchiveTarget, name: &str) -> Result<Vec<u8>> {
    target
        .get(name)
        .map_err(archive)?
        .ok_or_else(|| refuse(format!("{name} left the archive while it was read")))
}

fn archive(e: ArchiveError) -> Error {
    Error::Archive(Box::new(e))
}

fn refuse(text: String) -> Error {
    Error::FromArchive(text)
}
