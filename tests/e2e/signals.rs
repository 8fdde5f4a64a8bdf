//! End-to-end tests: signals and a live run seen from other processes. Ctrl-C (SIGINT),
//! SIGTERM and SIGHUP interrupt a run resumably (exit 3, children stopped, attempts journaled
//! as interrupted, no retry spent) and `resume` finishes it without re-running finished work; `status` of a live run works from
//! another process and a second owner is refused; `cancel` ends a run, live or dead, with its
//! unfinished tasks cancelled and no child left.

use std::path::PathBuf;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{
    Background, Scratch, fake_command, labels, live_processes_of, poll, send_signal, task_view,
    unique_run,
};
use sortie_testkit::Events;

/// The long tasks of the batches here.
const LONG: [&str; 3] = ["long-1", "long-2", "long-3"];

/// A batch of three long tasks (30 s on attempt 1, at once on later attempts, usage over 30
/// turns), plus, with `quick`, one task that completes at once and counts its runs in
/// `counter`.
fn batch(s: &Scratch, quick: bool) -> PathBuf {
    let mut toml = String::from("concurrency = 4\n\n[defaults]\nkill_grace = \"1s\"\n\n");
    if quick {
        toml.push_str(&format!(
            "[[tasks]]\nlabel = \"quick\"\ncommand = {}\n\n",
            fake_command(&["--counter", "counter", "--usage", "3,4,0.005"])
        ));
    }
    for l in LONG {
        toml.push_str(&format!(
            "[[tasks]]\nlabel = {l:?}\ncommand = {}\n\n",
            fake_command(&[
                "--attempt",
                "{attempt}",
                "--sleep",
                "30",
                "--sleep-attempts",
                "1",
                "--turns",
                "30",
                "--usage",
                "30,60,0.03",
                "--answer",
                &format!("{l} finished"),
            ])
        ));
    }
    s.write("batch.toml", &toml)
}

/// Waits until every long task of `run` is running and has checkpointed some usage (and the
/// quick task, if any, has finished).
fn wait_running(s: &Scratch, run: &str) {
    poll("the long tasks to run and report usage", 30, || {
        let events = s.try_events(run)?;
        if events.is_empty() {
            return None;
        }
        let order = labels(&events);
        let all_going = LONG.iter().all(|l| {
            let i = order.iter().position(|x| x == l).expect("a long task");
            !events.of(i as u64, "AttemptProgress").is_empty()
        });
        let quick_done = order
            .iter()
            .position(|x| x == "quick")
            .is_none_or(|i| !events.of(i as u64, "TaskFinished").is_empty());
        (all_going && quick_done).then_some(())
    });
}

/// Waits until no process of `run`'s attempts is alive.
fn wait_no_children(run: &str) {
    poll("every child of the run to be gone", 10, || {
        live_processes_of(run).is_empty().then_some(())
    });
}

/// The index of `label` among the run's tasks.
fn index(events: &[Value], label: &str) -> usize {
    labels(events)
        .iter()
        .position(|l| l == label)
        .unwrap_or_else(|| panic!("no task {label}"))
}

/// The stop reasons of a task's finished attempts, in order.
fn attempt_reasons(events: &[Value], task: usize) -> Vec<String> {
    events
        .of(task as u64, "AttemptFinished")
        .iter()
        .map(|e| {
            e["outcome"]["stop_reason"]
                .as_str()
                .unwrap_or("?")
                .to_owned()
        })
        .collect()
}

/// Interrupts a run with SIGINT and checks what a user sees: exit 3, how to resume, no child
/// left, `status` says interrupted, the journal says why.
fn interrupt(s: &Scratch, run: &str, sortie: Background) {
    interrupt_with(s, run, sortie, Signal::SIGINT);
}

/// Same, with `signal` (SIGINT or SIGTERM).
fn interrupt_with(s: &Scratch, run: &str, sortie: Background, signal: Signal) {
    send_signal(sortie.pid(), signal);
    let out = sortie.finish(30);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "interrupted: exit 3\n{stderr}");
    assert!(
        stderr.contains(&format!("resume {run}")),
        "stderr says how to resume:\n{stderr}"
    );
    wait_no_children(run);

    let status = s.status(run);
    assert_eq!(status["status"], "interrupted", "{status}");
    assert!(status["live_pid"].is_null(), "{status}");
    let list = s.run(&["--json", "list"]);
    let rows: Value = serde_json::from_slice(&list.stdout).expect("list --json");
    assert_eq!(rows[0]["run_id"], run, "{rows}");
    assert_eq!(rows[0]["status"], "interrupted", "{rows}");
    let events = s.events(run);
    for l in LONG {
        let i = index(&events, l);
        assert_eq!(attempt_reasons(&events, i), ["interrupted"], "{l}");
        assert_eq!(task_view(&status, l)["state"], "interrupted", "{status}");
        assert!(
            events.of(i as u64, "TaskFinished").is_empty(),
            "{l} is not finished: resume decides"
        );
    }
    assert_eq!(events.count("RunInterrupted"), 1);
    assert_eq!(events.count("RunFinished"), 0);
}

#[test]
fn ctrl_c_interrupts_resumably_and_resume_finishes_the_run() {
    let s = Scratch::new();
    let run = &unique_run("sig");
    let b = batch(&s, true);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, b.to_str().expect("utf-8")],
    );
    wait_running(&s, run);
    interrupt(&s, run, sortie);
    let before = s.events(run);
    let checkpoints: Vec<u64> = LONG
        .iter()
        .map(|l| {
            let fin = before.of((index(&before, l)) as u64, "AttemptFinished");
            fin[0]["usage"]["input"].as_u64().expect("input")
        })
        .collect();
    assert!(
        checkpoints.iter().all(|&c| c >= 1),
        "each interrupted attempt kept its checkpointed usage: {checkpoints:?}"
    );

    let out = Background::start(&s, run, &["resume", run]).finish(60);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "resume completes the run\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for l in LONG {
        assert!(
            stdout.contains(&format!("[{l}] completed\n"))
                && stdout.contains(&format!("{l} finished")),
            "{stdout}"
        );
    }
    wait_no_children(run);

    let status = s.status(run);
    assert_eq!(status["status"], "completed", "{status}");
    let events = s.events(run);
    assert_eq!(events.count("RunResumed"), 1);
    for (l, checkpoint) in LONG.iter().zip(&checkpoints) {
        let i = index(&events, l);
        assert_eq!(
            attempt_reasons(&events, i),
            ["interrupted", "completed"],
            "{l}: the interrupted attempt was retried"
        );
        let t = task_view(&status, l);
        assert_eq!(t["attempts"], 2, "{t}");
        // The interrupted attempt's checkpoint plus the whole of attempt 2.
        assert_eq!(t["usage"]["input"], checkpoint + 30, "{l}: {t}");
    }
    // The quick task finished before the interrupt: never run again.
    let quick = task_view(&status, "quick");
    assert_eq!(quick["attempts"], 1, "{quick}");
    let runs = std::fs::read_to_string(s.path().join("counter")).expect("counter");
    assert_eq!(runs.lines().count(), 1, "the quick task ran once: {runs}");

    let audit = s.audit_clean(run);
    let total = &audit["ledger"]["total"];
    assert_eq!(total["input"], 3 + checkpoints.iter().sum::<u64>() + 3 * 30);
}

#[test]
fn a_live_run_answers_status_and_refuses_a_second_owner() {
    let s = Scratch::new();
    let run = &unique_run("live");
    let b = batch(&s, false);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, b.to_str().expect("utf-8")],
    );
    let pid = sortie.pid();
    wait_running(&s, run);

    // `status` from another process, while the run is live.
    let status = s.status(run);
    assert_eq!(status["status"], "running", "{status}");
    assert_eq!(status["live_pid"], pid, "{status}");
    for l in LONG {
        assert_eq!(task_view(&status, l)["state"], "running", "{status}");
    }
    let list = s.run(&["--json", "list"]);
    let rows: Value = serde_json::from_slice(&list.stdout).expect("list --json");
    assert_eq!(rows[0]["status"], "running", "{rows}");
    assert_eq!(rows[0]["live_pid"], pid, "{rows}");

    // A second owner is refused, naming the live one.
    let out = s.run(&["resume", run]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&pid.to_string()),
        "the refusal names pid {pid}: {stderr}"
    );
    // The refused resume disturbed nothing: the run goes on.
    let status = s.status(run);
    assert_eq!(status["status"], "running", "{status}");
    assert_eq!(s.events(run).count("RunResumed"), 0);
    assert_eq!(live_processes_of(run).len(), LONG.len());

    interrupt(&s, run, sortie);
}

#[test]
fn cancel_of_a_live_run_cancels_its_unfinished_tasks() {
    let s = Scratch::new();
    let run = &unique_run("cancel-live");
    let b = batch(&s, false);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, b.to_str().expect("utf-8")],
    );
    wait_running(&s, run);

    let cancel = Background::start(&s, run, &["cancel", run]).finish(30);
    let ended = sortie.finish(30);
    let code = cancel.status.code();
    assert!(
        code != Some(0) && code != Some(3),
        "a cancelled run is neither completed nor resumable: {code:?}\n{}",
        String::from_utf8_lossy(&cancel.stderr)
    );
    assert_eq!(ended.status.code(), code, "the run and the cancel agree");
    wait_no_children(run);

    let status = s.status(run);
    assert_eq!(status["status"], "cancelled", "{status}");
    assert!(status["live_pid"].is_null());
    let events = s.events(run);
    for l in LONG {
        let t = task_view(&status, l);
        assert_eq!(t["state"], "cancelled", "{t}");
        assert_eq!(t["stop_reason"], "cancelled", "{t}");
        assert_eq!(t["attempts"], 1, "a cancelled task is not retried: {t}");
        assert!(
            t["error"].as_str().is_some_and(|e| e.contains("cancel")),
            "a cancelled task says it was cancelled: {t}"
        );
        assert_eq!(attempt_reasons(&events, index(&events, l)), ["cancelled"]);
    }
    assert_eq!(events.count("RunFinished"), 1);
    assert_eq!(events.count("RetryScheduled"), 0);
    s.audit_clean(run);

    // Final: there is nothing left to resume.
    let again = s.run(&["resume", run]);
    assert_eq!(again.status.code(), Some(2));
}

#[test]
fn cancel_of_an_interrupted_run_cancels_its_unfinished_tasks() {
    let s = Scratch::new();
    let run = &unique_run("cancel-dead");
    let b = batch(&s, true);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, b.to_str().expect("utf-8")],
    );
    wait_running(&s, run);
    // SIGTERM interrupts just like Ctrl-C.
    interrupt_with(&s, run, sortie, Signal::SIGTERM);

    let out = Background::start(&s, run, &["cancel", run]).finish(30);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a partial run: exit 1\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_no_children(run);

    let status = s.status(run);
    assert_eq!(
        status["status"], "partial",
        "one task completed, the rest cancelled: {status}"
    );
    assert_eq!(task_view(&status, "quick")["state"], "completed");
    let events = s.events(run);
    for l in LONG {
        let t = task_view(&status, l);
        assert_eq!(t["state"], "cancelled", "{t}");
        assert_eq!(t["stop_reason"], "cancelled", "{t}");
        assert_eq!(t["attempts"], 1, "nothing relaunched: {t}");
        assert!(
            t["error"].as_str().is_some_and(|e| e.contains("cancel")),
            "a cancelled task says it was cancelled, not only why its attempt ended: {t}"
        );
        assert!(
            events
                .of((index(&events, l)) as u64, "AttemptLaunching")
                .len()
                == 1
        );
    }
    assert_eq!(events.count("RunFinished"), 1);
    let runs = std::fs::read_to_string(s.path().join("counter")).expect("counter");
    assert_eq!(runs.lines().count(), 1, "the quick task ran once");
    s.audit_clean(run);
}

#[test]
fn a_second_ctrl_c_exits_at_once_and_the_run_stays_resumable() {
    let s = Scratch::new();
    let run = &unique_run("twice");
    // Agents that ignore SIGTERM, with a grace far longer than the test waits: only the
    // second Ctrl-C (SIGKILL to their groups) can end them in time.
    let mut toml = String::from("concurrency = 4\n\n[defaults]\nkill_grace = \"10m\"\n\n");
    for l in LONG {
        toml.push_str(&format!(
            "[[tasks]]\nlabel = {l:?}\ncommand = {}\n\n",
            fake_command(&[
                "--attempt",
                "{attempt}",
                "--ignore-term",
                "--sleep",
                "30",
                "--sleep-attempts",
                "1",
                "--turns",
                "30",
                "--usage",
                "30,60,0.03",
            ])
        ));
    }
    let b = s.write("batch.toml", &toml);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, b.to_str().expect("utf-8")],
    );
    wait_running(&s, run);
    // Press Ctrl-C until sortie is gone: the first asks the agents to stop (they ignore it), a
    // later one kills them and exits. (Two signals sent too close together may arrive as one.)
    let pid = sortie.pid();
    send_signal(pid, Signal::SIGINT);
    let mut pressed = 1;
    poll("sortie to exit on a second Ctrl-C", 60, || {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Some(());
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
        {
            return Some(());
        }
        if pressed < 20 {
            std::thread::sleep(std::time::Duration::from_millis(300));
            send_signal(pid, Signal::SIGINT);
            pressed += 1;
        }
        None
    });
    let out = sortie.finish(10);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "still resumable: exit 3\n{stderr}"
    );
    wait_no_children(run);
    assert_eq!(s.status(run)["status"], "interrupted");

    // Resume finds the attempts that never reported an end, and retries them.
    let out = Background::start(&s, run, &["resume", run]).finish(60);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_no_children(run);
    let status = s.status(run);
    assert_eq!(status["status"], "completed", "{status}");
    let events = s.events(run);
    for l in LONG {
        let i = index(&events, l);
        assert_eq!(
            events.of(i as u64, "AttemptOrphaned").len(),
            1,
            "{l}: attempt 1 was found orphaned on resume"
        );
        assert_eq!(attempt_reasons(&events, i), ["completed"], "{l}");
        assert_eq!(task_view(&status, l)["attempts"], 2);
    }
    s.audit_clean(run);
}

/// #32: an interrupt is the user's, never the task's. With `max_retries = 0`, a task
/// interrupted by SIGINT, then SIGTERM, then SIGHUP (three attempts cut short, one per signal)
/// is never failed and its dependent never skipped: each time the run exits 3 and stays
/// resumable, and the last resume completes both.
#[test]
fn an_interrupt_costs_the_task_nothing_even_without_retries() {
    interrupted_again_and_again(
        "max_retries = 0\n",
        &[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP],
    );
}

/// #32, finding 3: with the default retries (2), the third Ctrl-C used to fail the task (each
/// interrupt spent one) and skip its dependent. Three Ctrl-C, then a SIGTERM and a SIGHUP: five
/// attempts cut short, more than the task's three, and it still completes on the last resume.
#[test]
fn three_ctrl_c_and_more_do_not_fail_a_task_with_the_default_retries() {
    interrupted_again_and_again(
        "",
        &[
            Signal::SIGINT,
            Signal::SIGINT,
            Signal::SIGINT,
            Signal::SIGTERM,
            Signal::SIGHUP,
        ],
    );
}

/// A task `long` (and `after`, which needs it) under `defaults`: `sortie run`, then a resume
/// for each further signal, each stopped by its signal in `signals` while `long` runs: exit 3,
/// the run interrupted, `long` interrupted and not failed, `after` pending, nothing ended. A
/// last resume completes both, `long`'s attempts all interrupted but the last.
fn interrupted_again_and_again(defaults: &str, signals: &[Signal]) {
    let s = Scratch::new();
    let run = &unique_run("free");
    let n_signals = signals.len().to_string();
    let toml = format!(
        "[defaults]\n{defaults}kill_grace = \"1s\"\n\n\
         [[tasks]]\nlabel = \"long\"\ncommand = {}\n\n\
         [[tasks]]\nlabel = \"after\"\nneeds = [\"long\"]\ncommand = {}\n",
        fake_command(&[
            "--attempt",
            "{attempt}",
            "--sleep",
            "30",
            "--sleep-attempts",
            &n_signals,
            "--answer",
            "long finished",
        ]),
        fake_command(&["--answer", "after finished"]),
    );
    let b = s.write("batch.toml", &toml);
    let b = b.to_str().expect("utf-8");
    for (n, &signal) in signals.iter().enumerate() {
        let args: Vec<&str> = if n == 0 {
            vec!["run", "--run-id", run, b]
        } else {
            vec!["resume", run]
        };
        let sortie = Background::start(&s, run, &args);
        poll("the long task's attempt to start", 30, || {
            let events = s.try_events(run)?;
            let started = events.of(0, "AttemptStarted").len();
            (started == n + 1).then_some(())
        });
        send_signal(sortie.pid(), signal);
        let out = sortie.finish(30);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{signal:?} interrupts: exit 3\n{stderr}"
        );
        assert!(stderr.contains(&format!("resume {run}")), "{stderr}");
        wait_no_children(run);
        let status = s.status(run);
        assert_eq!(
            status["status"], "interrupted",
            "after {signal:?}: {status}"
        );
        assert_eq!(
            task_view(&status, "long")["state"],
            "interrupted",
            "{status}"
        );
        assert_eq!(task_view(&status, "after")["state"], "pending", "{status}");
        let events = s.events(run);
        assert_eq!(
            events.count("TaskFinished"),
            0,
            "after {signal:?}: nothing ended"
        );
    }
    let out = Background::start(&s, run, &["resume", run]).finish(60);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the last resume completes the run\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status(run);
    assert_eq!(status["status"], "completed", "{status}");
    let events = s.events(run);
    let mut reasons = vec!["interrupted"; signals.len()];
    reasons.push("completed");
    assert_eq!(attempt_reasons(&events, 0), reasons);
    assert_eq!(
        task_view(&status, "after")["state"],
        "completed",
        "{status}"
    );
    s.audit_clean(run);
}

/// A stop that lands in the middle of the agent's usage report: the attempt journals the usage
/// the agent reported, not less. The fake agent holds between the two halves of its first
/// report (`--hold-report`: logged, not yet printed); SIGTERM goes to sortie there, and the
/// agent is let go once the signal reached it (pending, or it died of it). What its
/// `--usage-log` says it billed is what `AttemptFinished` holds: the torture's oracle, which
/// once found a direct attempt killed in that window (seed 754775071).
#[test]
fn a_stop_in_the_middle_of_a_usage_report_keeps_the_reported_usage() {
    stop_in_a_report(false);
}

/// The same for an attempt under the run's shepherd: read from its stdout file to its end.
#[test]
fn a_stop_in_the_middle_of_a_supervised_usage_report_keeps_the_reported_usage() {
    stop_in_a_report(true);
}

/// See [`a_stop_in_the_middle_of_a_usage_report_keeps_the_reported_usage`].
fn stop_in_a_report(supervise: bool) {
    let s = Scratch::new();
    let run = &unique_run("report");
    let hold = s.path().join("hold");
    let log = s.path().join("usage-log");
    let toml = format!(
        "[defaults]\nkill_grace = \"30s\"\n\n\
         [[tasks]]\nlabel = \"reporting\"\nsupervise = {supervise}\ncommand = {}\n",
        fake_command(&[
            "--usage",
            "11,22,0.001",
            "--usage-log",
            log.to_str().expect("utf-8"),
            "--hold-report",
            hold.to_str().expect("utf-8"),
            "--answer",
            "reported",
        ]),
    );
    let b = s.write("batch.toml", &toml);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, b.to_str().expect("utf-8")],
    );
    let held = hold.with_extension("held");
    let pid: u32 = poll("the agent to hold in its report", 30, || {
        std::fs::read_to_string(&held).ok()?.trim().parse().ok()
    });
    send_signal(sortie.pid(), Signal::SIGTERM);
    // Signal n is bit n - 1 of the pending masks in /proc/<pid>/status.
    let term = 1u64 << (Signal::SIGTERM as u32 - 1);
    poll("the SIGTERM to reach the agent", 30, || {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return Some(()); // it died of it
        };
        let pending = status
            .lines()
            .filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
            .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
            .any(|mask| mask & term != 0);
        let zombie = status.lines().any(|l| l.starts_with("State:\tZ"));
        (pending || zombie).then_some(())
    });
    std::fs::write(hold.with_extension("go"), "").expect("release the agent");
    let out = sortie.finish(30);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "interrupted: exit 3\n{stderr}");
    let reports = std::fs::read_to_string(&log).unwrap_or_default();
    let last: Value =
        serde_json::from_str(reports.lines().last().expect("the agent billed a report"))
            .expect("JSON");
    let events = s.events(run);
    let finished = events.of(0, "AttemptFinished");
    let usage = &finished.last().expect("the attempt finished")["usage"];
    for field in ["input", "output", "turns"] {
        assert_eq!(
            usage[field], last["usage"][field],
            "{field}: journaled {usage}, billed {last}"
        );
    }
}
