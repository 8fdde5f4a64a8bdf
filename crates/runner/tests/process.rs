//! The process layer against real, short-lived processes: spawning, output, stopping, the
//! pid-reuse guard, orphan hunting, and the plain protocol fed by a real child.
//!
//! No assertion depends on timing: a child says when it is ready (a line on stdout), the
//! moment a test waits for is shown by a positive signal (an echo), and waits for "gone" are
//! bounded polls.

use std::path::PathBuf;
use std::time::Duration;

use sortie_core::{AgentProfile, AttemptStatus, Protocol, StopReason};
use sortie_protocol::{Exit, reader_for};
use sortie_runner::process::{
    Child, KillResult, MAX_LINE_BYTES, RenderError, STDERR_TAIL_BYTES, SpawnError, SpawnSpec, Vars,
    find_marked, is_running, kill_group_if_same, process_start_time, render_argv, spawn,
};

const MARK: &str = "SORTIE_TEST_ATTEMPT";

fn spec(argv: &[&str]) -> SpawnSpec {
    SpawnSpec {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        cwd: std::env::temp_dir(),
        env: vec![],
        marker: (MARK.into(), format!("test-{}/t/1", std::process::id())),
    }
}

fn sh(script: &str) -> SpawnSpec {
    spec(&["sh", "-c", script])
}

async fn lines(child: &mut Child) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(l) = child.next_line().await {
        out.push(l.text);
    }
    out
}

/// Polls until the process is gone (or a zombie); false after 10 s.
async fn gone(pid: u32, start_time: u64) -> bool {
    for _ in 0..500 {
        if !is_running(pid, start_time) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn spawn_reads_lines_and_exit_code() {
    let mut child = spawn(&sh("echo one; printf 'two\\nthree'; echo err >&2; exit 3"))
        .await
        .unwrap();
    assert!(child.start_time > 0);
    assert_eq!(lines(&mut child).await, ["one", "two", "three"]);
    assert_eq!(child.wait().await, Ok(Exit::Code(3)));
    assert_eq!(child.stderr_tail(), "err\n");
    assert_eq!(child.stdout_bytes(), 13);
    // wait is idempotent.
    assert_eq!(child.wait().await, Ok(Exit::Code(3)));
}

#[tokio::test]
async fn env_is_ours_plus_the_spec_plus_the_marker() {
    let mut s = sh("echo \"$EXTRA|$SORTIE_TEST_ATTEMPT|${PATH:+path}\"");
    s.env = vec![("EXTRA".into(), "extra value".into())];
    s.marker = (MARK.into(), "run/t/1".into());
    let mut child = spawn(&s).await.unwrap();
    assert_eq!(lines(&mut child).await, ["extra value|run/t/1|path"]);
    assert_eq!(child.wait().await, Ok(Exit::Code(0)));
}

#[tokio::test]
async fn the_marker_is_in_proc_environ_and_find_marked_sees_it() {
    let value = format!("marker-{}/task-a/2", std::process::id());
    let mut s = spec(&["sleep", "1000"]);
    s.marker = (MARK.into(), value.clone());
    let mut child = spawn(&s).await.unwrap();

    let found = find_marked(MARK, &format!("marker-{}/", std::process::id()));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].pid, child.pid);
    assert_eq!(found[0].start_time, child.start_time);
    assert_eq!(found[0].marker_value, value);
    // find_marked waits out an exec in progress; after it, /proc shows the environment.
    let environ = std::fs::read(format!("/proc/{}/environ", child.pid)).unwrap();
    let wanted = format!("{MARK}={value}");
    assert!(
        environ.split(|b| *b == 0).any(|kv| kv == wanted.as_bytes()),
        "marker in /proc/{}/environ",
        child.pid
    );
    assert!(find_marked(MARK, "no-such-run/").is_empty());

    assert_eq!(
        kill_group_if_same(found[0].pid, found[0].start_time, Duration::from_secs(5)).await,
        KillResult::Killed
    );
    assert_eq!(child.wait().await, Ok(Exit::Signal(15)));
    assert_eq!(
        kill_group_if_same(found[0].pid, found[0].start_time, Duration::from_secs(5)).await,
        KillResult::Gone
    );
}

#[tokio::test]
async fn cwd_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(&["pwd"]);
    s.cwd = dir.path().to_path_buf();
    let mut child = spawn(&s).await.unwrap();
    let out = lines(&mut child).await;
    assert_eq!(
        std::fs::canonicalize(&out[0]).unwrap(),
        std::fs::canonicalize(dir.path()).unwrap()
    );
    assert_eq!(child.wait().await, Ok(Exit::Code(0)));
}

#[tokio::test]
async fn stdin_is_dev_null() {
    let mut child = spawn(&spec(&["cat"])).await.unwrap();
    assert!(lines(&mut child).await.is_empty());
    assert_eq!(child.wait().await, Ok(Exit::Code(0)));
}

#[tokio::test]
async fn a_piped_stdin_takes_lines_and_closes_when_dropped() {
    let mut child = sortie_runner::process::spawn_piped(&spec(&["cat"]))
        .await
        .unwrap();
    let mut stdin = child.take_stdin().expect("a piped stdin");
    assert!(child.take_stdin().is_none(), "taken once");
    stdin.send_line(r#"{"type":"prompt"}"#).await.unwrap();
    let first = child.next_line().await.expect("cat echoes the line");
    assert_eq!(first.text, r#"{"type":"prompt"}"#);
    drop(stdin);
    assert!(lines(&mut child).await.is_empty());
    assert_eq!(child.wait().await, Ok(Exit::Code(0)), "EOF ends it");
    let mut plain = spawn(&spec(&["true"])).await.unwrap();
    assert!(plain.take_stdin().is_none(), "spawn gives /dev/null");
}

#[test]
fn session_args_expand_in_place() {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let argv = s(&["pi", "{session_args}", "--model", "m"]);
    assert_eq!(
        sortie_runner::process::expand_element(
            argv.clone(),
            sortie_runner::process::SESSION_ARGS,
            &s(&["--session-dir", "/d"])
        ),
        s(&["pi", "--session-dir", "/d", "--model", "m"])
    );
    assert_eq!(
        sortie_runner::process::expand_element(argv, sortie_runner::process::SESSION_ARGS, &[]),
        s(&["pi", "--model", "m"])
    );
}

#[tokio::test]
async fn spawn_errors_name_the_binary_and_why() {
    let err = spawn(&spec(&["sortie-no-such-binary-xyz", "a"]))
        .await
        .unwrap_err();
    assert!(matches!(err, SpawnError::NotFound { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "cannot run `sortie-no-such-binary-xyz`: not found"
    );

    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let err = spawn(&spec(&[script.to_str().unwrap()])).await.unwrap_err();
    assert!(
        matches!(err, SpawnError::PermissionDenied { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not-executable.sh"));

    let mut s = spec(&["true"]);
    s.cwd = PathBuf::from("/no/such/dir/for/sortie");
    let err = spawn(&s).await.unwrap_err();
    assert!(matches!(err, SpawnError::BadCwd { .. }), "{err:?}");
    assert!(err.to_string().contains("/no/such/dir/for/sortie"), "{err}");

    let err = spawn(&spec(&[])).await.unwrap_err();
    assert!(matches!(err, SpawnError::EmptyArgv));
    assert!(err.fault().deterministic());

    // An argv over the system's limit (E2BIG) is named as such, and is no transient failure.
    let big = "x".repeat(4 << 20);
    let err = spawn(&spec(&["true", &big])).await.unwrap_err();
    assert!(
        matches!(err, SpawnError::ArgumentListTooLong { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("argument 1 is 4194304 bytes, over the 131072 bytes"),
        "names the argument over Linux's limit on one: {err}"
    );
    assert!(err.fault().deterministic());
    // Many arguments, each under the limit on one, over the total (ARG_MAX).
    let part = "y".repeat(100 << 10);
    let mut argv = vec!["true"];
    argv.extend(std::iter::repeat_n(part.as_str(), 200));
    let err = spawn(&spec(&argv)).await.unwrap_err();
    assert!(err.to_string().contains("argument list too long"), "{err}");
    assert!(err.fault().deterministic());
}

#[tokio::test]
async fn a_prompt_file_is_the_childs_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt");
    let prompt = "p".repeat(1 << 20);
    std::fs::write(&file, &prompt).unwrap();
    let mut child = sortie_runner::process::spawn_stdin_file(&sh("wc -c"), &file)
        .await
        .unwrap();
    let line = child.next_line().await.unwrap();
    assert_eq!(line.text.trim(), "1048576");
    let err = sortie_runner::process::spawn_stdin_file(&sh("true"), &dir.path().join("none"))
        .await
        .unwrap_err();
    assert!(
        !err.fault().deterministic() && err.to_string().contains("stdin"),
        "{err}"
    );
}

#[tokio::test]
async fn stop_kills_a_child_that_ignores_sigterm_after_the_grace() {
    let mut child = spawn(&sh("trap '' TERM; echo ready; while :; do sleep 1; done"))
        .await
        .unwrap();
    assert_eq!(child.next_line().await.unwrap().text, "ready");
    let stopper = child.stopper();
    assert_eq!(stopper.sent_reason(), None);
    let winner = child
        .stop(StopReason::Timeout, Duration::from_millis(200))
        .await;
    assert_eq!(winner, StopReason::Timeout);
    assert!(stopper.has_exited());
    assert_eq!(child.wait().await, Ok(Exit::Signal(9)));
    // The first request wins; later ones are recorded nowhere and stop nothing.
    assert_eq!(stopper.request(StopReason::Cancelled), StopReason::Timeout);
    assert_eq!(
        stopper
            .stop(StopReason::Cancelled, Duration::from_millis(1))
            .await,
        StopReason::Timeout
    );
    assert_eq!(stopper.sent_reason(), Some(StopReason::Timeout));
    assert!(!is_running(child.pid, child.start_time));
}

#[tokio::test]
async fn stop_with_sigterm_needs_no_kill() {
    let mut child = spawn(&sh("echo ready; exec sleep 1000")).await.unwrap();
    assert_eq!(child.next_line().await.unwrap().text, "ready");
    child
        .stop(StopReason::Cancelled, Duration::from_secs(30))
        .await;
    assert_eq!(child.wait().await, Ok(Exit::Signal(15)));
    assert_eq!(child.stop_reason(), Some(StopReason::Cancelled));
}

#[tokio::test]
async fn a_grandchild_is_gone_after_stop() {
    let mut child = spawn(&sh("sleep 1000 & echo $!; wait")).await.unwrap();
    let grandchild: u32 = child.next_line().await.unwrap().text.parse().unwrap();
    let start = process_start_time(grandchild).expect("grandchild runs");
    child
        .stop(StopReason::Cancelled, Duration::from_millis(500))
        .await;
    assert!(
        gone(grandchild, start).await,
        "grandchild {grandchild} left"
    );
    assert!(child.wait().await.is_ok());
}

#[tokio::test]
async fn a_grandchild_that_ignores_sigterm_is_killed_with_the_group() {
    // The grandchild says `ready` once it ignores TERM, so that the stop below exercises the
    // SIGKILL of what is left of the group, not a TERM it would die of.
    let mut child = spawn(&sh(
        "(trap '' TERM; echo ready; exec sleep 1000) & echo $!; wait",
    ))
    .await
    .unwrap();
    // The two lines come in either order.
    let mut grandchild = None;
    let mut ready = false;
    for _ in 0..2 {
        let line = child.next_line().await.expect("two lines").text;
        match line.parse::<u32>() {
            Ok(pid) => grandchild = Some(pid),
            Err(_) => ready |= line == "ready",
        }
    }
    assert!(ready, "the grandchild ignores TERM");
    let grandchild = grandchild.expect("the grandchild's pid");
    let start = process_start_time(grandchild).expect("grandchild runs");
    // The leader dies of SIGTERM at once; what is left of the group is killed when it exits.
    child
        .stop(StopReason::Cancelled, Duration::from_secs(30))
        .await;
    assert_eq!(child.wait().await, Ok(Exit::Signal(15)));
    assert!(
        gone(grandchild, start).await,
        "grandchild {grandchild} left"
    );
}

#[tokio::test]
async fn leftovers_of_a_finished_leader_are_killed() {
    // The leader waits for a line (or end of input) before it exits, so that the grandchild's
    // start time is read while it surely runs.
    let mut child = sortie_runner::process::spawn_piped(&sh("sleep 1000 & echo $!; read go; true"))
        .await
        .unwrap();
    let stdin = child.take_stdin().expect("a piped stdin");
    let grandchild: u32 = child.next_line().await.unwrap().text.parse().unwrap();
    let start = process_start_time(grandchild).expect("the grandchild runs");
    drop(stdin);
    assert_eq!(child.wait().await, Ok(Exit::Code(0)));
    assert!(child.next_line().await.is_none(), "stdout closes");
    assert!(
        gone(grandchild, start).await,
        "grandchild {grandchild} left"
    );
}

#[tokio::test]
async fn dropping_a_child_kills_its_group() {
    let mut child = spawn(&sh("sleep 1000 & echo $!; wait")).await.unwrap();
    let grandchild: u32 = child.next_line().await.unwrap().text.parse().unwrap();
    let g_start = process_start_time(grandchild).expect("grandchild runs");
    let (pid, start) = (child.pid, child.start_time);
    drop(child);
    assert!(gone(pid, start).await, "leader {pid} left");
    assert!(
        gone(grandchild, g_start).await,
        "grandchild {grandchild} left"
    );
}

#[tokio::test]
async fn the_pid_reuse_guard_refuses_a_different_start_time() {
    let mut child = sortie_runner::process::spawn_piped(&spec(&["cat"]))
        .await
        .unwrap();
    let mut stdin = child.take_stdin().expect("a piped stdin");
    assert_eq!(
        kill_group_if_same(child.pid, child.start_time + 1, Duration::from_millis(10)).await,
        KillResult::Gone
    );
    // A signal the refused call had sent would be pending before `cat` returns from its next
    // read, and would end it there: an echo of a line written now proves none was sent.
    stdin.send_line("still here").await.unwrap();
    assert_eq!(child.next_line().await.unwrap().text, "still here");
    assert!(is_running(child.pid, child.start_time), "left alone");
    assert_eq!(
        kill_group_if_same(child.pid, child.start_time, Duration::from_secs(5)).await,
        KillResult::Killed
    );
    assert_eq!(child.wait().await, Ok(Exit::Signal(15)));
}

#[tokio::test]
async fn kill_group_if_same_kills_a_term_ignoring_orphan_and_its_group() {
    let mut child = spawn(&sh("trap '' TERM; sleep 1000 & echo $!; wait"))
        .await
        .unwrap();
    let grandchild: u32 = child.next_line().await.unwrap().text.parse().unwrap();
    let g_start = process_start_time(grandchild).unwrap();
    assert_eq!(
        kill_group_if_same(child.pid, child.start_time, Duration::from_millis(100)).await,
        KillResult::Killed
    );
    assert_eq!(child.wait().await, Ok(Exit::Signal(9)));
    assert!(gone(grandchild, g_start).await);
}

#[tokio::test]
async fn stderr_tail_keeps_only_the_last_50_kib() {
    let mut child = spawn(&sh(
        "printf START >&2; head -c 200000 /dev/zero | tr '\\0' a >&2; printf END >&2",
    ))
    .await
    .unwrap();
    assert!(lines(&mut child).await.is_empty());
    assert_eq!(child.wait().await, Ok(Exit::Code(0)));
    let tail = child.stderr_tail();
    assert_eq!(tail.len(), STDERR_TAIL_BYTES);
    assert!(tail.ends_with("aaaEND"));
    assert!(!tail.contains("START"));
}

#[tokio::test]
async fn a_10_mb_line_is_cut_and_reading_goes_on() {
    let mut child = spawn(&sh(
        "head -c 10000000 /dev/zero | tr '\\0' x; echo; echo after; printf tail",
    ))
    .await
    .unwrap();
    let first = child.next_line().await.unwrap();
    assert!(first.truncated);
    assert_eq!(first.text.len(), MAX_LINE_BYTES);
    assert!(first.text.bytes().all(|b| b == b'x'));
    let second = child.next_line().await.unwrap();
    assert_eq!((second.text.as_str(), second.truncated), ("after", false));
    assert_eq!(child.next_line().await.unwrap().text, "tail");
    assert!(child.next_line().await.is_none());
    assert_eq!(child.wait().await, Ok(Exit::Code(0)));
    assert_eq!(child.stdout_bytes(), 10_000_000 + 1 + 6 + 4);
}

#[tokio::test]
async fn binary_garbage_is_delivered_lossily() {
    let mut child = spawn(&sh("head -c 300000 /dev/urandom; printf '\\377\\376\\n'"))
        .await
        .unwrap();
    let mut total = 0;
    while let Some(line) = child.next_line().await {
        total += line.text.len();
    }
    assert!(total > 0);
    assert_eq!(child.wait().await, Ok(Exit::Code(0)));
}

#[tokio::test]
async fn a_signal_ending_the_child_is_reported() {
    let mut child = spawn(&sh("kill -KILL $$")).await.unwrap();
    assert_eq!(child.wait().await, Ok(Exit::Signal(9)));
    assert_eq!(child.stopper().sent_reason(), None);
}

#[tokio::test]
async fn plain_protocol_over_a_real_child() {
    let mut child = spawn(&sh(
        "echo working; echo 'SORTIE_USAGE {\"input\":10,\"output\":5,\"cost_usd\":0.25,\"turns\":1}'; \
         echo 'SORTIE_ERROR model_error quota exceeded for model x'; exit 1",
    ))
    .await
    .unwrap();
    let mut reader = reader_for(Protocol::Plain);
    let mut last_usage = None;
    while let Some(line) = child.next_line().await {
        if let Some(p) = reader.line(&line.text) {
            last_usage = Some(p.usage);
        }
    }
    let exit = child.wait().await.unwrap();
    let finished = reader.finish(exit, &child.stderr_tail());
    assert_eq!(last_usage.map(|u| u.input), Some(10));
    assert_eq!(finished.usage.cost.nanos, 250_000_000);
    assert_eq!(finished.outcome.status, AttemptStatus::Failed);
    assert_eq!(finished.outcome.stop_reason, StopReason::ModelError);
    assert_eq!(finished.outcome.exit_code, Some(1));
    assert_eq!(finished.output, "working");
}

#[tokio::test]
async fn a_stopped_plain_child_is_classified_by_the_stop_reason() {
    let mut child = spawn(&sh("echo half; exec sleep 1000")).await.unwrap();
    let mut reader = reader_for(Protocol::Plain);
    let first = child.next_line().await.unwrap();
    reader.line(&first.text);
    child.stop(StopReason::Budget, Duration::from_secs(5)).await;
    while let Some(line) = child.next_line().await {
        reader.line(&line.text);
    }
    let exit = child.wait().await.unwrap();
    let mut finished = reader.finish(exit, &child.stderr_tail());
    assert_eq!(finished.outcome.stop_reason, StopReason::UnexpectedSignal);
    if let Some(reason) = child.stopper().sent_reason() {
        finished = finished.stopped_by(reason);
    }
    assert_eq!(finished.outcome.stop_reason, StopReason::Budget);
    assert_eq!(finished.outcome.status, AttemptStatus::Partial);
    assert_eq!(finished.output, "half");
}

/// A pi profile of a user's own, placing the prompt as its last argument (the built-in one
/// gives it on stdin).
fn profile() -> AgentProfile {
    let mut p = AgentProfile::builtins()["pi"].clone();
    p.command.push("{prompt}".into());
    p
}

fn vars(model: Option<&str>) -> Vars {
    Vars {
        prompt: "fix {cwd} bug; echo $HOME".into(),
        model: model.map(str::to_owned),
        cwd: "/repo".into(),
        attempt: 2,
        label: "lint".into(),
    }
}

#[test]
fn render_argv_substitutes_placeholders_and_model_args() {
    const HEADLESS: [&str; 9] = [
        "pi",
        "--mode",
        "json",
        // `{session_args}` is the agent's launch plan's to expand (#13).
        "{session_args}",
        "--offline",
        "--no-extensions",
        "--no-skills",
        "--no-prompt-templates",
        "--no-themes",
    ];
    let argv = render_argv(&profile(), None, &vars(Some("gpt-x"))).unwrap();
    let mut want: Vec<&str> = HEADLESS.to_vec();
    // `{agent_args}` is the agent's launch plan's to expand, like `{session_args}`.
    want.extend([
        "{agent_args}",
        "--model",
        "gpt-x",
        "fix {cwd} bug; echo $HOME",
    ]);
    assert_eq!(
        argv, want,
        "the prompt is one argument and is not substituted again"
    );
    let argv = render_argv(&profile(), None, &vars(None)).unwrap();
    let mut want: Vec<&str> = HEADLESS.to_vec();
    want.extend(["{agent_args}", "fix {cwd} bug; echo $HOME"]);
    assert_eq!(
        argv, want,
        "{{model_args}} expands to nothing without a model"
    );
}

#[test]
fn the_built_in_agents_take_no_prompt_argument() {
    // Their prompt goes to stdin (no argv limit, no option parsing of a prompt that starts
    // with `-`); codex is told so with `-`.
    for (name, profile) in AgentProfile::builtins() {
        let mut v = vars(Some("m"));
        v.prompt = "-p is not an option here".into();
        let argv = render_argv(&profile, None, &v).unwrap_or_default();
        assert!(
            !argv.iter().any(|a| a.contains("-p is not")),
            "{name}: {argv:?}"
        );
    }
    let codex = &AgentProfile::builtins()["codex"];
    assert_eq!(codex.command.last().map(String::as_str), Some("-"));
}

#[test]
fn render_argv_uses_a_task_command_as_is_with_placeholders() {
    let command: Vec<String> = [
        "./check.sh",
        "--dir={cwd}",
        "{label}-{task}#{attempt}",
        "{unknown} {\"json\": 1}",
        "{model_args}",
    ]
    .map(str::to_owned)
    .into();
    let command_profile = AgentProfile::builtins()["command"].clone();
    let argv = render_argv(&command_profile, Some(&command), &vars(None)).unwrap();
    assert_eq!(
        argv,
        [
            "./check.sh",
            "--dir=/repo",
            "lint-lint#2",
            "{unknown} {\"json\": 1}"
        ]
    );
}

#[test]
fn render_argv_errors() {
    let command_profile = AgentProfile::builtins()["command"].clone();
    assert_eq!(
        render_argv(&command_profile, None, &vars(None)),
        Err(RenderError::NoCommand {
            agent: "command".into()
        })
    );
    let cmd = vec!["run".to_owned(), "--model={model}".to_owned()];
    assert_eq!(
        render_argv(&command_profile, Some(&cmd), &vars(None)),
        Err(RenderError::NoModel {
            element: "--model={model}".into()
        })
    );
    assert_eq!(
        render_argv(&command_profile, Some(&cmd), &vars(Some("m"))).unwrap()[1],
        "--model=m"
    );
    let cmd = vec!["{model_args}".to_owned()];
    assert!(matches!(
        render_argv(&command_profile, Some(&cmd), &vars(None)),
        Err(RenderError::EmptyProgram { .. })
    ));
}

#[test]
fn spawn_spec_debug_hides_env_values() {
    let mut s = spec(&["agent"]);
    s.env = vec![("API_KEY".into(), "sk-secret-value".into())];
    let shown = format!("{s:?}");
    assert!(shown.contains("API_KEY"), "{shown}");
    assert!(!shown.contains("sk-secret-value"), "{shown}");
}
