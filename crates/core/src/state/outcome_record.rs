//! A finished attempt's outcome as the state keeps it: compact, its rare parts boxed.

use serde::{Deserialize, Serialize};

use super::rare::Rare;
use crate::outcome::{AttemptOutcome, AttemptStatus, Denial, Phase, StopReason};

/// A finished attempt's outcome (`AttemptFinished`) and text, as the state keeps them: what
/// every outcome has inline, its texts and rarer fields in one box that most outcomes of a
/// plain command never need (32 bytes, where the outcome and its text were 136).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeRecord {
    /// Completed, partial or failed.
    pub status: AttemptStatus,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// For timeouts, where the task was.
    pub phase: Option<Phase>,
    /// True when the agent ran side-effecting tools.
    pub side_effects: bool,
    /// The provider refused the attempt for its rate limit.
    pub rate_limited: bool,
    /// The exit code, when the process exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the process, when one did.
    pub signal: Option<i32>,
    /// The rest, once any of it is set.
    pub(super) rest: Rare<OutcomeRest>,
}

/// What an [`OutcomeRecord`] keeps boxed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(super) struct OutcomeRest {
    error: Option<String>,
    denials: Vec<Denial>,
    retry_after_ms: Option<u64>,
    result: Option<String>,
    output: String,
}

impl OutcomeRecord {
    /// The record of `outcome` and the attempt's text.
    pub fn new(outcome: &AttemptOutcome, output: &str) -> Self {
        let rest = OutcomeRest {
            error: outcome.error.clone(),
            denials: outcome.denials.clone(),
            retry_after_ms: outcome.retry_after_ms,
            result: outcome.result.clone(),
            output: output.to_owned(),
        };
        let mut record = OutcomeRecord {
            status: outcome.status,
            stop_reason: outcome.stop_reason,
            phase: outcome.phase,
            side_effects: outcome.side_effects,
            rate_limited: outcome.rate_limited,
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            rest: Rare::default(),
        };
        if rest != OutcomeRest::default() {
            *record.rest.get_mut() = rest;
        }
        record
    }

    /// The outcome, whole.
    pub fn outcome(&self) -> AttemptOutcome {
        let rest = self.rest.get();
        AttemptOutcome {
            status: self.status,
            stop_reason: self.stop_reason,
            phase: self.phase,
            exit_code: self.exit_code,
            signal: self.signal,
            error: rest.and_then(|r| r.error.clone()),
            side_effects: self.side_effects,
            denials: rest.map(|r| r.denials.clone()).unwrap_or_default(),
            rate_limited: self.rate_limited,
            retry_after_ms: rest.and_then(|r| r.retry_after_ms),
            result: rest.and_then(|r| r.result.clone()),
        }
    }

    /// The attempt's text.
    pub fn output(&self) -> &str {
        self.rest.get().map_or("", |r| &r.output)
    }

    /// The outcome's error.
    pub fn error(&self) -> Option<&str> {
        self.rest.get().and_then(|r| r.error.as_deref())
    }

    /// The tool calls its agent's permissions denied.
    pub fn denials(&self) -> &[Denial] {
        self.rest.get().map_or(&[], |r| &r.denials)
    }

    /// The wait the provider asked for (milliseconds).
    pub fn retry_after_ms(&self) -> Option<u64> {
        self.rest.get().and_then(|r| r.retry_after_ms)
    }

    /// The structured result, as compact JSON text.
    pub fn result(&self) -> Option<&str> {
        self.rest.get().and_then(|r| r.result.as_deref())
    }
}
