//! End-to-end tests: bad input. A batch that does not load is refused with a message naming the
//! file, line and field, exit 2, and no run is started; an agent binary that is missing is
//! `invalid` at once (retrying cannot help), naming it; an agent printing binary garbage or a 10 MB line
//! does not upset sortie; a file a batch names past its size limit (`/dev/zero`) is refused
//! naming it, without filling the memory; a state dir that cannot be written is a clear error naming the path,
//! with nothing half-written.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::{Scratch, fake_command, finish, task_view};
use sortie_testkit::Events;

/// Runs `sortie run` on a batch with `text` and checks it is refused before anything runs:
/// exit 2, a message naming the file and containing each of `expected`, no run in the state
/// dir, and the agent (which would append to a counter file) never launched.
fn assert_refused(text: &str, expected: &[&str]) {
    let s = Scratch::new();
    let batch = s.write("batch.toml", text);
    let out = s.run(&["run", batch.to_str().expect("utf-8 path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a batch that does not load is a usage error\nstderr:\n{stderr}"
    );
    assert!(
        stderr.contains("batch.toml"),
        "the message names the file: {stderr}"
    );
    for e in expected {
        assert!(stderr.contains(e), "the message says {e:?}: {stderr}");
    }
    assert!(
        s.listed_runs().is_empty(),
        "no run was started for a batch that does not load"
    );
    assert!(
        !s.path().join("counter").exists(),
        "no agent ran for a batch that does not load"
    );
}

/// A task whose agent would leave a trace in `counter` (next to the batch) if it ran.
fn traced_task(label: &str) -> String {
    format!(
        "[[tasks]]\nlabel = {label:?}\ncommand = {}\n",
        fake_command(&["--counter", "counter"])
    )
}

#[test]
fn malformed_toml_is_refused_naming_file_and_line() {
    // Line 5 is broken.
    let text = format!("concurrency = 2\n{}max_retries = = 2\n", traced_task("a"));
    assert_eq!(text.lines().nth(4), Some("max_retries = = 2"));
    assert_refused(&text, &["batch.toml:5"]);
}

#[test]
fn an_unknown_field_is_refused_naming_file_line_and_field() {
    // Line 6 has a field no task has.
    let text = format!("concurrency = 2\n\n{}max_retrys = 2\n", traced_task("a"));
    assert_eq!(text.lines().nth(5), Some("max_retrys = 2"));
    assert_refused(&text, &["batch.toml:6", "max_retrys", "unknown field"]);
}

#[test]
fn a_duplicate_label_is_refused_naming_the_label() {
    // The second `twice` is on line 5.
    let text = format!("{}{}", traced_task("twice"), traced_task("twice"));
    assert_eq!(text.lines().nth(4), Some("label = \"twice\""));
    assert_refused(&text, &["batch.toml:5", "label", "duplicate", "twice"]);
}

#[test]
fn a_needs_cycle_is_refused_naming_the_cycle() {
    let mut text = String::new();
    for (label, need) in [("a", "c"), ("b", "a"), ("c", "b")] {
        text.push_str(&traced_task(label));
        text.push_str(&format!("needs = [{need:?}]\n"));
    }
    assert_refused(&text, &["batch.toml:", "needs", "cycle"]);
}

#[test]
fn a_missing_agent_binary_is_invalid_at_once_naming_the_binary() {
    let s = Scratch::new();
    let batch = s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"ghost\"\nmax_retries = 1\ncommand = [\"/nonexistent/agent\", \"--go\"]\n\n\
         [[tasks]]\nlabel = \"fine\"\ncommand = [\"true\"]\n",
    );
    let out = finish(
        s.spawn(&["run", "--run-id", "ghost", batch.to_str().expect("utf-8")]),
        60,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "a task failed: exit 1");
    assert!(
        stdout.contains("[ghost] failed") && stdout.contains("/nonexistent/agent"),
        "the summary names the binary:\n{stdout}"
    );
    let status = s.status("ghost");
    let ghost = task_view(&status, "ghost");
    assert_eq!(ghost["state"], "failed", "{ghost}");
    assert_eq!(ghost["stop_reason"], "invalid", "{ghost}");
    assert_eq!(
        ghost["attempts"], 1,
        "a missing binary is not retried: {ghost}"
    );
    let error = ghost["error"].as_str().unwrap_or_default();
    assert!(error.contains("/nonexistent/agent"), "{error}");
    assert!(error.contains("not found"), "{error}");
    assert_eq!(task_view(&status, "fine")["state"], "completed");

    let events = s.events("ghost");
    let reasons: Vec<&str> = events
        .of(0, "AttemptFinished")
        .iter()
        .map(|e| e["outcome"]["stop_reason"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(reasons, ["invalid"]);
    assert!(events.of(0, "RetryScheduled").is_empty());
    assert!(events.of(0, "AttemptStarted").is_empty(), "nothing started");
    s.audit_clean("ghost");
}

#[test]
fn binary_garbage_and_a_10_mb_line_do_not_upset_sortie() {
    let s = Scratch::new();
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"garbage\"\ncommand = {}\n\n[[tasks]]\nlabel = \"big\"\ncommand = {}\n",
            fake_command(&[
                "--garbage",
                "5000",
                "--usage",
                "5,6,0.001",
                "--answer",
                "garbage answer"
            ]),
            fake_command(&[
                "--big-line",
                "10000000",
                "--usage",
                "7,8,0.002",
                "--answer",
                "big answer"
            ]),
        ),
    );
    let out = finish(
        s.spawn(&["run", "--run-id", "odd", batch.to_str().expect("utf-8")]),
        60,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("[garbage] completed"), "{stdout}");
    assert!(stdout.contains("[big] completed"), "{stdout}");
    assert!(stdout.contains("garbage answer") && stdout.contains("big answer"));

    let status = s.status("odd");
    assert_eq!(status["status"], "completed");
    for (label, input, output) in [("garbage", 5, 6), ("big", 7, 8)] {
        let t = task_view(&status, label);
        assert_eq!(t["state"], "completed", "{t}");
        assert_eq!(t["attempts"], 1, "{t}");
        assert_eq!(t["usage"]["input"], input, "{t}");
        assert_eq!(t["usage"]["output"], output, "{t}");
    }
    // The journal reads back whole, and the ledger is what the agents reported.
    let events = s.events("odd");
    assert!(!events.is_empty());
    // `sortie export RUN | head -1`: more than a pipe holds, and the reader goes away early.
    let mut export = s.spawn(&["export", "odd"]);
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(export.stdout.take().expect("stdout")),
        &mut first,
    )
    .expect("read a line");
    assert!(first.contains("RunStarted"), "{first}");
    let export = finish(export, 30);
    let stderr = String::from_utf8_lossy(&export.stderr);
    assert!(
        !stderr.contains("Broken pipe"),
        "a reader that stops early is not worth a message: {stderr}"
    );
    let audit = s.audit_clean("odd");
    assert_eq!(audit["ledger"]["total"]["input"], 12);
    assert_eq!(audit["ledger"]["total"]["output"], 14);
    assert_eq!(audit["ledger"]["total"]["cost"]["nanos"], 3_000_000);
}

/// A state dir sortie cannot create: inside a read-only dir, or (for root, whom permissions do
/// not stop) under a regular file. Returns it and a check that nothing was written around it.
fn unwritable_state_dir(s: &Scratch) -> (PathBuf, Box<dyn Fn()>) {
    let ro = s.path().join("read-only");
    std::fs::create_dir(&ro).expect("mkdir");
    set_mode(&ro, 0o500);
    let probe = ro.join("probe");
    if std::fs::write(&probe, b"").is_err() {
        let check = move || {
            let left: Vec<_> = std::fs::read_dir(&ro).expect("read dir").collect();
            assert!(left.is_empty(), "nothing was written: {left:?}");
        };
        return (s.path().join("read-only").join("state"), Box::new(check));
    }
    // Root: permissions do not apply; a path under a regular file fails for everyone.
    let _ = std::fs::remove_file(&probe);
    set_mode(&ro, 0o700);
    let file = s.write("a-file", "not a directory\n");
    let check = move || {
        assert_eq!(
            std::fs::read_to_string(&file).expect("the file is still there"),
            "not a directory\n",
            "the file is untouched"
        );
    };
    (s.path().join("a-file").join("state"), Box::new(check))
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn an_unwritable_state_dir_is_a_clear_error_naming_the_path() {
    let s = Scratch::new();
    let (state, nothing_written) = unwritable_state_dir(&s);
    let batch = s.write("batch.toml", &traced_task("a"));
    let out = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .current_dir(s.path())
        .env_remove("SORTIE_DIR")
        .env_remove("RUST_LOG")
        .arg("--state-dir")
        .arg(&state)
        .arg("run")
        .arg(&batch)
        .stdin(Stdio::null())
        .output()
        .expect("run sortie");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it fails\nstderr:\n{stderr}");
    assert_ne!(out.status.code(), Some(3), "nothing to resume");
    assert!(
        stderr.contains(&state.display().to_string()),
        "the message names the path {}: {stderr}",
        state.display()
    );
    assert_eq!(
        stderr.matches("(os error").count(),
        1,
        "the cause is said once: {stderr}"
    );
    assert!(
        !s.path().join("counter").exists(),
        "no agent ran without a journal"
    );
    nothing_written();
    set_mode(&s.path().join("read-only"), 0o700);
}

/// A plain command that says which of its failures are transient (`transient_on`): a wrapper
/// around an API that prints `429` and exits 1 is retried and completes on its second attempt;
/// the same failure without the pattern (`other`) is a real failure, not retried.
#[test]
fn transient_on_retries_a_plain_command_whose_failure_matches() {
    let s = Scratch::new();
    let script = "n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; \
                  if [ $n -lt 2 ]; then echo 'HTTP 429: rate limit' >&2; exit 1; fi; echo done";
    std::fs::create_dir_all(s.path().join("a")).expect("mkdir");
    std::fs::create_dir_all(s.path().join("b")).expect("mkdir");
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"api\"\ncwd = \"a\"\nmax_retries = 2\n\
             transient_on = [\"rate limit\", \"503\"]\ncommand = [\"sh\", \"-c\", {script:?}]\n\n\
             [[tasks]]\nlabel = \"other\"\ncwd = \"b\"\nmax_retries = 2\n\
             transient_on = [\"503\"]\ncommand = [\"sh\", \"-c\", {script:?}]\n"
        ),
    );
    let out = finish(
        s.spawn(&["run", "--run-id", "tr", batch.to_str().expect("utf-8")]),
        60,
    );
    assert_eq!(out.status.code(), Some(1), "`other` failed");
    let events = s.events("tr");
    let reasons = |t: usize| -> Vec<String> {
        events
            .of(t as u64, "AttemptFinished")
            .iter()
            .map(|e| {
                e["outcome"]["stop_reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(reasons(0), ["error", "completed"]);
    let first = &events.of(0, "AttemptFinished")[0]["outcome"]["error"];
    assert!(
        first
            .as_str()
            .unwrap_or_default()
            .contains("\"rate limit\""),
        "{first}"
    );
    assert_eq!(
        reasons(1),
        ["nonzero_exit"],
        "no pattern matched: not retried"
    );
    let status = s.status("tr");
    assert_eq!(task_view(&status, "api")["state"], "completed");
    assert_eq!(task_view(&status, "other")["state"], "failed");
}

/// Runs `sortie ARGS` in `s` with its address space capped at 1 GiB (`ulimit -v`), so that
/// a sortie reading without bound fails fast instead of taking the machine's memory.
fn run_capped(s: &Scratch, args: &[&str]) -> std::process::Output {
    let sortie = s.sortie();
    let mut c = Command::new("sh");
    c.current_dir(s.path())
        .env_remove("SORTIE_DIR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$@\"")
        .arg("sh")
        .arg(sortie.get_program())
        .args(sortie.get_args())
        .args(args);
    c.output().expect("run sortie")
}

#[test]
fn every_input_past_its_documented_size_is_refused_naming_the_file() {
    let s = Scratch::new();
    let for_each = s.write(
        "for_each.toml",
        "[[tasks]]\nlabel = \"t-{item}\"\ncommand = [\"true\"]\nfor_each = { file = \"/dev/zero\" }\n",
    );
    let schema = s.write(
        "schema.toml",
        "[[tasks]]\nlabel = \"t\"\ncommand = [\"true\"]\noutput_schema = \"/dev/zero\"\n",
    );
    let cases: [(&str, &Path, &str); 3] = [
        ("/dev/zero", Path::new("/dev/zero"), "64 MiB a batch file"),
        ("for_each", &for_each, "16 MiB a `for_each` file"),
        ("output_schema", &schema, "4 MiB an `output_schema` file"),
    ];
    for (what, batch, limit) in cases {
        let out = run_capped(&s, &["check", batch.to_str().expect("utf-8 path")]);
        let stderr = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.status.code(),
            Some(2),
            "{what}: a usage error\n{stderr}"
        );
        assert!(
            stderr.contains("/dev/zero") && stderr.contains(&format!("larger than the {limit}")),
            "{what}: the error names the file and its limit:\n{stderr}"
        );
    }
    assert!(!s.state_dir().join("runs").exists(), "nothing was run");
}

#[test]
fn a_spawn_that_can_never_succeed_fails_at_once_naming_its_cause() {
    let s = Scratch::new();
    let not_a_program = s.write("not-a-program", "hello\n");
    set_mode(&not_a_program, 0o755);
    std::fs::create_dir(s.path().join("gone")).expect("mkdir");
    let big_env = "x".repeat(300 * 1024);
    let big_arg = "y".repeat(200 * 1024);
    // `vanish` removes `gone` before `cwd` starts in it: `check` saw it, the spawn does not.
    let batch = s.write(
        "batch.toml",
        &format!(
            "[defaults]\nmax_retries = 2\n\n\
             [[tasks]]\nlabel = \"nul\"\ncommand = [\"echo\", \"a\\u0000b\"]\n\n\
             [[tasks]]\nlabel = \"noexec\"\ncommand = [{:?}]\n\n\
             [[tasks]]\nlabel = \"bigenv\"\ncommand = [\"true\"]\nenv = {{ BIG = \"{big_env}\" }}\n\n\
             [[tasks]]\nlabel = \"bigarg\"\ncommand = [\"echo\", \"{big_arg}\"]\n\n\
             [[tasks]]\nlabel = \"vanish\"\ncommand = [\"rmdir\", \"gone\"]\n\n\
             [[tasks]]\nlabel = \"cwd\"\nneeds = [\"vanish\"]\ncwd = \"gone\"\ncommand = [\"true\"]\n",
            not_a_program.display().to_string()
        ),
    );
    let out = finish(
        s.spawn(&["run", "--run-id", "never", batch.to_str().expect("utf-8")]),
        120,
    );
    assert_eq!(out.status.code(), Some(1), "tasks failed: exit 1");
    let status = s.status("never");
    let cases = [
        ("nul", "NUL byte"),
        ("noexec", "not a program the system can run"),
        (
            "bigenv",
            "the environment variable BIG is 307200 bytes, over the 131072 bytes",
        ),
        (
            "bigarg",
            "argument 1 is 204800 bytes, over the 131072 bytes",
        ),
        ("cwd", "working directory"),
    ];
    for (label, cause) in cases {
        let task = task_view(&status, label);
        assert_eq!(task["state"], "failed", "{task}");
        assert_eq!(task["stop_reason"], "invalid", "{label}: {task}");
        assert_eq!(task["attempts"], 1, "{label} is not retried: {task}");
        let error = task["error"].as_str().unwrap_or_default();
        assert!(error.contains(cause), "{label}: {error}");
    }
    let bigenv = task_view(&status, "bigenv")["error"]
        .as_str()
        .unwrap_or_default();
    assert!(!bigenv.contains("prompt"), "no word of a prompt: {bigenv}");
    assert_eq!(
        s.events("never").count("RetryScheduled"),
        0,
        "nothing retried"
    );
    s.audit_clean("never");
}

#[test]
fn check_refuses_what_could_never_start_or_be_written() {
    let s = Scratch::new();
    let not_a_program = s.write("not-a-program", "hello\n");
    set_mode(&not_a_program, 0o755);
    let big_env = "x".repeat(300 * 1024);
    let big_arg = "y".repeat(200 * 1024);
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"nul\"\ncommand = [\"echo\", \"a\\u0000b\"]\n\n\
             [[tasks]]\nlabel = \"noexec\"\ncommand = [{:?}]\n\n\
             [[tasks]]\nlabel = \"out\"\ncommand = [\"true\"]\noutput = \"/proc/forbidden/out.md\"\n\n\
             [[tasks]]\nlabel = \"bigenv\"\ncommand = [\"true\"]\nenv = {{ BIG = \"{big_env}\" }}\n\n\
             [[tasks]]\nlabel = \"bigarg\"\ncommand = [\"echo\", \"{big_arg}\"]\n\n\
             [[tasks]]\nlabel = \"fine\"\ncommand = [\"true\"]\n",
            not_a_program.display().to_string()
        ),
    );
    let out = s.run(&["check", batch.to_str().expect("utf-8")]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "check refuses the batch:\n{text}"
    );
    let expected = [
        "field `command`: task `nul`: argument 1 holds a NUL byte",
        "field `command`: task `noexec`: the task's command",
        "not a program the system can run",
        "field `output`: task `out`: /proc/forbidden/out.md cannot be written",
        "field `env`: task `bigenv`: BIG is 307200 bytes",
        "field `command`: task `bigarg`: argument 1 is 204800 bytes",
        "5 problems",
    ];
    for e in expected {
        assert!(text.contains(e), "missing {e:?} in:\n{text}");
    }
    assert!(!text.contains("task `fine`"), "{text}");
}

/// A plain command without `transient_on` that prints `429 ... retry after` and fails is not
/// retried, and its error says that `transient_on` exists.
#[test]
fn a_plain_rate_limit_without_transient_on_says_transient_on_exists() {
    let s = Scratch::new();
    let script = "echo 'HTTP 429 Too Many Requests: retry after 30s' >&2; exit 1";
    let batch = s.write(
        "batch.toml",
        &format!("[[tasks]]\nlabel = \"api\"\ncommand = [\"sh\", \"-c\", {script:?}]\n"),
    );
    let out = s.run(&["run", "--run-id", "hint", batch.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let events = s.events("hint");
    assert_eq!(
        events.of(0, "AttemptFinished").len(),
        1,
        "not retried without transient_on"
    );
    let status = s.status("hint");
    let error = task_view(&status, "api")["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(error.contains("transient_on"), "{error}");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("transient_on"), "{said}");
}

/// An attempt that runs out its `attempt_timeout` is not retried by default; with
/// `retry_timeouts = true` it is, up to `max_retries`.
#[test]
fn an_attempt_timeout_is_retried_only_with_retry_timeouts() {
    let s = Scratch::new();
    let hang = crate::support::fake_command(&["--hang"]);
    let batch = s.write(
        "batch.toml",
        &format!(
            "[defaults]\nattempt_timeout = \"1s\"\nkill_grace = \"1s\"\nmax_retries = 1\n\n\
             [[tasks]]\nlabel = \"once\"\ncommand = {hang}\n\n\
             [[tasks]]\nlabel = \"again\"\nretry_timeouts = true\ncommand = {hang}\n"
        ),
    );
    let out = s.run(&["run", "--run-id", "rt", batch.to_str().expect("utf-8")]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events("rt");
    let reasons = |t: u64| -> Vec<String> {
        events
            .of(t, "AttemptFinished")
            .iter()
            .map(|e| {
                e["outcome"]["stop_reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(reasons(0), ["timeout"], "not retried by default");
    assert_eq!(
        reasons(1),
        ["timeout", "timeout"],
        "retried with retry_timeouts"
    );
}

/// Runs `sortie run` on a JSON Lines batch with `text`: its exit code and stderr, and whether a
/// run was started.
fn run_jsonl(text: &str) -> (Option<i32>, String, bool) {
    let s = Scratch::new();
    let batch = s.write("batch.jsonl", text);
    let out = s.run(&["run", batch.to_str().expect("utf-8 path")]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), stderr, !s.listed_runs().is_empty())
}

#[test]
fn a_malformed_jsonl_line_is_the_error_named_and_no_tasks_is_not_said() {
    let task = format!(
        "{{\"label\": \"a\", \"command\": {}}}",
        fake_command(&["--counter", "counter"])
    );
    let (code, stderr, started) = run_jsonl(&format!("{task} x\n"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(!started, "{stderr}");
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains("batch.jsonl:1: invalid JSON: trailing characters"),
        "the parse error comes first: {stderr}"
    );
    assert!(
        !stderr.contains("no tasks"),
        "a line that did not parse is not a batch without tasks: {stderr}"
    );
}

#[test]
fn a_duplicate_key_in_a_jsonl_task_is_refused_naming_line_and_key() {
    let task = |label: &str| {
        format!(
            "{{\"label\": \"{label}\", \"command\": {}, \"label\": \"other\"}}",
            fake_command(&["--counter", "counter"])
        )
    };
    let (code, stderr, started) = run_jsonl(&format!("{}\n\n{}\n", task("a"), task("b")));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(!started, "{stderr}");
    for line in [1, 3] {
        assert!(
            stderr.contains(&format!("batch.jsonl:{line}: duplicate key `label`")),
            "line {line} named: {stderr}"
        );
    }
}
