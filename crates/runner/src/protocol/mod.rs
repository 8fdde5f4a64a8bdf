//! Protocol readers: they turn an attempt's stdout lines into progress (usage, activity, side
//! effects) and, once the process has ended, into the attempt's outcome, usage and text.
//!
//! A reader sees every stdout line (without its newline) through [`ProtocolReader::line`], then
//! [`ProtocolReader::finish`] with the exit and the tail of stderr. A reader cannot know whether
//! sortie sent the signal that ended a process, so it calls every signal unexpected; when
//! sortie stopped the attempt itself, the caller applies [`Finished::stopped_by`].
//!
//! # The `plain` protocol
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
//!
//! # Agent protocols
//!
//! [`pi`] reads `pi --mode json`, [`claude`] reads `claude -p --output-format stream-json
//! --verbose`, [`codex`] reads `codex exec --json`. Each reduces a stream to an agent run
//! summary that one set of rules classifies (SEMANTICS.md, "Classifying an attempt"); the text
//! of a provider error is classified by [`classify_provider_error`]. docs/agents.md describes
//! the streams and the edge cases.

use std::collections::VecDeque;
use std::fmt;

use serde::Deserialize;
use sortie_core::{AttemptOutcome, AttemptStatus, Cost, Phase, Protocol, StopReason, Usage};

pub mod claude;
pub mod codex;
pub mod pi;

/// How much of a plain command's stdout is kept as its output text.
pub const MAX_PLAIN_OUTPUT: usize = 1 << 20;
/// How many stderr lines the output falls back to when there is neither text nor error.
pub const STDERR_FALLBACK_LINES: usize = 20;
/// How many bytes of stderr the output falls back to, at most.
pub const STDERR_FALLBACK_BYTES: usize = 4096;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal (this number) ended it.
    Signal(i32),
}

impl Exit {
    /// The exit code, when it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            Exit::Code(c) => Some(c),
            Exit::Signal(_) => None,
        }
    }

    /// The signal number, when a signal ended it.
    pub fn signal(self) -> Option<i32> {
        match self {
            Exit::Code(_) => None,
            Exit::Signal(s) => Some(s),
        }
    }

    /// True for exit code 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => match nix::sys::signal::Signal::try_from(s) {
                Ok(sig) => write!(f, "signal {s} ({})", sig.as_str()),
                Err(_) => write!(f, "signal {s}"),
            },
        }
    }
}

/// What a stdout line told about the running attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The attempt's usage so far (cumulative, never going backwards).
    pub usage: Usage,
    /// True once the agent has run a side-effecting tool (bash, write, edit).
    pub side_effects: bool,
    /// A short description of what the agent is doing, for status displays.
    pub activity: Option<String>,
}

/// The end of an attempt as its protocol reader saw it.
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
    /// useful output is `partial` (SEMANTICS.md: "budget breach: partial, output kept");
    /// every other stop is `failed`, which core turns into the matching terminal state
    /// (timeout, cancelled, or a retry for stalled and interrupted). Call it only when a stop
    /// signal was actually delivered (`Stopper::sent_reason`): a process that ended on its own
    /// first keeps its own outcome.
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

/// Reads one attempt's stdout in a given protocol.
///
/// Implementations are fed every stdout line in order, then finished once with the exit.
/// They must never panic on any input: a line they cannot read is counted in
/// [`ProtocolReader::parse_errors`].
pub trait ProtocolReader: Send {
    /// Reads one stdout line (without its newline). Returns progress when the line tells
    /// something about the attempt (usage, activity, side effects).
    fn line(&mut self, line: &str) -> Option<Progress>;

    /// Classifies the attempt from everything read, its exit and the tail of its stderr.
    fn finish(self: Box<Self>, exit: Exit, stderr_tail: &str) -> Finished;

    /// How many lines could not be parsed so far.
    fn parse_errors(&self) -> u64 {
        0
    }

    /// Where the agent's run stands, as far as the stream tells. Only agents driven over stdin
    /// need it (they run until their stdin closes, so sortie closes it once the run ended);
    /// readers that cannot tell say [`RunPhase::Unknown`].
    fn run_phase(&self) -> RunPhase {
        RunPhase::Unknown
    }
}

/// Where an agent's run stands (see [`ProtocolReader::run_phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunPhase {
    /// The reader cannot tell.
    Unknown,
    /// The agent is working: a turn is in progress, or its last message called tools.
    Working,
    /// Its last message was a final answer; the end of the run has not been seen yet.
    Answered,
    /// The run ended (for now: an agent may still retry a failed call by itself).
    Ended {
        /// Whether its last message failed.
        failed: bool,
    },
}

/// The reader for a protocol.
pub fn reader_for(protocol: Protocol) -> Box<dyn ProtocolReader> {
    match protocol {
        Protocol::Plain => Box::new(PlainReader::default()),
        Protocol::PiJson | Protocol::PiRpc => Box::new(pi::PiReader::default()),
        Protocol::ClaudeStreamJson => Box::new(claude::ClaudeReader::default()),
        Protocol::CodexJson => Box::new(codex::CodexReader::default()),
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

/// The `plain` protocol (see the module doc).
#[derive(Debug, Default)]
struct PlainReader {
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

/// The text of an attempt: its own output, else its error, else the last stderr lines.
fn choose_output(
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

/// `error`, followed by the last non-blank stderr line when there is one.
fn with_stderr(error: String, stderr_tail: &str) -> String {
    match stderr_tail
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
    {
        Some(last) => format!("{error}: {}", shorten(last, 200)),
        None => error,
    }
}

/// At most `max` chars of `s`, with an ellipsis when cut.
fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
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

// ---------------------------------------------------------------------------------------------
// What the agent protocols (pi-json, claude-stream-json, codex-json) share: the classification of
// a run and of a provider error text.

/// What an agent reader learned from a whole stream, to be classified by [`classify_agent`].
#[derive(Debug, Clone)]
struct AgentSummary {
    /// The agent's name, for error texts.
    agent: &'static str,
    /// True once the stream reached its end of run after the last message (pi: an `agent_end`
    /// not followed by a new agent attempt; Claude Code: the `result` line).
    finished: bool,
    /// True when at least one line of the protocol was read.
    started: bool,
    /// The text of the last assistant message, when it did not fail (possibly partial).
    answer: String,
    /// The last message failed.
    failure: Option<AgentFailure>,
    /// The protocol finished, but the answer is known to be cut short: why.
    cut_short: Option<String>,
    /// The attempt's usage.
    usage: Usage,
    /// True when a side-effecting tool ran.
    side_effects: bool,
}

/// The failure of an agent's last message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AgentFailure {
    /// The stop reason, when the error was recognized ([`classify_provider_error`]).
    reason: Option<StopReason>,
    /// The error text.
    message: String,
}

impl AgentFailure {
    /// A failure whose stop reason comes from its text.
    fn from_text(message: String) -> AgentFailure {
        AgentFailure {
            reason: classify_provider_error(&message),
            message,
        }
    }
}

/// Classifies an agent run (SEMANTICS.md, "Classifying an attempt").
///
/// Completed: exit 0, no signal, the last message did not fail, the protocol finished and the
/// answer is not known to be cut short. Partial: there is an answer, the last message did not
/// fail, but the protocol is incomplete (or the answer cut short) or a signal ended the process.
/// Otherwise failed, with exit 0 reported as 1. The stop reason of a failed message comes from
/// its error text; an unrecognized error is `nonzero_exit` when the protocol finished (a real
/// failure: retrying will not help) and `protocol_error` when it did not.
fn classify_agent(run: AgentSummary, exit: Exit, stderr_tail: &str) -> Finished {
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
    nix::sys::signal::Signal::try_from(code - 128)
        .ok()
        .map(|s| s.as_str())
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

/// A one-line, shortened description of a tool call for status displays: `tool: detail`.
fn tool_activity(tool: &str, detail: Option<&str>) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn last_lines_bounds_lines_and_bytes() {
        assert_eq!(last_lines("a\nb\nc\n", 2, 100), "b\nc");
        assert_eq!(last_lines("a\nb\nc", 5, 100), "a\nb\nc");
        assert_eq!(last_lines("", 5, 100), "");
        let long = format!("head\n{}", "é".repeat(100));
        let t = last_lines(&long, 5, 11);
        assert!(t.len() <= 11 && t.chars().all(|c| c == 'é'), "{t}");
    }

    #[test]
    fn exit_displays_signal_names() {
        assert_eq!(Exit::Code(2).to_string(), "exit code 2");
        assert_eq!(Exit::Signal(15).to_string(), "signal 15 (SIGTERM)");
        assert_eq!(Exit::Signal(99).to_string(), "signal 99");
    }
}
