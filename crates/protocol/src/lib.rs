//! sortie-protocol: the protocol readers. They turn an attempt's stdout lines into progress
//! (usage, activity, side effects) and, once the process has ended, its [`Exit`] and the tail of
//! its stderr into the attempt's outcome, usage and text.
//!
//! A reader sees every stdout line (without its newline) through [`ProtocolReader::line`], then
//! [`ProtocolReader::finish`] with the exit and the tail of stderr. A reader cannot know whether
//! sortie sent the signal that ended a process, so it calls every signal unexpected; when
//! sortie stopped the attempt itself, the caller applies [`Finished::stopped_by`].
//!
//! Invariant: this crate knows nothing about tokio, processes, files or the journal. It is pure:
//! lines and an exit in, progress and an outcome out, and no input makes a reader panic.
//!
//! # Where things are
//!
//! - this file: what every reader shares ([`ProtocolReader`], [`Progress`], [`RunPhase`];
//!   [`Finished`] is core's, where an attempt's outcome is composed) and [`reader_for`], the
//!   one place that maps a [`Protocol`] to its reader;
//! - `exit`: [`Exit`], how a process ended (the spawner produces it, the readers read it);
//! - `plain`: the `plain` protocol (any command; its `SORTIE_USAGE` and `SORTIE_ERROR` lines);
//! - [`pi`], [`claude`], [`codex`]: the agent protocols, one file per agent CLI;
//! - `classify`: the one set of rules that classifies an agent run, and the classification of a
//!   provider's error text ([`classify_provider_error`], [`classify_http_status`]);
//! - `shared`: the helpers the readers share (output text fallbacks, activity texts, the
//!   progress gate, a tolerant JSON line parse, token counts).
//!
//! # Agent protocols
//!
//! [`pi`] reads `pi --mode json`, [`claude`] reads `claude -p --output-format stream-json
//! --verbose`, [`codex`] reads `codex exec --json`. Each reduces a stream to an agent run
//! summary that one set of rules classifies (`classify_agent`, whose table docs/agents.md
//! shows); the text of a provider error is classified by [`classify_provider_error`].
//! docs/agents.md describes the streams and the edge cases.

use sortie_core::{Protocol, Usage};

mod classify;
pub mod claude;
pub mod codex;
mod exit;
pub mod pi;
mod plain;
// #14: shared rate limits.
pub mod rate_limit;
mod shared;
// #13: sessions.
mod rebased;
// #37: a cost priced by sortie.
mod priced;

pub use classify::{classify_http_status, classify_provider_error};
pub use exit::Exit;
pub use priced::priced;
pub use rebased::rebased;
pub use shared::last_lines;
/// The end of an attempt as a reader saw it: core's, where the outcome is composed.
pub use sortie_core::decide::Finished;
// #14: shared rate limits.
pub use rate_limit::{mark_rate_limit, rate_limit};

/// The longest stdout line the runner delivers whole (its `process::MAX_LINE_BYTES`): a longer
/// one reaches a reader cut to this many bytes.
pub const LINE_LIMIT_BYTES: usize = 1 << 20;

/// How much of a plain command's stdout is kept as its output text.
pub const MAX_PLAIN_OUTPUT: usize = 1 << 20;
/// How many stderr lines the output falls back to when there is neither text nor error.
pub const STDERR_FALLBACK_LINES: usize = 20;
/// How many bytes of stderr the output falls back to, at most.
pub const STDERR_FALLBACK_BYTES: usize = 4096;

/// What a stdout line told about the running attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The attempt's usage so far (cumulative, never going backwards).
    pub usage: Usage,
    /// True once the agent has run a side-effecting tool (bash, write, edit).
    pub side_effects: bool,
    /// A short description of what the agent is doing, for status displays.
    pub activity: Option<String>,
}

/// Reads one attempt's stdout in a given protocol.
///
/// Implementations are fed every stdout line in order, then finished once with the exit.
/// They must never panic on any input: a line they cannot read is counted in
/// [`ProtocolReader::parse_errors`].
pub trait ProtocolReader: Send {
    /// Reads one stdout line (without its newline). Returns progress when the line tells
    /// something about the attempt (usage, activity, side effects).
    fn line(&mut self, line: &str) -> Option<Progress>;

    /// Classifies the attempt from everything read, its exit and the tail of its stderr.
    fn finish(self: Box<Self>, exit: Exit, stderr_tail: &str) -> Finished;

    /// #10: lines this reader never saw were counted before: a resumed attempt's transcript was
    /// cut (its cap) below the offset the journal had read it to, and `usage` is what those
    /// lines reported (the journaled checkpoint less what the reader made of the lines it
    /// read up to that offset). The reader counts it as if it had read them; a reader whose
    /// readings are running totals of the whole run needs nothing (its next total covers them).
    fn seed(&mut self, usage: Usage);

    /// How many lines could not be parsed so far.
    fn parse_errors(&self) -> u64 {
        0
    }

    /// Where the agent's run stands, as far as the stream tells. Only agents driven over stdin
    /// need it (they run until their stdin closes, so sortie closes it once the run ended);
    /// readers that cannot tell say [`RunPhase::Unknown`].
    fn run_phase(&self) -> RunPhase {
        RunPhase::Unknown
    }

    /// The agent's own id of the conversation the attempt is in, once the stream named it
    /// (#13: Claude Code's `session_id`, Codex's `thread_id`), so that a later attempt can
    /// resume it. None: not named (yet), or the agent names none on stdout.
    fn session(&self) -> Option<&str> {
        None
    }

    // Issue 13: structured results.
    /// The agent's last final answer so far, when the reader can tell (an agent driven over
    /// stdin has its answer checked before its stdin is closed).
    fn answer(&self) -> Option<String> {
        None
    }
}

/// Where an agent's run stands (see [`ProtocolReader::run_phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunPhase {
    /// The reader cannot tell.
    Unknown,
    /// The agent is working: a turn is in progress, or its last message called tools.
    Working,
    /// Its last message was a final answer; the end of the run has not been seen yet.
    Answered,
    /// The run ended (for now: an agent may still retry a failed call by itself).
    Ended {
        /// Whether its last message failed.
        failed: bool,
    },
}

/// The reader for a protocol.
pub fn reader_for(protocol: Protocol) -> Box<dyn ProtocolReader> {
    match protocol {
        Protocol::Plain => Box::new(plain::PlainReader::default()),
        Protocol::PiJson | Protocol::PiRpc => Box::new(pi::PiReader::default()),
        Protocol::ClaudeStreamJson => Box::new(claude::ClaudeReader::default()),
        Protocol::CodexJson => Box::new(codex::CodexReader::default()),
    }
}
