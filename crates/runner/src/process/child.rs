//! A running child: the handle the attempt reads and waits on, the monitor that reaps the
//! leader (seeing its exit first with `waitid` and `WNOWAIT`, so that its group id cannot be
//! reused while what is left of the group is killed), and the [`Stopper`] (TERM, grace, KILL,
//! each signal behind the pid-reuse guard).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use sortie_core::StopReason;
use sortie_protocol::Exit;
use tokio::signal::unix::Signal as SignalStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::exit::{ExitSlot, WaitError};
use super::lines::{Line, TailBuffer};
use super::orphan::KILL_WAIT;
use super::procfs::{pid_of, process_start_time};
use super::stdin::Stdin;
use crate::sync::lock;

/// How often the monitor checks the leader even without a SIGCHLD (a safety net).
const EXIT_POLL: Duration = Duration::from_secs(1);
/// How often the monitor checks when SIGCHLD cannot be listened to.
const EXIT_POLL_WITHOUT_SIGCHLD: Duration = Duration::from_millis(50);

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
    pub(super) stopper: Stopper,
    pub(super) lines: mpsc::Receiver<Line>,
    pub(super) stderr: Arc<Mutex<TailBuffer>>,
    pub(super) stderr_task: Option<JoinHandle<()>>,
    pub(super) stdout_bytes: Arc<AtomicU64>,
    pub(super) stdin: Option<Stdin>,
}

impl Child {
    /// The write end of the child's stdin, when it was spawned with [`spawn_piped`](super::spawn_piped) (once).
    pub fn take_stdin(&mut self) -> Option<Stdin> {
        self.stdin.take()
    }

    /// The next stdout line, or None once stdout is closed (or abandoned
    /// [`DRAIN_AFTER_EXIT`](super::lines::DRAIN_AFTER_EXIT) after the leader exited). Cancel safe.
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
            orphan: None,
        }
    }

    /// The end of stderr so far (the last [`STDERR_TAIL_BYTES`](super::lines::STDERR_TAIL_BYTES),
    /// starting at a char boundary); complete once [`Child::wait`] returned.
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
    pub(super) shared: Arc<Shared>,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) pid: u32,
    pub(super) start_time: u64,
    /// True once the leader is reaped; held while signalling and while reaping.
    pub(super) reaped: Mutex<bool>,
    /// The first stop reason requested.
    pub(super) reason: OnceLock<StopReason>,
    /// True once a stop signal reached the live group.
    pub(super) signaled: AtomicBool,
    pub(super) exit: watch::Receiver<ExitSlot>,
}

impl Shared {
    /// Signals the group if its leader is not reaped and still the process we started.
    pub(super) fn signal_group(&self, sig: Signal) -> bool {
        let reaped = lock(&self.reaped);
        if *reaped || process_start_time(self.pid) != Some(self.start_time) {
            return false;
        }
        killpg(pid_of(self.pid), sig).is_ok()
    }
}

impl Stopper {
    /// A stopper for a process group this process did not spawn (a supervised attempt):
    /// signals pass the pid-reuse guard only, and `exit` says when it ended.
    pub(crate) fn external(pid: u32, start_time: u64, exit: watch::Receiver<ExitSlot>) -> Stopper {
        Stopper {
            shared: Arc::new(Shared {
                pid,
                start_time,
                reaped: Mutex::new(false),
                reason: OnceLock::new(),
                signaled: AtomicBool::new(false),
                exit,
            }),
        }
    }

    /// Sends `sig` to the group if its leader still is the process started (and, for a child
    /// of ours, not reaped); true when it was sent. For STOP and CONT (hold and release).
    pub fn signal_group(&self, sig: Signal) -> bool {
        self.shared.signal_group(sig)
    }

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
            // A held group (`sortie hold`) handles its SIGTERM only once continued.
            self.shared.signal_group(Signal::SIGCONT);
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

/// Reaps the leader (see the module doc) and publishes its exit. `marker`: an attempt's marker
/// value ([`MARKER`](super::MARKER)): before the exit is published, every process still carrying
/// it is stopped too (see [`stop_escaped`]).
pub(super) async fn monitor(
    mut child: tokio::process::Child,
    shared: Arc<Shared>,
    mut sigchld: Option<SignalStream>,
    exit_tx: watch::Sender<ExitSlot>,
    marker: Option<String>,
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
    if let Some(value) = marker {
        stop_escaped(value, shared.start_time).await;
    }
    let result = result.map_err(|message| WaitError {
        pid: shared.pid,
        message,
        orphan: None,
    });
    tracing::debug!(pid = shared.pid, ?result, "reaped");
    exit_tx.send_replace(Some(result));
}

/// #32: stops what is left of an ended attempt outside its process group: a descendant that
/// left it (`setsid`, a daemon) still carries the attempt's marker (`value`), so it is found in
/// `/proc` among the processes started since its leader (`since`: only their environments are
/// read, [`find_marked_since`](super::procfs::find_marked_since)) and stopped with its own
/// group (SIGKILL behind the pid-reuse guard), as the attempt's group was. A process that
/// cleared its environment is not found (only a supervised attempt's subreaper catches it).
async fn stop_escaped(value: String, since: u64) {
    let key = super::MARKER;
    let found = tokio::task::spawn_blocking(move || {
        let mut found = super::procfs::find_marked_since(key, &value, since);
        found.retain(|m| m.marker_value == value);
        found
    })
    .await
    .unwrap_or_default();
    for m in found {
        tracing::debug!(
            pid = m.pid,
            "stopping a process that left its attempt's group"
        );
        let _ = super::orphan::kill_group_if_same(m.pid, m.start_time, Duration::ZERO).await;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{SpawnSpec, is_running, spawn};
    use super::*;

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
