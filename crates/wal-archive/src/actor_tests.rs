//! The archiver against real storage and a real target directory.

use std::path::Path;
use std::time::Duration;

use actix::Addr;
use bytes::Bytes;
use tokio::sync::watch;
use wal_storage::{InitOptions, StorageConfig, Wal, WalFormat};
use wal_types::{Lsn, SystemId, TimelineId};

use crate::{ArchiveConfig, ArchiveMode, ArchiveTarget, Archiver, ArchiverStatus, StopArchiver};

const SEG: u64 = 1 << 20;
/// Long enough for a loaded machine; the archiver answers in milliseconds when it works.
const DEADLINE: Duration = Duration::from_secs(30);

fn new_wal(dir: &Path) -> Wal {
    let cfg = StorageConfig {
        segment_size: SEG,
        ..StorageConfig::default()
    };
    Wal::init(
        dir,
        cfg,
        InitOptions::primary(SystemId(7), WalFormat::Walserver),
    )
    .unwrap()
}

/// Appends records until the WAL has entered the `n`th segment after the current one, so
/// that `n` more segments are complete.
async fn fill(wal: &Wal, n: u64) {
    let target = Lsn((wal.flushed().segment_number(SEG) + n) * SEG);
    let mut i = 0u64;
    while wal.flushed() <= target {
        let batch = (0..8)
            .map(|_| {
                i += 1;
                Bytes::from(vec![(i % 251) as u8; 16 << 10])
            })
            .collect();
        wal.append(batch).unwrap().await.unwrap();
    }
}

fn config(target: &Path) -> ArchiveConfig {
    ArchiveConfig {
        mode: ArchiveMode::On,
        target: ArchiveTarget::Directory(target.into()),
        archive_timeout: Duration::ZERO,
        max_backlog: 0,
        compression: crate::Compression::None,
    }
}

fn start(wal: &Wal, target: &Path) -> (Addr<Archiver>, watch::Receiver<ArchiverStatus>) {
    Archiver::start(wal.clone(), config(target))
}

/// Starts an archiver and waits until it holds storage's retention, so that nothing written
/// after this returns can be removed before it is archived.
async fn start_holding(
    wal: &Wal,
    target: &Path,
) -> (Addr<Archiver>, watch::Receiver<ArchiverStatus>) {
    start_holding_with(wal, config(target)).await
}

/// [`start_holding`] with a configuration of the test's own.
async fn start_holding_with(
    wal: &Wal,
    config: ArchiveConfig,
) -> (Addr<Archiver>, watch::Receiver<ArchiverStatus>) {
    let (addr, mut rx) = Archiver::start(wal.clone(), config);
    wait_until(&mut rx, "the hold", |s| s.archived_lsn.is_some()).await;
    (addr, rx)
}

/// What a test starts from: its storage's data directory, a directory for the archive (the
/// archive itself, or where the test makes one later) and the storage. With `keep`, a slot
/// keeps every segment, for a test that compares the node's own files with what was
/// archived. A test binds the directories it does not use to `_` names, so that they live as
/// long as it runs.
fn setup(keep: bool) -> (tempfile::TempDir, tempfile::TempDir, Wal) {
    let data = tempfile::tempdir().unwrap();
    let wal = new_wal(data.path());
    if keep {
        wal.create_slot("keep", false, true).unwrap();
    }
    (data, tempfile::tempdir().unwrap(), wal)
}

async fn wait_until(
    rx: &mut watch::Receiver<ArchiverStatus>,
    what: &str,
    pred: impl FnMut(&ArchiverStatus) -> bool,
) -> ArchiverStatus {
    let reached = match tokio::time::timeout(DEADLINE, rx.wait_for(pred)).await {
        Ok(Ok(s)) => Some(s.clone()),
        _ => None,
    };
    reached.unwrap_or_else(|| panic!("archiver never reached: {what}; status {:?}", *rx.borrow()))
}

/// The WAL files and sidecars in the archive directory `dir`, sorted, without the archive's
/// identity file and its sidecar (which `identity.rs` and the first test here check).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v.retain(|n| !n.starts_with(crate::IDENTITY_FILE));
    v
}

#[actix_rt::test]
async fn every_completed_segment_and_history_file_is_archived_byte_for_byte() {
    // A slot keeps the node's own files to compare with once they are archived.
    let (data, archive, wal) = setup(true);
    let (addr, mut rx) = start_holding(&wal, archive.path()).await;
    fill(&wal, 3).await;
    let pg_wal = data.path().join("pg_wal");
    let own: Vec<(String, Vec<u8>)> = (1..=3)
        .map(|n| {
            let name = format!("0000000100000000000000{n:02X}");
            let bytes = std::fs::read(pg_wal.join(&name)).unwrap();
            (name, bytes)
        })
        .collect();
    let s = wait_until(&mut rx, "three segments", |s| s.archived_count == 3).await;
    assert_eq!(s.archived_lsn, Some(Lsn(4 * SEG)));
    assert_eq!(
        s.last_archived_wal.as_deref(),
        Some("000000010000000000000003")
    );
    assert_eq!(s.failed_count, 0);
    for (name, bytes) in &own {
        assert_eq!(
            &std::fs::read(archive.path().join(name)).unwrap(),
            bytes,
            "{name}"
        );
        let sum = std::fs::read_to_string(archive.path().join(format!("{name}.crc32c"))).unwrap();
        assert_eq!(sum, crate::sidecar(bytes));
    }
    // The current segment (4) is not complete: not archived.
    assert!(!archive.path().join("000000010000000000000004").exists());
    assert_eq!(wal.archived(), Some(Lsn(4 * SEG)));
    // The archive names the node's system.
    let target = ArchiveTarget::Directory(archive.path().into());
    assert_eq!(target.system_id().unwrap(), Some(wal.system_id()));

    // A promotion: the history file goes before the switch segment.
    let (tli, _) = wal.promote("test").unwrap();
    assert_eq!(tli, TimelineId(2));
    fill(&wal, 1).await;
    let s = wait_until(&mut rx, "the switch segment", |s| {
        s.archived_lsn == Some(Lsn(5 * SEG))
    })
    .await;
    // The history file, timeline 1's `.partial` and the switch segment.
    assert_eq!(s.archived_count, 6);
    assert_eq!(
        std::fs::read(archive.path().join("00000002.history")).unwrap(),
        wal.history_file(TimelineId(2)).unwrap().unwrap()
    );
    assert_eq!(
        std::fs::read(archive.path().join("000000020000000000000004")).unwrap(),
        std::fs::read(pg_wal.join("000000020000000000000004")).unwrap()
    );
    addr.send(StopArchiver).await.unwrap();
}

#[actix_rt::test]
async fn a_failing_target_is_retried_without_skipping_and_shows_in_status() {
    let (_data, root, wal) = setup(false);
    let archive = root.path().join("archive");
    // The target directory does not exist yet: every put fails.
    let (addr, mut rx) = start_holding(&wal, &archive).await;
    fill(&wal, 2).await;
    let s = wait_until(&mut rx, "two failures", |s| s.failed_count >= 2).await;
    assert_eq!(s.archived_count, 0);
    assert_eq!(
        s.last_failed_wal.as_deref(),
        Some("000000010000000000000001")
    );
    assert!(s.last_error.is_some());
    assert_eq!(s.backlog_bytes, 2 * SEG);
    // Storage still holds what is not archived.
    wal.run_retention().unwrap();
    assert_eq!(wal.oldest_retained(), Lsn(SEG));
    std::fs::create_dir(&archive).unwrap();
    let s = wait_until(&mut rx, "both segments", |s| s.archived_count == 2).await;
    assert_eq!(s.last_error, None);
    assert_eq!(
        names(&archive),
        [
            "000000010000000000000001",
            "000000010000000000000001.crc32c",
            "000000010000000000000002",
            "000000010000000000000002.crc32c",
        ]
    );
    addr.send(StopArchiver).await.unwrap();
}

#[actix_rt::test]
async fn other_contents_under_a_segments_name_are_kept_and_raise_the_alarm() {
    let (_data, archive, wal) = setup(false);
    let foreign = archive.path().join("000000010000000000000001");
    std::fs::write(&foreign, b"another cluster's segment").unwrap();
    let (addr, mut rx) = start_holding(&wal, archive.path()).await;
    fill(&wal, 2).await;
    let s = wait_until(&mut rx, "the alarm", |s| s.alarm.is_some()).await;
    assert!(
        s.alarm
            .as_deref()
            .unwrap()
            .contains("000000010000000000000001"),
        "{s:?}"
    );
    assert_eq!(s.archived_count, 0);
    assert_eq!(
        std::fs::read(&foreign).unwrap(),
        b"another cluster's segment"
    );
    // Nothing after it is archived either, and storage keeps the segment.
    assert!(!archive.path().join("000000010000000000000002").exists());
    assert_eq!(wal.archived(), Some(Lsn(SEG)));
    addr.send(StopArchiver).await.unwrap();
}

#[actix_rt::test]
async fn a_restart_resumes_from_the_durable_position() {
    let (_data, archive, wal) = setup(false);
    let (addr, mut rx) = start_holding(&wal, archive.path()).await;
    fill(&wal, 2).await;
    wait_until(&mut rx, "two segments", |s| s.archived_count == 2).await;
    addr.send(StopArchiver).await.unwrap();
    // Archived segments may now go; a new archiver starts after them.
    wal.run_retention().unwrap();
    fill(&wal, 1).await;
    let (addr, mut rx) = start(&wal, archive.path());
    let s = wait_until(&mut rx, "the third segment", |s| s.archived_count == 1).await;
    assert_eq!(
        s.last_archived_wal.as_deref(),
        Some("000000010000000000000003")
    );
    assert_eq!(s.archived_lsn, Some(Lsn(4 * SEG)));
    addr.send(StopArchiver).await.unwrap();
}

#[actix_rt::test]
async fn under_failover_only_the_holder_of_the_leaders_fence_starts_uploads() {
    let (_data, archive, wal) = setup(false);
    let (fence, fenced) = watch::channel(false);
    let (addr, mut rx) = Archiver::start_fenced(wal.clone(), config(archive.path()), Some(fenced));
    wait_until(&mut rx, "the hold", |s| s.archived_lsn.is_some()).await;
    fill(&wal, 2).await;
    // It has seen both segments complete and decided; outside the fence that is nothing.
    wait_until(&mut rx, "the backlog seen", |s| s.backlog_bytes == 2 * SEG).await;
    assert_eq!(rx.borrow().archived_count, 0);
    assert!(
        names(archive.path()).is_empty(),
        "{:?}",
        names(archive.path())
    );
    // Granted: it archives from where the hold is, none skipped.
    let granted = std::time::SystemTime::now();
    fence.send_replace(true);
    let s = wait_until(&mut rx, "both segments", |s| s.archived_count == 2).await;
    assert!(s.last_archived_time.is_some_and(|t| t >= granted), "{s:?}");
    // Closed again (the lease lost): the next segment waits, and storage keeps it.
    fence.send_replace(false);
    fill(&wal, 1).await;
    wait_until(&mut rx, "the third segment seen", |s| {
        s.backlog_bytes == SEG
    })
    .await;
    assert!(!archive.path().join("000000010000000000000003").exists());
    assert_eq!(wal.archived(), Some(Lsn(3 * SEG)));
    fence.send_replace(true);
    wait_until(&mut rx, "the third segment", |s| s.archived_count == 3).await;
    addr.send(StopArchiver).await.unwrap();
}

/// Appends one small record and returns the flushed end after it.
async fn append_one(wal: &Wal, byte: u8) -> Lsn {
    wal.append(vec![Bytes::from(vec![byte; 100])])
        .unwrap()
        .await
        .unwrap();
    wal.flushed()
}

#[actix_rt::test]
async fn archive_timeout_puts_the_durable_prefix_and_the_whole_segment_replaces_it() {
    let (data, archive, wal) = setup(true);
    let (addr, mut rx) = start_holding_with(
        &wal,
        ArchiveConfig {
            // Short, so the test takes a fraction of a second.
            archive_timeout: Duration::from_millis(100),
            ..config(archive.path())
        },
    )
    .await;
    let first = append_one(&wal, 1).await;
    wait_until(&mut rx, "the first prefix", |s| {
        s.covered_lsn == Some(first)
    })
    .await;
    let name = |end: Lsn| format!("000000010000000000000001.partial.{:08X}", end.0 - SEG);
    let prefix = std::fs::read(archive.path().join(name(first))).unwrap();
    assert_eq!(prefix.len() as u64, first.0 - SEG);
    assert_eq!(
        prefix,
        wal.read(TimelineId(1), Lsn(SEG), prefix.len()).unwrap()
    );
    let second = append_one(&wal, 2).await;
    wait_until(&mut rx, "the second prefix", |s| {
        s.covered_lsn == Some(second)
    })
    .await;
    // The longer one replaced the shorter, sidecar and all.
    assert_eq!(
        names(archive.path()),
        [name(second), format!("{}.crc32c", name(second))]
    );
    fill(&wal, 1).await;
    let s = wait_until(&mut rx, "the whole segment", |s| {
        s.archived_lsn == Some(Lsn(2 * SEG))
    })
    .await;
    assert!(s.covered_lsn >= Some(Lsn(2 * SEG)));
    assert!(
        names(archive.path())
            .iter()
            .all(|n| !n.starts_with("000000010000000000000001.partial")),
        "{:?}",
        names(archive.path())
    );
    assert_eq!(
        std::fs::read(archive.path().join("000000010000000000000001")).unwrap(),
        std::fs::read(data.path().join("pg_wal/000000010000000000000001")).unwrap()
    );
    addr.send(StopArchiver).await.unwrap();
}

#[actix_rt::test]
async fn a_promotion_puts_the_old_timelines_last_segment_as_its_partial() {
    let (_data, archive, wal) = setup(false);
    let (addr, mut rx) = start_holding(&wal, archive.path()).await;
    fill(&wal, 1).await;
    let switch = append_one(&wal, 3).await;
    let old = wal
        .read(TimelineId(1), Lsn(2 * SEG), (switch.0 - 2 * SEG) as usize)
        .unwrap();
    wal.promote("test").unwrap();
    fill(&wal, 1).await;
    wait_until(&mut rx, "the switch segment", |s| {
        s.archived_lsn == Some(Lsn(3 * SEG))
    })
    .await;
    let partial = std::fs::read(archive.path().join("000000010000000000000002.partial")).unwrap();
    assert_eq!(partial.len() as u64, SEG, "padded to the segment's size");
    assert_eq!(&partial[..old.len()], &old[..]);
    assert!(partial[old.len()..].iter().all(|&b| b == 0));
    let sum = std::fs::read_to_string(
        archive
            .path()
            .join("000000010000000000000002.partial.crc32c"),
    )
    .unwrap();
    assert_eq!(sum, crate::sidecar(&partial));
    assert!(archive.path().join("000000020000000000000002").exists());
    assert!(!archive.path().join("000000010000000000000002").exists());
    addr.send(StopArchiver).await.unwrap();
}

#[actix_rt::test]
async fn archive_command_gets_every_file_by_postgres_s_contract_and_is_retried() {
    let (data, root, wal) = setup(true);
    let out = root.path().join("out");
    let (addr, mut rx) = start_holding_with(
        &wal,
        ArchiveConfig {
            target: ArchiveTarget::Command(crate::ArchiveCommand {
                // PostgreSQL's documented example with a sync, as a real command must.
                command: format!(
                    "test ! -f {o}/%f && cp %p {o}/%f && sync {o}/%f",
                    o = out.display()
                ),
                staging: data.path().join("archive_staging"),
            }),
            ..config(root.path())
        },
    )
    .await;
    fill(&wal, 2).await;
    // The destination is missing: the command fails and says why, and is retried.
    let s = wait_until(&mut rx, "a failure", |s| s.failed_count >= 1).await;
    assert_eq!(
        s.last_failed_wal.as_deref(),
        Some("000000010000000000000001")
    );
    assert!(
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("archive_command")),
        "{s:?}"
    );
    std::fs::create_dir(&out).unwrap();
    wait_until(&mut rx, "both segments", |s| {
        s.archived_lsn == Some(Lsn(3 * SEG))
    })
    .await;
    for n in 1..=2 {
        let name = format!("00000001000000000000000{n}");
        assert_eq!(
            std::fs::read(out.join(&name)).unwrap(),
            std::fs::read(data.path().join("pg_wal").join(&name)).unwrap(),
            "{name}"
        );
    }
    // No sidecars: the tool keeps its own checksums.
    assert_eq!(names(&out).len(), 2, "{:?}", names(&out));
    addr.send(StopArchiver).await.unwrap();
}

/// Appends until storage refuses for the archive's backlog past `bound` (within a few
/// segments, so a loop that never ends is a failure, not a wait); returns the refusal.
/// `status` is the archiver's: the gate is judged against its archived position, which an
/// upload still in flight when this starts moves later (storage's own position moves first,
/// in the upload's job, and a baseline read from it can be stale by what that upload puts).
async fn append_until_refused(
    wal: &Wal,
    status: &mut watch::Receiver<ArchiverStatus>,
    bound: u64,
) -> wal_storage::WalError {
    let mut gate = wal.archive_backlog();
    for i in 0..(8 * SEG / (16 << 10)) {
        match wal.append(vec![Bytes::from(vec![i as u8; 16 << 10])]) {
            Ok(ticket) => {
                ticket.await.unwrap();
                // The archiver hears every flush and every upload's end: past the bound by its
                // count, it closes the gate before the next append, as a client's next request
                // would find it closed; an upload that ends first may bring the backlog back
                // within the bound, and then appends go on.
                let flushed = wal.flushed();
                let within = |s: &ArchiverStatus| {
                    s.archived_lsn
                        .is_some_and(|a| flushed.0.saturating_sub(a.0) <= bound)
                };
                let judged = async {
                    tokio::select! {
                        closed = gate.wait_for(Option::is_some) => closed.map(drop),
                        within = status.wait_for(within) => within.map(drop),
                    }
                };
                tokio::time::timeout(DEADLINE, judged)
                    .await
                    .expect("the gate closes past the bound")
                    .unwrap();
            }
            Err(e) => return e,
        }
    }
    panic!("appends were never refused past archive_max_backlog");
}

#[actix_rt::test]
async fn past_archive_max_backlog_appends_are_refused_until_the_archive_catches_up() {
    let (_data, root, wal) = setup(false);
    let archive = root.path().join("archive");
    // The target directory does not exist yet: nothing can be archived.
    let (addr, mut rx) = start_holding_with(
        &wal,
        ArchiveConfig {
            max_backlog: 2 * SEG,
            ..config(&archive)
        },
    )
    .await;
    let e = append_until_refused(&wal, &mut rx, 2 * SEG).await;
    assert!(e.is_archive_backlog(), "{e}");
    let s = wait_until(&mut rx, "backpressure shown", |s| s.backpressure).await;
    assert_eq!(s.archived_count, 0);
    // The archive comes back: it catches up, the gate opens and appends go on.
    std::fs::create_dir(&archive).unwrap();
    wait_until(&mut rx, "the backlog within its bound", |s| !s.backpressure).await;
    assert_eq!(*wal.archive_backlog().borrow(), None);
    wal.append(vec![Bytes::from_static(b"after")])
        .unwrap()
        .await
        .unwrap();
    // Refusing again, then stopped: a stopped archiver refuses nothing.
    // (A rename takes the target away at once; an upload whose put ended before it still
    // moves the archived position afterwards, which `append_until_refused` allows for.)
    std::fs::rename(&archive, root.path().join("gone")).unwrap();
    append_until_refused(&wal, &mut rx, 2 * SEG).await;
    addr.send(StopArchiver).await.unwrap();
    assert_eq!(*wal.archive_backlog().borrow(), None);
    wal.append(vec![Bytes::from_static(b"stopped")])
        .unwrap()
        .await
        .unwrap();
}

/// Archives segments `1..=n` of timeline 1 the way the schedule orders them, each after an
/// `archive_timeout` prefix of it when `prefixes` says so; `list_each` makes every upload
/// list the archive, as the archiver did before it kept what it knows. The time taken and
/// the listings made.
fn archive_segments(
    wal: &Wal,
    target: ArchiveTarget,
    n: u64,
    prefixes: bool,
    list_each: bool,
) -> (Duration, u64) {
    use crate::known::Known;
    use crate::schedule::Item;
    let config = ArchiveConfig {
        target,
        ..config(Path::new("/unused"))
    };
    let tli = TimelineId(1);
    let known = std::sync::Mutex::new(Known::default());
    let mut items = Vec::new();
    for segno in 1..=n {
        if prefixes {
            let end = Lsn(segno * SEG + SEG / 2);
            items.push(Item::Prefix { tli, segno, end });
        }
        items.push(Item::Segment { tli, segno });
    }
    let started = std::time::Instant::now();
    for item in items {
        if list_each {
            known.lock().unwrap().forget();
        }
        crate::actor::upload(wal, &config, &known, item, tli).unwrap();
    }
    let listings = known.lock().unwrap().listings();
    (started.elapsed(), listings)
}

/// A data directory with `n` complete segments, all kept.
async fn segments(dir: &Path, n: u64) -> Wal {
    let wal = new_wal(dir);
    wal.create_slot("keep", false, true).unwrap();
    wal.hold_for_archive().unwrap();
    fill(&wal, n).await;
    wal
}

#[actix_rt::test]
async fn uploads_list_the_archive_once_and_remove_prefixes_from_what_they_know() {
    let data = tempfile::tempdir().unwrap();
    let archive = tempfile::tempdir().unwrap();
    let wal = segments(data.path(), 6).await;
    let target = ArchiveTarget::Directory(archive.path().into());
    // A prefix an earlier run left behind, which the listing at the start finds.
    target
        .put(
            "000000010000000000000003.partial.00040000",
            vec![0u8; 0x40000],
            crate::Compression::None,
        )
        .unwrap();
    let (_, listings) = tokio::task::spawn_blocking(move || {
        let listings = archive_segments(&wal, target, 6, true, false).1;
        (wal, listings)
    })
    .await
    .unwrap();
    assert_eq!(listings, 1);
    let left = names(archive.path());
    assert!(!left.iter().any(|n| n.contains(".partial")), "{left:?}");
    assert_eq!(left.len(), 12, "{left:?}");
}

/// The archive under `prefix` of `server`'s bucket.
fn s3_target(server: &pg_testkit::SeaweedServer, prefix: &str) -> ArchiveTarget {
    let options = crate::S3Options {
        endpoint: Some(server.endpoint()),
        allow_http: true,
        access_key_id: Some(pg_testkit::SEAWEED_ACCESS_KEY_ID.into()),
        secret_access_key: Some(pg_testkit::SEAWEED_SECRET_ACCESS_KEY.into()),
        ..crate::S3Options::default()
    };
    ArchiveTarget::parse_with(&format!("s3://{}/{prefix}", server.bucket()), &options).unwrap()
}

/// The cost of listing per upload against a real S3 store, and that it is gone: `n`
/// segments (`WALSERVER_TEST_ARCHIVE_SEGMENTS`, 8 by default; a few hundred for a
/// measurement) archived to two prefixes of one SeaweedFS bucket, listing at each upload
/// and listing once.
#[actix_rt::test]
async fn archiving_to_s3_lists_the_archive_once_however_many_segments() {
    let n = std::env::var("WALSERVER_TEST_ARCHIVE_SEGMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let server = pg_testkit::SeaweedServer::start();
    let (before, after) = (s3_target(&server, "before"), s3_target(&server, "after"));
    let data = tempfile::tempdir().unwrap();
    let wal = segments(data.path(), n).await;
    let ((t_before, l_before), (t_after, l_after)) = tokio::task::spawn_blocking(move || {
        (
            archive_segments(&wal, before, n, false, true),
            archive_segments(&wal, after, n, false, false),
        )
    })
    .await
    .unwrap();
    eprintln!(
        "{n} segments of {SEG} bytes to SeaweedFS: listing at each upload {t_before:?} \
         ({l_before} listings, {:?} a segment), listing once {t_after:?} ({l_after}, {:?} a segment)",
        t_before / n as u32,
        t_after / n as u32,
    );
    assert_eq!(l_before, n);
    assert_eq!(l_after, 1);
}

/// Two nodes putting the same names at the same time (an old leader not yet stopped and its
/// successor, or two nodes under `always`) into one S3 archive: each put is a conditional
/// create that judges what is there, so both count every segment as archived, neither
/// fails or raises the alarm, and the archive holds each segment once, byte for byte.
#[actix_rt::test]
async fn two_nodes_archiving_the_same_wal_at_once_both_succeed() {
    let server = pg_testkit::SeaweedServer::start();
    let target = s3_target(&server, "twice");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    // The same WAL on two nodes: one directory, copied while closed.
    let wal = segments(a.path(), 4).await;
    drop(wal);
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", a.path().display()))
        .arg(b.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let cfg = StorageConfig {
        segment_size: SEG,
        ..StorageConfig::default()
    };
    let (wa, wb) = (
        Wal::open(a.path(), cfg.clone()).unwrap(),
        Wal::open(b.path(), cfg).unwrap(),
    );
    let config = ArchiveConfig {
        target: target.clone(),
        ..config(Path::new("/unused"))
    };
    let (x, mut rx) = Archiver::start(wa.clone(), config.clone());
    let (y, mut ry) = Archiver::start(wb.clone(), config);
    for rx in [&mut rx, &mut ry] {
        let s = wait_until(rx, "four segments", |s| {
            s.archived_lsn == Some(Lsn(5 * SEG))
        })
        .await;
        assert_eq!((s.failed_count, s.alarm), (0, None));
    }
    for segno in 1..=4u64 {
        let name = format!("0000000100000000000000{segno:02X}");
        let own = std::fs::read(a.path().join("pg_wal").join(&name)).unwrap();
        let archived = tokio::task::spawn_blocking({
            let (t, name) = (target.clone(), name.clone());
            move || t.get(&name)
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(archived.as_deref(), Some(&own[..]), "{name}");
    }
    x.send(StopArchiver).await.unwrap();
    y.send(StopArchiver).await.unwrap();
}

/// A backlog goes several segments at a time, and the archived position still moves in
/// order: a segment whose name holds foreign bytes stops it there, although the segment
/// after it, put beside it, is already in the archive; once the name is cleared the retry
/// goes on from there and finds that segment's own bytes.
#[actix_rt::test]
async fn a_backlog_goes_several_at_a_time_and_the_position_stops_at_a_failure() {
    let (data, archive, wal) = setup(true);
    fill(&wal, 6).await;
    let third = archive.path().join("000000010000000000000003");
    std::fs::write(&third, b"foreign").unwrap();
    let (_addr, mut rx) = start(&wal, archive.path());
    let s = wait_until(&mut rx, "a failure", |s| s.failed_count > 0).await;
    assert_eq!(s.archived_lsn, Some(Lsn(3 * SEG)), "{s:?}");
    assert_eq!(wal.archived(), Some(Lsn(3 * SEG)));
    assert!(s.alarm.is_some(), "{s:?}");
    assert!(
        archive.path().join("000000010000000000000004").exists(),
        "the segment after the failure was not put beside it: {:?}",
        names(archive.path())
    );
    std::fs::remove_file(&third).unwrap();
    let s = wait_until(&mut rx, "the backlog archived", |s| {
        s.archived_lsn == Some(Lsn(7 * SEG))
    })
    .await;
    assert_eq!(wal.archived(), Some(Lsn(7 * SEG)));
    assert!(s.alarm.is_none(), "{s:?}");
    assert_segments_archived_as_kept(data.path(), archive.path(), 6);
}

/// The archiver compresses at the configured zstd level: each object is that level's frame of
/// the segment (not the default level's, not another's), and reads back as the segment.
#[actix_rt::test]
async fn objects_are_compressed_at_the_configured_level() {
    use crate::Compression;
    let (data, archive, wal) = setup(true);
    fill(&wal, 2).await;
    let (fast, strong) = (
        Compression::Zstd { level: -7 },
        Compression::Zstd { level: 19 },
    );
    let config = ArchiveConfig {
        compression: strong,
        ..config(archive.path())
    };
    let (_addr, mut rx) = Archiver::start(wal.clone(), config);
    wait_until(&mut rx, "the segments archived", |s| {
        s.archived_lsn == Some(Lsn(3 * SEG))
    })
    .await;
    let target = ArchiveTarget::Directory(archive.path().into());
    for segno in 1..=2u64 {
        let name = format!("0000000100000000000000{segno:02X}");
        let own = Bytes::from(std::fs::read(data.path().join("pg_wal").join(&name)).unwrap());
        let stored = std::fs::read(archive.path().join(format!("{name}.zst"))).unwrap();
        assert_eq!(stored, strong.encode(&own).unwrap(), "{name}");
        assert_ne!(stored, fast.encode(&own).unwrap(), "{name}");
        assert_ne!(
            stored,
            Compression::DEFAULT_ZSTD.encode(&own).unwrap(),
            "{name}"
        );
        assert_eq!(target.get(&name).unwrap(), Some(own.to_vec()), "{name}");
    }
}

/// One upload thread keeps its read buffer between segments: a segment handed back is the
/// next one's room, a read holds its own segment's bytes, and a buffer still held elsewhere is
/// not kept (the next read takes new room).
#[actix_rt::test]
async fn a_thread_reads_each_segment_into_its_kept_buffer() {
    use crate::actor::{give_back, kept_read_buffer, read_range};
    let (data, _archive, wal) = setup(true);
    fill(&wal, 3).await;
    let own = |segno: u64| {
        let name = format!("0000000100000000000000{segno:02X}");
        std::fs::read(data.path().join("pg_wal").join(name)).unwrap()
    };
    let read = |segno: u64| {
        let (start, end) = (Lsn(segno * SEG), Lsn((segno + 1) * SEG));
        let bytes = read_range(&wal, TimelineId(1), start, end, "a segment").unwrap();
        assert_eq!(&bytes[..], &own(segno)[..], "segment {segno}");
        bytes
    };
    let first = read(1);
    assert_eq!(kept_read_buffer(), 0, "the read holds the buffer");
    give_back(first);
    assert!(
        kept_read_buffer() >= SEG as usize,
        "the buffer was not kept"
    );
    let second = read(2);
    let held = second.clone();
    give_back(second);
    assert_eq!(kept_read_buffer(), 0, "a buffer still held was kept");
    let third = read(3);
    assert_eq!(&held[..], &own(2)[..]);
    give_back(third);
    assert!(kept_read_buffer() >= SEG as usize);
}

/// Segments 1 to `n` of timeline 1 are in the archive directory `archive` with the bytes
/// the node's directory `data` keeps.
fn assert_segments_archived_as_kept(data: &Path, archive: &Path, n: u64) {
    for segno in 1..=n {
        let name = format!("0000000100000000000000{segno:02X}");
        let own = std::fs::read(data.join("pg_wal").join(&name)).unwrap();
        assert_eq!(std::fs::read(archive.join(&name)).unwrap(), own, "{name}");
    }
}

/// An S3 store that ignores `If-None-Match` (a real HTTP endpoint that stores every PUT) gets
/// nothing but the probe: the archiver raises the alarm and archives nothing.
#[actix_rt::test]
async fn a_store_that_ignores_if_none_match_gets_nothing_and_raises_the_alarm() {
    let dir = tempfile::tempdir().unwrap();
    let wal = new_wal(dir.path());
    let store = crate::careless::CarelessStore::start();
    let options = crate::S3Options {
        endpoint: Some(store.endpoint()),
        allow_http: true,
        access_key_id: Some("k".into()),
        secret_access_key: Some("s".into()),
        ..crate::S3Options::default()
    };
    let config = ArchiveConfig {
        target: ArchiveTarget::S3(crate::s3::S3Target::parse("b/p", &options).unwrap()),
        ..config(dir.path())
    };
    let (addr, mut rx) = Archiver::start(wal.clone(), config);
    // Filled only once the archiver holds the WAL: before, storage may already have removed
    // the completed segments (nothing held them), leaving nothing to upload and so no probe.
    wait_until(&mut rx, "the hold", |s| s.archived_lsn.is_some()).await;
    fill(&wal, 2).await;
    let s = wait_until(&mut rx, "the alarm", |s| s.alarm.is_some()).await;
    let alarm = s.alarm.unwrap_or_default();
    assert!(alarm.contains("ignores If-None-Match"), "{alarm}");
    assert_eq!(s.archived_count, 0);
    addr.send(StopArchiver).await.unwrap();
    let requests = store.requests();
    assert!(
        requests
            .iter()
            .all(|(_, path)| path.contains(crate::PROBE_PREFIX)),
        "{requests:?}"
    );
}

/// A round takes more segments than it has threads: a thread that finished one takes the
/// next not yet started. A failure past the segments started at once still stops the position
/// right there, each segment before it is in the archive and counted once, and the retry goes
/// on from the failed one, in order, none skipped.
#[actix_rt::test]
async fn a_round_stops_at_a_failure_past_its_first_threads_and_goes_on_in_order() {
    use crate::actor::{ROUND_SEGMENTS, UPLOADS_IN_FLIGHT};
    let (data, archive, wal) = setup(true);
    let n = ROUND_SEGMENTS as u64 - 2;
    fill(&wal, n).await;
    // Started only after two segments of each thread were done.
    let bad = 2 * UPLOADS_IN_FLIGHT as u64 + 1;
    let bad_path = archive
        .path()
        .join(format!("0000000100000000000000{bad:02X}"));
    std::fs::write(&bad_path, b"foreign").unwrap();
    let (_addr, mut rx) = start(&wal, archive.path());
    let s = wait_until(&mut rx, "a failure", |s| s.failed_count > 0).await;
    assert_eq!(s.archived_lsn, Some(Lsn(bad * SEG)), "{s:?}");
    assert_eq!(s.archived_count, bad - 1, "{s:?}");
    assert_eq!(wal.archived(), Some(Lsn(bad * SEG)));
    std::fs::remove_file(&bad_path).unwrap();
    let s = wait_until(&mut rx, "the backlog archived", |s| {
        s.archived_lsn == Some(Lsn((n + 1) * SEG))
    })
    .await;
    assert_eq!(s.archived_count, n, "each segment counted once: {s:?}");
    assert_eq!(wal.archived(), Some(Lsn((n + 1) * SEG)));
    assert_segments_archived_as_kept(data.path(), archive.path(), n);
}

/// A round's inputs: `n` completed segments after the first, held for the archive, and the
/// items that archive them.
struct Round {
    _data: tempfile::TempDir,
    archive: tempfile::TempDir,
    wal: Wal,
    config: ArchiveConfig,
    known: std::sync::Mutex<crate::known::Known>,
    items: Vec<crate::schedule::Item>,
}

impl Round {
    async fn of(n: u64) -> Round {
        let (data, archive, wal) = setup(true);
        fill(&wal, n).await;
        wal.hold_for_archive().unwrap();
        let tli = TimelineId(1);
        Round {
            config: config(archive.path()),
            known: Default::default(),
            items: (1..=n)
                .map(|segno| crate::schedule::Item::Segment { tli, segno })
                .collect(),
            _data: data,
            archive,
            wal,
        }
    }

    /// Runs the round's items as the archiver's upload job runs them.
    fn upload(
        &self,
        may_start: &crate::actor::MayStart,
        progress: crate::actor::Progress<'_>,
    ) -> Vec<(crate::schedule::Item, crate::Result<crate::Put>)> {
        crate::actor::upload_all(
            &self.wal,
            &self.config,
            &self.known,
            self.items.clone(),
            TimelineId(1),
            may_start,
            progress,
        )
    }
}

/// A round asked to stop, or whose node lost the leader's fence, starts no upload: it reports
/// nothing, stores no position and puts nothing.
#[actix_rt::test]
async fn a_round_that_may_not_start_puts_nothing() {
    use crate::actor::MayStart;
    let round = Round::of(6).await;
    let (_fence_tx, fence) = watch::channel(false);
    for may_start in [
        MayStart {
            halted: std::sync::Arc::new(true.into()),
            fence: None,
        },
        MayStart {
            halted: std::sync::Arc::default(),
            fence: Some(fence),
        },
    ] {
        let outcomes = round.upload(&may_start, &|_, _| {});
        assert!(outcomes.is_empty(), "{outcomes:?}");
    }
    assert_eq!(names(round.archive.path()), Vec::<String>::new());
    assert_eq!(round.wal.archived(), Some(Lsn(SEG)));
}

/// A round stores the archived position and tells its segments as they are archived in
/// order, not once at its end: each segment told once, in order, and only after the position
/// past it is durable, so retention and the backlog gate follow each segment.
#[actix_rt::test]
async fn a_round_stores_the_position_and_tells_each_segment_in_order_as_it_goes() {
    use crate::actor::MayStart;
    use crate::schedule::Item;
    use crate::target::Put;
    let round = Round::of(12).await;
    let (wal, items) = (&round.wal, &round.items);
    let told = std::sync::Mutex::new(Vec::new());
    let progress = |from: usize, archived: Vec<(Item, Put)>| {
        let end = archived.last().and_then(|(item, _)| item.segment_end(SEG));
        // A failed assertion here panics the upload's thread, which fails its segment.
        assert_eq!(
            wal.archived(),
            end,
            "the position is stored before it is told"
        );
        told.lock().unwrap().push((from, archived));
    };
    let may_start = MayStart {
        halted: std::sync::Arc::default(),
        fence: None,
    };
    let outcomes = round.upload(&may_start, &progress);
    assert_eq!(outcomes.len(), items.len());
    assert!(outcomes.iter().all(|(_, o)| o.is_ok()), "{outcomes:?}");
    let mut next = 0;
    for (from, archived) in told.into_inner().unwrap() {
        assert_eq!(from, next, "told in order, each once");
        assert!(!archived.is_empty());
        for (k, (item, put)) in archived.iter().enumerate() {
            assert_eq!(*item, items[from + k]);
            assert_eq!(*put, Put::Stored);
        }
        next += archived.len();
    }
    assert_eq!(next, items.len(), "every segment told");
    assert_eq!(wal.archived(), Some(Lsn(13 * SEG)));
}
