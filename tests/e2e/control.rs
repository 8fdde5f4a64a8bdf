//! End-to-end tests of live control through the run's control socket: `hold` / `release` (the
//! held process is stopped, a task that needs it waits, the stall watchdog does not fire while
//! held, a crash while held resumes held), `cancel --task` while the others finish, `steer` of
//! a pi-rpc agent (the fake stream agent), and every action journaled with who asked.

use std::path::Path;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{
    Background, Scratch, event_kind, fake_command, labels, live_processes_of, poll, send_signal,
    task_view, unique_run,
};
use sortie_testkit::Events;

/// The pid of task `i`'s attempt `attempt`, once it reported usage (so that it is well under
/// way: its stall clock restarted by its output).
fn working_pid(s: &Scratch, run: &str, i: usize, attempt: u64) -> u32 {
    let pid = attempt_pid(s, run, i, attempt);
    poll("the attempt to report usage", 30, || {
        let events = s.try_events(run)?;
        (!events.of(i as u64, "AttemptProgress").is_empty()).then_some(pid)
    })
}

/// The pid of task `i`'s live attempt, once started.
fn attempt_pid(s: &Scratch, run: &str, i: usize, attempt: u64) -> u32 {
    poll("the attempt to start", 30, || {
        let events = s.try_events(run)?;
        events
            .of(i as u64, "AttemptStarted")
            .iter()
            .find(|e| e["attempt"] == attempt)
            .and_then(|e| e["pid"].as_u64())
            .map(|p| p as u32)
    })
}

/// The one-letter state of a process in `/proc/PID/stat` (`T`: stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// Waits until `pid` is in state `want`.
fn wait_state(pid: u32, want: char) {
    poll(&format!("pid {pid} in state {want}"), 10, || {
        (proc_state(pid) == Some(want)).then_some(())
    });
}

fn control(s: &Scratch, args: &[&str]) -> std::process::Output {
    let out = s.run(args);
    assert!(
        out.status.success(),
        "sortie {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The `Control` events of a run: (task, action name, by).
fn controls(events: &[Value]) -> Vec<(Option<u64>, String, String)> {
    events
        .iter()
        .map(event_kind)
        .filter(|(k, _)| *k == "Control")
        .map(|(_, b)| {
            let (name, body) = b["action"]
                .as_object()
                .and_then(|o| o.iter().next())
                .expect("an action");
            (
                body["task"].as_u64(),
                name.clone(),
                b["by"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// `long` works for a while (silence between lines longer than nothing, shorter than the
/// stall); `after` needs it. With `ticker`, a third task reports its usage every quarter of a
/// second for 8 s: it keeps the journal's clock moving while `long` is held.
fn hold_batch(s: &Scratch, ticker: bool) -> std::path::PathBuf {
    let concurrency = if ticker { 3 } else { 2 };
    let ticker = if ticker {
        format!(
            "\n[[tasks]]\nlabel = \"ticker\"\ncommand = {}\n",
            fake_command(&["--sleep", "8", "--turns", "32", "--usage", "320,32,0.032"])
        )
    } else {
        String::new()
    };
    s.write(
        "batch.toml",
        &format!(
            "concurrency = {concurrency}\n\n[defaults]\nstall_after = \"2s\"\nstall_kill_after = \"1s\"\n\
             kill_grace = \"1s\"\n\n\
             [[tasks]]\nlabel = \"long\"\ncommand = {}\n\n\
             [[tasks]]\nlabel = \"after\"\nneeds = [\"long\"]\ncommand = {}\n{ticker}",
            fake_command(&[
                "--attempt",
                "{attempt}",
                "--sleep",
                "4",
                "--turns",
                "16",
                "--usage",
                "160,16,0.016",
                "--answer",
                "long done"
            ]),
            fake_command(&["--answer", "after done"]),
        ),
    )
}

#[test]
fn hold_stops_the_task_its_dependent_waits_no_stall_fires_and_release_finishes_it() {
    let s = Scratch::new();
    let run = unique_run("hold");
    let batch = hold_batch(&s, true);
    let sortie = Background::start(
        &s,
        &run,
        &["run", &batch.display().to_string(), "--run-id", &run],
    );
    let pid = working_pid(&s, &run, 0, 1);

    let out = control(&s, &["hold", &run, "--task", "long"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("task long held"));
    wait_state(pid, 'T');
    let status = s.status(&run);
    assert_eq!(task_view(&status, "long")["held"], true, "{status}");
    // Held for longer than stall_after + stall_kill_after, as the journal's clock (the ticker's
    // reports) measures it from the hold: no stall, nothing else launched.
    let held_at = s
        .events(&run)
        .first_at("Control")
        .expect("the hold is journaled");
    let events = s.events_past(
        &run,
        held_at + 3_500,
        "the journal's clock to pass the stall",
    );
    assert_eq!(proc_state(pid), Some('T'), "still stopped");
    assert!(
        events.of(0, "AttemptStalled").is_empty(),
        "no stall while held"
    );
    assert!(events.of(1, "AttemptLaunching").is_empty(), "after waits");

    // A release of a task not held is refused (and not journaled).
    let refused = s.run(&["release", &run, "--task", "after"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not held"));
    // With --json, the refusal is an error as every --json error is: `error` and `code`.
    let refused = s.run(&["--json", "release", &run, "--task", "after"]);
    assert_eq!(refused.status.code(), Some(1));
    let answer: serde_json::Value =
        serde_json::from_slice(&refused.stdout).expect("a JSON answer on stdout");
    assert_eq!(answer["ok"], false, "{answer}");
    assert_eq!(answer["code"], 1, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("not held")),
        "{answer}"
    );

    control(&s, &["release", &run, "--task", "long"]);
    let out = sortie.finish(60);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(&run);
    assert_eq!(
        events.count("AttemptStalled"),
        0,
        "the ticker never stalls either"
    );
    assert_eq!(events.of(0, "AttemptLaunching").len(), 1, "not retried");
    let c = controls(&events);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!((c[0].0, c[0].1.as_str()), (Some(0), "hold"));
    assert_eq!((c[1].0, c[1].1.as_str()), (Some(0), "release"));
    assert!(c[0].2.starts_with("uid "), "who: {}", c[0].2);
    // Replay shows them.
    let replay = String::from_utf8_lossy(&s.run_ok(&["replay", &run]).stdout).to_string();
    assert!(
        replay.contains("Control") && replay.contains("hold by uid"),
        "{replay}"
    );
}

#[test]
fn a_run_that_crashes_while_held_resumes_held() {
    let s = Scratch::new();
    let run = unique_run("heldcrash");
    let batch = hold_batch(&s, false);
    let sortie = Background::start(
        &s,
        &run,
        &["run", &batch.display().to_string(), "--run-id", &run],
    );
    let pid = working_pid(&s, &run, 0, 1);
    control(&s, &["hold", &run]);
    wait_state(pid, 'T');
    send_signal(sortie.pid(), Signal::SIGKILL);
    let _ = sortie.finish(10);

    let resumed = Background::start(&s, &run, &["resume", &run]);
    // A supervised attempt outlives sortie: resume adopts it, still stopped; a direct one dies
    // with sortie: resume records it orphaned and schedules its retry, which does not launch.
    let adopted = poll("the resume to take over", 30, || {
        let events = s.try_events(&run)?;
        if events.count("RunResumed") != 1 {
            return None;
        }
        if !events.of(0, "AttemptAdopted").is_empty() {
            return Some(true);
        }
        (events.of(0, "AttemptOrphaned").len() == 1 && events.of(0, "RetryScheduled").len() == 1)
            .then_some(false)
    });
    // Longer than stall_after + stall_kill_after.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let events = s.events(&run);
    assert_eq!(
        events.of(0, "AttemptLaunching").len(),
        1,
        "held after the resume: nothing more launches"
    );
    assert_eq!(events.count("AttemptStalled"), 0, "no stall while held");
    if adopted {
        assert_eq!(
            proc_state(pid),
            Some('T'),
            "the adopted attempt is still stopped"
        );
    } else {
        poll("the orphan to be gone", 10, || {
            live_processes_of(&run).is_empty().then_some(())
        });
    }
    let status = s.status(&run);
    assert_eq!(task_view(&status, "long")["held"], true, "{status}");

    control(&s, &["release", &run]);
    let out = resumed.finish(60);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(&run);
    let launches = if adopted { 1 } else { 2 };
    assert_eq!(events.of(0, "AttemptLaunching").len(), launches);
    assert_eq!(events.count("RunFinished"), 1);
}

#[test]
fn cancel_of_one_task_ends_it_cancelled_while_the_others_finish() {
    let s = Scratch::new();
    let run = unique_run("canceltask");
    let long = fake_command(&["--sleep", "4", "--turns", "8", "--answer", "finished"]);
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 3\n\n[defaults]\nkill_grace = \"1s\"\n\n\
             [[tasks]]\nlabel = \"a\"\ncommand = {long}\n\n\
             [[tasks]]\nlabel = \"b\"\ncommand = {long}\n\n\
             [[tasks]]\nlabel = \"c\"\ncommand = {long}\n\n\
             [[tasks]]\nlabel = \"d\"\nneeds = [\"b\"]\ncommand = {long}\n"
        ),
    );
    let sortie = Background::start(
        &s,
        &run,
        &["run", &batch.display().to_string(), "--run-id", &run],
    );
    let _ = attempt_pid(&s, &run, 1, 1);
    control(&s, &["cancel", &run, "--task", "b"]);
    let out = sortie.finish(60);
    assert_eq!(out.status.code(), Some(1), "partial");
    let status = s.status(&run);
    for (label, state) in [
        ("a", "completed"),
        ("b", "cancelled"),
        ("c", "completed"),
        ("d", "skipped"),
    ] {
        assert_eq!(
            task_view(&status, label)["state"],
            state,
            "{label}: {status}"
        );
    }
    let events = s.events(&run);
    assert_eq!(
        events.of(1, "AttemptLaunching").len(),
        1,
        "b is not retried"
    );
    let c = controls(&events);
    assert_eq!((c[0].0, c[0].1.as_str()), (Some(1), "cancel"), "{c:?}");
    assert_eq!(labels(&events).len(), 4);
}

fn fake_stream() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents/fake-stream.py")
}

#[test]
fn steer_passes_a_message_to_a_pi_rpc_agent_and_is_journaled() {
    let s = Scratch::new();
    let run = unique_run("steer");
    let log = s.path().join("stdin.log");
    let argv = [
        "python3".to_owned(),
        fake_stream().display().to_string(),
        "--rpc".into(),
        "--sample".into(),
        "ok".into(),
        "--turns".into(),
        "30".into(),
        "--turn-delay".into(),
        "0.3".into(),
        "--log".into(),
        log.display().to_string(),
        "{model_args}".into(),
    ];
    let quoted: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    let batch = s.write(
        "batch.toml",
        &format!(
            "[agents.rpc]\ncommand = [{}]\nmodel_args = []\nprotocol = \"pi-rpc\"\n\
             may_write = false\ncan_steer = true\n\n\
             [[tasks]]\nlabel = \"t\"\nagent = \"rpc\"\nprompt = \"say hello\"\n\n\
             [[tasks]]\nlabel = \"plain\"\ncommand = {}\n",
            quoted.join(", "),
            fake_command(&["--sleep", "3", "--turns", "6"]),
        ),
    );
    let sortie = Background::start(
        &s,
        &run,
        &["run", &batch.display().to_string(), "--run-id", &run],
    );
    let _ = attempt_pid(&s, &run, 0, 1);
    let _ = attempt_pid(&s, &run, 1, 1);
    control(&s, &["steer", &run, "--task", "t", "please wrap up now"]);
    // A plain command cannot be steered: refused, nothing journaled.
    let refused = s.run(&["steer", &run, "--task", "plain", "hello?"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot be steered"));
    let out = sortie.finish(60);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&log).expect("the agent's log");
    let commands: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v.get("stdin").cloned())
        .collect();
    assert!(
        commands
            .iter()
            .any(|c| c["type"] == "steer" && c["message"] == "please wrap up now"),
        "{commands:?}"
    );
    let c = controls(&s.events(&run));
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].0, c[0].1.as_str()), (Some(0), "steer"));
}
