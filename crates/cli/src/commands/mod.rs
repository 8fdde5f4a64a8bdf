//! One module per command; `dispatch` picks it. Errors carry their exit code (`crate::error`).

mod apply;
mod audit;
mod check;
mod control;
mod diff;
mod discard;
mod export;
mod gc;
mod list;
mod recover;
mod replay;
mod report;
mod run;
mod status;
mod wait;
// #10
mod logs;
// Issue 13: structured results.
mod results;
// #35: the dashboard.
mod serve;

use sortie_core::{RunId, RunState};
use sortie_runner::control::Request;
use sortie_runner::layout::open::{Closing, RunReader};
use sortie_runner::layout::{StateDir, index};

use crate::args::{Cli, Command};
pub(crate) use crate::error::Code;
use crate::error::{CliError, Result, ResultExt};

/// Runs the command.
pub(crate) fn dispatch(mut cli: Cli) -> Result<Code> {
    cli.global.rows = rows(&cli.command)?;
    let g = &cli.global;
    usable_state_dir(g, &cli.command)?;
    match cli.command {
        Command::Run(args) => run::run(g, args),
        Command::Resume(r) => run::resume(g, r.run.as_deref()),
        Command::Cancel(r) => match r.task {
            None => run::cancel(g, &r.run),
            Some(task) => control::send(g, &r.run, Request::Cancel { task: Some(task) }),
        },
        Command::Status(r) => match r.task {
            None => status::status(g, r.run.as_deref()),
            Some(label) => status::task(g, r.run.as_deref(), &label),
        },
        Command::List => list::list(g),
        Command::Replay(args) => replay::replay(g, args),
        Command::Audit(r) => audit::audit(g, &r.run),
        Command::Export(args) => export::export(g, &args.run),
        Command::Diff(t) => diff::diff(g, &t),
        Command::Apply(t) => apply::apply(g, &t),
        Command::Discard(t) => discard::discard(g, &t),
        Command::Gc(args) => gc::gc(g, &args),
        Command::Check(args) => check::check(g, &args),
        Command::Recover(r) => recover::recover(g, &r.run),
        Command::Hold(r) => control::send(g, &r.run, Request::Hold { task: r.task }),
        Command::Release(r) => control::send(g, &r.run, Request::Release { task: r.task }),
        Command::Steer(s) => control::send(
            g,
            &s.run,
            Request::Steer {
                task: s.task,
                message: s.message,
            },
        ),
        Command::Concurrency(c) => control::send(g, &c.run, Request::Concurrency { n: c.n }),
        Command::Wait(w) => wait::wait(g, &w),
        Command::Rerun(args) => run::rerun(g, &args),
        Command::Report(r) => report::report(g, &r),
        Command::Completions(c) => completions(&c.shell),
        Command::Logs(l) => logs::logs(g, &l),
        Command::Results(r) => results::results(g, &r),
        Command::Serve(s) => serve::serve(g, &s),
    }
}

/// #37: a state dir that cannot serve the command is the user's setup to fix (exit 2, naming
/// the path and the cause), not a failed run (exit 1): a file in its place, or, for a command
/// that writes it, one that cannot be created or written (a read-only filesystem, no
/// permission).
fn usable_state_dir(g: &crate::args::Global, command: &Command) -> Result<()> {
    if matches!(command, Command::Completions(_) | Command::Check(_)) {
        return Ok(());
    }
    let layout = g.layout();
    let root = layout.root();
    let unusable = |cause: String| {
        CliError::usage(format_args!(
            "the state dir {} cannot be used: {cause} (give another with --state-dir or \
             SORTIE_DIR)",
            root.display()
        ))
    };
    match std::fs::metadata(root) {
        Ok(m) if !m.is_dir() => return Err(unusable("it is not a directory".into())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(unusable(e.to_string())),
    }
    let writes = matches!(
        command,
        Command::Run(_)
            | Command::Resume(_)
            | Command::Rerun(_)
            | Command::Recover(_)
            | Command::Discard(_)
            | Command::Gc(_)
    );
    if writes {
        layout.ensure().map_err(|e| unusable(e.to_string()))?;
        // Created or there: whether it can be written (a read-only filesystem says so here).
        let probe = root.join(format!(".probe-{}", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .map_err(|e| unusable(format!("{}: {e}", probe.display())))?;
        let _ = std::fs::remove_file(&probe);
    }
    Ok(())
}

/// Which rows the command's tables list: its `--state` and `--all`.
fn rows(command: &Command) -> Result<sortie_core::view::RowFilter> {
    let (states, all) = match command {
        Command::Run(a) => (None, a.all),
        Command::Wait(w) => (None, w.all),
        Command::Status(s) => (s.state.as_deref(), s.all),
        Command::Results(r) => (r.state.as_deref(), true),
        _ => (None, false),
    };
    sortie_core::view::RowFilter::new(states, all).map_err(CliError::usage)
}

/// Parses a run id given on the command line (for a new run: `--run-id`).
fn run_id(s: &str) -> Result<RunId> {
    Ok(RunId::new(s)?)
}

/// The run a command line names: its whole id, or any prefix of exactly one run's id in the
/// state dir (an ambiguous prefix is a usage error naming the candidates; a prefix of none is
/// left as given, for the command to say there is no such run).
pub(crate) fn find_run(g: &crate::args::Global, s: &str) -> Result<RunId> {
    let layout = g.layout();
    if let Ok(id) = RunId::new(s)
        && layout.run(&id).exists()
    {
        return Ok(id);
    }
    let mut matches: Vec<RunId> = layout
        .run_ids()
        .into_iter()
        .filter(|id| id.as_str().starts_with(s))
        .collect();
    matches.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    match matches.len() {
        0 => run_id(s),
        1 => Ok(matches.remove(0)),
        n => {
            let names: Vec<&str> = matches.iter().take(5).map(RunId::as_str).collect();
            Err(CliError::usage(format_args!(
                "{s:?} is the start of {n} runs' ids: {}{}; give more of it",
                names.join(", "),
                if n > 5 { ", ..." } else { "" }
            )))
        }
    }
}

/// Opens a run for reading: works while another process runs it. Its journal is checked
/// against both high-water marks, and damage found is recorded in the index, so that `list`
/// says so (`sortie_runner::layout::open`).
fn open_read(state_dir: &StateDir, run: &RunId) -> Result<RunReader> {
    exists(state_dir, run)?;
    RunReader::open(state_dir, run).with_context(|| format!("cannot read run {run}"))
}

/// A usage error unless run `run` is in the state dir.
fn exists(state_dir: &StateDir, run: &RunId) -> Result<()> {
    if state_dir.run(run).exists() {
        Ok(())
    } else {
        Err(CliError::usage(format_args!(
            "no run {run} in {} (see `sortie list`)",
            state_dir.root().display()
        )))
    }
}

/// The newest run in the index, optionally only among unfinished ones.
fn newest(state_dir: &StateDir, unfinished_only: bool) -> Result<RunId> {
    let entries = index::list(state_dir)
        .with_context(|| format!("cannot list runs in {}", state_dir.root().display()))?;
    entries
        .into_iter()
        .find(|e| !unfinished_only || !e.status.is_finished())
        .map(|e| e.run_id)
        .ok_or_else(|| {
            CliError::usage(format_args!(
                "no {}run in {}",
                if unfinished_only { "unfinished " } else { "" },
                state_dir.root().display()
            ))
        })
}

/// Runs a future of the runner (git through `process::run_tool`) to its end.
fn block_on<F: std::future::Future>(f: F) -> Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .context("cannot start the async runtime")?;
    Ok(rt.block_on(f))
}

/// Task `label`'s kept worktree in run `run`, from the run's journal.
fn find_kept(
    g: &crate::args::Global,
    run: &str,
    label: &str,
) -> Result<sortie_runner::worktree::kept::Kept> {
    let run = find_run(g, run)?;
    let state = replay_all(&open_read(&g.layout(), &run)?)?;
    Ok(sortie_runner::worktree::kept::find(
        &state,
        &g.layout(),
        &run,
        label,
    )?)
}

/// A run's state after every record (from its newest valid snapshot and the tail), turning a
/// corrupt journal into an error that names the record.
fn replay_all(reader: &RunReader) -> Result<RunState> {
    Ok(reader.state()?)
}

/// [`replay_all`] of the run [`open_read`] opens, quicker for a big run: the newest snapshot's
/// decoding starts before the journal's private copy is made and opened, and the copy is
/// closed on a thread of its own while the caller goes on, until [`Closing`] is dropped
/// (see `RunReader::latest`).
fn read_latest(state_dir: &StateDir, run: &RunId) -> Result<(RunState, Closing)> {
    exists(state_dir, run)?;
    let reader = RunReader::open_prefetching(state_dir, run)
        .with_context(|| format!("cannot read run {run}"))?;
    Ok(reader.latest()?)
}

/// `sortie completions SHELL`: the completion script of `sortie` for bash, zsh or fish.
fn completions(shell: &str) -> Result<Code> {
    use clap::CommandFactory;
    use clap_complete::Shell;
    let shell = match shell {
        "bash" => Shell::Bash,
        "zsh" => Shell::Zsh,
        "fish" => Shell::Fish,
        other => {
            return Err(CliError::usage(format_args!(
                "no completions for {other:?}"
            )));
        }
    };
    let mut cmd = Cli::command();
    // Into memory first: clap_complete panics on a write error, and a closed stdout must end
    // the command quietly (see `error`).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "sortie", &mut script);
    std::io::Write::write_all(&mut std::io::stdout().lock(), &script)?;
    Ok(Code::Ok)
}
