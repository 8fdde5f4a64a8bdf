//! Structured results (issue 13): the result of a task with an `output_schema`, taken from
//! its final answer and checked against the schema.
//!
//! The result is the last fenced block tagged `json:result` of the answer; without one, the
//! last fenced block that holds JSON (tagged `json` or untagged); without one, the whole
//! answer when it is one JSON value (a plain command printing JSON). It is validated with
//! `jsonschema` (no `$ref` is fetched from anywhere) and kept as compact JSON text. What a
//! mismatch means (a repair round, `partial`) is decided by the attempt's driver and core's
//! `AttemptOutcome::judge_result`.

use serde_json::Value;
use sortie_core::prompt::RESULT_FENCE;

/// How many schema errors a mismatch names.
const MAX_ERRORS: usize = 5;

/// The fenced code blocks of `text`, in order: (info string, body). A block still open at the
/// end of the text counts (an answer cut short).
fn fenced_blocks(text: &str) -> Vec<(&str, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(&str, &str, Vec<&str>)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match &mut open {
            None => {
                for fence in ["```", "~~~"] {
                    if let Some(info) = trimmed.strip_prefix(fence) {
                        let ticks = fence;
                        let info = info.trim_start_matches(&ticks[..1]).trim();
                        open = Some((ticks, info, Vec::new()));
                        break;
                    }
                }
            }
            Some((fence, info, body)) => {
                if trimmed.starts_with(*fence)
                    && trimmed.trim_start_matches(&fence[..1]).trim().is_empty()
                {
                    blocks.push((*info, body.join("\n")));
                    open = None;
                } else {
                    body.push(line);
                }
            }
        }
    }
    if let Some((_, info, body)) = open {
        blocks.push((info, body.join("\n")));
    }
    blocks
}

/// The structured result's text in an answer (see the module's doc), if any.
pub(crate) fn extract(answer: &str) -> Option<String> {
    let blocks = fenced_blocks(answer);
    if let Some((_, body)) = blocks.iter().rev().find(|(info, _)| *info == RESULT_FENCE) {
        return Some(body.clone());
    }
    let json_block = blocks.iter().rev().find(|(info, body)| {
        (info.is_empty() || info.eq_ignore_ascii_case("json"))
            && serde_json::from_str::<Value>(body).is_ok()
    });
    if let Some((_, body)) = json_block {
        return Some(body.clone());
    }
    let whole = answer.trim();
    serde_json::from_str::<Value>(whole)
        .is_ok()
        .then(|| whole.to_owned())
}

/// Checks an answer against a schema (compact JSON text, compiled when the batch was loaded):
/// the result as compact JSON, or why there is none that matches.
pub(crate) fn check(schema: &str, answer: &str) -> Result<String, String> {
    let schema: Value = serde_json::from_str(schema)
        .map_err(|e| format!("the task's output_schema is not JSON: {e}"))?;
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| format!("the task's output_schema does not compile: {e}"))?;
    let Some(text) = extract(answer) else {
        return Err(format!(
            "the final answer has no ```{RESULT_FENCE} block (nor any JSON block)"
        ));
    };
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| format!("the {RESULT_FENCE} block is not valid JSON: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() { "/".to_owned() } else { at };
            format!("at {at}: {e}")
        })
        .collect();
    if errors.is_empty() {
        return Ok(value.to_string());
    }
    let shown = errors.len().min(MAX_ERRORS);
    let more = match errors.len() - shown {
        0 => String::new(),
        n => format!("; and {n} more"),
    };
    Err(format!(
        "the result does not match the schema: {}{more}",
        errors[..shown].join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str =
        r#"{"type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}"#;

    #[test]
    fn the_last_result_block_wins_over_other_json() {
        let answer = "Here:\n```json\n{\"n\": 1}\n```\nand\n```json:result\n{\"n\": 2}\n```\n\
                      then\n```json:result\n{\"n\": 3}\n```\n```json\n{\"n\": 4}\n```";
        assert_eq!(check(SCHEMA, answer), Ok(r#"{"n":3}"#.to_owned()));
    }

    #[test]
    fn without_a_result_block_the_last_json_block_or_the_whole_answer_is_read() {
        let answer = "```\nnot json\n```\n```json\n{\"n\": 7}\n```\n```python\nprint(1)\n```";
        assert_eq!(check(SCHEMA, answer), Ok(r#"{"n":7}"#.to_owned()));
        assert_eq!(check(SCHEMA, "  {\"n\": 8}\n"), Ok(r#"{"n":8}"#.to_owned()));
        let none = check(SCHEMA, "I did it.").unwrap_err();
        assert!(none.contains("no ```json:result block"), "{none}");
    }

    #[test]
    fn a_mismatch_names_where_and_why() {
        let err = check(SCHEMA, "```json:result\n{\"n\": \"three\"}\n```").unwrap_err();
        assert!(
            err.starts_with("the result does not match the schema: at /n: "),
            "{err}"
        );
        assert!(
            err.contains("\"three\" is not of type \"integer\""),
            "{err}"
        );
        let err = check(SCHEMA, "```json:result\n{\"m\": 1}\n```").unwrap_err();
        assert!(err.contains("\"n\" is a required property"), "{err}");
        let err = check(SCHEMA, "```json:result\n{n: 1}\n```").unwrap_err();
        assert!(
            err.starts_with("the json:result block is not valid JSON"),
            "{err}"
        );
    }

    #[test]
    fn an_unclosed_block_at_the_end_still_counts() {
        assert_eq!(
            check(SCHEMA, "```json:result\n{\"n\": 5}"),
            Ok(r#"{"n":5}"#.to_owned())
        );
    }
}
