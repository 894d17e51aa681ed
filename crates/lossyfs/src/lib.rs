//! A file system that loses what was not fsynced, for tests that pull a whole node's plug.
//!
//! [`LossyFs::mount`] serves a backing directory at a mount point through FUSE, as a plain
//! passthrough: every write, creation, rename, link, removal and truncation is done on the
//! backing directory at once. Beside it the file system keeps what a power loss could take
//! back: the changes of each file since its last fsync or fdatasync, and the entry changes of
//! each directory since its last fsync. [`LossyFs::crash`] is the power loss: it unmounts,
//! rewrites the backing directory into a state a power loss chosen by a seed could have left
//! (what was synced, plus an arbitrary prefix of the rest, torn at any byte; `model.rs` writes
//! the model out: its directory part is `powerloss-model`'s, the same as wal-storage's
//! in-process recorder's), and mounts that state again.
//! The same seed over the same operations gives the same state, so a failing seed replays.
//! [`LossyFs::crash_to_synced`] is the worst case no seed is sure to choose: everything not
//! synced is lost, for a scenario that must count on losing it.
//! A power loss is worth landing only when something is at stake: an [`UnsyncedWatch`] blocks
//! until one of its mounts holds an unsynced change of a file, woken by the request that
//! records it, with a deadline; [`LossyFs::hold_syncs`] keeps every sync waiting meanwhile,
//! until the plug is pulled or the [`SyncHold`] it returns is dropped (so that a scenario
//! that fails while holding them can still kill its nodes).
//!
//! Each mount can also be a disk of its own: [`Options::sync_latency`] is added to every
//! fsync and fdatasync (1 ms is what a network-attached cloud volume takes; changed while it
//! serves by [`LossyFs::set_sync_latency`]), while writes and
//! reads go at the page cache's speed; what a sync covers becomes durable only when the
//! latency has passed, so a power loss during it loses that. The backing files themselves
//! are never synced.
//!
//! It runs as root (mounting FUSE by mount(2), with no fusermount) and is test
//! infrastructure: the `walserver` binary does not link it. A mount is always unmounted: by
//! [`LossyFs::unmount`], by `Drop` (lazily, so that a mount still in use cannot stay behind
//! a failed test), and a mount whose process died is swept by the next mount. The
//! `lossyfs` program mounts one from a shell script until it is sent SIGTERM or SIGINT.

mod fs;
mod model;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

pub use model::{CrashReport, GRAVEYARD};

use fs::{LossyFilesystem, State, SyncGate, SyncLatency, Syncs, Waiter};
use model::Model;

/// What can go wrong with a mount.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("mounting {path} failed: {source} (lossyfs mounts FUSE itself and must run as root; /dev/fuse must exist)")]
    Mount { path: PathBuf, source: io::Error },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    /// The mount's requests did not end after it was unmounted: something still uses it.
    #[error("{path} is still in use {waited:?} after it was unmounted; stop what uses it before a crash")]
    Busy { path: PathBuf, waited: Duration },
    #[error("{0} is not mounted")]
    NotMounted(PathBuf),
}

pub type Result<T> = std::result::Result<T, Error>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// How a mount behaves.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Added to every fsync and fdatasync before it answers: the device's flush time.
    pub sync_latency: Duration,
}

/// `d` in whole microseconds, as the mount keeps its sync latency (saturating: a latency
/// of half a million years is as good as forever).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Threads that serve the kernel's requests. A guess: enough that a few fsyncs waiting out
/// the device's latency do not hold up the reads and writes of other threads of the node.
const THREADS: usize = 8;

/// How long an unmount waits for the requests in flight to end. A guess, far above any
/// request's time; past it something still holds files open.
const UNMOUNT_WAIT: Duration = Duration::from_secs(5);

/// How long a drop waits for the session to end: a drop may run while a failing test still
/// holds files open, and must not make the failure slow.
const DROP_WAIT: Duration = Duration::from_millis(200);

/// The source name of this crate's mounts in /proc/mounts: `lossyfs-<pid>`.
const SOURCE: &str = "lossyfs-";

/// One mounted lossy file system.
pub struct LossyFs {
    backing: PathBuf,
    mountpoint: PathBuf,
    options: Options,
    /// The requests' shared state, while no session holds it, it is this handle's alone.
    state: Option<Arc<Mutex<State>>>,
    /// Told when the session serving the mount ends.
    session: Option<mpsc::Receiver<io::Result<()>>>,
    /// The mount's device, whose FUSE connection an unmount aborts if its requests hang.
    dev: u64,
    gate: SyncGate,
    /// [`Options::sync_latency`] as it is now ([`LossyFs::set_sync_latency`]).
    sync_latency: SyncLatency,
}

impl std::fmt::Debug for LossyFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossyFs")
            .field("backing", &self.backing)
            .field("mountpoint", &self.mountpoint)
            .field("options", &self.options)
            .field("mounted", &self.session.is_some())
            .finish()
    }
}

impl LossyFs {
    /// Mounts `backing` at `mountpoint` (both existing directories); what `backing` holds now
    /// counts as durable.
    pub fn mount(backing: &Path, mountpoint: &Path, options: Options) -> Result<LossyFs> {
        sweep_stale();
        let model = Model::load(backing).map_err(io_err(format!(
            "read the backing directory {}",
            backing.display()
        )))?;
        let state = State::new(model).map_err(io_err("stat the backing root"))?;
        let mut fs = LossyFs {
            backing: backing.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            options: options.clone(),
            state: Some(Arc::new(Mutex::new(state))),
            session: None,
            dev: 0,
            gate: Arc::new((Mutex::new(Syncs::Run), std::sync::Condvar::new())),
            sync_latency: Arc::new(AtomicU64::new(micros(options.sync_latency))),
        };
        fs.start()?;
        Ok(fs)
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// Makes every sync from now on take `latency` ([`Options::sync_latency`]), also after a
    /// crash: a scenario whose nodes change roles gives the slow disk to whichever node it
    /// wants slow now.
    pub fn set_sync_latency(&self, latency: Duration) {
        self.sync_latency.store(micros(latency), Ordering::Relaxed);
    }

    fn start(&mut self) -> Result<()> {
        let state = self
            .state
            .clone()
            .ok_or_else(|| Error::NotMounted(self.mountpoint.clone()))?;
        let filesystem = LossyFilesystem {
            state,
            sync_latency: self.sync_latency.clone(),
            gate: self.gate.clone(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName(format!("{SOURCE}{}", std::process::id())),
            fuser::MountOption::Subtype("lossyfs".into()),
            fuser::MountOption::DefaultPermissions,
        ];
        // Nodes run as other users than the mount (PostgreSQL as postgres).
        config.acl = fuser::SessionACL::All;
        config.n_threads = Some(THREADS);
        let session =
            fuser::Session::new(filesystem, &self.mountpoint, &config).map_err(|source| {
                Error::Mount {
                    path: self.mountpoint.clone(),
                    source,
                }
            })?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("lossyfs".into())
            .spawn(move || {
                let _ = tx.send(session.run());
            })
            .map_err(io_err("start the file system's thread"))?;
        self.session = Some(rx);
        // Only now: a stat of the mount is a request the session must answer.
        self.dev = std::fs::metadata(&self.mountpoint)
            .map_err(io_err("stat the mount"))?
            .dev();
        Ok(())
    }

    /// Unmounts (lazily: the name goes at once) and waits up to `wait` for the session to
    /// end.
    fn stop(&mut self, wait: Duration) -> Result<()> {
        let Some(done) = self.session.take() else {
            return Ok(());
        };
        detach(&self.mountpoint);
        let ended = match done.recv_timeout(wait) {
            Ok(_) | Err(mpsc::RecvTimeoutError::Disconnected) => true,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Open files keep a detached mount's connection alive; aborting it (where
                // fusectl is mounted) fails their requests and ends the session.
                abort_connection(self.dev);
                done.recv_timeout(wait).is_ok()
            }
        };
        if ended {
            Ok(())
        } else {
            Err(Error::Busy {
                path: self.mountpoint.clone(),
                waited: wait * 2,
            })
        }
    }

    /// From now on every fsync and fdatasync waits, until [`LossyFs::pull_plug`] or the next
    /// [`LossyFs::crash`] fails them without making anything durable: the moment between a
    /// write and its sync, held open so that a power loss can be made to land in it. If
    /// neither comes first, dropping the returned [`SyncHold`] lets them run: a process with
    /// a thread in a held sync cannot be killed, so a scenario that gives up while it holds
    /// them (a wait that failed, a panic) must not leave them held for its teardown.
    pub fn hold_syncs(&self) -> SyncHold {
        let hold = Syncs::Hold(HOLDS.fetch_add(1, Ordering::Relaxed));
        self.set_syncs(hold);
        SyncHold {
            gate: self.gate.clone(),
            hold,
        }
    }

    /// Pulls the plug without the crash yet: every fsync (also one held) and every change
    /// from now on fails with EIO and reaches nothing. What uses the mount can then be
    /// stopped, which a held fsync would prevent, before [`LossyFs::crash`] decides what of the
    /// unsynced changes survived.
    pub fn pull_plug(&self) {
        self.set_syncs(Syncs::Fail);
    }

    fn set_syncs(&self, to: Syncs) {
        let (lock, cv) = &*self.gate;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = to;
        cv.notify_all();
    }

    /// How many writes and size changes of files are not synced yet (to wait for the first,
    /// an [`UnsyncedWatch`]).
    pub fn unsynced_changes(&self) -> usize {
        self.state.as_ref().map_or(0, |s| lock(s).unsynced())
    }

    /// Pulls the plug: unmounts, rewrites the backing directory into the state a power loss
    /// chosen by `seed` leaves, and mounts that state again. Whatever used the mount must
    /// have stopped (a process killed, its files closed) before.
    pub fn crash(&mut self, seed: u64) -> Result<CrashReport> {
        self.power_loss(Some(seed))
    }

    /// [`LossyFs::crash`] at its worst: every write and entry change not synced is lost, none
    /// kept torn, so that a scenario can count on losing what it has not synced.
    pub fn crash_to_synced(&mut self) -> Result<CrashReport> {
        self.power_loss(None)
    }

    fn power_loss(&mut self, seed: Option<u64>) -> Result<CrashReport> {
        self.set_syncs(Syncs::Fail);
        self.stop(UNMOUNT_WAIT)?;
        self.set_syncs(Syncs::Run);
        let state = self
            .state
            .take()
            .ok_or_else(|| Error::NotMounted(self.mountpoint.clone()))?;
        let state = Arc::try_unwrap(state).map_err(|_| Error::Busy {
            path: self.mountpoint.clone(),
            waited: Duration::ZERO,
        })?;
        let state = state.into_inner().unwrap_or_else(|e| e.into_inner());
        let (model, report) = state
            .model
            .crash(seed)
            .map_err(io_err(format!("crash {}", self.backing.display())))?;
        let state = State::new(model).map_err(io_err("stat the backing root"))?;
        self.state = Some(Arc::new(Mutex::new(state)));
        self.start()?;
        Ok(report)
    }

    /// Unmounts, with everything written kept as it is.
    pub fn unmount(mut self) -> Result<()> {
        self.set_syncs(Syncs::Fail);
        self.stop(UNMOUNT_WAIT)
    }
}

/// A wait for the first unsynced change of a file on any of some mounts. It looks when it is
/// made: a change made after that wakes it, so a test can watch, then cause the change, then
/// wait. It borrows the mounts, so none can crash or unmount while it waits.
pub struct UnsyncedWatch<'a> {
    mounts: Vec<&'a LossyFs>,
    waiter: Arc<Waiter>,
    /// A mount already held an unsynced change when the watch was made.
    held: bool,
}

impl<'a> UnsyncedWatch<'a> {
    pub fn on(mounts: &[&'a LossyFs]) -> UnsyncedWatch<'a> {
        let mut watch = UnsyncedWatch {
            mounts: mounts.to_vec(),
            waiter: Arc::new(Waiter::default()),
            held: false,
        };
        for state in watch.mounts.iter().filter_map(|m| m.state.as_ref()) {
            let mut s = lock(state);
            if s.unsynced() > 0 {
                watch.held = true;
                break;
            }
            s.waiters.push(watch.waiter.clone());
        }
        watch
    }

    /// Waits up to `timeout` until one of the mounts holds an unsynced change of a file;
    /// whether one does.
    pub fn wait(self, timeout: Duration) -> bool {
        self.held || self.waiter.wait(timeout)
    }
}

impl Drop for UnsyncedWatch<'_> {
    fn drop(&mut self) {
        for state in self.mounts.iter().filter_map(|m| m.state.as_ref()) {
            lock(state)
                .waiters
                .retain(|w| !Arc::ptr_eq(w, &self.waiter));
        }
    }
}

/// The numbers of [`LossyFs::hold_syncs`]'s holds, unique in the process.
static HOLDS: AtomicU64 = AtomicU64::new(0);

/// Syncs held by [`LossyFs::hold_syncs`], let run when this is dropped unless the hold has
/// ended already.
#[must_use = "the syncs are held only until the hold is dropped"]
pub struct SyncHold {
    gate: SyncGate,
    hold: Syncs,
}

impl Drop for SyncHold {
    /// Only this hold is ended: a pulled plug or a crash has ended it already (the syncs then
    /// fail, or run on the state after the crash), and a later hold is someone else's.
    fn drop(&mut self) {
        let (lock, cv) = &*self.gate;
        let mut syncs = lock.lock().unwrap_or_else(|e| e.into_inner());
        if *syncs == self.hold {
            *syncs = Syncs::Run;
            cv.notify_all();
        }
    }
}

/// A panic under the state's lock leaves at worst one operation unrecorded (see the file
/// system's own lock).
fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for LossyFs {
    /// The name goes at once; the session is given a moment to end and otherwise ends
    /// by itself when the last file open on it is closed.
    fn drop(&mut self) {
        self.set_syncs(Syncs::Fail);
        let _ = self.stop(DROP_WAIT);
    }
}

fn detach(mountpoint: &Path) {
    if let Ok(c) = CString::new(mountpoint.as_os_str().as_bytes()) {
        // SAFETY: a NUL-terminated path; MNT_DETACH only takes the name away.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Aborts the FUSE connection of device `dev` through fusectl, where it is mounted.
fn abort_connection(dev: u64) {
    let path = format!("/sys/fs/fuse/connections/{}/abort", libc::minor(dev));
    let _ = std::fs::write(path, "1");
}

/// Unmounts the mounts of this crate whose process is gone: a test process that died before
/// its `Drop` ran leaves its mount behind.
fn sweep_stale() {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    for line in mounts.lines() {
        let mut fields = line.split(' ');
        let (Some(source), Some(target)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some(pid) = source.strip_prefix(SOURCE) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            // /proc/mounts writes a space in a path as \040.
            detach(Path::new(&target.replace("\\040", " ")));
        }
    }
}
