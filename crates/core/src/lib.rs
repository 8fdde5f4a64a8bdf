//! sortie-core: the pure model of a sortie run.
//!
//! This crate owns the rules: the task spec and its validation, the event vocabulary, the run and
//! task state machine (`RunState::apply`), and the decisions (retry, fallback, aggregate state,
//! resume plan, an attempt's outcome from its facts, a task's budget and wrap-up, the rerun
//! selection, usage arithmetic, summary text) as pure functions.
//!
//! Invariants:
//! - no I/O, no clock, no randomness: time and jitter come in as data, so replaying the same
//!   events always gives the same state;
//! - `RunState::apply` either applies an event completely or rejects it with a [`Violation`] and
//!   leaves the state untouched; it never panics on any input.

pub mod agent_options;
pub mod bounds;
pub mod budget;
pub mod control;
pub mod decide;
pub mod digest;
pub mod event;
pub mod hook;
pub mod ids;
pub mod ledger;
pub mod outcome;
pub mod plan;
pub mod prices;
pub mod prompt;
pub mod recover;
pub mod rerun;
pub mod run_budget;
pub mod samples;
pub mod sandbox;
pub mod sandbox_net;
pub mod session;
pub mod spec;
pub mod state;
pub mod summary;
pub mod usage;
mod validate;
pub mod verify;
pub mod view;
// #11: where attempts run (Slurm).
pub mod slurm;
// #14: shared rate limits.
pub mod pool;

pub use decide::{
    NextStep, ResumePlan, backoff_delay, finish_result, is_transient, model_for_attempt, next_step,
    resume_plan,
};
pub use event::{BudgetLimit, ControlAction, DiscardedBy, Event, OrphanAction, Stamped};
pub use ids::{Attempt, RunId, Seq, TaskId, Timestamp};
pub use outcome::Denial;
pub use outcome::{
    AttemptOutcome, AttemptStatus, Phase, RunOutcome, StopReason, TaskResult, TerminalState,
    aggregate,
};
pub use plan::{Action, Facts, JobKind, Planner, RunEnding, Stopping};
pub use slurm::{Executor, ExecutorKind, Milli, RayOptions, SlurmOptions};
pub use spec::Permissions;
pub use spec::{
    AgentProfile, Batch, BodySharer, Isolation, MaxOutput, NeedsMode, OutputMode, Protocol,
    RunBudget, RunConfig, SpecBody, SpecError, TaskSpec, validate_batch,
};
pub use state::{
    AttemptRecord, PlannedWorktree, RunState, RunStatus, TaskRecord, TaskState, Violation,
};
// #10: attempts that outlive sortie.
pub use state::{Discarded, Found, OutcomeRecord, Placed, Recovery, TaskSteps};
pub use summary::summary_text;
pub use usage::{Cost, Usage};
// #14: shared rate limits.
pub use pool::{PoolSpec, PoolState, pool_of, provider_of, waiting_for_pool};
