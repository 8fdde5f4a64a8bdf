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
///
/// Written into one string as it goes: a run of 100,000 tasks held a block per task and then
/// their join (21 MB at the end of `sortie run`, its peak memory).
pub fn summary_text(state: &RunState) -> String {
    use std::fmt::Write as _;
    let Some(batch) = &state.batch else {
        return String::new();
    };
    let mut out = String::new();
    for (i, (spec, rec)) in batch.tasks.iter().zip(&state.tasks).enumerate() {
        if i > 0 {
            out.push_str("\n\n");
        }
        let (name, text) = match &rec.state {
            TaskState::Finished(r) => (r.state.as_str(), inline_text(spec, &r.text)),
            other => (other.name(), "(not finished)".to_owned()),
        };
        // Writing into a String cannot fail.
        let _ = write!(out, "[{}] {name}", spec.label);
        // #33: how its check went.
        if let Some(verified) = crate::verify::verified_text(rec) {
            let _ = write!(out, " ({verified})");
        } else if let TaskState::Finished(r) = &rec.state
            && r.stop_reason == crate::outcome::StopReason::Verify
        {
            let why = r.error.as_deref().unwrap_or_default();
            let _ = write!(out, " ({})", why.lines().next().unwrap_or_default());
        }
        let denials = rec.denials();
        if !denials.is_empty() {
            let _ = write!(out, " (denied: {})", crate::Denial::describe(&denials));
        }
        // #34: the connections its sandbox denied.
        let net =
            crate::sandbox_net::merge(rec.attempts.iter().flat_map(|a| a.net().unwrap_or(&[])));
        let net = crate::sandbox_net::denied(&net);
        if !net.is_empty() {
            let field = crate::sandbox_net::ALLOWING_FIELD;
            let _ = write!(out, " (network denied: {}; {field} allows)", net.join(", "));
        }
        out.push('\n');
        out.push_str(&text);
    }
    if let Some((_, reason)) = &state.budget_exceeded {
        if !batch.tasks.is_empty() {
            out.push_str("\n\n");
        }
        let _ = write!(out, "Run budget exceeded: {reason}");
    }
    out.shrink_to_fit();
    out
}
