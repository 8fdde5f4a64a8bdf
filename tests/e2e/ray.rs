//! End-to-end tests against a real Ray head node (`.ci/ray/up.sh`; skipped with a printed
//! reason when none answers, failed under CI): a 20-task batch of fake agents run as Ray jobs,
//! one of them cancelled with `sortie cancel --task` (its job ends `STOPPED`), checked through
//! `status --json`, `audit` and Ray's own job list (one submission per attempt); and a SIGKILL
//! of sortie with jobs running, then `resume`: every side effect once, no submission id
//! submitted twice, the audit clean.

use std::collections::BTreeMap;

use serde_json::Value;
use sortie_testkit::real_agent::under_ci;
use sortie_testkit::{Events, Journal, poll, unique_run};

use crate::support::{Background, Scratch, fake_command, send_signal, task_view};

/// The head's job API (`SORTIE_RAY_ADDRESS`, as `.ci/ray/up.sh` prints it, else Ray's default).
fn address() -> String {
    std::env::var("SORTIE_RAY_ADDRESS").unwrap_or_else(|_| "http://127.0.0.1:8265".into())
}

fn curl(path: &str) -> Result<String, String> {
    let out = std::process::Command::new("curl")
        .args(["-fsS", "--max-time", "5", &format!("{}{path}", address())])
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether the Ray test `test` runs: true when a head answers; false (printed) when none does
/// outside CI; a panic under CI.
fn should_run(test: &str) -> bool {
    match curl("/api/version") {
        Ok(_) => true,
        Err(why) if under_ci() => panic!("ray test {test} cannot run under CI: {why}"),
        Err(why) => {
            eprintln!(
                "ray test {test}: SKIPPED (passes without checking anything): no Ray head at \
                 {}: {why}\n(start one with `.ci/ray/up.sh`; with CI set, this fails instead)",
                address()
            );
            false
        }
    }
}

/// The head's jobs whose submission id starts with `prefix`: id → status.
fn jobs(prefix: &str) -> BTreeMap<String, String> {
    let list: Value = serde_json::from_str(&curl("/api/jobs/").expect("the job list"))
        .expect("the job list is JSON");
    list.as_array()
        .expect("an array")
        .iter()
        .filter_map(|j| {
            let id = j["submission_id"].as_str()?;
            id.starts_with(prefix)
                .then(|| (id.to_owned(), j["status"].as_str().unwrap_or("").to_owned()))
        })
        .collect()
}

/// The submission id prefix of run `run`'s task `task`, attempt `attempt`.
fn job_prefix(run: &str, task: usize, attempt: u64) -> String {
    format!("sortie-{run}-{task}-{attempt}-")
}

fn journal(s: &Scratch, run: &str) -> Journal {
    Journal::parse(&s.run_ok(&["export", run]).stdout).expect("export parses")
}

/// Every journaled attempt of the run has exactly one Ray job, and the run no other.
fn one_job_per_attempt(j: &Journal, run: &str) -> BTreeMap<String, String> {
    let all = poll("every job of the run ended", 60, || {
        let all = jobs(&format!("sortie-{run}-"));
        all.values()
            .all(|s| !["PENDING", "RUNNING"].contains(&s.as_str()))
            .then_some(all)
    });
    let launched: Vec<String> = j
        .kinds()
        .filter(|(k, _)| *k == "AttemptLaunching")
        .map(|(_, b)| {
            let t = b["task"].as_u64().unwrap_or(0) as usize;
            job_prefix(run, t, b["attempt"].as_u64().unwrap_or(0))
        })
        .collect();
    for p in &launched {
        let n = all.keys().filter(|id| id.starts_with(p.as_str())).count();
        assert_eq!(n, 1, "one job for attempt {p}: {all:?}");
    }
    assert_eq!(all.len(), launched.len(), "no other job: {all:?}");
    all
}

fn batch(s: &Scratch, tasks: &str) -> std::path::PathBuf {
    s.write(
        "batch.toml",
        &format!(
            "concurrency = 8\n\n[defaults]\nexecutor = \"ray\"\nmax_retries = 1\n\
             kill_grace = \"2s\"\n\n[defaults.ray]\naddress = \"{}\"\nnum_cpus = 0.1\n\n{tasks}",
            address()
        ),
    )
}

#[test]
fn ray_batch_of_twenty_with_a_cancel_one_job_per_attempt() {
    if !should_run("ray_batch_of_twenty_with_a_cancel_one_job_per_attempt") {
        return;
    }
    let s = Scratch::new();
    let dir = s.path().display().to_string();
    let mut tasks = String::new();
    let mut order = Vec::new();
    for k in 0..20 {
        let label = if k == 19 {
            "cancelled".to_owned()
        } else {
            format!("t{k}")
        };
        let counter = format!("{dir}/{label}.count");
        let usage = format!("{},{},{:.6}", 1000 + k, 100 + k, (10 + k) as f64 / 1e6);
        let mut args = vec!["--usage", &usage, "--counter", &counter, "--answer", "ok"];
        if k == 19 {
            args.extend(["--sleep", "600"]);
        }
        if k == 18 {
            args.extend(["--exit", "3"]);
        }
        tasks.push_str(&format!(
            "[[tasks]]\nlabel = \"{label}\"\ncommand = {}\n\n",
            fake_command(&args)
        ));
        order.push(label);
    }
    let batch = batch(&s, &tasks);
    // `sortie check` reaches the head and says what it has.
    let checked = s.run_ok(&["check", batch.to_str().unwrap()]);
    let checked = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.contains("Ray ") && checked.contains("CPU ") && checked.contains("node"),
        "{checked}"
    );
    let run = unique_run("ray20");
    let bg = Background::start(
        &s,
        &run,
        &["run", "--run-id", &run, batch.to_str().unwrap()],
    );
    let mine = job_prefix(&run, 19, 1);
    poll("the cancelled task's job runs", 90, || {
        jobs(&mine).values().any(|s| s == "RUNNING").then_some(())
    });
    let reply = s.run_ok(&["cancel", &run, "--task", "cancelled"]);
    assert!(
        String::from_utf8_lossy(&reply.stdout).contains("cancelled"),
        "{reply:?}"
    );
    let stopped = poll("the cancelled task's job is STOPPED", 60, || {
        jobs(&mine)
            .into_values()
            .find(|s| s != "RUNNING" && s != "PENDING")
    });
    assert_eq!(stopped, "STOPPED");
    let out = bg.finish(240);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status(&run);
    for label in &order {
        let t = task_view(&status, label);
        let want = match label.as_str() {
            "cancelled" => "cancelled",
            "t18" => "failed",
            _ => "completed",
        };
        assert_eq!(t["state"], want, "{label}: {t}");
        assert_eq!(t["attempts"], 1, "{label}: {t}");
        let count =
            std::fs::read_to_string(s.path().join(format!("{label}.count"))).unwrap_or_default();
        let once = usize::from(label != "cancelled");
        assert_eq!(count.lines().count(), once, "{label}");
    }
    let j = journal(&s, &run);
    let all = one_job_per_attempt(&j, &run);
    assert_eq!(all.values().filter(|s| *s == "SUCCEEDED").count(), 18);
    assert_eq!(
        all[&jobs(&job_prefix(&run, 18, 1))
            .into_keys()
            .next()
            .expect("t18")],
        "FAILED"
    );
    s.audit_clean(&run);
}

#[test]
fn ray_sigkill_with_jobs_running_then_resume() {
    if !should_run("ray_sigkill_with_jobs_running_then_resume") {
        return;
    }
    let s = Scratch::new();
    let dir = s.path().display().to_string();
    let mut tasks = String::new();
    let sleeps = ["1", "6", "3", "3", "3", "3"];
    for (k, sleep) in sleeps.iter().enumerate() {
        let counter = format!("{dir}/t{k}.count");
        let usage = format!("{},{},{:.6}", 2000 + k, 200 + k, (30 + k) as f64 / 1e6);
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
            "[[tasks]]\nlabel = \"t{k}\"\ncommand = {command}\n\n"
        ));
    }
    let batch = batch(&s, &tasks);
    let run = unique_run("raycrash");
    let bg = Background::start(
        &s,
        &run,
        &["run", "--run-id", &run, batch.to_str().unwrap()],
    );
    let prefix = format!("sortie-{run}-");
    poll("the run's jobs are submitted and running", 90, || {
        let all = jobs(&prefix);
        (all.len() == sleeps.len() && all.values().any(|s| s == "RUNNING")).then_some(())
    });
    send_signal(bg.pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = bg.finish(10);
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
        assert_eq!(
            t["attempts"], 1,
            "t{k}: adopted or recorded, never run again: {t}"
        );
        let count = std::fs::read_to_string(s.path().join(format!("t{k}.count"))).unwrap();
        assert_eq!(count.lines().count(), 1, "t{k}: its side effect once");
    }
    let j = journal(&s, &run);
    let all = one_job_per_attempt(&j, &run);
    assert!(all.values().all(|s| s == "SUCCEEDED"), "{all:?}");
    s.audit_clean(&run);
}

/// A crash between the journaled placement and the submission (a test hook SIGKILLs sortie
/// once the job's script is written): resume submits the job once, under attempt 1's id, and
/// the attempt is not orphaned.
#[test]
fn ray_crash_between_the_journal_and_the_submit_submits_once() {
    if !should_run("ray_crash_between_the_journal_and_the_submit_submits_once") {
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let s = Scratch::new();
    let counter = s.path().join("count").display().to_string();
    let command = fake_command(&["--counter", &counter, "--usage", "10,1,0.000010"]);
    let batch = batch(
        &s,
        &format!("[[tasks]]\nlabel = \"once\"\ncommand = {command}\n"),
    );
    let run = unique_run("rayhook");
    let out = s
        .sortie()
        .args(["run", "--run-id", &run, batch.to_str().unwrap()])
        .env("SORTIE_TEST_CRASH_BEFORE_RAY_SUBMIT", "1")
        .output()
        .expect("run sortie");
    assert_eq!(out.status.signal(), Some(9), "the hook killed sortie");
    assert!(journal(&s, &run).has(0, "AttemptPlaced"), "placed first");
    assert!(
        jobs(&format!("sortie-{run}-")).is_empty(),
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
    let j = journal(&s, &run);
    let all = one_job_per_attempt(&j, &run);
    assert_eq!(all.len(), 1, "submitted once: {all:?}");
    assert_eq!(j.count("AttemptOrphaned"), 0);
    s.audit_clean(&run);
}

/// Asks the head to stop job `id`, as someone outside sortie would.
fn stop_from_outside(id: &str) {
    let out = std::process::Command::new("curl")
        .args([
            "-fsS",
            "-X",
            "POST",
            &format!("{}/api/jobs/{id}/stop", address()),
        ])
        .output()
        .expect("curl");
    assert!(out.status.success(), "{out:?}");
}

/// Sortie's own stops and Ray's: a timeout and a budget stop their jobs (`STOPPED`, not
/// retried), a job stopped from outside is an unexpected signal (retried, then completed).
#[test]
fn ray_timeout_budget_and_a_stop_from_outside() {
    if !should_run("ray_timeout_budget_and_a_stop_from_outside") {
        return;
    }
    let s = Scratch::new();
    let dir = s.path().display().to_string();
    let counter = |l: &str| format!("{dir}/{l}.count");
    let (c0, c1, c2) = (counter("timeout"), counter("budget"), counter("outside"));
    let tasks = format!(
        "[[tasks]]\nlabel = \"timeout\"\nattempt_timeout = \"3s\"\ncommand = {}\n\n\
         [[tasks]]\nlabel = \"budget\"\nmax_tokens = 500\ncommand = {}\n\n\
         [[tasks]]\nlabel = \"outside\"\ncommand = {}\n",
        fake_command(&["--sleep", "600", "--counter", &c0]),
        fake_command(&[
            "--usage",
            "1000,100,0.001000",
            "--stall-attempts",
            "1",
            "--stall-at-turn",
            "1",
            "--counter",
            &c1,
        ]),
        fake_command(&[
            "--usage",
            "10,1,0.000010",
            "--sleep",
            "600",
            "--sleep-attempts",
            "1",
            "--attempt",
            "{attempt}",
            "--counter",
            &c2,
        ]),
    );
    let batch = batch(&s, &tasks);
    let run = unique_run("raystops");
    let bg = Background::start(
        &s,
        &run,
        &["run", "--run-id", &run, batch.to_str().unwrap()],
    );
    let outside = job_prefix(&run, 2, 1);
    let id = poll("the outside task's job runs", 90, || {
        jobs(&outside)
            .into_iter()
            .find(|(_, st)| st == "RUNNING")
            .map(|(id, _)| id)
    });
    stop_from_outside(&id);
    let out = bg.finish(180);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status(&run);
    let view = |l: &str| task_view(&status, l);
    assert_eq!(view("timeout")["state"], "timeout", "{status}");
    assert_eq!(view("budget")["state"], "partial", "{status}");
    assert_eq!(view("outside")["state"], "completed", "{status}");
    assert_eq!(
        view("outside")["attempts"],
        2,
        "a stop from outside is retried"
    );
    let j = journal(&s, &run);
    let all = one_job_per_attempt(&j, &run);
    let state = |t: usize, a: u64| {
        let p = job_prefix(&run, t, a);
        all.iter()
            .find(|(id, _)| id.starts_with(&p))
            .map(|(_, s)| s.clone())
    };
    assert_eq!(state(0, 1).as_deref(), Some("STOPPED"));
    assert_eq!(state(1, 1).as_deref(), Some("STOPPED"));
    assert_eq!(state(2, 1).as_deref(), Some("STOPPED"));
    assert_eq!(state(2, 2).as_deref(), Some("SUCCEEDED"));
    let finished: Vec<String> = j
        .kinds()
        .filter(|(k, b)| *k == "AttemptFinished" && b["task"] == 2)
        .map(|(_, b)| {
            b["outcome"]["stop_reason"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(finished[0], "unexpected_signal", "{finished:?}");
    s.audit_clean(&run);
}

/// Ctrl-C of a run with jobs running: every job is stopped (none left running on the head).
#[test]
fn ray_ctrl_c_stops_every_job() {
    if !should_run("ray_ctrl_c_stops_every_job") {
        return;
    }
    let s = Scratch::new();
    let mut tasks = String::new();
    for k in 0..4 {
        let command = fake_command(&["--sleep", "600"]);
        tasks.push_str(&format!(
            "[[tasks]]\nlabel = \"t{k}\"\ncommand = {command}\n\n"
        ));
    }
    let batch = batch(&s, &tasks);
    let run = unique_run("rayint");
    let bg = Background::start(
        &s,
        &run,
        &["run", "--run-id", &run, batch.to_str().unwrap()],
    );
    let prefix = format!("sortie-{run}-");
    poll("every job runs", 90, || {
        let all = jobs(&prefix);
        (all.len() == 4 && all.values().all(|s| s == "RUNNING")).then_some(())
    });
    send_signal(bg.pid(), nix::sys::signal::Signal::SIGINT);
    let out = bg.finish(120);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = poll("no job of the run runs", 60, || {
        let all = jobs(&prefix);
        all.values()
            .all(|s| s != "RUNNING" && s != "PENDING")
            .then_some(all)
    });
    assert!(all.values().all(|s| s == "STOPPED"), "{all:?}");
}

/// A batch on a Ray head that does not answer fails at once, naming the address, and `sortie
/// check` says the same (no head needed).
#[test]
fn ray_without_a_head_fails_at_once_naming_the_address() {
    let s = Scratch::new();
    let batch = s.write(
        "batch.toml",
        "[defaults]\nexecutor = \"ray\"\n\n[defaults.ray]\naddress = \"http://127.0.0.1:9\"\n\n\
         [[tasks]]\ncommand = [\"true\"]\n",
    );
    let out = s.run(&["run", batch.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the Ray head at http://127.0.0.1:9 does not answer"),
        "{stderr}"
    );
    let out = s.run(&["check", batch.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("http://127.0.0.1:9"), "{stdout}");
}

/// A fake head (Python's http.server: no Ray needed) that answers the version, takes one
/// submission and lists it running, until it is killed: the head lost.
const FAKE_HEAD: &str = r#"
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
jobs = {}
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def answer(self, body, code=200):
        b = json.dumps(body).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_GET(self):
        if self.path == "/api/version": return self.answer({"ray_version": "fake"})
        if self.path == "/api/jobs/": return self.answer([{"submission_id": i, "status": "RUNNING"} for i in jobs])
        i = self.path.split("/")[3]
        return self.answer({"submission_id": i, "status": "RUNNING"}) if i in jobs else self.answer({}, 404)
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"{}")
        if "submission_id" in body: jobs[body["submission_id"]] = 1
        return self.answer({"submission_id": body.get("submission_id"), "stopped": False})
s = HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// A head that stops answering mid-attempt: the attempt ends as a transient error naming the
/// head (after the lost-head wait, shortened here), not a hang.
#[test]
fn ray_a_lost_head_is_a_transient_error_naming_it() {
    use std::io::BufRead;
    let mut head = std::process::Command::new("python3")
        .args(["-c", FAKE_HEAD])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the fake head");
    let mut port = String::new();
    std::io::BufReader::new(head.stdout.take().expect("its stdout"))
        .read_line(&mut port)
        .expect("the fake head's port");
    let address = format!("http://127.0.0.1:{}", port.trim());
    let s = Scratch::new();
    let batch = s.write(
        "batch.toml",
        &format!(
            "[defaults]\nexecutor = \"ray\"\nmax_retries = 0\n\n[defaults.ray]\n\
             address = \"{address}\"\n\n[[tasks]]\nlabel = \"lost\"\ncommand = [\"true\"]\n"
        ),
    );
    let run = unique_run("raylost");
    let mut cmd = s.sortie();
    cmd.args(["run", "--run-id", &run, batch.to_str().unwrap()])
        .env("SORTIE_TEST_RAY_LOST_AFTER_MS", "1500");
    let bg = Background::from_command(cmd, &run);
    // Time to submit the job and see it running.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let _ = head.kill();
    let _ = head.wait();
    let out = bg.finish(60);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = journal(&s, &run);
    let errors: Vec<(String, String)> = j
        .kinds()
        .filter(|(k, _)| *k == "AttemptFinished")
        .map(|(_, b)| {
            let o = &b["outcome"];
            (
                o["stop_reason"].as_str().unwrap_or("").to_owned(),
                o["error"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, "error", "a transient error: {errors:?}");
    assert!(
        errors[0]
            .1
            .contains(&format!("lost the Ray head at {address}")),
        "{errors:?}"
    );
}
