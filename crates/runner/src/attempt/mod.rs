//! One attempt, in its own tokio task: spawn the agent, feed its stdout to the protocol reader,
//! watch the clocks (attempt timeout, deadline, stall), enforce the budgets, stop the process
//! group when told to (first stop reason wins), and report everything to the run loop as
//! [`Msg`]s. The attempt never touches the journal: the run loop turns its reports into events.
//!
//! An agent driven over stdin (pi's RPC mode, [`Drive`](crate::agent::Drive)) gets its prompt as
//! a command, and its stdin is closed once its run ended (it exits then). On a budget breach a
//! steerable agent is asked to wrap up and given `grace_turns` more turns; when it ends within
//! them the attempt is partial (budget) and "wrapped up", otherwise it is stopped. An agent that
//! cannot be steered is stopped at once. Either way the output so far is kept.
//!
//! The files: this one is the public face (what an attempt needs, what it reports, the run
//! loop's handle); `watch.rs` is the watchdog, a state machine pure over the clock (stalls,
//! timeouts and stop requests, tested on a paused clock; the budget and wrap-up rules are
//! core's `budget`); `run.rs` is the driver that spawns the child, carries the watchdog's
//! decisions out, and at the end gathers the facts for core's `decide::attempt_outcome`.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sortie_core::{Attempt, AttemptOutcome, TaskId, Timestamp, Usage};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::agent::LaunchPlan;
use crate::executor::{Adoption, Control, Executor, Placement, Sig};

mod repair;
mod run;
// #34: the kernel sandbox.
pub(crate) mod sandbox;
mod watch;

pub(crate) use watch::{Limits, StopRequest};

/// What an attempt needs to know.
#[derive(Debug, Clone)]
pub(crate) struct AttemptCtx {
    pub(crate) task: TaskId,
    pub(crate) attempt: Attempt,
    /// How it is launched: argv, protocol, drive, session, home (see `agent::launch_plan`).
    pub(crate) launch: LaunchPlan,
    pub(crate) cwd: PathBuf,
    pub(crate) env: Vec<(String, String)>,
    /// #34: why a reference of the task's `env` could not be read (the launch fails with it).
    pub(crate) env_error: Option<String>,
    /// #34: the values of the task's references, taken out of its output, its error, its
    /// result and its transcript files.
    pub(crate) redactor: Arc<sortie_batch::Redactor>,
    pub(crate) marker: (String, String),
    /// Its clocks and budgets.
    pub(crate) limits: Limits,
    /// How long a stopped child gets between SIGTERM and SIGKILL.
    pub(crate) kill_grace: Duration,
    /// Where the attempt's stderr tail is kept for post-mortems
    /// (`<run-dir>/logs/<task>.<attempt>.stderr`).
    pub(crate) stderr_log: PathBuf,
    /// The executor that runs it, and where (journaled before the launch).
    pub(crate) executor: Arc<dyn Executor>,
    /// See `executor`.
    pub(crate) placement: Placement,
    /// When it was journaled as launching: its clocks run from then.
    pub(crate) launched_at: Timestamp,
    /// Set when resume found the attempt alive or ended: it is followed, not launched.
    pub(crate) adopt: Option<Adoption>,
    /// A completed attempt with denied tool calls stays completed (the task's `allow_denials`).
    pub(crate) allow_denials: bool,
    /// For an adopted attempt: its journaled usage, and when it last wrote output.
    pub(crate) resumed: Option<(Usage, Timestamp)>,
    /// A plain command's transient failures (the task's `transient_on`).
    pub(crate) transient_on: Vec<String>,
    /// #10: for an adopted (or recorded) attempt, the offset in its stdout up to which the
    /// journal holds what it said (`AttemptRead`): the lines before it are read again only to
    /// rebuild the protocol reader, never reported again.
    pub(crate) read_until: u64,
    /// #14: for `isolation = "copy"`: the original directory (copied into `cwd` before the
    /// spawn, unless the copy is there), and the state dir, left out of the copy.
    pub(crate) copy_from: Option<(PathBuf, PathBuf)>,

    // Issue 13: structured results.
    /// The task's `output_schema` (compact JSON): the answer's result is checked against it.
    pub(crate) output_schema: Option<String>,
    /// `<run-dir>/prompts/<task>.<attempt>.repair`: the repair round's request, on stdin.
    pub(crate) repair_prompt: PathBuf,
    /// #34: the task's sandbox, when it is sandboxed.
    pub(crate) sandbox: Option<sandbox::SandboxPlan>,
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
    /// Its supervisor is gone without recording its end while sortie lives; its processes
    /// were stopped (see `run::Orphan`). Like `Finished`, its last report.
    Orphaned {
        task: TaskId,
        attempt: Attempt,
        action: sortie_core::OrphanAction,
    },
    /// What the agent is doing now changed (the tool it runs, `thinking`, ...): shown on the
    /// live board, never journaled.
    Activity {
        task: TaskId,
        attempt: Attempt,
        text: String,
    },
    /// The executor's own id of the attempt (a batch job id), once known.
    Handle {
        task: TaskId,
        attempt: Attempt,
        handle: String,
    },
    /// #10: how far its stdout was read when it sent its last `Progress` (a line's end).
    Read {
        task: TaskId,
        attempt: Attempt,
        offset: u64,
    },
    /// #13: the agent's own id of the conversation it is in (sent once).
    Session {
        task: TaskId,
        attempt: Attempt,
        session: String,
    },
    /// #37: it found no free machine-wide slot and waits for one (sent once, before `Started`).
    Waiting {
        task: TaskId,
        attempt: Attempt,
    },
    /// #33: the check of the task's ended attempt ended with this verdict (None: it was
    /// stopped by an interrupt of sortie, and resume runs it again). Its last report.
    Verified {
        task: TaskId,
        attempt: Attempt,
        verdict: Option<sortie_core::verify::Verdict>,
    },
}

impl Msg {
    pub(crate) fn task(&self) -> TaskId {
        match self {
            Msg::Started { task, .. }
            | Msg::Progress { task, .. }
            | Msg::Stalled { task, .. }
            | Msg::SideEffects { task, .. }
            | Msg::Finished { task, .. }
            | Msg::Orphaned { task, .. }
            | Msg::Activity { task, .. }
            | Msg::Handle { task, .. }
            | Msg::Read { task, .. }
            | Msg::Session { task, .. }
            | Msg::Waiting { task, .. }
            | Msg::Verified { task, .. } => *task,
        }
    }
}

/// What a user asks of a live attempt (`sortie hold`, `release`, `steer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ctl {
    /// Stop its processes (SIGSTOP through the executor's `signal`); its stall and attempt
    /// clocks stop too.
    Hold,
    /// Continue them (SIGCONT).
    Release,
    /// Pass a message to its agent (one that can be steered).
    Steer(String),
}

/// The run loop's handle on a live attempt.
pub(crate) struct AttemptHandle {
    stop: mpsc::UnboundedSender<StopRequest>,
    join: JoinHandle<()>,
    control: Arc<OnceLock<Arc<dyn Control>>>,
    ctl: mpsc::UnboundedSender<Ctl>,
    /// Whether its agent can be steered (`sortie steer`).
    pub(crate) steerable: bool,
}

impl AttemptHandle {
    /// Sends `sig` to the attempt's process group (SIGSTOP and SIGCONT hold and release it);
    /// false when it has not started or has ended.
    #[allow(
        dead_code,
        reason = "the seam's signal, for hold, release and cancel of one task"
    )]
    pub(crate) fn signal(&self, sig: Sig) -> bool {
        self.control
            .get()
            .is_some_and(|c| c.signal(sig).unwrap_or(false))
    }

    /// Passes a user's request on (hold, release, steer): the attempt's driver carries it out,
    /// so that its watchdog knows of a hold.
    pub(crate) fn control(&self, ctl: Ctl) {
        let _ = self.ctl.send(ctl);
    }

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
    let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
    let steerable = ctx
        .launch
        .drive
        .as_ref()
        .is_some_and(|d| d.steer_command.is_some());
    let control = Arc::new(OnceLock::new());
    let slot = Arc::clone(&control);
    let join = tokio::spawn(async move {
        let (task, attempt) = (ctx.task, ctx.attempt);
        let redactor = Arc::clone(&ctx.redactor);
        let files = ctx.placement.files();
        let stderr_log = ctx.stderr_log.clone();
        let ended = run::run(ctx, &tx, stop_rx, ctl_rx, &slot).await;
        // #34: the secrets it was given are out of its files and its report before the run
        // loop hears of its end (the journal never receives them).
        if !redactor.is_empty() {
            let paths = [files.stdout.as_path(), files.stderr.as_path(), &stderr_log];
            crate::transcript::mask_files(paths, &redactor);
        }
        match ended {
            Ok((mut outcome, usage, output)) => {
                redact_outcome(&redactor, &mut outcome);
                let output = redactor.redact(&output).into_owned();
                let _ = tx.send(Msg::Finished {
                    task,
                    attempt,
                    outcome,
                    usage,
                    output,
                });
            }
            // Its usage read to the end of its output, then its end as an orphan.
            Err(run::Orphan { action, usage }) => {
                let _ = tx.send(Msg::Progress {
                    task,
                    attempt,
                    usage,
                });
                let _ = tx.send(Msg::Orphaned {
                    task,
                    attempt,
                    action,
                });
            }
        }
    });
    AttemptHandle {
        stop: stop_tx,
        join,
        control,
        ctl: ctl_tx,
        steerable,
    }
}

/// #34: `outcome`'s texts (its error, its structured result) without the secrets of `redactor`.
fn redact_outcome(redactor: &sortie_batch::Redactor, outcome: &mut AttemptOutcome) {
    if redactor.is_empty() {
        return;
    }
    for text in [&mut outcome.error, &mut outcome.result]
        .into_iter()
        .flatten()
    {
        if let std::borrow::Cow::Owned(clean) = redactor.redact(text) {
            *text = clean;
        }
    }
}
