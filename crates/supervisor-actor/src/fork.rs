//! Following a leader whose history forked from this node's: where the fork is, and cutting
//! this node's WAL back to it. Shared by a live demotion ([`crate::FollowLeader`]) and the
//! offline `walserver rejoin`.
//!
//! The leader's history names, for each timeline it descends from, where it switched away.
//! If this node's timeline is one of them, the leader's WAL is this node's up to that switch
//! point and differs after it: WAL here beyond it was never the leader's and is dropped. If
//! the leader is on this node's own timeline, nothing forked. Anything else (another cluster,
//! a timeline the leader never descended from) is refused: no WAL is dropped on a guess.

use serde::Serialize;
use wal_storage::{departs_from, describe_line, Lsn, TimelineId, Wal};
use walreceiver_actor::UpstreamIdentity;

use crate::error::FollowError;

/// Where following the leader cuts this node's WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ForkPoint {
    /// Where the leader's history switched away from this node's timeline, if it did.
    pub fork: Option<Lsn>,
    /// This node's timeline and its durable end when asked.
    pub timeline: TimelineId,
    pub local_end: Lsn,
}

impl ForkPoint {
    /// Whether WAL must be dropped: this node holds WAL beyond the fork.
    pub fn must_cut(&self) -> bool {
        self.fork.is_some_and(|f| self.local_end > f)
    }

    /// Bytes beyond the fork.
    pub fn divergent_bytes(&self) -> u64 {
        match self.fork {
            Some(f) if self.local_end > f => self.local_end.0 - f.0,
            _ => 0,
        }
    }
}

/// Where the leader's history (`upstream`) forked from this node's WAL (`wal`), after
/// checking that the leader is of the same cluster and descends from this node's timeline.
pub fn fork_point(wal: &Wal, upstream: &UpstreamIdentity) -> Result<ForkPoint, FollowError> {
    if wal.system_id() != upstream.system_id {
        return Err(FollowError::OtherCluster {
            upstream: upstream.system_id.to_string(),
            local: wal.system_id().to_string(),
        });
    }
    let timeline = wal.timeline();
    let fork = upstream
        .history
        .iter()
        .find(|e| e.parent == timeline)
        .map(|e| e.switch_lsn);
    if fork.is_none() && upstream.timeline != timeline {
        return Err(FollowError::NotInHistory {
            local: timeline,
            upstream: upstream.timeline,
        });
    }
    let own = wal.history();
    if let Some(i) = departs_from(&own, &upstream.history) {
        return Err(FollowError::TimelineClash {
            local: timeline,
            detail: format!(
                "this node's history says {}, the leader's {}",
                describe_line(own.get(i)),
                describe_line(upstream.history.get(i))
            ),
        });
    }
    Ok(ForkPoint {
        fork,
        timeline,
        local_end: wal.flushed(),
    })
}

/// Whether following a leader whose history forked from this node's at `fork` would cut
/// below the commit point `told` this node was told (as storage publishes it). Refused where
/// the leader was chosen to hold everything acknowledged (`synchronous`): it then does not,
/// and this node may hold the only copy. Elsewhere (an asynchronous failover) losing
/// acknowledged WAL to a leader that lagged is the configured trade, bounded by
/// `maximum_lag_on_failover`, so the cut goes on. Refused even when nothing here lies past
/// the fork: readers here may already see up to `told`, which the leader's history lacks.
pub fn forks_below_commit_point(fork: Option<Lsn>, told: Option<Lsn>, synchronous: bool) -> bool {
    synchronous && matches!((fork, told), (Some(f), Some(c)) if f < c)
}

/// What [`cut_back_to_fork`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CutBack {
    pub point: ForkPoint,
    /// Bytes of WAL beyond the fork that were dropped (0 when nothing forked).
    pub dropped_bytes: u64,
}

/// Drops this node's WAL beyond the point where `upstream`'s history forked from it, durably
/// ([`Wal::truncate_beyond`]), and lowers a told commit point above the fork to the fork,
/// also when nothing lies beyond it: readers here then stop at the fork until the leader
/// tells a point of its own. Blocks on storage's thread: call it from a blocking thread.
/// Nobody may be reading the WAL beyond the fork (see [`Wal::truncate_to`]).
///
/// Whether anything lies beyond the fork is storage's decision, not [`ForkPoint::must_cut`]'s:
/// a walreceiver stopped a moment ago may have writes still landing, and a cut decided from
/// the flushed end read before they did left their tail in place, past the leader's fork.
pub fn cut_back_to_fork(wal: &Wal, upstream: &UpstreamIdentity) -> Result<CutBack, FollowError> {
    let point = fork_point(wal, upstream)?;
    let dropped_bytes = match point.fork {
        Some(fork) => {
            let dropped = wal.truncate_beyond(fork)?;
            if dropped > 0 {
                tracing::warn!(
                    timeline = %point.timeline,
                    %fork,
                    local_end = %(fork + dropped),
                    dropped_bytes = dropped,
                    "dropped this node's WAL beyond the fork from the leader's history"
                );
            }
            dropped
        }
        None => 0,
    };
    Ok(CutBack {
        point,
        dropped_bytes,
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use wal_storage::{HistoryEntry, InitOptions, StorageConfig, SystemId, TimelineId, WalFormat};

    use super::*;

    /// A primary of system 7 with 1 MiB segments.
    fn primary(dir: &std::path::Path) -> Wal {
        let cfg = StorageConfig {
            segment_size: 1 << 20,
            ..StorageConfig::default()
        };
        let opts = InitOptions::primary(SystemId(7), WalFormat::Walserver);
        Wal::init(dir, cfg, opts).expect("init")
    }

    /// A leader of system 7 on `timeline`, which switched from timeline `parent` at
    /// `switch` for `reason`.
    fn leader(
        timeline: TimelineId,
        parent: TimelineId,
        switch: Lsn,
        reason: &str,
    ) -> UpstreamIdentity {
        UpstreamIdentity {
            system_id: SystemId(7),
            timeline,
            xlogpos: switch,
            segment_size: 1 << 20,
            format: WalFormat::Walserver,
            server_version: String::new(),
            history_files: Vec::new(),
            history: vec![HistoryEntry {
                parent,
                switch_lsn: switch,
                reason: reason.into(),
            }],
            slot_restart: None,
        }
    }

    /// A write queued before the cut (a stopped walreceiver's last one, still landing) is cut
    /// with the rest: the flushed end read before it landed says there is nothing to cut.
    #[test]
    fn a_fork_below_the_told_commit_point_is_refused_only_in_a_synchronous_mode() {
        let (f, c) = (Some(Lsn(100)), Some(Lsn(150)));
        assert!(forks_below_commit_point(f, c, true));
        assert!(
            !forks_below_commit_point(f, c, false),
            "the trade of an asynchronous mode"
        );
        assert!(
            !forks_below_commit_point(f, Some(Lsn(100)), true),
            "to C itself"
        );
        assert!(!forks_below_commit_point(f, None, true), "told nothing");
        assert!(!forks_below_commit_point(None, c, true), "no fork");
    }

    /// A node that began its own timeline 2 is not cut to a leader's timeline 2 made apart,
    /// even at the same switch point; the leader's own timeline 2 is followed.
    #[test]
    fn a_leader_on_a_timeline_of_this_node_s_number_made_apart_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal = primary(dir.path());
        let (tli, switch) = wal.promote("restarted after early sends").expect("promote");
        wal.append(vec![Bytes::from(vec![1u8; 512])])
            .expect("append")
            .wait()
            .expect("durable");
        let leader = |reason: &str| leader(tli, TimelineId(1), switch, reason);
        let end = wal.flushed();
        match cut_back_to_fork(&wal, &leader("promoted by walserver at another moment")) {
            Err(FollowError::TimelineClash { local, detail }) => {
                assert_eq!(local, tli);
                assert!(
                    detail.contains("restarted after early sends at "),
                    "{detail}"
                );
            }
            other => panic!("expected a clash, got {other:?}"),
        }
        assert_eq!(wal.flushed(), end, "nothing was cut");
        let own = wal.history();
        let same = leader(&own[0].reason);
        let cut = cut_back_to_fork(&wal, &same).expect("the same timeline");
        assert_eq!((cut.point.fork, cut.dropped_bytes), (None, 0));
    }

    #[test]
    fn a_write_still_landing_is_cut_back_to_the_fork() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal = primary(dir.path());
        let fork = wal.flushed();
        let leader = leader(
            TimelineId(2),
            wal.timeline(),
            fork,
            "the leader's promotion",
        );
        for round in 0..20 {
            let landing = wal
                .append(vec![Bytes::from(vec![round as u8; 512])])
                .expect("append");
            let cut = cut_back_to_fork(&wal, &leader).expect("cut");
            assert!(cut.dropped_bytes > 0, "round {round}: {cut:?}");
            assert_eq!(wal.flushed(), fork, "round {round}");
            // The append itself was durable before the cut took it back.
            landing.wait().expect("the append");
        }
    }
}
