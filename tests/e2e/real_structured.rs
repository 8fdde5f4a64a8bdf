//! Structured results (issue 13) with the real Claude Code 2.1.332, pi 0.73.1 and Codex
//! 0.171.0, each against the project's loopback mock of its API (127.0.0.1 only). Every mock
//! serves the `structured` scenario of `tests/mock-llm/repair.py`: a result that does not match
//! the task's schema first (`{"answer": "forty-two"}`), and the right one only to a request
//! that continues the same conversation (its earlier assistant turn holds the wrong answer)
//! AND carries sortie's validation error. So a task that ends `completed` with
//! `{"answer": 42}` proves the ONE repair round reached the agent in its own session: Claude
//! Code's `--continue`, pi's `--session FILE` (pi-json) or a new RPC prompt (pi-rpc), `codex
//! exec resume --last`.
//!
//! Each test also checks what a user sees: one attempt, its usage the sum of both requests
//! as the mock served them, the value in `status --json` and `sortie results --jsonl`, and a
//! later task's prompt carrying it through `{outputs.LABEL.json}`. pi's also shows a
//! `stubborn` model whose repair does not help: the task ends `partial` with the validation
//! error, after exactly two requests.
//!
//! Without the CLIs (or python3) the tests are skipped, saying why, unless `CI` is set: then
//! they fail (`sortie_testkit::real_agent`).

use std::path::Path;
use std::process::Stdio;

use serde_json::{Value, json};
use sortie_testkit::real_agent::{
    MockServer, claude_found, codex_found, codex_user, pi_found, pi_user, should_run,
};

use crate::support::{Background, Scratch, task_view, unique_run};
use sortie_testkit::Events;

const SCHEMA: &str =
    r#"{"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}"#;

/// Runs `batch` as run `run` with the environment `env`, and returns its journal's events.
fn run_batch(s: &Scratch, run: &str, batch: &Path, env: &[(&str, &str)], code: i32) -> Vec<Value> {
    let mut cmd = s.sortie();
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.env_remove("PI_CODING_AGENT_DIR")
        .env_remove("PI_CODING_AGENT_SESSION_DIR")
        .env_remove("CLAUDE_CONFIG_DIR")
        .env_remove("CODEX_HOME")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .args(["run", "--run-id", run])
        .arg(batch)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = Background::from_command(cmd, run).finish(600);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "sortie run: {stdout}\n{stderr}"
    );
    s.events(run)
}

/// Asserts that task number `task` (label `label`) made one attempt that completed with
/// `{"answer": 42}` after the repair round, that its usage is the sum of the `tokens` the
/// mock served for `model` (two requests: the wrong answer, then the repaired one, which
/// continued the conversation and carried the error), and that `status --json` and
/// `sortie results --jsonl` show the value.
fn assert_repaired(
    s: &Scratch,
    run: &str,
    events: &[Value],
    task: usize,
    label: &str,
    served: &[&Value],
) {
    let finished = events.of(task as u64, "AttemptFinished");
    assert_eq!(
        finished.len(),
        1,
        "the repair round is the same attempt: {finished:?}"
    );
    let outcome = &finished[0]["outcome"];
    assert_eq!(outcome["status"], "completed", "{label}: {outcome}");
    assert_eq!(outcome["result"], r#"{"answer":42}"#, "{label}: {outcome}");
    assert!(
        finished[0]["output"]
            .as_str()
            .is_some_and(|o| o.contains("```json:result\n{\"answer\": 42}")),
        "{label}: the repaired answer is the output: {}",
        finished[0]["output"]
    );
    let kinds: Vec<&str> = served.iter().filter_map(|r| r["served"].as_str()).collect();
    assert_eq!(kinds, ["bad_result", "good_result"], "{label}: {served:?}");
    let sum = |key: &str| -> u64 {
        served
            .iter()
            .map(|r| r["tokens"][key].as_u64().unwrap_or(0))
            .sum()
    };
    let usage = &finished[0]["usage"];
    for (ours, theirs) in [
        ("input", "input"),
        ("output", "output"),
        ("cache_read", "cache_read"),
    ] {
        assert_eq!(
            usage[ours].as_u64(),
            Some(sum(theirs)),
            "{label} {ours}: {usage} vs {served:?}"
        );
    }
    let status = s.status(run);
    assert_eq!(task_view(&status, label)["result"], json!({"answer": 42}));
    let results = s.run_ok(&["results", run, "--jsonl"]);
    let record: Value = String::from_utf8_lossy(&results.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON Lines"))
        .find(|r| r["label"] == label)
        .unwrap_or_else(|| panic!("no record of {label}"));
    assert_eq!(
        (&record["state"], &record["value"]),
        (&json!("completed"), &json!({"answer": 42}))
    );
}

/// The prompt the first attempt of task number `task` read on stdin.
fn prompt_of(s: &Scratch, run: &str, task: usize) -> String {
    let path = s
        .state_dir()
        .join("runs")
        .join(run)
        .join(format!("prompts/{task}.1"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn real_claude_repairs_a_structured_result_once_in_its_session() {
    let found = claude_found();
    if !should_run("real_claude_structured", found) {
        return;
    }
    let s = Scratch::new();
    let args: Vec<String> = ["--model", "s=structured", "--model", "good=answer"]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
    let mock = MockServer::start(s.path(), "anthropic_server.py", &args);
    let home = s.path().join("home");
    std::fs::create_dir_all(s.path().join("work")).expect("mkdir");
    std::fs::create_dir_all(&home).expect("mkdir home");
    std::fs::create_dir_all(s.path().join("schemas")).expect("mkdir");
    s.write("schemas/answer.json", SCHEMA);
    let batch = s.write(
        "batch.toml",
        "[defaults]\nagent = \"claude\"\nmax_retries = 0\nattempt_timeout = \"3m\"\ncwd = \"work\"\n\n\
         [[tasks]]\nlabel = \"count\"\nmodel = \"s\"\noutput_schema = \"schemas/answer.json\"\n\
         prompt = \"What is six times seven?\"\n\n\
         [[tasks]]\nlabel = \"report\"\nmodel = \"good\"\nneeds = [\"count\"]\n\
         prompt = \"Report {outputs.count.json}.\"\n",
    );
    let run = unique_run("real-claude-structured");
    let base = format!("http://127.0.0.1:{}", mock.port);
    let env = [
        ("HOME", home.to_str().expect("utf-8")),
        ("ANTHROPIC_BASE_URL", base.as_str()),
        ("ANTHROPIC_API_KEY", "mock-key"),
    ];
    let events = run_batch(&s, &run, &batch, &env, 0);
    let served = mock.served();
    let of_s: Vec<&Value> = served.iter().filter(|r| r["model"] == "s").collect();
    assert_eq!(
        (
            of_s[1]["continues"].as_bool(),
            of_s[1]["has_error"].as_bool()
        ),
        (Some(true), Some(true)),
        "{of_s:?}"
    );
    assert_repaired(&s, &run, &events, 0, "count", &of_s);
    assert_eq!(prompt_of(&s, &run, 1), "Report {\"answer\":42}.");
    s.audit_clean(&run);
}

#[test]
fn real_pi_repairs_a_structured_result_by_its_session_or_over_rpc_and_a_stubborn_one_is_partial() {
    let found = pi_found();
    if !should_run("real_pi_structured", found) {
        return;
    }
    let s = Scratch::new();
    let args: Vec<String> = [
        "--model",
        "json=structured",
        "--model",
        "rpc=structured",
        "--model",
        "stubborn=stubborn",
        "--model",
        "good=answer",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    let mock = MockServer::start(s.path(), "server.py", &args);
    let home = s.path().join("home");
    pi_user(&home, mock.port, &["json", "rpc", "stubborn", "good"]);
    for dir in ["work/json", "work/rpc", "work/stubborn", "work/report"] {
        std::fs::create_dir_all(s.path().join(dir)).expect("mkdir");
    }
    let schema = "output_schema = { type = \"object\", required = [\"answer\"], \
                  properties = { answer = { type = \"integer\" } } }";
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 3\n\n\
             [defaults]\nmax_retries = 0\nattempt_timeout = \"3m\"\n\n\
             [[tasks]]\nlabel = \"json\"\nagent = \"pi\"\ncwd = \"work/json\"\nmodel = \"mock/json\"\n\
             {schema}\nprompt = \"What is six times seven?\"\n\n\
             [[tasks]]\nlabel = \"rpc\"\nagent = \"pi-rpc\"\ncwd = \"work/rpc\"\nmodel = \"mock/rpc\"\n\
             {schema}\nprompt = \"What is six times seven?\"\n\n\
             [[tasks]]\nlabel = \"stubborn\"\nagent = \"pi\"\ncwd = \"work/stubborn\"\n\
             model = \"mock/stubborn\"\n{schema}\nprompt = \"What is six times seven?\"\n\n\
             [[tasks]]\nlabel = \"report\"\nagent = \"pi\"\ncwd = \"work/report\"\nmodel = \"mock/good\"\n\
             needs = [\"json\", \"rpc\"]\nprompt = \"Report {{outputs.json.json}} and {{outputs.rpc.json}}.\"\n"
        ),
    );
    let run = unique_run("real-pi-structured");
    let env = [("HOME", home.to_str().expect("utf-8"))];
    let events = run_batch(&s, &run, &batch, &env, 1);
    let served = mock.served();
    let of =
        |model: &str| -> Vec<&Value> { served.iter().filter(|r| r["model"] == model).collect() };
    for (task, label) in [(0, "json"), (1, "rpc")] {
        let reqs = of(label);
        assert_eq!(
            (
                reqs[1]["continues"].as_bool(),
                reqs[1]["has_error"].as_bool()
            ),
            (Some(true), Some(true)),
            "{reqs:?}"
        );
        assert_repaired(&s, &run, &events, task, label, &reqs);
    }
    // pi-rpc was steered: one process, no repair prompt file; pi-json ran again on its session.
    let prompts = s.state_dir().join("runs").join(&run).join("prompts");
    assert!(
        prompts.join("0.1.repair").is_file(),
        "pi-json's repair run read its request"
    );
    assert!(
        !prompts.join("1.1.repair").exists(),
        "pi-rpc was steered, not run again"
    );

    // stubborn: the repair round reached it (same session, the error) and did not help.
    let reqs = of("stubborn");
    let kinds: Vec<&str> = reqs.iter().filter_map(|r| r["served"].as_str()).collect();
    assert_eq!(
        kinds,
        ["bad_result", "unrepaired"],
        "one repair round only: {reqs:?}"
    );
    assert_eq!(reqs[1]["continues"], true, "{reqs:?}");
    let finished = events.of(2, "AttemptFinished");
    assert_eq!(
        finished.len(),
        1,
        "a wrong result is not retried: {finished:?}"
    );
    let outcome = &finished[0]["outcome"];
    assert_eq!(outcome["status"], "partial", "{outcome}");
    assert_eq!(outcome["result"], Value::Null, "{outcome}");
    let error = outcome["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("structured result: the result does not match the schema: at /answer: ")
            && error.contains("(after the repair round;"),
        "{error}"
    );
    let status = s.status(&run);
    assert_eq!(task_view(&status, "stubborn")["state"], "partial");

    assert_eq!(
        prompt_of(&s, &run, 3),
        "Report {\"answer\":42} and {\"answer\":42}."
    );
    s.audit_clean(&run);
}

#[test]
fn real_codex_repairs_a_structured_result_by_resuming_its_session_in_its_sandbox() {
    let found = codex_found();
    if !should_run("real_codex_structured", found) {
        return;
    }
    let s = Scratch::new();
    let args: Vec<String> = ["--print-port", "--model-scenario", "s=structured"]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
    let mock = MockServer::start(s.path(), "codex_server.py", &args);
    let home = s.path().join("home");
    codex_user(&home, mock.port);
    std::fs::create_dir_all(s.path().join("work")).expect("mkdir");
    s.write("schema.json", SCHEMA);
    let batch = s.write(
        "batch.toml",
        "[defaults]\nagent = \"codex\"\nmax_retries = 0\nattempt_timeout = \"3m\"\n\
         env = { MOCK_API_KEY = \"mock-key\" }\n\n\
         [[tasks]]\nlabel = \"count\"\ncwd = \"work\"\nmodel = \"s\"\npermissions = \"read-only\"\n\
         output_schema = \"schema.json\"\nprompt = \"What is six times seven?\"\n",
    );
    let run = unique_run("real-codex-structured");
    let env = [("HOME", home.to_str().expect("utf-8"))];
    let events = run_batch(&s, &run, &batch, &env, 0);
    let served = mock.served();
    let of_s: Vec<&Value> = served.iter().filter(|r| r["model"] == "s").collect();
    // Codex's usage: the mock's, as Codex reports it (input includes the cached tokens).
    let tokens: Vec<Value> = of_s
        .iter()
        .map(|r| {
            let u = &r["usage"];
            let cached = u["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            json!({"input": u["input_tokens"].as_u64().unwrap_or(0) - cached,
                   "output": u["output_tokens"], "cache_read": cached})
        })
        .collect();
    let with_tokens: Vec<Value> = of_s
        .iter()
        .zip(&tokens)
        .map(|(r, t)| json!({"served": r["served"], "tokens": t}))
        .collect();
    let refs: Vec<&Value> = with_tokens.iter().collect();
    assert_eq!(
        (
            of_s[1]["checks"]["continues"].as_bool(),
            of_s[1]["checks"]["has_error"].as_bool()
        ),
        (Some(true), Some(true)),
        "{:?}",
        of_s.iter().map(|r| &r["checks"]).collect::<Vec<_>>()
    );
    // The resumed session kept the task's sandbox.
    for r in &of_s {
        let body = r["body"].to_string();
        assert!(
            body.contains("read-only") && !body.contains("workspace-write"),
            "a request outside the read-only sandbox"
        );
    }
    assert_repaired(&s, &run, &events, 0, "count", &refs);
    s.audit_clean(&run);
}
