//! sortie's test kit: the helpers that the end-to-end tests (`tests/e2e`), the crash torture
//! (`xtask/src/torture.rs`) and the runner's tests share, written once.
//!
//! - [`export`]: the JSON view of `sortie export` ([`Journal`], [`Usage`]), with the questions
//!   the crash tests and the torture ask of it (finished tasks, live attempts, each attempt's
//!   last usage, ...);
//! - [`wait`]: bounded polls and waits ([`poll`], [`wait_exit`], [`finish`]) and [`kill9`];
//! - [`procs`]: the `/proc` scan for processes carrying a run's `SORTIE_ATTEMPT` marker (the
//!   tests' own copy: the product's is `sortie_runner::process`, and a test must not trust the
//!   code it checks);
//! - [`cmd`]: one command helper in ripgrep's style ([`run`], [`git`]): a failure panics (or
//!   errs) naming the command, its cwd, its status, stdout and stderr;
//! - [`real_agent`]: the gate of the tests that run a real agent CLI: skipped with a printed
//!   reason when the CLI is missing, unless `CI` is set; a cookie names the ones that ran;
//! - [`attempts`]: whether an attempt's exit is recorded ([`exit_recorded`]);
//! - [`unique_run`]: run ids that no other test uses.
//!
//! A dev-only crate: no product crate may have it in `[dependencies]` (`cargo xtask tidy`
//! checks); xtask may, for the torture.

// #10: attempt dirs and the shepherd's status log.
pub mod attempts;
pub mod cmd;
pub mod export;
pub mod procs;
pub mod real_agent;
pub mod wait;
// #11: the gate of the tests against a real Slurm cluster, and their view of it.
pub mod slurm;

pub use attempts::exit_recorded;
pub use cmd::{CommandFailed, git, run, try_git, try_run};
pub use export::{Events, Journal, Usage};
pub use procs::{Marked, live_processes_of, marked_processes};
// #10: supervisors.
pub use procs::{all_processes_of, supervisors_of};
// #10: the per-run shepherd.
pub use procs::{SHEPHERD_MARKER, shepherds_of, zombie_children_of};
pub use wait::{TimedOut, finish, kill9, poll, poll_every, signal, wait_exit};

/// A run id that no other test, nor an earlier run of the tests, uses: `prefix`, this
/// process's id, a counter and the clock's nanoseconds. The `/proc` scan ([`procs`]) looks at
/// every process on the machine, so run ids must not collide across state dirs and test
/// processes.
pub fn unique_run(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{n}-{nanos:x}", std::process::id())
}

#[cfg(test)]
mod tests {
    #[test]
    fn run_ids_differ_within_a_process() {
        let a = super::unique_run("t");
        let b = super::unique_run("t");
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("t-{}-", std::process::id())), "{a}");
    }
}
