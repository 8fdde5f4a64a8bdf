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
//! What an executor can do is asked, never inferred from its name: whether it outlives sortie
//! (its placement is journaled), whether its output is followed from files, whether its clocks
//! start at the attempt's real start, whether its status is polled for all attempts at once,
//! whether a repair round may run locally (see the capability methods of [`Executor`]). Which
//! executor runs a task is chosen here too ([`for_spec`], and [`for_placement`] for one already
//! journaled): the engine and the attempt name no executor.
//!
//! The implementations: `direct.rs` (a child of sortie, pipes), `supervised.rs` (a small
//! per-attempt supervisor that survives sortie; the files above) and `slurm/` (#11: one batch
//! job per attempt, with Slurm's commands as data) and `ray/` (#36: one job per attempt through
//! Ray's HTTP job API).

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sortie_core::{Attempt, AttemptRecord, RunId, StopReason, TaskId, TaskSpec, Timestamp};
use sortie_protocol::Exit;

use crate::layout::attempt::{AttemptFiles, EXIT_FILE};
use crate::process::{Line, SpawnError, SpawnSpec, Stdin, WaitError};

mod direct;
// #36
pub mod ray;
// #11
pub mod slurm;
mod supervised;

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

impl Placement {
    /// The placement of `task`'s attempt `record` as journaled; an attempt placed nowhere ran
    /// direct (the direct executor journals no placement), in `unplaced_dir`.
    pub fn of_record(task: TaskId, record: &AttemptRecord, unplaced_dir: PathBuf) -> Placement {
        match record.placed.as_deref() {
            Some(p) => Placement {
                executor: p.executor().to_owned(),
                task,
                attempt: record.attempt,
                dir: PathBuf::from(p.dir()),
                handle: p.handle.clone(),
            },
            None => Placement {
                executor: DIRECT.to_owned(),
                task,
                attempt: record.attempt,
                dir: unplaced_dir,
                handle: None,
            },
        }
    }
}

/// Whether an attempt that `executor` ran has a supervisor of its own on this machine, whose
/// life (its `started` record) says whether the attempt's files may still grow.
pub fn has_own_supervisor(executor: &str) -> bool {
    executor == SUPERVISED
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

    /// #32: once [`Execution::wait`] returned, why its stdout or stderr could not be written to
    /// the state dir, when it could not (the disk full as the agent failed): core then counts
    /// its failure as an interrupt, not the task's. `None`: nothing seen.
    fn output_lost(&self) -> Option<String> {
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

/// What an executor can do, as the engine and the attempt ask it (each executor states every
/// field: a new capability is a decision for each of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Its attempts outlive sortie: their placement is journaled (`AttemptPlaced`) before the
    /// launch, so that a resume finds them again. One that dies with sortie journals none: its
    /// attempt is orphaned on resume.
    pub outlives_sortie: bool,
    /// #10: its attempts' stdout is followed from a file (not a pipe): its read offset is
    /// journaled (`AttemptRead`), adoption reads on from it, and the transcript's cutter cuts
    /// below it.
    pub follows_files: bool,
    /// #11: its attempts may wait before they run (a batch scheduler's queue): their clocks
    /// (stall, attempt timeout) start at the real start, which the executor tells
    /// ([`Execution::ran_before`]), or else when the attempt is seen started; never at the
    /// journaled launch.
    pub clocks_from_real_start: bool,
    /// #11: a resume asks for all of the run's attempts on it with one [`Executor::poll`] (a
    /// batch scheduler's status query), not one [`Executor::find`] each.
    pub polls_in_batch: bool,
    /// Issue 13: a structured output's repair round may run as a local child of sortie
    /// continuing the attempt's session (the attempt ran on this machine); else the first
    /// result stands.
    pub repairs_locally: bool,
}

/// An executor (see the module doc).
pub trait Executor: Send + Sync + fmt::Debug {
    /// Its journaled name (the placement records it; nothing outside this module compares it).
    fn kind(&self) -> &'static str;

    /// What it can do: the engine and the attempt ask this, never its name.
    fn can(&self) -> Capabilities;

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

/// What a run's executors share, kept by the run's owner: #11: the run's Slurm cluster (its
/// one status poller), made at its first use.
#[derive(Debug, Default)]
pub struct Shared {
    slurm: OnceLock<Arc<slurm::Cluster>>,
    /// #36: the run's Ray head nodes, by address.
    ray: ray::Heads,
}

/// What choosing an attempt's executor needs beside its task's spec.
#[derive(Debug, Clone, Copy)]
pub struct Choice<'a> {
    /// What the run's executors share.
    pub shared: &'a Shared,
    /// The run.
    pub run: &'a RunId,
    /// The run's incarnation (see `process::marker`).
    pub incarnation: u64,
    /// The task's deadline as a time, if it has one.
    pub deadline_at: Option<Timestamp>,
    /// Whether the task and its agent profile let its attempts be supervised, and its attempt
    /// dir can be journaled (its path is UTF-8 text).
    pub supervise: bool,
}

/// The executor of a new attempt of the task with `spec`: its batch's executor (#11: Slurm's,
/// one job per attempt); on this machine, supervised when `choice` lets it and this process
/// has a supervisor program (see [`use_supervisor`]), else direct.
pub fn for_spec(spec: &TaskSpec, choice: &Choice<'_>) -> Arc<dyn Executor> {
    match &spec.executor {
        sortie_core::Executor::Slurm(options) => slurm::place::for_spec(spec, options, choice),
        sortie_core::Executor::Ray(_) => ray::for_spec(spec, choice),
        sortie_core::Executor::Local => match supervisor() {
            Some(program) if choice.supervise => Arc::new(Supervised::new(program.to_path_buf())),
            _ => Arc::new(Direct),
        },
    }
}

/// #37: what must answer before the tasks can start, per executor they use: each problem
/// with the tasks (their indexes) it stops. A Slurm controller that does not answer
/// (`scontrol ping`) stops every task on Slurm; the local executors need nothing.
pub async fn unready(tasks: &[TaskSpec]) -> Vec<(Vec<usize>, String)> {
    let on_slurm: Vec<usize> = tasks
        .iter()
        .enumerate()
        .filter(|(_, t)| matches!(t.executor, sortie_core::Executor::Slurm(_)))
        .map(|(i, _)| i)
        .collect();
    let mut out = Vec::new();
    if !on_slurm.is_empty()
        && let Err(message) = slurm::controller_answers().await
    {
        out.push((on_slurm, message));
    }
    // #36: each Ray head the tasks use, once.
    let heads = ray_heads(tasks);
    for (address, ix) in heads {
        if let Err(message) = ray::heads_answer(std::slice::from_ref(&address)).await {
            out.push((ix, message));
        }
    }
    out
}

/// #36: each Ray head the tasks use (its address), with the tasks (their indexes) on it.
fn ray_heads(tasks: &[TaskSpec]) -> Vec<(String, Vec<usize>)> {
    let mut heads: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        if let sortie_core::Executor::Ray(o) = &t.executor {
            let a = ray::address(o);
            match heads.iter_mut().find(|(h, _)| *h == a) {
                Some((_, ix)) => ix.push(i),
                None => heads.push((a, vec![i])),
            }
        }
    }
    heads
}

/// #36: what the clusters the tasks use say of themselves, one line each (`sortie check`: a
/// Ray head's version); those that do not answer are [`unready`]'s.
pub async fn reached(tasks: &[TaskSpec]) -> Vec<String> {
    let mut out = Vec::new();
    for (address, _) in ray_heads(tasks) {
        if let Ok(said) = ray::heads_answer(std::slice::from_ref(&address)).await {
            out.extend(said);
        }
    }
    out
}

/// The executor of a journaled placement's executor name `name`, for the task with `spec`;
/// None for a name this build does not know (or `local` without a supervisor program).
pub fn for_placement(
    name: &str,
    spec: &TaskSpec,
    choice: &Choice<'_>,
) -> Option<Arc<dyn Executor>> {
    match name {
        DIRECT => Some(Arc::new(Direct)),
        SUPERVISED => Some(Arc::new(Supervised::new(supervisor()?.to_path_buf()))),
        slurm::SLURM => Some(slurm::place::for_placement(spec, choice)),
        ray::RAY => Some(ray::for_spec(spec, choice)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The executor chosen for `spec` with supervision allowed or not (no supervisor program is
    /// set in the runner's tests: local attempts run direct).
    fn chosen(spec: &TaskSpec, supervise: bool) -> Arc<dyn Executor> {
        let shared = Shared::default();
        let run = RunId::new("r").expect("a valid run id");
        let choice = Choice {
            shared: &shared,
            run: &run,
            incarnation: 1,
            deadline_at: None,
            supervise,
        };
        for_spec(spec, &choice)
    }

    /// What an executor can do, in the order of [`Capabilities`]' fields.
    fn capabilities(ex: &dyn Executor) -> [bool; 5] {
        let c = ex.can();
        [
            c.outlives_sortie,
            c.follows_files,
            c.clocks_from_real_start,
            c.polls_in_batch,
            c.repairs_locally,
        ]
    }

    #[test]
    fn a_spec_chooses_its_executor_and_the_executor_says_what_it_can_do() {
        let local = TaskSpec::new("t", "/tmp");
        let mut on_slurm = local.clone();
        on_slurm.executor = sortie_core::Executor::Slurm(Default::default());
        let direct = chosen(&local, true);
        assert_eq!(direct.kind(), DIRECT);
        assert_eq!(capabilities(&*direct), [false, false, false, false, true]);
        let slurm = chosen(&on_slurm, false);
        assert_eq!(slurm.kind(), slurm::SLURM);
        assert_eq!(capabilities(&*slurm), [true, true, true, true, false]);
        let supervised = Supervised::new(PathBuf::from("/bin/true"));
        assert_eq!(capabilities(&supervised), [true, true, false, false, true]);
    }

    #[test]
    fn a_journaled_name_finds_its_executor_again() {
        let spec = TaskSpec::new("t", "/tmp");
        let shared = Shared::default();
        let run = RunId::new("r").expect("a valid run id");
        let choice = Choice {
            shared: &shared,
            run: &run,
            incarnation: 1,
            deadline_at: None,
            supervise: false,
        };
        let kind = |name| for_placement(name, &spec, &choice).map(|e| e.kind());
        assert_eq!(kind(DIRECT), Some(DIRECT));
        // A Slurm placement of a task no longer on Slurm is still followed on Slurm.
        assert_eq!(kind(slurm::SLURM), Some(slurm::SLURM));
        assert_eq!(kind("kubernetes"), None);
    }
}
