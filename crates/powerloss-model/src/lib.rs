//! What a power loss may take back from a directory tree, shared by the two crash simulators
//! of the workspace: wal-storage's in-process recorder (`wal_storage::PowerLoss`, under its
//! `failpoints` feature) and the `lossyfs` FUSE file system that crashes whole nodes. One
//! model, so that a node tested whole is held to the rules its storage was tested against.
//!
//! Each simulator keeps its files its own way (the recorder a copy of the synced content, the
//! file system an undo log beside the real file) and shares here what is the same for both:
//! the directory entries ([`Names`]), what a crash reports ([`CrashReport`]) and the seeded
//! generator that chooses the crash ([`Rng`]); [`Names::durable_only`] is the crash no seed
//! chooses, the worst case, for a test that must lose everything unsynced.
//!
//! # The model of directory entries
//!
//! - The entries of a directory are those of its last fsync, followed by a prefix of the entry
//!   changes made in it since (creations, links, renames, removals, new subdirectories),
//!   chosen independently per directory. A rename between two directories is one change in
//!   both, and survives only where both prefixes keep it, and then whole: the old name goes
//!   exactly when the new one appears. Renaming a directory moves its whole subtree.
//! - An fsync of a directory also makes durable every change that precedes one of its changes
//!   in the other directory the change touched, so that what is durable stays a prefix of
//!   every directory's changes.
//! - A file no surviving name reaches is gone; an entry whose directory is gone is gone.
//!
//! Stricter than ext4 and xfs with default mount options, which journal metadata in one
//! ordered stream: there a directory fsync commits every earlier entry change of the whole
//! file system, and a crash keeps a prefix of that one stream, while here each directory loses
//! its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What a name reaches: a file (by an id its simulator gives it, stable across renames) or a
/// directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    File(u64),
    Dir,
}

/// A change of directory entries not yet durable. Paths are relative to the modelled root.
#[derive(Clone, Debug)]
pub enum NameChange {
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

/// The directory holding `p` (the empty path for the root's entries).
pub fn parent(p: &Path) -> PathBuf {
    p.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl NameChange {
    /// The directories whose entries this changes.
    pub fn dirs(&self) -> Vec<PathBuf> {
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

    /// Whether this change gives file `id` a name.
    pub fn touches(&self, id: u64) -> bool {
        match self {
            NameChange::Add(_, n) | NameChange::Rename(_, _, n) => *n == Node::File(id),
            NameChange::Remove(_) => false,
        }
    }

    /// Makes the change in `names`.
    pub fn apply(&self, names: &mut BTreeMap<PathBuf, Node>) {
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

/// The entries of a tree: those made durable by directory fsyncs, the current ones, and the
/// changes between them, oldest first.
///
/// Invariant: applying `pending` in order to `durable` gives `current`.
#[derive(Clone, Debug, Default)]
pub struct Names {
    durable: BTreeMap<PathBuf, Node>,
    current: BTreeMap<PathBuf, Node>,
    pending: Vec<NameChange>,
}

impl Names {
    /// A tree whose entries are all durable.
    pub fn durable(entries: BTreeMap<PathBuf, Node>) -> Names {
        Names {
            current: entries.clone(),
            durable: entries,
            pending: Vec::new(),
        }
    }

    /// The current node at `rel`.
    pub fn get(&self, rel: &Path) -> Option<Node> {
        self.current.get(rel).copied()
    }

    /// The current entries, sorted (a directory before its entries).
    pub fn current(&self) -> &BTreeMap<PathBuf, Node> {
        &self.current
    }

    /// Whether a durable or current name, or a change not yet durable, reaches file `id`: a
    /// crash could then leave a name of it.
    pub fn reaches(&self, id: u64) -> bool {
        let f = Node::File(id);
        self.durable
            .values()
            .chain(self.current.values())
            .any(|n| *n == f)
            || self.pending.iter().any(|c| c.touches(id))
    }

    /// Records a change made to the tree.
    pub fn change(&mut self, change: NameChange) {
        change.apply(&mut self.current);
        self.pending.push(change);
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
    }

    /// The entries a crash leaves, with each directory keeping a prefix of its changes, and
    /// a report counting the name changes it kept and lost.
    pub fn surviving(&self, rng: &mut Rng) -> (BTreeMap<PathBuf, Node>, CrashReport) {
        self.surviving_by(&mut |n| rng.below(n + 1))
    }

    /// The entries a crash that keeps no change not made durable leaves: the worst case.
    pub fn durable_only(&self) -> (BTreeMap<PathBuf, Node>, CrashReport) {
        self.surviving_by(&mut |_| 0)
    }

    /// The entries a crash leaves when each directory keeps `kept(n)` (at most `n`) of its
    /// `n` pending changes.
    fn surviving_by(
        &self,
        kept: &mut dyn FnMut(u64) -> u64,
    ) -> (BTreeMap<PathBuf, Node>, CrashReport) {
        let mut counts: BTreeMap<PathBuf, usize> = BTreeMap::new();
        for change in &self.pending {
            for d in change.dirs() {
                *counts.entry(d).or_default() += 1;
            }
        }
        let keep: BTreeMap<PathBuf, usize> = counts
            .into_iter()
            .map(|(d, n)| (d, kept(n as u64) as usize))
            .collect();
        let mut seen: BTreeMap<PathBuf, usize> = BTreeMap::new();
        let mut broken: BTreeSet<PathBuf> = BTreeSet::new();
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

/// splitmix64: a crash must be reproducible from its seed alone, and neighbouring seeds must
/// give unrelated crashes.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// A number in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn a_directory_rename_moves_its_subtree() {
        let mut names = BTreeMap::from([
            (p("a"), Node::Dir),
            (p("a/f"), Node::File(1)),
            (p("ab"), Node::File(2)),
        ]);
        NameChange::Rename(p("a"), p("b"), Node::Dir).apply(&mut names);
        let got: Vec<_> = names.into_iter().collect();
        assert_eq!(
            got,
            [
                (p("ab"), Node::File(2)),
                (p("b"), Node::Dir),
                (p("b/f"), Node::File(1))
            ]
        );
    }

    #[test]
    fn each_directory_keeps_a_prefix_and_a_synced_one_keeps_all() {
        let mut outcomes = BTreeSet::new();
        for seed in 0..64 {
            let mut names = Names::durable(BTreeMap::from([(p("d"), Node::Dir)]));
            names.change(NameChange::Add(p("x"), Node::File(1)));
            names.change(NameChange::Add(p("y"), Node::File(2)));
            names.change(NameChange::Add(p("d/z"), Node::File(3)));
            names.synced_dir(Path::new("d"));
            let (kept, report) = names.surviving(&mut Rng(seed));
            assert!(kept.contains_key(Path::new("d/z")), "{kept:?}");
            assert_eq!(report.name_changes, 2);
            outcomes.insert(kept.keys().cloned().collect::<Vec<_>>());
        }
        // The root's two changes survive as a prefix: none, x, or x and y; never y alone.
        let expect: BTreeSet<Vec<PathBuf>> = [
            vec![p("d"), p("d/z")],
            vec![p("d"), p("d/z"), p("x")],
            vec![p("d"), p("d/z"), p("x"), p("y")],
        ]
        .into_iter()
        .collect();
        assert_eq!(outcomes, expect);
    }

    /// The worst case keeps what a directory fsync made durable and nothing else.
    #[test]
    fn a_crash_to_the_durable_state_keeps_no_pending_change() {
        let mut names = Names::durable(BTreeMap::from([(p("d"), Node::Dir)]));
        names.change(NameChange::Add(p("x"), Node::File(1)));
        names.change(NameChange::Add(p("y"), Node::File(2)));
        names.change(NameChange::Add(p("d/z"), Node::File(3)));
        names.synced_dir(Path::new("d"));
        let (kept, report) = names.durable_only();
        assert_eq!(kept.keys().collect::<Vec<_>>(), vec![&p("d"), &p("d/z")]);
        assert_eq!((report.name_changes, report.name_changes_lost), (2, 2));
    }

    #[test]
    fn a_change_after_a_lost_rename_between_directories_is_lost_too() {
        let mut outcomes = BTreeSet::new();
        for seed in 0..64 {
            let mut names = Names::durable(BTreeMap::from([
                (p("a"), Node::Dir),
                (p("a/x"), Node::File(1)),
                (p("b"), Node::Dir),
            ]));
            // The rename counts in a and in b; if b's prefix drops it, a's prefix ends there.
            names.change(NameChange::Rename(p("a/x"), p("b/x"), Node::File(1)));
            names.change(NameChange::Add(p("a/y"), Node::File(2)));
            let (kept, _) = names.surviving(&mut Rng(seed));
            outcomes.insert(kept.keys().cloned().collect::<Vec<_>>());
        }
        let expect: BTreeSet<Vec<PathBuf>> = [
            vec![p("a"), p("a/x"), p("b")],
            vec![p("a"), p("b"), p("b/x")],
            vec![p("a"), p("a/y"), p("b"), p("b/x")],
        ]
        .into_iter()
        .collect();
        assert_eq!(outcomes, expect);
    }
}
