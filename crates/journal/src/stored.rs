//! The on-disk schema, format v1: `StoredEvent` and every type nested in it.
//!
//! These types mirror `sortie_core::Event` field by field but belong to the journal, so that core
//! can evolve without silently changing what is on disk. Conversions are explicit: `From<&Event>`
//! to store, `TryFrom<StoredEvent>` to read back (a stored value that core refuses, such as an
//! invalid run id or a malformed duration, is a decoding error, not a panic).
//!
//! Rules for this file: variants are never removed or reordered, fields never change type. A
//! change to core's event gets a new variant or a new format version (a `v2` module with its own
//! fixture), never an edit here.
//!
//! `sortie export` prints these types as JSON (see `export`), so their field and variant names
//! are a public format too: they are the names core had when v1 was frozen, spelled as core's
//! serde attributes spelled them (bincode ignores names, so the `rename_all`s change nothing on
//! disk). Never rename one; `tests/export.rs` pins the JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sortie_core::spec::{AgentProfile, Batch, MaxOutput, RunConfig};
use sortie_core::{
    Attempt, AttemptOutcome, AttemptStatus, Cost, Event, Isolation, OrphanAction, OutputMode,
    Phase, Protocol, RunId, RunOutcome, Seq, StopReason, TaskId, TaskResult, TaskSpec,
    TerminalState, Usage,
};

/// A record's payload: the event with its seq and time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecordV1 {
    /// The seq, repeated from the key so that a misplaced record is detected.
    pub(crate) seq: u64,
    /// Milliseconds since the Unix epoch.
    pub(crate) at: u64,
    /// The event.
    pub(crate) event: StoredEvent,
}

/// A duration as whole seconds plus nanoseconds (below 1e9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurationV1 {
    secs: u64,
    nanos: u32,
}

impl From<Duration> for DurationV1 {
    fn from(d: Duration) -> Self {
        DurationV1 {
            secs: d.as_secs(),
            nanos: d.subsec_nanos(),
        }
    }
}

impl TryFrom<DurationV1> for Duration {
    type Error = String;
    fn try_from(d: DurationV1) -> Result<Self, String> {
        if d.nanos >= 1_000_000_000 {
            return Err(format!("duration with {} nanoseconds", d.nanos));
        }
        Ok(Duration::new(d.secs, d.nanos))
    }
}

/// Mirrors `sortie_core::Cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CostV1 {
    nanos: u64,
    unreported: u32,
}

/// Mirrors `sortie_core::Usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UsageV1 {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    reasoning: u64,
    cost: CostV1,
    turns: u32,
    context_tokens: u64,
}

impl From<&Usage> for UsageV1 {
    fn from(u: &Usage) -> Self {
        UsageV1 {
            input: u.input,
            output: u.output,
            cache_read: u.cache_read,
            cache_write: u.cache_write,
            reasoning: u.reasoning,
            cost: CostV1 {
                nanos: u.cost.nanos,
                unreported: u.cost.unreported,
            },
            turns: u.turns,
            context_tokens: u.context_tokens,
        }
    }
}

impl From<UsageV1> for Usage {
    fn from(u: UsageV1) -> Self {
        Usage {
            input: u.input,
            output: u.output,
            cache_read: u.cache_read,
            cache_write: u.cache_write,
            reasoning: u.reasoning,
            cost: Cost {
                nanos: u.cost.nanos,
                unreported: u.cost.unreported,
            },
            turns: u.turns,
            context_tokens: u.context_tokens,
        }
    }
}

/// Defines a fieldless enum mirroring a core enum, with conversions both ways.
macro_rules! mirror_enum {
    ($(#[$m:meta])* $name:ident <=> $core:ident { $($v:ident),+ $(,)? }) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        $(#[$m])*
        pub(crate) enum $name { $($v),+ }

        impl From<$core> for $name {
            fn from(x: $core) -> Self {
                match x { $($core::$v => $name::$v),+ }
            }
        }

        impl From<$name> for $core {
            fn from(x: $name) -> Self {
                match x { $($name::$v => $core::$v),+ }
            }
        }
    };
}

mirror_enum!(
    /// Mirrors `sortie_core::Isolation`.
    #[serde(rename_all = "snake_case")]
    IsolationV1 <=> Isolation { None, Worktree }
);
mirror_enum!(
    /// Mirrors `sortie_core::OutputMode`.
    #[serde(rename_all = "kebab-case")]
    OutputModeV1 <=> OutputMode { Inline, FileOnly }
);
mirror_enum!(
    /// Mirrors `sortie_core::Protocol`.
    // PiRpc was appended after the first v1 fixture: the earlier variants encode as before.
    #[serde(rename_all = "kebab-case")]
    ProtocolV1 <=> Protocol { Plain, PiJson, ClaudeStreamJson, CodexJson, PiRpc }
);
mirror_enum!(
    /// Mirrors `sortie_core::StopReason`.
    #[serde(rename_all = "snake_case")]
    StopReasonV1 <=> StopReason {
        Completed, NonzeroExit, Error, ModelError, ProtocolError, UnexpectedSignal, SpawnError,
        Stalled, Timeout, Budget, Cancelled, Interrupted, SetupError, Invalid,
    }
);
mirror_enum!(
    /// Mirrors `sortie_core::Phase`.
    #[serde(rename_all = "snake_case")]
    PhaseV1 <=> Phase { Queued, Starting, Running }
);
mirror_enum!(
    /// Mirrors `sortie_core::AttemptStatus`.
    #[serde(rename_all = "snake_case")]
    AttemptStatusV1 <=> AttemptStatus { Completed, Partial, Failed }
);
mirror_enum!(
    /// Mirrors `sortie_core::TerminalState`.
    #[serde(rename_all = "snake_case")]
    TerminalStateV1 <=> TerminalState { Completed, Partial, Failed, Timeout, Cancelled, Skipped }
);
mirror_enum!(
    /// Mirrors `sortie_core::RunOutcome`.
    #[serde(rename_all = "snake_case")]
    RunOutcomeV1 <=> RunOutcome { Completed, Partial, Failed, Timeout, Cancelled }
);
mirror_enum!(
    /// Mirrors `sortie_core::OrphanAction`.
    #[serde(rename_all = "snake_case")]
    OrphanActionV1 <=> OrphanAction { Killed, Gone }
);

/// Mirrors `sortie_core::spec::MaxOutput`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MaxOutputV1 {
    bytes: u64,
    lines: u64,
}

/// Mirrors `sortie_core::spec::AgentProfile`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AgentProfileV1 {
    name: String,
    command: Vec<String>,
    model_args: Vec<String>,
    protocol: ProtocolV1,
    env_keys: Vec<String>,
    can_steer: bool,
    can_continue: bool,
    may_write: bool,
}

impl From<&AgentProfile> for AgentProfileV1 {
    fn from(p: &AgentProfile) -> Self {
        AgentProfileV1 {
            name: p.name.clone(),
            command: p.command.clone(),
            model_args: p.model_args.clone(),
            protocol: p.protocol.into(),
            env_keys: p.env_keys.clone(),
            can_steer: p.can_steer,
            can_continue: p.can_continue,
            may_write: p.may_write,
        }
    }
}

impl From<AgentProfileV1> for AgentProfile {
    fn from(p: AgentProfileV1) -> Self {
        AgentProfile {
            name: p.name,
            command: p.command,
            model_args: p.model_args,
            protocol: p.protocol.into(),
            env_keys: p.env_keys,
            can_steer: p.can_steer,
            can_continue: p.can_continue,
            may_write: p.may_write,
        }
    }
}

/// Mirrors `sortie_core::TaskSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TaskSpecV1 {
    label: String,
    prompt: Option<String>,
    command: Option<Vec<String>>,
    agent: String,
    model: Option<String>,
    fallback_models: Vec<String>,
    max_retries: u32,
    attempt_timeout: DurationV1,
    deadline: Option<DurationV1>,
    stall_after: DurationV1,
    stall_kill_after: DurationV1,
    kill_grace: DurationV1,
    max_turns: Option<u32>,
    max_tokens: Option<u64>,
    max_cost_nanos: Option<u64>,
    grace_turns: u32,
    cwd: String,
    isolation: IsolationV1,
    include_wip: bool,
    output: Option<String>,
    output_mode: OutputModeV1,
    max_output: MaxOutputV1,
    reads: Vec<String>,
    needs: Vec<String>,
    env_keys: Vec<String>,
    retry_after_side_effects: bool,
}

impl From<&TaskSpec> for TaskSpecV1 {
    fn from(t: &TaskSpec) -> Self {
        TaskSpecV1 {
            label: t.label.clone(),
            prompt: t.prompt.clone(),
            command: t.command.clone(),
            agent: t.agent.clone(),
            model: t.model.clone(),
            fallback_models: t.fallback_models.clone(),
            max_retries: t.max_retries,
            attempt_timeout: t.attempt_timeout.into(),
            deadline: t.deadline.map(Into::into),
            stall_after: t.stall_after.into(),
            stall_kill_after: t.stall_kill_after.into(),
            kill_grace: t.kill_grace.into(),
            max_turns: t.max_turns,
            max_tokens: t.max_tokens,
            max_cost_nanos: t.max_cost_nanos,
            grace_turns: t.grace_turns,
            cwd: t.cwd.clone(),
            isolation: t.isolation.into(),
            include_wip: t.include_wip,
            output: t.output.clone(),
            output_mode: t.output_mode.into(),
            max_output: MaxOutputV1 {
                bytes: t.max_output.bytes,
                lines: t.max_output.lines,
            },
            reads: t.reads.clone(),
            needs: t.needs.clone(),
            env_keys: t.env_keys.clone(),
            retry_after_side_effects: t.retry_after_side_effects,
        }
    }
}

impl TryFrom<TaskSpecV1> for TaskSpec {
    type Error = String;
    fn try_from(t: TaskSpecV1) -> Result<Self, String> {
        Ok(TaskSpec {
            label: t.label,
            prompt: t.prompt,
            command: t.command,
            agent: t.agent,
            model: t.model,
            fallback_models: t.fallback_models,
            max_retries: t.max_retries,
            attempt_timeout: t.attempt_timeout.try_into()?,
            deadline: t.deadline.map(TryInto::try_into).transpose()?,
            stall_after: t.stall_after.try_into()?,
            stall_kill_after: t.stall_kill_after.try_into()?,
            kill_grace: t.kill_grace.try_into()?,
            max_turns: t.max_turns,
            max_tokens: t.max_tokens,
            max_cost_nanos: t.max_cost_nanos,
            grace_turns: t.grace_turns,
            cwd: t.cwd,
            isolation: t.isolation.into(),
            include_wip: t.include_wip,
            output: t.output,
            output_mode: t.output_mode.into(),
            max_output: MaxOutput {
                bytes: t.max_output.bytes,
                lines: t.max_output.lines,
            },
            reads: t.reads,
            needs: t.needs,
            env_keys: t.env_keys,
            retry_after_side_effects: t.retry_after_side_effects,
        })
    }
}

/// Mirrors `sortie_core::spec::RunConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunConfigV1 {
    concurrency: u32,
    fail_fast: bool,
}

/// Mirrors `sortie_core::Batch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BatchV1 {
    tasks: Vec<TaskSpecV1>,
    agents: BTreeMap<String, AgentProfileV1>,
    config: RunConfigV1,
    source: String,
}

impl From<&Batch> for BatchV1 {
    fn from(b: &Batch) -> Self {
        BatchV1 {
            tasks: b.tasks.iter().map(Into::into).collect(),
            agents: b
                .agents
                .iter()
                .map(|(k, v)| (k.clone(), v.into()))
                .collect(),
            config: RunConfigV1 {
                concurrency: b.config.concurrency,
                fail_fast: b.config.fail_fast,
            },
            source: b.source.clone(),
        }
    }
}

impl TryFrom<BatchV1> for Batch {
    type Error = String;
    fn try_from(b: BatchV1) -> Result<Self, String> {
        Ok(Batch {
            tasks: b
                .tasks
                .into_iter()
                .map(TryInto::try_into)
                .collect::<Result<_, _>>()?,
            agents: b.agents.into_iter().map(|(k, v)| (k, v.into())).collect(),
            config: RunConfig {
                concurrency: b.config.concurrency,
                fail_fast: b.config.fail_fast,
            },
            source: b.source,
        })
    }
}

/// Mirrors `sortie_core::AttemptOutcome`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AttemptOutcomeV1 {
    status: AttemptStatusV1,
    stop_reason: StopReasonV1,
    phase: Option<PhaseV1>,
    exit_code: Option<i32>,
    signal: Option<i32>,
    error: Option<String>,
    side_effects: bool,
}

impl From<&AttemptOutcome> for AttemptOutcomeV1 {
    fn from(o: &AttemptOutcome) -> Self {
        AttemptOutcomeV1 {
            status: o.status.into(),
            stop_reason: o.stop_reason.into(),
            phase: o.phase.map(Into::into),
            exit_code: o.exit_code,
            signal: o.signal,
            error: o.error.clone(),
            side_effects: o.side_effects,
        }
    }
}

impl From<AttemptOutcomeV1> for AttemptOutcome {
    fn from(o: AttemptOutcomeV1) -> Self {
        AttemptOutcome {
            status: o.status.into(),
            stop_reason: o.stop_reason.into(),
            phase: o.phase.map(Into::into),
            exit_code: o.exit_code,
            signal: o.signal,
            error: o.error,
            side_effects: o.side_effects,
        }
    }
}

/// Mirrors `sortie_core::TaskResult`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TaskResultV1 {
    state: TerminalStateV1,
    stop_reason: StopReasonV1,
    phase: Option<PhaseV1>,
    error: Option<String>,
    text: String,
}

impl From<&TaskResult> for TaskResultV1 {
    fn from(r: &TaskResult) -> Self {
        TaskResultV1 {
            state: r.state.into(),
            stop_reason: r.stop_reason.into(),
            phase: r.phase.map(Into::into),
            error: r.error.clone(),
            text: r.text.clone(),
        }
    }
}

impl From<TaskResultV1> for TaskResult {
    fn from(r: TaskResultV1) -> Self {
        TaskResult {
            state: r.state.into(),
            stop_reason: r.stop_reason.into(),
            phase: r.phase.map(Into::into),
            error: r.error,
            text: r.text,
        }
    }
}

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
            } => StoredEvent::RunStarted {
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
            } => StoredEvent::AttemptFinished {
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
            Event::TaskFinished { task, result } => StoredEvent::TaskFinished {
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
        }
    }
}

impl TryFrom<StoredEvent> for Event {
    type Error = String;
    fn try_from(e: StoredEvent) -> Result<Self, String> {
        Ok(match e {
            StoredEvent::RunStarted {
                run_id,
                batch,
                batch_digest,
                host,
                pid,
            } => Event::RunStarted {
                run_id: RunId::new(run_id).map_err(|e| e.to_string())?,
                batch: batch.try_into()?,
                batch_digest,
                host,
                pid,
            },
            StoredEvent::RunResumed { pid, from_seq } => Event::RunResumed {
                pid,
                from_seq: Seq(from_seq),
            },
            StoredEvent::RunInterrupted { reason } => Event::RunInterrupted { reason },
            StoredEvent::RunFinished { state, summary } => Event::RunFinished {
                state: state.into(),
                summary,
            },
            StoredEvent::TaskQueued { task } => Event::TaskQueued { task: TaskId(task) },
            StoredEvent::TaskSetUp { task, worktree } => Event::TaskSetUp {
                task: TaskId(task),
                worktree,
            },
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
        })
    }
}
