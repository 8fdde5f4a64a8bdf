//! sortie-runner: everything that touches processes, clocks and the filesystem outside the
//! journal: batch loading, spawning and stopping attempts, protocol readers, the scheduler and
//! resume.
//!
//! Invariant: the runner never mutates run state directly. It decides an event, checks it
//! against the state, appends it to the journal (durable on return), then applies it.

pub mod batch;
pub mod process;
pub mod protocol;
