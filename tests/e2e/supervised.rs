//! End-to-end tests: supervised attempts outlive sortie. Each attempt runs under its own
//! supervisor, which writes the agent's output to the attempt dir and its exit status to an exit
//! file; `sortie` is SIGKILLed mid-run and `sortie resume` finds each attempt that was live:
//!
//! - still running: adopted (`AttemptAdopted`), followed from its files, finished once;
//! - ended while sortie was down: recorded from its files (`AttemptRecorded`), not run again;
//! - gone without a status (its supervisor killed too, as by a reboot): orphaned and retried,
//!   within `max_orphans`, without spending `max_retries`.
//!
//! Every side effect (the fake agent's counter) happens exactly once, every attempt's usage is
//! counted once, the audit is clean, and no process of the run (agent or supervisor, found in
//! `/proc` by their markers) is left, after a resume, a Ctrl-C or a cancel.

use std::collections::BTreeMap;
use std::path::PathBuf;

use nix::sys::signal::Signal;
use serde_json::Value;
use sortie_testkit::{
    Journal, Usage, all_processes_of, kill9, marked_processes, shepherds_of, supervisors_of,
};

use crate::support::{Background, Scratch, fake_command, finish, poll, send_signal, unique_run};

/// How long a bounded wait may last, in seconds.
const PATIENCE: u64 = 60;

/// One task of a batch: label, seconds of work, turns, and extra TOML lines.
struct T {
    label: &'static str,
    sleep: &'static str,
    turns: u64,
    extra: &'static str,
}

/// The usage every fake agent here reports in total (`--usage 300,30,0.03`, micro-dollars).
const USAGE: (u64, u64, u64) = (300, 30, 30_000);

fn batch(s: &Scratch, defaults: &str, tasks: &[T]) -> PathBuf {
    let mut toml = format!("concurrency = 8\n\n[defaults]\nkill_grace = \"1s\"\n{defaults}\n");
    for t in tasks {
        let counter = s.path().join(format!("count-{}", t.label));
        let turns = t.turns.to_string();
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = {:?}\ncommand = {}\n{}\n",
            t.label,
            fake_command(&[
                "--attempt",
                "{attempt}",
                "--sleep",
                t.sleep,
                "--sleep-attempts",
                "1",
                "--turns",
                &turns,
                "--usage",
                "300,30,0.03",
                "--counter",
                counter.to_str().expect("utf-8"),
                "--answer",
                &format!("{} finished", t.label),
            ]),
            t.extra
        ));
    }
    s.write("batch.toml", &toml)
}

fn journal(s: &Scratch, run: &str) -> Journal {
    Journal::from_events(s.events(run)).expect("export prints events")
}

/// The run's journal, while `export` can read it.
fn try_journal(s: &Scratch, run: &str) -> Option<Journal> {
    Journal::from_events(s.try_events(run)?).ok()
}

fn counter(s: &Scratch, label: &str) -> usize {
    std::fs::read_to_string(s.path().join(format!("count-{label}")))
        .map_or(0, |t| t.lines().count())
}

/// Waits until `n` attempts have their process journaled (`AttemptStarted`).
fn wait_started(s: &Scratch, run: &str, n: usize) {
    poll("the attempts to start", PATIENCE, || {
        (try_journal(s, run)?.count("AttemptStarted") >= n).then_some(())
    });
}

fn index_of(j: &Journal, label: &str) -> u64 {
    let started = j
        .events()
        .iter()
        .find_map(|e| e["event"]["RunStarted"]["batch"]["tasks"].as_array())
        .expect("RunStarted holds the tasks");
    started
        .iter()
        .position(|t| t["label"] == label)
        .expect("the label is a task") as u64
}

/// How many attempts of `run` have their exit recorded (an `exit` file in their dir).
fn exits_recorded(s: &Scratch, run: &str) -> usize {
    let dir = s.state_dir().join("runs").join(run).join("attempts");
    std::fs::read_dir(dir).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.path().join("exit").exists())
            .count()
    })
}

/// Waits until no process of `run` (agent or supervisor) is alive.
fn wait_none_left(run: &str, when: &str) {
    poll(
        &format!("no process of the run left {when}"),
        PATIENCE,
        || all_processes_of(run).is_empty().then_some(()),
    );
}

/// Eight supervised slow tasks; sortie is killed while all eight run; four end while it is
/// down; resume records those four from their files and adopts the other four. Each counter is
/// exactly 1, each task made one attempt whose usage is the agent's whole report, counted
/// once, the audit is clean, and nothing of the run is left. With `max_retries = 0` too.
#[test]
fn a_killed_sortie_costs_no_agent_work() {
    let short = ["s1", "s2", "s3", "s4"];
    let long = ["l1", "l2", "l3", "l4"];
    for retries in [2, 0] {
        let s = Scratch::new();
        let run = &unique_run("supervised");
        let tasks: Vec<T> = short
            .iter()
            .map(|l| T {
                label: l,
                sleep: "1",
                turns: 2,
                extra: "",
            })
            .chain(long.iter().map(|l| T {
                label: l,
                sleep: "12",
                turns: 4,
                extra: "",
            }))
            .collect();
        let b = batch(&s, &format!("max_retries = {retries}"), &tasks);
        let mut sortie = s.spawn(&["run", "--run-id", run, b.to_str().expect("utf-8")]);
        wait_started(&s, run, 8);
        assert!(kill9(&mut sortie), "sortie was still running");
        // The short ones end while sortie is down (the run's shepherd records it).
        poll("the short tasks to end", PATIENCE, || {
            (short.iter().all(|l| counter(&s, l) == 1) && exits_recorded(&s, run) == short.len())
                .then_some(())
        });
        assert_eq!(shepherds_of(run).len(), 1, "one shepherd serves the run");
        assert!(
            long.iter().all(|l| counter(&s, l) == 0),
            "the long ones still run"
        );

        let out = finish(
            s.sortie().args(["resume", run]).spawn().expect("resume"),
            120,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "the run ends completed: {err}");

        for l in short.iter().chain(&long) {
            assert_eq!(counter(&s, l), 1, "{l}'s side effect happened once");
        }
        let j = journal(&s, run);
        assert_eq!(j.count("AttemptOrphaned"), 0, "nothing was orphaned");
        assert_eq!(j.count("RetryScheduled"), 0, "nothing was retried");
        for l in short {
            let t = index_of(&j, l);
            assert_eq!(j.of(t, "AttemptRecorded").len(), 1, "{l} was recorded");
            assert!(j.of(t, "AttemptAdopted").is_empty(), "{l} was not adopted");
        }
        for l in long {
            let t = index_of(&j, l);
            assert_eq!(j.of(t, "AttemptAdopted").len(), 1, "{l} was adopted");
            assert!(
                j.of(t, "AttemptRecorded").is_empty(),
                "{l} was not recorded"
            );
        }
        let usage = j.attempt_usage();
        let whole = Usage::fake(USAGE.0, USAGE.1, USAGE.2, 1, 1);
        for l in short.iter().chain(&long) {
            let t = index_of(&j, l);
            assert_eq!(j.of(t, "AttemptLaunching").len(), 1, "{l} ran once");
            let result = &j.of(t, "TaskFinished")[0]["result"];
            assert_eq!(result["state"], "completed", "{l}: {result}");
            assert!(
                result["text"]
                    .as_str()
                    .is_some_and(|x| x.contains(&format!("{l} finished"))),
                "{l}'s answer is its result: {result}"
            );
            let got = usage.get(&(t, 1)).copied().unwrap_or_default();
            assert_eq!(
                (got.input, got.output, got.nanos),
                (whole.input, whole.output, whole.nanos),
                "{l}'s usage is its agent's whole report, once"
            );
        }
        let total = j.total();
        assert_eq!(
            total.input,
            whole.input * 8,
            "the run counts each attempt once"
        );
        s.audit_clean(run);
        wait_none_left(run, "after the resume");
    }
}

/// A reboot-like crash: sortie, the supervisors and the agents are all killed. Resume finds
/// the attempts gone without a status: orphaned, and retried although `max_retries = 0`, within
/// `max_orphans` (a task with `max_orphans = 0` ends failed, saying so).
#[test]
fn a_reboot_orphans_and_retries_within_max_orphans() {
    let s = Scratch::new();
    let run = &unique_run("reboot");
    let tasks = [
        T {
            label: "a",
            sleep: "30",
            turns: 3,
            extra: "",
        },
        T {
            label: "b",
            sleep: "30",
            turns: 3,
            extra: "",
        },
        T {
            label: "z",
            sleep: "30",
            turns: 3,
            extra: "max_orphans = 0",
        },
    ];
    let b = batch(&s, "max_retries = 0", &tasks);
    let mut sortie = s.spawn(&["run", "--run-id", run, b.to_str().expect("utf-8")]);
    wait_started(&s, run, 3);
    assert!(kill9(&mut sortie), "sortie was still running");
    for m in supervisors_of(run).into_iter().chain(marked_processes(run)) {
        send_signal(m.pid, Signal::SIGKILL);
    }
    wait_none_left(run, "after the reboot");

    let out = finish(
        s.sortie().args(["resume", run]).spawn().expect("resume"),
        120,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "z fails, the run is partial: {err}"
    );
    let j = journal(&s, run);
    for l in ["a", "b"] {
        let t = index_of(&j, l);
        assert_eq!(j.of(t, "AttemptOrphaned").len(), 1, "{l} was orphaned");
        assert_eq!(j.of(t, "RetryScheduled").len(), 1, "{l} was retried");
        assert_eq!(j.of(t, "AttemptLaunching").len(), 2);
        assert_eq!(j.of(t, "TaskFinished")[0]["result"]["state"], "completed");
        assert_eq!(counter(&s, l), 1, "{l} answered once, on its retry");
    }
    let z = index_of(&j, "z");
    assert_eq!(j.of(z, "AttemptOrphaned").len(), 1);
    assert!(j.of(z, "RetryScheduled").is_empty(), "z has no orphan left");
    let result = &j.of(z, "TaskFinished")[0]["result"];
    assert_eq!(result["state"], "failed", "{result}");
    assert!(
        result["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_orphans = 0")),
        "{result}"
    );
    assert_eq!(counter(&s, "z"), 0);
    s.audit_clean(run);
    wait_none_left(run, "after the resume");
}

/// Ctrl-C and `sortie cancel` reach supervised agents through their process group: an agent
/// that ignores SIGTERM is killed after the grace, a grandchild in its group too, and no agent
/// or supervisor of the run is left in `/proc`.
#[test]
fn ctrl_c_and_cancel_leave_no_supervised_process() {
    let s = Scratch::new();
    let run = &unique_run("sv-stop");
    let tasks = [
        T {
            label: "plain",
            sleep: "60",
            turns: 3,
            extra: "",
        },
        T {
            label: "stubborn",
            sleep: "60",
            turns: 3,
            extra: "",
        },
    ];
    let b = batch(&s, "max_retries = 1", &tasks);
    // The stubborn one ignores SIGTERM and leaves a grandchild in its group.
    let toml = std::fs::read_to_string(&b).expect("batch");
    let toml = toml.replacen(
        "\"--answer\", \"stubborn finished\"",
        "\"--answer\", \"stubborn finished\", \"--ignore-term\", \"--grandchild\"",
        1,
    );
    // Every attempt works long (the retries after Ctrl-C too), so that cancel finds them live.
    let toml = toml.replace("\"--sleep-attempts\", \"1\"", "\"--sleep-attempts\", \"9\"");
    std::fs::write(&b, toml).expect("batch");
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, b.to_str().expect("utf-8")],
    );
    wait_started(&s, run, 2);
    poll("the grandchild", PATIENCE, || {
        (marked_processes(run).len() >= 3).then_some(())
    });
    send_signal(sortie.pid(), Signal::SIGINT);
    let out = sortie.finish(PATIENCE);
    assert_eq!(out.status.code(), Some(3), "Ctrl-C interrupts");
    wait_none_left(run, "after Ctrl-C");
    let j = journal(&s, run);
    assert_eq!(j.count("RunInterrupted"), 1);

    let resume = Background::start(&s, run, &["resume", run]);
    poll("the resumed attempts to start", PATIENCE, || {
        let j = try_journal(&s, run)?;
        (j.count("AttemptStarted") >= 4 && shepherds_of(run).len() == 1).then_some(())
    });
    let out = s.run(&["cancel", run]);
    assert!(
        out.status.success() || out.status.code() == Some(1),
        "{out:?}"
    );
    let out = resume.finish(PATIENCE);
    assert!(out.status.code().is_some(), "the resume ended");
    wait_none_left(run, "after cancel");
    let j = journal(&s, run);
    let states: BTreeMap<u64, Value> = (0..2)
        .map(|t| (t, j.of(t, "TaskFinished")[0]["result"]["state"].clone()))
        .collect();
    assert!(
        states.values().all(|v| v == "cancelled"),
        "every task ends cancelled: {states:?}"
    );
    s.audit_clean(run);
}

/// #10, the shepherd: a supervised agent's descendant that left its process group (`setsid`)
/// and outlived it is killed once its attempt ended, while the run's other attempts run on
/// under the same shepherd; the shepherd itself is gone when the run ends.
#[test]
fn an_escaped_descendant_dies_with_its_attempt_not_with_the_run() {
    let s = Scratch::new();
    let run = &unique_run("escape");
    let b = s.write(
        "batch.toml",
        "concurrency = 2\n\n[defaults]\nkill_grace = \"1s\"\n\n\
         [[tasks]]\nlabel = \"daemon\"\n\
         command = [\"sh\", \"-c\", \"setsid sleep 300 & echo left a daemon\"]\n\n\
         [[tasks]]\nlabel = \"slow\"\ncommand = [\"sleep\", \"120\"]\n",
    );
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, b.to_str().expect("utf-8")],
    );
    let of_task = |t: u64| {
        marked_processes(run)
            .into_iter()
            .filter(|m| m.attempt.is_some_and(|(task, _)| task == t))
            .count()
    };
    poll("the daemon's attempt to end", PATIENCE, || {
        try_journal(&s, run)?
            .of(0, "TaskFinished")
            .first()
            .map(|_| ())
    });
    poll("the escaped daemon to be killed", PATIENCE, || {
        (of_task(0) == 0).then_some(())
    });
    assert_eq!(of_task(1), 1, "the other attempt runs on");
    assert_eq!(shepherds_of(run).len(), 1, "under the same shepherd");
    let out = s.run(&["cancel", run]);
    assert!(out.status.code().is_some(), "{out:?}");
    let out = sortie.finish(PATIENCE);
    assert!(out.status.code().is_some(), "the run ended");
    assert!(
        all_processes_of(run).is_empty(),
        "nothing of the run is left once sortie exited: {:?}",
        all_processes_of(run)
    );
    let j = journal(&s, run);
    assert_eq!(j.of(0, "TaskFinished")[0]["result"]["state"], "completed");
}
