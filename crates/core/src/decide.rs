//! The decisions, as pure functions of the spec, the journaled history and the time given.
//!
//! Retry rules: transient failures are retried; `model_error` moves to the next
//! fallback and is never retried on the model that raised it; attempt k uses fallback k-1 and
//! the primary once the fallbacks are used up; a same-model retry backs off exponentially with
//! jitter, a model switch starts at once; no wait reaches past the deadline.

use std::time::Duration;

use crate::ids::{Attempt, TaskId, Timestamp};
use crate::outcome::{AttemptOutcome, AttemptStatus, Phase, StopReason, TaskResult, TerminalState};
use crate::spec::{Isolation, TaskSpec};
use crate::state::{AttemptRecord, RunState, TaskRecord, TaskState};

mod outcome;
mod stderr;
pub use outcome::{
    Finished, LaunchFailure, Lost, LostAgent, OutcomeRules, SpawnFault, StopRequest, WatchEnd,
    attempt_outcome, last_lines, lost_attempt,
};
pub use stderr::{error_line, is_error_line};

/// The base of the retry backoff.
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The cap of the retry backoff.
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);

/// Whether an attempt's failure may pass if tried again.
///
/// Transient: a timeout while queued, `stalled`, `spawn_error`, `interrupted`, and a failure
/// with `error`, `protocol_error` or `unexpected_signal`. (In sortie a queued timeout can only
/// come from the task's deadline, which `next_step` never retries past.)
pub fn is_transient(outcome: &AttemptOutcome) -> bool {
    match outcome.stop_reason {
        StopReason::Timeout => outcome.phase == Some(Phase::Queued),
        StopReason::Stalled | StopReason::SpawnError | StopReason::Interrupted => true,
        StopReason::Error | StopReason::ProtocolError | StopReason::UnexpectedSignal => {
            outcome.status == AttemptStatus::Failed
        }
        // model_error is not retried on the same model; next_step moves it to a fallback.
        StopReason::ModelError => false,
        StopReason::Completed
        | StopReason::NonzeroExit
        | StopReason::Budget
        | StopReason::Cancelled
        | StopReason::SetupError
        | StopReason::Invalid
        | StopReason::Verify => false,
    }
}

/// The model that attempt `k` uses: attempt 1 the primary, attempt k the fallback k-1, the
/// primary again once the fallbacks are used up.
pub fn model_for_attempt(spec: &TaskSpec, attempt: Attempt) -> Option<String> {
    let k = attempt.0 as usize;
    if k >= 2
        && let Some(m) = spec.fallback_models.get(k - 2)
    {
        return Some(m.clone());
    }
    spec.model.clone()
}

/// The wait before the `n`-th same-model retry (n from 0): base × 2^n capped, then jittered
/// into `[d/2, d]` by `jitter` (any u64, e.g. a hash of run, task and attempt).
pub fn backoff_delay(n: u32, jitter: u64) -> Duration {
    let base = BACKOFF_BASE.as_millis() as u64;
    let cap = BACKOFF_CAP.as_millis() as u64;
    let d = base
        .saturating_mul(1u64.checked_shl(n.min(32)).unwrap_or(u64::MAX))
        .min(cap);
    let half = d / 2;
    Duration::from_millis(half + jitter % (d - half + 1))
}

/// What happens after an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    /// Try again.
    Retry {
        /// The next attempt's number.
        attempt: Attempt,
        /// Its model.
        model: Option<String>,
        /// The wait before it.
        delay: Duration,
        /// Why, for people.
        reason: String,
    },
    /// Stop: the task ends with this result.
    GiveUp(TaskResult),
    /// #33: the attempt completed and the task's check has not run: run it
    /// (`VerifyStarted`).
    Verify,
    /// #33: the check of the attempt runs: wait for its verdict.
    Checking,
    /// #33: the check failed and a feedback round is left: the next attempt continues the
    /// conversation with the check's failure (`RetryScheduled`, no delay). When it cannot
    /// start (a stop, the budget, fail_fast), the task ends with `failed`.
    Feedback {
        /// The next attempt's number.
        attempt: Attempt,
        /// Its model: the checked attempt's (its conversation goes on).
        model: Option<String>,
        /// Why, for people.
        reason: String,
        /// The task's result when no round runs.
        failed: TaskResult,
    },
}

/// A running attempt's timeout is final unless the task says `retry_timeouts`.
fn retried_timeout(spec: &TaskSpec, outcome: &AttemptOutcome) -> bool {
    spec.retry_timeouts
        && outcome.stop_reason == StopReason::Timeout
        && outcome.phase != Some(Phase::Queued)
}

/// Decides the next step for a task whose last attempt ended (state `Ended`), at time `now`.
pub fn next_step(spec: &TaskSpec, rec: &TaskRecord, now: Timestamp, jitter: u64) -> NextStep {
    let Some(last) = rec.attempts.last() else {
        return NextStep::GiveUp(result_without_attempt(
            TerminalState::Failed,
            StopReason::Invalid,
            None,
            "no attempt was recorded",
        ));
    };
    let outcome = last.outcome().unwrap_or_else(|| {
        AttemptOutcome::failed(StopReason::Interrupted, "the attempt did not report an end")
    });
    let output = last.output().unwrap_or_default();
    let give_up = |o: &AttemptOutcome| NextStep::GiveUp(finish_result(rec, o, output));
    // #33: a completed attempt of a task with a check is done only once the check passed.
    if let Some(step) = crate::verify::next_step(spec, rec, now) {
        return step;
    }

    if outcome.status != AttemptStatus::Failed {
        return give_up(&outcome);
    }
    let model_error = outcome.stop_reason == StopReason::ModelError;
    if !model_error && !retried_timeout(spec, &outcome) && !is_transient(&outcome) {
        return give_up(&outcome);
    }
    // An interrupt of sortie is the user's, never the task's: its conversation goes on, side
    // effects or not, and it spends no retry.
    let last_interrupted = interrupted(spec, last);
    if outcome.side_effects
        && !last_interrupted
        && spec.isolation != Isolation::Worktree
        && !spec.retry_after_side_effects
    {
        let mut o = outcome.clone();
        o.error = Some(format!(
            "{}; not retried: the agent ran side-effecting tools outside a worktree",
            o.error.as_deref().unwrap_or(o.stop_reason.as_str())
        ));
        return give_up(&o);
    }
    // A crash of sortie is not the task's fault: an orphan spends `max_orphans`, never a retry.
    let orphans = rec.attempts.iter().filter(|a| a.orphaned()).count() as u32;
    if last.orphaned() && orphans > spec.max_orphans {
        let mut o = outcome.clone();
        o.error = Some(format!(
            "{}; not retried: sortie stopped {orphans} times while this task ran (max_orphans = {})",
            o.error.as_deref().unwrap_or(o.stop_reason.as_str()),
            spec.max_orphans
        ));
        return give_up(&o);
    }
    // A rate limit is the provider's, not the task's: it spends `max_rate_limits`.
    let limited = rate_limited_attempts(spec, rec);
    let last_limited = spec.max_rate_limits > 0 && outcome.rate_limited && !last.orphaned();
    if last_limited && limited > spec.max_rate_limits {
        let mut o = outcome.clone();
        o.error = Some(format!(
            "{}; not retried: rate limited {limited} times (max_rate_limits = {})",
            o.error.as_deref().unwrap_or(o.stop_reason.as_str()),
            spec.max_rate_limits
        ));
        return give_up(&o);
    }
    let used = spent_attempts(spec, rec, orphans, limited);
    if !last.orphaned() && !last_limited && !last_interrupted && used >= spec.max_attempts() {
        return give_up(&outcome);
    }
    let next = Attempt(rec.attempts.len() as u32 + 1);
    // Models that raised a model_error are never tried again.
    let banned: Vec<Option<&str>> = rec
        .attempts
        .iter()
        .filter(|a| {
            a.outcome()
                .is_some_and(|o| o.stop_reason == StopReason::ModelError)
        })
        .map(AttemptRecord::model)
        .collect();
    // An orphan's retry stays on its model; otherwise the fallbacks go by the attempts that
    // were not orphaned.
    let first = if last.orphaned() || last_limited || last_interrupted {
        last.model().map(str::to_owned)
    } else {
        model_for_attempt(spec, Attempt(used + 1))
    };
    let candidates = std::iter::once(first)
        .chain(spec.fallback_models.iter().cloned().map(Some))
        .chain(std::iter::once(spec.model.clone()));
    let Some(model) = candidates
        .into_iter()
        .find(|m| !banned.contains(&m.as_deref()))
    else {
        return give_up(&outcome);
    };
    // A crash or an interrupt of sortie says nothing about the provider: retry at once.
    let delay = if outcome.stop_reason == StopReason::Interrupted {
        Duration::ZERO
    } else if last_limited {
        // The provider's retry-after, else the backoff of the rate limits in a row.
        let streak = rec
            .attempts
            .iter()
            .rev()
            .take_while(|a| a.outcome().is_some_and(|o| o.rate_limited))
            .count() as u32;
        outcome.retry_after_ms.map_or_else(
            || backoff_delay(streak.saturating_sub(1), jitter),
            Duration::from_millis,
        )
    } else if model.as_deref() == last.model() {
        let same = rec
            .attempts
            .iter()
            .filter(|a| a.model() == model.as_deref())
            .count() as u32;
        backoff_delay(same.saturating_sub(1), jitter)
    } else {
        Duration::ZERO
    };
    if let Some(deadline_at) = rec.deadline_at(spec)
        && now.plus(delay) >= deadline_at
    {
        return NextStep::GiveUp(deadline_result(rec, Phase::Starting, output));
    }
    let reason = format!(
        "attempt {} {}{}{}; retrying on {}",
        last.attempt,
        if last_limited { "rate limited, " } else { "" },
        outcome.stop_reason,
        outcome
            .error
            .as_deref()
            .map(|e| format!(": {}", first_line(e)))
            .unwrap_or_default(),
        model.as_deref().unwrap_or("the default model")
    );
    let reason = if last_limited {
        limited_reason(&reason, delay, limited, spec.max_rate_limits)
    } else {
        reason
    };
    NextStep::Retry {
        attempt: next,
        model,
        delay,
        reason,
    }
}

/// A rate-limited attempt's retry reason: `reason`, the wait, and the rate limits so far.
fn limited_reason(reason: &str, delay: Duration, limited: u32, max: u32) -> String {
    format!(
        "{reason} after {} (rate limit {limited} of max_rate_limits {max}; no retry spent)",
        crate::bounds::ranges::format(delay)
    )
}

/// How many of a task's attempts spent its retries: not orphaned (`orphans`), not rate
/// limited within `max_rate_limits` (`limited`), not ended by an interrupt, and (#33) not a
/// feedback round.
fn spent_attempts(spec: &TaskSpec, rec: &TaskRecord, orphans: u32, limited: u32) -> u32 {
    let interrupts = interrupted_attempts(spec, rec);
    let rounds = crate::verify::failed_checks(rec).min(spec.verify_rounds);
    (rec.attempts.len() as u32)
        .saturating_sub(orphans + limited + interrupts)
        .saturating_sub(rounds)
}

/// How many of a task's attempts ended rate limited and count against `max_rate_limits`
/// (none when it is 0: then a rate limit spends a retry).
pub fn rate_limited_attempts(spec: &TaskSpec, rec: &TaskRecord) -> u32 {
    if spec.max_rate_limits == 0 {
        return 0;
    }
    rec.attempts
        .iter()
        .filter(|a| {
            matches!(&a.end, Some(crate::state::AttemptEnd::Finished { outcome, .. })
                if outcome.rate_limited)
        })
        .count() as u32
}

/// Whether `attempt` ended because sortie was interrupted (SIGINT, SIGTERM or SIGHUP), or
/// failed while its output could not be written to the state dir (a full disk, step 7 of
/// [`attempt_outcome`]): the user's or the machine's doing, never the task's, so it spends no
/// retry (an orphan spends `max_orphans`, a rate limit `max_rate_limits`; neither counts here).
pub fn interrupted(spec: &TaskSpec, attempt: &AttemptRecord) -> bool {
    !attempt.orphaned()
        && attempt.outcome().is_some_and(|o| {
            o.stop_reason == StopReason::Interrupted
                && !(spec.max_rate_limits > 0 && o.rate_limited)
        })
}

/// Whether an attempt that ended with `outcome` while the run was `stopping` stops the run as
/// an interrupt does (resumable, exit 3): an attempt `interrupted` that sortie did not stop
/// failed because its output could not be written (the disk full), and `still_full` says the
/// disk of the run's files is full now (the runner's observation; an attempt that a resume
/// records from its files may have failed on a disk freed since). Retrying it at once would
/// fail again on the same disk, spending the agent's tokens each time; nothing more starts
/// until the user frees space and resumes.
pub fn stops_the_run(
    outcome: &AttemptOutcome,
    stopping: Option<crate::plan::Stopping>,
    still_full: bool,
) -> bool {
    still_full
        && stopping.is_none()
        && outcome.status == AttemptStatus::Failed
        && outcome.stop_reason == StopReason::Interrupted
}

/// How many of the task's attempts ended by an interrupt of sortie (see [`interrupted`]).
pub fn interrupted_attempts(spec: &TaskSpec, rec: &TaskRecord) -> u32 {
    rec.attempts.iter().filter(|a| interrupted(spec, a)).count() as u32
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

/// The result of a task whose deadline ran out in `phase`.
pub fn deadline_result(rec: &TaskRecord, phase: Phase, output: &str) -> TaskResult {
    let mut o = AttemptOutcome::failed(
        StopReason::Timeout,
        format!(
            "deadline exceeded while {}",
            match phase {
                Phase::Queued => "queued (never started)",
                Phase::Starting => "starting or waiting to retry",
                Phase::Running => "running",
            }
        ),
    );
    o.phase = Some(phase);
    if rec.attempts.is_empty() {
        return result_without_attempt(
            TerminalState::Timeout,
            StopReason::Timeout,
            Some(phase),
            o.error.as_deref().unwrap_or_default(),
        );
    }
    finish_result(rec, &o, output)
}

/// The result of a task from its last attempt's outcome and text.
pub fn finish_result(rec: &TaskRecord, outcome: &AttemptOutcome, output: &str) -> TaskResult {
    let state = match (outcome.status, outcome.stop_reason) {
        (AttemptStatus::Completed, _) => TerminalState::Completed,
        (AttemptStatus::Partial, _) => TerminalState::Partial,
        (AttemptStatus::Failed, StopReason::Timeout) => TerminalState::Timeout,
        (AttemptStatus::Failed, StopReason::Cancelled) => TerminalState::Cancelled,
        (AttemptStatus::Failed, _) => TerminalState::Failed,
    };
    let error = outcome.error.as_ref().map(|e| {
        if rec.attempts.len() > 1 {
            let models: Vec<&str> = rec
                .attempts
                .iter()
                .map(|a| a.model().unwrap_or("default"))
                .collect();
            format!(
                "{e} (after {} attempts: {})",
                rec.attempts.len(),
                models.join(" → ")
            )
        } else {
            e.clone()
        }
    });
    let text = if !output.trim().is_empty() {
        output.to_owned()
    } else if let Some(e) = &error {
        e.clone()
    } else {
        "(no output)".to_owned()
    };
    TaskResult {
        state,
        stop_reason: outcome.stop_reason,
        phase: outcome.phase,
        error,
        text,
        result: outcome.result.clone(),
    }
}

/// The result of a task that never ran an attempt (skipped, cancelled, deadline in the queue).
pub fn result_without_attempt(
    state: TerminalState,
    stop_reason: StopReason,
    phase: Option<Phase>,
    error: &str,
) -> TaskResult {
    TaskResult {
        state,
        stop_reason,
        phase,
        error: Some(error.to_owned()),
        text: error.to_owned(),
        result: None,
    }
}

/// A live attempt found by resume: its process must be made sure dead before anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// The task.
    pub task: TaskId,
    /// The attempt.
    pub attempt: Attempt,
    /// The journaled pid, when `AttemptStarted` made it to the journal.
    pub pid: Option<u32>,
    /// The journaled process start time.
    pub start_time: Option<u64>,
}

/// What resume must do, from the journal alone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResumePlan {
    /// Attempts that were live: find and stop their processes, then record them orphaned.
    pub orphans: Vec<Orphan>,
    /// Tasks whose last attempt ended with no next step recorded: decide it (retry or finish).
    pub undecided: Vec<TaskId>,
    /// Tasks that are not finished and not in the lists above: they continue as scheduled
    /// (pending, queued, retrying).
    pub waiting: Vec<TaskId>,
    /// How many tasks are finished and will not run again.
    pub finished: usize,
    /// #33: tasks (among `undecided`) whose check was started and has no verdict: the check is
    /// found again (its process adopted, or its end read) or run again.
    pub checks: Vec<TaskId>,
}

impl ResumePlan {
    /// Every task the plan touches.
    pub fn tasks(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.orphans
            .iter()
            .map(|o| o.task)
            .chain(self.undecided.iter().copied())
            .chain(self.waiting.iter().copied())
    }
}

/// The plan to resume a run from its replayed state. Finished tasks never appear in it.
pub fn resume_plan(state: &RunState) -> ResumePlan {
    let mut plan = ResumePlan::default();
    for (i, rec) in state.tasks.iter().enumerate() {
        let task = TaskId(i as u32);
        match &rec.state {
            TaskState::Finished(_) => plan.finished += 1,
            TaskState::Running { attempt } => {
                let a = rec.attempts.last();
                plan.orphans.push(Orphan {
                    task,
                    attempt: *attempt,
                    pid: a.and_then(|a| a.pid),
                    start_time: a.and_then(|a| a.start_time),
                });
            }
            TaskState::Ended { .. } => {
                if rec.attempts.last().is_some_and(AttemptRecord::checking) {
                    plan.checks.push(task);
                }
                plan.undecided.push(task)
            }
            TaskState::Pending | TaskState::Queued { .. } | TaskState::Retrying { .. } => {
                plan.waiting.push(task)
            }
        }
    }
    plan
}

/// A task that never (re)started, ended by `sortie cancel` (`by_user`) or by fail_fast.
pub fn not_started_result(by_user: bool) -> TaskResult {
    let why = if by_user {
        "cancelled"
    } else {
        "cancelled: not started after a failure (fail_fast)"
    };
    result_without_attempt(TerminalState::Cancelled, StopReason::Cancelled, None, why)
}

/// A task whose last attempt would be retried, ended instead because the run is cancelled
/// (`cancelling`) or fail_fast tripped: cancelled, saying why the task ends here and why its
/// last attempt ended.
pub fn not_retried_result(rec: &TaskRecord, cancelling: bool) -> TaskResult {
    let last = rec.attempts.last();
    let outcome = last
        .and_then(|a| a.outcome())
        .unwrap_or_else(|| AttemptOutcome::failed(StopReason::Cancelled, "cancelled"));
    let mut result = finish_result(
        rec,
        &outcome,
        last.and_then(|a| a.output()).unwrap_or_default(),
    );
    result.state = TerminalState::Cancelled;
    result.stop_reason = StopReason::Cancelled;
    let why = if cancelling {
        "cancelled"
    } else {
        "cancelled: not retried after a failure (fail_fast)"
    };
    result.error = Some(match result.error.take() {
        Some(e) => format!("{why} (last attempt: {e})"),
        None => why.to_owned(),
    });
    result
}

/// A pending task whose need `need` ended `state` instead of completing.
pub fn skipped_result(need: &str, state: TerminalState) -> TaskResult {
    result_without_attempt(
        TerminalState::Skipped,
        StopReason::Cancelled,
        None,
        // #37: the state is said where the error is shown (`skipped: ...`), not in it again.
        &format!("dependency {need:?} did not complete ({state})"),
    )
}

/// `result` after its artifact could not be written (`error` says why): a completed task
/// becomes partial, and the failure is its error.
pub fn artifact_failed(mut result: TaskResult, error: &str) -> TaskResult {
    if result.state == TerminalState::Completed {
        result.state = TerminalState::Partial;
    }
    result.error = Some(format!("Artifact write failed: {error}"));
    result
}

/// `result` after its worktree could not be finalized (`why`): the worktree is kept as it is, a
/// completed task becomes partial, and the failure is added to its error.
pub fn finalize_failed(mut result: TaskResult, why: &str) -> TaskResult {
    if result.state == TerminalState::Completed {
        result.state = TerminalState::Partial;
    }
    let msg = format!("Worktree finalize failed (the worktree is kept): {why}");
    result.error = Some(match result.error.take() {
        Some(e) => format!("{e}; {msg}"),
        None => msg,
    });
    result
}

/// A task ended because the run's budget ran out (`reason`): cancelled with stop reason
/// `budget`; a task that had attempts keeps its last output.
pub fn run_budget_result(rec: &TaskRecord, reason: &str) -> TaskResult {
    let why = format!("not run further: the run's budget ran out ({reason})");
    match rec.attempts.last() {
        None => result_without_attempt(TerminalState::Cancelled, StopReason::Budget, None, &why),
        Some(last) => {
            let outcome = last
                .outcome()
                .unwrap_or_else(|| AttemptOutcome::failed(StopReason::Budget, &why));
            let mut result = finish_result(rec, &outcome, last.output().unwrap_or_default());
            result.state = TerminalState::Cancelled;
            result.stop_reason = StopReason::Budget;
            result.error = Some(match result.error.take() {
                Some(e) => format!("{why} (last attempt: {e})"),
                None => why,
            });
            result
        }
    }
}
