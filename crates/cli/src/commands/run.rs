//! `sortie run`, `sortie resume` and `sortie cancel`: the commands that own a run.

use std::path::Path;

use crate::error::{CliError, Result, ResultExt};
use sortie_batch::{self as batch, Overrides};
use sortie_core::{RunOutcome, RunStatus};
use sortie_runner::engine::{self, End, RunEnd, Takeover};
use sortie_runner::layout::Owner;

use super::{Code, newest, open_read, run_id};
use crate::args::{Global, RunArgs};
use crate::output;

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// `sortie run`.
pub(crate) fn run(g: &Global, args: RunArgs) -> Result<Code> {
    let overrides = Overrides {
        concurrency: args.concurrency,
        fail_fast: args.fail_fast.then_some(true),
        agent: args.agent.clone(),
        model: args.model.clone(),
        allow_shared_writes: args.allow_shared_writes.then_some(true),
        worktrees: Some(g.layout().absolute().worktrees()),
        executor: args
            .executor
            .as_deref()
            .and_then(sortie_core::ExecutorKind::parse),
    };
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let loaded = match (&args.batch, &args.prompt, args.command.is_empty()) {
        (Some(path), None, true) => batch::load(path, args.defaults.as_deref(), &overrides)?,
        (None, Some(prompt), true) => batch::one_off_prompt(
            prompt,
            args.agent.as_deref(),
            args.model.as_deref(),
            &cwd,
            &overrides,
        )?,
        (None, None, false) => batch::one_off_command(&args.command, &cwd, &overrides)?,
        _ => {
            return Err(CliError::usage(
                "give one of: a batch file, --prompt TEXT, or -- CMD ARGS...",
            ));
        }
    };
    let run_id = args.run_id.as_deref().map(run_id).transpose()?;
    let observer = output::observer(g.json || g.quiet, run_id.as_ref());
    let state_dir = g.layout().absolute();
    let end = runtime()?.block_on(engine::run(&state_dir, run_id, loaded, observer))?;
    Ok(report(g, &end))
}

/// `sortie resume [RUN]`.
pub(crate) fn resume(g: &Global, run: Option<&str>) -> Result<Code> {
    let run = match run {
        Some(r) => run_id(r)?,
        None => newest(&g.layout(), true)?,
    };
    let observer = output::observer(g.json || g.quiet, Some(&run));
    let end = runtime()?
        .block_on(engine::take_over(
            &g.layout().absolute(),
            run.clone(),
            Takeover::Resume,
            observer,
        ))
        .map_err(|e| damage_context(e, &run))?;
    Ok(report(g, &end))
}

/// `sortie cancel RUN`: a live run is told to cancel (SIGUSR1 to its owner) and this command
/// waits until it has; a dead run is taken over and its unfinished tasks cancelled here.
pub(crate) fn cancel(g: &Global, run: &str) -> Result<Code> {
    let run = run_id(run)?;
    let dir = g.layout().run(&run);
    if let Owner::Live { pid } = dir.owner() {
        let pid = pid.ok_or_else(|| {
            CliError::usage(format_args!("run {run} is live but its pid is unknown"))
        })?;
        signal_cancel(pid)?;
        eprintln!("sortie: asked run {run} (pid {pid}) to cancel; waiting for it to stop");
        while matches!(dir.owner(), Owner::Live { .. }) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let state = super::replay_all(&open_read(&g.layout(), &run)?)?;
        return Ok(match state.status {
            RunStatus::Finished { state: s } => {
                output::print_summary(g.json, &run, &state)?;
                outcome_code(s)
            }
            _ => Code::Interrupted,
        });
    }
    let end = runtime()?
        .block_on(engine::take_over(
            &g.layout().absolute(),
            run.clone(),
            Takeover::Cancel,
            output::observer(g.json || g.quiet, Some(&run)),
        ))
        .map_err(|e| damage_context(e, &run))?;
    Ok(report(g, &end))
}

/// A damaged journal is refused in the words `status` and `audit` use for it.
fn damage_context(e: sortie_runner::Error, run: &sortie_core::RunId) -> CliError {
    let damaged = matches!(&e, sortie_runner::Error::Journal(j) if j.is_damage());
    let e = CliError::from(e);
    if damaged {
        e.context(format!("cannot read run {run}"))
    } else {
        e
    }
}

fn signal_cancel(pid: u32) -> anyhow::Result<()> {
    use anyhow::Context;
    let pid = i32::try_from(pid).context("pid out of range")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .with_context(|| format!("cannot signal pid {pid}"))
}

fn outcome_code(s: RunOutcome) -> Code {
    match s {
        RunOutcome::Completed => Code::Ok,
        _ => Code::Failed,
    }
}

fn report(g: &Global, end: &RunEnd) -> Code {
    // The run's own code wins over a failure to print its summary.
    if let Err(e) = output::print_summary(g.json, &end.run_id, &end.state) {
        e.print();
    }
    match end.end {
        End::Finished(s) => outcome_code(s),
        End::Interrupted => {
            eprintln!(
                "sortie: run {} interrupted; resume it with: sortie{} resume {}",
                end.run_id,
                state_dir_flag(&g.state_dir),
                end.run_id
            );
            Code::Interrupted
        }
    }
}

pub(super) fn state_dir_flag(dir: &Path) -> String {
    if dir == Path::new(".sortie") || std::env::var_os("SORTIE_DIR").is_some() {
        String::new()
    } else {
        format!(" --state-dir {}", dir.display())
    }
}
