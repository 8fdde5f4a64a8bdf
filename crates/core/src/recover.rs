//! #32: what `sortie recover` restores from the attempts' own files once the journal lost their
//! records, as events after the records kept (and the `RunRecovered` that says so). The runner
//! reads the files and passes what it found ([`TaskFiles`]); the rules are here:
//!
//! - a live attempt whose placement (or start) was lost is placed (and started) again from its
//!   files, so that resume finds it (records it if it ended, adopts it if it runs);
//! - the attempts numbered after the last one the records know, found on disk in order, are
//!   restored as launched and placed: the last one live (resume finds it), the ones before it
//!   orphaned (`Gone`: they ended, their end is lost; no retry is spent), with a retry between
//!   each; a live attempt the records knew is orphaned too, since a later one was launched;
//! - an attempt with only its output files (a direct one that was running when sortie died) is
//!   restored as orphaned: it runs again, under the next number, never under its own;
//! - a worktree task whose setup was lost gets it back first (`WorktreePlanned`, `TaskSetUp`)
//!   when the runner found its worktree, and `TaskSetUp` alone when the plan survived in the
//!   records, found or gone (a task's finalize finds it gone, a retry re-creates it); when
//!   both the plan and the worktree are gone (removed, unchanged, at the task's end), its
//!   attempts are restored without one, and a retry sets a new one up;
//! - when the task's state does not lead to the first attempt found, the attempts are named,
//!   not restored.
//!
//! Every task's events are checked against the state machine before they are kept.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Stamped;
use crate::Timestamp;
use crate::event::{Event, OrphanAction};
use crate::ids::{Attempt, TaskId};
use crate::spec::Isolation;
use crate::state::{PlannedWorktree, RunState, TaskState, Violation};

/// How an attempt's files say it was placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnDisk {
    /// Placed on `executor` with its files in `dir`: its process when a record names it (a
    /// supervisor's `started`), its executor's id when one does (a Slurm job).
    Placed {
        /// The executor's name.
        executor: String,
        /// The attempt dir.
        dir: String,
        /// Its agent's pid and start time.
        started: Option<(u32, u64)>,
        /// Its executor's own id.
        handle: Option<String>,
    },
    /// Only its output files: nothing tells how it ended.
    Files,
}

/// What the runner found on disk of one unfinished task's attempts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFiles {
    /// Its live attempt's (the last one the records know, when it is running).
    pub live: Option<OnDisk>,
    /// The attempts numbered after the last one the records know, in order, while each is
    /// found.
    pub after: Vec<OnDisk>,
    /// Its worktree, when its setup was lost with the records and the worktree is on disk.
    pub worktree: Option<PlannedWorktree>,
}

/// What [`restore`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restoring {
    /// The events that restore them, in order (after a `RunRecovered`).
    pub events: Vec<Event>,
    /// The attempts restored as found (resume records or adopts each).
    pub restored: Vec<(TaskId, Attempt)>,
    /// The attempts restored as orphaned, run again under the next number.
    pub orphaned: Vec<(TaskId, Attempt)>,
    /// The attempts found but not restored, and why (`label.attempt: why`).
    pub not_restored: Vec<String>,
}

/// What to restore in `state` (the records kept) from `found` (see the module doc).
pub fn restore(state: &RunState, found: &BTreeMap<TaskId, TaskFiles>) -> Restoring {
    let mut out = Restoring::default();
    // Checked as they will be journaled: after the `RunRecovered` that says what was restored.
    let mut scratch = state.clone();
    let _ = scratch.apply(&Stamped {
        seq: scratch.next_seq,
        at: scratch.last_at.unwrap_or(Timestamp(0)),
        event: Event::RunRecovered {
            kept: 0,
            scanned: 0,
            lost: None,
            restored: Vec::new(),
            damaged: String::new(),
        },
    });
    for (&task, files) in found {
        let Some(rec) = state.task(task) else {
            continue;
        };
        if rec.state.is_terminal() {
            continue;
        }
        let result = if files.after.is_empty() {
            placement(state, task, files.live.as_ref())
        } else {
            attempts_after(state, task, files)
        };
        match result {
            Ok(Some((attempt, events))) => {
                if let Err(violation) = commit(&mut scratch, &mut out, task, attempt, events) {
                    out.not_restored.push(format!(
                        "{}.{}: the journal refuses it ({violation})",
                        state.label(task),
                        attempt.0
                    ));
                }
            }
            Ok(None) => {}
            Err(why) => out.not_restored.extend(why),
        }
    }
    out
}

/// The events that place again the live attempt of `task` whose placement (or start) the
/// records lost, from what its files say (`live`).
fn placement(
    state: &RunState,
    task: TaskId,
    live: Option<&OnDisk>,
) -> Result<Option<(Attempt, Vec<Event>)>, Vec<String>> {
    let Some(rec) = state.task(task) else {
        return Ok(None);
    };
    let (TaskState::Running { attempt }, Some(a), Some(disk)) =
        (&rec.state, rec.attempts.last(), live)
    else {
        return Ok(None);
    };
    if a.placed.is_some() && a.pid.is_some() {
        return Ok(None);
    }
    let mut events = placed(task, *attempt, disk);
    events.retain(|e| match e {
        Event::AttemptPlaced { .. } => a.placed.is_none(),
        Event::AttemptStarted { .. } => a.pid.is_none(),
        Event::AttemptHandle { .. } => a.placed.as_ref().is_none_or(|p| p.handle.is_none()),
        _ => true,
    });
    Ok((!events.is_empty()).then_some((*attempt, events)))
}

/// The events that restore the attempts of `task` found after the last one the records know.
fn attempts_after(
    state: &RunState,
    task: TaskId,
    files: &TaskFiles,
) -> Result<Option<(Attempt, Vec<Event>)>, Vec<String>> {
    let (Some(rec), Some(spec)) = (state.task(task), state.spec(task)) else {
        return Ok(None);
    };
    let known = rec.attempts.len() as u32;
    let named = |why: &str| -> Vec<String> {
        (1..=files.after.len() as u32)
            .map(|n| format!("{}.{}: {why}", state.label(task), known + n))
            .collect()
    };
    // A worktree task whose setup was lost: set up again when its plan survived or its
    // worktree is on disk (`setup_again`); else (plan lost, worktree finalized and removed,
    // unchanged) its attempts are restored without one, and a retry sets a new one up (core
    // allows that after a recovery).
    let lost_setup = spec.isolation == Isolation::Worktree && rec.steps().setup.is_none();
    let mut events = Vec::new();
    // How the task got to the first attempt found: queued, or retried after the one before
    // (a live one ended, since another was launched: its end is lost, so it is an orphan).
    let (mut model, retried) = match &rec.state {
        TaskState::Pending => {
            events.push(Event::TaskQueued { task });
            (None, false)
        }
        TaskState::Queued { .. } => (None, false),
        TaskState::Retrying { next, model, .. } if next.0 == known + 1 => {
            (Some(model.clone()), false)
        }
        TaskState::Running { attempt } if attempt.0 == known => {
            events.push(Event::AttemptOrphaned {
                task,
                attempt: *attempt,
                action: OrphanAction::Gone,
            });
            (None, true)
        }
        TaskState::Ended { attempt } if attempt.0 == known => {
            events.extend(lost_verdict(spec, rec, task, *attempt));
            (None, true)
        }
        _ => return Err(named("the end of the attempt before it was lost")),
    };
    if lost_setup {
        events.extend(setup_again(task, rec.steps().worktree.as_ref(), files));
    }
    let last = files.after.len() - 1;
    for (n, disk) in files.after.iter().enumerate() {
        let attempt = Attempt(known + 1 + n as u32);
        let this_model = model
            .take()
            .unwrap_or_else(|| crate::decide::model_for_attempt(spec, attempt));
        if n > 0 || retried {
            events.push(Event::RetryScheduled {
                task,
                next_attempt: attempt,
                model: this_model.clone(),
                delay: Duration::ZERO,
                reason: "its files were found by recover".into(),
            });
        }
        events.push(Event::AttemptLaunching {
            task,
            attempt,
            model: this_model,
        });
        events.extend(placed(task, attempt, disk));
        if n < last || *disk == OnDisk::Files {
            events.push(Event::AttemptOrphaned {
                task,
                attempt,
                action: OrphanAction::Gone,
            });
        }
    }
    Ok(Some((Attempt(known + 1 + last as u32), events)))
}

/// The setup of a worktree task that the records lost, before its attempts found on disk: an
/// attempt found ran in a set-up worktree, so the task is set up again whenever its worktree
/// is known. Planned from what the runner found when the plan was lost too; from the plan the
/// records kept when it survived, even when the worktree is gone (removed, unchanged, at the
/// task's end): resume then records the attempt from its files, and the task's finalize finds
/// the worktree gone (a retry re-creates a missing worktree first). Neither known: nothing,
/// and the attempts are restored without one.
fn setup_again(task: TaskId, kept: Option<&PlannedWorktree>, files: &TaskFiles) -> Vec<Event> {
    let mut events = Vec::new();
    let path = match (kept, &files.worktree) {
        (Some(plan), _) => plan.path.clone(),
        (None, Some(w)) => {
            events.push(Event::WorktreePlanned {
                task,
                repo: w.repo.clone(),
                path: w.path.clone(),
                branch: w.branch.clone(),
                base: w.base.clone(),
            });
            w.path.clone()
        }
        (None, None) => return events,
    };
    events.push(Event::TaskSetUp {
        task,
        worktree: Some(path),
    });
    events
}

/// The events that place `attempt` of `task` as its files say (`disk`).
fn placed(task: TaskId, attempt: Attempt, disk: &OnDisk) -> Vec<Event> {
    let OnDisk::Placed {
        executor,
        dir,
        started,
        handle,
    } = disk
    else {
        return Vec::new();
    };
    let mut events = vec![Event::AttemptPlaced {
        task,
        attempt,
        executor: executor.clone(),
        dir: dir.clone(),
    }];
    if let Some(handle) = handle {
        events.push(Event::AttemptHandle {
            task,
            attempt,
            handle: handle.clone(),
        });
    }
    if let Some((pid, start_time)) = started {
        events.push(Event::AttemptStarted {
            task,
            attempt,
            pid: *pid,
            start_time: *start_time,
        });
    }
    events
}

/// Checks `events` (restoring `attempt` of `task`) against `scratch`, the state with what was
/// restored before, and when the journal accepts them, applies and keeps them.
fn commit(
    scratch: &mut RunState,
    out: &mut Restoring,
    task: TaskId,
    attempt: Attempt,
    events: Vec<Event>,
) -> Result<(), Violation> {
    let at = scratch.last_at.unwrap_or(Timestamp(0));
    scratch.check_round(at, &events)?;
    for event in &events {
        let stamped = Stamped {
            seq: scratch.next_seq,
            at,
            event: event.clone(),
        };
        scratch.apply(&stamped)?;
    }
    if matches!(events.last(), Some(Event::AttemptOrphaned { .. })) {
        out.orphaned.push((task, attempt));
    } else {
        out.restored.push((task, attempt));
    }
    out.events.extend(events);
    Ok(())
}

/// #33: a later attempt of a checked task ran after a completed attempt whose verdict the
/// damage took: only a failed check is followed by another attempt (a feedback round), so its
/// check is restored as failed, saying so.
fn lost_verdict(
    spec: &crate::spec::TaskSpec,
    rec: &crate::state::TaskRecord,
    task: TaskId,
    attempt: Attempt,
) -> Vec<Event> {
    let Some(last) = rec.attempts.last() else {
        return Vec::new();
    };
    let completed = last
        .outcome()
        .is_some_and(|o| o.status == crate::outcome::AttemptStatus::Completed);
    if spec.verify.is_none() || !completed || last.verdict().is_some() {
        return Vec::new();
    }
    let mut events = Vec::new();
    if !last.verify_started() {
        events.push(Event::VerifyStarted { task, attempt });
    }
    events.push(Event::VerifyEnded {
        task,
        attempt,
        verdict: crate::verify::Verdict {
            passed: false,
            score: 0,
            exit: None,
            digest: 0,
            error: Some(
                "the check failed: its verdict was lost with the journal's damage, and a \
                 feedback round followed"
                    .into(),
            ),
        },
    });
    events
}
