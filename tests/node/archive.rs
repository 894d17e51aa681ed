//! Continuous archiving on a real node: every completed segment lands in the archive byte for
//! byte, history files after a promotion, other contents under a name raise the alarm, a
//! kill -9 of a `walserver run` in the middle of archiving skips nothing, and a backlog past
//! `archive_max_backlog` refuses appends on a primary and pauses a relay until it falls, and
//! a node of another system than the one an archive names is refused by it.
//! The first four run against a directory and against SeaweedFS (S3, zstd-compressed); an S3
//! store that stops for a while and comes back costs nothing (`WALSERVER_TEST_S3_OUTAGE_SECS`
//! sets how long it stays down, 3 s by default; 30 s is the manual run).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fault_harness::node::conninfo_at;
use pg_testkit::{SeaweedServer, SEAWEED_ACCESS_KEY_ID, SEAWEED_SECRET_ACCESS_KEY};
use serde_json::Value;
use supervisor_actor::Promote;
use wal_archive::{ArchiveTarget, ArchiverStatus, S3Options};
use wal_storage::TimelineId;
use walserver_bench::node::ChildNode;
use walserver_bench::NodeProgram;

use crate::common::cluster::http_post;
use crate::common::*;

const SEG: u64 = 1 << 20;

/// The settings of a node that archives to `target` and keeps its own segments (so the test
/// can compare them after they are archived).
fn archiving(mode: &str, target: &Path) -> String {
    format!(
        "archive_mode = {mode:?}\narchive_target = \"file://{}\"\nwal_keep_size = 64\n",
        target.display()
    )
}

/// Where a test archives: a directory, or a bucket of a SeaweedFS of the test's own, whose
/// objects are zstd-compressed (so both targets and both stored forms are exercised).
enum Store {
    Dir {
        path: std::path::PathBuf,
        _made: Option<tempfile::TempDir>,
    },
    S3(SeaweedServer),
}

/// The key prefix of the S3 store's objects.
const S3_PREFIX: &str = "cluster-a";

impl Store {
    fn dir() -> Store {
        let made = tempfile::tempdir().unwrap();
        Store::Dir {
            path: made.path().into(),
            _made: Some(made),
        }
    }

    /// A directory the test made (or will make) itself.
    fn at(path: &Path) -> Store {
        Store::Dir {
            path: path.into(),
            _made: None,
        }
    }

    fn s3() -> Store {
        Store::S3(SeaweedServer::start())
    }

    /// The archive settings as `-c` pairs.
    fn settings(&self, mode: &str) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("archive_mode", mode.to_string()),
            ("wal_keep_size", "64".to_string()),
        ];
        match self {
            Store::Dir { path, .. } => {
                out.push(("archive_target", format!("file://{}", path.display())))
            }
            Store::S3(s) => out.extend([
                ("archive_target", format!("s3://{}/{S3_PREFIX}", s.bucket())),
                ("archive_compression", "zstd".to_string()),
                ("archive.endpoint", s.endpoint()),
                ("archive.allow_http", "true".to_string()),
                ("archive.access_key_id", SEAWEED_ACCESS_KEY_ID.to_string()),
                (
                    "archive.secret_access_key",
                    SEAWEED_SECRET_ACCESS_KEY.to_string(),
                ),
            ]),
        }
        out
    }

    /// The same as TOML lines (dotted keys, so they may come before other top-level keys).
    fn toml(&self, mode: &str) -> String {
        self.settings(mode)
            .into_iter()
            .map(|(k, v)| format!("{k} = {v:?}\n"))
            .collect::<String>()
            .replace("allow_http = \"true\"", "allow_http = true")
    }

    /// The archive as a reader sees it: every file checked against its sidecar.
    fn target(&self) -> ArchiveTarget {
        match self {
            Store::Dir { path, .. } => ArchiveTarget::Directory(path.clone()),
            Store::S3(s) => ArchiveTarget::parse_with(
                &format!("s3://{}/{S3_PREFIX}", s.bucket()),
                &S3Options {
                    endpoint: Some(s.endpoint()),
                    allow_http: true,
                    access_key_id: Some(SEAWEED_ACCESS_KEY_ID.into()),
                    secret_access_key: Some(SEAWEED_SECRET_ACCESS_KEY.into()),
                    ..S3Options::default()
                },
            )
            .unwrap(),
        }
    }

    /// The file `name` as the archive holds it, checked and decompressed.
    fn get(&self, name: &str) -> Option<Vec<u8>> {
        self.target().get(name).unwrap()
    }

    /// Writes an object past the archiver's rules (a foreign or damaged one).
    fn place(&self, object: &str, bytes: &[u8]) {
        match self {
            Store::Dir { path, .. } => std::fs::write(path.join(object), bytes).unwrap(),
            Store::S3(s) => s.put_raw(&format!("{S3_PREFIX}/{object}"), bytes).unwrap(),
        }
    }

    /// An object's stored bytes, unchecked.
    fn raw(&self, object: &str) -> Option<Vec<u8>> {
        match self {
            Store::Dir { path, .. } => std::fs::read(path.join(object)).ok(),
            Store::S3(s) => s.get_raw(&format!("{S3_PREFIX}/{object}")).unwrap(),
        }
    }
}

fn archiver(status: &Value) -> Option<ArchiverStatus> {
    serde_json::from_value(status.get("archiver")?.clone()).ok()
}

/// Waits until the archiver's status, read from `/status` at `http`, satisfies `ready`.
fn wait_archiver(
    http: &str,
    what: &str,
    ready: impl Fn(&ArchiverStatus) -> bool,
) -> ArchiverStatus {
    let mut last = None;
    wait_until(what, || {
        last = walserver_node::admin::get_json(http, "/status", None)
            .ok()
            .and_then(|s| archiver(&s));
        last.as_ref().is_some_and(&ready)
    });
    last.expect("checked by the wait")
}

/// Every segment from segment `from` to below `upto` is in `archive` under the name the
/// node's own file has in `pg_wal`, with the same bytes and a matching checksum sidecar.
fn assert_archived_byte_for_byte(pg_wal: &Path, archive: &Store, tli: u32, from: u64, upto: u64) {
    for segno in from..upto / SEG {
        let name = format!("{tli:08X}{:08X}{:08X}", segno >> 32, segno & 0xFFFF_FFFF);
        let name = if pg_wal.join(&name).exists() {
            name
        } else {
            // Below a switch point the segment is the parent timeline's.
            format!(
                "{:08X}{:08X}{:08X}",
                tli - 1,
                segno >> 32,
                segno & 0xFFFF_FFFF
            )
        };
        let own = read_file(&pg_wal.join(&name));
        // `get` checks the file against its sidecar (and decompresses it) first.
        let archived = archive.get(&name);
        assert!(
            archived.as_ref() == Some(&own),
            "{name} differs from the node's own"
        );
        let sum = archive.raw(&format!("{name}.crc32c")).unwrap();
        assert_eq!(
            sum,
            wal_archive::sidecar(&own).as_bytes(),
            "{name}'s checksum"
        );
    }
}

#[test]
fn a_primary_archives_every_completed_segment_byte_for_byte() {
    primary_archives_every_completed_segment(Store::dir());
}

#[test]
fn a_primary_archives_every_completed_segment_byte_for_byte_to_s3() {
    primary_archives_every_completed_segment(Store::s3());
}

fn primary_archives_every_completed_segment(archive: Store) {
    let node = TestNode::primary(&archive.toml("on"));
    for seed in 0..6 {
        node.append(40, 32 << 10, seed);
    }
    let flushed = node.wal().flushed();
    let complete = flushed.segment_start(SEG);
    assert!(complete.0 >= 6 * SEG, "{flushed}");
    let http = node.http_addr.to_string();
    let s = wait_archiver(&http, "every completed segment archived", |s| {
        s.archived_lsn.is_some_and(|a| a >= complete)
    });
    assert_eq!(s.archived_count, complete.0 / SEG - 1, "{s:?}");
    assert_eq!(s.failed_count, 0);
    assert_eq!(s.last_error, None);
    assert_archived_byte_for_byte(&node.data_dir().join("pg_wal"), &archive, 1, 1, complete.0);
    // The segment being written is not complete, so not archived.
    let current = format!("00000001{:08X}{:08X}", 0, complete.0 / SEG);
    assert_eq!(archive.get(&current), None);
    // /metrics shows the archiver's families, each in the README's table.
    let m = crate::metrics::scrape(&node);
    assert!(m.get("walserver_archive_archived_total") >= s.archived_count as f64);
    assert_eq!(m.get("walserver_archive_failed_total"), 0.0);
    assert_eq!(m.get("walserver_archive_alarm"), 0.0);
    assert!(m.get("walserver_archive_archived_lsn_bytes") >= complete.0 as f64);
    assert!(m.get("walserver_archive_backlog_seconds") >= 0.0);
    let shown: std::collections::BTreeSet<String> = m
        .family_names()
        .into_iter()
        .filter(|n| n.starts_with("walserver_archive_"))
        .collect();
    let listed: std::collections::BTreeSet<String> = readme_metric_names()
        .into_iter()
        .filter(|n| n.starts_with("walserver_archive_"))
        .collect();
    assert_eq!(
        shown, listed,
        "the archive families against the README's table"
    );
    // `walserver status` shows the line.
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(["status", "--http", &http])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("archiver           archived {}", s.archived_count)),
        "{stdout}"
    );
}

#[test]
fn other_contents_in_the_archive_are_kept_and_raise_the_alarm() {
    other_contents_raise_the_alarm(Store::dir());
}

#[test]
fn other_contents_in_an_s3_archive_are_kept_and_raise_the_alarm() {
    other_contents_raise_the_alarm(Store::s3());
}

fn other_contents_raise_the_alarm(archive: Store) {
    let foreign = "000000010000000000000001";
    // Uncompressed, where the S3 node stores zstd: the same file in either form.
    archive.place(foreign, b"not this cluster's WAL");
    let node = TestNode::primary(&archive.toml("on"));
    node.append(40, 32 << 10, 1);
    node.append(40, 32 << 10, 2);
    let s = wait_archiver(&node.http_addr.to_string(), "the alarm", |s| {
        s.alarm.is_some()
    });
    assert!(
        s.alarm
            .as_deref()
            .unwrap()
            .contains("000000010000000000000001"),
        "{s:?}"
    );
    assert_eq!(
        s.last_failed_wal.as_deref(),
        Some("000000010000000000000001")
    );
    assert_eq!(s.archived_count, 0);
    assert_eq!(
        archive.raw(foreign).as_deref(),
        Some(&b"not this cluster's WAL"[..])
    );
    assert_eq!(archive.raw(&format!("{foreign}.zst")), None);
    assert_eq!(
        crate::metrics::scrape(&node).get("walserver_archive_alarm"),
        1.0
    );
    // Nothing past it counts as archived, and storage keeps the segment. A later segment may
    // be in the store all the same: a backlog round uploads segments side by side, and one
    // started before this one failed finishes; it counts once this one is archived.
    let now = wait_archiver(&node.http_addr.to_string(), "the archiver's status", |_| {
        true
    });
    assert_eq!(
        (now.archived_count, now.last_archived_wal.as_deref()),
        (0, None),
        "{now:?}"
    );
    assert!(now.alarm.is_some(), "the alarm stays: {now:?}");
    assert!(node
        .data_dir()
        .join("pg_wal/000000010000000000000001")
        .exists());
}

/// Two systems pointed at one S3 prefix: the first names its system in the archive; the
/// second archives nothing there and raises the alarm naming both; `archive list` shows the
/// first's; a standby of the second is refused a restore from it, and a primary restored
/// from it keeps the first's identifier (so it may archive there on its new timeline).
#[test]
fn a_node_of_another_system_is_refused_by_the_archive_and_by_a_restore_from_it() {
    let archive = Store::s3();
    let first = TestNode::primary(&archive.toml("on"));
    first.append(40, 32 << 10, 1);
    wait_archiver(&first.http_addr.to_string(), "a segment archived", |s| {
        s.archived_count >= 1
    });
    let first_id = first.wal().system_id();
    let segment = "000000010000000000000001";
    let archived = archive.raw(&format!("{segment}.zst"));
    assert!(archived.is_some());
    drop(first);

    let second = TestNode::primary(&archive.toml("on"));
    let second_id = second.wal().system_id();
    assert_ne!(first_id, second_id);
    second.append(40, 32 << 10, 2);
    let s = wait_archiver(&second.http_addr.to_string(), "the alarm", |s| {
        s.alarm.is_some()
    });
    let alarm = s.alarm.as_deref().unwrap();
    assert!(
        alarm.contains(&format!(
            "belongs to system {first_id}, not to system {second_id}"
        )),
        "{alarm}"
    );
    assert_eq!(s.archived_count, 0, "{s:?}");
    assert_eq!(
        crate::metrics::scrape(&second).get("walserver_archive_alarm"),
        1.0
    );
    // The first system's objects are untouched, and storage keeps the second's segment.
    assert_eq!(archive.raw(&format!("{segment}.zst")), archived);
    assert!(second.data_dir().join("pg_wal").join(segment).exists());

    let mut args = vec!["archive".to_string(), "list".into()];
    for (k, v) in archive.settings("on") {
        args.extend(["-c".into(), format!("{k}={v}")]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(&args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains(&format!("system {first_id}\n")), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    let refused = walserver_node::from_archive::init_standby_from_archive(
        &dir.path().join("standby"),
        &archive.target(),
        &conninfo_at(second.addr(), "s1"),
        None,
    )
    .expect_err("a standby of another system");
    assert!(
        refused
            .to_string()
            .contains(&format!("belongs to system {first_id}")),
        "{refused}"
    );
    assert!(!dir.path().join("standby").exists());
    let restored = walserver_node::from_archive::init_from_archive(
        &dir.path().join("primary"),
        &archive.target(),
        &Default::default(),
    )
    .expect("a primary restored from the archive");
    assert_eq!(restored.system_id, first_id);
}

#[test]
fn a_promoted_standby_archives_its_history_file_before_its_segments() {
    promoted_standby_archives(Store::dir());
}

#[test]
fn a_promoted_standby_archives_its_history_file_before_its_segments_to_s3() {
    promoted_standby_archives(Store::s3());
}

fn promoted_standby_archives(archive: Store) {
    let primary = TestNode::primary("wal_keep_size = 64");
    primary.append(40, 32 << 10, 1);
    let dir = tempfile::tempdir().unwrap();
    walserver_node::init::init_standby(
        &dir.path().join("data"),
        &conninfo_at(primary.addr(), "s1"),
        None,
        None,
    )
    .expect("init the standby");
    // With archive_mode = on a standby does not archive; once promoted it does.
    let standby = TestNode::start_in(
        dir,
        &format!(
            "primary_conninfo = {:?}\n{}",
            conninfo_at(primary.addr(), "s1"),
            archive.toml("on")
        ),
    );
    let end = primary.append(40, 32 << 10, 2);
    wait_until("the standby to receive", || standby.wal().flushed() >= end);
    let status = standby.http_get("/status");
    assert!(
        archiver(&status).is_some_and(|s| s.archived_count == 0),
        "{status}"
    );
    futures_executor::block_on(standby.node.supervisor.send(Promote))
        .unwrap()
        .expect("promote");
    for seed in 3..5 {
        standby.append(40, 32 << 10, seed);
    }
    let complete = standby.wal().flushed().segment_start(SEG);
    let s = wait_archiver(
        &standby.http_addr.to_string(),
        "archived after the promotion",
        |s| s.archived_lsn.is_some_and(|a| a >= complete),
    );
    let pg_wal = standby.data_dir().join("pg_wal");
    // The standby's WAL begins where it was made from the primary; nothing was removed since
    // (wal_keep_size), so its oldest segment is where archiving began.
    let first = standby.wal().oldest_retained().segment_number(SEG);
    assert_eq!(
        archive.get("00000002.history"),
        Some(read_file(&pg_wal.join("00000002.history")))
    );
    assert_archived_byte_for_byte(&pg_wal, &archive, 2, first, complete.0);
    // Timeline 1's last segment as its `.partial`: the switch point is inside a segment.
    let switch = standby.wal().history()[0].switch_lsn;
    assert_ne!(switch.segment_offset(SEG), 0);
    let partial = format!(
        "{}.partial",
        wal_storage::segment_file_name(wal_storage::TimelineId(1), switch.segment_number(SEG), SEG)
    );
    assert!(archive.get(&partial).is_some(), "{partial}");
    // Every segment, the history file and the `.partial`, each once.
    assert_eq!(s.archived_count, complete.0 / SEG - first + 2, "{s:?}");
}

#[test]
fn kill_9_in_the_middle_of_archiving_skips_nothing() {
    kill_9_while_archiving(Store::dir());
}

#[test]
fn kill_9_in_the_middle_of_an_s3_upload_skips_nothing() {
    kill_9_while_archiving(Store::s3());
}

fn kill_9_while_archiving(archive: Store) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    walserver_node::init::init_primary(&data, SEG).expect("init");
    let program = NodeProgram::Path(env!("CARGO_BIN_EXE_walserver").into());
    let settings = archive.settings("on");
    let append = |node: &ChildNode| cli_append(node, 100, 32 << 10);
    let mut node = ChildNode::spawn(&program, &data, &settings).expect("start walserver run");
    append(&node);
    append(&node);
    // Killed at once: the archiver, which starts on each new segment as it completes, is
    // most likely in the middle of one (a put, the position's fsync); wherever it is, the
    // restart must go on from the durable position without a gap.
    node.kill9();
    node.start().expect("restart walserver run");
    append(&node);
    let http = node.http.clone();
    let status = walserver_node::admin::get_json(&http, "/status", None).unwrap();
    let flushed: wal_storage::Lsn = serde_json::from_value(status["flush_lsn"].clone()).unwrap();
    let complete = flushed.segment_start(SEG);
    wait_archiver(&http, "every completed segment archived", |s| {
        s.archived_lsn.is_some_and(|a| a >= complete) && s.failed_count == 0
    });
    assert_archived_byte_for_byte(&data.join("pg_wal"), &archive, 1, 1, complete.0);
}

/// `walserver append` of `count` records of `size` bytes to a child node, which must succeed.
fn cli_append(node: &ChildNode, count: u32, size: u32) {
    let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
        .args(["append", "--http", &node.http])
        .args(["--count", &count.to_string(), "--size", &size.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// SeaweedFS stops while the node takes appends, then comes back: appends go on, the
/// archiver's failures show, and its backoff resumes the uploads by itself with nothing
/// skipped.
#[test]
fn an_s3_store_that_stops_for_a_while_loses_and_skips_nothing() {
    let outage = std::env::var("WALSERVER_TEST_S3_OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(3), Duration::from_secs);
    let mut archive = Store::s3();
    let node = TestNode::primary(&archive.toml("on"));
    let http = node.http_addr.to_string();
    node.append(40, 32 << 10, 1);
    let complete = node.wal().flushed().segment_start(SEG);
    wait_archiver(&http, "archiving before the outage", |s| {
        s.archived_lsn.is_some_and(|a| a >= complete)
    });
    let Store::S3(server) = &mut archive else {
        unreachable!()
    };
    server.stop();
    // The outage is the fault's length, not a wait for an event: appends go on throughout,
    // a few segments' worth and then small ones, so that wal_keep_size keeps every segment
    // for the comparison at the end.
    let until = Instant::now() + outage;
    for seed in 2..5 {
        node.append(40, 32 << 10, seed);
    }
    // Bounded in count too: on a quiet machine the loop runs fast, and past about 64 MiB
    // wal_keep_size would let the node remove segments the comparison reads.
    let mut seed = 5;
    for _ in 0..3_000 {
        if Instant::now() >= until {
            break;
        }
        node.append(4, 1 << 10, seed);
        seed = seed.wrapping_add(1);
    }
    let s = wait_archiver(&http, "a failed upload", |s| s.failed_count > 0);
    assert!(s.last_error.is_some(), "{s:?}");
    let during = s.archived_lsn.expect("held");
    assert!(s.backlog_bytes > 0, "{s:?}");
    server.restart().expect("SeaweedFS back");
    let complete = node.wal().flushed().segment_start(SEG);
    assert!(complete > during, "{complete} {during}");
    let s = wait_archiver(&http, "the uploads to resume", |s| {
        s.archived_lsn.is_some_and(|a| a >= complete)
    });
    assert_eq!(s.last_error, None, "{s:?}");
    assert_eq!(s.alarm, None, "{s:?}");
    assert_archived_byte_for_byte(&node.data_dir().join("pg_wal"), &archive, 1, 1, complete.0);
}

#[test]
fn past_archive_max_backlog_a_primary_refuses_appends_naming_the_archive_then_resumes() {
    let root = tempfile::tempdir().unwrap();
    let archive = root.path().join("archive");
    // The archive directory is missing: nothing can be archived until it exists.
    let node = TestNode::primary(&format!(
        "{}archive_max_backlog = \"2MB\"\n",
        archiving("on", &archive)
    ));
    wait_archiver(&node.http_addr.to_string(), "the hold", |s| {
        s.archived_lsn.is_some()
    });
    for seed in 0..3 {
        node.append(24, 32 << 10, seed);
    }
    wait_archiver(&node.http_addr.to_string(), "backpressure", |s| {
        s.backpressure
    });
    let (code, v) = http_post(node.http_addr, "/wal", b"refused");
    assert_eq!(code, 503, "{v}");
    let text = v["error"].as_str().unwrap_or_default();
    assert!(
        text.contains("archive is behind") && text.contains("archive_max_backlog"),
        "{text}"
    );
    let before = node.wal().flushed();
    std::fs::create_dir(&archive).unwrap();
    let s = wait_archiver(&node.http_addr.to_string(), "the archive caught up", |s| {
        !s.backpressure
    });
    assert!(s.archived_count >= 1, "{s:?}");
    let (code, v) = http_post(node.http_addr, "/wal", b"accepted");
    assert_eq!(code, 200, "{v}");
    assert!(node.wal().flushed() > before);
}

#[test]
fn past_archive_max_backlog_a_relay_pauses_its_upstream_and_catches_up_after() {
    let primary = TestNode::primary("wal_keep_size = 64");
    let root = tempfile::tempdir().unwrap();
    let archive = root.path().join("archive");
    let relay = TestNode::standby_of(
        primary.addr(),
        "relay",
        &format!(
            "{}archive_max_backlog = \"2MB\"\n",
            archiving("always", &archive)
        ),
    );
    let mut end = primary.wal().flushed();
    for seed in 0..8 {
        end = primary.append(24, 32 << 10, seed);
    }
    wait_archiver(
        &relay.http_addr.to_string(),
        "backpressure on the relay",
        |s| s.backpressure,
    );
    // The archive returns: the relay reads again, takes everything and archives it.
    std::fs::create_dir(&archive).unwrap();
    relay.wait_flushed(TimelineId(1), end);
    let s = wait_archiver(
        &relay.http_addr.to_string(),
        "the relay's archive caught up",
        |s| !s.backpressure && s.archived_lsn.is_some_and(|a| a >= end.segment_start(SEG)),
    );
    // Every completed segment from where the relay began, each once, none skipped.
    let first = relay.wal().oldest_retained().segment_number(SEG);
    let complete = end.segment_start(SEG);
    assert_eq!(s.archived_count, complete.0 / SEG - first, "{s:?}");
    assert_archived_byte_for_byte(
        &relay.data_dir().join("pg_wal"),
        &Store::at(&archive),
        1,
        first,
        complete.0,
    );
}

/// A standby under `on` keeps what the archive lacks and, promoted, archives it with the old
/// timeline's `.partial`; `archive verify` passes, and names the `.partial` once it is removed.
#[test]
fn a_standby_holds_what_the_archive_lacks_and_goes_on_where_it_ends_when_promoted() {
    let root = tempfile::tempdir().unwrap();
    let archive = root.path().join("archive");
    std::fs::create_dir(&archive).unwrap();
    let primary = TestNode::primary(&archiving("on", &archive));
    // Without wal_keep_size only the archive's hold keeps the standby's WAL.
    let standby = TestNode::standby_of(
        primary.addr(),
        "s1",
        &format!(
            "archive_mode = \"on\"\narchive_target = \"file://{}\"\n",
            archive.display()
        ),
    );
    let http = standby.http_addr.to_string();
    for seed in 0..4 {
        primary.append(24, 32 << 10, seed);
    }
    let first_end = primary.wal().flushed().segment_start(SEG);
    wait_archiver(&primary.http_addr.to_string(), "the first segments", |s| {
        s.archived_lsn == Some(first_end)
    });
    standby.wait_flushed(TimelineId(1), primary.wal().flushed());
    // The archive goes away for the primary: what it writes now is not archived.
    let away = root.path().join("away");
    std::fs::rename(&archive, &away).unwrap();
    let mut end = primary.wal().flushed();
    for seed in 4..10 {
        end = primary.append(24, 32 << 10, seed);
    }
    standby.wait_flushed(TimelineId(1), end);
    let held = standby
        .wal()
        .archived()
        .expect("a standby under on holds WAL");
    assert!(held <= first_end, "{held} is past what the archive holds");
    // The leader dies with segments unarchived; the archive comes back; the standby leads.
    drop(primary);
    std::fs::rename(&away, &archive).unwrap();
    futures_executor::block_on(standby.node.supervisor.send(Promote))
        .unwrap()
        .expect("promote");
    for seed in 10..12 {
        standby.append(24, 32 << 10, seed);
    }
    let complete = standby.wal().flushed().segment_start(SEG);
    wait_archiver(&http, "the new leader archived up to its end", |s| {
        s.archived_lsn == Some(complete)
    });
    // Every segment from the first on, each once, under the timeline that wrote its end; the
    // old timeline's last segment as its .partial; the history file.
    let switch = standby.wal().history()[0].switch_lsn;
    let names: Vec<String> = std::fs::read_dir(&archive)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".crc32c"))
        .collect();
    let first = names
        .iter()
        .filter_map(|n| wal_storage::parse_segment_file_name(n, SEG))
        .map(|(_, segno)| segno)
        .min()
        .unwrap();
    for segno in first..complete.segment_number(SEG) {
        let whole: Vec<_> = names
            .iter()
            .filter(|n| {
                wal_storage::parse_segment_file_name(n, SEG).is_some_and(|(_, s)| s == segno)
            })
            .collect();
        let tli = if (segno + 1) * SEG <= switch.0 { 1 } else { 2 };
        assert_eq!(
            whole,
            [&wal_storage::segment_file_name(TimelineId(tli), segno, SEG)],
            "segment {segno}"
        );
    }
    let partial = format!(
        "{}.partial",
        wal_storage::segment_file_name(TimelineId(1), switch.segment_number(SEG), SEG)
    );
    assert!(names.contains(&partial), "{partial} in {names:?}");
    assert!(names.contains(&"00000002.history".to_string()), "{names:?}");

    // `archive verify` passes; without the .partial, timeline 1's WAL from its last whole
    // segment to the switch is nowhere under its name, and both commands name it.
    let target = format!("archive_target=file://{}", archive.display());
    let archive_command = |command: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_walserver"))
            .args(["archive", command, "-c", &target])
            .output()
            .expect("run walserver archive");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    };
    let (ok, said) = archive_command("verify");
    assert!(
        ok && said.contains("ok: no corrupt object, no gap"),
        "{said}"
    );
    std::fs::remove_file(archive.join(&partial)).unwrap();
    std::fs::remove_file(archive.join(format!("{partial}.crc32c"))).unwrap();
    let (ok, said) = archive_command("verify");
    assert!(!ok, "{said}");
    assert!(
        said.contains(&format!("problem: timeline 2: {partial} is missing")),
        "{said}"
    );
    let (ok, said) = archive_command("list");
    assert!(
        ok && said.contains(&format!("gap: {partial} is missing")),
        "{said}"
    );
}

/// kill -9 of a node holding a multipart upload after its parts are stored and before its
/// complete (the `failpoints` hold): no object under the segment's name, though every
/// byte of it is in the store; restarted without the hold, the node archives the segment
/// whole and `archive verify` passes. 8 MiB segments, so that with 5 MiB parts (S3's and
/// SeaweedFS's minimum) the segment goes in two.
#[cfg(feature = "failpoints")]
#[test]
fn kill_9_during_a_multipart_upload_leaves_no_object_and_archives_it_whole_after() {
    const BIG_SEG: u64 = 8 << 20;
    let archive = Store::s3();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    walserver_node::init::init_primary(&data, BIG_SEG).expect("init");
    let mut settings = archive.settings("on");
    settings.retain(|(k, _)| *k != "archive_compression");
    settings.push(("archive.multipart_part_size", (5u64 << 20).to_string()));
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let program = std::path::PathBuf::from(env!("CARGO_BIN_EXE_walserver"));
    let mut node = ChildNode::on_loopback("node", &program, &data, &settings).unwrap();
    node.env(wal_archive::FAILPOINT_HOLD_ENV, "1");
    node.start().expect("start walserver run");
    // Segment 1 completes (a new primary begins at its start).
    cli_append(&node, 9, 1 << 20);
    node.wait_line(wal_archive::FAILPOINT_HOLD_LINE)
        .expect("the upload held");
    node.kill9();

    let seg1 = "000000010000000000000001";
    // Compared, not printed: a failure would print megabytes.
    assert!(archive.raw(seg1).is_none(), "a partial object is visible");
    assert!(archive.target().get(seg1).unwrap().is_none());

    node.env_remove(wal_archive::FAILPOINT_HOLD_ENV);
    node.start().expect("restart walserver run");
    let status = walserver_node::admin::get_json(&node.http, "/status", None).unwrap();
    let flushed: wal_storage::Lsn = serde_json::from_value(status["flush_lsn"].clone()).unwrap();
    let complete = flushed.segment_start(BIG_SEG);
    wait_archiver(&node.http, "the segment archived after the restart", |s| {
        s.archived_lsn.is_some_and(|a| a >= complete) && s.failed_count == 0
    });
    let own = read_file(&data.join("pg_wal").join(seg1));
    assert!(
        archive.raw(seg1) == Some(own),
        "{seg1} is not archived whole"
    );
    let Store::S3(server) = &archive else {
        unreachable!()
    };
    let out = Command::new(&program)
        .args(["archive", "verify"])
        .args([
            "-c",
            &format!("archive_target=s3://{}/{S3_PREFIX}", server.bucket()),
        ])
        .args(["-c", &format!("archive.endpoint={}", server.endpoint())])
        .args(["-c", "archive.allow_http=true"])
        .args([
            "-c",
            &format!("archive.access_key_id={SEAWEED_ACCESS_KEY_ID}"),
        ])
        .args([
            "-c",
            &format!("archive.secret_access_key={SEAWEED_SECRET_ACCESS_KEY}"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
