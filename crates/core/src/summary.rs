//! The run's summary text: each task's label, end state and text, as shown when a run ends and
//! journaled in `RunFinished`.

use crate::spec::{OutputMode, TaskSpec};
use crate::state::{RunState, TaskState};

/// The text shown for a task in the summary: `Output written to PATH` for file-only tasks,
/// else the text cut to `max_output` with a marker naming the artifact.
pub fn inline_text(spec: &TaskSpec, text: &str) -> String {
    if spec.output_mode == OutputMode::FileOnly {
        return match &spec.output {
            Some(p) => format!("Output written to {p}"),
            None => "No output artifact".to_owned(),
        };
    }
    let max_bytes = usize::try_from(spec.max_output.bytes).unwrap_or(usize::MAX);
    let max_lines = usize::try_from(spec.max_output.lines).unwrap_or(usize::MAX);
    let mut end = text.len().min(max_bytes);
    // Cut at the newline that ends the last line shown, unless only that newline follows.
    if let Some((i, _)) = text.match_indices('\n').nth(max_lines.saturating_sub(1))
        && i + 1 < text.len()
    {
        end = end.min(i);
    }
    if end >= text.len() {
        return text.to_owned();
    }
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let whole = match &spec.output {
        Some(p) => format!("full output in {p}"),
        None => "no artifact was configured".to_owned(),
    };
    format!(
        "{}\n[output truncated at {} of {} bytes; {whole}]",
        &text[..end],
        end,
        text.len()
    )
}

/// The run's summary: for each task `[label] state` then its text, separated by blank lines.
pub fn summary_text(state: &RunState) -> String {
    let Some(batch) = &state.batch else {
        return String::new();
    };
    let mut blocks = Vec::with_capacity(batch.tasks.len());
    for (spec, rec) in batch.tasks.iter().zip(&state.tasks) {
        let (name, text) = match &rec.state {
            TaskState::Finished(r) => (r.state.as_str(), inline_text(spec, &r.text)),
            other => (other.name(), "(not finished)".to_owned()),
        };
        let denials = rec.denials();
        let denied = if denials.is_empty() {
            String::new()
        } else {
            format!(" (denied: {})", crate::Denial::describe(&denials))
        };
        blocks.push(format!("[{}] {name}{denied}\n{text}", spec.label));
    }
    if let Some((_, reason)) = &state.budget_exceeded {
        blocks.push(format!("Run budget exceeded: {reason}"));
    }
    blocks.join("\n\n")
}
