//! The runner's errors: I/O and journal failures, a run owned by another process, a batch that
//! does not load. A task failing is not an error: it is an outcome in the journal.

use std::path::PathBuf;

use sortie_core::{RunId, Violation};

/// The runner's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why the runner could not go on.
///
/// Each message is whole: it says its cause (an I/O error, the journal's error, the violation)
/// itself, and [`std::error::Error::source`] gives none, so a chain printed with `{:#}` says
/// every cause once. Whole messages matter because callers fold them into text of their own
/// (a failed artifact write goes into the task's journaled error). `Batch` is transparent: the
/// batch error, with its own cause chain.
#[derive(Debug)]
pub enum Error {
    /// A file or directory could not be used.
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The journal failed.
    Journal(sortie_journal::Error),
    /// An append to a live run's journal failed (a full disk, a file-size limit, its state dir
    /// removed). The run stopped at once: nothing more launched, its attempts killed. Unless
    /// the journal was removed, it holds every event acknowledged before, and the run resumes
    /// once the cause is gone.
    JournalWrite {
        /// The run.
        run: RunId,
        /// Its journal's directory.
        path: PathBuf,
        /// The journal's error.
        source: sortie_journal::Error,
    },
    /// Another process owns the run.
    Live {
        /// The run's directory.
        run_dir: PathBuf,
        /// The owner's pid, when known.
        pid: Option<u32>,
    },
    /// A run with this id exists already.
    RunExists(RunId),
    /// No such run.
    NoSuchRun(RunId),
    /// No unfinished run to resume.
    NothingToResume(PathBuf),
    /// The run has already finished.
    AlreadyFinished(RunId, String),
    /// A process of a crashed run's attempt could not be stopped: resuming would run its work
    /// twice. Nothing was recorded; the run stays resumable.
    Survivor {
        /// The process.
        pid: u32,
        /// The run.
        run: RunId,
    },
    /// The runner decided an event that the state machine refuses: a bug in sortie.
    Violation(Violation),
    /// The batch did not load.
    Batch(sortie_batch::BatchError),
    /// A run started nested deeper than `slots::MAX_DEPTH` in other runs' attempts.
    TooDeep(u32),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Journal(e) => e.fmt(f),
            Error::JournalWrite { run, path, source } => {
                f.write_str(&journal_write_text(run, path, source))
            }
            Error::Live { run_dir, pid } => write!(
                f,
                "run {} is live{}: wait for it, or `sortie cancel` it",
                run_dir.display(),
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
            ),
            Error::RunExists(run) => write!(
                f,
                "run {run} exists already; pick another --run-id or `sortie resume {run}`"
            ),
            Error::NoSuchRun(run) => write!(f, "no run {run} in this state dir"),
            Error::TooDeep(depth) => write!(
                f,
                "this run would be nested {depth} deep in other runs' attempts ({}={depth}); \
                 sortie nests at most {} deep",
                crate::slots::DEPTH_VAR,
                crate::slots::MAX_DEPTH
            ),
            Error::NothingToResume(dir) => {
                write!(f, "no unfinished run to resume in {}", dir.display())
            }
            Error::AlreadyFinished(run, state) => {
                write!(f, "run {run} has already finished ({state})")
            }
            Error::Survivor { pid, run } => write!(
                f,
                "process {pid} of run {run} survived SIGKILL (or may not be signalled); stop it, \
                 then resume again"
            ),
            Error::Violation(v) => {
                write!(
                    f,
                    "internal error: the runner decided an illegal event: {v}"
                )
            }
            Error::Batch(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the batch error's own cause.
            Error::Batch(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl From<sortie_journal::Error> for Error {
    fn from(e: sortie_journal::Error) -> Self {
        Error::Journal(e)
    }
}

impl From<Violation> for Error {
    fn from(v: Violation) -> Self {
        Error::Violation(v)
    }
}

impl From<sortie_batch::BatchError> for Error {
    fn from(e: sortie_batch::BatchError) -> Self {
        Error::Batch(e)
    }
}

impl Error {
    /// Whether the run this error stopped can be resumed as it is (exit code 3): a journal
    /// write that failed while the journal itself is still there.
    pub fn is_resumable(&self) -> bool {
        matches!(self, Error::JournalWrite { source, .. } if !matches!(source, sortie_journal::Error::Removed { .. }))
    }
}

fn journal_write_text(
    run: &RunId,
    path: &std::path::Path,
    source: &sortie_journal::Error,
) -> String {
    if let sortie_journal::Error::Removed { .. } = source {
        return format!(
            "{source}; run {run} stopped and its attempts were killed; nothing of it can be \
             resumed"
        );
    }
    // The path once: an I/O error names it already.
    let cause = source.to_string();
    let path = path.display().to_string();
    let at = if cause.starts_with(&path) {
        String::new()
    } else {
        format!(" ({path})")
    };
    format!(
        "cannot write the journal of run {run}{at}: {cause}; the run stopped (nothing more \
         launched, its attempts killed); the journal holds every event acknowledged before. \
         Once the cause is fixed (free disk space), `sortie resume {run}` goes on from there"
    )
}
