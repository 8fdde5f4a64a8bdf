//! Data-driven tests of the rules the run loop asks core at its edges: whether an attempt's
//! report is news (fencing and once-only), what a control request comes to, and which
//! task-end hook runs with what. A state and the runner's facts in, the decision out; one table
//! per rule.

use sortie_core::control::{self, ControlFacts};
use sortie_core::hook;
use sortie_core::{
    AgentProfile, Attempt, AttemptOutcome, Batch, ControlAction, Event, RunConfig, RunId, RunState,
    Stamped, TaskId, TaskResult, TaskSpec, Timestamp, Usage,
};

const A: TaskId = TaskId(0);
const B: TaskId = TaskId(1);
const C: TaskId = TaskId(2);

/// A run of three tasks: `a` runs attempt 2 (placed, read up to 100, its side effects and
/// session recorded), after attempt 1 failed; `b` runs attempt 1 (not placed, nothing
/// recorded); `c` completed. `a` and the run have `on_task_end` hooks, `b` has none.
fn run() -> RunState {
    let mut a = spec("a");
    a.max_retries = 1;
    a.on_task_end = Some("notify a".into());
    let tasks = vec![a, spec("b"), spec("c")];
    let config = RunConfig {
        on_task_end: Some("notify run".into()),
        ..RunConfig::default()
    };
    let mut events = vec![Event::RunStarted {
        run_id: RunId::new("loop-rules").expect("run id"),
        batch: Batch {
            tasks,
            agents: AgentProfile::builtins(),
            config,
            source: "loop.toml".into(),
        },
        batch_digest: 1,
        host: "h".into(),
        pid: 1,
    }];
    for task in [A, B, C] {
        events.push(Event::TaskQueued { task });
    }
    events.extend(launch(A, 1));
    events.push(Event::AttemptFinished {
        task: A,
        attempt: Attempt(1),
        outcome: AttemptOutcome::failed(sortie_core::StopReason::Error, "flaky"),
        usage: Usage::ZERO,
        output: String::new(),
    });
    events.push(Event::RetryScheduled {
        task: A,
        next_attempt: Attempt(2),
        model: None,
        delay: std::time::Duration::ZERO,
        reason: "flaky".into(),
    });
    events.push(Event::AttemptLaunching {
        task: A,
        attempt: Attempt(2),
        model: None,
    });
    events.push(Event::AttemptPlaced {
        task: A,
        attempt: Attempt(2),
        executor: "supervised".into(),
        dir: "/state/runs/r/attempts/0.2".into(),
    });
    events.push(Event::AttemptStarted {
        task: A,
        attempt: Attempt(2),
        pid: 200,
        start_time: 1,
    });
    events.extend([
        Event::AttemptRead {
            task: A,
            attempt: Attempt(2),
            offset: 100,
        },
        Event::AttemptSideEffects {
            task: A,
            attempt: Attempt(2),
        },
        Event::AttemptSession {
            task: A,
            attempt: Attempt(2),
            session: "s-1".into(),
        },
    ]);
    events.extend(launch(B, 1));
    events.extend(launch(C, 1));
    events.push(Event::AttemptFinished {
        task: C,
        attempt: Attempt(1),
        outcome: AttemptOutcome::completed(),
        usage: Usage::ZERO,
        output: "done".into(),
    });
    events.push(Event::TaskFinished {
        task: C,
        result: completed("done"),
    });
    let stamped: Vec<Stamped> = events
        .into_iter()
        .enumerate()
        .map(|(i, event)| Stamped {
            seq: sortie_core::Seq(i as u64),
            at: Timestamp(1_000 + i as u64),
            event,
        })
        .collect();
    RunState::replay(&stamped).unwrap_or_else(|(seq, v)| panic!("event {seq:?} refused: {v}"))
}

fn spec(label: &str) -> TaskSpec {
    let mut s = TaskSpec::new(label, format!("/work/{label}"));
    s.prompt = Some(format!("do {label}"));
    s
}

fn launch(task: TaskId, n: u32) -> [Event; 2] {
    [
        Event::AttemptLaunching {
            task,
            attempt: Attempt(n),
            model: None,
        },
        Event::AttemptStarted {
            task,
            attempt: Attempt(n),
            pid: 100 + task.0,
            start_time: 1,
        },
    ]
}

fn completed(text: &str) -> TaskResult {
    TaskResult {
        state: sortie_core::TerminalState::Completed,
        stop_reason: sortie_core::StopReason::Completed,
        phase: None,
        error: None,
        text: text.into(),
        result: None,
    }
}

#[test]
fn a_report_is_news_only_from_the_live_attempt_and_once() {
    let state = run();
    let progress = |task, n| Event::AttemptProgress {
        task,
        attempt: Attempt(n),
        usage: Usage::ZERO,
    };
    let side_effects = |task, n| Event::AttemptSideEffects {
        task,
        attempt: Attempt(n),
    };
    let session = |task, n| Event::AttemptSession {
        task,
        attempt: Attempt(n),
        session: "s-2".into(),
    };
    let read = |task, n, offset| Event::AttemptRead {
        task,
        attempt: Attempt(n),
        offset,
    };
    let table: &[(&str, Event, bool)] = &[
        ("the live attempt's progress", progress(A, 2), true),
        ("an earlier attempt's late report", progress(A, 1), false),
        ("a report of a finished task", progress(C, 1), false),
        ("a task that does not exist", progress(TaskId(9), 1), false),
        ("side effects already recorded", side_effects(A, 2), false),
        ("side effects not yet recorded", side_effects(B, 1), true),
        ("a session already named", session(A, 2), false),
        ("a first session", session(B, 1), true),
        ("a read that moves on", read(A, 2, 101), true),
        ("a read at the journaled offset", read(A, 2, 100), false),
        ("a read behind it", read(A, 2, 50), false),
        ("a read of an attempt never placed", read(B, 1, 10), false),
        ("a run event", Event::TaskQueued { task: B }, false),
    ];
    for (what, event, news) in table {
        assert_eq!(state.report_is_news(event), *news, "{what}");
    }
}

#[test]
fn a_control_request_is_journaled_or_refused_in_one_order() {
    let state = run();
    let facts = |stopping, steerable| ControlFacts {
        stopping,
        steerable,
    };
    let steer = |task| ControlAction::Steer {
        task,
        message: "look again".into(),
    };
    let table: &[(&str, ControlAction, ControlFacts, Result<(), &str>)] = &[
        (
            "hold a running task",
            ControlAction::Hold { task: Some(B) },
            facts(false, false),
            Ok(()),
        ),
        (
            "anything while the run stops",
            ControlAction::Hold { task: Some(B) },
            facts(true, false),
            Err("the run is stopping"),
        ),
        (
            "a stopping run refuses before the state is asked",
            ControlAction::Hold { task: Some(C) },
            facts(true, false),
            Err("the run is stopping"),
        ),
        (
            "a finished task",
            ControlAction::Cancel { task: Some(C) },
            facts(false, false),
            Err("task c: it has finished"),
        ),
        (
            "release a task not held",
            ControlAction::Release { task: Some(B) },
            facts(false, false),
            Err("task b: it is not held"),
        ),
        (
            "concurrency 0",
            ControlAction::Concurrency { n: 0 },
            facts(false, false),
            Err("the concurrency must be at least 1"),
        ),
        (
            "steer an agent that can take it",
            steer(A),
            facts(false, true),
            Ok(()),
        ),
        (
            "steer an agent that cannot",
            steer(A),
            facts(false, false),
            Err("task a: its agent cannot be steered (only pi over RPC with can_steer)"),
        ),
        (
            "the state refuses a steer of a finished task before steerability is asked",
            steer(C),
            facts(false, false),
            Err("task c: it has finished"),
        ),
    ];
    for (what, action, facts, expected) in table {
        let got = control::decide(&state, "cli", action.clone(), *facts);
        match (expected, got) {
            (Ok(()), Ok(event)) => assert_eq!(
                event,
                Event::Control {
                    by: "cli".into(),
                    action: action.clone()
                },
                "{what}"
            ),
            (Err(why), Err(got)) => assert!(got.contains(why), "{what}: {got:?}"),
            (expected, got) => panic!("{what}: expected {expected:?}, got {got:?}"),
        }
    }
}

#[test]
fn the_task_end_hook_is_the_flag_else_the_tasks_else_the_runs() {
    let state = run();
    let mut failed = completed("");
    failed.state = sortie_core::TerminalState::Failed;
    failed.error = Some("it broke\nsecond line".into());
    /// The hook's command and directory (none: no hook).
    type Chosen = Option<(&'static str, Option<&'static str>)>;
    let table: &[(&str, Option<&str>, TaskId, Chosen)] = &[
        (
            "the flag wins, in sortie's directory",
            Some("flag"),
            A,
            Some(("flag", None)),
        ),
        (
            "the task's own, in its cwd",
            None,
            A,
            Some(("notify a", Some("/work/a"))),
        ),
        (
            "else the run's, in the task's cwd",
            None,
            B,
            Some(("notify run", Some("/work/b"))),
        ),
        ("an unknown task runs nothing", None, TaskId(9), None),
    ];
    for (what, flag, task, expected) in table {
        let got = hook::task_end(*flag, &state, *task, &failed);
        assert_eq!(
            got.as_ref().map(|h| (h.command.as_str(), h.cwd.as_deref())),
            *expected,
            "{what}"
        );
    }
    let hook = hook::task_end(None, &state, A, &failed).expect("a's hook");
    let names: Vec<&str> = hook.env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "SORTIE_RUN",
            "SORTIE_TASK",
            "SORTIE_STATE",
            "SORTIE_COST_USD",
            "SORTIE_ARTIFACT",
            "SORTIE_ERROR"
        ]
    );
    let value = |k: &str| {
        hook.env
            .iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(value("SORTIE_RUN"), Some("loop-rules"));
    assert_eq!(value("SORTIE_TASK"), Some("a"));
    assert_eq!(value("SORTIE_STATE"), Some("failed"));
    assert_eq!(value("SORTIE_COST_USD"), Some("0.000000"));
    assert_eq!(
        value("SORTIE_ERROR"),
        Some("it broke"),
        "the error's first line"
    );
}

// #32: an attempt is placed before it starts; only after `sortie recover` (`RunRecovered`) may
// a started attempt without a placement (a direct one, whose end the damage lost) be placed
// from its files, once, so that resume records it instead of running it again.
#[test]
fn a_started_attempt_is_placed_late_only_after_a_recovery_and_once() {
    let mut state = run();
    let placed = Event::AttemptPlaced {
        task: B,
        attempt: Attempt(1),
        executor: "local".into(),
        dir: "/state/runs/r/attempts/1.1".into(),
    };
    assert!(state.check(&placed).is_err(), "placed after its start");
    let apply = |state: &mut RunState, event: Event| {
        let stamped = Stamped {
            seq: state.next_seq,
            at: Timestamp(9_000),
            event,
        };
        state.apply(&stamped).expect("legal");
    };
    apply(
        &mut state,
        Event::RunRecovered {
            kept: 20,
            scanned: 0,
            lost: Some((20, 30)),
            restored: vec![(B, Attempt(1))],
            damaged: "/state/runs/r/damaged/1".into(),
        },
    );
    assert_eq!(state.recovered.len(), 1);
    assert_eq!(state.check(&placed), Ok(()));
    apply(&mut state, placed.clone());
    assert!(state.check(&placed).is_err(), "placed twice");
}

/// #37: a run of tasks `w` (isolated, kept, its worktree discarded later) and `u` (isolated,
/// unchanged), each run once, then the run's end and `tail`.
fn isolated_run(tail: &[Event]) -> Result<RunState, String> {
    let (w, u) = (TaskId(0), TaskId(1));
    let mut events = vec![Event::RunStarted {
        run_id: RunId::new("discards").expect("run id"),
        batch: Batch {
            tasks: vec![spec("w"), spec("u")],
            agents: AgentProfile::builtins(),
            config: RunConfig::default(),
            source: "d.toml".into(),
        },
        batch_digest: 1,
        host: "h".into(),
        pid: 1,
    }];
    for (task, changed) in [(w, true), (u, false)] {
        events.push(Event::TaskQueued { task });
        events.push(Event::WorktreePlanned {
            task,
            repo: "/repo".into(),
            path: format!("/wt/{}", task.0),
            branch: format!("b{}", task.0),
            base: "c0".into(),
        });
        events.push(Event::TaskSetUp {
            task,
            worktree: Some(format!("/wt/{}", task.0)),
        });
        events.extend(launch(task, 1));
        events.push(Event::AttemptFinished {
            task,
            attempt: Attempt(1),
            outcome: AttemptOutcome::completed(),
            usage: Usage::ZERO,
            output: "done".into(),
        });
        events.push(Event::WorktreeFinalized {
            task,
            changed,
            diff: None,
        });
        events.push(Event::TaskFinished {
            task,
            result: completed("done"),
        });
    }
    events.push(Event::RunFinished {
        state: sortie_core::RunOutcome::Completed,
        summary: String::new(),
    });
    events.extend(tail.iter().cloned());
    let stamped: Vec<Stamped> = (0u64..)
        .zip(events)
        .map(|(i, event)| Stamped {
            seq: sortie_core::Seq(i),
            at: Timestamp(1_000 + i),
            event,
        })
        .collect();
    RunState::replay(&stamped).map_err(|(seq, v)| format!("event {seq:?} refused: {v}"))
}

#[test]
fn a_kept_worktree_is_discarded_once_after_the_runs_end_and_only_a_kept_one() {
    let discard = |task| Event::WorktreeDiscarded {
        task: TaskId(task),
        by: sortie_core::DiscardedBy::Discard,
        branch_kept: false,
    };
    let once = isolated_run(&[discard(0)]).expect("a kept worktree's discard");
    let d = once.tasks[0].steps().discarded.expect("recorded");
    assert_eq!(d.by, sortie_core::DiscardedBy::Discard);
    assert!(
        matches!(once.status, sortie_core::RunStatus::Finished { .. }),
        "the run stays finished"
    );
    assert!(
        isolated_run(&[discard(0), discard(0)]).is_err(),
        "a second discard is refused"
    );
    assert!(
        isolated_run(&[discard(1)]).is_err(),
        "an unchanged worktree was removed at its end, not kept"
    );
    assert!(isolated_run(&[discard(7)]).is_err(), "no such task");
    assert!(
        isolated_run(&[discard(0), Event::TaskQueued { task: TaskId(0) }]).is_err(),
        "no other task event after the end"
    );
}

#[test]
fn an_attempt_waits_for_a_machine_slot_once_before_its_start_and_is_clocked_from_it() {
    let state = run();
    let d = TaskId(1);
    // `b`'s attempt 1 has started: it waited for nothing, and cannot wait now.
    let waiting = |task, n| Event::AttemptWaiting {
        task,
        attempt: Attempt(n),
    };
    assert!(!state.report_is_news(&waiting(d, 1)), "started already");
    assert!(state.check(&waiting(d, 1)).is_err());
    let apply = |state: &mut RunState, at: u64, event: Event| {
        let stamped = Stamped {
            seq: state.next_seq,
            at: Timestamp(at),
            event,
        };
        state.apply(&stamped).expect("legal");
    };
    // A fresh one-task run: launched, then waiting, then started.
    let mut one = RunState::replay(&[
        Stamped {
            seq: sortie_core::Seq(0),
            at: Timestamp(1),
            event: Event::RunStarted {
                run_id: RunId::new("slots").expect("run id"),
                batch: Batch {
                    tasks: vec![spec("t")],
                    agents: AgentProfile::builtins(),
                    config: RunConfig::default(),
                    source: "s.toml".into(),
                },
                batch_digest: 1,
                host: "h".into(),
                pid: 1,
            },
        },
        Stamped {
            seq: sortie_core::Seq(1),
            at: Timestamp(2),
            event: Event::TaskQueued { task: A },
        },
        Stamped {
            seq: sortie_core::Seq(2),
            at: Timestamp(3),
            event: Event::AttemptLaunching {
                task: A,
                attempt: Attempt(1),
                model: None,
            },
        },
    ])
    .unwrap_or_else(|(seq, v)| panic!("event {seq:?} refused: {v}"));
    assert_eq!(one.tasks[0].display_state(), "running");
    assert!(one.report_is_news(&waiting(A, 1)));
    apply(&mut one, 10, waiting(A, 1));
    assert_eq!(one.tasks[0].display_state(), "waiting");
    assert!(!one.report_is_news(&waiting(A, 1)), "once");
    assert!(one.check(&waiting(A, 1)).is_err(), "once");
    apply(
        &mut one,
        5_000,
        Event::AttemptStarted {
            task: A,
            attempt: Attempt(1),
            pid: 9,
            start_time: 1,
        },
    );
    assert_eq!(one.tasks[0].display_state(), "running");
    let attempt = &one.tasks[0].attempts[0];
    assert_eq!(attempt.launched_at, Timestamp(3));
    assert_eq!(
        attempt.clock_from(),
        Timestamp(5_000),
        "its clock starts with it"
    );
}
