//! The `codex-json` protocol: the stream of `codex exec --json` (Codex CLI 0.171).
//!
//! One JSON object per line, each with a `type`. What the reader takes from them:
//!
//! - `thread.started` opens the stream; `turn.started` starts a codex turn (the prompt and
//!   everything the agent does for it), which ends with `turn.completed` or `turn.failed`. The
//!   run is finished when a turn ended and no new one started.
//! - `turn.completed` carries `usage`: the running total of the codex *thread* (summed over
//!   every model call, and over earlier processes when a session is resumed), so the reader
//!   keeps the latest reading (field-wise never lower), and never sums readings. `input_tokens`
//!   includes the cached tokens: sortie's `input` is `input_tokens - cached_input_tokens -
//!   cache_write_input_tokens`; `reasoning_output_tokens` are part of `output_tokens`. Codex
//!   reports no cost: the cost is always unreported, never 0. Nor does it report a context size.
//! - `turn.failed` carries `error.message`: the run failed, classified by
//!   [`classify_codex_error`] (codex rewrites some provider errors in its own words).
//! - `item.started` / `item.updated` / `item.completed` carry an `item` with an `id` and a
//!   `type`: `agent_message` (`text`; the last one is the answer), `reasoning`,
//!   `command_execution` (`command`, `exit_code`, `status`) and `file_change` (`changes`:
//!   `path` and `kind`), both side effects, `mcp_tool_call`, `web_search`, `todo_list`, and
//!   `error` (a warning, such as unknown model metadata: not a failure).
//! - `error` (top level): `Reconnecting... n/m (why)` while codex retries a model call itself
//!   (shown as the activity), else the error that is about to fail the turn. A stream that ends
//!   after one, without the end of the turn, failed with that error.
//!
//! Codex prints no event per model call, so the turns (model calls) are counted from the items:
//! one when a codex turn starts, and one more whenever a new item appears after a local tool
//! (command, patch, MCP call, plan update) finished, because the tool's result went back to the
//! model. Tool calls of one response that run one after another count as several calls: the
//! count is an estimate, never below the truth for a run that used tools in parallel.

use std::collections::HashSet;

use serde::Deserialize;
use sortie_core::{Cost, StopReason, Usage};

use crate::classify::{AgentFailure, AgentSummary, classify_agent, classify_provider_error};
use crate::shared::{ProgressGate, count, parse_line, shorten, tool_activity};
use crate::{Exit, Finished, MAX_PLAIN_OUTPUT, Progress, ProtocolReader};

/// The prefix codex gives the `error` events of its own retries.
const RECONNECTING: &str = "Reconnecting...";

/// Reads `codex exec --json` (see the module doc).
#[derive(Debug)]
pub struct CodexReader {
    /// The latest usage (cumulative, never going backwards); the cost stays unreported.
    usage: Usage,
    side_effects: bool,
    activity: Option<String>,
    /// What the last progress reported.
    gate: ProgressGate,
    /// At least one event was read.
    started: bool,
    /// A turn ended (completed or failed) and no new one started.
    finished: bool,
    /// The text of the last agent message.
    answer: String,
    /// The failure of the last turn (`turn.failed`).
    failure: Option<AgentFailure>,
    /// The last `error` event since the last sign of progress: the failing call, when the
    /// stream ends before the turn does.
    pending_error: Option<String>,
    /// Ids of the items seen so far (to tell new model output from a tool finishing).
    items: HashSet<String>,
    /// A local tool finished since the model last produced an item: the next new item comes
    /// from a new model call.
    after_tools: bool,
    parse_errors: u64,
    /// #13: the thread id of `thread.started`.
    session: Option<String>,
}

impl Default for CodexReader {
    fn default() -> Self {
        CodexReader {
            usage: Usage {
                cost: Cost::unreported(),
                ..Usage::ZERO
            },
            side_effects: false,
            activity: None,
            gate: ProgressGate::default(),
            started: false,
            finished: false,
            answer: String::new(),
            failure: None,
            pending_error: None,
            items: HashSet::new(),
            after_tools: false,
            parse_errors: 0,
            session: None,
        }
    }
}

/// The `type` of a line, without reading the rest.
#[derive(Deserialize)]
struct Peek {
    #[serde(rename = "type")]
    kind: String,
}

/// `item.started`, `item.updated`, `item.completed`.
#[derive(Deserialize)]
struct ItemLine {
    item: Item,
}

/// `turn.completed`.
#[derive(Deserialize)]
struct TurnCompleted {
    #[serde(default)]
    usage: Option<CodexUsage>,
}

/// `turn.failed`.
#[derive(Deserialize)]
struct TurnFailed {
    #[serde(default)]
    error: Option<ErrorBody>,
}

/// A top-level `error` event.
#[derive(Deserialize)]
struct ErrorLine {
    #[serde(default)]
    message: Option<String>,
}

/// An item. Fields that only describe (commands, changes) are read loosely, so that a change of
/// their shape does not lose the line.
#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    id: Option<String>,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    command: Option<serde_json::Value>,
    #[serde(default)]
    changes: Option<serde_json::Value>,
    #[serde(default)]
    server: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    query: Option<String>,
}

/// `turn.completed.usage` (numbers read as f64 so that odd values do not lose the line).
#[derive(Deserialize, Default)]
#[serde(default)]
struct CodexUsage {
    input_tokens: Option<f64>,
    cached_input_tokens: Option<f64>,
    cache_write_input_tokens: Option<f64>,
    output_tokens: Option<f64>,
    reasoning_output_tokens: Option<f64>,
}

impl CodexUsage {
    fn usage(&self) -> Usage {
        let cache_read = count(self.cached_input_tokens);
        let cache_write = count(self.cache_write_input_tokens);
        Usage {
            input: count(self.input_tokens)
                .saturating_sub(cache_read)
                .saturating_sub(cache_write),
            output: count(self.output_tokens),
            cache_read,
            cache_write,
            reasoning: count(self.reasoning_output_tokens),
            cost: Cost::unreported(),
            turns: 0,
            context_tokens: 0,
        }
    }
}

/// `turn.failed.error`: an object with a message (a bare string is tolerated).
#[derive(Deserialize)]
#[serde(untagged)]
enum ErrorBody {
    Object {
        #[serde(default)]
        message: Option<String>,
    },
    Text(String),
}

impl ErrorBody {
    fn message(self) -> Option<String> {
        match self {
            ErrorBody::Object { message } => message,
            ErrorBody::Text(s) => Some(s),
        }
    }
}

/// Classifies the text of a codex error (`turn.failed.error.message`, or an `error` event).
///
/// Codex passes some provider errors on as they are (`unexpected status 401 Unauthorized: ...`,
/// `exceeded retry limit, last status: 429 Too Many Requests`) and rewrites others in its own
/// words. Beyond [`classify_provider_error`]: `We're currently experiencing high demand, ...`
/// (a 5xx or an overloaded server) and `stream disconnected before completion: ...` (a stream
/// cut short or a `response.failed`) and `Connection failed: error sending request` (nothing
/// answers at the provider's address) are transient `error`s, unless the text also names a
/// model error (a quota) or an incomplete response (a content filter or an output limit:
/// retrying gives the same answer); `You've hit your usage limit` (a ChatGPT plan) is a
/// `model_error`.
pub fn classify_codex_error(message: &str) -> Option<StopReason> {
    let generic = classify_provider_error(message);
    let t = message.to_ascii_lowercase();
    if generic == Some(StopReason::ModelError) || t.contains("usage limit") {
        return Some(StopReason::ModelError);
    }
    if t.contains("incomplete response") {
        return None;
    }
    if t.contains("high demand")
        || t.contains("stream disconnected")
        || t.contains("connection failed")
        || t.contains("error sending request")
    {
        return Some(StopReason::Error);
    }
    generic
}

/// The command of a `command_execution` item for display: codex runs
/// `/bin/bash -lc '<command>'`; the wrapper is left out.
fn command_detail(command: &serde_json::Value) -> Option<String> {
    let full = match command {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join(" "),
        _ => return None,
    };
    let inner = ["bash -lc ", "bash -c ", "zsh -lc ", "sh -c "]
        .iter()
        .find_map(|w| {
            full.find(w)
                .filter(|&i| i == 0 || full[..i].ends_with('/'))
                .map(|i| &full[i + w.len()..])
        })
        .unwrap_or(&full);
    let inner = inner
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .unwrap_or(inner);
    Some(inner.to_owned())
}

/// The changes of a `file_change` item for display: `add hello.txt, update src/a.rs`.
fn changes_detail(changes: &serde_json::Value) -> Option<String> {
    let list = changes.as_array()?;
    let parts: Vec<String> = list
        .iter()
        .filter_map(|c| {
            let path = c.get("path")?.as_str()?;
            let name = path.rsplit('/').next().unwrap_or(path);
            Some(match c.get("kind").and_then(|k| k.as_str()) {
                Some(kind) => format!("{kind} {name}"),
                None => name.to_owned(),
            })
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

impl CodexReader {
    /// Progress, when the line changed something worth reporting.
    fn progress(&mut self) -> Option<Progress> {
        self.gate
            .report(self.usage, self.side_effects, &self.activity)
    }

    fn parse<T: for<'de> Deserialize<'de>>(&mut self, line: &str) -> Option<T> {
        parse_line(line, &mut self.parse_errors, "codex")
    }

    /// Counts one more model call.
    fn model_call(&mut self) {
        self.usage.turns = self.usage.turns.saturating_add(1);
    }

    fn turn_started(&mut self) {
        self.model_call();
        self.after_tools = false;
        self.finished = false;
        self.failure = None;
        self.pending_error = None;
        self.activity = Some("waiting for the model".into());
    }

    fn turn_completed(&mut self, usage: Option<CodexUsage>) {
        if let Some(u) = usage {
            let reading = u.usage();
            self.usage = Usage {
                cost: self.usage.cost,
                turns: self.usage.turns,
                context_tokens: 0,
                ..self.usage.max(&reading)
            };
        }
        self.finished = true;
        self.failure = None;
        self.pending_error = None;
        self.activity = Some("done".into());
    }

    fn turn_failed(&mut self, error: Option<ErrorBody>) {
        let message = error
            .and_then(ErrorBody::message)
            .or_else(|| self.pending_error.take())
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| "codex reported a failed turn".into());
        self.failure = Some(AgentFailure {
            reason: classify_codex_error(&message),
            message,
        });
        self.finished = true;
        self.pending_error = None;
        self.activity = Some("failed".into());
    }

    fn error(&mut self, message: Option<String>) {
        let message = message
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| "codex reported an error".into());
        match message.strip_prefix(RECONNECTING) {
            Some(rest) => {
                // `Reconnecting... 2/5 (why)` or `Reconnecting... waiting for network (why)`.
                let rest = rest.trim();
                let (what, why) = match (rest.find('('), rest.rfind(')')) {
                    (Some(open), Some(close)) if close > open => {
                        (rest[..open].trim(), rest[open + 1..close].trim())
                    }
                    _ => (rest, ""),
                };
                let what = if what.is_empty() {
                    String::new()
                } else {
                    format!(" ({what})")
                };
                let activity = if why.is_empty() {
                    format!("retrying{what}")
                } else {
                    format!("retrying{what} after: {why}")
                };
                self.activity = Some(shorten(&activity, 120));
                self.pending_error = Some(if why.is_empty() {
                    message.clone()
                } else {
                    why.to_owned()
                });
            }
            None => {
                self.activity = Some(shorten(&format!("error: {message}"), 120));
                self.pending_error = Some(message);
            }
        }
    }

    fn item(&mut self, item: Item, phase: &str) {
        let kind = item.kind.as_deref().unwrap_or("");
        if kind == "error" {
            // A warning (e.g. unknown model metadata): codex carries on.
            return;
        }
        let new = match &item.id {
            Some(id) => self.items.insert(id.clone()),
            None => true,
        };
        if new && self.after_tools {
            // The tools' results went back to the model: this is its next call.
            self.model_call();
            self.after_tools = false;
        }
        self.pending_error = None;
        match kind {
            "agent_message" => {
                if let Some(text) = item.text {
                    self.answer = text;
                    if self.answer.len() > MAX_PLAIN_OUTPUT {
                        let mut cut = MAX_PLAIN_OUTPUT;
                        while !self.answer.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        self.answer.truncate(cut);
                    }
                }
                self.activity = Some("writing".into());
            }
            "reasoning" => self.activity = Some("thinking".into()),
            "command_execution" | "file_change" => {
                if item.status.as_deref() != Some("declined") {
                    self.side_effects = true;
                }
                let (tool, detail) = if kind == "file_change" {
                    ("patch", item.changes.as_ref().and_then(changes_detail))
                } else {
                    ("shell", item.command.as_ref().and_then(command_detail))
                };
                self.activity = Some(tool_activity(tool, detail.as_deref()));
                if phase == "item.completed" {
                    self.after_tools = true;
                }
            }
            "mcp_tool_call" => {
                let name = match (item.server.as_deref(), item.tool.as_deref()) {
                    (Some(s), Some(t)) => format!("{s}.{t}"),
                    (None, Some(t)) => t.to_owned(),
                    _ => "tool".to_owned(),
                };
                self.activity = Some(tool_activity("mcp", Some(&name)));
                if phase == "item.completed" {
                    self.after_tools = true;
                }
            }
            "web_search" => {
                self.activity = Some(tool_activity("web search", item.query.as_deref()));
            }
            "todo_list" => {
                // A plan update is a tool call whose result goes back to the model; the item
                // completes only at the end of the turn.
                self.activity = Some("planning".into());
                if phase != "item.completed" {
                    self.after_tools = true;
                }
            }
            _ => {}
        }
    }

    /// What the stream amounts to, for [`classify_agent`].
    fn summary(self) -> AgentSummary {
        let mut run = AgentSummary {
            agent: "codex",
            finished: self.finished,
            started: self.started,
            answer: String::new(),
            failure: None,
            cut_short: None,
            usage: self.usage,
            side_effects: self.side_effects,
            denials: vec![],
        };
        match (self.failure, self.pending_error) {
            (Some(f), _) => run.failure = Some(f),
            (None, Some(e)) if !self.finished => {
                run.failure = Some(AgentFailure {
                    reason: classify_codex_error(&e),
                    message: e,
                })
            }
            _ => run.answer = self.answer,
        }
        run
    }
}

/// `thread.started`: the thread (session) id (#13).
#[derive(Deserialize)]
struct ThreadStarted {
    #[serde(default)]
    thread_id: Option<String>,
}

impl ProtocolReader for CodexReader {
    /// The tokens of `turn.completed` are the thread's running totals (the next covers the
    /// cut ones); its turns are counted one by one, so the cut ones are added.
    fn seed(&mut self, usage: Usage) {
        self.usage.turns = self.usage.turns.saturating_add(usage.turns);
    }

    fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    fn line(&mut self, line: &str) -> Option<Progress> {
        let line = line.trim();
        if line.is_empty() {
            return None;
        }
        let kind = match serde_json::from_str::<Peek>(line) {
            Ok(p) => p.kind,
            Err(e) => {
                tracing::debug!("unreadable codex event: {e}");
                self.parse_errors += 1;
                return None;
            }
        };
        self.started = true;
        match kind.as_str() {
            "thread.started" => {
                self.activity = Some("starting".into());
                if let Some(ThreadStarted {
                    thread_id: Some(id),
                }) = self.parse::<ThreadStarted>(line)
                    && !id.is_empty()
                {
                    self.session = Some(id);
                }
            }
            "turn.started" => self.turn_started(),
            "turn.completed" => {
                if let Some(t) = self.parse::<TurnCompleted>(line) {
                    self.turn_completed(t.usage);
                }
            }
            "turn.failed" => {
                if let Some(t) = self.parse::<TurnFailed>(line) {
                    self.turn_failed(t.error);
                }
            }
            "error" => {
                if let Some(e) = self.parse::<ErrorLine>(line) {
                    self.error(e.message);
                }
            }
            phase @ ("item.started" | "item.updated" | "item.completed") => {
                if let Some(i) = self.parse::<ItemLine>(line) {
                    self.item(i.item, phase);
                }
            }
            // Events a newer codex may add: nothing to take.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::AttemptStatus;

    fn run(lines: &[&str], exit: Exit) -> (Finished, u64) {
        let mut r = Box::new(CodexReader::default());
        for l in lines {
            r.line(l);
        }
        let errors = r.parse_errors();
        (r.finish(exit, ""), errors)
    }

    const STARTED: &str = r#"{"type":"thread.started","thread_id":"t"}"#;
    const TURN: &str = r#"{"type":"turn.started"}"#;

    #[test]
    fn codex_errors_in_its_own_words() {
        for (text, want) in [
            (
                "We\u{2019}re currently experiencing high demand, which may cause temporary errors.",
                Some(StopReason::Error),
            ),
            (
                "stream disconnected before completion: stream closed before response.completed",
                Some(StopReason::Error),
            ),
            (
                "exceeded retry limit, last status: 429 Too Many Requests",
                Some(StopReason::Error),
            ),
            (
                "Connection failed: error sending request",
                Some(StopReason::Error),
            ),
            (
                "unexpected status 401 Unauthorized: Incorrect API key provided: mock-key., url: \
                 http://127.0.0.1:41465/v1/responses",
                Some(StopReason::ModelError),
            ),
            (
                "Quota exceeded. Check your plan and billing details.",
                Some(StopReason::ModelError),
            ),
            (
                "stream disconnected before completion: You exceeded your current quota",
                Some(StopReason::ModelError),
            ),
            (
                "You've hit your usage limit. Try again later.",
                Some(StopReason::ModelError),
            ),
            (
                "stream disconnected before completion: Incomplete response returned, reason: \
                 content_filter",
                None,
            ),
            (
                "Codex ran out of room in the model's context window. Start a new thread or \
                 clear earlier history before retrying.",
                None,
            ),
        ] {
            assert_eq!(classify_codex_error(text), want, "{text}");
        }
    }

    #[test]
    fn commands_and_changes_are_shown_without_the_shell_wrapper() {
        let c = serde_json::json!("/bin/bash -lc 'echo hi > out.txt'");
        assert_eq!(command_detail(&c).as_deref(), Some("echo hi > out.txt"));
        let c = serde_json::json!(["bash", "-lc", "ls -la"]);
        assert_eq!(command_detail(&c).as_deref(), Some("ls -la"));
        let c = serde_json::json!("cargo test");
        assert_eq!(command_detail(&c).as_deref(), Some("cargo test"));
        assert_eq!(command_detail(&serde_json::json!(3)), None);
        let ch = serde_json::json!([{"path":"/p/a/hello.txt","kind":"add"},{"path":"b.rs"}]);
        assert_eq!(changes_detail(&ch).as_deref(), Some("add hello.txt, b.rs"));
        assert_eq!(changes_detail(&serde_json::json!([])), None);
    }

    #[test]
    fn parallel_tools_are_one_call_and_plan_updates_count() {
        let lines = [
            STARTED,
            TURN,
            r#"{"type":"item.started","item":{"id":"a","type":"command_execution","command":"ls","status":"in_progress"}}"#,
            r#"{"type":"item.started","item":{"id":"b","type":"command_execution","command":"pwd","status":"in_progress"}}"#,
            r#"{"type":"item.completed","item":{"id":"a","type":"command_execution","command":"ls","exit_code":0,"status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"id":"b","type":"command_execution","command":"pwd","exit_code":0,"status":"completed"}}"#,
            r#"{"type":"item.started","item":{"id":"p","type":"todo_list","items":[{"text":"x","completed":false}]}}"#,
            r#"{"type":"item.completed","item":{"id":"m","type":"agent_message","text":"ok"}}"#,
            r#"{"type":"item.completed","item":{"id":"p","type":"todo_list","items":[]}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":10,"output_tokens":2}}"#,
        ];
        let (f, errors) = run(&lines, Exit::Code(0));
        assert_eq!(errors, 0);
        assert_eq!(f.outcome.status, AttemptStatus::Completed);
        // The first call ran two commands, the second updated the plan, the third answered.
        assert_eq!(f.usage.turns, 3);
        assert_eq!((f.usage.input, f.usage.output), (10, 2));
        assert!(f.outcome.side_effects);
    }

    #[test]
    fn a_declined_command_is_no_side_effect() {
        let lines = [
            STARTED,
            TURN,
            r#"{"type":"item.completed","item":{"id":"a","type":"command_execution","command":"rm -rf /","status":"declined"}}"#,
            r#"{"type":"item.completed","item":{"id":"m","type":"agent_message","text":"I may not."}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":10,"output_tokens":2}}"#,
        ];
        let (f, _) = run(&lines, Exit::Code(0));
        assert!(!f.outcome.side_effects);
        assert_eq!(f.output, "I may not.");
    }

    #[test]
    fn killed_while_codex_retries_is_failed_with_the_error() {
        let lines = [
            STARTED,
            TURN,
            r#"{"type":"error","message":"Reconnecting... 2/5 (We’re currently experiencing high demand, which may cause temporary errors.)"}"#,
        ];
        let mut r = CodexReader::default();
        r.line(lines[0]);
        r.line(lines[1]);
        let p = r.line(lines[2]).expect("progress");
        assert_eq!(
            p.activity.as_deref(),
            Some(
                "retrying (2/5) after: We’re currently experiencing high demand, which may \
                 cause temporary errors."
            )
        );
        let f = Box::new(r).finish(Exit::Code(143), "");
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(f.outcome.stop_reason, StopReason::Error);
        let (f, _) = run(&lines, Exit::Signal(15));
        assert_eq!(f.outcome.stop_reason, StopReason::UnexpectedSignal);

        // A call that recovered after the notice: the answer counts, not the notice.
        let mut lines = lines.to_vec();
        lines.push(
            r#"{"type":"item.completed","item":{"id":"m","type":"agent_message","text":"hi"}}"#,
        );
        let (f, _) = run(&lines, Exit::Signal(9));
        assert_eq!(f.outcome.status, AttemptStatus::Partial);
        assert_eq!(f.output, "hi");
    }

    #[test]
    fn odd_shapes_do_not_lose_the_run() {
        let lines = [
            r#"{"type":"turn.started","extra":{"nested":[1,2]}}"#,
            r#"{"type":"item.completed","item":{"id":"x","type":"file_change","changes":"weird"}}"#,
            r#"{"type":"item.completed"}"#,
            r#"{"type":"item.completed","item":{"id":"m","type":"agent_message","text":"done"}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":-5,"cached_input_tokens":1e30,"output_tokens":2.6}}"#,
            r#"{"type":"turn.failed","error":"plain text error"}"#,
        ];
        let (f, errors) = run(&lines[..5], Exit::Code(0));
        assert_eq!(errors, 1, "an item event without an item");
        assert_eq!(f.outcome.status, AttemptStatus::Completed);
        assert_eq!(f.usage.output, 3);
        assert_eq!(f.usage.input, 0);
        assert!(f.outcome.side_effects);
        let (f, _) = run(&lines, Exit::Code(1));
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(f.outcome.error.as_deref(), Some("plain text error"));
        assert_eq!(f.outcome.stop_reason, StopReason::NonzeroExit);
    }
}
