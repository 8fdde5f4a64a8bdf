//! The usage ledger: what a run consumed, per task, per model and in total.
//!
//! A ledger is built by adding each attempt's last known usage exactly once, in (task, attempt)
//! order. [`ledger`] builds it from a replayed [`RunState`]; `sortie audit` builds a second one
//! independently from the raw journal events with [`Ledger::add`] and compares the two.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::TaskId;
use crate::state::RunState;
use crate::usage::Usage;

/// Usage per task, per model and in total.
///
/// Only tasks and models with at least one attempt appear. The model key `None` stands for
/// "the agent's own default model".
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Ledger {
    /// Per task: the sum over its attempts of each attempt's last known usage.
    pub tasks: BTreeMap<TaskId, Usage>,
    /// Per model: the sum over the attempts that used it.
    pub models: BTreeMap<Option<String>, Usage>,
    /// The whole run.
    pub total: Usage,
    /// How many attempts were counted.
    pub attempts: u64,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// Counts one attempt's usage once. Callers add attempts in (task, attempt) order so that
    /// the level `context_tokens` ends up the same however the ledger is built.
    pub fn add(&mut self, task: TaskId, model: Option<&str>, usage: &Usage) {
        let t = self.tasks.entry(task).or_insert(Usage::ZERO);
        *t = t.plus(usage);
        let m = self
            .models
            .entry(model.map(str::to_owned))
            .or_insert(Usage::ZERO);
        *m = m.plus(usage);
        self.total = self.total.plus(usage);
        self.attempts += 1;
    }

    /// Describes the first difference between two ledgers, or `None` when they are equal.
    pub fn difference(&self, other: &Ledger) -> Option<String> {
        if self.attempts != other.attempts {
            return Some(format!(
                "{} attempts counted against {}",
                self.attempts, other.attempts
            ));
        }
        for (task, usage) in &self.tasks {
            match other.tasks.get(task) {
                Some(u) if u == usage => {}
                Some(u) => return Some(format!("task {task}: {usage:?} against {u:?}")),
                None => return Some(format!("task {task} is missing from the other ledger")),
            }
        }
        if let Some(task) = other.tasks.keys().find(|t| !self.tasks.contains_key(t)) {
            return Some(format!("task {task} is missing from this ledger"));
        }
        if self.models != other.models {
            return Some(format!(
                "per-model usage differs: {:?} against {:?}",
                self.models, other.models
            ));
        }
        if self.total != other.total {
            return Some(format!("total {:?} against {:?}", self.total, other.total));
        }
        None
    }
}

/// The ledger of a replayed run: every attempt of every task, counted once with its last known
/// usage (attempts cut short by a crash count with their last checkpoint).
pub fn ledger(state: &RunState) -> Ledger {
    let mut ledger = Ledger::new();
    for (i, task) in state.tasks.iter().enumerate() {
        let id = TaskId(u32::try_from(i).unwrap_or(u32::MAX));
        for attempt in &task.attempts {
            ledger.add(id, attempt.model.as_deref(), &attempt.usage);
        }
    }
    ledger
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Cost;

    fn u(input: u64, ctx: u64) -> Usage {
        Usage {
            input,
            context_tokens: ctx,
            cost: Cost::reported_nanos(input),
            ..Usage::ZERO
        }
    }

    #[test]
    fn counts_each_attempt_once_per_task_model_and_total() {
        let mut l = Ledger::new();
        l.add(TaskId(0), Some("a"), &u(10, 5));
        l.add(TaskId(0), None, &u(1, 0));
        l.add(TaskId(1), Some("a"), &u(100, 7));
        assert_eq!(l.attempts, 3);
        assert_eq!(l.tasks[&TaskId(0)].input, 11);
        assert_eq!(l.models[&Some("a".to_owned())].input, 110);
        assert_eq!(l.models[&None].input, 1);
        assert_eq!((l.total.input, l.total.context_tokens), (111, 7));
        assert_eq!(l.difference(&l.clone()), None);
        let mut other = l.clone();
        other.add(TaskId(2), None, &u(1, 0));
        assert!(l.difference(&other).is_some());
    }

    #[test]
    fn an_empty_run_has_an_empty_ledger() {
        assert_eq!(ledger(&RunState::new()), Ledger::new());
    }
}
