//! The `pi-json` protocol: the event stream of `pi --mode json` (pi-coding-agent 0.73).
//!
//! One JSON object per line, each with a `type`. What the reader takes from them:
//!
//! - `message_end` of an assistant message: one LLM call, so one turn. Its `usage` is for that
//!   call alone and is summed (`cost.total` too); `context_tokens` is the latest call's
//!   `totalTokens`. Its text items make the answer, its `stopReason` (`error`, `aborted`) and
//!   `errorMessage` say whether it failed. Only the last assistant message decides the outcome.
//! - `message_update`: the streaming deltas of the message in progress. These lines carry the
//!   whole partial message twice and grow quadratically with the answer, so they are recognized
//!   by their prefix and read without building the message; only the text delta is kept, so that
//!   an attempt cut short in the middle of an answer still has its text.
//! - `tool_execution_start`: the tool being run is the activity; `bash`, `write` and `edit` are
//!   side effects.
//! - `agent_end` ends the run, but pi retries failed calls itself (`auto_retry_start`, then a
//!   new `agent_start`): the run is finished only when an `agent_end` comes after the last
//!   assistant message with no new agent attempt after it. The exit code says little: pi exits 0
//!   after a failed call.
//! - A "successful" answer with all-zero usage is how pi reports a stream the server closed
//!   early: it is cut short, never completed.
//!
//! When pi reports a cost of 0 for a call that used tokens, the model has no price in pi's
//! configuration: that cost counts as unreported, not as free.

use std::borrow::Cow;

use serde::Deserialize;
use sortie_core::{Cost, StopReason, Usage};

use crate::classify::{AgentFailure, AgentSummary, classify_agent};
use crate::shared::{ProgressGate, count, parse_line, shorten, tool_activity};
use crate::{Exit, Finished, MAX_PLAIN_OUTPUT, Progress, ProtocolReader, RunPhase};

/// pi's tools that change the world.
const SIDE_EFFECT_TOOLS: &[&str] = &["bash", "write", "edit"];

/// The prefix of a `message_update` line as pi prints it (`type` first).
const UPDATE_PREFIX: &str = r#"{"type":"message_update""#;

/// The prefix of an `agent_end` line as pi prints it. Its `messages` repeat the whole run, the
/// prompt included, so a long prompt makes it longer than a line sortie keeps: cut to
/// [`LINE_LIMIT_BYTES`](crate::LINE_LIMIT_BYTES), it no longer parses, but its beginning still
/// says the run ended (nothing else of it is read). A shorter cut line (a process that died
/// while writing it) is no end of the run.
const AGENT_END_PREFIX: &str = r#"{"type":"agent_end""#;

/// Reads `pi --mode json` (see the module doc).
#[derive(Debug, Default)]
pub struct PiReader {
    /// The sum over the assistant messages so far.
    usage: Usage,
    side_effects: bool,
    activity: Option<String>,
    /// What the last progress reported.
    gate: ProgressGate,
    /// At least one event was read.
    started: bool,
    /// An `agent_end` came after the last assistant message, with no new agent attempt since.
    finished: bool,
    /// The last assistant message that ended.
    last: Option<Assistant>,
    /// The text of an assistant message that started but has not ended yet.
    streaming: Option<Streaming>,
    /// The final error of pi's own retries (`auto_retry_end` with `success: false`).
    retry_error: Option<String>,
    /// RPC mode: a command pi refused (`response` with `success: false`).
    refused: Option<String>,
    /// Calls of tools pi was not given (`--tools`): pi answers them `Tool NAME not found`.
    denials: Vec<sortie_core::Denial>,
    parse_errors: u64,
}

/// An assistant message that ended.
#[derive(Debug)]
struct Assistant {
    stop_reason: String,
    error: Option<String>,
    text: String,
    /// Its usage reported no token at all.
    zero_usage: bool,
}

/// The text deltas of the assistant message in progress.
#[derive(Debug, Default)]
struct Streaming {
    text: String,
    block: Option<u64>,
}

/// The `type` of a line, without reading the rest (skipped, never built).
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
}

/// A `message_update` line: only the event's kind and delta (the partial messages are skipped).
#[derive(Deserialize)]
struct Update<'a> {
    #[serde(rename = "assistantMessageEvent", borrow, default)]
    event: Option<UpdateEvent<'a>>,
}

#[derive(Deserialize)]
struct UpdateEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(rename = "contentIndex", default)]
    content_index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
}

/// A `message_start` / `message_end` line.
#[derive(Deserialize)]
struct MessageLine {
    #[serde(default)]
    message: Option<Message>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    usage: Option<PiUsage>,
    #[serde(rename = "stopReason", default)]
    stop_reason: Option<String>,
    #[serde(rename = "errorMessage", default)]
    error_message: Option<String>,
}

/// A message's content: a list of items (assistant), or a plain string (tolerated).
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Items(Vec<ContentItem>),
    // Read only so that such a line is not a parse error.
    Text(#[allow(dead_code, reason = "only accepted, never used")] String),
}

#[derive(Deserialize)]
struct ContentItem {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
}

/// `message.usage`: numbers read as f64 so that a `12.0` does not lose the message.
#[derive(Deserialize, Default)]
#[serde(default)]
struct PiUsage {
    input: Option<f64>,
    output: Option<f64>,
    #[serde(rename = "cacheRead")]
    cache_read: Option<f64>,
    #[serde(rename = "cacheWrite")]
    cache_write: Option<f64>,
    #[serde(rename = "totalTokens")]
    total_tokens: Option<f64>,
    cost: Option<PiCost>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PiCost {
    total: Option<f64>,
}

/// A `tool_execution_end` line.
#[derive(Deserialize)]
struct ToolEnd {
    #[serde(rename = "toolName", default)]
    tool_name: Option<String>,
    #[serde(rename = "isError", default)]
    is_error: Option<bool>,
    #[serde(default)]
    result: Option<ToolResult>,
}

/// A tool's result: its text parts.
#[derive(Deserialize, Default)]
struct ToolResult {
    #[serde(default)]
    content: Vec<serde_json::Value>,
}

/// A `tool_execution_start` line.
#[derive(Deserialize)]
struct ToolStart {
    #[serde(rename = "toolName", default)]
    tool_name: Option<String>,
    #[serde(default)]
    args: Option<ToolArgs>,
}

/// The arguments of a tool call that describe it best (the rest is skipped).
#[derive(Deserialize, Default)]
#[serde(default)]
struct ToolArgs {
    command: Option<String>,
    path: Option<String>,
    file_path: Option<String>,
    pattern: Option<String>,
}

impl ToolArgs {
    fn detail(&self) -> Option<&str> {
        [&self.command, &self.path, &self.file_path, &self.pattern]
            .into_iter()
            .find_map(|a| a.as_deref())
    }
}

/// An RPC `response` line.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Response {
    command: Option<String>,
    success: Option<bool>,
    error: Option<String>,
}

/// An `auto_retry_start` / `auto_retry_end` line.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Retry {
    attempt: Option<u64>,
    #[serde(rename = "maxAttempts")]
    max_attempts: Option<u64>,
    #[serde(rename = "delayMs")]
    delay_ms: Option<u64>,
    #[serde(rename = "errorMessage")]
    error_message: Option<String>,
    success: Option<bool>,
    #[serde(rename = "finalError")]
    final_error: Option<String>,
}

impl PiReader {
    /// Progress, when the line changed something worth reporting.
    fn progress(&mut self) -> Option<Progress> {
        self.gate
            .report(self.usage, self.side_effects, &self.activity)
    }

    fn parse<'a, T: Deserialize<'a>>(&mut self, line: &'a str) -> Option<T> {
        parse_line(line, &mut self.parse_errors, "pi")
    }

    fn update(&mut self, line: &str) {
        let Some(update) = self.parse::<Update<'_>>(line) else {
            return;
        };
        let Some(event) = update.event else { return };
        let kind = event.kind.as_deref().unwrap_or("");
        if kind.starts_with("text_") {
            self.activity = Some("writing".into());
        } else if kind.starts_with("thinking_") {
            self.activity = Some("thinking".into());
        } else if kind.starts_with("toolcall_") {
            self.activity = Some("preparing a tool call".into());
        }
        if kind == "text_delta"
            && let Some(delta) = event.delta
        {
            let s = self.streaming.get_or_insert_with(Streaming::default);
            if s.block.is_some() && s.block != event.content_index && !s.text.is_empty() {
                s.text.push('\n');
            }
            s.block = event.content_index;
            if s.text.len() + delta.len() <= MAX_PLAIN_OUTPUT {
                s.text.push_str(&delta);
            }
        }
    }

    fn message(&mut self, line: &str, end: bool) {
        let Some(MessageLine { message: Some(m) }) = self.parse::<MessageLine>(line) else {
            return;
        };
        if m.role.as_deref() != Some("assistant") {
            return;
        }
        if !end {
            self.streaming = Some(Streaming::default());
            self.activity = Some("waiting for the model".into());
            return;
        }
        self.streaming = None;
        let text = match &m.content {
            Some(Content::Items(items)) => items
                .iter()
                .filter(|i| i.kind.as_deref() == Some("text"))
                .filter_map(|i| i.text.as_deref())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        let mut call = Usage {
            cost: Cost::unreported(),
            turns: 1,
            ..Usage::ZERO
        };
        if let Some(u) = &m.usage {
            call.input = count(u.input);
            call.output = count(u.output);
            call.cache_read = count(u.cache_read);
            call.cache_write = count(u.cache_write);
            let total = match count(u.total_tokens) {
                0 => call.tokens(),
                t => t,
            };
            call.context_tokens = total;
            call.cost = match u.cost.as_ref().and_then(|c| c.total) {
                Some(usd) if usd > 0.0 || total == 0 => Cost::from_usd(usd),
                // No cost, or 0 for a call that used tokens: pi has no price for the model.
                _ => Cost::unreported(),
            };
        }
        self.usage = self.usage.plus(&call);
        self.last = Some(Assistant {
            stop_reason: m.stop_reason.unwrap_or_default(),
            error: m.error_message,
            text,
            zero_usage: call.tokens() == 0 && call.context_tokens == 0,
        });
        self.finished = false;
    }

    fn tool_start(&mut self, line: &str) {
        let Some(t) = self.parse::<ToolStart>(line) else {
            return;
        };
        let name = t.tool_name.unwrap_or_else(|| "tool".into());
        if SIDE_EFFECT_TOOLS
            .iter()
            .any(|s| s.eq_ignore_ascii_case(&name))
        {
            self.side_effects = true;
        }
        let detail = t.args.as_ref().and_then(ToolArgs::detail);
        self.activity = Some(tool_activity(&name, detail));
    }

    /// A tool call that failed because pi was not given the tool (its `--tools` allow-list,
    /// how sortie's permissions reach pi) is a denial.
    fn tool_end(&mut self, line: &str) {
        let Some(t) = self.parse::<ToolEnd>(line) else {
            return;
        };
        let (Some(name), Some(true)) = (t.tool_name, t.is_error) else {
            return;
        };
        let not_found = format!("Tool {name} not found");
        let denied = t.result.iter().flat_map(|r| &r.content).any(|c| {
            c.get("text")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|text| text.trim() == not_found)
        });
        if denied {
            sortie_core::Denial::add(&mut self.denials, &name);
        }
    }

    fn retry(&mut self, line: &str, start: bool) {
        let Some(r) = self.parse::<Retry>(line) else {
            return;
        };
        if start {
            self.finished = false;
            let n = match (r.attempt, r.max_attempts) {
                (Some(a), Some(m)) => format!(" (retry {a}/{m})"),
                _ => String::new(),
            };
            let wait = r
                .delay_ms
                .map(|ms| format!(" in {}s", ms.div_ceil(1000)))
                .unwrap_or_default();
            let why = r.error_message.as_deref().unwrap_or("an error");
            self.activity = Some(shorten(&format!("retrying{wait}{n} after: {why}"), 120));
        } else if r.success == Some(false) {
            self.retry_error = r.final_error;
        }
    }

    /// What the stream amounts to, for [`classify_agent`].
    fn summary(self) -> AgentSummary {
        let mut run = AgentSummary {
            agent: "pi",
            finished: self.finished,
            started: self.started,
            answer: String::new(),
            failure: None,
            cut_short: None,
            usage: self.usage,
            side_effects: self.side_effects,
            denials: self.denials,
        };
        if self.streaming.is_some() || self.last.is_none() {
            // A call in progress (or none seen at all) may have cost something: unknown.
            run.usage.cost = run.usage.cost.plus(Cost::unreported());
        }
        if let Some(s) = self.streaming {
            // An answer that started but never ended: whatever text came so far.
            run.answer = s.text;
            run.finished = false;
        } else if let Some(last) = self.last {
            match last.stop_reason.as_str() {
                "error" | "aborted" => {
                    let message = last
                        .error
                        .or(self.retry_error)
                        .filter(|e| !e.trim().is_empty())
                        .unwrap_or_else(|| {
                            format!("the model call ended with {}", last.stop_reason)
                        });
                    let mut failure = AgentFailure::from_text(message);
                    if last.stop_reason == "aborted" && failure.reason.is_none() {
                        failure.reason = Some(StopReason::Error);
                    }
                    run.failure = Some(failure);
                }
                _ => {
                    if last.zero_usage {
                        run.cut_short = Some(
                            "the answer was cut short: pi reported no usage for it (a stream \
                             closed early)"
                                .into(),
                        );
                    }
                    run.answer = last.text;
                }
            }
        } else if let Some(refused) = self.refused {
            run.failure = Some(AgentFailure::from_text(refused));
        } else if self.finished {
            run.cut_short = Some("pi ended its run without an assistant message".into());
        }
        run
    }
}

impl ProtocolReader for PiReader {
    /// pi reports each call's usage: the cut calls are added to the sum.
    fn seed(&mut self, usage: Usage) {
        self.usage = self.usage.plus(&Usage {
            context_tokens: 0,
            ..usage
        });
    }

    fn line(&mut self, line: &str) -> Option<Progress> {
        let line = line.trim();
        if line.is_empty() {
            return None;
        }
        if line.starts_with(UPDATE_PREFIX) {
            self.started = true;
            self.update(line);
            return self.progress();
        }
        // A cut line may end in a replacement character (a cut UTF-8 sequence) and was trimmed.
        let cut_by_the_limit = line.len() + 8 >= crate::LINE_LIMIT_BYTES;
        if cut_by_the_limit
            && let Some(rest) = line.strip_prefix(AGENT_END_PREFIX)
            && rest.starts_with(',')
        {
            self.started = true;
            self.finished = true;
            return self.progress();
        }
        let kind = match serde_json::from_str::<Peek<'_>>(line) {
            Ok(Peek { kind: Some(kind) }) => kind,
            Ok(Peek { kind: None }) | Err(_) => {
                self.parse_errors += 1;
                return None;
            }
        };
        self.started = true;
        match kind.as_ref() {
            "message_update" => self.update(line),
            "message_start" => self.message(line, false),
            "message_end" => self.message(line, true),
            "tool_execution_start" => self.tool_start(line),
            "tool_execution_end" => self.tool_end(line),
            "agent_start" => self.finished = false,
            "agent_end" => self.finished = true,
            "auto_retry_start" => self.retry(line, true),
            "auto_retry_end" => self.retry(line, false),
            "response" => {
                if let Some(r) = self.parse::<Response>(line)
                    && r.success == Some(false)
                {
                    self.refused = Some(format!(
                        "pi refused the {} command: {}",
                        r.command.as_deref().unwrap_or("?"),
                        r.error.as_deref().unwrap_or("no reason given")
                    ));
                }
            }
            // session, turn_start, turn_end, tool_execution_update/end, queue_update,
            // compaction_*: nothing to take.
            _ => {}
        }
        self.progress()
    }

    fn finish(self: Box<Self>, exit: Exit, stderr_tail: &str) -> Finished {
        classify_agent(self.summary(), exit, stderr_tail)
    }

    fn parse_errors(&self) -> u64 {
        self.parse_errors
    }

    /// pi's run: working while a message streams or after a tool call, answered after a final
    /// message, ended at an `agent_end` that follows the last message (until pi announces a
    /// retry of its own with `auto_retry_start`, or an `auto_retry_end` gives up).
    fn run_phase(&self) -> RunPhase {
        if !self.started {
            return RunPhase::Unknown;
        }
        if self.streaming.is_some() {
            return RunPhase::Working;
        }
        let failed = self
            .last
            .as_ref()
            .is_some_and(|l| matches!(l.stop_reason.as_str(), "error" | "aborted"));
        if self.finished || self.retry_error.is_some() {
            return RunPhase::Ended { failed };
        }
        if self.last.is_none() && self.refused.is_some() {
            return RunPhase::Ended { failed: true };
        }
        match &self.last {
            Some(l) if l.stop_reason == "toolUse" => RunPhase::Working,
            Some(_) if !failed => RunPhase::Answered,
            _ => RunPhase::Working,
        }
    }

    // Issue 13: structured results.
    fn answer(&self) -> Option<String> {
        self.last
            .as_ref()
            .filter(|l| !matches!(l.stop_reason.as_str(), "error" | "aborted" | "toolUse"))
            .map(|l| l.text.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::AttemptStatus;

    fn end(usage: &str, stop: &str, content: &str) -> String {
        format!(
            r#"{{"type":"message_end","message":{{"role":"assistant","content":{content},"usage":{usage},"stopReason":"{stop}"}}}}"#
        )
    }

    fn run(lines: &[&str], exit: Exit) -> Finished {
        let mut r = Box::new(PiReader::default());
        for l in lines {
            r.line(l);
        }
        r.finish(exit, "")
    }

    const TEXT: &str = r#"[{"type":"text","text":"a"},{"type":"thinking","thinking":"hm"},{"type":"text","text":"b"}]"#;

    #[test]
    fn an_agent_end_cut_short_by_the_line_limit_still_ends_the_run() {
        let answer = end(r#"{"input":1,"output":1}"#, "stop", TEXT);
        let start =
            r#"{"type":"agent_end","messages":[{"role":"user","content":[{"type":"text","text":""#;
        let cut = format!(
            "{start}{}",
            "x".repeat(crate::LINE_LIMIT_BYTES - start.len())
        );
        let f = run(&[&answer, &cut], Exit::Code(0));
        assert_eq!(
            f.outcome.status,
            AttemptStatus::Completed,
            "{:?}",
            f.outcome
        );
        assert_eq!(f.output, "a\nb");
        // Cut short of the limit: the writer died mid-line, no end of the run.
        let f = run(&[&answer, &cut[..1000]], Exit::Code(0));
        assert_ne!(f.outcome.status, AttemptStatus::Completed);
        let other = format!("{{\"type\":\"agent_end_x\",{}", &cut[start.len()..]);
        let f = run(&[&answer, &other], Exit::Code(0));
        assert_ne!(
            f.outcome.status,
            AttemptStatus::Completed,
            "only agent_end itself"
        );
    }

    #[test]
    fn a_call_of_a_tool_pi_was_not_given_is_a_denial() {
        let missing = r#"{"type":"tool_execution_end","toolCallId":"c1","toolName":"bash","result":{"content":[{"type":"text","text":"Tool bash not found"}],"details":{}},"isError":true}"#;
        let failed = r#"{"type":"tool_execution_end","toolCallId":"c2","toolName":"bash","result":{"content":[{"type":"text","text":"exit 1"}]},"isError":true}"#;
        let answer = end(r#"{"input":1,"output":1}"#, "stop", TEXT);
        let f = run(
            &[missing, failed, missing, &answer, r#"{"type":"agent_end"}"#],
            Exit::Code(0),
        );
        assert_eq!(f.outcome.status, AttemptStatus::Completed);
        assert_eq!(
            f.outcome.denials,
            [sortie_core::Denial {
                tool: "bash".into(),
                count: 2
            }],
            "a failed command is no denial"
        );
    }

    #[test]
    fn a_zero_cost_for_spent_tokens_is_unreported() {
        let priced = end(
            r#"{"input":10,"output":2,"totalTokens":12,"cost":{"total":0.5}}"#,
            "toolUse",
            "[]",
        );
        let unpriced = end(
            r#"{"input":10.0,"output":2,"totalTokens":12,"cost":{"total":0}}"#,
            "toolUse",
            "[]",
        );
        let no_cost = end(r#"{"input":1,"output":1}"#, "stop", TEXT);
        let f = run(
            &[&priced, &unpriced, &no_cost, r#"{"type":"agent_end"}"#],
            Exit::Code(0),
        );
        assert_eq!(f.outcome.status, AttemptStatus::Completed);
        assert_eq!((f.usage.input, f.usage.output, f.usage.turns), (21, 5, 3));
        assert_eq!(f.usage.cost.nanos, 500_000_000);
        assert_eq!(f.usage.cost.unreported, 2);
        assert_eq!(f.usage.context_tokens, 2, "the latest call, total computed");
        assert_eq!(f.output, "a\nb", "text items joined, thinking left out");
    }

    #[test]
    fn an_aborted_call_fails_and_a_run_without_answer_is_not_completed() {
        let aborted = end(r#"{"input":1,"output":1}"#, "aborted", "[]");
        let f = run(&[&aborted, r#"{"type":"agent_end"}"#], Exit::Code(0));
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(f.outcome.stop_reason, StopReason::Error);
        assert_eq!(f.outcome.exit_code, Some(1));
        assert_eq!(f.output, "the model call ended with aborted");

        let f = run(
            &[r#"{"type":"agent_start"}"#, r#"{"type":"agent_end"}"#],
            Exit::Code(0),
        );
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
    }

    #[test]
    fn an_unrecognized_error_of_a_finished_run_is_a_real_failure() {
        let e = r#"{"type":"message_end","message":{"role":"assistant","content":[],"stopReason":"error","errorMessage":"400 prompt is too long"}}"#;
        let f = run(&[e, r#"{"type":"agent_end"}"#], Exit::Code(0));
        assert_eq!(f.outcome.stop_reason, StopReason::NonzeroExit);
        assert_eq!(f.outcome.error.as_deref(), Some("400 prompt is too long"));
        let f = run(&[e], Exit::Code(0));
        assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
    }

    #[test]
    fn the_run_phase_follows_the_stream_and_rpc_refusals_fail() {
        let mut r = PiReader::default();
        assert_eq!(r.run_phase(), RunPhase::Unknown);
        r.line(r#"{"type":"response","command":"prompt","success":true}"#);
        r.line(r#"{"type":"agent_start"}"#);
        r.line(r#"{"type":"message_start","message":{"role":"assistant","content":[]}}"#);
        assert_eq!(r.run_phase(), RunPhase::Working);
        r.line(&end(r#"{"input":1,"output":1}"#, "toolUse", "[]"));
        assert_eq!(r.run_phase(), RunPhase::Working, "a tool call: more turns");
        r.line(&end(r#"{"input":1,"output":1}"#, "stop", TEXT));
        assert_eq!(r.run_phase(), RunPhase::Answered);
        r.line(r#"{"type":"agent_end"}"#);
        assert_eq!(r.run_phase(), RunPhase::Ended { failed: false });
        r.line(&end(r#"{"input":0,"output":0}"#, "error", "[]"));
        r.line(r#"{"type":"agent_end"}"#);
        assert_eq!(r.run_phase(), RunPhase::Ended { failed: true });
        r.line(r#"{"type":"auto_retry_start","attempt":1,"maxAttempts":3,"delayMs":2000}"#);
        assert_eq!(r.run_phase(), RunPhase::Working, "pi retries by itself");
        assert_eq!(r.parse_errors, 0);

        let f = run(
            &[r#"{"type":"response","command":"prompt","success":false,"error":"busy"}"#],
            Exit::Code(0),
        );
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(
            f.outcome.error.as_deref(),
            Some("pi refused the prompt command: busy")
        );
    }

    #[test]
    fn updates_are_read_whatever_their_key_order() {
        let mut r = PiReader::default();
        r.line(r#"{"type":"message_start","message":{"role":"assistant","content":[]}}"#);
        let p = r
            .line(r#"{"message":{},"assistantMessageEvent":{"delta":"hi","type":"text_delta"},"type":"message_update"}"#)
            .expect("progress");
        assert_eq!(p.activity.as_deref(), Some("writing"));
        r.line(r#"{"type":"message_update","assistantMessageEvent":{"type":"thinking_delta","delta":"x"}}"#);
        assert_eq!(r.activity.as_deref(), Some("thinking"));
        assert_eq!(r.parse_errors, 0);
        let f = Box::new(r).finish(Exit::Signal(15), "");
        assert_eq!(f.outcome.status, AttemptStatus::Partial);
        assert_eq!(f.output, "hi");
        assert_eq!(
            f.usage.cost.unreported, 1,
            "the call in progress has an unknown cost"
        );
    }
}
