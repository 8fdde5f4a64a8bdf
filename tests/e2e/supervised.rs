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

use sortie_testkit::Events;
use std::collections::BTreeMap;
use std::path::PathBuf;

use nix::sys::signal::Signal;
use serde_json::Value;
use sortie_testkit::{
    Journal, Usage, all_processes_of, kill9, marked_processes, shepherds_of, supervisors_of,
    zombie_children_of,
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

/// How many attempts of `run` have their exit recorded (an `exit` file in their dir, or an
/// exit line in the shepherd's status log beside it; the shepherd's attempts have no dir, only
/// their files beside its name).
fn exits_recorded(s: &Scratch, run: &str) -> usize {
    let dir = s.state_dir().join("runs").join(run).join("attempts");
    std::fs::read_dir(&dir).map_or(0, |d| {
        d.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                let attempt = match name.strip_suffix(".stdout") {
                    Some(attempt) => dir.join(attempt),
                    None if e.path().is_dir() => e.path(),
                    None => return None,
                };
                sortie_testkit::exit_recorded(&attempt).then_some(())
            })
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

/// After a resume: task 0 ran once and completed, the audit is clean, and no process of the
/// run is left.
fn ran_once_and_left_nothing(s: &Scratch, run: &str, j: &Journal) {
    assert_eq!(j.of(0, "AttemptLaunching").len(), 1, "it ran once");
    assert_eq!(j.of(0, "TaskFinished")[0]["result"]["state"], "completed");
    s.audit_clean(run);
    wait_none_left(run, "after the resume");
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
        // One already gone (ESRCH) is what a reboot wants: none is left, checked below.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(m.pid).expect("a pid")),
            Signal::SIGKILL,
        );
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

/// `sortie cancel RUN --task` reaches one supervised task through its process group: its agent
/// (which ignores SIGTERM and leaves a grandchild in its group) and its supervisor are gone
/// from `/proc`, the other task goes on and completes, and once the run ended normally no
/// process of it is left, not even for a moment (sortie waits for its supervisors).
#[test]
fn cancel_of_one_supervised_task_leaves_nothing_of_it() {
    let s = Scratch::new();
    let run = &unique_run("sv-cancel-task");
    let tasks = [
        T {
            label: "stubborn",
            sleep: "60",
            turns: 3,
            extra: "",
        },
        T {
            label: "other",
            sleep: "6",
            turns: 2,
            extra: "",
        },
    ];
    let b = batch(&s, "max_retries = 1", &tasks);
    let toml = std::fs::read_to_string(&b).expect("batch");
    let toml = toml.replacen(
        "\"--answer\", \"stubborn finished\"",
        "\"--answer\", \"stubborn finished\", \"--ignore-term\", \"--grandchild\"",
        1,
    );
    std::fs::write(&b, toml).expect("batch");
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, b.to_str().expect("utf-8")],
    );
    wait_started(&s, run, 2);
    let of_stubborn = |m: &sortie_testkit::Marked| m.attempt.is_some_and(|(t, _)| t == 0);
    poll("the grandchild", PATIENCE, || {
        (marked_processes(run)
            .iter()
            .filter(|m| of_stubborn(m))
            .count()
            >= 2)
            .then_some(())
    });
    assert_eq!(
        journal(&s, run).count("AttemptPlaced"),
        2,
        "both run supervised (placed with an executor that outlives sortie)"
    );
    s.run_ok(&["cancel", run, "--task", "stubborn"]);
    poll("nothing of the cancelled task left", PATIENCE, || {
        let left = marked_processes(run)
            .into_iter()
            .chain(supervisors_of(run))
            .filter(|m| of_stubborn(m))
            .count();
        (left == 0).then_some(())
    });
    let out = sortie.finish(PATIENCE);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a cancelled task: not completed"
    );
    assert_eq!(
        all_processes_of(run),
        Vec::<u32>::new(),
        "no process of the run outlives it"
    );
    let j = journal(&s, run);
    let state = |l: &str| j.of(index_of(&j, l), "TaskFinished")[0]["result"]["state"].clone();
    assert_eq!(state("stubborn"), "cancelled");
    assert_eq!(state("other"), "completed");
    assert_eq!(j.of(index_of(&j, "stubborn"), "AttemptLaunching").len(), 1);
    assert_eq!(counter(&s, "other"), 1);
    assert_eq!(counter(&s, "stubborn"), 0);
    s.audit_clean(run);
}

/// An adopted attempt reads on from the offset journaled with its usage checkpoints
/// (`AttemptRead`): a pi agent (whose reader adds up each message's usage) is SIGKILLed out of
/// its sortie after a few checkpoints; resume adopts it; the lines before the offset only
/// rebuild the reader, so nothing journaled before the crash is reported again (every
/// checkpoint and every offset is new), and the attempt's usage is its agent's whole stream,
/// counted once: not twice (the lines read again), not short (the lines before the offset).
#[test]
fn an_adopted_attempt_reads_on_from_the_journaled_offset() {
    let s = Scratch::new();
    let run = &unique_run("read-on");
    let stream = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/agents/fake-stream.py")
        .display()
        .to_string();
    let b = s.write(
        "batch.toml",
        &format!(
            "[defaults]\nmax_retries = 0\n\n[agents.slowpi]\ncommand = [\"python3\", {stream:?}, \
             \"--attempt\", \"{{attempt}}\", \"--sample\", \"ok\", \"--turns\", \"6\", \
             \"--turn-delay\", \"1.5\", \"{{model_args}}\", \"{{prompt}}\"]\n\
             model_args = [\"--model\", \"{{model}}\"]\nprotocol = \"pi-json\"\nmay_write = false\n\n\
             [[tasks]]\nlabel = \"pi\"\nagent = \"slowpi\"\nprompt = \"say hello\"\n"
        ),
    );
    let mut sortie = s.spawn(&["run", "--run-id", run, b.to_str().expect("utf-8")]);
    poll("two checkpoints with their offsets", PATIENCE, || {
        (try_journal(&s, run)?.of(0, "AttemptRead").len() >= 2).then_some(())
    });
    assert!(kill9(&mut sortie), "sortie was still running");
    let out = finish(
        s.sortie().args(["resume", run]).spawn().expect("resume"),
        120,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let j = journal(&s, run);
    assert_eq!(j.of(0, "AttemptAdopted").len(), 1, "it was adopted");
    let resumed = j
        .events()
        .iter()
        .position(|e| e["event"].get("RunResumed").is_some())
        .expect("resumed");
    let of_task = |kind: &str, after: bool| -> Vec<Value> {
        j.events()
            .iter()
            .enumerate()
            .filter(|(i, _)| (*i > resumed) == after)
            .filter_map(|(_, e)| e["event"].get(kind).cloned())
            .filter(|b| b["task"] == 0)
            .collect()
    };
    let input = |b: &Value| b["usage"]["input"].as_u64().expect("input");
    let offset = |b: &Value| b["offset"].as_u64().expect("offset");
    let (before, after) = (
        of_task("AttemptProgress", false),
        of_task("AttemptProgress", true),
    );
    let (reads_before, reads_after) = (of_task("AttemptRead", false), of_task("AttemptRead", true));
    assert!(
        !before.is_empty() && !after.is_empty(),
        "{before:?} {after:?}"
    );
    let inputs: Vec<u64> = before.iter().chain(&after).map(input).collect();
    assert!(
        inputs.windows(2).all(|w| w[0] < w[1]),
        "no checkpoint is reported twice: {inputs:?}"
    );
    let offsets: Vec<u64> = reads_before
        .iter()
        .chain(&reads_after)
        .map(offset)
        .collect();
    assert!(
        !reads_after.is_empty() && offsets.windows(2).all(|w| w[0] < w[1]),
        "the reader went on from the journaled offset: {offsets:?}"
    );
    let transcript = s
        .state_dir()
        .join("runs")
        .join(run)
        .join("attempts/0.1.stdout");
    let len = std::fs::metadata(&transcript).expect("transcript").len();
    assert!(
        offsets.last().is_some_and(|o| *o <= len),
        "{offsets:?} {len}"
    );
    // The `ok` sample's call (100 in, 12 out, 50 cache read) and six more turns like it.
    let finished = &j.of(0, "AttemptFinished")[0]["usage"];
    assert_eq!(
        (
            finished["input"].as_u64(),
            finished["output"].as_u64(),
            finished["cache_read"].as_u64(),
            finished["turns"].as_u64()
        ),
        (Some(700), Some(84), Some(350), Some(7)),
        "the whole stream's usage, once: {finished}"
    );
    ran_once_and_left_nothing(&s, run, &j);
}

/// A pi agent driven over stdin (RPC mode) runs supervised too: its supervisor forwards a FIFO
/// in the attempt dir to the agent's stdin and holds it open, so a crash of sortie does not
/// close it. Resume adopts it without sending its prompt again, and a steer after the resume
/// reaches it (it wraps up and completes, once).
#[test]
fn a_steerable_agent_outlives_sortie_and_is_steered_after_resume() {
    let s = Scratch::new();
    let run = &unique_run("sv-rpc");
    let log = s.path().join("stdin.log");
    let stream = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/agents/fake-stream.py")
        .display()
        .to_string();
    let b = s.write(
        "batch.toml",
        &format!(
            "[defaults]\nmax_retries = 0\n\n[agents.rpc]\ncommand = [\"python3\", {stream:?}, \
             \"--rpc\", \"--sample\", \"ok\", \"--turns\", \"60\", \"--turn-delay\", \"0.5\", \
             \"--log\", {:?}, \"{{model_args}}\"]\nmodel_args = []\nprotocol = \"pi-rpc\"\n\
             may_write = false\ncan_steer = true\n\n\
             [[tasks]]\nlabel = \"t\"\nagent = \"rpc\"\nprompt = \"say hello\"\n",
            log.display().to_string()
        ),
    );
    let mut sortie = s.spawn(&["run", "--run-id", run, b.to_str().expect("utf-8")]);
    wait_started(&s, run, 1);
    assert_eq!(supervisors_of(run).len(), 1, "it runs supervised");
    let commands = || -> Vec<Value> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v.get("stdin").cloned())
            .collect()
    };
    poll("the prompt to arrive", PATIENCE, || {
        commands()
            .iter()
            .any(|c| c["type"] == "prompt")
            .then_some(())
    });
    assert!(kill9(&mut sortie), "sortie was still running");
    assert!(
        !marked_processes(run).is_empty(),
        "the agent outlives sortie: its stdin is still open"
    );
    let resume = Background::start(&s, run, &["resume", run]);
    poll("the adoption", PATIENCE, || {
        (try_journal(&s, run)?.count("AttemptAdopted") == 1).then_some(())
    });
    let out = s.run(&["steer", run, "--task", "t", "wrap up now"]);
    assert!(out.status.success(), "{out:?}");
    let out = resume.finish(PATIENCE);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let cmds = commands();
    let kinds: Vec<&str> = cmds.iter().filter_map(|c| c["type"].as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "prompt").count(),
        1,
        "the prompt is sent once: {kinds:?}"
    );
    assert!(kinds.contains(&"steer"), "the steer reached it: {kinds:?}");
    let j = journal(&s, run);
    ran_once_and_left_nothing(&s, run, &j);
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
    let shepherds = shepherds_of(run);
    assert_eq!(shepherds.len(), 1, "one shepherd: {shepherds:?}");
    // The shepherd, its subreaper, reaps it too: nothing `<defunct>` piles up under it.
    poll("the killed daemon to be reaped", PATIENCE, || {
        zombie_children_of(shepherds[0].pid)
            .is_empty()
            .then_some(())
    });
    assert_eq!(of_task(1), 1, "the other attempt runs on");
    assert_eq!(shepherds_of(run), shepherds, "under the same shepherd");
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

/// #32, finding 1: the run's shepherd killed (SIGKILL, then SIGTERM; each with `max_retries`
/// 0 and 2) while sortie lives and three agents run under it, each writing `start` to its
/// counter, waiting for a file, then writing `end`. sortie, a child subreaper, is handed the
/// agents and waits for them itself: they run on to their own ends once the file is there,
/// each attempt finishes once with its agent's exit (no orphan, no retry, no agent beside its
/// retry: each counter holds one `start` and one `end`), the run completes, the audit is
/// clean, and no process of the run is left. Before, each agent was stopped and its task run
/// again (`start` twice); earlier still, failed as "lost track" and run again beside it.
#[test]
fn a_killed_shepherd_runs_no_task_twice_and_leaves_no_agent() {
    let runs = [
        (Signal::SIGKILL, 0),
        (Signal::SIGKILL, 2),
        (Signal::SIGTERM, 0),
        (Signal::SIGTERM, 2),
    ];
    for (signal, retries) in runs {
        let s = Scratch::new();
        let run = &unique_run("shepherd");
        let go = s.path().join("go");
        let labels = ["a", "b", "c"];
        let mut toml = format!(
            "concurrency = 8\n\n[defaults]\nkill_grace = \"1s\"\nmax_retries = {retries}\n"
        );
        for l in labels {
            let counter = s.path().join(format!("count-{l}"));
            let script = format!(
                "echo start >> {c}; while [ ! -e {go} ]; do sleep 0.05; done; echo end >> {c}",
                c = counter.display(),
                go = go.display()
            );
            toml.push_str(&format!(
                "\n[[tasks]]\nlabel = {l:?}\ncommand = [\"sh\", \"-c\", {script:?}]\n"
            ));
        }
        let b = s.write("batch.toml", &toml);
        let read = |l: &str| std::fs::read_to_string(s.path().join(format!("count-{l}")));
        let sortie = s.spawn(&["run", "--run-id", run, b.to_str().expect("utf-8")]);
        poll("the three agents to start", PATIENCE, || {
            labels.iter().all(|l| read(l).is_ok()).then_some(())
        });
        let shepherds = shepherds_of(run);
        assert_eq!(shepherds.len(), 1, "one shepherd runs the three attempts");
        send_signal(shepherds[0].pid, signal);
        poll("the shepherd to die", PATIENCE, || {
            shepherds_of(run).is_empty().then_some(())
        });
        // The agents outlive their shepherd, waiting for the file.
        let alive = marked_processes(run);
        for l in labels {
            assert_eq!(
                read(l).expect("counter"),
                "start\n",
                "{signal:?}: {l} waits"
            );
        }
        assert!(alive.len() >= 3, "{signal:?}: the agents run on: {alive:?}");
        std::fs::write(&go, "").expect("write the file the agents wait for");
        let out = finish(sortie, 120);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{signal:?} of the shepherd, max_retries = {retries}: the run completes\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j = journal(&s, run);
        for l in labels {
            let t = index_of(&j, l);
            assert_eq!(
                read(l).expect("counter"),
                "start\nend\n",
                "{signal:?}, max_retries = {retries}: {l} ran once, to its end"
            );
            assert_eq!(j.of(t, "AttemptOrphaned").len(), 0, "{signal:?}: {l}");
            assert_eq!(j.of(t, "AttemptLaunching").len(), 1, "{signal:?}: {l}");
            let finished = j.of(t, "AttemptFinished");
            assert_eq!(finished.len(), 1, "{signal:?}: {l}");
            assert_eq!(finished[0]["outcome"]["exit_code"], 0, "{signal:?}: {l}");
            assert_eq!(j.of(t, "TaskFinished")[0]["result"]["state"], "completed");
            // Its exit is on disk too, as its shepherd would have recorded it: a `recover`
            // after damage to the journal reads the attempt's end from its files.
            let placed = j.of(t, "AttemptPlaced");
            let dir = PathBuf::from(placed[0]["dir"].as_str().expect("a dir"));
            assert!(
                sortie_testkit::exit_recorded(&dir),
                "{signal:?}: {l}: no exit recorded for {}",
                dir.display()
            );
        }
        s.audit_clean(run);
        wait_none_left(run, "after the run");
    }
}
