//! Roles and sessions (#13) with the real agent CLIs (Claude Code 2.1.332, Codex 0.171.0,
//! pi 0.73.1) against the project's loopback mocks (`tests/mock-llm/`, 127.0.0.1 only):
//!
//! - a session continued across two tasks: the second task's request carries the first
//!   task's conversation (the mock logs it), the journal names the agent's session id
//!   (`AttemptSession`) and the second task's `AttemptContinues` of it, and the second task's
//!   usage is its own (Claude Code and Codex report a resumed session's usage over the whole
//!   session: sortie takes the earlier attempts' part off);
//! - a role applied: a role file's permissions and system prompt reach the CLI's flags (the
//!   mock sees the role's prompt in the system prompt; read-only denies a write);
//! - a crash mid-attempt: sortie is SIGKILLed while the agent waits for the model, the agent
//!   is killed by the resume, and the retry resumes the agent's session instead of starting
//!   over (the model sees the prompt of the crashed attempt in the retry's conversation).
//!
//! Without the CLI (or python3) a test is skipped, saying why, unless `CI` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use sortie_testkit::real_agent::{
    MockServer, PI_VARS, claude_found, codex_found, codex_user, pi_found, pi_user, should_run,
};

use crate::support::{
    Background, Scratch, finish, live_processes_of, poll, run_as_user, task_view, unique_run,
};
use sortie_testkit::Events;

/// Writes a role file at `rel` under the scratch dir (its folders made).
fn write_role(s: &Scratch, rel: &str, text: &str) {
    let path = s.path().join(rel);
    std::fs::create_dir_all(path.parent().expect("a folder")).expect("mkdir");
    std::fs::write(path, text).expect("write the role file");
}

/// The usage journaled for task `task` (its attempts' last finished usage, summed):
/// (input, output, cache_read).
fn task_tokens(events: &[Value], task: usize) -> (u64, u64, u64) {
    events
        .of(task as u64, "AttemptFinished")
        .iter()
        .fold((0, 0, 0), |(i, o, c), b| {
            let u = &b["usage"];
            let n = |k: &str| u[k].as_u64().unwrap_or(0);
            (i + n("input"), o + n("output"), c + n("cache_read"))
        })
}

/// The session ids task `task`'s attempts named (`AttemptSession`).
fn sessions_of(events: &[Value], task: usize) -> Vec<String> {
    events
        .of(task as u64, "AttemptSession")
        .iter()
        .filter_map(|b| b["session"].as_str().map(str::to_owned))
        .collect()
}

/// The sessions task `task`'s attempts continued (`AttemptContinues`): (attempt, session).
fn continued(events: &[Value], task: usize) -> Vec<(u64, String)> {
    events
        .of(task as u64, "AttemptContinues")
        .iter()
        .map(|b| {
            (
                b["attempt"].as_u64().unwrap_or(0),
                b["session"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// The final state of task `label` as `status --json` shows it.
fn state_of(s: &Scratch, run: &str, label: &str) -> String {
    let status = s.status(run);
    task_view(&status, label)["state"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// Runs `cmd` (a `sortie run` of `run`), SIGKILLs it once `ready` holds of its journal, checks
/// that its unsupervised agent outlived it, then resumes with `resume` (the same environment)
/// and returns the resume's exit code and the journal.
fn crash_then_resume(
    s: &Scratch,
    run: &str,
    cmd: Command,
    mut resume: Command,
    ready: impl Fn(&[Value]) -> bool,
) -> (Option<i32>, Vec<Value>) {
    let bg = Background::from_command(cmd, run);
    poll(
        "the attempt in its session, waiting for the model",
        120,
        || s.try_events(run).filter(|e| ready(e)).map(|_| ()),
    );
    crate::support::send_signal(bg.pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = bg.finish(10);
    assert!(
        !live_processes_of(run).is_empty(),
        "the unsupervised agent outlives the killed sortie"
    );
    resume
        .args(["resume", run])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = finish(resume.spawn().expect("spawn sortie resume"), 300);
    assert!(
        live_processes_of(run).is_empty(),
        "resume leaves no agent behind: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), s.events(run))
}

/// The fake user's home (`fake_user` of the agent's tests, for the mock at `port`) and the
/// two work dirs the session tests use (`work/review`, `work/talk`).
fn user_and_work<T>(s: &Scratch, port: u16, fake_user: impl FnOnce(&Path, u16) -> T) -> PathBuf {
    let home = s.path().join("home");
    fake_user(&home, port);
    for dir in ["work/review", "work/talk"] {
        std::fs::create_dir_all(s.path().join(dir)).expect("mkdir");
    }
    home
}

#[test]
fn real_claude_continues_a_session_across_tasks_and_applies_a_role() {
    if !should_run("real_claude_sessions", claude_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::anthropic(s.path(), &[("good", "answer"), ("tool", "tool")]);
    let home = s.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir home");
    std::fs::create_dir_all(s.path().join("work/review")).expect("mkdir");
    std::fs::create_dir_all(s.path().join("work/talk")).expect("mkdir");
    // The project's own Claude Code agent file, as Claude Code's users write them.
    write_role(
        &s,
        ".claude/agents/auditor.md",
        "---\nname: auditor\ndescription: Audits, changes nothing\nmodel: tool\n\
         permissions: read-only\ncolor: blue\n---\nYou are the mock auditor. Change nothing.\n",
    );
    let run = unique_run("real-claude-sessions");
    let batch = s.write(
        "batch.toml",
        "concurrency = 2\n\n\
         [defaults]\nagent = \"claude\"\nmax_retries = 0\nattempt_timeout = \"3m\"\n\n\
         [[tasks]]\nlabel = \"audit\"\ncwd = \"work/review\"\nrole = \"auditor\"\n\
         prompt = \"Write hi into out.txt.\"\n\n\
         [[tasks]]\nlabel = \"first\"\ncwd = \"work/talk\"\nmodel = \"good\"\nsession = \"talk\"\n\
         prompt = \"Remember the word PELICAN.\"\n\n\
         [[tasks]]\nlabel = \"second\"\ncwd = \"work/talk\"\nmodel = \"good\"\nsession = \"talk\"\n\
         prompt = \"Which word did I ask you to remember?\"\n",
    );
    let check = s.run(&["check", batch.to_str().expect("utf-8")]);
    let check_out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check_out.contains(&format!(
            "role auditor: {} (task audit)",
            s.path().join(".claude/agents/auditor.md").display()
        )),
        "{check_out}"
    );
    let mut cmd = s.sortie();
    mock.claude_env(&mut cmd, &home);
    cmd.args(["run", "--run-id", &run])
        .arg(&batch)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = Background::from_command(cmd, &run).finish(600);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The audit's denied write makes it (and so the run) partial.
    assert_eq!(out.status.code(), Some(1), "sortie run: {stderr}");
    let events = s.events(&run);
    let served = mock.served();

    // The role: its model, its read-only permissions (the write was denied), its prompt.
    assert_eq!(state_of(&s, &run, "audit"), "partial");
    let finished = events.of(0, "AttemptFinished");
    assert_eq!(
        finished[0]["outcome"]["denials"],
        serde_json::json!([{"tool": "Bash", "count": 1}])
    );
    assert!(!s.path().join("work/review/out.txt").exists());
    let audit: Vec<&Value> = served.iter().filter(|r| r["model"] == "tool").collect();
    assert!(!audit.is_empty(), "the role's model was asked: {served:?}");
    assert!(
        audit.iter().all(|r| r["system_tail"]
            .as_str()
            .unwrap_or("")
            .contains("You are the mock auditor. Change nothing.")),
        "the role's prompt reached Claude Code's system prompt: {audit:?}"
    );
    let status = s.status(&run);
    assert_eq!(task_view(&status, "audit")["role"], "auditor");

    // The session: one conversation, the second task resumed the first's session.
    assert_eq!(state_of(&s, &run, "first"), "completed");
    assert_eq!(state_of(&s, &run, "second"), "completed");
    let first = sessions_of(&events, 1);
    assert_eq!(first.len(), 1, "{events:?}");
    assert_eq!(sessions_of(&events, 2), first, "the same session");
    assert_eq!(continued(&events, 2), [(1, first[0].clone())]);
    assert!(continued(&events, 1).is_empty(), "the first task starts it");
    let talk: Vec<&Value> = served.iter().filter(|r| r["model"] == "good").collect();
    assert_eq!(talk.len(), 2, "{talk:?}");
    assert_eq!(talk[0]["assistant_turns"], 0);
    assert_eq!(talk[1]["assistant_turns"], 1, "{talk:?}");
    let texts = talk[1]["user_texts"].to_string();
    assert!(
        texts.contains("Remember the word PELICAN.") && texts.contains("Which word"),
        "the second request carries the first conversation: {texts}"
    );
    // Each task counts its own request only: the mock served 100 in, 12 out, 50 cached each.
    assert_eq!(task_tokens(&events, 1), (100, 12, 50));
    assert_eq!(task_tokens(&events, 2), (100, 12, 50));
    assert_eq!(task_view(&status, "second")["session"], "talk");
    s.audit_clean(&run);
}

#[test]
fn real_claude_crash_mid_attempt_continues_its_session() {
    if !should_run("real_claude_crash_session", claude_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::anthropic(s.path(), &[("once", "hang_once")]);
    let home = s.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir home");
    std::fs::create_dir_all(s.path().join("work")).expect("mkdir");
    let run = unique_run("real-claude-crash");
    // Unsupervised: the agent is sortie's child, so the crash takes the orphan path (a
    // supervised attempt would be adopted and go on by itself).
    let batch = s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"talk\"\nagent = \"claude\"\ncwd = \"work\"\nmodel = \"once\"\n\
         supervise = false\nmax_retries = 1\nattempt_timeout = \"3m\"\n\
         prompt = \"Say hello after the crash.\"\n",
    );
    let mut cmd = s.sortie();
    mock.claude_env(&mut cmd, &home);
    cmd.args(["run", "--run-id", &run])
        .arg(&batch)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut resume = s.sortie();
    mock.claude_env(&mut resume, &home);
    let (code, events) = crash_then_resume(&s, &run, cmd, resume, |e| {
        !sessions_of(e, 0).is_empty() && !mock.served().is_empty()
    });
    assert_eq!(code, Some(0));
    assert_eq!(events.of(0, "AttemptOrphaned").len(), 1);
    let session = sessions_of(&events, 0);
    assert_eq!(session.len(), 2, "both attempts name it: {events:?}");
    assert_eq!(session[0], session[1], "the retry is in the same session");
    assert_eq!(continued(&events, 0), [(2, session[0].clone())]);
    let served = mock.served();
    assert_eq!(served.len(), 2, "{served:?}");
    let texts = served[1]["user_texts"].to_string();
    assert_eq!(
        texts.matches("Say hello after the crash.").count(),
        2,
        "the retry's request carries the crashed attempt's prompt, then its own: {texts}"
    );
    assert_eq!(state_of(&s, &run, "talk"), "completed");
    s.audit_clean(&run);
}

/// The Codex request's text items of role `role` (its `input` messages), joined.
fn codex_texts(request: &Value, role: &str) -> String {
    let items = request["body"]["input"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    items
        .iter()
        .filter(|i| i["role"] == role)
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["text"].as_str().map(str::to_owned))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The environment that points Codex at its mock (through the fake user's config).
fn codex_env(cmd: &mut Command, home: &Path) {
    cmd.env("HOME", home).env_remove("CODEX_HOME");
}

#[test]
fn real_codex_continues_a_session_across_tasks_and_applies_a_role() {
    if !should_run("real_codex_sessions", codex_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::responses(s.path(), &[("good", "ok"), ("tool", "tool")]);
    let home = user_and_work(&s, mock.port, codex_user);
    // sortie's own roles folder is looked at first.
    write_role(
        &s,
        ".sortie/agents/auditor.md",
        "---\nmodel: tool\npermissions: read-only\n---\nYou are the mock auditor.\n",
    );
    let run = unique_run("real-codex-sessions");
    let batch = s.write(
        "batch.toml",
        "concurrency = 2\n\n\
         [defaults]\nagent = \"codex\"\nmax_retries = 0\nattempt_timeout = \"2m\"\n\
         env = { MOCK_API_KEY = \"mock-key\" }\n\n\
         [[tasks]]\nlabel = \"audit\"\ncwd = \"work/review\"\nrole = \"auditor\"\n\
         prompt = \"Write hi into out.txt.\"\n\n\
         [[tasks]]\nlabel = \"first\"\ncwd = \"work/talk\"\nmodel = \"good\"\nsession = \"talk\"\n\
         prompt = \"Remember the word PELICAN.\"\n\n\
         [[tasks]]\nlabel = \"second\"\ncwd = \"work/talk\"\nmodel = \"good\"\nsession = \"talk\"\n\
         prompt = \"Which word did I ask you to remember?\"\n",
    );
    let mut cmd = s.sortie();
    codex_env(&mut cmd, &home);
    cmd.args(["run", "--run-id", &run])
        .arg(&batch)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = Background::from_command(cmd, &run).finish(600);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code().is_some(), "sortie run: {stderr}");
    let events = s.events(&run);
    let served = mock.served();

    // The role: its model and prompt reached Codex, and its read-only sandbox kept the
    // command from writing.
    let audit: Vec<&Value> = served.iter().filter(|r| r["model"] == "tool").collect();
    assert!(!audit.is_empty(), "the role's model was asked: {served:?}");
    let developer = codex_texts(audit[0], "developer");
    assert!(
        developer.contains("You are the mock auditor."),
        "the role's prompt reached Codex's developer instructions: {developer}"
    );
    assert!(
        developer.contains("read-only"),
        "Codex was told its sandbox is read-only: {developer}"
    );
    assert!(
        !s.path().join("work/review/out.txt").exists(),
        "read-only wrote nothing"
    );
    let status = s.status(&run);
    assert_eq!(task_view(&status, "audit")["role"], "auditor");

    // The session: Codex's thread id journaled; the second task resumed the first's thread.
    assert_eq!(state_of(&s, &run, "first"), "completed", "{stderr}");
    assert_eq!(state_of(&s, &run, "second"), "completed", "{stderr}");
    let first = sessions_of(&events, 1);
    assert_eq!(first.len(), 1, "{events:?}");
    assert_eq!(sessions_of(&events, 2), first, "the same thread");
    assert_eq!(continued(&events, 2), [(1, first[0].clone())]);
    let talk: Vec<&Value> = served.iter().filter(|r| r["model"] == "good").collect();
    assert_eq!(talk.len(), 2, "{talk:?}");
    let user = codex_texts(talk[1], "user");
    assert!(
        user.contains("Remember the word PELICAN.") && user.contains("Which word"),
        "the second request carries the first conversation: {user}"
    );
    assert!(
        codex_texts(talk[1], "assistant").contains("Hello from the mock LLM"),
        "and the first answer"
    );
    // Codex reports the thread's totals (300 in for the second): each task counts its own.
    assert_eq!(task_tokens(&events, 1), (100, 12, 50));
    assert_eq!(task_tokens(&events, 2), (100, 12, 50));
    s.audit_clean(&run);
}

#[test]
fn real_codex_crash_mid_attempt_continues_its_session() {
    if !should_run("real_codex_crash_session", codex_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::responses(s.path(), &[("once", "hang_once")]);
    let home = s.path().join("home");
    codex_user(&home, mock.port);
    std::fs::create_dir_all(s.path().join("work")).expect("mkdir");
    let run = unique_run("real-codex-crash");
    let batch = s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"talk\"\nagent = \"codex\"\ncwd = \"work\"\nmodel = \"once\"\n\
         supervise = false\nmax_retries = 1\nattempt_timeout = \"3m\"\n\
         env = { MOCK_API_KEY = \"mock-key\" }\n\
         prompt = \"Say hello after the crash.\"\n",
    );
    let mut cmd = s.sortie();
    codex_env(&mut cmd, &home);
    cmd.args(["run", "--run-id", &run])
        .arg(&batch)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut resume = s.sortie();
    codex_env(&mut resume, &home);
    let (code, events) = crash_then_resume(&s, &run, cmd, resume, |e| {
        !sessions_of(e, 0).is_empty() && !mock.served().is_empty()
    });
    assert_eq!(code, Some(0));
    assert_eq!(events.of(0, "AttemptOrphaned").len(), 1);
    let session = sessions_of(&events, 0);
    assert_eq!(session.len(), 2, "both attempts name it: {events:?}");
    assert_eq!(session[0], session[1], "the retry is in the same thread");
    assert_eq!(continued(&events, 0), [(2, session[0].clone())]);
    let served = mock.served();
    assert_eq!(served.len(), 2, "{served:?}");
    let user = codex_texts(&served[1], "user");
    assert_eq!(
        user.matches("Say hello after the crash.").count(),
        2,
        "the retry's request carries the crashed attempt's prompt, then its own: {user}"
    );
    assert_eq!(state_of(&s, &run, "talk"), "completed");
    s.audit_clean(&run);
}

#[test]
fn real_pi_continues_a_session_across_tasks_and_applies_a_role() {
    if !should_run("real_pi_sessions", pi_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::openai(s.path(), &[("good", "answer")]);
    let home = user_and_work(&s, mock.port, |h, p| pi_user(h, p, &["good"]));
    // pi's own agents folder: a scout that may only read and list.
    write_role(
        &s,
        ".pi/agents/lister.md",
        "---\nmodel: mock/good\ntools: read, ls\nthinking: low\n---\nYou are the mock lister.\n",
    );
    let run = unique_run("real-pi-sessions");
    let batch = s.write(
        "batch.toml",
        "concurrency = 2\n\n\
         [defaults]\nagent = \"pi\"\nmax_retries = 0\nattempt_timeout = \"2m\"\n\n\
         [[tasks]]\nlabel = \"list\"\ncwd = \"work/review\"\nrole = \"lister\"\n\
         prompt = \"List the files.\"\n\n\
         [[tasks]]\nlabel = \"first\"\ncwd = \"work/talk\"\nmodel = \"mock/good\"\n\
         session = \"talk\"\nprompt = \"Remember the word PELICAN.\"\n\n\
         [[tasks]]\nlabel = \"second\"\ncwd = \"work/talk\"\nmodel = \"mock/good\"\n\
         session = \"talk\"\nprompt = \"Which word did I ask you to remember?\"\n",
    );
    let (out, stderr) = run_as_user(&s, &home, PI_VARS, &run, &batch);
    assert_eq!(out.status.code(), Some(0), "sortie run: {stderr}");
    let events = s.events(&run);
    let served = mock.served();

    // The role: pi was offered the role's tools only, and its prompt.
    let listed: Vec<&Value> = served
        .iter()
        .filter(|r| r["user_texts"].to_string().contains("List the files."))
        .collect();
    assert_eq!(listed.len(), 1, "{served:?}");
    assert_eq!(listed[0]["tools"], serde_json::json!(["read", "ls"]));
    assert!(
        listed[0]["system"]
            .as_str()
            .unwrap_or("")
            .contains("You are the mock lister."),
        "{listed:?}"
    );

    // The session: the second task continued the first's session file.
    let cont = continued(&events, 2);
    assert_eq!(cont.len(), 1, "{events:?}");
    let run_dir = s.state_dir().join("runs").join(&run);
    assert!(
        Path::new(&cont[0].1).starts_with(run_dir.join("sessions").join("1.1")),
        "the first task's session file: {cont:?}"
    );
    let second: Vec<&Value> = served
        .iter()
        .filter(|r| r["user_texts"].to_string().contains("Which word"))
        .collect();
    assert_eq!(second.len(), 1, "{served:?}");
    assert_eq!(second[0]["assistant_turns"], 1, "{second:?}");
    assert!(
        second[0]["user_texts"]
            .to_string()
            .contains("Remember the word PELICAN."),
        "the second request carries the first conversation: {second:?}"
    );
    assert_eq!(task_tokens(&events, 2), (100, 12, 50));
    s.audit_clean(&run);
}
