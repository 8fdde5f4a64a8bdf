//! How a task is shown: the state name that `sortie status`, `replay` and the JSON views print.
//!
//! The journal's [`TaskState`] is what the rules need; a display names two moments it does not:
//! an attempt stopped by an interrupt, waiting for resume to decide its retry (`interrupted`),
//! and a queued task whose worktree is planned but not yet made (`setting-up`). Every display
//! asks here, so they agree.

use crate::outcome::StopReason;
use crate::state::{TaskRecord, TaskState};

impl TaskRecord {
    /// The task's state as displays name it: [`TaskState::name`], except `interrupted` for an
    /// ended task whose last attempt was interrupted and `setting-up` for a queued task whose
    /// planned worktree is not yet set up.
    pub fn display_state(&self) -> &'static str {
        match &self.state {
            TaskState::Ended { .. }
                if self
                    .attempts
                    .last()
                    .and_then(|a| a.outcome())
                    .is_some_and(|o| o.stop_reason == StopReason::Interrupted) =>
            {
                "interrupted"
            }
            TaskState::Queued { .. }
                if self.steps().worktree.is_some() && self.steps().setup.is_none() =>
            {
                "setting-up"
            }
            state => state.name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::OrphanAction;
    use crate::ids::{Attempt, Timestamp};
    use crate::outcome::AttemptOutcome;
    use crate::state::{AttemptEnd, AttemptRecord, OutcomeRecord, PlannedWorktree};

    fn record(state: TaskState) -> TaskRecord {
        let mut rec = TaskRecord::new();
        rec.state = state;
        rec
    }

    fn attempt(end: Option<AttemptEnd>) -> AttemptRecord {
        let mut a = AttemptRecord::new(Attempt(1), None, Timestamp(0));
        a.end = end;
        a
    }

    fn finished(stop_reason: StopReason) -> Option<AttemptEnd> {
        Some(AttemptEnd::Finished {
            outcome: OutcomeRecord::new(&AttemptOutcome::failed(stop_reason, "x"), ""),
            at: Timestamp(1),
        })
    }

    fn worktree() -> PlannedWorktree {
        PlannedWorktree {
            repo: "/r".into(),
            path: "/r/wt".into(),
            branch: "b".into(),
            base: "c".into(),
        }
    }

    #[test]
    fn an_ended_task_whose_last_attempt_was_interrupted_shows_interrupted() {
        let ended = TaskState::Ended {
            attempt: Attempt(1),
        };
        let mut rec = record(ended.clone());
        rec.attempts
            .push(attempt(finished(StopReason::Interrupted)));
        assert_eq!(rec.display_state(), "interrupted");
        // An orphaned attempt counts as interrupted too.
        let mut rec = record(ended.clone());
        rec.attempts.push(attempt(Some(AttemptEnd::Orphaned {
            action: OrphanAction::Gone,
            at: Timestamp(1),
        })));
        assert_eq!(rec.display_state(), "interrupted");
        // Any other stop is the state machine's own name.
        let mut rec = record(ended);
        rec.attempts.push(attempt(finished(StopReason::Invalid)));
        assert_eq!(rec.display_state(), "finishing");
    }

    #[test]
    fn only_an_ended_task_shows_interrupted() {
        let mut rec = record(TaskState::Running {
            attempt: Attempt(1),
        });
        rec.attempts
            .push(attempt(finished(StopReason::Interrupted)));
        assert_eq!(rec.display_state(), "running");
    }

    #[test]
    fn a_queued_task_with_a_planned_worktree_not_yet_set_up_shows_setting_up() {
        let queued = TaskState::Queued {
            since: Timestamp(0),
        };
        let mut rec = record(queued.clone());
        assert_eq!(rec.display_state(), "queued", "no worktree");
        rec.steps_mut().worktree = Some(worktree());
        assert_eq!(rec.display_state(), "setting-up");
        rec.steps_mut().setup = Some(Some("/r/wt".into()));
        assert_eq!(rec.display_state(), "queued", "set up");
        let mut pending = record(TaskState::Pending);
        pending.steps_mut().worktree = Some(worktree());
        assert_eq!(pending.display_state(), "pending", "only a queued task");
    }
}
