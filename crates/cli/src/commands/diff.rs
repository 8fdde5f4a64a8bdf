//! `sortie diff RUN LABEL`: the change a task made in its kept worktree, as a patch on stdout.

use std::io::Write;

use crate::error::Result;
use serde::Serialize;

use super::{Code, block_on, find_kept};
use crate::args::{Global, TaskRef};

#[derive(Serialize)]
struct DiffView<'a> {
    #[serde(flatten)]
    kept: &'a sortie_runner::worktree::kept::Kept,
    /// The patch text (lossily decoded).
    diff: String,
}

/// Prints the patch of a kept worktree (`--json`: the worktree's details and the patch).
pub(crate) fn diff(g: &Global, t: &TaskRef) -> Result<Code> {
    let kept = find_kept(g, &t.run, &t.label)?;
    let patch = block_on(sortie_runner::worktree::kept::diff(&kept))??;
    let mut out = std::io::stdout().lock();
    if g.json {
        let view = DiffView {
            kept: &kept,
            diff: String::from_utf8_lossy(&patch).into_owned(),
        };
        serde_json::to_writer_pretty(&mut out, &view)?;
        writeln!(out)?;
    } else {
        out.write_all(&patch)?;
    }
    Ok(Code::Ok)
}
