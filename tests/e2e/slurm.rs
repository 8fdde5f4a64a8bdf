//! End-to-end tests against a real Slurm cluster (`.ci/slurm/up.sh`; skipped with a printed
//! reason when none answers, failed under CI): a 20-task batch of fake agents run as Slurm
//! jobs, with every kind of attempt end (a `sortie cancel --task` through the run's control
//! socket, a task budget, a stall, a timeout, a cancel from outside), checked through what a
//! user sees (the results in `status --json`, the ledger `audit` recomputes, the journal's usage
//! against what each agent logged) and through Slurm's own accounting: exactly one job per
//! attempt, and every stop sortie made a `CANCELLED` job. Then Slurm's own time limit
//! (`TIMEOUT`) read as the attempt's timeout; Ctrl-C of a run with jobs running and queued
//! (every job cancelled, none left in `squeue`); and a job held in the queue past its attempt
//! timeout, through a crash and an adoption, that must not time out while it waits.

use sortie_testkit::Events;
use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use sortie_testkit::slurm::{self, Job};
use sortie_testkit::{Journal, Usage, poll, unique_run};

use crate::support::{Background, Scratch, fake_command, task_view};

/// What each agent logged: (task label, attempt) → its last usage report.
fn logged_usage(dir: &Path, labels: &[String]) -> BTreeMap<(String, u64), Usage> {
    let mut m = BTreeMap::new();
    for label in labels {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("{label}.usage"))) else {
            continue;
        };
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).expect("a usage log line");
            let u = &v["usage"];
            let micros = (u["cost_usd"].as_f64().expect("cost") * 1e6).round() as u64;
            let usage = Usage {
                input: u["input"].as_u64().expect("input"),
                output: u["output"].as_u64().expect("output"),
                nanos: micros * 1000,
                turns: u["turns"].as_u64().expect("turns"),
                ..Usage::default()
            };
            m.insert(
                (label.clone(), v["attempt"].as_u64().expect("attempt")),
                usage,
            );
        }
    }
    m
}

/// The journal's usage per (task label, attempt), for attempts that reported any.
fn journaled_usage(j: &Journal, labels: &[String]) -> BTreeMap<(String, u64), Usage> {
    j.attempt_usage()
        .into_iter()
        .filter(|(_, u)| *u != Usage::default())
        .map(|((t, a), u)| ((labels[t as usize].clone(), a), u))
        .collect()
}

/// Checks that Slurm ran exactly one job per journaled attempt of run `run`, and no other
/// job of the run (in `sacct`, once it shows every attempt's job ended: it lags slurmctld by
/// seconds); returns the jobs by (task, attempt).
fn one_job_per_attempt(j: &Journal, run: &str) -> BTreeMap<(u64, u64), Job> {
    let prefix = format!("sortie:{run}:");
    let mut launched: Vec<(u64, u64)> = j
        .kinds()
        .filter(|(k, _)| *k == "AttemptLaunching")
        .map(|(_, b)| {
            (
                b["task"].as_u64().unwrap_or(0),
                b["attempt"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    launched.sort_unstable();
    let key = |job: &Job| -> (u64, u64) {
        let mut f = job.name[prefix.len()..].split(':');
        let task = f.next().and_then(|t| t.parse().ok()).expect("task in name");
        let attempt = f
            .next()
            .and_then(|a| a.parse().ok())
            .expect("attempt in name");
        (task, attempt)
    };
    let jobs = poll("sacct shows every attempt's job ended", 60, || {
        let jobs = slurm::sacct_jobs(&prefix);
        let live = ["PENDING", "RUNNING", "COMPLETING"];
        let ended = jobs.iter().all(|job| !live.contains(&job.state.as_str()));
        let seen: std::collections::BTreeSet<(u64, u64)> = jobs.iter().map(key).collect();
        (ended && launched.iter().all(|k| seen.contains(k))).then_some(jobs)
    });
    let mut by_attempt: BTreeMap<(u64, u64), Job> = BTreeMap::new();
    for job in jobs {
        if let Some(other) = by_attempt.insert(key(&job), job.clone()) {
            panic!("two jobs for one attempt: {other:?} and {job:?}");
        }
    }
    let keys: Vec<(u64, u64)> = by_attempt.keys().copied().collect();
    assert_eq!(
        keys, launched,
        "one Slurm job per journaled attempt, and no other"
    );
    by_attempt
}

fn journal(s: &Scratch, run: &str) -> Journal {
    Journal::parse(&s.run_ok(&["export", run]).stdout).expect("export parses")
}

#[test]
fn slurm_batch_of_twenty_every_end_one_job_per_attempt() {
    if !slurm::should_run("slurm_batch_of_twenty_every_end_one_job_per_attempt") {
        return;
    }
    let s = Scratch::new();
    let dir = s.path().display().to_string();
    let log = |label: &str| format!("{dir}/{label}.usage");
    let mut tasks = String::new();
    let mut order: Vec<String> = Vec::new();
    let mut add = |label: &str, args: &[&str], extra: &str| {
        order.push(label.to_owned());
        let usage_log = log(label);
        let mut all: Vec<&str> = vec![
            "--attempt",
            "{attempt}",
            "--usage-log",
            &usage_log,
            "--usage-per-attempt",
            "--counter",
        ];
        let counter = format!("{dir}/{label}.count");
        all.push(&counter);
        all.extend_from_slice(args);
        tasks.push_str(&format!(
            "[[tasks]]\nlabel = \"{label}\"\ncommand = {}\n{extra}\n",
            fake_command(&all)
        ));
    };
    // Twelve answers, each with its own usage.
    let usages: Vec<String> = (0..12)
        .map(|k| {
            format!(
                "{},{},{:.6}",
                1000 + 7 * k,
                100 + 3 * k,
                (11 + k) as f64 / 1e6
            )
        })
        .collect();
    for (k, u) in usages.iter().enumerate() {
        let answer = format!("answer {k}");
        add(
            &format!("answer-{k}"),
            &["--usage", u, "--answer", &answer],
            "",
        );
    }
    // A 503 on attempt 1, retried on the same model.
    add(
        "retry-503",
        &["--usage", "500,50,0.000500", "--fail-attempts", "1:error"],
        "",
    );
    // A model error on the primary: the fallback model answers.
    add(
        "fallback",
        &[
            "--usage",
            "600,60,0.000600",
            "--model",
            "{model}",
            "--fail-model",
            "a:model_error",
        ],
        "model = \"a\"\nfallback_models = [\"b\"]",
    );
    // Attempt 1 goes silent after its first turn: stalled, stopped through scancel, retried.
    add(
        "stall",
        &["--usage", "700,70,0.000700", "--stall-attempts", "1"],
        "stall_after = \"4s\"\nstall_kill_after = \"1s\"",
    );
    // Attempt 1's job is cancelled on the cluster by someone else (below): an unexpected
    // signal, retried.
    add(
        "cancelled-outside",
        &[
            "--usage",
            "800,80,0.000800",
            "--sleep",
            "600",
            "--sleep-attempts",
            "1",
        ],
        "",
    );
    // Runs past its attempt timeout: stopped through scancel, not retried.
    add(
        "timeout",
        &["--usage", "900,90,0.000900", "--sleep", "600"],
        "attempt_timeout = \"4s\"",
    );
    // A real failure (exit 3): not retried.
    add("fails", &["--usage", "950,95,0.000950", "--exit", "3"], "");
    // Cancelled by the user with `sortie cancel RUN --task cancelled` once its job runs:
    // stopped through scancel, ends cancelled, not retried.
    add(
        "cancelled",
        &["--usage", "300,30,0.000300", "--sleep", "600"],
        "",
    );
    // Reports more tokens than its budget, then keeps working: stopped through scancel, its
    // output so far kept (partial).
    add(
        "budget",
        &[
            "--usage",
            "1000,100,0.001000",
            "--stall-attempts",
            "1",
            "--stall-at-turn",
            "1",
        ],
        "max_tokens = 500",
    );
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 8\n\n[defaults]\nexecutor = \"slurm\"\nmax_retries = 1\n\
             kill_grace = \"2s\"\n\n{tasks}"
        ),
    );
    let run = unique_run("slurm20");
    let _cleanup = slurm::CancelOnDrop(format!("sortie:{run}:"));
    let bg = Background::start(
        &s,
        &run,
        &["run", "--run-id", &run, batch.to_str().unwrap()],
    );
    // Cancel attempt 1 of `cancelled-outside` once its job runs.
    let index = |label: &str| order.iter().position(|l| l == label).expect("a label");
    let prefix = format!("sortie:{run}:{}:1:", index("cancelled-outside"));
    let job = poll("the job of cancelled-outside runs", 60, || {
        slurm::squeue_jobs(&prefix)
            .into_iter()
            .find(|j| j.state == "RUNNING")
    });
    slurm::scancel(job.id);
    // Cancel `cancelled` through the run's control socket once its job runs.
    let prefix = format!("sortie:{run}:{}:1:", index("cancelled"));
    let mine = poll("the job of cancelled runs", 60, || {
        slurm::squeue_jobs(&prefix)
            .into_iter()
            .find(|j| j.state == "RUNNING")
    });
    let reply = s.run_ok(&["cancel", &run, "--task", "cancelled"]);
    assert!(
        String::from_utf8_lossy(&reply.stdout).contains("cancelled"),
        "{reply:?}"
    );
    // The job itself is over, in Slurm's own words (not scancel's silent exit 0).
    let gone = poll(
        "the cancelled task's job is cancelled in squeue",
        60,
        || {
            slurm::squeue_jobs(&prefix)
                .into_iter()
                .find(|j| j.id == mine.id && !["RUNNING", "COMPLETING"].contains(&j.state.as_str()))
        },
    );
    assert_eq!(gone.state, "CANCELLED");
    let out = bg.finish(240);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed and a timed-out task: {stderr}"
    );

    let status = s.status(&run);
    let state = |label: &str| {
        task_view(&status, label)["state"]
            .as_str()
            .map(str::to_owned)
    };
    let attempts = |label: &str| task_view(&status, label)["attempts"].as_u64();
    for k in 0..12 {
        let label = format!("answer-{k}");
        assert_eq!(state(&label).as_deref(), Some("completed"), "{label}");
        assert_eq!(attempts(&label), Some(1), "{label}");
    }
    for label in ["retry-503", "fallback", "stall", "cancelled-outside"] {
        assert_eq!(
            state(label).as_deref(),
            Some("completed"),
            "{label}: {status}"
        );
        assert_eq!(attempts(label), Some(2), "{label}");
    }
    assert_eq!(state("timeout").as_deref(), Some("timeout"));
    assert_eq!(state("fails").as_deref(), Some("failed"));
    assert_eq!(state("cancelled").as_deref(), Some("cancelled"));
    assert_eq!(attempts("cancelled"), Some(1), "a cancel is not retried");
    assert_eq!(state("budget").as_deref(), Some("partial"), "{status}");
    assert_eq!(attempts("budget"), Some(1));

    let j = journal(&s, &run);
    let labels: Vec<String> = crate::support::labels(j.events());
    // Every attempt whose job ran is journaled started (with pid 0: no process here), as
    // resume and the crash matrix's checkpoints expect.
    for k in 0..12 {
        let t = labels
            .iter()
            .position(|l| *l == format!("answer-{k}"))
            .unwrap() as u64;
        let started = j.of(t, "AttemptStarted");
        assert_eq!(started.len(), 1, "answer-{k}: {started:?}");
        assert_eq!(started[0]["pid"], 0, "answer-{k}");
    }
    // Each attempt's journaled usage is what its agent last reported, and nothing more.
    assert_eq!(
        journaled_usage(&j, &labels),
        logged_usage(s.path(), &labels)
    );
    let audit = s.audit_clean(&run);
    let logged_total = logged_usage(s.path(), &labels)
        .values()
        .fold(Usage::default(), |a, u| a.plus(*u));
    assert_eq!(Usage::of(&audit["ledger"]["total"]), Some(logged_total));
    // Each side effect happened once per attempt that got to it.
    for label in &labels {
        let count =
            std::fs::read_to_string(s.path().join(format!("{label}.count"))).unwrap_or_default();
        let expected = usize::from(!["timeout", "cancelled", "budget"].contains(&label.as_str()));
        assert_eq!(count.lines().count(), expected, "{label}: {count}");
    }

    // Slurm ran exactly one job per attempt; the stops went through scancel.
    // The user's cancel is journaled as a control action, and the attempt says it.
    let task_of = |label: &str| labels.iter().position(|l| l == label).unwrap() as u64;
    let controls: Vec<&Value> = j
        .kinds()
        .filter(|(k, _)| *k == "Control")
        .map(|(_, b)| b)
        .collect();
    assert_eq!(controls.len(), 1, "{controls:?}");
    let action = controls[0]["action"].as_object().expect("an action");
    let (name, body) = action.iter().next().expect("one action");
    assert_eq!(
        (name.as_str(), body["task"].as_u64()),
        ("cancel", Some(task_of("cancelled")))
    );
    let stop_of = |label: &str| -> Vec<String> {
        j.kinds()
            .filter(|(k, b)| *k == "AttemptFinished" && b["task"] == task_of(label))
            .map(|(_, b)| {
                b["outcome"]["stop_reason"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(stop_of("cancelled"), ["cancelled"]);
    assert_eq!(stop_of("budget"), ["budget"]);
    assert_eq!(stop_of("stall")[0], "stalled");
    assert_eq!(stop_of("timeout"), ["timeout"]);

    let jobs = one_job_per_attempt(&j, &run);
    let job_state = |label: &str, attempt: u64| jobs[&(task_of(label), attempt)].state.clone();
    assert_eq!(job_state("stall", 1), "CANCELLED");
    assert_eq!(job_state("stall", 2), "COMPLETED");
    assert_eq!(job_state("timeout", 1), "CANCELLED");
    assert_eq!(job_state("cancelled-outside", 1), "CANCELLED");
    assert_eq!(job_state("retry-503", 1), "FAILED");
    assert_eq!(job_state("fails", 1), "FAILED");
    assert_eq!(job_state("answer-0", 1), "COMPLETED");
    assert_eq!(job_state("cancelled", 1), "CANCELLED");
    assert_eq!(job_state("budget", 1), "CANCELLED");
    assert_eq!(jobs.len(), 12 + 2 * 4 + 4);
}

/// #10: a Slurm job's transcript is capped too, while the job runs: sortie's follower is its
/// cutter (nothing of sortie's runs beside the job). A chatty job (25 times the cap) that then
/// waits keeps its head and tail within about the cap while it still runs, the stream's
/// length kept; once it ended, `status --task` says what was cut and `logs` prints whole lines
/// only, the first and the last.
#[test]
fn slurm_transcripts_are_cut_to_the_cap_while_the_job_runs() {
    if !slurm::should_run("slurm_transcripts_are_cut_to_the_cap_while_the_job_runs") {
        return;
    }
    const CAP: u64 = 64 * 1024;
    let s = Scratch::new();
    let end = s.path().join("end");
    let chatty = r#"["sh", "-c", "seq 1 100000 | awk '{print \"{\\\"n\\\":\" $1 \"}\"}'; while [ ! -e END ]; do sleep 0.1; done"]"#
        .replace("END", &end.display().to_string());
    let batch = s.write(
        "batch.toml",
        &format!(
            "[defaults]\nexecutor = \"slurm\"\n\n[[tasks]]\nlabel = \"chatty\"\ncommand = {chatty}\n"
        ),
    );
    let run = unique_run("slurmcap");
    let _cleanup = slurm::CancelOnDrop(format!("sortie:{run}:"));
    let mut cmd = s.sortie();
    cmd.env("SORTIE_TRANSCRIPT_CAP", CAP.to_string()).args([
        "--quiet",
        "run",
        "--run-id",
        &run,
        batch.to_str().expect("utf-8"),
    ]);
    let sortie = Background::from_command(cmd, &run);
    let whole: u64 = (1..=100_000u64)
        .map(|n| n.to_string().len() as u64 + 7)
        .sum();
    let transcript = || -> Option<Value> {
        let out = s
            .sortie()
            .args(["--json", "status", &run, "--task", "chatty"])
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(v["transcripts"][0].clone())
    };
    // While the job still runs (it waits for `end`): cut to about the cap.
    let t = poll("the running job's transcript to be cut", 120, || {
        transcript().filter(|t| {
            t["end"] == "running"
                && t["bytes"] == whole
                && t["disk_bytes"].as_u64().is_some_and(|d| d <= 2 * CAP)
        })
    });
    assert_eq!(t["executor"], "slurm", "{t}");
    assert_eq!(t["cut"]["from"], 16 * 1024, "{t}");
    std::fs::write(&end, "").expect("end");
    let out = sortie.finish(180);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let t = transcript().expect("status");
    assert_eq!(t["bytes"], whole, "the stream's length stays: {t}");
    assert!(
        t["disk_bytes"].as_u64().is_some_and(|d| d <= 2 * CAP),
        "{t}"
    );
    let out = s.run_ok(&["logs", &run, "chatty"]);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"{\"n\":1}"), "the head");
    assert_eq!(lines.last(), Some(&"{\"n\":100000}"), "the tail");
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("{\"n\":") && l.ends_with('}')),
        "every line printed is whole"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("were cut"));
}
