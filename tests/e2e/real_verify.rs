//! #33 with the real pi 0.73.1 (pi-json and pi-rpc) and Claude Code 2.1.332, each against the
//! project's loopback mock of its API (127.0.0.1 only): a task in a small git repository
//! (`isolation = "worktree"`) whose check `sh test.sh` fails with `FAILED test_add ...` until
//! `add` in `calc.sh` adds, with one feedback round (`verify_rounds = 1`).
//!
//! Every mock serves the `verify` scenario of `tests/mock-llm/verify_fix.py`: a plain answer
//! that fixes nothing first, the FIXING tool call (a shell command that makes `add` add) only
//! to a request whose last user message holds the check's failure, and a final answer after
//! that call's result. So a task that ends `completed` with its check passed proves that the
//! feedback round reached the agent, with the failure, as a new attempt continuing the checked
//! attempt's conversation: pi's `--session FILE` (pi-json; a new RPC process on that session
//! for pi-rpc), Claude Code's `--resume <session id>`.
//!
//! Each test checks what a user sees: the task `completed`, verified after one round in
//! `status --json`; the fix in `sortie diff`, the repository's own checkout untouched; the
//! failure in `sortie logs --verify --attempt 1`; both rounds' usage counted once (the task's
//! usage and the run's ledger are the sum of what the mock served, `sortie audit` clean); and
//! the mock asked exactly three times, the second request carrying the earlier turns.
//!
//! Without the CLIs (or python3) the tests are skipped, saying why, unless `CI` is set: then
//! they fail (`sortie_testkit::real_agent`).

use std::path::PathBuf;
use std::process::Stdio;

use serde_json::Value;
use sortie_testkit::Events;
use sortie_testkit::real_agent::{
    MockServer, PI_VARS, claude_found, pi_found, pi_user, should_run,
};

use crate::support::{Background, Scratch, run_as_user, task_view, unique_run};
use crate::verify::failing_repo;

/// The task's prompt (the first round's last user message).
const PROMPT: &str = "Make test.sh pass.";
/// What `sortie logs --verify --attempt 1` shows of the first check.
const FAILURE: &str = "FAILED test_add: add 2 2 gave 0, expected 4";

/// A task `label` of agent `agent` on `model`, in the failing repository `label/`, isolated in
/// a worktree, checked by `sh test.sh` with one feedback round.
fn task(s: &Scratch, label: &str, agent: &str, model: &str) -> (String, PathBuf) {
    let repo = failing_repo(s, label);
    let text = format!(
        "[[tasks]]\nlabel = \"{label}\"\nagent = \"{agent}\"\nmodel = \"{model}\"\n\
         cwd = \"{label}\"\nisolation = \"worktree\"\nprompt = \"{PROMPT}\"\n\
         verify = \"sh test.sh\"\nverify_rounds = 1\n\n"
    );
    (text, repo)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// (input, output, cache_read) of a usage object.
fn tokens(u: &Value) -> (u64, u64, u64) {
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    (n("input"), n("output"), n("cache_read"))
}

fn sum(parts: impl Iterator<Item = (u64, u64, u64)>) -> (u64, u64, u64) {
    parts.fold((0, 0, 0), |(i, o, c), (a, b, d)| (i + a, o + b, c + d))
}

/// Asserts that task number `task` (label `label`, its repository `repo`) was verified after
/// one feedback round that continued its conversation with the check's failure, as the mock
/// saw it (`served`: its requests for the task's model), and that its usage is theirs.
fn assert_verified(
    s: &Scratch,
    run: &str,
    events: &[Value],
    (task, label, repo): (u64, &str, &PathBuf),
    served: &[&Value],
) {
    // The mock: a plain answer, then (the feedback round) the fix and the answer to its result.
    let kinds: Vec<&str> = served.iter().filter_map(|r| r["served"].as_str()).collect();
    assert_eq!(
        kinds,
        ["looked", "fix_call", "fixed"],
        "{label}: {served:?}"
    );
    assert_eq!(served[0]["has_failure"], false, "{label}: {served:?}");
    let round = served[1];
    assert_eq!(
        (round["continues"].as_bool(), round["has_failure"].as_bool()),
        (Some(true), Some(true)),
        "{label}: the feedback round continues the conversation with the failure: {round}"
    );
    let users: Vec<&str> = round["user_texts"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        users.iter().any(|t| t.contains(PROMPT))
            && users
                .last()
                .is_some_and(|t| t.contains("The check of your work failed.")),
        "{label}: the earlier turns, then the feedback message: {users:?}"
    );

    // Two attempts (the checked one and the feedback round), both completed.
    let finished = events.of(task, "AttemptFinished");
    let states: Vec<&Value> = finished.iter().map(|b| &b["outcome"]["status"]).collect();
    assert_eq!(states, ["completed", "completed"], "{label}: {finished:?}");

    // What a user sees: completed, verified after one round.
    let status = s.status(run);
    let t = task_view(&status, label);
    assert_eq!(t["state"], "completed", "{label}: {t}");
    assert_eq!(t["verify"]["passed"], true, "{label}: {t}");
    assert_eq!(t["verify"]["rounds"], 1, "{label}: {t}");

    // Both rounds' usage, once: the task's is the sum of what the mock served it.
    let served_sum = sum(served.iter().map(|r| tokens(&r["tokens"])));
    assert_eq!(
        tokens(&t["usage"]),
        served_sum,
        "{label}: {t} vs {served:?}"
    );
    let journaled = sum(finished.iter().map(|b| tokens(&b["usage"])));
    assert_eq!(journaled, served_sum, "{label}: {finished:?}");

    // The fix is in the kept worktree's diff; the repository's checkout is untouched.
    let diff = s.run_ok(&["diff", run, label]);
    assert!(
        text(&diff.stdout).contains("+add() { echo $(( $1 + $2 )); }"),
        "{label}: {}",
        text(&diff.stdout)
    );
    let calc = std::fs::read_to_string(repo.join("calc.sh")).expect("calc.sh");
    assert!(calc.contains("$1 - $2"), "{label}: {calc}");

    // The first check's failure is kept; the last check passed.
    let first = s.run_ok(&["logs", run, label, "--verify", "--attempt", "1"]);
    assert!(
        text(&first.stdout).contains(FAILURE),
        "{label}: {}",
        text(&first.stdout)
    );
    let last = s.run_ok(&["logs", run, label, "--verify"]);
    assert!(
        text(&last.stdout).contains("1 passed"),
        "{label}: {}",
        text(&last.stdout)
    );
}

/// The run's ledger total (audited clean) is the sum of everything the mock served.
fn assert_ledger(s: &Scratch, run: &str, served: &[Value]) {
    let audit = s.audit_clean(run);
    let total = &audit["ledger"]["total"];
    let served_sum = sum(served.iter().map(|r| tokens(&r["tokens"])));
    assert_eq!(tokens(total), served_sum, "audit: {audit}");
}

#[test]
fn real_pi_fixes_the_code_in_a_feedback_round_continuing_its_session_json_and_rpc() {
    if !should_run("real_pi_verify", pi_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::openai(s.path(), &[("json", "verify"), ("rpc", "verify")]);
    let home = s.path().join("home");
    pi_user(&home, mock.port, &["json", "rpc"]);
    let (json, json_repo) = task(&s, "json", "pi", "mock/json");
    let (rpc, rpc_repo) = task(&s, "rpc", "pi-rpc", "mock/rpc");
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 2\n\n[defaults]\nmax_retries = 0\nattempt_timeout = \"3m\"\n\n\
             {json}{rpc}"
        ),
    );
    let run = unique_run("real-pi-verify");
    let (out, stderr) = run_as_user(&s, &home, PI_VARS, &run, &batch);
    let said = format!("{}{stderr}", text(&out.stdout));
    assert_eq!(out.status.code(), Some(0), "sortie run: {said}");
    assert!(said.contains("verified after 1 round"), "{said}");

    let events = s.events(&run);
    let served = mock.served();
    assert_eq!(served.len(), 6, "three requests per task: {served:?}");
    for (task, label, repo) in [(0, "json", &json_repo), (1, "rpc", &rpc_repo)] {
        let of: Vec<&Value> = served.iter().filter(|r| r["model"] == label).collect();
        assert_verified(&s, &run, &events, (task, label, repo), &of);
    }
    assert_ledger(&s, &run, &served);
}

#[test]
fn real_claude_fixes_the_code_in_a_feedback_round_resuming_its_session() {
    if !should_run("real_claude_verify", claude_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::anthropic(s.path(), &[("fixer", "verify")]);
    let home = s.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir home");
    let (fix, repo) = task(&s, "fix", "claude", "fixer");
    let batch = s.write(
        "batch.toml",
        &format!("[defaults]\nmax_retries = 0\nattempt_timeout = \"3m\"\n\n{fix}"),
    );
    let run = unique_run("real-claude-verify");
    let mut cmd = s.sortie();
    mock.claude_env(&mut cmd, &home);
    cmd.args(["run", "--run-id", &run])
        .arg(&batch)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = Background::from_command(cmd, &run).finish(600);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "sortie run: {said}");
    assert!(said.contains("verified after 1 round"), "{said}");

    let events = s.events(&run);
    let served = mock.served();
    let of: Vec<&Value> = served.iter().filter(|r| r["model"] == "fixer").collect();
    assert_eq!(of.len(), 3, "three requests: {served:?}");
    assert_verified(&s, &run, &events, (0, "fix", &repo), &of);
    assert_ledger(&s, &run, &served);
}
