//! #33: a check decides each task (`verify`), and a failed check is fed back to the agent
//! (`verify_rounds`). The agent is a plain command in a small git repository with a failing
//! test: it fixes the code only on a round whose input (the file `SORTIE_VERIFY_FEEDBACK`
//! names) holds the failing test's output.

use std::path::{Path, PathBuf};

use sortie_testkit::git;

use crate::support::{Scratch, event_kind, task_view, unique_run};

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
        .map(|(_, v)| v["passed"].as_bool())
        .collect();
    assert_eq!(ends, vec![Some(false), Some(true)]);
    s.audit_clean(&id);
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
