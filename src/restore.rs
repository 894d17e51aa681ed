//! `walserver restore-wal %f %p`: PostgreSQL's `restore_command` over walserver's archive.
//!
//! PostgreSQL runs it for every file recovery needs, with `%f` the file's name in the archive
//! and `%p` where to put it (`pg_wal/RECOVERYXLOG`, `pg_wal/RECOVERYHISTORY`, relative to the
//! data directory it runs in). It asks for files that do not exist as a matter of course:
//! the history file of the next timeline, to learn whether one exists; the segment after the
//! last one archived, to learn where recovery ends. The contract, as PostgreSQL 15 reads the
//! exit status:
//!
//! - 0: `%p` holds the file, whole and checked against its sidecar. It is written under a
//!   temporary name beside `%p`, fsynced and renamed into place, so `%p` is never partial.
//! - [`EXIT_MISSING`] (1): the archive has no such file. PostgreSQL treats it as the end of
//!   what the archive offers. Only whole segments, history files and a promotion's
//!   `.partial` are served; an `archive_timeout` prefix is no file PostgreSQL asks for.
//! - [`EXIT_FAILED`] (200): the object is damaged or the archive could not be read. Any
//!   status up to 125 would tell PostgreSQL "not in the archive", and a recovery without a
//!   target would then end early at WAL the archive holds and fork a new timeline over it;
//!   above 125 PostgreSQL stops recovery with an error instead, which a person can act on.
//!
//! It does not read the archive's identity (`wal_archive::IDENTITY_FILE`), as walserver's
//! own readers do: it has no system identifier to compare with (the data directory is
//! PostgreSQL's), and PostgreSQL compares its own with the one every segment's first page
//! header carries, refusing a segment of another system ("WAL file is from different
//! database system"); an archive that PostgreSQL's `archive_command` filled, without an
//! identity, is served as any other.
//!
//! Prefetch (`--prefetch N`, as WAL-G does): PostgreSQL asks for one segment at a time and
//! waits for each, so a restore from a remote store pays a round trip per segment. With
//! `--prefetch N`, a segment served also starts a background `walserver restore-wal` (its
//! own process group, no output) that fetches the N segments after it into a spool,
//! `.walserver-prefetch/` in `%p`'s directory (`pg_wal/`, since PostgreSQL runs the command
//! in the data directory): on `%p`'s file system, so that a spooled file goes into place
//! with a rename, and inside the data directory, so that it goes with it (PostgreSQL takes
//! only WAL-named files of `pg_wal` for its own). Each is fetched through
//! `ArchiveTarget::get`, so checked against its sidecar, written under a temporary name,
//! fsynced and renamed to `NAME.CCCCCCCC`, its CRC32C in its name. A request takes a
//! spooled file only once its bytes match that CRC (else it removes it and reads the
//! archive, as without a spool); a temporary file is never taken. Each request removes
//! every spooled file but the N after it, so the spool holds at most N segments, plus the
//! temporary files of the fetches in flight; a fetch is claimed by a `NAME.fetching` file
//! holding its process id, so two workers do not fetch one segment.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use wal_archive::{ArchiveTarget, SIDECAR_SUFFIX};

/// The exit status for a file the archive does not have.
pub const EXIT_MISSING: i32 = 1;
/// The exit status for every failure that is not a missing file (see the module's story).
pub const EXIT_FAILED: i32 = 200;

/// What `restore-wal` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restored {
    /// `dest` now holds the file: this many bytes.
    Written(u64),
    /// The archive has no such file.
    Missing,
}

/// The spool's directory name, in `%p`'s directory.
pub const SPOOL_DIR: &str = ".walserver-prefetch";

/// Fetches `name` from `target`, checked, and writes it to `dest` (temporary file, fsync,
/// rename). Nothing is written unless the whole file was fetched and checked.
pub fn restore_wal(target: &ArchiveTarget, name: &str, dest: &Path) -> anyhow::Result<Restored> {
    Ok(restore_wal_prefetching(target, name, dest, 0)?.0)
}

/// [`restore_wal`], taking a checked spooled copy of `name` when there is one, and keeping
/// the spool to the `prefetch` segments after it. Returns with what was done the segment
/// size to prefetch with, when `prefetch` is not 0 and `name` was a segment: the caller
/// starts [`prefetch`] for it in the background.
pub fn restore_wal_prefetching(
    target: &ArchiveTarget,
    name: &str,
    dest: &Path,
    prefetch: u32,
) -> anyhow::Result<(Restored, Option<u64>)> {
    if !servable(name)? {
        return Ok((Restored::Missing, None));
    }
    let spool = spool_of(dest);
    let segment = SegmentName::parse(name);
    let written = match segment.and_then(|_| take_spooled(&spool, name, dest).transpose()) {
        Some(taken) => taken.with_context(|| format!("taking {name} from {}", spool.display()))?,
        None => {
            let Some(bytes) = target.get(name)? else {
                return Ok((Restored::Missing, None));
            };
            write_whole(dest, &bytes)
                .with_context(|| format!("writing {name} to {}", dest.display()))?;
            bytes.len() as u64
        }
    };
    let Some(segment) = segment else {
        return Ok((Restored::Written(written), None));
    };
    // The spool keeps the segments after this one, nothing else; a failure to tidy it costs
    // only space, never the restore.
    let keep: Vec<String> = (1..=prefetch)
        .filter_map(|i| segment.after(i, written))
        .collect();
    let _ = tidy_spool(&spool, &keep);
    let start = (prefetch > 0 && written > 0).then_some(written);
    Ok((Restored::Written(written), start))
}

/// Fetches the `count` segments after `name` (of `segment_size` bytes) from `target` into
/// the spool beside `dest`, stopping at the first the archive lacks; the background half of
/// `--prefetch`. Each goes in whole and checked or not at all.
pub fn prefetch(
    target: &ArchiveTarget,
    name: &str,
    dest: &Path,
    count: u32,
    segment_size: u64,
) -> anyhow::Result<()> {
    let Some(segment) = SegmentName::parse(name) else {
        return Ok(());
    };
    let spool = spool_of(dest);
    fs::create_dir_all(&spool).with_context(|| format!("creating {}", spool.display()))?;
    for next in (1..=count).filter_map(|i| segment.after(i, segment_size)) {
        if spooled(&spool, &next)?.is_some() {
            continue;
        }
        let Some(claim) = Claim::take(&spool, &next)? else {
            continue;
        };
        let Some(bytes) = target.get(&next)? else {
            drop(claim);
            return Ok(());
        };
        let file = spool.join(format!("{next}.{:08x}", crc32c::crc32c(&bytes)));
        write_whole(&file, &bytes).with_context(|| format!("writing {}", file.display()))?;
        drop(claim);
    }
    Ok(())
}

/// `%p`'s directory's spool.
fn spool_of(dest: &Path) -> PathBuf {
    match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.join(SPOOL_DIR),
        _ => PathBuf::from(SPOOL_DIR),
    }
}

/// A segment's file name, `TTTTTTTTXXXXXXXXYYYYYYYY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SegmentName {
    timeline: u32,
    log: u32,
    seg: u32,
}

impl SegmentName {
    fn parse(name: &str) -> Option<SegmentName> {
        let hex = |r: std::ops::Range<usize>| u32::from_str_radix(name.get(r)?, 16).ok();
        if name.len() != 24 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(SegmentName {
            timeline: hex(0..8)?,
            log: hex(8..16)?,
            seg: hex(16..24)?,
        })
    }

    /// The name `n` segments after this one on its timeline, with segments of
    /// `segment_size` bytes (PostgreSQL's numbering: `segments per 4 GiB` per `log`).
    fn after(&self, n: u32, segment_size: u64) -> Option<String> {
        if !segment_size.is_power_of_two() || segment_size > 1 << 32 {
            return None;
        }
        let per_log = (1u64 << 32) / segment_size;
        let segno = u64::from(self.log) * per_log + u64::from(self.seg) + u64::from(n);
        let log = u32::try_from(segno / per_log).ok()?;
        Some(format!(
            "{:08X}{log:08X}{:08X}",
            self.timeline,
            segno % per_log
        ))
    }
}

/// The spooled file of `name`, `NAME.CCCCCCCC`, with the CRC32C its name gives.
fn spooled(spool: &Path, name: &str) -> std::io::Result<Option<(PathBuf, u32)>> {
    let entries = match fs::read_dir(spool) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let file = entry?.file_name();
        let Some(crc) = file
            .to_str()
            .and_then(|f| f.strip_prefix(name)?.strip_prefix('.'))
            .filter(|c| c.len() == 8)
            .and_then(|c| u32::from_str_radix(c, 16).ok())
        else {
            continue;
        };
        return Ok(Some((spool.join(file), crc)));
    }
    Ok(None)
}

/// Moves the spooled copy of `name` to `dest` if its bytes match the CRC32C in its name; a
/// copy that does not is removed. `None` when there is no good copy.
fn take_spooled(spool: &Path, name: &str, dest: &Path) -> std::io::Result<Option<u64>> {
    let Some((file, crc)) = spooled(spool, name)? else {
        return Ok(None);
    };
    let bytes = fs::read(&file)?;
    if crc32c::crc32c(&bytes) != crc {
        fs::remove_file(&file)?;
        return Ok(None);
    }
    fs::rename(&file, dest)?;
    sync_dir_of(dest)?;
    Ok(Some(bytes.len() as u64))
}

/// Removes every spooled file but those of `keep` (temporary files and claims of live
/// fetches stay).
fn tidy_spool(spool: &Path, keep: &[String]) -> std::io::Result<()> {
    for entry in fs::read_dir(spool)? {
        let file = entry?.file_name();
        let Some(f) = file.to_str() else { continue };
        let stem = f.get(..24).filter(|s| SegmentName::parse(s).is_some());
        let done = f.len() == 24 + 9 && !f.ends_with(".fetching");
        if let Some(stem) = stem {
            if done && !keep.iter().any(|k| k == stem) {
                fs::remove_file(spool.join(f))?;
            }
        }
    }
    Ok(())
}

/// A claim on fetching one segment into the spool: `NAME.fetching` holding the fetcher's
/// process id, removed when dropped. A claim whose process is gone (a killed fetch) is
/// taken over.
struct Claim(PathBuf);

impl Claim {
    fn take(spool: &Path, name: &str) -> std::io::Result<Option<Claim>> {
        let path = spool.join(format!("{name}.fetching"));
        for _ in 0..2 {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    f.write_all(std::process::id().to_string().as_bytes())?;
                    return Ok(Some(Claim(path)));
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let holder = fs::read_to_string(&path)
                        .ok()
                        .and_then(|p| p.trim().parse::<u32>().ok());
                    let alive =
                        holder.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
                    if alive {
                        return Ok(None);
                    }
                    let _ = fs::remove_file(&path);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Whether `name` is a file `restore-wal` hands to PostgreSQL. A name that cannot be a
/// file's name in the archive is an error, since only a mistyped `restore_command` gives one.
fn servable(name: &str) -> anyhow::Result<bool> {
    anyhow::ensure!(
        !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\0']),
        "{name:?} is not the name of a file in a WAL archive (restore_command passes %f, the file's name)"
    );
    // An `archive_timeout` prefix (`NAME.partial.EEEEEEEE`, see `ArchivedFile`) is judged by
    // its shape: which offsets are valid depends on a segment size restore-wal is not told.
    let prefix = name
        .get(24..)
        .is_some_and(|rest| rest.starts_with(".partial."));
    Ok(!prefix && !name.ends_with(SIDECAR_SUFFIX))
}

/// Writes `bytes` as `dest` through a temporary file in `dest`'s directory.
fn write_whole(dest: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temporary_beside(dest);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, dest)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    // The rename is durable once the directory is; PostgreSQL renames the file again when it
    // keeps it, but until then a crash should not leave an empty `%p`.
    sync_dir_of(dest)
}

fn sync_dir_of(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

fn temporary_beside(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.restore-wal.{}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_files_and_a_promotions_partial_are_served() {
        for name in [
            "000000010000000000000003",
            "00000002.history",
            "000000010000000000000003.partial",
            "000000010000000000000003.00000028.backup",
        ] {
            assert!(servable(name).unwrap(), "{name}");
        }
        for name in [
            "000000010000000000000003.partial.00800000",
            "000000010000000000000003.crc32c",
        ] {
            assert!(!servable(name).unwrap(), "{name}");
        }
        for name in ["", "../x", "a/b", ".000000010000000000000003.1.tmp"] {
            assert!(servable(name).is_err(), "{name:?}");
        }
    }

    #[test]
    fn a_restore_writes_the_checked_file_or_nothing() {
        let archive = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let target = ArchiveTarget::Directory(archive.path().into());
        let name = "000000010000000000000002";
        let dest = out.path().join("RECOVERYXLOG");
        assert_eq!(
            restore_wal(&target, name, &dest).unwrap(),
            Restored::Missing
        );
        assert!(!dest.exists());
        target
            .put(name, &b"segment bytes"[..], wal_archive::Compression::None)
            .unwrap();
        assert_eq!(
            restore_wal(&target, name, &dest).unwrap(),
            Restored::Written(13)
        );
        assert_eq!(fs::read(&dest).unwrap(), b"segment bytes");

        // A flipped byte: refused, and an existing %p is left as it was, nothing beside it.
        fs::write(archive.path().join(name), b"segment bytez").unwrap();
        fs::write(&dest, b"older").unwrap();
        let e = format!("{:#}", restore_wal(&target, name, &dest).unwrap_err());
        assert!(e.contains(name) && e.contains("corrupt"), "{e}");
        assert_eq!(fs::read(&dest).unwrap(), b"older");
        assert_eq!(fs::read_dir(out.path()).unwrap().count(), 1);
    }
}

#[cfg(test)]
mod prefetch_tests {
    use super::*;

    #[test]
    fn the_next_segments_follow_postgresql_s_numbering() {
        let s = SegmentName::parse("0000000200000001000000FE").unwrap();
        let seg = 16 << 20;
        assert_eq!(s.after(1, seg).unwrap(), "0000000200000001000000FF");
        assert_eq!(s.after(2, seg).unwrap(), "000000020000000200000000");
        let s = SegmentName::parse("000000010000000000000FFF").unwrap();
        assert_eq!(s.after(1, 1 << 20).unwrap(), "000000010000000100000000");
        assert_eq!(s.after(1, 3 << 20), None);
        for name in ["00000002.history", "000000010000000000000003.partial", "x"] {
            assert_eq!(SegmentName::parse(name), None, "{name}");
        }
    }

    /// Three segments of 1 MiB put in an archive; `dest` in `pg_wal` of a data directory.
    fn setup() -> (tempfile::TempDir, ArchiveTarget, PathBuf, Vec<Vec<u8>>) {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("archive");
        fs::create_dir(&archive).unwrap();
        let target = ArchiveTarget::Directory(archive);
        let segments: Vec<Vec<u8>> = (1..=4u8).map(|i| vec![i; 1 << 20]).collect();
        for (i, bytes) in segments.iter().enumerate() {
            let name = format!("0000000100000000000000{:02X}", i + 1);
            target
                .put(&name, bytes.clone(), wal_archive::Compression::None)
                .unwrap();
        }
        let pg_wal = dir.path().join("data/pg_wal");
        fs::create_dir_all(&pg_wal).unwrap();
        (dir, target, pg_wal.join("RECOVERYXLOG"), segments)
    }

    fn spool_names(dest: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(spool_of(dest))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// A request serves the segment and asks for the prefetch of the next; the prefetch
    /// spools them checked; the next request takes its file from the spool (the archive's
    /// copy is gone) and the spool keeps only the segments after it; a spooled file whose
    /// bytes do not match its name is never served, and the archive's copy is.
    #[test]
    fn spooled_segments_are_served_only_checked_and_the_spool_stays_bounded() {
        let (_dir, target, dest, segments) = setup();
        let first = "000000010000000000000001";
        let (done, start) = restore_wal_prefetching(&target, first, &dest, 2).unwrap();
        assert_eq!(done, Restored::Written(1 << 20));
        assert_eq!(start, Some(1 << 20));
        assert_eq!(fs::read(&dest).unwrap(), segments[0]);
        prefetch(&target, first, &dest, 2, 1 << 20).unwrap();
        let crc = |i: usize| format!("{:08x}", crc32c::crc32c(&segments[i]));
        assert_eq!(
            spool_names(&dest),
            [
                format!("000000010000000000000002.{}", crc(1)),
                format!("000000010000000000000003.{}", crc(2)),
            ]
        );

        // Served from the spool: the archive no longer has it.
        let second = "000000010000000000000002";
        let ArchiveTarget::Directory(archive) = &target else {
            unreachable!()
        };
        fs::remove_file(archive.join(second)).unwrap();
        let (done, _) = restore_wal_prefetching(&target, second, &dest, 2).unwrap();
        assert_eq!(done, Restored::Written(1 << 20));
        assert_eq!(fs::read(&dest).unwrap(), segments[1]);
        prefetch(&target, second, &dest, 2, 1 << 20).unwrap();
        assert_eq!(
            spool_names(&dest),
            [
                format!("000000010000000000000003.{}", crc(2)),
                format!("000000010000000000000004.{}", crc(3)),
            ]
        );

        // A spooled file damaged after it was checked: never served; the archive's is.
        let third = "000000010000000000000003";
        let spooled_third = spool_of(&dest).join(format!("{third}.{}", crc(2)));
        let mut bytes = segments[2].clone();
        bytes[100] ^= 1;
        fs::write(&spooled_third, &bytes).unwrap();
        // A temporary file of a fetch in flight is never taken either.
        fs::write(
            spool_of(&dest).join(format!(".{third}.00000000.restore-wal.1.tmp")),
            b"partial",
        )
        .unwrap();
        let (done, _) = restore_wal_prefetching(&target, third, &dest, 1).unwrap();
        assert_eq!(done, Restored::Written(1 << 20));
        assert_eq!(fs::read(&dest).unwrap(), segments[2]);
        assert!(!spooled_third.exists());

        // Past the archive's end the prefetch stops, and a missing file is still missing.
        let fourth = "000000010000000000000004";
        let (done, _) = restore_wal_prefetching(&target, fourth, &dest, 2).unwrap();
        assert_eq!(done, Restored::Written(1 << 20));
        prefetch(&target, fourth, &dest, 2, 1 << 20).unwrap();
        let fifth = "000000010000000000000005";
        assert_eq!(
            restore_wal_prefetching(&target, fifth, &dest, 2).unwrap(),
            (Restored::Missing, None)
        );
    }

    #[test]
    fn a_claim_of_a_live_fetch_holds_and_a_dead_one_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let name = "000000010000000000000002";
        let claim = Claim::take(dir.path(), name).unwrap().expect("claimed");
        assert!(Claim::take(dir.path(), name).unwrap().is_none());
        drop(claim);
        // A process id that cannot be alive: beyond Linux's largest pid_max.
        fs::write(dir.path().join(format!("{name}.fetching")), "4294967295").unwrap();
        assert!(Claim::take(dir.path(), name).unwrap().is_some());
    }
}
