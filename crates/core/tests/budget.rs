//! Data-driven tests of a task's budget while an attempt runs: budgets and usage in, the
//! breach, the wrap-up steps and the final usage out. One table per rule.

use sortie_core::budget::{BudgetStep, BudgetWatch, TaskBudget, WrapUpAsk, final_usage};
use sortie_core::{Cost, Usage};

fn usage(turns: u32, tokens: u64, cost_nanos: u64) -> Usage {
    Usage {
        turns,
        input: tokens,
        cost: Cost {
            nanos: cost_nanos,
            unreported: 0,
        },
        ..Usage::ZERO
    }
}

fn budget(turns: Option<u32>, tokens: Option<u64>, cost: Option<u64>, prior: Usage) -> TaskBudget {
    TaskBudget {
        max_turns: turns,
        max_tokens: tokens,
        max_cost_nanos: cost,
        grace_turns: 2,
        prior,
    }
}

#[test]
fn a_breach_counts_the_earlier_attempts_and_names_the_first_budget_met() {
    let none = Usage::ZERO;
    let table: &[(TaskBudget, Usage, Option<&str>)] = &[
        (
            budget(None, None, None, none),
            usage(1000, 1 << 40, 1 << 40),
            None,
        ),
        // Turns: at the maximum is a breach.
        (budget(Some(5), None, None, none), usage(4, 0, 0), None),
        (
            budget(Some(5), None, None, none),
            usage(5, 0, 0),
            Some("reached max turns budget (5 of 5)"),
        ),
        // Earlier attempts count.
        (
            budget(Some(5), None, None, usage(3, 0, 0)),
            usage(2, 0, 0),
            Some("reached max turns budget (5 of 5)"),
        ),
        // Tokens and cost: over the maximum, not at it.
        (budget(None, Some(10), None, none), usage(0, 10, 0), None),
        (
            budget(None, Some(10), None, usage(0, 6, 0)),
            usage(0, 5, 0),
            Some("exceeded max tokens budget (11 of 10)"),
        ),
        (
            budget(None, None, Some(1_000_000), none),
            usage(0, 0, 1_000_000),
            None,
        ),
        (
            budget(None, None, Some(1_000_000), none),
            usage(0, 0, 1_500_000),
            Some("exceeded max cost budget ($0.0015 of $0.0010)"),
        ),
        // Two met at once: turns first, then tokens.
        (
            budget(Some(1), Some(1), Some(1), none),
            usage(1, 2, 2),
            Some("reached max turns budget (1 of 1)"),
        ),
        (
            budget(Some(9), Some(1), Some(1), none),
            usage(1, 2, 2),
            Some("exceeded max tokens budget (2 of 1)"),
        ),
    ];
    for (i, (b, u, expected)) in table.iter().enumerate() {
        assert_eq!(b.breach(u).as_deref(), *expected, "row {i}");
    }
}

/// One usage update: (the attempt's turns, steerable now, working), and the step expected.
type Update = (u32, bool, bool, Option<&'static str>);

/// Renders a step for the tables.
fn step(s: Option<BudgetStep>) -> Option<String> {
    s.map(|s| match s {
        BudgetStep::WrapUp => "wrap up".to_owned(),
        BudgetStep::Stop(m) => format!("stop: {m}"),
    })
}

#[test]
fn a_breach_asks_a_steerable_agent_to_wrap_up_and_stops_it_after_the_grace_turns() {
    let cases: &[(u32, &[Update])] = &[
        // Not steerable: stopped at once.
        (
            2,
            &[
                (2, false, true, None),
                (
                    3,
                    false,
                    true,
                    Some(
                        "stop: reached max turns budget (3 of 3); stopped at once (the agent cannot be steered), not wrapped up",
                    ),
                ),
            ],
        ),
        // grace_turns = 0: stopped at once, steerable or not.
        (
            0,
            &[(
                3,
                true,
                true,
                Some(
                    "stop: reached max turns budget (3 of 3); stopped at once (grace_turns = 0), not wrapped up",
                ),
            )],
        ),
        // Steerable: asked once, then stopped when still working two turns later.
        (
            2,
            &[
                (3, true, true, Some("wrap up")),
                (4, true, true, None),
                // Between runs at the grace's end: not stopped yet.
                (5, true, false, None),
                (
                    5,
                    true,
                    true,
                    Some(
                        "stop: reached max turns budget (3 of 3); asked to wrap up, but still working after 2 grace turn(s): stopped, not wrapped up",
                    ),
                ),
            ],
        ),
    ];
    for (i, (grace, updates)) in cases.iter().enumerate() {
        let mut w = BudgetWatch::new(TaskBudget {
            grace_turns: *grace,
            ..budget(Some(3), None, None, Usage::ZERO)
        });
        for (turns, steerable, working, expected) in *updates {
            let got = step(w.on_usage(&usage(*turns, 0, 0), *steerable, *working));
            assert_eq!(got.as_deref(), *expected, "case {i}, turns {turns}");
        }
    }
}

#[test]
fn the_run_budget_asks_for_a_wrap_up_the_same_way() {
    let table: &[(u32, bool, &[WrapUpAsk])] = &[
        (2, true, &[WrapUpAsk::Asked, WrapUpAsk::AlreadyAsked]),
        (2, false, &[WrapUpAsk::Cannot, WrapUpAsk::Cannot]),
        (0, true, &[WrapUpAsk::Cannot]),
    ];
    for (grace, steerable, asks) in table {
        let mut w = BudgetWatch::new(TaskBudget {
            grace_turns: *grace,
            ..TaskBudget::default()
        });
        for expected in *asks {
            let got = w.ask_wrap_up("run budget exceeded".into(), &usage(1, 0, 0), *steerable);
            assert_eq!(got, *expected, "grace {grace}, steerable {steerable}");
        }
    }
    // Asked at turn 1 with 2 grace turns: working at turn 3 is stopped.
    let mut w = BudgetWatch::new(TaskBudget {
        grace_turns: 2,
        ..TaskBudget::default()
    });
    w.ask_wrap_up("run budget exceeded".into(), &usage(1, 0, 0), true);
    assert_eq!(step(w.on_usage(&usage(2, 0, 0), true, true)), None);
    assert!(matches!(
        w.on_usage(&usage(3, 0, 0), true, true),
        Some(BudgetStep::Stop(m)) if m.starts_with("run budget exceeded; asked to wrap up")
    ));
}

#[test]
fn a_wrap_up_is_accounted_for_at_the_end_or_stops_when_it_cannot_be_sent() {
    let mut w = BudgetWatch::new(budget(Some(1), None, None, Usage::ZERO));
    assert_eq!(w.wrapped_up(), None);
    assert_eq!(w.wrap_up_failed(), None, "nothing asked, nothing to stop");
    assert_eq!(
        w.on_usage(&usage(1, 0, 0), true, true),
        Some(BudgetStep::WrapUp)
    );
    assert_eq!(
        w.wrapped_up().as_deref(),
        Some(
            "reached max turns budget (1 of 1); asked to wrap up, and it wrapped up within 2 grace turn(s)"
        )
    );
    assert_eq!(
        w.wrap_up_failed().as_deref(),
        Some("reached max turns budget (1 of 1); stopped (the wrap-up request could not be sent)")
    );
    assert_eq!(w.wrapped_up(), None, "a failed wrap-up is forgotten");
}

#[test]
fn the_final_usage_never_goes_below_what_was_seen_and_the_reader_says_if_the_cost_is_known() {
    let unreported = |mut u: Usage| {
        u.cost.unreported = 1;
        u
    };
    let table: &[(Usage, Usage, Usage)] = &[
        // (the reader's last word, seen, final)
        (usage(3, 10, 5), usage(2, 20, 1), usage(3, 20, 5)),
        (Usage::ZERO, usage(2, 20, 1), usage(2, 20, 1)),
        (
            unreported(usage(1, 1, 0)),
            usage(2, 2, 0),
            unreported(usage(2, 2, 0)),
        ),
        (usage(1, 1, 7), unreported(usage(2, 2, 0)), usage(2, 2, 7)),
    ];
    for (i, (last, seen, expected)) in table.iter().enumerate() {
        assert_eq!(final_usage(*last, seen), *expected, "row {i}");
    }
}
