//! sortie-runner: everything that touches processes, clocks and the filesystem outside the
//! journal: the run loop that performs core's plan, attempts and their watchdogs, agents,
//! processes, worktrees, the state dir's layout, and resume. Batches load in `sortie-batch`
//! and stdout is read by `sortie-protocol`, before and beside all this.
//!
//! Invariant: the runner performs, it does not decide. Core decides every event (the planner's
//! actions, an attempt's outcome, a report's news, a control request, the run's end, the
//! task-end hook); the runner gathers the facts core needs, checks each event against the
//! state, appends it to the journal (durable on return), applies it, and only then performs
//! the effects it announces. It never mutates run state directly.

mod agent;
mod attempt;
pub mod clock;
pub mod control;
pub mod detach;
pub mod engine;
mod error;
pub mod executor;
pub mod files;
pub mod layout;
pub mod preflight;
pub mod process;
pub mod recover;
pub mod slots;
// The programs that outlive sortie: the per-attempt supervisor and the per-run shepherd.
pub mod supervisor;
mod sync;
pub mod worktree;
// Issue 13: structured results.
mod structured;

// #10: the transcripts of a run's attempts: kept under a cap, followed, read.
pub mod transcript;
// #14: isolation = "copy".
pub mod copy;

pub use error::{Error, Result};
