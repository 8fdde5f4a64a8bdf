//! `sortie run --detach` (start a run in the background, print its id) and `sortie wait RUN`
//! (wait for a run to end, exit with its code).

use std::io::Write;
use std::time::{Duration, Instant};

use serde::Serialize;
use sortie_core::{RunId, RunOutcome, RunStatus};
use sortie_runner::layout::Owner;

use super::{Code, find_run, open_read, replay_all};
use crate::args::{Global, WaitArgs};
use crate::error::{CliError, Result, ResultExt};

/// The environment variable that gives a detached run its id (set by the `--detach` parent).
pub(crate) const DETACHED_RUN_ID: &str = "SORTIE_DETACHED_RUN_ID";

/// How long the parent of a detached run waits for it to own its run dir.
const DETACH_START: Duration = Duration::from_secs(30);

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
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    if let Some(i) = args[..end].iter().position(|a| a == "--detach") {
        args.remove(i);
    }
    let layout = g.layout();
    let log = layout.detached_log(run);
    let mut child =
        sortie_runner::process::spawn_detached_with(&args, &log, DETACHED_RUN_ID, run.as_str())
            .with_context(|| format!("cannot start run {run} in the background"))?;
    let dir = layout.run(run);
    let started = Instant::now();
    loop {
        if matches!(dir.owner(), Owner::Live { .. }) {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(10).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(CliError::usage(format_args!(
                "the detached run {run} stopped at once ({status}):\n{}",
                tail.join("\n")
            )));
        }
        if started.elapsed() > DETACH_START {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = std::io::stdout().lock();
    if g.json {
        let d = Detached {
            run_id: run.to_string(),
            pid: child.id(),
            log: log.display().to_string(),
        };
        serde_json::to_writer_pretty(&mut out, &d)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{run}")?;
        eprintln!(
            "sortie: run {run} goes on in the background (pid {}, output in {}); \
             sortie wait {run}",
            child.id(),
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
    let started = Instant::now();
    while matches!(dir.owner(), Owner::Live { .. }) {
        if args.timeout.is_some_and(|t| started.elapsed() >= t) {
            eprintln!("sortie: run {run} is still running");
            return Ok(Code::StillRunning);
        }
        std::thread::sleep(Duration::from_millis(100));
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
