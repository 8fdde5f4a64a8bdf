//! The task-end hook as an effect: once a task's `TaskFinished` is durable, the hook core
//! chose (`sortie_core::hook::task_end`: `--on-task-end`, else the task's, else the run's
//! `on_task_end`) runs with what it is told of the task. It runs in the background: the loop
//! does not wait for it, and its failure is a warning, never the task's.

use std::path::Path;

use sortie_core::{TaskId, TaskResult};

use super::Engine;
use crate::process;

impl Engine {
    /// Runs the task-end hook of `task`, which just ended with `result` (durably), if it has
    /// one.
    pub(super) fn task_end_hook(&self, task: TaskId, result: &TaskResult) {
        let flag = self.on_task_end.as_deref();
        if let Some(hook) = sortie_core::hook::task_end(flag, &self.state, task, result) {
            process::run_hook_in(&hook.command, &hook.env, hook.cwd.as_deref().map(Path::new));
        }
    }
}
