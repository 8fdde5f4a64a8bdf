//! #33, a judge over samples: a task's `needs_mode` says when its needs let it run. With
//! `completed` (the default) a need that ends otherwise skips it; with `settled` it waits for
//! every need to end, however it ended, and its prompt gets a failed need's error as that
//! need's output.

use std::collections::{BTreeMap, BTreeSet};

use sortie_core::plan::{Action, Facts};
use sortie_core::{
    Attempt, AttemptOutcome, Event, NeedsMode, RunConfig, StopReason, TaskId, TaskSpec,
    TerminalState, Timestamp,
};

#[path = "support/run.rs"]
mod run;
use run::Run;

/// A run of `tasks`, eight at once.
fn start(tasks: Vec<TaskSpec>) -> Run {
    let config = RunConfig {
        concurrency: 8,
        ..RunConfig::default()
    };
    Run::start("needs-mode-test", "needs.toml", config, tasks)
}

impl Run {
    /// Task `t` runs one attempt ending with `outcome` (its output `output`), and finishes
    /// with the result core decides for it.
    fn run_to_end(&mut self, t: u32, outcome: AttemptOutcome, output: &str) -> TerminalState {
        let task = TaskId(t);
        let attempt = Attempt(1);
        if self.state.tasks[t as usize].state == sortie_core::TaskState::Pending {
            self.push(Event::TaskQueued { task });
        }
        self.push(Event::AttemptLaunching {
            task,
            attempt,
            model: None,
        })
        .start_and_end(t, attempt, outcome, output);
        let rec = &self.state.tasks[t as usize];
        let result = sortie_core::finish_result(
            rec,
            &rec.attempts[0].outcome().expect("ended"),
            rec.attempts[0].output().unwrap_or_default(),
        );
        let state = result.state;
        self.push(Event::TaskFinished { task, result });
        state
    }

    /// A round: its ready-task decisions (`queue X` or `STATE X: why`), applied as the
    /// runner appends them.
    fn round(&mut self) -> Vec<String> {
        let facts = Facts {
            now: Timestamp(self.now),
            stopping: None,
            live: 0,
            jobs: &BTreeMap::new(),
            setup_failed: &BTreeMap::new(),
            missing_worktrees: &BTreeSet::new(),
        };
        let mut said = Vec::new();
        for action in self.planner.plan(&self.state, &facts) {
            let line = match &action {
                Action::Append(Event::TaskQueued { task }) => {
                    format!("queue {}", self.state.label(*task))
                }
                Action::Append(Event::TaskFinished { task, result }) => format!(
                    "{} {}: {}",
                    result.state,
                    self.state.label(*task),
                    result.error.as_deref().unwrap_or("-")
                ),
                _ => continue,
            };
            said.push(line);
            if let Action::Append(e) = action {
                self.push(e);
            }
        }
        said
    }
}

fn task(label: &str, needs: &[&str], mode: NeedsMode) -> TaskSpec {
    let mut s = TaskSpec::new(label, "/work");
    s.command = Some(vec!["true".into()]);
    s.needs = needs.iter().map(|n| (*n).to_owned()).collect();
    s.needs_mode = mode;
    s
}

/// Samples s1 (completes) and s2 (fails) end first; s3 is still running. The default task is
/// skipped at once; the settled judge waits for s3, and runs once it has ended too, even though
/// s3 timed out.
#[test]
fn a_settled_task_runs_once_every_need_ended_and_a_completed_one_is_skipped() {
    let samples = ["s1", "s2", "s3"];
    let mut run = start(vec![
        task("s1", &[], NeedsMode::Completed),
        task("s2", &[], NeedsMode::Completed),
        task("s3", &[], NeedsMode::Completed),
        task("judge", &samples, NeedsMode::Settled),
        task("strict", &samples, NeedsMode::Completed),
    ]);
    run.round(); // the samples are queued
    assert_eq!(
        run.state.tasks[3].state,
        sortie_core::TaskState::Pending,
        "the judge waits"
    );
    let s1 = run.run_to_end(0, AttemptOutcome::completed(), "sample one says 42");
    let failed = AttemptOutcome::failed(StopReason::NonzeroExit, "sample two crashed");
    let s2 = run.run_to_end(1, failed, "");
    assert_eq!((s1, s2), (TerminalState::Completed, TerminalState::Failed));
    assert_eq!(
        run.round(),
        ["skipped strict: dependency \"s2\" did not complete (failed)"],
        "the judge waits for s3; the default mode skips at the first need that did not complete"
    );

    let timeout = AttemptOutcome::failed(StopReason::Timeout, "sample three ran out of time");
    let s3 = run.run_to_end(2, timeout, "");
    assert_eq!(s3, TerminalState::Timeout);
    assert_eq!(run.round(), ["queue judge"]);
}

/// A settled task whose needs all completed runs as any task does, and one with no needs at
/// all is ready at once.
#[test]
fn a_settled_task_whose_needs_completed_is_queued_like_any_other() {
    let mut run = start(vec![
        task("a", &[], NeedsMode::Settled),
        task("judge", &["a"], NeedsMode::Settled),
    ]);
    assert_eq!(run.round(), ["queue a"]);
    run.run_to_end(0, AttemptOutcome::completed(), "fine");
    assert_eq!(run.round(), ["queue judge"]);
}

/// The judge's prompt: each need's output where it completed, its error where it did not.
#[test]
fn a_settled_tasks_prompt_gets_each_failed_needs_error_as_its_output() {
    let mut judge = task("judge", &["s1", "s2"], NeedsMode::Settled);
    judge.command = None;
    judge.prompt = Some("one: {outputs.s1}\ntwo: {outputs.s2}".into());
    let mut context = task("context", &["s1", "s2"], NeedsMode::Settled);
    context.command = None;
    context.prompt = Some("judge these".into());
    let mut run = start(vec![
        task("s1", &[], NeedsMode::Completed),
        task("s2", &[], NeedsMode::Completed),
        judge,
        context,
    ]);
    run.run_to_end(0, AttemptOutcome::completed(), "sample one says 42");
    let failed = AttemptOutcome::failed(StopReason::NonzeroExit, "sample two crashed");
    run.run_to_end(1, failed, "");
    let prompt = sortie_core::prompt::render(&run.state, TaskId(2));
    assert!(
        prompt.starts_with("one: sample one says 42\ntwo: "),
        "{prompt}"
    );
    assert!(prompt.contains("sample two crashed"), "{prompt}");
    let prompt = sortie_core::prompt::render(&run.state, TaskId(3));
    assert!(
        prompt.contains("--- s1 ---\nsample one says 42"),
        "{prompt}"
    );
    assert!(
        prompt.contains("--- s2 ---\n") && prompt.contains("sample two crashed"),
        "{prompt}"
    );
}
