//! #33: what the planner decides for a task with a check: the check after a completed attempt
//! (journaled before it runs), a feedback round at once on the same model for a failed one,
//! the end with stop reason `verify` once the rounds are spent, and a cancel that ends an
//! unchecked task without its artifact (a resume may decide again).

use std::collections::{BTreeMap, BTreeSet};

use sortie_core::plan::{Action, Facts, Stopping};
use sortie_core::verify::{SCORE_UNIT, Verdict};
use sortie_core::{
    Attempt, AttemptOutcome, Event, RunConfig, StopReason, TaskId, TaskSpec, TerminalState,
    Timestamp,
};

#[path = "support/run.rs"]
mod run;
use run::Run;

/// One task with a check, `rounds` feedback rounds and an artifact.
fn checked(rounds: u32) -> Run {
    let mut t = TaskSpec::new("fix", "/work");
    t.prompt = Some("fix it".into());
    t.model = Some("m-a".into());
    t.output = Some("/work/out/fix.md".into());
    t.verify = Some(vec!["sh".into(), "-c".into(), "make test".into()]);
    t.verify_rounds = rounds;
    let mut run = Run::start("verify-test", "verify.toml", RunConfig::default(), vec![t]);
    run.push(Event::TaskQueued { task: TaskId(0) });
    run
}

impl Run {
    fn plan(&mut self, stopping: Option<Stopping>) -> Vec<Action> {
        let facts = Facts {
            now: Timestamp(self.now),
            stopping,
            live: 0,
            jobs: &BTreeMap::new(),
            setup_failed: &BTreeMap::new(),
            missing_worktrees: &BTreeSet::new(),
        };
        self.planner.plan(&self.state, &facts)
    }

    /// Attempt `n` launches on `m-a` and completes.
    fn completes(&mut self, n: u32) -> &mut Run {
        let attempt = Attempt(n);
        self.push(Event::AttemptLaunching {
            task: TaskId(0),
            attempt,
            model: Some("m-a".into()),
        })
        .start_and_end(0, attempt, AttemptOutcome::completed(), "done")
    }

    /// The check of attempt `n` runs and ends `passed` or not.
    fn checked(&mut self, n: u32, passed: bool) -> &mut Run {
        let (task, attempt) = (TaskId(0), Attempt(n));
        self.push(Event::VerifyStarted { task, attempt })
            .push(Event::VerifyEnded {
                task,
                attempt,
                verdict: Verdict {
                    passed,
                    score: if passed { SCORE_UNIT } else { 0 },
                    exit: Some(if passed { 0 } else { 1 }),
                    digest: 7,
                    error: (!passed).then(|| "the check exited 1: FAILED test_add".to_owned()),
                },
            })
    }
}

#[test]
fn a_completed_attempt_is_checked_and_a_failed_check_gets_a_round_at_once_on_its_model() {
    let mut run = checked(1);
    run.completes(1);
    let actions = run.plan(None);
    assert_eq!(
        actions,
        vec![
            Action::Append(Event::VerifyStarted {
                task: TaskId(0),
                attempt: Attempt(1)
            }),
            Action::Verify(TaskId(0)),
        ]
    );
    run.push(Event::VerifyStarted {
        task: TaskId(0),
        attempt: Attempt(1),
    });
    assert!(run.plan(None).is_empty(), "nothing while the check runs");
    run.push(Event::VerifyEnded {
        task: TaskId(0),
        attempt: Attempt(1),
        verdict: Verdict {
            passed: false,
            score: 0,
            exit: Some(1),
            digest: 7,
            error: Some("the check exited 1: FAILED test_add".into()),
        },
    });
    match run.plan(None).as_slice() {
        [
            Action::Append(Event::RetryScheduled {
                next_attempt,
                model,
                delay,
                reason,
                ..
            }),
        ] => {
            assert_eq!(*next_attempt, Attempt(2));
            assert_eq!(model.as_deref(), Some("m-a"), "the conversation's model");
            assert!(delay.is_zero());
            assert!(reason.contains("feedback round 1 of 1"), "{reason}");
        }
        other => panic!("expected a feedback round, got {other:?}"),
    }
}

#[test]
fn once_the_rounds_are_spent_a_failed_check_fails_the_task_with_reason_verify() {
    let mut run = checked(1);
    run.completes(1).checked(1, false);
    run.push(Event::RetryScheduled {
        task: TaskId(0),
        next_attempt: Attempt(2),
        model: Some("m-a".into()),
        delay: std::time::Duration::ZERO,
        reason: "feedback".into(),
    });
    run.completes(2).checked(2, false);
    match run.plan(None).as_slice() {
        [
            Action::EndTask {
                result, artifact, ..
            },
        ] => {
            assert_eq!(result.state, TerminalState::Failed);
            assert_eq!(result.stop_reason, StopReason::Verify);
            let error = result.error.as_deref().unwrap_or_default();
            assert!(
                error.contains("FAILED test_add") && error.contains("after 1 feedback round"),
                "{error}"
            );
            assert!(*artifact, "the answer is still written");
        }
        other => panic!("expected the task's end, got {other:?}"),
    }
}

#[test]
fn a_cancel_ends_an_unchecked_task_cancelled_without_writing_its_artifact() {
    let mut run = checked(0);
    run.completes(1);
    match run.plan(Some(Stopping::Cancel)).as_slice() {
        [Action::Append(Event::TaskFinished { result, .. })] => {
            assert_eq!(result.state, TerminalState::Cancelled);
            assert!(
                result
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains("before its check passed"))
            );
        }
        other => panic!("expected the task ended at once, got {other:?}"),
    }
}

#[test]
fn a_passed_check_completes_the_task() {
    let mut run = checked(0);
    run.completes(1).checked(1, true);
    match run.plan(None).as_slice() {
        [Action::EndTask { result, .. }] => assert_eq!(result.state, TerminalState::Completed),
        other => panic!("expected the task's end, got {other:?}"),
    }
}
