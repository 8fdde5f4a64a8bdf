//! Git worktrees for tasks with `isolation = "worktree"`: plan, create, finalize.
//!
//! A task's worktree lives at `<state-dir>/worktrees/<run>/<label>` on the branch
//! `sortie/<run>/<label>`, made from HEAD of the repository that holds the task's cwd. The run
//! loop journals `WorktreePlanned` (from [`plan`], which only reads the repository, apart from
//! writing the unreferenced objects of a WIP seed) before [`create`] runs, and `TaskSetUp` once
//! the worktree exists. With `include_wip` the worktree starts at a "sortie: seed" commit on top
//! of HEAD that holds the uncommitted (staged and unstaged) changes and the untracked,
//! non-ignored files, built through a scratch index so that the user's index and branch are
//! never touched; the plan's `base` is that commit, so a worktree holding only the seed counts
//! as unchanged.
//!
//! Every step is idempotent, so that resume can finish whatever a crash cut short:
//! - [`create`] leaves an existing worktree alone, clears a half-created one, and reuses the
//!   branch when it exists (a retry continues in the same worktree);
//! - [`finalize`] keeps a changed worktree (HEAD moved past `base`, or the tree is dirty) and
//!   writes its patch against `base` (uncommitted and untracked changes included, computed
//!   through a scratch index: nothing of the agent's is committed), or removes an unchanged one
//!   and deletes its branch; a worktree or branch already gone is fine.

pub mod kept;

use std::path::{Path, PathBuf};

use sortie_core::PlannedWorktree;

use crate::files::write_atomic;
use crate::layout::StateDir;
use crate::process::{self, ToolOutput};

/// Serializes this process's changes to worktrees: git reads every worktree's metadata when it
/// adds one, and a concurrent `git worktree add` may catch another one half-written ("failed
/// to read .git/worktrees/x/commondir").
static WORKTREE_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many times [`create`] tries (another process may race it the same way).
const CREATE_TRIES: u32 = 3;

/// Why a worktree step failed. The text is complete on its own: it becomes a task's error.
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    /// A git command could not be run, or failed.
    #[error("{what}: {detail}")]
    Git {
        /// What sortie was doing.
        what: String,
        /// What git (or the system) said.
        detail: String,
    },
    /// A file could not be written or removed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// What finalizing a worktree found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalized {
    /// Whether the worktree changed (and so was kept).
    pub changed: bool,
    /// The diff summary (`git diff --stat` against the base), when it changed.
    pub diff: Option<String>,
}

/// The environment every git command gets: no prompts, stable messages, and nothing of a
/// surrounding git invocation (hooks set these) that would point git elsewhere.
fn git_env() -> Vec<(String, String)> {
    vec![
        ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ("LC_ALL".into(), "C".into()),
    ]
}

async fn git_raw(
    cwd: &Path,
    args: &[&str],
    extra_env: &[(String, String)],
) -> Result<ToolOutput, WorktreeError> {
    let mut argv = vec!["git".to_owned()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    let mut env = git_env();
    env.extend(extra_env.iter().cloned());
    process::run_tool(&argv, cwd, &env)
        .await
        .map_err(|e| WorktreeError::Git {
            what: format!("git {}", args.join(" ")),
            detail: e.to_string(),
        })
}

/// Runs git and returns its trimmed stdout, or an error with its stderr.
async fn git(
    cwd: &Path,
    args: &[&str],
    extra_env: &[(String, String)],
) -> Result<String, WorktreeError> {
    let out = git_raw(cwd, args, extra_env).await?;
    if out.success() {
        Ok(out.text())
    } else {
        Err(WorktreeError::Git {
            what: format!("git {}", args.join(" ")),
            detail: first_lines(&out.stderr),
        })
    }
}

fn first_lines(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).take(3).collect();
    if lines.is_empty() {
        "failed".to_owned()
    } else {
        lines.join("; ")
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WorktreeError + '_ {
    move |source| WorktreeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A label made safe for a path component and a branch name: ASCII letters, digits, `.`, `_`
/// and `-` kept, anything else `-`; when that changed the label (or it starts with `.` or `-`),
/// the task number is appended so that two labels never share a name.
pub fn safe_name(label: &str, task: u32) -> String {
    let mut out: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let altered = out != label
        || out.is_empty()
        || out.starts_with(['.', '-'])
        || out.ends_with('.')
        || out.contains("..")
        || out.ends_with(".lock");
    if altered {
        out = format!(
            "t{task}-{}",
            out.trim_matches(['.', '-']).replace("..", "-")
        );
        if out.ends_with(".lock") || out.ends_with('.') || out.ends_with('-') {
            out.push('x');
        }
    }
    out
}

/// Where a task's worktree goes and its branch: `<state-dir>/worktrees/<run>/<name>` and
/// `sortie/<run>/<name>`, with `name` from [`safe_name`].
pub fn location(state_dir: &StateDir, run: &str, label: &str, task: u32) -> (PathBuf, String) {
    let name = safe_name(label, task);
    (
        state_dir.worktree(run, &name),
        format!("sortie/{run}/{name}"),
    )
}

/// Where the agent runs: the worktree's counterpart of the task's `cwd` (the same subdirectory
/// of the repository), or the worktree's root when `cwd` is not below the repository.
pub fn agent_cwd(plan: &PlannedWorktree, task_cwd: &str) -> PathBuf {
    let root = PathBuf::from(&plan.path);
    let cwd = std::fs::canonicalize(task_cwd).unwrap_or_else(|_| PathBuf::from(task_cwd));
    let repo = std::fs::canonicalize(&plan.repo).unwrap_or_else(|_| PathBuf::from(&plan.repo));
    match cwd.strip_prefix(&repo) {
        Ok(rel) if !rel.as_os_str().is_empty() => root.join(rel),
        _ => root,
    }
}

/// Reads what a worktree needs: the repository holding `cwd`, its HEAD and, with
/// `include_wip`, the seed commit of its uncommitted and untracked files (when there are any).
/// `scratch` is a file path sortie may use for a scratch index (removed afterwards); the
/// state dir (`state_dir`) never enters the seed, even when it lies inside the repository (the
/// default `./.sortie`). Nothing of the repository's refs, index or files changes.
pub async fn plan(
    cwd: &Path,
    path: &Path,
    branch: &str,
    include_wip: bool,
    scratch: &Path,
    state_dir: &Path,
) -> Result<PlannedWorktree, WorktreeError> {
    let repo = git(cwd, &["rev-parse", "--show-toplevel"], &[])
        .await
        .map_err(|e| WorktreeError::Git {
            what: format!("{} is not in a git repository", cwd.display()),
            detail: e.to_string(),
        })?;
    let repo_dir = PathBuf::from(&repo);
    let head = git(&repo_dir, &["rev-parse", "--verify", "HEAD^{commit}"], &[])
        .await
        .map_err(|e| WorktreeError::Git {
            what: format!("the repository {repo} has no commit to start from"),
            detail: e.to_string(),
        })?;
    let base = if include_wip {
        let state = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
        let exclude = state
            .strip_prefix(&repo_dir)
            .ok()
            .filter(|rel| !rel.as_os_str().is_empty())
            .map(|rel| format!(":(exclude,top){}", rel.display()));
        seed(&repo_dir, &head, scratch, exclude.as_deref()).await?
    } else {
        head
    };
    Ok(PlannedWorktree {
        repo,
        path: path.display().to_string(),
        branch: branch.to_owned(),
        base,
    })
}

/// The tree of a checkout's files as `git add -A` sees them (tracked, modified, untracked;
/// not ignored), written through a scratch index copied from the checkout's own.
async fn snapshot_tree(
    dir: &Path,
    scratch: &Path,
    exclude: Option<&str>,
) -> Result<String, WorktreeError> {
    // Git runs in `dir`: a relative index path would land inside the checkout.
    let scratch = &std::path::absolute(scratch).map_err(io_err(scratch))?;
    let index = git(dir, &["rev-parse", "--git-path", "index"], &[]).await?;
    let index = dir.join(index);
    if let Some(parent) = scratch.parent() {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let _ = std::fs::remove_file(scratch);
    if index.exists() {
        std::fs::copy(&index, scratch).map_err(io_err(scratch))?;
    }
    let env = [("GIT_INDEX_FILE".to_owned(), scratch.display().to_string())];
    let tree = async {
        let mut args = vec!["add", "-A", "--", "."];
        args.extend(exclude);
        git(dir, &args, &env).await?;
        git(dir, &["write-tree"], &env).await
    }
    .await;
    let _ = std::fs::remove_file(scratch);
    tree
}

/// The seed commit of a repository's work in progress, or `head` when there is none.
async fn seed(
    repo: &Path,
    head: &str,
    scratch: &Path,
    exclude: Option<&str>,
) -> Result<String, WorktreeError> {
    let tree = snapshot_tree(repo, scratch, exclude).await?;
    let head_tree = git(repo, &["rev-parse", &format!("{head}^{{tree}}")], &[]).await?;
    if tree == head_tree {
        return Ok(head.to_owned());
    }
    git(
        repo,
        &[
            "-c",
            "user.name=sortie",
            "-c",
            "user.email=sortie@localhost",
            "commit-tree",
            &tree,
            "-p",
            head,
            "-m",
            "sortie: seed",
        ],
        &[],
    )
    .await
}

/// Whether `path` is a worktree git knows (registered, its directory present).
async fn registered(plan: &PlannedWorktree) -> Result<bool, WorktreeError> {
    let list = git(
        Path::new(&plan.repo),
        &["worktree", "list", "--porcelain"],
        &[],
    )
    .await?;
    let path = Path::new(&plan.path);
    let known = list.lines().any(|l| {
        l.strip_prefix("worktree ")
            .is_some_and(|p| Path::new(p) == path)
    });
    Ok(known && path.join(".git").exists())
}

/// The commit a branch points at, if it exists.
async fn branch_tip(plan: &PlannedWorktree) -> Result<Option<String>, WorktreeError> {
    let out = git_raw(
        Path::new(&plan.repo),
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/heads/{}^{{commit}}", plan.branch),
        ],
        &[],
    )
    .await?;
    Ok(out.success().then(|| out.text()))
}

/// Clears what is left of a worktree git no longer knows (a half-created directory, a stale
/// registration).
async fn clear_leftovers(plan: &PlannedWorktree) -> Result<(), WorktreeError> {
    let repo = Path::new(&plan.repo);
    let path = Path::new(&plan.path);
    // A creation cut short may leave its registration locked ("initializing").
    let _ = git_raw(repo, &["worktree", "unlock", &plan.path], &[]).await;
    if path.exists() {
        std::fs::remove_dir_all(path).map_err(io_err(path))?;
    }
    git(repo, &["worktree", "prune"], &[]).await?;
    Ok(())
}

/// Makes sure the planned worktree exists (idempotent): an existing one is left alone, a
/// half-created one is cleared and made again, an existing branch is checked out as it is.
pub async fn create(plan: &PlannedWorktree) -> Result<(), WorktreeError> {
    let _serial = WORKTREE_LOCK.lock().await;
    let mut tries = 0;
    loop {
        tries += 1;
        match create_once(plan).await {
            Err(_) if tries < CREATE_TRIES => {
                tokio::time::sleep(std::time::Duration::from_millis(100 * u64::from(tries))).await;
            }
            other => return other,
        }
    }
}

async fn create_once(plan: &PlannedWorktree) -> Result<(), WorktreeError> {
    if registered(plan).await? {
        return Ok(());
    }
    clear_leftovers(plan).await?;
    let path = Path::new(&plan.path);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let repo = Path::new(&plan.repo);
    let added = if branch_tip(plan).await?.is_some() {
        git(repo, &["worktree", "add", &plan.path, &plan.branch], &[]).await
    } else {
        git(
            repo,
            &[
                "worktree",
                "add",
                "-b",
                &plan.branch,
                &plan.path,
                &plan.base,
            ],
            &[],
        )
        .await
    };
    match added {
        Ok(_) => Ok(()),
        // A git left running by a crashed sortie may have just made it.
        Err(_) if registered(plan).await? => Ok(()),
        Err(e) => Err(e),
    }
}

/// Finalizes a worktree (idempotent): changed → kept, its patch against `base` written
/// atomically to `patch`; unchanged → worktree removed and branch deleted.
pub async fn finalize(plan: &PlannedWorktree, patch: &Path) -> Result<Finalized, WorktreeError> {
    let patch = &std::path::absolute(patch).map_err(io_err(patch))?;
    let _serial = WORKTREE_LOCK.lock().await;
    let repo = Path::new(&plan.repo);
    let path = Path::new(&plan.path);
    let exists = registered(plan).await?;
    // The state to compare with the base: the worktree's files (uncommitted and untracked
    // included), or the branch when the worktree is gone.
    let target = if exists {
        let head = git(path, &["rev-parse", "--verify", "HEAD^{commit}"], &[]).await?;
        let dirty = !git(
            path,
            &["status", "--porcelain", "--untracked-files=all"],
            &[],
        )
        .await?
        .is_empty();
        if head == plan.base && !dirty {
            None
        } else {
            let scratch = patch.with_extension("index.tmp");
            Some(snapshot_tree(path, &scratch, None).await?)
        }
    } else {
        clear_leftovers(plan).await?;
        branch_tip(plan).await?.filter(|tip| *tip != plan.base)
    };
    if let Some(target) = target {
        let stat = git(repo, &["diff", "--stat", &plan.base, &target], &[]).await?;
        let diff = git_raw(repo, &["diff", "--binary", &plan.base, &target], &[]).await?;
        if !diff.success() {
            return Err(WorktreeError::Git {
                what: "git diff".into(),
                detail: first_lines(&diff.stderr),
            });
        }
        if let Some(dir) = patch.parent() {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        write_atomic(patch, &diff.stdout, 0o644).map_err(|e| WorktreeError::Io {
            path: patch.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let summary = if stat.is_empty() {
            "no file differs from the base (commits only)".to_owned()
        } else {
            stat
        };
        return Ok(Finalized {
            changed: true,
            diff: Some(summary),
        });
    }
    if exists {
        let removed = git(
            repo,
            &["worktree", "remove", "--force", "--force", &plan.path],
            &[],
        )
        .await;
        if let Err(e) = removed
            && path.exists()
        {
            return Err(e);
        }
        clear_leftovers(plan).await?;
    }
    if branch_tip(plan).await?.is_some() {
        git(repo, &["branch", "-D", &plan.branch], &[]).await?;
    }
    // The run's worktree directory goes once its last worktree does.
    if let Some(parent) = path.parent() {
        let _ = std::fs::remove_dir(parent);
    }
    Ok(Finalized {
        changed: false,
        diff: None,
    })
}

/// Runs a setup step within the task's deadline (dropping it kills its git command).
pub async fn within<T>(
    budget: std::time::Duration,
    fut: impl std::future::Future<Output = std::result::Result<T, String>>,
) -> std::result::Result<T, String> {
    match tokio::time::timeout(budget, fut).await {
        Ok(r) => r,
        Err(_) => Err("the task's deadline ran out during worktree setup".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_names_are_unique_and_valid() {
        assert_eq!(safe_name("fix-bug_2.x", 3), "fix-bug_2.x");
        assert_eq!(safe_name("a b/c", 4), "t4-a-b-c");
        assert_eq!(safe_name(".hidden", 1), "t1-hidden");
        assert_eq!(safe_name("x.lock", 2), "t2-x.lockx");
        assert_eq!(safe_name("", 0), "t0-x");
        assert_ne!(safe_name("a b", 1), safe_name("a/b", 2));
    }
}
