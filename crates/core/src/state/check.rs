//! `RunState::check`: whether an event may be applied now, one exhaustive match per event
//! against the run's and the task's state (fencing of stale attempts included).

use super::*;

impl RunState {
    /// Checks that an event may be applied now, without applying it. The runner calls this
    /// before appending, so a journal never receives an event that replay would refuse.
    pub fn check(&self, event: &Event) -> Result<(), Violation> {
        let name = event.name();
        match (&self.status, event) {
            (RunStatus::NotStarted, Event::RunStarted { .. }) => return Ok(()),
            (RunStatus::NotStarted, _) => return Err(Violation::NotStarted { event: name }),
            (_, Event::RunStarted { .. }) => return Err(Violation::AlreadyStarted),
            (RunStatus::Finished { .. }, _) => return Err(Violation::RunEnded { event: name }),
            (RunStatus::Running | RunStatus::Interrupted { .. }, Event::RunResumed { .. }) => {
                return Ok(());
            }
            (RunStatus::Running, Event::RunInterrupted { .. }) => return Ok(()),
            (RunStatus::Running, Event::RunFinished { state, .. }) => {
                let unfinished = self.tasks.iter().filter(|t| !t.state.is_terminal()).count();
                if unfinished > 0 {
                    return Err(Violation::TasksUnfinished { unfinished });
                }
                let expected = self.aggregate();
                if *state != expected {
                    return Err(Violation::WrongAggregate {
                        expected,
                        got: *state,
                    });
                }
                return Ok(());
            }
            (RunStatus::Running, _) => {}
            (RunStatus::Interrupted { .. }, _) => {
                return Err(Violation::RunStatus {
                    event: name,
                    status: self.status_name(),
                });
            }
        }
        // A task event while the run is running.
        let Some(task) = event.task() else {
            return Err(Violation::RunStatus {
                event: name,
                status: self.status_name(),
            });
        };
        let Some(rec) = self.tasks.get(task.index()) else {
            return Err(Violation::UnknownTask { event: name, task });
        };
        let illegal = || Violation::IllegalTransition {
            task,
            label: self.label(task),
            state: rec.state.name(),
            event: name,
        };
        let live = |attempt: Attempt| match rec.state {
            TaskState::Running { attempt: a } if a == attempt => Ok(()),
            TaskState::Running { attempt: a } => Err(Violation::StaleAttempt {
                task,
                event: name,
                live: a,
                got: attempt,
            }),
            _ if rec.state.is_terminal() => Err(illegal()),
            _ => Err(Violation::StaleAttempt {
                task,
                event: name,
                live: Attempt(0),
                got: attempt,
            }),
        };
        let max = self.spec(task).map_or(1, TaskSpec::max_attempts);
        let expected_next = Attempt(rec.attempts.len() as u32 + 1);
        let number_ok = |got: Attempt| {
            if got == expected_next && got.0 <= max {
                Ok(())
            } else {
                Err(Violation::AttemptNumber {
                    task,
                    expected: expected_next,
                    got,
                    max,
                })
            }
        };
        match event {
            Event::TaskQueued { .. } => match rec.state {
                TaskState::Pending => Ok(()),
                _ => Err(illegal()),
            },
            Event::TaskSetUp { .. } => match rec.state {
                TaskState::Queued { .. } if rec.setup.is_none() && rec.worktree_final.is_none() => {
                    Ok(())
                }
                _ => Err(illegal()),
            },
            Event::WorktreePlanned { .. } => match rec.state {
                _ if rec.worktree.is_some() => Err(Violation::Duplicate { task, event: name }),
                TaskState::Queued { .. }
                    if rec.setup.is_none()
                        && rec.attempts.is_empty()
                        && rec.worktree_final.is_none() =>
                {
                    Ok(())
                }
                _ => Err(illegal()),
            },
            Event::AttemptLaunching { attempt, model, .. } => match &rec.state {
                // The worktree is gone once finalized: nothing runs in it again.
                _ if rec.worktree_final.is_some() => Err(illegal()),
                // A planned worktree must exist before anything runs in it.
                _ if rec.worktree.is_some() && rec.setup.is_none() => Err(illegal()),
                TaskState::Queued { .. } => number_ok(*attempt),
                TaskState::Retrying {
                    next,
                    model: scheduled,
                    ..
                } => {
                    if attempt != next {
                        return Err(Violation::AttemptNumber {
                            task,
                            expected: *next,
                            got: *attempt,
                            max,
                        });
                    }
                    number_ok(*attempt)?;
                    if scheduled != model {
                        return Err(Violation::ModelMismatch {
                            task,
                            attempt: *attempt,
                            expected: scheduled.clone(),
                            got: model.clone(),
                        });
                    }
                    Ok(())
                }
                _ => Err(illegal()),
            },
            Event::AttemptStarted { attempt, .. } => {
                live(*attempt)?;
                match rec.attempts.last() {
                    Some(a) if a.pid.is_none() => Ok(()),
                    _ => Err(illegal()),
                }
            }
            Event::AttemptProgress { attempt, usage, .. }
            | Event::AttemptFinished { attempt, usage, .. } => {
                live(*attempt)?;
                match rec.attempts.last() {
                    Some(a) if usage.dominates(&a.usage) => Ok(()),
                    _ => Err(Violation::UsageDecreased {
                        task,
                        attempt: *attempt,
                    }),
                }
            }
            Event::AttemptStalled { attempt, .. } | Event::AttemptOrphaned { attempt, .. } => {
                live(*attempt)
            }
            Event::AttemptSideEffects { attempt, .. } => {
                live(*attempt)?;
                match rec.attempts.last() {
                    Some(a) if a.side_effects => Err(Violation::Duplicate { task, event: name }),
                    Some(_) => Ok(()),
                    None => Err(illegal()),
                }
            }
            Event::AttemptContinues { attempt, .. } => {
                live(*attempt)?;
                match rec.attempts.last() {
                    Some(a) if a.continues.is_some() => {
                        Err(Violation::Duplicate { task, event: name })
                    }
                    // Only before the process exists: it is how the process is started.
                    Some(a) if a.pid.is_none() => Ok(()),
                    _ => Err(illegal()),
                }
            }
            Event::RetryScheduled { next_attempt, .. } => match rec.state {
                // Artifact and worktree steps only come once the task gave up.
                TaskState::Ended { .. }
                    if rec.artifact.is_none() && rec.worktree_final.is_none() =>
                {
                    number_ok(*next_attempt)
                }
                _ => Err(illegal()),
            },
            Event::ArtifactWritten { .. } => match rec.state {
                TaskState::Ended { .. } if rec.worktree_final.is_some() => Err(illegal()),
                TaskState::Ended { .. } if rec.artifact.is_none() => Ok(()),
                TaskState::Ended { .. } => Err(Violation::Duplicate { task, event: name }),
                _ => Err(illegal()),
            },
            Event::WorktreeFinalized { .. } => match rec.state {
                _ if rec.worktree_final.is_some() => {
                    Err(Violation::Duplicate { task, event: name })
                }
                TaskState::Ended { .. } | TaskState::Queued { .. } | TaskState::Retrying { .. }
                    if rec.setup.is_some() || rec.worktree.is_some() =>
                {
                    Ok(())
                }
                _ => Err(illegal()),
            },
            Event::TaskFinished { .. } => match rec.state {
                TaskState::Pending
                | TaskState::Queued { .. }
                | TaskState::Retrying { .. }
                | TaskState::Ended { .. } => Ok(()),
                TaskState::Running { .. } | TaskState::Finished(_) => Err(illegal()),
            },
            Event::RunStarted { .. }
            | Event::RunResumed { .. }
            | Event::RunInterrupted { .. }
            | Event::RunFinished { .. } => Err(illegal()),
        }
    }
}
