//! `sortie status [RUN]`: a run's state, read from its journal, live or not.

use std::io::Write;

use crate::error::Result;
use sortie_runner::layout::Owner;

use super::{Code, newest, open_read, replay_all};
use crate::args::Global;
use crate::output;

/// Prints the state of a run (the newest by default).
pub(crate) fn status(g: &Global, run: Option<&str>) -> Result<Code> {
    let run = match run {
        Some(r) => super::find_run(g, r)?,
        None => newest(&g.layout(), false)?,
    };
    let live_pid = match g.layout().run(&run).owner() {
        Owner::Live { pid } => Some(pid.unwrap_or(0)),
        Owner::Free => None,
    };
    // Closed (its copy removed) when `_closing` drops, on every way out.
    let (state, _closing) = super::read_latest(&g.layout(), &run)?;
    let mut view = output::view(&run, &state, live_pid, false);
    if g.rows.states.is_some() {
        let tasks = view.tasks.len();
        view.tasks.retain(|t| g.rows.shows(tasks, &t.state));
    }
    // Buffered: stdout is line-buffered, and a 100,000-task run is as many lines.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if g.json {
        serde_json::to_writer_pretty(&mut out, &view)?;
        writeln!(out)?;
    } else {
        view = crate::text::printable_run(view);
        output::print_status(&mut out, &view, &g.rows)?;
        crate::pools::print(&mut out, &view.pools, view.now)?;
        output::print_kept(&mut out, &view)?;
        output::print_carried(&mut out, &state)?;
        if let Some(pool) = sortie_runner::slots::Pool::configured() {
            writeln!(
                out,
                "machine-wide slots: {} of {} held ({})",
                pool.held(),
                pool.slots,
                pool.dir.display()
            )?;
        }
    }
    out.flush()?;
    // The process ends here: freeing a 100,000-task state and its view one allocation at a
    // time is a tenth of a second of nothing (callgrind: 9% of `status` of that run).
    std::mem::forget(view);
    std::mem::forget(state);
    Ok(Code::Ok)
}

/// `sortie status RUN --task LABEL`: one task's line and each attempt's transcript.
pub(crate) fn task(g: &Global, run: Option<&str>, label: &str) -> Result<Code> {
    let run = match run {
        Some(r) => super::find_run(g, r)?,
        None => newest(&g.layout(), false)?,
    };
    let run_dir = g.layout().run(&run);
    let live_pid = match run_dir.owner() {
        Owner::Live { pid } => Some(pid.unwrap_or(0)),
        Owner::Free => None,
    };
    let state = replay_all(&open_read(&g.layout(), &run)?)?;
    let Some(id) = state.task_by_label(label) else {
        return Err(crate::error::CliError::usage(format_args!(
            "run {run} has no task {label:?}"
        )));
    };
    let view = output::view(&run, &state, live_pid, false);
    let Some(task) = view.tasks.into_iter().nth(id.0 as usize) else {
        return Err(crate::error::CliError::usage(format_args!(
            "run {run} has no task {label:?}"
        )));
    };
    let transcripts = sortie_runner::transcript::of_task(&state, &run_dir, id);
    let mut out = std::io::stdout().lock();
    if g.json {
        let v = TaskStatus {
            run_id: run.to_string(),
            task,
            transcripts,
        };
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
        return Ok(Code::Ok);
    }
    let task = crate::text::printable_task(task);
    writeln!(
        out,
        "run {run}, task {}: {}, {} attempt{}, {} tokens",
        task.label,
        task.state,
        task.attempts,
        if task.attempts == 1 { "" } else { "s" },
        task.usage.tokens()
    )?;
    for t in &transcripts {
        let what = if !t.exists {
            "no transcript (never started, or removed by `sortie gc`)".to_owned()
        } else {
            let mut s = super::logs::size(t.bytes);
            if let Some(cut) = t.cut {
                s.push_str(&format!(
                    ", cut {} (bytes {}..{}) to keep it under its cap; {} on disk",
                    super::logs::size(cut.bytes()),
                    cut.from,
                    cut.to,
                    super::logs::size(t.disk_bytes)
                ));
                if let Some(unread) = cut.unread {
                    s.push_str(&format!(
                        "; {} of it (bytes {unread}..{}) cut before sortie read it: not counted",
                        super::logs::size(cut.unread_bytes()),
                        cut.to
                    ));
                }
            }
            s
        };
        writeln!(
            out,
            "attempt {} ({}, {}): {}  {what}",
            t.attempt,
            t.executor,
            t.end,
            t.path.display()
        )?;
    }
    if let Some(last) = transcripts.last() {
        writeln!(
            out,
            "print one with: sortie logs {run} {} --attempt {}",
            task.label, last.attempt
        )?;
    }
    Ok(Code::Ok)
}

/// What `status --task --json` prints: the task's line and its transcripts.
#[derive(serde::Serialize)]
struct TaskStatus {
    run_id: String,
    #[serde(flatten)]
    task: output::TaskView,
    transcripts: Vec<sortie_runner::transcript::Transcript>,
}
