//! sortie-runner: everything that touches processes, clocks and the filesystem outside the
//! journal: spawning and stopping attempts, protocol readers, the scheduler and resume.
//! Batches load in `sortie-batch`, before any of this starts.
//!
//! Invariant: the runner never mutates run state directly. It decides an event, checks it
//! against the state, appends it to the journal (durable on return), then applies it.

pub mod agent_home;
mod attempt;
pub mod engine;
mod error;
pub mod kept;
pub mod process;
pub use sortie_protocol as protocol;
pub mod clock;
pub mod files;
pub mod layout;
pub mod worktree;

pub use error::{Error, Result};
/// Batch loading, which moved to its own crate; this alias keeps `sortie_runner::batch` paths
/// working until their users name `sortie_batch` themselves.
pub use sortie_batch as batch;
