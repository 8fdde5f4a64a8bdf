//! #33: how a task's check is shown: in `status`, the summary, `results` and the report.

use serde::Serialize;
use sortie_core::TaskRecord;

/// A task's checks as the views show them.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct VerifyView {
    /// How many times its check ran (one per checked attempt).
    pub(crate) checks: usize,
    /// Whether its last check passed.
    pub(crate) passed: bool,
    /// Its last check's score, from 0 to 1.
    pub(crate) score: f64,
    /// Its feedback rounds: the checks that failed before the last.
    pub(crate) rounds: u32,
    /// Its last check's exit code.
    pub(crate) exit: Option<i32>,
    /// Why its last check failed.
    pub(crate) error: Option<String>,
    /// For people: `verified`, `verified after 2 rounds`, `check failed`, `verifying`.
    pub(crate) text: String,
}

impl VerifyView {
    /// The view of `rec`'s checks; None for a task whose check never ran.
    pub(crate) fn of(rec: &TaskRecord) -> Option<VerifyView> {
        let checks = rec.attempts.iter().filter(|a| a.verify_started()).count();
        if checks == 0 {
            return None;
        }
        let last = sortie_core::verify::verdicts(rec).last();
        let failed = sortie_core::verify::failed_checks(rec);
        let checking = rec.attempts.last().is_some_and(|a| a.checking());
        let passed = last.is_some_and(|v| v.passed);
        let text = if checking {
            "verifying".to_owned()
        } else if passed {
            sortie_core::verify::verified_text(rec).unwrap_or_else(|| "verified".into())
        } else {
            "check failed".to_owned()
        };
        Some(VerifyView {
            checks,
            passed,
            score: last.map_or(0.0, |v| v.score_f64()),
            rounds: if passed {
                failed
            } else {
                failed.saturating_sub(1)
            },
            exit: last.and_then(|v| v.exit),
            error: last.and_then(|v| v.error.clone()),
            text,
        })
    }
}
