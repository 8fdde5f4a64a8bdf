//! The summary printed when a run ends (run, resume, cancel, wait): a table of the tasks (label,
//! state, attempts and the models tried, tokens, cost, duration, the artifact or kept worktree,
//! and the first line of the error of a task that did not complete), the totals, the usage per
//! model, and the exact commands to go on from here. The tasks' outputs come first for a small
//! run (at most [`OUTPUTS_UP_TO`] tasks) or with `--outputs`. `--json` prints the same as one
//! object (`output::RunView`), with the outputs under the same rule.

use std::io::Write;

use crate::args::Global;
use crate::board::{compact, cut, short_duration};
use crate::error::Result;
use crate::output::{self, RunView, TaskView};
use sortie_core::ledger::model_ledger;
use sortie_core::{RunId, RunState};

/// A run with at most this many tasks shows each task's output in its summary (more: only with
/// `--outputs`).
pub(crate) const OUTPUTS_UP_TO: usize = 20;

/// Whether the summary of `state` shows the tasks' outputs.
pub(crate) fn shows_outputs(g: &Global, state: &RunState) -> bool {
    g.outputs || state.tasks.len() <= OUTPUTS_UP_TO
}

/// Prints a finished (or interrupted) run's summary on stdout.
///
/// The table shows the tasks one view at a time (`output::task_view`): a run of 100,000 tasks
/// never holds all their views at once (they were the biggest part of `sortie run`'s peak
/// memory). `--json` prints the whole view as one object.
pub(crate) fn print_summary(g: &Global, run: &RunId, state: &RunState) -> Result<()> {
    let with_text = shows_outputs(g, state);
    let mut out = std::io::stdout().lock();
    if g.json {
        let mut view = output::view(run, state, None, with_text);
        view.commands = commands(g, &view);
        serde_json::to_writer_pretty(&mut out, &view)?;
        writeln!(out)?;
        return Ok(());
    }
    let mut view = output::view_head(run, state, None);
    if with_text {
        // The journal's text once the run finished (`RunFinished` carries it, made by core's
        // `summary_text`); a run not finished has none journaled, so the same function says it
        // as of now.
        match &state.summary {
            Some(text) => writeln!(out, "{text}")?,
            None => writeln!(out, "{}", sortie_core::summary_text(state))?,
        }
        writeln!(out)?;
    }
    let label_w = label_width(
        state
            .batch
            .iter()
            .flat_map(|b| b.tasks.iter().map(|t| t.label.as_str())),
    );
    let now = view.now;
    let rows = state
        .tasks
        .iter()
        .enumerate()
        .map(|(i, rec)| output::task_view(state, i, rec, now, false));
    // What the commands and the kept worktrees need: the tasks that did not complete, and
    // those whose worktree was kept.
    view.tasks = print_table(&mut out, &view, rows, label_w, colours())?;
    view.commands = commands(g, &view);
    writeln!(out)?;
    output::print_kept(&mut out, &view)?;
    output::print_carried(&mut out, state)?;
    let ledger = model_ledger(state);
    writeln!(
        out,
        "{:<28} {:>10} {:>10} {:>10} {:>10} {:>6}  cost",
        "usage by model", "input", "output", "cache_r", "cache_w", "turns"
    )?;
    for (model, u) in ledger
        .models
        .iter()
        .map(|(m, u)| (m.as_deref().unwrap_or("(default)"), u))
        .chain([("total", &ledger.total)])
    {
        writeln!(
            out,
            "{:<28} {:>10} {:>10} {:>10} {:>10} {:>6}  {}",
            cut(model, 28),
            u.input,
            u.output,
            u.cache_read,
            u.cache_write,
            u.turns,
            u.cost
        )?;
    }
    if !view.commands.is_empty() {
        writeln!(out)?;
        for c in &view.commands {
            writeln!(out, "{c}")?;
        }
    }
    Ok(())
}

/// Whether stdout gets colours (a terminal, `NO_COLOR` unset).
fn colours() -> bool {
    console::colors_enabled()
}

fn models_text(t: &TaskView) -> String {
    let names: Vec<&str> = t
        .models
        .iter()
        .map(|m| m.as_deref().unwrap_or("-"))
        .collect();
    if names.is_empty() {
        "-".to_owned()
    } else {
        names.join(" → ")
    }
}

/// The width of the label column: the longest label, within 4 to 28 characters.
pub(crate) fn label_width<'a>(labels: impl Iterator<Item = &'a str>) -> usize {
    labels
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 28)
}

/// Whether a task's view is one the summary's commands and kept worktrees name: it did not
/// complete, or its worktree was kept.
fn remarkable(t: &TaskView) -> bool {
    t.state != "completed" || t.worktree.as_ref().is_some_and(|w| w.kept == Some(true))
}

/// The table of the tasks `rows` (the run's counts and usage from `v`), then the totals;
/// returns the rows that are [`remarkable`].
pub(crate) fn print_table(
    out: &mut impl Write,
    v: &RunView,
    rows: impl Iterator<Item = TaskView>,
    label_w: usize,
    colour: bool,
) -> Result<Vec<TaskView>> {
    let (mut total, mut longest, mut remarkable_rows) = (0usize, None::<u64>, Vec::new());
    writeln!(
        out,
        "{:<label_w$}  {:<11} {:>3}  {:<24} {:>7} {:>9} {:>8}  result",
        "task", "state", "att", "models", "tokens", "cost", "time"
    )?;
    for t in rows {
        total += 1;
        longest = longest.max(t.duration_ms);
        let state = format!("{:<11}", t.state);
        let state = if colour {
            let style = match t.state.as_str() {
                "completed" => console::Style::new().green(),
                "partial" | "interrupted" | "cancelled" | "skipped" => {
                    console::Style::new().yellow()
                }
                "failed" | "timeout" | "setup_error" => console::Style::new().red(),
                _ => console::Style::new(),
            };
            style.apply_to(state).to_string()
        } else {
            state
        };
        let kept = t
            .worktree
            .as_ref()
            .filter(|w| w.kept == Some(true))
            .map(|w| &w.path);
        let result = match (&t.artifact, kept) {
            (Some(a), Some(w)) => format!("{a}; worktree {w}"),
            (Some(a), None) => a.clone(),
            (None, Some(w)) => format!("worktree {w}"),
            (None, None) => "-".to_owned(),
        };
        writeln!(
            out,
            "{:<label_w$}  {state} {:>3}  {:<24} {:>7} {:>9} {:>8}  {result}",
            cut(&t.label, label_w),
            t.attempts,
            cut(&models_text(&t), 24),
            compact(t.usage.tokens()),
            t.usage.cost.to_string(),
            t.duration_ms.map_or("-".to_owned(), short_duration),
        )?;
        if t.state != "completed"
            && let Some(e) = &t.error
        {
            let line = e.lines().next().unwrap_or_default();
            writeln!(out, "{:label_w$}  └ {}", "", cut(line, 100))?;
        }
        if remarkable(&t) {
            remarkable_rows.push(t);
        }
    }
    let counts: Vec<String> = v.counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let span = longest
        .map(|d| format!(" · longest {}", short_duration(d)))
        .unwrap_or_default();
    writeln!(
        out,
        "total: {} task(s) · {} · {} tokens · {}{span}",
        total,
        counts.join(", "),
        v.usage.tokens(),
        v.cost
    )?;
    Ok(remarkable_rows)
}

/// The commands to go on from here: resume an unfinished run, inspect what did not complete.
fn commands(g: &Global, v: &RunView) -> Vec<String> {
    let sortie = format!("sortie{}", crate::text::state_dir_flag(&g.state_dir));
    let run = &v.run_id;
    let mut c = Vec::new();
    let unfinished = !matches!(
        v.status.as_str(),
        "completed" | "partial" | "failed" | "timeout" | "cancelled"
    );
    if unfinished {
        c.push(format!("resume:  {sortie} resume {run}"));
    }
    let failed: Vec<&TaskView> = v
        .tasks
        .iter()
        .filter(|t| !matches!(t.state.as_str(), "completed"))
        .collect();
    if !unfinished && !failed.is_empty() {
        // `rerun` runs again what did not complete, carrying the rest.
        c.push(format!("rerun:   {sortie} rerun {run}"));
    }
    if let Some(t) = failed.first() {
        c.push(format!(
            "inspect: {sortie} replay {run} --task {}",
            shell_word(&t.label)
        ));
    }
    let kept = |t: &&TaskView| t.worktree.as_ref().is_some_and(|w| w.kept == Some(true));
    for t in v.tasks.iter().filter(kept) {
        // A label starting with `-` would parse as a flag: `--` ends the flags.
        let dashes = if t.label.starts_with('-') { "-- " } else { "" };
        c.push(format!(
            "diff:    {sortie} diff {run} {dashes}{}",
            shell_word(&t.label)
        ));
    }
    c.push(format!("status:  {sortie} status {run}"));
    c
}

/// A word as a shell reads it back: quoted when it holds anything but safe characters.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@+".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}
