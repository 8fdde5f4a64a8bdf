//! The task-end hook: which command runs when a task ends, where, and what it is told. The
//! runner runs it (`engine/hooks.rs`) once the task's `TaskFinished` is durable; this decides.

use crate::{RunState, TaskId, TaskResult};

/// A task-end hook to run: `sh -c command` in `cwd` with `env` added to sortie's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEndHook {
    /// The shell command.
    pub command: String,
    /// Where it runs: the task's `cwd` for a batch's hook; `None`, sortie's own directory, for
    /// `--on-task-end`.
    pub cwd: Option<String>,
    /// `SORTIE_RUN`, `SORTIE_TASK`, `SORTIE_STATE`, `SORTIE_COST_USD`, `SORTIE_ARTIFACT` and
    /// `SORTIE_ERROR` (the error's first line), in that order.
    pub env: Vec<(String, String)>,
}

/// The hook to run now that `task` ended with `result`, if any: `flag` (`--on-task-end CMD`,
/// run in sortie's directory) wins; else the task's own `on_task_end`, else the run's, both in
/// the task's `cwd` (batch fields, journaled with the batch, so a resume runs them too).
pub fn task_end(
    flag: Option<&str>,
    state: &RunState,
    task: TaskId,
    result: &TaskResult,
) -> Option<TaskEndHook> {
    let (command, cwd) = match flag {
        Some(cmd) => (cmd.to_owned(), None),
        None => {
            let spec = state.spec(task)?;
            let run = state
                .batch
                .as_ref()
                .and_then(|b| b.config.on_task_end.as_deref());
            let cmd = spec.on_task_end.as_deref().or(run)?;
            (cmd.to_owned(), Some(spec.cwd.clone()))
        }
    };
    Some(TaskEndHook {
        command,
        cwd,
        env: environment(state, task, result),
    })
}

/// What a hook is told of the task that ended.
fn environment(state: &RunState, task: TaskId, result: &TaskResult) -> Vec<(String, String)> {
    let rec = state.task(task);
    let usage = rec.map(|r| r.usage()).unwrap_or_default();
    let artifact = rec
        .and_then(|r| r.steps().artifact.as_ref())
        .map(|a| a.path.clone())
        .unwrap_or_default();
    let run = state
        .run_id
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    let error = result
        .error
        .as_deref()
        .and_then(|e| e.lines().next())
        .unwrap_or_default();
    vec![
        ("SORTIE_RUN".to_owned(), run),
        ("SORTIE_TASK".to_owned(), state.label(task)),
        ("SORTIE_STATE".to_owned(), result.state.to_string()),
        (
            "SORTIE_COST_USD".to_owned(),
            format!("{:.6}", usage.cost.usd()),
        ),
        ("SORTIE_ARTIFACT".to_owned(), artifact),
        ("SORTIE_ERROR".to_owned(), error.to_owned()),
    ]
}
