//! #33: a task's check (`verify`), run once its attempt ended completed.

use sortie_core::TaskId;

use super::Engine;

impl Engine {
    /// Starts the check of `task`'s last attempt, journaled as started.
    pub(super) fn start_check(&mut self, task: TaskId) {
        let _ = task;
    }
}
