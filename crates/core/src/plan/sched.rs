//! The planner's indexes over the state, so that a round does not scan every task.
//!
//! They are caches: rebuilt from the state on start and resume, and kept current by observing
//! each applied event (only the event's own task moves).

use std::collections::{BTreeMap, BTreeSet};

use crate::event::Event;
use crate::ids::{TaskId, Timestamp};
use crate::outcome::Phase;
use crate::state::{RunState, TaskState};

/// Indexes of the tasks by what the planner looks for.
#[derive(Debug, Default, Clone)]
pub(crate) struct Sched {
    /// Tasks in `Queued`, by (ready time, id): FIFO launch order.
    pub(crate) queued: BTreeSet<(Timestamp, TaskId)>,
    /// Tasks in `Retrying`, by (not before, id).
    pub(crate) retrying: BTreeSet<(Timestamp, TaskId)>,
    /// The `retrying` key of each retrying task.
    retry_at: BTreeMap<TaskId, Timestamp>,
    /// Tasks in `Ended`.
    pub(crate) ended: BTreeSet<TaskId>,
    /// Pending tasks to look at (their dependencies may have ended).
    pub(crate) check_pending: Vec<TaskId>,
    /// Dependents of each task (empty when no task has any: a batch of independent tasks
    /// holds no empty list per task).
    dependents: Vec<Vec<TaskId>>,
    /// Deadlines of unfinished tasks that have one, by (deadline, id).
    deadlines: BTreeSet<(Timestamp, TaskId)>,
    /// #13: the task of each task's session listed just before it (an implicit dependency);
    /// empty when no task has a session.
    pub(crate) session_prev: Vec<Option<TaskId>>,
}

impl Sched {
    /// The indexes of `state`.
    pub(crate) fn new(state: &RunState) -> Sched {
        let mut s = Sched::default();
        let Some(batch) = &state.batch else { return s };
        let n = batch.tasks.len();
        let depend = |dependents: &mut Vec<Vec<TaskId>>, dep: TaskId, on_it: usize| {
            if dependents.is_empty() {
                *dependents = vec![Vec::new(); n];
            }
            if let Some(d) = dependents.get_mut(dep.index()) {
                d.push(TaskId(on_it as u32));
            }
        };
        for (i, spec) in batch.tasks.iter().enumerate() {
            for need in &spec.needs {
                if let Some(dep) = state.task_by_label(need) {
                    depend(&mut s.dependents, dep, i);
                }
            }
        }
        s.session_prev = crate::session::session_links(batch)
            .into_iter()
            .map(|p| p.map(|p| TaskId(p as u32)))
            .collect();
        for (i, prev) in s.session_prev.iter().enumerate() {
            if let Some(prev) = prev {
                depend(&mut s.dependents, *prev, i);
            }
        }
        for i in 0..state.tasks.len() {
            s.index_task(state, TaskId(i as u32));
        }
        s
    }

    /// Indexes a task that is in no index yet (`new` starts from empty ones: removing it
    /// first would scan every index once per task, quadratic in a 100,000-task resume).
    fn index_task(&mut self, state: &RunState, task: TaskId) {
        let Some(rec) = state.task(task) else { return };
        match &rec.state {
            TaskState::Pending => self.check_pending.push(task),
            TaskState::Queued { since } => {
                self.queued.insert((*since, task));
            }
            TaskState::Retrying { not_before, .. } => {
                self.retrying.insert((*not_before, task));
                self.retry_at.insert(task, *not_before);
            }
            TaskState::Ended { .. } => {
                self.ended.insert(task);
            }
            TaskState::Running { .. } | TaskState::Finished(_) => {}
        }
        if let Some(at) = state.spec(task).and_then(|s| rec.deadline_at(s))
            && !rec.state.is_terminal()
        {
            self.deadlines.insert((at, task));
        }
    }

    /// Moves `event`'s task in the indexes; `state` has the event applied.
    pub(crate) fn observe(&mut self, state: &RunState, event: &Event) {
        if let Event::Control { .. } = event {
            return; // the planner reads `state.control` each round
        }
        let Some(task) = event.task() else { return };
        let Some(rec) = state.task(task) else { return };
        match &rec.state {
            TaskState::Queued { since } if matches!(event, Event::TaskQueued { .. }) => {
                self.queued.insert((*since, task));
                if let Some(at) = state.spec(task).and_then(|s| rec.deadline_at(s)) {
                    self.deadlines.insert((at, task));
                }
            }
            TaskState::Running { .. } if matches!(event, Event::AttemptLaunching { .. }) => {
                self.forget_waiting(state, task);
            }
            TaskState::Ended { .. } => {
                self.ended.insert(task);
            }
            TaskState::Retrying { not_before, .. } => {
                self.ended.remove(&task);
                self.retrying.insert((*not_before, task));
                self.retry_at.insert(task, *not_before);
            }
            TaskState::Finished(_) => {
                self.forget_waiting(state, task);
                self.ended.remove(&task);
                if let Some(at) = state.spec(task).and_then(|s| rec.deadline_at(s)) {
                    self.deadlines.remove(&(at, task));
                }
                if let Some(deps) = self.dependents.get(task.index()) {
                    self.check_pending.extend(deps.iter().copied());
                }
            }
            _ => {}
        }
    }

    /// Takes a task out of the queued and retrying indexes by their keys (`TaskQueued` sets
    /// `since` to `ready_at`), without a scan: O(log n) per launch in a 100,000-task run.
    fn forget_waiting(&mut self, state: &RunState, task: TaskId) {
        if let Some(ready) = state.task(task).and_then(|r| r.ready_at) {
            self.queued.remove(&(ready, task));
        }
        if let Some(at) = self.retry_at.remove(&task) {
            self.retrying.remove(&(at, task));
        }
    }

    /// Queued and retrying tasks whose deadline passed, with the phase it hit them in.
    pub(crate) fn expired(&self, state: &RunState, now: Timestamp) -> Vec<(TaskId, Phase)> {
        let mut out: Vec<(TaskId, Phase)> = Vec::new();
        let expired = self
            .deadlines
            .iter()
            .take_while(|(d, _)| *d <= now)
            .map(|&(_, t)| t);
        for task in expired {
            let Some(rec) = state.task(task) else {
                continue;
            };
            match &rec.state {
                TaskState::Queued { .. } => {
                    // A worktree being set up counts as starting.
                    let started = !rec.attempts.is_empty() || rec.steps().worktree.is_some();
                    out.push((
                        task,
                        if started {
                            Phase::Starting
                        } else {
                            Phase::Queued
                        },
                    ));
                }
                TaskState::Retrying { .. } => out.push((task, Phase::Starting)),
                _ => {}
            }
        }
        out
    }

    /// Every queued or retrying task (cancellation and fail_fast end them all).
    pub(crate) fn all_waiting(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.queued
            .iter()
            .chain(self.retrying.iter())
            .map(|&(_, t)| t)
    }

    /// The tasks that may launch now (queued, or retrying and due), oldest first, lazily: the
    /// caller takes as many as it has slots for, skipping those not ready (an isolated task
    /// whose worktree is not set up), so a round looks at no more tasks than it must.
    pub(crate) fn launchable(&self, now: Timestamp) -> impl Iterator<Item = TaskId> + '_ {
        let mut queued = self.queued.iter().copied().peekable();
        let mut due = self
            .retrying
            .iter()
            .copied()
            .take_while(move |(t, _)| *t <= now)
            .peekable();
        std::iter::from_fn(move || {
            let next = match (queued.peek(), due.peek()) {
                (Some(q), Some(r)) if r < q => due.next(),
                (Some(_), _) => queued.next(),
                (None, _) => due.next(),
            };
            next.map(|(_, t)| t)
        })
    }

    /// The next future time something falls due (a retry or a deadline).
    pub(crate) fn next_wake(&self, now: Timestamp) -> Option<Timestamp> {
        let after = |set: &BTreeSet<(Timestamp, TaskId)>| {
            set.range((Timestamp(now.0.saturating_add(1)), TaskId(0))..)
                .next()
                .map(|&(t, _)| t)
        };
        match (after(&self.retrying), after(&self.deadlines)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
