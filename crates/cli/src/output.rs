//! Printing: summaries, tables and JSON on stdout (log lines and progress on stderr are
//! `log_lines`'s).

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use crate::board::cut as truncate;
use crate::error::Result;
pub(crate) use crate::log_lines::{clock, first_line, front, init_tracing};
use sortie_core::ledger::Ledger;
use sortie_core::{RunId, RunState, RunStatus, Usage};

/// A task's line in status and JSON output.
#[derive(Debug, Default, Serialize)]
pub(crate) struct TaskView {
    /// Its label.
    pub(crate) label: String,
    /// Its state's name.
    pub(crate) state: String,
    /// How many attempts it made.
    pub(crate) attempts: usize,
    /// The model of its last attempt.
    pub(crate) model: Option<String>,
    /// Why it stopped.
    pub(crate) stop_reason: Option<String>,
    /// Its error.
    pub(crate) error: Option<String>,
    /// Whether its live attempt is stalled.
    pub(crate) stalled: bool,
    /// Its usage.
    pub(crate) usage: Usage,
    /// #37: its cost was priced by sortie (its agent reports no cost), not reported.
    pub(crate) cost_priced: bool,
    /// Its text (for finished tasks).
    pub(crate) text: Option<String>,
    /// The models its attempts ran on, in order, each once (`null` for the profile's default).
    pub(crate) models: Vec<Option<String>>,
    /// From its first attempt's launch to its last attempt's end (or now, for a live one), in
    /// milliseconds; `null` before any attempt.
    pub(crate) duration_ms: Option<u64>,
    /// Where its artifact was written.
    pub(crate) artifact: Option<String>,
    /// Whether it is held (`sortie hold`, of it or of the run).
    pub(crate) held: bool,
    /// Its worktree, for an isolated task whose worktree was planned.
    pub(crate) worktree: Option<WorktreeView>,
    /// Carried from the parent run (a rerun): the usage it spent there (not in `usage`).
    pub(crate) carried: Option<Usage>,
    /// The tool calls its agent's permissions denied (tool, count), over its attempts.
    pub(crate) denials: Vec<sortie_core::Denial>,
    /// The pool holding it back, when it is ready to launch but its pool is full or backing
    /// off (issue 14).
    pub(crate) waiting_for_pool: Option<String>,
    // #13: roles and sessions.
    /// The role its agent fields came from.
    pub(crate) role: Option<String>,
    /// The session (conversation) it belongs to.
    pub(crate) session: Option<String>,
    // Issue 13: structured results.
    /// Its validated structured result (a task with an `output_schema` that matched).
    pub(crate) result: Option<serde_json::Value>,
    /// #33: its checks (`verify`), once one ran.
    pub(crate) verify: Option<crate::verify_view::VerifyView>,
    /// #34: its sandboxed attempts' connections (`SandboxNet`), over its attempts: host, port,
    /// allowed, count, bytes each way.
    pub(crate) net: Vec<sortie_core::sandbox_net::Flow>,
}

/// A task's worktree as status and summaries show it.
#[derive(Debug, Serialize)]
pub(crate) struct WorktreeView {
    /// Where it is.
    pub(crate) path: String,
    /// Its branch.
    pub(crate) branch: String,
    /// Whether it is kept (changed, and not discarded since); None until it is finalized.
    pub(crate) kept: Option<bool>,
    /// Who removed it after its task ended (`discard`, `gc`), when it was.
    pub(crate) discarded: Option<&'static str>,
    /// Its diff summary (`git diff --stat` against its base), when kept.
    pub(crate) diff: Option<String>,
}

impl WorktreeView {
    fn of(rec: &sortie_core::TaskRecord) -> Option<WorktreeView> {
        let plan = rec.steps().worktree.as_ref()?;
        Some(WorktreeView {
            path: plan.path.clone(),
            branch: plan.branch.clone(),
            kept: rec
                .steps()
                .worktree_final
                .as_ref()
                .map(|(changed, _)| *changed && rec.steps().discarded.is_none()),
            discarded: rec.steps().discarded.map(|d| d.by.as_str()),
            diff: rec
                .steps()
                .worktree_final
                .as_ref()
                .and_then(|(_, d)| d.clone()),
        })
    }
}

/// The kept worktrees, in task order: label, path and branch, then the diff stat's last line
/// (`N files changed, ...`). Nothing when none was kept.
pub(crate) fn print_kept(out: &mut impl Write, v: &RunView) -> Result<()> {
    let kept: Vec<(&TaskView, &WorktreeView)> = v
        .tasks
        .iter()
        .filter_map(|t| t.worktree.as_ref().map(|w| (t, w)))
        .filter(|(_, w)| w.kept == Some(true))
        .collect();
    if kept.is_empty() {
        return Ok(());
    }
    writeln!(out, "kept worktrees ({}):", kept.len())?;
    for (t, w) in kept {
        let stat = w
            .diff
            .as_deref()
            .and_then(|d| d.lines().rev().find(|l| !l.trim().is_empty()))
            .map_or("(no diff summary)", str::trim);
        writeln!(
            out,
            "  {:<24} {}  ({})",
            truncate(&t.label, 24),
            w.path,
            w.branch
        )?;
        writeln!(out, "      {stat}")?;
    }
    writeln!(
        out,
        "review: sortie diff {run}; apply: sortie apply {run} --all [--commit]",
        run = v.run_id
    )?;
    Ok(())
}

/// Spaces for padding a column.
const SPACES: &str = "                        ";

/// Pushes `n` spaces.
fn pad(line: &mut String, mut n: usize) {
    while n > 0 {
        let k = n.min(SPACES.len());
        line.push_str(&SPACES[..k]);
        n -= k;
    }
}

/// Pushes `s` left-aligned in `width` characters, as `{:<width}` would.
fn push_left(line: &mut String, s: &str, width: usize) {
    line.push_str(s);
    pad(line, width.saturating_sub(s.chars().count()));
}

/// A task's line in `status`: `"  {:<24} {:<10} attempt {:<2} {:<18} {:>9} tok  {cost}"`,
/// laid out by hand into `line` (cleared first). `format!`'s padding writes each space through
/// the writer one character at a time, which made printing the lines of a 100,000-task run as
/// costly as reading its journal (callgrind).
fn task_line(line: &mut String, t: &TaskView) {
    use std::fmt::Write as _;
    line.clear();
    line.push_str("  ");
    if t.label.chars().count() <= 24 {
        push_left(line, &t.label, 24);
    } else {
        push_left(line, &truncate(&t.label, 24), 24);
    }
    line.push(' ');
    push_left(line, &t.state, 10);
    line.push_str(" attempt ");
    let at = line.len();
    let _ = write!(line, "{}", t.attempts);
    pad(line, 2usize.saturating_sub(line.len() - at));
    line.push(' ');
    push_left(line, t.model.as_deref().unwrap_or("-"), 18);
    line.push(' ');
    let at = line.len();
    let _ = write!(line, "{}", t.usage.tokens());
    let digits = line.len() - at;
    if digits < 9 {
        line.insert_str(at, &SPACES[..9 - digits]);
    }
    line.push_str(" tok  ");
    let _ = write!(line, "{}", t.usage.cost);
    if t.cost_priced {
        line.push('*');
    }
    if t.stalled {
        line.push_str("  STALLED");
    }
    line.push('\n');
}

/// A run as status and summaries show it.
#[derive(Debug, Serialize)]
pub(crate) struct RunView {
    /// The run.
    pub(crate) run_id: String,
    /// Its status: running, interrupted, or the final state.
    pub(crate) status: String,
    /// The live owner's pid, when a process runs it now.
    pub(crate) live_pid: Option<u32>,
    /// Task counts by state.
    pub(crate) counts: BTreeMap<String, usize>,
    /// The run's usage.
    pub(crate) usage: Usage,
    /// The run's cost, as text (`unreported` parts named).
    pub(crate) cost: String,
    /// The tasks.
    pub(crate) tasks: Vec<TaskView>,
    /// The journal's length.
    pub(crate) events: u64,
    /// Why the run's budget ran out, when it did.
    pub(crate) budget_exceeded: Option<String>,
    /// #37: how sortie priced the costs of the tasks marked `cost_priced` (None: none was).
    pub(crate) cost_priced: Option<String>,
    /// The commands to go on from here (in a run's summary; empty elsewhere).
    pub(crate) commands: Vec<String>,
    /// The run this one reruns.
    pub(crate) parent: Option<String>,
    /// #32: each rebuild of its journal by `sortie recover`, as a line.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) recovered: Vec<String>,
    /// The pools (issue 14).
    pub(crate) pools: Vec<crate::pools::PoolView>,
    /// The time the view was made for (ms since the epoch; the last attempt's end for a run
    /// no process owns).
    #[serde(skip)]
    pub(crate) now: u64,
}

/// Issue 13: a task's validated structured result as JSON (journaled as compact JSON text).
pub(crate) fn structured_value(r: &sortie_core::TaskResult) -> Option<serde_json::Value> {
    r.result
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
}

/// Builds the view of a run.
pub(crate) fn view(
    run: &RunId,
    state: &RunState,
    live_pid: Option<u32>,
    with_text: bool,
) -> RunView {
    let mut v = view_head(run, state, live_pid);
    v.tasks = state
        .tasks
        .iter()
        .enumerate()
        .map(|(i, rec)| task_view(state, i, rec, v.now, with_text))
        .collect();
    v
}

/// The view of a run without its tasks (`tasks` is empty; `counts` counts every task): what
/// a summary starts from that shows the tasks one [`task_view`] at a time, so that the views
/// of a 100,000-task run never exist at once.
pub(crate) fn view_head(run: &RunId, state: &RunState, live_pid: Option<u32>) -> RunView {
    let mut by_state: BTreeMap<&'static str, usize> = BTreeMap::new();
    for rec in &state.tasks {
        // Core names the display states (`interrupted`, `setting-up`).
        *by_state.entry(rec.display_state()).or_insert(0) += 1;
    }
    let counts = by_state
        .into_iter()
        .map(|(k, n)| (k.to_owned(), n))
        .collect();
    let now = state
        .tasks
        .iter()
        .flat_map(|r| r.attempts.iter())
        .filter_map(attempt_end)
        .max()
        .unwrap_or(0)
        .max(if live_pid.is_some() { now_ms() } else { 0 });
    let status = match (&state.status, live_pid) {
        (RunStatus::Finished { state }, _) => state.to_string(),
        (RunStatus::Interrupted { .. }, None) | (RunStatus::Running, None) => "interrupted".into(),
        (_, Some(_)) => "running".into(),
        (RunStatus::NotStarted, None) => "not started".into(),
    };
    let usage = state.usage();
    RunView {
        run_id: run.to_string(),
        status,
        live_pid,
        counts,
        usage,
        cost: usage.cost.to_string(),
        tasks: Vec::new(),
        events: state.next_seq.0,
        budget_exceeded: state.budget_exceeded.as_ref().map(|(_, r)| r.clone()),
        cost_priced: state
            .batch
            .as_ref()
            .and_then(sortie_core::prices::priced_note),
        commands: Vec::new(),
        parent: state.parent.as_ref().map(ToString::to_string),
        recovered: recovery_lines(state),
        pools: crate::pools::views(state, now),
        now,
    }
}

/// #32: one line per rebuild of the run's journal by `sortie recover`.
pub(crate) fn recovery_lines(state: &RunState) -> Vec<String> {
    state
        .recovered
        .iter()
        .map(|r| {
            format!(
                "{} at {}",
                crate::text::recovery_line(r.kept, r.lost, r.restored.len()),
                clock(r.at.0)
            )
        })
        .collect()
}

/// The view of task `i` of `state` (its record `rec`), as of `now` (ms since the epoch).
pub(crate) fn task_view(
    state: &RunState,
    i: usize,
    rec: &sortie_core::TaskRecord,
    now: u64,
    with_text: bool,
) -> TaskView {
    let spec = state.spec(sortie_core::TaskId(i as u32));
    let result = rec.result();
    TaskView {
        label: state.label(sortie_core::TaskId(i as u32)),
        state: rec.display_state().to_owned(),
        attempts: rec.attempts.len(),
        model: rec
            .attempts
            .last()
            .and_then(|a| a.model().map(str::to_owned)),
        stop_reason: result.map(|r| r.stop_reason.as_str().to_owned()),
        error: result.and_then(|r| r.error.clone()),
        stalled: rec.live_attempt().is_some_and(|a| a.stalled),
        usage: rec.usage(),
        cost_priced: spec.is_some_and(|s| {
            state
                .batch
                .as_ref()
                .is_some_and(|b| sortie_core::prices::is_priced(b, s))
        }),
        text: if with_text {
            result.map(|r| r.text.clone())
        } else {
            None
        },
        models: models_tried(rec),
        duration_ms: duration(rec, now),
        artifact: rec.steps().artifact.as_ref().map(|a| a.path.clone()),
        held: !rec.state.is_terminal() && state.control.is_held(sortie_core::TaskId(i as u32)),
        worktree: WorktreeView::of(rec),
        carried: rec.steps().carried,
        denials: if rec.attempts.iter().any(names_denials) {
            rec.denials()
        } else {
            Vec::new()
        },
        waiting_for_pool: sortie_core::waiting_for_pool(
            state,
            sortie_core::TaskId(i as u32),
            sortie_core::Timestamp(now),
        )
        .map(str::to_owned),
        role: spec.and_then(|s| s.role.clone()),
        session: spec.and_then(|s| s.session.clone()),
        result: result.and_then(structured_value),
        verify: crate::verify_view::VerifyView::of(rec),
        net: sortie_core::sandbox_net::merge(
            rec.attempts.iter().flat_map(|a| a.net().unwrap_or(&[])),
        ),
    }
}

/// Whether an attempt's outcome names denied tool calls (an orphaned attempt's never does):
/// most tasks have none, and `TaskRecord::denials` clones each attempt's outcome to find out
/// (16 M instructions of `sortie status` of a 100,000-task run).
fn names_denials(a: &sortie_core::AttemptRecord) -> bool {
    matches!(&a.end, Some(sortie_core::state::AttemptEnd::Finished { outcome, .. }) if !outcome.denials().is_empty())
}

/// The models a task's attempts ran on, in order, each once.
fn models_tried(rec: &sortie_core::TaskRecord) -> Vec<Option<String>> {
    let mut models: Vec<Option<String>> = Vec::new();
    for a in &rec.attempts {
        let model = a.model().map(str::to_owned);
        if !models.contains(&model) {
            models.push(model);
        }
    }
    models
}

/// When an attempt ended, if it has.
fn attempt_end(a: &sortie_core::AttemptRecord) -> Option<u64> {
    match &a.end {
        Some(sortie_core::state::AttemptEnd::Finished { at, .. })
        | Some(sortie_core::state::AttemptEnd::Orphaned { at, .. }) => Some(at.0),
        None => None,
    }
}

/// A task's span: its first launch to its last attempt's end, or to `now` while one runs.
fn duration(rec: &sortie_core::TaskRecord, now: u64) -> Option<u64> {
    let first = rec.attempts.first()?.launched_at.0;
    let last = rec.attempts.last()?;
    let end = attempt_end(last).unwrap_or(now.max(first));
    Some(end.saturating_sub(first))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A rerun's carried tasks, apart from the ledger (which is the run's own spending): each
/// task's usage in the earlier runs, and their total. Nothing for a run that carried none.
pub(crate) fn print_carried(out: &mut impl Write, state: &RunState) -> Result<()> {
    let carried: Vec<(String, Usage)> = state
        .tasks
        .iter()
        .enumerate()
        .filter_map(|(i, rec)| {
            let u = rec.steps().carried?;
            Some((state.label(sortie_core::TaskId(u32::try_from(i).ok()?)), u))
        })
        .collect();
    if carried.is_empty() {
        return Ok(());
    }
    let parent = state
        .parent
        .as_ref()
        .map_or_else(|| "an earlier run".to_owned(), |p| format!("run {p}"));
    writeln!(
        out,
        "carried from {parent} ({} tasks, not run again; spent there, not by this run):",
        carried.len()
    )?;
    for (label, u) in &carried {
        writeln!(
            out,
            "  task {:<23} {:>10} tok  {}",
            truncate(label, 23),
            u.tokens(),
            u.cost
        )?;
    }
    let total = Usage::sum(carried.iter().map(|(_, u)| u));
    writeln!(
        out,
        "  {:<28} {:>10} tok  {}",
        "carried total",
        total.tokens(),
        total.cost
    )?;
    Ok(())
}

/// Prints a usage ledger per task and per model.
pub(crate) fn print_ledger(out: &mut impl Write, state: &RunState, ledger: &Ledger) -> Result<()> {
    let rows = ledger
        .tasks
        .iter()
        .map(|(task, u)| (format!("task {}", state.label(*task)), u))
        .chain(ledger.models.iter().map(|(model, u)| {
            (
                format!("model {}", model.as_deref().unwrap_or("(default)")),
                u,
            )
        }))
        .chain([("total".to_owned(), &ledger.total)]);
    print_usage_table(out, "usage", rows, crate::text::stdout_width())
}

/// A usage table (name, input, output, cache_r, cache_w, turns, cost) fitted to `width`: the
/// name's column (at most 28) gives way to the numbers and the widest cost, and a line still
/// too long is cut.
pub(crate) fn print_usage_table<'a>(
    out: &mut impl Write,
    title: &str,
    rows: impl Iterator<Item = (String, &'a Usage)>,
    width: usize,
) -> Result<()> {
    let rows: Vec<(String, &Usage, String)> =
        rows.map(|(n, u)| (n, u, u.cost.to_string())).collect();
    let cost_w = rows.iter().map(|r| r.2.chars().count()).max().unwrap_or(4);
    // Four numbers of 9 and turns of 5, each after a space, and two before the cost.
    let name_w = width.saturating_sub(48 + cost_w).clamp(10, 28);
    let head = format!(
        "{:<name_w$} {:>9} {:>9} {:>9} {:>9} {:>5}  cost",
        truncate(title, name_w),
        "input",
        "output",
        "cache_r",
        "cache_w",
        "turns"
    );
    writeln!(out, "{}", crate::text::fit(&head, width))?;
    for (name, u, cost) in &rows {
        let line = format!(
            "{:<name_w$} {:>9} {:>9} {:>9} {:>9} {:>5}  {cost}",
            truncate(&crate::text::printable(name), name_w),
            u.input,
            u.output,
            u.cache_read,
            u.cache_write,
            u.turns,
        );
        writeln!(out, "{}", crate::text::fit(&line, width))?;
    }
    Ok(())
}

/// Prints the state of the tasks `filter` lists as a table (a big run: the tasks that did not
/// complete, then one line per state).
pub(crate) fn print_status(
    out: &mut impl Write,
    v: &RunView,
    filter: &sortie_core::view::RowFilter,
) -> Result<()> {
    writeln!(
        out,
        "run {}: {}{}  ({} events, {} tokens, {})",
        v.run_id,
        v.status,
        v.live_pid
            .map(|p| format!(" (pid {p})"))
            .unwrap_or_default(),
        v.events,
        v.usage.tokens(),
        v.cost
    )?;
    let counts: Vec<String> = v.counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    writeln!(out, "{}", counts.join(", "))?;
    if let Some(reason) = &v.budget_exceeded {
        writeln!(out, "run budget exceeded: {reason}")?;
    }
    if let Some(note) = &v.cost_priced {
        writeln!(out, "{note}")?;
    }
    for line in &v.recovered {
        writeln!(out, "{line}")?;
    }
    let mut line = String::new();
    let tasks: usize = v.counts.values().sum();
    let mut listed = 0;
    for t in v.tasks.iter().filter(|t| filter.shows(tasks, &t.state)) {
        listed += 1;
        task_line(&mut line, t);
        out.write_all(line.as_bytes())?;
        if t.held {
            writeln!(out, "      held")?;
        }
        if let Some(p) = &t.waiting_for_pool {
            writeln!(out, "      waiting for pool {p}")?;
        }
        if let Some(e) = &t.error {
            writeln!(out, "      {}", first_line(e))?;
        }
        if !t.denials.is_empty() {
            let denied = sortie_core::Denial::describe(&t.denials);
            writeln!(out, "      denied tool calls: {denied}")?;
        }
        let net = sortie_core::sandbox_net::denied(&t.net);
        if !net.is_empty() {
            let field = sortie_core::sandbox_net::ALLOWING_FIELD;
            writeln!(out, "      denied: {} ({field})", net.join(", "))?;
        }
        let agent_setup: Vec<String> = [("role", &t.role), ("session", &t.session)]
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v}")))
            .collect();
        if !agent_setup.is_empty() {
            writeln!(out, "      {}", agent_setup.join(", "))?;
        }
    }
    if filter.leaves_out(tasks) {
        writeln!(
            out,
            "listed {listed} of {tasks} task(s) (--all lists every one, --state picks states)"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::Attempt;

    #[test]
    fn a_task_view_names_the_denied_tool_calls_of_its_finished_attempts_only() {
        use sortie_core::state::AttemptEnd;
        use sortie_core::{AttemptOutcome, AttemptRecord, Denial, OrphanAction, TaskRecord};
        let attempt = |n: u32, end: AttemptEnd| {
            let mut a = AttemptRecord::new(Attempt(n), None, sortie_core::Timestamp(1));
            a.end = Some(end);
            a
        };
        let orphaned = AttemptEnd::Orphaned {
            action: OrphanAction::Killed,
            at: sortie_core::Timestamp(2),
        };
        let finished = |denials: Vec<Denial>| AttemptEnd::Finished {
            outcome: sortie_core::OutcomeRecord::new(
                &AttemptOutcome {
                    denials,
                    ..AttemptOutcome::completed()
                },
                "",
            ),
            at: sortie_core::Timestamp(3),
        };
        let record = |attempts| {
            let mut rec = TaskRecord::new();
            rec.state = sortie_core::TaskState::Ended {
                attempt: Attempt(2),
            };
            rec.attempts = attempts;
            rec
        };
        let bash = Denial {
            tool: "bash".into(),
            count: 2,
        };
        let mut state = RunState::new();
        state.tasks.push(record(vec![
            attempt(1, orphaned.clone()),
            attempt(2, finished(vec![bash.clone()])),
        ]));
        state.tasks.push(record(vec![
            attempt(1, orphaned),
            attempt(2, finished(Vec::new())),
        ]));
        let views: Vec<TaskView> = (0..2)
            .map(|i| task_view(&state, i, &state.tasks[i], 0, false))
            .collect();
        assert_eq!(views[0].denials, vec![bash]);
        assert_eq!(views[0].denials, state.tasks[0].denials());
        assert!(views[1].denials.is_empty());
    }

    /// The line as `format!` lays it out.
    fn formatted(t: &TaskView) -> String {
        format!(
            "  {:<24} {:<10} attempt {:<2} {:<18} {:>9} tok  {}{}\n",
            truncate(&t.label, 24),
            t.state,
            t.attempts,
            t.model.as_deref().unwrap_or("-"),
            t.usage.tokens(),
            t.usage.cost,
            if t.stalled { "  STALLED" } else { "" }
        )
    }

    #[test]
    fn a_task_line_keeps_its_columns_whatever_the_widths() {
        let tasks = [
            TaskView {
                label: "task-1".into(),
                state: "completed".into(),
                attempts: 1,
                ..TaskView::default()
            },
            TaskView {
                label: "a-label-much-longer-than-its-column-of-24".into(),
                state: "interrupted".into(),
                attempts: 123,
                model: Some("a-model-name-longer-than-18".into()),
                stalled: true,
                usage: Usage {
                    input: 12_345_678_901,
                    cost: sortie_core::Cost::reported_nanos(1_234_567_890),
                    ..Usage::default()
                },
                ..TaskView::default()
            },
            TaskView {
                label: "étiquette-à-accents".into(),
                state: "running".into(),
                attempts: 12,
                model: Some("modèle".into()),
                usage: Usage {
                    output: 99,
                    ..Usage::default()
                },
                ..TaskView::default()
            },
            TaskView {
                label: "ééééééééééééééééééééééééé".into(),
                state: "queued".into(),
                ..TaskView::default()
            },
        ];
        let mut line = String::new();
        for t in &tasks {
            task_line(&mut line, t);
            assert_eq!(line, formatted(t));
        }
        assert!(line.contains("ééééééééééééééééééééééé…"));
    }
}
