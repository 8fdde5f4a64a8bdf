//! sortie-runner: everything that touches processes, clocks and the filesystem outside the
//! journal: batch loading, spawning and stopping attempts, protocol readers, the scheduler and
//! resume.
//!
//! Invariant: the runner never mutates run state directly. It decides an event, checks it
//! against the state, appends it to the journal (durable on return), then applies it.

mod admission;
mod agent;
mod attempt;
pub mod batch;
pub mod clock;
pub mod engine;
mod error;
pub mod kept;
pub mod process;
mod prompt;
pub mod protocol;
pub mod statedir;
pub mod worktree;

pub use error::{Error, Result};
