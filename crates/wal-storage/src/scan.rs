//! Record boundaries in stored walserver WAL: where a scan can start below a position (through
//! the `rem_len` of a segment header) and where the last complete record below it ends. Open
//! (`recovery.rs`), the first append after raw writes (`writer.rs`) and promotion
//! (`timeline.rs`) all start their scans here.

use bytes::Bytes;
use wal_types::Lsn;

use crate::format::{ByteSource, Scan, Scanner, SegmentHeader, SEGMENT_HEADER_SIZE};
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
