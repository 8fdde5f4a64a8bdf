//! #33: `pick = "first-pass"`. Once one sample of an item ends passed (see `samples`), the
//! item's samples that have not started (pending, queued, retrying) end `cancelled` without
//! starting, its running ones are stopped ([`Action::StopTask`], once per planner: the stop is
//! asked of the runner, and the attempt's end comes back as any stopped attempt's does, its
//! usage kept), and one whose attempt ended meanwhile is not retried, checked nor given a
//! feedback round. A sample whose check runs is left to its verdict.
//!
//! The planner keeps the first-pass items (only samples of such templates are looked at) and
//! the items that have a winner and unfinished samples; both are rebuilt from the state on
//! resume, so the decisions are the same live and after a crash.

use std::collections::{BTreeMap, BTreeSet};

use super::{Action, Planner, Round};
use crate::decide;
use crate::event::Event;
use crate::ids::TaskId;
use crate::outcome::{AttemptOutcome, StopReason, TaskResult, TerminalState};
use crate::samples;
use crate::state::{RunState, TaskRecord, TaskState};
use crate::verify::Pick;

/// The first-pass items of a run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Picks {
    /// Each first-pass item's samples, in batch order.
    items: BTreeMap<String, Vec<TaskId>>,
    /// The item of each of their samples.
    item_of: BTreeMap<TaskId, String>,
    /// Items with a winner and unfinished samples.
    won: BTreeSet<String>,
    /// Samples this planner asked the runner to stop.
    stopped: BTreeSet<TaskId>,
    /// Items a sample of which this round finishes completed: their other samples do not
    /// launch in it.
    deciding: BTreeSet<String>,
}

impl Picks {
    /// The first-pass items of `state`, and those already won.
    pub(crate) fn new(state: &RunState) -> Picks {
        let mut p = Picks::default();
        let Some(batch) = &state.batch else { return p };
        for (i, spec) in batch.tasks.iter().enumerate() {
            if let (Some(Pick::FirstPass), Some(item)) = (spec.pick, &spec.sample_of) {
                let t = TaskId(i as u32);
                p.items.entry(item.clone()).or_default().push(t);
                p.item_of.insert(t, item.clone());
            }
        }
        for (item, samples) in &p.items {
            if !samples::first_pass_losers(state, item, samples).is_empty() {
                p.won.insert(item.clone());
            }
        }
        p
    }

    /// `event` was applied: a sample that finished passed makes its item won.
    pub(crate) fn observe(&mut self, state: &RunState, event: &Event) {
        let Event::TaskFinished { task, .. } = event else {
            return;
        };
        self.stopped.remove(task);
        let Some(item) = self.item_of.get(task) else {
            return;
        };
        if state.task(*task).and_then(samples::passed) == Some(true) {
            self.won.insert(item.clone());
        }
    }

    /// A new round begins.
    pub(crate) fn begin(&mut self) {
        self.deciding.clear();
    }

    /// The round ends `task` with `result`.
    pub(crate) fn ending(&mut self, task: TaskId, result: &TaskResult) {
        if result.state == TerminalState::Completed
            && let Some(item) = self.item_of.get(&task)
        {
            self.deciding.insert(item.clone());
        }
    }

    /// Whether `task` must not launch this round: a sample of its item is finishing passed.
    pub(crate) fn holds(&self, task: TaskId) -> bool {
        self.item_of
            .get(&task)
            .is_some_and(|item| self.deciding.contains(item) || self.won.contains(item))
    }

    /// The error `task` ends with when it lost its item to a winner.
    pub(crate) fn loss(&self, state: &RunState, task: TaskId) -> Option<String> {
        let item = self.item_of.get(&task)?;
        if !self.won.contains(item) {
            return None;
        }
        let samples = self.items.get(item)?;
        let win = samples::winner(state, Pick::FirstPass, samples)?;
        (win != task).then(|| {
            let label = state.spec(win).map_or("?", |s| s.label.as_str());
            samples::first_pass_loser(label, item)
        })
    }
}

impl Planner {
    /// Pass: the samples that lost to a first-pass winner end or are stopped.
    pub(super) fn picked_samples(&mut self, state: &RunState, round: &mut Round<'_>) {
        let won: Vec<String> = self.picks.won.iter().cloned().collect();
        for item in won {
            let Some(samples) = self.picks.items.get(&item) else {
                continue;
            };
            let losers = samples::first_pass_losers(state, &item, samples);
            if losers.is_empty() {
                self.picks.won.remove(&item);
                continue;
            }
            for (task, why) in losers {
                if round.busy(task) {
                    continue;
                }
                let Some(rec) = state.task(task) else {
                    continue;
                };
                match rec.state {
                    TaskState::Pending | TaskState::Queued { .. } | TaskState::Retrying { .. } => {
                        round.end(task, rec, lost_result(rec, &why), false);
                    }
                    TaskState::Running { .. } if !self.picks.stopped.contains(&task) => {
                        self.picks.stopped.insert(task);
                        round.push(Action::StopTask(task, why));
                    }
                    // Ended: `ended_tasks` ends it (see `Picks::loss`); running: asked to stop.
                    _ => {}
                }
            }
        }
    }
}

/// The result of a sample that lost to a first-pass winner before it finished: cancelled, with
/// `why` (its last attempt's error after it, when it ran one).
pub(super) fn lost_result(rec: &TaskRecord, why: &str) -> TaskResult {
    if rec.attempts.is_empty() {
        return decide::result_without_attempt(
            TerminalState::Cancelled,
            StopReason::Cancelled,
            None,
            why,
        );
    }
    let last = rec.attempts.last();
    let outcome = last
        .and_then(|a| a.outcome())
        .unwrap_or_else(|| AttemptOutcome::failed(StopReason::Cancelled, "cancelled"));
    let output = last.and_then(|a| a.output()).unwrap_or_default();
    let mut result = decide::finish_result(rec, &outcome, output);
    result.state = TerminalState::Cancelled;
    result.stop_reason = StopReason::Cancelled;
    result.error = Some(match result.error.take() {
        Some(e) => format!("{why} (last attempt: {e})"),
        None => why.to_owned(),
    });
    result
}
