//! What an archive holds, timeline by timeline, and what a restore of one timeline reads.
//!
//! A restore of timeline T reads, for each segment, the copy named by the timeline of T's
//! ancestry that wrote the segment's last byte: the archiver's naming rule (`schedule.rs`),
//! which is also the file PostgreSQL finds first. The segments run from the lowest one of
//! the path the archive holds to the highest, and every one between must be there: a missing
//! one is a *gap*, which `archive verify` reports and a restore refuses to cross. After the
//! last whole segment a restore may go on into the next one with its longest prefix: an
//! `archive_timeout` prefix of the timeline that names it, or else a promotion's `.partial`
//! of a timeline whose switch point lies inside it (its bytes count up to that point).
//!
//! Everything here is plain data: the listing and the history files come in, plans and gaps
//! go out, so the rules are tested without an archive.

use std::collections::{BTreeMap, BTreeSet};

use wal_storage::{segment_file_name, HistoryEntry};
use wal_types::{Lsn, TimelineId};

use crate::read::{ArchivedFile, ObjectInfo};

/// The WAL files of one timeline in an archive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimelineFiles {
    /// Its history file is there (timeline 1 has none).
    pub history: bool,
    /// Its whole segments.
    pub segments: BTreeSet<u64>,
    /// Segments it has a promotion's `.partial` of.
    pub partials: BTreeSet<u64>,
    /// Its longest `archive_timeout` prefix of each segment: the LSN it ends at.
    pub prefixes: BTreeMap<u64, Lsn>,
}

/// An archive's WAL files, by timeline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    pub segment_size: u64,
    pub timelines: BTreeMap<TimelineId, TimelineFiles>,
    /// Objects whose names are no WAL file (left by a person, or another tool).
    pub unknown: Vec<String>,
}

/// One object a restore reads, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The object's name.
    pub name: String,
    pub segno: u64,
    /// Where its bytes stop counting: the segment's end for a whole segment, the prefix's end,
    /// or the switch point for a promotion's `.partial`.
    pub end: Lsn,
}

/// What a restore of one timeline reads, and what it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub timeline: TimelineId,
    pub segment_size: u64,
    /// Whole segments, in order, then at most one prefix or `.partial`.
    pub pieces: Vec<Piece>,
    /// Runs of segments missing between the first and the last whole one.
    pub gaps: Vec<Gap>,
}

/// A run of missing segments, inclusive, with the names a restore looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gap {
    pub from: u64,
    pub to: u64,
    pub first: String,
    pub last: String,
}

impl Plan {
    /// Where the planned WAL starts (a segment start), if anything is planned.
    pub fn start(&self) -> Option<Lsn> {
        self.pieces
            .first()
            .map(|p| Lsn(p.segno * self.segment_size))
    }

    /// Where the planned WAL ends.
    pub fn end(&self) -> Option<Lsn> {
        self.pieces.last().map(|p| p.end)
    }
}

impl Catalog {
    /// Sorts `objects` by what their names say, for segments of `segment_size` bytes.
    pub fn new(objects: &[ObjectInfo], segment_size: u64) -> Catalog {
        let mut c = Catalog {
            segment_size,
            ..Catalog::default()
        };
        for o in objects {
            if o.name == crate::identity::IDENTITY_FILE {
                continue;
            }
            let Some(file) = ArchivedFile::parse(&o.name, segment_size) else {
                c.unknown.push(o.name.clone());
                continue;
            };
            let t = c.timelines.entry(file.timeline()).or_default();
            match file {
                ArchivedFile::History(_) => t.history = true,
                ArchivedFile::Segment { segno, .. } => {
                    t.segments.insert(segno);
                }
                ArchivedFile::Partial {
                    segno, end: None, ..
                } => {
                    t.partials.insert(segno);
                }
                ArchivedFile::Partial {
                    segno,
                    end: Some(end),
                    ..
                } => {
                    let longest = t.prefixes.entry(segno).or_insert(end);
                    *longest = (*longest).max(end);
                }
            }
        }
        c
    }

    /// The newest timeline the archive has files of.
    pub fn newest_timeline(&self) -> Option<TimelineId> {
        self.timelines.keys().next_back().copied()
    }

    /// What a restore of `tli`, whose ancestry is `history` (oldest first, as its history
    /// file lists it), reads.
    pub fn plan(&self, tli: TimelineId, history: &[HistoryEntry]) -> Plan {
        let seg = self.segment_size;
        // The timelines of the path with the end of each one's range (the last has none).
        let ranges: Vec<(TimelineId, Option<Lsn>)> = history
            .iter()
            .map(|h| (h.parent, Some(h.switch_lsn)))
            .chain([(tli, None)])
            .collect();
        // The timeline that wrote segment `segno`'s last byte.
        let namer = |segno: u64| {
            ranges
                .iter()
                .find(|(_, end)| end.is_none_or(|e| e.0 >= (segno + 1) * seg))
                .map(|(t, _)| *t)
                .unwrap_or(tli)
        };
        let files = |t: TimelineId| self.timelines.get(&t);
        let whole: BTreeSet<u64> = ranges
            .iter()
            .filter_map(|(t, _)| files(*t).map(|f| (t, f)))
            .flat_map(|(t, f)| f.segments.iter().filter(|&&s| namer(s) == *t).copied())
            .collect();
        let mut plan = Plan {
            timeline: tli,
            segment_size: seg,
            pieces: Vec::new(),
            gaps: Vec::new(),
        };
        let (first, last) = match (whole.first(), whole.last()) {
            (Some(&f), Some(&l)) => (f, l),
            _ => {
                // No whole segment: a restore can still begin with a tail piece of the
                // timeline's first segment.
                if let Some(piece) = self.tail(tli, &ranges, None) {
                    plan.pieces.push(piece);
                }
                return plan;
            }
        };
        let mut gap_start = None;
        for segno in first..=last {
            if whole.contains(&segno) {
                if let Some(from) = gap_start.take() {
                    let to = segno - 1;
                    plan.gaps.push(Gap {
                        from,
                        to,
                        first: segment_file_name(namer(from), from, seg),
                        last: segment_file_name(namer(to), to, seg),
                    });
                }
                plan.pieces.push(Piece {
                    name: segment_file_name(namer(segno), segno, seg),
                    segno,
                    end: Lsn((segno + 1) * seg),
                });
            } else if gap_start.is_none() {
                gap_start = Some(segno);
            }
        }
        if let Some(piece) = self.tail(tli, &ranges, Some(last + 1)) {
            plan.pieces.push(piece);
        }
        plan
    }

    /// The longest prefix of segment `segno` (or of the path's first segment with a prefix,
    /// when `None`) that the path's timelines hold.
    fn tail(
        &self,
        tli: TimelineId,
        ranges: &[(TimelineId, Option<Lsn>)],
        segno: Option<u64>,
    ) -> Option<Piece> {
        let seg = self.segment_size;
        let fits = |s: u64| segno.is_none_or(|want| want == s);
        if let Some((&s, &end)) = self
            .timelines
            .get(&tli)
            .and_then(|f| f.prefixes.iter().find(|(s, _)| fits(**s)))
        {
            return Some(Piece {
                name: format!(
                    "{}.partial.{:08X}",
                    segment_file_name(tli, s, seg),
                    end.0 - s * seg
                ),
                segno: s,
                end,
            });
        }
        ranges.iter().find_map(|(t, end)| {
            let end = (*end)?;
            let s = end.segment_number(seg);
            let inside = end.segment_offset(seg) != 0;
            let has = self
                .timelines
                .get(t)
                .is_some_and(|f| f.partials.contains(&s));
            (inside && has && fits(s)).then(|| Piece {
                name: format!("{}.partial", segment_file_name(*t, s, seg)),
                segno: s,
                end,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = 1 << 20;

    fn catalog(names: &[&str]) -> Catalog {
        let objects: Vec<ObjectInfo> = names
            .iter()
            .map(|n| ObjectInfo {
                name: n.to_string(),
                size: 0,
            })
            .collect();
        Catalog::new(&objects, SEG)
    }

    fn gaps(plan: &Plan) -> Vec<(u64, u64)> {
        plan.gaps.iter().map(|g| (g.from, g.to)).collect()
    }

    fn names(plan: &Plan) -> Vec<&str> {
        plan.pieces.iter().map(|p| p.name.as_str()).collect()
    }

    fn switch(parent: u32, lsn: u64) -> HistoryEntry {
        HistoryEntry {
            parent: TimelineId(parent),
            switch_lsn: Lsn(lsn),
            reason: "promoted".into(),
        }
    }

    #[test]
    fn one_timeline_reads_its_segments_then_its_longest_prefix() {
        let c = catalog(&[
            "000000010000000000000002",
            "000000010000000000000003",
            "000000010000000000000004.partial.00000100",
            "000000010000000000000004.partial.00080000",
            "notes.txt",
        ]);
        assert_eq!(c.unknown, ["notes.txt"]);
        let p = c.plan(TimelineId(1), &[]);
        assert_eq!(
            names(&p),
            [
                "000000010000000000000002",
                "000000010000000000000003",
                "000000010000000000000004.partial.00080000"
            ]
        );
        assert!(p.gaps.is_empty());
        assert_eq!(p.start(), Some(Lsn(2 * SEG)));
        assert_eq!(p.end(), Some(Lsn(4 * SEG + 0x80000)));
    }

    #[test]
    fn missing_segments_are_gaps() {
        let c = catalog(&[
            "000000010000000000000001",
            "000000010000000000000003",
            "000000010000000000000004",
            "000000010000000000000008",
        ]);
        let p = c.plan(TimelineId(1), &[]);
        assert_eq!(gaps(&p), [(2, 2), (5, 7)]);
        assert_eq!(p.gaps[1].first, "000000010000000000000005");
    }

    #[test]
    fn a_later_timeline_reads_its_ancestors_segments_below_the_switch() {
        // Timeline 2 began at 0/3080000, inside segment 3: segments 1 and 2 are timeline 1's,
        // segment 3 is timeline 2's copy; timeline 1's own segment 3 is its .partial, and its
        // segments past the switch (an old leader's tail) are on no path of timeline 2.
        let c = catalog(&[
            "000000010000000000000001",
            "000000010000000000000002",
            "000000010000000000000003.partial",
            "000000010000000000000004",
            "00000002.history",
            "000000020000000000000003",
            "000000020000000000000004",
        ]);
        let h = [switch(1, 3 * SEG + 0x80000)];
        let p = c.plan(TimelineId(2), &h);
        assert_eq!(
            names(&p),
            [
                "000000010000000000000001",
                "000000010000000000000002",
                "000000020000000000000003",
                "000000020000000000000004",
            ]
        );
        assert!(p.gaps.is_empty());
        // Before timeline 2's switch segment is archived, its parent's .partial ends the path
        // at the switch point.
        let c = catalog(&[
            "000000010000000000000001",
            "000000010000000000000002",
            "000000010000000000000003.partial",
            "00000002.history",
        ]);
        let p = c.plan(TimelineId(2), &h);
        assert_eq!(
            names(&p)[2..],
            ["000000010000000000000003.partial".to_string()]
        );
        assert_eq!(p.end(), Some(Lsn(3 * SEG + 0x80000)));
        // Timeline 1 itself reads its own segments, past the switch too.
        let c = catalog(&[
            "000000010000000000000002",
            "000000010000000000000003.partial",
            "000000010000000000000004",
            "000000020000000000000003",
        ]);
        let p = c.plan(TimelineId(1), &[]);
        assert_eq!(gaps(&p), [(3, 3)]);
    }

    #[test]
    fn a_switch_at_a_segment_boundary_leaves_the_segment_to_the_parent() {
        let c = catalog(&[
            "000000010000000000000002",
            "000000010000000000000003",
            "000000020000000000000004",
        ]);
        let p = c.plan(TimelineId(2), &[switch(1, 4 * SEG)]);
        assert_eq!(
            names(&p),
            [
                "000000010000000000000002",
                "000000010000000000000003",
                "000000020000000000000004",
            ]
        );
    }
}
