//! #33: a check decides each task (`verify`), and a failed check is fed back to the agent
//! (`verify_rounds`). The agent is a plain command in a small git repository with a failing
//! test: it fixes the code only on a round whose input (the file `SORTIE_VERIFY_FEEDBACK`
//! names) holds the failing test's output.

use std::path::{Path, PathBuf};

use sortie_testkit::git;

use sortie_runner::engine::TEST_PAUSE_AFTER as PAUSE_AFTER;

use crate::support::{Background, Scratch, event_kind, poll, send_signal, task_view, unique_run};

/// A repository `repo/` with `calc.sh` (a wrong `add`) and `test.sh`, its test: it fails
/// with `FAILED test_add: add 2 2 gave 0, expected 4` until `add` adds.
fn repo(s: &Scratch) -> PathBuf {
    failing_repo(s, "repo")
}

/// A repository `name/` (in the scratch dir) as [`repo`] makes it (also for `real_verify`).
pub(crate) fn failing_repo(s: &Scratch, name: &str) -> PathBuf {
    let repo = s.path().join(name);
    std::fs::create_dir_all(&repo).expect("mkdir repo");
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("calc.sh"), "add() { echo $(( $1 - $2 )); }\n").expect("calc");
    std::fs::write(
        repo.join("test.sh"),
        ". ./calc.sh\n\
         echo 'running 1 test'\n\
         got=$(add 2 2)\n\
         if [ \"$got\" = 4 ]; then echo '1 passed'; exit 0; fi\n\
         echo \"FAILED test_add: add 2 2 gave $got, expected 4\" >&2\n\
         echo '1 failed'\n\
         exit 1\n",
    )
    .expect("test");
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "init"]);
    repo
}

/// The agent: counts its rounds in `rounds.log` (outside the repository); fixes `add` only when
/// its feedback holds the test's failure.
fn agent(s: &Scratch) -> String {
    let log = s.path().join("rounds.log");
    format!(
        "echo round >> {log}; \
         if [ -n \"$SORTIE_VERIFY_FEEDBACK\" ] && grep -q 'FAILED test_add' \"$SORTIE_VERIFY_FEEDBACK\"; then \
           sed -i 's/\\$1 - \\$2/$1 + $2/' calc.sh; echo 'fixed add'; \
         else echo 'looked at calc.sh; it seems fine'; fi",
        log = log.display()
    )
}

fn batch(s: &Scratch, rounds: u32) -> PathBuf {
    let text = format!(
        "[[tasks]]\nlabel = \"fix\"\ncwd = \"repo\"\nisolation = \"worktree\"\n\
         command = [\"sh\", \"-c\", {agent:?}]\n\
         verify = \"sh test.sh\"\nverify_rounds = {rounds}\n",
        agent = agent(s)
    );
    s.write("batch.toml", &text)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn rounds(s: &Scratch) -> usize {
    std::fs::read_to_string(s.path().join("rounds.log"))
        .unwrap_or_default()
        .lines()
        .count()
}

fn run(s: &Scratch, run: &str, batch: &Path) -> std::process::Output {
    s.run(&["run", "--run-id", run, batch.to_str().expect("utf-8 path")])
}

#[test]
fn a_failed_check_is_fed_back_and_the_task_completes_verified_after_one_round() {
    let s = Scratch::new();
    let repo = repo(&s);
    let id = unique_run("verify-round");
    let out = run(&s, &id, &batch(&s, 1));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("verified after 1 round"), "{said}");
    assert_eq!(
        rounds(&s),
        2,
        "the agent ran twice: its attempt and one feedback round"
    );

    let status = s.status(&id);
    let t = task_view(&status, "fix");
    assert_eq!(t["state"], "completed");
    assert_eq!(t["verify"]["passed"], true, "{t}");
    assert_eq!(t["verify"]["rounds"], 1, "{t}");
    assert_eq!(t["verify"]["checks"], 2, "{t}");

    // The kept worktree holds the fix; the checkout is untouched.
    let diff = s.run_ok(&["diff", &id, "fix"]);
    assert!(
        text(&diff.stdout).contains("$1 + $2"),
        "{}",
        text(&diff.stdout)
    );
    assert!(
        std::fs::read_to_string(repo.join("calc.sh"))
            .expect("calc")
            .contains("$1 - $2")
    );
    // Both checks' output is kept: the first failed, the last passed.
    let first = s.run_ok(&["logs", &id, "fix", "--verify", "--attempt", "1"]);
    assert!(
        text(&first.stdout).contains("FAILED test_add: add 2 2 gave 0, expected 4"),
        "{}",
        text(&first.stdout)
    );
    let last = s.run_ok(&["logs", &id, "fix", "--verify"]);
    assert!(
        text(&last.stdout).contains("1 passed"),
        "{}",
        text(&last.stdout)
    );

    // The journal: the check of each attempt started and ended once, with its verdict.
    let events = s.events(&id);
    let ends: Vec<_> = events
        .iter()
        .map(event_kind)
        .filter(|(kind, _)| *kind == "VerifyEnded")
        .map(|(_, v)| v["verdict"]["passed"].as_bool())
        .collect();
    assert_eq!(ends, vec![Some(false), Some(true)]);
    let audit = s.audit_clean(&id);
    assert_eq!(audit["checks"]["verdicts"], 2, "{audit}");
    assert_eq!(audit["checks"]["failed"], 1, "{audit}");
    let said = text(&s.run_ok(&["audit", &id]).stdout);
    assert!(
        said.contains("checks: 2 verdicts, 1 passed, 1 failed"),
        "{said}"
    );
    // The replay and the HTML report say it too.
    let replay = text(&s.run_ok(&["replay", &id]).stdout);
    assert!(
        replay.contains("check of attempt 1 failed")
            && replay.contains("check of attempt 2 passed"),
        "{replay}"
    );
    let html = s.path().join("report.html");
    s.run_ok(&["report", &id, "--html", &html.display().to_string()]);
    let html = std::fs::read_to_string(&html).expect("the report");
    assert!(
        html.contains("verified after 1 round"),
        "the report's check column"
    );
    assert!(
        html.contains("FAILED test_add"),
        "the failed check on attempt 1's bar"
    );
}

#[test]
fn without_feedback_rounds_a_failed_check_fails_the_task_with_reason_verify() {
    let s = Scratch::new();
    repo(&s);
    let id = unique_run("verify-none");
    let out = run(&s, &id, &batch(&s, 0));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert_eq!(rounds(&s), 1, "no feedback round");
    let status = s.status(&id);
    let t = task_view(&status, "fix");
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["stop_reason"], "verify", "{t}");
    let error = t["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("the check exited 1")
            && error.contains("FAILED test_add: add 2 2 gave 0, expected 4"),
        "{error}"
    );
    // The summary says it in words.
    assert!(said.contains("the check exited 1"), "{said}");
    s.audit_clean(&id);
}

#[test]
fn the_check_sees_the_run_the_task_and_the_output_and_its_result_file_decides_the_score() {
    let s = Scratch::new();
    let seen = s.path().join("seen.txt");
    let check = format!(
        "echo \"$SORTIE_RUN $SORTIE_TASK $(cat \"$SORTIE_OUTPUT\")\" > {seen}; \
         echo '{{\"passed\": true, \"score\": 0.75, \"details\": {{\"cases\": 4}}}}' > \"$SORTIE_VERIFY_RESULT\"",
        seen = seen.display()
    );
    s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"scored\"\ncommand = [\"echo\", \"the answer\"]\n\
             verify = {check:?}\n\n\
             [[tasks]]\nlabel = \"refused\"\ncommand = [\"echo\", \"hi\"]\n\
             verify = [\"sh\", \"-c\", \"echo '{{\\\"passed\\\": false}}' > $SORTIE_VERIFY_RESULT\"]\n"
        ),
    );
    let id = unique_run("verify-env");
    let out = s.run(&["run", "--run-id", &id, "batch.toml"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let seen = std::fs::read_to_string(&seen).expect("the check ran");
    assert_eq!(seen.trim(), format!("{id} scored the answer"));
    let status = s.status(&id);
    let scored = task_view(&status, "scored");
    assert_eq!(scored["state"], "completed");
    assert_eq!(scored["verify"]["score"], 0.75);
    let refused = task_view(&status, "refused");
    assert_eq!(refused["state"], "failed");
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("passed: false"),
        "{refused}"
    );
}

/// Starts `sortie run` of `batch` paused once a check was journaled as started
/// (`SORTIE_TEST_PAUSE_AFTER=VerifyStarted`: the check runs, its verdict is never journaled).
fn run_paused_at_check(s: &Scratch, run: &str) -> Background {
    let mut cmd = s.sortie();
    cmd.env(PAUSE_AFTER, "VerifyStarted")
        .args(["run", "--run-id", run, "batch.toml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    Background::from_command(cmd, run)
}

fn lines_of(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// The verdicts the journal holds for each attempt of task 0, in order.
fn verdicts(s: &Scratch, run: &str) -> Vec<(u64, bool)> {
    s.events(run)
        .iter()
        .map(event_kind)
        .filter(|(kind, _)| *kind == "VerifyEnded")
        .map(|(_, v)| {
            (
                v["attempt"].as_u64().unwrap_or_default(),
                v["verdict"]["passed"].as_bool().unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn a_check_running_when_sortie_is_killed_is_adopted_by_resume_and_its_verdict_journaled_once() {
    let s = Scratch::new();
    let counter = s.path().join("checks-run");
    let gate = s.path().join("gate");
    s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"t\"\ncommand = [\"echo\", \"done\"]\n\
             verify = \"echo ran >> {c}; while [ ! -e {g} ]; do sleep 0.05; done; echo ok\"\n",
            c = counter.display(),
            g = gate.display()
        ),
    );
    let id = unique_run("verify-adopt");
    let first = run_paused_at_check(&s, &id);
    poll("the check to start", 60, || {
        (lines_of(&counter) == 1).then_some(())
    });
    send_signal(first.pid(), nix::sys::signal::Signal::SIGKILL);
    drop(first.finish(30));
    // The check outlives sortie (its shepherd's child): resume adopts it, and it finishes
    // once the gate opens.
    let resume = Background::start(&s, &id, &["resume", &id]);
    s.wait_task_state(&id, 0, "verifying");
    std::fs::write(&gate, "").expect("open the gate");
    let out = resume.finish(60);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(lines_of(&counter), 1, "the check ran once");
    assert_eq!(verdicts(&s, &id), vec![(1, true)]);
    assert_eq!(task_view(&s.status(&id), "t")["state"], "completed");
    s.audit_clean(&id);
}

#[test]
fn a_check_that_ended_while_sortie_was_dead_is_read_from_its_files_not_run_again() {
    let s = Scratch::new();
    let counter = s.path().join("checks-run");
    s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"t\"\ncommand = [\"echo\", \"done\"]\n\
             verify = \"echo ran >> {c}; echo 'FAILED: the answer is wrong' >&2; exit 3\"\n",
            c = counter.display()
        ),
    );
    let id = unique_run("verify-record");
    let first = run_paused_at_check(&s, &id);
    let log = s
        .state_dir()
        .join("runs")
        .join(&id)
        .join("checks")
        .join("0.1.stderr");
    // Ended: its stderr (beside its placement, under the run's shepherd) holds its last line.
    poll("the check to end", 60, || {
        std::fs::read_to_string(&log)
            .is_ok_and(|t| t.contains("the answer is wrong"))
            .then_some(())
    });
    send_signal(first.pid(), nix::sys::signal::Signal::SIGKILL);
    drop(first.finish(30));
    let out = s.run(&["resume", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(lines_of(&counter), 1, "the check is not run again");
    assert_eq!(verdicts(&s, &id), vec![(1, false)]);
    let status = s.status(&id);
    let t = task_view(&status, "t");
    assert_eq!(t["stop_reason"], "verify", "{t}");
    let error = t["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("exited 3") && error.contains("FAILED: the answer is wrong"),
        "{error}"
    );
    s.audit_clean(&id);
}

#[test]
fn check_names_a_check_whose_program_is_missing_or_whose_script_does_not_parse() {
    let s = Scratch::new();
    s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"missing\"\ncommand = [\"true\"]\nverify = \"no-such-checker -q\"\n\n\
         [[tasks]]\nlabel = \"broken\"\ncommand = [\"true\"]\nverify = \"if then fi (\"\n\n\
         [[tasks]]\nlabel = \"argv\"\ncommand = [\"true\"]\nverify = [\"no-such-argv-checker\"]\n\n\
         [[tasks]]\nlabel = \"fine\"\ncommand = [\"true\"]\nverify = \"test -e . && sh -c true\"\n\
         verify_rounds = 21\n",
    );
    let out = s.run(&["check", "batch.toml"]);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("batch.toml:4") && said.contains("`no-such-checker` is not on PATH"),
        "{said}"
    );
    assert!(
        said.contains("batch.toml:9") && said.contains("sh cannot parse the check"),
        "{said}"
    );
    assert!(
        said.contains("`no-such-argv-checker` is not on PATH"),
        "{said}"
    );
    assert!(
        said.contains("batch.toml:20") && said.contains("verify_rounds"),
        "{said}"
    );
}

#[test]
fn slurm_a_check_of_a_task_on_slurm_runs_as_a_job_of_its_own() {
    if !sortie_testkit::slurm::should_run(
        "slurm_a_check_of_a_task_on_slurm_runs_as_a_job_of_its_own",
    ) {
        return;
    }
    let s = Scratch::new();
    s.write(
        "batch.toml",
        "[defaults]\nexecutor = \"slurm\"\n\n\
         [[tasks]]\nlabel = \"on-slurm\"\ncommand = [\"sh\", \"-c\", \"echo $SLURM_JOB_ID > agent-job\"]\n\
         verify = \"echo $SLURM_JOB_ID > check-job; test -s agent-job\"\n",
    );
    let id = unique_run("verify-slurm");
    let out = s.run(&["run", "--run-id", &id, "batch.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let job = |f: &str| {
        std::fs::read_to_string(s.path().join(f))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let (agent, check) = (job("agent-job"), job("check-job"));
    assert!(!agent.is_empty() && !check.is_empty(), "both ran in a job");
    assert_ne!(agent, check, "the check is a job of its own");
    assert_eq!(
        task_view(&s.status(&id), "on-slurm")["verify"]["passed"],
        true
    );
}
