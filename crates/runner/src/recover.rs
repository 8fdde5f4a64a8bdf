//! `sortie recover RUN`: a damaged journal becomes a journal `resume` continues, losing nothing
//! more than the damage did.
//!
//! The damaged files are never modified: they are moved aside, whole, to
//! `runs/<id>/damaged/<time>/` (the journal's directory, its high-water mark, its snapshots),
//! and sled never opens them in place (salvage reads a private copy: sled's recovery rewrites a
//! damaged log). A new journal is built from every record that can still be read, in order, with
//! their seqs and times; its high-water mark and a snapshot are written, and
//! `runs/<id>/recovered.json` says what was lost: the seq range, and the tasks whose fate is
//! uncertain.
//!
//! Every source is used: the records sled still gives, then those the scan of the journal's
//! files finds whole past the damage (`Journal::salvage`); when none can be read, the run's
//! start from the newest valid snapshot (its batch, its id, its start); then the attempts'
//! own files. An attempt whose records were lost but whose files (its `started` record in its
//! dir or the shepherd's status log, or its Slurm job file) are there is restored as launched
//! and placed (`restore_attempts`): `resume` then finds it like any attempt a crash left
//! running, records it from its files if it ended (its output, its usage: never run again) or
//! adopts it, and its number is never used again. Earlier attempts of the same task found on
//! disk before it are restored as orphaned (ended, their end unknown; no retry spent). A
//! `RunRecovered` event, after the records read back and before what was restored, says all
//! this in the journal itself, so `audit`, `status`, `list` and `replay` show the recovery.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sortie_core::recover::{OnDisk, TaskFiles};
use sortie_core::{
    Event, Isolation, PlannedWorktree, RunId, RunState, Stamped, TaskId, TaskState, Timestamp,
};
use sortie_journal::{Journal, Salvage};

use crate::clock::now;
use crate::layout::{RunDir, StateDir, index};
use crate::{Error, Result};

/// What `recover` did.
#[derive(Debug, Clone, Serialize)]
pub struct Recovered {
    /// The run.
    pub run_id: RunId,
    /// How many records the new journal holds (the readable prefix).
    pub kept: u64,
    /// How many records the journal had acknowledged, when its mark says.
    pub acknowledged: Option<u64>,
    /// The lost records (`first..=last`), when known.
    pub lost: Option<(u64, u64)>,
    /// Why reading stopped, if it stopped before the end of what sled gave.
    pub stopped: Option<String>,
    /// Tasks whose end may be lost: an attempt was live in the surviving records (resume
    /// records it orphaned and retries it), or the newest snapshot, taken after records now
    /// lost, says they finished (they run again).
    pub uncertain: Vec<String>,
    /// Where the damaged files are now.
    pub damaged: PathBuf,
    /// How many of `kept` the scan of the journal's files found past sled's reading.
    pub scanned: u64,
    /// Whether the run's start was taken from the snapshot (no record could be read).
    pub started_from_snapshot: bool,
    /// The attempts restored from their files (`label.attempt`).
    pub restored: Vec<String>,
    /// Attempts whose files are there but could not be restored, and why.
    pub not_restored: Vec<String>,
    /// Attempts of which only output files were found (a direct attempt records no exit):
    /// restored as orphaned, so the task runs again under the next number.
    pub orphaned: Vec<String>,
}

/// Recovers a run that no process owns (see the module docs).
pub fn recover(state_dir: &StateDir, run_id: &RunId) -> Result<Recovered> {
    let dir = state_dir.run(run_id);
    if !dir.exists() {
        return Err(Error::NoSuchRun(run_id.clone()));
    }
    let _lock = dir.lock()?;
    let salvage = Journal::salvage(dir.path())?;
    // Another run's journal (a backup restored to the wrong run dir) is not this run's to
    // rebuild: its records would show run B's tasks and costs as run A's.
    if let Some(theirs) = salvage.state.run_id.as_ref().filter(|id| *id != run_id) {
        return Err(Error::Journal(sortie_journal::Error::Damaged {
            file: sortie_journal::db_dir(dir.path()),
            message: format!(
                "this journal is run {theirs}'s, not run {run_id}'s (restored to the wrong run \
                 dir?); nothing was changed"
            ),
        }));
    }
    let mut salvage = salvage;
    // Nothing readable (a zero-length or garbled log): the run's start from the snapshot, when
    // one is there; else a journal rebuilt from no record would read as whole and empty, and
    // resume could not go on from it: refused, the files left.
    let started_from_snapshot =
        salvage.records.is_empty() && start_from_snapshot(&mut salvage, run_id);
    if salvage.records.is_empty() {
        return Err(Error::Journal(sortie_journal::Error::Damaged {
            file: sortie_journal::db_dir(dir.path()).join("db"),
            message: "no record of the journal can be read and no snapshot holds the run's start: there is nothing to rebuild the run \
                      from (its files are left as they are)"
                .into(),
        }));
    }
    dir.claim()?;
    let acked = crate::layout::open::acknowledged(state_dir, run_id, salvage.acked);
    let kept = salvage.records.len() as u64;
    let lost = acked.filter(|a| *a > kept).map(|a| (kept, a - 1));
    let uncertain = uncertain(&salvage);

    // Move the damaged files aside, whole.
    let stamp = now().0;
    let aside = dir.damaged(stamp);
    crate::layout::private_dir(&aside)?;
    let run_dir = dir.path();
    let mut moves: Vec<PathBuf> = vec![dir.journal(), sortie_journal::mark_path(run_dir)];
    moves.extend(sortie_journal::snapshot_paths(run_dir));
    for from in moves {
        let Some(name) = from.file_name() else {
            continue;
        };
        let to = aside.join(name);
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { path: from, source }),
        }
    }

    let worktrees = lost_worktrees(state_dir, &dir, &salvage);
    let found = found_on_disk(&dir, &salvage.state, &worktrees);
    let restoring = sortie_core::recover::restore(&salvage.state, &found);
    let at = now();
    let mut tail = vec![Event::RunRecovered {
        kept,
        scanned: salvage.scanned,
        lost,
        restored: restoring
            .restored
            .iter()
            .chain(&restoring.orphaned)
            .copied()
            .collect(),
        damaged: aside.to_string_lossy().into_owned(),
    }];
    tail.extend(restoring.events);
    let mut state = salvage.state.clone();
    for event in &tail {
        let stamped = Stamped {
            seq: state.next_seq,
            at,
            event: event.clone(),
        };
        state.apply(&stamped).map_err(Error::Violation)?;
    }
    let journal = Journal::create(run_dir)?;
    rebuild(&journal, &salvage)?;
    let stamped: Vec<(Timestamp, Event)> = tail.into_iter().map(|e| (at, e)).collect();
    journal.append_all(&stamped)?;
    let mark = journal.write_snapshot(&state)?;
    let report = Recovered {
        run_id: run_id.clone(),
        kept,
        acknowledged: acked,
        lost,
        stopped: salvage.stopped.clone(),
        uncertain,
        damaged: aside,
        scanned: salvage.scanned,
        started_from_snapshot,
        restored: restoring
            .restored
            .iter()
            .map(|(t, a)| format!("{}.{}", state.label(*t), a.0))
            .collect(),
        not_restored: restoring.not_restored,
        orphaned: restoring
            .orphaned
            .iter()
            .map(|(t, a)| format!("{}.{}", state.label(*t), a.0))
            .collect(),
    };
    let json = serde_json::to_vec_pretty(&report).map_err(|e| Error::Io {
        path: dir.recovered(),
        source: std::io::Error::other(e),
    })?;
    crate::files::write_atomic(&dir.recovered(), &json, 0o600)?;
    let mut entry = index::RunEntry::from_state(run_id.clone(), &state, now());
    entry.acked = mark;
    index::write(state_dir, &entry)?;
    Ok(report)
}

/// Appends the salvaged records to the new journal, durably, in big writes.
fn rebuild(journal: &Journal, salvage: &Salvage) -> Result<()> {
    journal.set_durability(sortie_journal::Durability::Sync);
    for chunk in salvage.records.chunks(4096) {
        let events: Vec<(Timestamp, sortie_core::Event)> =
            chunk.iter().map(|s| (s.at, s.event.clone())).collect();
        journal.append_all(&events)?;
    }
    Ok(())
}

/// The tasks whose end may be lost (see [`Recovered::uncertain`]).
fn uncertain(salvage: &Salvage) -> Vec<String> {
    let state: &RunState = &salvage.state;
    let snapshot = salvage
        .snapshot
        .as_ref()
        .filter(|(mark, _)| mark.records > state.next_seq.0)
        .map(|(_, s)| s);
    (0..state.tasks.len())
        .filter(|&i| {
            let here = &state.tasks[i].state;
            let live = matches!(here, TaskState::Running { .. } | TaskState::Ended { .. });
            let finished_later = !here.is_terminal()
                && snapshot
                    .and_then(|s| s.tasks.get(i))
                    .is_some_and(|t| t.state.is_terminal());
            live || finished_later
        })
        .map(|i| state.label(sortie_core::TaskId(i as u32)))
        .collect()
}

/// When no record can be read: the run's start (`RunStarted`, at the run's own start time, so
/// that its processes' markers still name it) from the newest snapshot that decodes and is this
/// run's, as the salvage's first record. Whether there was one.
fn start_from_snapshot(salvage: &mut Salvage, run_id: &RunId) -> bool {
    let Some((_, snap)) = &salvage.snapshot else {
        return false;
    };
    let (Some(id), Some(batch), Some(started)) = (&snap.run_id, &snap.batch, snap.started_at)
    else {
        return false;
    };
    if id != run_id {
        return false;
    }
    let first = Stamped {
        seq: sortie_core::Seq(0),
        at: started,
        event: Event::RunStarted {
            run_id: id.clone(),
            batch: batch.clone(),
            batch_digest: snap.batch_digest,
            host: snap.host.clone(),
            pid: snap.pid,
        },
    };
    let mut state = RunState::new();
    if state.apply(&first).is_err() {
        return false;
    }
    salvage.records.push(first);
    salvage.state = state;
    true
}

/// What the files of the attempt dir `dir` say of its placement, if they are there: a Slurm
/// job (its `job` file; its dir holds a `started` record too, its supervisor runs on the node),
/// a supervised attempt (its `started` record), an ended direct attempt (the `exit` record
/// sortie wrote; placed with the supervised executor, which follows such files), or only
/// output files.
fn on_disk(dir: &Path) -> Option<OnDisk> {
    let placed =
        |executor: &str, started: Option<(u32, u64)>, handle: Option<String>| OnDisk::Placed {
            executor: executor.to_owned(),
            dir: dir.to_string_lossy().into_owned(),
            started,
            handle,
        };
    if let Some(job) = crate::executor::slurm::read_job_id(dir) {
        return Some(placed(crate::executor::slurm::SLURM, None, Some(job)));
    }
    if let Some(s) = crate::supervisor::read_started(dir) {
        let started = Some((s.pid, s.start_time));
        return Some(placed(crate::executor::SUPERVISED, started, None));
    }
    if crate::supervisor::read_exit(dir).is_some() {
        return Some(placed(crate::executor::SUPERVISED, None, None));
    }
    let files = crate::layout::attempt::AttemptFiles::of(dir);
    (files.stdout.exists() || files.stderr.exists()).then_some(OnDisk::Files)
}

/// What the attempts' files of each unfinished task of `state` say (core's
/// `recover::restore` decides what to restore from it): its live attempt's, those numbered
/// after the last one the records know, and its worktree when its setup was lost.
fn found_on_disk(
    dir: &RunDir,
    state: &RunState,
    worktrees: &BTreeMap<TaskId, PlannedWorktree>,
) -> BTreeMap<TaskId, TaskFiles> {
    let mut out = BTreeMap::new();
    for (i, rec) in state.tasks.iter().enumerate() {
        let task = TaskId(i as u32);
        if rec.state.is_terminal() {
            continue;
        }
        let known = rec.attempts.len() as u32;
        let live = match rec.state {
            TaskState::Running { attempt } => on_disk(&dir.attempt_dir(task.0, attempt.0)),
            _ => None,
        };
        let after: Vec<OnDisk> = (known + 1..)
            .map_while(|k| on_disk(&dir.attempt_dir(task.0, k)))
            .collect();
        if live.is_some() || !after.is_empty() {
            let worktree = worktrees.get(&task).cloned();
            out.insert(
                task,
                TaskFiles {
                    live,
                    after,
                    worktree,
                },
            );
        }
    }
    out
}

/// The worktrees of the tasks whose setup was lost with the records but whose worktree is on
/// disk: what `WorktreePlanned` said, from the newest snapshot when it holds it, else read back
/// from git (the repository of the task's `cwd`, the branch's fork point from its HEAD as the
/// base: with `include_wip`, the seed commit then counts as a change, and the worktree is kept).
fn lost_worktrees(
    state_dir: &StateDir,
    dir: &RunDir,
    salvage: &Salvage,
) -> BTreeMap<TaskId, PlannedWorktree> {
    let state = &salvage.state;
    let snapshot = salvage.snapshot.as_ref().map(|(_, s)| s);
    let mut out = BTreeMap::new();
    let mut runtime = None;
    for (i, rec) in state.tasks.iter().enumerate() {
        let task = TaskId(i as u32);
        let Some(spec) = state.spec(task) else {
            continue;
        };
        if spec.isolation != Isolation::Worktree
            || rec.steps().setup.is_some()
            || !rec.attempts.is_empty()
        {
            continue;
        }
        let (path, branch) =
            crate::worktree::location(state_dir, dir.id().as_str(), &spec.label, task.0);
        if !path.is_dir() {
            continue;
        }
        let from_snapshot = snapshot
            .and_then(|s| s.task(task))
            .and_then(|r| r.steps().worktree.clone())
            .filter(|w| Path::new(&w.path) == path);
        let planned = from_snapshot.or_else(|| {
            let rt = runtime.get_or_insert_with(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()
            });
            let rt = rt.as_ref()?;
            let git = |cwd: &Path, args: &[&str]| {
                let argv: Vec<String> = std::iter::once("git")
                    .chain(args.iter().copied())
                    .map(str::to_owned)
                    .collect();
                rt.block_on(crate::process::run_tool(&argv, cwd, &[]))
                    .ok()
                    .filter(|o| o.success())
                    .map(|o| o.text())
            };
            let repo = git(Path::new(&spec.cwd), &["rev-parse", "--show-toplevel"])?;
            let base = git(Path::new(&repo), &["merge-base", &branch, "HEAD"])?;
            Some(PlannedWorktree {
                repo,
                path: path.display().to_string(),
                branch: branch.clone(),
                base,
            })
        });
        if let Some(p) = planned {
            out.insert(task, p);
        }
    }
    out
}
