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
        // The agents' outputs: shown, never obeyed by the terminal.
        match &state.summary {
            Some(text) => writeln!(out, "{}", crate::text::printable(text))?,
            None => writeln!(
                out,
                "{}",
                crate::text::printable(&sortie_core::summary_text(state))
            )?,
        }
        writeln!(out)?;
    }
    let width = crate::text::stdout_width();
    let label_w = label_width(
        state
            .batch
            .iter()
            .flat_map(|b| b.tasks.iter().map(|t| t.label.as_str())),
    );
    let now = view.now;
    let rows =
        state.tasks.iter().enumerate().map(|(i, rec)| {
            crate::text::printable_task(output::task_view(state, i, rec, now, false))
        });
    // What the commands and the kept worktrees need: the tasks that did not complete, and
    // those whose worktree was kept.
    let layout = Layout::new(width, label_w);
    view.tasks = print_table(&mut out, &view, rows, &g.rows, layout, colours())?;
    view.commands = commands(g, &view);
    writeln!(out)?;
    output::print_kept(&mut out, &view)?;
    output::print_carried(&mut out, state)?;
    // #33: each item's samples.
    let samples = sortie_core::samples::summary_lines(state);
    if !samples.is_empty() {
        writeln!(
            out,
            "samples (of each item's judged samples, how many passed):"
        )?;
        for line in &samples {
            writeln!(out, "  {}", crate::text::printable(line))?;
        }
        writeln!(out)?;
    }
    let ledger = model_ledger(state);
    let usage_rows = ledger
        .models
        .iter()
        .map(|(m, u)| (m.as_deref().unwrap_or("(default)").to_owned(), u))
        .chain([("total".to_owned(), &ledger.total)]);
    output::print_usage_table(&mut out, "usage by model", usage_rows, width)?;
    if !view.commands.is_empty() {
        writeln!(out)?;
        for c in &view.commands {
            writeln!(out, "{}", crate::text::wrap_command(c, width))?;
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

/// The columns of the summary's task table at a width: the label's (at most 28) and the
/// models' (14 to 24) columns share what the others leave, so that a row fits (state 11, attempts 3, tokens 6, cost 10, time 6 and the
/// spaces between are 46 columns); a result that does not fit after them goes on a line of
/// its own, whole, and every other line is cut to the width.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// The whole width.
    pub(crate) width: usize,
    /// The label's column.
    pub(crate) label: usize,
    /// The models' column.
    pub(crate) models: usize,
}

/// The columns of a row but the label, the models and the result.
const FIXED: usize = 46;

impl Layout {
    /// The layout for `width` columns, labels up to `label_w` characters.
    pub(crate) fn new(width: usize, label_w: usize) -> Layout {
        // What the label and the models share, leaving room for a short result.
        let spare = width.saturating_sub(FIXED + 2);
        let label = label_w.min(28);
        let models = spare.saturating_sub(label).clamp(14, 24);
        let label = label.min(spare.saturating_sub(models)).max(4);
        Layout {
            width,
            label,
            models,
        }
    }
}

/// The table of the tasks `rows` (the run's counts and usage from `v`) as `filter` lists
/// them, then (when it may leave rows out) one line per state, then the totals; returns the
/// rows that are [`remarkable`], listed or not.
pub(crate) fn print_table(
    out: &mut impl Write,
    v: &RunView,
    rows: impl Iterator<Item = TaskView>,
    filter: &sortie_core::view::RowFilter,
    layout: Layout,
    colour: bool,
) -> Result<Vec<TaskView>> {
    let Layout {
        width,
        label: label_w,
        models: models_w,
    } = layout;
    let tasks: usize = v.counts.values().sum();
    let (mut total, mut listed, mut longest) = (0usize, 0usize, None::<u64>);
    let mut remarkable_rows = Vec::new();
    let mut head = format!(
        "{:<label_w$}  {:<11} {:>3}  {:<models_w$} {:>6} {:>10} {:>6}",
        "task", "state", "att", "models", "tokens", "cost", "time"
    );
    if head.chars().count() + 8 <= width {
        head.push_str("  result");
    }
    writeln!(out, "{}", crate::text::fit(&head, width))?;
    for t in rows {
        total += 1;
        longest = longest.max(t.duration_ms);
        if filter.shows(tasks, &t.state) {
            listed += 1;
            print_row(out, &t, layout, colour)?;
        }
        if remarkable(&t) {
            remarkable_rows.push(t);
        }
    }
    if filter.leaves_out(tasks) {
        writeln!(
            out,
            "{}",
            crate::text::fit(
                &format!("listed {listed} of {total} task(s) (--all lists every one); by state:"),
                width
            )
        )?;
        for (k, n) in &v.counts {
            writeln!(out, "  {n:>7} {k}")?;
        }
    }
    let counts: Vec<String> = v.counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let mut parts = vec![
        format!("total: {total} task(s)"),
        counts.join(", "),
        format!("{} tokens", v.usage.tokens()),
        v.cost.clone(),
    ];
    if let Some(d) = longest {
        parts.push(format!("longest {}", short_duration(d)));
    }
    for line in crate::text::wrap_parts(&parts, width).lines() {
        writeln!(out, "{}", crate::text::fit(line, width))?;
    }
    if let Some(note) = &v.cost_priced {
        for line in crate::text::wrap_words(note, width).lines() {
            writeln!(out, "{line}")?;
        }
    }
    Ok(remarkable_rows)
}

/// `s` cut to `n` characters in its middle (`a-task-w…label-03`): labels made from a template
/// differ at their end.
pub(crate) fn cut_middle(s: &str, n: usize) -> String {
    let len = s.chars().count();
    if len <= n || n < 6 {
        return cut(s, n);
    }
    let head = (n - 1) / 3;
    let tail = n - 1 - head;
    let mut t: String = s.chars().take(head).collect();
    t.push('…');
    t.extend(s.chars().skip(len - tail));
    t
}

/// One task's row of the summary's table (and its result and error lines).
fn print_row(out: &mut impl Write, t: &TaskView, layout: Layout, colour: bool) -> Result<()> {
    let Layout {
        width,
        label: label_w,
        models: models_w,
    } = layout;
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
    let before = format!(
        "{:<label_w$}  {:<11} {:>3}  {:<models_w$} {:>6} {:>10} {:>6}  ",
        cut_middle(&t.label, label_w),
        t.state,
        t.attempts,
        cut(&models_text(t), models_w),
        compact(t.usage.tokens()),
        format!("{}{}", t.usage.cost, if t.cost_priced { "*" } else { "" }),
        t.duration_ms.map_or("-".to_owned(), short_duration),
    );
    let used = before.chars().count();
    let (same_line, own_line) = if used + result.chars().count() <= width {
        (result, None)
    } else {
        ("↓".to_owned(), Some(result))
    };
    let mut line = crate::text::fit(&format!("{before}{same_line}"), width);
    if colour {
        // The state's column, coloured after the line was cut (the codes take no columns).
        let start = format!("{:<label_w$}  ", cut_middle(&t.label, label_w)).len();
        if line.is_char_boundary(start) && line.len() >= start + 11 {
            let style = match t.state.as_str() {
                "completed" => console::Style::new().green(),
                "partial" | "interrupted" | "cancelled" | "skipped" => {
                    console::Style::new().yellow()
                }
                "failed" | "timeout" | "setup_error" => console::Style::new().red(),
                _ => console::Style::new(),
            };
            let (a, rest) = line.split_at(start);
            if rest.is_char_boundary(11) {
                let (state, b) = rest.split_at(11);
                line = format!("{a}{}{b}", style.apply_to(state));
            }
        }
    }
    writeln!(out, "{line}")?;
    if let Some(result) = own_line {
        // Whole: a path is to be copied (one longer than the width is the only line that wraps).
        writeln!(out, "  → {result}")?;
    }
    // #33: how its check went.
    if let Some(v) = t.verify.as_ref().filter(|v| v.passed) {
        let indent = label_w.min(8);
        writeln!(
            out,
            "{}",
            crate::text::fit(&format!("{:indent$}  └ {}", "", v.text), width)
        )?;
    }
    if t.state != "completed"
        && let Some(e) = &t.error
    {
        let line = e.lines().next().unwrap_or_default();
        let indent = label_w.min(8);
        writeln!(
            out,
            "{}",
            crate::text::fit(&format!("{:indent$}  └ {line}", ""), width)
        )?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_is_cut_in_its_middle_and_the_columns_give_way_to_the_width() {
        assert_eq!(
            cut_middle("a-task-with-a-rather-long-label-07", 18),
            "a-tas…ong-label-07"
        );
        assert_eq!(cut_middle("short", 18), "short");
        let narrow = Layout::new(80, 34);
        assert_eq!(FIXED + narrow.label + narrow.models + 2, 80);
        let wide = Layout::new(200, 34);
        assert_eq!((wide.label, wide.models), (28, 24));
    }
}
