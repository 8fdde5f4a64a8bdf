//! Independent oracles for the model tests: a per-task grammar automaton, an attempt counter, a
//! usage ledger recomputed from the events, a resume checker, the aggregate order written apart
//! from core, and the probe events fed to `check`. None of them calls core's `check`.
//!
//! Shared by core's and the journal's model tests (included with `#[path]`).

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the oracles"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::time::Duration;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sortie_core::ledger::{Ledger, LedgerFold};
use sortie_core::{
    Attempt, AttemptOutcome, Batch, Event, OrphanAction, RunOutcome, RunState, Seq, Stamped,
    TaskId, TaskResult, TerminalState, Usage,
};

use super::generator::{MAX_TASKS, Trace, attempt_bit};

/// Runs a property with proptest's default config (so `PROPTEST_CASES` applies), without
/// regression files, and prints how many cases passed.
pub(crate) fn property<S>(
    name: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    match runner.run(&strategy, test) {
        Ok(()) => eprintln!("proptest: {name}: {cases} cases"),
        Err(e) => panic!("{name}: {e}"),
    }
}

/// The aggregate run state, in this order: all completed → completed; any completed
/// or partial → partial; all cancelled → cancelled; all timeout or cancelled → timeout;
/// otherwise failed.
pub(crate) fn aggregate_oracle(results: &[TerminalState]) -> RunOutcome {
    use TerminalState as T;
    let n = results.len();
    let count = |f: &dyn Fn(T) -> bool| results.iter().filter(|s| f(**s)).count();
    if count(&|s| s == T::Completed) == n {
        RunOutcome::Completed
    } else if count(&|s| matches!(s, T::Completed | T::Partial)) > 0 {
        RunOutcome::Partial
    } else if count(&|s| s == T::Cancelled) == n {
        RunOutcome::Cancelled
    } else if count(&|s| matches!(s, T::Timeout | T::Cancelled)) == n {
        RunOutcome::Timeout
    } else {
        RunOutcome::Failed
    }
}

/// Where a task is in its grammar:
/// `Queued Planned? SetUp? (Launching Continues? Started? (Stalled | Progress | SideEffects)*
/// (Finished | Orphaned) (VerifyStarted VerifyEnded)? Retry?)* Artifact? Worktree? Finished`, or `Finished` alone from
/// pending; a planned worktree that was never set up may still be finalized
/// (`Queued Planned Worktree? Finished`). `SideEffects` comes at most once per attempt and
/// `Continues` at most once, before `Started`.
///
/// The grammar is `Stalled* Progress*`; a live attempt goes silent (stalled) and speaks again
/// (progress) in any order, and core accepts both orders, so the automaton does too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum G {
    Pending,
    Queued,
    Planned,
    SetUp,
    /// Inside an attempt: whether `Started`, whether a stall or progress came, whether its side
    /// effects and its continued session were recorded.
    Attempt {
        started: bool,
        active: bool,
        side: bool,
        cont: bool,
    },
    AttemptEnded,
    /// #33: the check of the ended attempt runs (`VerifyStarted`), then has its verdict.
    Checking,
    Checked,
    Retried,
    Artifact,
    Worktree,
    Done,
}

fn step(g: G, e: &Event) -> Option<G> {
    use G::*;
    let before_tail = matches!(g, Queued | SetUp | AttemptEnded | Checked | Retried);
    Some(match (g, e) {
        // A user's action on the task (hold, cancel, steer) changes no step of its grammar.
        (g, Event::Control { .. }) if g != Done => g,
        (Pending, Event::TaskQueued { .. }) => Queued,
        (Pending, Event::TaskCarried { .. }) => Done,
        (Queued, Event::WorktreePlanned { .. }) => Planned,
        (Queued | Planned, Event::TaskSetUp { .. }) => SetUp,
        (Planned, Event::WorktreeFinalized { .. }) => Worktree,
        (Planned, Event::TaskFinished { .. }) => Done,
        (AttemptEnded, Event::VerifyStarted { .. }) => Checking,
        (Checking, Event::VerifyEnded { .. }) => Checked,
        (Queued | SetUp | AttemptEnded | Checked | Retried, Event::AttemptLaunching { .. }) => Attempt {
            started: false,
            active: false,
            side: false,
            cont: false,
        },
        (
            Attempt {
                started: false,
                active: false,
                side,
                cont,
            },
            Event::AttemptStarted { .. },
        ) => Attempt {
            started: true,
            active: false,
            side,
            cont,
        },
        (
            Attempt {
                started,
                side,
                cont,
                ..
            },
            Event::AttemptStalled { .. } | Event::AttemptProgress { .. },
        ) => Attempt {
            started,
            active: true,
            side,
            cont,
        },
        (
            Attempt {
                started,
                active,
                side: false,
                cont,
            },
            Event::AttemptSideEffects { .. },
        ) => Attempt {
            started,
            active,
            side: true,
            cont,
        },
        (
            Attempt {
                started: false,
                active,
                side,
                cont: false,
            },
            Event::AttemptContinues { .. },
        ) => Attempt {
            started: false,
            active,
            side,
            cont: true,
        },
        // Placed before its process starts; found by a resume (adopted, recorded) any time.
        (Attempt { started: false, .. }, Event::AttemptPlaced { .. }) => g,
        (
            Attempt { .. },
            Event::AttemptHandle { .. }
            | Event::AttemptAdopted { .. }
            | Event::AttemptRecorded { .. }
            | Event::AttemptRead { .. }
            // #13: at most once per attempt (core's check), any time while it lives.
            | Event::AttemptSession { .. }
            // #34: once per attempt, while it lives.
            | Event::SandboxNet { .. },
        ) => g,
        (Attempt { .. }, Event::AttemptFinished { .. } | Event::AttemptOrphaned { .. }) => {
            AttemptEnded
        }
        (AttemptEnded | Checked, Event::RetryScheduled { .. }) => Retried,
        (_, Event::ArtifactWritten { .. }) if before_tail => Artifact,
        (_, Event::WorktreeFinalized { .. }) if before_tail || g == Artifact => Worktree,
        (_, Event::TaskFinished { .. })
            if before_tail || matches!(g, Pending | Artifact | Worktree) =>
        {
            Done
        }
        _ => return None,
    })
}

/// Checks every task's events against the grammar; when `finished`, every task must be done.
pub(crate) fn check_grammar(
    batch: &Batch,
    events: &[Stamped],
    finished: bool,
) -> Result<(), String> {
    let mut g = vec![G::Pending; batch.tasks.len()];
    for e in events {
        let Some(task) = e.event.task() else { continue };
        let Some(cur) = g.get_mut(task.index()) else {
            return Err(format!(
                "seq {}: {} for unknown task {task}",
                e.seq,
                e.event.name()
            ));
        };
        match step(*cur, &e.event) {
            Some(next) => *cur = next,
            None => {
                return Err(format!(
                    "seq {}: {} for task {task} breaks the grammar in state {cur:?}",
                    e.seq,
                    e.event.name()
                ));
            }
        }
    }
    if finished && let Some(i) = g.iter().position(|s| *s != G::Done) {
        return Err(format!("the run finished but task #{i} is in {:?}", g[i]));
    }
    Ok(())
}

fn event_attempt(e: &Event) -> Option<Attempt> {
    match e {
        Event::AttemptLaunching { attempt, .. }
        | Event::AttemptStarted { attempt, .. }
        | Event::AttemptProgress { attempt, .. }
        | Event::AttemptStalled { attempt, .. }
        | Event::AttemptFinished { attempt, .. }
        | Event::AttemptOrphaned { attempt, .. }
        | Event::AttemptSideEffects { attempt, .. }
        | Event::AttemptContinues { attempt, .. }
        | Event::AttemptPlaced { attempt, .. }
        | Event::AttemptHandle { attempt, .. }
        | Event::AttemptAdopted { attempt, .. }
        | Event::AttemptRecorded { attempt, .. }
        | Event::AttemptRead { attempt, .. }
        | Event::AttemptSession { attempt, .. }
        | Event::SandboxNet { attempt, .. } => Some(*attempt),
        _ => None,
    }
}

/// Attempt numbers are consecutive from 1, every report names the live attempt, a retry names
/// the next attempt, and the launch uses the scheduled model. Within the policy: the attempts
/// that were not orphaned never exceed `max_attempts` (retries never exceed `max_retries`),
/// and no attempt launches after more than `max_orphans` orphans (a crash of sortie spends its
/// own budget, never a retry).
pub(crate) fn check_attempt_numbers(batch: &Batch, events: &[Stamped]) -> Result<(), String> {
    // Per task: the last launched attempt, the scheduled (attempt, model), the orphans.
    let mut last: Vec<u32> = vec![0; batch.tasks.len()];
    let mut scheduled: Vec<Option<(Attempt, Option<String>)>> = vec![None; batch.tasks.len()];
    let mut orphans: Vec<u32> = vec![0; batch.tasks.len()];
    // Issue 14: the rate-limited attempts, which spend `max_rate_limits` (when it is not 0).
    let mut limited: Vec<u32> = vec![0; batch.tasks.len()];
    // Issue 32: the attempts an interrupt of sortie ended, which spend nothing.
    let mut interrupts: Vec<u32> = vec![0; batch.tasks.len()];
    // #33: the failed checks, each of which may be followed by a feedback round (within
    // `verify_rounds`), which spends nothing either.
    let mut rounds: Vec<u32> = vec![0; batch.tasks.len()];
    for e in events {
        let Some(task) = e.event.task() else { continue };
        let i = task.index();
        let spec = &batch.tasks[i];
        // The next attempt is within the policy when the attempts before it that were not
        // orphaned leave a retry, and the orphans are within their budget.
        let (o, l, n) = (orphans[i], limited[i], interrupts[i]);
        let r = rounds[i].min(spec.verify_rounds);
        let within = |next: u32| {
            let spent = next.saturating_sub(1 + o + l + n + r);
            spent < spec.max_attempts() && o <= spec.max_orphans && l <= spec.max_rate_limits
        };
        let max = spec.max_attempts() + o + l + n + r;
        if let Event::VerifyEnded { verdict, .. } = &e.event
            && !verdict.passed
        {
            rounds[i] += 1;
        }
        if let Event::AttemptOrphaned { .. } = &e.event {
            orphans[i] += 1;
        }
        if let Event::AttemptFinished { outcome, .. } = &e.event
            && outcome.rate_limited
            && spec.max_rate_limits > 0
        {
            limited[i] += 1;
        }
        if let Event::AttemptFinished { outcome, .. } = &e.event
            && outcome.stop_reason == sortie_core::outcome::StopReason::Interrupted
            && !(outcome.rate_limited && spec.max_rate_limits > 0)
        {
            interrupts[i] += 1;
        }
        match &e.event {
            Event::AttemptLaunching { attempt, model, .. } => {
                if attempt.0 != last[i] + 1 || !within(attempt.0) {
                    return Err(format!(
                        "seq {}: task {task} launched attempt {attempt} after {} (max {max})",
                        e.seq, last[i]
                    ));
                }
                if let Some((a, m)) = scheduled[i].take()
                    && (a != *attempt || m != *model)
                {
                    return Err(format!(
                        "seq {}: task {task} launched {attempt} on {model:?}, scheduled {a} on {m:?}",
                        e.seq
                    ));
                }
                last[i] = attempt.0;
            }
            Event::RetryScheduled {
                next_attempt,
                model,
                ..
            } => {
                if next_attempt.0 != last[i] + 1 || !within(next_attempt.0) {
                    return Err(format!(
                        "seq {}: task {task} scheduled attempt {next_attempt} after {}",
                        e.seq, last[i]
                    ));
                }
                scheduled[i] = Some((*next_attempt, model.clone()));
            }
            other => {
                if let Some(a) = event_attempt(other)
                    && a.0 != last[i]
                {
                    return Err(format!(
                        "seq {}: {} for attempt {a} of task {task}, live is {}",
                        e.seq,
                        other.name(),
                        last[i]
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Sums usages by the rules of usage, written apart from core: counters add, the context
/// level is the latest nonzero one, unreported costs are counted.
pub(crate) fn sum_usage<'a>(usages: impl IntoIterator<Item = &'a Usage>) -> Usage {
    let mut s = Usage::default();
    for u in usages {
        s.input += u.input;
        s.output += u.output;
        s.cache_read += u.cache_read;
        s.cache_write += u.cache_write;
        s.reasoning += u.reasoning;
        s.cost.nanos += u.cost.nanos;
        s.cost.unreported += u.cost.unreported;
        s.turns += u.turns;
        if u.context_tokens != 0 {
            s.context_tokens = u.context_tokens;
        }
    }
    s
}

fn never_below(now: &Usage, before: &Usage) -> bool {
    now.input >= before.input
        && now.output >= before.output
        && now.cache_read >= before.cache_read
        && now.cache_write >= before.cache_write
        && now.reasoning >= before.reasoning
        && now.cost.nanos >= before.cost.nanos
        && now.cost.unreported >= before.cost.unreported
        && now.turns >= before.turns
}

/// The last stored usage of each attempt, from the events alone.
pub(crate) fn ledger(events: &[Stamped]) -> BTreeMap<(TaskId, Attempt), Usage> {
    let mut last = BTreeMap::new();
    for e in events {
        match &e.event {
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
                last.insert((*task, *attempt), *usage);
            }
            _ => {}
        }
    }
    last
}

fn task_usage(ledger: &BTreeMap<(TaskId, Attempt), Usage>, task: TaskId) -> Usage {
    sum_usage(
        ledger
            .range((task, Attempt(0))..=(task, Attempt(u32::MAX)))
            .map(|(_, u)| u),
    )
}

/// A task's usage is the sum of its attempts' last stored usages after every event, it never
/// decreases, each attempt is counted once (its marker bit appears once), and the final ledger
/// is what the fake agents reported for the attempts the journal holds.
pub(crate) fn check_usage(t: &Trace) -> Result<(), String> {
    let mut last: BTreeMap<(TaskId, Attempt), Usage> = BTreeMap::new();
    for (k, e) in t.events.iter().enumerate() {
        if let Event::AttemptProgress {
            task,
            attempt,
            usage,
        }
        | Event::AttemptFinished {
            task,
            attempt,
            usage,
            ..
        } = &e.event
        {
            last.insert((*task, *attempt), *usage);
        }
        let state = &t.lives[k];
        for (i, rec) in state.tasks.iter().enumerate() {
            let task = TaskId(i as u32);
            let expected = task_usage(&last, task);
            if rec.usage() != expected {
                return Err(format!(
                    "after seq {k}: task {task} usage {:?}, the events sum to {expected:?}",
                    rec.usage()
                ));
            }
            if k > 0
                && let Some(before) = t.lives[k - 1].tasks.get(i)
                && !never_below(&rec.usage(), &before.usage())
            {
                return Err(format!("after seq {k}: task {task} usage went backwards"));
            }
        }
        let run = state.usage();
        let bits: u64 = last
            .iter()
            .filter(|(_, u)| u.reasoning != 0)
            .map(|(&(task, a), _)| attempt_bit(task, a))
            .fold(0, |acc, b| acc | b);
        if run.reasoning != bits {
            return Err(format!(
                "after seq {k}: run reasoning {:#x}, attempts stored {bits:#x}: an attempt counted \
                 twice or lost",
                run.reasoning
            ));
        }
        if run != sum_usage(last.values()) {
            return Err(format!(
                "after seq {k}: run usage is not the sum of its attempts"
            ));
        }
    }
    if t.reported != last {
        return Err(format!(
            "ledger {last:?} differs from what the fake agents reported {:?}",
            t.reported
        ));
    }
    if let Some(state) = t.lives.last() {
        // Per model and in total, from the launches and the last reports alone.
        let mut models: BTreeMap<Option<String>, Vec<Usage>> = BTreeMap::new();
        let mut attempts = 0;
        for e in &t.events {
            if let Event::AttemptLaunching {
                task,
                attempt,
                model,
            } = &e.event
            {
                attempts += 1;
                let u = last.get(&(*task, *attempt)).copied().unwrap_or(Usage::ZERO);
                models.entry(model.clone()).or_default().push(u);
            }
        }
        let l = sortie_core::ledger::ledger(state);
        if l.attempts != attempts {
            return Err(format!(
                "ledger counts {} attempts, the events {attempts}",
                l.attempts
            ));
        }
        for (model, usages) in &models {
            // Each model's attempts, in (task, attempt) order as the ledger adds them.
            let sum = sum_usage(usages.iter());
            let got = l.models.get(model).copied().unwrap_or_default();
            if (got.input, got.reasoning, got.cost) != (sum.input, sum.reasoning, sum.cost) {
                return Err(format!(
                    "ledger for model {model:?}: {got:?}, expected {sum:?}"
                ));
            }
        }
        if l.total != state.usage() || l.total.reasoning != sum_usage(last.values()).reasoning {
            return Err("the ledger total is not the run's usage".into());
        }
        check_ledger_comparisons(&t.events, state, &l)?;
        for (i, rec) in state.tasks.iter().enumerate() {
            for a in &rec.attempts {
                let stored = last
                    .get(&(TaskId(i as u32), a.attempt))
                    .copied()
                    .unwrap_or(Usage::ZERO);
                if *a.usage() != stored {
                    return Err(format!(
                        "task #{i} attempt {} usage is not its last report",
                        a.attempt
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The raw ledger folded one way and another is the same, and comparing a ledger with the
/// state (`difference_from_state`, what audit does) says what comparing it with the state's
/// ledger (`difference`) says: for the raw ledger and for ledgers changed in each way audit
/// must notice.
fn check_ledger_comparisons(
    events: &[Stamped],
    state: &RunState,
    l: &Ledger,
) -> Result<(), String> {
    let raw = Ledger::from_events(events.iter().map(|e| &e.event));
    let mut fold = LedgerFold::with_tasks(state.tasks.len());
    events.iter().for_each(|e| fold.observe(&e.event));
    if fold.finish() != raw {
        return Err("the task-indexed fold differs from from_events".into());
    }
    let mut variants = vec![raw.clone()];
    let bump = |u: &mut Usage| u.input += 1;
    if let Some((&first, _)) = raw.tasks.iter().next() {
        let mut v = raw.clone();
        v.tasks.remove(&first);
        variants.push(v);
        let mut v = raw.clone();
        v.tasks.entry(first).and_modify(bump);
        variants.push(v);
    }
    if let Some((&last, _)) = raw.tasks.iter().next_back() {
        let mut v = raw.clone();
        v.tasks.entry(last).and_modify(bump);
        variants.push(v);
        let mut v = raw.clone();
        v.tasks.remove(&last);
        v.tasks.insert(TaskId(last.0 + 1), Usage::ZERO);
        variants.push(v);
    }
    let mut v = raw.clone();
    v.tasks.insert(
        TaskId(u32::try_from(state.tasks.len()).unwrap_or(u32::MAX)),
        Usage::ZERO,
    );
    variants.push(v);
    let mut v = raw.clone();
    v.attempts += 1;
    variants.push(v);
    let mut v = raw.clone();
    bump(&mut v.total);
    variants.push(v);
    let mut v = raw.clone();
    v.models
        .insert(Some("a model nobody used".into()), Usage::ZERO);
    variants.push(v);
    for (k, v) in variants.iter().enumerate() {
        let slow = v.difference(l);
        let fast = v.difference_from_state(state);
        if slow != fast {
            return Err(format!(
                "variant {k}: difference says {slow:?}, difference_from_state {fast:?}"
            ));
        }
        if k > 0 && fast.is_none() && v != l {
            return Err(format!("variant {k} differs from the ledger unnoticed"));
        }
    }
    Ok(())
}

/// For every resume: no finished task in the plan, every live attempt (found from the events
/// alone) an orphan, every ended-but-undecided task undecided, and nothing else.
pub(crate) fn check_resumes(t: &Trace) -> Result<(), String> {
    for r in &t.resumes {
        let events = &t.events[..r.at];
        let mut live: BTreeSet<(TaskId, Attempt)> = BTreeSet::new();
        let mut finished: BTreeSet<TaskId> = BTreeSet::new();
        let mut undecided: BTreeSet<TaskId> = BTreeSet::new();
        for e in events {
            match &e.event {
                Event::AttemptLaunching { task, attempt, .. } => {
                    live.insert((*task, *attempt));
                    undecided.remove(task);
                }
                Event::AttemptFinished { task, attempt, .. }
                | Event::AttemptOrphaned { task, attempt, .. } => {
                    live.remove(&(*task, *attempt));
                    undecided.insert(*task);
                }
                Event::RetryScheduled { task, .. } => {
                    undecided.remove(task);
                }
                Event::TaskFinished { task, .. } | Event::TaskCarried { task, .. } => {
                    finished.insert(*task);
                    undecided.remove(task);
                }
                _ => {}
            }
        }
        let orphans: BTreeSet<(TaskId, Attempt)> =
            r.plan.orphans.iter().map(|o| (o.task, o.attempt)).collect();
        if orphans != live {
            return Err(format!(
                "resume at {}: orphans {orphans:?}, live attempts {live:?}",
                r.at
            ));
        }
        let planned: BTreeSet<TaskId> = r.plan.undecided.iter().copied().collect();
        if planned != undecided {
            return Err(format!(
                "resume at {}: undecided {planned:?}, expected {undecided:?}",
                r.at
            ));
        }
        if let Some(task) = r.plan.tasks().find(|t| finished.contains(t)) {
            return Err(format!(
                "resume at {}: finished task {task} is in the plan",
                r.at
            ));
        }
        if r.plan.finished != finished.len() {
            return Err(format!(
                "resume at {}: {} finished, expected {}",
                r.at,
                r.plan.finished,
                finished.len()
            ));
        }
        let all: BTreeSet<TaskId> = r.plan.tasks().chain(finished.iter().copied()).collect();
        if all.len() != t.batch.tasks.len() || r.plan.tasks().count() + finished.len() != all.len()
        {
            return Err(format!(
                "resume at {}: the plan does not cover each task once",
                r.at
            ));
        }
    }
    Ok(())
}

/// Candidate events for a state: one of each kind for every task (and one unknown task), with
/// attempt numbers around the live one, run-level events, and every stored event again.
pub(crate) fn probes(state: &RunState, events: &[Stamped]) -> Vec<Event> {
    let mut out = Vec::new();
    let big = Usage {
        input: 1 << 40,
        output: 1 << 40,
        turns: 1 << 20,
        ..Usage::ZERO
    };
    for i in 0..=state.tasks.len().min(MAX_TASKS) {
        let task = TaskId(i as u32);
        let n = state.task(task).map_or(0, |r| r.attempts.len() as u32);
        out.push(Event::TaskQueued { task });
        out.push(Event::TaskSetUp {
            task,
            worktree: None,
        });
        out.push(Event::WorktreePlanned {
            task,
            repo: "/r".into(),
            path: "/p".into(),
            branch: "b".into(),
            base: "c".into(),
        });
        out.push(Event::ArtifactWritten {
            task,
            path: "/p".into(),
            bytes: 1,
            digest: 1,
        });
        out.push(Event::WorktreeFinalized {
            task,
            changed: false,
            diff: None,
        });
        out.push(Event::TaskFinished {
            task,
            result: TaskResult {
                state: TerminalState::Failed,
                stop_reason: sortie_core::StopReason::Invalid,
                phase: None,
                error: None,
                text: String::new(),
                result: None,
            },
        });
        let mut attempts: Vec<u32> = vec![0, 1, n, n + 1, n + 2];
        attempts.sort_unstable();
        attempts.dedup();
        for a in attempts.into_iter().map(Attempt) {
            let model = state
                .spec(task)
                .and_then(|s| sortie_core::model_for_attempt(s, a));
            out.push(Event::AttemptLaunching {
                task,
                attempt: a,
                model: model.clone(),
            });
            out.push(Event::AttemptLaunching {
                task,
                attempt: a,
                model: Some("m-zzz".into()),
            });
            out.push(Event::AttemptStarted {
                task,
                attempt: a,
                pid: 1,
                start_time: 1,
            });
            out.push(Event::AttemptProgress {
                task,
                attempt: a,
                usage: big,
            });
            out.push(Event::AttemptProgress {
                task,
                attempt: a,
                usage: Usage::ZERO,
            });
            out.push(Event::AttemptStalled { task, attempt: a });
            out.push(Event::AttemptSideEffects { task, attempt: a });
            out.push(Event::AttemptContinues {
                task,
                attempt: a,
                session: "/s".into(),
            });
            out.push(Event::AttemptFinished {
                task,
                attempt: a,
                outcome: AttemptOutcome::completed(),
                usage: big,
                output: String::new(),
            });
            out.push(Event::AttemptFinished {
                task,
                attempt: a,
                outcome: AttemptOutcome::completed(),
                usage: Usage::ZERO,
                output: String::new(),
            });
            out.push(Event::AttemptOrphaned {
                task,
                attempt: a,
                action: OrphanAction::Gone,
            });
            out.push(Event::AttemptPlaced {
                task,
                attempt: a,
                executor: "local".into(),
                dir: "/d".into(),
            });
            out.push(Event::AttemptHandle {
                task,
                attempt: a,
                handle: "42".into(),
            });
            out.push(Event::AttemptAdopted {
                task,
                attempt: a,
                offset: 0,
            });
            out.push(Event::AttemptRecorded { task, attempt: a });
            out.push(Event::AttemptRead {
                task,
                attempt: a,
                offset: 7,
            });
            out.push(Event::AttemptSession {
                task,
                attempt: a,
                session: "s".into(),
            });
            out.push(Event::SandboxNet {
                task,
                attempt: a,
                flows: Vec::new(),
            });
            out.push(Event::RetryScheduled {
                task,
                next_attempt: a,
                model,
                delay: Duration::ZERO,
                reason: String::new(),
            });
        }
    }
    out.push(Event::RunResumed {
        pid: 9,
        from_seq: Seq(state.next_seq.0.saturating_sub(1)),
    });
    out.push(Event::RunInterrupted {
        reason: "probe".into(),
    });
    for s in [
        RunOutcome::Completed,
        RunOutcome::Partial,
        RunOutcome::Failed,
        RunOutcome::Timeout,
        RunOutcome::Cancelled,
    ] {
        out.push(Event::RunFinished {
            state: s,
            summary: String::new(),
        });
    }
    out.extend(events.iter().map(|e| e.event.clone()));
    out
}

/// What a task's budget should decide for each usage reading of one attempt, written apart
/// from core's `budget`: `-` nothing, `wrap` ask to wrap up, `stop` stop (and nothing after).
/// `prior` is the usage of the task's earlier attempts; `steerable` whether the agent can be
/// asked; `working[i]` whether its run was working at reading `i`.
pub(crate) fn budget_oracle(
    spec: &sortie_core::TaskSpec,
    prior: &Usage,
    readings: &[Usage],
    steerable: bool,
    working: &[bool],
) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut asked_at: Option<u32> = None;
    for (i, u) in readings.iter().enumerate() {
        let turns = prior.turns + u.turns;
        let tokens = prior.input
            + u.input
            + prior.output
            + u.output
            + prior.cache_read
            + u.cache_read
            + prior.cache_write
            + u.cache_write;
        let nanos = prior.cost.nanos + u.cost.nanos;
        let over = spec.max_turns.is_some_and(|m| turns >= m)
            || spec.max_tokens.is_some_and(|m| tokens > m)
            || spec.max_cost_nanos.is_some_and(|m| nanos > m);
        let step = match asked_at {
            None if over && steerable && spec.grace_turns > 0 => {
                asked_at = Some(turns);
                "wrap"
            }
            None if over => "stop",
            Some(at) if turns >= at + spec.grace_turns && working[i] => "stop",
            _ => "-",
        };
        out.push(step);
        if step == "stop" {
            break;
        }
    }
    out
}

/// Which tasks of the finished run `state` a rerun with these selectors runs again, written
/// apart from core's `rerun`: the tasks picked by end or label, then, in one pass in task
/// order (a task needs only earlier ones), every task that did not complete and needs one
/// selected. None: nothing selected.
pub(crate) fn rerun_oracle(
    state: &RunState,
    (failed, partial, timeout): (bool, bool, bool),
    named: &[String],
) -> Option<Vec<bool>> {
    let batch = state.batch.as_ref()?;
    let any = failed || partial || timeout || !named.is_empty();
    let mut selected: Vec<bool> = Vec::new();
    for (spec, rec) in batch.tasks.iter().zip(&state.tasks) {
        let end = rec.result().map(|r| r.state);
        let picked = if any {
            named.contains(&spec.label)
                || (failed && end == Some(TerminalState::Failed))
                || (partial && end == Some(TerminalState::Partial))
                || (timeout && end == Some(TerminalState::Timeout))
        } else {
            end != Some(TerminalState::Completed)
        };
        let behind = end != Some(TerminalState::Completed)
            && spec.needs.iter().any(|n| {
                batch
                    .tasks
                    .iter()
                    .position(|t| &t.label == n)
                    .is_some_and(|j| selected[j])
            });
        selected.push(picked || behind);
    }
    selected.contains(&true).then_some(selected)
}
