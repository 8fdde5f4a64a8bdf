//! How a child ended, as its monitor (or a supervised attempt's follower) publishes it once
//! the leader is reaped: the exit, or why it cannot be known.

use sortie_protocol::Exit;

/// What the monitor publishes once the leader is reaped.
pub(crate) type ExitSlot = Option<Result<Exit, WaitError>>;

/// Why how a child ended cannot be known: waiting on its leader failed (or the runtime is
/// shutting down).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot learn how process {pid} ended: {message}")]
pub struct WaitError {
    /// The leader's pid.
    pub pid: u32,
    /// What went wrong.
    pub message: String,
    /// The leader's start time when its supervisor is gone without recording its exit: the
    /// agent may run on, reparented, and is the attempt's to stop before anything is retried.
    pub orphan: Option<u64>,
}
