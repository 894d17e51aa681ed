//! What the power-loss scenarios share: a data directory on a `lossyfs` mount of its own, the
//! commit rule a scenario runs under, and a power loss of some nodes at once, landed while a
//! write waits for its sync.

use std::path::Path;
use std::time::Duration;

use lossyfs::{LossyFs, Options, SyncHold, UnsyncedWatch};

use crate::node::*;
use crate::Rng;

/// The commit rule the nodes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// The primary flushes, then sends: a standby never holds WAL its primary lacks.
    Off,
    /// The overlapped commit on every node (`synchronous_commit_overlap`): the primary sends
    /// what it has written while its fdatasync runs, a standby (whose walreceiver then asks
    /// for such WAL) cuts back an unacknowledged tail at stream start, and a primary starts a
    /// new timeline at a start (or term) after it sent early.
    On,
}

impl Overlap {
    /// The settings of every node: the standbys too, since a standby cuts back an
    /// unacknowledged tail only with the switch on.
    pub fn settings(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Overlap::Off => vec![("synchronous_commit_overlap", "false")],
            Overlap::On => vec![("synchronous_commit_overlap", "true")],
        }
    }
}

/// The primary's mount takes this long for each sync where a scenario wants the standby's
/// flush of a batch sent early to return before the primary's own (the standby's mount takes
/// none): without it that moment is seldom reached. A guess, a few times a local flush.
pub const PRIMARY_SYNC_LATENCY: Duration = Duration::from_millis(20);

/// One power-loss scenario at a time: each runs its nodes and sixteen writers on two shared
/// cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A lossy mount at `dir/NAME.mnt` over `dir/NAME.backing`; the node's data directory is
/// `data` inside it.
pub fn disk(dir: &Path, name: &str, options: Options) -> LossyFs {
    let backing = dir.join(format!("{name}.backing"));
    let mnt = dir.join(format!("{name}.mnt"));
    std::fs::create_dir(&backing).expect("the backing directory");
    std::fs::create_dir(&mnt).expect("the mount point");
    let fs = LossyFs::mount(&backing, &mnt, options)
        .unwrap_or_else(|e| panic!("{e} (the power-loss scenarios mount FUSE: run them as root)"));
    // The data directory is made here and its entry synced, so that a power loss before the
    // first start is not what these scenarios are about.
    std::fs::create_dir(mnt.join("data")).expect("the data directory");
    std::fs::File::open(&mnt)
        .and_then(|d| d.sync_all())
        .expect("sync the mount's root");
    fs
}

/// Node `name` with its data directory `data` on `mount` (made there by [`disk`]), under
/// `settings` and `overlap`'s, not started. Its log is `dir/NAME.log`, outside the mount: a
/// crash must not take what explains it.
pub fn node_on(
    dir: &Path,
    mount: &LossyFs,
    name: &str,
    settings: &[(&str, &str)],
    overlap: Overlap,
) -> ChildNode {
    let mut settings = settings.to_vec();
    settings.extend(overlap.settings());
    child_node(name, &mount.mountpoint().join("data"), &settings)
        .with_log(&dir.join(format!("{name}.log")))
}

/// What one power loss took.
#[derive(Debug, Default)]
pub struct Outage {
    /// Unsynced writes the victims held when the power went, and how many of them were lost.
    pub at_risk: usize,
    pub lost: usize,
}

/// Pulls the plug of the nodes `hit` (indices into `nodes` and `mounts`) at once, each crash
/// chosen by a seed from `rng`: their syncs are held until one of them has written something
/// it has not synced (a node under load is always appending), then all go down before any
/// comes back. Nothing is started again. A power loss with nothing unsynced would prove
/// nothing, so that is an error, and the syncs then run again (the holds' drop), so that the
/// failing scenario can kill its nodes.
pub fn pull_plugs(
    nodes: &mut [ChildNode],
    mounts: &mut [LossyFs],
    hit: &[usize],
    rng: &mut Rng,
) -> anyhow::Result<Outage> {
    let _held: Vec<SyncHold> = hit.iter().map(|&i| mounts[i].hold_syncs()).collect();
    let victims: Vec<&LossyFs> = hit.iter().map(|&i| &mounts[i]).collect();
    anyhow::ensure!(
        UnsyncedWatch::on(&victims).wait(DEADLINE),
        "timed out after {DEADLINE:?} waiting for a write that waits for its sync"
    );
    power_off(nodes, mounts, hit, Some(rng))
}

/// The power loss itself, for a scenario that has held the victims' syncs
/// ([`LossyFs::hold_syncs`]) and waited for the moment it wants. Each crash is chosen by a
/// seed from `rng`, or without one loses everything unsynced ([`LossyFs::crash_to_synced`]).
pub fn power_off(
    nodes: &mut [ChildNode],
    mounts: &mut [LossyFs],
    hit: &[usize],
    mut rng: Option<&mut Rng>,
) -> anyhow::Result<Outage> {
    // A held fsync keeps the inode locked and a writer of the node in the kernel, where
    // SIGKILL waits: the plug is pulled (the syncs fail) before the kill.
    for &i in hit {
        mounts[i].pull_plug();
    }
    for &i in hit {
        nodes[i].kill9();
    }
    let mut outage = Outage::default();
    // The wait before the power loss is for any unsynced change, a file made or renamed as
    // much as a write, so a loss of only those counts as something at stake too.
    let mut unsynced = 0;
    for &i in hit {
        let crash_seed = rng.as_mut().map(|r| r.next_u64());
        let r = match crash_seed {
            Some(seed) => mounts[i].crash(seed),
            None => mounts[i].crash_to_synced(),
        }
        .map_err(|e| anyhow::anyhow!("crash {}: {e}", nodes[i].name))?;
        println!("{} crashed (seed {crash_seed:?}): {r:?}", nodes[i].name);
        outage.lost += r.writes_lost;
        outage.at_risk += r.writes;
        unsynced += r.writes + r.name_changes;
    }
    anyhow::ensure!(unsynced > 0, "the crash found no unsynced change");
    Ok(outage)
}

/// Waits until `standby` is durable past `primary` on the same timeline, which only WAL sent
/// early gives it, and, with `disk` (the primary's), until that disk also holds an unsynced
/// change; returns the standby's durable end. Their flushes are told only by `/status`, which
/// announces nothing: asked every 2 ms up to the deadline. The standby is asked first: the
/// primary's flushed end only grows, so a standby past the primary's end as it was a moment
/// later holds WAL sent early. Asked the other way round, a flush of the primary's and its
/// ordinary send between the two questions looked the same, and a test that then held the
/// primary's syncs before its early-send mark was durable kept the mark (and every early
/// send) from ever coming.
pub fn standby_past_primary(
    what: &str,
    primary: &ChildNode,
    standby: &ChildNode,
    disk: Option<&LossyFs>,
) -> anyhow::Result<wal_storage::Lsn> {
    wait_for(what, DEADLINE, Duration::from_millis(2), || {
        let s = standby.status().ok()?;
        let p = primary.status().ok()?;
        (disk.is_none_or(|d| d.unsynced_changes() > 0)
            && s.timeline == p.timeline
            && s.flush_lsn > p.flush_lsn)
            .then_some(s.flush_lsn)
    })
}
