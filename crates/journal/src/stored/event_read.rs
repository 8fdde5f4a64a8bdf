//! Reading a record's `StoredEvent` back into `sortie_core::Event` (see `event.rs` for the
//! format's rules): every variant, old and new, and the checks a decoded payload must pass.

use sortie_core::{Attempt, Event, RunId, Seq, TaskId};

use super::event::StoredEvent;

impl TryFrom<StoredEvent> for Event {
    type Error = String;
    fn try_from(e: StoredEvent) -> Result<Self, String> {
        Ok(match e {
            StoredEvent::TaskQueued { task } => Event::TaskQueued { task: TaskId(task) },
            StoredEvent::TaskSetUp { task, worktree } => Event::TaskSetUp {
                task: TaskId(task),
                worktree,
            },
            StoredEvent::RetryScheduled {
                task,
                next_attempt,
                model,
                delay,
                reason,
            } => Event::RetryScheduled {
                task: TaskId(task),
                next_attempt: Attempt(next_attempt),
                model,
                delay: delay.try_into()?,
                reason,
            },
            StoredEvent::ArtifactWritten {
                task,
                path,
                bytes,
                digest,
            } => Event::ArtifactWritten {
                task: TaskId(task),
                path,
                bytes,
                digest,
            },
            StoredEvent::WorktreeFinalized {
                task,
                changed,
                diff,
            } => Event::WorktreeFinalized {
                task: TaskId(task),
                changed,
                diff,
            },
            StoredEvent::TaskFinished { task, result } => Event::TaskFinished {
                task: TaskId(task),
                result: result.into(),
            },
            StoredEvent::WorktreePlanned {
                task,
                repo,
                path,
                branch,
                base,
            } => Event::WorktreePlanned {
                task: TaskId(task),
                repo,
                path,
                branch,
                base,
            },
            StoredEvent::TaskFinishedV2 { task, result } => Event::TaskFinished {
                task: TaskId(task),
                result: result.try_into()?,
            },
            StoredEvent::TaskCarried {
                task,
                result,
                usage,
            } => Event::TaskCarried {
                task: TaskId(task),
                result: result.try_into()?,
                usage: usage.into(),
            },
            StoredEvent::WorktreeDiscarded {
                task,
                by,
                branch_kept,
            } => Event::WorktreeDiscarded {
                task: TaskId(task),
                by: by.into(),
                branch_kept,
            },
            StoredEvent::SandboxNet {
                task,
                attempt,
                flows,
            } => Event::SandboxNet {
                task: TaskId(task),
                attempt: Attempt(attempt),
                flows: flows
                    .into_iter()
                    .map(|f| sortie_core::sandbox_net::Flow {
                        host: f.host,
                        port: f.port,
                        allowed: f.allowed,
                        count: f.count,
                        bytes_out: f.bytes_out,
                        bytes_in: f.bytes_in,
                    })
                    .collect(),
            },
            StoredEvent::VerifyStarted { task, attempt } => Event::VerifyStarted {
                task: TaskId(task),
                attempt: Attempt(attempt),
            },
            StoredEvent::VerifyEnded {
                task,
                attempt,
                verdict,
            } => Event::VerifyEnded {
                task: TaskId(task),
                attempt: Attempt(attempt),
                verdict: sortie_core::verify::Verdict {
                    passed: verdict.passed,
                    score: verdict.score,
                    exit: verdict.exit,
                    digest: verdict.digest,
                    error: verdict.error,
                },
            },
            StoredEvent::RunStarted { .. }
            | StoredEvent::RunResumed { .. }
            | StoredEvent::RunInterrupted { .. }
            | StoredEvent::RunFinished { .. }
            | StoredEvent::RunStartedV2 { .. }
            | StoredEvent::RunBudgetWarned { .. }
            | StoredEvent::RunBudgetExceeded { .. }
            | StoredEvent::Control { .. }
            | StoredEvent::RunRerunOf { .. }
            | StoredEvent::RunRecovered { .. }
            | StoredEvent::RunStartedShared { .. } => run_event(e)?,
            StoredEvent::AttemptLaunching { .. }
            | StoredEvent::AttemptStarted { .. }
            | StoredEvent::AttemptProgress { .. }
            | StoredEvent::AttemptStalled { .. }
            | StoredEvent::AttemptFinished { .. }
            | StoredEvent::AttemptOrphaned { .. }
            | StoredEvent::AttemptSideEffects { .. }
            | StoredEvent::AttemptContinues { .. }
            | StoredEvent::AttemptFinishedV2 { .. }
            | StoredEvent::AttemptPlaced { .. }
            | StoredEvent::AttemptHandle { .. }
            | StoredEvent::AttemptAdopted { .. }
            | StoredEvent::AttemptRecorded { .. }
            | StoredEvent::AttemptRead { .. }
            | StoredEvent::AttemptSession { .. }
            | StoredEvent::AttemptWaiting { .. } => attempt_event(e)?,
        })
    }
}

/// `RunStarted` read back from any of its stored forms (their batches already converted).
fn run_started(
    run_id: String,
    batch: sortie_core::Batch,
    batch_digest: u64,
    host: String,
    pid: u32,
) -> Result<Event, String> {
    Ok(Event::RunStarted {
        run_id: RunId::new(run_id).map_err(|e| e.to_string())?,
        batch,
        batch_digest,
        host,
        pid,
    })
}

/// A run's event read back (the run events of `Event::try_from`).
fn run_event(e: StoredEvent) -> Result<Event, String> {
    Ok(match e {
        StoredEvent::RunStarted {
            run_id,
            batch,
            batch_digest,
            host,
            pid,
        } => run_started(run_id, batch.try_into()?, batch_digest, host, pid)?,
        StoredEvent::RunResumed { pid, from_seq } => Event::RunResumed {
            pid,
            from_seq: Seq(from_seq),
        },
        StoredEvent::RunInterrupted { reason } => Event::RunInterrupted { reason },
        StoredEvent::RunFinished { state, summary } => Event::RunFinished {
            state: state.into(),
            summary,
        },
        StoredEvent::RunStartedV2 {
            run_id,
            batch,
            batch_digest,
            host,
            pid,
        } => run_started(run_id, batch.try_into()?, batch_digest, host, pid)?,
        StoredEvent::RunBudgetWarned { limit, used, of } => Event::RunBudgetWarned {
            limit: limit.into(),
            used,
            of,
        },
        StoredEvent::RunBudgetExceeded { limit, reason } => Event::RunBudgetExceeded {
            limit: limit.into(),
            reason,
        },
        StoredEvent::Control { by, action } => Event::Control {
            by,
            action: action.into(),
        },
        StoredEvent::RunRerunOf { parent } => Event::RunRerunOf {
            parent: RunId::new(parent).map_err(|e| e.to_string())?,
        },
        StoredEvent::RunRecovered {
            kept,
            scanned,
            lost,
            restored,
            damaged,
        } => Event::RunRecovered {
            kept,
            scanned,
            lost,
            restored: restored
                .into_iter()
                .map(|(t, a)| (sortie_core::TaskId(t), sortie_core::Attempt(a)))
                .collect(),
            damaged,
        },
        StoredEvent::RunStartedShared {
            run_id,
            batch,
            batch_digest,
            host,
            pid,
        } => run_started(run_id, batch.try_into()?, batch_digest, host, pid)?,
        _ => return Err("run_event was given an event that is not a run's".to_owned()),
    })
}

/// An attempt's event read back (the attempt events of `Event::try_from`).
fn attempt_event(e: StoredEvent) -> Result<Event, String> {
    Ok(match e {
        StoredEvent::AttemptLaunching {
            task,
            attempt,
            model,
        } => Event::AttemptLaunching {
            task: TaskId(task),
            attempt: Attempt(attempt),
            model,
        },
        StoredEvent::AttemptStarted {
            task,
            attempt,
            pid,
            start_time,
        } => Event::AttemptStarted {
            task: TaskId(task),
            attempt: Attempt(attempt),
            pid,
            start_time,
        },
        StoredEvent::AttemptProgress {
            task,
            attempt,
            usage,
        } => Event::AttemptProgress {
            task: TaskId(task),
            attempt: Attempt(attempt),
            usage: usage.into(),
        },
        StoredEvent::AttemptStalled { task, attempt } => Event::AttemptStalled {
            task: TaskId(task),
            attempt: Attempt(attempt),
        },
        StoredEvent::AttemptFinished {
            task,
            attempt,
            outcome,
            usage,
            output,
        } => Event::AttemptFinished {
            task: TaskId(task),
            attempt: Attempt(attempt),
            outcome: outcome.into(),
            usage: usage.into(),
            output,
        },
        StoredEvent::AttemptOrphaned {
            task,
            attempt,
            action,
        } => Event::AttemptOrphaned {
            task: TaskId(task),
            attempt: Attempt(attempt),
            action: action.into(),
        },
        StoredEvent::AttemptSideEffects { task, attempt } => Event::AttemptSideEffects {
            task: TaskId(task),
            attempt: Attempt(attempt),
        },
        StoredEvent::AttemptContinues {
            task,
            attempt,
            session,
        } => Event::AttemptContinues {
            task: TaskId(task),
            attempt: Attempt(attempt),
            session,
        },
        StoredEvent::AttemptFinishedV2 {
            task,
            attempt,
            outcome,
            usage,
            output,
        } => Event::AttemptFinished {
            task: TaskId(task),
            attempt: Attempt(attempt),
            outcome: outcome.try_into()?,
            usage: usage.into(),
            output,
        },
        StoredEvent::AttemptPlaced {
            task,
            attempt,
            executor,
            dir,
        } => Event::AttemptPlaced {
            task: TaskId(task),
            attempt: Attempt(attempt),
            executor,
            dir,
        },
        StoredEvent::AttemptHandle {
            task,
            attempt,
            handle,
        } => Event::AttemptHandle {
            task: TaskId(task),
            attempt: Attempt(attempt),
            handle,
        },
        StoredEvent::AttemptAdopted {
            task,
            attempt,
            offset,
        } => Event::AttemptAdopted {
            task: TaskId(task),
            attempt: Attempt(attempt),
            offset,
        },
        StoredEvent::AttemptRecorded { task, attempt } => Event::AttemptRecorded {
            task: TaskId(task),
            attempt: Attempt(attempt),
        },
        StoredEvent::AttemptRead {
            task,
            attempt,
            offset,
        } => Event::AttemptRead {
            task: TaskId(task),
            attempt: Attempt(attempt),
            offset,
        },
        StoredEvent::AttemptSession {
            task,
            attempt,
            session,
        } => Event::AttemptSession {
            task: TaskId(task),
            attempt: Attempt(attempt),
            session,
        },
        StoredEvent::AttemptWaiting { task, attempt } => Event::AttemptWaiting {
            task: TaskId(task),
            attempt: Attempt(attempt),
        },
        _ => return Err("attempt_event was given an event that is not an attempt's".to_owned()),
    })
}
