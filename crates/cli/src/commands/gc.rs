//! `sortie gc [--older-than 7d]`: removes the kept worktrees of finished runs that ended longer
//! ago than the retention, keeps every branch with commits found nowhere else, and prunes git's
//! worktree lists. Live and unfinished runs are left alone.

use std::io::Write;

use crate::error::Result;

use super::{Code, block_on};
use crate::args::{GcArgs, Global};

/// Collects old kept worktrees.
pub(crate) fn gc(g: &Global, args: &GcArgs) -> Result<Code> {
    let now = sortie_runner::clock::now();
    let report = block_on(sortie_runner::worktree::kept::gc(
        &g.layout(),
        args.older_than,
        now,
    ))??;
    let failed = report.iter().any(|r| !r.failed.is_empty());
    let mut out = std::io::stdout().lock();
    if g.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        if report.is_empty() {
            writeln!(out, "no kept worktrees in {}", g.state_dir.display())?;
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
