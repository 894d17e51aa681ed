//! What the failover actor shows and answers: the cluster as it sees it in etcd, and the
//! members it saw go.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One member as its member key in etcd says (JSON), refreshed by the member itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub name: String,
    /// `primary` or `standby`.
    pub role: String,
    pub timeline: u32,
    /// `X/X`.
    pub flush_lsn: String,
    /// Bytes behind the leader's last published flush position, for a standby.
    pub lag_bytes: Option<u64>,
    /// Whether a standby's walreceiver is streaming.
    pub streaming: bool,
    pub conninfo: String,
    pub api_url: String,
    pub nofailover: bool,
    pub priority: u32,
    /// The term it last followed or led.
    pub term: Option<u64>,
}

/// Who holds the leader key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderView {
    pub name: String,
    /// The leader key's create revision.
    pub term: u64,
    /// The lease's remaining time as etcd reported it, in milliseconds.
    pub lease_remaining_ms: Option<u64>,
    /// The lease is being renewed: etcd reports at least half its ttl left. A leader renews
    /// every third of the ttl, so less than half means at least one renewal missed: the
    /// leader is cut off, stopped or dead, and its key goes when the lease runs out.
    #[serde(default = "yes")]
    pub renewing: bool,
    /// Whether the leader's admin API answered (`GET /primary`, any status) within a
    /// moment when the view was read; `None` if it advertises none.
    #[serde(default)]
    pub api_reachable: Option<bool>,
}

fn yes() -> bool {
    true
}

/// One term in the cluster's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermRecord {
    pub term: u64,
    pub leader: String,
    pub timeline: u32,
    /// `X/X`: where the leader's timeline starts.
    pub switch_lsn: String,
    /// Why: `bootstrap`, `failover`, `switchover`.
    pub reason: String,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

/// `GET /cluster`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterView {
    pub cluster: String,
    pub members: Vec<MemberInfo>,
    pub leader: Option<LeaderView>,
    /// Automatic action is off (`pause`); the leader keeps its key.
    pub paused: bool,
    /// The published synchronous standby, in `synchronous_mode` on or strict.
    pub sync_standby: Option<String>,
    pub synchronous_mode: crate::SynchronousMode,
    pub ttl_seconds: u64,
    pub history: Vec<TermRecord>,
    /// Members whose key went (a lease run out or revoked) while this member watched, for
    /// as long as the leader keeps their slots (`member_slot_grace`): expected back, but
    /// missing. A member that left before this one joined is not among them.
    #[serde(default)]
    pub departed: Vec<DepartedMember>,
    /// The permanent slots, each with the position the leader last wrote (`X/X`; `None`
    /// until a leader has made it).
    #[serde(default)]
    pub permanent_slots: std::collections::BTreeMap<String, Option<String>>,
}

/// A member whose key went, as its key last said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepartedMember {
    pub name: String,
    /// `primary` or `standby`, as its key last said.
    pub role: String,
    pub timeline: u32,
    pub flush_lsn: String,
    pub api_url: String,
    /// When its key went, in seconds since the Unix epoch.
    pub gone_at: u64,
    /// How long ago its key went, in milliseconds.
    pub gone_for_ms: u64,
}

/// The members seen to go, and when, until they come back or have been gone for longer than
/// they are kept.
#[derive(Debug, Default)]
pub(crate) struct Departures(BTreeMap<String, (MemberInfo, Instant, SystemTime)>);

impl Departures {
    /// Notes who went and who came back between `before` and `after`.
    pub(crate) fn note(
        &mut self,
        before: &BTreeMap<String, MemberInfo>,
        after: &BTreeMap<String, MemberInfo>,
        now: Instant,
        wall: SystemTime,
    ) {
        for (name, info) in before {
            if !after.contains_key(name) {
                self.0.insert(name.clone(), (info.clone(), now, wall));
            }
        }
        self.0.retain(|name, _| !after.contains_key(name));
    }

    /// Those gone less than `keep` ago (the others are forgotten), by name.
    pub(crate) fn shown(&mut self, now: Instant, keep: Duration) -> Vec<DepartedMember> {
        self.0
            .retain(|_, (_, at, _)| now.saturating_duration_since(*at) < keep);
        self.0
            .values()
            .map(|(info, at, wall)| DepartedMember {
                name: info.name.clone(),
                role: info.role.clone(),
                timeline: info.timeline,
                flush_lsn: info.flush_lsn.clone(),
                api_url: info.api_url.clone(),
                gone_at: wall.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
                gone_for_ms: u64::try_from(now.saturating_duration_since(*at).as_millis())
                    .unwrap_or(u64::MAX),
            })
            .collect()
    }
}

/// What this node's health endpoints answer from (`GET /primary`, `GET /replica?lag=`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LocalHealth {
    /// This node holds the leader key and its own deadline has not passed.
    pub leader_with_live_lease: bool,
    /// A standby streaming from the leader.
    pub streaming: bool,
    /// Bytes behind the leader's last published position, for a standby.
    pub lag_bytes: Option<u64>,
    pub term: Option<u64>,
    /// Why this node is not a member of its cluster now, if it is not: it then serves as
    /// neither the primary nor a standby of the cluster.
    pub not_member: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> MemberInfo {
        MemberInfo {
            name: name.into(),
            role: "standby".into(),
            timeline: 2,
            flush_lsn: "0/3000000".into(),
            lag_bytes: None,
            streaming: true,
            conninfo: String::new(),
            api_url: format!("http://{name}"),
            nofailover: false,
            priority: 1,
            term: Some(5),
        }
    }

    /// A member whose key goes is shown as departed, with since when, until its key comes
    /// back or it has been gone for `keep`.
    #[test]
    fn departed_members_are_kept_for_a_while() {
        let t0 = Instant::now();
        let w0 = UNIX_EPOCH + Duration::from_secs(1_000);
        let keep = Duration::from_secs(40);
        let all: BTreeMap<_, _> = ["a", "b", "c"]
            .into_iter()
            .map(|n| (n.to_string(), member(n)))
            .collect();
        let mut without_b = all.clone();
        without_b.remove("b");
        let mut d = Departures::default();
        d.note(&all, &without_b, t0, w0);
        let shown = d.shown(t0 + Duration::from_secs(3), keep);
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].name, "b");
        assert_eq!((shown[0].gone_at, shown[0].gone_for_ms), (1_000, 3_000));
        assert_eq!((shown[0].role.as_str(), shown[0].timeline), ("standby", 2));
        // Back: no longer departed.
        d.note(&without_b, &all, t0 + Duration::from_secs(4), w0);
        assert!(d.shown(t0 + Duration::from_secs(5), keep).is_empty());
        // Gone again, and kept only until `keep`.
        d.note(&all, &without_b, t0 + Duration::from_secs(10), w0);
        assert_eq!(d.shown(t0 + Duration::from_secs(49), keep).len(), 1);
        assert!(d.shown(t0 + Duration::from_secs(50), keep).is_empty());
        assert!(d.shown(t0 + Duration::from_secs(51), keep).is_empty());
    }
}
