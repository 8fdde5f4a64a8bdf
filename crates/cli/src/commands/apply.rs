//! `sortie apply RUN LABEL`: a kept worktree's change applied onto the checkout of the
//! repository it came from, as uncommitted changes. A three-way merge that conflicts changes
//! nothing, says so, and exits 1. `--all` applies every kept worktree of the run in task order,
//! each all-or-nothing, and stops at the first conflict with a report of what was applied and
//! what was not; `--commit` makes one commit per task. `--all` takes completed tasks only;
//! `--include-failed` adds the kept work of tasks that failed, ended partial or timed out. #33:
//! of the samples of an item whose template has a `pick`, `--all` applies only the winner.

use std::io::Write;

use crate::error::{CliError, Result};
use serde::Serialize;
use sortie_core::TaskId;
use sortie_runner::worktree::kept::{self, Applied, Kept};

use crate::text::printable;

use super::{Code, block_on, find_kept, open_read, replay_all};
use crate::args::{ApplyArgs, Global};

#[derive(Serialize)]
struct ApplyView<'a> {
    run: &'a str,
    label: &'a str,
    repo: &'a str,
    patch: &'a std::path::Path,
    #[serde(flatten)]
    applied: &'a Applied,
    /// The commit made (`--commit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    commit: Option<&'a str>,
}

/// Applies a kept worktree's change, or all of them.
pub(crate) fn apply(g: &Global, t: &ApplyArgs) -> Result<Code> {
    // #33: `--all` applies only the samples a `pick` chose.
    let mut not_picked: Vec<(kept::Kept, Option<String>)> = Vec::new();
    let all = match (&t.label, t.all) {
        (Some(label), false) => vec![find_kept(g, &t.run, label)?],
        (None, true) => {
            let run = super::find_run(g, &t.run)?;
            let state = replay_all(&open_read(&g.layout(), &run)?)?;
            let items = sortie_core::samples::items(&state);
            let (all, lost): (Vec<_>, Vec<_>) = kept::all(&state, &g.layout(), &run)
                .into_iter()
                .partition(|k| !sortie_core::samples::lost(&state, &items, TaskId(k.task)));
            for k in lost {
                let of = state
                    .spec(TaskId(k.task))
                    .and_then(|s| s.sample_of.as_deref());
                let winner = items
                    .iter()
                    .find(|i| Some(i.name.as_str()) == of)
                    .and_then(|i| i.winner)
                    .map(|w| state.label(w).to_string());
                not_picked.push((k, winner));
            }
            all
        }
        _ => return Err(CliError::usage("give a task's label, or --all")),
    };
    let outcome = if t.all {
        block_on(kept::apply_all(&all, t.commit, t.include_failed))?.map_err(stopped_by)?
    } else {
        let mut one = kept::AllApplied {
            applied: Vec::new(),
            stopped: false,
            not_applied: Vec::new(),
            discarded: Vec::new(),
            not_completed: Vec::new(),
        };
        for k in &all {
            let (applied, commit) = block_on(kept::apply_one(k, t.commit))??;
            one.stopped = matches!(applied, Applied::Conflict { .. });
            one.applied.push((k, applied, commit));
        }
        one
    };
    let kept::AllApplied {
        applied: done,
        stopped,
        not_applied: not_reached,
        discarded,
        not_completed,
    } = outcome;
    let stopped = stopped.then(|| done.len() - 1);
    let code = if stopped.is_some() {
        Code::Failed
    } else {
        Code::Ok
    };
    let mut out = std::io::stdout().lock();
    if g.json {
        let views: Vec<ApplyView<'_>> = done
            .iter()
            .map(|(k, applied, commit)| ApplyView {
                run: &k.run,
                label: &k.label,
                repo: &k.repo,
                patch: &k.patch,
                applied,
                commit: commit.as_deref(),
            })
            .collect();
        if t.all {
            let v = serde_json::json!({
                "applied": views,
                "not_applied": not_reached.iter().map(|k| &k.label).collect::<Vec<_>>(),
                "discarded": discarded.iter().map(|k| &k.label).collect::<Vec<_>>(),
                "not_completed": not_completed.iter().map(|k| &k.label).collect::<Vec<_>>(),
                "not_picked": not_picked.iter().map(|(k, _)| &k.label).collect::<Vec<_>>(),
                "stopped_at": stopped.map(|i| &done[i].0.label),
            });
            serde_json::to_writer_pretty(&mut out, &v)?;
        } else if let Some(v) = views.first() {
            serde_json::to_writer_pretty(&mut out, v)?;
        }
        writeln!(out)?;
        return Ok(code);
    }
    for (k, applied, commit) in &done {
        print_one(&mut out, k, applied, commit.as_deref())?;
    }
    if t.all {
        if all.is_empty() && not_picked.is_empty() {
            writeln!(out, "run {} kept no worktree: nothing to apply", t.run)?;
        }
        for (k, winner) in &not_picked {
            let winner = match winner {
                Some(w) => format!("its item's pick chose {}", printable(w)),
                None => "its item's pick chose no sample".to_owned(),
            };
            writeln!(out, "skipped {}: {winner}", printable(&k.label))?;
        }
        for k in &discarded {
            writeln!(
                out,
                "skipped {}: its worktree was discarded (patch {})",
                k.label,
                k.patch.display()
            )?;
        }
        for k in &not_completed {
            let ended = k.ended.map_or("unfinished", |e| e.as_str());
            writeln!(
                out,
                "skipped {}: its task ended {ended} (add --include-failed to apply it)",
                k.label
            )?;
        }
        if stopped.is_some() && !not_reached.is_empty() {
            let labels: Vec<&str> = not_reached.iter().map(|k| k.label.as_str()).collect();
            eprintln!(
                "sortie: stopped at the conflict; not applied: {}",
                labels.join(", ")
            );
        }
    }
    Ok(code)
}

/// An error applying one worktree of `--all`, said with what was applied before it.
fn stopped_by(e: kept::StoppedAt<'_>) -> CliError {
    let applied: Vec<&str> = e.before.iter().map(|d| d.label.as_str()).collect();
    let before = if applied.is_empty() {
        "nothing was applied before it".to_owned()
    } else {
        format!("applied before it: {}", applied.join(", "))
    };
    CliError::from(e.error).context(format!("stopped at {}; {before}", e.at.label))
}

fn print_one(
    out: &mut impl Write,
    kept: &Kept,
    applied: &Applied,
    commit: Option<&str>,
) -> Result<()> {
    let committed = commit
        .map(|c| format!(", committed as {}", c.get(..12).unwrap_or(c)))
        .unwrap_or_default();
    let how = if commit.is_some() {
        "as a commit"
    } else {
        "as uncommitted changes"
    };
    match applied {
        Applied::Clean => writeln!(
            out,
            "applied {}'s change to {} {how}{committed}",
            kept.label, kept.repo
        )?,
        Applied::Merged => writeln!(
            out,
            "applied {}'s change to {} {how} (three-way merge, clean){committed}",
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
    Ok(())
}
