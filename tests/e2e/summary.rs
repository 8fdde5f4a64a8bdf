//! End-to-end tests of a run's summary: the table (state, attempts and models, tokens, cost,
//! result, first line of the error), the totals, the commands to go on, outputs only for small
//! runs or with `--outputs`, and the same as `--json`.

use crate::support::{Scratch, fake_command};

/// `n` quick tasks, task 0 retried once after a 503 with a fallback model, task 1 failing.
fn batch(s: &Scratch, n: usize) -> std::path::PathBuf {
    let mut toml = String::from("concurrency = 4\n\n");
    for i in 0..n {
        let (cmd, extra) = match i {
            0 => (
                fake_command(&[
                    "--model",
                    "{model}",
                    "--fail-model",
                    "primary:model_error",
                    "--usage",
                    "10,5,0.001",
                    "--answer",
                    "answer of t0",
                ]),
                "model = \"primary\"\nfallback_models = [\"backup\"]\n",
            ),
            1 => (
                fake_command(&["--exit", "4", "--stderr", "it broke\nin two lines"]),
                "max_retries = 0\n",
            ),
            _ => (
                fake_command(&[
                    "--usage",
                    "10,5,0.001",
                    "--answer",
                    &format!("answer of t{i}"),
                ]),
                "",
            ),
        };
        toml.push_str(&format!(
            "[[tasks]]\nlabel = \"t{i}\"\ncommand = {cmd}\n{extra}\n"
        ));
    }
    s.write("batch.toml", &toml)
}

#[test]
fn the_summary_is_a_table_with_totals_and_commands_and_outputs_only_for_small_runs() {
    let s = Scratch::new();
    let b = batch(&s, 25);
    let out = s.run(&["run", &b.display().to_string(), "--run-id", "bigrun"]);
    assert_eq!(out.status.code(), Some(1), "a failed task fails the run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = |label: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{label} ")))
            .unwrap_or_else(|| panic!("no row for {label}:\n{stdout}"))
            .to_owned()
    };
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("task ") && l.contains("state"))
    );
    let t0 = row("t0");
    assert!(
        t0.contains("completed") && t0.contains("primary → backup"),
        "{t0}"
    );
    let t1 = row("t1");
    assert!(t1.contains("failed"), "{t1}");
    assert!(
        stdout.contains("└ exited with code 4: in two lines"),
        "the first line of the error under its row:\n{stdout}"
    );
    assert!(
        stdout.contains("total: 25 task(s) · completed 24, failed 1"),
        "{stdout}"
    );
    assert!(stdout.contains("backup"), "usage by model:\n{stdout}");
    assert!(
        stdout.contains(&format!(
            "inspect: sortie --state-dir {} replay bigrun --task t1",
            s.state_dir().display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "rerun:   sortie --state-dir {} rerun bigrun",
            s.state_dir().display()
        )),
        "{stdout}"
    );
    // 25 tasks: more than the threshold, so no outputs.
    assert!(!stdout.contains("answer of t3"), "{stdout}");

    // `--outputs` shows them; `--json` says the same as one object.
    let b = batch(&s, 3);
    let out = s.run(&[
        "--json",
        "run",
        &b.display().to_string(),
        "--run-id",
        "small",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let tasks = v["tasks"].as_array().expect("tasks");
    assert_eq!(tasks[0]["models"], serde_json::json!(["primary", "backup"]));
    assert_eq!(tasks[0]["attempts"], 2);
    assert!(
        tasks[0]["text"]
            .as_str()
            .is_some_and(|t| t.ends_with("answer of t0")),
        "a small run shows outputs: {}",
        tasks[0]
    );
    assert_eq!(tasks[1]["state"], "failed");
    assert!(tasks[1]["duration_ms"].is_u64());
    assert_eq!(v["counts"]["completed"], 2);
    assert!(v["commands"].as_array().expect("commands").iter().any(|c| {
        c.as_str()
            .is_some_and(|c| c.contains("replay small --task t1"))
    }));
    let b = batch(&s, 22);
    let out = s.run(&[
        "--outputs",
        "run",
        &b.display().to_string(),
        "--run-id",
        "shown",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("answer of t21"));
}

/// Issue 37: a batch of `n` tasks running `true`, task `fails` running `false`.
fn true_batch(s: &Scratch, n: usize, fails: usize) -> std::path::PathBuf {
    let mut toml = String::from("concurrency = 64\n\n");
    for i in 0..n {
        let cmd = if i == fails { "false" } else { "true" };
        toml.push_str(&format!(
            "[[tasks]]\nlabel = \"t{i}\"\ncommand = [\"{cmd}\"]\nmax_retries = 0\n\n"
        ));
    }
    s.write("big.toml", &toml)
}

#[test]
fn a_big_run_shows_what_did_not_complete_and_a_line_per_state_not_every_task() {
    let s = Scratch::new();
    let b = true_batch(&s, 5_000, 4_321);
    let b = b.display().to_string();
    // `--quiet`: the summary only, at most 60 lines, the failed task's row and error among them.
    let out = s.run(&["--quiet", "run", &b, "--run-id", "quietbig"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() <= 60, "{} lines:\n{stdout}", lines.len());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = lines
        .iter()
        .position(|l| l.starts_with("t4321 ") && l.contains(" failed "))
        .unwrap_or_else(|| panic!("no row of the failed task:\n{stdout}"));
    assert!(
        lines[row + 1].contains("└ exited with code 1"),
        "its error under its row:\n{stdout}"
    );
    assert!(
        lines.iter().any(|l| l.trim() == "4999 completed"),
        "{stdout}"
    );
    assert!(lines.iter().any(|l| l.trim() == "1 failed"), "{stdout}");
    assert!(!lines.iter().any(|l| l.starts_with("t1 ")), "{stdout}");

    // Off a terminal, no line per launch or per completed task: the run's line, progress lines
    // and the failed task's.
    let out = s.run(&["run", &b, "--run-id", "plainbig"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() <= 60, "{} lines:\n{stderr}", lines.len());
    assert!(
        lines
            .iter()
            .any(|l| l.contains("[t4321] failed: exited with code 1")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("launching") && !stderr.contains("] completed"),
        "{stderr}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("run plainbig: 5000 task(s)")),
        "{stderr}"
    );

    // `status` lists what did not complete; `--state` filters, `--all` lists every row.
    let status = s.run_ok(&["status", "plainbig"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.lines().count() <= 60, "{text}");
    assert!(text.contains("  t4321 "), "{text}");
    let failed = s.run_ok(&["status", "plainbig", "--state", "failed,partial"]);
    let text = String::from_utf8_lossy(&failed.stdout);
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("  t")).collect();
    assert_eq!(rows.len(), 1, "{text}");
    let all = s.run_ok(&["status", "plainbig", "--all"]);
    let text = String::from_utf8_lossy(&all.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with("  t")).count(), 5_000);
    let results = s.run_ok(&["results", "plainbig", "--state", "failed"]);
    let text = String::from_utf8_lossy(&results.stdout);
    assert_eq!(
        text.lines().count(),
        2,
        "a header and the failed task:\n{text}"
    );
    assert!(
        text.lines().nth(1).is_some_and(|l| l.starts_with("t4321 ")),
        "{text}"
    );
    let json = s.run_ok(&["--json", "results", "plainbig", "--state", "completed"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(v.as_array().map(Vec::len), Some(4_999));
    // An unknown state is a usage error naming it.
    let bad = s.run(&["status", "plainbig", "--state", "broken"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("\"broken\""));
}
