//! `sortie diff RUN [LABEL]`: the change a task made in its kept worktree, as a patch on
//! stdout; without a label, every kept worktree's, in task order, each under a `# sortie:` line
//! naming the task, its repository and branch (git apply skips such lines).

use std::io::Write;

use crate::error::Result;
use serde::Serialize;

use super::{Code, block_on, find_kept, open_read, replay_all};
use crate::args::{DiffArgs, Global};
use sortie_runner::worktree::kept::{self, Kept};

#[derive(Serialize)]
struct DiffView<'a> {
    #[serde(flatten)]
    kept: &'a Kept,
    /// The patch text (lossily decoded).
    diff: String,
}

/// Prints the patch of a kept worktree, or of all (`--json`: the worktrees' details and
/// patches; one object for a label, an array for all).
pub(crate) fn diff(g: &Global, t: &DiffArgs) -> Result<Code> {
    let all = match &t.label {
        Some(label) => vec![find_kept(g, &t.run, label)?],
        None => {
            let run = super::find_run(g, &t.run)?;
            let state = replay_all(&open_read(&g.layout(), &run)?)?;
            kept::all(&state, &g.layout(), &run)
                .into_iter()
                .filter(|k| k.discarded.is_none())
                .collect()
        }
    };
    let mut patches = Vec::with_capacity(all.len());
    for k in &all {
        patches.push(block_on(kept::diff(k))??);
    }
    let mut out = std::io::stdout().lock();
    if g.json {
        let views: Vec<DiffView<'_>> = all
            .iter()
            .zip(&patches)
            .map(|(kept, p)| DiffView {
                kept,
                diff: String::from_utf8_lossy(p).into_owned(),
            })
            .collect();
        match (&t.label, views.as_slice()) {
            (Some(_), [one]) => serde_json::to_writer_pretty(&mut out, one)?,
            _ => serde_json::to_writer_pretty(&mut out, &views)?,
        }
        writeln!(out)?;
    } else if t.label.is_some() {
        for p in &patches {
            out.write_all(p)?;
        }
    } else if all.is_empty() {
        eprintln!("sortie: run {} kept no worktree", t.run);
    } else {
        for (k, p) in all.iter().zip(&patches) {
            writeln!(
                out,
                "# sortie: {} ({}, branch {}, worktree {})",
                crate::text::printable(&k.label),
                k.repo,
                k.branch,
                k.path
            )?;
            out.write_all(p)?;
        }
    }
    Ok(Code::Ok)
}
