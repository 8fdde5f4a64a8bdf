//! The local supervised executor: each attempt runs under its own small supervisor
//! (`supervisor::supervise`: `sortie __supervise`), which outlives sortie, writes the agent's
//! output to the attempt dir's files and its exit status, atomically, to its exit file. sortie
//! follows the files (`transcript::Followed`), so that a crash of sortie costs the agent nothing:
//! resume finds the attempt alive (adopted), ended (recorded from its files) or gone (orphaned).
//!
//! By default the supervisor is the run's shepherd (`supervisor::shepherd`: one long-lived process
//! that starts every supervised attempt of the run); `SORTIE_SUPERVISION=attempt` gives each
//! attempt its own (`sortie __supervise`). Both record the same (the shepherd its `started` and
//! `exit` records in the run's status log, `supervisor::status_log`, not in two files per attempt,
//! and its attempts' `stdout` and `stderr` beside the attempt dir's name, not in a dir:
//! `layout::attempt::AttemptFiles`), read by the same functions, so adoption and resume do not tell
//! them apart. The shepherd won on `bench/dispatch.sh`: a supervisor per attempt is an exec of the
//! sortie binary per attempt (see docs/design/shepherd.md).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use sortie_protocol::Exit;

use super::{
    Adoption, BoxFuture, Capabilities, Control, Execution, Executor, LaunchRequest, Presence, Sig,
    Started,
};
use crate::layout::attempt::{AttemptFiles, StartedFile};
use crate::process::{self, Line, SpawnError, Stdin, WaitError};
use crate::supervisor::{self, DirPresence};
use crate::transcript::{Followed, Watcher};

/// The variable that picks a supervisor per attempt (`attempt`) instead of the run's
/// shepherd (the default): both write the same files, and resume reads either; kept so that
/// `bench/dispatch.sh` measures both in the same run.
pub const SUPERVISION_VAR: &str = "SORTIE_SUPERVISION";

/// Whether attempts get a supervisor each ([`SUPERVISION_VAR`] `=attempt`).
fn per_attempt() -> bool {
    static PER_ATTEMPT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PER_ATTEMPT.get_or_init(|| std::env::var(SUPERVISION_VAR).is_ok_and(|v| v == "attempt"))
}

/// The local supervised executor; `supervisor` is the program run as `<program> __supervise`
/// (the sortie binary itself).
#[derive(Debug, Clone)]
pub struct Supervised {
    supervisor: PathBuf,
}

impl Supervised {
    /// The executor, with the supervisor program.
    pub fn new(supervisor: PathBuf) -> Supervised {
        Supervised { supervisor }
    }
}

impl Executor for Supervised {
    fn kind(&self) -> &'static str {
        super::SUPERVISED
    }

    // A supervisor of its own on this machine, files for its output.
    fn can(&self) -> Capabilities {
        Capabilities {
            outlives_sortie: true,
            follows_files: true,
            clocks_from_real_start: false,
            polls_in_batch: false,
            repairs_locally: true,
        }
    }

    fn launch(&self, req: LaunchRequest) -> BoxFuture<'_, Result<Box<dyn Execution>, SpawnError>> {
        Box::pin(async move {
            let dir = req.placement.dir.clone();
            let file = if req.piped_stdin {
                None
            } else {
                req.stdin_file.as_deref()
            };
            // An agent driven over stdin needs its own supervisor (the FIFO's forwarder); the
            // others start through the run's shepherd unless SORTIE_SUPERVISION=attempt.
            let followed = if per_attempt() || req.piped_stdin {
                let child = supervisor::spawn_supervised(
                    &self.supervisor,
                    &req.spawn,
                    &dir,
                    file,
                    req.piped_stdin,
                )
                .await?;
                let files = AttemptFiles::inside(&dir);
                Followed::new(
                    &dir,
                    files,
                    0,
                    child.started,
                    Watcher::Supervisor(child.process),
                )
            } else {
                // No dir of its own: its files lie beside the dir's name.
                let files = AttemptFiles::beside(&dir);
                let s =
                    supervisor::spawn_shepherded(&self.supervisor, &req.spawn, &dir, &files, file)
                        .await?;
                Followed::new(&dir, files, 0, s.started, Watcher::Shepherd(s))
            };
            // #10: an agent driven over stdin is written to through its supervisor's FIFO.
            let stdin = if req.piped_stdin {
                Some(Stdin::fifo(&dir).map_err(|error| SpawnError::Io {
                    program: req.spawn.argv.first().cloned().unwrap_or_default(),
                    error,
                })?)
            } else {
                None
            };
            Ok(Box::new(SupervisedExecution {
                followed,
                stdin,
                dir,
            }) as Box<dyn Execution>)
        })
    }

    fn find<'a>(&'a self, adoption: &'a Adoption) -> BoxFuture<'a, Presence> {
        let dir = adoption.placement.dir.clone();
        Box::pin(async move {
            let found = tokio::task::spawn_blocking(move || supervisor::presence(&dir)).await;
            match found {
                Ok(DirPresence::Alive(_)) => Presence::Alive,
                Ok(DirPresence::Ended(exit)) => Presence::Ended(exit),
                Ok(DirPresence::Gone) | Err(_) => Presence::Gone,
            }
        })
    }

    fn adopt(&self, adoption: Adoption) -> BoxFuture<'_, Result<Box<dyn Execution>, SpawnError>> {
        Box::pin(async move {
            let dir = adoption.placement.dir.clone();
            // #32: an ended attempt that no supervisor ran (a direct one, restored by `recover`
            // from the files sortie wrote) has no `started` record: its exit is read at once,
            // and no supervisor is waited for.
            let ended_unsupervised = || {
                supervisor::read_exit(&dir).map(|_| StartedFile {
                    pid: adoption.started.map_or(0, |s| s.pid),
                    start_time: adoption.started.map_or(0, |s| s.start_time),
                    supervisor: 0,
                    supervisor_start: 0,
                })
            };
            let Some(started) = supervisor::read_started(&dir).or_else(ended_unsupervised) else {
                return Err(SpawnError::Io {
                    program: "sortie".into(),
                    error: io::Error::other(format!("no supervisor record in {}", dir.display())),
                });
            };
            let followed = Followed::new(&dir, AttemptFiles::of(&dir), 0, started, Watcher::Files);
            // An agent driven over stdin is steered on through its FIFO, if it still runs.
            let stdin = dir
                .join(crate::layout::attempt::STDIN_FIFO)
                .exists()
                .then(|| Stdin::fifo(&dir).ok())
                .flatten();
            Ok(Box::new(SupervisedExecution {
                followed,
                stdin,
                dir,
            }) as Box<dyn Execution>)
        })
    }

    fn signal<'a>(&'a self, adoption: &'a Adoption, sig: Sig) -> BoxFuture<'a, io::Result<bool>> {
        Box::pin(async move {
            let s: Option<StartedFile> = supervisor::read_started(&adoption.placement.dir);
            Ok(s.is_some_and(|s| process::signal_group_if_same(s.pid, s.start_time, sig.nix())))
        })
    }
}

struct SupervisedExecution {
    followed: Followed,
    stdin: Option<Stdin>,
    /// Its attempt dir (#32: where its supervisor marks a failure on a full disk).
    dir: PathBuf,
}

impl Execution for SupervisedExecution {
    fn started(&mut self) -> BoxFuture<'_, Result<Started, SpawnError>> {
        let s = Started {
            pid: self.followed.started.pid,
            start_time: self.followed.started.start_time,
        };
        Box::pin(async move { Ok(s) })
    }

    fn next_line(&mut self) -> BoxFuture<'_, Option<Line>> {
        Box::pin(self.followed.next_line())
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<Exit, WaitError>> {
        Box::pin(self.followed.wait())
    }

    fn stderr_tail(&self) -> String {
        self.followed.stderr_tail()
    }

    fn stdout_offset(&self) -> u64 {
        // At a line's end: what the journal may record as read (`AttemptRead`).
        self.followed.line_end()
    }

    fn cut_before(&self) -> bool {
        self.followed.cut_before()
    }

    fn control(&self) -> Arc<dyn Control> {
        Arc::new(self.followed.stopper())
    }

    fn take_stdin(&mut self) -> Option<Stdin> {
        self.stdin.take()
    }

    fn output_lost(&self) -> Option<String> {
        supervisor::read_nospace(&self.dir).then(|| {
            let at = self.dir.parent().unwrap_or(&self.dir);
            format!("the disk of its output ({}) was full", at.display())
        })
    }
}
