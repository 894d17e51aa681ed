//! Timeline control, run on the writer thread between batches (so it sees a quiet WAL, every
//! byte written durable; the published flushed end may stop before the end of a standby's
//! partial record, so these look at the writer's durable end): promotion (a new timeline at the last complete record), following an
//! upstream's switch, the switch itself with its copied first segment, storing history files,
//! and truncation.
//!
//! **Invariants:** the control file is the commit point of a switch (the history file and the
//! switch segment are written first, and are harmless leftovers if a crash comes before it);
//! a timeline number some history file names is never reused; a truncation stores an exact
//! flush pointer before it cuts, so a crash in the middle redoes the same cut at open, and the
//! fork cut lowers the told commit point to the cut before it cuts (`told.rs`); the tail
//! cache is emptied before a truncation cuts and before a switch makes the new timeline current.

use std::fs::OpenOptions;
use std::sync::Arc;

use wal_types::{Lsn, TimelineId};

use crate::durable::write_atomic_with;
use crate::history::{check_history_for, format_history, parse_history};
use crate::io::{FP_FSYNC, FP_WRITE};
use crate::naming::{
    history_file_name, parse_history_file_name, parse_segment_file_name, segment_file_name,
};
use crate::scan::last_record_end;
use crate::state::{CommitBound, TimelineState};
use crate::writer::Writer;
use crate::{HistoryEntry, Result, Role, WalError};

impl Writer {
    /// Starts a new timeline at the end of the last complete record at or below the durable
    /// end.
    pub(crate) fn promote(&mut self, reason: &str) -> Result<(TimelineId, Lsn)> {
        let st = self.inner.state().clone();
        let x = last_record_end(
            &self.inner.files,
            &st.view(),
            &self.inner.cfg,
            st.wal_start,
            self.durable_end(),
        )?;
        // Like PostgreSQL's findNewestTimeLine: never reuse a timeline some history file names.
        let mut newest = st.tli;
        let pg_wal = self.inner.pg_wal();
        let entries = (self.inner.io)
            .read_dir(pg_wal)
            .map_err(|e| WalError::io(format!("listing {}", pg_wal.display()), e))?;
        for e in entries {
            if let Some(t) = parse_history_file_name(&e.file_name().to_string_lossy()) {
                newest = newest.max(t);
            }
        }
        let new_tli = newest.next();
        let mut history = st.history.to_vec();
        // The moment goes into the reason, so that a timeline of the same number made
        // elsewhere at the same switch point still has another history (`departs_from`).
        let made = wal_types::time::format_time(std::time::SystemTime::now());
        history.push(HistoryEntry {
            parent: st.tli,
            switch_lsn: x,
            reason: format!("{reason} at {made}"),
        });
        let bytes = format_history(&history);
        self.switch_to(new_tli, history, &bytes, x, Some(Role::Primary))?;
        Ok((new_tli, x))
    }

    /// Follows an upstream's switch to `new_tli` at `switch_lsn`.
    pub(crate) fn follow(
        &mut self,
        new_tli: TimelineId,
        bytes: Vec<u8>,
        switch_lsn: Lsn,
    ) -> Result<()> {
        let entries = parse_history(&bytes)?;
        check_history_for(new_tli, &entries)?;
        let st = self.inner.state().clone();
        if new_tli <= st.tli {
            return Err(WalError::InvalidHistory(format!(
                "timeline {new_tli} is not newer than the current timeline {}",
                st.tli
            )));
        }
        let Some((last, ancestors)) = entries.split_last() else {
            return Err(WalError::InvalidHistory(format!(
                "the history of timeline {new_tli} names no ancestor"
            )));
        };
        if last.parent != st.tli || last.switch_lsn != switch_lsn {
            return Err(WalError::InvalidHistory(format!(
                "timeline {new_tli} branched from timeline {} at {}, not from this node's timeline {} at {switch_lsn}",
                last.parent, last.switch_lsn, st.tli
            )));
        }
        let same = ancestors.len() == st.history.len()
            && ancestors
                .iter()
                .zip(st.history.iter())
                .all(|(a, b)| a.parent == b.parent && a.switch_lsn == b.switch_lsn);
        if !same {
            return Err(WalError::InvalidHistory(format!(
                "the history of timeline {new_tli} disagrees with this node's history of timeline {}",
                st.tli
            )));
        }
        let end = self.durable_end();
        if end > switch_lsn {
            return Err(WalError::Forked {
                fork_lsn: switch_lsn,
                local_end: end,
            });
        }
        if end < switch_lsn {
            return Err(WalError::BehindSwitchPoint {
                switch_lsn,
                flushed: end,
            });
        }
        // A told point above the switch belongs to the history left behind (a new primary
        // that lacked WAL this node was told was acknowledged, and which this node never
        // received): the new timeline's WAL past the switch has been told nothing yet, so
        // readers here must not take it up to that old point.
        self.lower_told_to(switch_lsn)?;
        let role = st.role;
        self.switch_to(new_tli, entries, &bytes, switch_lsn, role)
    }

    /// Records the node's role in the control data, atomically.
    /// Records `role`. A primary that becomes a standby records its durable end with it, in
    /// the same write: WAL it wrote as a primary, which only an explicit cut may drop.
    pub(crate) fn set_role(&mut self, role: Role) -> Result<()> {
        let mut st = self.inner.state().clone();
        if st.role == Some(Role::Primary) && role == Role::Standby {
            st.primary_end = Some(self.durable_end());
        }
        st.role = Some(role);
        self.inner.write_control(&st)?;
        let mut now = self.inner.state_mut();
        now.role = st.role;
        now.primary_end = st.primary_end;
        Ok(())
    }

    /// Writes the clean-shutdown mark (`clean.rs`) at the durable end, which between batches
    /// is the end of everything written.
    pub(crate) fn mark_clean_shutdown(&mut self) -> Result<()> {
        let tli = self.inner.state().tli;
        let end = self.durable_end();
        crate::clean::write(&self.inner.io, &self.inner.tmp, &self.inner.dir, tli, end)
    }

    pub(crate) fn store_history(&mut self, tli: TimelineId, bytes: &[u8]) -> Result<()> {
        let target = self.inner.pg_wal().join(history_file_name(tli));
        write_atomic_with(&self.inner.io, &self.inner.tmp, &target, bytes)
    }

    /// Makes `new_tli` current, beginning at `x`, with `role`. The control file is the commit
    /// point of both: a crash before it leaves the old timeline current and the role as it was
    /// (the new history file and switch segment are harmless leftovers, the latter removed at
    /// open).
    fn switch_to(
        &mut self,
        new_tli: TimelineId,
        history: Vec<HistoryEntry>,
        history_bytes: &[u8],
        x: Lsn,
        role: Option<Role>,
    ) -> Result<()> {
        let seg = self.seg();
        self.store_history(new_tli, history_bytes)?;
        if x.segment_offset(seg) != 0 {
            self.copy_switch_segment(new_tli, x)?;
        }
        let old = self.inner.state().clone();
        self.inner.tail.clear();
        let st = TimelineState {
            tli: new_tli,
            history: Arc::new(history),
            timeline_start: x,
            wal_start: old.wal_start,
            written: x,
            flushed: x,
            // A promotion makes this node the one that decides the commit point; a follow
            // keeps what the upstream told.
            commit: match (role, old.commit) {
                (Some(Role::Primary), CommitBound::Told(_)) => CommitBound::None,
                (_, c) => c,
            },
            role,
            primary_end: old.primary_end,
        };
        self.inner.write_control(&st)?;
        self.store_pointer(new_tli, x, true)?;
        *self.inner.state_mut() = st;
        self.inner.publish();
        self.resume_at(new_tli, x, true);
        self.request_prealloc(x.segment_number(seg) + 1);
        tracing::info!(timeline = %new_tli, start = %x, "switched to a new timeline");
        Ok(())
    }

    /// Creates the new timeline's first segment: a copy of the old one up to `x`, zeros after.
    fn copy_switch_segment(&mut self, new_tli: TimelineId, x: Lsn) -> Result<()> {
        let seg = self.seg();
        let segno = x.segment_number(seg);
        let name = segment_file_name(new_tli, segno, seg);
        let tmp = self.inner.tmp.join(format!("{name}.switch"));
        let view = self.inner.state().view();
        let io = &self.inner.io;
        let target = self.inner.pg_wal().join(&name);
        let ctx = |what: &str, path: &std::path::Path| {
            let ctx = format!("creating switch segment {name}: {what} {}", path.display());
            move |e| WalError::io(ctx, e)
        };
        let result = (|| -> Result<()> {
            let f = io.create(&tmp).map_err(ctx("creating", &tmp))?;
            let mut pos = x.segment_start(seg);
            while pos < x {
                let b = self
                    .inner
                    .files
                    .read(&view, pos, x, 1 << 20)?
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| WalError::SegmentRemoved {
                        segment: segment_file_name(view.timeline_of(pos), segno, seg),
                    })?;
                io.pwrite_all(&f, &b, pos.segment_offset(seg), FP_WRITE)
                    .map_err(ctx("writing", &tmp))?;
                pos = pos + b.len() as u64;
            }
            io.write_zeros(
                &f,
                x.segment_offset(seg),
                seg - x.segment_offset(seg),
                FP_WRITE,
            )
            .map_err(ctx("writing", &tmp))?;
            io.sync_all(&f, FP_FSYNC).map_err(ctx("syncing", &tmp))?;
            io.rename(&tmp, &target)
                .map_err(ctx("renaming into place", &tmp))?;
            io.sync_dir(self.inner.pg_wal())
                .map_err(ctx("syncing", self.inner.pg_wal()))
        })();
        if result.is_err() {
            let _ = io.remove_file(&tmp);
        }
        self.inner.files.evict(|t, s| t == new_tli && s == segno);
        result
    }

    /// The fork cut (`Wal::truncate_beyond`): lowers the told commit point to `lsn`, then
    /// drops the WAL beyond it if there is any (`None`: nothing lay beyond). The point first,
    /// on disk and then in the position (`told.rs`): from the cut on the watch shows no
    /// commit point above it, and a crash between leaves the point at the cut.
    pub(crate) fn cut_beyond(&mut self, lsn: Lsn) -> Result<Option<u64>> {
        let beyond = lsn < self.durable_end() || self.dirty_beyond(lsn);
        if beyond {
            self.check_truncate(lsn)?;
        }
        self.lower_told_to(lsn)?;
        if beyond {
            self.truncate(lsn).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Lowers the commit point to `lsn` if it is above: the told point on disk first, then
    /// the published one, so that from here on the watch shows no commit point above `lsn`
    /// and a crash in between leaves the point on disk at `lsn`.
    fn lower_told_to(&mut self, lsn: Lsn) -> Result<()> {
        self.inner
            .told
            .cut_to(&self.inner.io, &self.inner.tmp, lsn)?;
        self.inner.update_commit(|old| match old {
            CommitBound::Told(c) => CommitBound::Told(c.min(lsn)),
            CommitBound::Own(c) => CommitBound::Own(c.min(lsn)),
            CommitBound::None => CommitBound::None,
        });
        Ok(())
    }

    /// Refuses a cut at `lsn` that storage cannot make: beyond the durable end, before the
    /// timeline's start, or into WAL already removed.
    fn check_truncate(&self, lsn: Lsn) -> Result<()> {
        let st = self.inner.state();
        let end = self.durable_end();
        let bad = |reason: String| WalError::BadTruncate { lsn, reason };
        if lsn > end {
            return Err(bad(format!("the WAL of timeline {} ends at {end}", st.tli)));
        }
        if lsn < st.timeline_start {
            return Err(bad(format!(
                "timeline {} begins at {}",
                st.tli, st.timeline_start
            )));
        }
        if lsn < self.inner.oldest_retained() {
            return Err(bad("that WAL was already removed".into()));
        }
        Ok(())
    }

    /// Drops the current timeline's WAL beyond `lsn`.
    pub(crate) fn truncate(&mut self, lsn: Lsn) -> Result<u64> {
        let seg = self.seg();
        let st = self.inner.state().clone();
        let end = self.durable_end();
        if lsn == end && !self.dirty_beyond(lsn) {
            return Ok(0);
        }
        self.check_truncate(lsn)?;
        self.inner.tail.clear();
        // The exact pointer first: a crash in the middle of the cut redoes it at open.
        self.store_pointer(st.tli, lsn, true)?;
        self.forget_files();
        let segno = lsn.segment_number(seg);
        let path = self.inner.files.path(st.tli, segno);
        let opened = (self.inner.io)
            .open_if_exists(&path, OpenOptions::new().write(true))
            .map_err(|e| WalError::io(format!("opening {}", path.display()), e))?;
        if let Some(f) = opened {
            let off = lsn.segment_offset(seg);
            (self.inner.io)
                .write_zeros(&f, off, seg - off, FP_WRITE)
                .and_then(|_| self.inner.io.sync_data(&f, FP_FSYNC))
                .map_err(|e| WalError::io(format!("truncating {}", path.display()), e))?;
        }
        let pg_wal = self.inner.pg_wal();
        let entries = (self.inner.io)
            .read_dir(pg_wal)
            .map_err(|e| WalError::io(format!("listing {}", pg_wal.display()), e))?;
        for e in entries {
            if let Some((t, s)) = parse_segment_file_name(&e.file_name().to_string_lossy(), seg) {
                if t == st.tli && s > segno {
                    (self.inner.io).remove_file(&e.path()).map_err(|err| {
                        WalError::io(format!("removing {}", e.path().display()), err)
                    })?;
                }
            }
        }
        self.inner.files.evict(|t, s| t == st.tli && s > segno);
        (self.inner.io)
            .sync_dir(pg_wal)
            .map_err(|e| WalError::io(format!("syncing {}", pg_wal.display()), e))?;
        let dropped = end.0 - lsn.0;
        self.resume_at(st.tli, lsn, false);
        self.inner.set_positions(lsn, lsn);
        // A cut below the end this node wrote as a primary is an explicit one (a rejoin, a
        // member following a new leader past the fork; rule 4 never cuts below it): what
        // is left is shared with the new upstream's history, and the commit point it tells
        // is the floor from now on. Written after the cut: a crash between keeps the floor,
        // the side that refuses.
        let mut st = self.inner.state().clone();
        if st.primary_end.is_some_and(|e| lsn < e) {
            st.primary_end = None;
        }
        self.inner.write_control(&st)?;
        self.inner.state_mut().primary_end = st.primary_end;
        tracing::warn!(lsn = %lsn, dropped, "truncated WAL");
        Ok(dropped)
    }
}
