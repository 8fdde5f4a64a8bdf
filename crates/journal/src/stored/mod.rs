//! The on-disk schema, format v1: every type nested in `StoredEvent` (`event`), and v2 (`v2`).
//!
//! These types mirror `sortie_core::Event` field by field but belong to the journal, so that core
//! can evolve without silently changing what is on disk. Conversions are explicit: `From<&Event>`
//! to store, `TryFrom<StoredEvent>` to read back (a stored value that core refuses, such as an
//! invalid run id or a malformed duration, is a decoding error, not a panic).
//!
//! Rules for this file: variants are never removed or reordered, fields never change type. A
//! change to core's event gets a new variant or a new format version (a `v2` module with its own
//! fixture), never an edit here, except one line per field added to a core struct since v1: its
//! default for v1 records, in the v1 conversion (see `v2`).
//!
//! `sortie export` prints these types as JSON (see `export`), so their field and variant names
//! are a public format too: they are the names core had when v1 was frozen, spelled as core's
//! serde attributes spelled them (bincode ignores names, so the `rename_all`s change nothing on
//! disk). Never rename one; `tests/export.rs` pins the JSON.

mod event;
mod event_read;
mod v2;
mod v2_run;
mod v2_task;

pub(crate) use event::StoredEvent;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sortie_core::spec::{AgentProfile, Batch, MaxOutput, RunConfig, SpecBody};
use sortie_core::{
    AttemptOutcome, AttemptStatus, Cost, Isolation, OrphanAction, OutputMode, Phase, Protocol,
    RunOutcome, StopReason, TaskResult, TaskSpec, TerminalState, Usage,
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
    // Copy (#14) was appended after the v1 and v2 fixtures: the earlier variants encode as before.
    IsolationV1 <=> Isolation { None, Worktree, Copy }
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
        // #33: appended after the fixtures.
        Verify,
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
            supervise: true,
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
        let body = SpecBody {
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
            retry_timeouts: false,
            verify: None,
            verify_timeout: Duration::from_secs(sortie_core::verify::DEFAULT_TIMEOUT_SECS),
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
        };
        Ok(TaskSpec {
            label: t.label,
            prompt: t.prompt,
            body: std::sync::Arc::new(body),
        })
    }
}

/// Mirrors `sortie_core::spec::RunConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunConfigV1 {
    concurrency: u32,
    fail_fast: bool,
}

impl From<&RunConfig> for RunConfigV1 {
    fn from(c: &RunConfig) -> Self {
        RunConfigV1 {
            concurrency: c.concurrency,
            fail_fast: c.fail_fast,
        }
    }
}

impl From<RunConfigV1> for RunConfig {
    fn from(c: RunConfigV1) -> Self {
        RunConfig {
            concurrency: c.concurrency,
            fail_fast: c.fail_fast,
            budget: sortie_core::RunBudget::default(),
            pools: std::collections::BTreeMap::new(),
            on_task_end: None,
            // #37: a run from before prices priced nothing.
            prices: Box::default(),
        }
    }
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
            config: (&b.config).into(),
            source: b.source.clone(),
        }
    }
}

impl TryFrom<BatchV1> for Batch {
    type Error = String;
    fn try_from(b: BatchV1) -> Result<Self, String> {
        // Tasks alike share one body as they are decoded (the journal stores each whole).
        let mut sharer = sortie_core::BodySharer::default();
        Ok(Batch {
            tasks: b
                .tasks
                .into_iter()
                .map(|t| {
                    let mut spec = TaskSpec::try_from(t)?;
                    sharer.share(&mut spec);
                    Ok(spec)
                })
                .collect::<Result<_, String>>()?,
            agents: b.agents.into_iter().map(|(k, v)| (k, v.into())).collect(),
            config: b.config.into(),
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
            denials: vec![],
            rate_limited: false,
            retry_after_ms: None,
            result: None,
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
            result: None,
        }
    }
}
