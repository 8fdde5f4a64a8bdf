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

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use sortie_core::{AgentProfile, StopReason};
use sortie_protocol::Exit;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::signal::unix::{Signal as SignalStream, SignalKind, signal as signal_stream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The longest stdout line delivered whole; longer lines are cut to this and flagged.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// How much of stderr is kept (the end of it).
pub const STDERR_TAIL_BYTES: usize = 50 * 1024;
/// How long the output readers keep reading after the leader exited (for pipes held open by a
/// process that left the group).
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// Lines buffered between the stdout reader and the caller; beyond that the child blocks on
/// its pipe (backpressure, bounded memory).
const LINE_QUEUE: usize = 16;
/// The read size for stdout and stderr.
const READ_CHUNK: usize = 64 * 1024;
/// How often the monitor checks the leader even without a SIGCHLD (a safety net).
const EXIT_POLL: Duration = Duration::from_secs(1);
/// How often the monitor checks when SIGCHLD cannot be listened to.
const EXIT_POLL_WITHOUT_SIGCHLD: Duration = Duration::from_millis(50);
/// How long [`kill_group_if_same`] and [`Stopper::stop`] wait after SIGKILL before they give up.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long [`find_marked`] waits for a process in the middle of an exec.
const EXEC_WAIT: Duration = Duration::from_millis(100);
/// How often [`kill_group_if_same`] looks whether the process is gone.
const GONE_POLL: Duration = Duration::from_millis(20);

// ---------------------------------------------------------------------------------------------
// Rendering the argv

/// The values substituted into an argv template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vars {
    /// `{prompt}`: the rendered prompt.
    pub prompt: String,
    /// `{model}`: the attempt's model, if any (also decides whether `{model_args}` expands).
    pub model: Option<String>,
    /// `{cwd}`: the attempt's working directory.
    pub cwd: String,
    /// `{attempt}`: the attempt number, from 1.
    pub attempt: u32,
    /// `{label}` (alias `{task}`): the task's label.
    pub label: String,
}

/// Why an argv could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// Neither the profile nor the task gives a command.
    #[error("agent `{agent}` has no command and the task gives none")]
    NoCommand {
        /// The profile's name.
        agent: String,
    },
    /// `{model}` is used outside `{model_args}` but the attempt has no model.
    #[error("argument {element:?} uses {{model}} but the attempt has no model")]
    NoModel {
        /// The template element.
        element: String,
    },
    /// The program name renders to nothing.
    #[error("the program name is empty after rendering {template:?}")]
    EmptyProgram {
        /// The template's first element.
        template: String,
    },
}

/// Renders the argv of an attempt: the task's own `command` when it has one, else the
/// profile's template.
///
/// Placeholders `{prompt}`, `{model}`, `{cwd}`, `{attempt}`, `{label}` and `{task}` are
/// substituted inside elements in one pass (a substituted value is never scanned again); any
/// other brace text is left as is. An element that is exactly `{model_args}` expands to the
/// profile's `model_args` (rendered) when a model is set, and to nothing otherwise. No shell
/// is involved: an element with spaces stays one argument.
pub fn render_argv(
    profile: &AgentProfile,
    task_command: Option<&[String]>,
    vars: &Vars,
) -> Result<Vec<String>, RenderError> {
    let template = task_command.unwrap_or(&profile.command);
    if template.is_empty() {
        return Err(RenderError::NoCommand {
            agent: profile.name.clone(),
        });
    }
    let mut argv = Vec::with_capacity(template.len() + profile.model_args.len());
    for element in template {
        if element == "{model_args}" {
            if vars.model.is_some() {
                for arg in &profile.model_args {
                    argv.push(substitute(arg, vars)?);
                }
            }
        } else {
            argv.push(substitute(element, vars)?);
        }
    }
    match argv.first() {
        Some(program) if !program.is_empty() => Ok(argv),
        _ => Err(RenderError::EmptyProgram {
            template: template[0].clone(),
        }),
    }
}

/// The argv element that expands to an attempt's session arguments (see [`expand_element`]):
/// for a profile that can continue a conversation, where the agent keeps its session and, on a
/// continuation, which session to continue. Left alone by [`render_argv`].
pub const SESSION_ARGS: &str = "{session_args}";

/// Replaces every element of a rendered argv that is exactly `placeholder` with `values`
/// (with no values, the element is removed).
pub fn expand_element(argv: Vec<String>, placeholder: &str, values: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len() + values.len());
    for element in argv {
        if element == placeholder {
            out.extend(values.iter().cloned());
        } else {
            out.push(element);
        }
    }
    out
}

/// Substitutes the known placeholders of one element.
fn substitute(element: &str, vars: &Vars) -> Result<String, RenderError> {
    let mut out = String::with_capacity(element.len());
    let mut rest = element;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        if let Some(end) = after.find('}')
            && let Some(value) = placeholder(&after[..end], vars, element)?
        {
            out.push_str(&value);
            rest = &after[end + 1..];
            continue;
        }
        out.push('{');
        rest = after;
    }
    out.push_str(rest);
    Ok(out)
}

/// The value of a placeholder, or None for a name that is not one.
fn placeholder<'a>(
    name: &str,
    vars: &'a Vars,
    element: &str,
) -> Result<Option<Cow<'a, str>>, RenderError> {
    Ok(Some(match name {
        "prompt" => Cow::Borrowed(vars.prompt.as_str()),
        "model" => match &vars.model {
            Some(m) => Cow::Borrowed(m.as_str()),
            None => {
                return Err(RenderError::NoModel {
                    element: element.to_owned(),
                });
            }
        },
        "cwd" => Cow::Borrowed(vars.cwd.as_str()),
        "attempt" => Cow::Owned(vars.attempt.to_string()),
        "label" | "task" => Cow::Borrowed(vars.label.as_str()),
        _ => return Ok(None),
    }))
}

// ---------------------------------------------------------------------------------------------
// Spawning

/// What to start.
#[derive(Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    /// The program and its arguments (see [`render_argv`]).
    pub argv: Vec<String>,
    /// The working directory.
    pub cwd: PathBuf,
    /// Variables added to sortie's own environment (values may be secrets: never logged).
    pub env: Vec<(String, String)>,
    /// A variable set in the child's environment, e.g. `("SORTIE_ATTEMPT",
    /// "<run-id>/<task>/<attempt>/<incarnation>")`, by which [`find_marked`] finds it after a
    /// crash.
    pub marker: (String, String),
}

impl fmt::Debug for SpawnSpec {
    /// Shows the environment's names only: its values may be secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpawnSpec")
            .field("argv", &self.argv)
            .field("cwd", &self.cwd)
            .field(
                "env",
                &self.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            )
            .field("marker", &self.marker)
            .finish()
    }
}

/// Why a child could not be started. The text is complete on its own (it becomes the error of
/// a `spawn_error` outcome): a spawn failure ends an attempt, never the runner.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The argv is empty.
    #[error("nothing to run: the command is empty")]
    EmptyArgv,
    /// The program does not exist (or, for a script, its interpreter).
    #[error("cannot run `{program}`: not found")]
    NotFound {
        /// The program as given.
        program: String,
    },
    /// The program is not executable by us.
    #[error("cannot run `{program}`: permission denied")]
    PermissionDenied {
        /// The program as given.
        program: String,
    },
    /// The working directory is missing or not a directory.
    #[error("cannot run `{program}`: working directory {} is not usable: {error}", cwd.display())]
    BadCwd {
        /// The program as given.
        program: String,
        /// The working directory.
        cwd: PathBuf,
        /// What is wrong with it.
        error: io::Error,
    },
    /// Any other failure to start it.
    #[error("cannot run `{program}`: {error}")]
    Io {
        /// The program as given.
        program: String,
        /// The failure.
        error: io::Error,
    },
    /// It started but its `/proc` entry could not be read, so it could not be stopped safely
    /// later; it was killed at once.
    #[error("started `{program}` (pid {pid}) but could not read /proc/{pid}/stat; killed it")]
    NoProcStat {
        /// The program as given.
        program: String,
        /// Its pid.
        pid: u32,
    },
}

/// Starts a child as described by `spec` (see the module doc for what the child gets).
///
/// Must be called within a tokio runtime: the child's monitor and output readers are tasks.
pub async fn spawn(spec: &SpawnSpec) -> Result<Child, SpawnError> {
    spawn_child(spec, false).await
}

/// Like [`spawn`], but the child's stdin is a pipe: [`Child::take_stdin`] gives the handle
/// that writes to it, and dropping that handle closes it (EOF). For agents driven by commands
/// on stdin (pi's RPC mode).
pub async fn spawn_piped(spec: &SpawnSpec) -> Result<Child, SpawnError> {
    spawn_child(spec, true).await
}

#[allow(clippy::disallowed_methods, reason = "the one spawn function")]
async fn spawn_child(spec: &SpawnSpec, piped_stdin: bool) -> Result<Child, SpawnError> {
    let Some(program) = spec.argv.first() else {
        return Err(SpawnError::EmptyArgv);
    };
    // Checked first: a missing cwd fails exec with the same ENOENT as a missing program.
    let cwd_ok = std::fs::metadata(&spec.cwd).and_then(|m| {
        if m.is_dir() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory",
            ))
        }
    });
    if let Err(error) = cwd_ok {
        return Err(SpawnError::BadCwd {
            program: program.clone(),
            cwd: spec.cwd.clone(),
            error,
        });
    }

    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&spec.argv[1..])
        .current_dir(&spec.cwd)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env(&spec.marker.0, &spec.marker.1)
        .stdin(if piped_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);

    // Listening before the child exists: its SIGCHLD cannot be missed.
    let sigchld = signal_stream(SignalKind::child()).ok();
    let mut child = cmd.spawn().map_err(|error| match error.kind() {
        io::ErrorKind::NotFound => SpawnError::NotFound {
            program: program.clone(),
        },
        io::ErrorKind::PermissionDenied => SpawnError::PermissionDenied {
            program: program.clone(),
        },
        _ => SpawnError::Io {
            program: program.clone(),
            error,
        },
    })?;
    // Unreaped, so the id is there; and a pid always fits an i32 (pid_max <= 2^22).
    let pid = child.id().unwrap_or(0);
    let start_time = match process_start_time(pid) {
        Some(t) if pid != 0 => t,
        _ => {
            // Dropped right after: kill_on_drop kills it and tokio reaps it.
            let _ = child.start_kill();
            return Err(SpawnError::NoProcStat {
                program: program.clone(),
                pid,
            });
        }
    };

    let (exit_tx, exit_rx) = watch::channel(None);
    let shared = Arc::new(Shared {
        pid,
        start_time,
        reaped: Mutex::new(false),
        reason: OnceLock::new(),
        signaled: AtomicBool::new(false),
        exit: exit_rx.clone(),
    });
    let (line_tx, line_rx) = mpsc::channel(LINE_QUEUE);
    let stdout_bytes = Arc::new(AtomicU64::new(0));
    let stderr = Arc::new(Mutex::new(TailBuffer::new(STDERR_TAIL_BYTES)));
    if let Some(out) = child.stdout.take() {
        tokio::spawn(read_stdout(
            out,
            line_tx,
            Arc::clone(&stdout_bytes),
            exit_rx.clone(),
        ));
    }
    let stderr_task = child
        .stderr
        .take()
        .map(|err| tokio::spawn(read_stderr(err, Arc::clone(&stderr), exit_rx.clone())));
    let stdin = child.stdin.take().map(|inner| Stdin { inner });
    tokio::spawn(monitor(child, Arc::clone(&shared), sigchld, exit_tx));

    tracing::debug!(pid, program = %program, "spawned");
    Ok(Child {
        pid,
        start_time,
        stopper: Stopper { shared },
        lines: line_rx,
        stderr,
        stderr_task,
        stdout_bytes,
        stdin,
    })
}

/// The write end of a child's stdin (see [`spawn_piped`]). Dropping it closes the pipe.
#[derive(Debug)]
pub struct Stdin {
    inner: tokio::process::ChildStdin,
}

impl Stdin {
    /// Writes one line (a newline is added) and flushes it. Fails when the child closed its
    /// end (it exited).
    pub async fn send_line(&mut self, line: &str) -> io::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.inner.write_all(&bytes).await?;
        self.inner.flush().await
    }
}

// ---------------------------------------------------------------------------------------------
// The child

/// One stdout line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The text, without its newline (and a `\r` before it), decoded lossily as UTF-8.
    pub text: String,
    /// True when the line was longer than [`MAX_LINE_BYTES`]: `text` is its beginning and the
    /// rest of it was skipped.
    pub truncated: bool,
}

/// The leader's exit could not be learned (someone else reaped it, or the runtime is
/// shutting down).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot learn how process {pid} ended: {message}")]
pub struct WaitError {
    /// The leader's pid.
    pub pid: u32,
    /// What went wrong.
    pub message: String,
}

type ExitSlot = Option<Result<Exit, WaitError>>;

/// A running (or finished) child, the leader of its own process group.
///
/// Dropping it SIGKILLs the group unless the leader was already reaped; the leader is reaped
/// either way.
#[derive(Debug)]
pub struct Child {
    /// The leader's pid (also the group id).
    pub pid: u32,
    /// The leader's start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    stopper: Stopper,
    lines: mpsc::Receiver<Line>,
    stderr: Arc<Mutex<TailBuffer>>,
    stderr_task: Option<JoinHandle<()>>,
    stdout_bytes: Arc<AtomicU64>,
    stdin: Option<Stdin>,
}

impl Child {
    /// The write end of the child's stdin, when it was spawned with [`spawn_piped`] (once).
    pub fn take_stdin(&mut self) -> Option<Stdin> {
        self.stdin.take()
    }

    /// The next stdout line, or None once stdout is closed (or abandoned
    /// [`DRAIN_AFTER_EXIT`] after the leader exited). Cancel safe.
    pub async fn next_line(&mut self) -> Option<Line> {
        self.lines.recv().await
    }

    /// Waits until the leader has exited and been reaped (what was left of its group is
    /// killed by then) and stderr is read to its end. Cancel safe; may be called again.
    pub async fn wait(&mut self) -> Result<Exit, WaitError> {
        let mut exit = self.stopper.shared.exit.clone();
        let result = match exit.wait_for(Option::is_some).await {
            Ok(slot) => slot.clone().unwrap_or_else(|| Err(self.lost("no status"))),
            Err(_) => Err(self.lost("the process monitor stopped")),
        };
        if let Some(task) = &mut self.stderr_task {
            let _ = task.await;
            self.stderr_task = None;
        }
        result
    }

    fn lost(&self, message: &str) -> WaitError {
        WaitError {
            pid: self.pid,
            message: message.to_owned(),
        }
    }

    /// The end of stderr so far (the last [`STDERR_TAIL_BYTES`], starting at a char
    /// boundary); complete once [`Child::wait`] returned.
    pub fn stderr_tail(&self) -> String {
        lock(&self.stderr).text()
    }

    /// How many bytes stdout has produced so far (a line in the making counts too).
    pub fn stdout_bytes(&self) -> u64 {
        self.stdout_bytes.load(Ordering::Relaxed)
    }

    /// A handle that stops this child; it can be cloned and moved to other tasks.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Stops the child (see [`Stopper::stop`]); returns the stop reason that won.
    pub async fn stop(&self, reason: StopReason, grace: Duration) -> StopReason {
        self.stopper.stop(reason, grace).await
    }

    /// The first stop reason requested, if any.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stopper.reason()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // The monitor task still reaps the leader.
        self.stopper.shared.signal_group(Signal::SIGKILL);
    }
}

/// Stops a child: a cloneable handle, usable while another task reads or waits on the
/// [`Child`].
#[derive(Debug, Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    pid: u32,
    start_time: u64,
    /// True once the leader is reaped; held while signalling and while reaping.
    reaped: Mutex<bool>,
    /// The first stop reason requested.
    reason: OnceLock<StopReason>,
    /// True once a stop signal reached the live group.
    signaled: AtomicBool,
    exit: watch::Receiver<ExitSlot>,
}

impl Shared {
    /// Signals the group if its leader is not reaped and still the process we started.
    fn signal_group(&self, sig: Signal) -> bool {
        let reaped = lock(&self.reaped);
        if *reaped || process_start_time(self.pid) != Some(self.start_time) {
            return false;
        }
        killpg(pid_of(self.pid), sig).is_ok()
    }
}

impl Stopper {
    /// Records a stop reason if none was recorded yet; returns the one that stands (the first
    /// request wins; the precedence between reasons is the caller's).
    pub fn request(&self, reason: StopReason) -> StopReason {
        *self.shared.reason.get_or_init(|| reason)
    }

    /// The first stop reason requested, if any.
    pub fn reason(&self) -> Option<StopReason> {
        self.shared.reason.get().copied()
    }

    /// The stop reason, if a stop signal actually reached the running child: then its end is
    /// sortie's doing, not unexpected (see `Finished::stopped_by`).
    pub fn sent_reason(&self) -> Option<StopReason> {
        if self.shared.signaled.load(Ordering::SeqCst) {
            self.reason()
        } else {
            None
        }
    }

    /// True once the leader has exited and been reaped.
    pub fn has_exited(&self) -> bool {
        self.shared.exit.borrow().is_some()
    }

    /// Records `reason` (first request wins), sends SIGTERM to the group, and SIGKILL after
    /// `grace` if the leader has not exited by then; returns once the leader is reaped (or,
    /// for a process that SIGKILL cannot end at once, e.g. in uninterruptible sleep, a few
    /// seconds after it: the monitor still reaps it), with the reason that stands. Does
    /// nothing but record when the leader is already gone.
    pub async fn stop(&self, reason: StopReason, grace: Duration) -> StopReason {
        let winner = self.request(reason);
        let mut exit = self.shared.exit.clone();
        if self.has_exited() {
            return winner;
        }
        if self.shared.signal_group(Signal::SIGTERM) {
            self.shared.signaled.store(true, Ordering::SeqCst);
        }
        let exited = tokio::time::timeout(grace, exit.wait_for(Option::is_some))
            .await
            .is_ok();
        if !exited {
            if self.shared.signal_group(Signal::SIGKILL) {
                self.shared.signaled.store(true, Ordering::SeqCst);
            }
            let _ = tokio::time::timeout(KILL_WAIT, exit.wait_for(Option::is_some))
                .await
                .map(|r| r.map(|_| ()));
        }
        winner
    }
}

/// Reaps the leader (see the module doc) and publishes its exit.
async fn monitor(
    mut child: tokio::process::Child,
    shared: Arc<Shared>,
    mut sigchld: Option<SignalStream>,
    exit_tx: watch::Sender<ExitSlot>,
) {
    let pid = pid_of(shared.pid);
    // Exited (with its status, if nix could read it) but not reaped; or None when it cannot
    // be waited for at all.
    let observed: Option<Option<Exit>> = loop {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::Exited(_, code)) => break Some(Some(Exit::Code(code))),
            Ok(WaitStatus::Signaled(_, sig, _)) => break Some(Some(Exit::Signal(sig as i32))),
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            // nix refuses signals it has no name for (real-time ones): exited all the same.
            Err(Errno::EINVAL) => break Some(None),
            Err(e) => {
                tracing::warn!(pid = shared.pid, "waitid failed: {e}");
                break None;
            }
        }
        match sigchld.as_mut() {
            Some(s) => {
                tokio::select! {
                    _ = s.recv() => {}
                    _ = tokio::time::sleep(EXIT_POLL) => {}
                }
            }
            None => tokio::time::sleep(EXIT_POLL_WITHOUT_SIGCHLD).await,
        }
    };

    let reaped_now = {
        let mut reaped = lock(&shared.reaped);
        if observed.is_some() {
            // The leader is a zombie: its group id is still ours. Nothing outlives an attempt.
            let _ = killpg(pid, Signal::SIGKILL);
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                *reaped = true;
                Some(Ok(status))
            }
            Ok(None) => None,
            Err(e) => {
                *reaped = true;
                Some(Err(e))
            }
        }
    };
    let status = match reaped_now {
        Some(r) => r,
        None => {
            let r = child.wait().await;
            *lock(&shared.reaped) = true;
            r
        }
    };
    let result = match (observed.flatten(), status) {
        (Some(exit), _) => Ok(exit),
        (None, Ok(status)) => {
            use std::os::unix::process::ExitStatusExt as _;
            match (status.code(), status.signal()) {
                (Some(c), _) => Ok(Exit::Code(c)),
                (None, Some(s)) => Ok(Exit::Signal(s)),
                (None, None) => Err(format!("unreadable status {status:?}")),
            }
        }
        (None, Err(e)) => Err(e.to_string()),
    };
    let result = result.map_err(|message| WaitError {
        pid: shared.pid,
        message,
    });
    tracing::debug!(pid = shared.pid, ?result, "reaped");
    exit_tx.send_replace(Some(result));
}

// ---------------------------------------------------------------------------------------------
// Reading output

/// Reads a chunk; 0 means stop (end of file, error, or the drain time after exit is over).
async fn read_some<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut [u8],
    exit: &mut watch::Receiver<ExitSlot>,
    deadline: &mut Option<Instant>,
) -> usize {
    loop {
        if deadline.is_none() && exit.borrow().is_some() {
            *deadline = Some(Instant::now() + DRAIN_AFTER_EXIT);
        }
        match *deadline {
            Some(d) => {
                return tokio::select! {
                    r = src.read(buf) => r.unwrap_or(0),
                    _ = tokio::time::sleep_until(d) => 0,
                };
            }
            None => {
                tokio::select! {
                    r = src.read(buf) => return r.unwrap_or(0),
                    changed = exit.changed() => {
                        if changed.is_err() {
                            *deadline = Some(Instant::now() + DRAIN_AFTER_EXIT);
                        }
                    }
                }
            }
        }
    }
}

async fn read_stdout<R: AsyncRead + Unpin>(
    mut src: R,
    tx: mpsc::Sender<Line>,
    bytes: Arc<AtomicU64>,
    mut exit: watch::Receiver<ExitSlot>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut splitter = LineSplitter::new(MAX_LINE_BYTES);
    let mut ready = Vec::new();
    let mut deadline = None;
    // Once the caller is gone, keep draining the pipe so that the child never blocks on it.
    let mut listening = true;
    loop {
        let n = read_some(&mut src, &mut buf, &mut exit, &mut deadline).await;
        if n == 0 {
            break;
        }
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        splitter.push(&buf[..n], &mut ready);
        for line in ready.drain(..) {
            if listening && tx.send(line).await.is_err() {
                listening = false;
            }
        }
    }
    if let Some(line) = splitter.finish()
        && listening
    {
        let _ = tx.send(line).await;
    }
}

async fn read_stderr<R: AsyncRead + Unpin>(
    mut src: R,
    tail: Arc<Mutex<TailBuffer>>,
    mut exit: watch::Receiver<ExitSlot>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut deadline = None;
    loop {
        let n = read_some(&mut src, &mut buf, &mut exit, &mut deadline).await;
        if n == 0 {
            break;
        }
        lock(&tail).push(&buf[..n]);
    }
}

/// Splits a byte stream into bounded lines.
#[derive(Debug)]
struct LineSplitter {
    current: Vec<u8>,
    /// True while skipping the rest of a line that was cut.
    skipping: bool,
    max: usize,
}

impl LineSplitter {
    fn new(max: usize) -> Self {
        LineSplitter {
            current: Vec::new(),
            skipping: false,
            max,
        }
    }

    fn push(&mut self, mut chunk: &[u8], out: &mut Vec<Line>) {
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            self.take(&chunk[..i], out);
            if self.skipping {
                self.skipping = false;
            } else {
                let mut bytes = std::mem::take(&mut self.current);
                if bytes.last() == Some(&b'\r') {
                    bytes.pop();
                }
                out.push(line(bytes, false));
            }
            chunk = &chunk[i + 1..];
        }
        self.take(chunk, out);
    }

    /// Adds part of a line; cuts and delivers it when it grows past the limit.
    fn take(&mut self, part: &[u8], out: &mut Vec<Line>) {
        if self.skipping {
            return;
        }
        let room = self.max - self.current.len();
        if part.len() <= room {
            self.current.extend_from_slice(part);
        } else {
            self.current.extend_from_slice(&part[..room]);
            out.push(line(std::mem::take(&mut self.current), true));
            self.skipping = true;
        }
    }

    /// The last line when the stream ended without a newline.
    fn finish(self) -> Option<Line> {
        (!self.skipping && !self.current.is_empty()).then(|| line(self.current, false))
    }
}

fn line(bytes: Vec<u8>, truncated: bool) -> Line {
    let text = String::from_utf8(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    Line { text, truncated }
}

/// The last `cap` bytes of a stream.
#[derive(Debug)]
struct TailBuffer {
    buf: VecDeque<u8>,
    cap: usize,
    dropped: u64,
}

impl TailBuffer {
    fn new(cap: usize) -> Self {
        TailBuffer {
            buf: VecDeque::new(),
            cap,
            dropped: 0,
        }
    }

    fn push(&mut self, data: &[u8]) {
        let data = if data.len() > self.cap {
            self.dropped += (data.len() - self.cap) as u64;
            &data[data.len() - self.cap..]
        } else {
            data
        };
        let over = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        self.dropped += over as u64;
        self.buf.extend(data);
    }

    fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut bytes = Vec::with_capacity(self.buf.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        // A cut may have split a character: skip its continuation bytes.
        let start = if self.dropped > 0 {
            bytes
                .iter()
                .take(3)
                .take_while(|b| (**b & 0xC0) == 0x80)
                .count()
        } else {
            0
        };
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }
}

/// Locks a mutex, taking the data of a poisoned one (its holders never leave it half done).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

// ---------------------------------------------------------------------------------------------
// /proc, orphans

/// What sortie needs from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    state: char,
    pgrp: i32,
    flags: u64,
    start_time: u64,
    env_end: Option<u64>,
}

/// `PF_KTHREAD`: a kernel thread (no environment, ever).
const PF_KTHREAD: u64 = 0x0020_0000;

impl Stat {
    fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// True while an `execve` has not yet laid out the new environment: `/proc/<pid>/environ`
    /// reads empty for that instant (after the exec "succeeded" for the parent).
    fn in_exec(&self) -> bool {
        self.flags & PF_KTHREAD == 0 && self.env_end == Some(0) && !self.is_dead()
    }
}

fn read_stat(pid: u32) -> Option<Stat> {
    let bytes = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&String::from_utf8_lossy(&bytes))
}

/// Parses a stat line; the command name (field 2) may hold spaces and parentheses, so the
/// fields are counted from its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_ascii_whitespace().collect();
    // fields[0] is field 3 of proc_pid_stat(5).
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        state: field(3)?.chars().next()?,
        pgrp: field(5)?.parse().ok()?,
        flags: field(9)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
        env_end: field(51).and_then(|f| f.parse().ok()),
    })
}

/// The start time of a process in clock ticks since boot (`/proc/<pid>/stat` field 22), or
/// None when there is no such process. With the pid it names one process for good.
pub fn process_start_time(pid: u32) -> Option<u64> {
    read_stat(pid).map(|s| s.start_time)
}

/// True when the process `pid` started at `start_time` still runs (a zombie does not).
pub fn is_running(pid: u32, start_time: u64) -> bool {
    read_stat(pid).is_some_and(|s| s.start_time == start_time && !s.is_dead())
}

/// A process found by its marker variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedProcess {
    /// Its pid.
    pub pid: u32,
    /// Its start time (see [`process_start_time`]).
    pub start_time: u64,
    /// The marker's value, e.g. `<run-id>/<task>/<attempt>`.
    pub marker_value: String,
}

/// Every live process whose environment has `marker_key` set to a value starting with
/// `value_prefix`, by pid. Children inherit the marker, so an attempt's grandchildren are
/// found too. Entries that cannot be read (other users' processes, processes that vanished)
/// are skipped silently. Blocking (reads `/proc`, and may wait up to 100 ms for a process in
/// the middle of an exec): from async code, call it once, or through `spawn_blocking`.
pub fn find_marked(marker_key: &str, value_prefix: &str) -> Vec<MarkedProcess> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let needle = format!("{marker_key}=");
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Some(before) = read_stat(pid) else {
            continue;
        };
        let Some(environ) = read_environ(pid, before) else {
            continue;
        };
        let Some(value) = environ
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(needle.as_bytes()))
            .and_then(|v| std::str::from_utf8(v).ok())
        else {
            continue;
        };
        // The same process before and after reading its environment (no pid reuse between).
        if !value.starts_with(value_prefix)
            || before.is_dead()
            || process_start_time(pid) != Some(before.start_time)
        {
            continue;
        }
        found.push(MarkedProcess {
            pid,
            start_time: before.start_time,
            marker_value: value.to_owned(),
        });
    }
    found.sort_by_key(|p| p.pid);
    found
}

/// Reads a process's environment; a process caught in the middle of an exec is read again
/// (for at most [`EXEC_WAIT`]) once the exec has laid its environment out.
fn read_environ(pid: u32, mut stat: Stat) -> Option<Vec<u8>> {
    let start = std::time::Instant::now();
    loop {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        if !environ.is_empty() || !stat.in_exec() || start.elapsed() > EXEC_WAIT {
            return Some(environ);
        }
        std::thread::sleep(Duration::from_millis(1));
        stat = read_stat(pid).filter(|s| s.start_time == stat.start_time)?;
    }
}

/// What [`kill_group_if_same`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillResult {
    /// It was running and is gone now.
    Killed,
    /// It was not running (or the pid now belongs to another process): nothing was signalled.
    Gone,
    /// It was still running after SIGKILL and a wait, or we may not signal it.
    Survived,
}

/// Kills a process found after a crash, if `pid` still is the process that started at
/// `start_time`: SIGTERM to it and to its process group, SIGKILL to both after `grace`, then
/// waits until it is gone (a zombie counts as gone). The process is signalled itself too, for
/// a grandchild that changed group; sortie's own group is never signalled.
pub async fn kill_group_if_same(pid: u32, start_time: u64, grace: Duration) -> KillResult {
    if !is_running(pid, start_time) {
        return KillResult::Gone;
    }
    let own_group = nix::unistd::getpgrp().as_raw();
    let send = |sig: Signal| -> Result<bool, Errno> {
        let Some(stat) = read_stat(pid).filter(|s| s.start_time == start_time && !s.is_dead())
        else {
            return Ok(false);
        };
        if stat.pgrp > 1 && stat.pgrp != own_group {
            let _ = killpg(Pid::from_raw(stat.pgrp), sig);
        }
        match kill(pid_of(pid), sig) {
            Ok(()) | Err(Errno::ESRCH) => Ok(true),
            Err(e) => Err(e),
        }
    };
    match send(Signal::SIGTERM) {
        Ok(true) => {}
        Ok(false) => return KillResult::Gone,
        Err(e) => {
            tracing::warn!(pid, "cannot signal orphan: {e}");
            return KillResult::Survived;
        }
    }
    if wait_gone(pid, start_time, grace).await {
        return KillResult::Killed;
    }
    if let Err(e) = send(Signal::SIGKILL) {
        tracing::warn!(pid, "cannot signal orphan: {e}");
        return KillResult::Survived;
    }
    if wait_gone(pid, start_time, KILL_WAIT).await {
        KillResult::Killed
    } else {
        KillResult::Survived
    }
}

/// Waits up to `limit` for a process to be gone; true when it is.
async fn wait_gone(pid: u32, start_time: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if !is_running(pid, start_time) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(GONE_POLL).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Tools

/// What a short-lived tool (git) printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// Its exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// Everything it printed on stdout.
    pub stdout: Vec<u8>,
    /// Everything it printed on stderr, decoded lossily.
    pub stderr: String,
}

impl ToolOutput {
    /// True when it exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Its stdout, decoded lossily, with surrounding whitespace trimmed.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).trim().to_owned()
    }
}

/// Why a tool could not be run at all (a tool that ran and failed is a [`ToolOutput`]).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The argv is empty.
    #[error("nothing to run: the command is empty")]
    EmptyArgv,
    /// It could not be started or waited for.
    #[error("cannot run `{program}`: {error}")]
    Io {
        /// The program as given.
        program: String,
        /// The failure.
        error: io::Error,
    },
}

/// Runs a short-lived tool (e.g. `git`) to its end in `cwd`, with `env` added to sortie's own
/// environment and stdin `/dev/null`, and returns what it printed. No shell is involved.
/// Dropping the future kills the tool. Unlike [`spawn`], for commands sortie runs itself, not
/// for attempts: no process group, no marker, output held in memory.
#[allow(clippy::disallowed_methods, reason = "the one place besides spawn")]
pub async fn run_tool(
    argv: &[String],
    cwd: &std::path::Path,
    env: &[(String, String)],
) -> Result<ToolOutput, ToolError> {
    let Some(program) = argv.first() else {
        return Err(ToolError::EmptyArgv);
    };
    let out = tokio::process::Command::new(program)
        .args(&argv[1..])
        .current_dir(cwd)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|error| ToolError::Io {
            program: program.clone(),
            error,
        })?;
    Ok(ToolOutput {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]], max: usize) -> Vec<Line> {
        let mut s = LineSplitter::new(max);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        out.extend(s.finish());
        out
    }

    fn texts(lines: &[Line]) -> Vec<(&str, bool)> {
        lines
            .iter()
            .map(|l| (l.text.as_str(), l.truncated))
            .collect()
    }

    #[test]
    fn splitter_joins_chunks_and_strips_crlf() {
        let lines = split(&[b"he", b"llo\r\nwor", b"ld\n\nlast"], 100);
        assert_eq!(
            texts(&lines),
            [
                ("hello", false),
                ("world", false),
                ("", false),
                ("last", false)
            ]
        );
    }

    #[test]
    fn splitter_cuts_long_lines_and_skips_their_rest() {
        let lines = split(&[b"abcdefgh", b"ijk\nok\n", b"0123456789"], 4);
        assert_eq!(
            texts(&lines),
            [("abcd", true), ("ok", false), ("0123", true)]
        );
        // Exactly the limit is not a cut.
        assert_eq!(texts(&split(&[b"abcd\n"], 4)), [("abcd", false)]);
    }

    #[test]
    fn splitter_decodes_garbage_lossily() {
        let lines = split(&[&[0xff, 0xfe, b'a', b'\n', 0xc3]], 100);
        assert_eq!(lines[0].text, "\u{fffd}\u{fffd}a");
        assert_eq!(lines[1].text, "\u{fffd}");
    }

    #[test]
    fn tail_buffer_keeps_the_end_at_a_char_boundary() {
        let mut t = TailBuffer::new(5);
        t.push(b"abc");
        assert_eq!(t.text(), "abc");
        t.push("déf".as_bytes()); // 4 more bytes: "ab" is dropped
        assert_eq!(t.text(), "cdéf");
        t.push("xyzéé".as_bytes()); // 7 bytes, more than the cap
        assert_eq!(t.text(), "zéé");
        t.push("é".as_bytes());
        // The cut falls inside the first é: its continuation byte is skipped.
        assert_eq!(t.text(), "éé");
    }

    #[test]
    fn parse_stat_counts_fields_after_the_command_name() {
        let line = "1234 (a b) c)) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                pgrp: 77,
                flags: 4194560,
                start_time: 987654,
                env_end: None,
            })
        );
        let mid_exec = "9 (sleep) R 8 9 9 0 -1 4194304 2 0 0 0 0 0 0 0 20 0 1 0 71274 4096 0 \
                        18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 \
                        140723747936916 0 0 0 0";
        let stat = parse_stat(mid_exec).unwrap();
        assert_eq!((stat.start_time, stat.env_end), (71274, Some(0)));
        assert!(stat.in_exec());
        let own = read_stat(std::process::id()).unwrap();
        assert!(!own.in_exec() && !own.is_dead());
        assert_eq!(own.pgrp, nix::unistd::getpgrp().as_raw());
        assert_eq!(parse_stat("garbage"), None);
    }

    #[tokio::test]
    async fn the_pid_reuse_guard_refuses_a_different_start_time() {
        let spec = SpawnSpec {
            argv: vec!["sleep".into(), "1000".into()],
            cwd: std::env::temp_dir(),
            env: vec![],
            marker: ("SORTIE_UNIT_TEST".into(), "guard".into()),
        };
        let mut child = spawn(&spec).await.expect("spawn");
        let forged = Shared {
            pid: child.pid,
            start_time: child.start_time + 1,
            reaped: Mutex::new(false),
            reason: OnceLock::new(),
            signaled: AtomicBool::new(false),
            exit: child.stopper.shared.exit.clone(),
        };
        assert!(!forged.signal_group(Signal::SIGKILL));
        assert!(is_running(child.pid, child.start_time));
        assert!(child.stopper.shared.signal_group(Signal::SIGKILL));
        assert_eq!(child.wait().await, Ok(Exit::Signal(9)));
        assert!(
            !child.stopper.shared.signal_group(Signal::SIGKILL),
            "a reaped leader is never signalled"
        );
    }
}
