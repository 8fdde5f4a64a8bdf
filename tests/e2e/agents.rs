//! End-to-end tests: agents that speak pi's and Claude Code's event streams. The agent is
//! `examples/agents/fake-stream.py`, which replays the recorded samples
//! (`crates/protocol/tests/fixtures/agents/`) with scripted behaviour per attempt and model, under
//! `[agents.NAME]` profiles with the `pi-json`, `pi-rpc` and `claude-stream-json` protocols.
//! Each test checks what the journal holds: outcomes, stop reasons, the continued session, and
//! usage equal to the samples' for the attempts it holds.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{Background, Scratch, finish, live_processes_of, poll, unique_run};
use sortie_testkit::Events;

/// The engine's crash-test hook (`sortie_runner::engine::TEST_PAUSE_AFTER`).
const PAUSE_AFTER: &str = "SORTIE_TEST_PAUSE_AFTER";

/// The fake stream agent shipped in `examples/agents/`.
fn fake_stream() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents/fake-stream.py")
}

/// Usage as the journal shows it: input, output, cache_read, cost nanos, turns, and how many
/// costs are unreported (a call cut short in the middle may have cost something).
type U = [u64; 6];

/// pi's `ok` sample (and Claude Code's `claude_ok`): 100 in, 12 out, 50 cache read, $0.000495.
const OK: U = [100, 12, 50, 495_000, 1, 0];
/// A failed call: one turn, no tokens, a cost of 0.
const FAILED_CALL: U = [0, 0, 0, 0, 1, 0];
const ZERO: U = [0; 6];

fn usage_of(v: &Value) -> U {
    let n = |x: &Value| x.as_u64().unwrap_or_else(|| panic!("a counter in {v}"));
    [
        n(&v["input"]),
        n(&v["output"]),
        n(&v["cache_read"]),
        n(&v["cost"]["nanos"]),
        n(&v["turns"]),
        n(&v["cost"]["unreported"]),
    ]
}

fn plus(a: U, b: U) -> U {
    std::array::from_fn(|i| a[i] + b[i])
}

fn times(a: U, k: u64) -> U {
    a.map(|x| x * k)
}

/// An `[agents.NAME]` profile running the fake stream agent with `args`, speaking `protocol`.
/// `may_write = false`: the tasks of a batch share one directory (the fake writes nothing there).
fn profile(name: &str, protocol: &str, args: &[&str], extra: &str) -> String {
    let mut argv = vec![
        "python3".to_owned(),
        fake_stream().display().to_string(),
        "--attempt".to_owned(),
        "{attempt}".to_owned(),
    ];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv.push("{model_args}".to_owned());
    if protocol != "pi-rpc" {
        argv.push("{prompt}".to_owned());
    }
    let quoted: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "[agents.{name}]\ncommand = [{}]\nmodel_args = [\"--model\", \"{{model}}\"]\n\
         protocol = \"{protocol}\"\nmay_write = false\n{extra}\n",
        quoted.join(", ")
    )
}

/// A task of `agent`, with extra TOML lines.
fn task(label: &str, agent: &str, extra: &str) -> String {
    format!(
        "[[tasks]]\nlabel = \"{label}\"\nagent = \"{agent}\"\nprompt = \"say hello\"\n{extra}\n"
    )
}

/// Runs a batch to its end; returns the exit code and the run's events.
fn run_batch(s: &Scratch, run: &str, batch: &str) -> (Option<i32>, Vec<Value>, String) {
    let file = s.write("batch.toml", batch);
    let child = s.spawn(&["run", "--run-id", run, file.to_str().expect("utf-8 path")]);
    let out = finish(child, 120);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        s.try_events(run).is_some(),
        "no run was created: {stderr}\n{batch}"
    );
    (out.status.code(), s.events(run), stderr)
}

/// The `TaskFinished` result of task `task`.
fn result(events: &[Value], task: usize) -> &Value {
    let r = events.of(task as u64, "TaskFinished");
    assert_eq!(r.len(), 1, "task {task} finished once");
    &r[0]["result"]
}

/// The stop reasons of task `task`'s attempts, in order.
fn attempt_reasons(events: &[Value], task: usize) -> Vec<String> {
    events
        .of(task as u64, "AttemptFinished")
        .iter()
        .map(|f| {
            f["outcome"]["stop_reason"]
                .as_str()
                .expect("reason")
                .to_owned()
        })
        .collect()
}

/// The sum of the last usage the journal holds for each attempt of task `task`.
fn task_usage(events: &[Value], task: usize) -> U {
    let mut last: std::collections::BTreeMap<u64, U> = std::collections::BTreeMap::new();
    for (kind, body) in events.iter().map(crate::support::event_kind) {
        if matches!(kind, "AttemptProgress" | "AttemptFinished")
            && body["task"].as_u64() == Some(task as u64)
        {
            let a = body["attempt"].as_u64().expect("attempt");
            last.insert(a, usage_of(&body["usage"]));
        }
    }
    last.values().fold(ZERO, |acc, u| plus(acc, *u))
}

/// The audit's ledger total equals the sum of `expected` per task.
fn assert_ledger(s: &Scratch, run: &str, expected: U) {
    let audit = s.audit_clean(run);
    let total = &audit["ledger"]["total"];
    assert_eq!(usage_of(total), expected, "ledger: {audit}");
}

fn log_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("the fake agent logs JSON lines"))
        .collect()
}

#[test]
fn agents_pi_and_claude_samples_complete_with_the_samples_usage() {
    let s = Scratch::new();
    let run = unique_run("agents-ok");
    let batch = format!(
        "{}{}{}{}",
        profile("fakepi", "pi-json", &["--sample", "ok"], ""),
        profile(
            "fakeclaude",
            "claude-stream-json",
            &["--sample", "claude_ok"],
            ""
        ),
        task("pi", "fakepi", ""),
        task("claude", "fakeclaude", ""),
    );
    let (code, events, err) = run_batch(&s, &run, &batch);
    assert_eq!(code, Some(0), "{err}");
    for t in 0..2 {
        let r = result(&events, t);
        assert_eq!(r["state"], "completed", "{r}");
        assert_eq!(r["text"], "Hello from the mock LLM. Task complete.");
        assert_eq!(task_usage(&events, t), OK, "task {t}");
        let finished = events.of(t as u64, "AttemptFinished");
        assert_eq!(usage_of(&finished[0]["usage"]), OK);
    }
    assert_eq!(events.count("AttemptSideEffects"), 0);
    assert_ledger(&s, &run, times(OK, 2));
}

#[test]
fn agents_transient_error_then_success_and_a_model_error_moves_to_the_fallback() {
    let s = Scratch::new();
    let run = unique_run("agents-retry");
    let batch = format!(
        "{}{}{}{}",
        profile(
            "flaky",
            "pi-json",
            &["--samples", "1:error500_noretry,2:ok"],
            ""
        ),
        profile(
            "keyless",
            "pi-json",
            &[
                "--model-sample",
                "bad:error500_noretry",
                "--sample",
                "ok",
                "--error-text",
                "401 invalid api key",
            ],
            "",
        ),
        task("flaky", "flaky", "max_retries = 2"),
        task(
            "keyless",
            "keyless",
            "model = \"bad\"\nfallback_models = [\"good\"]\nmax_retries = 0"
        ),
    );
    let (code, events, err) = run_batch(&s, &run, &batch);
    assert_eq!(code, Some(0), "{err}");

    // A 500 is transient: the same model again, after a backoff; then the sample's answer.
    assert_eq!(attempt_reasons(&events, 0), ["error", "completed"]);
    let retry = events.of(0, "RetryScheduled");
    assert!(retry[0]["delay"] != Value::Null, "{retry:?}");
    assert_eq!(result(&events, 0)["state"], "completed");
    // The failed call has no tokens and a reported cost of 0: only the answer counts.
    assert_eq!(task_usage(&events, 0), plus(OK, FAILED_CALL));

    // A 401 is a model error: the fallback at once, never the same model again.
    assert_eq!(attempt_reasons(&events, 1), ["model_error", "completed"]);
    let launches = events.of(1, "AttemptLaunching");
    let models: Vec<&str> = launches
        .iter()
        .map(|l| l["model"].as_str().expect("a model"))
        .collect();
    assert_eq!(models, ["bad", "good"]);
    let retry = events.of(1, "RetryScheduled");
    assert_eq!(
        retry[0]["delay"]["secs"], 0,
        "a model switch starts at once"
    );
    assert_eq!(retry[0]["delay"]["nanos"], 0);
    assert_eq!(result(&events, 1)["state"], "completed");
    assert_ledger(&s, &run, plus(times(OK, 2), times(FAILED_CALL, 2)));
}

#[test]
fn agents_truncated_streams_and_a_stall() {
    let s = Scratch::new();
    let run = unique_run("agents-cut");
    let batch = format!(
        "{}{}{}{}{}{}",
        // Attempt 1 dies before the answer starts (exit 0, no end of run): failed
        // protocol_error, which is retried.
        profile(
            "cut",
            "pi-json",
            &["--sample", "ok", "--cut-after", "5", "--cut-attempts", "1"],
            ""
        ),
        // The server closed the stream early: pi reports a "successful" answer with no usage.
        profile("closed", "pi-json", &["--sample", "stall_then_close"], ""),
        // Attempt 1 goes silent after the user message: stalled, stopped, retried.
        profile(
            "stall",
            "pi-json",
            &[
                "--sample",
                "ok",
                "--stall-after",
                "5",
                "--stall-attempts",
                "1"
            ],
            ""
        ),
        task("cut", "cut", "max_retries = 1"),
        task("closed", "closed", "max_retries = 1"),
        task(
            "stall",
            "stall",
            "max_retries = 1\nstall_after = \"3s\"\nstall_kill_after = \"1s\"\nkill_grace = \"1s\""
        ),
    );
    let (code, events, err) = run_batch(&s, &run, &batch);
    assert_eq!(code, Some(1), "a partial task: {err}");

    assert_eq!(attempt_reasons(&events, 0), ["protocol_error", "completed"]);
    let first = &events.of(0, "AttemptFinished")[0]["outcome"];
    assert_eq!(first["status"], "failed", "{first}");
    assert_eq!(result(&events, 0)["state"], "completed");

    // Text but no usage: cut short, partial, not retried (it has an answer).
    assert_eq!(attempt_reasons(&events, 1), ["protocol_error"]);
    let r = result(&events, 1);
    assert_eq!(r["state"], "partial", "{r}");
    assert_eq!(r["text"], "Starting the ");

    assert_eq!(events.of(2, "AttemptStalled").len(), 1);
    assert_eq!(attempt_reasons(&events, 2), ["stalled", "completed"]);
    assert_eq!(result(&events, 2)["state"], "completed");

    let expected = [
        task_usage(&events, 0),
        task_usage(&events, 1),
        task_usage(&events, 2),
    ];
    // Attempts cut before their first answer spent no token the stream shows, at an unknown
    // cost; the answers are the sample's.
    let cut_short: U = [0, 0, 0, 0, 0, 1];
    assert_eq!(expected[0], plus(OK, cut_short));
    assert_eq!(
        expected[1],
        [0, 0, 0, 0, 1, 0],
        "no usage reported for the cut answer"
    );
    assert_eq!(expected[2], plus(OK, cut_short));
    assert_ledger(&s, &run, expected.iter().fold(ZERO, |a, u| plus(a, *u)));
}

#[test]
fn agents_budget_without_steering_stops_at_once_and_keeps_the_output() {
    let s = Scratch::new();
    let run = unique_run("agents-budget");
    let batch = format!(
        "{}{}",
        profile(
            "busy",
            "pi-json",
            &["--sample", "ok", "--turns", "8", "--turn-delay", "0.3"],
            ""
        ),
        task("busy", "busy", "max_turns = 2\ngrace_turns = 2"),
    );
    let (code, events, err) = run_batch(&s, &run, &batch);
    assert_eq!(code, Some(1), "partial: {err}");
    assert_eq!(attempt_reasons(&events, 0), ["budget"]);
    let outcome = &events.of(0, "AttemptFinished")[0]["outcome"];
    assert_eq!(outcome["status"], "partial", "{outcome}");
    let r = result(&events, 0);
    assert_eq!(r["state"], "partial", "{r}");
    assert_eq!(r["stop_reason"], "budget");
    let error = r["error"].as_str().expect("an error");
    assert!(
        error.contains("reached max turns budget") && error.contains("not wrapped up"),
        "{error}"
    );
    assert_eq!(r["text"], "step 2: using read", "the output so far is kept");
    // Stopped at the breach: two turns of the sample's usage, not eight.
    let u = task_usage(&events, 0);
    assert_eq!(u, times(OK, 2));
    assert!(live_processes_of(&run).is_empty(), "the agent was stopped");
    assert_ledger(&s, &run, u);
}

#[test]
fn agents_budget_with_steering_asks_to_wrap_up_within_grace_turns() {
    let s = Scratch::new();
    let run = unique_run("agents-steer");
    let (log1, log2) = (s.path().join("steered.log"), s.path().join("deaf.log"));
    let (l1, l2) = (log1.display().to_string(), log2.display().to_string());
    let steer = "can_steer = true";
    let batch = format!(
        "{}{}{}{}",
        profile(
            "steered",
            "pi-rpc",
            &[
                "--rpc",
                "--sample",
                "ok",
                "--turns",
                "8",
                "--turn-delay",
                "0.4",
                "--log",
                &l1,
            ],
            steer
        ),
        profile(
            "deaf",
            "pi-rpc",
            &[
                "--rpc",
                "--ignore-steer",
                "--sample",
                "ok",
                "--turns",
                "8",
                "--turn-delay",
                "0.4",
                "--log",
                &l2,
            ],
            steer
        ),
        task("steered", "steered", "max_turns = 2\ngrace_turns = 2"),
        task("deaf", "deaf", "max_turns = 2\ngrace_turns = 2"),
    );
    let (code, events, err) = run_batch(&s, &run, &batch);
    assert_eq!(code, Some(1), "partial: {err}");

    // The prompt went to stdin as a command, then the wrap-up request.
    let log = log_lines(&log1);
    let commands: Vec<&Value> = log.iter().filter_map(|l| l.get("stdin")).collect();
    assert_eq!(commands[0]["type"], "prompt", "{log:?}");
    assert_eq!(commands[0]["message"], "say hello");
    assert_eq!(commands[1]["type"], "steer", "{log:?}");
    assert!(
        commands[1]["message"]
            .as_str()
            .is_some_and(|m| m.contains("reached your budget")),
        "{log:?}"
    );

    let r = result(&events, 0);
    assert_eq!(
        (r["state"].as_str(), r["stop_reason"].as_str()),
        (Some("partial"), Some("budget")),
        "{r}"
    );
    let error = r["error"].as_str().expect("an error");
    assert!(
        error.contains("wrapped up within 2 grace turn(s)"),
        "{error}"
    );
    assert_eq!(r["text"], "wrapped up: here is what I have so far");
    let u = task_usage(&events, 0);
    assert_eq!(
        u,
        times(OK, 3),
        "the breach at 2 turns, then one turn to wrap up"
    );

    // An agent that ignores the request is stopped once its grace turns are used up.
    let log = log_lines(&log2);
    assert!(log.iter().any(|l| l["stdin"]["type"] == "steer"), "{log:?}");
    let r = result(&events, 1);
    assert_eq!(
        (r["state"].as_str(), r["stop_reason"].as_str()),
        (Some("partial"), Some("budget")),
        "{r}"
    );
    let error = r["error"].as_str().expect("an error");
    assert!(
        error.contains("still working after 2 grace turn(s)") && error.contains("not wrapped up"),
        "{error}"
    );
    let u2 = task_usage(&events, 1);
    assert_eq!(u2, times(OK, 4), "2 turns to the breach, 2 of grace");
    assert!(live_processes_of(&run).is_empty(), "both agents ended");
    assert_ledger(&s, &run, plus(u, u2));
}

/// Starts `sortie run` with the pause hook set, waits for the journal to show `ready`, then
/// SIGKILLs sortie (its agents live on) and resumes the run to its end.
fn crash_and_resume(
    s: &Scratch,
    run: &str,
    batch: &str,
    pause: &str,
    ready: impl Fn(&[Value]) -> bool,
) -> (Option<i32>, Vec<Value>) {
    let file = s.write("batch.toml", batch);
    let mut cmd = s.sortie();
    cmd.args(["run", "--run-id", run, file.to_str().expect("utf-8 path")])
        .env(PAUSE_AFTER, pause)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let bg = Background::from_command(cmd, run);
    poll("the pause point", 60, || {
        s.try_events(run).filter(|e| ready(e)).map(|_| ())
    });
    crate::support::send_signal(bg.pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = bg.finish(10);
    assert!(
        !live_processes_of(run).is_empty(),
        "the agent outlives the killed sortie"
    );
    let out = finish(s.spawn(&["resume", run]), 120);
    let code = out.status.code();
    assert!(
        live_processes_of(run).is_empty(),
        "resume leaves no agent behind: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, s.events(run))
}

#[test]
fn agents_crash_mid_attempt_continues_the_session() {
    let s = Scratch::new();
    let run = unique_run("agents-continue");
    let log = s.path().join("agent.log");
    let l = log.display().to_string();
    // Attempt 1 writes its session file, prints the user message, then hangs.
    let p = profile(
        "resumable",
        "pi-json",
        &[
            "--sample",
            "ok",
            "--stall-after",
            "5",
            "--stall-attempts",
            "1",
            "--log",
            &l,
            "{session_args}",
        ],
        "can_continue = true",
    );
    // Unsupervised: the attempt dies with sortie and resume takes the orphan path (a
    // supervised attempt would be adopted instead: tests/e2e/supervised.rs).
    let batch = format!(
        "{p}{}",
        task(
            "resumable",
            "resumable",
            "max_retries = 2\nsupervise = false"
        )
    );
    // Killed once attempt 1 started and its agent wrote its session file.
    let started = |e: &[Value]| {
        !e.of(0, "AttemptStarted").is_empty()
            && log_lines(&log)
                .iter()
                .any(|l| l.get("session_file").is_some())
    };
    let (code, events) = crash_and_resume(&s, &run, &batch, "AttemptStarted", started);
    assert_eq!(code, Some(0));

    // Attempt 1 was orphaned; attempt 2 continued its session, as the journal and the agent say.
    assert_eq!(events.of(0, "AttemptOrphaned").len(), 1);
    let continues = events.of(0, "AttemptContinues");
    assert_eq!(continues.len(), 1, "{events:?}");
    assert_eq!(continues[0]["attempt"], 2);
    let session = continues[0]["session"].as_str().expect("a session");
    let run_dir = s.state_dir().join("runs").join(&run);
    assert!(
        Path::new(session).starts_with(run_dir.join("sessions").join("0.1")),
        "attempt 1's session under the run dir: {session}"
    );
    let lines = log_lines(&log);
    let written: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["session_file"].as_str())
        .collect();
    assert_eq!(written.first().copied(), Some(session), "{lines:?}");
    assert!(
        lines.iter().any(|l| l["continued"] == session),
        "the agent saw --session {session}: {lines:?}"
    );
    let argv2 = lines
        .iter()
        .find(|l| l["attempt"] == 2)
        .expect("attempt 2 ran");
    let argv2: Vec<&str> = argv2["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        argv2.windows(2).any(|w| w == ["--session", session]),
        "{argv2:?}"
    );
    assert!(argv2.contains(&"--session-dir"), "{argv2:?}");
    assert_eq!(result(&events, 0)["state"], "completed");
    // Attempt 1 spent nothing the journal knows of; attempt 2 is the sample.
    assert_eq!(task_usage(&events, 0), OK);
    assert_ledger(&s, &run, OK);
}

#[test]
fn agents_crash_after_side_effects_outside_a_worktree_is_not_retried() {
    let s = Scratch::new();
    let run = unique_run("agents-fx");
    // Two bash turns (side effects), then silence until the kill.
    let p = profile(
        "writer",
        "pi-json",
        &[
            "--sample",
            "ok",
            "--turns",
            "2",
            "--tool",
            "bash",
            "--stall-after",
            "25",
        ],
        "",
    );
    // Unsupervised: the attempt dies with sortie and resume takes the orphan path (a
    // supervised attempt would be adopted instead: tests/e2e/supervised.rs).
    let batch = format!(
        "{p}{}",
        task("writer", "writer", "max_retries = 2\nsupervise = false")
    );
    let fx = |e: &[Value]| !e.of(0, "AttemptSideEffects").is_empty();
    let (code, events) = crash_and_resume(&s, &run, &batch, "AttemptSideEffects", fx);
    assert_eq!(code, Some(1));
    assert_eq!(events.of(0, "AttemptSideEffects").len(), 1);
    assert_eq!(events.of(0, "AttemptOrphaned").len(), 1);
    assert_eq!(events.of(0, "AttemptLaunching").len(), 1, "not retried");
    let r = result(&events, 0);
    assert_eq!(
        (r["state"].as_str(), r["stop_reason"].as_str()),
        (Some("failed"), Some("interrupted")),
        "{r}"
    );
    assert!(
        r["error"]
            .as_str()
            .is_some_and(|e| e.contains("side-effecting tools outside a worktree")),
        "{r}"
    );
    assert_ledger(&s, &run, task_usage(&events, 0));
}

#[test]
fn agents_pi_without_an_api_key_fails_naming_its_first_error_line_not_the_docs_path() {
    // pi with no key: its message, then help ending in a path to its docs, and exit 1.
    let s = Scratch::new();
    let run = unique_run("agents-nokey");
    let script = "printf '%s\\n' '{\"type\":\"session\",\"version\":3}'; \
                  printf 'No API key found for the selected model.\\n\\nUse /login or set an \
                  API key environment variable. See:\\n  /opt/pi/docs/models.md\\n' >&2; exit 1";
    let batch = format!(
        "[agents.nokey]\ncommand = [\"sh\", \"-c\", {script:?}]\nprotocol = \"pi-json\"\n\
         may_write = false\n{}",
        task("t", "nokey", "")
    );
    let (code, events, err) = run_batch(&s, &run, &batch);
    assert_eq!(code, Some(1), "{err}");
    let r = result(&events, 0);
    assert_eq!(r["state"], "failed", "{r}");
    let error = r["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("No API key found for the selected model.") && !error.contains("models.md"),
        "the task's error: {r}"
    );
    assert!(
        err.contains("No API key found for the selected model."),
        "the run's log names pi's message: {err}"
    );
}
