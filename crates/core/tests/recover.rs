//! Data-driven tests of what `sortie recover` restores from the attempts' files
//! (`recover::restore`): a state (the records kept) and what the runner found on disk in, the
//! events restored (by name and attempt) and the attempts named out. One row per case.

use std::collections::BTreeMap;

use sortie_core::recover::{OnDisk, TaskFiles, restore};
use sortie_core::{
    AgentProfile, Attempt, Batch, Event, Isolation, PlannedWorktree, RunConfig, RunId, RunState,
    Stamped, TaskId, TaskSpec, Timestamp,
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
    let worktree = PlannedWorktree {
        repo: "/work".into(),
        path: "/s/worktrees/r/t".into(),
        branch: "sortie/r/t".into(),
        base: "abc".into(),
    };
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
                worktree: Some(worktree),
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
