//! Timeline history files, in PostgreSQL's format.
//!
//! Format (text, one line per ancestor of timeline N, oldest first, in `0000000N.history`):
//!
//! ```text
//! parent_tli<TAB>switch_lsn<TAB>reason\n      e.g. "1\t0/4025A50\tno recovery target specified\n"
//! ```
//!
//! `switch_lsn` is where `parent_tli` ended and its child began, as `X/X`. On read, blank lines
//! and lines starting with `#` (after optional white space) are skipped, as PostgreSQL's
//! `readTimeLineHistory` does; the reason is free text up to the end of the line. Timeline 1 has
//! no history file.

use serde::{Deserialize, Serialize};
use wal_types::{Lsn, TimelineId};

use crate::{Result, WalError};

/// One line of a history file: timeline `parent` ended at `switch_lsn`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub parent: TimelineId,
    pub switch_lsn: Lsn,
    pub reason: String,
}

/// Parses the contents of a history file.
pub fn parse_history(text: &[u8]) -> Result<Vec<HistoryEntry>> {
    let text = std::str::from_utf8(text)
        .map_err(|_| WalError::InvalidHistory("history file is not valid UTF-8".into()))?;
    let mut entries: Vec<HistoryEntry> = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let bad =
            |what: &str| WalError::InvalidHistory(format!("line {}: {what}: {line:?}", lineno + 1));
        let mut fields = trimmed.splitn(3, '\t');
        let tli: u32 = fields
            .next()
            .and_then(|f| f.trim().parse().ok())
            .ok_or_else(|| bad("expected a numeric timeline ID"))?;
        let lsn: Lsn = fields
            .next()
            .and_then(|f| f.trim().parse().ok())
            .ok_or_else(|| bad("expected a switch point as X/X"))?;
        let reason = fields.next().unwrap_or("").to_string();
        if let Some(prev) = entries.last() {
            if tli <= prev.parent.0 {
                return Err(bad("timeline IDs must be in increasing sequence"));
            }
            if lsn < prev.switch_lsn {
                return Err(bad("switch points must not go backwards"));
            }
        }
        entries.push(HistoryEntry {
            parent: TimelineId(tli),
            switch_lsn: lsn,
            reason,
        });
    }
    Ok(entries)
}

/// Writes history entries exactly as PostgreSQL's `writeTimeLineHistory` does. A reason with a
/// line break would corrupt the file, so line breaks in it become spaces.
pub fn format_history(entries: &[HistoryEntry]) -> Vec<u8> {
    let mut out = String::new();
    for e in entries {
        let reason = e.reason.replace(['\n', '\r'], " ");
        out.push_str(&format!("{}\t{}\t{}\n", e.parent, e.switch_lsn, reason));
    }
    out.into_bytes()
}

/// The first place where `theirs`, the ancestry of a timeline an upstream holds, departs from
/// `own`, the ancestry of the timeline this node holds: the index of the first entry that
/// differs (reasons included), or `own`'s length where `theirs` is shorter; `None` when
/// `theirs` is `own` followed by possibly more. A timeline's history file begins with its
/// parent's, so a descendant of this node's timeline continues its ancestry. Two timelines of
/// one number made apart (an operator promotes a standby while the old primary, restarted,
/// began a timeline of its own) differ in the entry that made them: in its switch point, or
/// else in its reason, which names the moment it was made (`Wal::promote`).
pub fn departs_from(own: &[HistoryEntry], theirs: &[HistoryEntry]) -> Option<usize> {
    match own.iter().zip(theirs).position(|(o, t)| o != t) {
        Some(i) => Some(i),
        None if theirs.len() < own.len() => Some(theirs.len()),
        None => None,
    }
}

/// One line of an ancestry as an error names it where two ancestries depart
/// ([`departs_from`]): the switch and its reason, or "nothing more" past the shorter one.
pub fn describe_line(e: Option<&HistoryEntry>) -> String {
    match e {
        Some(e) => format!(
            "timeline {} switched at {} ({})",
            e.parent, e.switch_lsn, e.reason
        ),
        None => "nothing more".to_string(),
    }
}

/// Checks that `entries` can be the history of timeline `tli`: every parent is older than `tli`.
pub(crate) fn check_history_for(tli: TimelineId, entries: &[HistoryEntry]) -> Result<()> {
    if let Some(last) = entries.last() {
        if last.parent >= tli {
            return Err(WalError::InvalidHistory(format!(
                "the history of timeline {tli} names timeline {} as an ancestor",
                last.parent
            )));
        }
    }
    if tli == TimelineId::FIRST && !entries.is_empty() {
        return Err(WalError::InvalidHistory(
            "timeline 1 has no ancestors".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ancestry_is_continued_only_entry_for_entry_reasons_included() {
        let own = [
            entry(1, 0x100, "promoted"),
            entry(2, 0x200, "restarted at t1"),
        ];
        assert_eq!(departs_from(&own, &own), None, "the same timeline");
        let child = [own[0].clone(), own[1].clone(), entry(3, 0x300, "promoted")];
        assert_eq!(departs_from(&own, &child), None, "a descendant");
        assert_eq!(departs_from(&[], &child), None, "timeline 1 is everyone's");
        let other_switch = [own[0].clone(), entry(2, 0x280, "promoted at t2")];
        assert_eq!(departs_from(&own, &other_switch), Some(1));
        let same_switch = [own[0].clone(), entry(2, 0x200, "promoted at t2")];
        assert_eq!(
            departs_from(&own, &same_switch),
            Some(1),
            "made apart at one point"
        );
        assert_eq!(
            departs_from(&own, &own[..1]),
            Some(1),
            "an ancestor's ancestry"
        );
    }

    fn entry(tli: u32, lsn: u64, reason: &str) -> HistoryEntry {
        HistoryEntry {
            parent: TimelineId(tli),
            switch_lsn: Lsn(lsn),
            reason: reason.into(),
        }
    }

    #[test]
    fn observed_postgres_file() {
        let observed = b"1\t0/4025A50\tno recovery target specified\n";
        let parsed = parse_history(observed).unwrap();
        assert_eq!(
            parsed,
            vec![entry(1, 0x4025A50, "no recovery target specified")]
        );
        assert_eq!(format_history(&parsed), observed.to_vec());
    }

    #[test]
    fn comments_blank_lines_and_ancestors() {
        let text = b"# written by hand\n\n1\t0/4025A50\tfirst\n  # indented comment\n2\t1/60\tsecond promotion\n";
        let parsed = parse_history(text).unwrap();
        assert_eq!(
            parsed,
            vec![
                entry(1, 0x4025A50, "first"),
                entry(2, 0x1_0000_0060, "second promotion")
            ]
        );
        assert_eq!(
            format_history(&parsed),
            b"1\t0/4025A50\tfirst\n2\t1/60\tsecond promotion\n".to_vec()
        );
        // A reason may be missing; PostgreSQL ignores it when reading.
        assert_eq!(
            parse_history(b"1\t0/5000000\n").unwrap(),
            vec![entry(1, 0x5000000, "")]
        );
        assert_eq!(parse_history(b"").unwrap(), vec![]);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            &b"x\t0/1\treason\n"[..],
            b"1\tnot-an-lsn\treason\n",
            b"1\n",
            b"2\t0/5\ta\n1\t0/6\tb\n",
            b"1\t0/6\ta\n2\t0/5\tb\n",
            b"\xff\xfe",
        ] {
            assert!(
                parse_history(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn reason_line_breaks_are_flattened() {
        let out = format_history(&[entry(1, 0x100, "a\nb")]);
        assert_eq!(out, b"1\t0/100\ta b\n".to_vec());
    }

    #[test]
    fn history_must_precede_timeline() {
        assert!(check_history_for(TimelineId(2), &[entry(1, 5, "")]).is_ok());
        assert!(check_history_for(TimelineId(2), &[entry(2, 5, "")]).is_err());
        assert!(check_history_for(TimelineId(1), &[entry(1, 5, "")]).is_err());
        assert!(check_history_for(TimelineId(1), &[]).is_ok());
    }
}
