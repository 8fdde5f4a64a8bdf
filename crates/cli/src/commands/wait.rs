//! `sortie run --detach` (start a run in the background, print its id) and `sortie wait RUN`
//! (wait for a run to end, exit with its code).

use std::io::Write;

use serde::Serialize;
use sortie_core::{RunId, RunOutcome, RunStatus};
use sortie_runner::detach::{self, DetachError};

use super::{Code, find_run, open_read, replay_all};
use crate::args::{Global, WaitArgs};
use crate::error::{CliError, Result};

/// What `sortie run --detach --json` prints.
#[derive(Debug, Serialize)]
struct Detached {
    run_id: String,
    pid: u32,
    log: String,
}

/// Starts this same command line again without `--detach`, in the background, as run `run`;
/// returns once it owns its run dir (or says why it could not start).
pub(crate) fn detach(g: &Global, run: &RunId) -> Result<Code> {
    let args = detach::without_detach(std::env::args().skip(1).collect());
    let started = match detach::start(&g.layout(), run, &args) {
        Ok(started) => started,
        Err(DetachError::Stopped { status, tail }) => {
            return Err(CliError::usage(format_args!(
                "the detached run {run} stopped at once ({status}):\n{tail}"
            )));
        }
        Err(DetachError::Spawn(e)) => {
            return Err(
                CliError::from(e).context(format!("cannot start run {run} in the background"))
            );
        }
    };
    let (pid, log) = (started.pid, started.log);
    let mut out = std::io::stdout().lock();
    if g.json {
        let d = Detached {
            run_id: run.to_string(),
            pid,
            log: log.display().to_string(),
        };
        serde_json::to_writer_pretty(&mut out, &d)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{run}")?;
        eprintln!(
            "sortie: run {run} goes on in the background (pid {}, output in {}); \
             sortie wait {run}",
            pid,
            log.display()
        );
    }
    Ok(Code::Ok)
}

/// `sortie wait RUN [--timeout D]`.
pub(crate) fn wait(g: &Global, args: &WaitArgs) -> Result<Code> {
    let run = find_run(g, &args.run)?;
    let layout = g.layout();
    let dir = layout.run(&run);
    if !dir.exists() {
        return Err(CliError::usage(format_args!(
            "no run {run} in {} (see `sortie list`)",
            layout.root().display()
        )));
    }
    if !detach::wait_ownerless(&dir, args.timeout) {
        let message = format!("run {run} is still running");
        if g.json {
            crate::error::print_json(&message, Code::StillRunning);
        } else {
            eprintln!("sortie: {message}");
        }
        return Ok(Code::StillRunning);
    }
    let state = replay_all(&open_read(&layout, &run)?)?;
    crate::summary::print_summary(g, &run, &state)?;
    Ok(match state.status {
        RunStatus::Finished {
            state: RunOutcome::Completed,
        } => Code::Ok,
        RunStatus::Finished { .. } => Code::Failed,
        _ => Code::Interrupted,
    })
}
