//! What the readers share: the text of an attempt (its own output, its error, the tail of
//! stderr), short activity texts, and for the agent readers the progress gate, the tolerant
//! parse of a JSON line and the taming of a token count.

use sortie_core::{AttemptOutcome, Usage};

use crate::{Progress, STDERR_FALLBACK_BYTES, STDERR_FALLBACK_LINES};

/// The last lines of a text (core's, which the outcome rules read too).
pub use sortie_core::decide::last_lines;

/// The text of an attempt: its own output, else its error, else the last stderr lines.
pub(crate) fn choose_output(
    text: String,
    has_output: bool,
    outcome: &AttemptOutcome,
    stderr_tail: &str,
) -> String {
    if has_output {
        text
    } else if let Some(e) = &outcome.error {
        e.clone()
    } else {
        last_lines(stderr_tail, STDERR_FALLBACK_LINES, STDERR_FALLBACK_BYTES)
    }
}

/// `error`, followed by the stderr line that names the failure when there is one (core's
/// [`sortie_core::decide::error_line`]: the first error line, else the last line).
pub(crate) fn with_stderr(error: String, stderr_tail: &str) -> String {
    match sortie_core::decide::error_line(stderr_tail) {
        Some(line) => format!("{error}: {}", shorten(line, 200)),
        None => error,
    }
}

/// At most `max` chars of `s`, with an ellipsis when cut.
pub(crate) fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// A one-line, shortened description of a tool call for status displays: `tool: detail`.
pub(crate) fn tool_activity(tool: &str, detail: Option<&str>) -> String {
    match detail.map(|d| d.split_whitespace().collect::<Vec<_>>().join(" ")) {
        Some(d) if !d.is_empty() => shorten(&format!("{tool}: {d}"), 120),
        _ => shorten(tool, 120),
    }
}

/// Reports progress only when usage, side effects or activity changed since the last report:
/// the readers of agent protocols share it so that a chatty stream does not flood the run loop.
#[derive(Debug, Default)]
pub(crate) struct ProgressGate {
    sent: Option<(Usage, bool, Option<String>)>,
}

impl ProgressGate {
    /// The progress to report now, or `None` when nothing changed since the last report.
    pub(crate) fn report(
        &mut self,
        usage: Usage,
        side_effects: bool,
        activity: &Option<String>,
    ) -> Option<Progress> {
        let now = (usage, side_effects, activity.clone());
        if self.sent.as_ref() == Some(&now) {
            return None;
        }
        self.sent = Some(now);
        Some(Progress {
            usage,
            side_effects,
            activity: activity.clone(),
        })
    }
}

/// Parses one JSON line of an agent's stream; a line that does not parse is counted in
/// `parse_errors` (named after `agent` in the debug log) and never stops the reader.
pub(crate) fn parse_line<'a, T: serde::Deserialize<'a>>(
    line: &'a str,
    parse_errors: &mut u64,
    agent: &str,
) -> Option<T> {
    match serde_json::from_str(line) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::debug!("unreadable {agent} event: {e}");
            *parse_errors += 1;
            None
        }
    }
}

/// A token count reported as a JSON number: negative, fractional or absurd values are tamed.
pub(crate) fn count(x: Option<f64>) -> u64 {
    match x {
        Some(v) if v.is_finite() && v > 0.0 => {
            if v >= u64::MAX as f64 {
                u64::MAX
            } else {
                v.round() as u64
            }
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_bounds_lines_and_bytes() {
        assert_eq!(last_lines("a\nb\nc\n", 2, 100), "b\nc");
        assert_eq!(last_lines("a\nb\nc", 5, 100), "a\nb\nc");
        assert_eq!(last_lines("", 5, 100), "");
        let long = format!("head\n{}", "é".repeat(100));
        let t = last_lines(&long, 5, 11);
        assert!(t.len() <= 11 && t.chars().all(|c| c == 'é'), "{t}");
    }
}
