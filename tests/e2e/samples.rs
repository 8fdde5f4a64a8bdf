//! #33: samples, pass@k and best-of-N, end to end. The fake agent is a plain `sh` command that
//! appends its task's number (from `SORTIE_ATTEMPT`, `RUN/TASK/ATTEMPT/...`) to `starts`, then
//! passes when that number is listed in `passes`: deterministic, mixed, and counted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sortie_testkit::git;

use crate::support::{Scratch, unique_run};

/// The agent: records its start, writes `out-N.txt` in its working directory, then exits 0 when
/// its task number is in `passes`, else 1; a number in `slow` sleeps first.
fn agent(dir: &Path) -> String {
    let script = "i=${SORTIE_ATTEMPT#*/}; i=${i%%/*}; echo $i >> \"$0/starts\"; \
                  echo $i > out-$i.txt; \
                  if grep -qx \"$i\" \"$0/slow\" 2>/dev/null; then sleep 60; fi; \
                  grep -qx \"$i\" \"$0/passes\"";
    format!(
        "[\"sh\", \"-c\", {}, {:?}]",
        toml_string(script),
        dir.display().to_string()
    )
}

fn toml_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string")
}

/// The tasks (by number) that pass: a seeded pseudo-random choice, about half.
fn seeded_passes(total: u32, seed: u64) -> BTreeSet<u32> {
    let mut x = seed;
    (0..total)
        .filter(|_| {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 63 == 1
        })
        .collect()
}

fn write_set(s: &Scratch, name: &str, set: &BTreeSet<u32>) {
    let text: String = set.iter().map(|i| format!("{i}\n")).collect();
    s.write(name, &text);
}

/// C(n, k), exactly.
fn choose(n: u64, k: u64) -> u128 {
    if k > n {
        return 0;
    }
    (0..k).fold(1u128, |acc, i| acc * u128::from(n - i) / u128::from(i + 1))
}

fn starts(s: &Scratch) -> Vec<u32> {
    std::fs::read_to_string(s.path().join("starts"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn results_json(s: &Scratch, run: &str) -> Value {
    let out = s.run_ok(&["--json", "results", run]);
    serde_json::from_slice(&out.stdout).expect("results --json")
}

#[test]
fn samples_count_n_c_and_pass_at_k_per_item() {
    let s = Scratch::new();
    let run = unique_run("samples");
    // Seeded so that the items differ: some pass all, some none, most in between.
    let passes = seeded_passes(20, 0x5eed_0033);
    write_set(&s, "passes", &passes);
    let batch = format!(
        "concurrency = 4\n\n[[tasks]]\nlabel = \"fix-{{item}}-{{sample}}\"\n\
         command = {}\nfor_each = [\"a\", \"b\", \"c\", \"d\"]\ncount = 5\n",
        agent(s.path())
    );
    s.write("batch.toml", &batch);
    let out = s.run(&["run", "--run-id", &run, "batch.toml"]);
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(starts(&s).len(), 20, "every sample ran");

    let v = results_json(&s, &run);
    assert_eq!(v["tasks"].as_array().map(Vec::len), Some(20), "{v}");
    let items = v["samples"].as_array().expect("a samples array");
    let names: Vec<&str> = items.iter().filter_map(|i| i["item"].as_str()).collect();
    assert_eq!(names, ["fix-a-*", "fix-b-*", "fix-c-*", "fix-d-*"]);
    for (x, item) in items.iter().enumerate() {
        let n = 5u64;
        let c = (0..5)
            .filter(|k| passes.contains(&(x as u32 * 5 + k)))
            .count() as u64;
        assert_eq!(item["n"], n, "{item}");
        assert_eq!(item["c"], c, "{item}");
        let pass_at: Vec<f64> = item["pass_at"]
            .as_array()
            .expect("pass_at")
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        let expected: Vec<f64> = (1..=n)
            .map(|k| 1.0 - choose(n - c, k) as f64 / choose(n, k) as f64)
            .collect();
        assert_eq!(pass_at.len(), expected.len(), "{item}");
        for (got, want) in pass_at.iter().zip(&expected) {
            assert!(
                (got - want).abs() < 1e-9,
                "{item}: {pass_at:?} vs {expected:?}"
            );
        }
        assert!((item["mean_score"].as_f64().unwrap_or(-1.0) - c as f64 / 5.0).abs() < 1e-9);
        assert!(item["winner"].is_null(), "no pick, no winner: {item}");
        assert!(
            summary.contains(&format!(
                "fix-{}-*: {c} of 5 passed",
                ["a", "b", "c", "d"][x]
            )),
            "{summary}"
        );
    }
    let cs: BTreeSet<u64> = items.iter().filter_map(|i| i["c"].as_u64()).collect();
    assert!(
        cs.len() > 1 && cs.iter().any(|c| (1..5).contains(c)),
        "mixed: {cs:?}"
    );
    let total_c: u64 = items.iter().filter_map(|i| i["c"].as_u64()).sum();
    assert_eq!(total_c, passes.len() as u64);
    let models = v["rates"]["models"].as_array().expect("rates per model");
    assert_eq!(models.len(), 1, "{v}");
    assert_eq!(models[0]["n"], 20);
    assert_eq!(models[0]["c"], passes.len() as u64);
    let [lo, hi] = [&models[0]["wilson95"][0], &models[0]["wilson95"][1]].map(|x| x.as_f64());
    let rate = passes.len() as f64 / 20.0;
    assert!(
        lo.is_some_and(|l| l < rate) && hi.is_some_and(|h| h > rate),
        "{v}"
    );

    // --jsonl: the tasks, then a line per item.
    let jsonl = s.run_ok(&["results", &run, "--jsonl"]);
    let lines: Vec<Value> = String::from_utf8_lossy(&jsonl.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let sample_lines: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "samples").collect();
    assert_eq!(sample_lines.len(), 4);
    assert_eq!(sample_lines[0]["pass_at"], items[0]["pass_at"]);
    // The table: the samples table after the tasks.
    let table = s.run_ok(&["results", &run]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("PASS@5"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("fix-d-*")), "{table}");
    // The HTML report has each item's counts.
    let file = s.path().join("report.html");
    s.run_ok(&["report", &run, "--html", &file.display().to_string()]);
    let html = std::fs::read_to_string(&file).expect("the report");
    assert!(html.contains("<h2>Samples</h2>"), "{html}");
    assert!(html.contains("<td>fix-c-*</td>"), "{html}");
}

/// A repository `repo/` with one commit.
fn repo(s: &Scratch) -> PathBuf {
    let repo = s.path().join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir repo");
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("f.txt"), "one\n").expect("write f.txt");
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "init"]);
    repo
}

#[test]
fn first_pass_stops_an_item_at_its_first_passing_sample_and_keeps_only_its_worktree() {
    let s = Scratch::new();
    let _repo = repo(&s);
    let run = unique_run("first-pass");
    // Item a passes at its 2nd sample, b at its 1st, c never, d at its 3rd.
    let passes: BTreeSet<u32> = [1, 5, 17].into_iter().collect();
    write_set(&s, "passes", &passes);
    let batch = format!(
        "concurrency = 1\n\n[[tasks]]\nlabel = \"fix-{{item}}-{{sample}}\"\n\
         cwd = \"repo\"\nisolation = \"worktree\"\ncommand = {}\n\
         for_each = [\"a\", \"b\", \"c\", \"d\"]\ncount = 5\npick = \"first-pass\"\n",
        agent(s.path())
    );
    s.write("batch.toml", &batch);
    let out = s
        .sortie()
        .args(["run", "--run-id", &run, "batch.toml"])
        .output()
        .expect("run sortie");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // a: 2 starts, b: 1, c: 5, d: 3.
    let started = starts(&s);
    assert_eq!(started.len(), 11, "{started:?}\n{said}");
    assert!(started.len() < 20);

    let v = results_json(&s, &run);
    let items = v["samples"].as_array().expect("samples");
    let winners: Vec<&Value> = items.iter().map(|i| &i["winner"]).collect();
    assert_eq!(
        winners,
        [
            &Value::from("fix-a-2"),
            &Value::from("fix-b-1"),
            &Value::Null,
            &Value::from("fix-d-3")
        ],
        "{v}"
    );
    let task = |label: &str| -> Value {
        v["tasks"]
            .as_array()
            .and_then(|t| t.iter().find(|r| r["label"] == label).cloned())
            .unwrap_or(Value::Null)
    };
    assert_eq!(task("fix-a-3")["state"], "cancelled");
    assert_eq!(
        task("fix-a-3")["error"],
        "cancelled: sample fix-a-2 of fix-a-* passed first"
    );
    assert_eq!(
        task("fix-c-5")["state"],
        "failed",
        "c has no winner: all ran"
    );
    // a: n counts the judged samples (a-1 failed, a-2 passed); the cancelled ones are not.
    assert_eq!(
        (items[0]["n"].as_u64(), items[0]["c"].as_u64()),
        (Some(2), Some(1))
    );

    // The winners' worktrees are kept; the other samples' kept ones were discarded after the
    // run, their patches kept.
    let wt = |label: &str| s.state_dir().join("worktrees").join(&run).join(label);
    for w in ["fix-a-2", "fix-b-1", "fix-d-3"] {
        assert!(wt(w).exists(), "{w}'s worktree is kept\n{said}");
    }
    for l in ["fix-a-1", "fix-d-1", "fix-d-2"] {
        assert!(!wt(l).exists(), "{l}'s worktree was discarded\n{said}");
        let patch = s.state_dir().join("runs").join(&run).join("patches");
        assert!(
            patch.join(format!("{l}.patch")).exists(),
            "{l}'s patch stays in the run dir"
        );
    }
    // An item no sample of which passed keeps its worktrees for a look.
    assert!(wt("fix-c-1").exists(), "{said}");
    let events = s.events(&run);
    let discarded: Vec<&Value> = events
        .iter()
        .filter_map(|e| e["event"].get("WorktreeDiscarded"))
        .collect();
    assert!(discarded.iter().all(|d| d["by"] == "pick"), "{discarded:?}");
    // a-1, d-1, d-2.
    assert_eq!(discarded.len(), 3, "{discarded:?}");
    // apply --all applies the winners only.
    let applied = s.run_ok(&["--json", "apply", &run, "--all"]);
    let applied: Value = serde_json::from_slice(&applied.stdout).expect("apply --json");
    let labels: Vec<&str> = applied["applied"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["label"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(labels, ["fix-a-2", "fix-b-1", "fix-d-3"], "{applied}");
}

#[test]
fn first_pass_stops_a_running_sample_once_another_passes() {
    let s = Scratch::new();
    let run = unique_run("first-pass-stop");
    // Sample 1 (task 0) hangs, sample 2 (task 1) passes at once.
    write_set(&s, "passes", &[1].into_iter().collect());
    write_set(&s, "slow", &[0].into_iter().collect());
    let batch = format!(
        "concurrency = 2\n\n[[tasks]]\nlabel = \"s-{{sample}}\"\n\
         command = {}\ncount = 3\npick = \"first-pass\"\n",
        agent(s.path())
    );
    s.write("batch.toml", &batch);
    let _ = s.run(&["run", "--run-id", &run, "batch.toml"]);
    let v = results_json(&s, &run);
    let task = |label: &str| -> Value {
        v["tasks"]
            .as_array()
            .and_then(|t| t.iter().find(|r| r["label"] == label).cloned())
            .unwrap_or(Value::Null)
    };
    assert_eq!(task("s-2")["state"], "completed", "{v}");
    assert_eq!(task("s-1")["state"], "cancelled", "{v}");
    assert!(
        task("s-1")["error"]
            .as_str()
            .is_some_and(|e| e.contains("sample s-2 of s-* passed first")),
        "{v}"
    );
    assert_eq!(task("s-3")["state"], "cancelled", "{v}");
    assert_eq!(starts(&s).len(), 2, "s-3 never started");
    assert_eq!(v["samples"][0]["winner"], "s-2");
}

/// A check that reads its task's number from `SORTIE_ATTEMPT`, writes the score `scores` gives
/// it (`N SCORE` lines) to `SORTIE_VERIFY_RESULT`, and passes when the number is in `passes`.
fn check(dir: &Path) -> String {
    let script = format!(
        "i=${{SORTIE_ATTEMPT#*/}}; i=${{i%%/*}}; \
         sc=$(awk -v i=$i '$1 == i {{ print $2 }}' {d}/scores); \
         echo \"{{\\\"score\\\": ${{sc:-0}}}}\" > \"$SORTIE_VERIFY_RESULT\"; \
         grep -qx \"$i\" {d}/passes",
        d = dir.display()
    );
    toml_string(&script)
}

#[test]
fn best_score_keeps_the_passed_sample_with_the_highest_check_score() {
    let s = Scratch::new();
    let _repo = repo(&s);
    let run = unique_run("best-score");
    // Every agent completes; the checks pass for 0, 1 and 3. Task 2 has the highest score but
    // fails its check; 1 and 3 tie: the earliest wins.
    write_set(&s, "passes", &[0, 1, 3].into_iter().collect());
    s.write("agent-passes", "0\n1\n2\n3\n");
    s.write("scores", "0 0.5\n1 0.9\n2 0.95\n3 0.9\n");
    let agent = agent(s.path()).replace("/passes", "/agent-passes");
    let batch = format!(
        "concurrency = 2\n\n[[tasks]]\nlabel = \"s-{{sample}}\"\ncwd = \"repo\"\n\
         isolation = \"worktree\"\ncommand = {agent}\nverify = {}\ncount = 4\n\
         pick = \"best-score\"\n",
        check(s.path())
    );
    s.write("batch.toml", &batch);
    let out = s.run(&["run", "--run-id", &run, "batch.toml"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let v = results_json(&s, &run);
    let item = &v["samples"][0];
    assert_eq!(item["winner"], "s-2", "{v}\n{said}");
    assert_eq!(
        (item["n"].as_u64(), item["c"].as_u64()),
        (Some(4), Some(3)),
        "{v}"
    );
    let mean = item["mean_score"].as_f64().unwrap_or_default();
    assert!((mean - (0.5 + 0.9 + 0.95 + 0.9) / 4.0).abs() < 1e-9, "{v}");
    let wt = |label: &str| s.state_dir().join("worktrees").join(&run).join(label);
    assert!(wt("s-2").exists(), "the winner's worktree is kept\n{said}");
    for l in ["s-1", "s-4"] {
        assert!(!wt(l).exists(), "{l}'s worktree was discarded\n{said}");
    }
}

#[test]
fn first_pass_with_a_check_waits_for_a_passed_check() {
    let s = Scratch::new();
    let run = unique_run("first-pass-check");
    // Every agent completes; only task 2's check passes. Task 3 may start while task 2's check
    // runs (a check holds no slot): it hangs until it is stopped, so that task 4 cannot start
    // before the verdict.
    s.write("agent-passes", "0\n1\n2\n3\n4\n");
    write_set(&s, "slow", &[3].into_iter().collect());
    write_set(&s, "passes", &[2].into_iter().collect());
    s.write("scores", "");
    let agent = agent(s.path()).replace("/passes", "/agent-passes");
    let batch = format!(
        "concurrency = 1\n\n[[tasks]]\nlabel = \"s-{{sample}}\"\ncommand = {agent}\n\
         verify = {}\ncount = 5\npick = \"first-pass\"\n",
        check(s.path())
    );
    s.write("batch.toml", &batch);
    let _ = s.run(&["run", "--run-id", &run, "batch.toml"]);
    let started = starts(&s);
    assert_eq!(started[..3], [0, 1, 2], "{started:?}");
    assert!(!started.contains(&4), "s-5 never started: {started:?}");
    let v = results_json(&s, &run);
    let item = &v["samples"][0];
    assert_eq!(item["winner"], "s-3", "{v}");
    assert_eq!(
        (item["n"].as_u64(), item["c"].as_u64()),
        (Some(3), Some(1)),
        "{v}"
    );
    let states: Vec<&str> = v["tasks"]
        .as_array()
        .map(|t| t.iter().filter_map(|r| r["state"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        states,
        ["failed", "failed", "completed", "cancelled", "cancelled"],
        "{v}"
    );
}
