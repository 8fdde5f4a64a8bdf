//! Kept worktrees, end to end, in real git repositories made in the test's scratch dir (git
//! identity given with `-c`, since CI has none): `diff` prints the change, `apply` brings it
//! onto the checkout as uncommitted changes, a conflicting `apply` leaves the checkout exactly
//! as it was, `discard` removes the worktree and its branch, and `gc` respects its retention
//! and never deletes a branch whose commits are found nowhere else.

use std::path::{Path, PathBuf};
use std::process::Command;

use sortie_testkit::git;

use crate::support::{Scratch, fake_command, unique_run};

/// A repository `repo/` in the scratch dir with one commit: `f.txt` = "one\ntwo\nthree\n".
fn repo(s: &Scratch) -> PathBuf {
    let repo = s.path().join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir repo");
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("f.txt"), "one\ntwo\nthree\n").expect("write f.txt");
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "init"]);
    repo
}

/// Runs a batch of isolated tasks (label, TOML `command` array) in `repo/` to its end, with
/// the state dir given as a relative path.
fn run_isolated(s: &Scratch, run: &str, tasks: &[(&str, String)]) {
    let mut batch = String::new();
    for (label, command) in tasks {
        batch.push_str(&format!(
            "[[tasks]]\nlabel = \"{label}\"\ncwd = \"repo\"\nisolation = \"worktree\"\n\
             command = {command}\n\n"
        ));
    }
    s.write("batch.toml", &batch);
    // A relative state dir (as the default `.sortie` is): git runs elsewhere, in worktrees.
    let out = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .current_dir(s.path())
        .env_remove("SORTIE_DIR")
        .args(["--state-dir", "state", "run", "--run-id", run, "batch.toml"])
        .output()
        .expect("run sortie");
    assert_eq!(s.state_dir(), s.path().join("state"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The edit every test keeps: `f.txt` gets a fourth line, `new.txt` is created.
fn edit_command() -> String {
    fake_command(&["--write", "f.txt:four", "--write", "new.txt:hello"])
}

fn worktree_of(s: &Scratch, run: &str, label: &str) -> PathBuf {
    s.state_dir().join("worktrees").join(run).join(label)
}

fn branches(repo: &Path) -> String {
    git(repo, &["branch", "--list", "--format=%(refname:short)"])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn apply_brings_the_kept_change_onto_the_checkout_uncommitted() {
    let s = Scratch::new();
    let repo = repo(&s);
    let run = unique_run("apply-clean");
    run_isolated(&s, &run, &[("edit", edit_command())]);
    assert!(
        worktree_of(&s, &run, "edit").exists(),
        "the changed worktree is kept"
    );
    let head = git(&repo, &["rev-parse", "HEAD"]);

    let diff = s.run(&["diff", &run, "edit"]);
    assert_eq!(diff.status.code(), Some(0), "{}", text(&diff.stderr));
    let patch = text(&diff.stdout);
    assert!(patch.contains("+four"), "{patch}");
    assert!(
        patch.contains("new.txt") && patch.contains("+hello"),
        "{patch}"
    );
    let json = s.run(&["--json", "diff", &run, "edit"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("diff --json");
    assert_eq!(v["diff"], patch);
    assert_eq!(v["branch"], format!("sortie/{run}/edit"));

    let out = s.run(&["apply", &run, "edit"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("as uncommitted changes"));
    assert_eq!(
        std::fs::read_to_string(repo.join("f.txt")).expect("f.txt"),
        "one\ntwo\nthree\nfour\n"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("new.txt")).expect("new.txt"),
        "hello\n"
    );
    assert_eq!(
        git(&repo, &["status", "--porcelain"]),
        " M f.txt\n?? new.txt\n",
        "uncommitted, unstaged"
    );
    assert_eq!(
        git(&repo, &["rev-parse", "HEAD"]),
        head,
        "nothing committed"
    );
    assert!(
        worktree_of(&s, &run, "edit").exists(),
        "apply keeps the worktree"
    );
}

#[test]
fn apply_merges_three_ways_onto_a_checkout_that_moved() {
    let s = Scratch::new();
    let repo = repo(&s);
    let run = unique_run("apply-merge");
    run_isolated(&s, &run, &[("edit", edit_command())]);
    // The patch's context no longer matches (line 1 changed, uncommitted), but the change
    // does not overlap it: a clean three-way merge.
    std::fs::write(repo.join("f.txt"), "ONE\ntwo\nthree\n").expect("write f.txt");
    let out = s.run(&["--json", "apply", &run, "edit"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("apply --json");
    assert_eq!(v["result"], "merged", "{v}");
    assert_eq!(
        std::fs::read_to_string(repo.join("f.txt")).expect("f.txt"),
        "ONE\ntwo\nthree\nfour\n"
    );
    assert_eq!(
        git(&repo, &["status", "--porcelain"]),
        " M f.txt\n?? new.txt\n"
    );
}

#[test]
fn apply_that_conflicts_leaves_the_checkout_untouched() {
    let s = Scratch::new();
    let repo = repo(&s);
    let run = unique_run("apply-conflict");
    run_isolated(&s, &run, &[("edit", edit_command())]);
    // The user's checkout moved on: the same spot of f.txt is changed (uncommitted), and
    // there is an untracked file.
    std::fs::write(repo.join("f.txt"), "one\ntwo\nthree\nmine\n").expect("write f.txt");
    std::fs::write(repo.join("notes.txt"), "scribbles\n").expect("write notes");
    let status_before = git(&repo, &["status", "--porcelain", "--untracked-files=all"]);
    let index_before = std::fs::read(repo.join(".git/index")).expect("the index exists");

    let out = s.run(&["apply", &run, "edit"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("conflicts") && stderr.contains("nothing was changed"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(repo.join("f.txt")).expect("f.txt"),
        b"one\ntwo\nthree\nmine\n",
        "byte-identical"
    );
    assert_eq!(
        std::fs::read(repo.join("notes.txt")).expect("notes"),
        b"scribbles\n"
    );
    assert!(
        !repo.join("new.txt").exists(),
        "no part of the change landed"
    );
    assert_eq!(
        git(&repo, &["status", "--porcelain", "--untracked-files=all"]),
        status_before
    );
    assert_eq!(
        std::fs::read(repo.join(".git/index")).expect("the index"),
        index_before,
        "the index is untouched"
    );

    let json = s.run(&["--json", "apply", &run, "edit"]);
    assert_eq!(json.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("apply --json");
    assert_eq!(v["result"], "conflict", "{v}");
}

#[test]
fn discard_removes_the_worktree_and_its_branch() {
    let s = Scratch::new();
    let repo = repo(&s);
    let run = unique_run("discard");
    run_isolated(&s, &run, &[("edit", edit_command())]);
    let wt = worktree_of(&s, &run, "edit");
    assert!(wt.exists());
    assert!(branches(&repo).contains(&format!("sortie/{run}/edit")));

    let out = s.run(&["--json", "discard", &run, "edit"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("discard --json");
    assert_eq!(v["branch_deleted"], true, "{v}");
    assert!(!wt.exists(), "the worktree is gone");
    assert_eq!(branches(&repo), "main\n", "the branch is gone");
    assert!(
        !git(&repo, &["worktree", "list", "--porcelain"]).contains(&run),
        "git forgot the worktree"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("f.txt")).expect("f.txt"),
        "one\ntwo\nthree\n",
        "the checkout is untouched"
    );

    // #37: the discard is journaled: status no longer lists the worktree as kept, replay and
    // the audit see the event.
    let status = s.status(&run);
    let worktree = &status["tasks"][0]["worktree"];
    assert_eq!(worktree["kept"], false, "{worktree}");
    assert_eq!(worktree["discarded"], "discard", "{worktree}");
    let shown = s.run_ok(&["status", &run]);
    assert!(
        !text(&shown.stdout).contains("kept worktrees"),
        "{}",
        text(&shown.stdout)
    );
    let events = s.events(&run);
    let last = events.last().expect("events");
    assert_eq!(
        last["event"]["WorktreeDiscarded"]["by"], "discard",
        "the last event: {last}"
    );
    let replay = s.run_ok(&["replay", &run]);
    assert!(
        text(&replay.stdout).contains("removed by `sortie discard`"),
        "{}",
        text(&replay.stdout)
    );
    s.audit_clean(&run);

    // Asked again, diff and apply say where the work went.
    let again = s.run(&["diff", &run, "edit"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        text(&again.stderr).contains("removed by `sortie discard`"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn gc_respects_retention_and_keeps_branches_with_unique_commits() {
    let s = Scratch::new();
    let repo = repo(&s);
    let run = unique_run("gc");
    let commit = "[\"sh\", \"-c\", \"echo c > c.txt && git add c.txt && git -c user.name=agent \
                  -c user.email=agent@sortie.invalid commit -q -m agent-commit\"]"
        .to_owned();
    run_isolated(
        &s,
        &run,
        &[("loose", edit_command()), ("committed", commit)],
    );
    let loose = worktree_of(&s, &run, "loose");
    let committed = worktree_of(&s, &run, "committed");
    assert!(loose.exists() && committed.exists(), "both changed: kept");

    // Within the default retention (7 days): nothing is removed.
    let out = s.run(&["gc"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("within the retention"),
        "{}",
        text(&out.stdout)
    );
    assert!(loose.exists() && committed.exists());

    let out = s.run(&["--json", "gc", "--older-than", "0s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("gc --json");
    let removed = v[0]["removed"].as_array().expect("removed").clone();
    assert_eq!(removed.len(), 2, "{v}");
    assert!(
        !loose.exists() && !committed.exists(),
        "both worktrees removed"
    );
    let left = branches(&repo);
    assert!(
        !left.contains(&format!("sortie/{run}/loose")),
        "a branch with no commit of its own is deleted: {left}"
    );
    assert!(
        left.contains(&format!("sortie/{run}/committed")),
        "a branch with a commit found nowhere else is kept: {left}"
    );
    let kept = removed
        .iter()
        .find(|r| r["label"] == "committed")
        .expect("committed in the report");
    assert_eq!(kept["branch_deleted"], false, "{kept}");
    assert!(
        git(
            &repo,
            &["log", "--format=%s", &format!("sortie/{run}/committed")]
        )
        .contains("agent-commit")
    );
    let list = git(&repo, &["worktree", "list", "--porcelain"]);
    assert!(!list.contains(&run), "pruned: {list}");

    // A second gc finds nothing more to remove and still keeps the branch.
    let out = s.run(&["--json", "gc", "--older-than", "0s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(branches(&repo).contains(&format!("sortie/{run}/committed")));
}

#[test]
fn apply_all_takes_completed_tasks_only_unless_include_failed() {
    let s = Scratch::new();
    let repo = repo(&s);
    let run = unique_run("apply-all-failed");
    let batch = format!(
        "[[tasks]]\nlabel = \"good\"\ncwd = \"repo\"\nisolation = \"worktree\"\ncommand = {}\n\n\
         [[tasks]]\nlabel = \"bad\"\ncwd = \"repo\"\nisolation = \"worktree\"\nmax_retries = 0\n\
         command = {}\n",
        fake_command(&["--write", "good.txt:good"]),
        fake_command(&["--write", "bad.txt:half-done", "--exit", "1"]),
    );
    s.write("batch.toml", &batch);
    let out = s.run(&["run", "--run-id", &run, "batch.toml"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        worktree_of(&s, &run, "bad").exists(),
        "the failed task's changed worktree is kept"
    );

    let out = s.run(&["apply", &run, "--all"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(repo.join("good.txt").exists(), "{said}");
    assert!(
        !repo.join("bad.txt").exists(),
        "a failed task's partial work is not applied by default: {said}"
    );
    assert!(
        said.contains("skipped bad") && said.contains("--include-failed"),
        "{said}"
    );

    // Undo the first apply (good.txt was new, untracked) before applying everything again.
    std::fs::remove_file(repo.join("good.txt")).expect("remove good.txt");
    let out = s.run(&["--json", "apply", &run, "--all", "--include-failed"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(repo.join("bad.txt").exists(), "--include-failed applies it");
}

#[test]
fn the_summarys_diff_hint_parses_for_a_label_starting_with_a_dash() {
    let s = Scratch::new();
    repo(&s);
    let run = unique_run("dash-hint");
    s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"-dash\"\ncwd = \"repo\"\nisolation = \"worktree\"\ncommand = {}\n",
            edit_command()
        ),
    );
    let out = s.run(&["run", "--run-id", &run, "batch.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    // A hint longer than the width goes on over lines ending in ` \`, as a shell reads it.
    let joined = said.replace(" \\\n", " ");
    let hint = joined
        .lines()
        .find_map(|l| l.trim().strip_prefix("diff:"))
        .unwrap_or_else(|| panic!("no diff hint in:\n{said}"));
    // The hint's words after the program (it names the state dir), as a shell would split
    // them (no quoting needed here).
    let words: Vec<&str> = hint.split_whitespace().skip(1).collect();
    let diff = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .current_dir(s.path())
        .env_remove("SORTIE_DIR")
        .args(&words)
        .output()
        .expect("run the hint");
    assert_eq!(
        diff.status.code(),
        Some(0),
        "`{hint}` does not parse: {}",
        text(&diff.stderr)
    );
    assert!(text(&diff.stdout).contains("+four"));
}
