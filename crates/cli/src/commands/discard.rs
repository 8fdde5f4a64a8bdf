//! `sortie discard RUN LABEL`: removes a kept worktree and deletes its branch. The discard is
//! journaled (`WorktreeDiscarded`, also after the run's end); the patch stays in the run dir.

use std::io::Write;

use crate::error::Result;

use super::{Code, block_on, find_kept};
use crate::args::{Global, TaskRef};

/// Removes a kept worktree and its branch.
pub(crate) fn discard(g: &Global, t: &TaskRef) -> Result<Code> {
    let kept = find_kept(g, &t.run, &t.label)?;
    let removed = block_on(sortie_runner::worktree::kept::discard(&kept, &g.layout()))??;
    let mut out = std::io::stdout().lock();
    if g.json {
        serde_json::to_writer_pretty(&mut out, &removed)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "removed worktree {}{}; the patch stays at {}",
            removed.path,
            if removed.branch_deleted {
                format!(" and branch {}", removed.branch)
            } else {
                String::new()
            },
            kept.patch.display()
        )?;
    }
    Ok(Code::Ok)
}
