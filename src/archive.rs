//! `walserver archive list | verify`: what an archive holds, and whether a restore can trust it.
//!
//! `list` shows the system the archive belongs to (`wal_archive::IDENTITY_FILE`) and each
//! timeline's WAL as a restore of it would read it (`wal_archive::Catalog`): where it starts
//! and ends, from which objects, and the gaps. `verify` also reads every
//! object back against its checksum sidecar and checks each timeline's continuity along the
//! path its history file describes, from the archive's start (`Catalog::plan`): every
//! segment under the name of the timeline that wrote its last byte, at each switch inside a
//! segment the old timeline's `.partial` of it, and the history file of each timeline of the
//! path. It fails on a corrupt object, an unreadable history file, or a gap; names that are
//! no WAL file are shown, not failed, since a person may keep notes beside the archive.

use std::fmt::Write as _;

use anyhow::Context;
use clap::Subcommand;
use wal_archive::{ArchiveError, ArchiveTarget, Catalog, Gap, ObjectInfo, Plan};
use wal_types::TimelineId;

/// The `archive` commands.
#[derive(Clone, Debug, Subcommand)]
pub enum ArchiveCommand {
    /// The timelines, their segments and their gaps.
    List,
    /// Check every object against its checksum and each timeline's continuity; exits non-zero
    /// on a corrupt object or a gap.
    ///
    /// Continuity is checked along the path each timeline's history file describes, from the
    /// archive's start (the lowest segment any of its WAL files holds) to the furthest of the
    /// timeline's last whole segment and its last switch point: every segment under the name
    /// of the timeline that wrote its last byte; at each switch inside a segment, the old
    /// timeline's `.partial` of it (or a prefix reaching the switch, or the whole segment);
    /// the history file of each timeline of the path whose WAL reaches the start. An archive
    /// that begins after timeline 1's start (archive_mode turned on late, old WAL removed on
    /// purpose) is no gap by that alone: nothing in it tells those apart from a loss, so its
    /// first segment is where a restore can begin.
    Verify,
}

/// An archive as read for listing: its objects and their catalogue.
pub struct Survey {
    pub objects: Vec<ObjectInfo>,
    pub catalog: Catalog,
}

impl Survey {
    /// Lists `target` and sorts its objects into timelines. The segment size is the one the
    /// archive's segments have (16 MiB if it holds none, which then matters to no name).
    pub fn read(target: &ArchiveTarget) -> anyhow::Result<Survey> {
        let objects = target.list().context("cannot list the archive")?;
        let segment_size = target
            .segment_size(&objects)
            .context("cannot read the archive's segment size")?
            .unwrap_or(16 << 20);
        let catalog = Catalog::new(&objects, segment_size);
        Ok(Survey { objects, catalog })
    }

    /// The restore plan of each timeline, or why its history could not be read.
    pub fn plans(&self, target: &ArchiveTarget) -> Vec<(TimelineId, Result<Plan, String>)> {
        self.catalog
            .timelines
            .keys()
            .map(|&tli| {
                let plan = match target.history(tli) {
                    Ok(Some(history)) => Ok(self.catalog.plan(tli, &history)),
                    Ok(None) => Err(format!(
                        "its history file {tli:08X}.history is missing",
                        tli = tli.0
                    )),
                    Err(e) => Err(e.to_string()),
                };
                (tli, plan)
            })
            .collect()
    }
}

/// Runs `archive list` or `archive verify` on `target`, printing to standard output.
pub fn run(target: &ArchiveTarget, command: &ArchiveCommand) -> anyhow::Result<()> {
    let survey = Survey::read(target)?;
    let (text, problems) = match command {
        ArchiveCommand::List => (list(target, &survey), Vec::new()),
        ArchiveCommand::Verify => verify(target, &survey),
    };
    print!("{text}");
    for p in &problems {
        println!("problem: {p}");
    }
    anyhow::ensure!(
        problems.is_empty(),
        "the archive failed verification: {} problem(s)",
        problems.len()
    );
    Ok(())
}

/// `archive list`'s text.
pub fn list(target: &ArchiveTarget, survey: &Survey) -> String {
    let system = match target.system_id() {
        Ok(Some(id)) => format!("system {id}"),
        Ok(None) => "no system named".to_string(),
        Err(e) => format!("system unreadable ({e})"),
    };
    let mut out = format!(
        "{} objects, segments of {} MiB, {system}\n",
        survey.objects.len(),
        survey.catalog.segment_size >> 20
    );
    for (tli, plan) in survey.plans(target) {
        let _ = write!(out, "timeline {}: ", tli.0);
        match plan {
            Err(why) => {
                let _ = writeln!(out, "cannot be restored: {why}");
            }
            Ok(plan) => {
                let _ = writeln!(out, "{}", describe(&plan));
                for g in gaps(&plan) {
                    let _ = writeln!(out, "  gap: {g}");
                }
            }
        }
    }
    for name in &survey.catalog.unknown {
        let _ = writeln!(out, "not a WAL file: {name}");
    }
    out
}

/// `archive verify`'s text and the problems it found.
pub fn verify(target: &ArchiveTarget, survey: &Survey) -> (String, Vec<String>) {
    let mut problems = Vec::new();
    let mut checked = 0;
    for o in &survey.objects {
        match target.get(&o.name) {
            Ok(Some(_)) => checked += 1,
            // Removed since the listing: a superseded archive_timeout prefix, say.
            Ok(None) => {}
            Err(e @ ArchiveError::Corrupt { .. }) => problems.push(e.to_string()),
            Err(e) => problems.push(format!("cannot read {}: {e}", o.name)),
        }
    }
    let plans = survey.plans(target);
    for (tli, plan) in &plans {
        match plan {
            Err(why) => problems.push(format!("timeline {}: {why}", tli.0)),
            Ok(plan) => {
                for g in gaps(plan) {
                    problems.push(format!("timeline {}: {g}", tli.0));
                }
            }
        }
    }
    let mut out = format!(
        "{checked} objects match their checksums; {} timeline(s)\n",
        plans.len()
    );
    for (tli, plan) in plans {
        if let Ok(plan) = plan {
            let _ = writeln!(out, "timeline {}: {}", tli.0, describe(&plan));
        }
    }
    if problems.is_empty() {
        out.push_str("ok: no corrupt object, no gap\n");
    }
    (out, problems)
}

fn describe(plan: &Plan) -> String {
    match (
        plan.start(),
        plan.end(),
        plan.pieces.first(),
        plan.pieces.last(),
    ) {
        (Some(start), Some(end), Some(first), Some(last)) => format!(
            "WAL from {start} to {end} in {} object(s), {} .. {}",
            plan.pieces.len(),
            first.name,
            last.name
        ),
        _ => "no WAL".to_string(),
    }
}

/// Each gap of `plan`, said: the runs of missing segments, then the other missing files.
fn gaps(plan: &Plan) -> impl Iterator<Item = String> + '_ {
    let missing = plan.missing.iter().map(ToString::to_string);
    plan.gaps.iter().map(gap).chain(missing)
}

fn gap(g: &Gap) -> String {
    if g.from == g.to {
        format!("segment {} is missing", g.first)
    } else {
        format!(
            "segments {} .. {} are missing ({})",
            g.first,
            g.last,
            g.to - g.from + 1
        )
    }
}
