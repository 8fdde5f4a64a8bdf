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

/// Up to this many models, [`Ledger::add`] finds a model's entry by looking at each.
const FEW_MODELS: usize = 8;

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
        // A run uses a few models: found by a look at each, without allocating the key (a
        // BTreeMap<Option<String>, _> is searched with an owned key only).
        let known = if self.models.len() <= FEW_MODELS {
            self.models
                .iter_mut()
                .find(|(k, _)| k.as_deref() == model)
                .map(|(_, m)| m)
        } else {
            None
        };
        let m = match known {
            Some(m) => m,
            None => self
                .models
                .entry(model.map(str::to_owned))
                .or_insert(Usage::ZERO),
        };
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
                None => return Some(missing_from_other(*task)),
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

    /// `self.difference(&ledger(state))`, without building the state's ledger: its per-task
    /// sums are made one task at a time and compared as they come (for a 100,000-task run the
    /// second ledger was a map of 100,000 entries, built, searched and dropped after the scan).
    pub fn difference_from_state(&self, state: &RunState) -> Option<String> {
        // Per model and in total, in (task, attempt) order as `ledger` adds them.
        let mut untasked = Ledger::new();
        // The first difference `difference` would find while walking `self.tasks`, and the
        // first task of the state missing from `self` (reported only after those).
        let mut first_walk = None;
        let mut first_missing = None;
        let mut mine = self.tasks.iter().peekable();
        for (i, task) in state.tasks.iter().enumerate() {
            let id = TaskId(u32::try_from(i).unwrap_or(u32::MAX));
            let mut sum: Option<Usage> = None;
            for attempt in &task.attempts {
                let usage = attempt.usage();
                sum = Some(sum.unwrap_or(Usage::ZERO).plus(usage));
                untasked.add_untasked(attempt.model(), usage);
            }
            let Some(sum) = sum else { continue };
            if first_walk.is_some() && first_missing.is_some() {
                continue;
            }
            // Tasks of `self` before this one are missing from the state's ledger.
            while let Some((t, _)) = mine.next_if(|(t, _)| **t < id) {
                first_walk.get_or_insert_with(|| missing_from_other(*t));
            }
            match mine.next_if(|(t, _)| **t == id) {
                Some((_, usage)) if *usage == sum => {}
                Some((_, usage)) => {
                    first_walk
                        .get_or_insert_with(|| format!("task {id}: {usage:?} against {sum:?}"));
                }
                None => {
                    first_missing
                        .get_or_insert_with(|| format!("task {id} is missing from this ledger"));
                }
            }
        }
        if let Some((t, _)) = mine.next() {
            first_walk.get_or_insert_with(|| missing_from_other(*t));
        }
        if self.attempts != untasked.attempts {
            return Some(format!(
                "{} attempts counted against {}",
                self.attempts, untasked.attempts
            ));
        }
        if let Some(d) = first_walk.or(first_missing) {
            return Some(d);
        }
        if self.models != untasked.models {
            return Some(format!(
                "per-model usage differs: {:?} against {:?}",
                self.models, untasked.models
            ));
        }
        if self.total != untasked.total {
            return Some(format!(
                "total {:?} against {:?}",
                self.total, untasked.total
            ));
        }
        None
    }
}

/// What [`Ledger::difference`] says of a task the other ledger lacks.
fn missing_from_other(task: TaskId) -> String {
    format!("task {task} is missing from the other ledger")
}

impl Ledger {
    /// The ledger of attempts given in (task, attempt) order, as [`Ledger::add`] of each in
    /// turn makes it, but with the per-task map built at once from the sorted sums (inserting
    /// 100,000 tasks one at a time cost audit a tenth of a second). `tasks` is how many tasks
    /// there may be: the vector of sums is made that big at once.
    fn from_ordered<'a>(
        tasks: usize,
        attempts: impl IntoIterator<Item = (TaskId, Option<&'a str>, &'a Usage)>,
    ) -> Ledger {
        let mut ledger = Ledger::new();
        let mut tasks: Vec<(TaskId, Usage)> = Vec::with_capacity(tasks);
        for (task, model, usage) in attempts {
            match tasks.last_mut() {
                Some((t, sum)) if *t == task => *sum = sum.plus(usage),
                last => {
                    debug_assert!(last.is_none_or(|(t, _)| *t < task), "tasks out of order");
                    tasks.push((task, Usage::ZERO.plus(usage)));
                }
            }
            ledger.add_untasked(model, usage);
        }
        ledger.tasks = tasks.into_iter().collect();
        ledger
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
    /// The models seen, each once (a run uses a few): an attempt names its model by index
    /// here, so that counting an attempt allocates nothing.
    models: Vec<Option<String>>,
    /// The attempts of tasks `0..by_task.len()`, by task index. A search per usage report in
    /// a map of every attempt of a big run cost audit more than a tenth of its time, and a
    /// vector per task an allocation per task.
    by_task: Vec<Slot>,
    /// The attempts of any other task: (task, attempt) -> (model, last reported usage).
    attempts: BTreeMap<(TaskId, Attempt), Entry>,
}

/// One attempt as the fold counts it: its model (an index into [`LedgerFold::models`]) and
/// its last reported usage.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    attempt: Attempt,
    model: u32,
    usage: Usage,
}

/// A task's attempts in attempt order: most tasks make one, kept inline.
#[derive(Debug, Clone, Default)]
enum Slot {
    #[default]
    None,
    One(Entry),
    Many(Vec<Entry>),
}

impl Slot {
    fn entries(&self) -> &[Entry] {
        match self {
            Slot::None => &[],
            Slot::One(e) => std::slice::from_ref(e),
            Slot::Many(v) => v,
        }
    }

    /// The entry of `attempt`, the task's last one looked at first (the attempt reporting is
    /// nearly always the task's last).
    fn get_mut(&mut self, attempt: Attempt) -> Option<&mut Entry> {
        match self {
            Slot::None => None,
            Slot::One(e) => (e.attempt == attempt).then_some(e),
            Slot::Many(v) => {
                if v.last().is_some_and(|e| e.attempt == attempt) {
                    return v.last_mut();
                }
                let k = v.binary_search_by_key(&attempt, |e| e.attempt).ok()?;
                v.get_mut(k)
            }
        }
    }

    /// Opens `entry`'s attempt (again: a relaunch starts its usage over), in attempt order.
    fn launch(&mut self, entry: Entry) {
        match self {
            Slot::None => *self = Slot::One(entry),
            Slot::One(e) if e.attempt == entry.attempt => *e = entry,
            Slot::One(e) => {
                let first = *e;
                let mut v = vec![first, entry];
                v.sort_by_key(|e| e.attempt);
                *self = Slot::Many(v);
            }
            Slot::Many(v) => match v.binary_search_by_key(&entry.attempt, |e| e.attempt) {
                Ok(k) => v[k] = entry,
                Err(k) => v.insert(k, entry),
            },
        }
    }
}

impl LedgerFold {
    /// No event seen yet.
    pub fn new() -> LedgerFold {
        LedgerFold::default()
    }

    /// No event seen yet, for a run of `tasks` tasks: their attempts are found by task index
    /// (any other task's in a map, as by [`LedgerFold::new`]; the ledger is the same).
    pub fn with_tasks(tasks: usize) -> LedgerFold {
        let tasks = tasks.min(u32::MAX as usize);
        let mut by_task = Vec::new();
        by_task.resize_with(tasks, Slot::default);
        LedgerFold {
            models: Vec::new(),
            by_task,
            attempts: BTreeMap::new(),
        }
    }

    /// The index of `model` in [`LedgerFold::models`], added if new.
    fn model_index(&mut self, model: Option<&str>) -> u32 {
        let k = match self.models.iter().position(|m| m.as_deref() == model) {
            Some(k) => k,
            None => {
                self.models.push(model.map(str::to_owned));
                self.models.len() - 1
            }
        };
        u32::try_from(k).unwrap_or(u32::MAX)
    }

    /// Takes one event into account (only attempt launches and usage reports count).
    pub fn observe(&mut self, event: &Event) {
        match event {
            Event::AttemptLaunching {
                task,
                attempt,
                model,
            } => {
                let entry = Entry {
                    attempt: *attempt,
                    model: self.model_index(model.as_deref()),
                    usage: Usage::ZERO,
                };
                match self.by_task.get_mut(task.index()) {
                    Some(slot) => slot.launch(entry),
                    None => {
                        self.attempts.insert((*task, *attempt), entry);
                    }
                }
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
                let found = match self.by_task.get_mut(task.index()) {
                    Some(slot) => slot.get_mut(*attempt),
                    None => self.attempts.get_mut(&(*task, *attempt)),
                };
                if let Some(entry) = found {
                    entry.usage = *usage;
                }
            }
            _ => {}
        }
    }

    /// The ledger of the events seen, attempts added in (task, attempt) order.
    pub fn finish(self) -> Ledger {
        let models = &self.models;
        let model = move |e: &Entry| -> Option<&str> {
            usize::try_from(e.model)
                .ok()
                .and_then(|k| models.get(k))
                .and_then(|m| m.as_deref())
        };
        // The tasks by index come first: the map holds only tasks at or past `by_task.len()`.
        let by_index = self.by_task.iter().enumerate().flat_map(|(i, slot)| {
            let task = TaskId(u32::try_from(i).unwrap_or(u32::MAX));
            slot.entries()
                .iter()
                .map(move |e| (task, model(e), &e.usage))
        });
        let by_map = self
            .attempts
            .iter()
            .map(|((task, _), e)| (*task, model(e), &e.usage));
        Ledger::from_ordered(self.by_task.len(), by_index.chain(by_map))
    }
}

/// The ledger of a replayed run: every attempt of every task, counted once with its last known
/// usage (attempts cut short by a crash count with their last checkpoint).
pub fn ledger(state: &RunState) -> Ledger {
    Ledger::from_ordered(
        state.tasks.len(),
        state.tasks.iter().enumerate().flat_map(|(i, task)| {
            let id = TaskId(u32::try_from(i).unwrap_or(u32::MAX));
            task.attempts
                .iter()
                .map(move |attempt| (id, attempt.model(), attempt.usage()))
        }),
    )
}

/// [`ledger`] without its per-task part (`tasks` is empty): per model and in total, what a
/// run's summary prints (the per-task map of a 100,000-task run is megabytes).
pub fn model_ledger(state: &RunState) -> Ledger {
    let mut ledger = Ledger::new();
    for attempt in state.tasks.iter().flat_map(|t| t.attempts.iter()) {
        ledger.add_untasked(attempt.model(), attempt.usage());
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

    proptest::proptest! {
        /// Built at once from attempts in (task, attempt) order, a ledger is the one `add` of
        /// each in turn makes.
        #[test]
        fn a_ledger_built_at_once_is_the_ledger_added_up(
            mut attempts in proptest::collection::vec((0u32..6, 0usize..3, 0u64..1000, 0u64..9), 0..40),
        ) {
            attempts.sort_by_key(|a| a.0);
            let models = [None, Some("a"), Some("b")];
            let usages: Vec<(TaskId, Option<&str>, Usage)> = attempts
                .iter()
                .map(|&(t, m, n, c)| (TaskId(t), models[m], u(n, c)))
                .collect();
            let mut one_by_one = Ledger::new();
            for (t, m, usage) in &usages {
                one_by_one.add(*t, *m, usage);
            }
            let at_once = Ledger::from_ordered(0, usages.iter().map(|(t, m, usage)| (*t, *m, usage)));
            proptest::prop_assert_eq!(at_once, one_by_one);
        }
    }

    #[test]
    fn many_models_are_each_counted_apart() {
        let mut l = Ledger::new();
        for round in 0..2 {
            for m in 0..3 * FEW_MODELS {
                l.add(TaskId(0), Some(&format!("m{m}")), &u(1, round));
            }
            l.add(TaskId(0), None, &u(1, round));
        }
        assert_eq!(l.models.len(), 3 * FEW_MODELS + 1);
        assert!(l.models.values().all(|m| m.input == 2));
        assert_eq!(l.total.input, 2 * (3 * FEW_MODELS as u64 + 1));
    }

    proptest::proptest! {
        /// A fold that finds its tasks by index gives the ledger of the map alone, whatever the
        /// events (tasks below, at and beyond its size, attempts out of order, reports for
        /// attempts never launched, launches repeated).
        #[test]
        fn a_fold_by_task_index_is_the_fold_by_map(
            events in proptest::collection::vec(
                (0u8..4, 0u32..6, 1u32..4, 0usize..3, 0u64..1000), 0..60),
            tasks in 0usize..8,
        ) {
            use crate::outcome::{AttemptOutcome, StopReason};
            let models = [None, Some("a"), Some("b/c")];
            let events: Vec<Event> = events
                .into_iter()
                .map(|(kind, task, attempt, model, n)| {
                    let (task, attempt) = (TaskId(task), Attempt(attempt));
                    match kind {
                        0 => Event::AttemptLaunching {
                            task,
                            attempt,
                            model: models[model].map(str::to_owned),
                        },
                        1 => Event::AttemptFinished {
                            task,
                            attempt,
                            outcome: AttemptOutcome::failed(StopReason::Invalid, String::new()),
                            output: String::new(),
                            usage: u(n, n),
                        },
                        2 => Event::TaskQueued { task },
                        _ => Event::AttemptProgress { task, attempt, usage: u(n, n) },
                    }
                })
                .collect();
            let mut dense = LedgerFold::with_tasks(tasks);
            events.iter().for_each(|e| dense.observe(e));
            proptest::prop_assert_eq!(dense.finish(), Ledger::from_events(&events));
        }
    }

    #[test]
    fn an_empty_run_has_an_empty_ledger() {
        assert_eq!(ledger(&RunState::new()), Ledger::new());
    }
}
