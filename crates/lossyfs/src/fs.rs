//! The passthrough file system: every request is done on the backing directory at once and
//! recorded in the [`Model`] under one lock, so the model's order is the order in which the
//! operations happened. Inode numbers are the backing ones (the backing root's is FUSE's root,
//! 1), so a file keeps its number across renames and the graveyard.
//!
//! fsync and fdatasync make the model durable and then wait the mount's sync latency before
//! they answer, outside the lock: the device is slow, not the file system. The backing files
//! themselves are never fsynced; which bytes survive is the model's decision, and the host's
//! own power is not what these tests are about.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::model::{under, Ino, Model, Node, GRAVEYARD};

/// How long the kernel may cache names and attributes. Nothing changes the backing directory
/// behind the mount's back, and a crash remounts, which drops the cache.
const TTL: Duration = Duration::from_secs(1);

/// An open file.
struct Handle {
    file: Arc<File>,
    ino: Ino,
    /// Opened with `O_SYNC` or `O_DSYNC`: each write is also an fdatasync.
    sync_writes: bool,
}

/// What the mount's requests share.
pub(crate) struct State {
    pub(crate) model: Model,
    /// The backing root's inode number, FUSE's inode 1.
    root_ino: Ino,
    /// Where each inode the kernel knows was last seen, relative to the backing root.
    paths: HashMap<Ino, PathBuf>,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    /// Waits for an unsynced change ([`crate::UnsyncedWatch`]), woken by the next one.
    pub(crate) waiters: Vec<Arc<Waiter>>,
}

impl State {
    pub(crate) fn new(model: Model) -> io::Result<State> {
        let root_ino = fs::metadata(model.root())?.ino();
        Ok(State {
            model,
            root_ino,
            paths: HashMap::new(),
            handles: HashMap::new(),
            next_fh: 1,
            waiters: Vec::new(),
        })
    }

    fn backing_ino(&self, ino: INodeNo) -> Ino {
        if ino == INodeNo::ROOT {
            self.root_ino
        } else {
            ino.0
        }
    }

    fn fuse_ino(&self, ino: Ino) -> INodeNo {
        if ino == self.root_ino {
            INodeNo::ROOT
        } else {
            INodeNo(ino)
        }
    }

    /// The relative path of inode `ino`.
    fn rel(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        if ino == INodeNo::ROOT {
            return Ok(PathBuf::new());
        }
        if let Some(p) = self.paths.get(&ino.0) {
            return Ok(p.clone());
        }
        self.model.path_of(ino.0).ok_or(Errno::ENOENT)
    }

    /// The relative path of `name` in directory `parent`; the graveyard is not a name.
    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        if parent == INodeNo::ROOT && name == GRAVEYARD {
            return Err(Errno::EPERM);
        }
        Ok(self.rel(parent)?.join(name))
    }

    fn path(&self, rel: &Path) -> PathBuf {
        self.model.root().join(rel)
    }

    fn attr(&self, meta: &fs::Metadata) -> FileAttr {
        let time = |s: i64, ns: i64| {
            UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
        };
        let kind = if meta.is_dir() {
            FileType::Directory
        } else if meta.file_type().is_symlink() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        FileAttr {
            ino: self.fuse_ino(meta.ino()),
            size: meta.len(),
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (meta.mode() & 0o7777) as u16,
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: meta.blksize() as u32,
            flags: 0,
        }
    }

    /// Looks `rel` up and remembers where its inode is.
    fn entry(&mut self, rel: PathBuf) -> Result<FileAttr, Errno> {
        let meta = fs::symlink_metadata(self.path(&rel)).map_err(errno)?;
        let attr = self.attr(&meta);
        if meta.ino() != self.root_ino {
            self.paths.insert(meta.ino(), rel);
        }
        Ok(attr)
    }

    /// Unsynced changes of files, counted.
    pub(crate) fn unsynced(&self) -> usize {
        self.model.unsynced()
    }

    /// The model may have recorded an unsynced change of a file: wakes who waits for one, if
    /// one is there. Called under the state's lock, as a watch registers under it, so that no
    /// change falls between a watch's look and its wait.
    fn changed(&mut self) {
        if self.model.unsynced() > 0 {
            for w in self.waiters.drain(..) {
                w.wake();
            }
        }
    }

    fn add_handle(&mut self, file: File, ino: Ino, flags: i32) -> FileHandle {
        let fh = self.next_fh;
        self.next_fh += 1;
        let sync_writes = flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
        self.handles.insert(
            fh,
            Handle {
                file: Arc::new(file),
                ino,
                sync_writes,
            },
        );
        FileHandle(fh)
    }

    fn handle(&self, fh: FileHandle) -> Result<&Handle, Errno> {
        self.handles.get(&fh.0).ok_or(Errno::EBADF)
    }

    /// Opens inode `ino` for writing, through `fh` if the kernel gave one.
    fn writable(&self, ino: INodeNo, fh: Option<FileHandle>) -> Result<Arc<File>, Errno> {
        if let Some(h) = fh.and_then(|fh| self.handles.get(&fh.0)) {
            return Ok(h.file.clone());
        }
        let path = self.path(&self.rel(ino)?);
        let f = fs::OpenOptions::new()
            .write(true)
            .read(true)
            .open(path)
            .map_err(errno)?;
        Ok(Arc::new(f))
    }

    /// Makes `rel` owned by the requester, as a kernel file system would have made it.
    fn own(&self, rel: &Path, req: &Request) -> Result<(), Errno> {
        std::os::unix::fs::lchown(self.path(rel), Some(req.uid()), Some(req.gid())).map_err(errno)
    }
}

fn errno(e: io::Error) -> Errno {
    match e.raw_os_error() {
        Some(n) => Errno::from_i32(n),
        None => Errno::EIO,
    }
}

/// What fsyncs do: their normal work, wait (the plug is about to be pulled with writes not
/// yet synced), or fail without making anything durable (the plug was pulled). A hold is
/// numbered so that only its own `SyncHold` ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Syncs {
    Run,
    Hold(u64),
    Fail,
}

/// The switch for fsyncs, shared with the mount's handle.
pub(crate) type SyncGate = Arc<(Mutex<Syncs>, Condvar)>;

/// The device's flush time in microseconds, shared with the mount's handle, which may change
/// it while the mount serves.
pub(crate) type SyncLatency = Arc<AtomicU64>;

/// One wait for an unsynced change, registered with one or more mounts' states.
#[derive(Default)]
pub(crate) struct Waiter {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Waiter {
    fn wake(&self) {
        *self.woken.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    /// Waits until woken or `timeout` has passed; whether it was woken.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
        let (woken, _) = self
            .cv
            .wait_timeout_while(woken, timeout, |woken| !*woken)
            .unwrap_or_else(|e| e.into_inner());
        *woken
    }
}

/// The file system the kernel talks to.
pub(crate) struct LossyFilesystem {
    pub(crate) state: Arc<Mutex<State>>,
    pub(crate) sync_latency: SyncLatency,
    pub(crate) gate: SyncGate,
}

impl LossyFilesystem {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves at worst one operation unrecorded; the crash that
        // follows refuses nothing for it, and the test that panicked has failed anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the plug has been pulled: from then on nothing reaches the disk.
    fn unplugged(&self) -> bool {
        *self.gate.0.lock().unwrap_or_else(|e| e.into_inner()) == Syncs::Fail
    }

    /// Waits while fsyncs are held; whether this one may go on.
    fn may_sync(&self) -> bool {
        let (lock, cv) = &*self.gate;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        while matches!(*g, Syncs::Hold(_)) {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        *g == Syncs::Run
    }

    /// The device's flush time, paid before an fsync makes anything durable: a power loss
    /// while a sync runs loses what it was syncing, as on a device that has not answered
    /// yet. (A write through `O_SYNC` is durable at once and then pays it.)
    fn flush_delay(&self) {
        let latency = Duration::from_micros(self.sync_latency.load(Ordering::Relaxed));
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
    }
}

impl Filesystem for LossyFilesystem {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut s = self.lock();
        match s.child(parent, name).and_then(|rel| s.entry(rel)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = self.lock();
        let meta = match fh.and_then(|fh| s.handles.get(&fh.0)) {
            Some(h) => h.file.metadata().map_err(errno),
            None => s
                .rel(ino)
                .and_then(|rel| fs::symlink_metadata(s.path(&rel)).map_err(errno)),
        };
        match meta {
            Ok(meta) => reply.attr(&TTL, &s.attr(&meta)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if self.unplugged() {
            return reply.error(Errno::EIO);
        }
        let mut s = self.lock();
        let result = (|| {
            let rel = s.rel(ino)?;
            let path = s.path(&rel);
            if let Some(len) = size {
                let f = s.writable(ino, fh)?;
                let backing = s.backing_ino(ino);
                s.model.set_len(backing, &f, len).map_err(errno)?;
                s.changed();
            }
            if let Some(mode) = mode {
                fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(errno)?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&path, uid, gid).map_err(errno)?;
            }
            if atime.is_some() || mtime.is_some() {
                let when = |t: TimeOrNow| match t {
                    TimeOrNow::SpecificTime(t) => t,
                    TimeOrNow::Now => SystemTime::now(),
                };
                let mut times = fs::FileTimes::new();
                if let Some(t) = atime {
                    times = times.set_accessed(when(t));
                }
                if let Some(t) = mtime {
                    times = times.set_modified(when(t));
                }
                s.writable(ino, fh)?.set_times(times).map_err(errno)?;
            }
            fs::symlink_metadata(&path).map_err(errno)
        })();
        match result {
            Ok(meta) => reply.attr(&TTL, &s.attr(&meta)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        if self.unplugged() {
            return reply.error(Errno::EIO);
        }
        let mut s = self.lock();
        let result = (|| {
            let rel = s.child(parent, name)?;
            let path = s.path(&rel);
            fs::create_dir(&path).map_err(errno)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & !umask & 0o7777))
                .map_err(errno)?;
            s.own(&rel, req)?;
            let meta = fs::symlink_metadata(&path).map_err(errno)?;
            s.model.made_dir(&rel, &meta);
            s.entry(rel)
        })();
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        if self.unplugged() {
            return reply.error(Errno::EIO);
        }
        if !flags.is_empty() {
            // RENAME_EXCHANGE and RENAME_NOREPLACE are not modelled.
            reply.error(Errno::EINVAL);
            return;
        }
        let mut s = self.lock();
        let result = (|| {
            let from = s.child(parent, name)?;
            let to = s.child(newparent, newname)?;
            let node = s.model.node(&from).ok_or(Errno::ENOENT)?;
            if let (Node::Dir, Some(Node::Dir)) = (node, s.model.node(&to)) {
                // Replacing a directory needs it empty, as rename(2) says; its removal is
                // one change and the rename another.
                s.model.remove(&to).map_err(errno)?;
            }
            s.model.rename(&from, &to).map_err(errno)?;
            let moved: Vec<(Ino, PathBuf)> = s
                .paths
                .iter()
                .filter(|(_, p)| p.starts_with(&from))
                .filter_map(|(i, p)| p.strip_prefix(&from).ok().map(|r| (*i, under(&to, r))))
                .collect();
            s.paths.extend(moved);
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        if self.unplugged() {
            return reply.error(Errno::EIO);
        }
        let mut s = self.lock();
        let result = (|| {
            let from = s.rel(ino)?;
            let to = s.child(newparent, newname)?;
            fs::hard_link(s.path(&from), s.path(&to)).map_err(errno)?;
            let backing = s.backing_ino(ino);
            s.model.linked(backing, &to);
            let meta = fs::symlink_metadata(s.path(&to)).map_err(errno)?;
            Ok(s.attr(&meta))
        })();
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut s = self.lock();
        let result = (|| {
            let path = s.path(&s.rel(ino)?);
            let f = open_backing(&path, flags.0, false, 0)?;
            let backing = s.backing_ino(ino);
            Ok(s.add_handle(f, backing, flags.0))
        })();
        match result {
            Ok(fh) => reply.opened(fh, FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if self.unplugged() {
            return reply.error(Errno::EIO);
        }
        let mut s = self.lock();
        let result = (|| {
            let rel = s.child(parent, name)?;
            let f = open_backing(&s.path(&rel), flags, true, mode & !umask & 0o7777)?;
            s.own(&rel, req)?;
            let meta = f.metadata().map_err(errno)?;
            s.model.created(&rel, meta.ino());
            let attr = s.entry(rel)?;
            Ok((attr, s.add_handle(f, meta.ino(), flags)))
        })();
        match result {
            Ok((attr, fh)) => reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Reads change nothing the model keeps, so they run outside the lock.
        let file = match self.lock().handle(fh) {
            Ok(h) => h.file.clone(),
            Err(e) => return reply.error(e),
        };
        let mut buf = vec![0; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(e)),
            }
        }
        reply.data(&buf[..got]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.unplugged() {
            return reply.error(Errno::EIO);
        }
        let sync_writes = self.lock().handle(fh).map(|h| h.sync_writes);
        if sync_writes == Ok(true) && !self.may_sync() {
            return reply.error(Errno::EIO);
        }
        let mut s = self.lock();
        let result = (|| {
            let h = s.handle(fh)?;
            let (file, ino, sync) = (h.file.clone(), h.ino, h.sync_writes);
            s.model.write(ino, &file, offset, data).map_err(errno)?;
            if sync {
                s.model.synced(ino);
            }
            s.changed();
            Ok(sync)
        })();
        drop(s);
        match result {
            Ok(sync) => {
                if sync {
                    self.flush_delay();
                }
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.flush_delay();
        if !self.may_sync() {
            return reply.error(Errno::EIO);
        }
        let mut s = self.lock();
        let ino = match s.handle(fh) {
            Ok(h) => h.ino,
            Err(e) => return reply.error(e),
        };
        s.model.synced(ino);
        drop(s);
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let s = self.lock();
        let listed = (|| {
            let rel = s.rel(ino)?;
            let mut out = vec![
                (ino, FileType::Directory, ".".into()),
                (ino, FileType::Directory, "..".into()),
            ];
            for e in fs::read_dir(s.path(&rel)).map_err(errno)? {
                let e = e.map_err(errno)?;
                if rel.as_os_str().is_empty() && e.file_name() == GRAVEYARD {
                    continue;
                }
                let kind = if e.file_type().map_err(errno)?.is_dir() {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                let meta = e.metadata().map_err(errno)?;
                out.push((s.fuse_ino(meta.ino()), kind, e.file_name()));
            }
            Ok::<_, Errno>(out)
        })();
        drop(s);
        match listed {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(ino, i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.flush_delay();
        if !self.may_sync() {
            return reply.error(Errno::EIO);
        }
        let mut s = self.lock();
        match s.rel(ino) {
            Ok(rel) => s.model.synced_dir(&rel),
            Err(e) => return reply.error(e),
        }
        drop(s);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let root = self.lock().model.root().to_path_buf();
        match statvfs(&root) {
            Ok(v) => reply.statfs(
                v.f_blocks,
                v.f_bfree,
                v.f_bavail,
                v.f_files,
                v.f_ffree,
                v.f_bsize as u32,
                v.f_namemax as u32,
                v.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (`default_permissions`).
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if self.unplugged() {
            return reply.error(Errno::EIO);
        }
        // Growing with zeros, or reserving space without a size change, is modelled; punching
        // or collapsing ranges is not.
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            reply.error(Errno::EOPNOTSUPP);
            return;
        }
        let mut s = self.lock();
        let result = (|| {
            let h = s.handle(fh)?;
            let (file, ino) = (h.file.clone(), h.ino);
            let old_len = file.metadata().map_err(errno)?.len();
            // SAFETY: fallocate on a descriptor this handle owns.
            let rc = unsafe {
                libc::fallocate(
                    std::os::fd::AsRawFd::as_raw_fd(&*file),
                    mode,
                    offset as libc::off_t,
                    length as libc::off_t,
                )
            };
            if rc != 0 {
                return Err(errno(io::Error::last_os_error()));
            }
            let new_len = file.metadata().map_err(errno)?.len();
            s.model.grew(ino, old_len, new_len);
            s.changed();
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

impl LossyFilesystem {
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        if self.unplugged() {
            return reply.error(Errno::EIO);
        }
        let mut s = self.lock();
        let result = (|| {
            let rel = s.child(parent, name)?;
            match (s.model.node(&rel), dir) {
                (None, _) => return Err(Errno::ENOENT),
                (Some(Node::Dir), false) => return Err(Errno::EISDIR),
                (Some(Node::File(_)), true) => return Err(Errno::ENOTDIR),
                _ => {}
            }
            let node = s.model.node(&rel);
            s.model.remove(&rel).map_err(errno)?;
            match node {
                Some(Node::File(ino)) => match s.model.path_of(ino) {
                    Some(p) => {
                        s.paths.insert(ino, p);
                    }
                    None => {
                        s.paths.remove(&ino);
                    }
                },
                _ => s.paths.retain(|_, p| p != &rel),
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// Opens a backing file for a request with open(2) `flags`. Creation, truncation and
/// appending are the model's business (the kernel sends truncation as a size change and gives
/// appends their offset), and the backing file is never synced, so those flags are dropped.
fn open_backing(path: &Path, flags: i32, create: bool, mode: u32) -> Result<File, Errno> {
    let mut o = fs::OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => o.read(true),
        // Writes read what they overwrite, for the model's undo log.
        _ => o.read(true).write(true),
    };
    if create {
        o.read(true).write(true).create_new(true).mode(mode);
    }
    let dropped = libc::O_ACCMODE
        | libc::O_CREAT
        | libc::O_EXCL
        | libc::O_TRUNC
        | libc::O_APPEND
        | libc::O_SYNC
        | libc::O_DSYNC
        | libc::O_DIRECT;
    o.custom_flags(flags & !dropped);
    o.open(path).map_err(errno)
}

fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut v = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    if unsafe { libc::statvfs(c.as_ptr(), v.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled the buffer.
    Ok(unsafe { v.assume_init() })
}
