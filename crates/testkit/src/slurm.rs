//! The gate of the tests against a real Slurm cluster (`tests/e2e/slurm*.rs`), and the tests'
//! own view of the cluster (`sacct`, `squeue`, `scancel`: never the product's parsing).
//!
//! Without a cluster that answers (`sinfo` and `sacct`, within a few seconds), a plain
//! `cargo test` skips them, printing why; under CI (`.ci/run` starts a cluster with
//! `.ci/slurm/up.sh` and sets `SLURM_CONF`) a missing cluster fails them.

#![allow(
    clippy::disallowed_methods,
    reason = "the tests ask Slurm's own commands"
)]

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::real_agent::under_ci;

/// Whether the Slurm test `test` runs: true when a cluster answers; false (printed) when none
/// does outside CI; a panic under CI.
pub fn should_run(test: &str) -> bool {
    match cluster_answers() {
        Ok(()) => {
            eprintln!("slurm test {test}: a cluster answers, it runs");
            true
        }
        Err(why) if under_ci() => panic!("slurm test {test} cannot run under CI: {why}"),
        Err(why) => {
            eprintln!(
                "slurm test {test}: SKIPPED (passes without checking anything): {why}\n\
                 (start one with `.ci/slurm/up.sh` and export the SLURM_CONF it prints; with \
                 CI set, this fails instead)"
            );
            false
        }
    }
}

/// Ok when `sinfo` lists a node and `sacct` answers (the tests count jobs through it).
pub fn cluster_answers() -> Result<(), String> {
    let sinfo = output(&["sinfo", "--noheader", "--format=%n %t"])?;
    if sinfo.trim().is_empty() {
        return Err("sinfo lists no node".into());
    }
    output(&[
        "sacct",
        "--noheader",
        "--allocations",
        "--starttime=now-1minutes",
    ])
    .map_err(|e| format!("sacct does not answer (the tests need accounting): {e}"))?;
    Ok(())
}

/// `program ARGS`' stdout, or why it failed; bounded by `timeout 20`.
pub fn output(argv: &[&str]) -> Result<String, String> {
    let out = Command::new("timeout")
        .arg("20")
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {argv:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{argv:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One job as `sacct` or `squeue` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its state's first word (`COMPLETED`, `CANCELLED`, ...).
    pub state: String,
}

/// Every job of the last day whose name starts with `prefix`, from the accounting database
/// (allocations only), in id order.
pub fn sacct_jobs(prefix: &str) -> Vec<Job> {
    let out = output(&[
        "sacct",
        "--noheader",
        "--allocations",
        "--parsable2",
        "--starttime=now-1days",
        "--format=JobID,JobName,State",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    parse(&out, prefix)
}

/// The jobs slurmctld holds (pending, running, or ended recently) whose name starts with
/// `prefix`.
pub fn squeue_jobs(prefix: &str) -> Vec<Job> {
    let out = output(&["squeue", "--noheader", "--states=all", "--format=%i|%j|%T"])
        .unwrap_or_else(|e| panic!("{e}"));
    parse(&out, prefix)
}

fn parse(out: &str, prefix: &str) -> Vec<Job> {
    let mut jobs: Vec<Job> = out
        .lines()
        .filter_map(|l| {
            let mut f = l.trim().split('|');
            let id = f.next()?.parse().ok()?;
            let name = f.next()?.to_owned();
            let state = f.next()?.split_whitespace().next()?.to_owned();
            name.starts_with(prefix).then_some(Job { id, name, state })
        })
        .collect();
    jobs.sort_by_key(|j| j.id);
    jobs
}

/// The jobs of `prefix` in `sacct` once accounting has caught up: the same list, with every
/// job in a final state, twice in a row (sacct lags a few seconds behind slurmctld), within
/// `within`.
pub fn settled_sacct_jobs(prefix: &str, within: Duration) -> Vec<Job> {
    let end = std::time::Instant::now() + within;
    let mut last = Vec::new();
    loop {
        let now = sacct_jobs(prefix);
        let live = ["PENDING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED"];
        let settled = !now.is_empty() && now.iter().all(|j| !live.contains(&j.state.as_str()));
        if settled && now == last {
            return now;
        }
        if std::time::Instant::now() > end {
            panic!("sacct did not settle on the jobs of {prefix} within {within:?}: {now:?}");
        }
        last = now;
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `scancel ID`, from outside sortie.
pub fn scancel(id: u64) {
    output(&["scancel", &id.to_string()]).unwrap_or_else(|e| panic!("{e}"));
}

/// `scontrol ARGS` (`release ID`, `hold ID`), from outside sortie.
pub fn scontrol(args: &[&str]) {
    let mut argv = vec!["scontrol"];
    argv.extend_from_slice(args);
    output(&argv).unwrap_or_else(|e| panic!("{e}"));
}

/// Cancels, when dropped, every job slurmctld holds whose name starts with its prefix: a test
/// that fails leaves no job of its run in the queue.
#[derive(Debug)]
pub struct CancelOnDrop(pub String);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Ok(out) = output(&["squeue", "--noheader", "--format=%i|%j|%T"]) else {
            return;
        };
        for job in parse(&out, &self.0) {
            let _ = output(&["scancel", &job.id.to_string()]);
        }
    }
}
