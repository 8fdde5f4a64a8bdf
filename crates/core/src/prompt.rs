//! The prompt an attempt is given, rendered from the task's prompt and the journaled results of
//! the tasks it needs:
//!
//! - `{previous}`: the output of the task listed just before in the file (it must be in
//!   `needs`: validation refuses it otherwise);
//! - `{outputs.LABEL}`: the output of needed task `LABEL` (validation refuses a label not in
//!   `needs`); a need that did not complete (which only a `needs_mode = "settled"` task runs
//!   after) gives its error instead;
//! - `{task}`: the prompt, as written, of the chain's root (`crate::spec::chain_root`:
//!   walking back through `{previous}`'s task, else the first need, to a task that needs
//!   nothing);
//! - when the task needs tasks but its prompt names none of their outputs (no `{previous}`,
//!   no `{outputs.LABEL}`), their outputs are appended as a `Context:` block, each under a
//!   `--- label ---` header when there are several;
//! - `[Read from: a, b]` goes before it all when the task lists `reads`;
//! - `{outputs.LABEL.json}`: the validated structured result of needed task `LABEL` (one
//!   with an `output_schema`), as compact JSON (`null` when it has none);
//! - a task with an `output_schema` gets the contract ([`contract`]) after it all: the
//!   schema and how to answer (a fenced `json:result` block).
//!
//! Substitution is one pass: a substituted output is never scanned for placeholders again.

use crate::ids::TaskId;
use crate::spec::{PromptPart, chain_previous, chain_root, prompt_parts};
use crate::state::RunState;

/// Renders the prompt of `task` from the state (its dependencies' results are in the journal).
pub fn render(state: &RunState, task: TaskId) -> String {
    let (Some(batch), Some(spec)) = (state.batch.as_ref(), state.spec(task)) else {
        return String::new();
    };
    let Some(prompt) = &spec.prompt else {
        return String::new();
    };
    let output_of = |label: &str| -> String {
        state
            .task_by_label(label)
            .and_then(|id| state.task(id))
            .and_then(|r| r.result())
            .map(need_output)
            .unwrap_or_default()
    };
    let result_of = |label: &str| -> String {
        state
            .task_by_label(label)
            .and_then(|id| state.task(id))
            .and_then(|r| r.result())
            .and_then(|r| r.result.clone())
            .unwrap_or_else(|| "null".to_owned())
    };
    let i = task.index();
    let root_prompt = || -> String {
        let root = chain_root(batch, i);
        if root == i {
            return String::new();
        }
        batch
            .tasks
            .get(root)
            .and_then(|r| r.prompt.clone())
            .unwrap_or_default()
    };
    let mut text = String::with_capacity(prompt.len());
    let mut names_an_output = false;
    for part in prompt_parts(prompt) {
        match part {
            PromptPart::Text(t) => text.push_str(t),
            PromptPart::Previous => {
                names_an_output = true;
                if let Some(prev) = chain_previous(batch, i).and_then(|p| batch.tasks.get(p)) {
                    text.push_str(&output_of(&prev.label));
                }
            }
            PromptPart::Output(label) => {
                names_an_output = true;
                if spec.needs.iter().any(|n| n == label) {
                    text.push_str(&output_of(label));
                }
            }
            PromptPart::Task => text.push_str(&root_prompt()),
            PromptPart::OutputJson(label) => {
                names_an_output = true;
                if spec.needs.iter().any(|n| n == label) {
                    text.push_str(&result_of(label));
                }
            }
        }
    }
    if !names_an_output && !spec.needs.is_empty() {
        text.push_str(&context_block(
            spec.needs.iter().map(|n| (n.as_str(), output_of(n))),
        ));
    }
    if !spec.reads.is_empty() {
        text = format!("[Read from: {}]\n\n{text}", spec.reads.join(", "));
    }
    if let Some(schema) = &spec.output_schema {
        text.push_str(&contract(schema));
    }
    text
}

/// What a needed task gives the prompt: its text when it completed, else (a need of a task
/// whose `needs_mode` is settled, #33) its error, or its text when it has none.
fn need_output(r: &crate::outcome::TaskResult) -> String {
    match (&r.state, &r.error) {
        (crate::outcome::TerminalState::Completed, _) | (_, None) => r.text.clone(),
        (_, Some(error)) => error.clone(),
    }
}

/// The fence tag of a structured result block: ```` ```json:result ````.
pub const RESULT_FENCE: &str = "json:result";

/// The contract appended to the prompt of a task with an `output_schema` (compact JSON text):
/// what the result must match and how to give it.
pub fn contract(schema: &str) -> String {
    format!(
        "\n\n---\nStructured result: when you are done, end your final answer with your result \
         as one JSON value in a fenced block tagged `{RESULT_FENCE}`, like this:\n\n\
         ```{RESULT_FENCE}\n{{ ... }}\n```\n\n\
         The value must match this JSON Schema:\n\n```json\n{schema}\n```\n\
         Only the last `{RESULT_FENCE}` block of your final answer is read."
    )
}

/// What an agent is told in the repair round when its structured result did not match: the
/// validation error, and the contract again.
pub fn repair_request(error: &str, schema: &str) -> String {
    format!(
        "Your structured result was not accepted: {error}\n\nAnswer again with the corrected \
         result: one JSON value matching the schema, in a fenced block tagged \
         `{RESULT_FENCE}`:\n\n```json\n{schema}\n```"
    )
}

/// The `Context:` block appended to a prompt that names no output of the tasks it needs: the
/// one output as is, or each under a `--- label ---` header when there are several.
fn context_block<'a>(outputs: impl ExactSizeIterator<Item = (&'a str, String)>) -> String {
    let several = outputs.len() > 1;
    let mut block = String::from("\n\n---\nContext:");
    for (label, out) in outputs {
        if several {
            block.push_str(&format!("\n--- {label} ---"));
        }
        block.push('\n');
        block.push_str(&out);
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_gives_the_schema_and_the_fence_and_the_repair_request_the_error() {
        let schema = r#"{"type":"object"}"#;
        let c = contract(schema);
        assert!(c.contains("```json:result\n"), "{c}");
        assert!(c.contains(&format!("```json\n{schema}\n```")), "{c}");
        let r = repair_request("at /n: \"x\" is not of type \"integer\"", schema);
        assert!(r.contains("at /n: \"x\" is not of type \"integer\""), "{r}");
        assert!(r.contains("`json:result`") && r.contains(schema), "{r}");
    }

    #[test]
    fn outputs_label_json_is_its_own_placeholder() {
        use crate::spec::{PromptPart, prompt_parts};
        assert_eq!(
            prompt_parts("{outputs.a.json} {outputs.a} {outputs..json}"),
            [
                PromptPart::OutputJson("a"),
                PromptPart::Text(" "),
                PromptPart::Output("a"),
                PromptPart::Text(" "),
                PromptPart::Output(".json"),
            ]
        );
    }

    #[test]
    fn context_block_names_each_output_when_there_are_several() {
        assert_eq!(
            context_block([("a", "A out".to_owned())].into_iter()),
            "\n\n---\nContext:\nA out"
        );
        assert_eq!(
            context_block([("a", "A".to_owned()), ("b", "B".to_owned())].into_iter()),
            "\n\n---\nContext:\n--- a ---\nA\n--- b ---\nB"
        );
    }
}
