//! The attempt table the real-agent tests read from a run's exported events: each finished
//! attempt of a task with the model it ran on.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::Events;

/// One finished attempt of a task, as journaled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attempt {
    /// The attempt's number (1 first).
    pub attempt: u64,
    /// The model it was launched on (`AttemptLaunching`).
    pub model: String,
    /// Its outcome's status (`completed`, `error`, ...).
    pub status: String,
    /// Its outcome's stop reason.
    pub stop_reason: String,
    /// Its outcome's error text, empty for none.
    pub error: String,
    /// Its output, empty for none.
    pub output: String,
}

/// The finished attempts of task number `task`, in journal order.
pub fn attempts(events: &[Value], task: u64) -> Vec<Attempt> {
    let models: BTreeMap<u64, String> = events
        .of(task, "AttemptLaunching")
        .iter()
        .filter_map(|b| Some((b["attempt"].as_u64()?, text(&b["model"]))))
        .collect();
    events
        .of(task, "AttemptFinished")
        .iter()
        .map(|b| {
            let attempt = b["attempt"].as_u64().unwrap_or_default();
            let o = &b["outcome"];
            Attempt {
                attempt,
                model: models.get(&attempt).cloned().unwrap_or_default(),
                status: text(&o["status"]),
                stop_reason: text(&o["stop_reason"]),
                error: text(&o["error"]),
                output: text(&b["output"]),
            }
        })
        .collect()
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_row_names_its_model_and_outcome() {
        let events: Vec<Value> = [
            serde_json::json!({"AttemptLaunching": {"task": 1, "attempt": 1, "model": "bad"}}),
            serde_json::json!({"AttemptLaunching": {"task": 0, "attempt": 1, "model": "x"}}),
            serde_json::json!({"AttemptFinished": {"task": 1, "attempt": 1,
                "outcome": {"status": "error", "stop_reason": "error", "error": "500"}}}),
            serde_json::json!({"AttemptLaunching": {"task": 1, "attempt": 2, "model": "good"}}),
            serde_json::json!({"AttemptFinished": {"task": 1, "attempt": 2, "output": "hi",
                "outcome": {"status": "completed", "stop_reason": "completed"}}}),
        ]
        .into_iter()
        .map(|e| serde_json::json!({ "event": e }))
        .collect();
        let rows = attempts(&events, 1);
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].model.as_str(), rows[0].error.as_str()),
            ("bad", "500")
        );
        assert_eq!(
            (
                rows[1].attempt,
                rows[1].model.as_str(),
                rows[1].output.as_str()
            ),
            (2, "good", "hi")
        );
        assert!(attempts(&events, 0).is_empty());
    }
}
