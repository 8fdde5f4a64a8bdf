//! The real Codex CLI (`@openai/codex` 0.171.0, installed by `.ci/run`) under sortie's built-in
//! `codex` profile, against the project's loopback mock of the Responses API
//! (`tests/mock-llm/codex_server.py`, on 127.0.0.1): the fake user's only provider is the mock,
//! and the agent home turns off Codex's update check, analytics and plugin sync.
//!
//! One batch, three tasks at concurrency 3, so several Codex processes run at once, each with
//! its own `CODEX_HOME` seeded from a fake user's `~/.codex` (whose provider keeps Codex's
//! retries *on*, and which sets no sandbox):
//! - `plain`: a plain answer → completed, the text is the mock's answer;
//! - `tool`: an `exec_command` call (`echo hi > out.txt`), then an answer → completed, side
//!   effects recorded, `out.txt` written in the task's cwd (the home's `workspace-write`);
//! - `fallback`: model `bad` answers HTTP 500 every time → attempt 1 fails with `error` after a
//!   single request (Codex's own 30 requests are off), attempt 2 on the fallback `good`
//!   completes.
//!
//! The journal's tokens equal what the mock served (input without the cached tokens), and the
//! cost is unreported: Codex reports none, and sortie has no price for the mock's models. A
//! second test prices one (`[prices."good"]`): the priced cost binds the run's `max_cost` (#37).
//!
//! Without Codex 0.171.0 (or python3) the test is skipped, saying why, unless `CI` is set: then
//! it fails (`sortie_testkit::real_agent`). When it runs it leaves a cookie in
//! `target/real-agent-tests/`.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sortie_testkit::real_agent::{MockServer, attempts, codex_found, codex_user, should_run};

use crate::support::{Scratch, event_kind, run_as_user, unique_run};
use sortie_testkit::Events;

const HELLO: &str = "Hello from the mock LLM. Task complete.";
const DONE: &str = "Done: I ran the command and wrote out.txt.";

/// Token counts as the ledger keeps them: (input without cache, output, cache_read).
fn tokens(v: &Value) -> [u64; 3] {
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
    [n("input"), n("output"), n("cache_read")]
}

/// The same for a usage the mock served (OpenAI's: input includes the cached tokens).
fn served_tokens(u: &Value) -> [u64; 3] {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let cached = n(&u["input_tokens_details"]["cached_tokens"]);
    [
        n(&u["input_tokens"]) - cached,
        n(&u["output_tokens"]),
        cached,
    ]
}

#[test]
fn real_codex_answers_runs_a_command_and_falls_back_at_once_with_tokens_as_served() {
    if !should_run("real_codex", codex_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::responses(
        s.path(),
        &[("good", "ok"), ("tool", "tool"), ("bad", "error500")],
    );
    let home = s.path().join("home");
    let user_codex = codex_user(&home, mock.port);
    let user_config = std::fs::read_to_string(user_codex.join("config.toml")).expect("config");
    for dir in ["work/plain", "work/tool", "work/fallback"] {
        std::fs::create_dir_all(s.path().join(dir)).expect("mkdir");
    }
    let run = unique_run("real-codex");
    let batch = s.write(
        "batch.toml",
        "concurrency = 3\n\n\
         [defaults]\nagent = \"codex\"\nmax_retries = 1\nattempt_timeout = \"2m\"\n\
         env = { MOCK_API_KEY = \"mock-key\" }\n\n\
         [[tasks]]\nlabel = \"plain\"\ncwd = \"work/plain\"\nmodel = \"good\"\n\
         prompt = \"Say hello.\"\n\n\
         [[tasks]]\nlabel = \"tool\"\ncwd = \"work/tool\"\nmodel = \"tool\"\n\
         prompt = \"Write hi into out.txt.\"\n\n\
         [[tasks]]\nlabel = \"fallback\"\ncwd = \"work/fallback\"\nmodel = \"bad\"\n\
         fallback_models = [\"good\"]\nprompt = \"Say hello.\"\n",
    );
    let started = std::time::Instant::now();
    let (out, stderr) = run_as_user(&s, &home, &["CODEX_HOME"], &run, &batch);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "sortie run: {stderr}");

    let events = s.events(&run);
    let plain = attempts(&events, 0);
    assert_eq!(plain.len(), 1, "{plain:?}");
    assert_eq!(
        (plain[0].status.as_str(), plain[0].stop_reason.as_str()),
        ("completed", "completed")
    );
    assert_eq!(plain[0].output, HELLO);

    let tool = attempts(&events, 1);
    assert_eq!(tool.len(), 1, "{tool:?}");
    assert_eq!(tool[0].status, "completed", "{tool:?}");
    assert_eq!(tool[0].output, DONE);
    let finished = events.of(1, "AttemptFinished");
    assert_eq!(finished[0]["outcome"]["side_effects"], true);
    assert_eq!(
        std::fs::read_to_string(s.path().join("work/tool/out.txt")).expect("out.txt"),
        "hi\n",
        "the command ran in the task's cwd, writable"
    );

    let fb = attempts(&events, 2);
    assert_eq!(fb.len(), 2, "{fb:?}");
    assert_eq!(
        (
            fb[0].model.as_str(),
            fb[0].status.as_str(),
            fb[0].stop_reason.as_str()
        ),
        ("bad", "failed", "error"),
        "{fb:?}"
    );
    assert!(fb[0].error.contains("high demand"), "{fb:?}");
    assert_eq!(
        (fb[1].model.as_str(), fb[1].status.as_str()),
        ("good", "completed")
    );
    assert_eq!(fb[1].output, HELLO);

    // Codex's own retries were off: one request to the failing model.
    let served = mock.served();
    let requests = |model: &str| served.iter().filter(|r| r["model"] == model).count();
    assert_eq!(requests("bad"), 1, "Codex retried on its own: {served:?}");
    assert_eq!(requests("tool"), 2);
    assert_eq!(requests("good"), 2);

    // Each attempt had its own CODEX_HOME: the user's config with retries off and sortie's
    // defaults, no session of the user's carried over; its own session files are kept in its
    // conversation's store under the run dir (`sessions` links there), so that a retry after
    // a crash, or a session's next task, resumes them.
    let agents = s.state_dir().join("runs").join(&run).join("agents");
    let mut homes: Vec<String> = std::fs::read_dir(&agents)
        .expect("the run has agent homes")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    homes.sort();
    assert_eq!(homes, ["0.1", "1.1", "2.1", "2.2"]);
    for h in &homes {
        let dir = agents.join(h);
        let config = std::fs::read_to_string(dir.join("config.toml")).expect("config.toml");
        for line in [
            "[model_providers.mock]",
            "request_max_retries = 0",
            "stream_max_retries = 0",
            "sandbox_mode = \"workspace-write\"",
            "plugins = false",
            "approval_policy = \"never\"",
        ] {
            assert!(
                config.lines().any(|l| l.trim() == line),
                "{h}: no {line:?} in\n{config}"
            );
        }
        assert!(!config.contains("request_max_retries = 4"), "{h}");
        let sessions = dir.join("sessions");
        let task = h.split('.').next().expect("<task>.<attempt>");
        let store = s
            .state_dir()
            .join("runs")
            .join(&run)
            .join("conversations")
            .join(task);
        assert_eq!(
            std::fs::read_link(&sessions).expect("sessions is a link"),
            store,
            "{h}"
        );
        let session_files = walk_files(&sessions);
        assert!(!session_files.is_empty(), "{h}: the attempt's own rollout");
        assert!(
            session_files
                .iter()
                .all(|f| f.to_string_lossy().contains("rollout-")),
            "{h}: only Codex's own rollouts, none of the user's: {session_files:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(user_codex.join("config.toml")).expect("config"),
        user_config,
        "the user's config is only read"
    );
    assert_eq!(
        walk_files(&user_codex.join("sessions")).len(),
        1,
        "the user's sessions"
    );

    // The journal's tokens are what the mock served; the cost is unreported, never 0.
    let mut served_total = [0u64; 3];
    for r in &served {
        if !r["usage"].is_null() {
            for (t, v) in served_total.iter_mut().zip(served_tokens(&r["usage"])) {
                *t += v;
            }
        }
    }
    let audit = s.audit_clean(&run);
    let ledger = &audit["ledger"];
    assert_eq!(tokens(&ledger["total"]), served_total, "audit: {ledger}");
    assert_eq!(ledger["total"]["cost"]["nanos"], 0, "{ledger}");
    assert!(
        ledger["total"]["cost"]["unreported"].as_u64() >= Some(4),
        "every attempt's cost is unreported: {ledger}"
    );
    let mut turns = 0;
    for e in &events {
        if let ("AttemptFinished", b) = event_kind(e) {
            turns += b["usage"]["turns"].as_u64().expect("turns");
        }
    }
    // 1 (plain) + 2 (tool: the command, then the answer) + 1 + 1 (fallback).
    assert_eq!(turns, 5);
    println!(
        "served {served_total:?} ({} requests); took {took:?}",
        served.len()
    );
}

/// Every file under `dir` (none when it does not exist).
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Permissions reach Codex as its sandbox: under `read-only` the same `echo hi > out.txt`
/// writes nothing, under `edit` it writes `out.txt` in the task's cwd; and a prompt of 1 MiB
/// (Codex's own limit is 1 MiB of characters) reaches the model whole, on stdin.
#[test]
fn real_codex_read_only_cannot_write_edit_can_and_a_1_mib_prompt_arrives() {
    if !should_run("real_codex_permissions", codex_found()) {
        return;
    }
    let s = Scratch::new();
    // One model per tool task: the mock counts its steps per model.
    let mock = MockServer::responses(
        s.path(),
        &[("good", "ok"), ("tool", "tool"), ("tool2", "tool")],
    );
    let home = s.path().join("home");
    codex_user(&home, mock.port);
    for dir in ["work/ro", "work/edit", "work/big"] {
        std::fs::create_dir_all(s.path().join(dir)).expect("mkdir");
    }
    let mib = 1 << 20;
    let big = format!("Say hello. {}", "x".repeat(mib - "Say hello. ".len()));
    let run = unique_run("real-codex-perm");
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 3\n\n\
             [defaults]\nagent = \"codex\"\nmax_retries = 0\nattempt_timeout = \"2m\"\n\
             env = {{ MOCK_API_KEY = \"mock-key\" }}\n\n\
             [[tasks]]\nlabel = \"ro\"\ncwd = \"work/ro\"\nmodel = \"tool\"\n\
             permissions = \"read-only\"\nprompt = \"Write hi into out.txt.\"\n\n\
             [[tasks]]\nlabel = \"edit\"\ncwd = \"work/edit\"\nmodel = \"tool2\"\n\
             permissions = \"edit\"\nprompt = \"Write hi into out.txt.\"\n\n\
             [[tasks]]\nlabel = \"big\"\ncwd = \"work/big\"\nmodel = \"good\"\n\
             prompt = \"{big}\"\n"
        ),
    );
    let (_, stderr) = run_as_user(&s, &home, &["CODEX_HOME"], &run, &batch);
    let events = s.events(&run);
    assert!(
        !s.path().join("work/ro/out.txt").exists(),
        "read-only wrote a file: {:?}",
        attempts(&events, 0)
    );
    assert_eq!(
        std::fs::read_to_string(s.path().join("work/edit/out.txt")).expect("out.txt"),
        "hi\n",
        "edit writes in the task's cwd: {:?}",
        attempts(&events, 1)
    );
    let launched: Vec<Value> = events
        .of(2, "AttemptFinished")
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(launched.len(), 1, "{stderr}");
    assert_eq!(
        launched[0]["outcome"]["status"], "completed",
        "{launched:?}"
    );
    assert_eq!(launched[0]["output"], HELLO);
    let served = mock.served();
    // The read-only task's command was asked for (a tool call, then the answer after it).
    let tool_requests = served.iter().filter(|r| r["model"] == "tool").count();
    assert_eq!(tool_requests, 2, "{served:?}");
    let longest = served
        .iter()
        .filter(|r| r["model"] == "good")
        .map(|r| r["body"].to_string().len())
        .max()
        .unwrap_or(0);
    assert!(
        longest > mib,
        "the 1 MiB prompt did not reach the mock: {longest} bytes"
    );
}

/// #37: the real Codex reports tokens but no cost; priced by the batch's `[prices]`, its cost
/// binds the run's `max_cost`: the first task's priced cost passes it, so the task that needs
/// it never starts (ends `cancelled`, stop reason `budget`), and the journal holds the priced
/// cost (nothing unreported) that the summary marks `*`.
#[test]
fn real_codex_a_priced_cost_binds_the_runs_max_cost() {
    if !should_run("real_codex", codex_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::responses(s.path(), &[("good", "ok")]);
    let home = s.path().join("home");
    codex_user(&home, mock.port);
    std::fs::create_dir_all(s.path().join("work")).expect("mkdir");
    let run = unique_run("real-codex-priced");
    let batch = s.write(
        "batch.toml",
        "[budget]\nmax_cost = 0.0001\n\n\
         [prices.\"good\"]\ninput = 1000\noutput = 1000\ncache_read = 1000\n\n\
         [defaults]\nagent = \"codex\"\nmodel = \"good\"\ncwd = \"work\"\nmax_retries = 0\n\
         attempt_timeout = \"2m\"\nenv = { MOCK_API_KEY = \"mock-key\" }\n\n\
         [[tasks]]\nlabel = \"first\"\nprompt = \"Say hello.\"\n\n\
         [[tasks]]\nlabel = \"second\"\nprompt = \"Say hello again.\"\nneeds = [\"first\"]\n",
    );
    let (out, stderr) = run_as_user(&s, &home, &["CODEX_HOME"], &run, &batch);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let events = s.events(&run);
    let exceeded = events
        .iter()
        .find_map(|e| e["event"].get("RunBudgetExceeded"))
        .unwrap_or_else(|| panic!("the run's budget ran out: {stderr}"));
    assert_eq!(exceeded["limit"], "cost", "{exceeded}");
    let second = &events.of(1, "TaskFinished")[0]["result"];
    assert_eq!(
        (second["state"].as_str(), second["stop_reason"].as_str()),
        (Some("cancelled"), Some("budget")),
        "{second}"
    );
    assert!(events.of(1, "AttemptLaunching").is_empty(), "never started");
    let audit = s.audit_clean(&run);
    let cost = &audit["ledger"]["total"]["cost"];
    assert_eq!(cost["unreported"], 0, "priced, not unreported: {cost}");
    assert!(cost["nanos"].as_u64() > Some(100_000), "{cost}");
    assert!(stdout.contains("cost priced by sortie"), "{stdout}");
}
