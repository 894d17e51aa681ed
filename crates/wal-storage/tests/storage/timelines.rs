//! Promotion, reads across switch points, history files, following an upstream's switch, fork
//! detection and rejoin by truncation.

use bytes::Bytes;
use wal_storage::*;

use crate::common::*;

/// Copies `[from, to)` of the primary's timeline `tli` into the standby, as a walreceiver does.
fn relay(primary: &Wal, standby: &Wal, tli: TimelineId, from: Lsn, to: Lsn) {
    let bytes = read_range(primary, tli, from, to);
    standby
        .write(from, Bytes::from(bytes))
        .unwrap()
        .wait()
        .unwrap();
}

fn init_standby(dir: &std::path::Path) -> Wal {
    let mut opts = InitOptions::primary(SystemId(7), WalFormat::Walserver);
    opts.start_lsn = Some(Lsn(SEG));
    Wal::init(dir, cfg(), opts).unwrap()
}

#[test]
fn promote_and_read_across_the_switch() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let before: Vec<Bytes> = (0..30).map(|i| payload(i, 50_000)).collect();
    let ends = append(&wal, &before);
    let old_end = *ends.last().unwrap();
    let mut rx = wal.subscribe();
    let (tli, x) = wal.promote("operator asked").unwrap();
    assert_eq!((tli, x), (TimelineId(2), old_end));
    assert_eq!(wal.timeline(), TimelineId(2));
    assert!(rx.has_changed().unwrap());
    assert_eq!(rx.borrow_and_update().timeline, TimelineId(2));
    // The reason names the moment the timeline was made, so that another timeline 2 made
    // elsewhere from the same point has another history.
    let file = String::from_utf8(wal.history_file(TimelineId(2)).unwrap().unwrap()).unwrap();
    assert!(
        file.starts_with(&format!("1\t{x}\toperator asked at 20")) && file.ends_with("+00\n"),
        "{file:?}"
    );
    assert_eq!(file.lines().count(), 1, "{file:?}");
    assert_eq!(wal.timeline_end(TimelineId(1)), Some(x));
    let after: Vec<Bytes> = (100..120).map(|i| payload(i, 40_000)).collect();
    append(&wal, &after);
    // Timeline 1 ends at the switch point; timeline 2 reads through it.
    let recs1 = records(&wal, TimelineId(1), Lsn(SEG));
    assert_eq!(recs1.len(), 30);
    assert!(wal.read(TimelineId(1), x, 100).unwrap().is_empty());
    let recs2 = records(&wal, TimelineId(2), Lsn(SEG));
    assert_eq!(recs2.len(), 50);
    assert_eq!(recs2[30].start, x);
    assert_eq!(recs2[30].payload, after[0]);
    // The switch segment exists on both timelines; timeline 1's bytes below x are identical.
    let seg_start = x.segment_start(SEG);
    assert_eq!(
        read_range(&wal, TimelineId(1), seg_start, x),
        read_range(&wal, TimelineId(2), seg_start, x)
    );
    assert!(segment_path(tmp.path(), TimelineId(2), x).exists());
    drop(wal);

    // Everything holds after a restart, and a second promotion lists both ancestors.
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(wal.timeline(), TimelineId(2));
    assert_eq!(records(&wal, TimelineId(2), Lsn(SEG)).len(), 50);
    let (tli3, y) = wal.promote("again").unwrap();
    assert_eq!(tli3, TimelineId(3));
    // Timeline 3's file begins with timeline 2's, line for line.
    let file3 = String::from_utf8(wal.history_file(TimelineId(3)).unwrap().unwrap()).unwrap();
    assert!(file3.starts_with(&file), "{file3:?} after {file:?}");
    assert!(
        file3[file.len()..].starts_with(&format!("2\t{y}\tagain at 20")),
        "{file3:?}"
    );
    assert_eq!(wal.history().len(), 2);
    append(&wal, &[payload(500, 10)]);
    let recs3 = records(&wal, TimelineId(3), Lsn(SEG));
    assert_eq!(recs3.len(), 51);
    assert_eq!(records(&wal, TimelineId(2), Lsn(SEG)).len(), 50);
}

#[test]
fn promote_an_empty_wal_and_at_a_segment_boundary() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let (tli, x) = wal.promote("empty").unwrap();
    assert_eq!((tli, x), (TimelineId(2), Lsn(SEG)));
    let end = append(&wal, &[Bytes::from_static(b"first")])[0];
    assert_eq!(end, Lsn(SEG + 24 + 24));
    assert_eq!(records(&wal, TimelineId(2), Lsn(SEG)).len(), 1);
}

#[test]
fn standby_promotes_at_its_last_complete_record() {
    let tmp = tempfile::tempdir().unwrap();
    let primary = init_primary(&tmp.path().join("p"), WalFormat::Walserver);
    let ends = append(
        &primary,
        &(0..10).map(|i| payload(i, 30_000)).collect::<Vec<_>>(),
    );
    let standby = init_standby(&tmp.path().join("s"));
    // The standby has received part of record 7 only.
    let cut = ends[6] + 1000;
    relay(&primary, &standby, TimelineId(1), Lsn(SEG), cut);
    assert_eq!(standby.flushed(), cut);
    drop(standby);
    let standby = Wal::open(tmp.path().join("s"), cfg()).unwrap();
    assert_eq!(
        standby.flushed(),
        cut,
        "a mid-record end vouched by the pointer survives"
    );
    // Appending in the middle of a received record would corrupt it: refused.
    let err = standby
        .append(vec![payload(9, 10)])
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(
        matches!(err, WalError::NotAtRecordBoundary { end, record_end } if end == cut && record_end == ends[6]),
        "{err}"
    );
    let (tli, x) = standby.promote("failover").unwrap();
    assert_eq!((tli, x), (TimelineId(2), ends[6]));
    assert_eq!(standby.timeline_end(TimelineId(1)), Some(ends[6]));
    let recs = records(&standby, TimelineId(2), Lsn(SEG));
    assert_eq!(recs.len(), 7);
    append(&standby, &[payload(77, 10)]);
    drop(standby);
    let standby = Wal::open(tmp.path().join("s"), cfg()).unwrap();
    let recs = records(&standby, TimelineId(2), Lsn(SEG));
    assert_eq!(recs.len(), 8);
    assert_eq!(recs[7].payload, payload(77, 10));
}

#[test]
fn follow_fork_and_rejoin() {
    let tmp = tempfile::tempdir().unwrap();
    let primary = init_primary(&tmp.path().join("p"), WalFormat::Walserver);
    let ends = append(
        &primary,
        &(0..10).map(|i| payload(i, 20_000)).collect::<Vec<_>>(),
    );
    let a = init_standby(&tmp.path().join("a"));
    let b = init_standby(&tmp.path().join("b"));
    let c = init_standby(&tmp.path().join("c"));
    relay(&primary, &a, TimelineId(1), Lsn(SEG), ends[9]);
    relay(&primary, &b, TimelineId(1), Lsn(SEG), ends[5]);
    relay(&primary, &c, TimelineId(1), Lsn(SEG), ends[9]);
    // c gets WAL of timeline 1 that the primary never had: c forked.
    let mut own = c.clone();
    append(&own, &[payload(1000, 64)]);
    own = c;

    let (tli, x) = primary.promote("switchover").unwrap();
    assert_eq!(x, ends[9]);
    append(
        &primary,
        &(20..25).map(|i| payload(i, 20_000)).collect::<Vec<_>>(),
    );
    let hist = primary.history_file(tli).unwrap().unwrap();

    // a is exactly at the switch point: it follows, stores the history file byte for byte,
    // and receives timeline 2 from the switch point.
    a.follow_timeline(tli, hist.clone(), x).unwrap();
    assert_eq!(a.timeline(), tli);
    assert_eq!(a.history_file(tli).unwrap().unwrap(), hist);
    relay(&primary, &a, tli, x, primary.flushed());
    assert_eq!(
        read_range(&a, tli, Lsn(SEG), a.flushed()),
        read_range(&primary, tli, Lsn(SEG), primary.flushed())
    );
    assert_eq!(records(&a, tli, Lsn(SEG)).len(), 15);

    // b is behind: it must first receive the rest of timeline 1.
    let err = b.follow_timeline(tli, hist.clone(), x).unwrap_err();
    assert!(matches!(err, WalError::BehindSwitchPoint { .. }), "{err}");
    relay(&primary, &b, TimelineId(1), ends[5], x);
    b.follow_timeline(tli, hist.clone(), x).unwrap();

    // c forked: the error names the fork point; after truncating to it, c follows.
    let err = own.follow_timeline(tli, hist.clone(), x).unwrap_err();
    assert!(
        matches!(err, WalError::Forked { fork_lsn, local_end } if fork_lsn == x && local_end > x),
        "{err}"
    );
    let dropped = own.truncate_to(x).unwrap();
    assert_eq!(dropped, 16 + 64);
    assert_eq!(own.flushed(), x);
    drop(own);
    let c = Wal::open(tmp.path().join("c"), cfg()).unwrap();
    assert_eq!(c.flushed(), x, "truncation is durable");
    c.follow_timeline(tli, hist.clone(), x).unwrap();
    relay(&primary, &c, tli, x, primary.flushed());
    assert_eq!(records(&c, tli, Lsn(SEG)).len(), 15);

    // A history that does not continue this node's timeline is refused.
    let bogus = b"1\t0/1\tx\n".to_vec();
    let tmp2 = tempfile::tempdir().unwrap();
    let d = init_standby(tmp2.path());
    assert!(matches!(
        d.follow_timeline(TimelineId(2), bogus, Lsn(1)),
        Err(WalError::InvalidHistory(_)) | Err(WalError::Forked { .. })
    ));
}

/// The fork cut (`truncate_beyond`: a rejoin, or a member following a new leader past its
/// fork) lowers a told commit point above the fork to the fork, durably, also when nothing
/// lay beyond it: as the new leader's WAL arrives past the fork, readers stop at the fork
/// until the new leader tells a point of its own, not at the point the old history told,
/// which is also no floor of rule 4 any more (the walreceiver's `Floor` reads the position).
#[test]
fn the_fork_cut_lowers_the_told_commit_point_to_the_fork() {
    let tmp = tempfile::tempdir().unwrap();
    let old = init_primary(&tmp.path().join("old"), WalFormat::Walserver);
    let ends = append(
        &old,
        &(0..10).map(|i| payload(i, 20_000)).collect::<Vec<_>>(),
    );
    let fork = ends[4];
    // The new leader had the old history up to the fork, and wrote past the old end.
    let leader = init_standby(&tmp.path().join("leader"));
    relay(&old, &leader, TimelineId(1), Lsn(SEG), fork);
    let (tli, x) = leader.promote("failover").unwrap();
    assert_eq!(x, fork);
    append(
        &leader,
        &(20..35).map(|i| payload(i, 20_000)).collect::<Vec<_>>(),
    );
    assert!(leader.flushed() > ends[9]);
    let hist = leader.history_file(tli).unwrap().unwrap();

    // A standby told the old history's commit point: one that holds all of it, one that
    // holds less than the fork (a commit point counts a quorum it need not be part of).
    let told = |dir: &str, upto: Lsn| {
        let s = init_standby_role(&tmp.path().join(dir));
        relay(&old, &s, TimelineId(1), Lsn(SEG), upto);
        s.set_told_commit_point(Some(ends[9]));
        wait_position(&s, "the told point stored", |p| {
            p.commit == CommitBound::Told(ends[9])
        });
        s
    };
    let s = told("s", ends[9]);
    let behind = told("behind", ends[2]);

    assert_eq!(s.truncate_beyond(fork).unwrap(), ends[9].0 - fork.0);
    assert_eq!(s.position().commit, CommitBound::Told(fork));
    assert_eq!(behind.truncate_beyond(fork).unwrap(), 0, "nothing beyond");
    assert_eq!(behind.position().commit, CommitBound::Told(fork));

    s.follow_timeline(tli, hist, fork).unwrap();
    relay(&leader, &s, tli, fork, leader.flushed());
    let pos = s.position();
    assert_eq!(pos.flushed, leader.flushed());
    assert_eq!(pos.committed(), fork, "readers stop at the fork");
    assert_eq!(pos.sendable(), fork);

    // Durable: reopened, and told nothing newer yet (as a node starts, `NodeBuilder`).
    drop(s);
    drop(behind);
    for dir in ["s", "behind"] {
        let again = Wal::open(tmp.path().join(dir), cfg()).unwrap();
        again.set_told_commit_point(Some(Lsn::INVALID));
        assert_eq!(again.position().commit, CommitBound::Told(fork), "{dir}");
    }
    // The new leader's point moves it on.
    let s = Wal::open(tmp.path().join("s"), cfg()).unwrap();
    let c = Lsn(ends[9].0 + 100);
    s.set_told_commit_point(Some(c));
    let pos = wait_position(&s, "the new point stored", |p| {
        p.commit == CommitBound::Told(c)
    });
    assert_eq!(pos.committed(), c);
}

/// A standby that lags behind the old history's commit point follows a new primary that
/// lacked part of it (a standby promoted by hand that lagged too): nothing to cut, but the
/// told point above the switch belongs to the history left behind, so following lowers it to
/// the switch, durably, and readers take nothing of the new timeline until it is told.
#[test]
fn following_a_switch_below_the_told_commit_point_lowers_it_to_the_switch() {
    let tmp = tempfile::tempdir().unwrap();
    let old = init_primary(&tmp.path().join("old"), WalFormat::Walserver);
    let ends = append(
        &old,
        &(0..10).map(|i| payload(i, 20_000)).collect::<Vec<_>>(),
    );
    let switch = ends[4];
    let leader = init_standby(&tmp.path().join("leader"));
    relay(&old, &leader, TimelineId(1), Lsn(SEG), switch);
    let (tli, x) = leader.promote("by hand").unwrap();
    assert_eq!(x, switch);
    append(
        &leader,
        &(20..35).map(|i| payload(i, 20_000)).collect::<Vec<_>>(),
    );
    let hist = leader.history_file(tli).unwrap().unwrap();

    // Told the old history's point, holding only up to the switch.
    let s = init_standby_role(&tmp.path().join("s"));
    relay(&old, &s, TimelineId(1), Lsn(SEG), switch);
    s.set_told_commit_point(Some(ends[9]));
    wait_position(&s, "the told point stored", |p| {
        p.commit == CommitBound::Told(ends[9])
    });
    s.follow_timeline(tli, hist, switch).unwrap();
    assert_eq!(s.position().commit, CommitBound::Told(switch));
    relay(&leader, &s, tli, switch, leader.flushed());
    let pos = s.position();
    assert_eq!(pos.flushed, leader.flushed());
    assert_eq!(pos.committed(), switch, "readers stop at the switch");

    // Durable: reopened, and told nothing newer yet.
    drop(s);
    let again = Wal::open(tmp.path().join("s"), cfg()).unwrap();
    again.set_told_commit_point(Some(Lsn::INVALID));
    assert_eq!(again.position().commit, CommitBound::Told(switch));
}

#[test]
fn truncate_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let ends = append(
        &wal,
        &(0..40).map(|i| payload(i, 70_000)).collect::<Vec<_>>(),
    );
    assert!(matches!(
        wal.truncate_to(ends[39] + 8),
        Err(WalError::BadTruncate { .. })
    ));
    assert_eq!(wal.truncate_to(ends[39]).unwrap(), 0);
    let dropped = wal.truncate_to(ends[3]).unwrap();
    assert_eq!(dropped, ends[39].0 - ends[3].0);
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(wal.flushed(), ends[3]);
    assert_eq!(records(&wal, TimelineId(1), Lsn(SEG)).len(), 4);
    // Later segments of the timeline are gone; a new record is not followed by old ones.
    append(&wal, &[payload(4, 70_000)]);
    drop(wal);
    let wal = Wal::open(tmp.path(), cfg()).unwrap();
    assert_eq!(records(&wal, TimelineId(1), Lsn(SEG)).len(), 5);
    let (tli, x) = wal.promote("p").unwrap();
    assert!(matches!(
        wal.truncate_to(Lsn(x.0 - 8)),
        Err(WalError::BadTruncate { .. })
    ));
    assert_eq!(tli, TimelineId(2));
}

#[test]
fn store_history_files_from_upstream() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Postgres);
    let hist = b"# from upstream\n1\t0/4025A50\tno recovery target specified\n".to_vec();
    wal.store_history_file(TimelineId(2), hist.clone()).unwrap();
    assert_eq!(wal.history_file(TimelineId(2)).unwrap(), Some(hist));
    assert!(wal
        .store_history_file(TimelineId(1), b"1\t0/1\tx\n".to_vec())
        .is_err());
    assert!(wal
        .store_history_file(TimelineId(3), b"garbage".to_vec())
        .is_err());
}

/// The tail cache serves exactly what the files hold: small batches just flushed come from
/// memory, large ones and ranges it does not hold do not, and after a cut or a new timeline
/// it never serves the bytes that were replaced.
#[test]
fn cached_reads_match_the_files() {
    let tmp = tempfile::tempdir().unwrap();
    let wal = init_primary(tmp.path(), WalFormat::Walserver);
    let t1 = TimelineId(1);
    let start = wal.flushed();
    let mut ends = Vec::new();
    for i in 0..20 {
        ends.extend(append(&wal, &[payload(i, 300 + i as usize * 37)]));
    }
    let end = *ends.last().unwrap();
    // Every byte just written is in memory and equal to what `read` returns.
    let mut pos = start;
    while pos < end {
        let b = wal
            .read_cached(t1, pos, 1 << 20)
            .unwrap_or_else(|| panic!("{pos} is not cached"));
        assert!(!b.is_empty() && pos + b.len() as u64 <= end);
        assert_eq!(&b[..], &read_range(&wal, t1, pos, pos + b.len() as u64)[..]);
        pos = pos + b.len() as u64;
    }
    assert_eq!(wal.read_cached(t1, end, 10), None, "nothing beyond the end");
    assert_eq!(wal.read_cached(TimelineId(9), start, 10), None);

    // A cut inside what is cached: whatever is still served below it matches the files, at
    // it there is nothing, and a new record written there is served, not the bytes it
    // replaced.
    let cut = ends[12];
    wal.truncate_to(cut).unwrap();
    if let Some(below) = wal.read_cached(t1, ends[4], 1 << 20) {
        assert!(ends[4] + below.len() as u64 <= cut);
        assert_eq!(
            &below[..],
            &read_range(&wal, t1, ends[4], ends[4] + below.len() as u64)[..]
        );
    }
    assert_eq!(wal.read_cached(t1, cut, 10), None);
    let replaced = append(&wal, &[payload(500, 300)])[0];
    let b = wal
        .read_cached(t1, cut, 1 << 20)
        .expect("the new record is cached");
    assert_eq!(&b[..], &read_range(&wal, t1, cut, replaced)[..]);
    let end = replaced;
    let ends = ends[..12].to_vec();

    // A large batch is read from the files only.
    let big = append(&wal, &[payload(99, 200_000)])[0];
    assert_eq!(wal.read_cached(t1, end, 10), None);
    assert_eq!(
        wal.read_cached(t1, ends[0], 10),
        None,
        "the large batch emptied it"
    );

    // After a cut, new bytes at the same positions are what the cache serves.
    wal.truncate_to(end).unwrap();
    assert_eq!(wal.read_cached(t1, end, 10), None);
    let after = append(&wal, &[payload(1000, 500)])[0];
    assert!(after < big);
    let b = wal
        .read_cached(t1, end, 1 << 20)
        .expect("the new record is cached");
    assert_eq!(&b[..], &read_range(&wal, t1, end, after)[..]);

    // A new timeline: the old one's tail is not served under either timeline.
    let (t2, x) = wal.promote("p").unwrap();
    assert_eq!(wal.read_cached(t1, end, 10), None);
    assert_eq!(wal.read_cached(t2, end, 10), None);
    let e2 = append(&wal, &[payload(2000, 100)])[0];
    let b = wal
        .read_cached(t2, x, 1 << 20)
        .expect("the new timeline's record is cached");
    assert_eq!(&b[..], &read_range(&wal, t2, x, e2)[..]);
}

/// Rewrites the control file without its `role` field, as versions that did not record the
/// role wrote it (same envelope and version).
fn strip_role(dir: &std::path::Path) {
    let path = dir.join("control");
    let bytes = std::fs::read(&path).unwrap();
    let nl = bytes.iter().position(|&b| b == b'\n').unwrap();
    let mut body: serde_json::Value = serde_json::from_slice(&bytes[nl + 1..]).unwrap();
    assert!(body.as_object_mut().unwrap().remove("role").is_some());
    let json = serde_json::to_vec_pretty(&body).unwrap();
    let mut out = format!("walserver-control crc32c={:08x}\n", crc32c::crc32c(&json)).into_bytes();
    out.extend_from_slice(&json);
    std::fs::write(&path, out).unwrap();
}

/// The control data records the role: a new primary's and a standby's at init, `Primary` in
/// the same write that makes a promotion's timeline current, `Standby` by `set_role`; a
/// follow keeps it; a control file without the field (written before it existed) opens with
/// none and gets one when the node is promoted.
#[test]
fn the_role_is_recorded_with_the_timeline() {
    let tmp = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (tmp.path().join("p"), tmp.path().join("s"));
    let primary = init_primary(&p_dir, WalFormat::Walserver);
    assert_eq!(primary.role(), Some(Role::Primary));
    let mut opts = InitOptions::primary(SystemId(7), WalFormat::Walserver);
    opts.role = Role::Standby;
    let standby = Wal::init(&s_dir, cfg(), opts).unwrap();
    assert_eq!(standby.role(), Some(Role::Standby));
    assert_eq!(
        Wal::stored_role(&s_dir).unwrap(),
        (Some(Role::Standby), TimelineId(1))
    );
    // The standby follows its upstream's promotion and stays a standby.
    let end = append(&primary, &[payload(1, 100)])[0];
    relay(&primary, &standby, TimelineId(1), Lsn(SEG), end);
    let (tli, x) = primary.promote("failover").unwrap();
    let history = primary.history_file(tli).unwrap().unwrap();
    standby.follow_timeline(tli, history, x).unwrap();
    assert_eq!(standby.role(), Some(Role::Standby));
    drop(standby);
    assert_eq!(
        Wal::stored_role(&s_dir).unwrap(),
        (Some(Role::Standby), TimelineId(2))
    );
    // Promotion records the role with the new timeline.
    let standby = Wal::open(&s_dir, cfg()).unwrap();
    assert_eq!(standby.promote("failover").unwrap().0, TimelineId(3));
    drop(standby);
    assert_eq!(
        Wal::stored_role(&s_dir).unwrap(),
        (Some(Role::Primary), TimelineId(3))
    );
    // `set_role` records a role by itself (as `walserver rejoin` does), durably.
    drop(primary);
    let primary = Wal::open(&p_dir, cfg()).unwrap();
    primary.set_role(Role::Standby).unwrap();
    assert_eq!(primary.role(), Some(Role::Standby));
    drop(primary);
    assert_eq!(Wal::stored_role(&p_dir).unwrap().0, Some(Role::Standby));
    // A control file from before the role was recorded opens with none, and promotion
    // records one.
    strip_role(&s_dir);
    let old = Wal::open(&s_dir, cfg()).unwrap();
    assert_eq!(old.role(), None);
    append(&old, &[payload(2, 100)]);
    drop(old);
    assert_eq!(Wal::stored_role(&s_dir).unwrap().0, None, "kept as it was");
    let old = Wal::open(&s_dir, cfg()).unwrap();
    old.promote("failover").unwrap();
    assert_eq!(old.role(), Some(Role::Primary));
}

/// A primary that becomes a standby keeps the end of what it wrote as its `primary_end`,
/// durably; a cut at or above it keeps it, and only a cut below it (the explicit kind) ends
/// it. A standby that never was a primary has none.
#[test]
fn a_demoted_primary_keeps_its_end_until_a_cut_goes_below_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (tmp.path().join("p"), tmp.path().join("s"));
    let primary = init_primary(&p_dir, WalFormat::Walserver);
    let ends = append(&primary, &[payload(1, 100), payload(2, 100)]);
    let (first, end) = (ends[0], ends[1]);
    assert_eq!(primary.primary_end(), Some(end), "a primary: all it holds");
    primary.set_role(Role::Standby).unwrap();
    assert_eq!(primary.primary_end(), Some(end));
    drop(primary);
    let demoted = Wal::open(&p_dir, cfg()).unwrap();
    assert_eq!(demoted.primary_end(), Some(end), "kept across a restart");
    // A second `set_role(Standby)` (a rejoin of a node already demoted) changes nothing.
    demoted.set_role(Role::Standby).unwrap();
    assert_eq!(demoted.primary_end(), Some(end));
    // WAL received past it and cut back to it: the floor stands.
    let more = end + 100;
    demoted
        .write(end, Bytes::from(vec![0u8; 100]))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(demoted.truncate_to(end).unwrap(), 100);
    assert_eq!(demoted.primary_end(), Some(end));
    assert!(demoted.flushed() < more);
    // A cut below it ends it, durably.
    demoted.truncate_to(first).unwrap();
    assert_eq!(demoted.primary_end(), None);
    drop(demoted);
    assert_eq!(Wal::open(&p_dir, cfg()).unwrap().primary_end(), None);

    let standby = init_standby_role(&s_dir);
    assert_eq!(standby.primary_end(), None);
    standby.set_role(Role::Standby).unwrap();
    assert_eq!(standby.primary_end(), None, "never was a primary");
}

fn init_standby_role(dir: &std::path::Path) -> Wal {
    let mut opts = InitOptions::primary(SystemId(7), WalFormat::Walserver);
    opts.role = Role::Standby;
    Wal::init(dir, cfg(), opts).unwrap()
}
