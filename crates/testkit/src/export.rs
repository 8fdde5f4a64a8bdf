//! The JSON view of `sortie export` (one `{"seq", "at", "event": {"Kind": {...}}}` object a
//! line), and the questions the crash tests and the torture ask of a run's events.
//!
//! Only this module knows the export's shape: when it changes, the tests change here.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Usage summed the way the ledger sums it (`context_tokens` is a level and is left out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Usage {
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Cache reads.
    pub cache_read: u64,
    /// Cache writes.
    pub cache_write: u64,
    /// Reasoning tokens.
    pub reasoning: u64,
    /// Cost, in nano-dollars.
    pub nanos: u64,
    /// Turns whose cost was not reported.
    pub unreported: u64,
    /// Turns.
    pub turns: u64,
}

impl Usage {
    /// The usage in an exported event's `usage` (or the audit ledger's rows and total);
    /// `None` when a counter is missing or not a number.
    pub fn of(u: &Value) -> Option<Usage> {
        let n = |v: &Value| v.as_u64();
        Some(Usage {
            input: n(&u["input"])?,
            output: n(&u["output"])?,
            cache_read: n(&u["cache_read"])?,
            cache_write: n(&u["cache_write"])?,
            reasoning: n(&u["reasoning"])?,
            nanos: n(&u["cost"]["nanos"])?,
            unreported: n(&u["cost"]["unreported"])?,
            turns: n(&u["turns"])?,
        })
    }

    /// What the fake agent (`examples/agents/fake-agent.py`) reports after `turn` of `turns`
    /// turns of `--usage IN,OUT,COST`, the cost given in micro-dollars so that it converts
    /// exactly.
    pub fn fake(input: u64, output: u64, micros: u64, turn: u64, turns: u64) -> Usage {
        Usage {
            input: input * turn / turns,
            output: output * turn / turns,
            nanos: micros * 1000 * turn / turns,
            turns: turn,
            ..Usage::default()
        }
    }

    /// The sum of two usages, counter by counter.
    #[must_use]
    pub fn plus(self, o: Usage) -> Usage {
        Usage {
            input: self.input + o.input,
            output: self.output + o.output,
            cache_read: self.cache_read + o.cache_read,
            cache_write: self.cache_write + o.cache_write,
            reasoning: self.reasoning + o.reasoning,
            nanos: self.nanos + o.nanos,
            unreported: self.unreported + o.unreported,
            turns: self.turns + o.turns,
        }
    }
}

/// The questions asked of any run's exported events (a [`Journal`], or the `Vec` a test read
/// from `sortie export`): the one way the tests pick a task's events.
pub trait Events {
    /// (kind, body) of every event, in order (an event without one kind is left out).
    fn kinds(&self) -> impl Iterator<Item = (&str, &Value)>;

    /// How many events of `kind` the run has.
    fn count(&self, kind: &str) -> usize {
        self.kinds().filter(|(k, _)| *k == kind).count()
    }

    /// Bodies of the events of `kind` about task number `task`, in order.
    fn of(&self, task: u64, kind: &str) -> Vec<&Value> {
        self.kinds()
            .filter(|(k, b)| *k == kind && b["task"].as_u64() == Some(task))
            .map(|(_, b)| b)
            .collect()
    }

    /// Whether the run has an event of `kind` about `task`.
    fn has(&self, task: u64, kind: &str) -> bool {
        !self.of(task, kind).is_empty()
    }

    /// The journal's clock: the time (`at`, ms) of its last event (0: none).
    fn clock(&self) -> u64;

    /// When the first event of `kind` was journaled (`at`, ms), if one was.
    fn first_at(&self, kind: &str) -> Option<u64>;
}

impl Events for [Value] {
    fn kinds(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.iter().filter_map(kind_of)
    }

    fn clock(&self) -> u64 {
        self.iter()
            .filter_map(|e| e["at"].as_u64())
            .max()
            .unwrap_or(0)
    }

    fn first_at(&self, kind: &str) -> Option<u64> {
        self.iter()
            .find(|e| kind_of(e).is_some_and(|(k, _)| k == kind))
            .and_then(|e| e["at"].as_u64())
    }
}

/// A run's exported events, each checked to be an object with an `event` of one kind. It
/// derefs to its events, so [`Events`] asks it its questions.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    events: Vec<Value>,
}

impl std::ops::Deref for Journal {
    type Target = [Value];

    fn deref(&self) -> &[Value] {
        &self.events
    }
}

impl Journal {
    /// Parses `sortie export`'s stdout.
    pub fn parse(stdout: &[u8]) -> Result<Journal, String> {
        let events = String::from_utf8_lossy(stdout)
            .lines()
            .map(|l| serde_json::from_str(l).map_err(|e| format!("export line {l:?}: {e}")))
            .collect::<Result<Vec<Value>, String>>()?;
        Journal::from_events(events)
    }

    /// The journal of events already parsed; an error names the first that has no kind.
    pub fn from_events(events: Vec<Value>) -> Result<Journal, String> {
        if let Some(bad) = events.iter().find(|e| kind_of(e).is_none()) {
            return Err(format!("an exported event without one kind: {bad}"));
        }
        Ok(Journal { events })
    }

    /// Every event, as exported.
    pub fn events(&self) -> &[Value] {
        &self.events
    }

    /// Whether an event of `kind` about `task` matching `pred` follows the event `first` of
    /// the task's `attempt`.
    pub fn after(
        &self,
        task: u64,
        first: &str,
        attempt: u64,
        kind: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> bool {
        let mut seen = false;
        for (k, b) in self.kinds() {
            if b["task"].as_u64() != Some(task) {
                continue;
            }
            if k == first && b["attempt"].as_u64() == Some(attempt) {
                seen = true;
            } else if seen && k == kind && pred(b) {
                return true;
            }
        }
        false
    }

    /// Tasks with `TaskFinished`.
    pub fn finished(&self) -> BTreeSet<u64> {
        self.kinds()
            .filter(|(k, _)| *k == "TaskFinished")
            .filter_map(|(_, b)| b["task"].as_u64())
            .collect()
    }

    /// (task, attempt) of every `AttemptFinished`.
    pub fn finished_attempts(&self) -> BTreeSet<(u64, u64)> {
        self.kinds()
            .filter(|(k, _)| *k == "AttemptFinished")
            .filter_map(|(_, b)| attempt_key(b))
            .collect()
    }

    /// Each attempt's last journaled usage (zero until it reports any).
    pub fn attempt_usage(&self) -> BTreeMap<(u64, u64), Usage> {
        let mut m = BTreeMap::new();
        for (k, b) in self.kinds() {
            let Some(key) = attempt_key(b) else {
                continue;
            };
            match k {
                "AttemptLaunching" => {
                    m.insert(key, Usage::default());
                }
                "AttemptProgress" | "AttemptFinished" => {
                    m.insert(key, Usage::of(&b["usage"]).unwrap_or_default());
                }
                _ => {}
            }
        }
        m
    }

    /// The run's usage: the sum over attempts of each one's last usage.
    pub fn total(&self) -> Usage {
        self.attempt_usage()
            .values()
            .fold(Usage::default(), |a, u| a.plus(*u))
    }

    /// Attempts launched and not ended (no `AttemptFinished` or `AttemptOrphaned`).
    pub fn live_attempts(&self) -> BTreeSet<(u64, u64)> {
        let mut live = BTreeSet::new();
        for (k, b) in self.kinds() {
            let Some(key) = attempt_key(b) else {
                continue;
            };
            match k {
                "AttemptLaunching" => {
                    live.insert(key);
                }
                "AttemptFinished" | "AttemptOrphaned" => {
                    live.remove(&key);
                }
                _ => {}
            }
        }
        live
    }

    /// Tasks whose last attempt completed while the task did not finish (yet): a kill fell
    /// between an attempt's end and its task's end (artifact, worktree finalize,
    /// `TaskFinished`).
    pub fn ended_not_finished(&self) -> BTreeSet<u64> {
        let mut last: BTreeMap<u64, bool> = BTreeMap::new();
        for (k, b) in self.kinds() {
            let Some(task) = b["task"].as_u64() else {
                continue;
            };
            match k {
                "AttemptLaunching" | "AttemptOrphaned" => {
                    last.insert(task, false);
                }
                "AttemptFinished" => {
                    last.insert(task, b["outcome"]["stop_reason"] == "completed");
                }
                "TaskFinished" => {
                    last.remove(&task);
                }
                _ => {}
            }
        }
        last.into_iter()
            .filter(|(_, done)| *done)
            .map(|(t, _)| t)
            .collect()
    }
}

/// An exported event's kind and body, if it has exactly one kind.
fn kind_of(e: &Value) -> Option<(&str, &Value)> {
    let obj = e["event"].as_object()?;
    let mut it = obj.iter();
    match (it.next(), it.next()) {
        (Some((k, b)), None) => Some((k.as_str(), b)),
        _ => None,
    }
}

/// An event body's (task, attempt).
fn attempt_key(b: &Value) -> Option<(u64, u64)> {
    Some((b["task"].as_u64()?, b["attempt"].as_u64()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, turns: u64) -> Value {
        serde_json::json!({
            "input": input, "output": 1, "cache_read": 0, "cache_write": 0, "reasoning": 0,
            "cost": {"nanos": 5, "unreported": 0}, "turns": turns, "context_tokens": 99
        })
    }

    fn journal(lines: &[Value]) -> Journal {
        let text: Vec<String> = lines
            .iter()
            .enumerate()
            .map(|(i, e)| serde_json::json!({"seq": i, "at": 0, "event": e}).to_string())
            .collect();
        Journal::parse(text.join("\n").as_bytes()).expect("a well-formed export")
    }

    /// Task 0: attempt 1 orphaned with a checkpoint, attempt 2 completed, task finished.
    /// Task 1: attempt 1 completed, task not finished. Task 2: attempt 1 live.
    fn sample() -> Journal {
        journal(&[
            serde_json::json!({"RunStarted": {"batch": {}}}),
            serde_json::json!({"AttemptLaunching": {"task": 0, "attempt": 1}}),
            serde_json::json!({"AttemptProgress": {"task": 0, "attempt": 1, "usage": usage(10, 1)}}),
            serde_json::json!({"AttemptLaunching": {"task": 1, "attempt": 1}}),
            serde_json::json!({"AttemptLaunching": {"task": 2, "attempt": 1}}),
            serde_json::json!({"AttemptOrphaned": {"task": 0, "attempt": 1, "action": "killed"}}),
            serde_json::json!({"RetryScheduled": {"task": 0, "next_attempt": 2}}),
            serde_json::json!({"AttemptLaunching": {"task": 0, "attempt": 2}}),
            serde_json::json!({"AttemptFinished": {"task": 0, "attempt": 2, "usage": usage(30, 2),
                "outcome": {"stop_reason": "completed"}}}),
            serde_json::json!({"AttemptFinished": {"task": 1, "attempt": 1, "usage": usage(7, 1),
                "outcome": {"stop_reason": "completed"}}}),
            serde_json::json!({"TaskFinished": {"task": 0, "result": {"state": "completed"}}}),
        ])
    }

    #[test]
    fn the_questions_of_the_crash_tests() {
        let j = sample();
        assert_eq!(j.events().len(), 11);
        assert_eq!(j.count("AttemptLaunching"), 4);
        assert_eq!(j.of(0, "AttemptLaunching").len(), 2);
        assert!(j.has(2, "AttemptLaunching") && !j.has(2, "AttemptFinished"));
        assert!(j.after(0, "AttemptOrphaned", 1, "RetryScheduled", |b| {
            b["next_attempt"] == 2
        }));
        assert!(!j.after(0, "AttemptOrphaned", 2, "RetryScheduled", |_| true));
        assert_eq!(j.finished(), BTreeSet::from([0]));
        assert_eq!(j.finished_attempts(), BTreeSet::from([(0, 2), (1, 1)]));
        assert_eq!(j.live_attempts(), BTreeSet::from([(2, 1)]));
        assert_eq!(j.ended_not_finished(), BTreeSet::from([1]));
        let usage = j.attempt_usage();
        assert_eq!(usage[&(0, 1)].input, 10, "an orphan keeps its checkpoint");
        assert_eq!(usage[&(2, 1)], Usage::default());
        let total = j.total();
        assert_eq!((total.input, total.turns, total.nanos), (47, 4, 15));
    }

    #[test]
    fn a_failed_last_attempt_is_not_between_an_end_and_a_task_end() {
        let j = journal(&[
            serde_json::json!({"AttemptLaunching": {"task": 0, "attempt": 1}}),
            serde_json::json!({"AttemptFinished": {"task": 0, "attempt": 1, "usage": usage(1, 1),
                "outcome": {"stop_reason": "error"}}}),
        ]);
        assert!(j.ended_not_finished().is_empty());
    }

    #[test]
    fn a_malformed_export_is_refused() {
        assert!(Journal::parse(b"not json").is_err());
        assert!(Journal::parse(br#"{"event": {}}"#).is_err());
        assert!(Journal::parse(br#"{"event": {"A": {}, "B": {}}}"#).is_err());
        assert!(Journal::parse(b"").is_ok_and(|j| j.events().is_empty()));
    }

    #[test]
    fn usage_reads_a_ledger_row_and_the_fake_agents_reports() {
        let u = Usage::of(&usage(3, 2)).expect("a usage");
        assert_eq!((u.input, u.output, u.nanos, u.turns), (3, 1, 5, 2));
        assert_eq!(Usage::of(&serde_json::json!({"input": 1})), None);
        let half = Usage::fake(100, 10, 2_000, 1, 2);
        assert_eq!(
            (half.input, half.output, half.nanos, half.turns),
            (50, 5, 1_000_000, 1)
        );
        assert_eq!(half.plus(half), Usage::fake(100, 10, 2_000, 2, 2));
    }
}
