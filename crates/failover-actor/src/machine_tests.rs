use super::*;

fn config(name: &str) -> FailoverConfig {
    FailoverConfig::new(
        vec!["http://127.0.0.1:2379".into()],
        "c",
        name,
        format!("host=127.0.0.1 port=1 user={name}"),
        "http://127.0.0.1:2",
    )
}

fn member(name: &str) -> MemberInfo {
    MemberInfo {
        name: name.into(),
        role: "standby".into(),
        timeline: 1,
        flush_lsn: "0/0".into(),
        lag_bytes: None,
        streaming: true,
        conninfo: format!("host=h-{name}"),
        api_url: String::new(),
        nofailover: false,
        priority: 1,
        term: None,
    }
}

fn standby(flush: u64) -> Local {
    Local {
        role: LocalRole::Standby,
        timeline: 1,
        flush: Lsn(flush),
        streaming: true,
    }
}

fn primary(flush: u64) -> Local {
    Local {
        role: LocalRole::Primary,
        ..standby(flush)
    }
}

fn with_history() -> Cluster {
    Cluster {
        has_history: true,
        ..Cluster::default()
    }
}

fn key(holder: &str, term: u64, lease: i64) -> Option<LeaderKey> {
    Some(LeaderKey {
        holder: holder.into(),
        term,
        lease,
    })
}

#[test]
fn at_bootstrap_only_the_primary_campaigns() {
    let c = Cluster::default();
    let p = Progress::default();
    assert_eq!(
        decide(&config("a"), &c, &primary(100), &p),
        vec![Action::CheckPeers]
    );
    assert!(matches!(
        decide(&config("b"), &c, &standby(100), &p)[..],
        [Action::Wait(_)]
    ));
}

#[test]
fn winning_the_key_leads_and_a_standby_promotes() {
    let c = Cluster {
        leader: key("a", 7, 42),
        ..with_history()
    };
    let p = Progress {
        lease: Some(42),
        ..Progress::default()
    };
    assert_eq!(
        decide(&config("a"), &c, &standby(0), &p),
        vec![Action::Lead {
            term: 7,
            promote: true
        }]
    );
    assert_eq!(
        decide(&config("a"), &c, &primary(0), &p),
        vec![Action::Lead {
            term: 7,
            promote: false
        }]
    );
    let leading = Progress {
        leading: Some(7),
        ..p
    };
    assert!(decide(&config("a"), &c, &primary(0), &leading).is_empty());
}

#[test]
fn a_key_on_an_earlier_lease_of_ours_is_not_taken_up() {
    let c = Cluster {
        leader: key("a", 7, 41),
        ..with_history()
    };
    let p = Progress {
        lease: Some(42),
        ..Progress::default()
    };
    assert!(matches!(
        decide(&config("a"), &c, &primary(0), &p)[..],
        [Action::Wait(_)]
    ));
}

#[test]
fn another_leader_is_followed_once_and_an_older_term_refused() {
    let mut c = Cluster {
        leader: key("b", 9, 5),
        ..with_history()
    };
    c.members.insert("b".into(), member("b"));
    let p = Progress {
        lease: Some(1),
        ..Progress::default()
    };
    // Not before the leader has taken up its term: its history would not yet hold the fork.
    assert_eq!(
        decide(&config("a"), &c, &standby(0), &p),
        vec![Action::Wait("the leader has not taken up its term yet")]
    );
    c.members.insert(
        "b".into(),
        MemberInfo {
            role: "primary".into(),
            term: Some(9),
            ..member("b")
        },
    );
    let follow = Action::Follow {
        leader: "b".into(),
        conninfo: "host=h-b".into(),
        term: 9,
    };
    assert_eq!(
        decide(&config("a"), &c, &standby(0), &p),
        vec![follow.clone()]
    );
    // A primary that comes back (or lost its key) follows too, fence revoked first.
    let leading = Progress {
        leading: Some(3),
        ..p.clone()
    };
    assert_eq!(
        decide(&config("a"), &c, &primary(0), &leading),
        vec![Action::RevokeFence, follow]
    );
    let following = Progress {
        following: Some(("b".into(), 9)),
        highest_term: 9,
        ..p.clone()
    };
    assert!(decide(&config("a"), &c, &standby(0), &following).is_empty());
    let newer_seen = Progress {
        highest_term: 10,
        ..p
    };
    assert!(matches!(
        decide(&config("a"), &c, &standby(0), &newer_seen)[..],
        [Action::Wait(_)]
    ));
}

#[test]
fn without_the_leaders_member_key_nothing_is_followed() {
    let c = Cluster {
        leader: key("b", 9, 5),
        ..with_history()
    };
    assert!(matches!(
        decide(&config("a"), &c, &standby(0), &Progress::default())[..],
        [Action::Wait(_)]
    ));
}

#[test]
fn a_lost_key_revokes_the_fence_and_pause_stops_campaigns_and_demotion() {
    let mut c = with_history();
    c.paused = true;
    let leading = Progress {
        leading: Some(4),
        ..Progress::default()
    };
    assert!(matches!(
        decide(&config("a"), &c, &primary(0), &leading)[..],
        [Action::RevokeFence, Action::Wait("paused")]
    ));
    c.leader = key("b", 9, 5);
    c.members.insert("b".into(), member("b"));
    assert!(matches!(
        decide(&config("a"), &c, &primary(0), &Progress::default())[..],
        [Action::Wait(_)]
    ));
}

#[test]
fn eligibility_follows_the_configuration_and_the_lag() {
    let mut c = with_history();
    c.last_leader = Some(LeaderPosition {
        name: "b".into(),
        timeline: 1,
        flush: Lsn(10_000_000),
    });
    let mut cfg = config("a");
    assert_eq!(may_campaign(&cfg, &c, &standby(10_000_000 - 10)), Ok(true));
    assert!(
        may_campaign(&cfg, &c, &standby(10)).is_err(),
        "too far behind"
    );
    cfg.maximum_lag_on_failover = u64::MAX;
    assert_eq!(may_campaign(&cfg, &c, &standby(10)), Ok(true));
    cfg.nofailover = true;
    assert!(may_campaign(&cfg, &c, &standby(10_000_000)).is_err());
    cfg.nofailover = false;
    cfg.priority = 0;
    assert!(may_campaign(&cfg, &c, &standby(10_000_000)).is_err());
}

#[test]
fn an_old_primary_on_an_older_timeline_does_not_campaign() {
    let mut c = with_history();
    c.last_leader = Some(LeaderPosition {
        name: "b".into(),
        timeline: 2,
        flush: Lsn(100),
    });
    assert!(may_campaign(&config("a"), &c, &primary(100)).is_err());
    assert_eq!(may_campaign(&config("a"), &c, &standby(100)), Ok(true));
}

#[test]
fn in_synchronous_mode_only_the_published_standby_campaigns() {
    let mut cfg = config("a");
    cfg.synchronous_mode = SynchronousMode::On;
    let mut c = with_history();
    c.sync = Some(SyncRecord {
        leader: "b".into(),
        sync_standby: Some("a".into()),
        term: 3,
    });
    assert_eq!(may_campaign(&cfg, &c, &standby(0)), Ok(false));
    let mut other = cfg.clone();
    other.node_name = "c".into();
    assert!(may_campaign(&other, &c, &standby(u64::MAX)).is_err());
    c.sync = Some(SyncRecord {
        leader: "b".into(),
        sync_standby: None,
        term: 3,
    });
    assert!(may_campaign(&cfg, &c, &standby(0)).is_err());
    // The leader that published it has every acknowledged append.
    let mut old = cfg;
    old.node_name = "b".into();
    assert_eq!(may_campaign(&old, &c, &primary(0)), Ok(false));
}

/// The loss this guards against, seen in the kill -9 scenario: term 3's leader b published a
/// as its synchronous standby; a led term 15 and acknowledged appends; a died. b's record of
/// term 3 must not make b (or a) promotable: only a record of the last term counts.
#[test]
fn a_sync_record_of_an_older_term_makes_nobody_promotable() {
    let mut cfg = config("b");
    cfg.synchronous_mode = SynchronousMode::On;
    let mut c = with_history();
    c.latest_term = 15;
    c.sync = Some(SyncRecord {
        leader: "b".into(),
        sync_standby: Some("c".into()),
        term: 3,
    });
    assert!(may_campaign(&cfg, &c, &standby(u64::MAX)).is_err());
    let mut named = cfg.clone();
    named.node_name = "c".into();
    assert!(may_campaign(&named, &c, &standby(u64::MAX)).is_err());
    // The last term's own record does.
    c.sync = Some(SyncRecord {
        leader: "a".into(),
        sync_standby: Some("c".into()),
        term: 15,
    });
    assert_eq!(may_campaign(&named, &c, &standby(0)), Ok(false));
    assert!(may_campaign(&cfg, &c, &standby(u64::MAX)).is_err());
}

#[test]
fn a_switchover_lets_only_its_candidate_campaign() {
    let mut c = with_history();
    c.switchover = Some(SwitchoverRecord {
        from: "b".into(),
        to: "a".into(),
        force: false,
    });
    c.last_leader = Some(LeaderPosition {
        name: "b".into(),
        timeline: 1,
        flush: Lsn(u64::MAX),
    });
    assert_eq!(may_campaign(&config("a"), &c, &standby(0)), Ok(false));
    assert!(may_campaign(&config("c"), &c, &standby(u64::MAX)).is_err());
}

fn pos(name: &str, role: LocalRole, timeline: u32, flush: u64, priority: u32) -> PeerPosition {
    PeerPosition {
        name: name.into(),
        role,
        timeline,
        flush: Lsn(flush),
        priority,
        nofailover: false,
    }
}

#[test]
fn the_most_advanced_peer_wins_then_priority_then_name() {
    use LocalRole::*;
    let me = pos("b", Standby, 1, 100, 1);
    assert_eq!(better_peer(&me, &[pos("c", Standby, 1, 99, 9)]), None);
    assert_eq!(better_peer(&me, &[pos("c", Standby, 1, 101, 1)]), Some("c"));
    assert_eq!(better_peer(&me, &[pos("c", Standby, 2, 1, 1)]), Some("c"));
    assert_eq!(better_peer(&me, &[pos("c", Standby, 1, 100, 2)]), Some("c"));
    assert_eq!(better_peer(&me, &[pos("a", Standby, 1, 100, 1)]), Some("a"));
    assert_eq!(better_peer(&me, &[pos("c", Standby, 1, 100, 1)]), None);
    assert_eq!(better_peer(&me, &[pos("z", Primary, 1, 100, 1)]), Some("z"));
    let mut ineligible = pos("c", Standby, 1, 200, 1);
    ineligible.nofailover = true;
    assert_eq!(
        better_peer(&me, &[ineligible, pos("d", Standby, 1, 200, 0)]),
        None
    );
}

#[test]
fn the_fence_closes_a_margin_before_the_lease_can_expire() {
    let sent = Instant::now();
    let ttl = Duration::from_secs(2);
    assert_eq!(
        fence_deadline(sent, ttl),
        sent + Duration::from_millis(1500)
    );
    let ttl = Duration::from_secs(30);
    assert_eq!(fence_deadline(sent, ttl), sent + Duration::from_secs(27));
    assert!(fence_margin(Duration::from_millis(600)) <= Duration::from_millis(300));
    assert_eq!(
        renewal_interval(Duration::from_secs(3)),
        Duration::from_secs(1)
    );
}

#[test]
fn renewal_retries_back_off_to_a_cap() {
    let ttl = Duration::from_secs(10);
    assert_eq!(retry_delay(0, ttl), Duration::from_millis(100));
    assert_eq!(retry_delay(2, ttl), Duration::from_millis(400));
    assert_eq!(retry_delay(30, ttl), Duration::from_secs(1));
}

fn cand(name: &str, connected: bool, flush: u64) -> SyncCandidate {
    SyncCandidate {
        name: name.into(),
        connected,
        flush: Lsn(flush),
        priority: 1,
        nofailover: false,
    }
}

fn names(list: &[&str]) -> Option<SyncStandbyNames> {
    first(list)
}

#[test]
fn a_first_sync_standby_counts_before_it_is_published() {
    let on = SynchronousMode::On;
    let cands = [cand("b", true, 50), cand("c", true, 40)];
    let (phase, actions) = plan_sync(on, &SyncPhase::Steady, None, &cands, Lsn(60));
    assert_eq!(actions, vec![SyncAction::Set(names(&["b"]))]);
    let adding = SyncPhase::Adding {
        to: "b".into(),
        from: None,
        target: Lsn(60),
    };
    assert_eq!(phase, adding);
    // Not caught up: nothing is published yet.
    let (same, none) = plan_sync(on, &phase, None, &cands, Lsn(70));
    assert_eq!((same, none), (adding.clone(), vec![]));
    let caught = [cand("b", true, 60)];
    assert_eq!(
        plan_sync(on, &adding, None, &caught, Lsn(70)),
        (
            SyncPhase::Steady,
            vec![SyncAction::Publish(Some("b".into()))]
        )
    );
}

#[test]
fn replacing_a_sync_standby_counts_both_until_the_new_one_is_published() {
    let on = SynchronousMode::Strict;
    let cands = [cand("a", false, 10), cand("b", true, 50)];
    let (phase, actions) = plan_sync(on, &SyncPhase::Steady, Some("a"), &cands, Lsn(80));
    assert_eq!(actions, vec![SyncAction::Set(names(&["a", "b"]))]);
    let caught = [cand("a", false, 10), cand("b", true, 80)];
    assert_eq!(
        plan_sync(on, &phase, Some("a"), &caught, Lsn(90)).1,
        vec![
            SyncAction::Publish(Some("b".into())),
            SyncAction::Set(names(&["b"]))
        ]
    );
}

#[test]
fn losing_the_only_sync_standby_unpublishes_first_in_on_and_waits_in_strict() {
    let gone = [cand("a", false, 10)];
    assert_eq!(
        plan_sync(
            SynchronousMode::On,
            &SyncPhase::Steady,
            Some("a"),
            &gone,
            Lsn(9)
        )
        .1,
        vec![SyncAction::Publish(None), SyncAction::Set(None)]
    );
    assert!(plan_sync(
        SynchronousMode::Strict,
        &SyncPhase::Steady,
        Some("a"),
        &gone,
        Lsn(9)
    )
    .1
    .is_empty());
    assert!(plan_sync(
        SynchronousMode::Off,
        &SyncPhase::Steady,
        Some("a"),
        &gone,
        Lsn(9)
    )
    .1
    .is_empty());
}

#[test]
fn a_standby_lost_while_being_added_is_dropped_from_the_set() {
    let adding = SyncPhase::Adding {
        to: "b".into(),
        from: Some("a".into()),
        target: Lsn(80),
    };
    let cands = [cand("a", true, 80), cand("b", false, 70)];
    assert_eq!(
        plan_sync(SynchronousMode::Strict, &adding, Some("a"), &cands, Lsn(90)),
        (SyncPhase::Steady, vec![SyncAction::Set(names(&["a"]))])
    );
    let first_one = SyncPhase::Adding {
        to: "b".into(),
        from: None,
        target: Lsn(80),
    };
    let none = [cand("b", false, 70)];
    assert_eq!(
        plan_sync(SynchronousMode::On, &first_one, None, &none, Lsn(90)).1,
        vec![SyncAction::Set(None)]
    );
    assert!(
        plan_sync(SynchronousMode::Strict, &first_one, None, &none, Lsn(90))
            .1
            .is_empty()
    );
}

#[test]
fn the_strict_hold_releases_no_append_whoever_streams() {
    use walsender_actor::syncrep::{decide as sync_decide, StandbyPositions};
    let standby = |pid: u32, name: &str| StandbyPositions {
        pid,
        application_name: name.into(),
        streaming: true,
        write: Lsn(100),
        flush: Lsn(100),
        apply: Lsn(100),
    };
    let streaming = [standby(1, "b"), standby(2, "c"), standby(3, "*")];
    assert!(sync_decide(Some(&strict_hold()), &streaming)
        .positions
        .is_none());
    // The same standbys would release appends under a set that names one of them.
    assert!(sync_decide(names(&["b"]).as_ref(), &streaming)
        .positions
        .is_some());
}

#[test]
fn a_renewal_grants_only_what_its_transaction_confirmed_for_the_term_led() {
    let ttl = Duration::from_secs(10);
    let sent = Instant::now();
    let until = fence_deadline(sent, ttl);
    assert_eq!(
        after_renewal(Some((7, true)), Some(7), false, sent, ttl),
        Renewed::Grant { term: 7, until }
    );
    // The key held, but the actor no longer leads in that term, or a handover began while
    // the renewal ran: nothing is granted.
    assert_eq!(
        after_renewal(Some((7, true)), None, false, sent, ttl),
        Renewed::Nothing
    );
    assert_eq!(
        after_renewal(Some((7, true)), Some(9), false, sent, ttl),
        Renewed::Nothing
    );
    assert_eq!(
        after_renewal(Some((7, true)), Some(7), true, sent, ttl),
        Renewed::Nothing
    );
    // A failed confirmation steps down whatever the actor thinks it leads.
    assert_eq!(
        after_renewal(Some((7, false)), Some(7), false, sent, ttl),
        Renewed::StepDown { term: 7 }
    );
    assert_eq!(
        after_renewal(Some((7, false)), None, true, sent, ttl),
        Renewed::StepDown { term: 7 }
    );
    // A follower's renewal confirms nothing.
    assert_eq!(
        after_renewal(None, Some(7), false, sent, ttl),
        Renewed::Nothing
    );
}

#[test]
fn the_lease_ttl_is_the_lower_of_the_configured_and_the_granted() {
    let ten = Duration::from_secs(10);
    assert_eq!(effective_ttl(ten, 10), ten);
    assert_eq!(effective_ttl(ten, 30), ten);
    assert_eq!(effective_ttl(ten, 4), Duration::from_secs(4));
    // etcd never grants less than a second; a nonsense answer does not make it zero.
    assert_eq!(effective_ttl(ten, 0), Duration::from_secs(1));
    assert_eq!(effective_ttl(ten, -5), Duration::from_secs(1));
}

#[test]
fn the_next_renewal_counts_from_the_last_ones_send_and_comes_sooner_when_asked() {
    let ttl = Duration::from_secs(9);
    assert_eq!(
        next_renewal(ttl, Duration::ZERO, None),
        Duration::from_secs(3)
    );
    assert_eq!(
        next_renewal(ttl, Duration::from_millis(500), None),
        Duration::from_millis(2500)
    );
    assert_eq!(
        next_renewal(ttl, Duration::from_secs(5), None),
        Duration::ZERO
    );
    let soon = Some(Duration::from_millis(50));
    assert_eq!(
        next_renewal(ttl, Duration::ZERO, soon),
        Duration::from_millis(50)
    );
    assert_eq!(
        next_renewal(ttl, Duration::from_secs(5), soon),
        Duration::ZERO
    );
}

#[test]
fn a_campaign_says_why_as_things_stood_before_it() {
    assert_eq!(campaign_reason(&Cluster::default(), "a"), "bootstrap");
    assert_eq!(campaign_reason(&with_history(), "a"), "failover");
    let last = |name: &str| Cluster {
        last_leader: Some(LeaderPosition {
            name: name.into(),
            timeline: 1,
            flush: Lsn(0),
        }),
        ..with_history()
    };
    assert_eq!(campaign_reason(&last("a"), "a"), "restart");
    assert_eq!(campaign_reason(&last("b"), "a"), "failover");
    let handed = Cluster {
        switchover: Some(SwitchoverRecord {
            from: "b".into(),
            to: "a".into(),
            force: false,
        }),
        ..last("a")
    };
    assert_eq!(campaign_reason(&handed, "a"), "switchover");
}

#[test]
fn only_changes_a_decision_reads_call_for_one() {
    let led = Cluster {
        leader: key("a", 5, 1),
        ..with_history()
    };
    for kind in [
        KeyKind::Leader,
        KeyKind::Sync,
        KeyKind::Pause,
        KeyKind::Switchover,
    ] {
        assert!(calls_for_decision(&kind, &led));
    }
    assert!(
        calls_for_decision(&KeyKind::Member("a"), &led),
        "the leader's own member key"
    );
    assert!(
        !calls_for_decision(&KeyKind::Member("b"), &led),
        "a routine refresh"
    );
    assert!(
        calls_for_decision(&KeyKind::Member("b"), &with_history()),
        "with no leader the candidates weigh each other"
    );
    assert!(!calls_for_decision(&KeyKind::History, &with_history()));
    assert!(!calls_for_decision(&KeyKind::Other, &with_history()));
}

#[test]
fn a_switchover_without_a_candidate_picks_the_most_advanced_eligible_standby() {
    let at = |name: &str, flush: &str| MemberInfo {
        flush_lsn: flush.into(),
        ..member(name)
    };
    let mut members: BTreeMap<String, MemberInfo> = [
        at("a", "0/500"),
        at("b", "0/300"),
        at("c", "0/400"),
        MemberInfo {
            nofailover: true,
            ..at("d", "0/900")
        },
        MemberInfo {
            streaming: false,
            ..at("e", "0/800")
        },
        at("f", "not an lsn"),
    ]
    .into_iter()
    .map(|m| (m.name.clone(), m))
    .collect();
    if let Some(a) = members.get_mut("a") {
        a.role = "primary".into();
    }
    assert_eq!(switchover_candidate(&members, "a").as_deref(), Some("c"));
    assert_eq!(switchover_candidate(&members, "c").as_deref(), Some("b"));
    members.retain(|name, _| name == "a" || name == "d");
    assert_eq!(switchover_candidate(&members, "a"), None);
}

fn sender(name: &str, state: WalSenderState, flush: Option<u64>) -> WalSenderStatus {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
    let mut status = WalSenderStatus::new(1, "u", name, addr);
    status.state = state;
    status.flush_lsn = flush.map(Lsn);
    status
}

#[test]
fn walsenders_are_sync_candidates_by_their_member_keys() {
    let members: BTreeMap<String, MemberInfo> = [
        member("b"),
        MemberInfo {
            priority: 3,
            ..member("c")
        },
    ]
    .into_iter()
    .map(|m| (m.name.clone(), m))
    .collect();
    let replication = [
        sender("b", WalSenderState::Catchup, Some(40)),
        sender("c", WalSenderState::Startup, None),
        sender("x", WalSenderState::Streaming, Some(90)),
    ];
    let candidates = sync_candidates(&replication, &members);
    assert_eq!(
        candidates,
        vec![
            // Catching up counts as connected: choosing it is loss-free.
            cand("b", true, 40),
            SyncCandidate {
                priority: 3,
                ..cand("c", false, 0)
            },
            // A walsender with no member key is never chosen.
            SyncCandidate {
                priority: 0,
                nofailover: true,
                ..cand("x", true, 90)
            },
        ]
    );
    assert_eq!(
        best_sync_candidate(&candidates, None).map(|c| c.name.as_str()),
        Some("b")
    );
}

#[test]
fn a_young_hold_keeps_appends_waiting_and_looks_again_soon() {
    let ttl = Duration::from_secs(3);
    let young = Some(Duration::from_millis(100));
    let held = hold_for_sync(
        SynchronousMode::On,
        &SyncPhase::Steady,
        vec![SyncAction::Set(None)],
        young,
        ttl,
    );
    assert_eq!(held.actions, vec![SyncAction::Set(Some(strict_hold()))]);
    assert!(held.recheck_soon && !held.gave_up && !held.releases_hold);
    // Nothing to do while young: no give-up yet.
    let waiting = hold_for_sync(SynchronousMode::On, &SyncPhase::Steady, vec![], young, ttl);
    assert!(waiting.actions.is_empty() && waiting.recheck_soon && !waiting.gave_up);
}

#[test]
fn an_old_hold_gives_up_in_on_and_waits_on_in_strict() {
    let ttl = Duration::from_secs(3);
    let old = Some(Duration::from_secs(1));
    let on = hold_for_sync(SynchronousMode::On, &SyncPhase::Steady, vec![], old, ttl);
    assert_eq!(on.actions, vec![SyncAction::Set(None)]);
    assert!(on.gave_up && on.releases_hold && !on.recheck_soon);
    let strict = hold_for_sync(
        SynchronousMode::Strict,
        &SyncPhase::Steady,
        vec![],
        old,
        ttl,
    );
    assert!(strict.actions.is_empty() && !strict.gave_up && !strict.releases_hold);
    // A standby being added is waited for, even in `on`.
    let adding = SyncPhase::Adding {
        to: "b".into(),
        from: None,
        target: Lsn(5),
    };
    let on_adding = hold_for_sync(SynchronousMode::On, &adding, vec![], old, ttl);
    assert!(on_adding.actions.is_empty() && !on_adding.gave_up);
    // Without a hold the plan goes through as it is.
    let none = hold_for_sync(
        SynchronousMode::On,
        &SyncPhase::Steady,
        vec![SyncAction::Set(None)],
        None,
        ttl,
    );
    assert_eq!(none.actions, vec![SyncAction::Set(None)]);
    assert!(!none.recheck_soon && !none.releases_hold);
}

#[test]
fn the_hold_ends_when_a_standby_of_the_term_is_published() {
    let ttl = Duration::from_secs(3);
    let publish = vec![SyncAction::Publish(Some("b".into()))];
    for held_for in [
        Some(Duration::from_millis(10)),
        Some(Duration::from_secs(9)),
    ] {
        let round = hold_for_sync(
            SynchronousMode::Strict,
            &SyncPhase::Steady,
            publish.clone(),
            held_for,
            ttl,
        );
        assert_eq!(round.actions, publish);
        assert!(round.releases_hold);
    }
    let unpublish = hold_for_sync(
        SynchronousMode::Strict,
        &SyncPhase::Steady,
        vec![SyncAction::Publish(None)],
        Some(Duration::from_secs(9)),
        ttl,
    );
    assert!(!unpublish.releases_hold);
}

fn members(names: &[&str]) -> BTreeMap<String, MemberInfo> {
    names.iter().map(|n| (n.to_string(), member(n))).collect()
}

fn slots(names: &[&str]) -> Vec<String> {
    names.iter().filter_map(|n| member_slot_name(n)).collect()
}

#[test]
fn a_leader_holds_a_slot_for_every_other_member_and_a_departed_one_for_the_grace() {
    let grace = Duration::from_secs(30);
    let t0 = Instant::now();
    let mut absences = SlotAbsences::default();
    let all = members(&["a", "b", "c"]);
    assert!(absences.note_members(&BTreeSet::new(), &all, t0));
    assert_eq!(absences.wanted(&all, "a", grace, t0), slots(&["b", "c"]));
    // `c`'s key goes: its slot stays wanted until the grace ends.
    let left = members(&["a", "b"]);
    let before: BTreeSet<String> = all.keys().cloned().collect();
    assert!(absences.note_members(&before, &left, t0));
    let later = t0 + grace - Duration::from_millis(1);
    assert_eq!(
        absences.wanted(&left, "a", grace, later),
        slots(&["b", "c"])
    );
    // Only a slot actually held needs a look when its grace ends.
    assert_eq!(absences.next_expiry(&slots(&["b"]), grace, t0), None);
    assert_eq!(
        absences.next_expiry(&slots(&["b", "c"]), grace, t0),
        Some(grace)
    );
    assert_eq!(
        absences.wanted(&left, "a", grace, t0 + grace),
        slots(&["b"])
    );
    // A routine refresh changes nothing; `c` coming back ends its absence.
    let now: BTreeSet<String> = left.keys().cloned().collect();
    assert!(!absences.note_members(&now, &left, t0 + grace));
    assert!(absences.note_members(&now, &all, t0 + grace));
    assert_eq!(
        absences.wanted(&all, "a", grace, t0 + grace * 2),
        slots(&["b", "c"])
    );
}

#[test]
fn a_departed_member_s_slot_expires_at_the_grace_and_the_leader_s_own_at_once() {
    let grace = Duration::from_secs(30);
    let t0 = Instant::now();
    let mut absences = SlotAbsences::default();
    let all = members(&["a", "b", "c"]);
    let before: BTreeSet<String> = all.keys().cloned().collect();
    let left = members(&["a", "b"]);
    absences.note_members(&before, &left, t0);
    let held = slots(&["a", "b", "c"]);
    // The leader's own slot goes at once; `c`'s only once the grace is over.
    assert_eq!(
        absences.expired(&held, &left, "a", grace, t0),
        slots(&["a"])
    );
    assert_eq!(
        absences.next_expiry(&held, grace, t0 + Duration::from_secs(10)),
        Some(Duration::from_secs(20))
    );
    let just_before = t0 + grace - Duration::from_millis(1);
    assert_eq!(
        absences.expired(&held, &left, "a", grace, just_before),
        slots(&["a"])
    );
    assert_eq!(
        absences.expired(&held, &left, "a", grace, t0 + grace),
        slots(&["a", "c"])
    );
    // Dropped, and past its grace: its absence is forgotten.
    let still = slots(&["b"]);
    assert!(absences
        .expired(&still, &left, "a", grace, t0 + grace)
        .is_empty());
    assert_eq!(absences.next_expiry(&held, grace, t0 + grace), None);
}

#[test]
fn a_held_slot_of_a_member_never_seen_counts_its_absence_from_when_it_is_seen() {
    let grace = Duration::from_secs(30);
    let t0 = Instant::now();
    let mut absences = SlotAbsences::default();
    let here = members(&["a", "b"]);
    let held = slots(&["b", "z"]);
    // A restarted leader finds `z`'s slot with no member: it is kept for a grace from now.
    assert!(absences.expired(&held, &here, "a", grace, t0).is_empty());
    assert_eq!(absences.wanted(&here, "a", grace, t0), slots(&["b", "z"]));
    assert_eq!(absences.next_expiry(&held, grace, t0), Some(grace));
    let late = t0 + grace + Duration::from_secs(5);
    assert_eq!(
        absences.expired(&held, &here, "a", grace, late),
        slots(&["z"])
    );
}

/// A lease renewed every third of its ttl shows as renewing between renewals; one whose
/// holder has missed renewals for more than a renewal interval and a second does not.
#[test]
fn a_lease_without_renewals_shows_as_running_out() {
    // etcd reports whole seconds, rounded up. ttl 10: renewed every 3.3 s, so at least 7 left.
    assert!(lease_renewing(10, 10));
    assert!(lease_renewing(7, 10));
    assert!(lease_renewing(6, 10));
    assert!(!lease_renewing(5, 10));
    assert!(!lease_renewing(0, 10));
    // ttl 4: renewed every 1.3 s, so at least 3 left.
    assert!(lease_renewing(3, 4));
    assert!(lease_renewing(2, 4));
    assert!(!lease_renewing(1, 4));
}
