//! The `claude-stream-json` protocol: the stream of
//! `claude -p --output-format stream-json --verbose` (Claude Code 2.1).
//!
//! One JSON object per line, each with a `type`. What the reader takes from them:
//!
//! - `assistant`: an API message (Claude Code prints one line per content block, all with the
//!   message's `id`). Its `usage` is the snapshot taken when the message started, so the live
//!   usage is, per message id, the largest snapshot seen, summed over the ids; each id is a turn.
//!   `tool_use` blocks give the activity; `Bash`, `Write`, `Edit`, `MultiEdit` and
//!   `NotebookEdit` are side effects (unless the `result` lists them as permission denials).
//!   A synthetic message (`is_api_error_message`) is an API error.
//! - `system` / `api_retry`: Claude Code retrying a failed call (shown as the activity).
//! - `result`, the last line: the end of the run. Its `usage` and `modelUsage` are cumulative
//!   for the run and become the attempt's usage (field-wise the larger of the two, and never
//!   below what progress already showed); `total_cost_usd` is the cost (absent: unreported);
//!   `result` is the answer, or the error text when `is_error` is true (Claude Code then exits
//!   1, and `api_error_status` holds the HTTP status when there was one).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use sortie_core::{Cost, StopReason, Usage};

use crate::classify::{
    AgentFailure, AgentSummary, classify_agent, classify_http_status, classify_provider_error,
};
use crate::shared::{ProgressGate, count, parse_line, shorten, tool_activity};
use crate::{Exit, Finished, Progress, ProtocolReader};

/// The id under which messages cut from the transcript are counted (see `seed`): no message id
/// of Claude's has a NUL in it.
const CUT_MESSAGES: &str = "\0cut";

/// Claude Code's tools that change the world.
const SIDE_EFFECT_TOOLS: &[&str] = &["Bash", "Write", "Edit", "MultiEdit", "NotebookEdit"];

/// Reads `claude -p --output-format stream-json --verbose` (see the module doc).
#[derive(Debug, Default)]
pub struct ClaudeReader {
    /// Per assistant message id (in order), the largest usage snapshot seen.
    messages: Vec<(String, Usage)>,
    /// The usage last reported: it never goes backwards.
    live: Usage,
    side_effects: bool,
    /// Ids of the side-effecting tool calls.
    side_effect_calls: Vec<String>,
    activity: Option<String>,
    gate: ProgressGate,
    started: bool,
    /// The text of the last assistant message that had text, and that message's id.
    text: String,
    text_id: Option<String>,
    /// An API error message (synthetic) not followed by a real message.
    api_error: Option<AgentFailure>,
    /// The `result` line.
    result: Option<ResultLine>,
    parse_errors: u64,
    /// #13: the session id of the `system`/`init` line.
    session: Option<String>,
}

/// The `session_id` of the `system`/`init` line (#13).
#[derive(Deserialize)]
struct InitLine {
    #[serde(default)]
    session_id: Option<String>,
}

/// The `type` of a line, without reading the rest.
#[derive(Deserialize)]
struct Peek {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    subtype: Option<String>,
}

#[derive(Deserialize)]
struct AssistantLine {
    #[serde(default)]
    message: Option<ApiMessage>,
    #[serde(default)]
    is_api_error_message: Option<bool>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default)]
    api_error_status: Option<f64>,
}

#[derive(Deserialize)]
struct ApiMessage {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    content: Vec<Block>,
    #[serde(default)]
    usage: Option<ApiUsage>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<ToolInput>,
}

/// The arguments of a tool call that describe it best (the rest is skipped).
#[derive(Deserialize, Default)]
#[serde(default)]
struct ToolInput {
    command: Option<String>,
    file_path: Option<String>,
    notebook_path: Option<String>,
    path: Option<String>,
    pattern: Option<String>,
    url: Option<String>,
    description: Option<String>,
}

impl ToolInput {
    fn detail(&self) -> Option<&str> {
        [
            &self.command,
            &self.file_path,
            &self.notebook_path,
            &self.path,
            &self.pattern,
            &self.url,
            &self.description,
        ]
        .into_iter()
        .find_map(|a| a.as_deref())
    }
}

/// The Anthropic usage object (numbers read as f64 so that odd values do not lose the line).
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
struct ApiUsage {
    input_tokens: Option<f64>,
    output_tokens: Option<f64>,
    cache_read_input_tokens: Option<f64>,
    cache_creation_input_tokens: Option<f64>,
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
struct OutputDetails {
    thinking_tokens: Option<f64>,
}

impl ApiUsage {
    fn usage(&self) -> Usage {
        Usage {
            input: count(self.input_tokens),
            output: count(self.output_tokens),
            cache_read: count(self.cache_read_input_tokens),
            cache_write: count(self.cache_creation_input_tokens),
            reasoning: count(
                self.output_tokens_details
                    .as_ref()
                    .and_then(|d| d.thinking_tokens),
            ),
            cost: Cost::unreported(),
            turns: 0,
            context_tokens: 0,
        }
    }
}

/// One model's entry in `result.modelUsage`.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default, rename_all = "camelCase")]
struct ModelUsage {
    input_tokens: Option<f64>,
    output_tokens: Option<f64>,
    cache_read_input_tokens: Option<f64>,
    cache_creation_input_tokens: Option<f64>,
    thinking_tokens: Option<f64>,
    #[serde(rename = "costUSD")]
    cost_usd: Option<f64>,
}

/// A `system` line with subtype `api_retry`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct ApiRetry {
    attempt: Option<u64>,
    max_retries: Option<u64>,
    retry_delay_ms: Option<u64>,
    error_status: Option<f64>,
    error: Option<String>,
}

/// The `result` line.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
struct ResultLine {
    subtype: Option<String>,
    is_error: Option<bool>,
    result: Option<String>,
    usage: Option<ApiUsage>,
    #[serde(rename = "modelUsage")]
    model_usage: Option<BTreeMap<String, ModelUsage>>,
    total_cost_usd: Option<f64>,
    num_turns: Option<f64>,
    api_error_status: Option<f64>,
    permission_denials: Option<Vec<Denial>>,
    errors: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize, Default, Debug, Clone)]
#[serde(default)]
struct Denial {
    tool_use_id: Option<String>,
    tool_name: Option<String>,
}

/// An HTTP status reported as a JSON number.
fn status(x: Option<f64>) -> Option<u16> {
    x.filter(|v| (100.0..600.0).contains(v)).map(|v| v as u16)
}

impl ResultLine {
    /// The run's failure, when the result reports one.
    fn failure(&self) -> Option<AgentFailure> {
        let subtype = self.subtype.as_deref().unwrap_or("");
        if self.is_error != Some(true) && !subtype.starts_with("error") {
            return None;
        }
        let mut message = self.result.clone().unwrap_or_default();
        if message.trim().is_empty() {
            let errors: Vec<String> = self
                .errors
                .iter()
                .flatten()
                .map(|e| match e {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            message = if errors.is_empty() {
                format!("Claude Code reported an error ({})", subtype.trim())
            } else {
                errors.join("; ")
            };
        }
        let reason = status(self.api_error_status)
            .and_then(classify_http_status)
            .or_else(|| classify_provider_error(&message))
            .or_else(|| {
                subtype
                    .starts_with("error_max")
                    .then_some(StopReason::Budget)
            });
        Some(AgentFailure { reason, message })
    }

    /// The run's usage: `usage` and the sum of `modelUsage`, field-wise the larger.
    fn usage(&self) -> Usage {
        let mut u = self.usage.as_ref().map(ApiUsage::usage).unwrap_or(Usage {
            cost: Cost::unreported(),
            ..Usage::ZERO
        });
        let mut cost_sum = None;
        for m in self.model_usage.iter().flat_map(|m| m.values()) {
            let mu = Usage {
                input: count(m.input_tokens),
                output: count(m.output_tokens),
                cache_read: count(m.cache_read_input_tokens),
                cache_write: count(m.cache_creation_input_tokens),
                reasoning: count(m.thinking_tokens),
                ..Usage::ZERO
            };
            u = Usage {
                cost: u.cost,
                ..u.max(&mu)
            };
            if let Some(c) = m.cost_usd {
                cost_sum = Some(cost_sum.unwrap_or(0.0) + c);
            }
        }
        u.cost = match self.total_cost_usd.or(cost_sum) {
            Some(usd) if usd > 0.0 || u.tokens() == 0 => Cost::from_usd(usd),
            // No cost, or 0 for tokens spent: Claude Code has no price for the model.
            _ => Cost::unreported(),
        };
        u.turns = self
            .num_turns
            .map_or(0, |n| count(Some(n)).min(u64::from(u32::MAX)) as u32);
        u
    }
}

impl ClaudeReader {
    fn progress(&mut self) -> Option<Progress> {
        self.gate
            .report(self.live, self.side_effects, &self.activity)
    }

    fn parse<T: for<'de> Deserialize<'de>>(&mut self, line: &str) -> Option<T> {
        parse_line(line, &mut self.parse_errors, "Claude Code")
    }

    /// Raises the live counters to `reading` (field-wise); the cost becomes `reading`'s.
    fn raise(&mut self, reading: Usage) {
        self.live = Usage {
            cost: reading.cost,
            ..self.live.max(&reading)
        };
    }

    fn assistant(&mut self, line: &str) {
        let Some(a) = self.parse::<AssistantLine>(line) else {
            return;
        };
        let Some(m) = a.message else { return };
        let id = m.id.clone().unwrap_or_default();
        let synthetic = a.is_api_error_message == Some(true)
            || (a.error.is_some() && m.model.as_deref() == Some("<synthetic>"));
        let text: Vec<&str> = m
            .content
            .iter()
            .filter(|b| b.kind.as_deref() == Some("text"))
            .filter_map(|b| b.text.as_deref())
            .collect();
        if synthetic {
            let message = if text.is_empty() {
                "API error".to_owned()
            } else {
                text.join("\n")
            };
            let reason = status(a.api_error_status)
                .and_then(classify_http_status)
                .or_else(|| classify_provider_error(&message));
            self.api_error = Some(AgentFailure { reason, message });
        } else {
            self.api_error = None;
            if !text.is_empty() {
                let joined = text.join("\n");
                if self.text_id.as_deref() == Some(id.as_str()) && !self.text.is_empty() {
                    self.text.push('\n');
                    self.text.push_str(&joined);
                } else {
                    self.text = joined;
                    self.text_id = Some(id.clone());
                }
                self.activity = Some("writing".into());
            }
        }
        for b in &m.content {
            match b.kind.as_deref() {
                Some("tool_use") => {
                    let name = b.name.as_deref().unwrap_or("tool");
                    if SIDE_EFFECT_TOOLS.contains(&name) {
                        self.side_effects = true;
                        self.side_effect_calls
                            .push(b.id.clone().unwrap_or_default());
                    }
                    let detail = b.input.as_ref().and_then(ToolInput::detail);
                    self.activity = Some(tool_activity(name, detail));
                }
                Some("thinking") | Some("redacted_thinking") => {
                    self.activity = Some("thinking".into());
                }
                _ => {}
            }
        }
        // Usage: the largest snapshot per message id, summed over the ids.
        let mut snapshot = m.usage.as_ref().map(ApiUsage::usage).unwrap_or_default();
        snapshot.turns = 1;
        let context = snapshot.tokens();
        match self.messages.iter_mut().rev().find(|(i, _)| *i == id) {
            Some((_, u)) => *u = u.max(&snapshot),
            None => self.messages.push((id, snapshot)),
        }
        let mut sum = Usage::sum(self.messages.iter().map(|(_, u)| u));
        // Assistant messages carry no cost: unknown until the result line.
        sum.cost = if self.result.is_some() {
            self.live.cost
        } else {
            Cost::unreported()
        };
        if context > 0 {
            sum.context_tokens = context;
        } else {
            sum.context_tokens = self.live.context_tokens;
        }
        self.raise(sum);
    }

    fn result(&mut self, line: &str) {
        let Some(r) = self.parse::<ResultLine>(line) else {
            return;
        };
        let mut usage = r.usage();
        usage.context_tokens = self.live.context_tokens;
        self.result = Some(r);
        self.raise(usage);
        self.activity = Some("done".into());
    }

    fn api_retry(&mut self, line: &str) {
        let Some(r) = self.parse::<ApiRetry>(line) else {
            return;
        };
        let what = match (status(r.error_status), r.error.as_deref()) {
            (Some(s), Some(e)) => format!("HTTP {s} {e}"),
            (Some(s), None) => format!("HTTP {s}"),
            (None, Some(e)) => e.to_owned(),
            (None, None) => "an API error".to_owned(),
        };
        let n = match (r.attempt, r.max_retries) {
            (Some(a), Some(m)) => format!(" (retry {a}/{m})"),
            _ => String::new(),
        };
        let wait = r
            .retry_delay_ms
            .map(|ms| format!(" in {}s", ms.div_ceil(1000)))
            .unwrap_or_default();
        self.activity = Some(shorten(&format!("retrying{wait}{n} after {what}"), 120));
    }

    /// What the stream amounts to, for [`classify_agent`].
    fn summary(self) -> AgentSummary {
        let mut run = AgentSummary {
            agent: "claude",
            finished: self.result.is_some(),
            started: self.started,
            answer: String::new(),
            failure: None,
            cut_short: None,
            usage: self.live,
            side_effects: self.side_effects,
            denials: vec![],
        };
        match &self.result {
            Some(r) => {
                run.failure = r.failure();
                if run.failure.is_none() {
                    run.answer = r.result.clone().unwrap_or_default();
                }
                let denied: Vec<&str> = r
                    .permission_denials
                    .iter()
                    .flatten()
                    .filter_map(|d| d.tool_use_id.as_deref())
                    .collect();
                run.side_effects = self
                    .side_effect_calls
                    .iter()
                    .any(|id| !denied.contains(&id.as_str()));
                for d in r.permission_denials.iter().flatten() {
                    let tool = d.tool_name.as_deref().unwrap_or("unknown tool");
                    sortie_core::Denial::add(&mut run.denials, tool);
                }
            }
            None => {
                // Without the result line, the cost is unknown.
                run.usage.cost = Cost::unreported();
                match self.api_error {
                    Some(f) => run.failure = Some(f),
                    None => run.answer = self.text,
                }
            }
        }
        run
    }
}

impl ProtocolReader for ClaudeReader {
    /// The cut messages count as one more message of the sum (the `result` line's run totals,
    /// when it comes, are the larger).
    fn seed(&mut self, usage: Usage) {
        let cut = Usage {
            context_tokens: 0,
            cost: Cost::default(),
            ..usage
        };
        self.messages.insert(0, (CUT_MESSAGES.to_owned(), cut));
        self.live = self.live.plus(&cut);
    }

    fn line(&mut self, line: &str) -> Option<Progress> {
        let line = line.trim();
        if line.is_empty() {
            return None;
        }
        let (kind, subtype) = match serde_json::from_str::<Peek>(line) {
            Ok(Peek {
                kind: Some(kind),
                subtype,
            }) => (kind, subtype),
            Ok(Peek { kind: None, .. }) | Err(_) => {
                self.parse_errors += 1;
                return None;
            }
        };
        self.started = true;
        match (kind.as_str(), subtype.as_deref()) {
            ("system", Some("init")) => {
                self.activity = Some("starting".into());
                if let Ok(InitLine {
                    session_id: Some(id),
                }) = serde_json::from_str(line)
                    && !id.is_empty()
                {
                    self.session = Some(id);
                }
            }
            ("system", Some("api_retry")) => self.api_retry(line),
            ("assistant", _) => self.assistant(line),
            ("user", _) => self.activity = Some("waiting for the model".into()),
            ("result", _) => self.result(line),
            // stream_event (--include-partial-messages), other system lines, rate limit
            // notices: nothing to take.
            _ => {}
        }
        self.progress()
    }

    fn session(&self) -> Option<&str> {
        self.session.as_deref()
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

    fn run(lines: &[&str], exit: Exit) -> Finished {
        let mut r = Box::new(ClaudeReader::default());
        for l in lines {
            r.line(l);
        }
        r.finish(exit, "")
    }

    const BASH: &str = r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"rm -rf build"}}],"usage":{"input_tokens":10,"output_tokens":1}}}"#;

    #[test]
    fn denied_tools_have_no_side_effects() {
        let result = r#"{"type":"result","subtype":"success","is_error":false,"result":"could not","usage":{"input_tokens":10,"output_tokens":5},"total_cost_usd":0.001,"num_turns":1,"permission_denials":[{"tool_name":"Bash","tool_use_id":"t1","tool_input":{}}]}"#;
        let mut r = ClaudeReader::default();
        let p = r.line(BASH).expect("progress");
        assert!(p.side_effects, "live: the tool may run");
        assert_eq!(p.activity.as_deref(), Some("Bash: rm -rf build"));
        r.line(result);
        let f = Box::new(r).finish(Exit::Code(0), "");
        assert_eq!(f.outcome.status, AttemptStatus::Completed);
        assert!(!f.outcome.side_effects, "the result says it was denied");
        assert_eq!(
            f.outcome.denials,
            [sortie_core::Denial {
                tool: "Bash".into(),
                count: 1
            }]
        );
        assert_eq!(f.usage.cost.nanos, 1_000_000);
    }

    #[test]
    fn one_message_in_several_lines_is_one_turn() {
        let text = r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"Let me look."}],"usage":{"input_tokens":10,"output_tokens":1}}}"#;
        let bash = BASH.replace("\"output_tokens\":1", "\"output_tokens\":3");
        let mut r = ClaudeReader::default();
        r.line(text);
        let p = r.line(&bash).expect("progress");
        assert_eq!((p.usage.input, p.usage.output, p.usage.turns), (10, 3, 1));
        let f = Box::new(r).finish(Exit::Signal(9), "");
        assert_eq!(f.outcome.status, AttemptStatus::Partial);
        assert_eq!(f.output, "Let me look.");
        assert!(!f.usage.cost.is_complete());
    }

    #[test]
    fn errors_without_text_status_or_cost() {
        // Claude Code's own turn limit.
        let max_turns = r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":3,"usage":{"input_tokens":30,"output_tokens":9}}"#;
        let f = run(&[max_turns], Exit::Code(1));
        assert_eq!(f.outcome.stop_reason, StopReason::Budget);
        assert_eq!(
            f.outcome.error.as_deref(),
            Some("Claude Code reported an error (error_max_turns)")
        );
        assert_eq!(f.usage.turns, 3);
        assert!(!f.usage.cost.is_complete(), "no total_cost_usd: unreported");

        // An API error message, then the stream ends without a result.
        let synthetic = r#"{"type":"assistant","message":{"id":"x","model":"<synthetic>","content":[{"type":"text","text":"API Error: 401 Invalid bearer token"}]},"error":"authentication_failed","is_api_error_message":true,"api_error_status":401}"#;
        let f = run(&[synthetic], Exit::Code(1));
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(f.outcome.stop_reason, StopReason::ModelError);
        assert_eq!(f.output, "API Error: 401 Invalid bearer token");

        // A successful result with a nonzero exit: a real failure, the answer kept.
        let ok = r#"{"type":"result","subtype":"success","is_error":false,"result":"done","total_cost_usd":0}"#;
        let f = run(&[ok], Exit::Code(3));
        assert_eq!(f.outcome.stop_reason, StopReason::NonzeroExit);
        assert_eq!(f.output, "done");
        assert!(f.usage.cost.is_complete(), "no token, cost 0: reported");
    }
}
