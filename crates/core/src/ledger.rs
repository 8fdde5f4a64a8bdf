//! The usage ledger: what a run consumed, per task, per model and in total.
//!
//! A ledger is built by adding each attempt's last known usage exactly once, in (task, attempt)
//! order. [`ledger`] builds it from a replayed [`RunState`]; `sortie audit` builds a second one
//! independently from the raw journal events ([`Ledger::from_events`], or [`LedgerFold`] one
//! event at a time) and compares the two.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::ids::{Attempt, TaskId};
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
        self.add_untasked(model, usage);
    }

    /// [`Ledger::add`] without the per-task part.
    fn add_untasked(&mut self, model: Option<&str>, usage: &Usage) {
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

impl Ledger {
    /// The ledger from the raw events alone, without the state machine: every attempt that an
    /// `AttemptLaunching` opened (on its model), counted once with the last usage an
    /// `AttemptProgress` or `AttemptFinished` reported for it. On a journal replay accepts,
    /// it equals [`ledger`] of the replayed state.
    pub fn from_events<'e>(events: impl IntoIterator<Item = &'e Event>) -> Ledger {
        let mut fold = LedgerFold::new();
        for event in events {
            fold.observe(event);
        }
        fold.finish()
    }
}

/// [`Ledger::from_events`] one event at a time, for a caller that streams them (audit scans a
/// journal that may not fit in memory).
#[derive(Debug, Clone, Default)]
pub struct LedgerFold {
    /// (task, attempt) -> (model, last reported usage).
    attempts: BTreeMap<(TaskId, Attempt), (Option<String>, Usage)>,
}

impl LedgerFold {
    /// No event seen yet.
    pub fn new() -> LedgerFold {
        LedgerFold::default()
    }

    /// Takes one event into account (only attempt launches and usage reports count).
    pub fn observe(&mut self, event: &Event) {
        match event {
            Event::AttemptLaunching {
                task,
                attempt,
                model,
            } => {
                self.attempts
                    .insert((*task, *attempt), (model.clone(), Usage::ZERO));
            }
            Event::AttemptProgress {
                task,
                attempt,
                usage,
            }
            | Event::AttemptFinished {
                task,
                attempt,
                usage,
                ..
            } => {
                if let Some(entry) = self.attempts.get_mut(&(*task, *attempt)) {
                    entry.1 = *usage;
                }
            }
            _ => {}
        }
    }

    /// The ledger of the events seen, attempts added in (task, attempt) order.
    pub fn finish(self) -> Ledger {
        let mut ledger = Ledger::new();
        for ((task, _), (model, usage)) in &self.attempts {
            ledger.add(*task, model.as_deref(), usage);
        }
        ledger
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

/// [`ledger`] without its per-task part (`tasks` is empty): per model and in total, what a
/// run's summary prints (the per-task map of a 100,000-task run is megabytes).
pub fn model_ledger(state: &RunState) -> Ledger {
    let mut ledger = Ledger::new();
    for attempt in state.tasks.iter().flat_map(|t| t.attempts.iter()) {
        ledger.add_untasked(attempt.model.as_deref(), &attempt.usage);
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
    fn from_events_counts_each_launched_attempt_once_with_its_last_report() {
        use crate::outcome::{AttemptOutcome, StopReason};
        let launch = |task, attempt, model: Option<&str>| Event::AttemptLaunching {
            task: TaskId(task),
            attempt: Attempt(attempt),
            model: model.map(str::to_owned),
        };
        let progress = |task, attempt, usage| Event::AttemptProgress {
            task: TaskId(task),
            attempt: Attempt(attempt),
            usage,
        };
        let events = vec![
            launch(1, 1, Some("a")),
            launch(0, 1, None),
            progress(0, 1, u(3, 1)),
            progress(0, 1, u(5, 2)),
            progress(1, 1, u(100, 7)),
            // A report for an attempt never launched counts nothing.
            progress(2, 1, u(1000, 0)),
            Event::AttemptFinished {
                task: TaskId(0),
                attempt: Attempt(1),
                outcome: AttemptOutcome::failed(StopReason::Invalid, "x".to_owned()),
                output: String::new(),
                usage: u(6, 2),
            },
            launch(0, 2, Some("a")),
        ];
        let l = Ledger::from_events(&events);
        let mut expected = Ledger::new();
        expected.add(TaskId(0), None, &u(6, 2));
        expected.add(TaskId(0), Some("a"), &Usage::ZERO);
        expected.add(TaskId(1), Some("a"), &u(100, 7));
        assert_eq!(l, expected);
        assert_eq!(l.attempts, 3);
        assert_eq!(l.total.input, 106);
        let mut fold = LedgerFold::new();
        events.iter().for_each(|e| fold.observe(e));
        assert_eq!(
            fold.finish(),
            l,
            "the fold is from_events one event at a time"
        );
        assert_eq!(Ledger::from_events(std::iter::empty()), Ledger::new());
    }

    #[test]
    fn the_model_ledger_is_the_ledger_without_its_tasks() {
        use crate::ids::{RunId, Seq, Timestamp};
        use crate::spec::{AgentProfile, Batch, RunConfig, TaskSpec};
        let batch = Batch {
            tasks: vec![TaskSpec::new("a", "/w"), TaskSpec::new("b", "/w")],
            agents: AgentProfile::builtins(),
            config: RunConfig::default(),
            source: "t.toml".into(),
        };
        let mut events = vec![Event::RunStarted {
            run_id: RunId::new("r").unwrap(),
            batch,
            batch_digest: 0,
            host: "h".into(),
            pid: 1,
        }];
        for (task, model, input) in [(0, Some("m"), 10), (1, None, 3)] {
            events.push(Event::TaskQueued { task: TaskId(task) });
            events.push(Event::AttemptLaunching {
                task: TaskId(task),
                attempt: Attempt(1),
                model: model.map(str::to_owned),
            });
            events.push(Event::AttemptProgress {
                task: TaskId(task),
                attempt: Attempt(1),
                usage: u(input, input),
            });
        }
        let stamped: Vec<crate::event::Stamped> = events
            .into_iter()
            .enumerate()
            .map(|(i, event)| crate::event::Stamped {
                seq: Seq(i as u64),
                at: Timestamp(1),
                event,
            })
            .collect();
        let state = RunState::replay(&stamped).unwrap();
        let full = ledger(&state);
        let models = model_ledger(&state);
        assert!(models.tasks.is_empty());
        assert_eq!(full.tasks.len(), 2);
        assert_eq!(
            (models.models, models.total, models.attempts),
            (full.models, full.total, full.attempts)
        );
    }

    #[test]
    fn an_empty_run_has_an_empty_ledger() {
        assert_eq!(ledger(&RunState::new()), Ledger::new());
    }
}
