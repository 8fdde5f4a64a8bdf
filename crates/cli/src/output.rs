//! Printing: log lines and progress on stderr, summaries, tables and JSON on stdout.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};

use serde::Serialize;

use crate::error::Result;
use sortie_core::ledger::{Ledger, ledger};
use sortie_core::{Event, RunId, RunState, RunStatus, Stamped, Usage};
use sortie_runner::engine::Observer;

/// Installs the tracing subscriber: warnings by default, `-v` info, `-vv` debug; RUST_LOG wins.
pub(crate) fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Prints one line per notable event on stderr (plain log lines, good in CI logs and on a
/// terminal alike). With `--json`, stays quiet: stdout gets the final JSON.
pub(crate) fn observer(json: bool) -> Box<dyn Observer> {
    Box::new(LogLines {
        quiet: json,
        tty: std::io::stderr().is_terminal(),
        board: Board::default(),
    })
}

struct LogLines {
    quiet: bool,
    tty: bool,
    board: Board,
}

/// The live display on a terminal: below the log lines, one line of counts, tokens, cost and
/// ETA, then one line per running task. Redrawn at most ten times a second, and whenever a log
/// line is printed above it.
#[derive(Default)]
struct Board {
    drawn: usize,
    last_draw: Option<std::time::Instant>,
}

/// How many running tasks the board lists before it summarises the rest.
const BOARD_TASKS: usize = 12;

impl Board {
    fn erase(&mut self, out: &mut impl Write) {
        for _ in 0..self.drawn {
            let _ = write!(out, "\x1b[1A\x1b[2K");
        }
        self.drawn = 0;
    }

    fn draw(&mut self, out: &mut impl Write, state: &RunState, at: u64) {
        let total = state.tasks.len();
        let done = state.done_count();
        let running: Vec<(usize, &sortie_core::TaskRecord)> = state
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.live_attempt().is_some())
            .collect();
        let usage = state.usage_counters();
        let eta = match (state.started_at, done) {
            (Some(start), d) if d > 0 && d < total => {
                let per = at.saturating_sub(start.0) / d as u64;
                format!(" · ETA {}", short_duration(per * (total - d) as u64))
            }
            _ => String::new(),
        };
        let mut lines = vec![format!(
            "[{done}/{total}] running {} · {} tokens · {}{eta}",
            running.len(),
            usage.tokens(),
            usage.cost
        )];
        for (i, rec) in running.iter().take(BOARD_TASKS) {
            let Some(a) = rec.live_attempt() else {
                continue;
            };
            lines.push(format!(
                "  {:<24} attempt {} {:<16} {:>7} {:>8} tok{}",
                truncate(&state.label(sortie_core::TaskId(*i as u32)), 24),
                a.attempt,
                truncate(a.model.as_deref().unwrap_or("-"), 16),
                short_duration(at.saturating_sub(a.launched_at.0)),
                a.usage.tokens(),
                if a.stalled { "  stalled" } else { "" }
            ));
        }
        if running.len() > BOARD_TASKS {
            lines.push(format!("  … and {} more", running.len() - BOARD_TASKS));
        }
        for l in &lines {
            let _ = writeln!(out, "{l}");
        }
        self.drawn = lines.len();
        self.last_draw = Some(std::time::Instant::now());
    }
}

fn short_duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{}.{}s", s, ms % 1000 / 100),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

impl Observer for LogLines {
    fn event(&mut self, state: &RunState, s: &Stamped) {
        if self.quiet {
            return;
        }
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
            } => Some(format!(
                "[{}] attempt {attempt} launching{}",
                state.label(*task),
                model
                    .as_deref()
                    .map(|m| format!(" on {m}"))
                    .unwrap_or_default()
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
                "[{}] attempt {attempt} orphaned by a crash ({action:?})",
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
            Event::TaskFinished { task, result } => {
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
        let mut err = std::io::stderr().lock();
        if !self.tty {
            if let Some(line) = line {
                let _ = writeln!(err, "{} {line}", clock(s.at.0));
            }
            return;
        }
        let ending = matches!(
            s.event,
            Event::RunFinished { .. } | Event::RunInterrupted { .. }
        );
        let due = self
            .board
            .last_draw
            .is_none_or(|t| t.elapsed().as_millis() >= 100);
        if line.is_some() || due || ending {
            self.board.erase(&mut err);
            if let Some(line) = line {
                let _ = writeln!(err, "\x1b[2m{}\x1b[0m {line}", clock(s.at.0));
            }
            if !ending {
                self.board.draw(&mut err, state, s.at.0);
            }
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

/// `HH:MM:SS` (UTC) of a timestamp.
pub(crate) fn clock(ms: u64) -> String {
    let s = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60)
}

/// A task's line in status and JSON output.
#[derive(Debug, Serialize)]
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
    /// Its text (for finished tasks).
    pub(crate) text: Option<String>,
    /// The tool calls its agent's permissions denied (tool, count), over its attempts.
    pub(crate) denials: Vec<sortie_core::Denial>,
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
}

/// Builds the view of a run.
pub(crate) fn view(
    run: &RunId,
    state: &RunState,
    live_pid: Option<u32>,
    with_text: bool,
) -> RunView {
    let mut counts = BTreeMap::new();
    let tasks: Vec<TaskView> = state
        .tasks
        .iter()
        .enumerate()
        .map(|(i, rec)| {
            // Core names the display states (`interrupted`, `setting-up`).
            let name = rec.display_state().to_owned();
            *counts.entry(name.clone()).or_insert(0) += 1;
            let result = rec.result();
            TaskView {
                label: state.label(sortie_core::TaskId(i as u32)),
                state: name,
                attempts: rec.attempts.len(),
                model: rec.attempts.last().and_then(|a| a.model.clone()),
                stop_reason: result.map(|r| r.stop_reason.to_string()),
                error: result.and_then(|r| r.error.clone()),
                stalled: rec.live_attempt().is_some_and(|a| a.stalled),
                usage: rec.usage(),
                text: if with_text {
                    result.map(|r| r.text.clone())
                } else {
                    None
                },
                denials: rec.denials(),
            }
        })
        .collect();
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
        tasks,
        events: state.next_seq.0,
    }
}

/// Prints a finished (or interrupted) run's summary: the summary text and the ledger, or JSON.
pub(crate) fn print_summary(json: bool, run: &RunId, state: &RunState) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &view(run, state, None, true))?;
        writeln!(out)?;
        return Ok(());
    }
    // The journal's text once the run finished (`RunFinished` carries it, made by core's
    // `summary_text`); a run not finished has none journaled, so the same function says it as
    // of now.
    match &state.summary {
        Some(text) => writeln!(out, "{text}")?,
        None => writeln!(out, "{}", sortie_core::summary_text(state))?,
    }
    writeln!(out)?;
    print_ledger(&mut out, state, &ledger(state))?;
    Ok(())
}

/// Prints a usage ledger per task and per model.
pub(crate) fn print_ledger(out: &mut impl Write, state: &RunState, ledger: &Ledger) -> Result<()> {
    writeln!(
        out,
        "{:<28} {:>10} {:>10} {:>10} {:>10} {:>6}  cost",
        "usage", "input", "output", "cache_r", "cache_w", "turns"
    )?;
    let row = |out: &mut dyn Write, name: &str, u: &Usage| -> std::io::Result<()> {
        writeln!(
            out,
            "{:<28} {:>10} {:>10} {:>10} {:>10} {:>6}  {}",
            truncate(name, 28),
            u.input,
            u.output,
            u.cache_read,
            u.cache_write,
            u.turns,
            u.cost
        )
    };
    for (task, u) in &ledger.tasks {
        row(out, &format!("task {}", state.label(*task)), u)?;
    }
    for (model, u) in &ledger.models {
        row(
            out,
            &format!("model {}", model.as_deref().unwrap_or("(default)")),
            u,
        )?;
    }
    row(out, "total", &ledger.total)?;
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

/// Prints the state of every task as a table.
pub(crate) fn print_status(out: &mut impl Write, v: &RunView) -> Result<()> {
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
    for t in &v.tasks {
        writeln!(
            out,
            "  {:<24} {:<10} attempt {:<2} {:<18} {:>9} tok  {}{}",
            truncate(&t.label, 24),
            t.state,
            t.attempts,
            t.model.as_deref().unwrap_or("-"),
            t.usage.tokens(),
            t.usage.cost,
            if t.stalled { "  STALLED" } else { "" }
        )?;
        if let Some(e) = &t.error {
            writeln!(out, "      {}", first_line(e))?;
        }
        if !t.denials.is_empty() {
            let denied = sortie_core::Denial::describe(&t.denials);
            writeln!(out, "      denied tool calls: {denied}")?;
        }
    }
    Ok(())
}
