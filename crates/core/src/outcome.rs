//! What an attempt ended with, what a task ended with, and what a run ended with.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why an attempt (and so a task) stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The agent finished normally.
    Completed,
    /// The process exited nonzero with a complete protocol: a real task failure.
    NonzeroExit,
    /// A provider or agent error that may pass (429, 5xx, overloaded, connection).
    Error,
    /// A provider error tied to the model (quota, billing, auth, unknown model).
    ModelError,
    /// The agent's output protocol was incomplete or unreadable.
    ProtocolError,
    /// The process was ended by a signal sortie did not send.
    UnexpectedSignal,
    /// The agent could not be started.
    SpawnError,
    /// No output for `stall_after` plus `stall_kill_after`.
    Stalled,
    /// A timeout: `attempt_timeout` while running, or the task's deadline.
    Timeout,
    /// A budget (turns, tokens, cost) was exhausted.
    Budget,
    /// The user cancelled the task or the run.
    Cancelled,
    /// sortie itself was stopped or died while the attempt ran.
    Interrupted,
    /// The task's setup (e.g. its worktree) failed.
    SetupError,
    /// The task cannot run as specified.
    Invalid,
    /// #33: the agent completed, but the task's check (`verify`) did not pass.
    Verify,
}

impl StopReason {
    /// The snake_case name used in output and exports.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Completed => "completed",
            StopReason::NonzeroExit => "nonzero_exit",
            StopReason::Error => "error",
            StopReason::ModelError => "model_error",
            StopReason::ProtocolError => "protocol_error",
            StopReason::UnexpectedSignal => "unexpected_signal",
            StopReason::SpawnError => "spawn_error",
            StopReason::Stalled => "stalled",
            StopReason::Timeout => "timeout",
            StopReason::Budget => "budget",
            StopReason::Cancelled => "cancelled",
            StopReason::Interrupted => "interrupted",
            StopReason::SetupError => "setup_error",
            StopReason::Invalid => "invalid",
            StopReason::Verify => "verify",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a task was when a timeout hit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting for its dependencies or a slot (never started).
    Queued,
    /// Setting up, launching, or waiting between attempts.
    Starting,
    /// An attempt was running.
    Running,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Queued => "queued",
            Phase::Starting => "starting",
            Phase::Running => "running",
        })
    }
}

/// How an attempt ended, coarsely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptStatus {
    /// Exit 0, protocol complete, last message did not fail.
    Completed,
    /// Useful output, but stopped early (budget, signal, incomplete protocol).
    Partial,
    /// Anything else.
    Failed,
}

/// The full outcome of one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptOutcome {
    /// Completed, partial or failed.
    pub status: AttemptStatus,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// For timeouts, where the task was.
    pub phase: Option<Phase>,
    /// The exit code, when the process exited (a failed exit 0 is reported as 1).
    pub exit_code: Option<i32>,
    /// The signal that ended the process, when one did.
    pub signal: Option<i32>,
    /// A human-readable error, when there is one.
    pub error: Option<String>,
    /// True when the agent ran side-effecting tools (bash, write, edit).
    pub side_effects: bool,
    /// The agent's tool calls that its permissions denied, per tool, in the order first seen.
    pub denials: Vec<Denial>,
    // Shared rate limits (issue 14).
    /// The provider refused the attempt for its rate limit (429, overloaded): retried apart
    /// from `max_retries`, and its pool backs off.
    pub rate_limited: bool,
    /// The wait the provider asked for, when the agent printed it (milliseconds).
    pub retry_after_ms: Option<u64>,
    // Issue 13: structured results.
    /// The structured result that matched the task's `output_schema`, as compact JSON text
    /// (None: the task has no schema, or its answer did not match).
    pub result: Option<String>,
}

/// Tool calls of one tool that an agent's permissions denied during an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Denial {
    /// The tool's name, as the agent calls it (`Bash`, `Write`, ...).
    pub tool: String,
    /// How many of its calls were denied.
    pub count: u32,
}

impl Denial {
    /// Counts one denied call of `tool` into `denials`.
    pub fn add(denials: &mut Vec<Denial>, tool: &str) {
        match denials.iter_mut().find(|d| d.tool == tool) {
            Some(d) => d.count = d.count.saturating_add(1),
            None => denials.push(Denial {
                tool: tool.to_owned(),
                count: 1,
            }),
        }
    }

    /// `Bash ×2, Write` for people.
    pub fn describe(denials: &[Denial]) -> String {
        denials
            .iter()
            .map(|d| match d.count {
                1 => d.tool.clone(),
                n => format!("{} ×{n}", d.tool),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl AttemptOutcome {
    /// A completed attempt whose agent had tool calls denied becomes `partial` (the work it
    /// was asked for may be half done, whatever its final message says), unless the task
    /// allows denials (`allow_denials`). The error names the denied tools.
    pub fn judge_denials(mut self, allow_denials: bool) -> Self {
        if self.status == AttemptStatus::Completed && !self.denials.is_empty() && !allow_denials {
            self.status = AttemptStatus::Partial;
            self.error = Some(format!(
                "the agent's permissions denied tool calls: {} (allow_denials = true accepts \
                 this as completed)",
                Denial::describe(&self.denials)
            ));
        }
        self
    }

    /// Judges a completed attempt of a task with an `output_schema` by its structured result:
    /// `Ok(value)` (the result matched; compact JSON) is kept as the attempt's result; `Err`
    /// (no result, or one that did not match even after the repair round, if any) makes it
    /// `partial` with the validation error. Any other attempt is left as it is.
    pub fn judge_result(mut self, checked: Result<String, String>) -> Self {
        if self.status != AttemptStatus::Completed {
            return self;
        }
        match checked {
            Ok(value) => self.result = Some(value),
            Err(why) => {
                self.status = AttemptStatus::Partial;
                self.error = Some(format!("structured result: {why}"));
            }
        }
        self
    }

    /// A plain command that failed with a nonzero exit whose `text` (the stderr tail and the
    /// last output lines) contains one of `patterns` (case-insensitive) failed with `error`: a
    /// transient failure, retried (the task's `transient_on`).
    pub fn transient_on(mut self, patterns: &[String], text: &str) -> Self {
        if self.stop_reason != StopReason::NonzeroExit || self.status != AttemptStatus::Failed {
            return self;
        }
        let haystack = text.to_lowercase();
        if let Some(p) = patterns
            .iter()
            .find(|p| !p.is_empty() && haystack.contains(&p.to_lowercase()))
        {
            self.stop_reason = StopReason::Error;
            let error = self.error.take().unwrap_or_default();
            self.error = Some(format!("{error} (transient: matched {p:?})"));
        }
        self
    }

    /// A completed attempt with exit code 0.
    pub fn completed() -> Self {
        AttemptOutcome {
            status: AttemptStatus::Completed,
            stop_reason: StopReason::Completed,
            phase: None,
            exit_code: Some(0),
            signal: None,
            error: None,
            side_effects: false,
            denials: vec![],
            rate_limited: false,
            retry_after_ms: None,
            result: None,
        }
    }

    /// A failed attempt with a reason and an error text.
    pub fn failed(stop_reason: StopReason, error: impl Into<String>) -> Self {
        AttemptOutcome {
            status: AttemptStatus::Failed,
            stop_reason,
            phase: None,
            exit_code: None,
            signal: None,
            error: Some(error.into()),
            side_effects: false,
            denials: vec![],
            rate_limited: false,
            retry_after_ms: None,
            result: None,
        }
    }
}

/// A task's terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalState {
    /// Done, fully.
    Completed,
    /// Stopped early with useful output (budget, truncation, artifact failure).
    Partial,
    /// Failed after its attempts.
    Failed,
    /// Its deadline or attempt timeout ran out.
    Timeout,
    /// Cancelled by the user, or not started after `fail_fast`.
    Cancelled,
    /// A dependency did not complete.
    Skipped,
}

impl TerminalState {
    /// The lowercase name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            TerminalState::Completed => "completed",
            TerminalState::Partial => "partial",
            TerminalState::Failed => "failed",
            TerminalState::Timeout => "timeout",
            TerminalState::Cancelled => "cancelled",
            TerminalState::Skipped => "skipped",
        }
    }

    /// Whether `apply --all` brings in the kept work of a task that ended so without being
    /// asked: only a completed task's. A failed, partial, timed-out or cancelled task's kept
    /// worktree holds work it did not finish; it is applied only with `--include-failed`.
    pub fn applied_by_all(self, include_failed: bool) -> bool {
        self == TerminalState::Completed || include_failed
    }
}

impl fmt::Display for TerminalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The end of a task, as recorded by `TaskFinished`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The terminal state.
    pub state: TerminalState,
    /// Why it ended.
    pub stop_reason: StopReason,
    /// For timeouts, where the task was.
    pub phase: Option<Phase>,
    /// The error message, ending with `(after N attempts: a → b)` when there were retries.
    pub error: Option<String>,
    /// The task's text: final agent message, else the error, else stderr, else `(no output)`.
    pub text: String,
    // Issue 13: structured results.
    /// The validated structured result of its last attempt, as compact JSON text (see
    /// [`AttemptOutcome::result`]).
    pub result: Option<String>,
}

/// The aggregate end of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// Every task completed.
    Completed,
    /// Some task completed or was partial.
    Partial,
    /// Nothing completed.
    Failed,
    /// Every task timed out or was cancelled.
    Timeout,
    /// Every task was cancelled.
    Cancelled,
}

impl RunOutcome {
    /// The lowercase name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Completed => "completed",
            RunOutcome::Partial => "partial",
            RunOutcome::Failed => "failed",
            RunOutcome::Timeout => "timeout",
            RunOutcome::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The aggregate run state from the task results, in this order: all completed →
/// completed; any completed or partial → partial; all cancelled → cancelled; all timeout or
/// cancelled → timeout; otherwise failed. (An empty run counts as completed.)
pub fn aggregate(results: impl IntoIterator<Item = TerminalState>) -> RunOutcome {
    let (mut all_completed, mut any_useful, mut all_cancelled, mut all_timeout_or_cancelled) =
        (true, false, true, true);
    for s in results {
        all_completed &= s == TerminalState::Completed;
        any_useful |= matches!(s, TerminalState::Completed | TerminalState::Partial);
        all_cancelled &= s == TerminalState::Cancelled;
        all_timeout_or_cancelled &= matches!(s, TerminalState::Timeout | TerminalState::Cancelled);
    }
    if all_completed {
        RunOutcome::Completed
    } else if any_useful {
        RunOutcome::Partial
    } else if all_cancelled {
        RunOutcome::Cancelled
    } else if all_timeout_or_cancelled {
        RunOutcome::Timeout
    } else {
        RunOutcome::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_make_a_completed_attempt_partial_unless_allowed() {
        let mut o = AttemptOutcome::completed();
        Denial::add(&mut o.denials, "Bash");
        Denial::add(&mut o.denials, "Write");
        Denial::add(&mut o.denials, "Bash");
        assert_eq!(Denial::describe(&o.denials), "Bash ×2, Write");
        let judged = o.clone().judge_denials(false);
        assert_eq!(judged.status, AttemptStatus::Partial);
        assert_eq!(judged.stop_reason, StopReason::Completed);
        assert!(
            judged
                .error
                .as_deref()
                .unwrap_or("")
                .contains("Bash ×2, Write")
        );
        assert_eq!(
            o.clone().judge_denials(true),
            o,
            "allow_denials keeps it completed"
        );
        // A failed attempt stays failed; no denial, no change.
        let failed = AttemptOutcome::failed(StopReason::Error, "500");
        let mut with = failed.clone();
        Denial::add(&mut with.denials, "Bash");
        assert_eq!(
            with.clone().judge_denials(false).status,
            AttemptStatus::Failed
        );
        let plain = AttemptOutcome::completed();
        assert_eq!(plain.clone().judge_denials(false), plain);
    }

    #[test]
    fn transient_on_makes_a_matching_nonzero_exit_a_retried_error() {
        let failed = AttemptOutcome {
            exit_code: Some(1),
            ..AttemptOutcome::failed(StopReason::NonzeroExit, "exited with code 1")
        };
        let patterns = vec!["429".to_owned(), "Rate Limit".to_owned()];
        let hit = failed
            .clone()
            .transient_on(&patterns, "HTTP 503\nerror: RATE LIMIT hit");
        assert_eq!(hit.stop_reason, StopReason::Error);
        assert!(crate::is_transient(&hit));
        assert!(
            hit.error
                .as_deref()
                .unwrap_or("")
                .contains("\"Rate Limit\"")
        );
        let miss = failed.clone().transient_on(&patterns, "syntax error");
        assert_eq!(miss, failed);
        assert!(!crate::is_transient(&miss));
        let done = AttemptOutcome::completed();
        assert_eq!(done.clone().transient_on(&patterns, "429"), done);
    }

    // Issue 13: structured results.
    #[test]
    fn a_structured_result_is_kept_or_makes_a_completed_attempt_partial() {
        let ok = AttemptOutcome::completed().judge_result(Ok(r#"{"n":1}"#.into()));
        assert_eq!(
            (ok.status, ok.result.as_deref()),
            (AttemptStatus::Completed, Some(r#"{"n":1}"#))
        );
        let bad = AttemptOutcome::completed().judge_result(Err("at /n: not an integer".into()));
        assert_eq!(bad.status, AttemptStatus::Partial);
        assert_eq!(
            bad.error.as_deref(),
            Some("structured result: at /n: not an integer")
        );
        assert_eq!(bad.result, None);
        assert!(!crate::is_transient(&bad), "a wrong result is not retried");
        let failed = AttemptOutcome::failed(StopReason::Error, "500");
        assert_eq!(failed.clone().judge_result(Err("none".into())), failed);
    }
}
