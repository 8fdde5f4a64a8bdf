//! A run in the background and waits on a run's owner: `sortie run --detach` starts the same
//! command line again without `--detach` (through `process::spawn_detached_with`) and returns
//! once that process owns its run dir; `sortie wait` and `sortie cancel` wait for a run's owner
//! to let go.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use sortie_core::RunId;

use crate::layout::{Owner, RunDir, StateDir};

/// #35: `sortie serve --open` opens its URL in the user's browser.
pub use crate::process::open_url;

/// The environment variable that gives a detached run its id (set by the `--detach` parent).
pub const DETACHED_RUN_ID: &str = "SORTIE_DETACHED_RUN_ID";

/// How long the parent of a detached run waits for it to own its run dir.
const DETACH_START: Duration = Duration::from_secs(30);

/// How often a wait looks at a run's owner lock.
const POLL: Duration = Duration::from_millis(100);

/// A run started in the background.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detached {
    /// Its process.
    pub pid: u32,
    /// Where its output goes.
    pub log: PathBuf,
}

/// Why a detached run did not start.
#[derive(Debug)]
pub enum DetachError {
    /// Its process could not be spawned.
    Spawn(std::io::Error),
    /// It exited before it owned its run dir.
    Stopped {
        /// How it exited.
        status: ExitStatus,
        /// The last lines of its log (at most 10).
        tail: String,
    },
}

impl std::fmt::Display for DetachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DetachError::Spawn(e) => e.fmt(f),
            DetachError::Stopped { status, tail } => {
                write!(f, "it stopped at once ({status}):\n{tail}")
            }
        }
    }
}

impl std::error::Error for DetachError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DetachError::Spawn(e) => Some(e),
            DetachError::Stopped { .. } => None,
        }
    }
}

/// `args` (a command line, program name left out) without its `--detach` flag (the first one
/// before a `--`).
pub fn without_detach(mut args: Vec<String>) -> Vec<String> {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    if let Some(i) = args[..end].iter().position(|a| a == "--detach") {
        args.remove(i);
    }
    args
}

/// Starts this program again with `args` in the background, as run `run` of `state_dir`
/// (its output in `StateDir::detached_log`); returns once it owns its run dir, or after 30 s
/// of waiting for that, or with its log's last lines when it exits first.
pub fn start(state_dir: &StateDir, run: &RunId, args: &[String]) -> Result<Detached, DetachError> {
    let log = state_dir.detached_log(run);
    // The state dir as plain `run` makes it (0700), before the log beside `runs/`.
    state_dir
        .ensure()
        .map_err(|e| DetachError::Spawn(std::io::Error::other(e.to_string())))?;
    let mut child = crate::process::spawn_detached_with(args, &log, DETACHED_RUN_ID, run.as_str())
        .map_err(DetachError::Spawn)?;
    let dir = state_dir.run(run);
    let started = Instant::now();
    while !matches!(dir.owner(), Owner::Live { .. }) && started.elapsed() <= DETACH_START {
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(10).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(DetachError::Stopped {
                status,
                tail: tail.join("\n"),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Detached {
        pid: child.id(),
        log,
    })
}

/// Waits while run `dir` has a live owner, at most `timeout` (None: as long as it takes).
/// Returns whether the owner let go.
pub fn wait_ownerless(dir: &RunDir, timeout: Option<Duration>) -> bool {
    let started = Instant::now();
    while matches!(dir.owner(), Owner::Live { .. }) {
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            return false;
        }
        std::thread::sleep(POLL);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn only_the_first_detach_before_a_double_dash_goes() {
        assert_eq!(
            without_detach(argv(&["run", "--detach", "b.toml"])),
            argv(&["run", "b.toml"])
        );
        assert_eq!(
            without_detach(argv(&["run", "--", "echo", "--detach"])),
            argv(&["run", "--", "echo", "--detach"])
        );
        assert_eq!(
            without_detach(argv(&["run", "--detach", "--", "x", "--detach"])),
            argv(&["run", "--", "x", "--detach"])
        );
    }

    #[test]
    fn a_run_with_no_owner_is_waited_for_no_time() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let state = StateDir::new(tmp.path());
        let dir = state.run(&RunId::new("r1").expect("an id"));
        assert!(wait_ownerless(&dir, Some(Duration::ZERO)));
        let lock = {
            std::fs::create_dir_all(dir.path()).expect("mkdir");
            dir.acquire().expect("the lock")
        };
        assert!(!wait_ownerless(&dir, Some(Duration::from_millis(10))));
        drop(lock);
        assert!(wait_ownerless(&dir, None));
    }
}
