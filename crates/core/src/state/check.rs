//! `RunState::check`: whether an event may be applied now, one exhaustive match per event
//! against the run's and the task's state (fencing of stale attempts included).

use std::collections::HashMap;

use super::*;

impl RunState {
    /// Whether an attempt's report, as the event it would become, adds anything to the state
    /// (report fencing and once-only): it is of the task's live attempt (a late report of an
    /// attempt that ended, or of an earlier one, is not), and a once-only fact not yet recorded
    /// (side effects, the session) or a read offset that moves past the journaled one (only a
    /// placed attempt's). A report that is not news is dropped, not journaled; one that is must
    /// still pass [`RunState::check`].
    pub fn report_is_news(&self, event: &Event) -> bool {
        // #33: a check's verdict, of the task's last attempt while its check runs.
        if let Event::VerifyEnded { task, attempt, .. } = event {
            return self.task(*task).is_some_and(|r| {
                matches!(r.state, TaskState::Ended { .. })
                    && r.attempts
                        .last()
                        .is_some_and(|a| a.attempt == *attempt && a.checking())
            });
        }
        let Some(live) = event
            .task()
            .and_then(|t| self.task(t))
            .and_then(|r| r.live_attempt())
        else {
            return false;
        };
        if Some(live.attempt) != event.attempt() {
            return false;
        }
        match event {
            Event::AttemptSideEffects { .. } => !live.side_effects,
            Event::AttemptSession { .. } => live.session().is_none(),
            Event::SandboxNet { .. } => live.net().is_none(),
            // An adopted attempt takes a slot again: its process was started already.
            Event::AttemptWaiting { .. } => live.waited().is_none() && live.pid.is_none(),
            Event::AttemptRead { offset, .. } => {
                live.placed.as_deref().is_some_and(|p| *offset > p.read)
            }
            _ => true,
        }
    }

    /// #37: a worktree may be discarded once its task kept it, once.
    fn check_discarded(&self, task: TaskId) -> Result<(), Violation> {
        let Some(rec) = self.tasks.get(task.index()) else {
            return Err(Violation::UnknownTask {
                event: "WorktreeDiscarded",
                task,
            });
        };
        match (&rec.steps().worktree_final, &rec.steps().discarded) {
            (Some((true, _)), None) => Ok(()),
            (Some((true, _)), Some(_)) => Err(Violation::Duplicate {
                task,
                event: "WorktreeDiscarded",
            }),
            _ => Err(Violation::IllegalTransition {
                task,
                label: self.label(task),
                state: rec.state.name(),
                event: "WorktreeDiscarded",
            }),
        }
    }

    /// Checks that an event may be applied now, without applying it. The runner calls this
    /// before appending, so a journal never receives an event that replay would refuse.
    pub fn check(&self, event: &Event) -> Result<(), Violation> {
        let name = event.name();
        match (&self.status, event) {
            (RunStatus::NotStarted, Event::RunStarted { .. }) => return Ok(()),
            (RunStatus::NotStarted, _) => return Err(Violation::NotStarted { event: name }),
            (_, Event::RunStarted { .. }) => return Err(Violation::AlreadyStarted),
            // Recover says so whatever the run's state: a finished run's end may have survived.
            (_, Event::RunRecovered { .. }) => return Ok(()),
            // #37: a kept worktree may be removed after the run's end.
            (_, Event::WorktreeDiscarded { task, .. }) => return self.check_discarded(*task),
            (RunStatus::Finished { .. }, _) => return Err(Violation::RunEnded { event: name }),
            (RunStatus::Running | RunStatus::Interrupted { .. }, Event::RunResumed { .. }) => {
                return Ok(());
            }
            (RunStatus::Running, Event::RunInterrupted { .. }) => return Ok(()),
            (RunStatus::Running, Event::RunBudgetWarned { limit, .. }) => {
                if self.budget_warned.contains(limit) {
                    return Err(Violation::BudgetTwice {
                        event: name,
                        limit: *limit,
                    });
                }
                return Ok(());
            }
            (RunStatus::Running, Event::RunRerunOf { .. }) => {
                if self.parent.is_some() {
                    return Err(Violation::RerunTwice);
                }
                return Ok(());
            }
            (RunStatus::Running, Event::RunBudgetExceeded { limit, .. }) => {
                if self.budget_exceeded.is_some() {
                    return Err(Violation::BudgetTwice {
                        event: name,
                        limit: *limit,
                    });
                }
                return Ok(());
            }
            (RunStatus::Running, Event::Control { action, .. }) => {
                return self.check_control(action);
            }
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
        self.check_task_event(event, task, rec)
    }

    /// Checks a round of events as one: accepts it exactly when checking each event, then
    /// applying it (at `at`), one after the other on a copy of the state would, and refuses
    /// it with the first refusal that would meet. The runner appends an accepted round in one
    /// durable write, then applies its events in order.
    ///
    /// A round of task events only (no run event, no control) is checked without a copy: a
    /// task event changes nothing that another task's check reads, so each event is checked
    /// against the state, its task's record projected through the round's earlier events of
    /// that task (`mutate_task`, as apply does). A round with a run event or a control among
    /// several events is checked on a copy of the state (rare: a rerun's prelude).
    pub fn check_round(&self, at: Timestamp, events: &[Event]) -> Result<(), Violation> {
        let [first, rest @ ..] = events else {
            return Ok(());
        };
        if rest.is_empty() {
            return self.check(first);
        }
        let task_event = |e: &Event| !matches!(e, Event::Control { .. }) && e.task().is_some();
        if !events.iter().all(task_event) {
            let mut copy = self.clone();
            for e in events {
                copy.check(e)?;
                copy.mutate(at, e);
            }
            return Ok(());
        }
        // The tasks with several events in the round (none in a round that queues a whole
        // batch: its events are checked against the state, no map of them built).
        let mut tasks: Vec<TaskId> = events.iter().filter_map(Event::task).collect();
        tasks.sort_unstable();
        let repeated: Vec<TaskId> = tasks
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        drop(tasks);
        if repeated.is_empty() {
            return events.iter().try_for_each(|e| self.check(e));
        }
        // How many events of each repeated task are still to come.
        let mut left: HashMap<TaskId, usize> = HashMap::new();
        for e in events {
            if let Some(task) = e.task()
                && repeated.binary_search(&task).is_ok()
            {
                *left.entry(task).or_insert(0) += 1;
            }
        }
        // Only the records of tasks with several events in the round are projected.
        let mut projected: HashMap<TaskId, TaskRecord> = HashMap::new();
        // The projections' placements share nothing with the state's: they are dropped.
        let mut strings = Interner::default();
        for e in events {
            let Some(task) = e.task() else { continue };
            match projected.get(&task) {
                Some(rec) if self.status == RunStatus::Running => {
                    self.check_task_event(e, task, rec)?;
                }
                _ => self.check(e)?,
            }
            let remaining = left.get_mut(&task).map_or(0, |n| {
                *n -= 1;
                *n
            });
            if remaining > 0 {
                let base = match projected.remove(&task) {
                    Some(rec) => Some(rec),
                    None => self.tasks.get(task.index()).cloned(),
                };
                if let Some(mut rec) = base {
                    Self::mutate_task(&mut rec, at, e, self.resumes, &mut strings);
                    projected.insert(task, rec);
                }
            } else {
                projected.remove(&task);
            }
        }
        Ok(())
    }

    /// Checks a task event against the task's record `rec` (the run is running).
    fn check_task_event(
        &self,
        event: &Event,
        task: TaskId,
        rec: &TaskRecord,
    ) -> Result<(), Violation> {
        let name = event.name();
        let cx = TaskCheck {
            run: self,
            task,
            rec,
            name,
        };
        // #33: a task whose check runs takes nothing but its verdict (a cancel ends it after).
        if matches!(rec.state, TaskState::Ended { .. })
            && rec.attempts.last().is_some_and(AttemptRecord::checking)
            && !matches!(event, Event::VerifyEnded { .. })
        {
            return Err(cx.illegal());
        }
        match event {
            Event::AttemptLaunching { .. }
            | Event::AttemptStarted { .. }
            | Event::AttemptProgress { .. }
            | Event::AttemptFinished { .. }
            | Event::AttemptStalled { .. }
            | Event::AttemptOrphaned { .. }
            | Event::AttemptSideEffects { .. }
            | Event::AttemptContinues { .. }
            | Event::AttemptSession { .. }
            | Event::AttemptWaiting { .. }
            | Event::SandboxNet { .. } => cx.attempt_event(event),
            Event::AttemptPlaced { .. }
            | Event::AttemptHandle { .. }
            | Event::AttemptAdopted { .. }
            | Event::AttemptRecorded { .. }
            | Event::AttemptRead { .. } => cx.placed_event(event),
            _ => cx.task_event(event),
        }
    }
}

/// One task event being checked: the task's record, and the shapes of refusal.
struct TaskCheck<'a> {
    run: &'a RunState,
    task: TaskId,
    rec: &'a TaskRecord,
    name: &'static str,
}

impl TaskCheck<'_> {
    fn illegal(&self) -> Violation {
        Violation::IllegalTransition {
            task: self.task,
            label: self.run.label(self.task),
            state: self.rec.state.name(),
            event: self.name,
        }
    }

    fn duplicate(&self) -> Violation {
        Violation::Duplicate {
            task: self.task,
            event: self.name,
        }
    }

    /// A report must be about the live attempt (fencing).
    fn live(&self, attempt: Attempt) -> Result<(), Violation> {
        match self.rec.state {
            TaskState::Running { attempt: a } if a == attempt => Ok(()),
            TaskState::Running { attempt: a } => Err(Violation::StaleAttempt {
                task: self.task,
                event: self.name,
                live: a,
                got: attempt,
            }),
            _ if self.rec.state.is_terminal() => Err(self.illegal()),
            _ => Err(Violation::StaleAttempt {
                task: self.task,
                event: self.name,
                live: Attempt(0),
                got: attempt,
            }),
        }
    }

    /// #33: `VerifyStarted` (`ended = false`) or `VerifyEnded` of `attempt`.
    fn verify_event(&self, attempt: Attempt, ended: bool) -> Result<(), Violation> {
        let TaskState::Ended { attempt: last } = self.rec.state else {
            return Err(self.illegal());
        };
        let Some(rec) = self.rec.attempts.last() else {
            return Err(self.illegal());
        };
        let has_check = self.run.spec(self.task).is_some_and(|s| s.verify.is_some());
        let completed = rec
            .outcome()
            .is_some_and(|o| o.status == crate::outcome::AttemptStatus::Completed);
        if last != attempt || rec.attempt != attempt || !has_check || !completed {
            return Err(self.illegal());
        }
        if self.rec.steps().artifact.is_some() || self.rec.steps().worktree_final.is_some() {
            return Err(self.illegal());
        }
        match (ended, rec.verify_started(), rec.verdict()) {
            (_, _, Some(_)) => Err(self.duplicate()),
            (false, true, None) => Err(self.duplicate()),
            (false, false, None) | (true, true, None) => Ok(()),
            (true, false, None) => Err(self.illegal()),
        }
    }

    /// The most attempts allowed: retries and fallbacks, plus the orphans so far within
    /// `max_orphans` (a crash of sortie spends no retry), plus every attempt an interrupt of
    /// sortie ended (nor does an interrupt).
    fn max(&self) -> u32 {
        let orphans = self.rec.attempts.iter().filter(|a| a.orphaned()).count() as u32;
        self.run.spec(self.task).map_or(1, |s| {
            // Issue 14: rate-limited attempts spend `max_rate_limits`, not a retry.
            let limited = crate::decide::rate_limited_attempts(s, self.rec);
            s.max_attempts_with(orphans)
                .saturating_add(limited.min(s.max_rate_limits))
                .saturating_add(crate::decide::interrupted_attempts(s, self.rec))
                // #33: a feedback round is an attempt too, within `verify_rounds`.
                .saturating_add(crate::verify::failed_checks(self.rec).min(s.verify_rounds))
        })
    }

    /// A new attempt must be the next one, within the spec's attempts.
    fn number_ok(&self, got: Attempt) -> Result<(), Violation> {
        let expected = Attempt(self.rec.attempts.len() as u32 + 1);
        let max = self.max();
        if got == expected && got.0 <= max {
            Ok(())
        } else {
            Err(Violation::AttemptNumber {
                task: self.task,
                expected,
                got,
                max,
            })
        }
    }

    /// An attempt's events: launching (numbered, on the scheduled model, in a set-up
    /// worktree) and the live attempt's reports.
    fn attempt_event(&self, event: &Event) -> Result<(), Violation> {
        match event {
            Event::AttemptLaunching { attempt, model, .. } => match &self.rec.state {
                // The worktree is gone once finalized: nothing runs in it again.
                _ if self.rec.steps().worktree_final.is_some() => Err(self.illegal()),
                // A planned worktree must exist before anything runs in it.
                _ if self.rec.steps().worktree.is_some() && self.rec.steps().setup.is_none() => {
                    Err(self.illegal())
                }
                TaskState::Queued { .. } => self.number_ok(*attempt),
                TaskState::Retrying {
                    next,
                    model: scheduled,
                    ..
                } => {
                    if attempt != next {
                        return Err(Violation::AttemptNumber {
                            task: self.task,
                            expected: *next,
                            got: *attempt,
                            max: self.max(),
                        });
                    }
                    self.number_ok(*attempt)?;
                    if scheduled != model {
                        return Err(Violation::ModelMismatch {
                            task: self.task,
                            attempt: *attempt,
                            expected: scheduled.clone(),
                            got: model.clone(),
                        });
                    }
                    Ok(())
                }
                _ => Err(self.illegal()),
            },
            Event::AttemptStarted { attempt, .. } => {
                self.live(*attempt)?;
                match self.rec.attempts.last() {
                    Some(a) if a.pid.is_none() => Ok(()),
                    _ => Err(self.illegal()),
                }
            }
            Event::AttemptProgress { attempt, usage, .. }
            | Event::AttemptFinished { attempt, usage, .. } => {
                self.live(*attempt)?;
                match self.rec.attempts.last() {
                    Some(a) if usage.dominates(a.usage()) => Ok(()),
                    _ => Err(Violation::UsageDecreased {
                        task: self.task,
                        attempt: *attempt,
                    }),
                }
            }
            Event::AttemptStalled { attempt, .. } | Event::AttemptOrphaned { attempt, .. } => {
                self.live(*attempt)
            }
            Event::AttemptSideEffects { attempt, .. } => {
                self.live(*attempt)?;
                match self.rec.attempts.last() {
                    Some(a) if a.side_effects => Err(self.duplicate()),
                    Some(_) => Ok(()),
                    None => Err(self.illegal()),
                }
            }
            Event::AttemptContinues { attempt, .. } => {
                self.live(*attempt)?;
                match self.rec.attempts.last() {
                    Some(a) if a.continues().is_some() => Err(self.duplicate()),
                    // Only before the process exists: it is how the process is started.
                    Some(a) if a.pid.is_none() => Ok(()),
                    _ => Err(self.illegal()),
                }
            }
            // #37: before its process exists, once.
            Event::AttemptWaiting { attempt, .. } => {
                self.live(*attempt)?;
                match self.rec.attempts.last() {
                    Some(a) if a.waited().is_some() => Err(self.duplicate()),
                    Some(a) if a.pid.is_none() => Ok(()),
                    _ => Err(self.illegal()),
                }
            }
            Event::AttemptSession {
                attempt, session, ..
            } => {
                self.live(*attempt)?;
                match self.rec.attempts.last() {
                    Some(a) if a.session().is_some() => Err(self.duplicate()),
                    Some(_) if session.is_empty() => Err(self.illegal()),
                    Some(_) => Ok(()),
                    None => Err(self.illegal()),
                }
            }
            // #34: once, while the attempt is live (just before its end).
            Event::SandboxNet { attempt, .. } => {
                self.live(*attempt)?;
                match self.rec.attempts.last() {
                    Some(a) if a.net().is_some() => Err(self.duplicate()),
                    Some(_) => Ok(()),
                    None => Err(self.illegal()),
                }
            }
            _ => Err(self.illegal()),
        }
    }

    /// The placed attempt's events: placed before its process exists, its executor's id
    /// once, and what a resume found of it (once per resume).
    fn placed_event(&self, event: &Event) -> Result<(), Violation> {
        let (Event::AttemptPlaced { attempt, .. }
        | Event::AttemptHandle { attempt, .. }
        | Event::AttemptAdopted { attempt, .. }
        | Event::AttemptRecorded { attempt, .. }
        | Event::AttemptRead { attempt, .. }) = event
        else {
            return Err(self.illegal());
        };
        self.live(*attempt)?;
        let Some(a) = self.rec.attempts.last() else {
            return Err(self.illegal());
        };
        match (event, a.placed.as_deref()) {
            (Event::AttemptPlaced { .. }, Some(_)) => Err(self.duplicate()),
            (Event::AttemptPlaced { .. }, None) if a.pid.is_none() => Ok(()),
            // #32: after `sortie recover`, a started attempt whose placement is not in the
            // journal (an ended direct attempt) is placed from its files, so resume records it.
            (Event::AttemptPlaced { .. }, None) if !self.run.recovered.is_empty() => Ok(()),
            (Event::AttemptHandle { .. }, Some(p)) if p.handle.is_some() => Err(self.duplicate()),
            (Event::AttemptHandle { .. }, Some(_)) => Ok(()),
            (Event::AttemptRead { offset, .. }, Some(p)) if *offset >= p.read => Ok(()),
            // Only a resume finds an attempt, once.
            (Event::AttemptAdopted { .. } | Event::AttemptRecorded { .. }, Some(p)) => {
                match p.found {
                    Some((at, _)) if at == self.run.resumes => Err(self.duplicate()),
                    _ if self.run.resumes == 0 => Err(self.illegal()),
                    _ => Ok(()),
                }
            }
            _ => Err(self.illegal()),
        }
    }

    /// The task's own steps: queued, set up, worktree planned and finalized, retry, artifact,
    /// finished.
    fn task_event(&self, event: &Event) -> Result<(), Violation> {
        match event {
            Event::TaskQueued { .. } => match self.rec.state {
                TaskState::Pending => Ok(()),
                _ => Err(self.illegal()),
            },
            Event::TaskSetUp { .. } => match self.rec.state {
                TaskState::Queued { .. }
                    if self.rec.steps().setup.is_none()
                        && self.rec.steps().worktree_final.is_none() =>
                {
                    Ok(())
                }
                // #32: after `sortie recover`, a task whose setup was lost with the records (its
                // worktree gone too) is set up again before its retry.
                TaskState::Retrying { .. }
                    if !self.run.recovered.is_empty()
                        && self.rec.steps().setup.is_none()
                        && self.rec.steps().worktree_final.is_none() =>
                {
                    Ok(())
                }
                _ => Err(self.illegal()),
            },
            Event::WorktreePlanned { .. } => match self.rec.state {
                _ if self.rec.steps().worktree.is_some() => Err(self.duplicate()),
                TaskState::Queued { .. }
                    if self.rec.steps().setup.is_none()
                        && self.rec.attempts.is_empty()
                        && self.rec.steps().worktree_final.is_none() =>
                {
                    Ok(())
                }
                // #32: the same after `sortie recover`, whatever attempts were restored.
                TaskState::Queued { .. } | TaskState::Retrying { .. }
                    if !self.run.recovered.is_empty()
                        && self.rec.steps().setup.is_none()
                        && self.rec.steps().worktree_final.is_none() =>
                {
                    Ok(())
                }
                _ => Err(self.illegal()),
            },
            Event::RetryScheduled { next_attempt, .. } => match self.rec.state {
                // Artifact and worktree steps only come once the task gave up.
                TaskState::Ended { .. }
                    if self.rec.steps().artifact.is_none()
                        && self.rec.steps().worktree_final.is_none() =>
                {
                    self.number_ok(*next_attempt)
                }
                _ => Err(self.illegal()),
            },
            Event::ArtifactWritten { .. } => match self.rec.state {
                TaskState::Ended { .. } if self.rec.steps().worktree_final.is_some() => {
                    Err(self.illegal())
                }
                TaskState::Ended { .. } if self.rec.steps().artifact.is_none() => Ok(()),
                TaskState::Ended { .. } => Err(self.duplicate()),
                _ => Err(self.illegal()),
            },
            Event::WorktreeFinalized { .. } => match self.rec.state {
                _ if self.rec.steps().worktree_final.is_some() => Err(self.duplicate()),
                TaskState::Ended { .. } | TaskState::Queued { .. } | TaskState::Retrying { .. }
                    if self.rec.steps().setup.is_some() || self.rec.steps().worktree.is_some() =>
                {
                    Ok(())
                }
                _ => Err(self.illegal()),
            },
            Event::TaskCarried { .. } => match self.rec.state {
                TaskState::Pending if self.rec.attempts.is_empty() => Ok(()),
                _ => Err(self.illegal()),
            },
            // #33: the check of the task's last attempt, ended completed, once; its verdict
            // once, after it started. Before the task's artifact and finalize.
            Event::VerifyStarted { attempt, .. } => self.verify_event(*attempt, false),
            Event::VerifyEnded { attempt, .. } => self.verify_event(*attempt, true),
            Event::TaskFinished { .. } => match self.rec.state {
                TaskState::Pending
                | TaskState::Queued { .. }
                | TaskState::Retrying { .. }
                | TaskState::Ended { .. } => Ok(()),
                TaskState::Running { .. } | TaskState::Finished(_) => Err(self.illegal()),
            },
            // Run events are decided above; attempt events in `attempt_event`.
            _ => Err(self.illegal()),
        }
    }
}

impl RunState {
    /// A control action applies to a running run, on a task that exists and has not finished;
    /// a steer only to a task with a live attempt; a concurrency of at least 1.
    fn check_control(&self, action: &ControlAction) -> Result<(), Violation> {
        let name = "Control";
        if let ControlAction::Concurrency { n: 0 } = action {
            return Err(Violation::IllegalControl {
                why: "the concurrency must be at least 1".into(),
            });
        }
        let Some(task) = action.task() else {
            return Ok(());
        };
        let Some(rec) = self.tasks.get(task.index()) else {
            return Err(Violation::UnknownTask { event: name, task });
        };
        let refuse = |why: &str| {
            Err(Violation::IllegalControl {
                why: format!("task {}: {why}", self.label(task)),
            })
        };
        if rec.state.is_terminal() {
            return refuse("it has finished");
        }
        match action {
            ControlAction::Steer { .. } if rec.live_attempt().is_none() => {
                refuse("it is not running")
            }
            ControlAction::Release { .. } if !self.control.held.contains(&task) => {
                refuse("it is not held")
            }
            ControlAction::Cancel { .. } if self.control.cancelled.contains(&task) => {
                refuse("it is already cancelled")
            }
            _ => Ok(()),
        }
    }
}
