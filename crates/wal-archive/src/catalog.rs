//! What an archive holds, timeline by timeline, and what a restore of one timeline reads.
//!
//! A restore of timeline T reads, for each segment, the copy named by the timeline of T's
//! ancestry that wrote the segment's last byte: the archiver's naming rule (`schedule.rs`),
//! which is also the file PostgreSQL finds first. After the last whole segment a restore may
//! go on into the next one with its longest prefix: an `archive_timeout` prefix of the
//! timeline that names it, or else a promotion's `.partial` of a timeline whose switch point
//! lies inside it (its bytes count up to that point).
//!
//! Continuity is checked along the path T's history file describes, from the archive's start
//! to the furthest of T's last whole segment in the archive and its last switch point. The
//! archive's start is the lowest segment any of its WAL files holds, of any timeline: an
//! archive that begins after timeline 1's start (`archive_mode` turned on late, old WAL
//! removed on purpose) lacks nothing by that alone, and no listing could tell those apart
//! from a loss. From there every segment must be present whole under its name (a missing run
//! is a [`Gap`]); each switch point inside a segment at or after the start needs the old
//! timeline's copy of that segment (its `.partial`, a prefix reaching the switch, or the
//! whole segment), since only that holds the old timeline's WAL up to the switch under the
//! old timeline's name; and each timeline of the path after the first whose WAL reaches the
//! start needs its history file, since PostgreSQL looks for the newest timeline one history
//! file at a time. A missing one of those is a [`Missing`] file. Both are gaps to `archive
//! verify`; a restore refuses to cross a [`Gap`].
//!
//! Everything here is plain data: the listing and the history files come in, plans and gaps
//! go out, so the rules are tested without an archive.

use std::collections::{BTreeMap, BTreeSet};

use wal_storage::{history_file_name, segment_file_name, HistoryEntry};
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
    /// Runs of segments missing from the archive's start to the path's end.
    pub gaps: Vec<Gap>,
    /// The path's history files and switch segments the archive lacks.
    pub missing: Vec<Missing>,
}

/// A run of missing segments, inclusive, with the names a restore looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gap {
    pub from: u64,
    pub to: u64,
    pub first: String,
    pub last: String,
}

/// A file of the path, other than a whole segment, that the archive lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// The history file of a timeline of the path.
    History { timeline: TimelineId, name: String },
    /// The old timeline's copy of the segment its switch point lies inside, named as the
    /// promotion's `.partial` (a prefix reaching the switch, or the whole segment, would do).
    Switch {
        timeline: TimelineId,
        switch: Lsn,
        name: String,
    },
}

impl Missing {
    /// The name the archive lacks.
    pub fn name(&self) -> &str {
        match self {
            Missing::History { name, .. } | Missing::Switch { name, .. } => name,
        }
    }
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::History { timeline, name } => {
                write!(
                    f,
                    "{name}, timeline {}'s history file, is missing",
                    timeline.0
                )
            }
            Missing::Switch {
                timeline,
                switch,
                name,
            } => write!(
                f,
                "{name} is missing: timeline {}'s WAL up to its switch at {switch}",
                timeline.0
            ),
        }
    }
}

impl Plan {
    /// Whether the path lacks nothing from the archive's start to its end.
    pub fn is_complete(&self) -> bool {
        self.gaps.is_empty() && self.missing.is_empty()
    }

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

    /// The archive's start: the lowest segment any of its WAL files holds, of any timeline.
    pub fn first_segment(&self) -> Option<u64> {
        self.timelines
            .values()
            .flat_map(|f| {
                [
                    f.segments.first(),
                    f.partials.first(),
                    f.prefixes.keys().next(),
                ]
            })
            .flatten()
            .min()
            .copied()
    }

    /// The newest timeline the archive has files of.
    pub fn newest_timeline(&self) -> Option<TimelineId> {
        self.timelines.keys().next_back().copied()
    }

    /// What a restore of `tli`, whose ancestry is `history` (oldest first, as its history
    /// file lists it), reads, and what the archive lacks of that path from its start.
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
            missing: Vec::new(),
        };
        let Some(start) = self.first_segment() else {
            return plan;
        };
        plan.missing = self.missing(&ranges, start);
        // The path ends at its last whole segment, or further at a switch point past it: the
        // history file says the WAL below a switch was written, so the archive must hold it.
        let reach = whole
            .last()
            .map(|l| l + 1)
            .into_iter()
            .chain(history.iter().map(|h| h.switch_lsn.0 / seg))
            .max()
            .unwrap_or(start);
        let mut gap_start = None;
        for segno in start..reach.max(start) {
            if whole.contains(&segno) {
                if let Some(from) = gap_start.take() {
                    plan.gaps.push(self.gap(&namer, from, segno - 1));
                }
            } else if gap_start.is_none() {
                gap_start = Some(segno);
            }
        }
        if let Some(from) = gap_start {
            plan.gaps.push(self.gap(&namer, from, reach - 1));
        }
        plan.pieces = whole
            .iter()
            .map(|&segno| Piece {
                name: segment_file_name(namer(segno), segno, seg),
                segno,
                end: Lsn((segno + 1) * seg),
            })
            .collect();
        // With no whole segment a restore can still begin with a tail piece of the path's
        // first segment.
        if let Some(piece) = self.tail(tli, &ranges, whole.last().map(|l| l + 1)) {
            plan.pieces.push(piece);
        }
        plan
    }

    fn gap(&self, namer: &impl Fn(u64) -> TimelineId, from: u64, to: u64) -> Gap {
        let seg = self.segment_size;
        Gap {
            from,
            to,
            first: segment_file_name(namer(from), from, seg),
            last: segment_file_name(namer(to), to, seg),
        }
    }

    /// The history files and switch segments of the path `ranges` (each timeline with the
    /// end of its range) that the archive lacks, from segment `start` on.
    fn missing(&self, ranges: &[(TimelineId, Option<Lsn>)], start: u64) -> Vec<Missing> {
        let seg = self.segment_size;
        let files = |t: TimelineId| self.timelines.get(&t);
        let mut missing = Vec::new();
        for &(t, end) in ranges {
            let reaches_start = end.is_none_or(|e| e.0 > start * seg);
            if t != TimelineId::FIRST && reaches_start && !files(t).is_some_and(|f| f.history) {
                missing.push(Missing::History {
                    timeline: t,
                    name: history_file_name(t),
                });
            }
            let Some(switch) = end else { continue };
            let segno = switch.segment_number(seg);
            if switch.segment_offset(seg) == 0 || segno < start {
                continue;
            }
            let held = files(t).is_some_and(|f| {
                f.partials.contains(&segno)
                    || f.segments.contains(&segno)
                    || f.prefixes.get(&segno).is_some_and(|&e| e >= switch)
            });
            if !held {
                missing.push(Missing::Switch {
                    timeline: t,
                    switch,
                    name: format!("{}.partial", segment_file_name(t, segno, seg)),
                });
            }
        }
        missing
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

    fn missing(plan: &Plan) -> Vec<&str> {
        plan.missing.iter().map(Missing::name).collect()
    }

    #[test]
    fn a_switch_inside_a_segment_needs_the_old_timelines_copy_of_it() {
        let h = [switch(1, 3 * SEG + 0x80000)];
        let path = [
            "000000010000000000000001",
            "000000010000000000000002",
            "00000002.history",
            "000000020000000000000003",
            "000000020000000000000004",
        ];
        let p = catalog(&path).plan(TimelineId(2), &h);
        assert!(p.gaps.is_empty());
        assert_eq!(missing(&p), ["000000010000000000000003.partial"]);
        assert!(!p.is_complete());
        // The .partial, the whole segment (an old leader that went on), or an archive_timeout
        // prefix reaching the switch each hold timeline 1's WAL up to it; a shorter prefix
        // does not.
        for copy in [
            "000000010000000000000003.partial",
            "000000010000000000000003",
            "000000010000000000000003.partial.00080000",
        ] {
            let p = catalog(&[&path[..], &[copy]].concat()).plan(TimelineId(2), &h);
            assert!(p.is_complete(), "{copy}: {p:?}");
        }
        let short = "000000010000000000000003.partial.00040000";
        let p = catalog(&[&path[..], &[short]].concat()).plan(TimelineId(2), &h);
        assert_eq!(missing(&p), ["000000010000000000000003.partial"]);
        // A switch at a segment's boundary needs no copy.
        let p = catalog(&path).plan(TimelineId(2), &[switch(1, 3 * SEG)]);
        assert!(p.is_complete(), "{p:?}");
    }

    #[test]
    fn a_missing_segment_of_an_ancestor_is_a_gap_up_to_the_switch() {
        let h = [switch(1, 4 * SEG + 0x80000)];
        // Segment 3 of timeline 1 is missing, between others of the path.
        let p = catalog(&[
            "000000010000000000000001",
            "000000010000000000000002",
            "000000010000000000000004.partial",
            "00000002.history",
            "000000020000000000000004",
            "000000020000000000000005",
        ])
        .plan(TimelineId(2), &h);
        assert_eq!(gaps(&p), [(3, 3)]);
        assert_eq!(p.gaps[0].first, "000000010000000000000003");
        // The same before the new timeline archived anything whole: the history file says
        // timeline 1 went on to its switch, so its segment below is still lacking.
        let p = catalog(&[
            "000000010000000000000001",
            "000000010000000000000002",
            "000000010000000000000004.partial",
            "00000002.history",
        ])
        .plan(TimelineId(2), &h);
        assert_eq!(gaps(&p), [(3, 3)]);
        assert!(p.missing.is_empty(), "{p:?}");
    }

    #[test]
    fn a_missing_history_file_of_the_path_is_named() {
        // Timeline 3 descends from 2, which the archive holds segments of but no history file.
        let h = [switch(1, 2 * SEG), switch(2, 4 * SEG)];
        let names = [
            "000000010000000000000001",
            "000000020000000000000002",
            "000000020000000000000003",
            "00000003.history",
            "000000030000000000000004",
        ];
        let p = catalog(&names).plan(TimelineId(3), &h);
        assert!(p.gaps.is_empty());
        assert_eq!(missing(&p), ["00000002.history"]);
        // Timeline 2 of an ancestry that has no file of it at all: its history file, its
        // segments and the switch into timeline 3 are each lacking.
        let h = [switch(1, 2 * SEG), switch(2, 4 * SEG + 0x100)];
        let p = catalog(&[
            "000000010000000000000001",
            "00000003.history",
            "000000030000000000000004",
            "000000030000000000000005",
        ])
        .plan(TimelineId(3), &h);
        assert_eq!(gaps(&p), [(2, 3)]);
        assert_eq!(p.gaps[0].first, "000000020000000000000002");
        assert_eq!(
            missing(&p),
            ["00000002.history", "000000020000000000000004.partial"]
        );
    }

    #[test]
    fn an_archive_that_starts_late_lacks_nothing_before_its_start() {
        // Archiving began on timeline 3, at segment 6: the switches below lack nothing, and
        // the history files of timelines that ended before it are not needed.
        let h = [switch(1, 2 * SEG + 0x100), switch(2, 4 * SEG + 0x100)];
        let p = catalog(&[
            "00000003.history",
            "000000030000000000000006",
            "000000030000000000000007",
        ])
        .plan(TimelineId(3), &h);
        assert!(p.is_complete(), "{p:?}");
        assert_eq!(p.start(), Some(Lsn(6 * SEG)));
        // From its start on, it does lack what is missing: here timeline 2's switch segment,
        // the first the archive holds, and timeline 2's history file.
        let p = catalog(&[
            "00000003.history",
            "000000030000000000000004",
            "000000030000000000000005",
        ])
        .plan(TimelineId(3), &h);
        assert_eq!(
            missing(&p),
            ["00000002.history", "000000020000000000000004.partial"]
        );
    }
}
