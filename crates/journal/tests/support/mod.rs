//! Event generators shared by the journal's tests and its benchmark: a small run that uses every
//! event variant, and a realistic many-task run of any length. Both are legal (they replay).

#![allow(dead_code, reason = "each test binary uses a different part")]
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a test failure"
)]

pub(crate) mod v2;

use std::collections::BTreeMap;
use std::time::Duration;

use sortie_core::spec::{
    AgentProfile, Batch, MaxOutput, OutputMode, Protocol, RunConfig, SpecBody,
};
use sortie_core::{
    Attempt, AttemptOutcome, AttemptStatus, Cost, Event, Isolation, OrphanAction, Phase, RunId,
    RunOutcome, Seq, StopReason, TaskId, TaskResult, TaskSpec, TerminalState, Timestamp, Usage,
};

/// Copies a committed fixture (a directory tree) to `to`: tests open the copy, since opening a
/// sled database writes to it.
pub(crate) fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A batch of `n` tasks named `t0`, `t1`, ...
///
/// Every value is written out here rather than taken from `TaskSpec::new` or
/// `AgentProfile::builtins()`: the committed v1 fixture holds this batch, and it must keep
/// replaying to it when the product's defaults or built-in profiles change.
pub(crate) fn batch(n: u32) -> Batch {
    let tasks = (0..n)
        .map(|i| TaskSpec {
            label: format!("t{i}"),
            prompt: Some(format!("do step {i} of the plan")),
            body: std::sync::Arc::new(SpecBody {
                command: None,
                agent: "pi".into(),
                model: Some("anthropic/claude-sonnet".into()),
                fallback_models: vec!["openai/gpt".into()],
                max_retries: 2,
                attempt_timeout: Duration::from_secs(15 * 60),
                deadline: None,
                stall_after: Duration::from_secs(5 * 60),
                stall_kill_after: Duration::from_secs(60),
                kill_grace: Duration::from_secs(3),
                max_turns: None,
                max_tokens: None,
                max_cost_nanos: None,
                grace_turns: 2,
                cwd: "/work/project".into(),
                isolation: Isolation::None,
                include_wip: false,
                output: None,
                output_mode: OutputMode::Inline,
                max_output: MaxOutput {
                    bytes: 200 * 1024,
                    lines: 5000,
                },
                reads: vec![],
                needs: vec![],
                env_keys: vec![],
                retry_after_side_effects: false,
                retry_timeouts: false,
                // #10: what a v1 record reads as.
                max_orphans: 3,
                supervise: true,
                executor: sortie_core::Executor::Local,
                permissions: sortie_core::Permissions::Edit,
                tools: vec![],
                allow_denials: false,
                system_prompt: None,
                thinking: None,
                transient_on: vec![],
                pool: None,
                max_rate_limits: 0,
                on_task_end: None,

                role: None,
                session: None,
                output_schema: None,
                // #33: what a record before verified results reads as.
                verify: None,
                verify_timeout: Duration::from_secs(600),
                verify_rounds: 0,
                pick: None,
                sample_of: None,
                // #33: a judge over samples.
                needs_mode: sortie_core::NeedsMode::Completed,
                // #34: the kernel sandbox.
                sandbox: sortie_core::sandbox::Sandbox::Off,
                sandbox_write: vec![],
                sandbox_read: vec![],
                sandbox_hosts: vec![],
            }),
        })
        .collect();
    Batch {
        tasks,
        agents: frozen_profiles(),
        config: RunConfig {
            concurrency: 4,
            fail_fast: false,
            ..RunConfig::default()
        },
        source: "/work/project/batch.toml".into(),
    }
}

/// The built-in profiles as they were when the v1 fixture was written.
fn frozen_profiles() -> BTreeMap<String, AgentProfile> {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let profile =
        |name: &str, command: Vec<String>, model_args: Vec<String>, protocol, may_write| {
            AgentProfile {
                name: name.into(),
                command,
                model_args,
                protocol,
                env_keys: vec![],
                can_steer: false,
                can_continue: false,
                may_write,
                supervise: true,
            }
        };
    let model = s(&["--model", "{model}"]);
    [
        profile(
            "pi",
            s(&[
                "pi",
                "--mode",
                "json",
                "--no-session",
                "{model_args}",
                "{prompt}",
            ]),
            model.clone(),
            Protocol::PiJson,
            true,
        ),
        profile(
            "claude",
            s(&[
                "claude",
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "{model_args}",
                "{prompt}",
            ]),
            model.clone(),
            Protocol::ClaudeStreamJson,
            true,
        ),
        profile(
            "codex",
            s(&["codex", "exec", "--json", "{model_args}", "{prompt}"]),
            model,
            Protocol::CodexJson,
            true,
        ),
        profile("command", vec![], vec![], Protocol::Plain, false),
    ]
    .into_iter()
    .map(|p| (p.name.clone(), p))
    .collect()
}

/// A usage that grows with `k`.
pub(crate) fn usage(k: u64) -> Usage {
    Usage {
        input: 1000 * k,
        output: 100 * k,
        cache_read: 10 * k,
        cache_write: k,
        reasoning: 3 * k,
        cost: if k % 5 == 4 {
            Cost::unreported()
        } else {
            Cost::reported_nanos(12_345 * k)
        },
        turns: u32::try_from(k).unwrap_or(u32::MAX),
        context_tokens: 500 * k,
    }
}

/// Like [`usage`], with the cost always reported (so that checkpoints never go backwards).
pub(crate) fn reported(k: u64) -> Usage {
    Usage {
        cost: Cost::reported_nanos(12_345 * k),
        ..usage(k)
    }
}

fn at(i: u64) -> Timestamp {
    Timestamp(1_764_500_000_000 + 250 * i)
}

/// A small run that uses every event variant once at least, stamped 250 ms apart.
pub(crate) fn every_variant() -> Vec<(Timestamp, Event)> {
    let mut b = batch(3);
    b.tasks[0].isolation = Isolation::Worktree;
    b.tasks[0].output = Some("/work/project/out/t0.md".into());
    b.tasks[0].deadline = Some(Duration::from_millis(90_500));
    b.tasks[2].needs = vec!["t1".into()];
    let t0 = TaskId(0);
    let t1 = TaskId(1);
    let t2 = TaskId(2);
    let m1 = Some("anthropic/claude-sonnet".to_owned());
    let m2 = Some("openai/gpt".to_owned());
    let mut failed = AttemptOutcome::failed(StopReason::Error, "429 Too Many Requests");
    failed.exit_code = Some(1);
    failed.side_effects = true;
    let events = vec![
        Event::RunStarted {
            run_id: RunId::new("fixture-v1").unwrap(),
            batch: b,
            batch_digest: 0xDEAD_BEEF_0123_4567,
            host: "builder".into(),
            pid: 4242,
        },
        Event::TaskQueued { task: t0 },
        Event::TaskQueued { task: t1 },
        Event::TaskSetUp {
            task: t0,
            worktree: Some("/work/project/.sortie/worktrees/fixture-v1/t0".into()),
        },
        Event::AttemptLaunching {
            task: t0,
            attempt: Attempt(1),
            model: m1.clone(),
        },
        Event::AttemptStarted {
            task: t0,
            attempt: Attempt(1),
            pid: 5000,
            start_time: 123_456,
        },
        Event::AttemptStalled {
            task: t0,
            attempt: Attempt(1),
        },
        Event::AttemptProgress {
            task: t0,
            attempt: Attempt(1),
            usage: usage(1),
        },
        Event::AttemptFinished {
            task: t0,
            attempt: Attempt(1),
            outcome: failed,
            usage: usage(2),
            output: "rate limited".into(),
        },
        Event::RetryScheduled {
            task: t0,
            next_attempt: Attempt(2),
            model: m2.clone(),
            delay: Duration::new(1, 500_000_000),
            reason: "error: 429 Too Many Requests".into(),
        },
        Event::AttemptLaunching {
            task: t0,
            attempt: Attempt(2),
            model: m2.clone(),
        },
        Event::AttemptProgress {
            task: t0,
            attempt: Attempt(2),
            usage: usage(3),
        },
        Event::RunInterrupted {
            reason: "SIGTERM".into(),
        },
        Event::RunResumed {
            pid: 4343,
            from_seq: Seq(12),
        },
        Event::AttemptOrphaned {
            task: t0,
            attempt: Attempt(2),
            action: OrphanAction::Killed,
        },
        Event::RetryScheduled {
            task: t0,
            next_attempt: Attempt(3),
            model: m1.clone(),
            delay: Duration::ZERO,
            reason: "interrupted".into(),
        },
        Event::AttemptLaunching {
            task: t0,
            attempt: Attempt(3),
            model: m1,
        },
        Event::AttemptStarted {
            task: t0,
            attempt: Attempt(3),
            pid: 5100,
            start_time: 223_456,
        },
        Event::AttemptFinished {
            task: t0,
            attempt: Attempt(3),
            outcome: AttemptOutcome::completed(),
            usage: usage(4),
            output: "done: ünïcödé ✓".into(),
        },
        Event::ArtifactWritten {
            task: t0,
            path: "/work/project/out/t0.md".into(),
            bytes: 17,
            digest: 0x0123_4567_89AB_CDEF,
        },
        Event::WorktreeFinalized {
            task: t0,
            changed: true,
            diff: Some("2 files changed, 10 insertions(+)".into()),
        },
        Event::TaskFinished {
            task: t0,
            result: TaskResult {
                state: TerminalState::Completed,
                stop_reason: StopReason::Completed,
                phase: None,
                error: None,
                text: "done: ünïcödé ✓".into(),
                result: None,
            },
        },
        Event::AttemptLaunching {
            task: t1,
            attempt: Attempt(1),
            model: None,
        },
        Event::AttemptFinished {
            task: t1,
            attempt: Attempt(1),
            outcome: AttemptOutcome {
                status: AttemptStatus::Failed,
                stop_reason: StopReason::Timeout,
                phase: Some(Phase::Running),
                exit_code: None,
                signal: Some(9),
                error: Some("attempt timed out".into()),
                side_effects: false,
                denials: vec![],
                rate_limited: false,
                retry_after_ms: None,
                result: None,
            },
            usage: usage(7),
            output: String::new(),
        },
        Event::TaskFinished {
            task: t1,
            result: TaskResult {
                state: TerminalState::Timeout,
                stop_reason: StopReason::Timeout,
                phase: Some(Phase::Running),
                error: Some("attempt timed out".into()),
                text: "attempt timed out".into(),
                result: None,
            },
        },
        Event::TaskFinished {
            task: t2,
            result: TaskResult {
                state: TerminalState::Skipped,
                stop_reason: StopReason::Cancelled,
                phase: None,
                error: Some("t1 did not complete".into()),
                text: "(no output)".into(),
                result: None,
            },
        },
        Event::RunFinished {
            state: RunOutcome::Partial,
            summary: "[t0] completed\ndone\n\n[t1] timeout\n\n[t2] skipped".into(),
        },
    ];
    (0u64..).zip(events).map(|(i, e)| (at(i), e)).collect()
}

/// The variants appended to `StoredEvent` v1 after the fixture was written, each placed where a
/// run records it. The committed fixture holds none of them; [`every_variant_and_later`] is the
/// fixture's run with them, so that the fixture test covers them without a new fixture.
pub(crate) fn appended_variants() -> Vec<(usize, Event)> {
    vec![
        (
            // Before the TaskSetUp of t0 (record 3 of the fixture).
            3,
            Event::WorktreePlanned {
                task: TaskId(0),
                repo: "/work/project".into(),
                path: "/work/project/.sortie/worktrees/fixture-v1/t0".into(),
                branch: "sortie/fixture-v1/t0".into(),
                base: "0123456789abcdef0123456789abcdef01234567".into(),
            },
        ),
        (
            // Before the AttemptStarted of t0's attempt 1 (record 5): placed, then its id.
            5,
            Event::AttemptPlaced {
                task: TaskId(0),
                attempt: Attempt(1),
                executor: "local".into(),
                dir: "/work/project/.sortie/runs/fixture-v1/attempts/0.1".into(),
            },
        ),
        (
            5,
            Event::AttemptHandle {
                task: TaskId(0),
                attempt: Attempt(1),
                handle: "4711".into(),
            },
        ),
        (
            // After the AttemptStarted of t0's attempt 1 (record 5 of the fixture).
            6,
            Event::AttemptSideEffects {
                task: TaskId(0),
                attempt: Attempt(1),
            },
        ),
        (
            // #10: how far t0's attempt 1's stdout was journaled (its checkpoint's offset).
            6,
            Event::AttemptRead {
                task: TaskId(0),
                attempt: Attempt(1),
                offset: 512,
            },
        ),
        (
            // Right after the AttemptLaunching of t0's attempt 2 (record 10).
            11,
            Event::AttemptPlaced {
                task: TaskId(0),
                attempt: Attempt(2),
                executor: "local".into(),
                dir: "/work/project/.sortie/runs/fixture-v1/attempts/0.2".into(),
            },
        ),
        (
            // Right after the RunResumed (record 13): found running, then orphaned all the same.
            14,
            Event::AttemptAdopted {
                task: TaskId(0),
                attempt: Attempt(2),
                offset: 1234,
            },
        ),
        (
            // Right after the AttemptLaunching of t0's attempt 3 (record 16), which follows the
            // orphaned attempt 2.
            17,
            Event::AttemptContinues {
                task: TaskId(0),
                attempt: Attempt(3),
                session: "/work/project/.sortie/runs/fixture-v1/sessions/0.2/s.jsonl".into(),
            },
        ),
        (
            // #34: t0's attempt 3 ran sandboxed: its connections, before its end.
            17,
            Event::SandboxNet {
                task: TaskId(0),
                attempt: Attempt(3),
                flows: vec![
                    sortie_core::sandbox_net::Flow {
                        host: "example.com".into(),
                        port: 443,
                        allowed: false,
                        count: 3,
                        bytes_out: 0,
                        bytes_in: 0,
                    },
                    sortie_core::sandbox_net::Flow {
                        host: "pypi.org".into(),
                        port: 443,
                        allowed: true,
                        count: 2,
                        bytes_out: 1800,
                        bytes_in: 90_000,
                    },
                ],
            },
        ),
    ]
}

/// [`every_variant`] with [`appended_variants`] inserted: a legal run that uses every variant,
/// stamped 250 ms apart, with `RunResumed.from_seq` moved along.
pub(crate) fn every_variant_and_later() -> Vec<(Timestamp, Event)> {
    let mut events: Vec<Event> = every_variant().into_iter().map(|(_, e)| e).collect();
    let added = appended_variants();
    for (i, e) in added.iter().rev() {
        events.insert(*i, e.clone());
    }
    for e in &mut events {
        if let Event::RunResumed { from_seq, .. } = e {
            let before = added
                .iter()
                .filter(|(i, _)| (*i as u64) <= from_seq.0)
                .count();
            *from_seq = Seq(from_seq.0 + before as u64);
        }
    }
    (0u64..).zip(events).map(|(i, e)| (at(i), e)).collect()
}

/// The events of a realistic run of `tasks` tasks, in order: `RunStarted`, then per task
/// queued, launching, started, `progress` checkpoints, finished and task finished, four tasks
/// interleaved at a time, then `RunFinished`. Every event is legal.
pub(crate) fn realistic(tasks: u32, progress: u32) -> impl Iterator<Item = (Timestamp, Event)> {
    let start = std::iter::once(Event::RunStarted {
        run_id: RunId::new("bench").unwrap(),
        batch: batch(tasks),
        batch_digest: 1,
        host: "bench-host".into(),
        pid: 1,
    });
    let per_task = move |t: u32| {
        let task = TaskId(t);
        let a = Attempt(1);
        let mut v = vec![
            Event::TaskQueued { task },
            Event::AttemptLaunching {
                task,
                attempt: a,
                model: Some("anthropic/claude-sonnet".into()),
            },
            Event::AttemptStarted {
                task,
                attempt: a,
                pid: 10_000 + t,
                start_time: u64::from(t) * 7,
            },
        ];
        for k in 1..=u64::from(progress) {
            v.push(Event::AttemptProgress {
                task,
                attempt: a,
                usage: reported(k),
            });
        }
        v.push(Event::AttemptFinished {
            task,
            attempt: a,
            outcome: AttemptOutcome::completed(),
            usage: reported(u64::from(progress) + 1),
            output: format!("task {t} finished: all good"),
        });
        v.push(Event::TaskFinished {
            task,
            result: TaskResult {
                state: TerminalState::Completed,
                stop_reason: StopReason::Completed,
                phase: None,
                error: None,
                text: format!("task {t} finished: all good"),
                result: None,
            },
        });
        v
    };
    // Four tasks at a time, their events interleaved round-robin.
    let body = (0..tasks.div_ceil(4)).flat_map(move |g| {
        let group: Vec<Vec<Event>> = (g * 4..(g * 4 + 4).min(tasks)).map(per_task).collect();
        let len = group.iter().map(Vec::len).max().unwrap_or(0);
        let mut out = Vec::new();
        for i in 0..len {
            for events in &group {
                if let Some(e) = events.get(i) {
                    out.push(e.clone());
                }
            }
        }
        out
    });
    let end = std::iter::once(Event::RunFinished {
        state: RunOutcome::Completed,
        summary: "all done".into(),
    });
    (0u64..)
        .zip(start.chain(body).chain(end))
        .map(|(i, e)| (at(i), e))
}

/// How many events `realistic(tasks, progress)` yields.
pub(crate) fn realistic_len(tasks: u32, progress: u32) -> u64 {
    2 + u64::from(tasks) * (5 + u64::from(progress))
}
