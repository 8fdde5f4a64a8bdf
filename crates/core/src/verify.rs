//! #33: verified results. A task with a `verify` check ends `completed` only when its check
//! passes: after an attempt ends completed, the check runs in the task's working directory
//! (`VerifyStarted`, durable before it starts; `VerifyEnded` with its verdict). A failed check
//! either asks the agent again in the same conversation (a feedback round: a new attempt that
//! continues the verified one's conversation, with the check's failure as its prompt, up to
//! `verify_rounds`) or ends the task `failed` with stop reason `verify`. A failed check is never
//! a transient retry.
//!
//! Everything here is pure: the runner runs the check, reads its exit, its output and its
//! result file, and asks [`verdict`] what they mean.

use serde::{Deserialize, Serialize};

use crate::decide::{NextStep, finish_result};
use crate::digest::fnv1a;
use crate::ids::{Attempt, Timestamp};
use crate::outcome::{AttemptStatus, StopReason, TaskResult, TerminalState};
use crate::spec::TaskSpec;
use crate::state::{AttemptRecord, TaskRecord};

/// The default `verify_timeout`: ten minutes.
pub const DEFAULT_TIMEOUT_SECS: u64 = 600;

/// How much of the end of a check's output a feedback round's message carries (bytes).
pub const FEEDBACK_TAIL: usize = 8 * 1024;

/// A score's unit: scores are kept in millionths (0 to 1,000,000), so that events stay `Eq`.
pub const SCORE_UNIT: u32 = 1_000_000;

/// The environment variable naming the file a feedback round of a plain command reads.
pub const FEEDBACK_VAR: &str = "SORTIE_VERIFY_FEEDBACK";
/// The environment variable naming the file a check may write its verdict to.
pub const RESULT_VAR: &str = "SORTIE_VERIFY_RESULT";

/// What a check said about an attempt (see `Event::VerifyEnded`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Whether the check passed: exit 0, and `passed` in its result file when it says so.
    pub passed: bool,
    /// Its score in millionths: the result file's `score`, else all or nothing.
    pub score: u32,
    /// Its exit code, when it exited (None: killed by a signal, timed out, or never started).
    pub exit: Option<i32>,
    /// A digest of its output (stdout then stderr), to tell two runs of a check apart.
    pub digest: u64,
    /// Why it failed, for people: its exit and its output's first informative line, or its
    /// timeout, or why it could not start. None when it passed.
    pub error: Option<String>,
}

impl Verdict {
    /// The score as a fraction of 1.
    pub fn score_f64(&self) -> f64 {
        f64::from(self.score) / f64::from(SCORE_UNIT)
    }
}

/// Which samples of an item a template keeps (`pick` on a template with `count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pick {
    /// Once one sample passes its check, the item's other samples are cancelled or stopped;
    /// the winner's worktree is kept, the others discarded.
    FirstPass,
    /// Every sample runs; the one with the highest score is kept (a tie: the earliest).
    BestScore,
}

impl Pick {
    /// The name a batch file gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Pick::FirstPass => "first-pass",
            Pick::BestScore => "best-score",
        }
    }

    /// Reads a batch file's name.
    pub fn parse(s: &str) -> Option<Pick> {
        match s {
            "first-pass" => Some(Pick::FirstPass),
            "best-score" => Some(Pick::BestScore),
            _ => None,
        }
    }
}

/// What a check's run left, as the runner read it.
#[derive(Debug, Clone, Default)]
pub struct CheckRun<'a> {
    /// Its exit code (None: a signal ended it, or it timed out, or never started).
    pub exit: Option<i32>,
    /// It ran out its `verify_timeout` (and was stopped).
    pub timed_out: Option<std::time::Duration>,
    /// It could not be started: why.
    pub spawn_error: Option<&'a str>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Its stdout and stderr, as kept (their ends, for a long output).
    pub output: &'a str,
    /// The text of its result file (`SORTIE_VERIFY_RESULT`), when it wrote one.
    pub result_file: Option<&'a str>,
}

/// The verdict of a check's run: passed on exit 0 unless its result file says `passed: false`
/// (a result file that says `passed: true` does not pass a nonzero exit); the score from the
/// file's `score` (clamped to 0..1), else 1 or 0. A result file that cannot be read as that
/// object fails the check, naming why.
pub fn verdict(run: &CheckRun<'_>) -> Verdict {
    let digest = fnv1a(run.output.as_bytes());
    let first = informative_line(run.output);
    let mut error = if let Some(why) = run.spawn_error {
        Some(format!("the check could not start: {why}"))
    } else if let Some(after) = run.timed_out {
        Some(format!(
            "the check timed out after {} (verify_timeout)",
            crate::bounds::ranges::format(after)
        ))
    } else {
        match (run.exit, run.signal) {
            (Some(0), _) => None,
            (Some(code), _) => Some(format!("the check exited {code}")),
            (None, Some(sig)) => Some(format!("the check was killed by signal {sig}")),
            (None, None) => Some("the check ended without an exit status".to_owned()),
        }
    };
    let mut passed = error.is_none();
    let mut score = None;
    if let Some(text) = run.result_file.filter(|t| !t.trim().is_empty()) {
        match read_result(text) {
            Ok((p, s)) => {
                if p == Some(false) && passed {
                    passed = false;
                    error = Some("the check's result file says passed: false".to_owned());
                }
                score = s;
            }
            Err(why) => {
                passed = false;
                error = Some(format!("the check's result file ({RESULT_VAR}): {why}"));
            }
        }
    }
    if let (Some(e), Some(line)) = (&mut error, first) {
        e.push_str(": ");
        e.push_str(line);
    }
    let score = score.unwrap_or(if passed { SCORE_UNIT } else { 0 });
    Verdict {
        passed,
        score,
        exit: run.exit,
        digest,
        error,
    }
}

/// The first informative line of a check's output: the first that names a failure the way test
/// runners and compilers do (`FAILED`, `Error`, `error:`, `assert`, `panicked`, `Traceback`,
/// `expected`), else the first that says `fail` or `error` at all (a tally such as `1 failed`),
/// else the last non-empty line. Capped at 200 bytes.
pub fn informative_line(output: &str) -> Option<&str> {
    const STRONG: &[&str] = &[
        "FAIL",
        "Error",
        "ERROR",
        "error:",
        "error[",
        "assert",
        "panicked",
        "Traceback",
        "expected",
    ];
    let lines = || output.lines().map(str::trim).filter(|l| !l.is_empty());
    let strong = lines().find(|l| STRONG.iter().any(|w| l.contains(w)));
    let weak = || {
        lines().find(|l| {
            let lower = l.to_ascii_lowercase();
            lower.contains("fail") || lower.contains("error")
        })
    };
    let line = strong.or_else(weak).or_else(|| lines().next_back())?;
    Some(cut(line, 200))
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Reads a result file: `{"passed": bool, "score": 0..1, "details": ...}`, every key optional.
/// A minimal JSON reader for this one object (core has no JSON library): `passed` and `score`
/// are found as top-level keys; anything else is ignored.
fn read_result(text: &str) -> Result<(Option<bool>, Option<u32>), String> {
    let t = text.trim();
    if !(t.starts_with('{') && t.ends_with('}')) {
        return Err("expected a JSON object such as {\"passed\": true, \"score\": 0.5}".into());
    }
    let passed = match top_level_value(t, "passed") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => return Err(format!("`passed` must be true or false (found {other})")),
    };
    let score = match top_level_value(t, "score") {
        None | Some("null") => None,
        Some(v) => {
            let x: f64 = v
                .parse()
                .map_err(|_| format!("`score` must be a number from 0 to 1 (found {v})"))?;
            if !x.is_finite() {
                return Err(format!("`score` must be a number from 0 to 1 (found {v})"));
            }
            Some((x.clamp(0.0, 1.0) * f64::from(SCORE_UNIT)).round() as u32)
        }
    };
    Ok((passed, score))
}

/// The scalar value of a top-level `key` of a JSON object's text (not inside a nested value
/// or a string), as its raw token.
fn top_level_value<'t>(obj: &'t str, key: &str) -> Option<&'t str> {
    let bytes = obj.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let start = i + 1;
                let mut j = start;
                while j < bytes.len() && bytes[j] != b'"' {
                    if bytes[j] == b'\\' {
                        j += 1;
                    }
                    j += 1;
                }
                let name = obj.get(start..j.min(obj.len()))?;
                i = j + 1;
                if depth == 1 && name == key {
                    let rest = obj.get(i..)?.trim_start();
                    if let Some(rest) = rest.strip_prefix(':') {
                        let rest = rest.trim_start();
                        let end = rest
                            .find(|c: char| c == ',' || c == '}' || c.is_whitespace())
                            .unwrap_or(rest.len());
                        return Some(&rest[..end]);
                    }
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The message a feedback round asks the agent with: the check's command, its failure and the
/// end of its output (at most [`FEEDBACK_TAIL`] bytes).
pub fn feedback_message(command: &[String], verdict: &Verdict, output: &str) -> String {
    let tail = tail(output, FEEDBACK_TAIL);
    format!(
        "The check of your work failed. Fix the problem, then stop.\n\n\
         Check: {}\nResult: {}\n\nThe end of its output:\n```\n{}\n```\n",
        command_text(command),
        verdict.error.as_deref().unwrap_or("failed"),
        tail.trim_end()
    )
}

/// A check's argv as a person would type it (`sh -c "X"` shows as `X`).
pub fn command_text(command: &[String]) -> String {
    match command {
        [sh, c, script] if sh == "sh" && c == "-c" => script.clone(),
        _ => command.join(" "),
    }
}

fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// The next step of a task with a check whose last attempt ended completed (None: the task has
/// no check, or its last attempt did not complete: the usual rules decide).
pub(crate) fn next_step(spec: &TaskSpec, rec: &TaskRecord, now: Timestamp) -> Option<NextStep> {
    spec.verify.as_ref()?;
    let last = rec.attempts.last()?;
    let outcome = last.outcome()?;
    if outcome.status != AttemptStatus::Completed {
        return None;
    }
    let output = last.output().unwrap_or_default();
    let verdict = match last.verdict() {
        None if last.verify_started() => return Some(NextStep::Checking),
        // Its end began without a check (a cancel finalized its worktree, then sortie died):
        // it ends as that decision said.
        None if rec.steps().worktree_final.is_some() => {
            return Some(NextStep::GiveUp(unverified_result(rec, "cancelled")));
        }
        None => return Some(NextStep::Verify),
        Some(v) => v,
    };
    if verdict.passed {
        return Some(NextStep::GiveUp(finish_result(rec, &outcome, output)));
    }
    let failed = failed_checks(rec);
    let mut result = failed_result(rec, verdict, output);
    if failed > spec.verify_rounds {
        return Some(NextStep::GiveUp(result));
    }
    if rec.deadline_at(spec).is_some_and(|d| now >= d) {
        if let Some(e) = &mut result.error {
            e.push_str("; no feedback round: the task's deadline passed");
        }
        return Some(NextStep::GiveUp(result));
    }
    Some(NextStep::Feedback {
        attempt: Attempt(rec.attempts.len() as u32 + 1),
        model: last.model().map(str::to_owned),
        reason: format!(
            "attempt {} {}; feedback round {failed} of {}",
            last.attempt,
            verdict.error.as_deref().unwrap_or("failed its check"),
            spec.verify_rounds
        ),
        failed: result,
    })
}

/// The result of a task whose check failed: `failed`, stop reason `verify`, the check's error
/// (with the rounds it had), the agent's last answer as its text.
pub fn failed_result(rec: &TaskRecord, verdict: &Verdict, output: &str) -> TaskResult {
    let rounds = failed_checks(rec).saturating_sub(1);
    let mut error = verdict
        .error
        .clone()
        .unwrap_or_else(|| "the check failed".to_owned());
    if rounds > 0 {
        error.push_str(&format!(
            " (after {rounds} feedback round{})",
            if rounds == 1 { "" } else { "s" }
        ));
    }
    TaskResult {
        state: TerminalState::Failed,
        stop_reason: StopReason::Verify,
        phase: None,
        text: if output.trim().is_empty() {
            error.clone()
        } else {
            output.to_owned()
        },
        error: Some(error),
        result: rec
            .attempts
            .last()
            .and_then(|a| a.outcome())
            .and_then(|o| o.result),
    }
}

/// The result of a task whose completed attempt was never checked (cancelled first).
pub fn unverified_result(rec: &TaskRecord, why: &str) -> TaskResult {
    let output = rec
        .attempts
        .last()
        .and_then(|a| a.output())
        .unwrap_or_default();
    TaskResult {
        state: TerminalState::Cancelled,
        stop_reason: StopReason::Cancelled,
        phase: None,
        error: Some(format!("{why} before its check passed")),
        text: if output.trim().is_empty() {
            format!("{why} before its check passed")
        } else {
            output.to_owned()
        },
        result: None,
    }
}

/// How a finished task's check went, for people: `verified`, `verified after 2 rounds`, or
/// None for a task without a verdict.
pub fn verified_text(rec: &TaskRecord) -> Option<String> {
    let last = verdicts(rec).last()?;
    if !last.passed {
        return None;
    }
    Some(match failed_checks(rec) {
        0 => "verified".to_owned(),
        1 => "verified after 1 round".to_owned(),
        n => format!("verified after {n} rounds"),
    })
}

/// The verdicts of a task's attempts, oldest first.
pub fn verdicts(rec: &TaskRecord) -> impl Iterator<Item = &Verdict> {
    rec.attempts.iter().filter_map(AttemptRecord::verdict)
}

/// How many feedback rounds a task has had: its failed verdicts that were followed by an
/// attempt.
pub fn rounds_used(rec: &TaskRecord) -> u32 {
    let n = rec.attempts.len();
    rec.attempts
        .iter()
        .take(n.saturating_sub(1))
        .filter(|a| a.verdict().is_some_and(|v| !v.passed))
        .count() as u32
}

/// The failed verdict the live (or last) attempt of a task answers, when it is a feedback round
/// (or a retry of one): the newest verdict of an earlier attempt, when it failed.
pub fn answering(rec: &TaskRecord) -> Option<(&AttemptRecord, &Verdict)> {
    let n = rec.attempts.len();
    rec.attempts
        .iter()
        .take(n.saturating_sub(1))
        .rev()
        .find_map(|a| a.verdict().map(|v| (a, v)))
        .filter(|(_, v)| !v.passed)
}

/// How many of a task's checks failed (each may be followed by a feedback round).
pub fn failed_checks(rec: &TaskRecord) -> u32 {
    verdicts(rec).filter(|v| !v.passed).count() as u32
}

/// Whether an attempt starts a feedback round: the attempt right before it has a failed verdict.
pub fn starts_round(rec: &TaskRecord, index: usize) -> bool {
    index > 0
        && rec
            .attempts
            .get(index - 1)
            .and_then(AttemptRecord::verdict)
            .is_some_and(|v| !v.passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(exit: Option<i32>, output: &str, file: Option<&str>) -> Verdict {
        verdict(&CheckRun {
            exit,
            output,
            result_file: file,
            ..CheckRun::default()
        })
    }

    #[test]
    fn exit_zero_passes_with_score_one_and_a_nonzero_exit_names_the_failing_line() {
        let v = run(Some(0), "3 passed\n", None);
        assert!(v.passed && v.score == SCORE_UNIT && v.error.is_none());
        let v = run(
            Some(1),
            "collected 3 items\nFAILED test_x.py::test_add - assert 3 == 4\n1 failed\n",
            None,
        );
        assert!(!v.passed && v.score == 0);
        assert_eq!(
            v.error.as_deref(),
            Some("the check exited 1: FAILED test_x.py::test_add - assert 3 == 4")
        );
    }

    #[test]
    fn the_result_file_may_fail_a_zero_exit_and_gives_the_score() {
        let v = run(Some(0), "", Some(r#"{"passed": false, "score": 0.25}"#));
        assert!(!v.passed);
        assert_eq!(v.score, 250_000);
        let v = run(
            Some(0),
            "",
            Some(r#"{"details": {"passed": false}, "score": 0.75, "passed": true}"#),
        );
        assert!(v.passed);
        assert_eq!(v.score, 750_000);
        // A passing file does not pass a failing exit.
        assert!(!run(Some(2), "", Some(r#"{"passed": true}"#)).passed);
        // A score outside 0..1 is clamped; a malformed file fails, naming it.
        assert_eq!(run(Some(0), "", Some(r#"{"score": 7}"#)).score, SCORE_UNIT);
        let v = run(Some(0), "", Some("passed"));
        assert!(!v.passed);
        assert!(v.error.unwrap_or_default().contains(RESULT_VAR));
        let v = run(Some(0), "", Some(r#"{"passed": "yes"}"#));
        assert!(!v.passed);
    }

    #[test]
    fn a_timeout_and_a_spawn_error_fail_in_words() {
        let v = verdict(&CheckRun {
            timed_out: Some(std::time::Duration::from_secs(600)),
            ..CheckRun::default()
        });
        assert!(!v.passed);
        assert!(v.error.unwrap_or_default().contains("timed out after 10m"));
        let v = verdict(&CheckRun {
            spawn_error: Some("pytest: not found"),
            ..CheckRun::default()
        });
        assert!(v.error.unwrap_or_default().contains("pytest: not found"));
    }

    #[test]
    fn the_feedback_names_the_check_and_carries_the_end_of_its_output() {
        let long = format!("{}\nE   assert 3 == 4\n", "x".repeat(20_000));
        let v = run(Some(1), &long, None);
        let argv = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            "python3 -m pytest -q".to_owned(),
        ];
        let m = feedback_message(&argv, &v, &long);
        assert!(m.contains("Check: python3 -m pytest -q"));
        assert!(m.contains("assert 3 == 4"));
        assert!(m.len() < FEEDBACK_TAIL + 600);
    }
}
