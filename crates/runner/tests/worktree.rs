//! The git helper (`process::run_tool`) and the worktree steps (`worktree::plan`, `create`,
//! `finalize`) against real repositories made in a temp dir: each step is idempotent, so that
//! resume can finish whatever a crash cut short.

use std::path::{Path, PathBuf};

use sortie_runner::layout::StateDir;
use sortie_runner::process::run_tool;
use sortie_runner::worktree::kept::{self, Applied, Discard, Kept};
use sortie_runner::worktree::{self, agent_cwd, location};
use sortie_testkit::git;

/// A repository with one committed file, and a state dir beside it.
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().canonicalize().expect("canonical");
    let repo = root.join("repo");
    std::fs::create_dir_all(repo.join("sub")).expect("mkdir");
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("a.txt"), "a\n").expect("write");
    std::fs::write(repo.join("sub/b.txt"), "b\n").expect("write");
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "init"]);
    (tmp, repo, root.join("state"))
}

fn branches(repo: &Path) -> String {
    git(
        repo,
        &["branch", "--list", "sortie/*", "--format=%(refname:short)"],
    )
    .trim()
    .to_owned()
}

#[tokio::test]
async fn run_tool_reports_output_exit_code_and_a_missing_program() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let argv = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let out = run_tool(&argv(&["git", "--version"]), tmp.path(), &[])
        .await
        .expect("git runs");
    assert!(out.success());
    assert!(out.text().starts_with("git version"), "{}", out.text());

    let out = run_tool(&argv(&["git", "rev-parse", "HEAD"]), tmp.path(), &[])
        .await
        .expect("git runs");
    assert!(!out.success(), "not a repository");
    assert!(
        out.stderr.contains("not a git repository"),
        "{}",
        out.stderr
    );

    let env = [("SORTIE_TOOL_TEST".to_owned(), "seen".to_owned())];
    let out = run_tool(
        &argv(&["sh", "-c", "echo $SORTIE_TOOL_TEST; exit 3"]),
        tmp.path(),
        &env,
    )
    .await
    .expect("sh runs");
    assert_eq!((out.code, out.text().as_str()), (Some(3), "seen"));

    assert!(
        run_tool(&argv(&["no-such-tool-here"]), tmp.path(), &[])
            .await
            .is_err()
    );
    assert!(run_tool(&[], tmp.path(), &[]).await.is_err());
}

#[tokio::test]
async fn create_and_finalize_are_idempotent() {
    let (_tmp, repo, state) = setup();
    let (path, branch) = location(&StateDir::new(&state), "run1", "task one", 0);
    assert!(
        path.ends_with("worktrees/run1/t0-task-one"),
        "{}",
        path.display()
    );
    let scratch = state.join("scratch.index");
    let plan = worktree::plan(&repo.join("sub"), &path, &branch, false, &scratch, &state)
        .await
        .expect("plan");
    assert_eq!(Path::new(&plan.repo), repo);
    assert_eq!(plan.base, git(&repo, &["rev-parse", "HEAD"]).trim());
    assert_eq!(
        agent_cwd(&plan, &repo.join("sub").display().to_string()),
        path.join("sub")
    );

    // Twice: the second finds it there.
    worktree::create(&plan).await.expect("create");
    worktree::create(&plan).await.expect("create again");
    assert!(path.join("sub/b.txt").exists());
    assert_eq!(branches(&repo), branch);

    // A half-created worktree (its directory without git's files) is cleared and made again.
    std::fs::remove_file(path.join(".git")).expect("break it");
    worktree::create(&plan)
        .await
        .expect("create over a broken one");
    assert!(path.join(".git").exists());

    // Unchanged: removed with its branch; again: nothing left to do, still fine.
    let patch = state.join("patches/t.patch");
    let f = worktree::finalize(&plan, &patch).await.expect("finalize");
    assert!(!f.changed && f.diff.is_none());
    assert!(!path.exists());
    assert_eq!(branches(&repo), "");
    let f = worktree::finalize(&plan, &patch)
        .await
        .expect("finalize again");
    assert!(!f.changed);
    assert!(!patch.exists());

    // A crash between `worktree remove` and `branch -D`: the branch alone is deleted.
    worktree::create(&plan).await.expect("create");
    git(&repo, &["worktree", "remove", "--force", &plan.path]);
    let f = worktree::finalize(&plan, &patch).await.expect("finalize");
    assert!(!f.changed);
    assert_eq!(branches(&repo), "");
}

#[tokio::test]
async fn changes_are_kept_with_a_patch_and_nothing_of_the_agents_is_committed() {
    let (_tmp, repo, state) = setup();
    let (path, branch) = location(&StateDir::new(&state), "run2", "edit", 1);
    let plan = worktree::plan(&repo, &path, &branch, false, &state.join("s.index"), &state)
        .await
        .expect("plan");
    worktree::create(&plan).await.expect("create");
    std::fs::write(path.join("a.txt"), "a\nedited\n").expect("edit");
    std::fs::write(path.join("new.txt"), "new\n").expect("untracked");
    let status_before = git(&path, &["status", "--porcelain"]);
    let patch = state.join("patches/edit.patch");
    let f = worktree::finalize(&plan, &patch).await.expect("finalize");
    assert!(f.changed);
    let diff = f.diff.expect("a diff summary");
    assert!(diff.contains("a.txt") && diff.contains("new.txt"), "{diff}");
    let text = std::fs::read_to_string(&patch).expect("patch");
    assert!(text.contains("+edited") && text.contains("+new"), "{text}");
    assert!(path.exists());
    assert_eq!(branches(&repo), branch);
    assert_eq!(git(&path, &["status", "--porcelain"]), status_before);
    assert_eq!(git(&path, &["rev-parse", "HEAD"]).trim(), plan.base);

    // The patch applies to the base.
    git(&repo, &["apply", "--check", &patch.display().to_string()]);

    // A commit alone (the tree clean) counts as changed too.
    git(&path, &["add", "-A"]);
    git(&path, &["commit", "-q", "-m", "agent"]);
    let f = worktree::finalize(&plan, &patch).await.expect("finalize");
    assert!(f.changed);
}

#[tokio::test]
async fn include_wip_seeds_a_commit_and_leaves_the_users_index_alone() {
    let (_tmp, repo, state) = setup();
    std::fs::write(repo.join("a.txt"), "a\nwip\n").expect("write");
    std::fs::write(repo.join("staged.txt"), "s\n").expect("write");
    git(&repo, &["add", "staged.txt"]);
    std::fs::write(repo.join("untracked.txt"), "u\n").expect("write");
    let status = git(&repo, &["status", "--porcelain"]);
    let (path, branch) = location(&StateDir::new(&state), "run3", "wip", 2);
    let plan = worktree::plan(&repo, &path, &branch, true, &state.join("s.index"), &state)
        .await
        .expect("plan");
    let head = git(&repo, &["rev-parse", "HEAD"]).trim().to_owned();
    assert_ne!(plan.base, head, "a seed commit");
    assert_eq!(
        git(&repo, &["rev-parse", &format!("{}^", plan.base)]).trim(),
        head
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), status);
    assert!(
        !state.join("s.index").exists(),
        "the scratch index is removed"
    );

    worktree::create(&plan).await.expect("create");
    assert_eq!(
        std::fs::read_to_string(path.join("a.txt")).expect("read"),
        "a\nwip\n"
    );
    assert!(path.join("staged.txt").exists() && path.join("untracked.txt").exists());
    let f = worktree::finalize(&plan, &state.join("p.patch"))
        .await
        .expect("finalize");
    assert!(!f.changed, "the seed alone is no change");
    assert!(!path.exists());

    // A state dir inside the repository (the default ./.sortie) never enters the seed.
    let inside = repo.join(".sortie");
    std::fs::create_dir_all(inside.join("runs")).expect("mkdir");
    std::fs::write(inside.join("runs/journal"), "journal\n").expect("write");
    let plan = worktree::plan(
        &repo,
        &path,
        &branch,
        true,
        &inside.join("s.index"),
        &inside,
    )
    .await
    .expect("plan");
    let files = git(&repo, &["ls-tree", "-r", "--name-only", &plan.base]);
    assert!(files.contains("untracked.txt"), "{files}");
    assert!(!files.contains(".sortie"), "{files}");
    std::fs::remove_dir_all(&inside).expect("rm");

    // No work in progress: the base is HEAD itself.
    git(&repo, &["stash", "-u", "-q"]);
    let plan = worktree::plan(&repo, &path, &branch, true, &state.join("s.index"), &state)
        .await
        .expect("plan");
    assert_eq!(plan.base, head);
}

#[tokio::test]
async fn plan_fails_outside_a_repository_and_without_a_commit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("plain");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let p = tmp.path().join("wt");
    let e = worktree::plan(
        &dir,
        &p,
        "sortie/r/x",
        false,
        &tmp.path().join("i"),
        tmp.path(),
    )
    .await
    .expect_err("not a repository");
    assert!(e.to_string().contains("not in a git repository"), "{e}");
    git(&dir, &["init", "-q"]);
    let e = worktree::plan(
        &dir,
        &p,
        "sortie/r/x",
        false,
        &tmp.path().join("i"),
        tmp.path(),
    )
    .await
    .expect_err("no commit");
    assert!(e.to_string().contains("no commit"), "{e}");
}

/// A kept worktree of run `r` whose patch is `git diff` of `file` rewritten to `text` in `repo`
/// (the checkout is put back after).
fn kept_changing(repo: &Path, label: &str, task: u32, file: &str, text: &str) -> Kept {
    let original = std::fs::read_to_string(repo.join(file)).expect("read");
    std::fs::write(repo.join(file), text).expect("write");
    let patch_text = git(repo, &["diff", "--binary"]);
    std::fs::write(repo.join(file), original).expect("write back");
    let patch = repo
        .parent()
        .expect("a parent")
        .join(format!("{label}.patch"));
    std::fs::write(&patch, format!("{patch_text}\n")).expect("patch");
    Kept {
        run: "r".into(),
        label: label.into(),
        task,
        repo: repo.display().to_string(),
        path: repo.join("gone").display().to_string(),
        branch: format!("sortie/{label}"),
        base: git(repo, &["rev-parse", "HEAD"]).trim().to_owned(),
        patch,
        summary: None,
        discarded: None,
        ended: Some(sortie_core::TerminalState::Completed),
    }
}

#[tokio::test]
async fn apply_all_skips_the_discarded_stops_at_the_first_conflict_and_commits_each() {
    let (_tmp, repo, _state) = setup();
    let mut gone = kept_changing(&repo, "gone", 1, "sub/b.txt", "gone\n");
    gone.discarded = Some(Discard {
        by: "discard".into(),
        at: 1,
        branch_kept: false,
    });
    let all = vec![
        kept_changing(&repo, "first", 0, "a.txt", "first\n"),
        gone,
        kept_changing(&repo, "clash", 2, "a.txt", "clash\n"),
        kept_changing(&repo, "later", 3, "sub/b.txt", "later\n"),
    ];
    let done = kept::apply_all(&all, true, false).await.expect("no error");
    let applied: Vec<(&str, bool)> = done
        .applied
        .iter()
        .map(|(k, _, commit)| (k.label.as_str(), commit.is_some()))
        .collect();
    assert_eq!(applied, [("first", true), ("clash", false)]);
    assert_eq!(done.applied[0].1, Applied::Clean);
    assert!(matches!(done.applied[1].1, Applied::Conflict { .. }));
    assert!(done.stopped);
    let labels = |ks: &[&Kept]| ks.iter().map(|k| k.label.clone()).collect::<Vec<_>>();
    assert_eq!(labels(&done.not_applied), ["later"]);
    assert_eq!(labels(&done.discarded), ["gone"]);
    // One commit, with the message of its task; the conflict changed nothing.
    assert_eq!(
        git(&repo, &["log", "-1", "--format=%s"]).trim(),
        kept::commit_message(&all[0])
    );
    assert_eq!(kept::commit_message(&all[0]), "sortie: first (run r)");
    assert_eq!(
        std::fs::read_to_string(repo.join("a.txt")).unwrap(),
        "first\n"
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]).trim(), "");

    // Without a conflict, every one but the discarded, as uncommitted changes.
    let (_tmp, repo, _state) = setup();
    let all = vec![
        kept_changing(&repo, "one", 0, "a.txt", "one\n"),
        kept_changing(&repo, "two", 1, "sub/b.txt", "two\n"),
    ];
    let done = kept::apply_all(&all, false, false).await.expect("no error");
    assert!(!done.stopped);
    assert_eq!(done.applied.len(), 2);
    assert!(done.applied.iter().all(|(_, _, commit)| commit.is_none()));
    assert!(done.not_applied.is_empty());
    assert_eq!(git(&repo, &["log", "--format=%s"]).trim(), "init");
    assert_eq!(
        std::fs::read_to_string(repo.join("sub/b.txt")).unwrap(),
        "two\n"
    );
}
