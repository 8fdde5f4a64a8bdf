//! Attempt processes: rendering an agent's argv, the one function that spawns a child, reading
//! its output, stopping it, and hunting the orphans of a crashed run.
//!
//! Invariants:
//! - [`spawn`] (attempts) and [`run_tool`] (short-lived tools such as git) are the only places
//!   in sortie that create a `Command` (clippy bans it elsewhere). No shell is ever involved:
//!   the argv is executed as is.
//! - A child runs in its own process group, with stdin `/dev/null` (or, from [`spawn_piped`],
//!   a pipe the caller writes lines to: agents driven over stdin), stdout and stderr piped,
//!   and our environment plus the spec's variables plus a marker variable by which a crashed
//!   run's children are found again ([`find_marked`]).
//! - The group leader is always reaped, by a monitor task. The monitor first sees the exit
//!   without reaping (`waitid` with `WNOWAIT`): while the leader is an unreaped zombie its pid,
//!   and so its group id, cannot be reused. In that window it SIGKILLs whatever is left of the
//!   group (an attempt leaves nothing behind), then reaps the leader under the same lock that
//!   every signal sender takes: sortie never signals a group whose leader it has reaped.
//! - Signals also pass the pid-reuse guard: the pid's start time (`/proc/<pid>/stat`, field
//!   22) must still be the one recorded at spawn.
//! - Dropping a [`Child`] SIGKILLs its group unless the leader was already reaped.
//! - Output is read concurrently: stdout as lines of at most [`MAX_LINE_BYTES`] (a longer line
//!   is delivered cut, flagged `truncated`, and the rest of it skipped), decoded lossily;
//!   stderr into a tail buffer of the last [`STDERR_TAIL_BYTES`].
//!
//! A process that left the group (`setsid`) and keeps the pipes open cannot hold an attempt
//! forever: readers stop [`DRAIN_AFTER_EXIT`] after the leader exited.
//!
//! The files, one reason to change each: `argv.rs` renders an argv template; `spawn.rs` is the
//! one spawn function (process group, environment, stdin); `child.rs` is the running child
//! (its monitor, `waitid` with `WNOWAIT`, and the [`Stopper`]: TERM, grace, KILL behind the
//! pid-reuse guard); `lines.rs` reads its output (bounded lines, stderr tail); `procfs.rs`
//! reads `/proc` (stat, environ, [`find_marked`]); `orphan.rs` kills what a crashed run left;
//! `tool.rs` runs short-lived tools ([`run_tool`], for git); `transcript.rs` keeps an
//! attempt's output files under their cap and reads them back across the cut.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::unistd::Pid;

// The one import from the readers: how a process ended.
use sortie_protocol::Exit;

mod argv;
mod child;
mod detach;
mod follow;
mod host;
mod lines;
mod marker;
mod orphan;
mod procfs;
// #10: programs found on PATH once.
mod resolve;
mod spawn;
mod supervise;
// #10: the per-run shepherd and sortie's side of it.
mod shepherd;
mod shepherd_client;
mod status_log;
mod tool;
// #10: transcripts kept under a cap
mod transcript;

pub use argv::{RenderError, SESSION_ARGS, Vars, expand_element, render_argv};
pub use child::{Child, Stopper, WaitError};
pub use detach::{run_hook, run_hook_in, spawn_detached_with};
pub use follow::{Followed, Watcher};
pub use host::{hostname, survive_file_size_limit};
pub use lines::Line;
pub(crate) use lines::LineSplitter;
pub use marker::{MARKER, kill_marked, marker};
pub use orphan::{KillResult, kill_group_if_same, signal_group_if_same};
pub use procfs::{MarkedProcess, find_marked, is_running, process_start_time};
pub use spawn::{
    SpawnError, SpawnSpec, Stdin, spawn, spawn_piped, spawn_stdin_file, spawn_transcribed,
};
pub use supervise::{
    AttemptFiles, DirPresence, EXIT_FILE, STARTED_FILE, STDERR_FILE, STDIN_CLOSE, STDIN_FIFO,
    STDOUT_FILE, SUPERVISE_ARG, SUPERVISOR_MARKER, StartedFile, SupervisorChild, presence,
    read_exit, read_started, spawn_supervised, supervise_main,
};
pub use tool::{ToolError, ToolOutput, run_tool};
pub(crate) use transcript::{CHECK_EVERY, Trimmer};
// #10: the per-run shepherd.
pub use shepherd::{SHEPHERD_ARG, SHEPHERD_MARKER, SWEEP_EVERY, shepherd_main};
pub use shepherd_client::{Forget, Shepherded, release_shepherds, spawn_shepherded};
pub use transcript::{
    CAP_VAR, Cap, Cut, DEFAULT_CAP, HARD_FACTOR, Kept, KeptReader, WholeLines, ack_moves, cut_file,
    read_cut, read_file, read_step, trim_ended, write_read,
};

/// The longest stdout line delivered whole; longer lines are cut to this and flagged.
pub const MAX_LINE_BYTES: usize = sortie_protocol::LINE_LIMIT_BYTES;
/// How much of stderr is kept (the end of it).
pub const STDERR_TAIL_BYTES: usize = 50 * 1024;
/// How long the output readers keep reading after the leader exited (for pipes held open by a
/// process that left the group).
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// How long [`kill_group_if_same`] and [`Stopper::stop`] wait after SIGKILL before they give up.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What the monitor publishes once the leader is reaped.
type ExitSlot = Option<Result<Exit, WaitError>>;

/// Locks a mutex, taking the data of a poisoned one (its holders never leave it half done).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}
