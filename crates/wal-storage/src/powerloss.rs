//! A recorder of what a power loss could take back, and the simulated crash that takes it.
//!
//! Under the `failpoints` feature a test can attach a [`PowerLoss`] to a `Wal`'s fail points
//! ([`Failpoints::record_power_loss`](crate::Failpoints::record_power_loss)). Every file
//! operation through [`Io`](crate::io) then goes on as usual on the real files, and is also
//! recorded: per file, the content as of its last fsync or fdatasync and the writes since; per
//! directory, the entries made durable by its last fsync and the changes since. After the test
//! pulls the plug ([`PowerLoss::pull_plug_after`]: from the chosen operation on, every
//! operation fails with `EIO` before it touches anything) and drops the `Wal`,
//! [`PowerLoss::crash`] rewrites the data directory into one state a power loss could have
//! left, chosen by a seed. Nothing of this is compiled without the feature.
//!
//! # The model: what a power loss may do
//!
//! - A file's content is its content as of its last successful fsync or fdatasync (the two
//!   are the same here), followed by a prefix of the writes made since, in the order they were
//!   made: none, some, or all of them, the last one kept possibly cut at any byte. A size
//!   change (creation with truncation, `fallocate`) is one of those writes and survives whole
//!   or not at all.
//! - The entries of directories follow the model shared with lossyfs (`powerloss_model`): each
//!   directory keeps the entries of its last successful fsync and a prefix of its changes since.
//! - A file no surviving name reaches is gone; an entry whose directory is gone is gone.
//!
//! Stricter than ext4 and xfs with default mount options, which journal metadata in one
//! ordered stream: there a directory fsync (and, on ext4, a new file's own fsync) commits every
//! earlier entry change of the whole file system, and a crash keeps a prefix of that one
//! stream, while here each directory loses its own. Byte-granular cutting is stricter than any
//! disk, which writes at least whole 512-byte sectors; since records and pointer slots carry
//! CRCs, any cut point must be survivable. Looser than a real disk in one way: a real page
//! cache may write back a later page of a file before an earlier one, where this model keeps
//! only prefixes. Storage never relies on that order (its scan is contiguous from a durable
//! point and stops at the first record that fails), but this model cannot show it.
//!
//! The moment of the plug is a count of operations, so a seed reproduces the same crash for
//! one thread's operation order; with several threads writing it reproduces it as far as
//! their interleaving repeats.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

pub use powerloss_model::CrashReport;
use powerloss_model::{NameChange, Names, Node, Rng};

/// A file of the model: one inode, whatever names reach it.
type FileId = u64;

/// A change to a file's content or size not yet made durable by a sync of the file.
#[derive(Clone, Debug)]
enum Change {
    Write {
        offset: u64,
        bytes: Vec<u8>,
    },
    /// Creation over an existing file: its size set to zero.
    Truncate,
    /// `fallocate`: the size grown to at least this, with zeros.
    Extend(u64),
}

#[derive(Debug)]
struct FileModel {
    /// The real inode, while a current name reaches it.
    ino: (u64, u64),
    synced: Vec<u8>,
    unsynced: Vec<Change>,
}

#[derive(Default)]
struct Model {
    root: PathBuf,
    next_id: FileId,
    live: HashMap<(u64, u64), FileId>,
    files: HashMap<FileId, FileModel>,
    names: Names,
    /// Operations recorded so far, and the one from which every operation fails.
    ops: u64,
    plug: Option<u64>,
    /// Set when an operation could not be modelled (a write to a file the model does not
    /// know); a crash then refuses to run rather than produce a state no power loss leaves.
    lost: Option<String>,
}

/// The power-loss recorder of one data directory; see the module docs for its model.
pub struct PowerLoss {
    model: Mutex<Model>,
}

impl std::fmt::Debug for PowerLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.lock();
        f.debug_struct("PowerLoss")
            .field("root", &m.root)
            .field("ops", &m.ops)
            .field("plug", &m.plug)
            .finish_non_exhaustive()
    }
}

/// The model while an operation runs under its lock, so that the recorded order is the order
/// in which the operations happened.
pub(crate) struct Recording<'a>(MutexGuard<'a, Model>);

fn ino(meta: &fs::Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

impl PowerLoss {
    /// Starts recording `root`: what it holds now counts as durable.
    pub fn start(root: &Path) -> io::Result<PowerLoss> {
        let mut model = Model {
            root: root.to_path_buf(),
            ..Model::default()
        };
        model.load()?;
        Ok(PowerLoss {
            model: Mutex::new(model),
        })
    }

    /// Lets the next `n` operations run and makes every one after them fail with `EIO` before
    /// it touches anything: the plug is pulled there. Reads are not operations here.
    pub fn pull_plug_after(&self, n: u64) {
        let mut m = self.lock();
        m.plug = Some(m.ops + n);
    }

    /// Whether the plug has been pulled (an operation was refused for it).
    pub fn plug_pulled(&self) -> bool {
        let m = self.lock();
        m.plug.is_some_and(|p| m.ops > p)
    }

    /// Operations recorded so far.
    pub fn operations(&self) -> u64 {
        self.lock().ops
    }

    /// Rewrites the directory into the state a power loss chosen by `seed` leaves (module
    /// docs), and starts recording afresh from it with the plug back in. Call it with no `Wal`
    /// open on the directory.
    pub fn crash(&self, seed: u64) -> io::Result<CrashReport> {
        let mut m = self.lock();
        if let Some(why) = &m.lost {
            return Err(io::Error::other(format!("the recorder lost track: {why}")));
        }
        let mut rng = Rng(seed);
        let (names, mut report) = m.names.surviving(&mut rng);
        let mut contents = HashMap::new();
        for node in names.values() {
            if let Node::File(id) = node {
                if !contents.contains_key(id) {
                    contents.insert(*id, m.files[id].surviving(&mut rng, &mut report));
                }
            }
        }
        for entry in fs::read_dir(&m.root)? {
            let path = entry?.path();
            if fs::symlink_metadata(&path)?.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
        }
        // Names are sorted, so a directory comes before its entries. A file reached by more
        // than one name is written once and linked.
        let mut written: HashMap<FileId, PathBuf> = HashMap::new();
        for (rel, node) in &names {
            let path = m.root.join(rel);
            match node {
                Node::Dir => fs::create_dir(&path)?,
                Node::File(id) => match written.get(id) {
                    Some(first) => fs::hard_link(first, &path)?,
                    None => {
                        fs::write(&path, &contents[id])?;
                        written.insert(*id, path);
                    }
                },
            }
        }
        let (root, plug) = (m.root.clone(), None);
        *m = Model {
            root,
            plug,
            ..Model::default()
        };
        m.load()?;
        Ok(report)
    }

    fn lock(&self) -> MutexGuard<'_, Model> {
        // A panic while recording leaves at worst one operation unrecorded, and a test that
        // panicked has failed anyway.
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the model for one operation, or refuses the operation if the plug is pulled.
    pub(crate) fn begin(&self) -> io::Result<Recording<'_>> {
        let mut m = self.lock();
        m.ops += 1;
        if m.plug.is_some_and(|p| m.ops > p) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(Recording(m))
    }
}

impl Model {
    /// Takes what `root` holds as durable.
    fn load(&mut self) -> io::Result<()> {
        let mut durable = BTreeMap::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for entry in fs::read_dir(self.root.join(&rel))? {
                let entry = entry?;
                let rel = rel.join(entry.file_name());
                let meta = fs::symlink_metadata(entry.path())?;
                if meta.is_dir() {
                    durable.insert(rel.clone(), Node::Dir);
                    stack.push(rel);
                } else if let Some(&id) = self.live.get(&ino(&meta)) {
                    durable.insert(rel, Node::File(id));
                } else {
                    let id = self.new_file(ino(&meta), fs::read(entry.path())?);
                    durable.insert(rel, Node::File(id));
                }
            }
        }
        self.names = Names::durable(durable);
        Ok(())
    }

    fn new_file(&mut self, ino: (u64, u64), synced: Vec<u8>) -> FileId {
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(ino, id);
        let unsynced = Vec::new();
        self.files.insert(
            id,
            FileModel {
                ino,
                synced,
                unsynced,
            },
        );
        id
    }

    fn rel(&self, path: &Path) -> Option<PathBuf> {
        path.strip_prefix(&self.root).ok().map(Path::to_path_buf)
    }

    fn change_names(&mut self, change: NameChange) {
        self.names.change(change);
    }

    /// Forgets the real inode of a file no current name reaches: the number may be reused.
    fn unlinked(&mut self, node: Option<Node>) {
        if let Some(Node::File(id)) = node {
            if !self.names.current().values().any(|n| *n == Node::File(id)) {
                let ino = self.files[&id].ino;
                self.live.remove(&ino);
            }
        }
    }

    fn file_of(&mut self, f: &File) -> Option<FileId> {
        let found = f
            .metadata()
            .ok()
            .and_then(|m| self.live.get(&ino(&m)).copied());
        if found.is_none() && self.lost.is_none() {
            self.lost = Some("a write to a file created outside Io".to_string());
        }
        found
    }
}

impl FileModel {
    /// The content a crash leaves: the synced content and a prefix of the changes since, the
    /// last kept write possibly cut.
    fn surviving(&self, rng: &mut Rng, report: &mut CrashReport) -> Vec<u8> {
        let mut content = self.synced.clone();
        let n = self.unsynced.len();
        let whole = rng.below(n as u64 + 1) as usize;
        for change in &self.unsynced[..whole] {
            apply(&mut content, change);
        }
        report.writes += n;
        report.writes_lost += n - whole;
        if let Some(Change::Write { offset, bytes }) = self.unsynced.get(whole) {
            // Half the time the next write is cut, anywhere inside it; cutting it at every
            // byte with equal odds would make losing all of it as rare as one byte in its
            // length.
            let cut = match rng.below(2) {
                0 => 0,
                _ => rng.below(bytes.len() as u64) as usize,
            };
            if cut > 0 {
                report.torn += 1;
                let part = Change::Write {
                    offset: *offset,
                    bytes: bytes[..cut].to_vec(),
                };
                apply(&mut content, &part);
            }
        }
        content
    }
}

fn apply(content: &mut Vec<u8>, change: &Change) {
    match change {
        Change::Write { offset, bytes } => {
            let (start, end) = (*offset as usize, *offset as usize + bytes.len());
            if content.len() < end {
                content.resize(end, 0);
            }
            content[start..end].copy_from_slice(bytes);
        }
        Change::Truncate => content.clear(),
        Change::Extend(len) => {
            if (content.len() as u64) < *len {
                content.resize(*len as usize, 0);
            }
        }
    }
}

impl Recording<'_> {
    /// A file at `path` was opened, and created if `created`; `f` is it.
    pub(crate) fn opened(&mut self, path: &Path, f: &File, truncated: bool) {
        let m = &mut self.0;
        let Some(rel) = m.rel(path) else { return };
        let Ok(meta) = f.metadata() else {
            m.lost = Some(format!("no fstat of {}", path.display()));
            return;
        };
        match m.live.get(&ino(&meta)).copied() {
            Some(id) => {
                if truncated {
                    let file = m.files.get_mut(&id).expect("a live file is modelled");
                    file.unsynced.push(Change::Truncate);
                }
            }
            None => {
                let id = m.new_file(ino(&meta), Vec::new());
                m.change_names(NameChange::Add(rel, Node::File(id)));
            }
        }
    }

    /// `path` and its missing ancestors were created as directories.
    pub(crate) fn created_dirs(&mut self, path: &Path) {
        let m = &mut self.0;
        let Some(rel) = m.rel(path) else { return };
        let mut at = PathBuf::new();
        for part in rel.components() {
            at.push(part);
            if m.names.get(&at).is_none() {
                m.change_names(NameChange::Add(at.clone(), Node::Dir));
            }
        }
    }

    pub(crate) fn renamed(&mut self, from: &Path, to: &Path) {
        let m = &mut self.0;
        let (Some(from), Some(to)) = (m.rel(from), m.rel(to)) else {
            return;
        };
        let Some(node) = m.names.get(&from) else {
            m.lost = Some(format!("a rename of unknown {}", from.display()));
            return;
        };
        let replaced = m.names.get(&to);
        m.change_names(NameChange::Rename(from, to, node));
        if replaced != Some(node) {
            m.unlinked(replaced);
        }
    }

    pub(crate) fn linked(&mut self, from: &Path, to: &Path) {
        let m = &mut self.0;
        let (Some(from), Some(to)) = (m.rel(from), m.rel(to)) else {
            return;
        };
        let Some(node) = m.names.get(&from) else {
            m.lost = Some(format!("a link of unknown {}", from.display()));
            return;
        };
        m.change_names(NameChange::Add(to, node));
    }

    pub(crate) fn removed(&mut self, path: &Path) {
        let m = &mut self.0;
        let Some(rel) = m.rel(path) else { return };
        let node = m.names.get(&rel);
        m.change_names(NameChange::Remove(rel));
        m.unlinked(node);
    }

    pub(crate) fn wrote(&mut self, f: &File, offset: u64, bufs: &[&[u8]]) {
        let m = &mut self.0;
        if let Some(id) = m.file_of(f) {
            let bytes = bufs.concat();
            let file = m.files.get_mut(&id).expect("a live file is modelled");
            file.unsynced.push(Change::Write { offset, bytes });
        }
    }

    pub(crate) fn extended(&mut self, f: &File, len: u64) {
        let m = &mut self.0;
        if let Some(id) = m.file_of(f) {
            let file = m.files.get_mut(&id).expect("a live file is modelled");
            file.unsynced.push(Change::Extend(len));
        }
    }

    /// `f` was fsynced or fdatasynced: its content so far is durable.
    pub(crate) fn synced(&mut self, f: &File) {
        let m = &mut self.0;
        if let Some(id) = m.file_of(f) {
            let file = m.files.get_mut(&id).expect("a live file is modelled");
            for change in std::mem::take(&mut file.unsynced) {
                apply(&mut file.synced, &change);
            }
        }
    }

    /// The directory `dir` was fsynced: its changes, and every change before one of them in
    /// another directory that change touched, are durable.
    pub(crate) fn synced_dir(&mut self, dir: &Path) {
        let m = &mut self.0;
        let Some(rel) = m.rel(dir) else { return };
        m.names.synced_dir(&rel);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use crate::io::{Failpoints, Io, FP_FSYNC, FP_WRITE};

    const SEEDS: u64 = 64;

    /// Runs `ops` on a fresh directory through a recording `Io`, crashes it with each seed,
    /// and returns what each crash left: every file's relative path and content.
    fn outcomes(ops: impl Fn(&Io, &Path)) -> Vec<BTreeMap<PathBuf, Vec<u8>>> {
        (0..SEEDS)
            .map(|seed| {
                let dir = tempfile::tempdir().unwrap();
                let fp = Arc::new(Failpoints::default());
                let pl = fp.record_power_loss(dir.path()).unwrap();
                let io = Io::with_failpoints(true, fp);
                ops(&io, dir.path());
                pl.crash(seed).unwrap();
                files(dir.path())
            })
            .collect()
    }

    fn files(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let rel = p.strip_prefix(root).unwrap().to_path_buf();
                    out.insert(rel, fs::read(&p).unwrap());
                }
            }
        }
        out
    }

    fn names(outcomes: &[BTreeMap<PathBuf, Vec<u8>>]) -> BTreeSet<Vec<String>> {
        outcomes
            .iter()
            .map(|o| o.keys().map(|p| p.display().to_string()).collect())
            .collect()
    }

    fn write_synced(io: &Io, path: &Path, bytes: &[u8]) -> File {
        let f = io.create(path).unwrap();
        io.pwrite_all(&f, bytes, 0, FP_WRITE).unwrap();
        io.sync_all(&f, FP_FSYNC).unwrap();
        f
    }

    #[test]
    fn a_file_keeps_its_synced_content_and_a_prefix_of_the_rest() {
        let synced = vec![1u8; 100];
        let later = vec![2u8; 300];
        let all = outcomes(|io, root| {
            let f = write_synced(io, &root.join("f"), &synced);
            io.sync_dir(root).unwrap();
            io.pwrite_all(&f, &later[..150], 50, FP_WRITE).unwrap();
            io.pwrite_all(&f, &later[150..], 200, FP_WRITE).unwrap();
        });
        let mut lens = BTreeSet::new();
        for o in &all {
            // Whatever survived of the later writes is their prefix, in order, over the
            // synced bytes.
            let got = &o[Path::new("f")];
            let kept = got[50..].iter().take_while(|&&b| b == 2).count();
            let mut expect = synced.clone();
            expect.resize(100.max(50 + kept), 0);
            expect[50..50 + kept].copy_from_slice(&later[..kept]);
            assert_eq!(got, &expect);
            lens.insert(kept);
        }
        assert!(lens.contains(&0), "never all lost: {lens:?}");
        assert!(lens.contains(&300), "never all kept: {lens:?}");
        assert!(
            lens.iter().any(|&k| k != 0 && k != 150 && k != 300),
            "never torn: {lens:?}"
        );
    }

    #[test]
    fn a_sync_makes_content_durable() {
        for o in outcomes(|io, root| {
            let f = write_synced(io, &root.join("f"), b"old");
            io.sync_dir(root).unwrap();
            io.pwrite_all(&f, b"new!", 0, FP_WRITE).unwrap();
            io.sync_data(&f, FP_FSYNC).unwrap();
        }) {
            assert_eq!(o[Path::new("f")], b"new!");
        }
    }

    #[test]
    fn entry_changes_need_their_directory_synced() {
        let all = outcomes(|io, root| {
            write_synced(io, &root.join("old"), b"o");
            write_synced(io, &root.join("gone"), b"g");
            io.sync_dir(root).unwrap();
            write_synced(io, &root.join("tmp"), b"t");
            io.rename(&root.join("tmp"), &root.join("old")).unwrap();
            io.remove_file(&root.join("gone")).unwrap();
            write_synced(io, &root.join("new"), b"n");
        });
        // A prefix of: create tmp, rename it over old, remove gone, create new.
        let expect: BTreeSet<Vec<String>> = [
            vec!["gone", "old"],
            vec!["gone", "old", "tmp"],
            vec!["gone", "old"],
            vec!["old"],
            vec!["new", "old"],
        ]
        .into_iter()
        .map(|v| v.into_iter().map(String::from).collect())
        .collect();
        assert_eq!(names(&all), expect);
        for o in &all {
            // "gone" goes only after the rename over "old" survived.
            let old = &o[Path::new("old")];
            assert!(old == b"o" || old == b"t", "{old:?}");
            assert!(o.contains_key(Path::new("gone")) || old == b"t");
        }
        assert!(all.iter().any(|o| o[Path::new("old")] == b"o"));
        assert!(all
            .iter()
            .any(|o| o[Path::new("old")] == b"t" && o.contains_key(Path::new("gone"))));
    }

    #[test]
    fn a_directory_sync_makes_its_entries_durable() {
        for o in outcomes(|io, root| {
            io.create_dir_all(&root.join("tmp")).unwrap();
            io.create_dir_all(&root.join("d")).unwrap();
            io.sync_dir(root).unwrap();
            write_synced(io, &root.join("tmp/x"), b"x");
            io.hard_link(&root.join("tmp/x"), &root.join("d/y"))
                .unwrap();
            write_synced(io, &root.join("tmp/z"), b"z");
            io.rename(&root.join("tmp/z"), &root.join("d/z")).unwrap();
            io.sync_dir(&root.join("d")).unwrap();
        }) {
            assert_eq!(o[Path::new("d/y")], b"x");
            assert_eq!(o[Path::new("d/z")], b"z");
            // The rename out of tmp is durable with d, and so is tmp/z's creation before it,
            // and tmp/x's before that: tmp/z never comes back.
            assert_eq!(o.get(Path::new("tmp/x")).map(|v| &v[..]), Some(&b"x"[..]));
            assert!(!o.contains_key(Path::new("tmp/z")));
        }
    }

    #[test]
    fn a_lost_directory_takes_its_entries() {
        let all = outcomes(|io, root| {
            io.create_dir_all(&root.join("d")).unwrap();
            write_synced(io, &root.join("d/f"), b"f");
            io.sync_dir(&root.join("d")).unwrap();
        });
        let seen = names(&all);
        assert!(seen.contains(&vec![]), "{seen:?}");
        assert!(seen.contains(&vec!["d/f".to_string()]), "{seen:?}");
        assert_eq!(seen.len(), 2, "{seen:?}");
    }

    #[test]
    fn after_the_plug_every_operation_fails_and_nothing_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let fp = Arc::new(Failpoints::default());
        let pl = fp.record_power_loss(dir.path()).unwrap();
        let io = Io::with_failpoints(true, fp);
        let f = write_synced(&io, &dir.path().join("f"), b"a");
        io.sync_dir(dir.path()).unwrap();
        pl.pull_plug_after(1);
        io.pwrite_all(&f, b"b", 0, FP_WRITE).unwrap();
        assert!(!pl.plug_pulled());
        let err = io.sync_data(&f, FP_FSYNC).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        assert!(pl.plug_pulled());
        assert!(io.create(&dir.path().join("g")).is_err());
        assert!(
            !dir.path().join("g").exists(),
            "a refused operation touches nothing"
        );
        // The write before the plug was never synced: some crash loses it.
        let report = pl.crash(0).unwrap();
        assert_eq!(report.writes, 1);
        assert_eq!(report.name_changes, 0);
        // The crash starts recording afresh, plug back in, from what it left.
        let f = io
            .open(&dir.path().join("f"), fs::OpenOptions::new().write(true))
            .unwrap();
        io.pwrite_all(&f, b"c", 0, FP_WRITE).unwrap();
        io.sync_data(&f, FP_FSYNC).unwrap();
        assert_eq!(pl.crash(1).unwrap(), CrashReport::default());
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"c");
    }
}
