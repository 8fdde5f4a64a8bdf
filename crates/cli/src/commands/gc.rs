//! `sortie gc [--older-than 7d]`: removes the kept worktrees of finished runs that ended longer
//! ago than the retention, keeps every branch with commits found nowhere else, and prunes git's
//! worktree lists; and (#10) removes those runs' transcripts, the attempt dirs (the journal keeps
//! every attempt's outcome, usage and output). Live and unfinished runs are left alone.

use std::io::Write;

use crate::error::Result;

use super::{Code, block_on};
use crate::args::{GcArgs, Global};
use sortie_runner::transcript::Collected;
use sortie_runner::worktree::kept::GcRun;

/// Collects old kept worktrees.
pub(crate) fn gc(g: &Global, args: &GcArgs) -> Result<Code> {
    let now = sortie_runner::clock::now();
    let report = block_on(sortie_runner::worktree::kept::gc(
        &g.layout(),
        args.older_than,
        now,
    ))??;
    let failed = report.iter().any(|r| !r.failed.is_empty());
    let transcripts = sortie_runner::transcript::gc(&g.layout(), args.older_than, now);
    let mut out = std::io::stdout().lock();
    if g.json {
        serde_json::to_writer_pretty(&mut out, &entries(report, transcripts))?;
        writeln!(out)?;
    } else {
        if report.is_empty() {
            writeln!(out, "no kept worktrees in {}", g.state_dir.display())?;
        }
        for t in &transcripts {
            writeln!(
                out,
                "{}: removed the transcripts of {} attempt{} ({})",
                t.run,
                t.attempts,
                if t.attempts == 1 { "" } else { "s" },
                super::logs::size(t.bytes)
            )?;
        }
        for r in &report {
            if let Some(why) = &r.skipped {
                writeln!(out, "{}: left alone: {why}", r.run)?;
            }
            for w in &r.removed {
                let branch = match (&w.branch_kept_because, w.branch_deleted) {
                    (Some(why), _) => format!("kept branch {}: {why}", w.branch),
                    (None, true) => format!("deleted branch {}", w.branch),
                    (None, false) => "no branch left".to_owned(),
                };
                writeln!(out, "{}: removed {} ({}); {branch}", r.run, w.label, w.path)?;
            }
            for (label, why) in &r.failed {
                writeln!(out, "{}: could not remove {label}: {why}", r.run)?;
            }
        }
    }
    Ok(if failed { Code::Failed } else { Code::Ok })
}

/// One run's entry of `gc --json`: its worktrees' part, and its transcripts' part (null when
/// none were removed).
#[derive(serde::Serialize)]
struct Entry {
    #[serde(flatten)]
    worktrees: GcRun,
    transcripts: Option<Collected>,
}

/// The worktrees' report with each run's transcripts added (runs with only transcripts
/// removed get an entry of their own, in run order).
fn entries(report: Vec<GcRun>, transcripts: Vec<Collected>) -> Vec<Entry> {
    let mut by_run: std::collections::BTreeMap<String, Collected> = transcripts
        .into_iter()
        .map(|c| (c.run.clone(), c))
        .collect();
    let mut out: Vec<Entry> = report
        .into_iter()
        .map(|r| Entry {
            transcripts: by_run.remove(&r.run),
            worktrees: r,
        })
        .collect();
    out.extend(by_run.into_values().map(|c| Entry {
        worktrees: GcRun {
            run: c.run.clone(),
            skipped: None,
            removed: Vec::new(),
            failed: Vec::new(),
        },
        transcripts: Some(c),
    }));
    out
}
