//! The prompt an attempt is given: the task's prompt with `{previous}` and `{outputs.LABEL}`
//! substituted from the journaled results of the tasks it needs, a `Context:` block when it
//! needs tasks but names none of them, and `[Read from: a, b]` before it when it lists `reads`.

use sortie_core::{RunState, TaskId};

/// Renders the prompt of `task` from the state (its dependencies' results are in the journal).
pub(crate) fn render(state: &RunState, task: TaskId) -> String {
    let Some(spec) = state.spec(task) else {
        return String::new();
    };
    let Some(mut text) = spec.prompt.clone() else {
        return String::new();
    };
    let output_of = |label: &str| -> Option<String> {
        let id = state.task_by_label(label)?;
        Some(state.task(id)?.result()?.text.clone())
    };
    let mut used_placeholder = false;
    if text.contains("{previous}") {
        used_placeholder = true;
        let previous = task
            .0
            .checked_sub(1)
            .and_then(|i| state.spec(TaskId(i)))
            .filter(|prev| spec.needs.contains(&prev.label))
            .and_then(|prev| output_of(&prev.label))
            .unwrap_or_default();
        text = text.replace("{previous}", &previous);
    }
    for need in &spec.needs {
        let placeholder = format!("{{outputs.{need}}}");
        if text.contains(&placeholder) {
            used_placeholder = true;
            text = text.replace(&placeholder, &output_of(need).unwrap_or_default());
        }
    }
    if !used_placeholder && !spec.needs.is_empty() {
        text.push_str("\n\n---\nContext:");
        for need in &spec.needs {
            let out = output_of(need).unwrap_or_default();
            if spec.needs.len() == 1 {
                text.push_str(&format!("\n{out}"));
            } else {
                text.push_str(&format!("\n--- {need} ---\n{out}"));
            }
        }
    }
    if !spec.reads.is_empty() {
        text = format!("[Read from: {}]\n\n{text}", spec.reads.join(", "));
    }
    text
}
