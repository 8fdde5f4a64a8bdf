//! `StoredEvent`: the on-disk mirror of `sortie_core::Event`, and its writing from it (its
//! reading back is `event_read.rs`).
//!
//! Variants are never removed or reordered (bincode stores the variant's index). A new core
//! event gets a variant appended at the end; a core event whose payload grew is written as its
//! `...V2` variant (the v1 payload plus the ext of `v2`), and its v1 variant still reads.
//! The V2 variants serialize under their v1 names for `sortie export` (`rename(serialize)`);
//! bincode ignores names. A run's start is written as `RunStartedShared` (each distinct task body
//! once, [`StoredEvent::to_write`]); export prints it from the decoded event as `RunStartedV2`.

use serde::{Deserialize, Serialize};
use sortie_core::{ControlAction, DiscardedBy, Event, TaskId};

use super::v2::{AttemptOutcomeV2, BatchV2, BudgetLimitV2, SharedBatchV2, TaskResultV2};
use super::{
    AttemptOutcomeV1, BatchV1, DurationV1, OrphanActionV1, RunOutcomeV1, TaskResultV1, UsageV1,
};

/// Mirrors `sortie_core::Event`, format v1. Never remove or reorder a variant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum StoredEvent {
    /// `Event::RunStarted`.
    RunStarted {
        run_id: String,
        batch: BatchV1,
        batch_digest: u64,
        host: String,
        pid: u32,
    },
    /// `Event::RunResumed`.
    RunResumed { pid: u32, from_seq: u64 },
    /// `Event::RunInterrupted`.
    RunInterrupted { reason: String },
    /// `Event::RunFinished`.
    RunFinished {
        state: RunOutcomeV1,
        summary: String,
    },
    /// `Event::TaskQueued`.
    TaskQueued { task: u32 },
    /// `Event::TaskSetUp`.
    TaskSetUp { task: u32, worktree: Option<String> },
    /// `Event::AttemptLaunching`.
    AttemptLaunching {
        task: u32,
        attempt: u32,
        #[serde(deserialize_with = "option_string")]
        model: Option<String>,
    },
    /// `Event::AttemptStarted`.
    AttemptStarted {
        task: u32,
        attempt: u32,
        pid: u32,
        start_time: u64,
    },
    /// `Event::AttemptProgress`.
    AttemptProgress {
        task: u32,
        attempt: u32,
        usage: UsageV1,
    },
    /// `Event::AttemptStalled`.
    AttemptStalled { task: u32, attempt: u32 },
    /// `Event::AttemptFinished`.
    AttemptFinished {
        task: u32,
        attempt: u32,
        outcome: AttemptOutcomeV1,
        usage: UsageV1,
        output: String,
    },
    /// `Event::AttemptOrphaned`.
    AttemptOrphaned {
        task: u32,
        attempt: u32,
        action: OrphanActionV1,
    },
    /// `Event::RetryScheduled`.
    RetryScheduled {
        task: u32,
        next_attempt: u32,
        model: Option<String>,
        delay: DurationV1,
        reason: String,
    },
    /// `Event::ArtifactWritten`.
    ArtifactWritten {
        task: u32,
        path: String,
        bytes: u64,
        digest: u64,
    },
    /// `Event::WorktreeFinalized`.
    WorktreeFinalized {
        task: u32,
        changed: bool,
        diff: Option<String>,
    },
    /// `Event::TaskFinished`.
    TaskFinished { task: u32, result: TaskResultV1 },
    /// `Event::WorktreePlanned` (appended after the first v1 fixture; older journals never hold
    /// it, and appending a variant leaves the earlier ones' encoding unchanged).
    WorktreePlanned {
        task: u32,
        repo: String,
        path: String,
        branch: String,
        base: String,
    },
    /// `Event::AttemptSideEffects` (appended after `WorktreePlanned`).
    AttemptSideEffects { task: u32, attempt: u32 },
    /// `Event::AttemptContinues` (appended after `AttemptSideEffects`).
    AttemptContinues {
        task: u32,
        attempt: u32,
        session: String,
    },
    /// `Event::RunStarted` with a v2 batch (format v2: every run started since writes this).
    #[serde(rename(serialize = "RunStarted"))]
    RunStartedV2 {
        run_id: String,
        batch: BatchV2,
        batch_digest: u64,
        host: String,
        pid: u32,
    },
    /// `Event::AttemptFinished` with a v2 outcome.
    #[serde(rename(serialize = "AttemptFinished"))]
    AttemptFinishedV2 {
        task: u32,
        attempt: u32,
        outcome: AttemptOutcomeV2,
        usage: UsageV1,
        #[serde(deserialize_with = "string")]
        output: String,
    },
    /// `Event::TaskFinished` with a v2 result.
    #[serde(rename(serialize = "TaskFinished"))]
    TaskFinishedV2 { task: u32, result: TaskResultV2 },
    /// `Event::RunBudgetWarned` (issue 14).
    RunBudgetWarned {
        limit: BudgetLimitV2,
        used: u64,
        of: u64,
    },
    /// `Event::RunBudgetExceeded` (issue 14).
    RunBudgetExceeded {
        limit: BudgetLimitV2,
        reason: String,
    },
    // #10: attempts that outlive sortie.
    /// `Event::AttemptPlaced`.
    AttemptPlaced {
        task: u32,
        attempt: u32,
        executor: String,
        dir: String,
    },
    /// `Event::AttemptHandle`.
    AttemptHandle {
        task: u32,
        attempt: u32,
        handle: String,
    },
    /// `Event::AttemptAdopted`.
    AttemptAdopted {
        task: u32,
        attempt: u32,
        offset: u64,
    },
    /// `Event::AttemptRecorded`.
    AttemptRecorded { task: u32, attempt: u32 },
    /// `Event::Control` (issue 15: live control).
    Control { by: String, action: ControlActionV1 },
    /// `Event::RunRerunOf` (issue 14).
    RunRerunOf { parent: String },
    /// `Event::TaskCarried` (issue 14).
    TaskCarried {
        task: u32,
        result: TaskResultV2,
        usage: UsageV1,
    },
    /// `Event::AttemptRead` (#10: adoption reads on from the journaled offset).
    AttemptRead {
        task: u32,
        attempt: u32,
        offset: u64,
    },
    /// `Event::AttemptSession` (#13: sessions).
    AttemptSession {
        task: u32,
        attempt: u32,
        session: String,
    },
    /// `Event::RunStarted` with each distinct task body stored once (every run started since
    /// writes this, see [`StoredEvent::to_write`]; `RunStartedV2` stores each task whole).
    /// `sortie export` prints a run's start as `RunStartedV2`, whichever variant stored it.
    RunStartedShared {
        run_id: String,
        batch: SharedBatchV2,
        batch_digest: u64,
        host: String,
        pid: u32,
    },
    /// `Event::RunRecovered` (#32).
    RunRecovered {
        kept: u64,
        scanned: u64,
        lost: Option<(u64, u64)>,
        restored: Vec<(u32, u32)>,
        damaged: String,
    },
    /// `Event::AttemptWaiting` (#37).
    AttemptWaiting { task: u32, attempt: u32 },
    /// `Event::WorktreeDiscarded` (#37).
    WorktreeDiscarded {
        task: u32,
        by: DiscardedByV1,
        branch_kept: bool,
    },
    /// `Event::VerifyStarted` (#33).
    VerifyStarted { task: u32, attempt: u32 },
    /// `Event::VerifyEnded` (#33).
    VerifyEnded {
        task: u32,
        attempt: u32,
        verdict: VerdictV1,
    },
    /// `Event::SandboxNet` (#34).
    SandboxNet {
        task: u32,
        attempt: u32,
        flows: Vec<FlowV1>,
    },
}

/// Mirrors `sortie_core::sandbox_net::Flow` (#34). Never remove or reorder a field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FlowV1 {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) allowed: bool,
    pub(crate) count: u32,
    pub(crate) bytes_out: u64,
    pub(crate) bytes_in: u64,
}

/// Mirrors `sortie_core::verify::Verdict` (#33). Never remove or reorder a field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VerdictV1 {
    pub(crate) passed: bool,
    pub(crate) score: u32,
    pub(crate) exit: Option<i32>,
    pub(crate) digest: u64,
    pub(crate) error: Option<String>,
}

/// Mirrors `sortie_core::DiscardedBy`. Never remove or reorder a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DiscardedByV1 {
    Discard,
    Gc,
    Pick,
}

impl From<DiscardedBy> for DiscardedByV1 {
    fn from(by: DiscardedBy) -> Self {
        match by {
            DiscardedBy::Discard => DiscardedByV1::Discard,
            DiscardedBy::Gc => DiscardedByV1::Gc,
            DiscardedBy::Pick => DiscardedByV1::Pick,
        }
    }
}

impl From<DiscardedByV1> for DiscardedBy {
    fn from(by: DiscardedByV1) -> Self {
        match by {
            DiscardedByV1::Discard => DiscardedBy::Discard,
            DiscardedByV1::Gc => DiscardedBy::Gc,
            DiscardedByV1::Pick => DiscardedBy::Pick,
        }
    }
}

/// Reads a `String` as a borrowed `str` copied once: for `String` itself, bincode zeroes a
/// buffer, then copies the bytes into it (a third of the decoding of a small record). The same
/// bytes give the same string; for the hot fields of the records a run writes most.
fn string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    /// Takes a borrowed or an owned string.
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<String, E> {
            Ok(v)
        }
    }
    d.deserialize_str(Text)
}

/// [`string`] of an `Option<String>`.
fn option_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    /// None, or a string read by [`string`].
    struct MaybeText;
    impl<'de> serde::de::Visitor<'de> for MaybeText {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an optional string")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
            string(d).map(Some)
        }
    }
    d.deserialize_option(MaybeText)
}

impl StoredEvent {
    /// The variant this build writes for `e`: as [`StoredEvent::from`] (which `sortie export`
    /// prints), but a run's start with each distinct task body once (`RunStartedShared`).
    pub(crate) fn to_write(e: &Event) -> Self {
        let Event::RunStarted {
            run_id,
            batch,
            batch_digest,
            host,
            pid,
        } = e
        else {
            return StoredEvent::from(e);
        };
        let (run_id, host) = (run_id.as_str().to_owned(), host.clone());
        let (batch, batch_digest, pid) = (batch.into(), *batch_digest, *pid);
        StoredEvent::RunStartedShared {
            run_id,
            batch,
            batch_digest,
            host,
            pid,
        }
    }
}

/// Mirrors `sortie_core::ControlAction`. Never remove or reorder a variant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ControlActionV1 {
    Hold { task: Option<u32> },
    Release { task: Option<u32> },
    Cancel { task: Option<u32> },
    Steer { task: u32, message: String },
    Concurrency { n: u32 },
}

impl From<&ControlAction> for ControlActionV1 {
    fn from(a: &ControlAction) -> Self {
        match a {
            ControlAction::Hold { task } => ControlActionV1::Hold {
                task: task.map(|t| t.0),
            },
            ControlAction::Release { task } => ControlActionV1::Release {
                task: task.map(|t| t.0),
            },
            ControlAction::Cancel { task } => ControlActionV1::Cancel {
                task: task.map(|t| t.0),
            },
            ControlAction::Steer { task, message } => ControlActionV1::Steer {
                task: task.0,
                message: message.clone(),
            },
            ControlAction::Concurrency { n } => ControlActionV1::Concurrency { n: *n },
        }
    }
}

impl From<ControlActionV1> for ControlAction {
    fn from(a: ControlActionV1) -> Self {
        match a {
            ControlActionV1::Hold { task } => ControlAction::Hold {
                task: task.map(TaskId),
            },
            ControlActionV1::Release { task } => ControlAction::Release {
                task: task.map(TaskId),
            },
            ControlActionV1::Cancel { task } => ControlAction::Cancel {
                task: task.map(TaskId),
            },
            ControlActionV1::Steer { task, message } => ControlAction::Steer {
                task: TaskId(task),
                message,
            },
            ControlActionV1::Concurrency { n } => ControlAction::Concurrency { n },
        }
    }
}

impl From<&Event> for StoredEvent {
    fn from(e: &Event) -> Self {
        match e {
            Event::RunStarted {
                run_id,
                batch,
                batch_digest,
                host,
                pid,
            } => StoredEvent::RunStartedV2 {
                run_id: run_id.as_str().to_owned(),
                batch: batch.into(),
                batch_digest: *batch_digest,
                host: host.clone(),
                pid: *pid,
            },
            Event::RunResumed { pid, from_seq } => StoredEvent::RunResumed {
                pid: *pid,
                from_seq: from_seq.0,
            },
            Event::RunInterrupted { reason } => StoredEvent::RunInterrupted {
                reason: reason.clone(),
            },
            Event::RunFinished { state, summary } => StoredEvent::RunFinished {
                state: (*state).into(),
                summary: summary.clone(),
            },
            Event::TaskQueued { task } => StoredEvent::TaskQueued { task: task.0 },
            Event::TaskSetUp { task, worktree } => StoredEvent::TaskSetUp {
                task: task.0,
                worktree: worktree.clone(),
            },
            Event::RetryScheduled {
                task,
                next_attempt,
                model,
                delay,
                reason,
            } => StoredEvent::RetryScheduled {
                task: task.0,
                next_attempt: next_attempt.0,
                model: model.clone(),
                delay: (*delay).into(),
                reason: reason.clone(),
            },
            Event::ArtifactWritten {
                task,
                path,
                bytes,
                digest,
            } => StoredEvent::ArtifactWritten {
                task: task.0,
                path: path.clone(),
                bytes: *bytes,
                digest: *digest,
            },
            Event::WorktreeFinalized {
                task,
                changed,
                diff,
            } => StoredEvent::WorktreeFinalized {
                task: task.0,
                changed: *changed,
                diff: diff.clone(),
            },
            Event::TaskFinished { task, result } => StoredEvent::TaskFinishedV2 {
                task: task.0,
                result: result.into(),
            },
            Event::WorktreePlanned {
                task,
                repo,
                path,
                branch,
                base,
            } => StoredEvent::WorktreePlanned {
                task: task.0,
                repo: repo.clone(),
                path: path.clone(),
                branch: branch.clone(),
                base: base.clone(),
            },
            Event::RunBudgetWarned { limit, used, of } => StoredEvent::RunBudgetWarned {
                limit: (*limit).into(),
                used: *used,
                of: *of,
            },
            Event::RunBudgetExceeded { limit, reason } => StoredEvent::RunBudgetExceeded {
                limit: (*limit).into(),
                reason: reason.clone(),
            },
            Event::Control { by, action } => StoredEvent::Control {
                by: by.clone(),
                action: action.into(),
            },
            Event::RunRerunOf { parent } => StoredEvent::RunRerunOf {
                parent: parent.as_str().to_owned(),
            },
            Event::RunRecovered {
                kept,
                scanned,
                lost,
                restored,
                damaged,
            } => StoredEvent::RunRecovered {
                kept: *kept,
                scanned: *scanned,
                lost: *lost,
                restored: restored.iter().map(|(t, a)| (t.0, a.0)).collect(),
                damaged: damaged.clone(),
            },
            Event::TaskCarried {
                task,
                result,
                usage,
            } => StoredEvent::TaskCarried {
                task: task.0,
                result: result.into(),
                usage: usage.into(),
            },
            Event::WorktreeDiscarded {
                task,
                by,
                branch_kept,
            } => StoredEvent::WorktreeDiscarded {
                task: task.0,
                by: (*by).into(),
                branch_kept: *branch_kept,
            },
            Event::VerifyStarted { .. } | Event::VerifyEnded { .. } => stored_verify_event(e),
            Event::SandboxNet { .. } => stored_net_event(e),
            Event::AttemptLaunching { .. }
            | Event::AttemptStarted { .. }
            | Event::AttemptProgress { .. }
            | Event::AttemptStalled { .. }
            | Event::AttemptFinished { .. }
            | Event::AttemptOrphaned { .. }
            | Event::AttemptSideEffects { .. }
            | Event::AttemptContinues { .. }
            | Event::AttemptPlaced { .. }
            | Event::AttemptHandle { .. }
            | Event::AttemptAdopted { .. }
            | Event::AttemptRecorded { .. }
            | Event::AttemptRead { .. }
            | Event::AttemptSession { .. }
            | Event::AttemptWaiting { .. } => stored_attempt_event(e),
        }
    }
}

/// #34: a sandboxed attempt's connections.
fn stored_net_event(e: &Event) -> StoredEvent {
    let Event::SandboxNet {
        task,
        attempt,
        flows,
    } = e
    else {
        unreachable!("`From<&Event>` sends only `SandboxNet` here")
    };
    StoredEvent::SandboxNet {
        task: task.0,
        attempt: attempt.0,
        flows: flows
            .iter()
            .map(|f| FlowV1 {
                host: f.host.clone(),
                port: f.port,
                allowed: f.allowed,
                count: f.count,
                bytes_out: f.bytes_out,
                bytes_in: f.bytes_in,
            })
            .collect(),
    }
}

/// An attempt's event in its stored form (the attempt events of [`StoredEvent::from`]).
/// #33: a check's events.
fn stored_verify_event(e: &Event) -> StoredEvent {
    match e {
        Event::VerifyStarted { task, attempt } => StoredEvent::VerifyStarted {
            task: task.0,
            attempt: attempt.0,
        },
        Event::VerifyEnded {
            task,
            attempt,
            verdict,
        } => StoredEvent::VerifyEnded {
            task: task.0,
            attempt: attempt.0,
            verdict: VerdictV1 {
                passed: verdict.passed,
                score: verdict.score,
                exit: verdict.exit,
                digest: verdict.digest,
                error: verdict.error.clone(),
            },
        },
        _ => unreachable!("`From<&Event>` sends only a check's events here"),
    }
}

fn stored_attempt_event(e: &Event) -> StoredEvent {
    match e {
        Event::AttemptLaunching {
            task,
            attempt,
            model,
        } => StoredEvent::AttemptLaunching {
            task: task.0,
            attempt: attempt.0,
            model: model.clone(),
        },
        Event::AttemptStarted {
            task,
            attempt,
            pid,
            start_time,
        } => StoredEvent::AttemptStarted {
            task: task.0,
            attempt: attempt.0,
            pid: *pid,
            start_time: *start_time,
        },
        Event::AttemptProgress {
            task,
            attempt,
            usage,
        } => StoredEvent::AttemptProgress {
            task: task.0,
            attempt: attempt.0,
            usage: usage.into(),
        },
        Event::AttemptStalled { task, attempt } => StoredEvent::AttemptStalled {
            task: task.0,
            attempt: attempt.0,
        },
        Event::AttemptFinished {
            task,
            attempt,
            outcome,
            usage,
            output,
        } => StoredEvent::AttemptFinishedV2 {
            task: task.0,
            attempt: attempt.0,
            outcome: outcome.into(),
            usage: usage.into(),
            output: output.clone(),
        },
        Event::AttemptOrphaned {
            task,
            attempt,
            action,
        } => StoredEvent::AttemptOrphaned {
            task: task.0,
            attempt: attempt.0,
            action: (*action).into(),
        },
        Event::AttemptSideEffects { task, attempt } => StoredEvent::AttemptSideEffects {
            task: task.0,
            attempt: attempt.0,
        },
        Event::AttemptContinues {
            task,
            attempt,
            session,
        } => StoredEvent::AttemptContinues {
            task: task.0,
            attempt: attempt.0,
            session: session.clone(),
        },
        Event::AttemptPlaced {
            task,
            attempt,
            executor,
            dir,
        } => StoredEvent::AttemptPlaced {
            task: task.0,
            attempt: attempt.0,
            executor: executor.clone(),
            dir: dir.clone(),
        },
        Event::AttemptHandle {
            task,
            attempt,
            handle,
        } => StoredEvent::AttemptHandle {
            task: task.0,
            attempt: attempt.0,
            handle: handle.clone(),
        },
        Event::AttemptAdopted {
            task,
            attempt,
            offset,
        } => StoredEvent::AttemptAdopted {
            task: task.0,
            attempt: attempt.0,
            offset: *offset,
        },
        Event::AttemptRecorded { task, attempt } => StoredEvent::AttemptRecorded {
            task: task.0,
            attempt: attempt.0,
        },
        Event::AttemptRead {
            task,
            attempt,
            offset,
        } => StoredEvent::AttemptRead {
            task: task.0,
            attempt: attempt.0,
            offset: *offset,
        },
        Event::AttemptSession {
            task,
            attempt,
            session,
        } => StoredEvent::AttemptSession {
            task: task.0,
            attempt: attempt.0,
            session: session.clone(),
        },
        Event::AttemptWaiting { task, attempt } => StoredEvent::AttemptWaiting {
            task: task.0,
            attempt: attempt.0,
        },
        _ => unreachable!("`From<&Event>` sends only an attempt's events here"),
    }
}
