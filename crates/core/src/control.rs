//! A live control request (`sortie hold`, `release`, `cancel --task`, `steer`, `concurrency`)
//! decided: the event to journal, or why it is refused. The runner resolves labels, passes the
//! facts only it knows (is the run stopping, can a live agent be steered) and journals the
//! answer; a refusal journals nothing.

use crate::{ControlAction, Event, RunState};

/// What the runner knows of the moment a request arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlFacts {
    /// The run is stopping (interrupted or cancelled): it takes no more requests.
    pub stopping: bool,
    /// For a steer: whether the named task's live attempt can take a message now (pi over RPC
    /// with `can_steer`).
    pub steerable: bool,
}

/// The `Event::Control` to journal for `action` asked by `by`, or why it is refused: the run is
/// stopping; the state refuses it (an unknown or finished task, a concurrency out of range...);
/// a steer of an agent that cannot be steered.
pub fn decide(
    state: &RunState,
    by: &str,
    action: ControlAction,
    facts: ControlFacts,
) -> Result<Event, String> {
    if facts.stopping {
        return Err("the run is stopping".to_owned());
    }
    let steered = match &action {
        ControlAction::Steer { task, .. } => Some(*task),
        _ => None,
    };
    let event = Event::Control {
        by: by.to_owned(),
        action,
    };
    state.check(&event).map_err(|v| v.to_string())?;
    if let Some(task) = steered
        && !facts.steerable
    {
        return Err(format!(
            "task {}: its agent cannot be steered (only pi over RPC with can_steer)",
            state.label(task)
        ));
    }
    Ok(event)
}
