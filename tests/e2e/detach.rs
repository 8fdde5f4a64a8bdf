//! End-to-end tests of `sortie run --detach` + `sortie wait`, run ids by unique prefix, and
//! `--on-task-end`.

use crate::support::{Scratch, fake_command, poll, unique_run};

fn batch(s: &Scratch, name: &str, sleep: &str, exit: &str) -> std::path::PathBuf {
    s.write(
        name,
        &format!(
            "[[tasks]]\nlabel = \"one\"\nmax_retries = 0\ncommand = {}\noutput = \"out/one.md\"\n\n\
             [[tasks]]\nlabel = \"two\"\ncommand = {}\n",
            fake_command(&[
                "--sleep",
                sleep,
                "--usage",
                "10,5,0.25",
                "--answer",
                "one done"
            ]),
            fake_command(&["--exit", exit, "--answer", "two done"]),
        ),
    )
}

#[test]
fn a_detached_run_prints_its_id_and_wait_exits_with_its_code() {
    let s = Scratch::new();
    let ok = batch(&s, "ok.toml", "2", "0");
    let run = unique_run("detached");
    let out = s.run_ok(&[
        "run",
        "--detach",
        &ok.display().to_string(),
        "--run-id",
        &run,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        run,
        "prints the run id"
    );
    // It returned while the run goes on: a wait with a short timeout gives up (exit 5).
    let early = s.run(&["wait", &run, "--timeout", "0s"]);
    assert_eq!(
        early.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&early.stderr)
    );
    // A unique prefix names it.
    let waited = s.run(&["wait", &run[..run.len() - 2]]);
    assert_eq!(
        waited.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let summary = String::from_utf8_lossy(&waited.stdout);
    assert!(
        summary.contains("total: 2 task(s) · completed 2"),
        "{summary}"
    );
    let log = std::fs::read_to_string(s.state_dir().join("logs").join(format!("{run}.log")))
        .expect("the detached run's log");
    assert!(log.contains("[one] completed"), "{log}");

    // A failing run: wait exits 1; `--json` of a detach names the run.
    let bad = batch(&s, "bad.toml", "0", "3");
    let out = s.run_ok(&["--json", "run", "--detach", &bad.display().to_string()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let id = v["run_id"].as_str().expect("a run id").to_owned();
    let waited = s.run(&["wait", &id]);
    assert_eq!(waited.status.code(), Some(1));

    // Two runs that share a prefix: it is ambiguous; a longer one names one of them.
    for id in ["pfx-aaa", "pfx-bbb"] {
        let _ = s.run(&["--quiet", "run", "--run-id", id, "--", "true"]);
    }
    let ambiguous = s.run(&["status", "pfx"]);
    assert_eq!(ambiguous.status.code(), Some(2));
    let err = String::from_utf8_lossy(&ambiguous.stderr);
    assert!(
        err.contains("pfx-aaa, pfx-bbb") && err.contains("give more of it"),
        "{err}"
    );
    let one = s.run_ok(&["--json", "status", "pfx-b"]);
    let v: serde_json::Value = serde_json::from_slice(&one.stdout).expect("JSON");
    assert_eq!(v["run_id"], "pfx-bbb");
}

#[test]
fn a_detached_batch_that_does_not_load_fails_at_once() {
    let s = Scratch::new();
    let broken = s.write("broken.toml", "[[tasks]]\nlabel = \"x\"\nnope = 1\n");
    let out = s.run(&["run", "--detach", &broken.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}

#[test]
fn on_task_end_runs_a_command_with_the_tasks_label_state_cost_and_artifact() {
    let s = Scratch::new();
    let b = batch(&s, "b.toml", "0", "3");
    let hook = "echo \"$SORTIE_RUN|$SORTIE_TASK|$SORTIE_STATE|$SORTIE_COST_USD|$SORTIE_ARTIFACT|$SORTIE_ERROR\" >> hooks.log";
    let out = s.run(&[
        "--on-task-end",
        hook,
        "run",
        &b.display().to_string(),
        "--run-id",
        "hooked",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let lines = poll("both hooks to have run", 10, || {
        let text = std::fs::read_to_string(s.path().join("hooks.log")).ok()?;
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines.sort();
        (lines.len() == 2).then_some(lines)
    });
    let artifact = s.path().join("out/one.md");
    assert_eq!(
        lines[0],
        format!("hooked|one|completed|0.250000|{}|", artifact.display())
    );
    assert!(
        lines[1].starts_with("hooked|two|failed|0.000000||exited with code 3"),
        "{}",
        lines[1]
    );
}

// #15: `on_task_end` as a batch field, batch-wide and per task; the flag wins.
#[test]
fn on_task_end_in_the_batch_runs_per_task_or_batch_wide_and_the_flag_wins() {
    let s = Scratch::new();
    std::fs::create_dir(s.path().join("sub")).unwrap();
    let line = |tag: &str| {
        format!(
            "echo \"{tag}|$SORTIE_RUN|$SORTIE_TASK|$SORTIE_STATE|$SORTIE_COST_USD|$SORTIE_ARTIFACT|$SORTIE_ERROR\" >> hooks.log"
        )
    };
    let toml_str = |s: &str| toml_string(s);
    let b = s.write(
        "b.toml",
        &format!(
            "on_task_end = {}\n\n\
             [[tasks]]\nlabel = \"one\"\nmax_retries = 0\ncommand = {}\noutput = \"out/one.md\"\n\n\
             [[tasks]]\nlabel = \"two\"\ncommand = {}\n\n\
             [[tasks]]\nlabel = \"three\"\ncwd = \"sub\"\non_task_end = {}\ncommand = {}\n",
            toml_str(&line("batch")),
            fake_command(&["--usage", "10,5,0.25", "--answer", "one done"]),
            fake_command(&["--exit", "3", "--answer", "two done"]),
            toml_str(&line("own")),
            fake_command(&["--usage", "1,1,0.5", "--answer", "three done"]),
        ),
    );
    let out = s.run(&["run", &b.display().to_string(), "--run-id", "inbatch"]);
    assert_eq!(out.status.code(), Some(1));
    let read_lines = |path: &std::path::Path, n: usize| {
        poll("the hooks to have run", 10, || {
            let text = std::fs::read_to_string(path).ok()?;
            let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
            lines.sort();
            (lines.len() == n).then_some(lines)
        })
    };
    // The batch-wide hook, for the tasks without their own, in each task's cwd.
    let lines = read_lines(&s.path().join("hooks.log"), 2);
    let artifact = s.path().join("out/one.md");
    assert_eq!(
        lines[0],
        format!(
            "batch|inbatch|one|completed|0.250000|{}|",
            artifact.display()
        )
    );
    assert!(
        lines[1].starts_with("batch|inbatch|two|failed|0.000000||exited with code 3"),
        "{}",
        lines[1]
    );
    // The task's own, in its cwd, instead of the batch-wide one.
    let own = read_lines(&s.path().join("sub/hooks.log"), 1);
    assert_eq!(own, ["own|inbatch|three|completed|0.500000||"]);
    // Journaled with the run's batch: the run config and the task's spec.
    let events = s.events("inbatch");
    let batch = &events[0]["event"]["RunStarted"]["batch"];
    assert_eq!(batch["config"]["on_task_end"], line("batch"), "{batch}");
    assert_eq!(batch["tasks"][2]["on_task_end"], line("own"));
    assert!(batch["tasks"][0]["on_task_end"].is_null());

    // `--on-task-end` wins over both.
    let flag = "echo \"flag|$SORTIE_TASK\" >> flag.log";
    let out = s.run(&[
        "--on-task-end",
        flag,
        "run",
        &b.display().to_string(),
        "--run-id",
        "flagged",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let lines = read_lines(&s.path().join("flag.log"), 3);
    assert_eq!(lines, ["flag|one", "flag|three", "flag|two"]);
    let batch_lines = std::fs::read_to_string(s.path().join("hooks.log")).unwrap();
    assert!(!batch_lines.contains("flagged"), "{batch_lines}");
    assert!(!s.path().join("sub/flag.log").exists());
}

/// `s` as a TOML basic string.
fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// #32: `run --detach` keeps a run private as plain `run` does, whatever the umask: a missing
/// state dir is made 0700, `logs/` 0700 and the log (every task's output) 0600.
#[test]
fn a_detached_run_is_private_to_its_user() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new();
    let ok = batch(&s, "ok.toml", "0", "0");
    let run = unique_run("private");
    let state = s.path().join("fresh").join("state");
    // Through a shell with the common umask 022 (the test's own may be stricter).
    let out = std::process::Command::new("sh")
        .args(["-c", "umask 022; exec \"$@\"", "sh"])
        .arg(env!("CARGO_BIN_EXE_sortie"))
        .arg("--state-dir")
        .arg(&state)
        .args(["run", "--detach", "--run-id", &run])
        .arg(&ok)
        .current_dir(s.path())
        .env_remove("SORTIE_DIR")
        .output()
        .expect("sortie run --detach");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let waited = std::process::Command::new(env!("CARGO_BIN_EXE_sortie"))
        .arg("--state-dir")
        .arg(&state)
        .args(["wait", &run])
        .output()
        .expect("sortie wait");
    assert_eq!(
        waited.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&state), 0o700, "the state dir");
    assert_eq!(mode(&state.join("logs")), 0o700, "logs/");
    let log = state.join("logs").join(format!("{run}.log"));
    assert_eq!(mode(&log), 0o600, "the detached run's log");
    assert_eq!(mode(&state.join("runs")), 0o700, "runs/");
}
