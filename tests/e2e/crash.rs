//! End-to-end tests: crash. `sortie` is SIGKILLed at chosen moments of a run (tasks still
//! queued, attempts mid-flight, between an attempt's end and its task's end, between a spawn
//! and its `AttemptStarted` record, during a resume, and at varied moments over several rounds),
//! then `sortie resume` finishes the run. What must hold afterwards:
//!
//! - a task the journal showed finished at a kill is never run again (its side-effect counter,
//!   one line per answer of the fake agent, does not move);
//! - every task ends completed, and a completed task answered at least once;
//! - `sortie audit` exits 0, even right after a kill, and its ledger total equals the sum over
//!   the journal's attempts of each attempt's last usage, computed here from `sortie export`;
//! - every attempt live at a kill is recorded `AttemptOrphaned` (`Killed` when its process was
//!   still running: resume kills it, found through its environment marker even when its pid
//!   never reached the journal), then `RetryScheduled`, then a later attempt;
//! - an orphaned attempt keeps the usage of its last journaled checkpoint, counted once;
//! - no process of the run is alive at the end.
//!
//! These tests pin the direct executor's crash path (`supervise = false`: attempts are children
//! of sortie and die with it); supervised attempts, which outlive sortie and are adopted or
//! recorded by resume, are tested in `supervised.rs`.
//!
//! Exact moments come from `SORTIE_TEST_PAUSE_AFTER=<event>` (see `engine::TEST_PAUSE_AFTER`):
//! the run loop waits forever once it has committed that event, and the test kills it there.

use sortie_testkit::Events;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use serde_json::Value;
use sortie_runner::engine::TEST_PAUSE_AFTER as PAUSE_AFTER;
use sortie_testkit::{Journal, Usage, poll_every, unique_run};

use crate::support::{Scratch, fake_command, live_processes_of};

/// How long any bounded wait of these tests may last before the test fails, in seconds.
const PATIENCE_SECS: u64 = 60;

/// Polls `f` until it returns `Some`, for at most [`PATIENCE_SECS`]; panics naming `what`.
fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    // Not too often: a reader holds the journal's lock for a moment when no writer does.
    poll_every(what, PATIENCE_SECS, Duration::from_millis(100), f)
}

/// A batch under test: its scratch dir, run id and task labels (task number = index).
struct Batch {
    s: Scratch,
    run: String,
    labels: Vec<String>,
    file: PathBuf,
}

impl Batch {
    /// Writes a batch of `tasks` (label, fake agent args, extra TOML lines); every task also
    /// gets `--counter <its own file>`.
    fn new(tag: &str, concurrency: u32, tasks: &[(String, Vec<String>, String)]) -> Batch {
        let s = Scratch::new();
        // Unsupervised, so that every kill orphans the live attempts (the path these tests
        // check); a budget of orphans as large as the retries', since one test kills five times.
        let mut toml = format!(
            "concurrency = {concurrency}\n\n[defaults]\nmax_retries = 8\nkill_grace = \"1s\"\n\
             attempt_timeout = \"5m\"\nsupervise = false\nmax_orphans = 8\n"
        );
        let mut labels = Vec::new();
        for (label, args, extra) in tasks {
            let counter = s.path().join(format!("count-{label}"));
            let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
            let counter = counter.display().to_string();
            args.extend(["--counter", counter.as_str()]);
            toml.push_str(&format!(
                "\n[[tasks]]\nlabel = \"{label}\"\ncommand = {}\n{extra}\n",
                fake_command(&args)
            ));
            labels.push(label.clone());
        }
        let file = s.write("batch.toml", &toml);
        Batch {
            s,
            run: unique_run(&format!("crash-{tag}")),
            labels,
            file,
        }
    }

    /// Starts `sortie run` in the background, paused after `pause` if given.
    fn start_run(&self, pause: Option<&str>) -> Sortie {
        let file = self.file.display().to_string();
        self.start(&["run", "--run-id", &self.run, &file], pause, "run")
    }

    /// Starts `sortie resume` in the background, paused after `pause` if given.
    fn start_resume(&self, pause: Option<&str>, log: &str) -> Sortie {
        self.start(&["resume", &self.run], pause, log)
    }

    fn start(&self, args: &[&str], pause: Option<&str>, log: &str) -> Sortie {
        let out = File::create(self.s.path().join(format!("{log}.out"))).expect("log file");
        let err = File::create(self.s.path().join(format!("{log}.err"))).expect("log file");
        let mut c = self.s.sortie();
        c.args(args).stdout(out).stderr(err);
        match pause {
            Some(p) => c.env(PAUSE_AFTER, p),
            None => c.env_remove(PAUSE_AFTER),
        };
        Sortie(c.spawn().expect("spawn sortie"))
    }

    /// `sortie resume RUN` to its end (bounded); returns its exit code, with its stderr.
    fn resume_to_end(&self, log: &str) -> (Option<i32>, String) {
        let mut child = self.start_resume(None, log);
        let status = wait_exit(&mut child);
        let err =
            std::fs::read_to_string(self.s.path().join(format!("{log}.err"))).unwrap_or_default();
        (status.code(), err)
    }

    /// The run's journal now, through `sortie export`.
    fn journal(&self) -> Journal {
        Journal::from_events(self.s.events(&self.run)).expect("export prints events")
    }

    /// The same, or `None` while `export` cannot read it (the run does not exist yet).
    fn try_journal(&self) -> Option<Journal> {
        let out = self.s.run(&["export", &self.run]);
        if !out.status.success() {
            return None;
        }
        Some(Journal::parse(&out.stdout).expect("export prints events"))
    }

    /// Whether the journal has an event of `kind` (false while it cannot be read).
    fn journal_has(&self, kind: &str) -> bool {
        self.try_journal()
            .is_some_and(|j| j.kinds().any(|(k, _)| k == kind))
    }

    /// Lines in each task's side-effect counter (0 when the file does not exist).
    fn counters(&self) -> Vec<usize> {
        self.labels
            .iter()
            .map(|l| {
                std::fs::read_to_string(self.s.path().join(format!("count-{l}")))
                    .map(|t| t.lines().count())
                    .unwrap_or(0)
            })
            .collect()
    }

    /// `sortie --json audit RUN`: asserts exit 0, a clean journal, and a ledger total equal to
    /// the one computed from the exported events; returns the audit.
    fn audit_matches(&self, j: &Journal, when: &str) -> Value {
        let out = self.s.run(&["--json", "audit", &self.run]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "audit {when}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let audit: Value = serde_json::from_slice(&out.stdout).expect("audit --json");
        assert_eq!(audit["clean"], true, "audit {when}: {audit}");
        assert_eq!(
            Usage::of(&audit["ledger"]["total"]),
            Some(j.total()),
            "audit {when}: the ledger total is not the sum of each attempt's last usage"
        );
        audit
    }

    /// A task's usage in the audit's ledger.
    fn ledger_of(&self, audit: &Value, label: &str) -> Usage {
        let row = audit["ledger"]["tasks"]
            .as_array()
            .expect("ledger tasks")
            .iter()
            .find(|r| r[0] == label)
            .unwrap_or_else(|| panic!("no task {label} in the ledger"));
        Usage::of(&row[1]).unwrap_or_else(|| panic!("[{label}] a usage in the ledger: {row}"))
    }

    /// What must hold once the run ended after crashes. `frozen` holds, per task number, the
    /// counter of a task the journal showed finished at some kill.
    fn assert_whole(&self, frozen: &BTreeMap<u64, usize>) -> Journal {
        let j = self.journal();
        let counters = self.counters();
        assert!(
            j.kinds()
                .any(|(k, b)| k == "RunFinished" && b["state"] == "completed"),
            "the run did not finish completed"
        );
        for (t, label) in self.labels.iter().enumerate() {
            let t = t as u64;
            let finished = j.of(t, "TaskFinished");
            assert_eq!(finished.len(), 1, "[{label}] finishes exactly once");
            assert_eq!(
                finished[0]["result"]["state"], "completed",
                "[{label}] ends completed: {}",
                finished[0]
            );
            assert!(
                counters[t as usize] >= 1,
                "[{label}] completed but its agent never answered"
            );
            if let Some(&before) = frozen.get(&t) {
                assert_eq!(
                    counters[t as usize], before,
                    "[{label}] had finished before a kill, yet ran again after it"
                );
            }
            // Attempts are 1, 2, ...; every orphan is retried as transient by a later attempt.
            let launched: Vec<u64> = j
                .of(t, "AttemptLaunching")
                .iter()
                .map(|b| b["attempt"].as_u64().expect("attempt"))
                .collect();
            let expected: Vec<u64> = (1..=launched.len() as u64).collect();
            assert_eq!(launched, expected, "[{label}] attempt numbers");
            for o in j.of(t, "AttemptOrphaned") {
                let a = o["attempt"].as_u64().expect("attempt");
                assert!(
                    j.after(
                        t,
                        "AttemptOrphaned",
                        a,
                        "RetryScheduled",
                        |b| b["next_attempt"].as_u64() == Some(a + 1)
                    ),
                    "[{label}] orphaned attempt {a} is not followed by a retry"
                );
                assert!(
                    launched.contains(&(a + 1)),
                    "[{label}] orphaned attempt {a} has no later attempt"
                );
            }
        }
        let live = live_processes_of(&self.run);
        assert!(
            live.is_empty(),
            "processes of the run still alive: {live:?}"
        );
        self.audit_matches(&j, "after the last resume");
        j
    }
}

impl Drop for Batch {
    /// A failing test shows what sortie said, and leaves no process of its run behind.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for pid in live_processes_of(&self.run) {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let Ok(dir) = std::fs::read_dir(self.s.path()) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".err") || name.ends_with(".out") {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                eprintln!("--- {name} ---\n{text}");
            }
        }
    }
}

/// A `sortie` process started in the background; SIGKILLed if still running when dropped (a
/// failing test leaves nothing behind).
struct Sortie(Child);

impl Drop for Sortie {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits for sortie to exit, at most [`PATIENCE_SECS`] (killed and failed past that).
fn wait_exit(child: &mut Sortie) -> ExitStatus {
    sortie_testkit::wait_exit(&mut child.0, Duration::from_secs(PATIENCE_SECS))
        .expect("sortie ends in time")
}

/// SIGKILLs a sortie process and reaps it. Returns false when it had already exited by itself.
fn kill9(child: &mut Sortie) -> bool {
    sortie_testkit::kill9(&mut child.0)
}

/// `--usage` text for the fake agent (cost in micro-dollars).
fn usage_arg(input: u64, output: u64, micros: u64) -> String {
    format!("{input},{output},{:.6}", micros as f64 / 1e6)
}

/// What the kill left behind, before any resume: the journal, the counters, and (checked
/// here) a journal that audits clean with a ledger that adds up.
fn after_kill(b: &Batch, frozen: &mut BTreeMap<u64, usize>, when: &str) -> Journal {
    let j = b.journal();
    b.audit_matches(&j, when);
    let counters = b.counters();
    for t in j.finished() {
        let now = counters[t as usize];
        let before = *frozen.entry(t).or_insert(now);
        assert_eq!(
            now, before,
            "[{}] finished before an earlier kill, yet its counter moved ({when})",
            b.labels[t as usize]
        );
    }
    j
}

fn task(label: &str, args: &[&str]) -> (String, Vec<String>, String) {
    (
        label.to_owned(),
        args.iter().map(|a| (*a).to_owned()).collect(),
        String::new(),
    )
}

/// (a) Killed while most tasks are still queued: ten tasks at concurrency 2, killed once the
/// first attempt has started. Queued tasks run once; the two live ones are orphaned and
/// retried; nothing is counted twice.
#[test]
fn kill_with_tasks_still_queued() {
    let usages: Vec<String> = (0..10u64)
        .map(|i| usage_arg(100 + i, 10 + i, 1000 + i))
        .collect();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            task(
                &format!("q{i}"),
                &["--usage", &usages[i], "--turns", "2", "--sleep", "0.3"],
            )
        })
        .collect();
    let b = Batch::new("queued", 2, &tasks);
    let mut run = b.start_run(Some("AttemptStarted"));
    wait_for("the first AttemptStarted", || {
        b.journal_has("AttemptStarted").then_some(())
    });
    assert!(kill9(&mut run), "the paused run exited by itself");

    let mut frozen = BTreeMap::new();
    let at_kill = after_kill(&b, &mut frozen, "right after the kill");
    let launched: BTreeSet<u64> = (0..10)
        .filter(|&t| at_kill.has(t, "AttemptLaunching"))
        .collect();
    assert!(
        !launched.is_empty() && launched.len() <= 2,
        "concurrency 2: launched at the kill: {launched:?}"
    );
    assert!(at_kill.finished().is_empty());

    let (code, err) = b.resume_to_end("resume");
    assert_eq!(code, Some(0), "resume: {err}");
    let j = b.assert_whole(&frozen);
    let counters = b.counters();
    for t in 0..10u64 {
        let label = &b.labels[t as usize];
        if launched.contains(&t) {
            assert_eq!(
                j.of(t, "AttemptOrphaned").len(),
                1,
                "[{label}] orphaned once"
            );
        } else {
            // Queued at the kill: launched once, by the resume, and answered once.
            assert_eq!(
                j.of(t, "AttemptLaunching").len(),
                1,
                "[{label}] one attempt"
            );
            assert_eq!(counters[t as usize], 1, "[{label}] answered once");
            assert!(
                j.of(t, "AttemptOrphaned").is_empty(),
                "[{label}] never orphaned"
            );
        }
    }
}

/// (b) Killed with attempts mid-flight. Their processes, in their own process groups, outlive
/// sortie; resume kills the ones still running (`AttemptOrphaned` with `Killed`), retries every
/// orphan, and keeps each orphan's usage from its last checkpoint, counted once. A task that
/// finished before the kill is not run again.
#[test]
fn kill_mid_flight_orphans_are_killed_and_usage_kept() {
    let (quick_u, hold_u, burst_u, turning_u) = (
        usage_arg(11, 1, 100),
        usage_arg(500, 50, 50_000),
        usage_arg(300, 30, 30_000),
        usage_arg(700, 70, 70_000),
    );
    let tasks = vec![
        task("quick", &["--usage", &quick_u, "--sleep", "0.1"]),
        // Attempt 1: one turn of five (a checkpoint), then silent forever.
        task(
            "hold",
            &[
                "--attempt",
                "{attempt}",
                "--stall-attempts",
                "1",
                "--usage",
                &hold_u,
                "--turns",
                "5",
                "--sleep",
                "2",
            ],
        ),
        // Attempt 1: three turns in a quick burst (faster than progress is rate-limited), then
        // silent forever: the journal's checkpoint must still catch up with the third turn.
        task(
            "burst",
            &[
                "--attempt",
                "{attempt}",
                "--stall-attempts",
                "1",
                "--stall-at-turn",
                "3",
                "--usage",
                &burst_u,
                "--turns",
                "3",
                "--sleep",
                "0.09",
            ],
        ),
        // A line every half second: at the kill it is mid-flight, and it dies by itself at its
        // next line (broken pipe), so resume finds it killed or gone.
        task(
            "turning",
            &["--usage", &turning_u, "--turns", "8", "--sleep", "4"],
        ),
    ];
    let b = Batch::new("midflight", 4, &tasks);
    let (quick, hold, burst, turning) = (0u64, 1u64, 2u64, 3u64);
    let mut run = b.start_run(None);
    let progress_turns = |j: &Journal, t: u64| {
        j.of(t, "AttemptProgress")
            .last()
            .map(|p| p["usage"]["turns"].as_u64().expect("turns"))
    };
    wait_for(
        "quick to finish and the others to checkpoint their usage",
        || {
            let j = b.try_journal()?;
            (j.finished().contains(&quick)
                && progress_turns(&j, hold) == Some(1)
                && progress_turns(&j, burst) == Some(3)
                && progress_turns(&j, turning).is_some())
            .then_some(())
        },
    );
    assert!(kill9(&mut run), "the run ended by itself");

    let mut frozen = BTreeMap::new();
    let at_kill = after_kill(&b, &mut frozen, "right after the kill");
    let live_at_kill = at_kill.live_attempts();
    for t in [hold, burst, turning] {
        assert!(live_at_kill.contains(&(t, 1)), "task {t} live at the kill");
    }
    assert!(
        live_processes_of(&b.run).len() >= 2,
        "the stalled attempts' processes outlive sortie"
    );
    let turning_checkpoint = at_kill.attempt_usage()[&(turning, 1)];

    let (code, err) = b.resume_to_end("resume");
    assert_eq!(code, Some(0), "resume: {err}");
    let j = b.assert_whole(&frozen);

    assert_eq!(b.counters()[quick as usize], 1, "quick answered once");
    assert_eq!(j.of(quick, "AttemptLaunching").len(), 1, "quick ran once");
    for t in [hold, burst, turning] {
        let label = &b.labels[t as usize];
        let orphaned = j.of(t, "AttemptOrphaned");
        assert_eq!(orphaned.len(), 1, "[{label}] orphaned once: {orphaned:?}");
        assert_eq!(orphaned[0]["attempt"], 1);
        if t != turning {
            assert_eq!(
                orphaned[0]["action"], "killed",
                "[{label}] its process was still running at the resume"
            );
        }
        assert!(
            j.after(
                t,
                "AttemptOrphaned",
                1,
                "RetryScheduled",
                |r| r["next_attempt"] == 2
            ),
            "[{label}] retried after the orphan"
        );
        assert_eq!(
            j.of(t, "AttemptLaunching").len(),
            2,
            "[{label}] two attempts"
        );
    }
    // Each orphan counts with its last checkpoint, once; each retry with its full usage.
    let audit = b.audit_matches(&j, "after the resume");
    let expect = [
        (quick, Usage::fake(11, 1, 100, 1, 1)),
        (
            hold,
            Usage::fake(500, 50, 50_000, 1, 5).plus(Usage::fake(500, 50, 50_000, 5, 5)),
        ),
        (
            burst,
            Usage::fake(300, 30, 30_000, 3, 3).plus(Usage::fake(300, 30, 30_000, 3, 3)),
        ),
        (
            turning,
            turning_checkpoint.plus(Usage::fake(700, 70, 70_000, 8, 8)),
        ),
    ];
    for (t, want) in expect {
        let label = &b.labels[t as usize];
        assert_eq!(
            b.ledger_of(&audit, label),
            want,
            "[{label}] usage in the ledger"
        );
    }
}

/// (c) Killed between an attempt's end and its task's end, made exact by pausing the run loop
/// right after `AttemptFinished` (and, for a task with an artifact, right after
/// `ArtifactWritten`). Resume finishes the task from the journal without running it again.
#[test]
fn kill_between_attempt_end_and_task_end() {
    for pause in ["AttemptFinished", "ArtifactWritten"] {
        let done_u = usage_arg(40, 4, 4_000);
        let slow_u = usage_arg(200, 20, 20_000);
        let mut done = task(
            "done",
            &[
                "--answer",
                "the answer of done",
                "--usage",
                &done_u,
                "--sleep",
                "0.1",
            ],
        );
        done.2 = "output = \"out/done.txt\"".to_owned();
        let tasks = vec![
            done,
            task(
                "slow",
                &[
                    "--attempt",
                    "{attempt}",
                    "--stall-attempts",
                    "1",
                    "--usage",
                    &slow_u,
                    "--turns",
                    "2",
                    "--sleep",
                    "0.2",
                ],
            ),
        ];
        let b = Batch::new("between", 2, &tasks);
        let mut run = b.start_run(Some(pause));
        wait_for(pause, || b.journal_has(pause).then_some(()));
        assert!(kill9(&mut run), "the paused run exited by itself");

        let mut frozen = BTreeMap::new();
        let at_kill = after_kill(&b, &mut frozen, &format!("killed after {pause}"));
        assert!(
            at_kill.has(0, "AttemptFinished") && !at_kill.has(0, "TaskFinished"),
            "killed after {pause}: done's attempt ended, the task did not"
        );
        assert_eq!(at_kill.ended_not_finished(), BTreeSet::from([0]));
        let artifact = b.s.path().join("out/done.txt");
        assert_eq!(
            at_kill.has(0, "ArtifactWritten"),
            pause == "ArtifactWritten"
        );
        assert_eq!(b.counters()[0], 1, "done answered before the kill");

        let (code, err) = b.resume_to_end("resume");
        assert_eq!(code, Some(0), "resume after a kill after {pause}: {err}");
        let j = b.assert_whole(&BTreeMap::from([(0, 1)]));
        assert_eq!(
            j.of(0, "AttemptLaunching").len(),
            1,
            "done is not run again"
        );
        assert_eq!(j.of(0, "ArtifactWritten").len(), 1, "one artifact record");
        let text = std::fs::read_to_string(&artifact).expect("the artifact exists");
        assert!(text.contains("the answer of done"), "artifact: {text:?}");
        let result = &j.of(0, "TaskFinished")[0]["result"];
        assert!(
            result["text"]
                .as_str()
                .is_some_and(|t| t.contains("the answer of done")),
            "done's result keeps its journaled output: {result}"
        );
    }
}

/// Killed between a spawn and its `AttemptStarted` record (the run loop paused right after the
/// launch): the child's pid is in no journal, yet resume finds it by its environment marker and
/// kills it. That resume is itself killed right after recording the orphan; the next one does
/// not record it again, retries it, and finishes.
#[test]
fn kill_between_spawn_and_started_record() {
    let u = usage_arg(50, 5, 5_000);
    // Attempt 1 is silent forever from its start (a write after sortie's death would kill it
    // with a broken pipe, and resume would rightly find it gone); attempt 2 answers.
    let tasks = vec![task(
        "hidden",
        &[
            "--attempt",
            "{attempt}",
            "--stall-attempts",
            "1",
            "--stall-at-turn",
            "0",
            "--usage",
            &u,
            "--sleep",
            "0.05",
        ],
    )];
    let b = Batch::new("spawn", 1, &tasks);
    let mut run = b.start_run(Some("AttemptLaunching"));
    wait_for("the attempt's process", || {
        (!live_processes_of(&b.run).is_empty()).then_some(())
    });
    assert!(kill9(&mut run), "the paused run exited by itself");

    let mut frozen = BTreeMap::new();
    let at_kill = after_kill(&b, &mut frozen, "killed after the spawn");
    assert!(at_kill.has(0, "AttemptLaunching"));
    assert!(
        !at_kill.has(0, "AttemptStarted"),
        "the pid must not be in the journal for this test"
    );
    assert!(
        !live_processes_of(&b.run).is_empty(),
        "the child outlives sortie"
    );

    // A resume killed right after it recorded the orphan.
    let mut resume = b.start_resume(Some("AttemptOrphaned"), "resume1");
    wait_for("the orphan record", || {
        b.journal_has("AttemptOrphaned").then_some(())
    });
    let live = live_processes_of(&b.run);
    assert!(
        live.is_empty(),
        "the orphan is recorded only once killed: {live:?}"
    );
    assert!(kill9(&mut resume), "the paused resume exited by itself");
    let j1 = after_kill(&b, &mut frozen, "killed after AttemptOrphaned");
    assert!(!j1.has(0, "RetryScheduled"));

    let (code, err) = b.resume_to_end("resume2");
    assert_eq!(code, Some(0), "resume: {err}");
    let j = b.assert_whole(&frozen);
    let orphaned = j.of(0, "AttemptOrphaned");
    assert_eq!(orphaned.len(), 1, "one orphan record: {orphaned:?}");
    assert_eq!(orphaned[0]["attempt"], 1);
    assert_eq!(
        orphaned[0]["action"], "killed",
        "found by its marker and killed"
    );
    assert_eq!(
        j.kinds().filter(|(k, _)| *k == "RunResumed").count(),
        2,
        "two resumes"
    );
    assert_eq!(j.of(0, "AttemptLaunching").len(), 2);
}

/// The fewest kills [`repeated_kills_at_varied_moments`] must make of its five.
const MIN_KILLS: usize = 3;

/// Five kills at varied moments of one run of many short tasks at high concurrency (the run,
/// then each resume killed in turn), then a last resume to the end. After every kill the
/// journal audits clean and adds up, tasks finished so far keep their counters, and attempts
/// already journaled keep their usage exactly; at the end every invariant holds.
///
/// A round that ends the run before its kill makes no kill (a fast machine): the test counts
/// the kills it made, prints them, and fails below [`MIN_KILLS`], so that its coverage cannot
/// quietly shrink to nothing.
#[test]
fn repeated_kills_at_varied_moments() {
    let n = 30u64;
    let args: Vec<Vec<String>> = (0..n)
        .map(|i| {
            // Long enough that the five rounds find the run still going on a quiet machine.
            let sleep = 0.3 + (i * 37 % 10) as f64 * 0.1;
            vec![
                "--usage".to_owned(),
                usage_arg(1000 + 7 * i, 100 + i, 2000 + 13 * i),
                "--turns".to_owned(),
                (1 + i % 3).to_string(),
                "--sleep".to_owned(),
                format!("{sleep:.2}"),
            ]
        })
        .collect();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let a: Vec<&str> = args[i as usize].iter().map(String::as_str).collect();
            task(&format!("t{i:02}"), &a)
        })
        .collect();
    let b = Batch::new("varied", 8, &tasks);
    // Varied, not random: per round, how many more tasks must finish first, then a further
    // wait. A goal of 0 kills the resume early (while it starts or reaps the orphans); the
    // waits spread the other kills over the run, whatever the machine's load.
    let rounds: [(usize, u64); 5] = [(3, 150), (0, 60), (4, 0), (2, 320), (0, 700)];
    let mut frozen = BTreeMap::new();
    let mut seen_usage: BTreeMap<(u64, u64), Usage> = BTreeMap::new();
    let mut live_at_kills: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut between = 0;
    let mut kills = 0usize;
    let mut done = 0;
    let mut finished_early = false;
    for (round, (more, delay)) in rounds.into_iter().enumerate() {
        let mut child = if round == 0 {
            b.start_run(None)
        } else {
            b.start_resume(None, &format!("resume{round}"))
        };
        let goal = (done + more).min(n as usize - 2);
        if more > 0 {
            wait_for("tasks to finish before the kill", || {
                let finished = b.try_journal().map_or(0, |j| j.finished().len());
                let exited = !matches!(child.0.try_wait(), Ok(None));
                (finished >= goal || exited).then_some(())
            });
        }
        // The further wait ends early once one task is left, or sortie exited: the kill then
        // still finds the run going on a fast machine.
        let until = Instant::now() + Duration::from_millis(delay);
        while Instant::now() < until && matches!(child.0.try_wait(), Ok(None)) {
            let finished = b.try_journal().map_or(0, |j| j.finished().len());
            if finished + 1 >= n as usize {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !kill9(&mut child) {
            // It finished before the kill (a fast machine, or a short round): nothing more to
            // crash, and it must have finished the run.
            let status = child.0.wait().expect("reap sortie");
            assert_eq!(
                status.code(),
                Some(0),
                "round {round} ended on its own, completing the run"
            );
            finished_early = true;
            break;
        }
        kills += 1;
        let j = after_kill(&b, &mut frozen, &format!("after kill {}", round + 1));
        between += j.ended_not_finished().len();
        live_at_kills.extend(j.live_attempts());
        done = j.finished().len();
        eprintln!(
            "repeated kills: kill {}: {} tasks finished, {} attempts live, {} events",
            round + 1,
            j.finished().len(),
            j.live_attempts().len(),
            j.events().len()
        );
        // What the journal holds of an attempt never changes afterwards: a dead attempt
        // reports nothing more, and resume neither drops nor adds usage.
        for (key, u) in j.attempt_usage() {
            if let Some(before) = seen_usage.insert(key, u) {
                assert_eq!(u, before, "attempt {key:?} usage changed across a crash");
            }
        }
    }
    eprintln!(
        "repeated kills: {kills} of {} kills made (at least {MIN_KILLS} required), {between} \
         times killed between an attempt's end and its task's end, {} tasks finished before \
         the last kill",
        rounds.len(),
        frozen.len()
    );
    assert!(
        kills >= MIN_KILLS,
        "only {kills} kills landed, fewer than {MIN_KILLS}: the run was too quick for the test"
    );
    if !finished_early {
        let (code, err) = b.resume_to_end("last");
        assert_eq!(code, Some(0), "the last resume: {err}");
    }
    let j = b.assert_whole(&frozen);
    for (t, a) in live_at_kills {
        assert!(
            j.of(t, "AttemptOrphaned").iter().any(|o| o["attempt"] == a),
            "[{}] attempt {a} was live at a kill but is not recorded orphaned",
            b.labels[t as usize]
        );
    }
    for (key, before) in seen_usage {
        assert_eq!(
            j.attempt_usage().get(&key),
            Some(&before),
            "attempt {key:?} usage changed after the last kill"
        );
    }
}

/// Two state dirs (two projects) hold a run of the same id (`--run-id` in scripts): resuming
/// the crashed one must kill its own orphan and nothing of the other, which is live.
#[test]
fn resume_leaves_a_same_named_run_elsewhere_alone() {
    let hang = [
        "--attempt",
        "{attempt}",
        "--stall-attempts",
        "1",
        "--stall-at-turn",
        "0",
    ];
    let a = Batch::new("twin", 1, &[task("hang", &hang)]);
    let mut b = Batch::new("twin", 1, &[task("hang", &hang)]);
    b.run = a.run.clone();
    let started_pid = |x: &Batch| {
        x.try_journal()
            .and_then(|j| j.of(0, "AttemptStarted").first().map(|s| s["pid"].as_u64()))
            .flatten()
    };
    let mut run_a = a.start_run(None);
    let pid_a = wait_for("run A's attempt", || started_pid(&a));
    let mut run_b = b.start_run(None);
    let pid_b = wait_for("run B's attempt", || started_pid(&b));
    assert!(kill9(&mut run_b), "run B ended by itself");

    let (code, err) = b.resume_to_end("resume");
    assert_eq!(code, Some(0), "resume of B: {err}");
    let live: Vec<u64> = live_processes_of(&a.run)
        .into_iter()
        .map(u64::from)
        .collect();
    assert!(!live.contains(&pid_b), "B's orphan was killed");
    assert!(
        live.contains(&pid_a),
        "resuming run {} in one state dir killed the attempt of the live run of the same id in \
         another state dir (SORTIE_ATTEMPT markers must tell the two apart)",
        a.run
    );
    assert!(
        !a.journal().has(0, "AttemptFinished"),
        "run A's attempt was disturbed"
    );

    // Run A, crashed in turn, resumes to the end on its own.
    assert!(kill9(&mut run_a), "run A ended by itself");
    let (code, err) = a.resume_to_end("resume");
    assert_eq!(code, Some(0), "resume of A: {err}");
    for x in [&a, &b] {
        let j = x.assert_whole(&BTreeMap::new());
        assert_eq!(j.of(0, "AttemptOrphaned")[0]["action"], "killed");
    }
}
