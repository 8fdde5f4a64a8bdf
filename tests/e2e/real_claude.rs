//! The real Claude Code (`@anthropic-ai/claude-code` 2.1.332, installed by `.ci/run`) under
//! sortie, against the project's loopback mock of the Anthropic Messages API
//! (`tests/mock-llm/anthropic_server.py`, on 127.0.0.1): nothing contacts a model provider
//! (`ANTHROPIC_BASE_URL` is the mock, the key is a dummy, and the agent home sortie gives each
//! attempt turns Claude Code's update checks, telemetry, error reports and other start-up
//! traffic off).
//!
//! One batch, at concurrency 3:
//! - `answer`: a plain answer → completed, the mock's text; its `system_prompt` reaches the
//!   model at the end of Claude Code's own (`--append-system-prompt`);
//! - `tool`: a `Bash` tool call (`echo hi > out.txt`) in a task isolated in a git worktree,
//!   with the default permissions (`edit`) → completed, `out.txt` written in the worktree
//!   (kept, its patch adds it), the repository's own checkout untouched;
//! - `denied`: the same tool call under `permissions = "read-only"` → Claude Code denies it
//!   (its result's `permission_denials`), the attempt ends `partial` with the denial journaled
//!   (`Bash`, 1) and shown by `status`, and no file is written;
//! - `fallback`: HTTP 500 → attempt 1 fails `error` after one request (Claude Code's own
//!   retries are off), attempt 2 on the fallback model completes;
//! - `stall`: headers, then silence → the stall watchdog stops attempt 1 (`stalled`), attempt 2
//!   on the fallback completes;
//! - `big`: a 1 MiB prompt reaches the model whole (on stdin: no argv limit).
//!
//! Without Claude Code 2.1.332 (or python3) the test is skipped, saying why, unless `CI` is
//! set: then it fails (`sortie_testkit::real_agent`).

use std::path::PathBuf;
use std::process::Stdio;

use serde_json::Value;

use sortie_testkit::git;
use sortie_testkit::real_agent::{ANSWER, MockServer, attempts, claude_found, should_run};

use crate::support::{Background, Scratch, task_view, unique_run};
use sortie_testkit::Events;

const MIB: usize = 1 << 20;

#[test]
fn real_claude_answers_edits_its_worktree_is_denied_read_only_falls_back_stalls_and_takes_1_mib() {
    if !should_run("real_claude", claude_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::anthropic(
        s.path(),
        &[
            ("good", "answer"),
            ("tool", "tool"),
            ("bad", "error500"),
            ("hang", "hang"),
        ],
    );
    let home = s.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir home");
    let repo = s.path().join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir repo");
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("README"), "base\n").expect("write");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "initial"]);
    for dir in [
        "work/answer",
        "work/denied",
        "work/fallback",
        "work/stall",
        "work/big",
    ] {
        std::fs::create_dir_all(s.path().join(dir)).expect("mkdir");
    }
    let big = format!("Say hello. {}", "x".repeat(MIB - "Say hello. ".len()));
    let run = unique_run("real-claude");
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 3\n\n\
             [defaults]\nagent = \"claude\"\nmax_retries = 1\nattempt_timeout = \"3m\"\n\n\
             [[tasks]]\nlabel = \"answer\"\ncwd = \"work/answer\"\nmodel = \"good\"\n\
             system_prompt = \"Answer like a pirate.\"\nthinking = \"high\"\n\
             prompt = \"Say hello.\"\n\n\
             [[tasks]]\nlabel = \"tool\"\ncwd = \"repo\"\nisolation = \"worktree\"\n\
             model = \"tool\"\nprompt = \"Write hi into out.txt.\"\n\n\
             [[tasks]]\nlabel = \"denied\"\ncwd = \"work/denied\"\nmodel = \"tool\"\n\
             permissions = \"read-only\"\nprompt = \"Write hi into out.txt.\"\n\n\
             [[tasks]]\nlabel = \"fallback\"\ncwd = \"work/fallback\"\nmodel = \"bad\"\n\
             fallback_models = [\"good\"]\nprompt = \"Say hello.\"\n\n\
             [[tasks]]\nlabel = \"stall\"\ncwd = \"work/stall\"\nmodel = \"hang\"\n\
             fallback_models = [\"good\"]\nstall_after = \"20s\"\nstall_kill_after = \"10s\"\n\
             prompt = \"Say hello.\"\n\n\
             [[tasks]]\nlabel = \"big\"\ncwd = \"work/big\"\nmodel = \"good\"\n\
             prompt = \"{big}\"\n"
        ),
    );
    let mut cmd = s.sortie();
    mock.claude_env(&mut cmd, &home);
    cmd.args(["run", "--run-id", &run])
        .arg(&batch)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = Background::from_command(cmd, &run).finish(600);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A partial task makes the run partial: exit 1 is sortie's "not all completed".
    assert_eq!(out.status.code(), Some(1), "sortie run: {stdout}\n{stderr}");
    let events = s.events(&run);

    // answer: one attempt, completed, the mock's text.
    let answer = attempts(&events, 0);
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert_eq!(
        (answer[0].status.as_str(), answer[0].stop_reason.as_str()),
        ("completed", "completed")
    );
    assert_eq!(answer[0].output, ANSWER);

    // tool: completed, the Bash call ran in the task's worktree, which is kept with its patch.
    let tool = attempts(&events, 1);
    assert_eq!(tool.len(), 1, "{tool:?}");
    assert_eq!(tool[0].status, "completed", "{tool:?}");
    let finished = events.of(1, "AttemptFinished");
    assert_eq!(finished[0]["outcome"]["side_effects"], true);
    assert_eq!(finished[0]["outcome"]["denials"], serde_json::json!([]));
    let planned = events.of(1, "WorktreePlanned");
    let worktree = PathBuf::from(planned[0]["path"].as_str().expect("a worktree path"));
    assert_eq!(
        std::fs::read_to_string(worktree.join("out.txt")).expect("out.txt in the worktree"),
        "hi\n"
    );
    assert!(!repo.join("out.txt").exists(), "the checkout is untouched");
    let patch = std::fs::read_to_string(
        s.state_dir()
            .join("runs")
            .join(&run)
            .join("patches/tool.patch"),
    )
    .expect("the kept worktree's patch");
    assert!(
        patch.contains("out.txt") && patch.contains("+hi"),
        "{patch}"
    );

    // denied: read-only, so Claude Code denied the Bash call; partial, the denial journaled.
    let denied = attempts(&events, 2);
    assert_eq!(
        denied.len(),
        1,
        "a partial attempt is not retried: {denied:?}"
    );
    assert_eq!(
        (denied[0].status.as_str(), denied[0].stop_reason.as_str()),
        ("partial", "completed")
    );
    assert!(
        denied[0].error.contains("denied") && denied[0].error.contains("Bash"),
        "{denied:?}"
    );
    let finished = events.of(2, "AttemptFinished");
    assert_eq!(
        finished[0]["outcome"]["denials"],
        serde_json::json!([{"tool": "Bash", "count": 1}])
    );
    assert!(
        !s.path().join("work/denied/out.txt").exists(),
        "nothing was written"
    );
    let status = s.status(&run);
    let view = task_view(&status, "denied");
    assert_eq!(view["state"], "partial", "{view}");
    assert_eq!(
        view["denials"],
        serde_json::json!([{"tool": "Bash", "count": 1}])
    );
    let text = s.run_ok(&["status", &run]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("denied tool calls: Bash"), "{text}");
    assert!(
        stdout.contains("[denied] partial (denied: Bash)"),
        "{stdout}"
    );

    // fallback: one request to the failing model (no retries of Claude Code's own).
    let fb = attempts(&events, 3);
    assert_eq!(fb.len(), 2, "{fb:?}");
    assert_eq!(
        (
            fb[0].model.as_str(),
            fb[0].status.as_str(),
            fb[0].stop_reason.as_str()
        ),
        ("bad", "failed", "error")
    );
    assert!(fb[0].error.contains("500"), "{fb:?}");
    assert_eq!(
        (fb[1].model.as_str(), fb[1].status.as_str()),
        ("good", "completed")
    );

    // stall: stopped by the watchdog, then the fallback.
    let st = attempts(&events, 4);
    assert_eq!(st.len(), 2, "{st:?}");
    assert_eq!(
        (st[0].model.as_str(), st[0].stop_reason.as_str()),
        ("hang", "stalled"),
        "{st:?}"
    );
    assert_eq!(
        (st[1].model.as_str(), st[1].status.as_str()),
        ("good", "completed")
    );

    // answer: its system_prompt was appended to Claude Code's own.
    let served = mock.served();
    let answered: Vec<&Value> = served.iter().filter(|r| r["model"] == "good").collect();
    assert!(
        answered.iter().any(|r| r["system_tail"]
            .as_str()
            .unwrap_or("")
            .contains("Answer like a pirate.")),
        "no request carried the appended system prompt: {answered:?}"
    );

    // big: completed, and the mock got the whole prompt.
    let b = attempts(&events, 5);
    assert_eq!((b[0].status.as_str(), b.len()), ("completed", 1), "{b:?}");
    assert!(
        served
            .iter()
            .any(|r| r["prompt_chars"].as_u64().unwrap_or(0) >= MIB as u64),
        "no request carried the 1 MiB prompt"
    );
    let requests = |model: &str| served.iter().filter(|r| r["model"] == model).count();
    assert_eq!(
        requests("bad"),
        1,
        "Claude Code retried on its own: {served:?}"
    );
    assert_eq!(requests("hang"), 1, "{served:?}");
    // Each tool task: the call, then the answer to its result.
    assert_eq!(requests("tool"), 4, "{served:?}");
    s.audit_clean(&run);
}
