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
