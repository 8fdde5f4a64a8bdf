//! #33: samples of an item, built from events: `pick = "first-pass"` ends or stops the samples
//! that lost, `best-score` keeps the highest score, and the counts `sortie results` shows
//! (n, c, pass@k, mean score, winner, rates per model and role).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use sortie_core::plan::{Action, Facts, Planner};
use sortie_core::samples::{self, Item};
use sortie_core::verify::{Pick, SCORE_UNIT, Verdict};
use sortie_core::{
    Attempt, AttemptOutcome, Event, RunConfig, StopReason, TaskId, TaskSpec, Timestamp,
};

#[path = "support/run.rs"]
mod run;
use run::Run;

/// `n` samples `{item}-{i}` of each item, with `pick`.
fn samples(items: &[&str], n: u32, pick: Option<Pick>, verify: bool) -> Vec<TaskSpec> {
    let mut out = Vec::new();
    for item in items {
        for i in 1..=n {
            let mut s = TaskSpec::new(format!("{item}-{i}"), "/work");
            s.prompt = Some("p".into());
            let body = Arc::make_mut(&mut s.body);
            body.pick = pick;
            body.sample_of = Some(format!("{item}-*"));
            if verify {
                body.verify = Some(vec!["true".into()]);
            }
            out.push(s);
        }
    }
    out
}

impl Run {
    fn new(concurrency: u32, tasks: Vec<TaskSpec>) -> Run {
        let config = RunConfig {
            concurrency,
            ..RunConfig::default()
        };
        Run::start("samples-test", "samples.toml", config, tasks)
    }

    fn label(&self, t: &TaskId) -> String {
        self.state.label(*t).to_string()
    }

    /// One round: its actions as lines, its events applied.
    fn round(&mut self, live: usize) -> Vec<String> {
        let facts = Facts {
            now: Timestamp(self.now),
            stopping: None,
            live,
            jobs: &BTreeMap::new(),
            setup_failed: &BTreeMap::new(),
            missing_worktrees: &BTreeSet::new(),
        };
        let actions = self.planner.plan(&self.state, &facts);
        let mut lines = Vec::new();
        for a in actions {
            match a {
                Action::Append(Event::TaskFinished { task, result }) => {
                    lines.push(format!(
                        "finish {} {}: {}",
                        self.label(&task),
                        result.state,
                        result.error.as_deref().unwrap_or("-")
                    ));
                    self.push(Event::TaskFinished { task, result });
                }
                Action::Append(Event::AttemptLaunching { task, .. }) => {
                    lines.push(format!("launch {}", self.label(&task)));
                    let attempt = Attempt(self.state.tasks[task.index()].attempts.len() as u32 + 1);
                    self.push(Event::AttemptLaunching {
                        task,
                        attempt,
                        model: Some("m-1".into()),
                    });
                }
                Action::Append(e) => {
                    lines.push(format!("append {}", e.name()));
                    self.push(e);
                }
                Action::StopTask(task, why) => {
                    lines.push(format!("stop {}: {why}", self.label(&task)))
                }
                Action::Verify(task) => lines.push(format!("verify {}", self.label(&task))),
                Action::Launch(_) => {}
                other => lines.push(format!("{other:?}")),
            }
        }
        lines
    }

    /// Task `t`'s live attempt starts and ends with `outcome`.
    fn end(&mut self, t: u32, outcome: AttemptOutcome) -> &mut Run {
        let attempt = Attempt(self.state.tasks[t as usize].attempts.len() as u32);
        self.start_and_end(t, attempt, outcome, &format!("answer of {t}"))
    }

    /// Task `t`'s ended attempt checked with `score` (passed when `passed`).
    fn check(&mut self, t: u32, passed: bool, score: u32) -> &mut Run {
        let task = TaskId(t);
        let attempt = Attempt(self.state.tasks[t as usize].attempts.len() as u32);
        self.push(Event::VerifyStarted { task, attempt })
            .push(Event::VerifyEnded {
                task,
                attempt,
                verdict: Verdict {
                    passed,
                    score,
                    exit: Some(if passed { 0 } else { 1 }),
                    digest: 0,
                    error: (!passed).then(|| "the check exited 1".to_owned()),
                },
            })
    }

    fn items(&self) -> Vec<Item> {
        samples::items(&self.state)
    }
}

fn failed(reason: StopReason) -> AttemptOutcome {
    AttemptOutcome::failed(reason, format!("{reason} happened"))
}

#[test]
fn first_pass_cancels_the_waiting_samples_and_stops_the_running_ones_once_one_passes() {
    let mut tasks = samples(&["a"], 4, Some(Pick::FirstPass), false);
    tasks[0].body = Arc::new({
        let mut b = (*tasks[0].body).clone();
        b.max_retries = 2;
        b
    });
    let mut run = Run::new(2, tasks);
    assert_eq!(
        run.round(0),
        [
            "append TaskQueued",
            "append TaskQueued",
            "append TaskQueued",
            "append TaskQueued"
        ]
    );
    assert_eq!(run.round(0), ["launch a-1", "launch a-2"]);
    // a-2 passes first; a-1 still runs, a-3 and a-4 wait.
    run.end(1, AttemptOutcome::completed());
    assert_eq!(run.round(1), ["finish a-2 completed: -"]);
    let why = "cancelled: sample a-2 of a-* passed first";
    assert_eq!(
        run.round(1),
        [
            format!("stop a-1: {why}"),
            format!("finish a-3 cancelled: {why}"),
            format!("finish a-4 cancelled: {why}"),
        ]
    );
    // Asked once: the next round does not ask again.
    assert!(run.round(1).is_empty());
    // a-1's attempt ends failed (it would be retried): it is not.
    run.end(0, failed(StopReason::Error));
    let lines = run.round(0);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("finish a-1 cancelled: {why} (last attempt:")),
        "{lines:?}"
    );
    let items = run.items();
    assert_eq!(items.len(), 1);
    let a = &items[0];
    assert_eq!((a.name.as_str(), a.n, a.c, a.finished), ("a-*", 1, 1, 4));
    assert_eq!(a.winner, Some(TaskId(1)));
    assert_eq!(a.pass_at, [1.0]);
    assert!(samples::lost(&run.state, &items, TaskId(0)));
    assert!(!samples::lost(&run.state, &items, TaskId(1)));
    // A resumed planner sees the item won and decides nothing more.
    run.planner = Planner::new(&run.state);
    assert_eq!(run.round(0), ["EndRun(Finished)"]);
}

#[test]
fn first_pass_with_checks_waits_for_a_passed_verdict_and_a_checked_loser_is_not_given_a_round() {
    let mut tasks = samples(&["a"], 3, Some(Pick::FirstPass), true);
    for t in &mut tasks {
        Arc::make_mut(&mut t.body).verify_rounds = 2;
    }
    let mut run = Run::new(3, tasks);
    run.round(0);
    assert_eq!(run.round(0), ["launch a-1", "launch a-2", "launch a-3"]);
    // a-1 completes but fails its check: a feedback round, no winner yet.
    run.end(0, AttemptOutcome::completed());
    assert_eq!(run.round(2), ["append VerifyStarted", "verify a-1"]);
    run.push(Event::VerifyEnded {
        task: TaskId(0),
        attempt: Attempt(1),
        verdict: Verdict {
            passed: false,
            score: 0,
            exit: Some(1),
            digest: 0,
            error: Some("the check exited 1".into()),
        },
    });
    run.end(1, AttemptOutcome::completed())
        .check(1, true, SCORE_UNIT);
    // a-2 passed: it finishes, a-1's feedback round is not scheduled, a-3 is stopped.
    let lines = run.round(1);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines.contains(&"finish a-2 completed: -".to_owned()),
        "{lines:?}"
    );
    let next = run.round(1);
    let why = "cancelled: sample a-2 of a-* passed first";
    assert!(next.contains(&format!("stop a-3: {why}")), "{next:?}");
}

#[test]
fn best_score_keeps_the_highest_passed_score_the_earliest_on_a_tie() {
    let mut run = Run::new(4, samples(&["a", "b"], 3, Some(Pick::BestScore), true));
    run.round(0);
    run.round(0);
    run.round(0);
    let scores = [
        (true, 500_000),
        (true, 900_000),
        (false, 950_000),
        (true, 700_000),
        (true, 700_000),
        (false, 0),
    ];
    for (t, (passed, score)) in scores.iter().enumerate() {
        if run.state.tasks[t].attempts.is_empty() {
            run.round(0);
        }
        run.end(t as u32, AttemptOutcome::completed())
            .check(t as u32, *passed, *score);
        run.round(0);
    }
    let items = run.items();
    assert_eq!(items.len(), 2);
    // A failed check never wins, whatever its score.
    assert_eq!(items[0].winner, Some(TaskId(1)));
    assert_eq!(items[1].winner, Some(TaskId(3)));
    assert_eq!((items[0].n, items[0].c), (3, 2));
    let mean = items[0].mean_score.unwrap_or_default();
    assert!((mean - (0.5 + 0.9 + 0.95) / 3.0).abs() < 1e-9, "{mean}");
    assert!((items[0].pass_at[0] - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(items[0].pass_at[1], 1.0);
}

#[test]
fn items_count_without_pick_and_rates_per_model_and_role() {
    let mut tasks = samples(&["a"], 4, None, false);
    for (i, t) in tasks.iter_mut().enumerate() {
        Arc::make_mut(&mut t.body).role = Some(if i < 2 { "fixer" } else { "tester" }.into());
    }
    let mut run = Run::new(4, tasks);
    run.round(0);
    run.round(0);
    run.end(0, AttemptOutcome::completed())
        .end(1, failed(StopReason::NonzeroExit))
        .end(2, AttemptOutcome::completed())
        .end(3, AttemptOutcome::completed());
    run.round(0);
    let items = run.items();
    let a = &items[0];
    assert_eq!((a.n, a.c, a.winner), (4, 3, None));
    assert_eq!(a.mean_score, Some(0.75));
    assert!((a.pass_at[0] - 0.75).abs() < 1e-12);
    assert!((a.pass_at[1] - 1.0).abs() < 1e-12, "{:?}", a.pass_at);
    let rates = samples::rates(&run.state);
    assert_eq!(rates.by_model.len(), 1);
    assert_eq!(
        (
            rates.by_model[0].name.as_str(),
            rates.by_model[0].c,
            rates.by_model[0].n
        ),
        ("m-1", 3, 4)
    );
    let roles: Vec<(&str, u32, u32)> = rates
        .by_role
        .iter()
        .map(|r| (r.name.as_str(), r.c, r.n))
        .collect();
    assert_eq!(roles, [("fixer", 1, 2), ("tester", 2, 2)]);
    let r = &rates.by_model[0];
    assert!(r.low < 0.75 && 0.75 < r.high);
    assert_eq!(
        samples::summary_lines(&run.state),
        ["a-*: 3 of 4 passed, pass@1 0.75"]
    );
}
