//! Structured results (issue 13): the answer of a task with an `output_schema` is checked
//! (`crate::structured`), and a mismatch gets ONE repair round in the same conversation:
//!
//! - an agent driven over stdin (pi's RPC mode) is still running when its run ends: instead of
//!   closing its stdin, the driver sends the repair request as a new prompt ([`SteerRepair`]),
//!   and closes it at the end of that run;
//! - any other agent whose launch plan has a [`Repair::Continue`] is run again once its first
//!   process exited, continuing its session (pi's `--session FILE`, Claude's `--continue`,
//!   `codex exec resume --last`), with the request on stdin; both runs are one attempt: the
//!   same clocks, budgets and stop requests, the usage of both (the second run's is added onto
//!   the first's), the second run's answer;
//! - plain commands, agents without a repair (a template that places `{prompt}`) and attempts
//!   of an executor that cannot repair locally (a Slurm job: its repair would have to be a job
//!   too) get none.
//!
//! Still wrong (or no repair possible) → core's `AttemptOutcome::judge_result` makes the
//! attempt `partial` with the validation error. A repair run that does not complete leaves the
//! first answer, `partial`, with both errors. A crash during the repair run is an orphaned or
//! recorded attempt like any other (its process carries the attempt's marker).

use std::path::Path;

use sortie_core::prompt::repair_request;
use sortie_core::{AttemptOutcome, AttemptStatus, Denial, Usage};
use sortie_protocol::{self as protocol, Exit, Finished, Progress, ProtocolReader, RunPhase};
use tokio::sync::mpsc;

use super::run::{Driver, Ended};
use super::watch::{Decision, Watch};
use super::{AttemptCtx, Ctl, Msg, StopRequest};
use crate::agent::{Repair, home};
use crate::clock::Anchor;
use crate::executor::{Direct, Executor, LaunchRequest};
use crate::process::SpawnSpec;
use crate::structured;

/// The repair round of an agent steered over stdin.
#[derive(Debug, Clone, Copy)]
pub(super) enum SteerRepair {
    /// None is due (no schema, not steerable, or the answer matched).
    Off,
    /// The answer is checked when the run ends: this makes the request's command line.
    Ready(fn(&str) -> String),
    /// The request was sent; `restarted` once the agent began the new run (until then its
    /// phase still says the old run ended, which must not close its stdin).
    Sent {
        /// The agent began the new run.
        restarted: bool,
    },
}

impl SteerRepair {
    /// The repair round an attempt's launch plan allows when steered.
    pub(super) fn of(ctx: &AttemptCtx) -> SteerRepair {
        match (&ctx.output_schema, &ctx.launch.repair) {
            (Some(_), Some(Repair::Steer(command))) => SteerRepair::Ready(*command),
            _ => SteerRepair::Off,
        }
    }

    /// Whether the answer is checked now: the run ended (`decisions` close the stdin) and
    /// the repair round is still to come.
    pub(super) fn checks(self, decisions: &[Decision]) -> bool {
        matches!(self, SteerRepair::Ready(_)) && decisions.contains(&Decision::CloseStdin)
    }

    /// Whether the request was sent (the attempt's answer is then the repaired one).
    pub(super) fn was_sent(self) -> bool {
        matches!(self, SteerRepair::Sent { .. })
    }
}

impl Driver<'_> {
    /// Replaces the closing of the stdin of an agent whose run ended with the repair request,
    /// when its answer does not match the schema (once).
    pub(super) async fn steer_repair(
        &mut self,
        mut decisions: Vec<Decision>,
        phase: RunPhase,
        answer: Option<String>,
    ) -> Vec<Decision> {
        let closes = decisions.contains(&Decision::CloseStdin);
        match self.steer_repair {
            SteerRepair::Off | SteerRepair::Sent { restarted: true } => {}
            SteerRepair::Sent { restarted: false } => {
                if !matches!(phase, RunPhase::Ended { .. }) {
                    self.steer_repair = SteerRepair::Sent { restarted: true };
                } else if closes {
                    decisions.retain(|d| *d != Decision::CloseStdin);
                    self.watch.reopen_stdin();
                }
            }
            SteerRepair::Ready(command) if closes => {
                let Some(schema) = self.ctx.output_schema.as_deref() else {
                    return decisions;
                };
                let answer = answer.unwrap_or_default();
                self.steer_repair = SteerRepair::Off;
                if let Err(why) = structured::check(schema, &answer)
                    && let Some(w) = self.stdin.as_mut()
                    && w.send_line(&command(&repair_request(&why, schema)))
                        .await
                        .is_ok()
                {
                    tracing::debug!(
                        "attempt {}: structured result repair: {why}",
                        self.ctx.attempt
                    );
                    decisions.retain(|d| *d != Decision::CloseStdin);
                    self.watch.reopen_stdin();
                    self.steer_repair = SteerRepair::Sent { restarted: false };
                }
            }
            SteerRepair::Ready(_) => {}
        }
        decisions
    }
}

/// Checks the structured result of an attempt that ended (`steered`: its repair request was
/// already sent over stdin), runs the repair round of an agent that is continued, and judges
/// the attempt.
pub(super) async fn structured(
    ctx: &AttemptCtx,
    ended: Ended,
    steered: bool,
    tx: &mpsc::UnboundedSender<Msg>,
    stop_rx: &mut mpsc::UnboundedReceiver<StopRequest>,
    ctl_rx: &mut mpsc::UnboundedReceiver<Ctl>,
) -> Ended {
    let Some(schema) = ctx.output_schema.as_deref() else {
        return ended;
    };
    let (outcome, usage, output) = ended;
    if outcome.status != AttemptStatus::Completed {
        return (outcome, usage, output);
    }
    let why = match structured::check(schema, &output) {
        Ok(value) => return (outcome.judge_result(Ok(value)), usage, output),
        Err(why) => why,
    };
    let continued = match &ctx.launch.repair {
        Some(Repair::Continue {
            argv,
            session_in,
            cumulative,
        }) if !steered && ctx.executor.can().repairs_locally => {
            Some((argv, session_in, *cumulative))
        }
        _ => None,
    };
    let Some((argv, session_in, cumulative)) = continued else {
        let why = if steered {
            format!("{why} (after the repair round)")
        } else {
            why
        };
        return (outcome.judge_result(Err(why)), usage, output);
    };
    let request = repair_request(&why, schema);
    let base = Offset::base(usage, cumulative);
    let second = match repair_run(
        ctx,
        argv,
        session_in.as_deref(),
        &request,
        base,
        tx,
        stop_rx,
        ctl_rx,
    )
    .await
    {
        Ok(ended) => ended,
        Err(e) => {
            let why = format!("{why}; the repair round could not start: {e}");
            return (outcome.judge_result(Err(why)), usage, output);
        }
    };
    let (mut again, usage, repaired) = second;
    again.side_effects |= outcome.side_effects;
    for d in &outcome.denials {
        for _ in 0..d.count {
            Denial::add(&mut again.denials, &d.tool);
        }
    }
    if again.status != AttemptStatus::Completed {
        // A stop (timeout, budget, cancel) during the repair round is the attempt's end.
        if again.status == AttemptStatus::Failed && is_stop(&again) {
            return (again, usage, repaired);
        }
        let error = again
            .error
            .clone()
            .unwrap_or_else(|| again.stop_reason.to_string());
        let why = format!(
            "{why}; the repair round ended {}: {error}",
            again.stop_reason
        );
        let mut first = outcome;
        first.side_effects = again.side_effects;
        first.denials = again.denials;
        return (first.judge_result(Err(why)), usage, output);
    }
    let checked = structured::check(schema, &repaired)
        .map_err(|e| format!("{e} (after the repair round; first: {why})"));
    (again.judge_result(checked), usage, repaired)
}

/// Whether an attempt ended because it was stopped (not by its own failure).
fn is_stop(o: &AttemptOutcome) -> bool {
    use sortie_core::StopReason as R;
    matches!(
        o.stop_reason,
        R::Timeout | R::Budget | R::Cancelled | R::Interrupted | R::Stalled
    )
}

/// Runs the agent again to repair its result, continuing its session: the same attempt (its
/// clocks, budgets, stop requests and marker), a direct child reading `request` on stdin.
#[allow(
    clippy::too_many_arguments,
    reason = "one attempt's context, split by ownership"
)]
async fn repair_run(
    ctx: &AttemptCtx,
    argv: &[String],
    session_in: Option<&Path>,
    request: &str,
    base: Base,
    tx: &mpsc::UnboundedSender<Msg>,
    stop_rx: &mut mpsc::UnboundedReceiver<StopRequest>,
    ctl_rx: &mut mpsc::UnboundedReceiver<Ctl>,
) -> Result<Ended, String> {
    let mut argv = argv.to_vec();
    if let Some(dir) = session_in {
        let Some(file) = newest_session(dir) else {
            return Err(format!("no session file in {}", dir.display()));
        };
        argv.push("--session".into());
        argv.push(file);
    }
    let file = &ctx.repair_prompt;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(file, request).map_err(|e| format!("{}: {e}", file.display()))?;
    let env = match &ctx.launch.home {
        None => ctx.env.clone(),
        Some(plan) => home::existing(plan.agent, &plan.dir)
            .map_or_else(|| ctx.env.clone(), |h| h.child_env(&ctx.env)),
    };
    let req = LaunchRequest {
        placement: ctx.placement.clone(),
        spawn: SpawnSpec {
            argv,
            cwd: ctx.cwd.clone(),
            env,
            marker: ctx.marker.clone(),
        },
        piped_stdin: false,
        stdin_file: Some(file.clone()),
    };
    let mut child = Direct.launch(req).await.map_err(|e| e.to_string())?;
    child.started().await.map_err(|e| e.to_string())?;
    let anchor = Anchor::now();
    let watch = Watch::new(
        ctx.limits.clone(),
        anchor.instant_of_past(ctx.launched_at),
        anchor,
        false,
        false,
    );
    let mut inner = protocol::reader_for(ctx.launch.protocol);
    // #13 sessions: a resumed session's readings count only this attempt's part.
    if let Some(session_base) = ctx.launch.usage_base {
        inner = protocol::rebased(inner, session_base);
    }
    // #37: priced like the attempt's first round.
    if let Some(price) = ctx.launch.price {
        inner = protocol::priced(inner, price);
    }
    let mut reader: Box<dyn ProtocolReader> = Box::new(Offset { inner, base });
    let mut driver = Driver {
        ctx,
        tx,
        stopper: child.control(),
        stdin: None,
        watch,
        stop_task: None,
        activity: None,
        offset: 0,
        read_sent: 0,
        replaying: None,
        session_sent: false,
        steer_repair: SteerRepair::Off,
    };
    let exit = driver
        .watch_child(child.as_mut(), reader.as_mut(), stop_rx, ctl_rx)
        .await;
    // A direct child: never an orphan (its supervisor is this process).
    driver
        .finish(child, reader, exit)
        .await
        .map_err(|_| "the repair round lost its process".to_owned())
}

/// The newest session file (`*.jsonl`) of a session directory, searched one level deep too.
fn newest_session(dir: &Path) -> Option<String> {
    let mut found = Vec::new();
    let mut dirs = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = dirs.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() && depth < 1 {
                dirs.push((path, depth + 1));
            } else if path.extension().is_some_and(|x| x == "jsonl")
                && let Ok(modified) = entry.metadata().and_then(|m| m.modified())
            {
                found.push((modified, path));
            }
        }
    }
    found
        .into_iter()
        .max()
        .map(|(_, p)| p.display().to_string())
}

/// The first run's usage, as the repair run's reader starts from it.
#[derive(Debug, Clone, Copy)]
struct Base {
    usage: Usage,
    /// The agent reports its session's running total (see `Repair::Continue`).
    cumulative: bool,
}

impl Base {
    /// The attempt's usage from a reading of the repair run: the first run's plus the repair
    /// run's own, or, for an agent reporting its session's running total, the larger of the
    /// two (field by field). Either way it never goes back and nothing is counted twice.
    fn with(self, reading: &Usage) -> Usage {
        if self.cumulative {
            self.usage.max(reading)
        } else {
            self.usage.plus(reading)
        }
    }
}

/// A reader whose usage starts from the attempt's first run (see [`Base`]).
struct Offset {
    inner: Box<dyn ProtocolReader>,
    base: Base,
}

impl Offset {
    fn base(usage: Usage, cumulative: bool) -> Base {
        Base { usage, cumulative }
    }
}

impl ProtocolReader for Offset {
    fn seed(&mut self, usage: Usage) {
        self.inner.seed(usage);
    }

    fn line(&mut self, line: &str) -> Option<Progress> {
        self.inner.line(line).map(|mut p| {
            p.usage = self.base.with(&p.usage);
            p
        })
    }

    fn finish(self: Box<Self>, exit: Exit, stderr_tail: &str) -> Finished {
        let base = self.base;
        let mut finished = self.inner.finish(exit, stderr_tail);
        finished.usage = base.with(&finished.usage);
        finished
    }

    fn parse_errors(&self) -> u64 {
        self.inner.parse_errors()
    }

    fn run_phase(&self) -> RunPhase {
        self.inner.run_phase()
    }

    fn answer(&self) -> Option<String> {
        self.inner.answer()
    }
}
