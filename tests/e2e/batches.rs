//! Batches at scale end to end (issue 14): a task template expanded over directories and
//! samples, run as ordinary tasks; out-of-range values refused before anything runs.

use std::path::{Path, PathBuf};

use crate::support::{Scratch, event_kind, fake_command, task_view, unique_run};
use sortie_testkit::Events;

/// A scratch git repository `name` under `root` with one committed file.
pub(crate) fn scratch_repo(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    sortie_testkit::git(&dir, &["init", "-q"]);
    std::fs::write(dir.join("README"), format!("{name}\n")).expect("write");
    sortie_testkit::git(&dir, &["add", "-A"]);
    sortie_testkit::git(&dir, &["commit", "-q", "-m", "initial"]);
    dir
}

#[test]
fn for_each_over_five_repositories_times_two_samples_runs_ten_ordinary_tasks() {
    let s = Scratch::new();
    for n in 1..=5 {
        scratch_repo(&s.path().join("repos"), &format!("r{n}"));
    }
    // Not a directory: the glob takes directories only.
    std::fs::write(s.path().join("repos/notes.txt"), "").expect("write");
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 4\n\n[[tasks]]\nlabel = \"{{name}}-{{sample}}\"\n\
             for_each = {{ glob = \"repos/*\" }}\ncount = 2\ncwd = \"{{item}}\"\n\
             isolation = \"worktree\"\noutput = \"out/{{name}}-{{sample}}.txt\"\n\
             command = {}\n",
            fake_command(&[
                "--quiet",
                "--write",
                "made.txt:{label}",
                "--answer",
                "{label}"
            ])
        ),
    );
    let run = unique_run("fe");
    let out = s.run(&["run", batch.to_str().expect("utf-8"), "--run-id", &run]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(&run);
    let labels = crate::support::labels(&events);
    let want: Vec<String> = (1..=5)
        .flat_map(|n| (1..=2).map(move |k| format!("r{n}-{k}")))
        .collect();
    assert_eq!(labels, want, "ten tasks, in item then sample order");
    let started = events
        .iter()
        .map(event_kind)
        .find(|(k, _)| *k == "RunStarted")
        .expect("RunStarted")
        .1;
    let tasks = started["batch"]["tasks"].as_array().expect("tasks");
    for (i, t) in tasks.iter().enumerate() {
        let repo = format!("r{}", i / 2 + 1);
        let cwd = t["cwd"].as_str().expect("cwd");
        assert!(cwd.ends_with(&format!("repos/{repo}")), "{i}: {cwd}");
        let finished = events.of(i as u64, "TaskFinished");
        assert_eq!(finished.len(), 1, "{i}");
        assert_eq!(
            finished[0]["result"]["state"], "completed",
            "{}",
            finished[0]
        );
        let label = &want[i];
        let artifact = s.path().join(format!("out/{label}.txt"));
        assert_eq!(
            std::fs::read_to_string(&artifact).expect("artifact").trim(),
            label.as_str()
        );
    }
    for n in 1..=5 {
        let repo = s.path().join(format!("repos/r{n}"));
        let branches = sortie_testkit::git(
            &repo,
            &["branch", "--list", "sortie/*", "--format=%(refname:short)"],
        );
        let mut got: Vec<&str> = branches.lines().collect();
        got.sort_unstable();
        assert_eq!(
            got,
            [
                format!("sortie/{run}/r{n}-1"),
                format!("sortie/{run}/r{n}-2")
            ],
            "each repository holds its own two samples' kept worktrees"
        );
    }
    s.audit_clean(&run);
}

#[test]
fn out_of_range_values_are_refused_naming_file_line_and_field() {
    let s = Scratch::new();
    let batch = s.write(
        "batch.toml",
        "[[tasks]]\ncommand = [\"true\"]\nmax_retries = 1000000\nattempt_timeout = \"1000d\"\n\
         stall_after = \"0s\"\n",
    );
    let out = s.run(&["run", batch.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("batch.toml:3: field `max_retries`: must be between 0 and 1000"),
        "{err}"
    );
    assert!(
        err.contains("batch.toml:4: field `attempt_timeout`: must be more than 0 to 7d"),
        "{err}"
    );
    assert!(
        !err.contains("stall_after"),
        "0s is off, not an error: {err}"
    );
    assert!(
        !s.state_dir().join("runs").exists()
            || std::fs::read_dir(s.state_dir().join("runs"))
                .expect("runs")
                .next()
                .is_none(),
        "nothing ran"
    );
}

/// `sortie check` with the variables that could hold an agent's key removed and `HOME` empty.
fn check_cmd(s: &Scratch, batch: &Path) -> std::process::Output {
    let home = s.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir");
    let mut c = s.sortie();
    c.env("HOME", &home);
    for k in [
        "PI_CODING_AGENT_DIR",
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "GEMINI_API_KEY",
        "GROQ_API_KEY",
        "XAI_API_KEY",
        "OPENROUTER_API_KEY",
        "MISTRAL_API_KEY",
        "CEREBRAS_API_KEY",
        "ZAI_API_KEY",
        "AWS_PROFILE",
        "AWS_ACCESS_KEY_ID",
    ] {
        c.env_remove(k);
    }
    c.args(["check", batch.to_str().expect("utf-8")]);
    c.output().expect("run sortie check")
}

#[test]
fn check_names_every_mistake_at_once_and_runs_nothing() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.path().join("plain-dir")).expect("mkdir");
    std::fs::write(s.path().join("a-file"), "").expect("write");
    let counter = s.path().join("spawned.txt");
    let counter_s = counter.display().to_string();
    let fine = fake_command(&["--quiet", "--counter", &counter_s]);
    let batch = s.write(
        "batch.toml",
        &format!(
            "[agents.ghost]\ncommand = [\"no-such-agent-zz\", \"{{prompt}}\"]\nprotocol = \"plain\"\n\
             may_write = false\n\n\
             [[tasks]]\nlabel = \"typo\"\ncommand = {fine}\nmax_retrys = 2\n\n\
             [[tasks]]\nlabel = \"nowhere\"\ncommand = {fine}\ncwd = \"no/such/dir\"\n\n\
             [[tasks]]\nlabel = \"ghost\"\nagent = \"ghost\"\nprompt = \"hi\"\n\n\
             [[tasks]]\nlabel = \"not-git\"\ncommand = {fine}\ncwd = \"plain-dir\"\n\
             isolation = \"worktree\"\n\n\
             [[tasks]]\nlabel = \"blocked\"\ncommand = {fine}\noutput = \"a-file/out.md\"\n\n\
             [[tasks]]\nlabel = \"no-key\"\nagent = \"pi\"\nprompt = \"hi\"\n"
        ),
    );
    let out = check_cmd(&s, &batch);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    for want in [
        "batch.toml:9: field `max_retrys`: unknown field; did you mean `max_retries`?",
        "batch.toml:14: field `cwd`: task `nowhere`: the directory",
        "batch.toml:18: field `agent`: task `ghost`: the agent `ghost`'s program \
         `no-such-agent-zz` is not on PATH",
        "batch.toml:25: field `isolation`: task `not-git`: `isolation = \"worktree\"` needs a \
         git repository",
        "batch.toml:30: field `output`: task `blocked`:",
        "a-file is not a directory",
        "batch.toml:34: field `agent`: task `no-key`: no credentials for pi",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(text.contains("nothing was run"), "{text}");
    assert!(!counter.exists(), "no agent was spawned");
    assert!(
        !s.state_dir().join("runs").exists(),
        "no run was created: {text}"
    );

    // Fixed, the same batch is ready: exit 0, still nothing spawned.
    let ok = s.write(
        "ok.toml",
        &format!("[[tasks]]\nlabel = \"{{name}}\"\nfor_each = [\"a\", \"b\"]\ncommand = {fine}\n"),
    );
    let out = check_cmd(&s, &ok);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("2 tasks ready to run"), "{text}");
    assert!(!counter.exists(), "no agent was spawned");
}

#[test]
fn apply_all_commit_applies_in_task_order_one_commit_each_and_stops_at_the_conflict() {
    let s = Scratch::new();
    let repo = scratch_repo(s.path(), "repo");
    std::fs::write(repo.join("shared.txt"), "base\n").expect("write");
    sortie_testkit::git(&repo, &["add", "-A"]);
    sortie_testkit::git(&repo, &["commit", "-q", "-m", "shared"]);
    // sortie's own commits need an identity; a CI machine has none configured.
    sortie_testkit::git(&repo, &["config", "user.name", "Test"]);
    sortie_testkit::git(&repo, &["config", "user.email", "test@example.invalid"]);
    let task = |label: &str, write: &str| {
        format!(
            "\n[[tasks]]\nlabel = \"{label}\"\ncommand = {}\n",
            fake_command(&["--quiet", "--write", write])
        )
    };
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 3\n[defaults]\nisolation = \"worktree\"\ncwd = {:?}\n{}{}{}",
            repo.display().to_string(),
            task("first", "shared.txt:first"),
            task("second", "shared.txt:second"),
            task("third", "third.txt:third"),
        ),
    );
    let run = unique_run("ap");
    s.run_ok(&["run", batch.to_str().expect("utf-8"), "--run-id", &run]);

    // The summary of status names each kept worktree: path, branch and diff stat.
    let status = String::from_utf8_lossy(&s.run_ok(&["status", &run]).stdout).into_owned();
    assert!(status.contains("kept worktrees (3):"), "{status}");
    for label in ["first", "second", "third"] {
        assert!(
            status.contains(&format!("(sortie/{run}/{label})")),
            "{status}"
        );
        assert!(
            status.contains(&format!("worktrees/{run}/{label}")),
            "{status}"
        );
    }
    assert!(status.contains("1 file changed"), "{status}");

    // diff RUN: every kept worktree, in task order.
    let diff = String::from_utf8_lossy(&s.run_ok(&["diff", &run]).stdout).into_owned();
    let at = |l: &str| {
        diff.find(&format!("# sortie: {l} "))
            .unwrap_or_else(|| panic!("{l} in {diff}"))
    };
    assert!(
        at("first") < at("second") && at("second") < at("third"),
        "{diff}"
    );
    assert!(diff.contains("+second"), "{diff}");

    let head_before = sortie_testkit::git(&repo, &["rev-parse", "HEAD"]);
    let out = s.run(&["apply", &run, "--all", "--commit"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("applied first's change to") && stdout.contains("committed as"),
        "{stdout}"
    );
    assert!(
        stderr.contains("second's change conflicts with"),
        "{stderr}"
    );
    assert!(stderr.contains("not applied: third"), "{stderr}");
    // One commit, first's, on top of what was there; second changed nothing; third not reached.
    let log = sortie_testkit::git(
        &repo,
        &[
            "log",
            "--format=%s",
            &format!("{}..HEAD", head_before.trim()),
        ],
    );
    assert_eq!(log.trim(), format!("sortie: first (run {run})"));
    assert_eq!(
        std::fs::read_to_string(repo.join("shared.txt")).expect("read"),
        "base\nfirst\n"
    );
    assert!(!repo.join("third.txt").exists(), "third was not applied");
    let dirty = sortie_testkit::git(&repo, &["status", "--porcelain"]);
    assert_eq!(
        dirty.trim(),
        "",
        "the checkout is clean: nothing half-applied"
    );
}

#[test]
fn a_run_budget_stops_a_batch_warning_first_and_ends_with_the_reason() {
    let s = Scratch::new();
    let fast = fake_command(&["--quiet", "--usage", "60,40,0.001"]);
    // 100 tokens every 2 s, for 200 s: the budget runs out while it works.
    let slow = fake_command(&[
        "--quiet",
        "--usage",
        "6000,4000,0.1",
        "--turns",
        "100",
        "--sleep",
        "200",
    ]);
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 1\n\n[budget]\nmax_tokens = 220\n\n[defaults]\nkill_grace = \"1s\"\n\n\
             [[tasks]]\nlabel = \"a\"\ncommand = {fast}\n\n\
             [[tasks]]\nlabel = \"b\"\ncommand = {fast}\n\n\
             [[tasks]]\nlabel = \"c\"\ncommand = {slow}\n\n\
             [[tasks]]\nlabel = \"d\"\ncommand = {fast}\n\n\
             [[tasks]]\nlabel = \"e\"\ncommand = {fast}\n"
        ),
    );
    let run = unique_run("bu");
    let out = s.run(&["run", batch.to_str().expect("utf-8"), "--run-id", &run]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "partial: {stdout}\n{stderr}");
    assert!(
        stdout.contains("Run budget exceeded: run tokens") && stdout.contains("max_tokens 220"),
        "{stdout}"
    );
    assert!(
        stderr.contains("warning: the run has used") && stderr.contains("budget's max_tokens"),
        "{stderr}"
    );
    let events = s.events(&run);
    let kinds: Vec<&str> = events.iter().map(|e| event_kind(e).0).collect();
    let warned = kinds.iter().position(|k| *k == "RunBudgetWarned");
    let exceeded = kinds.iter().position(|k| *k == "RunBudgetExceeded");
    assert!(
        warned.is_some() && warned < exceeded,
        "warned, then exceeded: {kinds:?}"
    );
    let result = |i: usize| {
        let f = events.of(i as u64, "TaskFinished");
        assert_eq!(f.len(), 1, "task {i}");
        f[0]["result"].clone()
    };
    for i in [0, 1] {
        assert_eq!(result(i)["state"], "completed", "{}", result(i));
    }
    // Stopped (a plain command cannot be steered) before it printed anything: a budget stop
    // without output is failed (partial needs output).
    let c = result(2);
    assert_eq!(
        (c["state"].as_str(), c["stop_reason"].as_str()),
        (Some("failed"), Some("budget")),
        "{c}"
    );
    assert!(
        c["error"]
            .as_str()
            .is_some_and(|e| e.contains("the run's budget ran out")),
        "{c}"
    );
    for i in [3, 4] {
        let r = result(i);
        assert_eq!(
            (r["state"].as_str(), r["stop_reason"].as_str()),
            (Some("cancelled"), Some("budget")),
            "{r}"
        );
        assert!(
            events.of(i as u64, "AttemptLaunching").is_empty(),
            "task {i} never started"
        );
    }
    s.audit_clean(&run);
}

#[test]
fn a_rerun_of_the_failed_tasks_carries_the_rest_with_their_ledger_apart() {
    let s = Scratch::new();
    let count = |name: &str| s.path().join(format!("{name}.count")).display().to_string();
    let (ca, cd) = (count("a"), count("d"));
    let good =
        |counter: &str| fake_command(&["--quiet", "--usage", "100,50,0.5", "--counter", counter]);
    let flaky =
        "[\"sh\", \"-c\", \"if [ -f fixed ]; then echo fixed; else echo broken; exit 1; fi\"]";
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 2\n\n\
             [[tasks]]\nlabel = \"a\"\ncommand = {}\n\n\
             [[tasks]]\nlabel = \"b\"\ncommand = {flaky}\n\n\
             [[tasks]]\nlabel = \"c\"\nneeds = [\"b\"]\ncommand = [\"echo\", \"after b\"]\n\n\
             [[tasks]]\nlabel = \"d\"\ncommand = {}\n",
            good(&ca),
            good(&cd)
        ),
    );
    let parent = unique_run("p");
    let out = s.run(&["run", batch.to_str().expect("utf-8"), "--run-id", &parent]);
    assert_eq!(out.status.code(), Some(1), "b fails, c is skipped");
    // A finished run cannot be resumed; it can be rerun.
    std::fs::write(s.path().join("fixed"), "").expect("write");
    let child = unique_run("c");
    let out = s.run(&["rerun", &parent, "--failed", "--run-id", &child]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(&child);
    let kinds: Vec<&str> = events.iter().map(|e| event_kind(e).0).collect();
    assert_eq!(kinds.get(1), Some(&"RunRerunOf"), "{kinds:?}");
    assert_eq!(event_kind(&events[1]).1["parent"], parent.as_str());
    for (i, carried) in [(0, true), (1, false), (2, false), (3, true)] {
        assert_eq!(
            events.of(i, "TaskCarried").len(),
            usize::from(carried),
            "task {i}"
        );
        assert_eq!(
            events.of(i, "AttemptLaunching").is_empty(),
            carried,
            "task {i}: carried tasks are not run again, the others are"
        );
    }
    for c in [&ca, &cd] {
        let ran = std::fs::read_to_string(c).expect("counter");
        assert_eq!(ran.lines().count(), 1, "{c}: ran once, in the parent only");
    }
    // The ledger is the run's own spending; the carried usage is shown apart.
    let status = s.status(&child);
    assert_eq!(status["usage"]["input"], 0, "{status}");
    assert_eq!(
        crate::support::task_view(&status, "a")["carried"]["input"],
        100
    );
    assert!(
        stdout.contains(&format!("carried from run {parent} (2 tasks")),
        "{stdout}"
    );
    assert!(stdout.contains("carried total"), "{stdout}");
    let list = String::from_utf8_lossy(&s.run_ok(&["list"]).stdout).into_owned();
    assert!(list.contains(&format!("(rerun of {parent})")), "{list}");
    s.audit_clean(&child);
}

#[test]
fn two_runs_at_once_share_a_machine_wide_cap_of_two_live_attempts() {
    use std::collections::BTreeSet;
    let s = Scratch::new();
    let slots = s.path().join("slots");
    let work = fake_command(&["--quiet", "--sleep", "1.5"]);
    let mut toml = String::from("concurrency = 3\n");
    for l in ["x", "y", "z"] {
        toml.push_str(&format!("\n[[tasks]]\nlabel = \"{l}\"\ncommand = {work}\n"));
    }
    let batch = s.write("batch.toml", &toml);
    let runs = [unique_run("m1"), unique_run("m2")];
    let mut bg = Vec::new();
    for run in &runs {
        let mut c = s.sortie();
        c.env("SORTIE_MACHINE_SLOTS", "2")
            .env("SORTIE_SLOTS_DIR", &slots)
            .args(["run", batch.to_str().expect("utf-8"), "--run-id", run])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        bg.push(crate::support::Background::from_command(c, run));
    }
    // Sample /proc until both runs are done: never more than 2 attempts alive across them.
    let mut most = 0;
    let mut seen = BTreeSet::new();
    // The run index says when a run is over, without opening its journal.
    let done = |run: &str| {
        std::fs::read(s.state_dir().join("index").join(run))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|e| e["status"].get("finished").is_some())
    };
    let start = std::time::Instant::now();
    while !(done(&runs[0]) && done(&runs[1])) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "the runs did not finish"
        );
        let mut alive = BTreeSet::new();
        for run in &runs {
            for m in sortie_testkit::marked_processes(run) {
                alive.insert((run.clone(), m.attempt));
            }
        }
        most = most.max(alive.len());
        seen.extend(alive);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for b in bg {
        let out = b.finish(60);
        assert!(out.status.success(), "{out:?}");
    }
    assert!(
        most <= 2,
        "{most} attempts were alive at once across the two runs: {seen:?}"
    );
    for run in &runs {
        let events = s.events(run);
        for i in 0..3 {
            let f = events.of(i, "TaskFinished");
            assert_eq!(f[0]["result"]["state"], "completed", "{run} task {i}");
        }
    }
}

/// #32: a task that runs `sortie run` under `SORTIE_MACHINE_SLOTS=1` used to wait, silent, for
/// the one slot its own attempt held, until its attempt timed out. The nested run takes no slot
/// (its parent's attempt holds one for it) and completes; a run nested deeper than sortie
/// allows is refused at once, naming the limit.
#[test]
fn a_nested_run_uses_its_parents_slot_and_too_deep_a_nesting_is_refused() {
    let s = Scratch::new();
    let slots = s.path().join("slots");
    let sortie = env!("CARGO_BIN_EXE_sortie");
    let state = s.path().join("inner-state");
    let inner = s.write(
        "inner.toml",
        &format!(
            "[[tasks]]\nlabel = \"inner\"\ncommand = {}\n",
            fake_command(&["--answer", "inner done"])
        ),
    );
    let outer = s.write(
        "outer.toml",
        &format!(
            "[defaults]\nattempt_timeout = \"60s\"\nmax_retries = 0\n\n\
             [[tasks]]\nlabel = \"outer\"\ncommand = [{sortie:?}, \"--state-dir\", {:?}, \"run\", \
             {:?}]\n",
            state.display().to_string(),
            inner.display().to_string()
        ),
    );
    let out = s
        .sortie()
        .env("SORTIE_MACHINE_SLOTS", "1")
        .env("SORTIE_SLOTS_DIR", &slots)
        .env_remove("SORTIE_DEPTH")
        .args(["run", "--run-id", "outer", outer.to_str().expect("utf-8")])
        .output()
        .expect("sortie run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "the nested run completes in its parent's slot\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = s.status("outer");
    assert_eq!(
        task_view(&status, "outer")["state"],
        "completed",
        "{status}"
    );

    let deep = s
        .sortie()
        .env("SORTIE_DEPTH", "4")
        .args(["run", "--run-id", "deep", inner.to_str().expect("utf-8")])
        .output()
        .expect("sortie run");
    let stderr = String::from_utf8_lossy(&deep.stderr);
    assert_eq!(deep.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("nested 4 deep") && stderr.contains("at most 3"),
        "{stderr}"
    );
    assert!(
        !s.state_dir().join("runs/deep").exists(),
        "a refused run leaves no trace"
    );
}

/// #37: a task whose attempt waits for a machine-wide slot is `waiting`, not `running`, and
/// its attempt clock starts when it gets the slot: a wait longer than its `attempt_timeout`
/// does not time it out.
#[test]
fn a_task_waiting_for_a_machine_slot_is_waiting_and_its_attempt_clock_has_not_started() {
    let s = Scratch::new();
    let slots = s.path().join("slots");
    std::fs::create_dir_all(&slots).expect("mkdir slots");
    // Another user of the machine holds the one slot: `flock` holds it while `cat` reads
    // its stdin (`-o`: `cat` does not inherit the lock), until the test closes that.
    let mut holder = std::process::Command::new("flock")
        .arg("-o")
        .arg(slots.join("slot-0"))
        .arg("cat")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("flock holds the slot");
    let batch = s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"t\"\ncommand = [\"true\"]\nattempt_timeout = \"1s\"\n",
    );
    let run = unique_run("slotwait");
    let mut c = s.sortie();
    c.env("SORTIE_MACHINE_SLOTS", "1")
        .env("SORTIE_SLOTS_DIR", &slots)
        .args(["run", batch.to_str().expect("utf-8"), "--run-id", &run])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let bg = crate::support::Background::from_command(c, &run);
    s.wait_task_state(&run, 0, "waiting");
    let text = String::from_utf8_lossy(&s.run_ok(&["status", &run]).stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("t ") && l.contains("waiting")),
        "{text}"
    );
    // Longer than the attempt timeout: only the wait, not the attempt, runs meanwhile.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(
        s.task_state(&run, 0).as_deref(),
        Some("waiting"),
        "still waiting while the slot is held"
    );
    drop(holder.stdin.take());
    let _ = holder.wait();
    let out = bg.finish(60);
    assert!(out.status.success(), "{out:?}");
    let events = s.events(&run);
    let names: Vec<&str> = events
        .iter()
        .filter_map(|e| e["event"].as_object()?.keys().next().map(String::as_str))
        .collect();
    let at = |n: &str| names.iter().position(|x| *x == n);
    assert!(
        at("AttemptWaiting") < at("AttemptStarted") && at("AttemptWaiting").is_some(),
        "{names:?}"
    );
    assert_eq!(
        events.of(0, "TaskFinished")[0]["result"]["state"],
        "completed",
        "the wait did not count against its attempt_timeout"
    );
    let replay = String::from_utf8_lossy(&s.run_ok(&["replay", &run]).stdout).into_owned();
    assert!(replay.contains("waits for a machine-wide slot"), "{replay}");
    s.audit_clean(&run);
}
