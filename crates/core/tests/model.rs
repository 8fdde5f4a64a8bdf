//! Model-based property tests of the pure state machine: random but legal runs (with crashes,
//! resumes, Ctrl-C and cancels) from the shared generator, checked against independent oracles
//! written here (a grammar automaton, an attempt counter, a usage ledger, an aggregate), never
//! against core's own `check`.
//!
//! `PROPTEST_CASES` sets the number of cases per property (default 256); each property prints
//! `proptest: NAME: N cases` to stderr when it passes (`cargo xtask proptest` shows them).

#[path = "support/gen.rs"]
mod generator;

#[path = "support/oracle.rs"]
mod oracle;

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::Index;
use sortie_core::{
    Attempt, Event, RunState, RunStatus, Seq, Stamped, TaskId, TerminalState, Usage,
};

use generator::{Driver, MemBackend, Scenario, Trace, scenario_strategy};
use oracle::{
    aggregate_oracle, budget_oracle, check_attempt_numbers, check_grammar, check_resumes,
    check_usage, probes, property, rerun_oracle, sum_usage,
};

fn trace(s: &Scenario) -> Trace {
    Driver::run(s, MemBackend::default()).0
}

#[test]
fn replay_of_every_prefix_is_the_live_state() {
    property(
        "replay_of_every_prefix_is_the_live_state",
        scenario_strategy(),
        |s| {
            let t = trace(&s);
            for k in 0..t.events.len() {
                let replayed = RunState::replay(&t.events[..=k]).map_err(|(seq, v)| {
                    TestCaseError::fail(format!("replay refused {seq}: {v}"))
                })?;
                prop_assert_eq!(&replayed, &t.lives[k], "after event {}", k);
            }
            Ok(())
        },
    );
}

#[test]
fn seqs_are_dense() {
    property("seqs_are_dense", scenario_strategy(), |s| {
        let t = trace(&s);
        prop_assert!(
            matches!(
                t.events.first().map(|e| &e.event),
                Some(Event::RunStarted { .. })
            ),
            "the first event is RunStarted"
        );
        for (i, e) in t.events.iter().enumerate() {
            prop_assert_eq!(e.seq, Seq(i as u64));
            prop_assert_eq!(t.lives[i].next_seq, Seq(i as u64 + 1));
        }
        for w in t.events.windows(2) {
            prop_assert!(w[0].at < w[1].at, "time moves forward");
        }
        Ok(())
    });
}

#[test]
fn every_task_follows_the_grammar() {
    let strategy = (
        scenario_strategy(),
        prop::collection::vec(any::<Index>(), 1..5),
    );
    property("every_task_follows_the_grammar", strategy, |(s, picks)| {
        let t = trace(&s);
        check_grammar(
            &t.batch,
            &t.events,
            t.lives.last().is_some_and(RunState::is_finished),
        )
        .map_err(TestCaseError::fail)?;
        // Whatever core accepts must keep the grammar too: extend prefixes with probes.
        for pick in picks {
            let k = pick.index(t.events.len());
            let state = &t.lives[k];
            for probe in probes(state, &t.events) {
                if state.check(&probe).is_ok() {
                    let mut events: Vec<Stamped> = t.events[..=k].to_vec();
                    events.push(Stamped {
                        seq: state.next_seq,
                        at: t.events[k].at,
                        event: probe.clone(),
                    });
                    check_grammar(&t.batch, &events, false).map_err(|e| {
                        TestCaseError::fail(format!("core accepted {probe:?} after event {k}: {e}"))
                    })?;
                }
            }
        }
        Ok(())
    });
}

#[test]
fn attempt_numbers_are_consecutive_and_within_policy() {
    property(
        "attempt_numbers_are_consecutive_and_within_policy",
        scenario_strategy(),
        |s| {
            let t = trace(&s);
            check_attempt_numbers(&t.batch, &t.events).map_err(TestCaseError::fail)
        },
    );
}

#[test]
fn usage_is_counted_once_and_never_decreases() {
    property(
        "usage_is_counted_once_and_never_decreases",
        scenario_strategy(),
        |s| {
            let t = trace(&s);
            check_usage(&t).map_err(TestCaseError::fail)
        },
    );
}

#[test]
fn kept_counts_equal_a_pass_over_the_tasks() {
    property(
        "kept_counts_equal_a_pass_over_the_tasks",
        scenario_strategy(),
        |s| {
            let t = trace(&s);
            for (k, live) in t.lives.iter().enumerate() {
                let done = live.tasks.iter().filter(|r| r.state.is_terminal()).count();
                prop_assert_eq!(live.done_count(), done, "done after event {}", k);
                prop_assert_eq!(
                    live.all_finished(),
                    live.tasks.iter().all(|r| r.state.is_terminal()),
                    "all_finished after event {}",
                    k
                );
                let usage = live.usage();
                let counters = sortie_core::Usage {
                    context_tokens: 0,
                    ..usage
                };
                prop_assert_eq!(live.usage_counters(), counters, "usage after event {}", k);
            }
            let mut owned = RunState::new();
            for e in &t.events {
                owned
                    .apply_owned(e.clone())
                    .map_err(|v| TestCaseError::fail(format!("apply_owned refused: {v}")))?;
            }
            prop_assert_eq!(
                Some(&owned),
                t.lives.last(),
                "apply_owned agrees with apply"
            );
            Ok(())
        },
    );
}

#[test]
fn terminal_states_absorb() {
    property("terminal_states_absorb", scenario_strategy(), |s| {
        let t = trace(&s);
        for (k, e) in t.events.iter().enumerate() {
            let Event::TaskFinished { task, .. } = &e.event else {
                continue;
            };
            // Right after the task finished, and at the end of the run.
            for state in [&t.lives[k], t.lives.last().expect("events")] {
                for probe in probes(state, &t.events) {
                    if probe.task() == Some(*task) {
                        prop_assert!(
                            state.check(&probe).is_err(),
                            "{:?} accepted after task {} finished",
                            probe,
                            task
                        );
                    }
                }
            }
        }
        Ok(())
    });
}

/// #33: a task is queued only once each of its needs ended, completed unless its
/// `needs_mode` is settled; it is skipped for a need only in the default mode.
#[test]
fn a_task_is_queued_only_when_its_needs_let_it() {
    use sortie_core::NeedsMode;
    property(
        "a_task_is_queued_only_when_its_needs_let_it",
        scenario_strategy(),
        |s| {
            let t = trace(&s);
            let mut ended: BTreeMap<&str, TerminalState> = BTreeMap::new();
            for e in &t.events {
                match &e.event {
                    Event::TaskQueued { task } => {
                        let spec = &t.batch.tasks[task.index()];
                        for need in &spec.needs {
                            let end = ended.get(need.as_str()).copied();
                            prop_assert!(
                                end.is_some_and(|st| spec.needs_mode == NeedsMode::Settled
                                    || st == TerminalState::Completed),
                                "{} ({:?}) queued when its need {need} was {end:?}",
                                spec.label,
                                spec.needs_mode
                            );
                        }
                    }
                    Event::TaskFinished { task, result } => {
                        let spec = &t.batch.tasks[task.index()];
                        let for_a_need = result
                            .error
                            .as_deref()
                            .is_some_and(|m| m.starts_with("dependency "));
                        prop_assert!(
                            !for_a_need || spec.needs_mode == NeedsMode::Completed,
                            "{} ({:?}) skipped: {:?}",
                            spec.label,
                            spec.needs_mode,
                            result.error
                        );
                        ended.insert(spec.label.as_str(), result.state);
                    }
                    Event::TaskCarried { task, result, .. } => {
                        let spec = &t.batch.tasks[task.index()];
                        ended.insert(spec.label.as_str(), result.state);
                    }
                    _ => {}
                }
            }
            Ok(())
        },
    );
}

#[test]
fn run_finished_carries_the_aggregate() {
    property(
        "run_finished_carries_the_aggregate",
        scenario_strategy(),
        |s| {
            let t = trace(&s);
            let results: Vec<TerminalState> = t
                .events
                .iter()
                .filter_map(|e| match &e.event {
                    Event::TaskFinished { result, .. } | Event::TaskCarried { result, .. } => {
                        Some(result.state)
                    }
                    _ => None,
                })
                .collect();
            let finished: Vec<_> = t
                .events
                .iter()
                .filter_map(|e| match &e.event {
                    Event::RunFinished { state, .. } => Some(*state),
                    _ => None,
                })
                .collect();
            prop_assert!(finished.len() <= 1);
            if let Some(state) = finished.first() {
                prop_assert_eq!(
                    results.len(),
                    t.batch.tasks.len(),
                    "every task finished once"
                );
                prop_assert_eq!(*state, aggregate_oracle(&results));
                prop_assert!(
                    matches!(
                        t.events.last().map(|e| &e.event),
                        Some(Event::RunFinished { .. })
                    ),
                    "RunFinished is the last event"
                );
            }
            Ok(())
        },
    );
}

#[test]
fn aggregate_follows_the_semantics_order() {
    let strategy = prop::collection::vec(
        prop::sample::select(vec![
            TerminalState::Completed,
            TerminalState::Partial,
            TerminalState::Failed,
            TerminalState::Timeout,
            TerminalState::Cancelled,
            TerminalState::Skipped,
        ]),
        0..8,
    );
    property(
        "aggregate_follows_the_semantics_order",
        strategy,
        |results| {
            prop_assert_eq!(
                sortie_core::aggregate(results.iter().copied()),
                aggregate_oracle(&results)
            );
            prop_assert_eq!(
                sortie_core::aggregate(results.iter().rev().copied()),
                aggregate_oracle(&results),
                "the order of the tasks does not matter"
            );
            Ok(())
        },
    );
}

#[test]
fn resume_plans_orphan_every_live_attempt_and_no_finished_task() {
    property(
        "resume_plans_orphan_every_live_attempt_and_no_finished_task",
        scenario_strategy(),
        |s| {
            let t = trace(&s);
            check_resumes(&t).map_err(TestCaseError::fail)
        },
    );
}

#[test]
fn rejected_events_leave_the_state_untouched() {
    let strategy = (
        scenario_strategy(),
        prop::collection::vec(any::<Index>(), 1..5),
    );
    property(
        "rejected_events_leave_the_state_untouched",
        strategy,
        |(s, picks)| {
            let t = trace(&s);
            let mut states: Vec<&RunState> = picks
                .iter()
                .map(|p| &t.lives[p.index(t.lives.len())])
                .collect();
            states.push(t.lives.last().expect("events"));
            let fresh = RunState::new();
            states.push(&fresh);
            for state in states {
                for probe in probes(state, &t.events) {
                    let verdict = state.check(&probe);
                    for seq in [state.next_seq, Seq(state.next_seq.0 + 1), Seq(0)] {
                        let mut after = state.clone();
                        let stamped = Stamped {
                            seq,
                            at: sortie_core::Timestamp(1),
                            event: probe.clone(),
                        };
                        let applied = after.apply(&stamped);
                        if seq == state.next_seq {
                            prop_assert_eq!(
                                applied.is_ok(),
                                verdict.is_ok(),
                                "apply agrees with check on {:?}",
                                probe
                            );
                        }
                        if applied.is_err() {
                            prop_assert_eq!(
                                &after,
                                state,
                                "a refused {:?} changed the state",
                                probe
                            );
                        } else {
                            prop_assert_eq!(after.next_seq, Seq(state.next_seq.0 + 1));
                        }
                    }
                }
                if state.is_finished() {
                    for probe in probes(state, &t.events) {
                        prop_assert!(
                            state.check(&probe).is_err(),
                            "{:?} accepted after RunFinished",
                            probe
                        );
                    }
                }
            }
            Ok(())
        },
    );
}

// #10: attempts that outlive sortie.
/// A placed attempt that a resume found (adopted or recorded) ends with its own
/// `AttemptFinished` unless sortie dies again first; a recorded one ends at once, and is never
/// orphaned; and across many scenarios the generator makes all three of adopted, recorded and
/// orphaned (a placed attempt gone), so the properties above cover them.
#[test]
fn found_attempts_end_once_and_the_generator_makes_all_three() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use sortie_core::{Attempt, TaskId};
    use std::collections::BTreeSet;

    let mut runner = TestRunner::deterministic();
    let (mut adopted, mut recorded, mut orphaned_placed) = (0, 0, 0);
    for _ in 0..300 {
        let s = scenario_strategy()
            .new_tree(&mut runner)
            .expect("a scenario")
            .current();
        let t = trace(&s);
        let mut placed: BTreeSet<(TaskId, Attempt)> = BTreeSet::new();
        for (k, e) in t.events.iter().enumerate() {
            match &e.event {
                Event::AttemptPlaced { task, attempt, .. } => {
                    placed.insert((*task, *attempt));
                }
                Event::AttemptAdopted { .. } => adopted += 1,
                Event::AttemptRecorded { task, attempt } => {
                    recorded += 1;
                    // Recorded from its files: its end follows (after its start, if that was
                    // not journaled yet), unless this process dies at once.
                    let next = t.events[k + 1..]
                        .iter()
                        .map(|e| &e.event)
                        .find(|e| e.task() == Some(*task));
                    if let Some(next) = next {
                        assert!(
                            matches!(
                                next,
                                Event::AttemptFinished { attempt: a, .. }
                                | Event::AttemptStarted { attempt: a, .. } if a == attempt
                            ),
                            "a recorded attempt is followed by {next:?}"
                        );
                    }
                }
                Event::AttemptOrphaned { task, attempt, .. }
                    if placed.contains(&(*task, *attempt)) =>
                {
                    orphaned_placed += 1;
                }
                _ => {}
            }
        }
    }
    eprintln!("adopted {adopted}, recorded {recorded}, orphaned after placed {orphaned_placed}");
    assert!(adopted > 0 && recorded > 0 && orphaned_placed > 0);
}

/// #10: `check_round` (one check for a round appended in one write) accepts and refuses
/// exactly as checking then applying the round's events one by one on a copy of the state
/// does. Rounds are cut from a legal run (what the runner appends: several events of one
/// task in order, such as a launch and its placement) with probes mixed in (most illegal),
/// run events and controls included.
#[test]
fn a_round_is_checked_as_its_events_one_after_another() {
    let strategy = (
        scenario_strategy(),
        any::<Index>(),
        1usize..7,
        prop::collection::vec((any::<Index>(), any::<Index>(), any::<bool>()), 0..3),
    );
    property(
        "a_round_is_checked_as_its_events_one_after_another",
        strategy,
        |(s, start, len, mixed)| {
            let t = trace(&s);
            let k = start.index(t.events.len());
            let state = &t.lives[k];
            let at = t.events[k].at;
            let mut round: Vec<Event> = t.events[k + 1..]
                .iter()
                .take(len)
                .map(|e| e.event.clone())
                .collect();
            let probes = probes(state, &t.events);
            for (which, place, swap) in mixed {
                if probes.is_empty() {
                    break;
                }
                let probe = probes[which.index(probes.len())].clone();
                let i = place.index(round.len() + 1);
                if swap && i < round.len() {
                    round[i] = probe;
                } else {
                    round.insert(i, probe);
                }
            }
            let mut copy = state.clone();
            let mut one_by_one = Ok(());
            for e in &round {
                let stamped = Stamped {
                    seq: copy.next_seq,
                    at,
                    event: e.clone(),
                };
                if let Err(v) = copy.apply(&stamped) {
                    one_by_one = Err(v);
                    break;
                }
            }
            prop_assert_eq!(
                state.check_round(at, &round),
                one_by_one,
                "round {:?}",
                round
            );
            Ok(())
        },
    );
}

/// The budget decisions of core's `budget` on every attempt's stored usage readings, with the
/// budgets the generator gives its tasks and the earlier attempts' usage from the journal,
/// agree with the oracle's.
#[test]
fn budget_decisions_follow_the_oracle() {
    property(
        "budget_decisions_follow_the_oracle",
        scenario_strategy(),
        |s| check_budgets(&trace(&s)).map(|_| ()),
    );
}

/// Checks core's budget steps for every attempt of `t` against the oracle; returns them (`-`,
/// `wrap`, `stop`), one list per attempt.
fn check_budgets(t: &Trace) -> Result<Vec<Vec<&'static str>>, TestCaseError> {
    use sortie_core::budget::{BudgetStep, BudgetWatch, TaskBudget};
    let mut all = Vec::new();
    let mut last: BTreeMap<(TaskId, Attempt), Usage> = BTreeMap::new();
    for (k, e) in t.events.iter().enumerate() {
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
            Event::AttemptLaunching { task, attempt, .. } => {
                let spec = &t.batch.tasks[task.index()];
                let rec = &t.lives[k].tasks[task.index()];
                let budget = TaskBudget::for_attempt(spec, rec);
                let prior = sum_usage(
                    last.range((*task, Attempt(0))..(*task, *attempt))
                        .map(|(_, u)| u),
                );
                prop_assert_eq!(&budget.prior, &prior, "task {} {}", task, attempt);
                let readings: Vec<Usage> = t.events[k + 1..]
                    .iter()
                    .filter_map(|e| match &e.event {
                        Event::AttemptProgress {
                            task: pt,
                            attempt: pa,
                            usage,
                        } if pt == task && pa == attempt => Some(*usage),
                        _ => None,
                    })
                    .collect();
                // Two attempts in three can be steered; every third reading is between runs.
                let steerable = (task.0 + attempt.0) % 3 != 0;
                let working: Vec<bool> = (0..readings.len()).map(|i| i % 3 != 2).collect();
                let mut watch = BudgetWatch::new(budget);
                let mut got = Vec::new();
                for (u, w) in readings.iter().zip(&working) {
                    let step = match watch.on_usage(u, steerable, *w) {
                        None => "-",
                        Some(BudgetStep::WrapUp) => "wrap",
                        Some(BudgetStep::Stop(_)) => "stop",
                    };
                    got.push(step);
                    if step == "stop" {
                        break;
                    }
                }
                let expected = budget_oracle(spec, &prior, &readings, steerable, &working);
                prop_assert_eq!(&got, &expected, "task {} {}", task, attempt);
                all.push(got);
            }
            _ => {}
        }
    }
    Ok(all)
}

/// A rerun of the run the generator ended with selects what the oracle selects (the closure
/// over `needs` included), refuses an unfinished run, and carries every other task with its
/// result and its usage.
#[test]
fn a_rerun_selects_and_carries_as_the_oracle_says() {
    let strategy = (
        scenario_strategy(),
        any::<(bool, bool, bool)>(),
        any::<u8>(),
    );
    property(
        "a_rerun_selects_and_carries_as_the_oracle_says",
        strategy,
        |(s, flags, names)| check_rerun(&trace(&s), flags, names).map(|_| ()),
    );
}

/// What a rerun check saw: not finished, nothing selected, or a plan (and whether a task was
/// pulled in behind a selected one).
#[derive(Debug, PartialEq, Eq)]
enum RerunSeen {
    NotFinished,
    Empty,
    Plan { pulled_in: bool },
}

/// Checks core's rerun of the run `t` ended with, for the selectors `flags` (failed, partial,
/// timeout) and the tasks whose bit is set in `names`, against the oracle.
fn check_rerun(
    t: &Trace,
    flags: (bool, bool, bool),
    names: u8,
) -> Result<RerunSeen, TestCaseError> {
    use sortie_core::rerun::{self, RerunError, Selection};
    let Some(state) = t.lives.last() else {
        return Ok(RerunSeen::NotFinished);
    };
    let named: Vec<String> = t
        .batch
        .tasks
        .iter()
        .enumerate()
        .filter(|(i, _)| names & (1 << i) != 0)
        .map(|(_, spec)| spec.label.clone())
        .collect();
    let selection = Selection {
        failed: flags.0,
        partial: flags.1,
        timeout: flags.2,
        tasks: named.clone(),
    };
    let got = rerun::select(state, &selection);
    if !matches!(state.status, RunStatus::Finished { .. }) {
        prop_assert_eq!(got, Err(RerunError::NotFinished));
        return Ok(RerunSeen::NotFinished);
    }
    let Some(expected) = rerun_oracle(state, flags, &named) else {
        prop_assert_eq!(got, Err(RerunError::NothingSelected));
        return Ok(RerunSeen::Empty);
    };
    let plan = got.map_err(|e| TestCaseError::fail(format!("refused: {e}")))?;
    prop_assert_eq!(&plan.selected, &expected);
    let carried: Vec<TaskId> = plan.carried.iter().map(|c| c.task).collect();
    let not_selected: Vec<TaskId> = (0..expected.len())
        .filter(|i| !expected[*i])
        .map(|i| TaskId(i as u32))
        .collect();
    prop_assert_eq!(carried, not_selected, "every task not run again is carried");
    for c in &plan.carried {
        let rec = &state.tasks[c.task.index()];
        prop_assert_eq!(Some(&c.result), rec.result());
        let spent = sum_usage([&rec.usage(), &rec.steps().carried.unwrap_or_default()]);
        prop_assert_eq!(c.usage, spent, "task {}", c.task);
    }
    // A task selected that its own end or label did not pick: the closure pulled it in.
    let pulled_in =
        (expected.iter().zip(&t.batch.tasks).zip(&state.tasks)).any(|((selected, spec), rec)| {
            let end = rec.result().map(|r| r.state);
            let own = named.contains(&spec.label)
                || (flags.0 && end == Some(TerminalState::Failed))
                || (flags.1 && end == Some(TerminalState::Partial))
                || (flags.2 && end == Some(TerminalState::Timeout));
            *selected && !own
        });
    Ok(RerunSeen::Plan { pulled_in })
}

/// Across many scenarios the generator makes every budget step (a wrap-up, a stop at once, a
/// stop after the grace turns) and every kind of rerun (a plan, one with a task pulled in
/// behind a selected one, nothing selected), so that the two properties above cover them.
#[test]
fn the_generator_makes_every_budget_step_and_every_kind_of_rerun() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let (mut wraps, mut stops, mut graced) = (0, 0, 0);
    let (mut plans, mut pulled, mut empty) = (0, 0, 0);
    for i in 0..300u32 {
        let s = scenario_strategy()
            .new_tree(&mut runner)
            .expect("a scenario")
            .current();
        let t = trace(&s);
        for steps in check_budgets(&t).expect("budgets follow the oracle") {
            wraps += usize::from(steps.contains(&"wrap"));
            let stop = steps.last() == Some(&"stop");
            stops += usize::from(stop);
            graced += usize::from(stop && steps.contains(&"wrap"));
        }
        let flags = (i % 2 == 0, i % 3 == 0, i % 5 == 0);
        let names = if i % 4 == 0 { (i / 4) as u8 } else { 0 };
        match check_rerun(&t, flags, names).expect("reruns follow the oracle") {
            RerunSeen::NotFinished => {}
            RerunSeen::Empty => empty += 1,
            RerunSeen::Plan { pulled_in } => {
                plans += 1;
                pulled += usize::from(pulled_in);
            }
        }
    }
    eprintln!(
        "budget: {wraps} wrap-ups, {stops} stops, {graced} after the grace; \
         rerun: {plans} plans, {pulled} with a task pulled in, {empty} empty"
    );
    assert!(wraps > 0 && stops > 0 && graced > 0);
    assert!(plans > 0 && pulled > 0 && empty > 0);
}

/// #33: under `pick = "first-pass"` (the generator makes a batch one item's samples), once a
/// sample finished completed (passed), no other sample launches an attempt, and every sample
/// that had not finished then ends cancelled or its live attempt ends.
#[test]
fn first_pass_launches_nothing_of_an_item_once_a_sample_passed() {
    property(
        "first_pass_launches_nothing_of_an_item_once_a_sample_passed",
        scenario_strategy(),
        |s| {
            let first_pass = s
                .batch
                .tasks
                .first()
                .is_some_and(|t| t.pick == Some(sortie_core::verify::Pick::FirstPass));
            if !first_pass {
                return Ok(());
            }
            let t = trace(&s);
            let mut won: Option<TaskId> = None;
            for e in &t.events {
                match &e.event {
                    Event::TaskFinished { task, result }
                        if won.is_none() && result.state == TerminalState::Completed =>
                    {
                        won = Some(*task);
                    }
                    Event::TaskCarried { task, result, .. }
                        if won.is_none() && result.state == TerminalState::Completed =>
                    {
                        won = Some(*task);
                    }
                    Event::AttemptLaunching { task, .. } => {
                        prop_assert!(
                            won.is_none_or(|w| w == *task),
                            "task {} launched after task {:?} passed",
                            task,
                            won
                        );
                    }
                    _ => {}
                }
            }
            Ok(())
        },
    );
}
