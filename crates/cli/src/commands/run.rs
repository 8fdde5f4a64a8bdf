//! `sortie run`, `sortie resume` and `sortie cancel`: the commands that own a run.

use crate::error::{CliError, Result, ResultExt};
use sortie_batch as batch;
use sortie_core::{RunOutcome, RunStatus};
use sortie_runner::engine::{self, End, RunEnd, Takeover};
use sortie_runner::layout::Owner;

use super::{Code, newest, open_read, run_id};
use crate::args::{Global, RerunArgs, RunArgs};
use crate::output;

/// The runtime of a run's owner: one thread, which runs the loop and every attempt's tasks
/// (their followers, the shepherd's reader and writer). Their work is reading lines and passing
/// messages; on a thread of their own each hand-off between them woke another thread, and on a
/// loaded machine those wake-ups were the largest cost sortie added per attempt. What may block
/// for long (a direct attempt's fork and exec, a task's copied directory, an adopted attempt's
/// presence check) goes to tokio's blocking pool; the engine's journal writes are short.
/// Dispatch of 5,000 × `true` at 16, four rounds interleaved with `xargs -P 16`: with two
/// workers 0.751–0.804× xargs, with one 0.779–0.821×, on one thread 0.804–0.841×
/// (docs/performance.md, 2026-12-04).
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// `sortie run`.
pub(crate) fn run(g: &Global, args: RunArgs) -> Result<Code> {
    let overrides = args.overrides(g);
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
    let mut run_id = args.run_id.as_deref().map(run_id).transpose()?;
    if run_id.is_none()
        && let Ok(id) = std::env::var(sortie_runner::detach::DETACHED_RUN_ID)
    {
        run_id = Some(super::run_id(&id)?);
    }
    let runtime = runtime()?;
    // #37: a batch on Slurm without a controller that answers is refused before anything
    // starts (each attempt would otherwise fail only after its `sbatch` gave up).
    if let Some((_, message)) = runtime
        .block_on(sortie_runner::executor::unready(&loaded.batch.tasks))
        .into_iter()
        .next()
    {
        return Err(CliError::usage(format_args!(
            "the batch cannot start: {message}; nothing was run"
        )));
    }
    if args.detach {
        // The batch loaded above: a batch that does not load fails here, not in the
        // background.
        let id = run_id.unwrap_or_else(sortie_runner::clock::new_run_id);
        if g.layout().run(&id).exists() {
            return Err(CliError::usage(format_args!("run {id} exists already")));
        }
        return super::wait::detach(g, &id);
    }
    let front = output::front(g, run_id.as_ref());
    let state_dir = g.layout().absolute();
    let end = runtime.block_on(engine::run(&state_dir, run_id, loaded, front))?;
    Ok(report(g, &end))
}

/// `sortie resume [RUN]`.
pub(crate) fn resume(g: &Global, run: Option<&str>) -> Result<Code> {
    let run = match run {
        Some(r) => super::find_run(g, r)?,
        None => newest(&g.layout(), true)?,
    };
    let front = output::front(g, Some(&run));
    let end = runtime()?
        .block_on(engine::take_over(
            &g.layout().absolute(),
            run.clone(),
            Takeover::Resume,
            front,
        ))
        .map_err(|e| damage_context(e, &run))?;
    Ok(report(g, &end))
}

/// `sortie cancel RUN`: a live run is told to cancel (SIGUSR1 to its owner) and this command
/// waits until it has; a dead run is taken over and its unfinished tasks cancelled here.
pub(crate) fn cancel(g: &Global, run: &str) -> Result<Code> {
    let run = super::find_run(g, run)?;
    let dir = g.layout().run(&run);
    if let Owner::Live { pid } = dir.owner() {
        let pid = pid.ok_or_else(|| {
            CliError::usage(format_args!("run {run} is live but its pid is unknown"))
        })?;
        // Through the control socket, so that the cancel is journaled with who asked; a run
        // without one (started by an older sortie) gets SIGUSR1.
        let asked = sortie_runner::control::send(
            &dir.control_socket(),
            &sortie_runner::control::Request::Cancel { task: None },
        );
        match asked {
            Ok(reply) if !reply.ok => {
                return Err(CliError::usage(format_args!(
                    "run {run} refused: {}",
                    reply.message
                )));
            }
            Ok(_) => {}
            Err(_) => signal_cancel(pid)?,
        }
        eprintln!("sortie: asked run {run} (pid {pid}) to cancel; waiting for it to stop");
        sortie_runner::detach::wait_ownerless(&dir, None);
        let state = super::replay_all(&open_read(&g.layout(), &run)?)?;
        return Ok(match state.status {
            RunStatus::Finished { state: s } => {
                crate::summary::print_summary(g, &run, &state)?;
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
            output::front(g, Some(&run)),
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
    // The run's own code wins over a failure to print its summary (said on stderr even with
    // `--json`: the exit code is the run's, not this error's).
    if let Err(e) = crate::summary::print_summary(g, &end.run_id, &end.state) {
        e.print(false);
    }
    match end.end {
        End::Finished(s) => outcome_code(s),
        End::Interrupted => {
            eprintln!(
                "sortie: run {} interrupted; resume it with: sortie{} resume {}",
                end.run_id,
                crate::text::state_dir_flag(&g.state_dir),
                end.run_id
            );
            Code::Interrupted
        }
    }
}

/// `sortie rerun RUN`: the finished run's journaled batch (and saved environment) as a new
/// run, the selected tasks run again and the others carried. A task that did not complete
/// because a selected task did not (skipped, or cancelled behind it) is selected too.
pub(crate) fn rerun(g: &Global, args: &RerunArgs) -> Result<Code> {
    use sortie_core::rerun::{self, RerunError, Selection};
    let parent = super::find_run(g, &args.run)?;
    let state = super::replay_all(&open_read(&g.layout(), &parent)?)?;
    let selection = Selection {
        failed: args.failed,
        partial: args.partial,
        timeout: args.timeout,
        tasks: args.tasks.clone(),
    };
    let plan = rerun::select(&state, &selection).map_err(|e| {
        CliError::usage(match e {
            RerunError::NotFinished => {
                format!("run {parent} has not finished; `sortie resume {parent}` goes on with it")
            }
            RerunError::NoBatch => format!("run {parent} has no batch"),
            RerunError::NoSuchTask(label) => format!("run {parent} has no task {label:?}"),
            RerunError::NothingSelected => {
                format!("nothing to rerun in run {parent}: no task matches")
            }
        })
    })?;
    let (batch, carried) = (plan.batch, plan.carried);
    let env = g
        .layout()
        .run(&parent)
        .load_env(batch.tasks.len())
        .context("cannot read the parent run's environment")?;
    let loaded = sortie_batch::LoadedBatch {
        batch,
        env,
        digest: plan.digest,
    };
    let run_id = args.run_id.as_deref().map(run_id).transpose()?;
    let rerun = engine::Rerun { parent, carried };
    let front = output::front(g, run_id.as_ref());
    let state_dir = g.layout().absolute();
    let end = runtime()?.block_on(engine::rerun(&state_dir, run_id, loaded, rerun, front))?;
    Ok(report(g, &end))
}
