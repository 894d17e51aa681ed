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
//! - The entries of a directory are those of its last fsync, followed by a prefix of the entry
//!   changes made in it since (creations, links, renames, removals, new subdirectories),
//!   chosen independently per directory. A rename between two directories survives only where
//!   both prefixes keep it, and then whole. An fsync of a directory also makes durable every
//!   change that precedes one of its changes in the other directory that change touched, so
//!   that what is durable stays a prefix of every directory's changes.
//! - A file no surviving name reaches is gone; an entry whose directory is gone is gone.
//!
//! One thing the recorder never needed and this model adds: renaming a directory moves its
//! whole subtree, as one change in the parents of its two names.
//!
//! A write opened with `O_SYNC` or `O_DSYNC` is a write followed by an fdatasync of its file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The directory, at the backing root, where files that lost their last name wait until no
/// crash can bring a name of them back. The mount hides it.
pub const GRAVEYARD: &str = ".lossyfs-graveyard";

/// A backing inode number: files keep theirs across renames and across the graveyard, so it
/// names a file for as long as the model needs it.
pub type Ino = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    File(Ino),
    Dir,
}

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

/// A change of directory entries not yet durable. Paths are relative to the backing root.
#[derive(Clone, Debug)]
enum NameChange {
    Add(PathBuf, Node),
    Remove(PathBuf),
    Rename(PathBuf, PathBuf, Node),
}

/// `rest` inside `dir`, or `dir` itself when `rest` is empty (where `join` would add a
/// trailing slash, which a file's path must not have).
pub fn under(dir: &Path, rest: &Path) -> PathBuf {
    if rest.as_os_str().is_empty() {
        dir.to_path_buf()
    } else {
        dir.join(rest)
    }
}

fn parent(p: &Path) -> PathBuf {
    p.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl NameChange {
    /// The directories whose entries this changes.
    fn dirs(&self) -> Vec<PathBuf> {
        match self {
            NameChange::Add(p, _) | NameChange::Remove(p) => vec![parent(p)],
            NameChange::Rename(from, to, _) => {
                let (a, b) = (parent(from), parent(to));
                if a == b {
                    vec![a]
                } else {
                    vec![a, b]
                }
            }
        }
    }

    fn touches(&self, ino: Ino) -> bool {
        match self {
            NameChange::Add(_, n) | NameChange::Rename(_, _, n) => *n == Node::File(ino),
            NameChange::Remove(_) => false,
        }
    }

    fn apply(&self, names: &mut BTreeMap<PathBuf, Node>) {
        match self {
            NameChange::Add(p, n) => {
                names.insert(p.clone(), *n);
            }
            NameChange::Remove(p) => {
                names.remove(p);
            }
            NameChange::Rename(from, to, n) => {
                names.remove(from);
                if *n == Node::Dir {
                    // The subtree moves with its directory.
                    let inside: Vec<(PathBuf, Node)> = names
                        .range(from.clone()..)
                        .take_while(|(p, _)| p.starts_with(from))
                        .map(|(p, n)| (p.clone(), *n))
                        .collect();
                    for (p, n) in inside {
                        names.remove(&p);
                        if let Ok(rest) = p.strip_prefix(from) {
                            names.insert(under(to, rest), n);
                        }
                    }
                }
                names.insert(to.clone(), *n);
            }
        }
    }
}

/// What a crash did, for a failing test to print.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Entry changes that were not durable, and of those the ones the crash undid.
    pub name_changes: usize,
    pub name_changes_lost: usize,
    /// Writes and size changes not synced (of the files that kept a name), and of those the
    /// ones the crash lost in whole or in part.
    pub writes: usize,
    pub writes_lost: usize,
    /// Files whose last surviving write was cut.
    pub torn: usize,
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
    durable: BTreeMap<PathBuf, Node>,
    current: BTreeMap<PathBuf, Node>,
    pending: Vec<NameChange>,
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
            durable: BTreeMap::new(),
            current: BTreeMap::new(),
            pending: Vec::new(),
            logs: HashMap::new(),
            buried: HashSet::new(),
            dirs: HashMap::new(),
        };
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
                    m.durable.insert(rel.clone(), Node::Dir);
                    m.dirs.insert(rel.clone(), dir_meta(&meta));
                    stack.push(rel);
                } else {
                    m.durable.insert(rel, Node::File(meta.ino()));
                }
            }
        }
        m.current = m.durable.clone();
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
        self.current.get(rel).copied()
    }

    /// A current name of file `ino`, or its place in the graveyard.
    pub fn path_of(&self, ino: Ino) -> Option<PathBuf> {
        if let Some((p, _)) = self.current.iter().find(|(_, n)| **n == Node::File(ino)) {
            return Some(p.clone());
        }
        self.buried
            .contains(&ino)
            .then(|| PathBuf::from(GRAVEYARD).join(ino.to_string()))
    }

    fn change_names(&mut self, change: NameChange) {
        change.apply(&mut self.current);
        self.pending.push(change);
    }

    fn has_other_name(&self, ino: Ino, except: &Path) -> bool {
        self.current
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
        let mut durable = vec![false; self.pending.len()];
        let mut todo = vec![(rel.to_path_buf(), self.pending.len())];
        while let Some((d, upto)) = todo.pop() {
            for (i, c) in self.pending[..upto].iter().enumerate() {
                let ds = c.dirs();
                if !durable[i] && ds.contains(&d) {
                    durable[i] = true;
                    todo.extend(ds.into_iter().filter(|x| *x != d).map(|x| (x, i)));
                }
            }
        }
        let pending = std::mem::take(&mut self.pending);
        for (change, durable) in pending.into_iter().zip(durable) {
            if durable {
                change.apply(&mut self.durable);
            } else {
                self.pending.push(change);
            }
        }
        self.bury_for_good();
    }

    /// Deletes the buried files no crash can bring back: no durable or current name and no
    /// pending change reaches them.
    fn bury_for_good(&mut self) {
        let reached: HashSet<Ino> = self
            .durable
            .values()
            .chain(self.current.values())
            .filter_map(|n| match n {
                Node::File(ino) => Some(*ino),
                Node::Dir => None,
            })
            .collect();
        let gone: Vec<Ino> = self
            .buried
            .iter()
            .copied()
            .filter(|ino| !reached.contains(ino) && !self.pending.iter().any(|c| c.touches(*ino)))
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
    /// (module docs) and returns the model of that state, all of it durable. Nothing may use
    /// the backing directory meanwhile.
    pub fn crash(self, seed: u64) -> io::Result<(Model, CrashReport)> {
        let mut rng = Rng(seed);
        let (names, mut report) = self.surviving_names(&mut rng);
        // Each surviving file's fate: how many of its changes it keeps, and how many bytes of
        // the next one if that is a write.
        let mut fates: BTreeMap<Ino, (usize, usize)> = BTreeMap::new();
        for node in names.values() {
            if let Node::File(ino) = *node {
                if let std::collections::btree_map::Entry::Vacant(e) = fates.entry(ino) {
                    e.insert(self.fate(ino, &mut rng, &mut report));
                }
            }
        }
        // Every file goes into the graveyard, every directory is removed, and the surviving
        // tree is made again from the graveyard.
        for (rel, node) in &self.current {
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
    /// half the time part of the next one if it is a write.
    fn fate(&self, ino: Ino, rng: &mut Rng, report: &mut CrashReport) -> (usize, usize) {
        let log = self.logs.get(&ino).map(Vec::as_slice).unwrap_or_default();
        let n = log.len();
        let keep = rng.below(n as u64 + 1) as usize;
        report.writes += n;
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

    /// The entries a crash leaves, with each directory keeping a prefix of its changes.
    fn surviving_names(&self, rng: &mut Rng) -> (BTreeMap<PathBuf, Node>, CrashReport) {
        let mut counts: BTreeMap<PathBuf, usize> = BTreeMap::new();
        for change in &self.pending {
            for d in change.dirs() {
                *counts.entry(d).or_default() += 1;
            }
        }
        let keep: BTreeMap<PathBuf, usize> = counts
            .into_iter()
            .map(|(d, n)| (d, rng.below(n as u64 + 1) as usize))
            .collect();
        let mut seen: BTreeMap<PathBuf, usize> = BTreeMap::new();
        let mut broken: HashSet<PathBuf> = HashSet::new();
        let mut names = self.durable.clone();
        let mut report = CrashReport {
            name_changes: self.pending.len(),
            ..CrashReport::default()
        };
        for change in &self.pending {
            let dirs = change.dirs();
            let survives = dirs
                .iter()
                .all(|d| !broken.contains(d) && seen.get(d).copied().unwrap_or(0) < keep[d]);
            for d in &dirs {
                *seen.entry(d.clone()).or_default() += 1;
                if !survives {
                    broken.insert(d.clone());
                }
            }
            if survives {
                change.apply(&mut names);
            } else {
                report.name_changes_lost += 1;
            }
        }
        // An entry whose directory is gone is gone; sorted order puts a directory first.
        let mut kept: BTreeMap<PathBuf, Node> = BTreeMap::new();
        for (rel, node) in names {
            let parent = parent(&rel);
            if parent.as_os_str().is_empty() || kept.get(&parent) == Some(&Node::Dir) {
                kept.insert(rel, node);
            }
        }
        (kept, report)
    }
}

fn dir_meta(meta: &fs::Metadata) -> DirMeta {
    DirMeta {
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
    }
}

/// splitmix64: a crash must be reproducible from its seed alone.
struct Rng(u64);

impl Rng {
    /// A number in `0..n`; 0 when `n` is 0.
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        if n == 0 {
            0
        } else {
            z % n
        }
    }
}
