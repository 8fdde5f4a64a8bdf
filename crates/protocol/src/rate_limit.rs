//! Rate limits in a provider's error text (issue 14): whether a transient failure is the
//! provider refusing the request for its rate limit, and the wait it asked for.
//!
//! A rate limit is a transient error (`classify_provider_error` says `error`) whose text has a
//! 429 or 529 status, or says `rate limit`, `too many requests`, `overloaded_error`
//! (Anthropic's), `resource_exhausted` (Google's) or `throttl...`; a 503 that says it is
//! overloaded is an ordinary transient error. A quota or billing error is a model error, never a rate
//! limit. The wait is read where the agents print it: `retry-after: 12` (the header, seconds),
//! `retry-after-ms: 500`, `retry_after: 2`, `retry after 3s`, `try again in 1.5s` / `in 20ms` /
//! `in 2m` (OpenAI's message), `retryDelay": "7s"` (Google's); a number without a unit is in
//! seconds (milliseconds after a `-ms`/`_ms` key). A wait above [`MAX_RETRY_AFTER`] is cut to it.

use std::time::Duration;

use sortie_core::{AttemptOutcome, AttemptStatus, StopReason};

use crate::classify::classify_provider_error;

/// The longest wait a provider's retry-after may impose.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// A rate limit in `text`, with the wait it asked for (None inside: it named none). None: not
/// a rate limit.
pub fn rate_limit(text: &str) -> Option<Option<Duration>> {
    if classify_provider_error(text) != Some(StopReason::Error) {
        return None;
    }
    const WORDS: &[&str] = &[
        "rate limit",
        "rate_limit",
        "ratelimit",
        "rate-limit",
        "too many requests",
        "overloaded_error",
        "resource_exhausted",
        "resource exhausted",
        "throttl",
    ];
    let t = text.to_ascii_lowercase();
    let status = has_status(&t, "429") || has_status(&t, "529");
    if !status && !WORDS.iter().any(|w| t.contains(w)) {
        return None;
    }
    Some(retry_after(&t))
}

/// Marks a failed attempt whose error (or `text`: its stderr tail and last output lines) is a
/// rate limit: `rate_limited`, with the retry-after it asked for.
pub fn mark_rate_limit(outcome: &mut AttemptOutcome, text: &str) {
    if outcome.status != AttemptStatus::Failed || outcome.stop_reason != StopReason::Error {
        return;
    }
    let error = outcome.error.as_deref().unwrap_or_default();
    let found = match rate_limit(error) {
        // The wait may be printed apart from the error (stderr, a later line).
        Some(None) => Some(retry_after(&text.to_ascii_lowercase())),
        Some(wait) => Some(wait),
        None => rate_limit(&format!("{error}\n{text}")),
    };
    if let Some(wait) = found {
        outcome.rate_limited = true;
        outcome.retry_after_ms = wait.map(|d| d.as_millis() as u64);
    }
}

/// Whether `t` holds `code` as a whole number.
fn has_status(t: &str, code: &str) -> bool {
    let b = t.as_bytes();
    t.match_indices(code).any(|(i, _)| {
        let before = i == 0 || !b[i - 1].is_ascii_digit();
        let after = b.get(i + code.len()).is_none_or(|c| !c.is_ascii_digit());
        before && after
    })
}

/// The wait a lowercased error text asks for.
fn retry_after(t: &str) -> Option<Duration> {
    // (key, unit when none is written: true = milliseconds)
    const KEYS: &[(&str, bool)] = &[
        ("retry-after-ms", true),
        ("retry_after_ms", true),
        ("retry-after", false),
        ("retry_after", false),
        ("retryafter", false),
        ("retry after", false),
        ("retrydelay", false),
        ("retry in", false),
        ("try again in", false),
        ("try again after", false),
    ];
    for (key, ms) in KEYS {
        for (i, _) in t.match_indices(key) {
            let rest = &t[i + key.len()..];
            let rest = rest.trim_start_matches(|c: char| {
                c.is_whitespace() || matches!(c, ':' | '=' | '"' | '\'')
            });
            if let Some(d) = number_with_unit(rest, *ms) {
                return Some(d.min(MAX_RETRY_AFTER));
            }
        }
    }
    None
}

/// `1.5s`, `20ms`, `2m`, `3 seconds`, `12` at the start of `s`.
fn number_with_unit(s: &str, default_ms: bool) -> Option<Duration> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let value: f64 = s.get(..end)?.trim_end_matches('.').parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    let unit = s[end..].trim_start();
    let word: String = unit.chars().take_while(char::is_ascii_alphabetic).collect();
    let secs = match word.as_str() {
        "ms" | "msec" | "millisecond" | "milliseconds" => value / 1000.0,
        "s" | "sec" | "secs" | "second" | "seconds" => value,
        "m" | "min" | "mins" | "minute" | "minutes" => value * 60.0,
        "h" | "hour" | "hours" => value * 3600.0,
        _ if default_ms => value / 1000.0,
        _ => value,
    };
    Some(Duration::from_secs_f64(
        secs.min(MAX_RETRY_AFTER.as_secs_f64()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_and_their_waits_are_read_where_agents_print_them() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        for (text, want) in [
            // pi's errorMessage and Claude Code's result, as recorded.
            ("429 mock: rate limit exceeded (429)", Some(None)),
            (
                "API Error: Request rejected (429) · mock: rate limit exceeded (429)",
                Some(None),
            ),
            // OpenAI's message, Anthropic's overload, Google's retryDelay, a header.
            (
                "429 Rate limit reached for gpt-4o. Please try again in 1.5s.",
                Some(Some(ms(1500))),
            ),
            ("Rate limit: try again in 20ms", Some(Some(ms(20)))),
            (
                "529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}",
                Some(None),
            ),
            (
                "429 RESOURCE_EXHAUSTED \"retryDelay\": \"7s\"",
                Some(Some(s(7))),
            ),
            (
                "HTTP 429 Too Many Requests; retry-after: 12",
                Some(Some(s(12))),
            ),
            ("429; retry-after-ms: 250", Some(Some(ms(250)))),
            ("rate limited, retry after 2 minutes", Some(Some(s(120)))),
            ("429 retry-after: 999999", Some(Some(MAX_RETRY_AFTER))),
            // Not rate limits: other transient errors, quota, ports.
            ("500 mock: internal server error", None),
            ("503 Service Unavailable: upstream overloaded", None),
            ("connect ECONNREFUSED 127.0.0.1:4290", None),
            ("429 You exceeded your current quota", None),
            ("syntax error", None),
        ] {
            assert_eq!(rate_limit(text), want, "{text}");
        }
    }

    #[test]
    fn only_a_transient_failure_is_marked() {
        let mut o = AttemptOutcome::failed(StopReason::Error, "429 too many requests");
        mark_rate_limit(&mut o, "try again in 3s");
        assert!(o.rate_limited);
        assert_eq!(o.retry_after_ms, Some(3000));
        let mut o = AttemptOutcome::failed(StopReason::NonzeroExit, "429 too many requests");
        mark_rate_limit(&mut o, "");
        assert!(
            !o.rate_limited,
            "a real failure (transient_on did not match)"
        );
        let mut o = AttemptOutcome::failed(StopReason::Error, "exited with code 22");
        mark_rate_limit(&mut o, "curl: (22) The requested URL returned error: 429");
        assert!(o.rate_limited, "found in the stderr");
    }
}
