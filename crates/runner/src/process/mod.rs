//! Attempt processes: rendering an agent's argv, the one function that spawns a child, reading
//! its output, stopping it, and hunting the orphans of a crashed run.
//!
//! Invariants:
//! - [`spawn`] (attempts), [`run_tool`] (short-lived tools such as git), the detached
//!   processes of `detach.rs`, and the programs of the `supervisor` room (which outlive sortie)
//!   are the only places in sortie that create a `Command` (clippy bans it elsewhere). No shell
//!   is ever involved in an attempt: the argv is executed as is.
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
//! one spawn function (process group, environment, stdin); `stdin.rs` the write end of an
//! agent's stdin (a pipe, or a supervisor's FIFO); `exit.rs` how a child ended, as its
//! monitor publishes it; `resolve.rs` finds a program on
//! `PATH` once; `child.rs` is the running child (its monitor, `waitid` with `WNOWAIT`, and the
//! [`Stopper`]: TERM, grace, KILL behind the pid-reuse guard); `lines.rs` reads its output
//! (bounded lines, stderr tail); `procfs.rs` reads `/proc` (stat, environ, [`find_marked`]);
//! `orphan.rs` signals a group behind the pid-reuse guard; `adopt.rs` waits, as its new parent,
//! for an agent whose supervisor died while sortie lives; `marker.rs` names an attempt's
//! processes and kills what a crashed run left; `tool.rs` runs short-lived tools
//! ([`run_tool`], for git); `host.rs` the host's name and SIGXFSZ; `detach.rs` a detached run
//! and the task-end hook.
//!
//! Not here: the programs that outlive sortie (`supervisor`) and an attempt's transcript files
//! and their follower (`transcript`). Other rooms reach the internals they share with this one
//! through its `pub(crate)` modules (`child`, `exit`, `lines`, `procfs`, `resolve`, `spawn`).

mod adopt;
mod argv;
pub(crate) mod child;
mod detach;
pub(crate) mod exit;
mod host;
pub(crate) mod lines;
mod marker;
mod orphan;
pub(crate) mod procfs;
// #10: programs found on PATH once.
pub(crate) mod resolve;
pub(crate) mod spawn;
mod stdin;
mod tool;

pub use adopt::{become_subreaper, end_marked_children, wait_orphan};
pub use argv::{RenderError, SESSION_ARGS, Vars, expand_element, render_argv};
pub use child::{Child, Stopper};
pub use detach::{open_url, run_hook, run_hook_in, spawn_detached_with};
pub use exit::WaitError;
pub use host::{hostname, survive_file_size_limit};
pub use lines::{DRAIN_AFTER_EXIT, Line, MAX_LINE_BYTES, STDERR_TAIL_BYTES};
pub use marker::{MARKER, SUPERVISOR_MARKER, kill_marked, marker};
pub use orphan::{KillResult, kill_group_if_same, signal_group_if_same};
pub use procfs::{MarkedProcess, find_marked, is_running, process_start_time};
pub use spawn::{SpawnError, SpawnSpec, spawn, spawn_piped, spawn_stdin_file, spawn_transcribed};
pub use stdin::Stdin;
pub use tool::{ToolError, ToolOutput, run_tool};
