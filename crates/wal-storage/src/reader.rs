//! The record reader: walserver records decoded from the flushed WAL of a timeline, through the
//! same read path as every other reader. It stops at the flushed end (`None`: call again for
//! more) and reports damage below it as corruption.

use std::sync::Arc;

use bytes::Bytes;
use wal_types::{Lsn, TimelineId};

use crate::format::{ByteSource, Record, Scan, Scanner, StopKind};
use crate::naming::segment_file_name;
use crate::state::Inner;
use crate::{Result, WalError};

/// Decodes records from the stored stream; see [`Wal::record_reader`](crate::Wal::record_reader).
pub struct RecordReader {
    scanner: Scanner<WalSource>,
    inner: Arc<Inner>,
}

impl RecordReader {
    /// A reader of timeline `tli`'s records from `from`, a record boundary or a segment start.
    pub(crate) fn new(inner: Arc<Inner>, tli: TimelineId, from: Lsn) -> RecordReader {
        let (seg, max) = (inner.cfg.segment_size, inner.cfg.max_record_size);
        RecordReader {
            scanner: Scanner::new(
                WalSource {
                    inner: inner.clone(),
                    tli,
                },
                seg,
                max,
                from,
            ),
            inner,
        }
    }

    /// The next complete record, or `None` at the end of what is readable (call again later
    /// for more). Damage below the flushed end is an error.
    pub fn next_record(&mut self) -> Result<Option<Record>> {
        match self.scanner.next()? {
            Scan::Record(r) => Ok(Some(r)),
            Scan::Stop(stop) => match stop.kind {
                StopKind::Incomplete => Ok(None),
                StopKind::Zeroed | StopKind::Invalid(_) => {
                    let seg = self.inner.cfg.segment_size;
                    let reason = match stop.kind {
                        StopKind::Invalid(r) => r,
                        _ => "zeroed record header".into(),
                    };
                    Err(WalError::Corruption {
                        segment: segment_file_name(
                            self.scanner_tli(),
                            stop.at.segment_number(seg),
                            seg,
                        ),
                        offset: stop.at.segment_offset(seg),
                        reason,
                    })
                }
            },
        }
    }

    fn scanner_tli(&self) -> TimelineId {
        self.scanner.source().tli
    }

    /// Where the next record starts (or the scan position).
    pub fn position(&self) -> Lsn {
        self.scanner.position()
    }
}

impl Iterator for RecordReader {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        self.next_record().transpose()
    }
}

/// Reads what a handle may read: the flushed WAL of one timeline.
struct WalSource {
    inner: Arc<Inner>,
    tli: TimelineId,
}

impl ByteSource for WalSource {
    fn read_at(&mut self, lsn: Lsn, max_len: usize) -> Result<Bytes> {
        self.inner.read(self.tli, lsn, max_len)
    }
}
