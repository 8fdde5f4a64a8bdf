//! End-to-end tests: faults from outside. Each injects one and checks what sortie does:
//!
//! - a full disk while journaling (a file-size limit, RLIMIT_FSIZE, put on the live `sortie`
//!   process, a few hundred bytes past its journal's size, so that a write is cut short): the
//!   run stops with exit 3 and a message naming the journal and the error, no process of the
//!   run survives, the journal audits whole, and once the limit is gone `sortie resume`
//!   finishes the run without running a finished task again;
//! - a state dir on a small tmpfs (root only) filled by the journal, or by the agents' own
//!   output: the run stops with exit 3 naming the full disk in words (`No space left on device
//!   (os error 28)`, never a debug value) and the journal, and an attempt whose writes failed
//!   spends no retry, so `resume` completes every task once space is back;
//! - an artifact path that cannot be written (under a regular file): that task ends partial
//!   with `Artifact write failed: ...`, the run goes on;
//! - the state dir removed while tasks run: sortie notices at its next journal write (or, while
//!   every agent is silent, within a few seconds all the same), stops with a message saying the
//!   journal was removed (no panic, no hang), and kills its attempts;
//! - an agent that forks a grandchild and exits: the grandchild (same process group, same
//!   environment marker) is gone once the task ends, while the run still goes on;
//! - a daemon an agent started in a session of its own (`setsid`, `supervise = false`): it is
//!   stopped when its attempt ends;
//! - an agent that ignores SIGTERM, stopped by its attempt timeout: SIGKILLed after
//!   `kill_grace`, the attempt records a timeout ended by signal 9, no process left.

use crate::support::{
    Background, Scratch, event_kind, fake_command, live_processes_of, poll, unique_run,
};
use sortie_testkit::Events;

/// A batch of `n` tasks that each report usage over several turns and append to their own
/// counter file (`count-tNN`).
fn busy_batch(s: &Scratch, n: usize, turns: u32, sleep: f64) -> std::path::PathBuf {
    let mut toml = String::from(
        "concurrency = 4\n\n[defaults]\nmax_retries = 8\nkill_grace = \"1s\"\n\
         attempt_timeout = \"5m\"\n",
    );
    for i in 0..n {
        let counter = s.path().join(format!("count-t{i:02}"));
        let usage = format!("{},{},0.00{:04}", 100 + i, 10 + i, 7 + i);
        let turns = turns.to_string();
        let sleep = format!("{sleep:.2}");
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"t{i:02}\"\ncommand = {}\n",
            fake_command(&[
                "--usage",
                &usage,
                "--turns",
                &turns,
                "--sleep",
                &sleep,
                "--counter",
                counter.to_str().expect("utf-8"),
            ])
        ));
    }
    s.write("batch.toml", &toml)
}

/// Lines in task `i`'s counter file of [`busy_batch`] (0 when missing).
fn counter(s: &Scratch, i: usize) -> usize {
    std::fs::read_to_string(s.path().join(format!("count-t{i:02}")))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Task numbers with `TaskFinished` in the run's journal (empty while it cannot be read).
fn finished_tasks(s: &Scratch, run: &str) -> Vec<u64> {
    s.try_events(run)
        .unwrap_or_default()
        .iter()
        .map(event_kind)
        .filter(|(k, _)| *k == "TaskFinished")
        .filter_map(|(_, b)| b["task"].as_u64())
        .collect()
}

/// Waits (bounded) until no process carries `prefix` (a run id, or `run/task`) in its
/// `SORTIE_ATTEMPT` marker.
fn wait_gone(prefix: &str, what: &str) {
    poll(what, 30, || {
        live_processes_of(prefix).is_empty().then_some(())
    });
}

/// Puts a file-size limit of `bytes` on a live process (python's `resource.prlimit`: the
/// tests need python3 for the fake agent already).
fn limit_file_size(pid: u32, bytes: u64) {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import resource, sys; n = int(sys.argv[2]); \
             resource.prlimit(int(sys.argv[1]), resource.RLIMIT_FSIZE, (n, n))",
            &pid.to_string(),
            &bytes.to_string(),
        ])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "prlimit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The size of the journal's sled log of `run`.
fn journal_bytes(s: &Scratch, run: &str) -> u64 {
    std::fs::metadata(s.state_dir().join("runs").join(run).join("journal/db"))
        .expect("the journal's log file")
        .len()
}

#[test]
fn a_full_disk_stops_the_run_as_interrupted_and_resume_finishes_it() {
    let s = Scratch::new();
    let run = &unique_run("fault-disk");
    let n = 24;
    let batch = busy_batch(&s, n, 4, 0.4);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, batch.to_str().expect("utf-8")],
    );
    poll("three tasks to finish", 60, || {
        (finished_tasks(&s, run).len() >= 3).then_some(())
    });
    // The disk fills up: the next write past this size fails (cut short mid-record, since the
    // limit is not on a record's boundary).
    limit_file_size(sortie.pid(), journal_bytes(&s, run) + 777);
    let out = sortie.finish(60);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "interrupted, resumable:\n{stderr}"
    );
    assert!(
        stderr.contains("cannot write the journal of run")
            && stderr.contains(run.as_str())
            && stderr.contains("File too large"),
        "the message names the journal and the error:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    wait_gone(run, "the run's attempts to be stopped");

    // The journal is whole: everything acknowledged before the failure, nothing torn.
    s.audit_clean(run);
    let before = finished_tasks(&s, run);
    assert!(
        before.len() < n,
        "the run stopped before its end: {before:?}"
    );
    let frozen: Vec<(u64, usize)> = before
        .iter()
        .map(|&t| (t, counter(&s, t as usize)))
        .collect();

    // Space is back (a new process has no limit): resume finishes the run.
    let out = Background::start(&s, run, &["resume", run]).finish(120);
    assert_eq!(
        out.status.code(),
        Some(0),
        "resume: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_gone(run, "no process of the run after the resume");
    s.audit_clean(run);
    let events = s.events(run);
    for t in 0..n {
        assert_eq!(
            events.of(t as u64, "TaskFinished").len(),
            1,
            "task {t} finishes exactly once"
        );
        assert_eq!(
            events.of(t as u64, "TaskFinished")[0]["result"]["state"],
            "completed"
        );
        assert!(counter(&s, t) >= 1, "task {t} answered");
    }
    for (t, c) in frozen {
        assert_eq!(
            counter(&s, t as usize),
            c,
            "task {t} finished before the disk filled up, yet ran again"
        );
    }
}

#[test]
fn an_unwritable_artifact_path_makes_the_task_partial_and_the_run_goes_on() {
    let s = Scratch::new();
    let run = &unique_run("fault-artifact");
    s.write("blocker", "a regular file, not a directory\n");
    let toml = format!(
        "concurrency = 1\n\n\
         [[tasks]]\nlabel = \"blocked\"\ncommand = {}\noutput = \"blocker/out.md\"\n\n\
         [[tasks]]\nlabel = \"after\"\ncommand = {}\noutput = \"out/after.md\"\n",
        fake_command(&["--answer", "blocked answer"]),
        fake_command(&["--answer", "after answer"]),
    );
    let batch = s.write("batch.toml", &toml);
    let out = s.run(&["run", "--run-id", run, batch.to_str().expect("utf-8")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a partial task: exit 1\n{stderr}"
    );
    let events = s.events(run);
    let blocked = &events.of(0, "TaskFinished")[0]["result"];
    assert_eq!(blocked["state"], "partial", "{blocked}");
    assert!(
        blocked["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("Artifact write failed: ")),
        "{blocked}"
    );
    assert!(
        blocked["text"]
            .as_str()
            .is_some_and(|t| t.contains("blocked answer")),
        "the output stays in the journal: {blocked}"
    );
    assert!(events.of(0, "ArtifactWritten").is_empty());
    let after = &events.of(1, "TaskFinished")[0]["result"];
    assert_eq!(after["state"], "completed", "{after}");
    let text = std::fs::read_to_string(s.path().join("out/after.md")).expect("after's artifact");
    assert!(text.contains("after answer"), "{text:?}");
    s.audit_clean(run);
}

#[test]
fn a_state_dir_removed_mid_run_stops_it_with_a_clear_message() {
    let s = Scratch::new();
    let run = &unique_run("fault-rmstate");
    let batch = busy_batch(&s, 16, 6, 1.2);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, batch.to_str().expect("utf-8")],
    );
    poll("a task to finish", 60, || {
        (!finished_tasks(&s, run).is_empty()).then_some(())
    });
    // sortie may create a file while it goes: remove until nothing is left.
    poll("the state dir to be removed", 30, || {
        let _ = std::fs::remove_dir_all(s.state_dir());
        (!s.state_dir().exists()).then_some(())
    });
    let out = sortie.finish(60);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("was removed while the run was live") && stderr.contains(run.as_str()),
        "the message says what happened:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    wait_gone(run, "the run's attempts to be stopped");
}

#[test]
fn a_state_dir_removed_while_every_agent_is_silent_is_noticed_all_the_same() {
    let s = Scratch::new();
    let run = &unique_run("fault-rmquiet");
    // Agents that never say a word: no event comes to make sortie write its journal.
    let mut toml = String::from("concurrency = 2\n");
    for l in ["quiet1", "quiet2"] {
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"{l}\"\ncommand = {}\n",
            fake_command(&["--hang"])
        ));
    }
    let batch = s.write("batch.toml", &toml);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, batch.to_str().expect("utf-8")],
    );
    poll("both attempts to start", 60, || {
        let events = s.try_events(run)?;
        (events
            .iter()
            .filter(|e| event_kind(e).0 == "AttemptStarted")
            .count()
            == 2)
            .then_some(())
    });
    poll("the state dir to be removed", 30, || {
        let _ = std::fs::remove_dir_all(s.state_dir());
        (!s.state_dir().exists()).then_some(())
    });
    let out = sortie.finish(60);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("was removed while the run was live"),
        "{stderr}"
    );
    wait_gone(run, "the silent agents to be stopped");
}

#[test]
fn a_grandchild_is_stopped_with_its_group_when_the_task_ends() {
    let s = Scratch::new();
    let run = &unique_run("fault-grandchild");
    let toml = format!(
        "concurrency = 2\n\n\
         [[tasks]]\nlabel = \"forks\"\ncommand = {}\n\n\
         [[tasks]]\nlabel = \"slow\"\ncommand = {}\n",
        fake_command(&["--grandchild", "--sleep", "3", "--usage", "5,5,0.001"]),
        fake_command(&["--sleep", "6", "--turns", "12"]),
    );
    let batch = s.write("batch.toml", &toml);
    let sortie = Background::start(
        &s,
        run,
        &["run", "--run-id", run, batch.to_str().expect("utf-8")],
    );
    let forks = format!("{run}/0");
    // The agent and the grandchild it forked, both marked as attempt 1 of `forks`.
    poll("the agent and its grandchild", 30, || {
        (live_processes_of(&forks).len() >= 2).then_some(())
    });
    poll("forks to finish", 60, || {
        finished_tasks(&s, run).contains(&0).then_some(())
    });
    // The run goes on (slow still runs), and nothing of forks is left.
    wait_gone(&forks, "the grandchild to be stopped with its group");
    let out = sortie.finish(60);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(run);
    let slow_end = events
        .iter()
        .position(|e| event_kind(e).0 == "TaskFinished" && event_kind(e).1["task"] == 1)
        .expect("slow finished");
    let forks_end = events
        .iter()
        .position(|e| event_kind(e).0 == "TaskFinished" && event_kind(e).1["task"] == 0)
        .expect("forks finished");
    assert!(forks_end < slow_end, "forks ended while the run went on");
    assert_eq!(
        events.of(0, "TaskFinished")[0]["result"]["state"],
        "completed"
    );
    wait_gone(run, "no process of the run at its end");
    s.audit_clean(run);
}

#[test]
fn a_child_ignoring_sigterm_is_killed_after_the_grace_on_timeout() {
    let s = Scratch::new();
    let run = &unique_run("fault-ignoreterm");
    // The agent ignores SIGTERM from its first instant: `sh` ignores it before the exec (an
    // ignored signal stays ignored across exec), so that a slow interpreter start cannot let
    // the timeout's SIGTERM in before the agent's own `--ignore-term` takes effect.
    let agent = fake_command(&["--ignore-term", "--sleep", "60", "--turns", "60"]);
    let command = format!(
        "[\"sh\", \"-c\", \"trap '' TERM; exec \\\"$0\\\" \\\"$@\\\"\", {}",
        &agent[1..]
    );
    let toml = format!(
        "[defaults]\nmax_retries = 0\n\n\
         [[tasks]]\nlabel = \"stubborn\"\ncommand = {command}\nattempt_timeout = \"1s\"\n\
         kill_grace = \"1s\"\n"
    );
    let batch = s.write("batch.toml", &toml);
    let out = Background::start(
        &s,
        run,
        &["run", "--run-id", run, batch.to_str().expect("utf-8")],
    )
    .finish(60);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a timed-out task: exit 1\n{stderr}"
    );
    wait_gone(run, "the stubborn agent to be gone");
    let events = s.events(run);
    let finished = events.of(0, "AttemptFinished");
    assert_eq!(finished.len(), 1, "one attempt");
    let outcome = &finished[0]["outcome"];
    assert_eq!(outcome["stop_reason"], "timeout", "{outcome}");
    assert_eq!(
        outcome["signal"], 9,
        "SIGTERM was ignored: SIGKILL after the grace ended it: {outcome}"
    );
    let result = &events.of(0, "TaskFinished")[0]["result"];
    assert_eq!(result["state"], "timeout", "{result}");
    s.audit_clean(run);
}

/// Runs `run`: `tasks` tasks at concurrency 4 (after `defaults`, a TOML table or nothing), each
/// printing `bytes` bytes, to its end.
fn run_writers(
    s: &Scratch,
    run: &str,
    defaults: &str,
    tasks: usize,
    bytes: usize,
) -> std::process::Output {
    let mut toml = format!("concurrency = 4\n\n{defaults}");
    for i in 0..tasks {
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"t{i}\"\ncommand = [\"sh\", \"-c\", \
             \"head -c {bytes} /dev/zero | tr '\\\\0' x; echo\"]\n"
        ));
    }
    let batch = s.write("batch.toml", &toml);
    Background::start(
        s,
        run,
        &["run", "--run-id", run, batch.to_str().expect("utf-8")],
    )
    .finish(120)
}

/// A small tmpfs mounted over a path while it lives (root only), unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`2m`) over `dir`; None when this process may not mount.
    fn mount(dir: &std::path::Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).expect("mkdir");
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }

    /// Gives it `size` (`64m`): space is back.
    fn grow(&self, size: &str) {
        let ok = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "remount {}", self.0.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// #32: a state dir on a 2 MB disk, 20 tasks printing 150 KB each at concurrency 4: the disk
/// fills up mid-run. sortie stops with exit 3 and a message naming the full disk (it used to
/// hang for good in sled's drop, deaf to SIGINT and SIGTERM); once space is back, `resume`
/// completes every task: none is failed for the disk's fault, none that completed runs again.
#[test]
fn a_disk_that_fills_up_stops_the_run_resumably_and_costs_no_task() {
    let s = Scratch::new();
    let Some(disk) = Tmpfs::mount(&s.state_dir(), "2m") else {
        eprintln!("skipped: mounting a tmpfs needs root (CI runs as root)");
        return;
    };
    let run = &unique_run("fault-full");
    let mut toml = String::from("concurrency = 4\n");
    for i in 0..20 {
        let counter = s.path().join(format!("count-{i}"));
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"t{i:02}\"\ncommand = [\"sh\", \"-c\", \
             \"echo run >> {}; head -c 150000 /dev/zero | tr '\\\\0' x; echo\"]\n",
            counter.display()
        ));
    }
    let batch = s.write("batch.toml", &toml);
    let out = Background::start(
        &s,
        run,
        &["run", "--run-id", run, batch.to_str().expect("utf-8")],
    )
    .finish(120);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "interrupted, resumable:\n{stderr}"
    );
    assert!(
        stderr.contains("No space left on device") && stderr.contains(&format!("resume {run}")),
        "the message names the full disk and the way on:\n{stderr}"
    );
    wait_gone(run, "the run's attempts to be stopped");
    let ran_before: Vec<(usize, String)> = finished_tasks(&s, run)
        .into_iter()
        .map(|t| {
            let c =
                std::fs::read_to_string(s.path().join(format!("count-{t}"))).unwrap_or_default();
            (t as usize, c)
        })
        .collect();

    disk.grow("64m");
    let out = Background::start(&s, run, &["resume", run]).finish(120);
    assert_eq!(
        out.status.code(),
        Some(0),
        "resume completes every task:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(run);
    for t in 0..20u64 {
        let finished = events.of(t, "TaskFinished");
        assert_eq!(finished.len(), 1, "task {t} finishes once");
        assert_eq!(finished[0]["result"]["state"], "completed", "task {t}");
    }
    for (t, before) in ran_before {
        let now = std::fs::read_to_string(s.path().join(format!("count-{t}"))).unwrap_or_default();
        assert_eq!(
            now, before,
            "task {t} finished before the disk filled, yet ran again"
        );
    }
    s.audit_clean(run);
}

/// #32: the tasks whose own output filled the disk (4 x 800 KB at once on a 2 MB state dir,
/// with no retries at all): their writes fail, they exit 1, through no fault of theirs. Such an
/// attempt ends `interrupted`, naming the full disk, and spends no retry: once space is back,
/// `resume` runs it again and every task completes (each used to stay `failed`).
#[test]
fn a_task_whose_output_filled_the_disk_spends_no_retry() {
    let s = Scratch::new();
    let Some(disk) = Tmpfs::mount(&s.state_dir(), "2m") else {
        eprintln!("skipped: mounting a tmpfs needs root (CI runs as root)");
        return;
    };
    let run = &unique_run("fault-nospace");
    let out = run_writers(&s, run, "[defaults]\nmax_retries = 0\n", 4, 800_000);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "interrupted, resumable:\n{stderr}"
    );
    wait_gone(run, "the run's attempts to end");

    disk.grow("64m");
    let out = Background::start(&s, run, &["resume", run]).finish(120);
    assert_eq!(
        out.status.code(),
        Some(0),
        "resume completes every task:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(run);
    let mut spared = 0;
    for t in 0..4u64 {
        let finished = events.of(t, "TaskFinished");
        assert_eq!(finished.len(), 1, "task {t} finishes once");
        assert_eq!(finished[0]["result"]["state"], "completed", "task {t}");
        for a in events.of(t, "AttemptFinished") {
            let outcome = &a["outcome"];
            if outcome["status"] == "failed" {
                assert_eq!(outcome["stop_reason"], "interrupted", "{outcome}");
                let error = outcome["error"].as_str().unwrap_or_default();
                assert!(
                    error.contains("was full") && error.contains("not the task's"),
                    "the error names the full disk: {error}"
                );
                spared += 1;
            }
        }
    }
    // Which write meets the full disk first is a race: an agent's (then its attempt is spared
    // as above) or the journal's own (then the run stopped before any agent's write failed, and
    // said so). Either way no task spent a retry and each completed once.
    assert!(
        spared >= 1 || stderr.contains("No space left on device"),
        "4 x 800 KB on 2 MB: an attempt's writes failed, or the journal's did:\n{stderr}"
    );
    s.audit_clean(run);
}

/// #37: a disk full from the first writes (a 64 KB state dir) stops the run naming the error in
/// words, `No space left on device (os error 28)`, and the journal it was writing; sled hands
/// its error on as a clone whose text was Rust's debug value (`Os { code: 28, kind:
/// StorageFull, .. }`), which is what users read.
#[test]
fn a_full_disk_is_named_in_words_with_the_path_being_written() {
    let s = Scratch::new();
    let Some(_disk) = Tmpfs::mount(&s.state_dir(), "64k") else {
        eprintln!("skipped: mounting a tmpfs needs root (CI runs as root)");
        return;
    };
    let run = &unique_run("fault-words");
    let out = run_writers(&s, run, "", 8, 150_000);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "interrupted:\n{stderr}");
    let journal = s.state_dir().join("runs").join(run).join("journal");
    assert!(
        stderr.contains(&format!(
            "{}: No space left on device (os error 28)",
            journal.display()
        )),
        "the error in words, with the path being written:\n{stderr}"
    );
    assert!(
        !stderr.contains("Os {") && !stderr.contains("StorageFull"),
        "no debug value:\n{stderr}"
    );
    wait_gone(run, "the run's attempts to be stopped");
}

/// #32: with `supervise = false`, a daemon that an attempt starts in a session of its own
/// (`setsid`, so out of the attempt's process group, which is all that is killed when the agent
/// exits) used to outlive the run. It still carries the attempt's marker: it is stopped when
/// its attempt ends, before the task is reported finished.
#[test]
fn a_daemon_that_left_its_attempts_group_is_stopped_when_the_attempt_ends() {
    let s = Scratch::new();
    let run = &unique_run("fault-setsid");
    let pid_file = s.path().join("daemon.pid");
    // The agent starts the daemon, waits until it runs (its pid written), and exits 0.
    let script = s.write(
        "agent.sh",
        &format!(
            "setsid sh -c 'echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; exec sleep 300' \
             </dev/null >/dev/null 2>&1 &\n\
             while [ ! -s {pid} ]; do sleep 0.05; done\necho started\n",
            pid = pid_file.display()
        ),
    );
    let toml = format!(
        "[[tasks]]\nlabel = \"daemon\"\nsupervise = false\ncommand = [\"sh\", \"{}\"]\n",
        script.display()
    );
    let batch = s.write("batch.toml", &toml);
    let out = Background::start(
        &s,
        run,
        &["run", "--run-id", run, batch.to_str().expect("utf-8")],
    )
    .finish(60);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("the daemon ran")
        .trim()
        .parse()
        .expect("its pid");
    // It had left the attempt's group: a session (and group) of its own.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    if let Some(fields) = stat.rsplit_once(") ").map(|(_, rest)| rest) {
        let fields: Vec<&str> = fields.split(' ').collect();
        assert!(
            fields.first() == Some(&"Z") || fields.get(2) == Some(&pid.to_string().as_str()),
            "the daemon {pid} leads its own group: {stat}"
        );
    }
    wait_gone(run, "the daemon to be stopped with its attempt");
    s.audit_clean(run);
}

/// #37: a state dir that cannot be used is the user's setup to fix: exit 2 (not 1, a failed
/// run's), naming the path and the cause, for a file in its place and (root only) a read-only
/// filesystem; nothing runs.
#[test]
fn an_unusable_state_dir_exits_2_naming_it_and_its_cause() {
    let s = Scratch::new();
    let batch = s.write(
        "b.toml",
        "[[tasks]]\nlabel = \"t\"\ncommand = [\"touch\", \"ran\"]\n",
    );
    let b = batch.to_str().expect("utf-8");
    let file = s.write("a-file", "not a directory\n");
    let sortie = |state: &std::path::Path, args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sortie"))
            .current_dir(s.path())
            .env_remove("SORTIE_DIR")
            .arg("--state-dir")
            .arg(state)
            .args(args)
            .output()
            .expect("run sortie")
    };
    for args in [&["run", b][..], &["status"], &["list"], &["resume"]] {
        let out = sortie(&file, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&file.display().to_string()) && err.contains("not a directory"),
            "{args:?}: {err}"
        );
    }
    let ro = s.path().join("ro");
    let Some(_disk) = Tmpfs::mount(&ro, "1m") else {
        eprintln!("skipped the read-only filesystem: mounting needs root (CI runs as root)");
        return;
    };
    let remounted = std::process::Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&ro)
        .status()
        .is_ok_and(|st| st.success());
    assert!(remounted, "remount read-only");
    let out = sortie(&ro, &["run", b]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&ro.display().to_string()) && err.contains("Read-only file system"),
        "{err}"
    );
    assert!(!s.path().join("ran").exists(), "nothing ran");
}

/// #37: a batch on Slurm whose controller does not answer (here the configuration names none):
/// `check` refuses it naming the task and why, and `run` refuses it at once, before anything
/// is submitted, instead of failing each attempt after its `sbatch` gave up.
#[test]
fn a_batch_on_slurm_without_a_controller_is_refused_by_check_and_run() {
    let s = Scratch::new();
    let batch = s.write(
        "b.toml",
        "[[tasks]]\nlabel = \"on-slurm\"\ncommand = [\"touch\", \"ran\"]\nexecutor = \"slurm\"\n\n\
         [[tasks]]\nlabel = \"here\"\ncommand = [\"true\"]\n",
    );
    let b = batch.to_str().expect("utf-8");
    let sortie = |args: &[&str]| {
        s.sortie()
            .env("SLURM_CONF", s.path().join("no-such-slurm.conf"))
            .args(args)
            .output()
            .expect("run sortie")
    };
    let out = sortie(&["check", b]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("field `executor`: task `on-slurm`")
            && said.contains("Slurm")
            && !said.contains("task `here`"),
        "{said}"
    );
    let out = sortie(&["run", b]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the batch cannot start")
            && err.contains("Slurm")
            && err.contains("nothing was run"),
        "{err}"
    );
    let runs = std::fs::read_dir(s.state_dir().join("runs")).map_or(0, |d| d.count());
    assert_eq!(runs, 0, "no run was made");
    assert!(!s.path().join("ran").exists());
}
