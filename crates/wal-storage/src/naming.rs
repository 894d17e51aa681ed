//! PostgreSQL's names for the files in `pg_wal`.
//!
//! A segment file is `TTTTTTTTXXXXXXXXYYYYYYYY`: the timeline, then `segno / segs_per_xlogid`
//! and `segno % segs_per_xlogid`, each as 8 upper-case hex digits, where
//! `segs_per_xlogid = 2^32 / segment_size`. A history file is `TTTTTTTT.history`.

use wal_types::TimelineId;

/// How many segments of `segment_size` make up one 4 GiB "xlogid".
fn segments_per_xlogid(segment_size: u64) -> u64 {
    0x1_0000_0000 / segment_size
}

/// The file name of segment `segno` of timeline `tli`, as PostgreSQL's `XLogFileName` makes it.
pub fn segment_file_name(tli: TimelineId, segno: u64, segment_size: u64) -> String {
    let per = segments_per_xlogid(segment_size);
    format!("{:08X}{:08X}{:08X}", tli.0, segno / per, segno % per)
}

/// The inverse of [`segment_file_name`]: `(timeline, segno)`, or `None` if `name` is not a
/// segment file name for this segment size.
pub fn parse_segment_file_name(name: &str, segment_size: u64) -> Option<(TimelineId, u64)> {
    if name.len() != 24 || !name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'A'..=b'F')) {
        return None;
    }
    let field = |i: usize| u32::from_str_radix(&name[i * 8..i * 8 + 8], 16).ok();
    let (tli, hi, lo) = (field(0)?, field(1)? as u64, field(2)? as u64);
    let per = segments_per_xlogid(segment_size);
    if lo >= per {
        return None;
    }
    Some((TimelineId(tli), hi * per + lo))
}

/// `TTTTTTTT.history`.
pub fn history_file_name(tli: TimelineId) -> String {
    format!("{:08X}.history", tli.0)
}

/// The inverse of [`history_file_name`].
pub fn parse_history_file_name(name: &str) -> Option<TimelineId> {
    let hex = name.strip_suffix(".history")?;
    if hex.len() != 8 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'A'..=b'F')) {
        return None;
    }
    u32::from_str_radix(hex, 16).ok().map(TimelineId)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal_types::Lsn;

    const MIB16: u64 = 16 << 20;

    #[test]
    fn segment_names_match_postgres() {
        let check = |tli: u32, lsn: u64, seg: u64, name: &str| {
            let segno = Lsn(lsn).segment_number(seg);
            assert_eq!(segment_file_name(TimelineId(tli), segno, seg), name);
            assert_eq!(
                parse_segment_file_name(name, seg),
                Some((TimelineId(tli), segno))
            );
        };
        // A name a real PostgreSQL 15 gave: TLI 1, LSN 0/4025A50, 16 MiB segments.
        check(1, 0x4025A50, MIB16, "000000010000000000000004");
        check(1, 0x1000000, MIB16, "000000010000000000000001");
        check(2, 0x1_FF00_0000, MIB16, "0000000200000001000000FF");
        check(0x10, 0x1_0010_0000, 1 << 20, "000000100000000100000001");
        check(3, 0x2_4000_0000, 1 << 30, "000000030000000200000001");
    }

    #[test]
    fn segment_name_parse_rejects() {
        for bad in [
            "00000001000000000000000",
            "0000000100000000000000041",
            "00000001000000000000000g",
            "00000001000000000000000a",
            "000000010000000000000004.partial",
            "00000002.history",
            // With 16 MiB segments the low part runs only to 0xFF.
            "000000010000000000000100",
        ] {
            assert_eq!(parse_segment_file_name(bad, MIB16), None, "{bad}");
        }
    }

    #[test]
    fn history_names() {
        assert_eq!(history_file_name(TimelineId(2)), "00000002.history");
        assert_eq!(history_file_name(TimelineId(0x1A)), "0000001A.history");
        assert_eq!(
            parse_history_file_name("0000001A.history"),
            Some(TimelineId(0x1A))
        );
        assert_eq!(parse_history_file_name("0000001a.history"), None);
        assert_eq!(parse_history_file_name("00000002.histor"), None);
        assert_eq!(parse_history_file_name("2.history"), None);
    }
}
