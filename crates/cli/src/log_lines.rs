//! Log lines and progress on stderr as a run goes (the observer a front end gives the run),
//! and the tracing subscriber.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};

use crate::board::Board;
use sortie_core::{Attempt, Event, RunId, RunState, Stamped, TaskId};
use sortie_runner::engine::{Front, Observer};

/// Installs the tracing subscriber: warnings by default, `-v` info, `-vv` debug; RUST_LOG wins.
pub(crate) fn init_tracing(verbose: u8) {
    // sled logs through `log` (bridged into tracing): its complaints about a damaged file
    // are for -v; without it sortie's own one-line error says what is wrong.
    let default = match verbose {
        0 => "warn,sled=off",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // #37: colour codes only for a terminal; a pipe or a file gets plain lines.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// What a run prints while it goes: off a terminal, one timestamped line per event worth a
/// person's attention; on a terminal, the same lines above the live board (`board.rs`). With
/// `--json` or `--quiet`, nothing: stdout gets the summary at the end.
pub(crate) fn observer(g: &crate::args::Global, run_id: Option<&RunId>) -> Box<dyn Observer> {
    let quiet = g.json || g.quiet;
    let board = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let board = Board::new();
        if let Some(run) = run_id {
            board.set_run_id(&run.to_string());
        }
        board
    });
    Box::new(LogLines {
        quiet,
        board,
        last_progress: None,
    })
}

/// What a run's command gives the engine: the [`observer`] and `--on-task-end CMD` (the engine
/// runs the task-end hooks).
pub(crate) fn front(g: &crate::args::Global, run_id: Option<&RunId>) -> Front {
    Front {
        observer: observer(g, run_id),
        on_task_end: g.on_task_end.clone(),
    }
}

struct LogLines {
    quiet: bool,
    board: Option<Board>,
    /// When the last progress line of a big run was printed (off a terminal), or the first
    /// event was seen.
    last_progress: Option<u64>,
}

/// Whether colours may be used on stderr (a terminal, and `NO_COLOR` unset).
fn colour() -> bool {
    console::colors_enabled_stderr()
}

impl Observer for LogLines {
    fn event(&mut self, state: &RunState, s: &Stamped) {
        if self.quiet {
            return;
        }
        let tasks = state.tasks.len();
        let line = match &s.event {
            Event::RunStarted { run_id, batch, .. } => Some(format!(
                "run {run_id}: {} task(s), concurrency {}",
                batch.tasks.len(),
                batch.config.concurrency
            )),
            Event::RunResumed { pid, from_seq } => {
                Some(format!("resumed by pid {pid} after seq {from_seq}"))
            }
            Event::AttemptLaunching {
                task,
                attempt,
                model,
            } if sortie_core::view::logs_launch(tasks) => Some(format!(
                "[{}] attempt {attempt} launching{}",
                state.label(*task),
                model
                    .as_deref()
                    .map(|m| format!(" on {m}"))
                    .unwrap_or_default()
            )),
            Event::RunBudgetWarned { limit, used, of } => Some(format!(
                "warning: the run has used {}% of its budget's {}",
                crate::text::percent(*used, *of),
                limit.field()
            )),
            Event::RunBudgetExceeded { reason, .. } => Some(format!(
                "the run's budget ran out: {reason}; nothing new starts, running tasks wrap up \
                 or stop"
            )),
            Event::AttemptStalled { task, attempt } => Some(format!(
                "[{}] attempt {attempt} stalled (no output)",
                state.label(*task)
            )),
            Event::AttemptOrphaned {
                task,
                attempt,
                action,
            } => Some(format!(
                "[{}] attempt {attempt} orphaned: sortie or its supervisor stopped ({action:?})",
                state.label(*task)
            )),
            Event::RetryScheduled {
                task,
                reason,
                delay,
                ..
            } => Some(format!(
                "[{}] {reason} (in {:.1}s)",
                state.label(*task),
                delay.as_secs_f64()
            )),
            // #33: a check's verdict (its start is shown by the board and status).
            Event::VerifyEnded {
                task,
                attempt,
                verdict,
            } if sortie_core::view::logs_launch(tasks) => Some(format!(
                "[{}] check of attempt {attempt} {}",
                state.label(*task),
                match &verdict.error {
                    None => "passed".to_owned(),
                    Some(e) => format!("failed: {}", first_line(e)),
                }
            )),
            Event::Control { by, action } => Some(format!(
                "[{}] {} by {by}",
                action
                    .task()
                    .map(|t| state.label(t))
                    .unwrap_or_else(|| "run".to_owned()),
                crate::text::control_text(action)
            )),
            Event::TaskFinished { task, result }
                if sortie_core::view::logs_task_end(tasks, result.state.as_str()) =>
            {
                let done = state.done_count();
                let usage = state.usage_counters();
                Some(format!(
                    "[{}] {}{} ({done}/{} done, {} tokens, {})",
                    state.label(*task),
                    result.state,
                    result
                        .error
                        .as_deref()
                        .map(|e| format!(": {}", first_line(e)))
                        .unwrap_or_default(),
                    state.tasks.len(),
                    usage.tokens(),
                    usage.cost
                ))
            }
            _ => None,
        };
        // Labels and errors are shown, never obeyed by the terminal.
        let line = line.map(|l| crate::text::printable(&l));
        match &mut self.board {
            None => {
                if let Some(line) = line {
                    // One write per line (stderr is unbuffered: `writeln!` would make one per
                    // piece, four system calls per task).
                    let text = format!("{} {line}\n", clock(s.at.0));
                    let _ = std::io::stderr().lock().write_all(text.as_bytes());
                }
                let since = *self.last_progress.get_or_insert(s.at.0);
                if sortie_core::view::progress_due(tasks, since, s.at.0) {
                    self.last_progress = Some(s.at.0);
                    let text = format!("{} {}\n", clock(s.at.0), progress_line(state));
                    let _ = std::io::stderr().lock().write_all(text.as_bytes());
                }
            }
            Some(board) => {
                if let Some(line) = line {
                    let stamp = if colour() {
                        format!("\x1b[2m{}\x1b[0m", clock(s.at.0))
                    } else {
                        clock(s.at.0)
                    };
                    board.println(&format!("{stamp} {line}"));
                }
                board.event(state, s);
                if matches!(
                    s.event,
                    Event::RunFinished { .. } | Event::RunInterrupted { .. }
                ) {
                    board.finish();
                }
            }
        }
    }

    fn activity(&mut self, _: &RunState, task: TaskId, attempt: Attempt, text: &str) {
        if let Some(board) = &self.board {
            board.activity(task, attempt, text);
        }
    }
}

/// A big run's progress line: done of all, the count per state, tokens and cost so far.
fn progress_line(state: &RunState) -> String {
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for rec in &state.tasks {
        *counts.entry(rec.display_state()).or_insert(0) += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let usage = state.usage_counters();
    format!(
        "progress: {}/{} done ({}), {} tokens, {}",
        state.done_count(),
        state.tasks.len(),
        counts.join(", "),
        usage.tokens(),
        usage.cost
    )
}

pub(crate) fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

/// `HH:MM:SS` (UTC) of a timestamp.
pub(crate) fn clock(ms: u64) -> String {
    let s = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60)
}
