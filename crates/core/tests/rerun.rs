//! Data-driven tests of the rerun selection: a finished run and a selection in, the tasks that
//! run again (or the error) and what the others carry out. One table per rule.

use sortie_core::rerun::{self, RerunError, Selection};
use sortie_core::{
    AgentProfile, Attempt, AttemptOutcome, Batch, Event, RunConfig, RunId, RunState, Stamped,
    StopReason, TaskId, TaskResult, TaskSpec, TerminalState, Timestamp, Usage,
};

/// A task's end in the parent run, and the tokens its one attempt spent (none: no attempt).
type End = (
    &'static str,
    &'static [&'static str],
    TerminalState,
    Option<u64>,
);

/// The parent run of most tables: `a` failed; `b` needs `a` and was skipped; `c` needs `b`
/// and was skipped; `d` completed; `e` needs `d`, partial; `f` timed out; `g` needs `d` and
/// `f`, cancelled; `h` completed and needs `a` (it ran before `a` failed: a retry's luck).
const RUN: &[End] = &[
    ("a", &[], TerminalState::Failed, Some(10)),
    ("b", &["a"], TerminalState::Skipped, None),
    ("c", &["b"], TerminalState::Skipped, None),
    ("d", &[], TerminalState::Completed, Some(40)),
    ("e", &["d"], TerminalState::Partial, Some(50)),
    ("f", &[], TerminalState::Timeout, Some(60)),
    ("g", &["d", "f"], TerminalState::Cancelled, None),
    ("h", &["a"], TerminalState::Completed, Some(80)),
];

/// Builds the finished run of `ends`, each task's end as given.
fn finished(ends: &[End]) -> RunState {
    let tasks = ends
        .iter()
        .map(|(label, needs, _, _)| {
            let mut s = TaskSpec::new(*label, "/work");
            s.prompt = Some(format!("do {label}"));
            s.needs = needs.iter().map(|n| (*n).to_owned()).collect();
            s
        })
        .collect();
    let mut events = vec![Event::RunStarted {
        run_id: RunId::new("parent").expect("run id"),
        batch: Batch {
            tasks,
            agents: AgentProfile::builtins(),
            config: RunConfig::default(),
            source: "rerun.toml".into(),
        },
        batch_digest: 77,
        host: "h".into(),
        pid: 1,
    }];
    for (i, (_, _, end, tokens)) in ends.iter().enumerate() {
        let task = TaskId(i as u32);
        if let Some(tokens) = tokens {
            let attempt = Attempt(1);
            let outcome = if *end == TerminalState::Completed {
                AttemptOutcome::completed()
            } else {
                AttemptOutcome::failed(StopReason::Error, "it broke")
            };
            events.extend([
                Event::TaskQueued { task },
                Event::AttemptLaunching {
                    task,
                    attempt,
                    model: None,
                },
                Event::AttemptStarted {
                    task,
                    attempt,
                    pid: 100,
                    start_time: 1,
                },
                Event::AttemptFinished {
                    task,
                    attempt,
                    outcome,
                    usage: Usage {
                        input: *tokens,
                        ..Usage::ZERO
                    },
                    output: String::new(),
                },
            ]);
        }
        events.push(Event::TaskFinished {
            task,
            result: result(*end),
        });
    }
    let mut state = RunState::new();
    for event in events {
        push(&mut state, event);
    }
    let summary = String::new();
    let outcome = state.aggregate();
    push(
        &mut state,
        Event::RunFinished {
            state: outcome,
            summary,
        },
    );
    state
}

fn push(state: &mut RunState, event: Event) {
    let stamped = Stamped {
        seq: state.next_seq,
        at: Timestamp(1_000 + state.next_seq.0),
        event,
    };
    state
        .apply(&stamped)
        .unwrap_or_else(|v| panic!("test event refused: {v}\n{stamped:?}"));
}

fn result(state: TerminalState) -> TaskResult {
    TaskResult {
        state,
        stop_reason: if state == TerminalState::Completed {
            StopReason::Completed
        } else {
            StopReason::Error
        },
        phase: None,
        error: None,
        text: format!("{state:?}"),
        result: None,
    }
}

/// A selection from a short spelling: `failed`, `partial`, `timeout` and `task=LABEL` words.
fn selection(words: &str) -> Selection {
    let mut s = Selection::default();
    for w in words.split_whitespace() {
        match w {
            "failed" => s.failed = true,
            "partial" => s.partial = true,
            "timeout" => s.timeout = true,
            _ => s.tasks.push(
                w.strip_prefix("task=")
                    .unwrap_or_else(|| panic!("unknown selector {w}"))
                    .to_owned(),
            ),
        }
    }
    s
}

/// The labels that run again, space-separated, or the error.
fn rerun_of(state: &RunState, words: &str) -> Result<String, RerunError> {
    let plan = rerun::select(state, &selection(words))?;
    let labels: Vec<&str> = plan
        .selected
        .iter()
        .zip(&plan.batch.tasks)
        .filter(|(s, _)| **s)
        .map(|(_, spec)| spec.label.as_str())
        .collect();
    Ok(labels.join(" "))
}

fn check(state: &RunState, table: &[(&str, Result<&str, RerunError>)]) {
    for (words, expected) in table {
        let got = rerun_of(state, words);
        let expected = expected.clone().map(str::to_owned);
        assert_eq!(got, expected, "selection {words:?}");
    }
}

#[test]
fn the_selectors_pick_by_end_or_by_label() {
    let state = finished(RUN);
    check(
        &state,
        &[
            // No selector: every task that did not complete (and the closure).
            ("", Ok("a b c e f g")),
            ("failed", Ok("a b c")),
            ("partial", Ok("e")),
            ("timeout", Ok("f g")),
            ("failed timeout", Ok("a b c f g")),
            // A named task runs again whatever its end, completed too.
            ("task=d", Ok("d e g")),
            ("task=h", Ok("h")),
            ("task=e partial", Ok("e")),
        ],
    );
}

#[test]
fn the_closure_over_needs_takes_what_did_not_complete_behind_a_selected_task() {
    let state = finished(RUN);
    check(
        &state,
        &[
            // b and c are behind a, transitively; h completed and stays.
            ("task=a", Ok("a b c")),
            // Behind b only c.
            ("task=b", Ok("b c")),
            // g needs d and f: either selected pulls it in.
            ("task=f", Ok("f g")),
            // e needs d (completed), d named: e and g did not complete, they follow.
            ("task=d", Ok("d e g")),
            // A leaf selected pulls in nothing.
            ("task=c", Ok("c")),
        ],
    );
}

#[test]
fn a_rerun_that_cannot_be_planned_says_why() {
    let state = finished(RUN);
    check(
        &state,
        &[
            ("task=zz", Err(RerunError::NoSuchTask("zz".into()))),
            ("failed task=zz", Err(RerunError::NoSuchTask("zz".into()))),
        ],
    );
    let all_done = finished(&[
        ("a", &[], TerminalState::Completed, Some(1)),
        ("b", &["a"], TerminalState::Completed, Some(2)),
    ]);
    check(
        &all_done,
        &[
            ("", Err(RerunError::NothingSelected)),
            ("failed partial timeout", Err(RerunError::NothingSelected)),
            ("task=a", Ok("a")),
        ],
    );
    let mut running = RunState::new();
    push(
        &mut running,
        Event::RunStarted {
            run_id: RunId::new("live").expect("run id"),
            batch: Batch {
                tasks: vec![TaskSpec::new("a", "/work")],
                agents: AgentProfile::builtins(),
                config: RunConfig::default(),
                source: "rerun.toml".into(),
            },
            batch_digest: 0,
            host: "h".into(),
            pid: 1,
        },
    );
    assert_eq!(rerun_of(&running, ""), Err(RerunError::NotFinished));
    assert_eq!(rerun_of(&RunState::new(), ""), Err(RerunError::NotFinished));
}

#[test]
fn the_tasks_not_run_again_carry_their_result_and_usage() {
    let state = finished(RUN);
    /// A carried task: its label, its end, the input tokens it spent.
    type Kept = (&'static str, TerminalState, u64);
    let table: &[(&str, &[Kept])] = &[
        (
            "failed",
            &[
                ("d", TerminalState::Completed, 40),
                ("e", TerminalState::Partial, 50),
                ("f", TerminalState::Timeout, 60),
                ("g", TerminalState::Cancelled, 0),
                ("h", TerminalState::Completed, 80),
            ],
        ),
        (
            "",
            &[
                ("d", TerminalState::Completed, 40),
                ("h", TerminalState::Completed, 80),
            ],
        ),
    ];
    for (words, expected) in table {
        let plan = rerun::select(&state, &selection(words)).expect("a plan");
        assert_eq!(plan.digest, 77);
        let got: Vec<(String, TerminalState, u64)> = plan
            .carried
            .iter()
            .map(|c| (state.label(c.task), c.result.state, c.usage.input))
            .collect();
        let expected: Vec<(String, TerminalState, u64)> = expected
            .iter()
            .map(|(l, s, u)| ((*l).to_owned(), *s, *u))
            .collect();
        assert_eq!(got, expected, "selection {words:?}");
    }
}

#[test]
fn a_rerun_of_a_rerun_carries_what_was_carried_before() {
    let parent = finished(RUN);
    let first = rerun::select(&parent, &selection("failed")).expect("a plan");
    // The rerun: its carried tasks, then a, b and c complete.
    let mut state = RunState::new();
    push(
        &mut state,
        Event::RunStarted {
            run_id: RunId::new("child").expect("run id"),
            batch: first.batch.clone(),
            batch_digest: first.digest,
            host: "h".into(),
            pid: 1,
        },
    );
    for c in &first.carried {
        push(
            &mut state,
            Event::TaskCarried {
                task: c.task,
                result: c.result.clone(),
                usage: c.usage,
            },
        );
    }
    for t in 0..3 {
        push(
            &mut state,
            Event::TaskFinished {
                task: TaskId(t),
                result: result(TerminalState::Completed),
            },
        );
    }
    let outcome = state.aggregate();
    push(
        &mut state,
        Event::RunFinished {
            state: outcome,
            summary: String::new(),
        },
    );
    let second = rerun::select(&state, &selection("partial")).expect("a plan");
    let e = second.carried.iter().find(|c| state.label(c.task) == "e");
    assert!(e.is_none(), "e runs again");
    let d = second
        .carried
        .iter()
        .find(|c| state.label(c.task) == "d")
        .expect("d carried");
    // d's usage was spent in the first run and carried twice.
    assert_eq!(d.usage.input, 40);
    assert_eq!(rerun_of(&state, ""), Ok("e f g".to_owned()));
}
