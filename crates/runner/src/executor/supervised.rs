//! The local supervised executor: each attempt runs under its own small supervisor
//! (`process::supervise`: `sortie __supervise`), which outlives sortie, writes the agent's output
//! to the attempt dir's files and its exit status, atomically, to its exit file. sortie follows
//! the files (`process::Followed`), so that a crash of sortie costs the agent nothing: resume
//! finds the attempt alive (adopted), ended (recorded from its files) or gone (orphaned).
//!
//! Why a supervisor per attempt rather than one shepherd per run: see ARCHITECTURE.md
//! (measured with `bench/dispatch.sh`).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use sortie_protocol::Exit;

use super::{
    Adoption, BoxFuture, Control, Execution, Executor, LaunchRequest, Presence, Sig, Started,
};
use crate::process::{
    self, DirPresence, Followed, Line, SpawnError, StartedFile, Stdin, WaitError,
};

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

    fn launch(&self, req: LaunchRequest) -> BoxFuture<'_, Result<Box<dyn Execution>, SpawnError>> {
        Box::pin(async move {
            if req.piped_stdin {
                return Err(SpawnError::Io {
                    program: req.spawn.argv.first().cloned().unwrap_or_default(),
                    error: io::Error::other("a supervised attempt's stdin cannot be a pipe"),
                });
            }
            let dir = req.placement.dir.clone();
            let stdin = req.stdin_file.as_deref();
            let child =
                process::spawn_supervised(&self.supervisor, &req.spawn, &dir, stdin).await?;
            let followed = Followed::new(&dir, 0, child.started, Some(child.process));
            Ok(Box::new(SupervisedExecution { followed }) as Box<dyn Execution>)
        })
    }

    fn find<'a>(&'a self, adoption: &'a Adoption) -> BoxFuture<'a, Presence> {
        let dir = adoption.placement.dir.clone();
        Box::pin(async move {
            let found = tokio::task::spawn_blocking(move || process::presence(&dir)).await;
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
            let Some(started) = process::read_started(&dir) else {
                return Err(SpawnError::Io {
                    program: "sortie".into(),
                    error: io::Error::other(format!("no supervisor record in {}", dir.display())),
                });
            };
            let followed = Followed::new(&dir, 0, started, None);
            Ok(Box::new(SupervisedExecution { followed }) as Box<dyn Execution>)
        })
    }

    fn signal<'a>(&'a self, adoption: &'a Adoption, sig: Sig) -> BoxFuture<'a, io::Result<bool>> {
        Box::pin(async move {
            let s: Option<StartedFile> = process::read_started(&adoption.placement.dir);
            Ok(s.is_some_and(|s| process::signal_group_if_same(s.pid, s.start_time, sig.nix())))
        })
    }
}

struct SupervisedExecution {
    followed: Followed,
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

    fn control(&self) -> Arc<dyn Control> {
        Arc::new(self.followed.stopper())
    }

    fn take_stdin(&mut self) -> Option<Stdin> {
        None
    }
}
