//! Crashes of sortie with Slurm jobs in flight (against a real cluster; skipped with a printed
//! reason when none answers, failed under CI): SIGKILL with jobs pending, running and about to
//! end, then `resume`; and a crash between the journaled launch and `sbatch` (a test hook).
//! Every side effect happens once, Slurm runs one job per attempt, the jobs that ended while
//! sortie was down are recorded, not run again.

use sortie_testkit::Events;
use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;

use sortie_testkit::slurm::{self, Job};
use sortie_testkit::{Journal, poll, unique_run};

use crate::support::{Background, Scratch, fake_command, send_signal, task_view};

fn journal(s: &Scratch, run: &str) -> Journal {
    Journal::parse(&s.run_ok(&["export", run]).stdout).expect("export parses")
}

/// The run's jobs in `sacct` once every one of `expected` jobs shows ended.
fn ended_jobs(run: &str, expected: usize) -> Vec<Job> {
    let prefix = format!("sortie:{run}:");
    poll("sacct shows the run's jobs ended", 60, || {
        let jobs = slurm::sacct_jobs(&prefix);
        let ended = jobs
            .iter()
            .all(|j| !["PENDING", "RUNNING", "COMPLETING"].contains(&j.state.as_str()));
        (ended && jobs.len() >= expected).then_some(jobs)
    })
}

/// Attempt numbers of a task, from its job names: each attempt's job once.
fn attempts_of(jobs: &[Job], run: &str, task: usize) -> Vec<u64> {
    let prefix = format!("sortie:{run}:{task}:");
    jobs.iter()
        .filter_map(|j| j.name.strip_prefix(&prefix))
        .filter_map(|rest| rest.split(':').next()?.parse().ok())
        .collect()
}

#[test]
fn slurm_sigkill_with_jobs_pending_running_and_ending_then_resume() {
    if !slurm::should_run("slurm_sigkill_with_jobs_pending_running_and_ending_then_resume") {
        return;
    }
    let s = Scratch::new();
    let dir = s.path().display().to_string();
    let mut tasks = String::new();
    // Each job takes half the node's CPUs: two run at once, the others wait (PENDING).
    let sleeps = ["1", "8", "2", "2", "2", "2", "2", "2"];
    for (k, sleep) in sleeps.iter().enumerate() {
        let usage = format!("{},{},{:.6}", 2000 + k, 200 + k, (30 + k) as f64 / 1e6);
        let counter = format!("{dir}/t{k}.count");
        let command = fake_command(&[
            "--sleep",
            sleep,
            "--usage",
            &usage,
            "--counter",
            &counter,
            "--quiet",
        ]);
        tasks.push_str(&format!(
            "[[tasks]]\nlabel = \"t{k}\"\ncommand = {command}\nslurm = {{ cpus = 4 }}\n\n"
        ));
    }
    let batch = s.write(
        "batch.toml",
        &format!("concurrency = 8\n\n[defaults]\nexecutor = \"slurm\"\nmax_retries = 2\n\n{tasks}"),
    );
    let run = unique_run("slurmcrash");
    let prefix = format!("sortie:{run}:");
    let bg = Background::start(
        &s,
        &run,
        &["run", "--run-id", &run, batch.to_str().unwrap()],
    );
    // Kill sortie once jobs run and others wait.
    let at_kill = poll("jobs running and pending", 60, || {
        let jobs = slurm::squeue_jobs(&prefix);
        let has = |state: &str| jobs.iter().any(|j| j.state == state);
        (jobs.len() == sleeps.len() && has("RUNNING") && has("PENDING")).then_some(jobs)
    });
    send_signal(bg.pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = bg.finish(10);
    // Let a job that was running at the kill end while sortie is down.
    let running: BTreeSet<u64> = at_kill
        .iter()
        .filter(|j| j.state == "RUNNING")
        .map(|j| j.id)
        .collect();
    let ended_while_down = poll("a running job ends while sortie is down", 60, || {
        slurm::squeue_jobs(&prefix)
            .into_iter()
            .find(|j| running.contains(&j.id) && j.state == "COMPLETED")
    });
    let before = journal(&s, &run);
    let task_down: u64 = ended_while_down.name[prefix.len()..]
        .split(':')
        .next()
        .and_then(|t| t.parse().ok())
        .expect("task in the job name");
    assert!(
        !before.has(task_down, "AttemptFinished"),
        "the job ended after the crash, unrecorded"
    );

    let out = s.run(&["resume", &run]);
    assert!(
        out.status.success(),
        "resume: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status(&run);
    for k in 0..sleeps.len() {
        let t = task_view(&status, &format!("t{k}"));
        assert_eq!(t["state"], "completed", "t{k}: {t}");
        // Adopted or recorded, never run again: the crash cost no attempt.
        assert_eq!(t["attempts"], 1, "t{k}: {t}");
        let count = std::fs::read_to_string(s.path().join(format!("t{k}.count"))).unwrap();
        assert_eq!(count.lines().count(), 1, "t{k} did its work once");
    }
    let j = journal(&s, &run);
    assert_eq!(
        j.count("AttemptOrphaned"),
        0,
        "every job was found again by its name"
    );
    let jobs = ended_jobs(&run, sleeps.len());
    assert_eq!(jobs.len(), sleeps.len(), "one job per attempt: {jobs:?}");
    for k in 0..sleeps.len() {
        assert_eq!(attempts_of(&jobs, &run, k), [1], "t{k}: {jobs:?}");
    }
    assert!(jobs.iter().all(|j| j.state == "COMPLETED"), "{jobs:?}");
    // The usage of each attempt is counted once: the one its agent reported.
    for (k, sleep) in sleeps.iter().enumerate() {
        let _ = sleep;
        let usage = j.attempt_usage()[&(k as u64, 1)];
        assert_eq!(
            (usage.input, usage.output),
            (2000 + k as u64, 200 + k as u64)
        );
    }
    s.audit_clean(&run);
}

#[test]
fn slurm_crash_between_the_journaled_launch_and_sbatch_submits_once_on_resume() {
    if !slurm::should_run(
        "slurm_crash_between_the_journaled_launch_and_sbatch_submits_once_on_resume",
    ) {
        return;
    }
    let s = Scratch::new();
    let counter = s.path().join("count").display().to_string();
    let command = fake_command(&["--counter", &counter, "--usage", "10,5,0.000010", "--quiet"]);
    let batch = s.write(
        "batch.toml",
        &format!("[[tasks]]\nlabel = \"once\"\nexecutor = \"slurm\"\ncommand = {command}\n"),
    );
    let run = unique_run("slurmhook");
    let prefix = format!("sortie:{run}:");
    let out = s
        .sortie()
        .args(["run", "--run-id", &run, batch.to_str().unwrap()])
        .env("SORTIE_TEST_CRASH_BEFORE_SBATCH", "1")
        .output()
        .expect("run sortie");
    assert_eq!(out.status.signal(), Some(9), "the hook killed sortie");
    let j = journal(&s, &run);
    assert!(
        j.has(0, "AttemptLaunching"),
        "the launch is journaled first"
    );
    assert!(
        slurm::squeue_jobs(&prefix).is_empty(),
        "nothing was submitted"
    );

    let out = s.run(&["resume", &run]);
    assert!(
        out.status.success(),
        "resume: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status(&run);
    let t = task_view(&status, "once");
    assert_eq!(
        (t["state"].as_str(), t["attempts"].as_u64()),
        (Some("completed"), Some(1))
    );
    let count = std::fs::read_to_string(s.path().join("count")).unwrap();
    assert_eq!(count.lines().count(), 1);
    let jobs = ended_jobs(&run, 1);
    assert_eq!(jobs.len(), 1, "submitted once: {jobs:?}");
    assert_eq!(attempts_of(&jobs, &run, 0), [1], "under attempt 1's name");
    assert_eq!(journal(&s, &run).count("AttemptOrphaned"), 0);
    s.audit_clean(&run);
}
