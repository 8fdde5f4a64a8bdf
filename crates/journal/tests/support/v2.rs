//! The run of the committed format-v2 fixture (`tests/fixtures/v2`): every event variant of
//! format v2, with every field added since v1 set to a value other than its default, so that
//! the fixture pins v2's variant indexes and the layout of each extension.
//!
//! Every value is written out here: the fixture must keep replaying to exactly this run when the
//! product's defaults change. A field appended to an extension later is set here to its default
//! (what the fixture's records read it as).

use std::time::Duration;

use sortie_core::{
    Attempt, AttemptOutcome, AttemptStatus, BudgetLimit, ControlAction, Denial, Event, Executor,
    Isolation, OrphanAction, Permissions, RunBudget, RunId, RunOutcome, Seq, SlurmOptions,
    StopReason, TaskId, TaskResult, TerminalState, Timestamp,
};

use super::{batch, reported, usage};

fn at(i: u64) -> Timestamp {
    Timestamp(1_764_600_000_000 + 250 * i)
}

/// The v2 fixture's batch: four tasks, each using some of the fields added since v1.
pub(crate) fn batch_v2() -> sortie_core::Batch {
    let mut b = batch(4);
    b.source = "/work/project/batch-v2.toml".into();
    let t0 = &mut b.tasks[0];
    t0.isolation = Isolation::Worktree;
    t0.output = Some("/work/project/out/t0.md".into());
    t0.max_orphans = 5;
    t0.tools = vec!["Read".into(), "Bash".into()];
    t0.allow_denials = true;
    t0.system_prompt = Some("Answer in English; be brief.".into());
    t0.thinking = Some("high".into());
    let t1 = &mut b.tasks[1];
    t1.executor = Executor::Slurm(SlurmOptions {
        partition: Some("debug".into()),
        account: Some("lab".into()),
        cpus: Some(2),
        mem_mb: Some(4096),
        extra_args: vec!["--qos=low".into()],
    });
    t1.permissions = Permissions::ReadOnly;
    let t2 = &mut b.tasks[2];
    t2.agent = "command".into();
    t2.prompt = None;
    t2.command = Some(vec!["make".into(), "test".into()]);
    t2.model = None;
    t2.fallback_models = vec![];
    t2.supervise = false;
    t2.permissions = Permissions::Full;
    t2.transient_on = vec!["429".into(), "rate limit".into()];
    if let Some(claude) = b.agents.get_mut("claude") {
        claude.supervise = false;
    }
    b.config.budget = RunBudget {
        max_cost_nanos: Some(5_000_000_000),
        max_tokens: Some(2_000_000),
        deadline: Some(Duration::from_secs(2 * 3600)),
        warn_percent: 75,
    };
    b
}

fn result(state: TerminalState, stop: StopReason, error: Option<&str>, text: &str) -> TaskResult {
    TaskResult {
        state,
        stop_reason: stop,
        phase: None,
        error: error.map(Into::into),
        text: text.into(),
        result: None,
    }
}

fn placed(task: TaskId, attempt: u32, executor: &str) -> Event {
    Event::AttemptPlaced {
        task,
        attempt: Attempt(attempt),
        executor: executor.into(),
        dir: format!(
            "/work/project/.sortie/runs/fixture-v2/attempts/{}.{attempt}",
            task.0
        ),
    }
}

/// The v2 fixture's run: a rerun with a carried task, live control, a Slurm attempt, two
/// resumes (one attempt recorded, one adopted, one orphaned), a continued session, and a run
/// budget that warns and then runs out.
pub(crate) fn every_variant_v2() -> Vec<(Timestamp, Event)> {
    let (t0, t1, t2, t3) = (TaskId(0), TaskId(1), TaskId(2), TaskId(3));
    let m1 = Some("anthropic/claude-sonnet".to_owned());
    let m2 = Some("openai/gpt".to_owned());
    let by = "uid 1000 pid 77".to_owned();
    let mut denied = AttemptOutcome::failed(StopReason::Error, "529 overloaded");
    denied.exit_code = Some(1);
    denied.side_effects = true;
    denied.denials = vec![
        Denial {
            tool: "Bash".into(),
            count: 2,
        },
        Denial {
            tool: "Write".into(),
            count: 1,
        },
    ];
    let events = vec![
        Event::RunStarted {
            run_id: RunId::new("fixture-v2").unwrap(),
            batch: batch_v2(),
            batch_digest: 0x0123_4567_DEAD_BEEF,
            host: "builder".into(),
            pid: 4242,
        },
        Event::RunRerunOf {
            parent: RunId::new("fixture-v1").unwrap(),
        },
        Event::TaskCarried {
            task: t3,
            result: result(
                TerminalState::Completed,
                StopReason::Completed,
                None,
                "carried ✓",
            ),
            usage: usage(5),
        },
        Event::TaskQueued { task: t0 },
        Event::TaskQueued { task: t1 },
        Event::TaskQueued { task: t2 },
        Event::Control {
            by: by.clone(),
            action: ControlAction::Hold { task: Some(t1) },
        },
        Event::WorktreePlanned {
            task: t0,
            repo: "/work/project".into(),
            path: "/work/project/.sortie/worktrees/fixture-v2/t0".into(),
            branch: "sortie/fixture-v2/t0".into(),
            base: "89abcdef0123456789abcdef0123456789abcdef".into(),
        },
        Event::TaskSetUp {
            task: t0,
            worktree: Some("/work/project/.sortie/worktrees/fixture-v2/t0".into()),
        },
        Event::AttemptLaunching {
            task: t0,
            attempt: Attempt(1),
            model: m1.clone(),
        },
        placed(t0, 1, "local"),
        Event::AttemptHandle {
            task: t0,
            attempt: Attempt(1),
            handle: "5000".into(),
        },
        Event::AttemptStarted {
            task: t0,
            attempt: Attempt(1),
            pid: 5000,
            start_time: 123_456,
        },
        Event::AttemptSideEffects {
            task: t0,
            attempt: Attempt(1),
        },
        Event::AttemptProgress {
            task: t0,
            attempt: Attempt(1),
            usage: reported(1),
        },
        Event::Control {
            by: by.clone(),
            action: ControlAction::Steer {
                task: t0,
                message: "wrap up: the budget is nearly spent".into(),
            },
        },
        Event::AttemptFinished {
            task: t0,
            attempt: Attempt(1),
            outcome: denied,
            usage: reported(2),
            output: "overloaded".into(),
        },
        Event::RetryScheduled {
            task: t0,
            next_attempt: Attempt(2),
            model: m2.clone(),
            delay: Duration::from_millis(2_500),
            reason: "error: 529 overloaded".into(),
        },
        Event::AttemptLaunching {
            task: t0,
            attempt: Attempt(2),
            model: m2,
        },
        placed(t0, 2, "local"),
        Event::AttemptStarted {
            task: t0,
            attempt: Attempt(2),
            pid: 5100,
            start_time: 133_456,
        },
        Event::AttemptLaunching {
            task: t2,
            attempt: Attempt(1),
            model: None,
        },
        Event::AttemptStarted {
            task: t2,
            attempt: Attempt(1),
            pid: 5200,
            start_time: 143_456,
        },
        // sortie dies here; the resume finds t0's attempt ended and t2's (a child of sortie,
        // unsupervised) gone.
        Event::RunResumed {
            pid: 4343,
            from_seq: Seq(23),
        },
        Event::AttemptRecorded {
            task: t0,
            attempt: Attempt(2),
        },
        Event::AttemptFinished {
            task: t0,
            attempt: Attempt(2),
            outcome: AttemptOutcome::completed(),
            usage: reported(3),
            output: "done while sortie was down".into(),
        },
        Event::AttemptOrphaned {
            task: t2,
            attempt: Attempt(1),
            action: OrphanAction::Gone,
        },
        Event::RetryScheduled {
            task: t2,
            next_attempt: Attempt(2),
            model: None,
            delay: Duration::ZERO,
            reason: "orphaned".into(),
        },
        Event::ArtifactWritten {
            task: t0,
            path: "/work/project/out/t0.md".into(),
            bytes: 26,
            digest: 0xFEDC_BA98_7654_3210,
        },
        Event::WorktreeFinalized {
            task: t0,
            changed: true,
            diff: Some("1 file changed, 3 insertions(+)".into()),
        },
        Event::TaskFinished {
            task: t0,
            result: result(
                TerminalState::Completed,
                StopReason::Completed,
                None,
                "done while sortie was down",
            ),
        },
        Event::Control {
            by: by.clone(),
            action: ControlAction::Release { task: Some(t1) },
        },
        Event::Control {
            by: by.clone(),
            action: ControlAction::Concurrency { n: 2 },
        },
        Event::AttemptLaunching {
            task: t1,
            attempt: Attempt(1),
            model: m1.clone(),
        },
        placed(t1, 1, "slurm"),
        Event::AttemptHandle {
            task: t1,
            attempt: Attempt(1),
            handle: "31337".into(),
        },
        Event::AttemptStarted {
            task: t1,
            attempt: Attempt(1),
            pid: 0,
            start_time: 0,
        },
        Event::AttemptStalled {
            task: t1,
            attempt: Attempt(1),
        },
        Event::RunInterrupted {
            reason: "SIGTERM".into(),
        },
        Event::RunResumed {
            pid: 4444,
            from_seq: Seq(40),
        },
        Event::AttemptAdopted {
            task: t1,
            attempt: Attempt(1),
            offset: 4096,
        },
        Event::AttemptFinished {
            task: t1,
            attempt: Attempt(1),
            outcome: AttemptOutcome {
                status: AttemptStatus::Failed,
                stop_reason: StopReason::Stalled,
                phase: None,
                exit_code: None,
                signal: Some(15),
                error: Some("no output for 5m".into()),
                side_effects: false,
                denials: vec![],
                rate_limited: false,
                retry_after_ms: None,
                result: None,
            },
            usage: reported(4),
            output: String::new(),
        },
        Event::RetryScheduled {
            task: t1,
            next_attempt: Attempt(2),
            model: m1.clone(),
            delay: Duration::from_secs(1),
            reason: "stalled".into(),
        },
        Event::AttemptLaunching {
            task: t1,
            attempt: Attempt(2),
            model: m1,
        },
        Event::AttemptContinues {
            task: t1,
            attempt: Attempt(2),
            session: "/work/project/.sortie/runs/fixture-v2/sessions/1.1/s.jsonl".into(),
        },
        placed(t1, 2, "slurm"),
        Event::AttemptHandle {
            task: t1,
            attempt: Attempt(2),
            handle: "31338".into(),
        },
        Event::AttemptStarted {
            task: t1,
            attempt: Attempt(2),
            pid: 0,
            start_time: 0,
        },
        Event::RunBudgetWarned {
            limit: BudgetLimit::Cost,
            used: 3_900_000_000,
            of: 5_000_000_000,
        },
        Event::RunBudgetExceeded {
            limit: BudgetLimit::Cost,
            reason: "run cost $5.10 passed max_cost $5.00".into(),
        },
        Event::AttemptFinished {
            task: t1,
            attempt: Attempt(2),
            outcome: AttemptOutcome::failed(StopReason::Budget, "run budget exceeded"),
            usage: reported(5),
            output: "partial answer".into(),
        },
        Event::TaskFinished {
            task: t1,
            result: result(
                TerminalState::Cancelled,
                StopReason::Budget,
                Some("run budget exceeded"),
                "partial answer",
            ),
        },
        Event::Control {
            by,
            action: ControlAction::Cancel { task: Some(t2) },
        },
        Event::TaskFinished {
            task: t2,
            result: result(
                TerminalState::Cancelled,
                StopReason::Cancelled,
                Some("cancelled by uid 1000 pid 77"),
                "",
            ),
        },
        Event::RunFinished {
            state: RunOutcome::Partial,
            summary: "[t0] completed\n[t1] cancelled\n[t2] cancelled\n[t3] completed (carried)"
                .into(),
        },
    ];
    (0u64..).zip(events).map(|(i, e)| (at(i), e)).collect()
}
