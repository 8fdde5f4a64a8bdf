//! One attempt, in its own tokio task: spawn the agent, feed its stdout to the protocol reader,
//! watch the clocks (attempt timeout, deadline, stall), enforce the budgets, stop the process
//! group when told to (first stop reason wins), and report everything to the run loop as
//! [`Msg`]s. The attempt never touches the journal: the run loop turns its reports into events.
//!
//! An agent driven over stdin (pi's RPC mode, [`Drive`]) gets its prompt as a command, and its
//! stdin is closed once its run ended (it exits then). On a budget breach a steerable agent is
//! asked to wrap up and given `grace_turns` more turns; when it ends within them the attempt is
//! partial (budget) and "wrapped up", otherwise it is stopped. An agent that cannot be steered
//! is stopped at once. Either way the output so far is kept.

use std::path::PathBuf;
use std::time::Duration;

use sortie_core::{Attempt, AttemptOutcome, Phase, Protocol, StopReason, TaskId, Timestamp, Usage};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::agent::{self, Drive, HomePlan, home};
use crate::process::{self, SpawnSpec};
use crate::protocol::{self, Exit, RunPhase};
use crate::statedir::now;

/// How often at most a progress report is sent while usage moves.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);
/// How long a driven agent whose last call failed may stay silent before its stdin is closed:
/// pi announces a retry of its own (`auto_retry_start`) right after such a run's end.
const RETRY_SETTLE: Duration = Duration::from_secs(2);

/// What an attempt needs to know.
#[derive(Debug, Clone)]
pub(crate) struct AttemptCtx {
    pub(crate) task: TaskId,
    pub(crate) attempt: Attempt,
    pub(crate) argv: Result<Vec<String>, process::RenderError>,
    pub(crate) cwd: PathBuf,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) marker: (String, String),
    pub(crate) protocol: Protocol,
    pub(crate) attempt_timeout: Duration,
    pub(crate) deadline_at: Option<Timestamp>,
    pub(crate) stall_after: Duration,
    pub(crate) stall_kill_after: Duration,
    pub(crate) kill_grace: Duration,
    pub(crate) max_turns: Option<u32>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_cost_nanos: Option<u64>,
    /// Turns granted to wrap up after a budget breach (steerable agents only).
    pub(crate) grace_turns: u32,
    /// Set for an agent driven over stdin.
    pub(crate) drive: Option<Drive>,
    /// The agent's session directory, created before the spawn (continuable profiles).
    pub(crate) session_dir: Option<PathBuf>,
    /// The usage of the task's earlier attempts (budgets cover the whole task).
    pub(crate) prior: Usage,
    /// Where the attempt's stderr tail is kept for post-mortems
    /// (`<run-dir>/logs/<task>.<attempt>.stderr`).
    pub(crate) stderr_log: PathBuf,
    /// The attempt's own agent config directory, prepared right before the spawn.
    pub(crate) home: Option<HomePlan>,
}

/// A report from an attempt to the run loop.
#[derive(Debug)]
pub(crate) enum Msg {
    Started {
        task: TaskId,
        attempt: Attempt,
        pid: u32,
        start_time: u64,
    },
    Progress {
        task: TaskId,
        attempt: Attempt,
        usage: Usage,
    },
    Stalled {
        task: TaskId,
        attempt: Attempt,
    },
    /// The agent ran a side-effecting tool (sent once).
    SideEffects {
        task: TaskId,
        attempt: Attempt,
    },
    Finished {
        task: TaskId,
        attempt: Attempt,
        outcome: AttemptOutcome,
        usage: Usage,
        output: String,
    },
}

impl Msg {
    pub(crate) fn task(&self) -> TaskId {
        match self {
            Msg::Started { task, .. }
            | Msg::Progress { task, .. }
            | Msg::Stalled { task, .. }
            | Msg::SideEffects { task, .. }
            | Msg::Finished { task, .. } => *task,
        }
    }

    pub(crate) fn attempt(&self) -> Attempt {
        match self {
            Msg::Started { attempt, .. }
            | Msg::Progress { attempt, .. }
            | Msg::Stalled { attempt, .. }
            | Msg::SideEffects { attempt, .. }
            | Msg::Finished { attempt, .. } => *attempt,
        }
    }
}

enum Step {
    Line(Option<process::Line>),
    Exit(Result<Exit, process::WaitError>),
}

/// A wrap-up request sent to a steerable agent after a budget breach.
struct WrapUp {
    /// Which budget, for people.
    why: String,
    /// The task's turns when it was sent.
    at_turns: u32,
}

/// A request to stop an attempt.
#[derive(Debug, Clone)]
pub(crate) struct StopRequest {
    pub(crate) reason: StopReason,
    pub(crate) phase: Option<Phase>,
    pub(crate) message: String,
}

/// The run loop's handle on a live attempt.
pub(crate) struct AttemptHandle {
    stop: mpsc::UnboundedSender<StopRequest>,
    join: JoinHandle<()>,
}

impl AttemptHandle {
    /// Asks the attempt to stop (SIGTERM, grace, SIGKILL); it then reports `Finished`.
    pub(crate) fn stop(&self, req: StopRequest) {
        let _ = self.stop.send(req);
    }

    /// Drops the attempt at once: its child's process group gets SIGKILL (the child handle
    /// kills its group when dropped) and nothing more is reported.
    pub(crate) fn kill_now(&self) {
        self.join.abort();
    }
}

/// Starts an attempt in its own task.
pub(crate) fn start(ctx: AttemptCtx, tx: mpsc::UnboundedSender<Msg>) -> AttemptHandle {
    let (stop_tx, stop_rx) = mpsc::unbounded_channel();
    let join = tokio::spawn(async move {
        let (task, attempt) = (ctx.task, ctx.attempt);
        let (outcome, usage, output) = run(ctx, &tx, stop_rx).await;
        let _ = tx.send(Msg::Finished {
            task,
            attempt,
            outcome,
            usage,
            output,
        });
    });
    AttemptHandle {
        stop: stop_tx,
        join,
    }
}

/// Keeps the last 50 KiB of an attempt's stderr beside the journal. Best effort: a log that
/// cannot be written costs the post-mortem a detail, never the run.
fn keep_stderr(path: &std::path::Path, stderr: &str) {
    if stderr.is_empty() {
        return;
    }
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, stderr));
    if let Err(e) = written {
        tracing::warn!("cannot keep stderr in {}: {e}", path.display());
    }
}

/// Prepares an agent home off the async threads (it copies files).
async fn prepare_home(plan: HomePlan) -> Result<home::AgentHome, agent::HomeError> {
    let dir = plan.dir.clone();
    tokio::task::spawn_blocking(move || home::prepare(plan.agent, &plan.dir, &plan.user))
        .await
        .unwrap_or_else(|e| {
            Err(agent::HomeError::Io {
                path: dir,
                source: std::io::Error::other(e.to_string()),
            })
        })
}

fn instant_of(t: Timestamp) -> Instant {
    Instant::now() + t.since(now())
}

/// An attempt's final usage: the counters never below what progress showed, but whether the
/// cost is known is the reader's last word (Claude Code's cost is unknown until its `result`
/// line, which then reports it).
pub(crate) fn final_usage(last_word: Usage, seen: &Usage) -> Usage {
    let mut u = last_word.max(seen);
    u.cost.unreported = last_word.cost.unreported;
    u
}

/// Which budget, if any, the task's usage has reached.
fn budget_breach(ctx: &AttemptCtx, usage: &Usage) -> Option<String> {
    let total = ctx.prior.plus(usage);
    if let Some(max) = ctx.max_turns
        && total.turns >= max
    {
        return Some(format!(
            "reached max turns budget ({} of {max})",
            total.turns
        ));
    }
    if let Some(max) = ctx.max_tokens
        && total.tokens() > max
    {
        return Some(format!(
            "exceeded max tokens budget ({} of {max})",
            total.tokens()
        ));
    }
    if let Some(max) = ctx.max_cost_nanos
        && total.cost.nanos > max
    {
        return Some(format!(
            "exceeded max cost budget (${:.4} of ${:.4})",
            total.cost.usd(),
            max as f64 / 1e9
        ));
    }
    None
}

async fn run(
    ctx: AttemptCtx,
    tx: &mpsc::UnboundedSender<Msg>,
    mut stop_rx: mpsc::UnboundedReceiver<StopRequest>,
) -> (AttemptOutcome, Usage, String) {
    let argv = match &ctx.argv {
        Ok(argv) => argv.clone(),
        Err(e) => {
            let o = AttemptOutcome::failed(StopReason::Invalid, e.to_string());
            return (o, Usage::ZERO, e.to_string());
        }
    };
    let env = match &ctx.home {
        None => ctx.env.clone(),
        Some(plan) => match prepare_home(plan.clone()).await {
            Ok(home) => home.child_env(&ctx.env),
            Err(e) => {
                let reason = match e {
                    // A file operation may work next time; a broken user config will not.
                    agent::HomeError::Io { .. } => StopReason::SpawnError,
                    agent::HomeError::Invalid { .. } => StopReason::SetupError,
                };
                let msg = e.to_string();
                return (
                    AttemptOutcome::failed(reason, msg.clone()),
                    Usage::ZERO,
                    msg,
                );
            }
        },
    };
    let spec = SpawnSpec {
        argv,
        cwd: ctx.cwd.clone(),
        env,
        marker: ctx.marker.clone(),
    };
    if let Some(dir) = &ctx.session_dir
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        let msg = format!("cannot create the session directory {}: {e}", dir.display());
        return (
            AttemptOutcome::failed(StopReason::SpawnError, msg.clone()),
            Usage::ZERO,
            msg,
        );
    }
    let spawned = if ctx.drive.is_some() {
        process::spawn_piped(&spec).await
    } else {
        process::spawn(&spec).await
    };
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let msg = e.to_string();
            return (
                AttemptOutcome::failed(StopReason::SpawnError, msg.clone()),
                Usage::ZERO,
                msg,
            );
        }
    };
    let (task, attempt) = (ctx.task, ctx.attempt);
    let _ = tx.send(Msg::Started {
        task,
        attempt,
        pid: child.pid,
        start_time: child.start_time,
    });

    let mut reader = protocol::reader_for(ctx.protocol);
    let mut stdin = child.take_stdin();
    if let (Some(drive), Some(w)) = (&ctx.drive, stdin.as_mut())
        && let Err(e) = w.send_line(&drive.prompt_command).await
    {
        // It exited at once; its exit and stderr say why.
        tracing::debug!("cannot send the prompt to attempt {}: {e}", ctx.attempt);
        stdin = None;
    }
    let mut settle_at: Option<Instant> = None;
    let mut wrap_up: Option<WrapUp> = None;
    let mut side_effects_sent = false;
    let stopper = child.stopper();
    let timeout_at = Instant::now() + ctx.attempt_timeout;
    let deadline_at = ctx.deadline_at.map(instant_of);
    let mut last_output = Instant::now();
    let mut stalled = false;
    let mut usage = Usage::ZERO;
    let mut sent_usage = Usage::ZERO;
    let mut last_sent = Instant::now();
    let mut stop: Option<StopRequest> = None;
    let mut stop_task: Option<JoinHandle<StopReason>> = None;
    let mut stdout_open = true;

    let request_stop = |req: StopRequest,
                        stop: &mut Option<StopRequest>,
                        stop_task: &mut Option<JoinHandle<StopReason>>| {
        if stop.is_some() {
            return;
        }
        let s = stopper.clone();
        let grace = ctx.kill_grace;
        let reason = req.reason;
        *stop = Some(req);
        *stop_task = Some(tokio::spawn(async move { s.stop(reason, grace).await }));
    };

    let exit = loop {
        let stall_at = if stalled {
            last_output + ctx.stall_after + ctx.stall_kill_after
        } else {
            last_output + ctx.stall_after
        };
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        tokio::select! {
            step = async {
                if stdout_open {
                    Step::Line(child.next_line().await)
                } else {
                    Step::Exit(child.wait().await)
                }
            } => match step {
                Step::Exit(exit) => break exit,
                Step::Line(Some(line)) => {
                    last_output = Instant::now();
                    let mut report = false;
                    if stalled {
                        stalled = false;
                        report = true;
                    }
                    if let Some(p) = reader.line(&line.text) {
                        usage = usage.max(&p.usage);
                        if p.side_effects && !side_effects_sent {
                            side_effects_sent = true;
                            let _ = tx.send(Msg::SideEffects { task, attempt });
                        }
                        let phase = reader.run_phase();
                        if stop.is_none() && wrap_up.is_none()
                            && let Some(why) = budget_breach(&ctx, &usage)
                        {
                            let steer = ctx.drive.as_ref().and_then(|d| d.wrap_up_command.as_ref());
                            match (steer, stdin.as_mut()) {
                                (Some(cmd), Some(w)) if ctx.grace_turns > 0 => {
                                    if w.send_line(cmd).await.is_ok() {
                                        let at_turns = ctx.prior.plus(&usage).turns;
                                        wrap_up = Some(WrapUp { why, at_turns });
                                    } else {
                                        let message = format!("{why}; stopped (the wrap-up request could not be sent)");
                                        let req = StopRequest { reason: StopReason::Budget, phase: None, message };
                                        request_stop(req, &mut stop, &mut stop_task);
                                    }
                                }
                                (Some(_), Some(_)) => {
                                    let message = format!("{why}; stopped at once (grace_turns = 0), not wrapped up");
                                    let req = StopRequest { reason: StopReason::Budget, phase: None, message };
                                    request_stop(req, &mut stop, &mut stop_task);
                                }
                                _ => {
                                    let message = format!("{why}; stopped at once (the agent cannot be steered), not wrapped up");
                                    let req = StopRequest { reason: StopReason::Budget, phase: None, message };
                                    request_stop(req, &mut stop, &mut stop_task);
                                }
                            }
                        } else if stop.is_none()
                            && let Some(w) = &wrap_up
                            && ctx.prior.plus(&usage).turns >= w.at_turns.saturating_add(ctx.grace_turns)
                            && phase == RunPhase::Working
                        {
                            let message = format!(
                                "{}; asked to wrap up, but still working after {} grace turn(s): \
                                 stopped, not wrapped up",
                                w.why, ctx.grace_turns
                            );
                            let req = StopRequest { reason: StopReason::Budget, phase: None, message };
                            request_stop(req, &mut stop, &mut stop_task);
                        }
                    }
                    if stdin.is_some() {
                        match reader.run_phase() {
                            // Its run ended: closing stdin lets it exit.
                            RunPhase::Ended { failed: false } => stdin = None,
                            RunPhase::Ended { failed: true } => {
                                settle_at.get_or_insert_with(|| Instant::now() + RETRY_SETTLE);
                            }
                            _ => settle_at = None,
                        }
                    }
                    if usage != sent_usage && last_sent.elapsed() >= PROGRESS_EVERY {
                        report = true;
                    }
                    if report {
                        let _ = tx.send(Msg::Progress { task, attempt, usage });
                        sent_usage = usage;
                        last_sent = Instant::now();
                    }
                }
                Step::Line(None) => stdout_open = false,
            },
            // Rate-limited, not dropped: usage held back by the limit is sent once it allows,
            // so the journal's checkpoint catches up even when the agent then goes silent.
            _ = tokio::time::sleep_until(last_sent + PROGRESS_EVERY), if usage != sent_usage => {
                let _ = tx.send(Msg::Progress { task, attempt, usage });
                sent_usage = usage;
                last_sent = Instant::now();
            }
            _ = tokio::time::sleep_until(settle_at.unwrap_or(far)), if settle_at.is_some() => {
                // The failed run was not retried by the agent itself: let it exit.
                settle_at = None;
                stdin = None;
            }
            _ = tokio::time::sleep_until(stall_at), if stop.is_none() => {
                if stalled {
                    let message = format!(
                        "no output for {}",
                        humantime::format_duration(ctx.stall_after + ctx.stall_kill_after)
                    );
                    let req = StopRequest { reason: StopReason::Stalled, phase: None, message };
                    request_stop(req, &mut stop, &mut stop_task);
                } else {
                    stalled = true;
                    let _ = tx.send(Msg::Stalled { task, attempt });
                }
            }
            _ = tokio::time::sleep_until(timeout_at), if stop.is_none() => {
                let message = format!(
                    "attempt timed out after {}",
                    humantime::format_duration(ctx.attempt_timeout)
                );
                let req = StopRequest { reason: StopReason::Timeout, phase: Some(Phase::Running), message };
                request_stop(req, &mut stop, &mut stop_task);
            }
            _ = tokio::time::sleep_until(deadline_at.unwrap_or(far)), if stop.is_none() && deadline_at.is_some() => {
                let req = StopRequest {
                    reason: StopReason::Timeout,
                    phase: Some(Phase::Running),
                    message: "deadline exceeded while running".into(),
                };
                request_stop(req, &mut stop, &mut stop_task);
            }
            req = stop_rx.recv(), if stop.is_none() => {
                if let Some(req) = req {
                    request_stop(req, &mut stop, &mut stop_task);
                }
            }
        }
    };
    if let Some(t) = stop_task {
        let _ = t.await;
    }
    let exit = match exit {
        Ok(e) => e,
        Err(e) => {
            let msg = format!("lost track of the agent process: {}", e.message);
            return (
                AttemptOutcome::failed(StopReason::Error, msg.clone()),
                usage,
                msg,
            );
        }
    };
    let stderr = child.stderr_tail();
    keep_stderr(&ctx.stderr_log, &stderr);
    drop(stdin);
    let mut finished = reader.finish(exit, &stderr);
    finished.usage = final_usage(finished.usage, &usage);
    if let (Some(w), None) = (&wrap_up, stopper.sent_reason()) {
        // It ended by itself after the wrap-up request: partial, output kept.
        finished = finished.stopped_by(StopReason::Budget);
        let message = format!(
            "{}; asked to wrap up, and it wrapped up within {} grace turn(s)",
            w.why, ctx.grace_turns
        );
        finished.outcome.error = Some(message.clone());
        if !finished.has_output {
            finished.output = message;
        }
    } else if let (Some(reason), Some(req)) = (stopper.sent_reason(), &stop) {
        finished = finished.stopped_by(reason);
        finished.outcome.error = Some(req.message.clone());
        if reason == req.reason && req.phase.is_some() {
            finished.outcome.phase = req.phase;
        }
        if !finished.has_output {
            finished.output = req.message.clone();
        }
    }
    if let Exit::Signal(_) = exit {
        tracing::debug!("attempt {attempt} of task {task} ended by a signal");
    }
    (finished.outcome, finished.usage, finished.output)
}
