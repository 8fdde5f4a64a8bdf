//! Killing what a crashed run left behind: a process found by its marker, if it still is the
//! process that started at the recorded time, and its process group.

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::time::Instant;

use super::procfs::{is_running, pid_of, read_stat};

/// How long [`kill_group_if_same`] and [`Stopper::stop`](super::Stopper::stop) wait after SIGKILL
/// before they give up.
pub(super) const KILL_WAIT: Duration = Duration::from_secs(5);

/// How often [`kill_group_if_same`] looks whether the process is gone.
const GONE_POLL: Duration = Duration::from_millis(20);

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

/// Sends `sig` to the process group led by `pid` if `pid` still is the process that started
/// at `start_time`; true when it was sent (hold, release and stop of a process this process
/// does not own).
pub fn signal_group_if_same(pid: u32, start_time: u64, sig: Signal) -> bool {
    is_running(pid, start_time) && killpg(pid_of(pid), sig).is_ok()
}
