//! Data-driven tests of the decisions: `next_step` (fallback order, banned models, backoff,
//! deadline, side effects, max attempts, what is transient), `aggregate`, the inline text's
//! truncation marker and the summary text.
//!
//! Each `check` builds a journal for one task from a list of attempts, replays it, asks
//! `next_step`, and compares a one-line rendering of the answer with the expected line.

use std::time::Duration;

use sortie_core::decide::result_without_attempt;
use sortie_core::summary::inline_text;
use sortie_core::{
    AgentProfile, Attempt, AttemptOutcome, AttemptStatus, Batch, Event, Isolation, MaxOutput,
    NextStep, OrphanAction, OutputMode, Phase, RunConfig, RunId, RunOutcome, RunState, Seq,
    Stamped, StopReason, TaskId, TaskResult, TaskSpec, TerminalState, Timestamp, Usage, aggregate,
    backoff_delay, next_step, summary_text,
};

const T: TaskId = TaskId(0);

fn spec(model: Option<&str>, fallbacks: &[&str], max_retries: u32) -> TaskSpec {
    let mut s = TaskSpec::new("a", "/work");
    s.prompt = Some("do it".into());
    s.model = model.map(str::to_owned);
    s.fallback_models = fallbacks.iter().map(|m| (*m).to_owned()).collect();
    s.max_retries = max_retries;
    s
}

fn fail(reason: StopReason) -> Option<AttemptOutcome> {
    let error = match reason {
        StopReason::Error => "429 overloaded",
        StopReason::ModelError => "403 quota",
        other => other.as_str(),
    };
    Some(AttemptOutcome::failed(reason, error))
}

fn with_side_effects(o: Option<AttemptOutcome>) -> Option<AttemptOutcome> {
    o.map(|mut o| {
        o.side_effects = true;
        o
    })
}

fn batch(tasks: Vec<TaskSpec>) -> Batch {
    Batch {
        tasks,
        agents: AgentProfile::builtins(),
        config: RunConfig::default(),
        source: "decisions.toml".into(),
    }
}

/// Replays a run of one task, queued at time 0, whose attempts ran on the given models and
/// ended with the given outcomes (`None`: orphaned by a crash), each at `i + 1` seconds.
fn replay(spec: &TaskSpec, attempts: &[(Option<&str>, Option<AttemptOutcome>)]) -> RunState {
    let mut events = vec![
        Event::RunStarted {
            run_id: RunId::new("r").expect("run id"),
            batch: batch(vec![spec.clone()]),
            batch_digest: 0,
            host: "h".into(),
            pid: 1,
        },
        Event::TaskQueued { task: T },
    ];
    for (i, (model, outcome)) in attempts.iter().enumerate() {
        let attempt = Attempt(i as u32 + 1);
        let model = model.map(str::to_owned);
        if i > 0 {
            events.push(Event::RetryScheduled {
                task: T,
                next_attempt: attempt,
                model: model.clone(),
                delay: Duration::ZERO,
                reason: "test".into(),
            });
        }
        events.push(Event::AttemptLaunching {
            task: T,
            attempt,
            model,
        });
        events.push(Event::AttemptStarted {
            task: T,
            attempt,
            pid: 100 + attempt.0,
            start_time: 1,
        });
        events.push(match outcome {
            Some(outcome) => Event::AttemptFinished {
                task: T,
                attempt,
                outcome: outcome.clone(),
                usage: Usage::ZERO,
                output: if outcome.status == AttemptStatus::Failed {
                    String::new()
                } else {
                    "the answer".into()
                },
            },
            None => Event::AttemptOrphaned {
                task: T,
                attempt,
                action: OrphanAction::Gone,
            },
        });
    }
    let stamped: Vec<Stamped> = events
        .into_iter()
        .enumerate()
        .map(|(i, event)| Stamped {
            seq: Seq(i as u64),
            at: Timestamp(if i < 2 { 0 } else { 1000 * i as u64 }),
            event,
        })
        .collect();
    RunState::replay(&stamped)
        .unwrap_or_else(|(seq, v)| panic!("test journal refused at {seq}: {v}"))
}

fn show(step: &NextStep) -> String {
    match step {
        NextStep::Retry {
            attempt,
            model,
            delay,
            ..
        } => format!(
            "retry {attempt} on {} after {}ms",
            model.as_deref().unwrap_or("default"),
            delay.as_millis()
        ),
        NextStep::GiveUp(r) => show_result(r),
        NextStep::Verify => "verify".to_owned(),
        NextStep::Checking => "checking".to_owned(),
        NextStep::Feedback { attempt, .. } => format!("feedback round as attempt {attempt}"),
    }
}

fn show_result(r: &TaskResult) -> String {
    format!(
        "give up: {} {}{}: {}",
        r.state,
        r.stop_reason,
        r.phase.map(|p| format!(" ({p})")).unwrap_or_default(),
        r.error.as_deref().unwrap_or("-")
    )
}

/// Asks `next_step` at `now_ms` with `jitter` and compares its one-line rendering.
#[track_caller]
fn check(
    spec: &TaskSpec,
    attempts: &[(Option<&str>, Option<AttemptOutcome>)],
    now_ms: u64,
    jitter: u64,
    expected: &str,
) {
    let state = replay(spec, attempts);
    let rec = state.task(T).expect("task 0");
    let step = next_step(spec, rec, Timestamp(now_ms), jitter);
    assert_eq!(show(&step), expected, "after {attempts:?}");
}

#[test]
fn fallbacks_are_tried_in_order_then_the_primary() {
    let s = spec(Some("a"), &["b", "c"], 0);
    assert_eq!(s.max_attempts(), 3);
    let e = || fail(StopReason::Error);
    check(&s, &[(Some("a"), e())], 0, 0, "retry 2 on b after 0ms");
    check(
        &s,
        &[(Some("a"), e()), (Some("b"), e())],
        0,
        0,
        "retry 3 on c after 0ms",
    );
    check(
        &s,
        &[(Some("a"), e()), (Some("b"), e()), (Some("c"), e())],
        0,
        0,
        "give up: failed error: 429 overloaded (after 3 attempts: a → b → c)",
    );
    let s = spec(Some("a"), &["b", "c"], 4);
    let three = [(Some("a"), e()), (Some("b"), e()), (Some("c"), e())];
    check(&s, &three, 0, 0, "retry 4 on a after 0ms");
    let four = [three.as_slice(), &[(Some("a"), e())]].concat();
    // Back on the primary, a same-model retry: the second on `a`, so base × 2.
    check(&s, &four, 0, 0, "retry 5 on a after 1000ms");
}

#[test]
fn a_model_error_bans_its_model() {
    let me = || fail(StopReason::ModelError);
    let e = || fail(StopReason::Error);
    let s = spec(Some("a"), &["b"], 3);
    check(&s, &[(Some("a"), me())], 0, 0, "retry 2 on b after 0ms");
    // Attempt 3 would be the primary again, but `a` raised a model error.
    check(
        &s,
        &[(Some("a"), me()), (Some("b"), e())],
        0,
        0,
        "retry 3 on b after 500ms",
    );
    check(
        &s,
        &[(Some("a"), me()), (Some("b"), me())],
        0,
        0,
        "give up: failed model_error: 403 quota (after 2 attempts: a → b)",
    );
    check(
        &spec(Some("a"), &[], 2),
        &[(Some("a"), me())],
        0,
        0,
        "give up: failed model_error: 403 quota",
    );
    check(
        &spec(None, &[], 2),
        &[(None, me())],
        0,
        0,
        "give up: failed model_error: 403 quota",
    );
}

#[test]
fn backoff_only_on_the_same_model_within_half_to_full() {
    let e = || fail(StopReason::Error);
    let s = spec(None, &[], 3);
    check(&s, &[(None, e())], 0, 0, "retry 2 on default after 500ms");
    check(
        &s,
        &[(None, e())],
        0,
        500,
        "retry 2 on default after 1000ms",
    );
    check(&s, &[(None, e())], 0, 501, "retry 2 on default after 500ms");
    check(
        &s,
        &[(None, e()), (None, e())],
        0,
        0,
        "retry 3 on default after 1000ms",
    );
    check(
        &s,
        &[(None, e()), (None, e()), (None, e())],
        0,
        u64::MAX,
        &format!("retry 4 on default after {}ms", 2000 + u64::MAX % 2001),
    );
    // A switch to another model starts at once.
    check(
        &spec(Some("a"), &["b"], 3),
        &[(Some("a"), e())],
        0,
        u64::MAX,
        "retry 2 on b after 0ms",
    );
    for n in 0..70u32 {
        let d = 1000u64
            .saturating_mul(1u64.checked_shl(n).unwrap_or(u64::MAX))
            .min(60_000);
        for jitter in [0, 1, d / 2, d, d + 1, 12_345_678_901, u64::MAX] {
            let got = backoff_delay(n, jitter).as_millis() as u64;
            assert!(
                (d / 2..=d).contains(&got),
                "backoff_delay({n}, {jitter}) = {got}ms, outside [{}, {d}]",
                d / 2
            );
        }
    }
}

#[test]
fn no_retry_reaches_the_deadline() {
    let e = || fail(StopReason::Error);
    let mut s = spec(None, &[], 3);
    s.deadline = Some(Duration::from_secs(10));
    let giving_up = "give up: timeout timeout (starting): deadline exceeded while starting or \
                     waiting to retry";
    check(
        &s,
        &[(None, e())],
        9_000,
        0,
        "retry 2 on default after 500ms",
    );
    check(&s, &[(None, e())], 9_500, 0, giving_up);
    check(&s, &[(None, e())], 9_600, 0, giving_up);
    let mut s = spec(Some("a"), &["b"], 3);
    s.deadline = Some(Duration::from_secs(10));
    check(&s, &[(Some("a"), e())], 9_999, 0, "retry 2 on b after 0ms");
    check(&s, &[(Some("a"), e())], 10_000, 0, giving_up);
}

#[test]
fn side_effects_outside_a_worktree_are_not_retried() {
    let fx = || with_side_effects(fail(StopReason::Error));
    let s = spec(None, &[], 2);
    check(
        &s,
        &[(None, fx())],
        0,
        0,
        "give up: failed error: 429 overloaded; not retried: the agent ran side-effecting tools \
         outside a worktree",
    );
    let mut isolated = s.clone();
    isolated.isolation = Isolation::Worktree;
    check(
        &isolated,
        &[(None, fx())],
        0,
        0,
        "retry 2 on default after 500ms",
    );
    let mut allowed = s.clone();
    allowed.retry_after_side_effects = true;
    check(
        &allowed,
        &[(None, fx())],
        0,
        0,
        "retry 2 on default after 500ms",
    );
}

/// Replays one task whose first attempt started, ran a side-effecting tool (when `fx`) and was
/// orphaned by a crash.
fn orphaned_after(spec: &TaskSpec, fx: bool) -> RunState {
    let mut state = replay(spec, &[]);
    let mut events = vec![
        Event::AttemptLaunching {
            task: T,
            attempt: Attempt(1),
            model: None,
        },
        Event::AttemptStarted {
            task: T,
            attempt: Attempt(1),
            pid: 101,
            start_time: 1,
        },
    ];
    if fx {
        events.push(Event::AttemptSideEffects {
            task: T,
            attempt: Attempt(1),
        });
    }
    events.push(Event::AttemptOrphaned {
        task: T,
        attempt: Attempt(1),
        action: OrphanAction::Killed,
    });
    for event in events {
        let stamped = Stamped {
            seq: state.next_seq,
            at: Timestamp(5000),
            event,
        };
        state.apply(&stamped).expect("legal");
    }
    state
}

#[test]
fn an_orphan_remembers_its_side_effects() {
    let s = spec(None, &[], 2);
    let step = |spec: &TaskSpec, fx: bool| {
        let state = orphaned_after(spec, fx);
        let rec = state.task(T).expect("task 0");
        assert_eq!(rec.attempts[0].side_effects, fx);
        assert_eq!(rec.attempts[0].outcome().map(|o| o.side_effects), Some(fx));
        show(&next_step(spec, rec, Timestamp(6000), 0))
    };
    assert_eq!(step(&s, false), "retry 2 on default after 0ms");
    assert_eq!(
        step(&s, true),
        "give up: failed interrupted: sortie or its supervisor stopped while attempt 1 ran; its process was still \
         running and was killed; not retried: the agent ran side-effecting tools outside a \
         worktree"
    );
    let mut isolated = s.clone();
    isolated.isolation = Isolation::Worktree;
    assert_eq!(step(&isolated, true), "retry 2 on default after 0ms");

    // Recorded once per attempt.
    let mut live = replay(&s, &[]);
    let events = [
        Event::AttemptLaunching {
            task: T,
            attempt: Attempt(1),
            model: None,
        },
        Event::AttemptSideEffects {
            task: T,
            attempt: Attempt(1),
        },
    ];
    for event in events.iter().cloned() {
        let seq = live.next_seq;
        live.apply(&Stamped {
            seq,
            at: Timestamp(5000),
            event,
        })
        .expect("legal");
    }
    assert!(
        live.check(&events[1]).is_err(),
        "a second AttemptSideEffects"
    );
}

#[test]
fn attempts_stop_at_the_policy() {
    let e = || fail(StopReason::Error);
    let s = spec(None, &[], 1);
    assert_eq!(s.max_attempts(), 2);
    check(&s, &[(None, e())], 0, 0, "retry 2 on default after 500ms");
    check(
        &s,
        &[(None, e()), (None, e())],
        0,
        0,
        "give up: failed error: 429 overloaded (after 2 attempts: default → default)",
    );
    let s = spec(None, &[], 0);
    check(
        &s,
        &[(None, e())],
        0,
        0,
        "give up: failed error: 429 overloaded",
    );
    // max = 1 + max(retries, fallbacks)
    assert_eq!(spec(None, &["x", "y", "z"], 1).max_attempts(), 4);
}

#[test]
fn what_is_retried_and_what_is_final() {
    let s = spec(None, &[], 2);
    let retried = "retry 2 on default after 500ms";
    for reason in [
        StopReason::Error,
        StopReason::ProtocolError,
        StopReason::UnexpectedSignal,
        StopReason::SpawnError,
        StopReason::Stalled,
    ] {
        check(&s, &[(None, fail(reason))], 0, 0, retried);
    }
    // sortie itself stopped (Ctrl-C) or died (an orphaned attempt counts as interrupted): that
    // says nothing about the provider, so the retry starts at once.
    let at_once = "retry 2 on default after 0ms";
    check(&s, &[(None, fail(StopReason::Interrupted))], 0, 0, at_once);
    check(&s, &[(None, None)], 0, 0, at_once);
    check(
        &s,
        &[(None, Some(AttemptOutcome::completed()))],
        0,
        0,
        "give up: completed completed: -",
    );
    for (reason, expected) in [
        (
            StopReason::NonzeroExit,
            "give up: failed nonzero_exit: nonzero_exit",
        ),
        (
            StopReason::Cancelled,
            "give up: cancelled cancelled: cancelled",
        ),
        (
            StopReason::SetupError,
            "give up: failed setup_error: setup_error",
        ),
        (StopReason::Invalid, "give up: failed invalid: invalid"),
    ] {
        check(&s, &[(None, fail(reason))], 0, 0, expected);
    }
    let mut timeout = AttemptOutcome::failed(StopReason::Timeout, "attempt timed out");
    timeout.phase = Some(Phase::Running);
    check(
        &s,
        &[(None, Some(timeout))],
        0,
        0,
        "give up: timeout timeout (running): attempt timed out",
    );
    let mut budget = AttemptOutcome::failed(StopReason::Budget, "token budget");
    budget.status = AttemptStatus::Partial;
    check(
        &s,
        &[(None, Some(budget))],
        0,
        0,
        "give up: partial budget: token budget",
    );
    // Partial output is kept, never retried, even with a transient reason.
    let mut partial = AttemptOutcome::failed(StopReason::ProtocolError, "no final message");
    partial.status = AttemptStatus::Partial;
    check(
        &s,
        &[(None, Some(partial))],
        0,
        0,
        "give up: partial protocol_error: no final message",
    );
}

#[test]
fn a_result_text_is_the_output_else_the_error() {
    let s = spec(None, &[], 0);
    let state = replay(&s, &[(None, Some(AttemptOutcome::completed()))]);
    let NextStep::GiveUp(r) = next_step(&s, state.task(T).expect("task"), Timestamp(0), 0) else {
        panic!("a completed attempt is final");
    };
    assert_eq!(r.text, "the answer");
    let state = replay(&s, &[(None, fail(StopReason::NonzeroExit))]);
    let NextStep::GiveUp(r) = next_step(&s, state.task(T).expect("task"), Timestamp(0), 0) else {
        panic!("nonzero_exit is final");
    };
    assert_eq!(r.text, "nonzero_exit");
}

#[test]
fn aggregate_follows_the_semantics_order() {
    use RunOutcome as R;
    use TerminalState::*;
    let cases: &[(&[TerminalState], RunOutcome)] = &[
        (&[], R::Completed),
        (&[Completed, Completed], R::Completed),
        (&[Completed, Failed], R::Partial),
        (&[Completed, Skipped], R::Partial),
        (&[Partial], R::Partial),
        (&[Failed, Partial, Cancelled], R::Partial),
        (&[Cancelled, Cancelled], R::Cancelled),
        (&[Timeout, Cancelled], R::Timeout),
        (&[Timeout], R::Timeout),
        (&[Failed, Cancelled], R::Failed),
        (&[Skipped], R::Failed),
        (&[Skipped, Cancelled], R::Failed),
        (&[Timeout, Failed], R::Failed),
    ];
    for (results, expected) in cases {
        assert_eq!(aggregate(results.iter().copied()), *expected, "{results:?}");
    }
}

fn out_spec(bytes: u64, lines: u64) -> TaskSpec {
    let mut s = spec(None, &[], 0);
    s.output = Some("/out/a.md".into());
    s.max_output = MaxOutput { bytes, lines };
    s
}

#[test]
fn inline_text_is_cut_with_a_marker_naming_the_artifact() {
    let cases: &[(TaskSpec, &str, &str)] = &[
        (out_spec(10, 100), "short", "short"),
        (out_spec(10, 100), "0123456789", "0123456789"),
        (
            out_spec(10, 100),
            "0123456789abcdef",
            "0123456789\n[output truncated at 10 of 16 bytes; full output in /out/a.md]",
        ),
        (
            out_spec(100, 2),
            "a\nb\nc\nd",
            "a\nb\n[output truncated at 3 of 7 bytes; full output in /out/a.md]",
        ),
        // Two lines and their final newline fit in two lines.
        (out_spec(100, 2), "a\nb\n", "a\nb\n"),
        (
            out_spec(100, 2),
            "a\nb\n\n",
            "a\nb\n[output truncated at 3 of 5 bytes; full output in /out/a.md]",
        ),
        // Never cut inside a character.
        (
            out_spec(3, 100),
            "ééé",
            "é\n[output truncated at 2 of 6 bytes; full output in /out/a.md]",
        ),
        (
            {
                let mut s = out_spec(4, 100);
                s.output = None;
                s
            },
            "abcdefgh",
            "abcd\n[output truncated at 4 of 8 bytes; no artifact was configured]",
        ),
        (
            {
                let mut s = out_spec(4, 100);
                s.output_mode = OutputMode::FileOnly;
                s
            },
            "abcdefgh",
            "Output written to /out/a.md",
        ),
    ];
    for (spec, text, expected) in cases {
        assert_eq!(
            inline_text(spec, text),
            *expected,
            "{text:?} with {:?}",
            spec.max_output
        );
    }
}

#[test]
fn summary_lists_each_task_with_its_state_and_text() {
    let mut b = spec(None, &[], 0);
    b.label = "b".into();
    let mut c = spec(None, &[], 0);
    c.label = "c".into();
    let events = [
        Event::RunStarted {
            run_id: RunId::new("r").expect("run id"),
            batch: batch(vec![spec(None, &[], 0), b, c]),
            batch_digest: 0,
            host: "h".into(),
            pid: 1,
        },
        Event::TaskFinished {
            task: TaskId(0),
            result: TaskResult {
                state: TerminalState::Completed,
                stop_reason: StopReason::Completed,
                phase: None,
                error: None,
                text: "hello\nworld".into(),
                result: None,
            },
        },
        Event::TaskFinished {
            task: TaskId(1),
            result: result_without_attempt(
                TerminalState::Skipped,
                StopReason::Cancelled,
                None,
                "dependency \"a\" did not complete",
            ),
        },
    ];
    let stamped: Vec<Stamped> = events
        .into_iter()
        .enumerate()
        .map(|(i, event)| Stamped {
            seq: Seq(i as u64),
            at: Timestamp(i as u64),
            event,
        })
        .collect();
    let state = RunState::replay(&stamped).expect("replay");
    assert_eq!(
        summary_text(&state),
        "[a] completed\nhello\nworld\n\n[b] skipped\ndependency \"a\" did not complete\n\n[c] \
         pending\n(not finished)"
    );
    assert_eq!(summary_text(&RunState::new()), "");
    // A run whose budget ran out says so after the tasks, as one more block.
    let mut state = state;
    let exceeded = Stamped {
        seq: state.next_seq,
        at: Timestamp(9),
        event: Event::RunBudgetExceeded {
            limit: sortie_core::BudgetLimit::Cost,
            reason: "spent $2.00 of $1.00".into(),
        },
    };
    state.apply(&exceeded).expect("apply");
    assert!(
        summary_text(&state)
            .ends_with("[c] pending\n(not finished)\n\nRun budget exceeded: spent $2.00 of $1.00"),
        "{}",
        summary_text(&state)
    );
}

// #10: a crash of sortie spends `max_orphans`, never a retry.
#[test]
fn an_orphan_spends_no_retry_and_orphans_have_their_own_budget() {
    let e = || fail(StopReason::Error);
    // No retries at all: an orphan is still tried again, on its own model, at once.
    let mut s = spec(Some("a"), &["b"], 0);
    s.fallback_models.clear();
    check(&s, &[(Some("a"), None)], 0, 0, "retry 2 on a after 0ms");
    check(
        &s,
        &[(Some("a"), None), (Some("a"), None), (Some("a"), None)],
        0,
        0,
        "retry 4 on a after 0ms",
    );
    // The fourth orphan is over `max_orphans = 3`.
    let four: Vec<(Option<&str>, Option<AttemptOutcome>)> = vec![(Some("a"), None); 4];
    check(
        &s,
        &four,
        0,
        0,
        "give up: failed interrupted: sortie or its supervisor stopped while attempt 4 ran; its process was gone; \
         not retried: sortie stopped 4 times while this task ran (max_orphans = 3) \
         (after 4 attempts: a → a → a → a)",
    );
    // After an orphan, a real failure still finds its one retry, on the first fallback.
    let s = spec(Some("a"), &["b"], 1);
    check(
        &s,
        &[(Some("a"), None), (Some("a"), e())],
        0,
        0,
        "retry 3 on b after 0ms",
    );
    check(
        &s,
        &[(Some("a"), None), (Some("a"), e()), (Some("b"), e())],
        0,
        0,
        "give up: failed error: 429 overloaded (after 3 attempts: a → a → b)",
    );
    // `max_orphans = 0`: a crash ends the task.
    let mut s = spec(None, &[], 2);
    s.max_orphans = 0;
    let step = show(&next_step(
        &s,
        replay(&s, &[(None, None)]).task(T).expect("task"),
        Timestamp(0),
        0,
    ));
    assert!(step.starts_with("give up: failed interrupted"), "{step}");
    assert!(step.contains("max_orphans = 0"), "{step}");
}

// #32: a failure while the attempt's output could not be written to the state dir (a full
// disk) is composed as an interrupt (step 7 of `attempt_outcome`): with no retries at all, the
// task is tried again, at once, on its model; the same exit without the observation fails it.
#[test]
fn a_failure_on_a_full_disk_spends_no_retry() {
    use sortie_core::decide::{Finished, OutcomeRules, WatchEnd, attempt_outcome};
    let compose = |lost: Option<&str>| {
        let mut o = AttemptOutcome::failed(StopReason::NonzeroExit, "exited with code 1");
        o.exit_code = Some(1);
        let reader = Finished {
            outcome: o,
            usage: Usage::ZERO,
            output: String::new(),
            has_output: false,
        };
        let f = attempt_outcome(
            reader,
            &WatchEnd::default(),
            None,
            "",
            OutcomeRules::default(),
            |_, _| {},
            lost,
        );
        Some(f.outcome)
    };
    let s = spec(Some("a"), &["b"], 0);
    let full = || compose(Some("its disk was full"));
    check(&s, &[(Some("a"), full())], 0, 0, "retry 2 on a after 0ms");
    check(
        &s,
        &[(Some("a"), full()), (Some("a"), full())],
        0,
        0,
        "retry 3 on a after 0ms",
    );
    check(
        &s,
        &[(Some("a"), compose(None))],
        0,
        0,
        "give up: failed nonzero_exit: exited with code 1",
    );
    // The same disk would fail its retry again, spending the agent's tokens each time: such an
    // attempt stops the run (resumable) while the disk is still full, unless the run was
    // stopping already; a failure of the task's own, or an interrupt sortie caused, does not.
    use sortie_core::decide::stops_the_run;
    use sortie_core::plan::Stopping;
    let full = full().expect("outcome");
    assert!(stops_the_run(&full, None, true));
    // A resume recording it from its files once space was freed goes on.
    assert!(!stops_the_run(&full, None, false));
    assert!(!stops_the_run(&full, Some(Stopping::Interrupt), true));
    assert!(!stops_the_run(&full, Some(Stopping::Cancel), true));
    assert!(!stops_the_run(&compose(None).expect("outcome"), None, true));
}

// #32: an interrupt of sortie (SIGINT, SIGTERM, SIGHUP) is the user's: it spends nothing.
#[test]
fn an_interrupt_spends_no_retry_keeps_its_model_and_passes_side_effects() {
    let i = || fail(StopReason::Interrupted);
    let e = || fail(StopReason::Error);
    // No retries at all: the interrupted attempt is still tried again, on its model, at once.
    let s = spec(Some("a"), &[], 0);
    check(&s, &[(Some("a"), i())], 0, 0, "retry 2 on a after 0ms");
    // Any number of interrupts in a row: the third Ctrl-C fails nothing.
    let s = spec(Some("a"), &["b"], 1);
    check(
        &s,
        &[(Some("a"), i()), (Some("a"), i()), (Some("a"), i())],
        0,
        0,
        "retry 4 on a after 0ms",
    );
    // The interrupt does not move the task to a fallback: the conversation goes on.
    check(
        &s,
        &[(Some("a"), e()), (Some("b"), i())],
        0,
        0,
        "retry 3 on b after 0ms",
    );
    // The retries are the real failures': one failure, interrupts around it, one retry left.
    check(
        &s,
        &[(Some("a"), i()), (Some("a"), e()), (Some("b"), i())],
        0,
        0,
        "retry 4 on b after 0ms",
    );
    check(
        &s,
        &[
            (Some("a"), i()),
            (Some("a"), e()),
            (Some("b"), i()),
            (Some("b"), e()),
        ],
        0,
        0,
        "give up: failed error: 429 overloaded (after 4 attempts: a → a → b → b)",
    );
    // Side effects outside a worktree end a failed task, never an interrupted one.
    let s = spec(None, &[], 2);
    check(
        &s,
        &[(None, with_side_effects(i()))],
        0,
        0,
        "retry 2 on default after 0ms",
    );
    let step = show(&next_step(
        &s,
        replay(&s, &[(None, with_side_effects(e()))])
            .task(T)
            .expect("task"),
        Timestamp(0),
        0,
    ));
    assert!(
        step.contains("not retried: the agent ran side-effecting"),
        "{step}"
    );
}

/// `apply --all` takes a completed task's kept work; the others' only with `--include-failed`.
#[test]
fn apply_all_takes_completed_tasks_unless_asked_for_the_rest() {
    use TerminalState::*;
    let table = [
        (Completed, false, true),
        (Completed, true, true),
        (Partial, false, false),
        (Partial, true, true),
        (Failed, false, false),
        (Failed, true, true),
        (Timeout, false, false),
        (Timeout, true, true),
        (Cancelled, false, false),
        (Cancelled, true, true),
        (Skipped, false, false),
    ];
    for (ended, include_failed, taken) in table {
        assert_eq!(
            ended.applied_by_all(include_failed),
            taken,
            "{ended} with include_failed = {include_failed}"
        );
    }
}

/// An attempt timeout is final by default; `retry_timeouts` retries it (with backoff, within
/// `max_retries`).
#[test]
fn an_attempt_timeout_is_retried_only_with_retry_timeouts() {
    let mut timeout = AttemptOutcome::failed(StopReason::Timeout, "attempt timed out");
    timeout.phase = Some(Phase::Running);
    let plain = spec(None, &[], 2);
    let mut retrying = spec(None, &[], 2);
    retrying.retry_timeouts = true;
    let mut spent = spec(None, &[], 0);
    spent.retry_timeouts = true;
    let table = [
        (
            &plain,
            timeout.clone(),
            "give up: timeout timeout (running): attempt timed out",
        ),
        (&retrying, timeout.clone(), "retry 2 on default after 500ms"),
        (
            &spent,
            timeout,
            "give up: timeout timeout (running): attempt timed out",
        ),
    ];
    for (s, outcome, expected) in table {
        check(s, &[(None, Some(outcome))], 0, 0, expected);
    }
}
