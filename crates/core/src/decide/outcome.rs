//! An attempt's outcome, composed from what each side saw of its end, in one order: what the
//! protocol reader made of the exit, the watchdog's stop (or a wrap-up's account), an end the
//! executor caused, the denied tool calls, the task's transient patterns, and the provider's
//! rate limit. Also which launch failure is retried and which is not, and how an attempt
//! whose end is lost (its supervisor gone without a record) ends ([`lost_attempt`]).
//!
//! The order decides retries, so it is written once, in [`attempt_outcome`]:
//! 1. the usage: the reader's last word raised to what the watchdog saw ([`final_usage`]);
//! 2. the watchdog: an agent that ended by itself after a wrap-up request is `budget`
//!    (partial with output) with the wrap-up's account; a stop whose signal reached the child
//!    is that stop ([`Finished::stopped_by`]), with the stop's message (and phase, when the
//!    signal sent was the stop decided);
//! 3. the executor: when sortie sent no stop, an end the executor caused (a scheduler's time
//!    limit, a lost node, out of memory) is the outcome, with the side effects and output read;
//! 4. denials: a completed attempt with denied tool calls is partial unless allowed;
//! 5. `transient_on`: a nonzero exit whose stderr or last output lines match a pattern is a
//!    transient `error`; without patterns, a plain command's failure that reads as a rate
//!    limit stays a failure whose error says `transient_on` exists;
//! 6. the rate limit: a transient `error` that is the provider's rate limit is marked (its pool
//!    backs off). Reading a rate limit in a text is the protocol crate's; the caller passes it;
//! 7. the state dir: an attempt that failed by itself while its stdout or stderr could not be
//!    written to the state dir (its disk full: the agent's own writes failed) is `interrupted`,
//!    as a stop of sortie is: the machine's fault, not the task's, so it spends no retry
//!    ([`crate::decide::interrupted`]). Whether the writes failed is the runner's observation.

use crate::budget::final_usage;
use crate::outcome::{AttemptOutcome, AttemptStatus, Phase, StopReason};
use crate::usage::Usage;

/// The end of an attempt as its protocol reader saw it (and, after [`attempt_outcome`], as it
/// is reported).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Status, stop reason, exit code or signal, error, side effects.
    pub outcome: AttemptOutcome,
    /// The attempt's final usage.
    pub usage: Usage,
    /// The attempt's text: the final message, else the error, else the last stderr lines,
    /// else "".
    pub output: String,
    /// True when `output` is the agent's own output (a final message or stdout text), not a
    /// fallback to the error or stderr.
    pub has_output: bool,
}

impl Finished {
    /// Reclassifies an attempt that sortie stopped itself (its signal was not unexpected).
    ///
    /// The stop reason becomes `reason` (a timeout gets phase `running`). A budget stop with
    /// useful output is `partial` ("budget breach: partial, output kept"); every other stop is
    /// `failed`, which core turns into the matching terminal state (timeout, cancelled, or a
    /// retry for stalled and interrupted). Apply it only when a stop signal was actually
    /// delivered: a process that ended on its own first keeps its own outcome.
    pub fn stopped_by(mut self, reason: StopReason) -> Finished {
        let o = &mut self.outcome;
        o.stop_reason = reason;
        o.status = if reason == StopReason::Budget && self.has_output {
            AttemptStatus::Partial
        } else {
            AttemptStatus::Failed
        };
        o.phase = (reason == StopReason::Timeout).then_some(Phase::Running);
        if o.status == AttemptStatus::Failed && o.exit_code == Some(0) {
            o.exit_code = Some(1);
        }
        let error = format!("stopped by sortie ({reason})");
        if !self.has_output {
            self.output = error.clone();
        }
        o.error = Some(error);
        self
    }
}

/// A request to stop an attempt (the watchdog's, or the run's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopRequest {
    /// Why.
    pub reason: StopReason,
    /// Where the task was, when it matters (a timeout while running).
    pub phase: Option<Phase>,
    /// For people.
    pub message: String,
}

/// What the watchdog knew at an attempt's end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchEnd {
    /// The usage it saw (what progress showed).
    pub seen: Usage,
    /// The account of a wrap-up the agent was asked for, if one was.
    pub wrapped_up: Option<String>,
    /// The stop it decided, if any.
    pub stop: Option<StopRequest>,
    /// The stop reason whose signal reached the running child, if any.
    pub sent: Option<StopReason>,
}

/// The task's own rules about its outcome.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutcomeRules<'a> {
    /// A completed attempt with denied tool calls stays completed.
    pub allow_denials: bool,
    /// Patterns that make a plain command's nonzero exit a transient failure.
    pub transient_on: &'a [String],
    /// The task is a plain command (not an agent): a failure that reads as a rate limit
    /// while `transient_on` is empty gets a hint that `transient_on` exists.
    pub plain: bool,
}

/// How many of the output's last lines (and bytes) the transient and rate-limit rules read,
/// with the stderr tail.
const TAIL_LINES: usize = 20;
/// See [`TAIL_LINES`].
const TAIL_BYTES: usize = 8192;

/// An attempt's outcome, usage and output (see the module doc for the order).
/// `mark_rate_limit` marks a transient failure whose error or `text` is a provider's rate
/// limit (the protocol crate's `mark_rate_limit`).
/// `output_lost`: why the attempt's output could not be written to the state dir, when the
/// runner saw that it could not (step 7).
pub fn attempt_outcome(
    reader: Finished,
    watch: &WatchEnd,
    executor_end: Option<AttemptOutcome>,
    stderr: &str,
    rules: OutcomeRules<'_>,
    mark_rate_limit: impl FnOnce(&mut AttemptOutcome, &str),
    output_lost: Option<&str>,
) -> Finished {
    let mut finished = watched(reader, watch);
    if watch.sent.is_none()
        && let Some(mut outcome) = executor_end
    {
        outcome.side_effects = finished.outcome.side_effects;
        if !finished.has_output {
            finished.output = outcome.error.clone().unwrap_or_default();
        }
        finished.outcome = outcome;
    }
    let mut outcome = finished.outcome.judge_denials(rules.allow_denials);
    let tail = last_lines(&finished.output, TAIL_LINES, TAIL_BYTES);
    let text = format!("{stderr}\n{tail}");
    if !rules.transient_on.is_empty() {
        outcome = outcome.transient_on(rules.transient_on, &text);
    } else if rules.plain {
        outcome = hint_transient_on(outcome, &text);
    }
    mark_rate_limit(&mut outcome, &text);
    finished.outcome = outcome;
    if let Some(why) = output_lost
        && watch.sent.is_none()
    {
        finished = lost_output(finished, why);
    }
    finished
}

/// Step 5 without patterns: a plain command's nonzero exit whose `text` reads as a rate limit
/// (`429` with `retry after`, `retry-after` or `too many requests`, any case) stays a failure,
/// not retried, but its error says that `transient_on` would retry it.
fn hint_transient_on(mut o: AttemptOutcome, text: &str) -> AttemptOutcome {
    if o.stop_reason != StopReason::NonzeroExit || o.status != AttemptStatus::Failed {
        return o;
    }
    let t = text.to_lowercase();
    let limited = t.contains("429")
        && ["retry after", "retry-after", "too many requests"]
            .iter()
            .any(|w| t.contains(w));
    if limited {
        let error = o.error.take().unwrap_or_else(|| "nonzero exit".to_owned());
        o.error = Some(format!(
            "{error} (its output reads as a rate limit: `transient_on = [\"429\"]` retries it)"
        ));
    }
    o
}

/// Step 7: a failure of an attempt whose output could not be written (`why`) is `interrupted`:
/// it spends no retry and keeps its model. A completed or partial attempt keeps its outcome.
fn lost_output(mut finished: Finished, why: &str) -> Finished {
    let o = &mut finished.outcome;
    if o.status != AttemptStatus::Failed || o.stop_reason == StopReason::Interrupted {
        return finished;
    }
    let error = format!(
        "{} while {why}: the state dir's fault, not the task's",
        o.error.as_deref().unwrap_or(o.stop_reason.as_str())
    );
    o.stop_reason = StopReason::Interrupted;
    o.phase = None;
    o.rate_limited = false;
    o.retry_after_ms = None;
    o.error = Some(error.clone());
    if !finished.has_output {
        finished.output = error;
    }
    finished
}

/// Steps 1 and 2: the final usage, and the watchdog's stop or wrap-up in the outcome.
fn watched(mut finished: Finished, watch: &WatchEnd) -> Finished {
    finished.usage = final_usage(finished.usage, &watch.seen);
    if let (Some(message), None) = (&watch.wrapped_up, watch.sent) {
        // It ended by itself after the wrap-up request: partial, output kept.
        finished = finished.stopped_by(StopReason::Budget);
        finished.outcome.error = Some(message.clone());
        if !finished.has_output {
            finished.output = message.clone();
        }
    } else if let (Some(reason), Some(req)) = (watch.sent, &watch.stop) {
        finished = finished.stopped_by(reason);
        finished.outcome.error = Some(req.message.clone());
        if reason == req.reason && req.phase.is_some() {
            finished.outcome.phase = req.phase;
        }
        if !finished.has_output {
            finished.output = req.message.clone();
        }
    }
    finished
}

/// Where an attempt's launch failed, before or at its spawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchFailure {
    /// An attempt found again after a crash could not be followed again.
    Adopt,
    /// The argv could not be rendered from the profile and the task.
    Argv,
    /// The task's directory could not be copied (`isolation = "copy"`).
    Copy,
    /// A file operation preparing the agent's home failed.
    HomeFiles,
    /// The user's agent configuration is broken.
    HomeConfig,
    /// The session directory could not be created.
    SessionDir,
    /// The prompt file could not be written.
    PromptFile,
    /// The executor could not start it, for this reason.
    Spawn(SpawnFault),
    /// #34: a secret of its `env` given by reference could not be read.
    Secret,
    /// #34: its sandbox cannot be made (the machine lacks Landlock or user namespaces, or its
    /// policy cannot be written): a sandboxed task does not start unconfined.
    Sandbox,
}

/// Why a program could not be started, as the runner observed it (the rule of which are
/// retried is [`SpawnFault::deterministic`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnFault {
    /// The command is empty.
    EmptyCommand,
    /// The program (or a script's interpreter) does not exist.
    NotFound,
    /// The program may not be executed.
    PermissionDenied,
    /// The file is not a program the system can run (ENOEXEC).
    NotExecutable,
    /// The working directory is missing or not a directory.
    BadCwd,
    /// An argument or an environment value holds a NUL byte.
    NulByte,
    /// The arguments and environment are over the system's limit (E2BIG).
    TooLong,
    /// Anything else (out of processes, memory, a scheduler that did not answer): it may pass
    /// next time.
    Other,
}

impl SpawnFault {
    /// Whether starting it again fails the same way: every fault but [`SpawnFault::Other`]
    /// comes from the task as specified (its command, its directory, its environment), which a
    /// retry does not change.
    pub fn deterministic(self) -> bool {
        self != SpawnFault::Other
    }
}

impl LaunchFailure {
    /// The stop reason of an attempt that failed there: `invalid` (never retried) when the task
    /// cannot run as specified, `setup_error` when its setup is broken, `spawn_error`
    /// (transient) when it may work next time, `error` for a lost adopted attempt.
    pub fn stop_reason(self) -> StopReason {
        match self {
            LaunchFailure::Adopt => StopReason::Error,
            LaunchFailure::Argv => StopReason::Invalid,
            LaunchFailure::Spawn(fault) if fault.deterministic() => StopReason::Invalid,
            LaunchFailure::Copy
            | LaunchFailure::HomeConfig
            | LaunchFailure::Secret
            | LaunchFailure::Sandbox => StopReason::SetupError,
            LaunchFailure::HomeFiles
            | LaunchFailure::SessionDir
            | LaunchFailure::PromptFile
            | LaunchFailure::Spawn(_) => StopReason::SpawnError,
        }
    }

    /// The outcome of an attempt whose launch failed here with `message`.
    pub fn outcome(self, message: impl Into<String>) -> AttemptOutcome {
        AttemptOutcome::failed(self.stop_reason(), message)
    }
}

/// What sortie could do about an attempt whose end it cannot learn: its supervisor is gone
/// without recording it, and its agent was not handed to sortie to wait for (the runner waits
/// for an agent it was handed, and the attempt ends with the agent's own exit: never lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostAgent {
    /// Nothing names the agent's process (no start time: the pid-reuse guard cannot pass).
    Unknown,
    /// Its process group was stopped (`Killed`), or was gone already (`Gone`).
    Stopped(crate::event::OrphanAction),
    /// Its process group survived SIGKILL (or may not be signalled): it may still run.
    Survived,
}

/// How a lost attempt ends (see [`lost_attempt`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// Orphaned, as by a crash of sortie (`AttemptOrphaned`: spends `max_orphans`, never
    /// `max_retries`), and retried at once: nothing of it runs any more.
    Orphaned(crate::event::OrphanAction),
    /// Ended with this outcome.
    Ended(AttemptOutcome),
}

/// The rule for an attempt whose end is lost (`message` says how): a supervisor's death is
/// never the task's fault, so an agent known stopped is an orphan; one that may still run is
/// partial, never retried beside it; one that nothing names is a transient `error` (its end
/// was not seen: no exit to judge it by).
pub fn lost_attempt(agent: LostAgent, message: &str) -> Lost {
    match agent {
        LostAgent::Stopped(action) => Lost::Orphaned(action),
        LostAgent::Survived => {
            let mut o = AttemptOutcome::failed(
                StopReason::Error,
                format!(
                    "{message}; its process group survived SIGKILL: not retried while it may still run"
                ),
            );
            o.status = AttemptStatus::Partial;
            Lost::Ended(o)
        }
        LostAgent::Unknown => Lost::Ended(AttemptOutcome::failed(
            StopReason::Error,
            format!("lost track of the agent process: {message}"),
        )),
    }
}

/// The last lines of a text, at most `max_lines` lines and `max_bytes` bytes (cut at a char
/// boundary), trimmed.
pub fn last_lines(text: &str, max_lines: usize, max_bytes: usize) -> String {
    let text = text.trim_end();
    let start = match max_lines.checked_sub(1) {
        Some(n) => text.rmatch_indices('\n').nth(n).map_or(0, |(i, _)| i + 1),
        None => text.len(),
    };
    let mut tail = &text[start..];
    if tail.len() > max_bytes {
        let mut cut = tail.len() - max_bytes;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = &tail[cut..];
    }
    tail.trim().to_owned()
}
