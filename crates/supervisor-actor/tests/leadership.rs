//! The leadership messages over real nodes on loopback: a standby promoted for a term records
//! the term in its timeline history; a demoted primary drops exactly its divergent tail and
//! streams from the new leader; a standby re-targeted at another upstream follows it at once;
//! the synchronous standbys can be changed under waiting appends.

mod common;
use common::*;

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use supervisor_actor::{
    AppendError, AppendRecords, Durability, Fence, FollowLeader, Followed, GetNodeStatus,
    LocalLevel, Node, NodeBuilder, NodeRole, PromoteForTerm, SetSyncStandbys,
};
use supervisor_actor::{Follow, RecordEvent};
use wal_storage::{CommitBound, Lsn, TimelineId, WalError};
use walreceiver_actor::ReceiverConfig;

/// A grant far beyond the tests' own deadline.
fn lasting() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

async fn flushed_to(node: &Node, lsn: Lsn) {
    tokio::time::timeout(DEADLINE, node.wait_for_lsn(lsn, LocalLevel::Flushed))
        .await
        .unwrap_or_else(|_| panic!("flushed to {lsn} by the deadline"));
}

async fn start(builder: NodeBuilder) -> Node {
    builder.start().await.unwrap()
}

/// `builder` with the overlapped commit switched `on` or off, for its walsenders and, on a
/// standby, its walreceiver.
fn with_overlap(mut builder: NodeBuilder, on: bool) -> NodeBuilder {
    let config = builder.config_mut();
    let mut session = (*config.walsender.session).clone();
    session.commit_overlap = on;
    config.walsender.session = std::sync::Arc::new(session);
    if let Some(receiver) = config.standby.as_mut() {
        receiver.session.commit_overlap = on;
    }
    builder
}

/// Makes `node` the leader of `term` as the failover actor does: a standby, or a primary
/// under the overlapped commit, takes the term up with `PromoteForTerm` (a primary under
/// failover starts held at the commit point it stored, and from the term on decides it
/// itself, so its walsenders send again), then the fence is granted.
async fn lead(node: &Node, fence: &Fence, term: u64) {
    if role(node).await == NodeRole::Standby || node.shared.settings().session.commit_overlap {
        promote(node, term).await;
    }
    fence.grant(term, lasting());
}

async fn promote(node: &Node, term: u64) -> supervisor_actor::Promoted {
    tokio::time::timeout(DEADLINE, node.supervisor.send(PromoteForTerm { term }))
        .await
        .expect("promoted by the deadline")
        .unwrap()
        .unwrap()
}

#[test]
fn a_standby_promoted_for_a_term_records_it_in_its_history() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let p = start(primary(&dir.path().join("p")).fence(Fence::open())).await;
        let end = append(&p, "before", Durability::Local).await;
        let fence = Fence::closed();
        let s = start(standby_of(&p, &dir.path().join("s"), "s").fence(fence.clone())).await;
        flushed_to(&s, end).await;
        // Under failover a plain promotion is refused: it would make a primary of no term.
        let refused = s.supervisor.send(supervisor_actor::Promote).await.unwrap();
        assert!(
            matches!(
                refused,
                Err(supervisor_actor::PromoteError::ManagedByFailover)
            ),
            "{refused:?}"
        );
        assert_eq!(role(&s).await, NodeRole::Standby);
        let promoted = promote(&s, 7).await;
        assert_eq!(promoted.timeline, TimelineId(2));
        assert_eq!(role(&s).await, NodeRole::Primary);
        let history = s.wal.history();
        let last = history.last().expect("timeline 2 has a history");
        assert_eq!(last.parent, TimelineId(1));
        assert_eq!(last.switch_lsn, promoted.switch_lsn);
        assert!(last.reason.contains("term 7"), "{:?}", last.reason);
        assert_eq!(fence.term(), Some(7));
        // Promoted, but not yet granted: the failover actor grants after the promotion.
        assert!(matches!(
            try_append(&s, "early", Durability::Local).await,
            Err(AppendError::NotLeader { term: Some(7) })
        ));
        fence.grant(7, lasting());
        assert!(append(&s, "after", Durability::Local).await > promoted.switch_lsn);
        stop(s).await;
        stop(p).await;
    });
}

/// Waits until `node`'s readers see WAL up to `lsn` on `timeline`: flushed there and
/// acknowledged, which on a standby under the overlapped commit is the commit point its
/// upstream told it (readers trail the flush), and with the switch off the flush itself.
async fn readable_on(node: &Node, timeline: TimelineId, lsn: Lsn) {
    flushed_on(node, timeline, lsn).await;
    let mut acknowledged = node.acknowledged();
    tokio::time::timeout(DEADLINE, acknowledged.wait_for(|a| *a >= lsn))
        .await
        .unwrap_or_else(|_| panic!("readable to {lsn} by the deadline"))
        .unwrap();
}

/// Waits until `node` holds WAL up to `lsn` on `timeline`.
async fn flushed_on(node: &Node, timeline: TimelineId, lsn: Lsn) {
    let mut pos = node.wal.subscribe();
    tokio::time::timeout(
        DEADLINE,
        pos.wait_for(|p| p.timeline == timeline && p.flushed >= lsn),
    )
    .await
    .unwrap_or_else(|_| panic!("flushed to {lsn} on timeline {timeline} by the deadline"))
    .unwrap();
}

/// Rule 5 of the overlapped commit under failover: a primary that takes up a term (it led
/// before and won the key again, say after a restart) starts a new timeline at its durable
/// end if its early-send mark names its timeline, since a synchronous standby may hold a tail
/// of it that it lost. One that never sent early takes the term up on its timeline and stops
/// holding its readers at the commit point it started with (it now decides it). With the
/// switch off a primary is refused, as before, and keeps its timeline.
#[test]
fn a_primary_taking_up_a_term_starts_a_new_timeline_only_after_early_sends() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        for (overlap, sent_early) in [(false, false), (true, false), (true, true)] {
            let fence = Fence::closed();
            let builder =
                primary(&dir.path().join(format!("{overlap}-{sent_early}"))).fence(fence.clone());
            let p = start(with_overlap(builder, overlap)).await;
            // Under failover the start leaves the timeline to the term.
            assert_eq!(p.wal.timeline(), TimelineId(1));
            fence.grant(2, lasting());
            let end = append(&p, "term 2", Durability::Local).await;
            if sent_early {
                // The mark, asked for as a walsender about to send early asks for it.
                let mut announced = p.wal.subscribe();
                p.wal.mark_early_sends(TimelineId(1));
                tokio::time::timeout(DEADLINE, async {
                    while p.wal.early_sends_marked() != Some(TimelineId(1)) {
                        announced.changed().await.expect("storage is open");
                    }
                })
                .await
                .expect("the mark is durable by the deadline");
            }
            fence.revoke();
            let taken =
                tokio::time::timeout(DEADLINE, p.supervisor.send(PromoteForTerm { term: 3 }))
                    .await
                    .expect("answered by the deadline")
                    .unwrap();
            if !overlap {
                assert!(
                    matches!(taken, Err(supervisor_actor::PromoteError::NotStandby)),
                    "{taken:?}"
                );
                assert_eq!(p.wal.timeline(), TimelineId(1));
                stop(p).await;
                continue;
            }
            let taken = taken.expect("the term taken up");
            if !sent_early {
                assert_eq!((taken.timeline, taken.switch_lsn), (TimelineId(1), Lsn(0)));
                assert!(p.wal.history().is_empty(), "no new timeline");
                assert!(
                    !matches!(p.wal.position().commit, CommitBound::Told(_)),
                    "{:?}: readers still held at the commit point it started with",
                    p.wal.position().commit
                );
                fence.grant(3, lasting());
                assert!(append(&p, "term 3", Durability::Local).await > end);
                stop(p).await;
                continue;
            }
            assert_eq!((taken.timeline, taken.switch_lsn), (TimelineId(2), end));
            let last = p.wal.history().last().cloned().expect("a history entry");
            assert_eq!((last.parent, last.switch_lsn), (TimelineId(1), end));
            assert!(last.reason.contains("term 3"), "{:?}", last.reason);
            assert_eq!(role(&p).await, NodeRole::Primary);
            fence.grant(3, lasting());
            assert!(append(&p, "term 3", Durability::Local).await > end);
            assert_eq!(p.wal.timeline(), TimelineId(2));
            stop(p).await;
        }
    });
}

fn leader(node: &Node, name: &str) -> ReceiverConfig {
    ReceiverConfig::parse(&conninfo(node), Some(name)).unwrap()
}

async fn follow(node: &Node, upstream: &Node, name: &str, term: u64) -> Followed {
    tokio::time::timeout(
        DEADLINE,
        node.supervisor.send(FollowLeader {
            upstream: leader(upstream, name),
            term,
            synchronous: false,
        }),
    )
    .await
    .expect("followed by the deadline")
    .unwrap()
    .unwrap()
}

#[test]
fn a_demoted_primary_drops_exactly_its_divergent_tail_and_streams_from_the_new_leader() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let p_fence = Fence::closed();
        let p = start(primary(&dir.path().join("p")).fence(p_fence.clone())).await;
        lead(&p, &p_fence, 1).await;
        let from = p.wal.flushed();
        let mut shared_end = Lsn::INVALID;
        for i in 0..5 {
            shared_end = append(&p, format!("shared {i}"), Durability::Local).await;
        }
        let s_fence = Fence::closed();
        let s = start(standby_of(&p, &dir.path().join("s"), "s").fence(s_fence.clone())).await;
        flushed_to(&s, shared_end).await;
        let promoted = promote(&s, 2).await;
        s_fence.grant(2, lasting());
        // The old primary goes on for a while, as a stale leader would: WAL the new leader
        // never had.
        let mut p_end = Lsn::INVALID;
        for i in 0..20 {
            p_end = append(
                &p,
                format!("divergent {i} {}", "x".repeat(200)),
                Durability::Local,
            )
            .await;
        }
        assert!(p_end > promoted.switch_lsn);
        let mut s_end = Lsn::INVALID;
        for i in 0..3 {
            s_end = append(&s, format!("new leader {i}"), Durability::Local).await;
        }

        // A reader that has given the divergent records: it must not go on inside the other
        // history once they are dropped.
        let mut reader = Box::pin(p.records(from, Follow::Forever));
        for _ in 0..25 {
            let ev = tokio::time::timeout(DEADLINE, reader.next()).await.unwrap();
            assert!(matches!(ev, Some(Ok(RecordEvent::Record { .. }))), "{ev:?}");
        }

        let followed = follow(&p, &s, "p", 2).await;
        assert!(followed.demoted);
        let ev = tokio::time::timeout(DEADLINE, reader.next()).await.unwrap();
        assert!(
            matches!(ev, Some(Err(WalError::ReadWalDropped { read_to, end })) if read_to == p_end && end == promoted.switch_lsn),
            "{ev:?}"
        );
        assert_eq!(followed.fork, Some(promoted.switch_lsn));
        assert_eq!(followed.dropped_bytes, p_end.0 - promoted.switch_lsn.0);
        assert_eq!(role(&p).await, NodeRole::Standby);
        assert_eq!(p_fence.term(), Some(2));
        assert!(matches!(
            try_append(&p, "refused", Durability::Local).await,
            Err(AppendError::Standby)
        ));

        // It streams from the new leader: what the leader appends now arrives too.
        let more = append(&s, "after the demotion", Durability::Local).await;
        readable_on(&p, TimelineId(2), more.max(s_end)).await;
        assert_eq!(p.wal.history(), s.wal.history());
        let on_p = records(&p, from).await;
        let on_s = records(&s, from).await;
        assert_eq!(on_p, on_s);
        assert!(on_p.iter().all(|(_, _, r)| !r.starts_with(b"divergent")));
        assert_eq!(on_p.len(), 5 + 3 + 1);
        let status = p.supervisor.send(GetNodeStatus).await.unwrap().unwrap();
        let receiver = status.wal_receiver.expect("a standby's walreceiver");
        assert_eq!(
            receiver.status.and_then(|s| s.sender_port),
            Some(s.listen_addr.port())
        );
        stop(p).await;
        stop(s).await;
    });
}

#[test]
fn a_standby_is_retargeted_at_the_new_leader_at_once() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let p = start(primary(&dir.path().join("p")).fence(Fence::open())).await;
        let from = p.wal.flushed();
        let end = append(&p, "before", Durability::Local).await;
        let a_fence = Fence::closed();
        let a = start(standby_of(&p, &dir.path().join("a"), "a").fence(a_fence.clone())).await;
        let b_fence = Fence::closed();
        let b = start(standby_of(&p, &dir.path().join("b"), "b").fence(b_fence.clone())).await;
        flushed_to(&a, end).await;
        flushed_to(&b, end).await;
        // The old upstream is gone: only the new leader can feed B from now on.
        stop(p).await;
        let promoted = promote(&a, 5).await;
        a_fence.grant(5, lasting());
        let followed = follow(&b, &a, "b", 5).await;
        assert!(!followed.demoted);
        assert_eq!(followed.fork, Some(promoted.switch_lsn));
        assert_eq!(followed.dropped_bytes, 0);
        assert_eq!(b_fence.term(), Some(5));
        let a_end = append(&a, "on the new leader", Durability::Local).await;
        readable_on(&b, TimelineId(2), a_end).await;
        assert_eq!(records(&b, from).await, records(&a, from).await);
        assert_eq!(b.wal.history(), a.wal.history());
        let signal = supervisor_actor::datadir::StandbySignal::read(&dir.path().join("b"))
            .unwrap()
            .expect("still a standby");
        assert!(
            signal
                .primary_conninfo
                .unwrap()
                .contains(&format!("port={}", a.listen_addr.port())),
            "a restart follows the new leader"
        );
        // The same leader again is nothing to do.
        let again = follow(&b, &a, "b", 5).await;
        assert_eq!((again.dropped_bytes, again.fork), (0, None));
        stop(a).await;
        stop(b).await;
    });
}

#[test]
fn new_synchronous_standbys_release_the_appends_they_satisfy() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        // A synchronous standby that never connects: appends wait.
        let p = start(
            primary(&dir.path().join("p"))
                .fence(Fence::open())
                .synchronous_standby_names("never_connects")
                .unwrap(),
        )
        .await;
        let s = start(standby_of(&p, &dir.path().join("s"), "s").fence(Fence::closed())).await;
        let waiting = p.supervisor.send(AppendRecords {
            records: vec![Bytes::from_static(b"waits for s")],
            durability: Some(Durability::On),
        });
        let mut waiting = Box::pin(waiting);
        // Durable on the primary and on `s`, yet not acknowledged: `s` does not count.
        let start_at = p.wal.flushed();
        let mut pos = p.wal.subscribe();
        tokio::select! {
            r = pos.wait_for(|p| p.flushed > start_at) => { r.unwrap(); }
            r = &mut waiting => panic!("acknowledged before s counted: {r:?}"),
        }
        let end = p.wal.flushed();
        tokio::select! {
            () = flushed_to(&s, end) => {}
            r = &mut waiting => panic!("acknowledged before s counted: {r:?}"),
        }
        let names = walsender_actor::syncrep::parse_sync_standby_names("s").unwrap();
        p.supervisor.do_send(SetSyncStandbys { names });
        let appended = tokio::time::timeout(DEADLINE, waiting)
            .await
            .expect("released by the deadline")
            .unwrap()
            .unwrap();
        assert_eq!(appended.end_lsn, end);

        // With none, appends do not wait at all.
        let p2 = start(
            primary(&dir.path().join("p2"))
                .fence(Fence::open())
                .synchronous_standby_names("never_connects")
                .unwrap(),
        )
        .await;
        let waiting = Box::pin(p2.supervisor.send(AppendRecords {
            records: vec![Bytes::from_static(b"waits")],
            durability: Some(Durability::On),
        }));
        let before = p2.wal.flushed();
        let mut waiting = waiting;
        let mut pos = p2.wal.subscribe();
        tokio::select! {
            r = pos.wait_for(|p| p.flushed > before) => { r.unwrap(); }
            r = &mut waiting => panic!("acknowledged without its standby: {r:?}"),
        }
        p2.supervisor.do_send(SetSyncStandbys { names: None });
        tokio::time::timeout(DEADLINE, waiting)
            .await
            .expect("released by the deadline")
            .unwrap()
            .unwrap();
        // The supervisor's own setting changed too: the next one does not wait either.
        try_append(&p2, "asynchronous now", Durability::Local)
            .await
            .unwrap();
        stop(s).await;
        stop(p).await;
        stop(p2).await;
    });
}

/// [`stale_leader_with_a_standby`]'s nodes: P led term 1 from `from`, S was promoted for
/// term 2, and P went on to `p_end` as a stale leader.
struct Forked {
    p: Node,
    s: Node,
    c: Node,
    from: Lsn,
    promoted: supervisor_actor::Promoted,
    p_end: Lsn,
}

/// P leads term 1 (the overlapped commit `overlap`) with standbys S and C; S is promoted
/// for term 2 and leads it, and P goes on as a stale leader with `divergent` appends,
/// which C, still its standby, is sent too.
async fn stale_leader_with_a_standby(
    dir: &std::path::Path,
    overlap: bool,
    divergent: usize,
) -> Forked {
    let p_fence = Fence::closed();
    let p = start(with_overlap(primary(&dir.join("p")), overlap).fence(p_fence.clone())).await;
    lead(&p, &p_fence, 1).await;
    let from = p.wal.flushed();
    let shared = append(&p, "shared", Durability::Local).await;
    let s_fence = Fence::closed();
    // The standbys run the same switch, so that with it off C's walreceiver refuses P's
    // fork rather than cut it at a stream start before it is told to follow.
    let s =
        start(with_overlap(standby_of(&p, &dir.join("s"), "s"), overlap).fence(s_fence.clone()))
            .await;
    let c =
        start(with_overlap(standby_of(&p, &dir.join("c"), "c"), overlap).fence(Fence::closed()))
            .await;
    flushed_to(&s, shared).await;
    flushed_to(&c, shared).await;
    let promoted = promote(&s, 2).await;
    s_fence.grant(2, lasting());
    let mut p_end = Lsn::INVALID;
    for i in 0..divergent {
        p_end = append(&p, format!("divergent {i}"), Durability::Local).await;
    }
    Forked {
        p,
        s,
        c,
        from,
        promoted,
        p_end,
    }
}

#[test]
fn a_cascading_standby_with_the_divergent_tail_drops_it_and_follows_the_new_history() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        // C streams from P, before and after P's demotion (a cascade of it).
        let Forked {
            p,
            s,
            c,
            from,
            promoted,
            p_end,
        } = stale_leader_with_a_standby(dir.path(), false, 10).await;
        // C holds the divergent tail as well.
        flushed_to(&c, p_end).await;
        let divergent = p_end.0 - promoted.switch_lsn.0;
        assert_eq!(follow(&p, &s, "p", 2).await.dropped_bytes, divergent);
        assert_eq!(
            tail_cuts(&p).await,
            (1, divergent),
            "counted as rule 4's cuts"
        );
        // The same upstream as before, once it is on the new history, which forked from C's
        // WAL: C cuts back.
        flushed_on(&p, TimelineId(2), promoted.switch_lsn).await;
        let followed = follow(&c, &p, "c", 2).await;
        assert!(!followed.demoted);
        assert_eq!(followed.fork, Some(promoted.switch_lsn));
        assert_eq!(followed.dropped_bytes, divergent);
        assert_eq!(tail_cuts(&c).await, (1, divergent));
        let s_end = append(&s, "on the new leader", Durability::Local).await;
        readable_on(&c, TimelineId(2), s_end).await;
        readable_on(&p, TimelineId(2), s_end).await;
        let on_s = records(&s, from).await;
        assert_eq!(records(&c, from).await, on_s);
        assert_eq!(records(&p, from).await, on_s);
        assert_eq!(c.wal.history(), s.wal.history());
        stop(c).await;
        stop(p).await;
        stop(s).await;
    });
}

/// The tails a node cut and their bytes, as `/status` shows them under `commit`.
async fn tail_cuts(node: &Node) -> (u64, u64) {
    let status = node.supervisor.send(GetNodeStatus).await.unwrap().unwrap();
    (status.commit.tail_cuts, status.commit.tail_cut_bytes)
}

/// Rule 4 for the fork cut: a standby told a commit point by a stale leader refuses to
/// follow a new leader whose history forked below it when the leader was chosen to hold
/// everything acknowledged (a synchronous mode), keeps its WAL and counts the refusal; in an
/// asynchronous mode it cuts past the fork, the configured trade, and the cut lowers the
/// told point to the fork (rule 3): the new leader's WAL past the fork is read by no one
/// there until the new leader tells a point of its own, not up to the stale leader's point.
#[test]
fn a_fork_below_the_told_commit_point_is_refused_in_a_synchronous_mode() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        // C, still the stale leader's standby, is told its appends.
        let Forked {
            p,
            s,
            c,
            promoted,
            p_end,
            ..
        } = stale_leader_with_a_standby(dir.path(), true, 5).await;
        let mut pos = c.wal.subscribe();
        tokio::time::timeout(
            DEADLINE,
            pos.wait_for(|p| matches!(p.commit, CommitBound::Told(x) if x >= p_end)),
        )
        .await
        .expect("told by the deadline")
        .unwrap();
        flushed_to(&c, p_end).await;
        let held = c.wal.flushed();
        let refused = c
            .supervisor
            .send(FollowLeader {
                upstream: leader(&s, "c"),
                term: 2,
                synchronous: true,
            })
            .await
            .unwrap();
        assert!(
            matches!(refused, Err(supervisor_actor::FollowError::BelowCommitPoint { fork, commit_point }) if fork == promoted.switch_lsn && commit_point >= p_end),
            "{refused:?}"
        );
        assert_eq!(c.wal.flushed(), held, "nothing cut");
        let status = c.supervisor.send(GetNodeStatus).await.unwrap().unwrap();
        assert_eq!(status.commit.tail_cut_refusals, 1, "{:?}", status.commit);
        assert_eq!(status.commit.tail_cuts, 0);
        // The new leader tells no point past the fork while the synchronous standby it names
        // confirms nothing; its appends at `local` go on.
        let names = walsender_actor::syncrep::parse_sync_standby_names("never_connects").unwrap();
        s.supervisor.send(SetSyncStandbys { names }).await.unwrap();
        let mut s_pos = s.wal.subscribe();
        tokio::time::timeout(
            DEADLINE,
            s_pos.wait_for(|p| matches!(p.commit, CommitBound::Own(x) if x <= promoted.switch_lsn)),
        )
        .await
        .expect("the new leader's own point by the deadline")
        .unwrap();
        let followed = follow(&c, &s, "c", 2).await;
        assert_eq!(followed.fork, Some(promoted.switch_lsn));
        assert!(followed.dropped_bytes > 0);
        assert_eq!(tail_cuts(&c).await, (1, followed.dropped_bytes));
        let mut s_end = Lsn::INVALID;
        for i in 0..100 {
            if s_end > p_end {
                break;
            }
            s_end = append(&s, format!("on the new leader {i}"), Durability::Local).await;
        }
        assert!(
            s_end > p_end,
            "the new history reaches past the stale leader's"
        );
        flushed_on(&c, TimelineId(2), s_end).await;
        let pos = c.wal.position();
        assert!(
            pos.committed() <= promoted.switch_lsn,
            "readers on the new history stop at the fork, not at the stale point: {pos:?}"
        );
        assert!(*c.acknowledged().borrow() <= promoted.switch_lsn);
        let past_fork = records(&c, promoted.switch_lsn).await;
        assert!(past_fork.is_empty(), "{past_fork:?}");
        // Once the new leader's point moves, readers follow it.
        s.supervisor
            .send(SetSyncStandbys { names: None })
            .await
            .unwrap();
        readable_on(&c, TimelineId(2), s_end).await;
        stop(c).await;
        stop(s).await;
        stop(p).await;
    });
}

#[test]
fn held_walsender_sessions_end_and_resume() {
    use walsender_actor::messages::{GetReplicationStatus, HoldWalSenders, ResumeWalSenders};
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let p = start(primary(&dir.path().join("p")).fence(Fence::open())).await;
        let first = append(&p, "first", Durability::Local).await;
        let s = start(standby_of(&p, &dir.path().join("s"), "s").fence(Fence::closed())).await;
        flushed_to(&s, first).await;
        tokio::time::timeout(DEADLINE, p.registry.send(HoldWalSenders))
            .await
            .expect("every session ended by the deadline")
            .unwrap();
        let sessions = p.registry.send(GetReplicationStatus).await.unwrap();
        assert!(sessions.is_empty(), "{sessions:?}");
        let second = append(&p, "second", Durability::Local).await;
        p.registry.do_send(ResumeWalSenders);
        // The standby's walreceiver reconnects and streams again.
        flushed_to(&s, second).await;
        stop(s).await;
        stop(p).await;
    });
}

/// Under a failover actor (a managed fence) the synchronous standbys are the actor's choice:
/// a reload with the configuration's names (none, as the configuration must have under
/// failover) keeps them, so appends still wait for the chosen standby.
#[test]
fn a_reload_keeps_the_synchronous_standbys_a_failover_actor_chose() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let fence = Fence::closed();
        fence.grant(1, lasting());
        let p = start(primary(&dir.path().join("p")).fence(fence)).await;
        let names = walsender_actor::syncrep::parse_sync_standby_names("never_connects").unwrap();
        p.supervisor.send(SetSyncStandbys { names }).await.unwrap();
        p.supervisor
            .send(supervisor_actor::Reconfigure {
                walsender: (*p.shared.settings()).clone(),
                max_wal_senders: 10,
                receiver: None,
                sync: supervisor_actor::SyncSettings::default(),
            })
            .await
            .unwrap();
        let before = p.wal.flushed();
        let mut waiting = Box::pin(p.supervisor.send(AppendRecords {
            records: vec![Bytes::from_static(b"waits for the chosen standby")],
            durability: Some(Durability::On),
        }));
        let mut pos = p.wal.subscribe();
        tokio::select! {
            r = pos.wait_for(|x| x.flushed > before) => { r.unwrap(); }
            r = &mut waiting => panic!("acknowledged after a reload dropped the chosen standby: {r:?}"),
        }
        // Durable locally; give a wrongly released answer the time to arrive first.
        let status = p
            .supervisor
            .send(supervisor_actor::GetNodeStatus)
            .await
            .unwrap()
            .unwrap();
        assert!(status.flush_lsn > before);
        tokio::select! {
            biased;
            r = &mut waiting => panic!("acknowledged after a reload dropped the chosen standby: {r:?}"),
            () = std::future::ready(()) => {}
        }
        drop(waiting);
        stop(p).await;
    });
}
