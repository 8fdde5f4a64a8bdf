//! The CLI edge (after jj's `command_error.rs`): every error gets its exit code where its type is
//! known, through the `From` impls below, not by searching a chain afterwards. Commands return
//! [`CliError`]; `?` picks the code. Context added with [`ResultExt`] keeps it.
//!
//! Exit codes (as README.md lists them): 0 completed, 1 failed or partial (or an error), 2 usage
//! error, 3 interrupted (resumable), 4 journal corrupt. A closed stdout (`sortie list | head -1`)
//! is graceful termination, as ripgrep has it: exit 0 and not a word.

use std::fmt::Display;
use std::io::Write;

use sortie_batch::BatchError;
use sortie_runner::worktree::kept::KeptError;

/// sortie's exit codes, as README.md lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// The run completed, or the command did its job.
    Ok = 0,
    /// The run failed or was partial, or the command failed.
    Failed = 1,
    /// A usage error.
    Usage = 2,
    /// The run was interrupted and can be resumed.
    Interrupted = 3,
    /// The journal is corrupt.
    Corrupt = 4,
    /// `sortie wait --timeout` gave up: the run goes on.
    StillRunning = 5,
}

impl From<Code> for std::process::ExitCode {
    fn from(c: Code) -> Self {
        std::process::ExitCode::from(c as u8)
    }
}

/// The cli's result type.
pub(crate) type Result<T, E = CliError> = std::result::Result<T, E>;

/// An error on its way out of `sortie`, with the exit code it was given where it arose.
#[derive(Debug)]
pub(crate) struct CliError {
    code: Code,
    err: anyhow::Error,
    /// stdout was closed under us: exit 0, say nothing.
    broken_pipe: bool,
}

impl CliError {
    /// An error with its code.
    pub(crate) fn new(code: Code, err: impl Into<anyhow::Error>) -> CliError {
        CliError {
            code,
            err: err.into(),
            broken_pipe: false,
        }
    }

    /// A mistake in how sortie was called (exit 2).
    pub(crate) fn usage(message: impl Display) -> CliError {
        CliError::new(Code::Usage, anyhow::anyhow!("{message}"))
    }

    fn broken_pipe(err: impl Into<anyhow::Error>) -> CliError {
        CliError {
            code: Code::Ok,
            err: err.into(),
            broken_pipe: true,
        }
    }

    /// The exit code.
    pub(crate) fn code(&self) -> Code {
        self.code
    }

    /// What went wrong, without the context added on the way out.
    pub(crate) fn cause(&self) -> String {
        self.err.root_cause().to_string()
    }

    /// The same error (and code) said in a wider context.
    pub(crate) fn context(self, context: impl Display + Send + Sync + 'static) -> CliError {
        CliError {
            err: self.err.context(context),
            ..self
        }
    }

    /// Says the error, each cause once (`{:#}`), unless stdout was merely closed: on stderr,
    /// or with `--json` (`json`) as [`print_json`] does.
    pub(crate) fn print(&self, json: bool) {
        if self.broken_pipe {
            return;
        }
        if json {
            print_json(&format!("{:#}", self.err), self.code);
        } else {
            let _ = writeln!(std::io::stderr(), "sortie: {:#}", self.err);
        }
    }
}

/// An error as `--json` says it: one line on stdout, `{"error": MESSAGE, "code": CODE}`, where
/// a script reading the command's JSON looks (docs/cli.md); the exit code is the same `code`.
pub(crate) fn print_json(message: &str, code: Code) {
    let _ = writeln!(std::io::stdout(), "{}", json_error(message, code));
}

/// The JSON object [`print_json`] prints.
pub(crate) fn json_error(message: &str, code: Code) -> serde_json::Value {
    serde_json::json!({ "error": message, "code": code as u8 })
}

/// `context`/`with_context` for results whose error becomes a [`CliError`], keeping its code.
pub(crate) trait ResultExt<T> {
    /// Adds context to the error.
    fn context<C: Display + Send + Sync + 'static>(self, context: C) -> Result<T>;
    /// Adds context, computed only on error.
    fn with_context<C: Display + Send + Sync + 'static>(self, f: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<CliError>> ResultExt<T> for std::result::Result<T, E> {
    fn context<C: Display + Send + Sync + 'static>(self, context: C) -> Result<T> {
        self.map_err(|e| e.into().context(context))
    }

    fn with_context<C: Display + Send + Sync + 'static>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| e.into().context(f()))
    }
}

/// An error of the cli's own making, such as a failed system call: exit 1.
impl From<anyhow::Error> for CliError {
    fn from(err: anyhow::Error) -> Self {
        CliError::new(Code::Failed, err)
    }
}

/// Writing stdout: a reader that went away early is graceful termination.
impl From<std::io::Error> for CliError {
    fn from(err: std::io::Error) -> Self {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            CliError::broken_pipe(err)
        } else {
            CliError::new(Code::Failed, err)
        }
    }
}

/// JSON on stdout: serde_json wraps the write error (and does not give it as its source).
impl From<serde_json::Error> for CliError {
    fn from(err: serde_json::Error) -> Self {
        if err.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe) {
            CliError::broken_pipe(err)
        } else {
            CliError::new(Code::Failed, err)
        }
    }
}

/// A run id that is not one: a usage error.
impl From<sortie_core::ids::InvalidRunId> for CliError {
    fn from(err: sortie_core::ids::InvalidRunId) -> Self {
        CliError::new(Code::Usage, err)
    }
}

/// A corrupt journal is 4; a missing or busy one is a usage error.
impl From<sortie_journal::Error> for CliError {
    fn from(err: sortie_journal::Error) -> Self {
        CliError::new(journal_code(&err), err)
    }
}

fn journal_code(e: &sortie_journal::Error) -> Code {
    use sortie_journal::Error;
    match e {
        _ if e.is_damage() => Code::Corrupt,
        Error::NotFound { .. } | Error::Locked { .. } => Code::Usage,
        _ => Code::Failed,
    }
}

/// A batch that does not load never runs: a usage error.
impl From<BatchError> for CliError {
    fn from(err: BatchError) -> Self {
        CliError::new(Code::Usage, err)
    }
}

/// Asking about a worktree that is not there is a usage error; failing at the job is 1.
impl From<KeptError> for CliError {
    fn from(err: KeptError) -> Self {
        let code = if err.is_usage() {
            Code::Usage
        } else {
            Code::Failed
        };
        CliError::new(code, Whole(err))
    }
}

/// The runner: a journal write that failed on a live run is resumable (3); a run that is not
/// there, not ours or already over is a usage error.
impl From<sortie_runner::Error> for CliError {
    fn from(err: sortie_runner::Error) -> Self {
        use sortie_runner::Error;
        let code = match &err {
            Error::Journal(j) => journal_code(j),
            Error::JournalWrite { .. } if err.is_resumable() => Code::Interrupted,
            Error::JournalWrite { .. } => Code::Failed,
            Error::Batch(_)
            | Error::Live { .. }
            | Error::NoSuchRun(_)
            | Error::RunExists(_)
            | Error::NothingToResume(_)
            | Error::AlreadyFinished(..)
            | Error::TooDeep(_) => Code::Usage,
            Error::Io { .. } | Error::Survivor { .. } | Error::Violation(_) => Code::Failed,
        };
        CliError::new(code, err)
    }
}

/// An error whose message already says its causes, shown as the end of the chain.
///
/// `KeptError`'s messages include their cause (`PATH: CAUSE`, `run RUN: JOURNAL ERROR`) because
/// `gc` folds them into its report as text (`kept.rs`, `gc`); their `source()` would say the
/// cause a second time under `{:#}`. Once the gc report prints chains, `KeptError` can say only
/// its context and this goes.
#[derive(Debug)]
struct Whole<E>(E);

impl<E: Display> Display for Whole<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: std::fmt::Debug + Display> std::error::Error for Whole<E> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn text(e: &CliError) -> String {
        format!("{:#}", e.err)
    }

    #[test]
    fn a_json_error_holds_the_message_and_the_exit_code() {
        assert_eq!(
            json_error("no run \"x\"", Code::Usage).to_string(),
            r#"{"code":2,"error":"no run \"x\""}"#
        );
    }

    #[test]
    fn a_broken_pipe_is_graceful_whatever_wrote_it() {
        let io = CliError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(io.broken_pipe);
        assert_eq!(io.code(), Code::Ok);
        let json = serde_json::to_writer(Pipe, &[1, 2, 3]).map_err(CliError::from);
        let json = json.expect_err("the write fails");
        assert!(json.broken_pipe);
        assert_eq!(json.code(), Code::Ok);
        let other = CliError::from(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert!(!other.broken_pipe);
        assert_eq!(other.code(), Code::Failed);
    }

    /// A writer whose reader went away.
    struct Pipe;

    impl Write for Pipe {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_error_gets_its_code_where_its_type_is_known() {
        let path = PathBuf::from("/x");
        let journal = |e| CliError::from(e).code();
        assert_eq!(
            journal(sortie_journal::Error::Corrupt {
                seq: sortie_core::Seq(3),
                reason: "bad".into()
            }),
            Code::Corrupt
        );
        assert_eq!(
            journal(sortie_journal::Error::NotFound { path: path.clone() }),
            Code::Usage
        );
        assert_eq!(journal(sortie_journal::Error::ReadOnly), Code::Failed);
        let run = sortie_core::RunId::new("r1").expect("a run id");
        let runner = |e| CliError::from(e).code();
        assert_eq!(
            runner(sortie_runner::Error::NoSuchRun(run.clone())),
            Code::Usage
        );
        assert_eq!(
            runner(sortie_runner::Error::Journal(
                sortie_journal::Error::Violation {
                    seq: sortie_core::Seq(1),
                    violation: sortie_core::Violation::SeqGap {
                        expected: sortie_core::Seq(1),
                        got: sortie_core::Seq(2),
                    },
                }
            )),
            Code::Corrupt
        );
        let full = || sortie_journal::Error::Io {
            path: path.clone(),
            source: std::io::Error::other("disk full"),
        };
        assert_eq!(
            runner(sortie_runner::Error::JournalWrite {
                run: run.clone(),
                path: path.clone(),
                source: full(),
            }),
            Code::Interrupted
        );
        assert_eq!(
            runner(sortie_runner::Error::JournalWrite {
                run,
                path: path.clone(),
                source: sortie_journal::Error::Removed { path: path.clone() },
            }),
            Code::Failed
        );
        assert_eq!(
            CliError::from(sortie_core::RunId::new("a/b").expect_err("not a run id")).code(),
            Code::Usage
        );
        assert_eq!(CliError::usage("no").code(), Code::Usage);
        assert_eq!(CliError::from(anyhow::anyhow!("x")).code(), Code::Failed);
    }

    #[test]
    fn context_keeps_the_code_and_each_cause_is_said_once() {
        let e: Result<()> = Err(sortie_journal::Error::Io {
            path: PathBuf::from("/state/runs/r1/journal"),
            source: std::io::Error::other("Permission denied"),
        })
        .context("cannot read run r1");
        let e = e.expect_err("an error");
        assert_eq!(e.code(), Code::Failed);
        assert_eq!(
            text(&e),
            "cannot read run r1: /state/runs/r1/journal: Permission denied"
        );
        let kept = CliError::from(KeptError::Io {
            path: PathBuf::from("/p"),
            source: std::io::Error::other("gone"),
        })
        .context("cannot diff");
        assert_eq!(text(&kept), "cannot diff: /p: gone");
        let batch = CliError::from(BatchError::Io {
            path: PathBuf::from("b.toml"),
            source: std::io::Error::other("No such file"),
        });
        assert_eq!(batch.code(), Code::Usage);
        assert_eq!(text(&batch), "b.toml: No such file");
        let runner = CliError::from(sortie_runner::Error::Io {
            path: PathBuf::from("/s"),
            source: std::io::Error::other("read-only"),
        });
        assert_eq!(text(&runner), "/s: read-only");
    }
}
