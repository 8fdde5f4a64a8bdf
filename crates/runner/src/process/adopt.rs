//! An agent whose supervisor (the run's shepherd, or its own) died while sortie lives: sortie
//! is a child subreaper ([`become_subreaper`], set before it starts its first supervisor), so
//! the kernel hands the agent, running or ended and unreaped, to sortie, which waits for it as
//! its parent ([`wait_orphan`]): the attempt ends with the agent's own exit status, once, and
//! no retry can start beside it. An agent handed to another process (its supervisor was
//! started by an earlier sortie, now gone) cannot be waited for: the caller stops it instead.
//!
//! Reaping here is by pid only, and only of processes that were reparented to sortie (an
//! attempt's leader, and the processes carrying its marker): never one that sortie spawned
//! itself, whose reaping belongs to its own waiter.

use std::sync::Once;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use sortie_protocol::Exit;

use super::marker::MARKER;
use super::procfs::{children_of, env_value, pid_of, read_stat};

/// How long the kernel may take to hand a dead supervisor's children on (its exit closes its
/// pipes, which sortie notices, a moment before its children are reparented).
const REPARENT_WAIT: Duration = Duration::from_secs(5);
/// How often the leader's parent is looked at while its supervisor finishes dying.
const REPARENT_POLL: Duration = Duration::from_millis(10);
/// How often an adopted leader is looked at for its end.
const EXIT_POLL: Duration = Duration::from_millis(50);
/// How long the descendants killed with an adopted attempt are waited for, to be reaped.
const STRAY_WAIT: Duration = Duration::from_secs(2);

/// Makes this process a child subreaper, once: the orphans of its descendants (the agents
/// of a supervisor that died) are reparented to it rather than to init.
pub fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::warn!("cannot become a child subreaper: {e}");
        }
    });
}

/// Waits for the agent led by `pid` (started at `start_time`), whose supervisor `supervisor`
/// died, to end, as its new parent: its exit, once it ended (its group then killed and the
/// processes that carry its marker, reparented to sortie too, killed and reaped). None when
/// it is not, or no longer, this process's child (handed to another process, or reaped by
/// its supervisor before it died): the caller decides from the supervisor's records.
pub async fn wait_orphan(pid: u32, start_time: u64, supervisor: u32) -> Option<Exit> {
    let me = std::process::id();
    let deadline = tokio::time::Instant::now() + REPARENT_WAIT;
    loop {
        let stat = read_stat(pid).filter(|s| s.start_time == start_time)?;
        if stat.ppid == me {
            break;
        }
        if stat.ppid != supervisor || tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(REPARENT_POLL).await;
    }
    // Read while it runs (a zombie's environment is gone): its escaped descendants carry it.
    let marker = env_value(pid, MARKER);
    let exit = loop {
        match waitid(
            Id::Pid(pid_of(pid)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        ) {
            Ok(WaitStatus::Exited(_, code)) => break Exit::Code(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => break Exit::Signal(sig as i32),
            Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {
                tokio::time::sleep(EXIT_POLL).await;
            }
            // Another state, or a signal nix cannot name: the reap below says.
            Ok(_) => break reap(pid).unwrap_or(Exit::Code(-1)),
            Err(_) => return None,
        }
    };
    // The leader is an unreaped zombie: its group id is still its own.
    let _ = killpg(pid_of(pid), Signal::SIGKILL);
    let _ = reap(pid);
    if let Some(marker) = marker {
        let _ = tokio::task::spawn_blocking(move || end_marked_children(&marker)).await;
    }
    Some(exit)
}

/// Reaps the child `pid`, blocking until it ended; its status.
fn reap(pid: u32) -> Option<Exit> {
    loop {
        match waitpid(pid_of(pid), None) {
            Ok(WaitStatus::Exited(_, code)) => return Some(Exit::Code(code)),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Some(Exit::Signal(sig as i32)),
            Err(Errno::EINTR) => {}
            Ok(_) | Err(_) => return None,
        }
    }
}

/// Kills this process's children that carry the attempt marker value `marker` (reparented to
/// sortie: an adopted agent's descendants that left its group, or an agent whose supervisor
/// died before recording its start), and reaps them (within [`STRAY_WAIT`]). Blocking.
pub fn end_marked_children(marker: &str) {
    let strays: Vec<u32> = children_of(std::process::id())
        .into_iter()
        .filter(|&p| env_value(p, MARKER).as_deref() == Some(marker))
        .collect();
    for &p in &strays {
        let _ = killpg(pid_of(p), Signal::SIGKILL);
        let _ = kill(pid_of(p), Signal::SIGKILL);
    }
    let deadline = std::time::Instant::now() + STRAY_WAIT;
    let mut left = strays;
    while !left.is_empty() && std::time::Instant::now() < deadline {
        left.retain(|&p| {
            matches!(
                waitpid(pid_of(p), Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::StillAlive) | Err(Errno::EINTR)
            )
        });
        if !left.is_empty() {
            std::thread::sleep(REPARENT_POLL);
        }
    }
}
