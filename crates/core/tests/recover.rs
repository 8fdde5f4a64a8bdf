//! Data-driven tests of what `sortie recover` restores from the attempts' files
//! (`recover::restore`): a state (the records kept) and what the runner found on disk in, the
//! events restored (by name and attempt) and the attempts named out. One row per case.

use std::collections::BTreeMap;

use std::collections::BTreeSet;
use std::time::Duration;

use sortie_core::plan::{Action, Facts, Planner};
use sortie_core::recover::{OnDisk, TaskFiles, restore};
use sortie_core::{
    AgentProfile, Attempt, AttemptOutcome, Batch, Event, Isolation, PlannedWorktree, RunConfig,
    RunId, RunState, Seq, Stamped, StopReason, TaskId, TaskSpec, TaskState, Timestamp, Usage,
};

const T: TaskId = TaskId(0);

/// One task `t` (isolated in a worktree when `worktree`), with `events` after its start.
fn state(worktree: bool, events: Vec<Event>) -> RunState {
    let mut spec = TaskSpec::new("t", "/work/t");
    spec.prompt = Some("do t".into());
    if worktree {
        spec.isolation = Isolation::Worktree;
    }
    let mut all = vec![Event::RunStarted {
        run_id: RunId::new("recover-rules").expect("run id"),
        batch: Batch {
            tasks: vec![spec],
            agents: AgentProfile::builtins(),
            config: RunConfig::default(),
            source: "r.toml".into(),
        },
        batch_digest: 1,
        host: "h".into(),
        pid: 1,
    }];
    all.extend(events);
    let stamped: Vec<Stamped> = all
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

/// The worktree the runner plans for `t`.
fn plan() -> PlannedWorktree {
    PlannedWorktree {
        repo: "/work".into(),
        path: "/s/worktrees/r/t".into(),
        branch: "sortie/r/t".into(),
        base: "abc".into(),
    }
}

fn plan_event() -> Event {
    let p = plan();
    Event::WorktreePlanned {
        task: T,
        repo: p.repo,
        path: p.path,
        branch: p.branch,
        base: p.base,
    }
}

/// Queued, its worktree planned (not yet set up).
fn planned() -> Vec<Event> {
    vec![Event::TaskQueued { task: T }, plan_event()]
}

fn local(n: u32, pid: Option<u32>) -> OnDisk {
    OnDisk::Placed {
        executor: "local".into(),
        dir: format!("/s/runs/r/attempts/0.{n}"),
        started: pid.map(|p| (p, 7)),
        handle: None,
    }
}

fn launched(n: u32) -> Event {
    Event::AttemptLaunching {
        task: T,
        attempt: Attempt(n),
        model: None,
    }
}

fn started(n: u32) -> Event {
    Event::AttemptStarted {
        task: T,
        attempt: Attempt(n),
        pid: 100 + n,
        start_time: 1,
    }
}

/// Each restored event as `Name` or `Name n` (its attempt); then `restored`, `orphaned` and
/// the first words of each `not_restored`.
fn show(state: &RunState, files: TaskFiles) -> String {
    let r = restore(state, &BTreeMap::from([(T, files)]));
    let events: Vec<String> = r
        .events
        .iter()
        .map(|e| match e.attempt() {
            Some(a) => format!("{} {}", e.name(), a.0),
            None => e.name().to_owned(),
        })
        .collect();
    let attempts = |v: &[(TaskId, Attempt)]| {
        v.iter()
            .map(|(_, a)| a.0.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "{} | restored {} | orphaned {} | not {}",
        events.join(", "),
        attempts(&r.restored),
        attempts(&r.orphaned),
        r.not_restored.join("; ")
    )
}

#[test]
fn recover_restores_what_the_files_show_and_never_reuses_a_number() {
    let queued = || vec![Event::TaskQueued { task: T }];
    let running = || vec![Event::TaskQueued { task: T }, launched(1), started(1)];
    let worktree = plan();
    let rows: Vec<(&str, RunState, TaskFiles, &str)> = vec![
        (
            "its queueing and its launch lost: queued, launched, placed, started",
            state(false, vec![]),
            TaskFiles {
                after: vec![local(1, Some(200))],
                ..TaskFiles::default()
            },
            "TaskQueued, AttemptLaunching 1, AttemptPlaced 1, AttemptStarted 1 | restored 1 | orphaned  | not ",
        ),
        (
            "a live direct attempt's end lost: placed late from its exit record",
            state(false, running()),
            TaskFiles {
                live: Some(local(1, None)),
                ..TaskFiles::default()
            },
            "AttemptPlaced 1 | restored 1 | orphaned  | not ",
        ),
        (
            "a live attempt and its retry on disk: the first an orphan, the retry live",
            state(false, running()),
            TaskFiles {
                live: Some(local(1, Some(101))),
                after: vec![local(2, Some(202))],
                ..TaskFiles::default()
            },
            "AttemptOrphaned 1, RetryScheduled, AttemptLaunching 2, AttemptPlaced 2, AttemptStarted 2 | restored 2 | orphaned  | not ",
        ),
        (
            "a chain of two found: the first orphaned, a retry, the last live",
            state(false, queued()),
            TaskFiles {
                after: vec![local(1, Some(201)), local(2, Some(202))],
                ..TaskFiles::default()
            },
            "AttemptLaunching 1, AttemptPlaced 1, AttemptStarted 1, AttemptOrphaned 1, RetryScheduled, AttemptLaunching 2, AttemptPlaced 2, AttemptStarted 2 | restored 2 | orphaned  | not ",
        ),
        (
            "only output files: launched and orphaned, run again under the next number",
            state(false, queued()),
            TaskFiles {
                after: vec![OnDisk::Files],
                ..TaskFiles::default()
            },
            "AttemptLaunching 1, AttemptOrphaned 1 | restored  | orphaned 1 | not ",
        ),
        (
            "a worktree task whose setup was lost, its worktree found: set up first",
            state(true, queued()),
            TaskFiles {
                after: vec![local(1, Some(201))],
                worktree: Some(worktree.clone()),
                ..TaskFiles::default()
            },
            "WorktreePlanned, TaskSetUp, AttemptLaunching 1, AttemptPlaced 1, AttemptStarted 1 | restored 1 | orphaned  | not ",
        ),
        (
            "a worktree task whose setup was lost, its worktree gone: restored without one",
            state(true, queued()),
            TaskFiles {
                after: vec![local(1, Some(201))],
                ..TaskFiles::default()
            },
            "AttemptLaunching 1, AttemptPlaced 1, AttemptStarted 1 | restored 1 | orphaned  | not ",
        ),
        (
            // Torture seed 791571778: the damage kept `WorktreePlanned`, lost `TaskSetUp`, and
            // the task had ended unchanged (its worktree removed).
            "a worktree task whose plan was kept, its setup lost, its worktree gone: set up at \
             its planned path, then its attempt restored",
            state(true, planned()),
            TaskFiles {
                after: vec![local(1, None)],
                ..TaskFiles::default()
            },
            "TaskSetUp, AttemptLaunching 1, AttemptPlaced 1 | restored 1 | orphaned  | not ",
        ),
        (
            "the same with its worktree found: set up once, at its planned path",
            state(true, planned()),
            TaskFiles {
                after: vec![local(1, Some(201))],
                worktree: Some(worktree.clone()),
                ..TaskFiles::default()
            },
            "TaskSetUp, AttemptLaunching 1, AttemptPlaced 1, AttemptStarted 1 | restored 1 | orphaned  | not ",
        ),
        (
            "the same with only output files: set up, launched and orphaned (run again)",
            state(true, planned()),
            TaskFiles {
                after: vec![OnDisk::Files],
                ..TaskFiles::default()
            },
            "TaskSetUp, AttemptLaunching 1, AttemptOrphaned 1 | restored  | orphaned 1 | not ",
        ),
        (
            "nothing on disk beyond what the records hold: nothing",
            state(false, running()),
            TaskFiles::default(),
            " | restored  | orphaned  | not ",
        ),
    ];
    for (why, state, files, want) in rows {
        assert_eq!(show(&state, files), want, "{why}");
    }
}

/// `state` (the records kept) after `sortie recover` journaled what [`restore`] decided from
/// `files`, and what it named out.
fn recovered(state: &RunState, files: TaskFiles) -> (RunState, Vec<String>) {
    let r = restore(state, &BTreeMap::from([(T, files)]));
    let mut state = state.clone();
    let mut events = vec![Event::RunRecovered {
        kept: state.next_seq.0,
        scanned: 0,
        lost: None,
        restored: r.restored.iter().chain(&r.orphaned).copied().collect(),
        damaged: "/s/runs/r/damaged/1".into(),
    }];
    events.extend(r.events);
    apply(&mut state, events);
    (state, r.not_restored)
}

fn apply(state: &mut RunState, events: Vec<Event>) {
    for event in events {
        let stamped = Stamped {
            seq: state.next_seq,
            at: Timestamp(state.last_at.map_or(1, |t| t.0 + 1)),
            event,
        };
        state
            .apply(&stamped)
            .unwrap_or_else(|v| panic!("refused: {v}\n{stamped:?}"));
    }
}

/// A resume of `state`: each live attempt ended on disk is recorded from its files with
/// `outcome`; then the planner's rounds (the worktree gone from disk) until the task ends, one
/// line per action, as the runner performs them (a finalize finds the worktree gone: unchanged).
fn resume_to_end(mut state: RunState, outcome: &AttemptOutcome) -> (RunState, Vec<String>) {
    let from_seq = Seq(state.next_seq.0 - 1);
    apply(&mut state, vec![Event::RunResumed { pid: 2, from_seq }]);
    if let TaskState::Running { attempt } = state.tasks[0].state {
        apply(
            &mut state,
            vec![
                Event::AttemptRecorded { task: T, attempt },
                Event::AttemptFinished {
                    task: T,
                    attempt,
                    outcome: outcome.clone(),
                    usage: Usage::ZERO,
                    output: "answer".into(),
                },
            ],
        );
    }
    let mut planner = Planner::new(&state);
    let missing = BTreeSet::from([T]);
    let mut log = Vec::new();
    for _ in 0..10 {
        if state.tasks[0].state.is_terminal() {
            break;
        }
        let facts = Facts {
            now: Timestamp(state.last_at.map_or(0, |t| t.0) + 1),
            stopping: None,
            live: 0,
            jobs: &BTreeMap::new(),
            setup_failed: &BTreeMap::new(),
            missing_worktrees: &missing,
        };
        let actions = planner.plan(&state, &facts);
        if actions.is_empty() {
            break;
        }
        for action in actions {
            let events = match action {
                Action::Append(e) => {
                    log.push(e.name().to_owned());
                    vec![e]
                }
                Action::EndTask {
                    task,
                    result,
                    finalize: true,
                    ..
                } => {
                    log.push(format!("end {} +finalize", result.state));
                    vec![
                        Event::WorktreeFinalized {
                            task,
                            changed: false,
                            diff: None,
                        },
                        Event::TaskFinished { task, result },
                    ]
                }
                other => {
                    log.push(format!("{other:?}"));
                    Vec::new()
                }
            };
            for event in events {
                apply(&mut state, vec![event.clone()]);
                planner.observe(&state, &event);
            }
        }
    }
    (state, log)
}

/// Torture seed 791571778, end to end in core: the damage kept the task's `WorktreePlanned`,
/// lost its `TaskSetUp`, and the task had ended unchanged (its worktree removed). Recover
/// restores its finished attempt; resume records it and finalizes the task: attempt 1 never
/// runs again, and no worktree is made again for it.
#[test]
fn a_finished_attempt_in_a_removed_worktree_whose_setup_was_lost_is_not_run_again() {
    let kept = state(true, planned());
    let files = TaskFiles {
        after: vec![local(1, None)],
        ..TaskFiles::default()
    };
    let (state, not) = recovered(&kept, files);
    assert_eq!(not, Vec::<String>::new());
    assert_eq!(
        state.tasks[0].state,
        TaskState::Running {
            attempt: Attempt(1)
        }
    );
    let (state, log) = resume_to_end(state, &AttemptOutcome::completed());
    assert_eq!(log, vec!["end completed +finalize"]);
    assert_eq!(state.tasks[0].attempts.len(), 1, "attempt 1 ran once");
    assert!(state.tasks[0].state.is_terminal());
}

/// Every cut of a worktree task's journal (a retried attempt, then a completed one, then its
/// worktree removed unchanged), as a damage that keeps a prefix leaves it, with both attempts'
/// files on disk and the worktree gone: recover restores what the records lost, names nothing
/// out, and the resume finishes the task without running an attempt again.
#[test]
fn every_cut_of_a_finished_worktree_task_recovers_without_a_rerun() {
    let failed = AttemptOutcome::failed(StopReason::Error, "overloaded");
    let ok = AttemptOutcome::completed();
    let mut history = planned();
    history.push(Event::TaskSetUp {
        task: T,
        worktree: Some(plan().path),
    });
    for (n, outcome) in [(1, &failed), (2, &ok)] {
        if n == 2 {
            history.push(Event::RetryScheduled {
                task: T,
                next_attempt: Attempt(2),
                model: None,
                delay: Duration::ZERO,
                reason: "overloaded".into(),
            });
        }
        history.extend([
            launched(n),
            Event::AttemptPlaced {
                task: T,
                attempt: Attempt(n),
                executor: "local".into(),
                dir: format!("/s/runs/r/attempts/0.{n}"),
            },
            started(n),
            Event::AttemptFinished {
                task: T,
                attempt: Attempt(n),
                outcome: outcome.clone(),
                usage: Usage::ZERO,
                output: String::new(),
            },
        ]);
    }
    history.push(Event::WorktreeFinalized {
        task: T,
        changed: false,
        diff: None,
    });
    for cut in 0..=history.len() {
        let kept = state(true, history[..cut].to_vec());
        let rec = &kept.tasks[0];
        let known = rec.attempts.len() as u32;
        let disk = |n: u32| local(n, Some(100 + n));
        let files = TaskFiles {
            live: match rec.state {
                TaskState::Running { attempt } => Some(disk(attempt.0)),
                _ => None,
            },
            after: (known + 1..=2).map(disk).collect(),
            worktree: None,
        };
        let (state, not) = recovered(&kept, files);
        assert_eq!(not, Vec::<String>::new(), "cut after {cut} events");
        let (state, log) = resume_to_end(state, &ok);
        let rec = &state.tasks[0];
        assert!(rec.state.is_terminal(), "cut after {cut}: {log:?}");
        assert_eq!(rec.attempts.len(), 2, "cut after {cut}: {log:?}");
        assert!(
            !log.iter().any(|l| l.contains("Launch")),
            "cut after {cut}: an attempt ran again: {log:?}"
        );
    }
}
