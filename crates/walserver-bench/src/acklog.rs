//! The client's own log of acknowledged appends, and the check of a node against it.
//!
//! Fault tests judge a cluster by what its client was told, never by what its servers say about
//! themselves: every append the load tool's HTTP writers get a success for is written here as
//! one JSON line, before the writer sends its next append, and [`verify`] later looks for each
//! acknowledged record on a node. The line, [`AckEntry`]:
//!
//! ```text
//! {"writer":0,"seq":17,"timeline":1,"end_lsn":"0/1A2B3C","hashes":["9f86d0…", …]}
//! ```
//!
//! `end_lsn` and `timeline` are what `POST /wal` answered; `hashes` are the SHA-256 of each
//! record of the append, in order, so the last one ends at `end_lsn`. Payloads are unique
//! ([`payload`]: writer, sequence number and record index, then filler), so a record found at
//! the right place with the right hash can only be the acknowledged one. The file is opened
//! for appending and each line is written with one `write` call, so a log cut by a crash of
//! the tool loses at most its last line, never the lines before it.
//!
//! A node's records come from `GET /wal?from=earliest` ([`fetch_records`]). An acknowledged
//! record is *found* when a record ending at its position has its hash, *lost* when the node's
//! WAL covers that position but holds something else there or ends before it, and
//! *unverifiable* when it lies below the oldest record the node still keeps (retention removed
//! it, which says nothing about durability).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Mutex;

use anyhow::{bail, Context};
use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wal_storage::Lsn;
use walserver_node::admin::base_url;

/// One acknowledged append, as a line of the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckEntry {
    pub writer: usize,
    pub seq: u64,
    pub timeline: u32,
    pub end_lsn: Lsn,
    /// SHA-256 of each record of the append, hex, in order.
    pub hashes: Vec<String>,
    /// When the acknowledgement arrived: [`mono_ms`], the machine's monotonic clock, which
    /// every process on the machine reads alike, so a test can set it beside the moment of
    /// its own fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mono_ms: Option<u64>,
    /// The admin API (`HOST:PORT`) that acknowledged it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The leader's term the answer named, when the node runs under automatic failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
}

/// One append whose outcome the client does not know: it was sent, and the answer was an
/// explicit "indeterminate" (`504`, or `"outcome":"indeterminate"`), a timeout, or a cut
/// connection. It may or may not be durable; it is never counted as acknowledged. These go to
/// the log's sibling file, [`indeterminate_path`], so the acknowledgement log keeps one line
/// per acknowledged append.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndeterminateEntry {
    pub writer: usize,
    pub seq: u64,
    /// SHA-256 of each record of the append, hex, in order.
    pub hashes: Vec<String>,
    /// When the client gave up on the answer ([`mono_ms`]).
    pub mono_ms: u64,
    /// The admin API the append was sent to.
    pub node: String,
    /// What the client saw, in words.
    pub reason: String,
}

/// The file of indeterminate appends beside the acknowledgement log at `ack_log`
/// (`acks.jsonl` → `acks.jsonl.indeterminate`).
pub fn indeterminate_path(ack_log: &Path) -> std::path::PathBuf {
    let mut name = ack_log.as_os_str().to_owned();
    name.push(".indeterminate");
    std::path::PathBuf::from(name)
}

/// The machine's monotonic clock (`CLOCK_MONOTONIC`) in milliseconds: the same for every
/// process on the machine, in every network namespace, and never set back.
pub fn mono_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec it is given; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// The log, shared by the writers of one load: acknowledged appends in one file, and
/// indeterminate ones in its sibling.
pub struct AckLog {
    file: Mutex<File>,
    indeterminate: Mutex<File>,
}

/// Creates (or truncates) `path` and opens it for appending.
fn create_appending(path: &Path) -> anyhow::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .with_context(|| format!("cannot create the acknowledgement log {}", path.display()))?;
    drop(file);
    OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open the acknowledgement log {}", path.display()))
}

/// Writes `entry` as one line with one `write` call.
fn write_line(file: &Mutex<File>, entry: &impl Serialize) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(entry)?;
    line.push(b'\n');
    let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
    f.write_all(&line)
        .context("cannot write to the acknowledgement log")
}

impl AckLog {
    /// Creates (or truncates) the log at `path` and its [`indeterminate_path`].
    pub fn create(path: &Path) -> anyhow::Result<AckLog> {
        Ok(AckLog {
            file: Mutex::new(create_appending(path)?),
            indeterminate: Mutex::new(create_appending(&indeterminate_path(path))?),
        })
    }

    /// Writes one acknowledged append as one line with one `write` call.
    pub fn record(&self, entry: &AckEntry) -> anyhow::Result<()> {
        write_line(&self.file, entry)
    }

    /// Writes one indeterminate append to the sibling file.
    pub fn record_indeterminate(&self, entry: &IndeterminateEntry) -> anyhow::Result<()> {
        write_line(&self.indeterminate, entry)
    }
}

/// Reads every complete line of the NDJSON file at `path`: those that end in a newline. A last
/// line without one is left out, whether a crash of the writer cut it short or the writer is
/// still writing it: each line goes in with one `write` call, but a reader may see the first
/// part of that write before the rest (a write that crosses a page of the page cache becomes
/// visible a page at a time), and the next read would then return the rest as if it were a
/// line of its own.
fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let f = File::open(path)
        .with_context(|| format!("cannot open the acknowledgement log {}", path.display()))?;
    let mut reader = BufReader::new(f);
    let mut out = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        reader
            .read_until(b'\n', &mut line)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let Some(body) = line.strip_suffix(b"\n") else {
            // Nothing more, or a line not (yet) whole.
            break;
        };
        match serde_json::from_slice::<T>(body) {
            Ok(e) => out.push(e),
            Err(e) => bail!(
                "{}: a malformed line {:?}: {e}",
                path.display(),
                String::from_utf8_lossy(body)
            ),
        }
    }
    Ok(out)
}

/// Reads every complete line of the log at `path` (a last line cut short by a crash of the
/// writer is left out).
pub fn read(path: &Path) -> anyhow::Result<Vec<AckEntry>> {
    read_lines(path)
}

/// Reads the indeterminate appends beside the log at `ack_log`; none when the file does not
/// exist (a log written before there was one, or by hand).
pub fn read_indeterminate(ack_log: &Path) -> anyhow::Result<Vec<IndeterminateEntry>> {
    let path = indeterminate_path(ack_log);
    if !path.exists() {
        return Ok(Vec::new());
    }
    read_lines(&path)
}

/// The record `index` of append `seq` of `writer`: a header that makes it unique, then
/// filler up to `size` bytes (the header alone if `size` is smaller).
pub fn payload(writer: usize, seq: u64, index: usize, size: usize) -> Vec<u8> {
    let mut p = format!("w{writer:04} s{seq:012} r{index:04} ").into_bytes();
    // A cheap generator keeps the filler from being one repeated byte, so that a record
    // shifted by a few bytes cannot match by accident.
    let mut x = (writer as u64 + 1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(seq.wrapping_mul(31))
        .wrapping_add(index as u64)
        | 1;
    while p.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p.push(b'a' + (x % 26) as u8);
    }
    p
}

/// SHA-256 of `data`, hex.
pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One record a node holds, as `GET /wal` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRecord {
    pub timeline: u32,
    pub start: Lsn,
    pub end: Lsn,
    pub sha256: String,
}

/// Every record a node's admin API at `http` serves from the oldest it keeps.
pub fn fetch_records(http: &str, token: Option<&str>) -> anyhow::Result<Vec<NodeRecord>> {
    let url = format!("{}/wal?from=earliest", base_url(http));
    let mut req = ureq::get(&url);
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut resp = req
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .with_context(|| format!("cannot reach {url}"))?;
    let status = resp.status();
    let text = resp
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_string()
        .with_context(|| format!("cannot read the answer of {url}"))?;
    if !status.is_success() {
        bail!("{url} answered {status}: {text}");
    }
    parse_records(&text).with_context(|| format!("the answer of {url}"))
}

/// The records of a `GET /wal` NDJSON body (timeline switches are left out).
pub fn parse_records(text: &str) -> anyhow::Result<Vec<NodeRecord>> {
    #[derive(Deserialize)]
    struct Line {
        timeline: Option<u32>,
        start: Option<Lsn>,
        end: Option<Lsn>,
        data: Option<String>,
        timeline_switch: Option<serde_json::Value>,
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
        let l: Line = serde_json::from_str(line)
            .with_context(|| format!("line {} is not a record: {line:?}", i + 1))?;
        if l.timeline_switch.is_some() {
            continue;
        }
        let (Some(timeline), Some(start), Some(end), Some(data)) =
            (l.timeline, l.start, l.end, l.data)
        else {
            bail!("line {} lacks a field: {line:?}", i + 1);
        };
        let data = base64::engine::general_purpose::STANDARD
            .decode(data)
            .with_context(|| format!("line {}: the data is not base64", i + 1))?;
        out.push(NodeRecord {
            timeline,
            start,
            end,
            sha256: sha256_hex(&data),
        });
    }
    Ok(out)
}

/// What [`verify`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Acknowledged appends and records in the log.
    pub appends: u64,
    pub records: u64,
    /// Acknowledged records found on the node, at their place, on their timeline, with their
    /// hash.
    pub found: u64,
    /// Acknowledged records the node should hold and does not (up to 20 described): another
    /// payload or another timeline at the place, or no record there.
    pub lost: u64,
    pub lost_examples: Vec<String>,
    /// Acknowledged records older than the oldest record the node keeps.
    pub unverifiable: u64,
    /// Appends whose outcome the client never learnt ([`IndeterminateEntry`]), how many of
    /// them the node holds whole, and how many it holds only some records of (which would be
    /// a torn append: an append is one write, all or nothing).
    pub indeterminate: u64,
    pub indeterminate_present: u64,
    pub indeterminate_partial: u64,
    /// The node's records: how many, the oldest start and the newest end.
    pub node_records: u64,
    pub node_start: Option<Lsn>,
    pub node_end: Option<Lsn>,
}

/// Checks every acknowledged record of `log` against `records` (one node's, from
/// [`fetch_records`]).
pub fn verify(log: &[AckEntry], records: &[NodeRecord]) -> VerifyReport {
    verify_all(log, &[], records)
}

/// [`verify`], and which of the `indeterminate` appends the node holds (found by their
/// records' hashes anywhere, as their place was never told).
pub fn verify_all(
    log: &[AckEntry],
    indeterminate: &[IndeterminateEntry],
    records: &[NodeRecord],
) -> VerifyReport {
    let mut r = VerifyReport {
        appends: log.len() as u64,
        indeterminate: indeterminate.len() as u64,
        node_records: records.len() as u64,
        node_start: records.first().map(|x| x.start),
        node_end: records.last().map(|x| x.end),
        ..VerifyReport::default()
    };
    let by_end: HashMap<Lsn, usize> = records
        .iter()
        .enumerate()
        .map(|(i, x)| (x.end, i))
        .collect();
    let lose = |r: &mut VerifyReport, what: String| {
        r.lost += 1;
        if r.lost_examples.len() < 20 {
            r.lost_examples.push(what);
        }
    };
    for e in log {
        r.records += e.hashes.len() as u64;
        if r.node_start.is_none_or(|s| e.end_lsn <= s) {
            if r.node_start.is_some() {
                r.unverifiable += e.hashes.len() as u64;
            } else {
                for _ in &e.hashes {
                    lose(
                        &mut r,
                        format!(
                            "writer {} append {}: the node holds no record",
                            e.writer, e.seq
                        ),
                    );
                }
            }
            continue;
        }
        let Some(&last) = by_end.get(&e.end_lsn) else {
            for (k, _) in e.hashes.iter().enumerate() {
                lose(
                    &mut r,
                    format!(
                        "writer {} append {} record {k}: no record ends at {} (timeline {})",
                        e.writer, e.seq, e.end_lsn, e.timeline
                    ),
                );
            }
            continue;
        };
        let n = e.hashes.len();
        for (k, want) in e.hashes.iter().enumerate() {
            // Record k of n ends n - 1 - k records before the append's end.
            let back = n - 1 - k;
            match last.checked_sub(back).map(|i| &records[i]) {
                Some(got) if &got.sha256 == want && got.timeline == e.timeline => r.found += 1,
                Some(got) if &got.sha256 == want => lose(
                    &mut r,
                    format!(
                        "writer {} append {} record {k}: the record ending at {} is on timeline {}, \
                         acknowledged on {}",
                        e.writer, e.seq, got.end, got.timeline, e.timeline
                    ),
                ),
                Some(got) => lose(
                    &mut r,
                    format!(
                        "writer {} append {} record {k}: the record ending at {} (timeline {}) has another payload",
                        e.writer, e.seq, got.end, got.timeline
                    ),
                ),
                None => r.unverifiable += 1,
            }
        }
    }
    if !indeterminate.is_empty() {
        let held: std::collections::HashSet<&str> =
            records.iter().map(|x| x.sha256.as_str()).collect();
        for e in indeterminate {
            let present = e
                .hashes
                .iter()
                .filter(|h| held.contains(h.as_str()))
                .count();
            if present == e.hashes.len() && present > 0 {
                r.indeterminate_present += 1;
            } else if present > 0 {
                r.indeterminate_partial += 1;
            }
        }
    }
    r
}

/// Reads the log at `path` (and its indeterminate appends), fetches the node's records and
/// checks them.
pub fn verify_node(path: &Path, http: &str, token: Option<&str>) -> anyhow::Result<VerifyReport> {
    let log = read(path)?;
    let indeterminate = read_indeterminate(path)?;
    let records = fetch_records(http, token)?;
    Ok(verify_all(&log, &indeterminate, &records))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only lines that end in a newline are read: the last one, while its writer is still at
    /// it, is left out even where its first part already parses, and a malformed whole line
    /// is an error.
    #[test]
    fn only_whole_lines_of_the_log_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acks.jsonl");
        let entry = |seq: u64| AckEntry {
            seq,
            ..AckEntry::default()
        };
        let mut text = Vec::new();
        for seq in 0..3 {
            text.extend(serde_json::to_vec(&entry(seq)).unwrap());
            text.push(b'\n');
        }
        // The fourth line, seen before its newline: valid JSON already.
        text.extend(serde_json::to_vec(&entry(3)).unwrap());
        std::fs::write(&path, &text).unwrap();
        let seqs: Vec<u64> = read(&path).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [0, 1, 2]);
        // Cut inside a line.
        std::fs::write(&path, &text[..text.len() - 5]).unwrap();
        assert_eq!(read(&path).unwrap().len(), 3);
        // A whole line that does not parse is not the writer's, and is reported.
        text.extend(b"\n{\"writer\":0,\"se\n");
        std::fs::write(&path, &text).unwrap();
        assert!(read(&path).is_err());
    }

    fn rec(tl: u32, start: u64, data: &[u8]) -> NodeRecord {
        NodeRecord {
            timeline: tl,
            start: Lsn(start),
            end: Lsn(start + data.len() as u64 + 8),
            sha256: sha256_hex(data),
        }
    }

    /// A node holding three appends (the last of two records), and their log entries.
    fn node() -> (Vec<NodeRecord>, Vec<AckEntry>) {
        let p: Vec<Vec<u8>> = (0..4).map(|i| payload(0, i, 0, 40)).collect();
        let mut records = Vec::new();
        let mut at = 0x100;
        for d in &p {
            let r = rec(1, at, d);
            at = r.end.0;
            records.push(r);
        }
        let entry = |seq: u64, ends: usize, payloads: &[&Vec<u8>]| AckEntry {
            writer: 0,
            seq,
            timeline: 1,
            end_lsn: records[ends].end,
            hashes: payloads.iter().map(|d| sha256_hex(d)).collect(),
            ..AckEntry::default()
        };
        let log = vec![
            entry(0, 0, &[&p[0]]),
            entry(1, 1, &[&p[1]]),
            entry(2, 3, &[&p[2], &p[3]]),
        ];
        (records, log)
    }

    #[test]
    fn payloads_are_unique_and_sized() {
        let a = payload(1, 2, 3, 100);
        assert_eq!(a.len(), 100);
        assert_ne!(a, payload(1, 2, 4, 100));
        assert_ne!(a, payload(2, 2, 3, 100));
        assert_ne!(a[40..], payload(1, 3, 3, 100)[40..]);
        assert!(payload(0, 0, 0, 1).starts_with(b"w0000 "));
    }

    #[test]
    fn finds_every_acknowledged_record() {
        let (records, log) = node();
        let r = verify(&log, &records);
        assert_eq!(
            (r.appends, r.records, r.found, r.lost),
            (3, 4, 4, 0),
            "{r:?}"
        );
    }

    #[test]
    fn a_missing_tail_is_lost() {
        let (records, log) = node();
        let r = verify(&log, &records[..2]);
        assert_eq!((r.found, r.lost), (2, 2), "{r:?}");
    }

    #[test]
    fn another_payload_at_the_place_is_lost() {
        let (mut records, log) = node();
        records[1].sha256 = sha256_hex(b"something else");
        records[1].timeline = 2;
        let r = verify(&log, &records);
        assert_eq!((r.found, r.lost), (3, 1), "{r:?}");
        assert!(r.lost_examples[0].contains("another payload"), "{r:?}");
    }

    #[test]
    fn records_below_the_oldest_kept_are_unverifiable() {
        let (records, log) = node();
        let r = verify(&log, &records[2..]);
        assert_eq!((r.found, r.lost, r.unverifiable), (2, 0, 2), "{r:?}");
    }

    #[test]
    fn the_right_payload_on_another_timeline_is_lost() {
        let (records, mut log) = node();
        log[1].timeline = 2;
        let r = verify(&log, &records);
        assert_eq!((r.found, r.lost), (3, 1), "{r:?}");
        assert!(r.lost_examples[0].contains("timeline 1"), "{r:?}");
    }

    #[test]
    fn indeterminate_appends_are_counted_and_looked_for() {
        let (records, log) = node();
        let held = IndeterminateEntry {
            hashes: vec![records[3].sha256.clone()],
            ..IndeterminateEntry::default()
        };
        let absent = IndeterminateEntry {
            hashes: vec![sha256_hex(b"never written")],
            ..IndeterminateEntry::default()
        };
        let torn = IndeterminateEntry {
            hashes: vec![records[0].sha256.clone(), sha256_hex(b"never written")],
            ..IndeterminateEntry::default()
        };
        let r = verify_all(&log, &[held, absent, torn], &records);
        assert_eq!(
            (
                r.indeterminate,
                r.indeterminate_present,
                r.indeterminate_partial
            ),
            (3, 1, 1),
            "{r:?}"
        );
        assert_eq!((r.found, r.lost), (4, 0), "{r:?}");
    }

    #[test]
    fn an_empty_node_loses_everything() {
        let (_, log) = node();
        let r = verify(&log, &[]);
        assert_eq!(r.lost, 4, "{r:?}");
    }

    #[test]
    fn the_log_round_trips_and_a_cut_last_line_is_dropped() {
        let (_, log) = node();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("acks.ndjson");
        let l = AckLog::create(&path).expect("create");
        for e in &log {
            l.record(e).expect("record");
        }
        assert_eq!(read(&path).expect("read"), log);
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(b"{\"writer\":0,\"se").expect("write");
        assert_eq!(read(&path).expect("read"), log);
        let i = IndeterminateEntry {
            writer: 1,
            seq: 9,
            hashes: vec![sha256_hex(b"x")],
            mono_ms: 5,
            node: "127.0.0.1:1".into(),
            reason: "timed out".into(),
        };
        l.record_indeterminate(&i).expect("record");
        assert_eq!(read_indeterminate(&path).expect("read"), vec![i]);
        assert!(read_indeterminate(&dir.path().join("none"))
            .expect("read")
            .is_empty());
        assert!(mono_ms() > 0);
    }

    #[test]
    fn parses_the_records_body() {
        let data = base64::engine::general_purpose::STANDARD.encode(b"abc");
        let body = format!(
            "{{\"timeline\":1,\"start\":\"0/100\",\"end\":\"0/10B\",\"data\":\"{data}\"}}\n\
             {{\"timeline_switch\":{{\"from\":1,\"to\":2,\"at\":\"0/10B\"}}}}\n"
        );
        let r = parse_records(&body).expect("parse");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].sha256, sha256_hex(b"abc"));
        assert!(parse_records("{\"timeline\":1}\n").is_err());
    }
}
