//! `sortie apply RUN LABEL`: a kept worktree's change applied onto the checkout of the
//! repository it came from, as uncommitted changes. A three-way merge that conflicts changes
//! nothing, says so, and exits 1.

use std::io::Write;

use crate::error::Result;
use serde::Serialize;
use sortie_runner::worktree::kept::Applied;

use super::{Code, block_on, find_kept};
use crate::args::{Global, TaskRef};

#[derive(Serialize)]
struct ApplyView<'a> {
    run: &'a str,
    label: &'a str,
    repo: &'a str,
    patch: &'a std::path::Path,
    #[serde(flatten)]
    applied: &'a Applied,
}

/// Applies a kept worktree's change.
pub(crate) fn apply(g: &Global, t: &TaskRef) -> Result<Code> {
    let kept = find_kept(g, &t.run, &t.label)?;
    let applied = block_on(sortie_runner::worktree::kept::apply(&kept))??;
    let code = match applied {
        Applied::Conflict { .. } => Code::Failed,
        _ => Code::Ok,
    };
    let mut out = std::io::stdout().lock();
    if g.json {
        let view = ApplyView {
            run: &kept.run,
            label: &kept.label,
            repo: &kept.repo,
            patch: &kept.patch,
            applied: &applied,
        };
        serde_json::to_writer_pretty(&mut out, &view)?;
        writeln!(out)?;
        return Ok(code);
    }
    match &applied {
        Applied::Clean => writeln!(
            out,
            "applied {}'s change to {} as uncommitted changes",
            kept.label, kept.repo
        )?,
        Applied::Merged => writeln!(
            out,
            "applied {}'s change to {} as uncommitted changes (three-way merge, clean)",
            kept.label, kept.repo
        )?,
        Applied::Empty => writeln!(
            out,
            "{}'s worktree holds no change to apply (its patch is empty)",
            kept.label
        )?,
        Applied::Conflict { detail } => {
            eprintln!(
                "sortie: {}'s change conflicts with {}; nothing was changed. git said: {detail}",
                kept.label, kept.repo
            );
            eprintln!(
                "sortie: the change is in {} (patch {})",
                kept.path,
                kept.patch.display()
            );
        }
    }
    Ok(code)
}
