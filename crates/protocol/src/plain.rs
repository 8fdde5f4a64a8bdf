//! The `plain` protocol: any command's stdout is its output.
//!
//! Stdout is the output (the last [`MAX_PLAIN_OUTPUT`] bytes of it are kept, with a note when
//! earlier lines were dropped). Exit 0 is `completed`; a nonzero exit is `failed` with
//! `nonzero_exit`; a signal is `failed` with `unexpected_signal`. A plain command spends nothing:
//! its usage is [`Usage::ZERO`] with a reported cost of 0.
//!
//! Two small extensions let scripts (and the fake agents of the tests) speak to sortie through
//! plain output. Neither line is part of the output text:
//!
//! - `SORTIE_USAGE {"input":1,"output":2,"cache_read":0,"cache_write":0,"cost_usd":0.01,"turns":1}`
//!   sets the attempt's cumulative usage. Every field is optional (also `reasoning` and
//!   `context_tokens`); a missing cost counts as a reported 0. Readings are monotone: the usage
//!   is the field-wise maximum of every reading so far ([`Usage::max`]). A line that does not
//!   parse counts as a parse error.
//! - `SORTIE_ERROR <kind> <message>` with kind `error` (transient: a 429, an overload) or
//!   `model_error` (quota, auth, unknown model) makes the attempt fail with that stop reason
//!   instead of `nonzero_exit`, also when the process exits 0 (the exit code is then reported
//!   as 1). The last such line wins; an unknown kind counts as a parse error and the line stays
//!   in the output.

use std::collections::VecDeque;

use serde::Deserialize;
use sortie_core::{AttemptOutcome, Cost, StopReason, Usage};

use crate::shared::{choose_output, shorten, with_stderr};
use crate::{Exit, Finished, MAX_PLAIN_OUTPUT, Progress, ProtocolReader};

/// The `plain` protocol (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct PlainReader {
    output: OutputTail,
    usage: Option<Usage>,
    error: Option<(StopReason, String)>,
    parse_errors: u64,
}

/// The JSON of a `SORTIE_USAGE` line.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UsageLine {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    reasoning: u64,
    cost_usd: Option<f64>,
    turns: u32,
    context_tokens: u64,
}

impl UsageLine {
    fn usage(&self) -> Usage {
        Usage {
            input: self.input,
            output: self.output,
            cache_read: self.cache_read,
            cache_write: self.cache_write,
            reasoning: self.reasoning,
            cost: self
                .cost_usd
                .map_or(Cost::reported_nanos(0), Cost::from_usd),
            turns: self.turns,
            context_tokens: self.context_tokens,
        }
    }
}

/// The rest of `line` after the directive `word`, when `line` is that directive.
fn directive<'a>(line: &'a str, word: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(word)?;
    (rest.is_empty() || rest.starts_with(char::is_whitespace)).then(|| rest.trim())
}

impl PlainReader {
    fn current_usage(&self) -> Usage {
        self.usage.unwrap_or(Usage::ZERO)
    }
}

impl ProtocolReader for PlainReader {
    /// `SORTIE_USAGE` lines are running totals: the next one covers what was cut.
    fn seed(&mut self, _usage: Usage) {}

    fn line(&mut self, line: &str) -> Option<Progress> {
        if let Some(json) = directive(line, "SORTIE_USAGE") {
            return match serde_json::from_str::<UsageLine>(json) {
                Ok(reading) => {
                    let reading = reading.usage();
                    let usage = match self.usage {
                        Some(prev) => prev.max(&reading),
                        None => reading,
                    };
                    self.usage = Some(usage);
                    Some(Progress {
                        usage,
                        side_effects: false,
                        activity: None,
                    })
                }
                Err(e) => {
                    tracing::debug!("unreadable SORTIE_USAGE line: {e}");
                    self.parse_errors += 1;
                    None
                }
            };
        }
        if let Some(rest) = directive(line, "SORTIE_ERROR") {
            let (kind, message) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            let reason = match kind {
                "error" => Some(StopReason::Error),
                "model_error" => Some(StopReason::ModelError),
                _ => None,
            };
            if let Some(reason) = reason {
                let message = message.trim();
                let message = if message.is_empty() {
                    format!("the agent reported {kind}")
                } else {
                    message.to_owned()
                };
                self.error = Some((reason, message));
                return None;
            }
            self.parse_errors += 1;
        }
        self.output.push(line);
        let activity = line.trim();
        (!activity.is_empty()).then(|| Progress {
            usage: self.current_usage(),
            side_effects: false,
            activity: Some(shorten(activity, 120)),
        })
    }

    fn finish(self: Box<Self>, exit: Exit, stderr_tail: &str) -> Finished {
        let usage = self.current_usage();
        let text = self.output.text();
        let has_output = !text.trim().is_empty();
        let outcome = match (exit, self.error) {
            (Exit::Signal(sig), _) => AttemptOutcome {
                signal: Some(sig),
                ..AttemptOutcome::failed(
                    StopReason::UnexpectedSignal,
                    with_stderr(format!("killed by {exit}"), stderr_tail),
                )
            },
            (Exit::Code(code), Some((reason, message))) => AttemptOutcome {
                exit_code: Some(if code == 0 { 1 } else { code }),
                ..AttemptOutcome::failed(reason, message)
            },
            (Exit::Code(0), None) => AttemptOutcome::completed(),
            (Exit::Code(code), None) => AttemptOutcome {
                exit_code: Some(code),
                ..AttemptOutcome::failed(
                    StopReason::NonzeroExit,
                    with_stderr(format!("exited with code {code}"), stderr_tail),
                )
            },
        };
        let output = choose_output(text, has_output, &outcome, stderr_tail);
        Finished {
            outcome,
            usage,
            output,
            has_output,
        }
    }

    fn parse_errors(&self) -> u64 {
        self.parse_errors
    }
}

/// The last [`MAX_PLAIN_OUTPUT`] bytes of a plain command's stdout, as whole lines.
#[derive(Debug, Default)]
struct OutputTail {
    lines: VecDeque<String>,
    bytes: usize,
    dropped: bool,
}

impl OutputTail {
    fn push(&mut self, line: &str) {
        let line = if line.len() > MAX_PLAIN_OUTPUT {
            self.dropped = true;
            let mut cut = line.len() - MAX_PLAIN_OUTPUT;
            while !line.is_char_boundary(cut) {
                cut += 1;
            }
            &line[cut..]
        } else {
            line
        };
        self.bytes += line.len() + 1;
        self.lines.push_back(line.to_owned());
        while self.bytes > MAX_PLAIN_OUTPUT + 1 && self.lines.len() > 1 {
            if let Some(first) = self.lines.pop_front() {
                self.bytes -= first.len() + 1;
                self.dropped = true;
            }
        }
    }

    fn text(&self) -> String {
        let mut out = String::with_capacity(self.bytes + 64);
        if self.dropped {
            out.push_str("[output truncated: only the last 1 MiB is kept]\n");
        }
        for (i, line) in self.lines.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str(line);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use sortie_core::{AttemptStatus, Phase, Protocol};

    use super::*;
    use crate::reader_for;

    fn run(lines: &[&str], exit: Exit, stderr: &str) -> (Finished, u64) {
        let mut r = reader_for(Protocol::Plain);
        for l in lines {
            r.line(l);
        }
        let errors = r.parse_errors();
        (r.finish(exit, stderr), errors)
    }

    #[test]
    fn plain_exit_zero_is_completed_with_stdout_as_output() {
        let (f, errors) = run(&["hello", "", "world"], Exit::Code(0), "noise");
        assert_eq!(f.outcome, AttemptOutcome::completed());
        assert_eq!(f.output, "hello\n\nworld");
        assert!(f.has_output);
        assert_eq!(f.usage, Usage::ZERO);
        assert!(f.usage.cost.is_complete(), "a plain command reports cost 0");
        assert_eq!(errors, 0);
    }

    #[test]
    fn plain_nonzero_exit_is_failed_and_names_the_last_stderr_line() {
        let (f, _) = run(&[], Exit::Code(3), "warning\nfatal: no such file\n");
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(f.outcome.stop_reason, StopReason::NonzeroExit);
        assert_eq!(f.outcome.exit_code, Some(3));
        assert_eq!(
            f.outcome.error.as_deref(),
            Some("exited with code 3: fatal: no such file")
        );
        assert_eq!(f.output, "exited with code 3: fatal: no such file");
        assert!(!f.has_output);
    }

    #[test]
    fn plain_signal_is_unexpected_unless_sortie_stopped_it() {
        let (f, _) = run(&["partial"], Exit::Signal(9), "");
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(f.outcome.stop_reason, StopReason::UnexpectedSignal);
        assert_eq!(f.outcome.signal, Some(9));
        assert_eq!(f.outcome.exit_code, None);
        assert_eq!(
            f.outcome.error.as_deref(),
            Some("killed by signal 9 (SIGKILL)")
        );

        let t = f.clone().stopped_by(StopReason::Timeout);
        assert_eq!(t.outcome.stop_reason, StopReason::Timeout);
        assert_eq!(t.outcome.phase, Some(Phase::Running));
        assert_eq!(t.outcome.status, AttemptStatus::Failed);
        assert_eq!(t.output, "partial", "the output is kept");

        let b = f.stopped_by(StopReason::Budget);
        assert_eq!(b.outcome.status, AttemptStatus::Partial);
        assert_eq!(b.outcome.phase, None);
    }

    #[test]
    fn a_stopped_attempt_without_output_says_why() {
        let (f, _) = run(&[], Exit::Code(0), "");
        let c = f.stopped_by(StopReason::Cancelled);
        assert_eq!(c.outcome.status, AttemptStatus::Failed);
        assert_eq!(c.outcome.stop_reason, StopReason::Cancelled);
        assert_eq!(
            c.outcome.exit_code,
            Some(1),
            "a failed exit 0 is reported as 1"
        );
        assert_eq!(c.output, "stopped by sortie (cancelled)");
        let (f, _) = run(&[], Exit::Code(0), "");
        assert_eq!(
            f.stopped_by(StopReason::Budget).outcome.status,
            AttemptStatus::Failed,
            "a budget stop without output is not partial"
        );
    }

    #[test]
    fn plain_completed_without_stdout_falls_back_to_stderr_lines() {
        let stderr: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let (f, _) = run(&[], Exit::Code(0), &stderr);
        assert_eq!(f.outcome.status, AttemptStatus::Completed);
        assert!(f.output.starts_with("line 11\n"), "{}", f.output);
        assert!(f.output.ends_with("line 30"));
        let (f, _) = run(&[], Exit::Code(0), "");
        assert_eq!(f.output, "");
    }

    #[test]
    fn sortie_usage_lines_set_monotone_usage_and_are_not_output() {
        let mut r = reader_for(Protocol::Plain);
        let p = r
            .line(r#"SORTIE_USAGE {"input":100,"output":20,"cost_usd":0.5,"turns":1}"#)
            .expect("progress");
        assert_eq!((p.usage.input, p.usage.turns), (100, 1));
        assert_eq!(p.usage.cost.nanos, 500_000_000);
        r.line("the answer");
        // A lagging reading never makes a counter go backwards.
        let p = r
            .line(r#"SORTIE_USAGE {"input":50,"output":40,"cache_read":7}"#)
            .expect("progress");
        assert_eq!(
            (p.usage.input, p.usage.output, p.usage.cache_read),
            (100, 40, 7)
        );
        assert_eq!(p.usage.cost.nanos, 500_000_000);
        assert!(r.line("SORTIE_USAGE {not json").is_none());
        assert!(r.line("SORTIE_USAGE").is_none());
        assert_eq!(r.parse_errors(), 2);
        let f = r.finish(Exit::Code(0), "");
        assert_eq!(f.output, "the answer");
        assert_eq!(f.usage.output, 40);
        assert_eq!(f.outcome.status, AttemptStatus::Completed);
    }

    #[test]
    fn sortie_error_lines_choose_the_stop_reason() {
        let (f, _) = run(
            &["SORTIE_ERROR error 429 rate limit exceeded"],
            Exit::Code(2),
            "",
        );
        assert_eq!(f.outcome.stop_reason, StopReason::Error);
        assert_eq!(f.outcome.exit_code, Some(2));
        assert_eq!(f.outcome.error.as_deref(), Some("429 rate limit exceeded"));
        assert_eq!(f.output, "429 rate limit exceeded");

        let (f, _) = run(
            &["some text", "SORTIE_ERROR model_error quota exceeded"],
            Exit::Code(0),
            "",
        );
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(f.outcome.stop_reason, StopReason::ModelError);
        assert_eq!(f.outcome.exit_code, Some(1), "exit 0 is reported as 1");
        assert_eq!(f.output, "some text");

        let (f, errors) = run(&["SORTIE_ERROR bogus nope"], Exit::Code(0), "");
        assert_eq!(errors, 1);
        assert_eq!(f.outcome.status, AttemptStatus::Completed);
        assert_eq!(f.output, "SORTIE_ERROR bogus nope");

        let (f, _) = run(&["SORTIE_ERRORS are fine"], Exit::Code(0), "");
        assert_eq!(f.output, "SORTIE_ERRORS are fine");
    }

    #[test]
    fn plain_lines_report_activity() {
        let mut r = reader_for(Protocol::Plain);
        assert!(r.line("   ").is_none());
        let p = r.line("  compiling foo  ").expect("progress");
        assert_eq!(p.activity.as_deref(), Some("compiling foo"));
        assert_eq!(p.usage, Usage::ZERO);
    }

    #[test]
    fn plain_output_keeps_the_last_mebibyte() {
        let mut r = reader_for(Protocol::Plain);
        let line = "x".repeat(1000);
        for _ in 0..2000 {
            r.line(&line);
        }
        r.line("the end");
        let f = r.finish(Exit::Code(0), "");
        assert!(f.output.starts_with("[output truncated"));
        assert!(f.output.ends_with("\nthe end"));
        assert!(f.output.len() <= MAX_PLAIN_OUTPUT + 100);
    }
}
