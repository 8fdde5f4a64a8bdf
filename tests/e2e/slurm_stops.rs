//! How Slurm runs end when something else than the agent ends them (against a real cluster;
//! skipped with a printed reason when none answers, failed under CI): Slurm's own time limit
//! reads as the attempt's timeout; Ctrl-C of a run cancels every job of it through `scancel`,
//! queued and held ones too, and the journal says why; a job held in the queue past its attempt
//! timeout, through a crash and an adoption, does not time out while it waits: its clocks
//! count from its real start.

use nix::sys::signal::Signal;
use serde_json::Value;
use sortie_testkit::Events;
use sortie_testkit::slurm::{self, CancelOnDrop};
use sortie_testkit::{Journal, poll, unique_run};

use crate::support::{Background, Scratch, fake_command, send_signal, task_view};

fn journal(s: &Scratch, run: &str) -> Journal {
    Journal::parse(&s.run_ok(&["export", run]).stdout).expect("export parses")
}

/// The outcomes journaled for `task`, in order.
fn outcomes(j: &Journal, task: u64) -> Vec<Value> {
    j.of(task, "AttemptFinished")
        .into_iter()
        .map(|b| b["outcome"].clone())
        .collect()
}

#[test]
fn slurm_time_limit_ends_the_attempt_as_a_timeout() {
    if !slurm::should_run("slurm_time_limit_ends_the_attempt_as_a_timeout") {
        return;
    }
    let s = Scratch::new();
    // A turn a second for ten minutes; Slurm's limit is one minute (its resolution), far
    // before sortie's own attempt timeout.
    let command = fake_command(&[
        "--turns",
        "600",
        "--sleep",
        "600",
        "--usage",
        "600,60,0.0006",
    ]);
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"long\"\nexecutor = \"slurm\"\nmax_retries = 1\n\
             attempt_timeout = \"30m\"\ncommand = {command}\n\
             slurm = {{ extra_args = [\"--time=1\"] }}\n"
        ),
    );
    let run = unique_run("slurmlimit");
    let _cleanup = CancelOnDrop(format!("sortie:{run}:"));
    let out = s.run(&["run", "--run-id", &run, batch.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status(&run);
    let t = task_view(&status, "long");
    assert_eq!(t["state"], "timeout", "{t}");
    assert_eq!(t["attempts"], 1, "a time limit is not retried: {t}");
    let j = journal(&s, &run);
    let o = outcomes(&j, 0);
    assert_eq!(o.len(), 1);
    assert_eq!(
        (o[0]["stop_reason"].as_str(), o[0]["phase"].as_str()),
        (Some("timeout"), Some("running")),
        "as a local attempt timeout reads: {o:?}"
    );
    let error = o[0]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("reached its time limit (TIMEOUT)"),
        "{error}"
    );
    // The usage it reported before Slurm stopped it is kept.
    let usage = j.attempt_usage()[&(0, 1)];
    assert!(usage.input > 0 && usage.turns > 0, "{usage:?}");
    let jobs = slurm::settled_sacct_jobs(
        &format!("sortie:{run}:"),
        std::time::Duration::from_secs(60),
    );
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].state, "TIMEOUT");
    s.audit_clean(&run);
}

#[test]
fn slurm_ctrl_c_cancels_every_job_of_the_run_running_and_queued() {
    if !slurm::should_run("slurm_ctrl_c_cancels_every_job_of_the_run_running_and_queued") {
        return;
    }
    let s = Scratch::new();
    let mut tasks = String::new();
    let n = 6;
    for k in 0..n {
        let command = fake_command(&["--sleep", "600", "--turns", "60", "--usage", "10,1,0.00001"]);
        // Half the node each: two run, the others wait in the queue, the last two held there
        // (they would never start by themselves: only a cancel while queued ends them).
        let hold = if k >= 4 {
            ", extra_args = [\"--hold\"]"
        } else {
            ""
        };
        tasks.push_str(&format!(
            "[[tasks]]\nlabel = \"t{k}\"\ncommand = {command}\nslurm = {{ cpus = 4{hold} }}\n\n"
        ));
    }
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = {n}\n\n[defaults]\nexecutor = \"slurm\"\nkill_grace = \"3s\"\n\n{tasks}"
        ),
    );
    let run = unique_run("slurmint");
    let prefix = format!("sortie:{run}:");
    let _cleanup = CancelOnDrop(prefix.clone());
    let bg = Background::start(
        &s,
        &run,
        &["run", "--run-id", &run, batch.to_str().unwrap()],
    );
    poll("jobs running and queued", 60, || {
        let jobs = slurm::squeue_jobs(&prefix);
        let has = |state: &str| jobs.iter().any(|j| j.state == state);
        (jobs.len() == n && has("RUNNING") && has("PENDING")).then_some(())
    });
    send_signal(bg.pid(), Signal::SIGINT);
    let out = bg.finish(120);
    assert_eq!(
        out.status.code(),
        Some(3),
        "interrupted: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // When sortie has exited, no job of the run is left in the queue: each is CANCELLED.
    let jobs = slurm::squeue_jobs(&prefix);
    assert_eq!(jobs.len(), n, "{jobs:?}");
    assert!(jobs.iter().all(|j| j.state == "CANCELLED"), "{jobs:?}");
    // The journal says why, for each attempt and for the run.
    let j = journal(&s, &run);
    for k in 0..n as u64 {
        let o = outcomes(&j, k);
        assert_eq!(o.len(), 1, "t{k}: {o:?}");
        assert_eq!(o[0]["stop_reason"], "interrupted", "t{k}: {o:?}");
    }
    let interrupted: Vec<&Value> = j
        .kinds()
        .filter(|(k, _)| *k == "RunInterrupted")
        .map(|(_, b)| b)
        .collect();
    assert_eq!(interrupted.len(), 1);
    assert!(
        interrupted[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("interrupted")),
        "{interrupted:?}"
    );
    let status = s.status(&run);
    assert_eq!(status["status"], "interrupted", "{status}");
    s.audit_clean(&run);
}

#[test]
fn slurm_a_job_held_in_the_queue_does_not_time_out_while_it_waits() {
    if !slurm::should_run("slurm_a_job_held_in_the_queue_does_not_time_out_while_it_waits") {
        return;
    }
    let s = Scratch::new();
    let counter = s.path().join("count").display().to_string();
    let command = fake_command(&[
        "--sleep",
        "1",
        "--usage",
        "20,2,0.00002",
        "--counter",
        &counter,
    ]);
    // Submitted held (`--hold`): it waits in the queue until the test releases it. Its
    // attempt timeout and stall are far shorter than that wait, and far longer than its run.
    // A local ticker reports its usage every quarter of a second for 30 s (supervised, so it
    // outlives the kill below and is adopted): the journal's clock measures the waits.
    let ticker = fake_command(&[
        "--sleep",
        "30",
        "--turns",
        "120",
        "--usage",
        "120,12,0.00012",
    ]);
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"held\"\nexecutor = \"slurm\"\nattempt_timeout = \"6s\"\n\
             stall_after = \"4s\"\nstall_kill_after = \"1s\"\ncommand = {command}\n\
             slurm = {{ extra_args = [\"--hold\"] }}\n\n\
             [[tasks]]\nlabel = \"ticker\"\ncommand = {ticker}\n"
        ),
    );
    let run = unique_run("slurmheld");
    let prefix = format!("sortie:{run}:");
    let _cleanup = CancelOnDrop(prefix.clone());
    let bg = Background::start(
        &s,
        &run,
        &["run", "--run-id", &run, batch.to_str().unwrap()],
    );
    let job = poll("the job waits in the queue", 60, || {
        slurm::squeue_jobs(&prefix)
            .into_iter()
            .find(|j| j.state == "PENDING")
    });
    // Longer than the attempt timeout after its launch, by the journal's clock, while queued
    // under the first sortie...
    let launched = journal(&s, &run)
        .first_at("AttemptLaunching")
        .expect("the attempt is journaled");
    let events = s.events_past(
        &run,
        launched + 7_000,
        "the journal's clock to pass the timeout",
    );
    assert!(
        !events.has(0, "AttemptFinished"),
        "not timed out while queued"
    );
    send_signal(bg.pid(), Signal::SIGKILL);
    let _ = bg.finish(10);
    // ... and again under the one that adopts it.
    let resumed = Background::start(&s, &run, &["resume", &run]);
    let resumed_at = poll("the resume adopts the queued job", 60, || {
        s.try_events(&run)
            .filter(|events| events.has(0, "AttemptAdopted"))
            .and_then(|events| events.first_at("RunResumed"))
    });
    let events = s.events_past(
        &run,
        resumed_at + 7_000,
        "the journal's clock to pass the timeout",
    );
    assert!(
        !events.has(0, "AttemptFinished"),
        "not timed out while queued"
    );
    assert_eq!(
        slurm::squeue_jobs(&prefix)
            .iter()
            .map(|j| j.state.as_str())
            .collect::<Vec<_>>(),
        ["PENDING"]
    );
    slurm::scontrol(&["release", &job.id.to_string()]);
    let out = resumed.finish(120);
    assert!(
        out.status.success(),
        "resume: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status(&run);
    let t = task_view(&status, "held");
    assert_eq!(
        (t["state"].as_str(), t["attempts"].as_u64()),
        (Some("completed"), Some(1)),
        "{t}"
    );
    let count = std::fs::read_to_string(&counter).unwrap();
    assert_eq!(count.lines().count(), 1);
    let jobs = slurm::settled_sacct_jobs(&prefix, std::time::Duration::from_secs(60));
    assert_eq!(jobs.len(), 1, "one job, adopted: {jobs:?}");
    assert_eq!(jobs[0].state, "COMPLETED");
    s.audit_clean(&run);
}
