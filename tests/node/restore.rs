//! Restore from the archive: `init --from-archive --target-lsn` makes a node whose `GET /wal`
//! holds exactly the load tool's acknowledged records up to the target; `archive list |
//! verify`, `restore-wal` and `init --from-archive` refuse a corrupted object, and a removed
//! segment is a gap.

use std::path::Path;
use std::process::{Command, Output};

use clap::Parser;
use serde_json::Value;
use wal_archive::ArchiverStatus;
use wal_storage::{segment_file_name, Lsn, TimelineId};
use walserver_bench::acklog;
use walserver_bench::{AppendArgs, BenchCommand, NodeProgram};

use crate::common::*;

const SEG: u64 = 1 << 20;

#[derive(Parser)]
struct Load {
    #[command(flatten)]
    args: AppendArgs,
}

fn walserver(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(args)
        .output()
        .expect("run walserver")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn archiver(node: &TestNode) -> Option<ArchiverStatus> {
    let status: Value = node.http_get("/status");
    serde_json::from_value(status.get("archiver")?.clone()).ok()
}

#[test]
fn a_node_restored_to_a_target_lsn_holds_exactly_the_acknowledged_records_up_to_it() {
    let archive = tempfile::tempdir().unwrap();
    let target = format!("archive_target=file://{}", archive.path().display());
    let node = TestNode::primary(&format!(
        "archive_mode = \"on\"\narchive_target = \"file://{}\"\narchive_timeout = 1\n",
        archive.path().display()
    ));
    // The load tool's writers, with their acknowledgement log: about 3.5 segments of records.
    let work = tempfile::tempdir().unwrap();
    let ack_log = work.path().join("acks.jsonl");
    let http = node.http_addr.to_string();
    let load = Load::parse_from([
        "append",
        "--http",
        &http,
        "--ack-log",
        ack_log.to_str().unwrap(),
        "--writers",
        "2",
        "--batch",
        "4",
        "--size",
        "3000",
        "--bytes",
        "3500kB",
    ]);
    let program = NodeProgram::Path(env!("CARGO_BIN_EXE_walserver").into());
    walserver_bench::run(BenchCommand::Append(load.args), &program).expect("the load");
    let acks = acklog::read(&ack_log).expect("the acknowledgement log");
    let end = acks
        .iter()
        .map(|a| a.end_lsn)
        .max()
        .expect("acknowledged appends");
    assert!(end.0 > 4 * SEG, "the load ended at {end}");
    // Everything acknowledged is in the archive: whole segments, then the prefix that
    // archive_timeout uploads.
    wait_until(
        "the archive to reach the end of the acknowledged WAL",
        || {
            archiver(&node)
                .is_some_and(|s| s.archived_lsn.is_some_and(|a| a >= end.segment_start(SEG)))
                && std::fs::read_dir(archive.path()).unwrap().any(|e| {
                    let name = e.unwrap().file_name().into_string().unwrap();
                    name.strip_prefix(&segment_file_name(
                        TimelineId(1),
                        end.segment_number(SEG),
                        SEG,
                    ))
                    .and_then(|rest| rest.strip_prefix(".partial."))
                    .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                    .is_some_and(|off| off >= end.segment_offset(SEG))
                })
        },
    );
    drop(node);

    // Targets: an acknowledged append's own LSN (kept), and an LSN inside an append that
    // spans two segments (the cut falls on the record boundary before it).
    let mut ends: Vec<Lsn> = acks.iter().map(|a| a.end_lsn).collect();
    ends.sort();
    let at_ack = ends[ends.len() / 2];
    let spanning = ends
        .windows(2)
        .find(|w| w[0].segment_number(SEG) == 2 && w[1].segment_number(SEG) == 3)
        .map(|w| Lsn(w[1].segment_start(SEG).0 + 8))
        .expect("an append that ends in segment 3 after one in segment 2");
    for (i, stop) in [at_ack, spanning, end].into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut args = vec![
            "init".to_string(),
            "--data-dir".into(),
            data.display().to_string(),
            "--from-archive".into(),
            "-c".into(),
            target.clone(),
        ];
        // The last run restores to the end, with no target.
        if stop != end {
            args.extend(["--target-lsn".to_string(), stop.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = walserver(&args);
        assert!(
            out.status.success(),
            "restore {i} to {stop}: {}",
            text(&out)
        );
        // wal_keep_size keeps the restored segments, which retention would otherwise remove
        // at the node's first segment switch.
        let restored = TestNode::start_in(dir, "wal_keep_size = 64\n");
        let records = acklog::fetch_records(&restored.http_addr.to_string(), None)
            .expect("GET /wal of the restored node");
        let expected: Vec<_> = acks.iter().filter(|a| a.end_lsn <= stop).cloned().collect();
        let report = acklog::verify(&expected, &records);
        assert_eq!(report.lost, 0, "restore {i} to {stop}: {report:?}");
        let want: u64 = expected.iter().map(|a| a.hashes.len() as u64).sum();
        assert_eq!(report.found, want, "restore {i} to {stop}: {report:?}");
        // Nothing else, except where the target falls inside an append of several records:
        // its records that end at or before the target are kept (an append is one write, but
        // its records carry no mark of it), and they are that append's first ones.
        let kept_to = expected.iter().map(|a| a.end_lsn).max().unwrap_or(Lsn(0));
        let extra: Vec<&str> = records
            .iter()
            .filter(|r| r.end > kept_to)
            .map(|r| r.sha256.as_str())
            .collect();
        if !extra.is_empty() {
            let next = acks
                .iter()
                .filter(|a| a.end_lsn > stop)
                .min_by_key(|a| a.end_lsn)
                .expect("an append after the target");
            assert!(
                extra.len() < next.hashes.len() && extra == next.hashes[..extra.len()],
                "restore {i} to {stop}: records past the last whole append {kept_to} are not the next append's first ones"
            );
        }
        assert_eq!(
            records.len() as u64,
            want + extra.len() as u64,
            "restore {i} to {stop}"
        );
        let last = records.last().expect("records").end;
        assert!(
            last <= stop,
            "restore {i}: a record ends at {last}, past {stop}"
        );
        // A restore before the end goes on as a new timeline, as PostgreSQL's does; one to
        // the end goes on with the archive's own.
        let tli = if stop == end { 1 } else { 2 };
        assert_eq!(restored.status().timeline, TimelineId(tli), "restore {i}");
        // It takes appends, after the restored WAL.
        let appended = restored.append(3, 100, 7);
        assert!(appended > last);
    }
    check_refusals(archive.path(), &target);
}

/// Runs `walserver args`, which must succeed or fail as `ok` says and say `needle`.
fn expect(args: &[&str], ok: bool, needle: &str) -> Output {
    let out = walserver(args);
    assert_eq!(out.status.success(), ok, "{args:?}: {}", text(&out));
    assert!(text(&out).contains(needle), "{args:?}: {}", text(&out));
    out
}

/// A corrupted object and a removed segment, each refused by `verify`, `restore-wal` and
/// `init --from-archive`; and a `--target-time` before anything was archived.
fn check_refusals(archive: &Path, target: &str) {
    let verify = ["archive", "verify", "-c", target];
    expect(&verify, true, "ok: no corrupt object, no gap");

    let seg2 = segment_file_name(TimelineId(1), 2, SEG);
    let path = archive.join(&seg2);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[SEG as usize / 2] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    expect(&verify, false, &format!("{seg2} in the archive is corrupt"));
    let dest = archive.join("..").join("restored-segment");
    let out = expect(
        &["restore-wal", "-c", target, &seg2, dest.to_str().unwrap()],
        false,
        "corrupt",
    );
    assert_eq!(out.status.code(), Some(200));
    assert!(!dest.exists());
    let fresh = tempfile::tempdir().unwrap();
    let data = fresh.path().join("data");
    let init = [
        "init",
        "--data-dir",
        data.to_str().unwrap(),
        "--from-archive",
        "-c",
        target,
    ];
    expect(&init, false, "corrupt");
    // Met halfway through the restore: nothing is left where the data directory would be.
    assert!(!data.exists());
    assert_eq!(std::fs::read_dir(fresh.path()).unwrap().count(), 0);

    // Removed instead: a gap.
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(archive.join(format!("{seg2}.crc32c"))).unwrap();
    expect(&verify, false, &format!("segment {seg2} is missing"));
    let list = ["archive", "list", "-c", target];
    expect(&list, true, &format!("gap: segment {seg2} is missing"));
    expect(&init, false, &format!("the archive lacks {seg2}"));

    let mut timed = init.to_vec();
    timed.extend(["--target-time", "2000-01-01 00:00:00.000000+00"]);
    expect(&timed, false, "was stored at or before it");
    assert!(!data.exists());
}

/// `restore-wal --prefetch 2`: the segment is served at once, and a background
/// `restore-wal` spools the next two, checked; the next call takes its segment from the
/// spool (the archive's copy removed meanwhile) and leaves no other file in `pg_wal`.
#[test]
fn restore_wal_prefetches_the_next_segments_into_a_spool() {
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("archive");
    std::fs::create_dir(&archive).unwrap();
    let target = wal_archive::ArchiveTarget::Directory(archive.clone());
    let names: Vec<String> = (1..=3)
        .map(|segno| segment_file_name(TimelineId(1), segno, SEG))
        .collect();
    for (i, name) in names.iter().enumerate() {
        let bytes = vec![i as u8 + 1; SEG as usize];
        target
            .put(name, bytes, wal_archive::Compression::None)
            .unwrap();
    }
    let pg_wal = work.path().join("data/pg_wal");
    std::fs::create_dir_all(&pg_wal).unwrap();
    let dest = pg_wal.join("RECOVERYXLOG");
    let setting = format!("archive_target=file://{}", archive.display());
    let restore = |name: &str| {
        expect(
            &[
                "restore-wal",
                "--prefetch",
                "2",
                "-c",
                &setting,
                name,
                dest.to_str().unwrap(),
            ],
            true,
            "",
        );
    };
    restore(&names[0]);
    assert_eq!(std::fs::read(&dest).unwrap(), vec![1u8; SEG as usize]);
    let spool = pg_wal.join(walserver::restore::SPOOL_DIR);
    let spooled = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&spool)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let want: Vec<String> = names[1..]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            format!(
                "{n}.{:08x}",
                crc32c::crc32c(&vec![i as u8 + 2; SEG as usize])
            )
        })
        .collect();
    wait_until(
        "the background fetch to spool the next two segments",
        || spooled() == want,
    );
    std::fs::remove_file(archive.join(&names[1])).unwrap();
    restore(&names[1]);
    assert_eq!(std::fs::read(&dest).unwrap(), vec![2u8; SEG as usize]);
    let mut in_pg_wal: Vec<_> = std::fs::read_dir(&pg_wal)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    in_pg_wal.sort();
    assert_eq!(in_pg_wal, [walserver::restore::SPOOL_DIR, "RECOVERYXLOG"]);
}

/// `init --from-archive --target-time T`: records appended before a noted time and after
/// it; the restored node holds every record up to the end of the last object stored at or
/// before T (at least the whole segments stored before it), and none appended after T.
#[test]
fn a_node_restored_to_a_target_time_holds_what_was_durable_by_then_and_nothing_after() {
    let archive = tempfile::tempdir().unwrap();
    let setting = format!("archive_target=file://{}", archive.path().display());
    let node = TestNode::primary(&format!(
        "archive_mode = \"on\"\narchive_target = \"file://{}\"\narchive_timeout = 1\nwal_keep_size = 64\n",
        archive.path().display()
    ));
    let covered = |upto: Lsn| {
        wait_until("the archive to cover the appends", || {
            archiver(&node).is_some_and(|s| s.covered_lsn.is_some_and(|c| c >= upto))
        })
    };
    let before = node.append(80, 32 << 10, 1);
    covered(before);
    let time = std::time::SystemTime::now();
    // A file system stamps files with a clock that may lag the system's by a tick: wait
    // until a file written now is stamped after the noted time, so that nothing stored
    // after it can carry an earlier stamp.
    let probe = archive.path().join("..probe");
    wait_until("file times to pass the noted time", || {
        std::fs::write(&probe, b"").unwrap();
        std::fs::metadata(&probe).unwrap().modified().unwrap() > time
    });
    std::fs::remove_file(&probe).unwrap();
    let after = node.append(80, 32 << 10, 2);
    covered(after);
    let http = node.http_addr.to_string();
    let all = acklog::fetch_records(&http, None).expect("GET /wal of the primary");
    drop(node);

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let when = wal_types::time::format_time(time);
    expect(
        &[
            "init",
            "--data-dir",
            data.to_str().unwrap(),
            "--from-archive",
            "-c",
            &setting,
            "--target-time",
            &when,
        ],
        true,
        "initialised primary data directory",
    );
    let restored = TestNode::start_in(dir, "wal_keep_size = 64\n");
    let records = acklog::fetch_records(&restored.http_addr.to_string(), None)
        .expect("GET /wal of the restored node");
    let end = records.last().expect("records").end;
    // At least every record in the whole segments stored before the time; nothing past what
    // was appended before it.
    let whole = all
        .iter()
        .map(|r| r.end)
        .filter(|e| *e <= before.segment_start(SEG))
        .max()
        .expect("records in whole segments");
    assert!(
        end >= whole && end <= before,
        "restored to {end}; whole segments stored before the time hold records up to {whole}, \
         appends before it end at {before}"
    );
    let expected: Vec<_> = all.iter().filter(|r| r.end <= end).cloned().collect();
    assert_eq!(records, expected, "restored to {end}");
    assert!(after > before);
    assert_eq!(restored.status().timeline, TimelineId(2));
}
