//! What the agent protocols (pi-json, claude-stream-json, codex-json) share: one set of rules
//! that classifies a whole run ([`classify_agent`], whose table docs/agents.md shows), and
//! the classification of a provider's error text and HTTP status.

use sortie_core::{AttemptOutcome, AttemptStatus, StopReason, Usage};

use crate::exit::signal_name;
use crate::shared::{choose_output, with_stderr};
use crate::{Exit, Finished};

/// What an agent reader learned from a whole stream, to be classified by [`classify_agent`].
#[derive(Debug, Clone)]
pub(crate) struct AgentSummary {
    /// The agent's name, for error texts.
    pub(crate) agent: &'static str,
    /// True once the stream reached its end of run after the last message (pi: an `agent_end`
    /// not followed by a new agent attempt; Claude Code: the `result` line).
    pub(crate) finished: bool,
    /// True when at least one line of the protocol was read.
    pub(crate) started: bool,
    /// The text of the last assistant message, when it did not fail (possibly partial).
    pub(crate) answer: String,
    /// The last message failed.
    pub(crate) failure: Option<AgentFailure>,
    /// The protocol finished, but the answer is known to be cut short: why.
    pub(crate) cut_short: Option<String>,
    /// The attempt's usage.
    pub(crate) usage: Usage,
    /// True when a side-effecting tool ran.
    pub(crate) side_effects: bool,
    /// The tool calls the agent's permissions denied.
    pub(crate) denials: Vec<sortie_core::Denial>,
}

/// The failure of an agent's last message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentFailure {
    /// The stop reason, when the error was recognized ([`classify_provider_error`]).
    pub(crate) reason: Option<StopReason>,
    /// The error text.
    pub(crate) message: String,
}

impl AgentFailure {
    /// A failure whose stop reason comes from its text.
    pub(crate) fn from_text(message: String) -> AgentFailure {
        AgentFailure {
            reason: classify_provider_error(&message),
            message,
        }
    }
}

/// Classifies an agent run (docs/agents.md, "The contract of a reader", has the same table).
///
/// Completed: exit 0, no signal, the last message did not fail, the protocol finished and the
/// answer is not known to be cut short. Partial: there is an answer, the last message did not
/// fail, but the protocol is incomplete (or the answer cut short) or a signal ended the process.
/// Otherwise failed, with exit 0 reported as 1. The stop reason of a failed message comes from
/// its error text; an unrecognized error is `nonzero_exit` when the protocol finished (a real
/// failure: retrying will not help) and `protocol_error` when it did not.
pub(crate) fn classify_agent(run: AgentSummary, exit: Exit, stderr_tail: &str) -> Finished {
    let agent = run.agent;
    let useful = run.failure.is_none() && !run.answer.trim().is_empty();
    let status_if_useful = if useful {
        AttemptStatus::Partial
    } else {
        AttemptStatus::Failed
    };
    let (status, reason, error) = match (&run.failure, exit) {
        (Some(f), Exit::Signal(_)) if !run.finished => (
            AttemptStatus::Failed,
            StopReason::UnexpectedSignal,
            format!("killed by {exit} after: {}", f.message),
        ),
        (Some(f), Exit::Code(code)) => {
            let reason = f.reason.unwrap_or_else(|| {
                if run.finished {
                    StopReason::NonzeroExit
                } else if signal_exit(code).is_some() {
                    StopReason::UnexpectedSignal
                } else {
                    StopReason::ProtocolError
                }
            });
            (AttemptStatus::Failed, reason, f.message.clone())
        }
        (Some(f), Exit::Signal(_)) => (
            AttemptStatus::Failed,
            f.reason.unwrap_or(StopReason::NonzeroExit),
            f.message.clone(),
        ),
        (None, Exit::Signal(_)) => (
            status_if_useful,
            StopReason::UnexpectedSignal,
            with_stderr(format!("killed by {exit}"), stderr_tail),
        ),
        (None, Exit::Code(code)) if !run.finished => {
            let (reason, what) = if code == 0 {
                let what = if run.started {
                    format!("{agent} exited 0 before the end of its run (incomplete event stream)")
                } else {
                    format!("{agent} exited 0 without printing its event stream")
                };
                (StopReason::ProtocolError, what)
            } else if let Some(reason) = classify_provider_error(stderr_tail) {
                (
                    reason,
                    format!("{agent} exited with code {code} before the end of its run"),
                )
            } else if let Some(sig) = signal_exit(code) {
                (
                    StopReason::UnexpectedSignal,
                    format!("{agent} exited with code {code} ({sig}) before the end of its run"),
                )
            } else {
                (
                    StopReason::ProtocolError,
                    format!("{agent} exited with code {code} before the end of its run"),
                )
            };
            (status_if_useful, reason, with_stderr(what, stderr_tail))
        }
        (None, Exit::Code(_)) if run.cut_short.is_some() => (
            status_if_useful,
            StopReason::ProtocolError,
            run.cut_short.clone().unwrap_or_default(),
        ),
        (None, Exit::Code(0)) => (
            AttemptStatus::Completed,
            StopReason::Completed,
            String::new(),
        ),
        (None, Exit::Code(code)) => (
            AttemptStatus::Failed,
            classify_provider_error(stderr_tail).unwrap_or(StopReason::NonzeroExit),
            with_stderr(format!("exited with code {code}"), stderr_tail),
        ),
    };
    let outcome = AttemptOutcome {
        status,
        stop_reason: reason,
        phase: None,
        exit_code: exit.code().map(|c| {
            if c == 0 && status == AttemptStatus::Failed {
                1
            } else {
                c
            }
        }),
        signal: exit.signal(),
        error: (status != AttemptStatus::Completed).then_some(error),
        side_effects: run.side_effects,
        denials: run.denials,
        rate_limited: false,
        retry_after_ms: None,
        result: None,
    };
    let output = choose_output(run.answer, useful, &outcome, stderr_tail);
    Finished {
        outcome,
        usage: run.usage,
        output,
        has_output: useful,
    }
}

/// The signal name behind an exit code of 128 + n (how Node and shells report a signal they
/// handled), for codes 129..=159.
fn signal_exit(code: i32) -> Option<&'static str> {
    if !(129..=159).contains(&code) {
        return None;
    }
    signal_name(code - 128)
}

/// Classifies the text of a provider or agent error (an HTTP error as the agent printed it).
///
/// - `model_error` (not retried on the same model): quota, billing, credit, payment, auth
///   (401, 402, 403, "invalid api key", "authentication"), model not found or unknown model.
/// - `error` (transient): 408, 409, 425, 429, 5xx, overloaded, rate limit, too many requests,
///   timed out, connection reset/refused/error/closed, network errors, fetch failed.
/// - `None`: not recognized; the caller picks `nonzero_exit` or `protocol_error`.
///
/// Model errors win over transient ones: a 429 that says "quota" is a billing problem, not a
/// passing one. Status codes count only as whole 3-digit numbers that are not part of an address
/// or version (so a port like `:34561` or `1.500` is not a 500).
pub fn classify_provider_error(text: &str) -> Option<StopReason> {
    const MODEL: &[&str] = &[
        "quota",
        "billing",
        "credit",
        "insufficient_quota",
        "payment required",
        "authenticat",
        "unauthori",
        "forbidden",
        "permission_error",
        "invalid api key",
        "invalid x-api-key",
        "invalid_api_key",
        "incorrect api key",
        "no api key",
        "api key not",
        "missing api key",
        "model not found",
        "model_not_found",
        "unknown model",
        "no such model",
        "invalid model",
        "model does not exist",
    ];
    const TRANSIENT: &[&str] = &[
        "overloaded",
        "rate limit",
        "rate_limit",
        "ratelimit",
        "too many requests",
        "timed out",
        "timeout",
        "time out",
        "connection reset",
        "connection refused",
        "connection error",
        "connection closed",
        "connection lost",
        "connection aborted",
        "econnreset",
        "econnrefused",
        "etimedout",
        "eai_again",
        "socket hang up",
        "network",
        "fetch failed",
        "service unavailable",
        "server error",
        "server_error",
        "internal error",
        "bad gateway",
        "temporarily unavailable",
    ];
    let t = text.to_ascii_lowercase();
    let codes = http_statuses(&t);
    let model_not_found = t.contains("model")
        && (t.contains("not found") || t.contains("not_found") || t.contains("does not exist"));
    if MODEL.iter().any(|p| t.contains(p))
        || model_not_found
        || codes.iter().any(|c| matches!(c, 401..=403))
    {
        return Some(StopReason::ModelError);
    }
    if TRANSIENT.iter().any(|p| t.contains(p))
        || codes
            .iter()
            .any(|c| matches!(c, 408 | 409 | 425 | 429 | 500..=599))
    {
        return Some(StopReason::Error);
    }
    None
}

/// Classifies an HTTP status an agent reported apart from its error text (Claude Code's
/// `api_error_status`): 401-403 are `model_error`, 408, 409, 425, 429 and 5xx are `error`.
pub fn classify_http_status(status: u16) -> Option<StopReason> {
    match status {
        401..=403 => Some(StopReason::ModelError),
        408 | 409 | 425 | 429 | 500..=599 => Some(StopReason::Error),
        _ => None,
    }
}

/// The whole 3-digit numbers in `text` (100..=599) that look like HTTP statuses: not preceded by
/// `.`, `:`, `-` or `_`, nor followed by `.` and a digit.
fn http_statuses(text: &str) -> Vec<u16> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let before_ok = start == 0 || !matches!(b[start - 1], b'.' | b':' | b'-' | b'_');
        let after_ok = !(i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit());
        if i - start == 3
            && before_ok
            && after_ok
            && let Ok(n) = text[start..i].parse::<u16>()
            && (100..=599).contains(&n)
        {
            out.push(n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_errors_from_the_recorded_samples_are_transient() {
        for text in [
            // pi (errorMessage of the failed assistant message).
            "500 mock: internal server error",
            "429 mock: rate limit exceeded (429)",
            "Request timed out.",
            "Connection error.",
            // Claude Code (result.result).
            "API Error: 500 mock: internal server error. This is a server-side issue, usually \
             temporary — try again in a moment. If it persists, check your inference gateway \
             (127.0.0.1:34561).",
            "API Error: Request rejected (429) · mock: rate limit exceeded (429)",
            "API Error: Request timed out. Check your network or set API_TIMEOUT_MS above 3000.",
            // Other common shapes.
            "529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}",
            "503 Service Unavailable",
            "fetch failed: ECONNRESET",
            "connect ECONNREFUSED 127.0.0.1:8080",
            "Too Many Requests",
        ] {
            assert_eq!(
                classify_provider_error(text),
                Some(StopReason::Error),
                "{text}"
            );
        }
    }

    #[test]
    fn provider_errors_tied_to_the_model_are_model_errors() {
        for text in [
            "401 Invalid API key",
            "API Error: 401 {\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\
             \"message\":\"invalid x-api-key\"}}",
            "403 Forbidden",
            "No API key found for provider anthropic",
            "429 You exceeded your current quota, please check your plan and billing details.",
            "Your credit balance is too low to access the Anthropic API.",
            "404 The model `gpt-9` does not exist or you do not have access to it.",
            "404 {\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":\"model: claude-x\"}}",
            "Unknown model: mock/nope",
            "402 Payment Required",
        ] {
            assert_eq!(
                classify_provider_error(text),
                Some(StopReason::ModelError),
                "{text}"
            );
        }
    }

    #[test]
    fn unrecognized_errors_and_numbers_in_addresses_are_not_classified() {
        for text in [
            "",
            "prompt is too long: 210000 tokens > 200000 maximum",
            "check your inference gateway (127.0.0.1:40123)",
            "listening on :500",
            "version 2.1.429",
            "took 500.5 ms",
        ] {
            assert_eq!(classify_provider_error(text), None, "{text}");
        }
        assert_eq!(
            http_statuses("HTTP/1.1 502 Bad Gateway; 1.500, :429"),
            [502]
        );
        assert_eq!(classify_http_status(529), Some(StopReason::Error));
        assert_eq!(classify_http_status(401), Some(StopReason::ModelError));
        assert_eq!(classify_http_status(400), None);
    }
}
