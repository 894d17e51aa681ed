//! Record boundaries in stored walserver WAL: where a scan can start below a position (through
//! the `rem_len` of a segment header) and where the last complete record below it ends. Open
//! (`recovery.rs`), the first append after raw writes (`writer.rs`) and promotion
//! (`timeline.rs`) all start their scans here. [`RecordEnds`] follows, batch by batch, how far
//! a standby's raw bytes of walserver records would be found again by open's scan, which is
//! as far as the writer publishes them as flushed.

use bytes::Bytes;
use wal_types::Lsn;

use crate::format::{ByteSource, Scan, Scanner, SegmentHeader, StopKind, SEGMENT_HEADER_SIZE};
use crate::naming::segment_file_name;
use crate::segments::{SegmentFiles, View};
use crate::{Result, StorageConfig, WalError};

/// A record boundary at or below `upto` from which a scan can verify everything up to `upto`:
/// the first boundary of the newest segment whose header is below `upto` and whose first
/// boundary is too. `None` if no such segment exists (nothing below `upto` but a continuation).
pub(crate) fn find_scan_start(
    files: &SegmentFiles,
    view: &View,
    wal_start: Lsn,
    upto: Lsn,
) -> Result<Option<Lsn>> {
    let seg = files.seg;
    if upto <= wal_start {
        return Ok(None);
    }
    let mut segno = Lsn(upto.0 - 1).segment_number(seg);
    loop {
        let s = Lsn(segno * seg);
        if s < wal_start.segment_start(seg) {
            return Ok(None);
        }
        if s + SEGMENT_HEADER_SIZE <= upto {
            // A segment removed by retention ends the walk: nothing older can be scanned.
            let Some(b) = files.read(view, s, Lsn::MAX, SEGMENT_HEADER_SIZE as usize)? else {
                return Ok(None);
            };
            let h = SegmentHeader::decode(&b, s).map_err(|reason| WalError::Corruption {
                segment: segment_file_name(view.timeline_of(s), segno, seg),
                offset: 0,
                reason: format!("bad segment header below the durable end {upto}: {reason}"),
            })?;
            let first = s + SEGMENT_HEADER_SIZE + h.rem_len as u64;
            if (h.rem_len as u64) < seg - SEGMENT_HEADER_SIZE && first <= upto {
                return Ok(Some(first));
            }
        }
        if segno == 0 {
            return Ok(None);
        }
        segno -= 1;
    }
}

/// The first record boundary at or after `from`'s segment start that a scan can begin at: the
/// one the header of the segment holding `from` names, or of a later one when a record covers
/// that whole segment. Recovery falls back to it when [`find_scan_start`] finds none because
/// retention removed the segment that a record reaching `from` began in: a pointer stored
/// exactly at a segment start (a batch ended there) vouches for WAL whose only earlier
/// boundary was in the removed segment. The bytes between `from` and the boundary are the
/// tail of a record no one can read any more (every slot restarts at a boundary at or after
/// it). `None` if the segment is missing or its header unreadable (not yet written).
pub(crate) fn first_boundary_from(
    files: &SegmentFiles,
    view: &View,
    from: Lsn,
    max_record_size: u64,
) -> Result<Option<Lsn>> {
    let seg = files.seg;
    let mut s = from.segment_start(seg);
    // A record spans at most this many whole segments.
    for _ in 0..=max_record_size / seg + 1 {
        let Some(b) = files.read(view, s, Lsn::MAX, SEGMENT_HEADER_SIZE as usize)? else {
            return Ok(None);
        };
        let Ok(h) = SegmentHeader::decode(&b, s) else {
            return Ok(None);
        };
        if (h.rem_len as u64) < seg - SEGMENT_HEADER_SIZE {
            return Ok(Some(s + SEGMENT_HEADER_SIZE + h.rem_len as u64));
        }
        s = s + seg;
    }
    Ok(None)
}

/// Reads a view's files up to `limit` (`Lsn::MAX` for none), for scans; a missing file reads as
/// no bytes, where the scan stops.
pub(crate) struct FileSource<'a> {
    pub files: &'a SegmentFiles,
    pub view: &'a View,
    pub limit: Lsn,
}

impl ByteSource for FileSource<'_> {
    fn read_at(&mut self, lsn: Lsn, max_len: usize) -> Result<Bytes> {
        Ok(self
            .files
            .read(self.view, lsn, self.limit, max_len)?
            .unwrap_or_default())
    }
}

/// The end of the last complete record at or below `upto`: where a new timeline starts, and
/// where appends may follow a standby's raw bytes.
pub(crate) fn last_record_end(
    files: &SegmentFiles,
    view: &View,
    cfg: &StorageConfig,
    wal_start: Lsn,
    upto: Lsn,
) -> Result<Lsn> {
    let Some(start) = find_scan_start(files, view, wal_start, upto)? else {
        if upto == wal_start {
            return Ok(upto);
        }
        return Err(WalError::Corruption {
            segment: segment_file_name(
                view.tli,
                upto.segment_number(cfg.segment_size),
                cfg.segment_size,
            ),
            offset: upto.segment_offset(cfg.segment_size),
            reason: "no complete record below the flushed end to start a timeline at".into(),
        });
    };
    let src = FileSource {
        files,
        view,
        limit: upto,
    };
    let mut scanner = Scanner::new(src, cfg.segment_size, cfg.max_record_size, start);
    let mut end = start;
    while let Scan::Record(r) = scanner.next()? {
        end = r.end;
    }
    Ok(end)
}

/// How far open would find a standby's raw bytes of walserver records again after a crash,
/// followed as they become durable (`writer.rs` publishes no further as flushed).
///
/// Open keeps the flush pointer's position and every valid record of the chain that begins at
/// [`find_scan_start`] of the pointer, and nothing else. So this follows the same chain: it
/// restarts at the pointer's scan start whenever the pointer is stored, and from there scans
/// each record once, when the durable end reaches the position by which its header says it is
/// complete. Received bytes arrive in order, so the scan only ever moves forward.
#[derive(Debug, Default)]
pub(crate) struct RecordEnds {
    /// The start of the first record of the chain not known to be complete; `None` while open
    /// would not scan at all (no scan start at or below the pointer).
    next: Option<Lsn>,
    /// The durable end by which the record at `next` is complete, as far as is known: its
    /// header's length once the header is durable. Scanning before that finds nothing new;
    /// `Lsn::MAX` after a record that does not validate, where open's scan stops too.
    complete_by: Lsn,
}

impl RecordEnds {
    /// Follows the chain open would scan after the flush pointer was stored at `pointer`.
    pub(crate) fn pointer_stored(
        &mut self,
        files: &SegmentFiles,
        view: &View,
        wal_start: Lsn,
        pointer: Lsn,
    ) -> Result<()> {
        match find_scan_start(files, view, wal_start, pointer)? {
            None => self.next = None,
            // Positions below `next` were found complete before; both are boundaries of one
            // chain, so the scan goes on from the later one.
            Some(start) if self.next.is_none_or(|n| n < start) => {
                self.next = Some(start);
                self.complete_by = start;
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// True if open would scan records past the stored pointer (there is a scan start at or
    /// below it); while it is not, only the pointer vouches for raw bytes.
    pub(crate) fn scannable(&self) -> bool {
        self.next.is_some()
    }

    /// The bytes up to `end` are complete records (appends end at a record boundary), on a
    /// chain open scans.
    pub(crate) fn complete_to(&mut self, end: Lsn) {
        if self.next.is_some() {
            self.next = Some(end);
            self.complete_by = end;
        }
    }

    /// Scans the records of `src`, which holds the durable bytes up to `end`, from the first
    /// one not yet known complete; returns the start of the first one still incomplete (the
    /// end of the last complete one, or past the header of the segment after it), `None` if
    /// open would not scan.
    pub(crate) fn advance<S: ByteSource>(
        &mut self,
        src: S,
        cfg: &StorageConfig,
        end: Lsn,
    ) -> Result<Option<Lsn>> {
        let Some(next) = self.next else {
            return Ok(None);
        };
        if end < self.complete_by {
            return Ok(Some(next));
        }
        let mut scanner = Scanner::new(src, cfg.segment_size, cfg.max_record_size, next);
        loop {
            match scanner.next()? {
                Scan::Record(r) => self.next = Some(r.end),
                Scan::Stop(stop) => {
                    self.next = Some(stop.at.min(end));
                    self.complete_by = match stop.kind {
                        StopKind::Incomplete => stop.complete_by,
                        StopKind::Zeroed | StopKind::Invalid(_) => Lsn::MAX,
                    };
                    return Ok(self.next);
                }
            }
        }
    }
}
