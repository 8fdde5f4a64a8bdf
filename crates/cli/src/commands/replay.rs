//! `sortie replay RUN [--task LABEL] [--at SEQ]`: the run's timeline (seq, time since the
//! start, task, event), then the state as of the last event shown. Read-only: it never spawns.

use std::io::Write;

use crate::error::{CliError, Result};
use serde::Serialize;
use sortie_core::{Event, Seq, Stamped};

use super::{Code, open_read};
use crate::args::{Global, ReplayArgs};
use crate::output;
use crate::text::{control_text, percent};

#[derive(Serialize)]
struct ReplayView<'a> {
    events: Vec<&'a Stamped>,
    state: output::RunView,
}

/// Prints the timeline and the state as of `--at`.
pub(crate) fn replay(g: &Global, args: ReplayArgs) -> Result<Code> {
    let run = super::find_run(g, &args.run)?;
    let journal = open_read(&g.layout(), &run)?;
    let upto = args.at.map(Seq);
    // Folded from seq 0, never from the snapshot; the snapshot is checked against the fold
    // when the fold passes its seq.
    let checked = journal.replay_checked(upto)?;
    let code = if checked.snapshot_agrees() {
        Code::Ok
    } else {
        eprintln!(
            "sortie: run {run}: its snapshot differs from the journal folded to the same seq \
             (see `sortie audit {run}`)"
        );
        Code::Corrupt
    };
    // A moment before the journal's end is past: what ran then was running as of then, not
    // interrupted (only the final view of a run whose owner is gone says that).
    let past = upto.is_some_and(|u| u.0.saturating_add(1) < journal.next_seq().0);
    // A live run (its owner holds its lock) is running now too.
    let live = matches!(
        g.layout().run(&run).owner(),
        sortie_runner::layout::Owner::Live { .. }
    );
    let (state, shown) = (checked.state, checked.events);
    let view = |with_text| {
        let mut v = output::view(&run, &state, None, with_text);
        if (past || live) && matches!(state.status, sortie_core::RunStatus::Running) {
            v.status = "running".into();
        }
        v
    };
    let filter = match &args.task {
        Some(label) => Some(
            state
                .task_by_label(label)
                .ok_or_else(|| CliError::usage(format_args!("run {run} has no task {label:?}")))?,
        ),
        None => None,
    };
    let selected: Vec<&Stamped> = shown
        .iter()
        .filter(|s| filter.is_none() || s.event.task() == filter)
        .collect();
    let mut out = std::io::stdout().lock();
    if g.json {
        let view = ReplayView {
            events: selected,
            state: view(true),
        };
        serde_json::to_writer_pretty(&mut out, &view)?;
        writeln!(out)?;
        return Ok(code);
    }
    let start = state.started_at.map(|t| t.0).unwrap_or(0);
    let started = output::clock(start);
    writeln!(
        out,
        "run {run}, started {started} UTC; times relative to the start, attempts indented"
    )?;
    for s in &selected {
        // The run's events at the margin, a task's under its label, an attempt's one step in.
        let (who, indent) = match s.event.task() {
            None => ("run".to_owned(), ""),
            Some(t) if is_attempt_event(&s.event) => (format!("[{}]", state.label(t)), "    "),
            Some(t) => (format!("[{}]", state.label(t)), ""),
        };
        let line = format!(
            "{:>10}  {who} {indent}{} {}  (seq {})",
            relative(s.at.0.saturating_sub(start)),
            s.event.name(),
            details(&s.event),
            s.seq
        );
        // Labels, errors and steer messages are shown, never obeyed by the terminal.
        writeln!(out, "{}", crate::text::printable(&line))?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "state as of seq {}:",
        state.next_seq.0.saturating_sub(1)
    )?;
    output::print_status(
        &mut out,
        &crate::text::printable_run(view(false)),
        &sortie_core::view::RowFilter {
            all: true,
            states: None,
        },
    )?;
    Ok(code)
}

/// A time since the start: `+4.250s`, `+1m02.5s`, `+2h05m10s`.
fn relative(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("+{}.{:03}s", s, ms % 1000),
        60..3600 => format!("+{}m{:02}.{}s", s / 60, s % 60, ms % 1000 / 100),
        _ => format!("+{}h{:02}m{:02}s", s / 3600, s % 3600 / 60, s % 60),
    }
}

/// Whether the event is about one attempt (shown indented under its task).
fn is_attempt_event(e: &Event) -> bool {
    matches!(
        e,
        Event::AttemptStarted { .. }
            | Event::AttemptProgress { .. }
            | Event::AttemptStalled { .. }
            | Event::AttemptFinished { .. }
            | Event::AttemptOrphaned { .. }
            | Event::AttemptSideEffects { .. }
            | Event::AttemptContinues { .. }
            | Event::AttemptSession { .. }
            | Event::SandboxNet { .. }
    )
}

/// #34: a sandboxed attempt's connections: how many were allowed, which were denied.
fn net_details(attempt: sortie_core::Attempt, flows: &[sortie_core::sandbox_net::Flow]) -> String {
    let allowed: u32 = flows.iter().filter(|f| f.allowed).map(|f| f.count).sum();
    let denied = sortie_core::sandbox_net::denied(flows);
    let denied = if denied.is_empty() {
        "none".to_owned()
    } else {
        denied.join(", ")
    };
    format!("attempt {attempt}: {allowed} connection(s) allowed, denied: {denied}")
}

/// #33: a check's start and verdict.
fn check_details(e: &Event) -> String {
    match e {
        Event::VerifyStarted { attempt, .. } => format!("check of attempt {attempt}"),
        Event::VerifyEnded {
            attempt, verdict, ..
        } => format!(
            "check of attempt {attempt} {} (score {:.2}){}",
            if verdict.passed { "passed" } else { "failed" },
            verdict.score_f64(),
            verdict
                .error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ),
        _ => String::new(),
    }
}

fn details(e: &Event) -> String {
    match e {
        Event::RunStarted {
            batch, host, pid, ..
        } => {
            format!(
                "{} tasks from {} on {host} pid {pid}",
                batch.tasks.len(),
                batch.source
            )
        }
        Event::RunResumed { pid, from_seq } => format!("pid {pid} after seq {from_seq}"),
        Event::RunInterrupted { reason } => reason.clone(),
        Event::RunFinished { state, .. } => state.to_string(),
        Event::TaskQueued { .. } => String::new(),
        Event::TaskSetUp { worktree, .. } => worktree.clone().unwrap_or_default(),
        Event::AttemptLaunching { attempt, model, .. } => {
            format!(
                "attempt {attempt} model {}",
                model.as_deref().unwrap_or("(default)")
            )
        }
        Event::AttemptStarted { attempt, pid, .. } => format!("attempt {attempt} pid {pid}"),
        Event::AttemptProgress { attempt, usage, .. } => format!(
            "attempt {attempt} {} tokens {} turns {}",
            usage.tokens(),
            usage.turns,
            usage.cost
        ),
        Event::AttemptStalled { attempt, .. } => format!("attempt {attempt}"),
        Event::AttemptFinished {
            attempt,
            outcome,
            usage,
            ..
        } => format!(
            "attempt {attempt} {:?}/{}{} {} {} tokens {}",
            outcome.status,
            outcome.stop_reason,
            outcome
                .error
                .as_deref()
                .map(|e| format!(" ({})", e.lines().next().unwrap_or_default()))
                .unwrap_or_default(),
            match (outcome.exit_code, outcome.signal) {
                (_, Some(sig)) => format!("signal {sig}"),
                (Some(code), None) => format!("exit {code}"),
                (None, None) => "no exit".to_owned(),
            },
            usage.tokens(),
            usage.cost
        ),
        Event::AttemptOrphaned {
            attempt, action, ..
        } => format!("attempt {attempt} {action:?}"),
        Event::RetryScheduled {
            next_attempt,
            delay,
            reason,
            ..
        } => {
            format!(
                "attempt {next_attempt} in {:.1}s: {reason}",
                delay.as_secs_f64()
            )
        }
        Event::ArtifactWritten { path, bytes, .. } => format!("{path} ({bytes} bytes)"),
        // #33: the check of a completed attempt.
        Event::VerifyStarted { .. } | Event::VerifyEnded { .. } => check_details(e),
        Event::WorktreeFinalized { changed, .. } => format!("changed: {changed}"),
        Event::WorktreePlanned { path, branch, .. } => format!("{path} on {branch}"),
        Event::AttemptSideEffects { attempt, .. } => format!("attempt {attempt}"),
        Event::AttemptContinues {
            attempt, session, ..
        } => format!("attempt {attempt} continues {session}"),
        Event::AttemptSession {
            attempt, session, ..
        } => format!("attempt {attempt} is in session {session}"),
        Event::SandboxNet { attempt, flows, .. } => net_details(*attempt, flows),
        Event::RunBudgetWarned { limit, used, of } => {
            format!(
                "{} at {}% ({used} of {of})",
                limit.field(),
                percent(*used, *of)
            )
        }
        Event::RunBudgetExceeded { reason, .. } => reason.clone(),
        Event::RunRerunOf { parent } => format!("rerun of {parent}"),
        Event::AttemptWaiting { attempt, .. } => {
            format!("attempt {attempt} waits for a machine-wide slot")
        }
        Event::WorktreeDiscarded {
            by, branch_kept, ..
        } => format!(
            "removed by {}{}; its patch stays",
            by.who(),
            if *branch_kept {
                ", its branch kept"
            } else {
                ""
            }
        ),
        Event::RunRecovered {
            kept,
            lost,
            restored,
            ..
        } => crate::text::recovery_line(*kept, *lost, restored.len()),
        Event::TaskCarried { result, usage, .. } => format!(
            "carried: {} ({} tokens, {} spent by the parent run)",
            result.state,
            usage.tokens(),
            usage.cost
        ),
        Event::TaskFinished { result, .. } => format!(
            "{} ({}){}",
            result.state,
            result.stop_reason,
            result
                .error
                .as_deref()
                .map(|e| format!(": {}", e.lines().next().unwrap_or_default()))
                .unwrap_or_default()
        ),
        // #10: attempts that outlive sortie.
        Event::AttemptPlaced {
            attempt,
            executor,
            dir,
            ..
        } => format!("attempt {attempt} on {executor} in {dir}"),
        Event::AttemptHandle {
            attempt, handle, ..
        } => format!("attempt {attempt} is {handle}"),
        Event::AttemptAdopted {
            attempt, offset, ..
        } => format!("attempt {attempt} adopted (stdout at {offset} bytes)"),
        Event::AttemptRecorded { attempt, .. } => {
            format!("attempt {attempt} ended while sortie was down: recorded from its files")
        }
        Event::Control { by, action } => format!("{} by {by}", control_text(action)),
        Event::AttemptRead {
            attempt, offset, ..
        } => format!("attempt {attempt}: journaled up to byte {offset} of its stdout"),
    }
}
