//! The one function that spawns an attempt's child: its own process group, the environment
//! plus the marker, stdin `/dev/null` or a pipe, stdout and stderr piped to the readers, and a
//! monitor that reaps it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::signal::unix::{SignalKind, signal as signal_stream};
use tokio::sync::{mpsc, watch};

use super::child::{Child, Shared, Stopper, monitor};
use super::lines::{LINE_QUEUE, STDERR_TAIL_BYTES, TailBuffer, read_stderr, read_stdout};
use super::procfs::process_start_time;
use super::stdin::Stdin;
use sortie_core::decide::SpawnFault;

use crate::layout::attempt::{STDERR_FILE, STDOUT_FILE, write_exit};
use crate::transcript::{Cap, Trimmer};
/// What to start.
#[derive(Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    /// The program and its arguments (see [`render_argv`](super::render_argv)).
    pub argv: Vec<String>,
    /// The working directory.
    pub cwd: PathBuf,
    /// Variables added to sortie's own environment (values may be secrets: never logged).
    pub env: Vec<(String, String)>,
    /// A variable set in the child's environment, e.g. `("SORTIE_ATTEMPT",
    /// "<run-id>/<task>/<attempt>/<incarnation>")`, by which [`find_marked`](super::find_marked) finds it after a
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
    /// The file is not a program the system can run (ENOEXEC: no `#!` line, not a binary).
    #[error(
        "cannot run `{program}`: it is not a program the system can run (a script needs a `#!` \
         line; exec format error)"
    )]
    NotExecutable {
        /// The program as given.
        program: String,
    },
    /// An argument or an environment value holds a NUL byte, which no program can be given.
    #[error("cannot run `{program}`: an argument or environment value holds a NUL byte")]
    NulByte {
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
    /// The arguments or the environment are over the system's limit (E2BIG).
    #[error("cannot run `{program}`: {why}")]
    ArgumentListTooLong {
        /// The program as given.
        program: String,
        /// Which argument or variable is over which limit ([`too_long`]).
        why: String,
    },
}

// The most bytes Linux takes in one argument or one `NAME=value` (MAX_ARG_STRLEN: 32 pages).
use crate::preflight::MAX_ARG_BYTES as MAX_ARG_STRLEN;

/// What made a spawn of `argv` with `env` added fail with E2BIG, for people: the first
/// argument or variable over [`MAX_ARG_STRLEN`], else the totals (over ARG_MAX).
pub(crate) fn too_long(argv: &[String], env: &[(String, String)]) -> String {
    if let Some((i, a)) = argv
        .iter()
        .enumerate()
        .find(|(_, a)| a.len() >= MAX_ARG_STRLEN)
    {
        return format!(
            "argument {i} is {} bytes, over the {MAX_ARG_STRLEN} bytes Linux allows one argument \
             (a prompt this long goes on stdin: a profile whose command has no {{prompt}} gets it there)",
            a.len()
        );
    }
    if let Some((name, value)) = env
        .iter()
        .find(|(k, v)| k.len() + v.len() + 1 >= MAX_ARG_STRLEN)
    {
        return format!(
            "the environment variable {name} is {} bytes, over the {MAX_ARG_STRLEN} bytes Linux \
             allows one variable",
            value.len()
        );
    }
    let args: usize = argv.iter().map(|a| a.len() + 1).sum();
    let vars: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    format!(
        "argument list too long: {args} bytes of arguments and {vars} bytes of added environment \
         are over the system's total (ARG_MAX)"
    )
}

/// The word by which a supervisor or the shepherd reports why a spawn failed (read back by
/// [`SpawnError::from_kind`]).
pub(crate) fn kind_of(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::NotFound => "not_found",
        io::ErrorKind::PermissionDenied => "permission_denied",
        io::ErrorKind::ArgumentListTooLong => "too_long",
        io::ErrorKind::InvalidInput if e.to_string().contains("nul byte") => "nul_byte",
        _ if e.raw_os_error() == Some(libc::ENOEXEC) => "not_executable",
        _ => "io",
    }
}

impl SpawnError {
    /// What went wrong, as core's rule of retries reads it ([`SpawnFault::deterministic`]).
    pub fn fault(&self) -> SpawnFault {
        match self {
            SpawnError::EmptyArgv => SpawnFault::EmptyCommand,
            SpawnError::NotFound { .. } => SpawnFault::NotFound,
            SpawnError::PermissionDenied { .. } => SpawnFault::PermissionDenied,
            SpawnError::NotExecutable { .. } => SpawnFault::NotExecutable,
            SpawnError::NulByte { .. } => SpawnFault::NulByte,
            SpawnError::BadCwd { .. } => SpawnFault::BadCwd,
            SpawnError::ArgumentListTooLong { .. } => SpawnFault::TooLong,
            SpawnError::Io { .. } | SpawnError::NoProcStat { .. } => SpawnFault::Other,
        }
    }

    /// The error a `kind` word ([`kind_of`]) stands for; `too_long` says why (see
    /// [`too_long`]), `msg` is the text of any other.
    pub fn from_kind(kind: &str, program: String, msg: &str, why_too_long: String) -> SpawnError {
        match kind {
            "not_found" => SpawnError::NotFound { program },
            "permission_denied" => SpawnError::PermissionDenied { program },
            "not_executable" => SpawnError::NotExecutable { program },
            "nul_byte" => SpawnError::NulByte { program },
            "too_long" => SpawnError::ArgumentListTooLong {
                program,
                why: why_too_long,
            },
            _ => SpawnError::Io {
                program,
                error: io::Error::other(msg.to_owned()),
            },
        }
    }
}

/// Starts a child as described by `spec` (see the module doc for what the child gets).
///
/// Must be called within a tokio runtime: the child's monitor and output readers are tasks.
pub async fn spawn(spec: &SpawnSpec) -> Result<Child, SpawnError> {
    spawn_child(spec, StdinFrom::Null, None).await
}

/// Like [`spawn`], but the child's stdin is a pipe: [`Child::take_stdin`] gives the handle
/// that writes to it, and dropping that handle closes it (EOF). For agents driven by commands
/// on stdin (pi's RPC mode).
pub async fn spawn_piped(spec: &SpawnSpec) -> Result<Child, SpawnError> {
    spawn_child(spec, StdinFrom::Piped, None).await
}

/// Like [`spawn`], but the child reads its stdin from the file at `stdin`: how an agent gets a
/// prompt of any size (no argv limit, no pipe to keep fed). A file that cannot be opened is a
/// [`SpawnError::Io`].
pub async fn spawn_stdin_file(spec: &SpawnSpec, stdin: &Path) -> Result<Child, SpawnError> {
    spawn_child(spec, StdinFrom::File(open_stdin(spec, stdin)?), None).await
}

fn open_stdin(spec: &SpawnSpec, stdin: &Path) -> Result<std::fs::File, SpawnError> {
    let program = spec.argv.first().cloned().unwrap_or_default();
    std::fs::File::open(stdin).map_err(|error| SpawnError::Io {
        program,
        error: io::Error::new(
            error.kind(),
            format!("cannot open its stdin {}: {error}", stdin.display()),
        ),
    })
}

/// Like [`spawn`] (stdin a pipe when `piped`, else the file `stdin_file`, else `/dev/null`),
/// and what is read from the child's stdout and stderr is written to the attempt dir `dir`'s
/// `stdout` and `stderr` files too, under the transcript cap (see `transcript`), then its exit
/// to `exit` once both are complete: a direct attempt keeps the same transcript as a
/// supervised one.
pub async fn spawn_transcribed(
    spec: &SpawnSpec,
    piped: bool,
    stdin_file: Option<&Path>,
    dir: &Path,
) -> Result<Child, SpawnError> {
    let stdin = match (piped, stdin_file) {
        (true, _) => StdinFrom::Piped,
        (false, Some(file)) => StdinFrom::File(open_stdin(spec, file)?),
        (false, None) => StdinFrom::Null,
    };
    spawn_child(spec, stdin, Some(dir)).await
}

/// Where a child's stdin comes from.
enum StdinFrom {
    Null,
    Piped,
    File(std::fs::File),
}

async fn spawn_child(
    spec: &SpawnSpec,
    stdin: StdinFrom,
    transcript: Option<&Path>,
) -> Result<Child, SpawnError> {
    let program = spec.argv.first().cloned().unwrap_or_default();
    // Listening before the child exists: its SIGCHLD cannot be missed.
    let sigchld = signal_stream(SignalKind::child()).ok();
    // The files and the fork and exec (`Command::spawn` waits until the exec happened) on
    // tokio's blocking pool: a run's owner has one thread (`sortie`'s runtime), and sixteen
    // spawns in a row on it were most of the wall time of `supervise = false` dispatch.
    let started = {
        let (spec, dir) = (spec.clone(), transcript.map(Path::to_path_buf));
        tokio::task::spawn_blocking(move || start_child(&spec, &stdin, dir.as_deref())).await
    };
    let (mut child, pid, start_time, out_file, err_file) = match started {
        Ok(started) => started?,
        Err(join) => {
            return Err(SpawnError::Io {
                program,
                error: io::Error::other(format!("the spawn did not finish: {join}")),
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
    let stdout_task = child.stdout.take().map(|out| {
        tokio::spawn(read_stdout(
            out,
            line_tx,
            Arc::clone(&stdout_bytes),
            exit_rx.clone(),
            out_file,
        ))
    });
    let (err_done, err_done_rx) = tokio::sync::oneshot::channel::<()>();
    let stderr_task = child.stderr.take().map(|err| {
        let (tail, exit) = (Arc::clone(&stderr), exit_rx.clone());
        tokio::spawn(async move {
            read_stderr(err, tail, exit, err_file).await;
            let _ = err_done.send(());
        })
    });
    if let Some(dir) = transcript {
        tokio::spawn(record_exit(
            dir.to_path_buf(),
            stdout_task,
            err_done_rx,
            exit_rx.clone(),
        ));
    }
    let stdin = child.stdin.take().map(Stdin::child);
    // #32: an attempt's descendants that left its group are stopped when it ends.
    let marker = (spec.marker.0 == super::MARKER).then(|| spec.marker.1.clone());
    tokio::spawn(monitor(
        child,
        Arc::clone(&shared),
        sigchld,
        exit_tx,
        marker,
    ));

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

/// A started child, its pid and start time, and its transcript files.
type Started = (
    tokio::process::Child,
    u32,
    u64,
    Option<Trimmer>,
    Option<Trimmer>,
);

/// What [`spawn_child`] does on the blocking pool: checks the working directory, creates the
/// transcript files in `transcript`, starts the child and reads its start time.
fn start_child(
    spec: &SpawnSpec,
    stdin: &StdinFrom,
    transcript: Option<&Path>,
) -> Result<Started, SpawnError> {
    let Some(program) = spec.argv.first() else {
        return Err(SpawnError::EmptyArgv);
    };
    check_cwd(program, &spec.cwd)?;
    let (out_file, err_file) = match transcript {
        Some(dir) => {
            let cap = Cap::from_env();
            let open = |name| {
                Trimmer::create(&dir.join(name), cap).map_err(|error| SpawnError::Io {
                    program: program.clone(),
                    error: io::Error::new(
                        error.kind(),
                        format!("cannot create its transcript in {}: {error}", dir.display()),
                    ),
                })
            };
            (Some(open(STDOUT_FILE)?), Some(open(STDERR_FILE)?))
        }
        None => (None, None),
    };
    // The program found on PATH once (see `resolve`); found no more, by its name again.
    let spawned = super::resolve::spawn_resolved(program, &spec.env, |path| {
        command(spec, path, stdin).and_then(|mut c| c.spawn())
    });
    let mut child = spawned.map_err(|error| match kind_of(&error) {
        "io" => SpawnError::Io {
            program: program.clone(),
            error,
        },
        kind => SpawnError::from_kind(kind, program.clone(), "", too_long(&spec.argv, &spec.env)),
    })?;
    // Unreaped, so the id is there; and a pid always fits an i32 (pid_max <= 2^22).
    let pid = child.id().unwrap_or(0);
    match process_start_time(pid) {
        Some(t) if pid != 0 => Ok((child, pid, t, out_file, err_file)),
        _ => {
            // Dropped right after: kill_on_drop kills it and tokio reaps it.
            let _ = child.start_kill();
            Err(SpawnError::NoProcStat {
                program: program.clone(),
                pid,
            })
        }
    }
}

/// The command that starts `spec` as `program` (argv[0] stays the spec's).
#[allow(clippy::disallowed_methods, reason = "the one spawn function")]
fn command(
    spec: &SpawnSpec,
    program: &Path,
    stdin: &StdinFrom,
) -> io::Result<tokio::process::Command> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg0(&spec.argv[0])
        .args(&spec.argv[1..])
        .current_dir(&spec.cwd)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env(&spec.marker.0, &spec.marker.1)
        .stdin(match stdin {
            StdinFrom::Null => Stdio::null(),
            StdinFrom::Piped => Stdio::piped(),
            StdinFrom::File(file) => Stdio::from(file.try_clone()?),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    Ok(cmd)
}

/// Writes a direct attempt's `exit` file once its transcript is complete and its leader reaped.
async fn record_exit(
    dir: PathBuf,
    stdout: Option<tokio::task::JoinHandle<()>>,
    stderr: tokio::sync::oneshot::Receiver<()>,
    mut exit: watch::Receiver<super::exit::ExitSlot>,
) {
    if let Some(t) = stdout {
        let _ = t.await;
    }
    let _ = stderr.await;
    let Ok(slot) = exit.wait_for(Option::is_some).await else {
        return;
    };
    if let Some(Ok(status)) = slot.clone() {
        let _ = write_exit(&dir, status);
    }
}

/// Checked before a spawn: a missing cwd fails exec with the same ENOENT as a missing program.
pub(crate) fn check_cwd(program: &str, cwd: &std::path::Path) -> Result<(), SpawnError> {
    let cwd_ok = std::fs::metadata(cwd).and_then(|m| {
        if m.is_dir() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory",
            ))
        }
    });
    cwd_ok.map_err(|error| SpawnError::BadCwd {
        program: program.to_owned(),
        cwd: cwd.to_path_buf(),
        error,
    })
}
