//! Replication slots: names, persistence, acquire/release, retention and invalidation.

use wal_storage::*;

use crate::common::*;

fn cfg_with(wal_keep_size: u64, max_slot: Option<u64>) -> StorageConfig {
    StorageConfig {
        wal_keep_size,
        max_slot_wal_keep_size: max_slot,
        max_wal_size: 2 * SEG,
        ..cfg()
    }
}

/// Writes `n` segments' worth of raw bytes.
fn fill_segments(wal: &Wal, n: u64) {
    for _ in 0..n {
        let at = wal.flushed();
        wal.write(at, payload(at.0, SEG as usize))
            .unwrap()
            .wait()
            .unwrap();
    }
}

fn segments_on_disk(wal: &Wal) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(wal.data_dir().join("pg_wal"))
        .unwrap()
        .filter_map(|e| {
            parse_segment_file_name(&e.unwrap().file_name().into_string().unwrap(), SEG)
        })
        .map(|(_, s)| s)
        .collect();
    v.sort();
    v
}

#[test]
fn slot_lifecycle_and_persistence() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Postgres);
    for bad in ["", "Upper", "with-dash", &"x".repeat(64)] {
        assert!(matches!(
            wal.create_slot(bad, false, true),
            Err(WalError::SlotNameInvalid { .. })
        ));
    }
    let s = wal.create_slot("standby_1", false, true).unwrap();
    assert_eq!(s.restart_lsn, Some(Lsn(SEG)));
    assert_eq!(s.restart_tli, Some(TimelineId(1)));
    assert_eq!(s.wal_status, Some(WalStatus::Reserved));
    assert!(!s.active);
    let lazy = wal.create_slot("lazy", false, false).unwrap();
    assert_eq!((lazy.restart_lsn, lazy.wal_status), (None, None));
    assert!(matches!(
        wal.create_slot("standby_1", false, true),
        Err(WalError::SlotExists { .. })
    ));
    wal.create_slot("temp", true, true).unwrap();

    let guard = wal.acquire_slot("standby_1", 7).unwrap();
    let held = wal.slot("standby_1").unwrap();
    assert_eq!((held.active, held.active_pid), (true, Some(7)));
    // Both refusals name the holder, as PostgreSQL's "is active for PID" does.
    let in_use = |r: Result<(), WalError>| match r {
        Err(e @ WalError::SlotInUse { pid: 7, .. }) => e.to_string(),
        other => panic!("not SlotInUse by 7: {other:?}"),
    };
    assert_eq!(
        in_use(wal.acquire_slot("standby_1", 8).map(drop)),
        "replication slot \"standby_1\" is active for PID 7"
    );
    in_use(wal.drop_slot("standby_1"));
    drop(guard);
    let released = wal.slot("standby_1").unwrap();
    assert_eq!((released.active, released.active_pid), (false, None));

    fill_segments(&wal, 2);
    wal.advance_slot("standby_1", Lsn(2 * SEG + 100), TimelineId(1))
        .unwrap();
    assert_eq!(
        wal.slot("standby_1").unwrap().restart_lsn,
        Some(Lsn(2 * SEG + 100))
    );

    // A temporary slot goes when released.
    let t = wal.acquire_slot("temp", 7).unwrap();
    drop(t);
    assert!(matches!(
        wal.slot("temp"),
        Err(WalError::SlotNotFound { .. })
    ));
    wal.create_slot("temp2", true, true).unwrap();
    drop(wal);

    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    let names: Vec<String> = wal.slots().into_iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        vec!["lazy", "standby_1"],
        "temporary slots are not persisted"
    );
    // The restart point was persisted at the clean stop.
    assert_eq!(
        wal.slot("standby_1").unwrap().restart_lsn,
        Some(Lsn(2 * SEG + 100))
    );
    wal.drop_slot("lazy").unwrap();
    assert!(matches!(
        wal.drop_slot("lazy"),
        Err(WalError::SlotNotFound { .. })
    ));
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(wal.slots().len(), 1);
}

#[test]
fn slots_hold_segments_until_advanced() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cfg_with(0, None);
    let wal = Wal::init(
        tmp.path(),
        c.clone(),
        InitOptions::primary(SystemId(1), WalFormat::Postgres),
    )
    .unwrap();
    wal.create_slot("s", false, true).unwrap();
    fill_segments(&wal, 6);
    wal.run_retention().unwrap();
    assert_eq!(wal.oldest_retained(), Lsn(SEG));
    assert_eq!(segments_on_disk(&wal)[0], 1);
    assert_eq!(wal.read(TimelineId(1), Lsn(SEG), 10).unwrap().len(), 10);
    // The slot moves to segment 4: segments 1 to 3 go.
    wal.advance_slot("s", Lsn(4 * SEG + 5), TimelineId(1))
        .unwrap();
    wal.run_retention().unwrap();
    assert_eq!(wal.oldest_retained(), Lsn(4 * SEG));
    assert_eq!(segments_on_disk(&wal)[0], 4);
    let err = wal.read(TimelineId(1), Lsn(2 * SEG), 10).unwrap_err();
    assert!(
        matches!(&err, WalError::SegmentRemoved { segment } if segment == "000000010000000000000002"),
        "{err}"
    );
    assert!(err
        .to_string()
        .contains("000000010000000000000002 has already been removed"));
    // Dropping the slot leaves only the current segment (wal_keep_size is 0).
    wal.drop_slot("s").unwrap();
    wal.run_retention().unwrap();
    let cur = wal.flushed().segment_number(SEG) - 1;
    assert!(segments_on_disk(&wal).iter().all(|&s| s >= cur));
    drop(wal);
    // What was removed stays removed across a restart.
    let wal = Wal::open(tmp.path(), c).unwrap();
    assert_eq!(wal.oldest_retained(), Lsn(cur * SEG));
}

#[test]
fn the_archived_position_holds_segments_until_archived() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cfg_with(0, None);
    let wal = Wal::init(
        tmp.path(),
        c.clone(),
        InitOptions::primary(SystemId(1), WalFormat::Postgres),
    )
    .unwrap();
    assert_eq!(wal.archived(), None);
    assert_eq!(wal.hold_for_archive().unwrap(), Lsn(SEG));
    // A slot that moves on does not release what the archive still needs.
    wal.create_slot("s", false, true).unwrap();
    fill_segments(&wal, 6);
    wal.advance_slot("s", wal.flushed(), TimelineId(1)).unwrap();
    wal.run_retention().unwrap();
    assert_eq!(segments_on_disk(&wal)[0], 1);
    assert_eq!(wal.oldest_retained(), Lsn(SEG));
    // Segments 1 and 2 archived: they go, segment 3 stays.
    wal.set_archived(Lsn(3 * SEG)).unwrap();
    wal.run_retention().unwrap();
    assert_eq!(segments_on_disk(&wal)[0], 3);
    // The position never moves back.
    wal.set_archived(Lsn(2 * SEG)).unwrap();
    assert_eq!(wal.archived(), Some(Lsn(3 * SEG)));
    drop(wal);
    // The hold survives a reopen, and taking it again keeps its position.
    let wal = Wal::open(tmp.path(), c.clone()).unwrap();
    assert_eq!(wal.archived(), Some(Lsn(3 * SEG)));
    assert_eq!(wal.hold_for_archive().unwrap(), Lsn(3 * SEG));
    fill_segments(&wal, 1);
    wal.run_retention().unwrap();
    assert_eq!(segments_on_disk(&wal)[0], 3);
    // Released (archiving turned off), it holds nothing, also after a reopen.
    wal.release_archive_hold().unwrap();
    drop(wal);
    let wal = Wal::open(tmp.path(), c).unwrap();
    assert_eq!(wal.archived(), None);
    wal.run_retention().unwrap();
    let cur = wal.flushed().segment_number(SEG) - 1;
    assert!(segments_on_disk(&wal).iter().all(|&s| s >= cur));
}

#[test]
fn a_cut_below_the_archived_position_brings_the_hold_back_to_its_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = Wal::init(
        tmp.path(),
        cfg_with(0, None),
        InitOptions::primary(SystemId(1), WalFormat::Postgres),
    )
    .unwrap();
    wal.hold_for_archive().unwrap();
    // A slot keeps the WAL the cut goes into.
    wal.create_slot("s", false, true).unwrap();
    fill_segments(&wal, 4);
    wal.set_archived(Lsn(4 * SEG)).unwrap();
    // A cut above the position changes nothing.
    wal.truncate_to(Lsn(4 * SEG + 10)).unwrap();
    assert_eq!(wal.archived(), Some(Lsn(4 * SEG)));
    // A cut inside segment 2: the new history from there on is not archived yet.
    wal.truncate_to(Lsn(2 * SEG + 100)).unwrap();
    assert_eq!(wal.archived(), Some(Lsn(2 * SEG)));
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg_with(0, None)).unwrap();
    assert_eq!(wal.archived(), Some(Lsn(2 * SEG)), "durably");
}

#[test]
fn the_archive_backlog_gate_refuses_appends_and_wakes_its_watchers() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = Wal::init(
        tmp.path(),
        cfg(),
        InitOptions::primary(SystemId(1), WalFormat::Walserver),
    )
    .unwrap();
    let mut gate = wal.archive_backlog();
    assert_eq!(*gate.borrow_and_update(), None);
    let over = ArchiveBacklog {
        backlog: 3 * SEG,
        bound: 2 * SEG,
    };
    wal.set_archive_backlog(Some(over));
    assert!(gate.has_changed().unwrap(), "the crossing wakes a watcher");
    assert_eq!(*gate.borrow_and_update(), Some(over));
    let err = wal.append(vec![payload(1, 10)]).err().unwrap();
    assert!(err.is_archive_backlog(), "{err}");
    assert!(err.to_string().contains("archive"), "{err}");
    // A new figure past the bound is no new crossing.
    wal.set_archive_backlog(Some(ArchiveBacklog {
        backlog: 4 * SEG,
        ..over
    }));
    assert!(!gate.has_changed().unwrap());
    wal.set_archive_backlog(None);
    assert!(gate.has_changed().unwrap());
    assert_eq!(*gate.borrow_and_update(), None);
    let before = wal.flushed();
    wal.append(vec![payload(2, 10)]).unwrap().wait().unwrap();
    assert!(wal.flushed() > before);
}

#[test]
fn wal_keep_size_keeps_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = Wal::init(
        tmp.path(),
        cfg_with(3 * SEG, None),
        InitOptions::primary(SystemId(1), WalFormat::Postgres),
    )
    .unwrap();
    fill_segments(&wal, 8);
    wal.run_retention().unwrap();
    let cur = wal.flushed().segment_number(SEG);
    assert_eq!(cur, 9);
    assert_eq!(wal.oldest_retained(), Lsn((cur - 3) * SEG));
    assert_eq!(segments_on_disk(&wal)[0], cur - 3);
}

#[test]
fn slots_beyond_max_slot_wal_keep_size_are_invalidated() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cfg_with(0, Some(2 * SEG));
    let wal = Wal::init(
        tmp.path(),
        c.clone(),
        InitOptions::primary(SystemId(1), WalFormat::Postgres),
    )
    .unwrap();
    wal.create_slot("slow", false, true).unwrap();
    wal.create_slot("fast", false, true).unwrap();
    fill_segments(&wal, 2);
    // Within the limit: the slot still holds, safe_wal_size says how much more may come.
    wal.run_retention().unwrap();
    let s = wal.slot("slow").unwrap();
    assert_eq!(s.restart_lsn, Some(Lsn(SEG)));
    assert_eq!(
        s.safe_wal_size,
        Some(((1 + 2 + 1) * SEG - wal.written().0) as i64)
    );
    assert_eq!(s.wal_status, Some(WalStatus::Reserved));
    // "fast" keeps up (retention also runs by itself at each segment switch); "slow" does not.
    for _ in 0..4 {
        wal.advance_slot("fast", wal.flushed(), TimelineId(1))
            .unwrap();
        fill_segments(&wal, 1);
    }
    wal.advance_slot("fast", wal.flushed(), TimelineId(1))
        .unwrap();
    wal.run_retention().unwrap();
    let s = wal.slot("slow").unwrap();
    assert_eq!(
        (s.restart_lsn, s.wal_status, s.safe_wal_size),
        (None, Some(WalStatus::Lost), None)
    );
    assert_eq!(
        wal.slot("fast").unwrap().wal_status,
        Some(WalStatus::Reserved)
    );
    assert!(matches!(
        wal.advance_slot("slow", wal.flushed(), TimelineId(1)),
        Err(WalError::SlotInvalidated { .. })
    ));
    // Six segments written: the flushed end is the start of segment 7. With "slow" gone and
    // "fast" at the end, only segment 6, which holds the last durable byte, is kept.
    assert_eq!(wal.flushed(), Lsn(7 * SEG));
    assert_eq!(wal.oldest_retained(), Lsn(6 * SEG));
    drop(wal);
    let wal = Wal::open(tmp.path(), c).unwrap();
    assert_eq!(
        wal.slot("slow").unwrap().wal_status,
        Some(WalStatus::Lost),
        "invalidation is persisted"
    );
}

/// Retention removes a slot's old WAL only once the slot's new restart point is on disk: a
/// crash brings the slot back as its file says, and its WAL from there must still be there.
#[cfg(feature = "failpoints")]
#[test]
fn a_slot_not_yet_written_holds_its_wal() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cfg_with(0, None);
    let opts = InitOptions::primary(SystemId(1), WalFormat::Postgres);
    let wal = Wal::init(tmp.path(), c.clone(), opts).unwrap();
    wal.create_slot("s", false, true).unwrap();
    fill_segments(&wal, 6);
    // The slot file cannot be written: the slot moves in memory only.
    wal.failpoints().set(FP_ATOMIC, libc::EIO);
    wal.advance_slot("s", Lsn(4 * SEG + 5), TimelineId(1))
        .unwrap();
    wal.run_retention().unwrap();
    assert_eq!(
        segments_on_disk(&wal)[0],
        1,
        "WAL the slot's file holds was removed"
    );
    // Written, it lets them go, and the slot comes back from its file where it moved to.
    wal.failpoints().clear(FP_ATOMIC);
    wal.run_retention().unwrap();
    assert_eq!(segments_on_disk(&wal)[0], 4);
    drop(wal);
    let wal = Wal::open(tmp.path(), c).unwrap();
    assert_eq!(wal.slot("s").unwrap().restart_lsn, Some(Lsn(4 * SEG + 5)));
    assert_eq!(
        wal.read(TimelineId(1), Lsn(4 * SEG + 5), 1).unwrap().len(),
        1
    );
}

/// `slot_moves` changes when a slot is made or dropped and when a restart point enters
/// another segment, not when it moves within one (a copy kept elsewhere follows it at the
/// granularity retention works in); `create_slot_at` takes a point beyond the flushed end as
/// the flushed end.
#[test]
fn slot_moves_follow_segments_and_slots_can_be_made_at_a_point() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Postgres);
    fill_segments(&wal, 3);
    let mut moves = wal.slot_moves();
    assert!(!moves.has_changed().unwrap());

    let s = wal
        .create_slot_at("copy", false, Some(Lsn(2 * SEG + 5)))
        .unwrap();
    assert_eq!(s.restart_lsn, Some(Lsn(2 * SEG + 5)));
    assert!(moves.has_changed().unwrap(), "made");
    moves.mark_unchanged();
    let beyond = wal
        .create_slot_at("ahead", false, Some(Lsn(100 * SEG)))
        .unwrap();
    assert_eq!(beyond.restart_lsn, Some(wal.flushed()));
    let none = wal.create_slot_at("later", false, None).unwrap();
    assert_eq!(none.restart_lsn, None);
    moves.mark_unchanged();

    // Within the segment its file holds: no change.
    wal.advance_slot("copy", Lsn(2 * SEG + 500), TimelineId(1))
        .unwrap();
    assert!(!moves.has_changed().unwrap(), "moved within its segment");
    // Into the next one: a change.
    wal.advance_slot("copy", Lsn(3 * SEG + 1), TimelineId(1))
        .unwrap();
    assert!(moves.has_changed().unwrap(), "entered another segment");
    moves.mark_unchanged();
    wal.drop_slot("later").unwrap();
    assert!(moves.has_changed().unwrap(), "dropped");
}
