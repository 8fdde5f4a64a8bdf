//! Data-driven tests of how an attempt's outcome is composed: the reader's end, the watchdog's
//! stop, the executor's end, denials, `transient_on` and the rate limit in, the outcome out;
//! one row per step of the order, and rows where two steps meet (the earlier one decides).
//! Also which launch failures are retried.

use sortie_core::decide::{
    Finished, LaunchFailure, OutcomeRules, SpawnFault, StopRequest, WatchEnd, attempt_outcome,
};
use sortie_core::{AttemptOutcome, AttemptStatus, Denial, Phase, StopReason, Usage, is_transient};

/// The facts of one attempt's end.
#[derive(Clone)]
struct Facts {
    reader: Finished,
    watch: WatchEnd,
    executor_end: Option<AttemptOutcome>,
    stderr: &'static str,
    allow_denials: bool,
    transient_on: Vec<String>,
    /// The task is a plain command.
    plain: bool,
    /// Why its output could not be written to the state dir, when it could not.
    output_lost: Option<&'static str>,
}

fn reader(outcome: AttemptOutcome, output: &str) -> Finished {
    Finished {
        outcome,
        usage: Usage {
            turns: 2,
            ..Usage::ZERO
        },
        output: output.to_owned(),
        has_output: !output.is_empty(),
    }
}

fn facts(reader: Finished) -> Facts {
    Facts {
        reader,
        watch: WatchEnd::default(),
        executor_end: None,
        stderr: "",
        allow_denials: false,
        transient_on: vec![],
        plain: false,
        output_lost: None,
    }
}

fn nonzero(error: &str) -> AttemptOutcome {
    let mut o = AttemptOutcome::failed(StopReason::NonzeroExit, error);
    o.exit_code = Some(3);
    o
}

fn denied() -> AttemptOutcome {
    let mut o = AttemptOutcome::completed();
    Denial::add(&mut o.denials, "Bash");
    o
}

fn stop(reason: StopReason, phase: Option<Phase>, message: &str) -> Option<StopRequest> {
    Some(StopRequest {
        reason,
        phase,
        message: message.to_owned(),
    })
}

/// A stand-in for the protocol's rate-limit reader: a failed `error` whose error or text says
/// 429 is a rate limit, with a wait of 7 s when the text says `retry in 7s`.
fn mark(o: &mut AttemptOutcome, text: &str) {
    let error = o.error.clone().unwrap_or_default();
    if o.status == AttemptStatus::Failed
        && o.stop_reason == StopReason::Error
        && (error.contains("429") || text.contains("429"))
    {
        o.rate_limited = true;
        let said = format!("{error}\n{text}");
        o.retry_after_ms = said.contains("retry in 7s").then_some(7_000);
    }
}

/// One line per outcome: `status reason [phase] | error | output [| rate limited]`.
fn render(f: &Finished) -> String {
    let o = &f.outcome;
    let mut line = format!("{:?} {:?}", o.status, o.stop_reason);
    if let Some(p) = o.phase {
        line.push_str(&format!(" {p:?}"));
    }
    line.push_str(&format!(
        " | {} | {}",
        o.error.as_deref().unwrap_or("-"),
        f.output
    ));
    if o.rate_limited {
        line.push_str(&format!(" | rate limited {:?}", o.retry_after_ms));
    }
    line
}

fn check(table: Vec<(&str, Facts, &str)>) {
    for (name, f, expected) in table {
        let rules = OutcomeRules {
            allow_denials: f.allow_denials,
            transient_on: &f.transient_on,
            plain: f.plain,
        };
        let got = attempt_outcome(
            f.reader,
            &f.watch,
            f.executor_end,
            f.stderr,
            rules,
            mark,
            f.output_lost,
        );
        assert_eq!(render(&got), expected, "{name}");
    }
}

#[test]
fn each_step_of_the_order_on_its_own() {
    let timed_out = WatchEnd {
        stop: stop(
            StopReason::Timeout,
            Some(Phase::Running),
            "attempt timed out after 10s",
        ),
        sent: Some(StopReason::Timeout),
        ..WatchEnd::default()
    };
    let wrapped = WatchEnd {
        wrapped_up: Some("reached max turns budget (3 of 3); asked to wrap up, and it wrapped up within 2 grace turn(s)".into()),
        ..WatchEnd::default()
    };
    let mut slurm = AttemptOutcome::failed(StopReason::Timeout, "slurm: job hit its time limit");
    slurm.phase = Some(Phase::Running);
    check(vec![
        (
            "the reader's end stands alone",
            facts(reader(AttemptOutcome::completed(), "done")),
            "Completed Completed | - | done",
        ),
        (
            "a stop that reached the child is the outcome, with its message and phase",
            Facts {
                watch: timed_out.clone(),
                ..facts(reader(
                    AttemptOutcome::failed(StopReason::UnexpectedSignal, "killed"),
                    "",
                ))
            },
            "Failed Timeout Running | attempt timed out after 10s | attempt timed out after 10s",
        ),
        (
            "an agent that wrapped up by itself is partial, output kept",
            Facts {
                watch: wrapped,
                ..facts(reader(AttemptOutcome::completed(), "half done"))
            },
            "Partial Budget | reached max turns budget (3 of 3); asked to wrap up, and it wrapped up within 2 grace turn(s) | half done",
        ),
        (
            "an end the executor caused is the outcome",
            Facts {
                executor_end: Some(slurm.clone()),
                ..facts(reader(
                    AttemptOutcome::failed(StopReason::UnexpectedSignal, "killed"),
                    "",
                ))
            },
            "Failed Timeout Running | slurm: job hit its time limit | slurm: job hit its time limit",
        ),
        (
            "a completed attempt with denied tool calls is partial",
            facts(reader(denied(), "done")),
            "Partial Completed | the agent's permissions denied tool calls: Bash (allow_denials = true accepts this as completed) | done",
        ),
        (
            "unless the task allows denials",
            Facts {
                allow_denials: true,
                ..facts(reader(denied(), "done"))
            },
            "Completed Completed | - | done",
        ),
        (
            "a nonzero exit matching transient_on in stderr is a transient error",
            Facts {
                stderr: "curl: Connection reset by peer",
                transient_on: vec!["connection reset".into()],
                ..facts(reader(nonzero("exit 3"), ""))
            },
            "Failed Error | exit 3 (transient: matched \"connection reset\") | ",
        ),
        (
            "a transient error that is a rate limit is marked",
            facts(reader(
                AttemptOutcome::failed(StopReason::Error, "HTTP 429, retry in 7s"),
                "",
            )),
            "Failed Error | HTTP 429, retry in 7s |  | rate limited Some(7000)",
        ),
    ]);
}

#[test]
fn where_two_steps_meet_the_earlier_one_decides() {
    let cancelled = WatchEnd {
        stop: stop(StopReason::Cancelled, None, "cancelled by the user"),
        sent: Some(StopReason::Cancelled),
        ..WatchEnd::default()
    };
    let slurm = AttemptOutcome::failed(StopReason::Error, "slurm: node failure");
    check(vec![
        (
            "a stop sent wins over the executor's end",
            Facts {
                watch: cancelled.clone(),
                executor_end: Some(slurm.clone()),
                ..facts(reader(AttemptOutcome::completed(), ""))
            },
            "Failed Cancelled | cancelled by the user | cancelled by the user",
        ),
        (
            "a stop sent wins over a wrap-up's account",
            Facts {
                watch: WatchEnd {
                    wrapped_up: Some("asked to wrap up".into()),
                    stop: stop(
                        StopReason::Budget,
                        None,
                        "still working after 2 grace turn(s)",
                    ),
                    sent: Some(StopReason::Budget),
                    ..WatchEnd::default()
                },
                ..facts(reader(AttemptOutcome::completed(), "some work"))
            },
            "Partial Budget | still working after 2 grace turn(s) | some work",
        ),
        (
            "a stop decided but never sent (the child ended first) leaves the reader's end",
            Facts {
                watch: WatchEnd {
                    sent: None,
                    ..cancelled.clone()
                },
                ..facts(reader(AttemptOutcome::completed(), "done"))
            },
            "Completed Completed | - | done",
        ),
        (
            "the signal sent is the reason; the stop's phase only when it is the stop decided",
            Facts {
                watch: WatchEnd {
                    stop: stop(
                        StopReason::Timeout,
                        Some(Phase::Running),
                        "deadline exceeded while running",
                    ),
                    sent: Some(StopReason::Interrupted),
                    ..WatchEnd::default()
                },
                ..facts(reader(
                    AttemptOutcome::failed(StopReason::UnexpectedSignal, "killed"),
                    "",
                ))
            },
            "Failed Interrupted | deadline exceeded while running | deadline exceeded while running",
        ),
        (
            "the executor's end keeps the output the agent wrote, and the transient patterns read it",
            Facts {
                executor_end: Some(slurm),
                transient_on: vec!["node failure".into()],
                ..facts(reader(AttemptOutcome::completed(), "partial answer"))
            },
            "Failed Error | slurm: node failure | partial answer",
        ),
        (
            "a stop is never a rate limit, whatever the text",
            Facts {
                watch: cancelled,
                stderr: "HTTP 429",
                ..facts(reader(AttemptOutcome::failed(StopReason::Error, "429"), ""))
            },
            "Failed Cancelled | cancelled by the user | cancelled by the user",
        ),
        (
            "transient_on runs before the rate limit: a matched 429 exit is marked",
            Facts {
                stderr: "HTTP 429 Too Many Requests",
                transient_on: vec!["too many requests".into()],
                ..facts(reader(nonzero("exit 3"), ""))
            },
            "Failed Error | exit 3 (transient: matched \"too many requests\") |  | rate limited None",
        ),
        (
            "an unmatched nonzero exit is no rate limit",
            Facts {
                stderr: "HTTP 429",
                ..facts(reader(nonzero("exit 3"), ""))
            },
            "Failed NonzeroExit | exit 3 | ",
        ),
        (
            "denials are judged after the executor's end: a failed end is not made partial",
            Facts {
                executor_end: Some(AttemptOutcome::failed(StopReason::Error, "lost node")),
                ..facts(reader(denied(), "done"))
            },
            "Failed Error | lost node | done",
        ),
    ]);
}

#[test]
fn the_usage_is_never_below_what_the_watchdog_saw_and_side_effects_survive_the_executor() {
    let mut with_effects = AttemptOutcome::completed();
    with_effects.side_effects = true;
    let f = Facts {
        watch: WatchEnd {
            seen: Usage {
                turns: 5,
                input: 9,
                ..Usage::ZERO
            },
            ..WatchEnd::default()
        },
        executor_end: Some(AttemptOutcome::failed(StopReason::Error, "oom")),
        ..facts(reader(with_effects, ""))
    };
    let got = attempt_outcome(
        f.reader,
        &f.watch,
        f.executor_end,
        "",
        OutcomeRules::default(),
        mark,
        None,
    );
    assert_eq!((got.usage.turns, got.usage.input), (5, 9));
    assert!(got.outcome.side_effects);
}

#[test]
fn a_launch_failure_is_retried_only_when_it_may_pass_next_time() {
    let table: &[(LaunchFailure, StopReason, bool)] = &[
        (LaunchFailure::Adopt, StopReason::Error, true),
        (LaunchFailure::Argv, StopReason::Invalid, false),
        (LaunchFailure::Copy, StopReason::SetupError, false),
        (LaunchFailure::HomeFiles, StopReason::SpawnError, true),
        (LaunchFailure::HomeConfig, StopReason::SetupError, false),
        (LaunchFailure::SessionDir, StopReason::SpawnError, true),
        (LaunchFailure::PromptFile, StopReason::SpawnError, true),
        (LaunchFailure::Secret, StopReason::SetupError, false),
        (LaunchFailure::Sandbox, StopReason::SetupError, false),
    ];
    let spawn: &[(SpawnFault, bool)] = &[
        (SpawnFault::EmptyCommand, false),
        (SpawnFault::NotFound, false),
        (SpawnFault::PermissionDenied, false),
        (SpawnFault::NotExecutable, false),
        (SpawnFault::BadCwd, false),
        (SpawnFault::NulByte, false),
        (SpawnFault::TooLong, false),
        (SpawnFault::Other, true),
    ];
    let spawn = spawn.iter().map(|&(fault, retried)| {
        let reason = if retried {
            StopReason::SpawnError
        } else {
            StopReason::Invalid
        };
        (LaunchFailure::Spawn(fault), reason, retried)
    });
    let table: Vec<_> = table.iter().copied().chain(spawn).collect();
    for (at, reason, retried) in table {
        let o = at.outcome("it broke");
        assert_eq!(o.stop_reason, reason, "{at:?}");
        assert_eq!(o.status, AttemptStatus::Failed, "{at:?}");
        assert_eq!(is_transient(&o), retried, "{at:?}");
    }
}

// #32: an attempt whose end is lost (its supervisor gone without a record, its agent not
// handed to sortie): what sortie could do about the agent decides, never the task.
#[test]
fn a_lost_attempt_is_an_orphan_once_its_agent_is_stopped_and_never_retried_while_it_may_run() {
    use sortie_core::OrphanAction;
    use sortie_core::decide::{Lost, LostAgent, lost_attempt};
    let why = "its supervisor is gone without recording its exit";
    // The orphan, or the status, stop reason and words of an ended attempt.
    type Want = Result<OrphanAction, (AttemptStatus, StopReason, &'static str)>;
    let rows: [(LostAgent, Want); 4] = [
        (
            LostAgent::Stopped(OrphanAction::Killed),
            Ok(OrphanAction::Killed),
        ),
        (
            LostAgent::Stopped(OrphanAction::Gone),
            Ok(OrphanAction::Gone),
        ),
        (
            LostAgent::Survived,
            Err((
                AttemptStatus::Partial,
                StopReason::Error,
                "survived SIGKILL: not retried while it may still run",
            )),
        ),
        (
            LostAgent::Unknown,
            Err((
                AttemptStatus::Failed,
                StopReason::Error,
                "lost track of the agent process",
            )),
        ),
    ];
    for (agent, want) in rows {
        let got = lost_attempt(agent, why);
        match (got, want) {
            (Lost::Orphaned(a), Ok(w)) => assert_eq!(a, w, "{agent:?}"),
            (Lost::Ended(o), Err((status, reason, says))) => {
                assert_eq!((o.status, o.stop_reason), (status, reason), "{agent:?}");
                let error = o.error.unwrap_or_default();
                assert!(
                    error.contains(says) && error.contains(why),
                    "{agent:?}: {error}"
                );
                // A partial attempt is never retried; a failed `error` is transient.
                assert_eq!(
                    is_transient(&AttemptOutcome {
                        error: Some(error),
                        ..o
                    }),
                    status == AttemptStatus::Failed,
                    "{agent:?}"
                );
            }
            (got, want) => panic!("{agent:?}: got {got:?}, want {want:?}"),
        }
    }
}

// #32: step 7, the state dir. An attempt whose output could not be written (the disk of the
// state dir full, so the agent's own writes failed and it exited nonzero) failed for the
// machine, not for the task: it is `interrupted`, which spends no retry.
#[test]
fn a_failure_while_the_output_could_not_be_written_is_an_interrupt() {
    const FULL: Option<&str> = Some("the disk of its output was full");
    let lost = |reader: Finished| Facts {
        output_lost: FULL,
        ..facts(reader)
    };
    let mut killed = AttemptOutcome::failed(StopReason::UnexpectedSignal, "killed by SIGPIPE");
    killed.signal = Some(13);
    let timed_out = WatchEnd {
        stop: stop(
            StopReason::Timeout,
            Some(Phase::Running),
            "attempt timed out after 10s",
        ),
        sent: Some(StopReason::Timeout),
        ..WatchEnd::default()
    };
    check(vec![
        (
            "a nonzero exit while the disk was full is an interrupt, its error says why",
            lost(reader(nonzero("exited with code 1"), "")),
            "Failed Interrupted | exited with code 1 while the disk of its output was full: \
             the state dir's fault, not the task's | exited with code 1 while the disk of its \
             output was full: the state dir's fault, not the task's",
        ),
        (
            "output the agent gave is kept",
            lost(reader(nonzero("exited with code 1"), "half an answer")),
            "Failed Interrupted | exited with code 1 while the disk of its output was full: \
             the state dir's fault, not the task's | half an answer",
        ),
        (
            "a signal it was killed by (a broken pipe of a writer) likewise",
            lost(reader(killed, "")),
            "Failed Interrupted | killed by SIGPIPE while the disk of its output was full: \
             the state dir's fault, not the task's | killed by SIGPIPE while the disk of its \
             output was full: the state dir's fault, not the task's",
        ),
        (
            "a transient error that read as a rate limit is no longer the provider's",
            lost(reader(
                AttemptOutcome::failed(StopReason::Error, "429 overloaded"),
                "",
            )),
            "Failed Interrupted | 429 overloaded while the disk of its output was full: the \
             state dir's fault, not the task's | 429 overloaded while the disk of its output \
             was full: the state dir's fault, not the task's",
        ),
        (
            "a completed attempt stays completed: its writes did not fail it",
            lost(reader(AttemptOutcome::completed(), "done")),
            "Completed Completed | - | done",
        ),
        (
            "a stop sortie sent stays that stop (the watchdog's step comes first)",
            Facts {
                watch: timed_out,
                ..lost(reader(nonzero("exited with code 1"), ""))
            },
            "Failed Timeout Running | attempt timed out after 10s | attempt timed out after 10s",
        ),
        (
            "without the observation a nonzero exit is the task's",
            facts(reader(nonzero("exited with code 1"), "")),
            "Failed NonzeroExit | exited with code 1 | ",
        ),
    ]);
}

#[test]
fn a_plain_commands_rate_limit_without_transient_on_gets_a_hint_and_no_retry() {
    let limited = "HTTP 429: retry after 30s";
    let plain = |f: Facts| Facts { plain: true, ..f };
    let with = |f: Facts| Facts {
        transient_on: vec!["429".into()],
        ..f
    };
    let mut agent = facts(reader(nonzero("exit code 3"), limited));
    agent.plain = false;
    check(vec![
        (
            "a plain command's 429 with retry after: the hint",
            plain(facts(reader(nonzero("exit code 3"), limited))),
            "Failed NonzeroExit | exit code 3 (its output reads as a rate limit: `transient_on = [\"429\"]` retries it) | HTTP 429: retry after 30s",
        ),
        (
            "in stderr too, any case",
            Facts {
                stderr: "429 Too Many Requests",
                ..plain(facts(reader(nonzero("exit code 3"), "")))
            },
            "Failed NonzeroExit | exit code 3 (its output reads as a rate limit: `transient_on = [\"429\"]` retries it) | ",
        ),
        (
            "429 alone is no rate limit",
            plain(facts(reader(nonzero("exit code 3"), "read 429 rows"))),
            "Failed NonzeroExit | exit code 3 | read 429 rows",
        ),
        (
            "transient_on given: it applies, no hint",
            with(plain(facts(reader(nonzero("exit code 3"), limited)))),
            "Failed Error | exit code 3 (transient: matched \"429\") | HTTP 429: retry after 30s | rate limited None",
        ),
        (
            "an agent: no hint",
            agent,
            "Failed NonzeroExit | exit code 3 | HTTP 429: retry after 30s",
        ),
    ]);
}
