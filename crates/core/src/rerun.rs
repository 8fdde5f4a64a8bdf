//! Which tasks of a finished run run again in a rerun (`sortie rerun`), and what the others
//! carry into the new run.
//!
//! Rules:
//! - Only a finished run with a batch can be rerun; every label named must be one of its tasks.
//! - With no selector, every task that did not complete runs again. With selectors, a task runs
//!   again when it is named, or when its end matches a selected end (failed, partial, timeout).
//! - A task that did not complete runs again when one of its `needs` runs again (it was skipped
//!   or cancelled behind it, or it failed with an input that now changes), to a fixed point. A
//!   completed task runs again only when it is selected itself.
//! - Nothing selected is an error, not an empty run.
//! - A task that does not run again is carried: its result, and the usage it spent in the
//!   parent (its own attempts plus what it carried there).

use crate::ids::TaskId;
use crate::outcome::{TaskResult, TerminalState};
use crate::spec::Batch;
use crate::state::{RunState, RunStatus};
use crate::usage::Usage;

/// What the user asked to run again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// The tasks that failed.
    pub failed: bool,
    /// The tasks that ended partial.
    pub partial: bool,
    /// The tasks that timed out.
    pub timeout: bool,
    /// These tasks by label, whatever their end.
    pub tasks: Vec<String>,
}

impl Selection {
    /// Whether any selector is set (none: every task that did not complete runs again).
    fn by_state(&self) -> bool {
        self.failed || self.partial || self.timeout || !self.tasks.is_empty()
    }

    /// Whether a task with this label and end is selected by itself (before the closure).
    fn picks(&self, label: &str, end: Option<TerminalState>) -> bool {
        if !self.by_state() {
            return end != Some(TerminalState::Completed);
        }
        self.tasks.iter().any(|l| l == label)
            || (self.failed && end == Some(TerminalState::Failed))
            || (self.partial && end == Some(TerminalState::Partial))
            || (self.timeout && end == Some(TerminalState::Timeout))
    }
}

/// A task carried from the parent run: not run again, its end kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// The task.
    pub task: TaskId,
    /// Its result in the parent run.
    pub result: TaskResult,
    /// The usage it spent in the parent (and what it carried there).
    pub usage: Usage,
}

/// What a rerun does: the parent's batch, which tasks run again, which are carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerunPlan {
    /// The parent's batch, which the rerun runs again.
    pub batch: Batch,
    /// The parent's batch digest.
    pub digest: u64,
    /// Per task (by `TaskId`): whether it runs again.
    pub selected: Vec<bool>,
    /// The tasks that do not run again and have a result, in task order.
    pub carried: Vec<Carried>,
}

/// Why a rerun cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RerunError {
    /// The run has not finished (it may be resumed instead).
    #[error("the run has not finished")]
    NotFinished,
    /// The run has no batch.
    #[error("the run has no batch")]
    NoBatch,
    /// A label named no task of the run.
    #[error("the run has no task {0:?}")]
    NoSuchTask(String),
    /// No task matches the selection.
    #[error("no task matches")]
    NothingSelected,
}

/// Plans a rerun of the finished run `state` for the user's `selection` (see the module doc).
pub fn select(state: &RunState, selection: &Selection) -> Result<RerunPlan, RerunError> {
    if !matches!(state.status, RunStatus::Finished { .. }) {
        return Err(RerunError::NotFinished);
    }
    let Some(batch) = &state.batch else {
        return Err(RerunError::NoBatch);
    };
    if let Some(label) = selection
        .tasks
        .iter()
        .find(|l| state.task_by_label(l).is_none())
    {
        return Err(RerunError::NoSuchTask(label.clone()));
    }
    let ends: Vec<Option<TerminalState>> = state
        .tasks
        .iter()
        .map(|rec| rec.result().map(|r| r.state))
        .collect();
    let mut selected: Vec<bool> = batch
        .tasks
        .iter()
        .zip(&ends)
        .map(|(spec, end)| selection.picks(&spec.label, *end))
        .collect();
    close_over_needs(state, batch, &ends, &mut selected);
    if !selected.contains(&true) {
        return Err(RerunError::NothingSelected);
    }
    let carried = state
        .tasks
        .iter()
        .enumerate()
        .filter(|(i, _)| !selected.get(*i).copied().unwrap_or(false))
        .filter_map(|(i, rec)| {
            let result = rec.result()?.clone();
            let usage = rec
                .usage()
                .plus(&rec.steps().carried.unwrap_or(Usage::ZERO));
            Some(Carried {
                task: TaskId(u32::try_from(i).ok()?),
                result,
                usage,
            })
        })
        .collect();
    Ok(RerunPlan {
        batch: batch.clone(),
        digest: state.batch_digest,
        selected,
        carried,
    })
}

/// Selects every task that did not complete and needs a selected one, until none is added.
fn close_over_needs(
    state: &RunState,
    batch: &Batch,
    ends: &[Option<TerminalState>],
    selected: &mut [bool],
) {
    loop {
        let mut grew = false;
        for (i, spec) in batch.tasks.iter().enumerate() {
            let completed = ends.get(i).copied().flatten() == Some(TerminalState::Completed);
            if selected.get(i).copied().unwrap_or(true) || completed {
                continue;
            }
            let behind = spec.needs.iter().any(|n| {
                state
                    .task_by_label(n)
                    .is_some_and(|t| selected.get(t.index()).copied().unwrap_or(false))
            });
            if behind {
                selected[i] = true;
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
}
