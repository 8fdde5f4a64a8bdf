//! The direct executor: the attempt is a child of sortie in its own process group, its output
//! read from pipes (`process::spawn_transcribed`) and written by sortie to the attempt dir's
//! `stdout` and `stderr` (the transcript, under the same cap as a supervised attempt's), its
//! exit to `exit` once they are complete. It dies with sortie: after a crash it is never found
//! alive ([`Presence::Gone`]); resume kills what is left of it by its marker.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use sortie_core::StopReason;
use sortie_protocol::Exit;

use super::{
    Adoption, BoxFuture, Capabilities, Control, Execution, Executor, LaunchRequest, Presence, Sig,
    Started,
};
use crate::process::{self, Child, Line, SpawnError, Stdin, Stopper, WaitError};

/// The direct executor (see the module doc).
#[derive(Debug, Clone, Copy, Default)]
pub struct Direct;

impl Executor for Direct {
    fn kind(&self) -> &'static str {
        super::DIRECT
    }

    // A child of sortie with pipes: it dies with sortie, and runs here.
    fn can(&self) -> Capabilities {
        Capabilities {
            outlives_sortie: false,
            follows_files: false,
            clocks_from_real_start: false,
            polls_in_batch: false,
            repairs_locally: true,
        }
    }

    fn launch(&self, req: LaunchRequest) -> BoxFuture<'_, Result<Box<dyn Execution>, SpawnError>> {
        Box::pin(async move {
            // Sortie writes what it reads: the same transcript files as a supervised attempt.
            let child = process::spawn_transcribed(
                &req.spawn,
                req.piped_stdin,
                req.stdin_file.as_deref(),
                &req.placement.dir,
            )
            .await?;
            Ok(Box::new(DirectExecution { child }) as Box<dyn Execution>)
        })
    }

    fn find<'a>(&'a self, _: &'a Adoption) -> BoxFuture<'a, Presence> {
        // Its pipes were sortie's: whatever is left of it cannot be followed.
        Box::pin(async { Presence::Gone })
    }

    fn adopt(&self, _: Adoption) -> BoxFuture<'_, Result<Box<dyn Execution>, SpawnError>> {
        Box::pin(async {
            Err(SpawnError::Io {
                program: "sortie".into(),
                error: io::Error::other("a direct attempt cannot be adopted"),
            })
        })
    }

    fn signal<'a>(&'a self, adoption: &'a Adoption, sig: Sig) -> BoxFuture<'a, io::Result<bool>> {
        Box::pin(async move {
            Ok(match adoption.started {
                Some(s) => process::signal_group_if_same(s.pid, s.start_time, sig.nix()),
                None => false,
            })
        })
    }
}

struct DirectExecution {
    child: Child,
}

impl Execution for DirectExecution {
    fn started(&mut self) -> BoxFuture<'_, Result<Started, SpawnError>> {
        let s = Started {
            pid: self.child.pid,
            start_time: self.child.start_time,
        };
        Box::pin(async move { Ok(s) })
    }

    fn next_line(&mut self) -> BoxFuture<'_, Option<Line>> {
        Box::pin(self.child.next_line())
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<Exit, WaitError>> {
        Box::pin(self.child.wait())
    }

    fn stderr_tail(&self) -> String {
        self.child.stderr_tail()
    }

    fn stdout_offset(&self) -> u64 {
        self.child.stdout_bytes()
    }

    fn control(&self) -> Arc<dyn Control> {
        Arc::new(self.child.stopper())
    }

    fn take_stdin(&mut self) -> Option<Stdin> {
        self.child.take_stdin()
    }
}

impl Control for Stopper {
    fn signal(&self, sig: Sig) -> io::Result<bool> {
        Ok(self.signal_group(sig.nix()))
    }

    fn stop(&self, reason: StopReason, grace: Duration) -> BoxFuture<'static, StopReason> {
        let s = self.clone();
        Box::pin(async move { s.stop(reason, grace).await })
    }

    fn sent_reason(&self) -> Option<StopReason> {
        Stopper::sent_reason(self)
    }
}
