//! `sortie recover RUN`: a damaged journal rebuilt from every record that can still be read
//! (`sortie_runner::recover`); says what was lost and how to go on.

use std::io::Write;

use crate::error::{Result, ResultExt};

use super::{Code, run_id};
use crate::args::Global;

/// Recovers a run.
pub(crate) fn recover(g: &Global, run: &str) -> Result<Code> {
    let run = run_id(run)?;
    let r = sortie_runner::recover::recover(&g.layout().absolute(), &run)
        .with_context(|| format!("cannot recover run {run}"))?;
    let mut out = std::io::stdout().lock();
    if g.json {
        serde_json::to_writer_pretty(&mut out, &r)?;
        writeln!(out)?;
        return Ok(Code::Ok);
    }
    writeln!(out, "run {run}: kept {} records", r.kept)?;
    if r.scanned > 0 {
        writeln!(
            out,
            "of which {} found whole in the journal's files past the damage",
            r.scanned
        )?;
    }
    if r.started_from_snapshot {
        writeln!(
            out,
            "no record could be read: the run's start was taken from its snapshot"
        )?;
    }
    match (r.lost, r.acknowledged) {
        (Some((from, to)), _) => writeln!(out, "lost: records {from}..{to}")?,
        (None, Some(_)) => writeln!(out, "lost: nothing the journal acknowledged")?,
        (None, None) => writeln!(
            out,
            "lost: unknown (no high-water mark): records after {} may be lost",
            r.kept.saturating_sub(1)
        )?,
    }
    if let Some(why) = &r.stopped {
        writeln!(out, "reading stopped at: {why}")?;
    }
    if !r.restored.is_empty() {
        writeln!(
            out,
            "restored from their files ({}): {} (resume records each from its files if it \
             ended, else adopts it: none runs again, no attempt number is used twice)",
            r.restored.len(),
            r.restored.join(", ")
        )?;
    }
    if !r.orphaned.is_empty() {
        writeln!(
            out,
            "orphaned ({}): {} (only their output files are left, no exit: each runs again \
             under the next attempt number)",
            r.orphaned.len(),
            r.orphaned.join(", ")
        )?;
    }
    for why in &r.not_restored {
        writeln!(out, "not restored: {why}")?;
    }
    if !r.uncertain.is_empty() {
        writeln!(
            out,
            "uncertain ({}): {} (their end is lost: resume records a live attempt from its \
             files, or orphaned when they are gone; a task that finished only in lost records \
             and left no attempt files runs again)",
            r.uncertain.len(),
            r.uncertain.join(", ")
        )?;
    }
    writeln!(out, "damaged files moved to {}", r.damaged.display())?;
    writeln!(
        out,
        "continue with: sortie{} resume {run}",
        crate::text::state_dir_flag(&g.state_dir)
    )?;
    Ok(Code::Ok)
}
