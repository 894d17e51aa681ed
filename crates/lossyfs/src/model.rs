//! What a power loss may take back, and the crash that takes it.
//!
//! The backing directory always holds the current state, as a plain passthrough file system
//! would; the model keeps beside it what is needed to go back: per file, the writes and size
//! changes since its last fsync with the bytes each overwrote (an undo log, so memory grows with
//! unsynced data only, never with the size of the files); per directory, the entries made
//! durable by its last fsync and the entry changes since. A file that loses its last name is
//! not deleted but moved into the graveyard (`GRAVEYARD` at the backing root, hidden from the
//! mount), because a crash may bring a name of it back; it is deleted for real once no durable
//! name, current name or pending change reaches it.
//!
//! # The model: what a power loss may do
//!
//! The same as wal-storage's in-process recorder (`wal_storage::PowerLoss`), so that a node
//! tested whole on this file system is held to the rules its storage was tested against:
//! - A file's content is its content as of its last fsync or fdatasync (the two are the same
//!   here), followed by a prefix of the changes made since, in their order: none, some or all,
//!   the last one kept possibly cut at any byte. A size change (truncation, `fallocate` that
//!   grows the file) is one change and survives whole or not at all.
//! - The directory entries follow the model both share (`powerloss_model`, which writes it
//!   down): each directory keeps the entries of its last fsync and a prefix of its changes
//!   since; a file no surviving name reaches is gone.
//!
//! A write opened with `O_SYNC` or `O_DSYNC` is a write followed by an fdatasync of its file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use powerloss_model::{under, CrashReport, Node};
use powerloss_model::{NameChange, Names, Rng};

/// The directory, at the backing root, where files that lost their last name wait until no
/// crash can bring a name of them back. The mount hides it.
pub const GRAVEYARD: &str = ".lossyfs-graveyard";

/// A backing inode number: files keep theirs across renames and across the graveyard, so it
/// names a file for as long as the model needs it.
pub type Ino = u64;

/// One unsynced change of a file, with what undoes it.
#[derive(Clone, Debug)]
enum Change {
    /// `new` written at `offset` over `old` (the bytes there before, as far as the file
    /// reached), when the file was `old_len` long.
    Write {
        offset: u64,
        new: Vec<u8>,
        old: Vec<u8>,
        old_len: u64,
    },
    /// The length set from `old_len` to `new_len`; `cut` holds the bytes a shrink removed.
    SetLen {
        old_len: u64,
        new_len: u64,
        cut: Vec<u8>,
    },
}

/// Owner and mode of a directory, to make it again as it was.
#[derive(Clone, Copy, Debug)]
struct DirMeta {
    mode: u32,
    uid: u32,
    gid: u32,
}

/// The model of one backing directory.
#[derive(Debug)]
pub struct Model {
    root: PathBuf,
    names: Names,
    /// Unsynced changes per file, oldest first.
    logs: HashMap<Ino, Vec<Change>>,
    /// Files in the graveyard.
    buried: HashSet<Ino>,
    dirs: HashMap<PathBuf, DirMeta>,
}

impl Model {
    /// Takes what `root` holds as durable. Whatever a previous mount left in the graveyard is
    /// reached by no name: it is deleted.
    pub fn load(root: &Path) -> io::Result<Model> {
        let grave = root.join(GRAVEYARD);
        if grave.exists() {
            fs::remove_dir_all(&grave)?;
        }
        fs::create_dir(&grave)?;
        let mut m = Model {
            root: root.to_path_buf(),
            names: Names::default(),
            logs: HashMap::new(),
            buried: HashSet::new(),
            dirs: HashMap::new(),
        };
        let mut durable = BTreeMap::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for entry in fs::read_dir(root.join(&rel))? {
                let entry = entry?;
                if rel.as_os_str().is_empty() && entry.file_name() == GRAVEYARD {
                    continue;
                }
                let rel = rel.join(entry.file_name());
                let meta = fs::symlink_metadata(entry.path())?;
                if meta.is_dir() {
                    durable.insert(rel.clone(), Node::Dir);
                    m.dirs.insert(rel.clone(), dir_meta(&meta));
                    stack.push(rel);
                } else {
                    durable.insert(rel, Node::File(meta.ino()));
                }
            }
        }
        m.names = Names::durable(durable);
        Ok(m)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the graveyard keeps `ino`.
    pub fn grave(&self, ino: Ino) -> PathBuf {
        self.root.join(GRAVEYARD).join(ino.to_string())
    }

    /// The current node at `rel`.
    pub fn node(&self, rel: &Path) -> Option<Node> {
        self.names.get(rel)
    }

    /// A current name of file `ino`, or its place in the graveyard.
    pub fn path_of(&self, ino: Ino) -> Option<PathBuf> {
        if let Some((p, _)) = self
            .names
            .current()
            .iter()
            .find(|(_, n)| **n == Node::File(ino))
        {
            return Some(p.clone());
        }
        self.buried
            .contains(&ino)
            .then(|| PathBuf::from(GRAVEYARD).join(ino.to_string()))
    }

    fn change_names(&mut self, change: NameChange) {
        self.names.change(change);
    }

    fn has_other_name(&self, ino: Ino, except: &Path) -> bool {
        self.names
            .current()
            .iter()
            .any(|(p, n)| *n == Node::File(ino) && p != except)
    }

    /// A file was created at `rel`.
    pub fn created(&mut self, rel: &Path, ino: Ino) {
        self.change_names(NameChange::Add(rel.to_path_buf(), Node::File(ino)));
    }

    /// A directory was made at `rel`.
    pub fn made_dir(&mut self, rel: &Path, meta: &fs::Metadata) {
        self.dirs.insert(rel.to_path_buf(), dir_meta(meta));
        self.change_names(NameChange::Add(rel.to_path_buf(), Node::Dir));
    }

    /// A second name `to` for the file at `from`.
    pub fn linked(&mut self, ino: Ino, to: &Path) {
        self.change_names(NameChange::Add(to.to_path_buf(), Node::File(ino)));
    }

    /// Removes the name `rel` from the backing directory and the model: an empty directory
    /// is removed, a file's link is removed, or the file moved into the graveyard if this was
    /// its last name.
    pub fn remove(&mut self, rel: &Path) -> io::Result<()> {
        let path = self.root.join(rel);
        match self.node(rel) {
            None => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
            Some(Node::Dir) => fs::remove_dir(&path)?,
            Some(Node::File(ino)) => {
                if self.has_other_name(ino, rel) {
                    fs::remove_file(&path)?;
                } else {
                    fs::rename(&path, self.grave(ino))?;
                    self.buried.insert(ino);
                }
            }
        }
        self.change_names(NameChange::Remove(rel.to_path_buf()));
        Ok(())
    }

    /// Renames `from` to `to` in the backing directory and the model. A file the rename
    /// replaces goes to the graveyard first if `to` was its last name.
    pub fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let Some(node) = self.node(from) else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        if let Some(Node::File(old)) = self.node(to) {
            if node != Node::File(old) && !self.has_other_name(old, to) {
                fs::rename(self.root.join(to), self.grave(old))?;
                self.buried.insert(old);
            }
        }
        fs::rename(self.root.join(from), self.root.join(to))?;
        if node == Node::Dir {
            let moved: Vec<(PathBuf, DirMeta)> = self
                .dirs
                .iter()
                .filter(|(p, _)| p.starts_with(from))
                .map(|(p, m)| (p.clone(), *m))
                .collect();
            for (p, m) in moved {
                if let Ok(rest) = p.strip_prefix(from) {
                    self.dirs.insert(under(to, rest), m);
                }
            }
        }
        self.change_names(NameChange::Rename(
            from.to_path_buf(),
            to.to_path_buf(),
            node,
        ));
        Ok(())
    }

    /// Writes `data` at `offset` of `f` (file `ino`), remembering what it overwrote.
    pub fn write(&mut self, ino: Ino, f: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        let old_len = f.metadata()?.len();
        let reach = old_len.saturating_sub(offset).min(data.len() as u64) as usize;
        let mut old = vec![0; reach];
        f.read_exact_at(&mut old, offset)?;
        f.write_all_at(data, offset)?;
        self.logs.entry(ino).or_default().push(Change::Write {
            offset,
            new: data.to_vec(),
            old,
            old_len,
        });
        Ok(())
    }

    /// Sets the length of `f` (file `ino`), remembering what a shrink removed.
    pub fn set_len(&mut self, ino: Ino, f: &File, new_len: u64) -> io::Result<()> {
        let old_len = f.metadata()?.len();
        if old_len == new_len {
            return Ok(());
        }
        let mut cut = vec![0; old_len.saturating_sub(new_len) as usize];
        f.read_exact_at(&mut cut, new_len)?;
        f.set_len(new_len)?;
        self.logs.entry(ino).or_default().push(Change::SetLen {
            old_len,
            new_len,
            cut,
        });
        Ok(())
    }

    /// `fallocate` grew file `ino` from `old_len` to `new_len` with zeros.
    pub fn grew(&mut self, ino: Ino, old_len: u64, new_len: u64) {
        if new_len > old_len {
            self.logs.entry(ino).or_default().push(Change::SetLen {
                old_len,
                new_len,
                cut: Vec::new(),
            });
        }
    }

    /// How many changes of files are not synced.
    pub fn unsynced(&self) -> usize {
        self.logs.values().map(Vec::len).sum()
    }

    /// File `ino` was fsynced or fdatasynced: its content is durable.
    pub fn synced(&mut self, ino: Ino) {
        self.logs.remove(&ino);
    }

    /// The directory `rel` was fsynced: its entry changes, and every change before one of
    /// them in another directory that change touched, are durable.
    pub fn synced_dir(&mut self, rel: &Path) {
        self.names.synced_dir(rel);
        self.bury_for_good();
    }

    /// Deletes the buried files no crash can bring back: no durable or current name and no
    /// pending change reaches them.
    fn bury_for_good(&mut self) {
        let gone: Vec<Ino> = self
            .buried
            .iter()
            .copied()
            .filter(|ino| !self.names.reaches(*ino))
            .collect();
        for ino in gone {
            // A file that cannot be deleted stays buried; the next mount deletes it.
            if fs::remove_file(self.grave(ino)).is_ok() {
                self.buried.remove(&ino);
                self.logs.remove(&ino);
            }
        }
    }

    /// Rewrites the backing directory into the state a power loss chosen by `seed` leaves
    /// (module docs), or with `None` the state that keeps nothing unsynced (the worst case),
    /// and returns the model of that state, all of it durable. Nothing may use the backing
    /// directory meanwhile.
    pub fn crash(self, seed: Option<u64>) -> io::Result<(Model, CrashReport)> {
        let mut rng = seed.map(Rng);
        let (names, mut report) = match &mut rng {
            Some(rng) => self.names.surviving(rng),
            None => self.names.durable_only(),
        };
        // Each surviving file's fate: how many of its changes it keeps, and how many bytes of
        // the next one if that is a write.
        let mut fates: BTreeMap<Ino, (usize, usize)> = BTreeMap::new();
        for node in names.values() {
            if let Node::File(ino) = *node {
                if let std::collections::btree_map::Entry::Vacant(e) = fates.entry(ino) {
                    e.insert(self.fate(ino, rng.as_mut(), &mut report));
                }
            }
        }
        // Every file goes into the graveyard, every directory is removed, and the surviving
        // tree is made again from the graveyard.
        for (rel, node) in self.names.current() {
            if let Node::File(ino) = *node {
                let grave = self.grave(ino);
                if self.buried.contains(&ino) || grave.exists() {
                    fs::remove_file(self.root.join(rel))?;
                } else {
                    fs::rename(self.root.join(rel), &grave)?;
                }
            }
        }
        for entry in fs::read_dir(&self.root)? {
            let entry = entry?;
            if entry.file_name() == GRAVEYARD {
                continue;
            }
            if entry.file_type()?.is_dir() {
                fs::remove_dir_all(entry.path())?;
            } else {
                fs::remove_file(entry.path())?;
            }
        }
        for (&ino, &(keep, torn)) in &fates {
            self.undo(ino, keep, torn)?;
        }
        // Names are sorted, so a directory comes before its entries.
        let mut placed: HashMap<Ino, PathBuf> = HashMap::new();
        for (rel, node) in &names {
            let path = self.root.join(rel);
            match node {
                Node::Dir => {
                    fs::create_dir(&path)?;
                    if let Some(meta) = self.dirs.get(rel) {
                        fs::set_permissions(&path, fs::Permissions::from_mode(meta.mode))?;
                        std::os::unix::fs::lchown(&path, Some(meta.uid), Some(meta.gid))?;
                    }
                }
                Node::File(ino) => match placed.get(ino) {
                    Some(first) => fs::hard_link(first, &path)?,
                    None => {
                        fs::rename(self.grave(*ino), &path)?;
                        placed.insert(*ino, path);
                    }
                },
            }
        }
        let root = self.root.clone();
        drop(self);
        Ok((Model::load(&root)?, report))
    }

    /// Chooses how much of file `ino`'s unsynced changes a crash keeps: a prefix of them, and
    /// half the time part of the next one if it is a write; none without `rng`.
    fn fate(&self, ino: Ino, rng: Option<&mut Rng>, report: &mut CrashReport) -> (usize, usize) {
        let log = self.logs.get(&ino).map(Vec::as_slice).unwrap_or_default();
        let n = log.len();
        report.writes += n;
        let Some(rng) = rng else {
            report.writes_lost += n;
            return (0, 0);
        };
        let keep = rng.below(n as u64 + 1) as usize;
        report.writes_lost += n - keep;
        let mut torn = 0;
        if let Some(Change::Write { new, .. }) = log.get(keep) {
            // Cutting at every byte with equal odds would make losing all of the write as
            // rare as one byte in its length; half the time it is lost whole.
            if rng.below(2) == 1 {
                torn = rng.below(new.len() as u64) as usize;
            }
            if torn > 0 {
                report.torn += 1;
            }
        }
        (keep, torn)
    }

    /// Takes the buried file `ino` back to its content after its first `keep` unsynced
    /// changes and `torn` bytes of the next.
    fn undo(&self, ino: Ino, keep: usize, torn: usize) -> io::Result<()> {
        let Some(log) = self.logs.get(&ino) else {
            return Ok(());
        };
        if keep == log.len() {
            return Ok(());
        }
        let f = fs::OpenOptions::new().write(true).open(self.grave(ino))?;
        for change in log[keep..].iter().rev() {
            match change {
                Change::Write {
                    offset,
                    old,
                    old_len,
                    ..
                } => {
                    f.write_all_at(old, *offset)?;
                    if f.metadata()?.len() > *old_len {
                        f.set_len(*old_len)?;
                    }
                }
                Change::SetLen {
                    old_len,
                    new_len,
                    cut,
                } => {
                    f.set_len(*old_len)?;
                    f.write_all_at(cut, *new_len)?;
                }
            }
        }
        if let Some(Change::Write { offset, new, .. }) = log.get(keep) {
            f.write_all_at(&new[..torn], *offset)?;
        }
        Ok(())
    }
}

fn dir_meta(meta: &fs::Metadata) -> DirMeta {
    DirMeta {
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
    }
}
