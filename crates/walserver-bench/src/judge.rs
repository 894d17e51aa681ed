//! The one judge of every fault scenario: what a cluster holds at the end, set against what its
//! client was told ([`acklog`]), never against what the servers say about themselves.
//!
//! [`judge`] takes the acknowledgement log and each node's view ([`NodeWal`]: its records as
//! `GET /wal?from=earliest` serves them, and its data directory) and checks the same four
//! things for every scenario suite, so that no published table rests on a weaker check than
//! another:
//!
//! 1. Every acknowledged record is on every node exactly once: at its LSN, on its timeline,
//!    with its hash ([`acklog::verify_all`]), and its hash nowhere else on that node.
//!    Records below the oldest one a node keeps are counted as unverifiable, not lost
//!    (retention removed them, which says nothing about durability).
//! 2. The WAL is byte-identical across nodes up to the shorter end, timeline by timeline:
//!    a timeline's range on a node runs from where its history file says it began to where the
//!    next one began (or, on the node's current timeline, to its last record's end), and the
//!    segment files of that timeline are compared over the ranges both nodes hold.
//! 3. History files of the same name are identical on every node that has one.
//! 4. Nothing was acknowledged on an old term: no acknowledgement of an older timeline (or
//!    term, where the answers name one) arrived after the first of a newer one.
//!
//! The [`Verdict`] lists each failure with the node, the position and what was found there, so
//! that a failing scenario explains itself. [`acked_beyond`] is the check scenarios use for
//! "nothing acknowledged while the fault held": by LSN and by the log's own arrival times,
//! not by a guessed grace period.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use wal_storage::{history_file_name, parse_history, segment_file_name, Lsn, TimelineId};

use crate::acklog::{self, AckEntry, IndeterminateEntry, NodeRecord, VerifyReport};

/// One node as the judge sees it.
#[derive(Clone, Debug)]
pub struct NodeWal {
    pub name: String,
    /// Every record the node serves, oldest first ([`acklog::fetch_records`]).
    pub records: Vec<NodeRecord>,
    /// The node's data directory; its `pg_wal` is read directly.
    pub data_dir: PathBuf,
    pub segment_size: u64,
}

impl NodeWal {
    /// The node whose admin API is at `http`: its records fetched now.
    pub fn fetch(
        name: &str,
        http: &str,
        token: Option<&str>,
        data_dir: &Path,
        segment_size: u64,
    ) -> anyhow::Result<NodeWal> {
        Ok(NodeWal {
            name: name.to_string(),
            records: acklog::fetch_records(http, token)?,
            data_dir: data_dir.to_path_buf(),
            segment_size,
        })
    }

    fn pg_wal(&self) -> PathBuf {
        self.data_dir.join("pg_wal")
    }

    /// Each timeline the node's WAL runs through, with the range it holds on it: from the
    /// history file of its current timeline (the last record's), and the last record's end.
    fn timelines(&self) -> Result<Vec<(TimelineId, Lsn, Lsn)>, Failure> {
        let Some(last) = self.records.last() else {
            return Ok(Vec::new());
        };
        let current = TimelineId(last.timeline);
        let mut ranges = Vec::new();
        let mut from = Lsn(0);
        if current.0 > 1 {
            let name = history_file_name(current);
            let text =
                std::fs::read(self.pg_wal().join(&name)).map_err(|e| Failure::Unreadable {
                    node: self.name.clone(),
                    what: format!("{name}: {e}"),
                })?;
            let entries = parse_history(&text).map_err(|e| Failure::Unreadable {
                node: self.name.clone(),
                what: format!("{name}: {e}"),
            })?;
            for e in entries {
                ranges.push((e.parent, from, e.switch_lsn));
                from = e.switch_lsn;
            }
        }
        ranges.push((current, from, last.end));
        Ok(ranges)
    }
}

/// One thing that did not hold, precisely enough to start looking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Acknowledged records a node does not hold where it should (up to 20 described).
    Lost {
        node: String,
        lost: u64,
        of: u64,
        examples: Vec<String>,
    },
    /// An acknowledged record a node holds more than once.
    Duplicated {
        node: String,
        sha256: String,
        at: Vec<Lsn>,
    },
    /// Appends whose outcome the client never learnt that a node holds only in part: an
    /// append is one write, all or nothing.
    TornIndeterminate { node: String, count: u64 },
    /// Two nodes' WAL differs on a timeline below both their ends.
    WalDiffers {
        a: String,
        b: String,
        timeline: TimelineId,
        segment: String,
        at: Lsn,
    },
    /// Two nodes hold a range of a timeline in common, but no segment file of it to compare.
    NothingCompared { a: String, b: String },
    /// A history file differs between two nodes.
    HistoryDiffers { a: String, b: String, file: String },
    /// Acknowledgements of an old timeline or term after the first of a newer one.
    OldTerm { count: u64, examples: Vec<String> },
    /// Something the judge needed could not be read.
    Unreadable { node: String, what: String },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Lost {
                node,
                lost,
                of,
                examples,
            } => write!(
                f,
                "{node}: {lost} of {of} acknowledged records lost: {examples:?}"
            ),
            Failure::Duplicated { node, sha256, at } => write!(
                f,
                "{node}: the acknowledged record {sha256} is there {} times, ending at {at:?}",
                at.len()
            ),
            Failure::TornIndeterminate { node, count } => write!(
                f,
                "{node}: {count} appends of unknown outcome held only in part"
            ),
            Failure::WalDiffers {
                a,
                b,
                timeline,
                segment,
                at,
            } => write!(
                f,
                "{a} and {b}: the WAL of timeline {} differs at {at} (segment {segment})",
                timeline.0
            ),
            Failure::NothingCompared { a, b } => write!(
                f,
                "{a} and {b}: no segment file in common to compare their WAL"
            ),
            Failure::HistoryDiffers { a, b, file } => write!(f, "{a} and {b}: {file} differs"),
            Failure::OldTerm { count, examples } => write!(
                f,
                "{count} appends acknowledged on an old timeline or term after the first on a \
                 newer one: {examples:#?}"
            ),
            Failure::Unreadable { node, what } => write!(f, "{node}: cannot read {what}"),
        }
    }
}

/// What [`judge`] found.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Acknowledged appends, and their records.
    pub appends: u64,
    pub records: u64,
    /// Acknowledged records missing on the worst node.
    pub lost: u64,
    /// Acknowledgements of an old term after a newer one ([`Failure::OldTerm`]).
    pub old_term_acks: u64,
    /// Each node's check against the log, in the order given.
    pub nodes: Vec<(String, VerifyReport)>,
    /// WAL bytes compared between nodes, all pairs together.
    pub compared_bytes: u64,
    pub failures: Vec<Failure>,
}

impl Verdict {
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// The report of node `name`.
    pub fn node(&self, name: &str) -> Option<&VerifyReport> {
        self.nodes.iter().find(|(n, _)| n == name).map(|(_, r)| r)
    }

    /// Every failure, one per line.
    pub fn describe(&self) -> Vec<String> {
        self.failures.iter().map(Failure::to_string).collect()
    }
}

/// Judges `nodes` against the acknowledgement log `log` and its `indeterminate` appends.
pub fn judge(log: &[AckEntry], indeterminate: &[IndeterminateEntry], nodes: &[NodeWal]) -> Verdict {
    let mut v = Verdict {
        appends: log.len() as u64,
        records: log.iter().map(|e| e.hashes.len() as u64).sum(),
        ..Verdict::default()
    };
    for node in nodes {
        let r = acklog::verify_all(log, indeterminate, &node.records);
        if r.lost > 0 {
            v.failures.push(Failure::Lost {
                node: node.name.clone(),
                lost: r.lost,
                of: r.records,
                examples: r.lost_examples.clone(),
            });
        }
        if r.indeterminate_partial > 0 {
            v.failures.push(Failure::TornIndeterminate {
                node: node.name.clone(),
                count: r.indeterminate_partial,
            });
        }
        v.lost = v.lost.max(r.lost);
        v.failures.extend(duplicates(log, node));
        v.nodes.push((node.name.clone(), r));
    }
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            match same_wal(a, b) {
                Ok(n) => v.compared_bytes += n,
                Err(f) => v.failures.push(f),
            }
            v.failures.extend(same_history(a, b));
        }
    }
    let (old, examples) = old_term_after_new(log);
    v.old_term_acks = old;
    if old > 0 {
        v.failures.push(Failure::OldTerm {
            count: old,
            examples,
        });
    }
    v
}

/// Acknowledged records `node` holds more than once.
fn duplicates(log: &[AckEntry], node: &NodeWal) -> Vec<Failure> {
    let mut at: HashMap<&str, Vec<Lsn>> = HashMap::new();
    for r in &node.records {
        at.entry(r.sha256.as_str()).or_default().push(r.end);
    }
    log.iter()
        .flat_map(|e| &e.hashes)
        .filter_map(|h| {
            let ends = at.get(h.as_str())?;
            (ends.len() > 1).then(|| Failure::Duplicated {
                node: node.name.clone(),
                sha256: h.clone(),
                at: ends.clone(),
            })
        })
        .collect()
}

/// Compares the segment files of `a` and `b`, timeline by timeline, over the ranges both hold;
/// the bytes compared.
fn same_wal(a: &NodeWal, b: &NodeWal) -> Result<u64, Failure> {
    let (ta, tb) = (a.timelines()?, b.timelines()?);
    let seg = a.segment_size;
    let mut compared = 0u64;
    let mut common = false;
    for &(tli, a_from, a_to) in &ta {
        let Some(&(_, b_from, b_to)) = tb.iter().find(|(t, _, _)| *t == tli) else {
            continue;
        };
        let (from, to) = (a_from.max(b_from).0, a_to.min(b_to).0);
        if from >= to {
            continue;
        }
        common = true;
        for segno in from / seg..=(to - 1) / seg {
            let name = segment_file_name(tli, segno, seg);
            let (Ok(x), Ok(y)) = (
                std::fs::read(a.pg_wal().join(&name)),
                std::fs::read(b.pg_wal().join(&name)),
            ) else {
                // Retention removed it from one of them: nothing to compare there.
                continue;
            };
            let start = from.max(segno * seg) - segno * seg;
            let end = to.min((segno + 1) * seg) - segno * seg;
            let (start, end) = (start as usize, end as usize);
            if x.len() < end || y.len() < end {
                return Err(Failure::WalDiffers {
                    a: a.name.clone(),
                    b: b.name.clone(),
                    timeline: tli,
                    segment: name,
                    at: Lsn(segno * seg + x.len().min(y.len()) as u64),
                });
            }
            if let Some(i) = x[start..end]
                .iter()
                .zip(&y[start..end])
                .position(|(p, q)| p != q)
            {
                return Err(Failure::WalDiffers {
                    a: a.name.clone(),
                    b: b.name.clone(),
                    timeline: tli,
                    segment: name,
                    at: Lsn(segno * seg + (start + i) as u64),
                });
            }
            compared += (end - start) as u64;
        }
    }
    if common && compared == 0 {
        return Err(Failure::NothingCompared {
            a: a.name.clone(),
            b: b.name.clone(),
        });
    }
    Ok(compared)
}

/// History files present on both `a` and `b` that differ.
fn same_history(a: &NodeWal, b: &NodeWal) -> Vec<Failure> {
    let names = |n: &NodeWal| -> Vec<String> {
        std::fs::read_dir(n.pg_wal())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|f| wal_storage::parse_history_file_name(f).is_some())
                    .collect()
            })
            .unwrap_or_default()
    };
    let theirs = names(b);
    names(a)
        .into_iter()
        .filter(|f| theirs.contains(f))
        .filter_map(|file| {
            let x = std::fs::read(a.pg_wal().join(&file));
            let y = std::fs::read(b.pg_wal().join(&file));
            match (x, y) {
                (Ok(x), Ok(y)) if x == y => None,
                _ => Some(Failure::HistoryDiffers {
                    a: a.name.clone(),
                    b: b.name.clone(),
                    file,
                }),
            }
        })
        .collect()
}

/// The entries ordered by when their answers arrived (entries without a time last).
fn by_time(log: &[AckEntry]) -> Vec<&AckEntry> {
    let mut v: Vec<&AckEntry> = log.iter().collect();
    v.sort_by_key(|e| e.mono_ms.unwrap_or(u64::MAX));
    v
}

/// Acknowledgements of an older timeline (or term, where the answers name one) received after
/// the first acknowledgement of a newer one: each is an append a deposed leader acknowledged
/// while the new one already did, what a fence must make impossible. Described, up to 20.
pub fn old_term_after_new(log: &[AckEntry]) -> (u64, Vec<String>) {
    let mut newest: Option<&AckEntry> = None;
    let mut count = 0;
    let mut examples = Vec::new();
    for e in by_time(log) {
        let key = |x: &AckEntry| (x.timeline, x.term.unwrap_or(0));
        match newest {
            Some(n) if key(e) < key(n) => {
                count += 1;
                if examples.len() < 20 {
                    examples.push(format!(
                        "writer {} append {} acknowledged on timeline {} (term {:?}) by {:?} at \
                         {:?} ms, after writer {} append {} on timeline {} (term {:?}) by {:?} \
                         at {:?} ms",
                        e.writer,
                        e.seq,
                        e.timeline,
                        e.term,
                        e.node,
                        e.mono_ms,
                        n.writer,
                        n.seq,
                        n.timeline,
                        n.term,
                        n.node,
                        n.mono_ms
                    ));
                }
            }
            Some(n) if key(e) <= key(n) => {}
            _ => newest = Some(e),
        }
    }
    (count, examples)
}

/// Acknowledgements that arrived in `[from_ms, to_ms]` (the log's [`acklog::mono_ms`] times)
/// for WAL ending past `durable`: what a fault should have held. A node cut off from its
/// synchronous standby, or stopped, may still have answers on their way when the fault
/// begins; those end at or below what the standby held, so the check needs no grace period.
pub fn acked_beyond(log: &[AckEntry], from_ms: u64, to_ms: u64, durable: Lsn) -> Vec<&AckEntry> {
    log.iter()
        .filter(|e| {
            e.mono_ms.is_some_and(|t| (from_ms..=to_ms).contains(&t)) && e.end_lsn > durable
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acklog::sha256_hex;

    const SEG: u64 = 1 << 16;

    fn ack(seq: u64, timeline: u32, at: u64) -> AckEntry {
        AckEntry {
            writer: (seq % 2) as usize,
            seq,
            timeline,
            end_lsn: Lsn(0x1000 + seq * 0x100),
            hashes: vec![sha256_hex(&seq.to_le_bytes())],
            mono_ms: Some(at),
            node: Some(format!("n{timeline}")),
            term: None,
        }
    }

    #[test]
    fn an_old_term_ack_after_the_new_one_is_caught() {
        let good = vec![ack(0, 1, 10), ack(1, 1, 20), ack(2, 2, 30), ack(3, 2, 40)];
        assert_eq!(old_term_after_new(&good).0, 0);
        // The log's order is the writers' and not the arrival's: sorting must find it.
        let bad = vec![ack(0, 1, 10), ack(2, 2, 30), ack(1, 1, 31), ack(3, 2, 40)];
        let (n, examples) = old_term_after_new(&bad);
        assert_eq!(n, 1, "{examples:?}");
        assert!(examples[0].contains("append 1 acknowledged on timeline 1"));
        let shuffled = vec![ack(3, 2, 40), ack(1, 1, 31), ack(2, 2, 30), ack(0, 1, 10)];
        assert_eq!(old_term_after_new(&shuffled).0, 1);
    }

    #[test]
    fn a_term_in_the_answer_counts_too() {
        let mut a = ack(0, 1, 10);
        a.term = Some(2);
        let mut b = ack(1, 1, 20);
        b.term = Some(1);
        assert_eq!(old_term_after_new(&[a, b]).0, 1);
    }

    #[test]
    fn acks_past_what_was_durable_during_a_fault_are_found() {
        let log = vec![ack(0, 1, 10), ack(1, 1, 20), ack(2, 1, 30), ack(3, 1, 40)];
        // Appends 1 and 2 arrived during the fault; only 2 ends past the durable 0/1100.
        let found = acked_beyond(&log, 15, 35, Lsn(0x1100));
        assert_eq!(found.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
        assert!(acked_beyond(&log, 15, 35, Lsn(0x1200)).is_empty());
    }

    /// Nodes in a temporary directory, written as storage would: each record's bytes in the
    /// segment file of its timeline at its LSN.
    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture {
                dir: tempfile::tempdir().expect("tempdir"),
            }
        }

        /// Node `name` serving `records` (timeline, start, bytes), whose segment files also
        /// hold `unserved` (bytes no record of its history covers: a tail it wrote on an old
        /// timeline past the switch point), with `history` as its current timeline's history.
        fn node(
            &self,
            name: &str,
            records: &[(u32, u64, &[u8])],
            unserved: &[(u32, u64, &[u8])],
            history: &str,
        ) -> NodeWal {
            let data = self.dir.path().join(name);
            let pg_wal = data.join("pg_wal");
            std::fs::create_dir_all(&pg_wal).unwrap();
            for &(tl, start, bytes) in records.iter().chain(unserved) {
                let segno = start / SEG;
                let path = pg_wal.join(segment_file_name(TimelineId(tl), segno, SEG));
                let mut seg = std::fs::read(&path).unwrap_or_else(|_| vec![0; SEG as usize]);
                let off = (start - segno * SEG) as usize;
                seg[off..off + bytes.len()].copy_from_slice(bytes);
                std::fs::write(&path, seg).unwrap();
            }
            let last_tl = records.last().map_or(1, |p| p.0);
            if last_tl > 1 {
                std::fs::write(pg_wal.join(history_file_name(TimelineId(last_tl))), history)
                    .unwrap();
            }
            NodeWal {
                name: name.into(),
                records: records
                    .iter()
                    .map(|&(tl, start, bytes)| NodeRecord {
                        timeline: tl,
                        start: Lsn(start),
                        end: Lsn(start + bytes.len() as u64),
                        sha256: sha256_hex(bytes),
                    })
                    .collect(),
                data_dir: data,
                segment_size: SEG,
            }
        }
    }

    fn acked(tl: u32, start: u64, bytes: &[u8], seq: u64) -> AckEntry {
        AckEntry {
            seq,
            timeline: tl,
            end_lsn: Lsn(start + bytes.len() as u64),
            hashes: vec![sha256_hex(bytes)],
            mono_ms: Some(seq),
            ..AckEntry::default()
        }
    }

    /// Two nodes that agree, one a prefix of the other, across a timeline switch, pass; the
    /// old timeline's tail past the switch point, which only one node wrote, is not compared.
    #[test]
    fn nodes_that_agree_pass() {
        let f = Fixture::new();
        let hist = "1\t0/1040\tpromoted\n";
        let served: &[(u32, u64, &[u8])] = &[
            (1, 0x1000, b"first record"),
            (1, 0x1020, b"second"),
            (2, 0x1040, b"third"),
        ];
        let a = f.node("a", served, &[], hist);
        let b = f.node("b", served, &[(1, 0x1040, b"tail")], hist);
        let c = f.node("c", &served[..2], &[], "");
        let log = vec![
            acked(1, 0x1000, b"first record", 0),
            acked(1, 0x1020, b"second", 1),
        ];
        let v = judge(&log, &[], &[a.clone(), b.clone(), c]);
        assert!(v.is_ok(), "{:#?}", v.describe());
        assert_eq!(v.records, 2);
        assert!(v.compared_bytes > 0);
        // A node still on timeline 1, with a tail past where the others switched, agrees
        // with them up to the switch point: a fork is not a difference.
        let tail = f.node(
            "tail",
            &[
                (1, 0x1000, b"first record"),
                (1, 0x1020, b"second"),
                (1, 0x1040, b"tail"),
            ],
            &[],
            "",
        );
        let v = judge(&log, &[], &[a, tail]);
        assert!(v.is_ok(), "{:#?}", v.describe());
        let third = acked(2, 0x1040, b"third", 2);
        let v = judge(
            &[third],
            &[],
            &[b, f.node("d", &served[..2], &[(1, 0x1040, b"other")], "")],
        );
        assert!(
            matches!(&v.failures[..], [Failure::Lost { node, .. }] if node == "d"),
            "{:?}",
            v.failures
        );
    }

    /// Each failure the judge knows, made on purpose, is found and named.
    #[test]
    fn every_kind_of_failure_is_found() {
        let f = Fixture::new();
        let log = vec![
            acked(1, 0x1000, b"first record", 0),
            acked(1, 0x1020, b"second", 1),
        ];
        let a = f.node(
            "a",
            &[(1, 0x1000, b"first record"), (1, 0x1020, b"second")],
            &[],
            "",
        );

        // Lost: a node without the second record.
        let short = f.node("short", &[(1, 0x1000, b"first record")], &[], "");
        let v = judge(&log, &[], &[a.clone(), short]);
        assert!(
            matches!(&v.failures[..], [Failure::Lost { node, lost: 1, .. }] if node == "short"),
            "{:?}",
            v.failures
        );
        assert_eq!(v.lost, 1);

        // Duplicated: the first record again later on the node.
        let dup = f.node(
            "dup",
            &[
                (1, 0x1000, b"first record"),
                (1, 0x1020, b"second"),
                (1, 0x1040, b"first record"),
            ],
            &[],
            "",
        );
        let v = judge(&log, &[], &[dup]);
        assert!(
            matches!(&v.failures[..], [Failure::Duplicated { at, .. }] if at.len() == 2),
            "{:?}",
            v.failures
        );

        // WAL differs: the same records, but a byte between them (not in any record's
        // payload as the records list shows it) differs in the segment file.
        let other = f.node(
            "other",
            &[(1, 0x1000, b"first record"), (1, 0x1020, b"second")],
            &[],
            "",
        );
        let path = other
            .pg_wal()
            .join(segment_file_name(TimelineId(1), 0, SEG));
        let mut seg = std::fs::read(&path).unwrap();
        seg[0x1010] = 0xff;
        std::fs::write(&path, seg).unwrap();
        let v = judge(&log, &[], &[a.clone(), other]);
        assert!(
            matches!(&v.failures[..], [Failure::WalDiffers { at, .. }] if *at == Lsn(0x1010)),
            "{:?}",
            v.failures
        );

        // Nothing compared: the segment file is gone on one node.
        let gone = f.node(
            "gone",
            &[(1, 0x1000, b"first record"), (1, 0x1020, b"second")],
            &[],
            "",
        );
        std::fs::remove_file(gone.pg_wal().join(segment_file_name(TimelineId(1), 0, SEG))).unwrap();
        let v = judge(&log, &[], &[a.clone(), gone]);
        assert!(
            matches!(&v.failures[..], [Failure::NothingCompared { .. }]),
            "{:?}",
            v.failures
        );

        // History differs: the same timeline 2, forked at another point per the files.
        let log2 = vec![acked(1, 0x1000, b"first record", 0)];
        let h1 = f.node(
            "h1",
            &[(1, 0x1000, b"first record"), (2, 0x1020, b"x")],
            &[],
            "1\t0/1020\ta\n",
        );
        let h2 = f.node(
            "h2",
            &[(1, 0x1000, b"first record"), (2, 0x1020, b"x")],
            &[],
            "1\t0/1020\tb\n",
        );
        let v = judge(&log2, &[], &[h1, h2]);
        assert!(
            matches!(&v.failures[..], [Failure::HistoryDiffers { file, .. }] if file == "00000002.history"),
            "{:?}",
            v.failures
        );

        // An old term after a new one.
        let mut late = acked(1, 0x1020, b"second", 9);
        late.mono_ms = Some(9);
        let mut new = acked(2, 0x1000, b"first record", 5);
        new.mono_ms = Some(5);
        let v = judge(&[new, late], &[], &[]);
        assert_eq!(v.old_term_acks, 1);
        assert!(
            v.describe()[0].contains("old timeline"),
            "{:?}",
            v.describe()
        );
    }
}
