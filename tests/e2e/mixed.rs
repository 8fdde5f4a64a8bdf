//! End-to-end tests: one batch of more than fifty tasks with every kind of outcome (success,
//! real failure, transient failures retried on the same or a fallback model, a stall, an
//! attempt timeout, a deadline, a skipped dependent, retries exhausted), checked through what a
//! user sees: `status --json`, the events `export` prints, the exit code, the summary and the
//! ledger `audit` recomputes. And a small batch where everything succeeds.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::support::{Scratch, event_kind, fake_command, finish, labels, task_view};
use sortie_testkit::Events;

/// One attempt's usage as the fake agent reports it (input, output, cost in nanodollars,
/// turns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct U {
    input: u64,
    output: u64,
    nanos: u64,
    turns: u64,
}

impl U {
    fn plus(self, o: U) -> U {
        U {
            input: self.input + o.input,
            output: self.output + o.output,
            nanos: self.nanos + o.nanos,
            turns: self.turns + o.turns,
        }
    }

    fn of(v: &Value) -> U {
        assert_eq!(
            v["cost"]["unreported"], 0,
            "a fake agent reports its cost: {v}"
        );
        assert_eq!(v["cache_read"], 0, "{v}");
        assert_eq!(v["cache_write"], 0, "{v}");
        U {
            input: v["input"].as_u64().expect("input"),
            output: v["output"].as_u64().expect("output"),
            nanos: v["cost"]["nanos"].as_u64().expect("cost nanos"),
            turns: v["turns"].as_u64().expect("turns"),
        }
    }
}

/// The `--usage` argument for the `k`-th usage-reporting task, and what one attempt of it
/// reports (one turn). Every value is unique so that ledgers cannot add up by accident; costs
/// are whole micro-dollars so that they convert exactly.
fn usage(k: u64) -> (String, U) {
    let (input, output, micros) = (1000 + 7 * k, 100 + 3 * k, 11 + k);
    (
        format!("{input},{output},{:.6}", micros as f64 / 1e6),
        U {
            input,
            output,
            nanos: micros * 1000,
            turns: 1,
        },
    )
}

/// A task of the batch and everything the run must end up saying about it.
struct Case {
    label: String,
    args: Vec<String>,
    /// Extra TOML lines of the task.
    extra: String,
    /// Final state and stop reason, as `status --json` names them.
    state: &'static str,
    stop_reason: &'static str,
    /// The phase in the `TaskFinished` result (`"running"` for timeouts).
    phase: Option<&'static str>,
    /// Per attempt, in order: the model, the stop reason in the journal, the usage reported.
    attempts: Vec<(Option<&'static str>, &'static str, U)>,
    /// Something the task's error must contain, or end with.
    error_has: Option<String>,
    error_ends: Option<String>,
}

impl Case {
    fn new(label: &str, args: &[&str]) -> Case {
        Case {
            label: label.to_owned(),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            extra: String::new(),
            state: "completed",
            stop_reason: "completed",
            phase: None,
            attempts: Vec::new(),
            error_has: None,
            error_ends: None,
        }
    }

    fn with_usage(mut self, k: u64) -> (Case, U) {
        let (arg, u) = usage(k);
        self.args.push("--usage".into());
        self.args.push(arg);
        (self, u)
    }

    fn toml(&self) -> String {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        format!(
            "[[tasks]]\nlabel = {:?}\ncommand = {}\n{}\n",
            self.label,
            fake_command(&args),
            self.extra
        )
    }
}

/// The batch: the slow and special tasks first (so that the queue never eats their clocks),
/// then many plain successes and one dependent of a success.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut k = 0;
    let mut next = || {
        k += 1;
        k
    };

    // A deadline on a task that hangs: it times out while running, once.
    let mut c = Case::new("deadline", &["--hang"]);
    c.extra = "deadline = \"2s\"\n".into();
    c.state = "timeout";
    c.stop_reason = "timeout";
    c.phase = Some("running");
    c.attempts = vec![(None, "timeout", U::default())];
    c.error_has = Some("deadline".into());
    cases.push(c);

    // An attempt timeout: timeout while running, never retried (work may be half done).
    let mut c = Case::new("attempt-timeout", &["--hang"]);
    c.extra = "attempt_timeout = \"2s\"\n".into();
    c.state = "timeout";
    c.stop_reason = "timeout";
    c.phase = Some("running");
    c.attempts = vec![(None, "timeout", U::default())];
    c.error_has = Some("timed out".into());
    cases.push(c);

    // A stall: one line, then silence; stopped as stalled, retried, then completes. The
    // stalled attempt's usage (printed before the silence) counts.
    let (mut c, u) = Case::new(
        "stall",
        &["--attempt", "{attempt}", "--stall-attempts", "1"],
    )
    .with_usage(next());
    // (4s of silence in all before the kill: a slow start is seldom taken for a stall; see
    // `settle_stall` for when it is.)
    c.extra = "stall_after = \"2s\"\nstall_kill_after = \"2s\"\n".into();
    c.attempts = vec![(None, "stalled", u), (None, "completed", u)];
    cases.push(c);

    // Retries exhausted: a transient error every time, max_retries = 1: two attempts.
    let (mut c, u) = Case::new(
        "exhausted",
        &["--attempt", "{attempt}", "--fail-attempts", "9:error"],
    )
    .with_usage(next());
    c.extra = "max_retries = 1\n".into();
    c.state = "failed";
    c.stop_reason = "error";
    c.attempts = vec![(None, "error", u), (None, "error", u)];
    c.error_ends = Some("(after 2 attempts: default → default)".into());
    cases.push(c);

    // A transient failure, then success on the same model.
    let (mut c, u) = Case::new(
        "flaky",
        &["--attempt", "{attempt}", "--fail-attempts", "1:error"],
    )
    .with_usage(next());
    c.attempts = vec![(None, "error", u), (None, "completed", u)];
    cases.push(c);

    // A transient failure on the primary; attempt 2 uses the first fallback and succeeds.
    let (mut c, u) = Case::new(
        "fallback-error",
        &["--model", "{model}", "--fail-model", "a:error"],
    )
    .with_usage(next());
    c.extra = "model = \"a\"\nfallback_models = [\"b\"]\n".into();
    c.attempts = vec![(Some("a"), "error", u), (Some("b"), "completed", u)];
    cases.push(c);

    // A model_error (quota, auth): never retried on that model, the fallback at once.
    let (mut c, u) = Case::new(
        "fallback-model-error",
        &["--model", "{model}", "--fail-model", "a:model_error"],
    )
    .with_usage(next());
    c.extra = "model = \"a\"\nfallback_models = [\"b\"]\n".into();
    c.attempts = vec![(Some("a"), "model_error", u), (Some("b"), "completed", u)];
    cases.push(c);

    // A real task failure: nonzero exit with a complete answer, never retried.
    let (mut c, u) = Case::new("nonzero", &["--exit", "3"]).with_usage(next());
    c.state = "failed";
    c.stop_reason = "nonzero_exit";
    c.attempts = vec![(None, "nonzero_exit", u)];
    c.error_has = Some("code 3".into());
    cases.push(c);

    // A dependent of the failed task: skipped, never launched.
    let (mut c, _) = Case::new("skipped", &[]).with_usage(next());
    c.extra = "needs = [\"nonzero\"]\n".into();
    c.state = "skipped";
    c.stop_reason = "cancelled";
    c.error_has = Some("nonzero".into());
    cases.push(c);

    // Many plain successes, each with its own usage.
    for i in 0..42 {
        let label = format!("ok-{i:02}");
        let answer = format!("answer of {label}");
        let (mut c, u) = Case::new(&label, &["--answer", &answer]).with_usage(next());
        c.attempts = vec![(None, "completed", u)];
        cases.push(c);
    }

    // A dependent of a success: runs after it and completes.
    let (mut c, u) = Case::new("after-ok", &[]).with_usage(next());
    c.extra = "needs = [\"ok-00\"]\n".into();
    c.attempts = vec![(None, "completed", u)];
    cases.push(c);
    cases
}

/// The stall task's attempts, from what they printed. Its first attempt prints its usage and
/// one line, then goes silent: stalled, its usage counts, and attempt 2 completes. But the
/// stall clock starts at spawn, and on a machine loaded enough that the agent takes longer than
/// the stall window to start, an attempt is stopped before it printed anything (usage zero)
/// and one more attempt is made. Each stalled attempt counts what it printed, no more, no less.
fn settle_stall(cases: &mut [Case], events: &[Value]) {
    let i = cases
        .iter()
        .position(|c| c.label == "stall")
        .expect("a stall task");
    let u = cases[i].attempts[0].2;
    let finished = events.of(i as u64, "AttemptFinished");
    let n = finished.len();
    assert!(
        (2..=3).contains(&n),
        "the stall task made 2 attempts (3 on a loaded machine), not {n}"
    );
    let mut attempts = Vec::new();
    for (k, e) in finished.iter().enumerate() {
        let printed = e["output"]
            .as_str()
            .is_some_and(|o| o.contains(&format!("working on attempt {} turn 1", k + 1)));
        if k + 1 < n {
            attempts.push((None, "stalled", if printed { u } else { U::default() }));
        } else {
            attempts.push((None, "completed", u));
        }
    }
    if n > 2 {
        eprintln!("note: the stall task needed {n} attempts: a slow start looked like a stall");
    }
    cases[i].attempts = attempts;
}

#[test]
fn mixed_outcomes_are_classified_retried_and_billed_as_specified() {
    let s = Scratch::new();
    let mut cases = cases();
    assert!(cases.len() >= 50);
    let mut toml = String::from("concurrency = 8\n\n[defaults]\nkill_grace = \"1s\"\n\n");
    for c in &cases {
        toml.push_str(&c.toml());
    }
    let batch = s.write("mixed.toml", &toml);
    // `--all`: more than 50 tasks is a big run, whose summary lists every row only when asked;
    // 200 columns: no label is cut.
    let child = s
        .sortie()
        .env("COLUMNS", "200")
        .args([
            "run",
            "--all",
            "--run-id",
            "mixed",
            batch.to_str().expect("utf-8 path"),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sortie");
    let out = finish(child, 120);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "some tasks failed: exit 1\nstderr:\n{stderr}"
    );

    let status = s.status("mixed");
    assert_eq!(status["status"], "partial", "{status}");
    assert!(status["live_pid"].is_null());
    let events = s.events("mixed");
    let order = labels(&events);
    assert_eq!(
        order,
        cases.iter().map(|c| c.label.clone()).collect::<Vec<_>>()
    );

    let mut total = U::default();
    let mut per_model: BTreeMap<Option<&str>, U> = BTreeMap::new();
    let mut per_task: BTreeMap<String, U> = BTreeMap::new();
    settle_stall(&mut cases, &events);
    for (i, c) in cases.iter().enumerate() {
        let what = format!("task {}", c.label);
        let v = task_view(&status, &c.label);
        assert_eq!(v["state"], c.state, "{what}: {v}");
        assert_eq!(v["stop_reason"], c.stop_reason, "{what}: {v}");
        assert_eq!(v["attempts"], c.attempts.len(), "{what}: {v}");

        // The models tried, in order, and each attempt's stop reason and usage.
        let launched: Vec<Option<&str>> = events
            .of(i as u64, "AttemptLaunching")
            .iter()
            .map(|e| e["model"].as_str())
            .collect();
        let expected_models: Vec<Option<&str>> = c.attempts.iter().map(|a| a.0).collect();
        assert_eq!(launched, expected_models, "{what}: models tried");
        let finished = events.of(i as u64, "AttemptFinished");
        let reasons: Vec<&str> = finished
            .iter()
            .map(|e| e["outcome"]["stop_reason"].as_str().expect("stop reason"))
            .collect();
        let expected_reasons: Vec<&str> = c.attempts.iter().map(|a| a.1).collect();
        assert_eq!(reasons, expected_reasons, "{what}: attempt stop reasons");
        let used: Vec<U> = finished.iter().map(|e| U::of(&e["usage"])).collect();
        let expected_usage: Vec<U> = c.attempts.iter().map(|a| a.2).collect();
        assert_eq!(
            used,
            expected_usage,
            "{what}: usage of each attempt; its events: {:#?}",
            events
                .iter()
                .filter(|e| event_kind(e).1["task"].as_u64() == Some(i as u64))
                .map(|e| {
                    let mut t = e.to_string();
                    t.truncate(400);
                    t
                })
                .collect::<Vec<_>>()
        );
        let attempt_numbers: Vec<u64> = finished
            .iter()
            .map(|e| e["attempt"].as_u64().expect("attempt"))
            .collect();
        assert_eq!(
            attempt_numbers,
            (1..=c.attempts.len() as u64).collect::<Vec<_>>(),
            "{what}"
        );
        // A retry is scheduled between attempts, never after the last.
        let retries = events.of(i as u64, "RetryScheduled");
        assert_eq!(
            retries.len(),
            c.attempts.len().saturating_sub(1),
            "{what}: retries"
        );
        // A model switch starts at once; a same-model retry waits.
        for (n, r) in retries.iter().enumerate() {
            let switch = c.attempts[n].0 != c.attempts[n + 1].0;
            let delay = &r["delay"];
            let zero = delay["secs"] == 0 && delay["nanos"] == 0;
            assert_eq!(zero, switch, "{what}: delay of retry {} {r}", n + 1);
        }

        // The result.
        let ends = events.of(i as u64, "TaskFinished");
        assert_eq!(ends.len(), 1, "{what}: one TaskFinished");
        let result = &ends[0]["result"];
        assert_eq!(result["phase"].as_str(), c.phase, "{what}: {result}");
        let error = result["error"].as_str().unwrap_or_default();
        if let Some(has) = &c.error_has {
            assert!(error.contains(has.as_str()), "{what}: error {error:?}");
        }
        if let Some(end) = &c.error_ends {
            assert!(error.ends_with(end.as_str()), "{what}: error {error:?}");
        }
        if c.state == "completed" {
            assert!(result["error"].is_null(), "{what}: {result}");
        }
        // More than 20 tasks: the summary is the table, without the outputs; `--all`: every row.
        assert!(
            stdout.lines().any(|l| {
                let mut words = l.split_whitespace();
                (words.next(), words.next()) == (Some(c.label.as_str()), Some(&*c.state))
            }),
            "{what}: the summary's table shows its state\n{stdout}"
        );

        let task_usage = c.attempts.iter().fold(U::default(), |acc, a| acc.plus(a.2));
        assert_eq!(U::of(&v["usage"]), task_usage, "{what}: usage in status");
        if !c.attempts.is_empty() {
            per_task.insert(c.label.clone(), task_usage);
        }
        for a in &c.attempts {
            let m = per_model.entry(a.0).or_default();
            *m = m.plus(a.2);
        }
        total = total.plus(task_usage);
    }
    assert_eq!(U::of(&status["usage"]), total, "run usage in status");
    // Only the stalling task was ever marked stalled: its first attempt, and possibly its
    // second or more than once when a slow start under load looked like silence.
    let stall = order.iter().position(|l| l == "stall").expect("stall");
    let stalled: Vec<(u64, u64)> = events
        .iter()
        .map(event_kind)
        .filter(|(k, _)| *k == "AttemptStalled")
        .map(|(_, b)| {
            (
                b["task"].as_u64().unwrap_or(99),
                b["attempt"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    assert!(!stalled.is_empty(), "the stall was seen");
    assert!(
        stalled.contains(&(stall as u64, 1)) && stalled.iter().all(|&(t, _)| t == stall as u64),
        "only the stalling attempt was marked stalled: {stalled:?}"
    );

    // The ledger audit recomputes from the journal is what the agents reported.
    let audit = s.audit_clean("mixed");
    let ledger = &audit["ledger"];
    let tasks: BTreeMap<String, U> = ledger["tasks"]
        .as_array()
        .expect("ledger tasks")
        .iter()
        .map(|p| (p[0].as_str().expect("label").to_owned(), U::of(&p[1])))
        .collect();
    assert_eq!(tasks, per_task, "ledger per task");
    let models: BTreeMap<Option<&str>, U> = ledger["models"]
        .as_array()
        .expect("ledger models")
        .iter()
        .map(|p| (p[0].as_str(), U::of(&p[1])))
        .collect();
    assert_eq!(models, per_model, "ledger per model");
    assert_eq!(U::of(&ledger["total"]), total, "ledger total");
}

#[test]
fn an_all_success_batch_exits_0_and_prints_each_task() {
    let s = Scratch::new();
    let mut toml = String::from("concurrency = 3\n");
    let labels = ["alpha", "beta", "gamma", "delta"];
    for (i, l) in labels.iter().enumerate() {
        let answer = format!("the answer of {l}");
        let u = format!("{},{},0.00{}", 10 + i, 20 + i, i + 1);
        toml.push_str(&format!(
            "[[tasks]]\nlabel = {l:?}\ncommand = {}\n",
            fake_command(&["--answer", &answer, "--usage", &u])
        ));
    }
    let batch = s.write("ok.toml", &toml);
    let out = finish(
        s.spawn(&["run", "--run-id", "ok", batch.to_str().expect("utf-8")]),
        60,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The summary: `[label] completed` then the task's text, blocks separated by a blank line.
    let blocks: Vec<&str> = stdout.split("\n\n").collect();
    for l in labels {
        let head = format!("[{l}] completed\n");
        let block = blocks
            .iter()
            .find(|b| b.starts_with(&head))
            .unwrap_or_else(|| panic!("no block for {l} in:\n{stdout}"));
        assert!(
            block.contains(&format!("the answer of {l}")),
            "{l}: {block}"
        );
    }
    let status = s.status("ok");
    assert_eq!(status["status"], "completed");
    assert_eq!(status["counts"]["completed"], labels.len());
    let audit = s.audit_clean("ok");
    assert_eq!(audit["ledger"]["total"]["input"], 10 + 11 + 12 + 13);
    assert_eq!(audit["ledger"]["total"]["cost"]["nanos"], 10_000_000);
}

#[test]
fn fail_fast_stops_launching_after_the_first_failure() {
    let s = Scratch::new();
    let mut toml = String::from("concurrency = 1\n");
    toml.push_str(&format!(
        "[[tasks]]\nlabel = \"first\"\ncommand = {}\n",
        fake_command(&["--exit", "3", "--usage", "1,2,0.001"])
    ));
    for l in ["second", "third"] {
        toml.push_str(&format!(
            "[[tasks]]\nlabel = {l:?}\ncommand = {}\n",
            fake_command(&["--counter", "counter"])
        ));
    }
    let batch = s.write("ff.toml", &toml);
    let out = finish(
        s.spawn(&[
            "run",
            "--fail-fast",
            "--run-id",
            "ff",
            batch.to_str().expect("utf-8"),
        ]),
        60,
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status("ff");
    assert_eq!(status["status"], "failed", "{status}");
    assert_eq!(task_view(&status, "first")["state"], "failed");
    let events = s.events("ff");
    for (i, l) in ["second", "third"].iter().enumerate() {
        let t = task_view(&status, l);
        assert_eq!(t["state"], "cancelled", "{t}");
        assert_eq!(t["attempts"], 0, "{t}");
        assert!(events.of((i + 1) as u64, "AttemptLaunching").is_empty());
    }
    assert!(
        !s.path().join("counter").exists(),
        "no task was launched after the failure"
    );
    s.audit_clean("ff");
}
