//! The runner's errors: I/O and journal failures, a run owned by another process, a batch that
//! does not load. A task failing is not an error: it is an outcome in the journal.

use std::path::PathBuf;

use sortie_core::{RunId, Violation};

/// The runner's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why the runner could not go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory could not be used.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] sortie_journal::Error),
    /// An append to a live run's journal failed (a full disk, a file-size limit, its state dir
    /// removed). The run stopped at once: nothing more launched, its attempts killed. Unless
    /// the journal was removed, it holds every event acknowledged before, and the run resumes
    /// once the cause is gone.
    #[error("{}", journal_write_text(run, path, source))]
    JournalWrite {
        /// The run.
        run: RunId,
        /// Its journal's directory.
        path: PathBuf,
        /// The journal's error.
        source: sortie_journal::Error,
    },
    /// Another process owns the run.
    #[error("run {} is live{}: wait for it, or `sortie cancel` it", run_dir.display(), pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Live {
        /// The run's directory.
        run_dir: PathBuf,
        /// The owner's pid, when known.
        pid: Option<u32>,
    },
    /// A run with this id exists already.
    #[error("run {0} exists already; pick another --run-id or `sortie resume {0}`")]
    RunExists(RunId),
    /// No such run.
    #[error("no run {0} in this state dir")]
    NoSuchRun(RunId),
    /// No unfinished run to resume.
    #[error("no unfinished run to resume in {}", .0.display())]
    NothingToResume(PathBuf),
    /// The run has already finished.
    #[error("run {0} has already finished ({1})")]
    AlreadyFinished(RunId, String),
    /// A process of a crashed run's attempt could not be stopped: resuming would run its work
    /// twice. Nothing was recorded; the run stays resumable.
    #[error(
        "process {pid} of run {run} survived SIGKILL (or may not be signalled); stop it, then resume again"
    )]
    Survivor {
        /// The process.
        pid: u32,
        /// The run.
        run: RunId,
    },
    /// The runner decided an event that the state machine refuses: a bug in sortie.
    #[error("internal error: the runner decided an illegal event: {0}")]
    Violation(#[from] Violation),
    /// The batch did not load.
    #[error(transparent)]
    Batch(#[from] sortie_batch::BatchError),
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
    format!(
        "cannot write the journal of run {run} ({}): {source}; the run stopped (nothing more \
         launched, its attempts killed); the journal holds every event acknowledged before. \
         Once the cause is fixed (free disk space), `sortie resume {run}` goes on from there",
        path.display()
    )
}
