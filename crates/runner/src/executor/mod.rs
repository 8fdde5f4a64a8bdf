//! The executor seam: how an attempt is started, followed, signalled and found again.
//!
//! The engine and the attempt's driver know an attempt only through this seam:
//! - [`Executor::place`] gives the attempt's [`Placement`], its identity: which executor runs it
//!   and its attempt dir under the run dir. The engine journals it (`AttemptPlaced`) BEFORE
//!   [`Executor::launch`], and it is enough for another process (a resume) to find the attempt
//!   again with [`Executor::find`]: alive, ended (with its exit status), or gone.
//! - [`Executor::launch`] starts it and returns an [`Execution`]: its stdout lines, its exit, the
//!   tail of its stderr, and a [`Control`] that stops or signals it. A remote executor (a batch
//!   scheduler) may return before the attempt runs: [`Execution::started`] resolves once it
//!   does, and [`Execution::handle`] names the scheduler's own id once it is known (the engine
//!   journals it as `AttemptHandle`).
//! - [`Executor::adopt`] follows an attempt found alive (or ended) after a crash, from its
//!   files, as if it had been launched by this process.
//! - [`Executor::poll`] asks for many placements at once (a scheduler's batched status query);
//!   the default asks [`Executor::find`] for each.
//!
//! Output comes from files for every executor that outlives sortie: the attempt dir holds the
//! attempt's `stdout` (the agent's whole event stream, kept as its transcript), its `stderr`,
//! and its exit status, recorded by whatever survives sortie (an `exit` file written atomically,
//! or a line of the run's shepherd's status log beside the attempt dirs). The direct executor
//! (today's behaviour: a child of sortie with pipes) is the exception: it dies with sortie.
//!
//! The implementations: `direct.rs` (a child of sortie, pipes) and `supervised.rs` (a small
//! per-attempt supervisor that survives sortie; the files above).

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sortie_core::{Attempt, StopReason, TaskId};
use sortie_protocol::Exit;

use crate::layout::attempt::{AttemptFiles, EXIT_FILE};
use crate::process::{Line, SpawnError, SpawnSpec, Stdin, WaitError};

mod direct;
mod supervised;
// #11
pub mod slurm;

pub use direct::Direct;
pub use supervised::{SUPERVISION_VAR, Supervised};

/// A boxed future, for the seam's object-safe async methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The journaled name of the direct executor (a child of sortie; dies with it).
pub const DIRECT: &str = "direct";
/// The journaled name of the local supervised executor (a per-attempt supervisor).
pub const SUPERVISED: &str = "local";

/// An attempt's identity, journaled before it starts (`AttemptPlaced`), enough to find it
/// again from another process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The executor that runs it ([`DIRECT`], [`SUPERVISED`], or another executor's name).
    pub executor: String,
    /// The task.
    pub task: TaskId,
    /// The attempt.
    pub attempt: Attempt,
    /// The attempt's dir (absolute): its `stdout`, `stderr`, and the executor's own files; the
    /// run's shepherd creates none, and its attempts' files lie beside the dir's name instead
    /// (see [`AttemptFiles`]).
    pub dir: PathBuf,
    /// The executor's own id of the attempt once known (a batch job id), if it has one.
    pub handle: Option<String>,
}

impl Placement {
    /// The attempt's stdout and stderr: inside its dir, or beside it for a supervised attempt
    /// that the run's shepherd started.
    pub fn files(&self) -> AttemptFiles {
        attempt_files(&self.executor, &self.dir)
    }

    /// The attempt's stdout, its transcript.
    pub fn stdout(&self) -> PathBuf {
        self.files().stdout
    }

    /// The attempt's stderr.
    pub fn stderr(&self) -> PathBuf {
        self.files().stderr
    }

    /// The exit file: the attempt's exit status, written atomically once it ended (by a
    /// supervisor of its own or the direct executor; the run's shepherd records it in its
    /// status log instead).
    pub fn exit_file(&self) -> PathBuf {
        self.dir.join(EXIT_FILE)
    }
}

/// The stdout and stderr of an attempt that `executor` ran, placed with the dir `dir`: inside
/// it, or beside it for a supervised attempt that the run's shepherd started.
pub fn attempt_files(executor: &str, dir: &Path) -> AttemptFiles {
    if executor == SUPERVISED {
        AttemptFiles::of(dir)
    } else {
        AttemptFiles::inside(dir)
    }
}

/// What to launch.
#[derive(Debug, Clone)]
pub struct LaunchRequest {
    /// Where it runs and how it is found again (already journaled).
    pub placement: Placement,
    /// The program, its cwd, its environment and its marker.
    pub spawn: SpawnSpec,
    /// Whether the attempt's stdin is a pipe the driver writes to (an agent driven over
    /// stdin), else `/dev/null`.
    pub piped_stdin: bool,
    /// A file the attempt reads as its stdin (its prompt, of any size), when not piped.
    pub stdin_file: Option<PathBuf>,
}

/// Where an attempt stands, as seen from its files and its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// It still runs.
    Alive,
    /// It ended, and this is how (its exit record).
    Ended(Exit),
    /// Neither: nothing of it runs and no status was recorded (a reboot, a killed supervisor,
    /// an executor that does not outlive sortie).
    Gone,
}

/// A signal sent to an attempt's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sig {
    /// SIGTERM.
    Term,
    /// SIGKILL.
    Kill,
    /// SIGSTOP: hold it.
    Stop,
    /// SIGCONT: release it.
    Cont,
}

impl Sig {
    /// The signal's number.
    pub fn number(self) -> i32 {
        match self {
            Sig::Term => libc::SIGTERM,
            Sig::Kill => libc::SIGKILL,
            Sig::Stop => libc::SIGSTOP,
            Sig::Cont => libc::SIGCONT,
        }
    }

    pub(crate) fn nix(self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal;
        match self {
            Sig::Term => Signal::SIGTERM,
            Sig::Kill => Signal::SIGKILL,
            Sig::Stop => Signal::SIGSTOP,
            Sig::Cont => Signal::SIGCONT,
        }
    }
}

/// When and as what an attempt's process started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// The agent's pid (its process group id).
    pub pid: u32,
    /// Its start time in clock ticks since boot (the pid-reuse guard).
    pub start_time: u64,
}

/// Stops and signals a running attempt; cloneable across tasks.
pub trait Control: Send + Sync + fmt::Debug {
    /// Sends `sig` to the attempt's process group, if it still runs; true when it was sent.
    fn signal(&self, sig: Sig) -> io::Result<bool>;

    /// Records `reason` (the first request wins), sends SIGTERM, SIGKILL after `grace` if it
    /// has not ended, and resolves once it ended (or gave up waiting), with the reason that
    /// stands.
    fn stop(&self, reason: StopReason, grace: Duration) -> BoxFuture<'static, StopReason>;

    /// The stop reason, if a stop signal actually reached the running attempt.
    fn sent_reason(&self) -> Option<StopReason>;
}

/// A launched (or adopted) attempt, followed by its driver.
pub trait Execution: Send {
    /// Resolves once the attempt's process runs (at once for a local executor), with its pid
    /// and start time; an error when it never started (the attempt's end then).
    fn started(&mut self) -> BoxFuture<'_, Result<Started, SpawnError>>;

    /// The executor's own id of the attempt (a batch job id), once known.
    fn handle(&self) -> Option<String> {
        None
    }

    /// The next stdout line, or None once stdout ended. Cancel safe.
    fn next_line(&mut self) -> BoxFuture<'_, Option<Line>>;

    /// Resolves once the attempt ended, with how. Cancel safe; may be called again.
    fn wait(&mut self) -> BoxFuture<'_, Result<Exit, WaitError>>;

    /// The end of its stderr so far (complete once [`Execution::wait`] returned).
    fn stderr_tail(&self) -> String;

    /// How far stdout was read: for an executor that follows files, the offset in the
    /// transcript just after the last line [`Execution::next_line`] gave (what `AttemptRead`
    /// journals); for pipes, the bytes read so far.
    fn stdout_offset(&self) -> u64;

    /// #10: whether its transcript was cut somewhere before the last line
    /// [`Execution::next_line`] gave (the cap cut lines the reader never saw).
    fn cut_before(&self) -> bool {
        false
    }

    /// The handle that stops and signals it.
    fn control(&self) -> Arc<dyn Control>;

    /// The write end of its stdin, for an agent driven over stdin (once).
    fn take_stdin(&mut self) -> Option<Stdin>;

    /// #11: how long the attempt had already run when [`Execution::started`] resolved, when
    /// the executor knows it (a batch job's run time, from the scheduler): its stall and
    /// attempt clocks count from its real start, never from its submission or its adoption
    /// (queue time is not run time). `None`: from the launch.
    fn ran_before(&self) -> Option<Duration> {
        None
    }

    /// #11: once [`Execution::wait`] returned, an end the executor itself caused, as the
    /// attempt's outcome (a scheduler's time limit, a lost node, out of memory, a cancel from
    /// outside): it stands instead of the reader's reading of the exit, unless sortie stopped
    /// the attempt itself. `None` for an attempt that ended by itself.
    fn executor_end(&self) -> Option<sortie_core::AttemptOutcome> {
        None
    }
}

/// What an executor may be asked to adopt: an attempt found again after a crash.
#[derive(Debug, Clone)]
pub struct Adoption {
    /// Where it runs.
    pub placement: Placement,
    /// The agent's pid and start time, when they were journaled (`AttemptStarted`).
    pub started: Option<Started>,
}

/// An executor (see the module doc).
pub trait Executor: Send + Sync + fmt::Debug {
    /// Its journaled name.
    fn kind(&self) -> &'static str;

    /// The placement of attempt `attempt` of `task` in its attempt dir `dir` (the layout's
    /// `RunDir::attempt_dir`): its identity, journaled before the launch. Pure: nothing is
    /// created.
    fn place(&self, dir: PathBuf, task: TaskId, attempt: Attempt) -> Placement {
        Placement {
            executor: self.kind().to_owned(),
            task,
            attempt,
            dir,
            handle: None,
        }
    }

    /// Starts an attempt whose placement is journaled.
    fn launch(&self, req: LaunchRequest) -> BoxFuture<'_, Result<Box<dyn Execution>, SpawnError>>;

    /// Where an attempt placed by any process stands.
    fn find<'a>(&'a self, adoption: &'a Adoption) -> BoxFuture<'a, Presence>;

    /// Many at once (a batch scheduler answers them with one query); the default asks
    /// [`Executor::find`] for each, in order.
    fn poll<'a>(&'a self, adoptions: &'a [Adoption]) -> BoxFuture<'a, Vec<Presence>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(adoptions.len());
            for a in adoptions {
                out.push(self.find(a).await);
            }
            out
        })
    }

    /// Follows an attempt found [`Presence::Alive`] or [`Presence::Ended`] from its files,
    /// from the start of its stdout (the reader rebuilds its state from it). An executor that
    /// cannot adopt says so with an error.
    fn adopt(&self, adoption: Adoption) -> BoxFuture<'_, Result<Box<dyn Execution>, SpawnError>>;

    /// Sends `sig` to the process group of the attempt at `adoption`, found through its
    /// identity (not through a live [`Execution`]); true when it was sent.
    fn signal<'a>(&'a self, adoption: &'a Adoption, sig: Sig) -> BoxFuture<'a, io::Result<bool>>;
}

/// The supervisor program of this process (see [`use_supervisor`]).
static SUPERVISOR: OnceLock<PathBuf> = OnceLock::new();

/// Makes `program` (run as `<program> __supervise ...`: the sortie binary) this process's
/// supervisor, which turns supervised attempts on. Without it (a library user, the runner's
/// own tests) every attempt runs direct. The first call wins.
pub fn use_supervisor(program: PathBuf) {
    let _ = SUPERVISOR.set(program);
}

/// The supervisor program, when one was set.
pub fn supervisor() -> Option<&'static Path> {
    SUPERVISOR.get().map(PathBuf::as_path)
}

/// The executor of a journaled name; None for a name this build does not know (or `local`
/// without a supervisor program).
pub fn by_kind(kind: &str) -> Option<Arc<dyn Executor>> {
    match kind {
        DIRECT => Some(Arc::new(Direct)),
        SUPERVISED => Some(Arc::new(Supervised::new(supervisor()?.to_path_buf()))),
        _ => None,
    }
}
