//! One module per command; `dispatch` picks it, `exit_code_of` maps errors to exit codes.

mod apply;
mod audit;
mod diff;
mod discard;
mod export;
mod gc;
mod list;
mod replay;
mod run;
mod status;

use std::path::Path;

use anyhow::{Context, Result};
use sortie_core::{RunId, RunState};
use sortie_journal::Journal;

use crate::args::{Cli, Command};

/// The exit codes of DESIGN.md section 8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// The run completed, or the command did its job.
    Ok = 0,
    /// The run failed or was partial, or the command failed.
    Failed = 1,
    /// A usage error.
    Usage = 2,
    /// The run was interrupted and can be resumed.
    Interrupted = 3,
    /// The journal is corrupt.
    Corrupt = 4,
}

impl From<Code> for std::process::ExitCode {
    fn from(c: Code) -> Self {
        std::process::ExitCode::from(c as u8)
    }
}

/// Runs the command.
pub(crate) fn dispatch(cli: Cli) -> Result<Code> {
    let g = &cli.global;
    match cli.command {
        Command::Run(args) => run::run(g, args),
        Command::Resume(r) => run::resume(g, r.run.as_deref()),
        Command::Cancel(r) => run::cancel(g, &r.run),
        Command::Status(r) => status::status(g, r.run.as_deref()),
        Command::List => list::list(g),
        Command::Replay(args) => replay::replay(g, args),
        Command::Audit(r) => audit::audit(g, &r.run),
        Command::Export(args) => export::export(g, &args.run),
        Command::Diff(t) => diff::diff(g, &t),
        Command::Apply(t) => apply::apply(g, &t),
        Command::Discard(t) => discard::discard(g, &t),
        Command::Gc(args) => gc::gc(g, &args),
    }
}

/// The exit code for an error.
pub(crate) fn exit_code_of(err: &anyhow::Error) -> Code {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<sortie_journal::Error>() {
            return journal_code(e);
        }
        if let Some(e) = cause.downcast_ref::<sortie_runner::kept::KeptError>() {
            return if e.is_usage() {
                Code::Usage
            } else {
                Code::Failed
            };
        }
        if let Some(e) = cause.downcast_ref::<sortie_runner::Error>() {
            return match e {
                sortie_runner::Error::Journal(j) => journal_code(j),
                sortie_runner::Error::JournalWrite { .. } if e.is_resumable() => Code::Interrupted,
                sortie_runner::Error::JournalWrite { .. } => Code::Failed,
                sortie_runner::Error::Batch(_)
                | sortie_runner::Error::Live { .. }
                | sortie_runner::Error::NoSuchRun(_)
                | sortie_runner::Error::RunExists(_)
                | sortie_runner::Error::NothingToResume(_)
                | sortie_runner::Error::AlreadyFinished(..) => Code::Usage,
                sortie_runner::Error::Io { .. }
                | sortie_runner::Error::Survivor { .. }
                | sortie_runner::Error::Violation(_) => Code::Failed,
            };
        }
        // `batch::load` errors reach here unwrapped (not as `sortie_runner::Error::Batch`).
        if cause.downcast_ref::<UsageError>().is_some()
            || cause.downcast_ref::<sortie_batch::BatchError>().is_some()
            || cause
                .downcast_ref::<sortie_core::ids::InvalidRunId>()
                .is_some()
        {
            return Code::Usage;
        }
    }
    Code::Failed
}

fn journal_code(e: &sortie_journal::Error) -> Code {
    match e {
        sortie_journal::Error::Corrupt { .. } | sortie_journal::Error::Violation { .. } => {
            Code::Corrupt
        }
        sortie_journal::Error::NotFound { .. } | sortie_journal::Error::Locked { .. } => {
            Code::Usage
        }
        _ => Code::Failed,
    }
}

/// A mistake in how sortie was called.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// Parses a run id given on the command line.
fn run_id(s: &str) -> Result<RunId> {
    Ok(RunId::new(s)?)
}

/// Opens a run's journal for reading: works while another process runs it.
fn open_read(state_dir: &Path, run: &RunId) -> Result<Journal> {
    let dir = sortie_journal::run_dir(state_dir, run);
    if !dir.exists() {
        return Err(UsageError(format!(
            "no run {run} in {} (see `sortie list`)",
            state_dir.display()
        ))
        .into());
    }
    Journal::open_read_only(&dir).with_context(|| format!("cannot read run {run}"))
}

/// The newest run in the index, optionally only among unfinished ones.
fn newest(state_dir: &Path, unfinished_only: bool) -> Result<RunId> {
    let entries = sortie_journal::index::list(state_dir)
        .with_context(|| format!("cannot list runs in {}", state_dir.display()))?;
    entries
        .into_iter()
        .find(|e| !unfinished_only || !is_finished_status(&e.status))
        .map(|e| e.run_id)
        .ok_or_else(|| {
            UsageError(format!(
                "no {}run in {}",
                if unfinished_only { "unfinished " } else { "" },
                state_dir.display()
            ))
            .into()
        })
}

fn is_finished_status(status: &str) -> bool {
    matches!(
        status,
        "completed" | "partial" | "failed" | "timeout" | "cancelled"
    )
}

/// Runs a future of the runner (git through `process::run_tool`) to its end.
fn block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    Ok(rt.block_on(f))
}

/// Task `label`'s kept worktree in run `run`, from the run's journal.
fn find_kept(g: &crate::args::Global, run: &str, label: &str) -> Result<sortie_runner::kept::Kept> {
    let run = run_id(run)?;
    let state = replay_all(&open_read(&g.state_dir, &run)?)?;
    Ok(sortie_runner::kept::find(
        &state,
        &g.state_dir,
        &run,
        label,
    )?)
}

/// Replays a run fully, turning a corrupt journal into an error that names the record.
fn replay_all(journal: &Journal) -> Result<RunState> {
    Ok(journal.replay(None)?)
}
