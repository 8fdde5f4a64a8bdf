//! What a user does with a kept worktree once its task ended: look at its change ([`diff`]),
//! bring it onto their checkout ([`apply`]), throw it away ([`discard`]), and collect the kept
//! worktrees of old finished runs ([`gc`]).
//!
//! A kept worktree is found through its run's journal: `WorktreePlanned` gave its repository,
//! path, branch and base, `WorktreeFinalized { changed: true }` says it was kept, and its patch
//! (everything it changed against its base, uncommitted and untracked files included) is at
//! `<run-dir>/patches/<name>.patch` (see `worktree`).
//!
//! A discard is journaled (`WorktreeDiscarded`: who removed it, `discard` or `gc`, and whether
//! the branch was kept), the one task event a run takes after its end, under the run's lock: a
//! live run's worktrees are discarded once it has ended. `status`, `diff` and `apply` read it
//! from the journal. The patch file is never removed: it is the last record of the work.
//!
//! Invariants:
//! - `apply` never leaves the checkout half-changed: the three-way merge is tried on a scratch
//!   index built from the checkout's files (tracked and untracked); only when it is clean is the
//!   merged change applied to the files, by one atomic `git apply`, as uncommitted changes (the
//!   user's index is never touched). A conflict leaves every file as it was. `apply_commit`
//!   is the one exception to the index rule: it needs an index with nothing staged, applies
//!   through it and commits the change alone.
//! - `gc` never deletes a branch with a commit that no other ref reaches, never touches a live
//!   or unfinished run, and removes worktrees of finished runs only past the retention.
//! - Every git command goes through `process::run_tool`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sortie_core::{
    DiscardedBy, Event, PlannedWorktree, RunId, RunState, RunStatus, TaskId, TaskState,
    TerminalState, Timestamp,
};

use crate::clock;
use crate::files::write_atomic;
use crate::layout::{Owner, RunDir, StateDir};
use crate::{process, worktree};

/// Why a kept-worktree command could not do its job.
#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    /// The run has no task of that label.
    #[error("run {run} has no task {label:?}")]
    NoTask {
        /// The run.
        run: RunId,
        /// The label asked for.
        label: String,
    },
    /// The task has no worktree, or its worktree was not kept.
    #[error("task {label:?} has no kept worktree: {why}")]
    NotKept {
        /// The task.
        label: String,
        /// Why (not isolated, not finished yet, unchanged and removed).
        why: String,
    },
    /// The worktree was discarded (by `discard` or `gc`).
    #[error(
        "task {label:?}'s worktree was removed by {by}; its patch is still at {}",
        patch.display()
    )]
    Discarded {
        /// The task.
        label: String,
        /// Who: `` `sortie discard` ``, `` `sortie gc` `` or the run's `pick`.
        by: String,
        /// The patch that remains.
        patch: PathBuf,
    },
    /// A git command could not run, or failed.
    #[error("{what}: {detail}")]
    Git {
        /// What sortie was doing.
        what: String,
        /// What git said.
        detail: String,
    },
    /// The run is live: its journal has an owner, who alone writes it.
    #[error(
        "run {run} is live{}: discard its worktrees once it has ended",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Live {
        /// The run.
        run: RunId,
        /// Its owner's pid, when known.
        pid: Option<u32>,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A run's journal could not be read.
    #[error("run {run}: {source}")]
    Journal {
        /// The run.
        run: RunId,
        /// The cause.
        source: sortie_journal::Error,
    },
}

impl KeptError {
    /// True when the command was asked about something that is not there (a usage error),
    /// rather than failing at its job.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            KeptError::NoTask { .. } | KeptError::NotKept { .. } | KeptError::Discarded { .. }
        )
    }
}

type Result<T, E = KeptError> = std::result::Result<T, E>;

/// A kept worktree of a finished task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kept {
    /// The run.
    pub run: String,
    /// The task's label.
    pub label: String,
    /// The task's number (from 0, in file order).
    pub task: u32,
    /// The repository it belongs to (where `apply` applies).
    pub repo: String,
    /// The worktree's path (it may be gone, see `discarded`).
    pub path: String,
    /// Its branch.
    pub branch: String,
    /// The commit it started from.
    pub base: String,
    /// Its patch file.
    pub patch: PathBuf,
    /// The diff summary journaled when it was finalized.
    pub summary: Option<String>,
    /// Set when it was discarded or collected.
    pub discarded: Option<Discard>,
    /// How its task ended (`None` while it has not).
    pub ended: Option<TerminalState>,
}

/// A removed kept worktree, as its `WorktreeDiscarded` recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discard {
    /// `discard` or `gc`.
    pub by: String,
    /// When, in ms since the epoch.
    pub at: u64,
    /// Whether the branch was kept (gc keeps a branch with commits found nowhere else).
    pub branch_kept: bool,
}

impl From<&sortie_core::Discarded> for Discard {
    fn from(d: &sortie_core::Discarded) -> Self {
        Discard {
            by: d.by.as_str().to_owned(),
            at: d.at.0,
            branch_kept: d.branch_kept,
        }
    }
}

/// Finds task `label`'s kept worktree in run `run`'s replayed state.
pub fn find(state: &RunState, state_dir: &StateDir, run: &RunId, label: &str) -> Result<Kept> {
    let task = state
        .task_by_label(label)
        .ok_or_else(|| KeptError::NoTask {
            run: run.clone(),
            label: label.to_owned(),
        })?;
    let rec = state.task(task).ok_or_else(|| KeptError::NoTask {
        run: run.clone(),
        label: label.to_owned(),
    })?;
    let not_kept = |why: &str| KeptError::NotKept {
        label: label.to_owned(),
        why: why.to_owned(),
    };
    let plan = rec
        .steps()
        .worktree
        .clone()
        .ok_or_else(|| not_kept("it did not run in a worktree (isolation = \"none\")"))?;
    let summary = match rec.steps().worktree_final.as_ref() {
        // A finalize that failed keeps the worktree as it is (its task ended partial).
        None if rec.state.is_terminal() => None,
        None => return Err(not_kept("its task has not finished yet")),
        Some((false, _)) => return Err(not_kept("it was unchanged, so it was removed")),
        Some((true, summary)) => summary.clone(),
    };
    // Absolute: git runs in the repository, not here.
    let run_dir = state_dir.absolute().run(run);
    let discarded = rec.steps().discarded.as_ref().map(Discard::from);
    Ok(Kept {
        run: run.to_string(),
        label: label.to_owned(),
        task: task.0,
        repo: plan.repo,
        path: plan.path,
        branch: plan.branch,
        base: plan.base,
        patch: run_dir.patch(&worktree::safe_name(label, task.0)),
        summary,
        discarded,
        ended: match &rec.state {
            TaskState::Finished(r) => Some(r.state),
            _ => None,
        },
    })
}

fn refuse_discarded(kept: &Kept) -> Result<()> {
    match &kept.discarded {
        Some(d) => Err(KeptError::Discarded {
            label: kept.label.clone(),
            by: match d.by.as_str() {
                "pick" => DiscardedBy::Pick.who().to_owned(),
                other => format!("`sortie {other}`"),
            },
            patch: kept.patch.clone(),
        }),
        None => Ok(()),
    }
}

fn git_env() -> Vec<(String, String)> {
    vec![
        ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ("LC_ALL".into(), "C".into()),
    ]
}

async fn git_raw(
    cwd: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> Result<process::ToolOutput> {
    let mut argv = vec!["git".to_owned()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    let mut all = git_env();
    all.extend(env.iter().cloned());
    process::run_tool(&argv, cwd, &all)
        .await
        .map_err(|e| KeptError::Git {
            what: format!("git {}", args.join(" ")),
            detail: e.to_string(),
        })
}

async fn git(cwd: &Path, args: &[&str], env: &[(String, String)]) -> Result<String> {
    let out = git_raw(cwd, args, env).await?;
    if out.success() {
        Ok(out.text())
    } else {
        Err(KeptError::Git {
            what: format!("git {} (in {})", args.join(" "), cwd.display()),
            detail: stderr_lines(&out.stderr),
        })
    }
}

fn stderr_lines(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        "failed".to_owned()
    } else {
        lines.join("; ")
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeptError + '_ {
    move |source| KeptError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The change of a kept worktree: its patch file, or, when the patch is missing, `git diff`
/// of the worktree against its base (tracked files only).
pub async fn diff(kept: &Kept) -> Result<Vec<u8>> {
    refuse_discarded(kept)?;
    match std::fs::read(&kept.patch) {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && Path::new(&kept.path).exists() => {
            let out = git_raw(
                Path::new(&kept.path),
                &["diff", "--binary", &kept.base],
                &[],
            )
            .await?;
            if out.success() {
                Ok(out.stdout)
            } else {
                Err(KeptError::Git {
                    what: format!("git diff {} in {}", kept.base, kept.path),
                    detail: stderr_lines(&out.stderr),
                })
            }
        }
        Err(e) => Err(io(&kept.patch)(e)),
    }
}

/// How an apply went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Applied {
    /// The patch applied as it is.
    Clean,
    /// The patch needed a three-way merge, which was clean.
    Merged,
    /// The three-way merge conflicts: nothing was changed.
    Conflict {
        /// What git said (the conflicting paths among it).
        detail: String,
    },
    /// The worktree changed nothing that a patch holds (commits only, or an empty patch).
    Empty,
}

/// Applies a kept worktree's change onto its repository's checkout as uncommitted changes
/// (see the module's invariants: a conflict changes nothing).
pub async fn apply(kept: &Kept) -> Result<Applied> {
    apply_to(kept, false).await
}

/// Applies a kept worktree's change and commits it, alone, in one commit (`message`) on the
/// repository's current branch: the change goes through the index (`git apply --index`), so
/// the index must hold nothing staged beforehand (refused otherwise: the commit would take it
/// along). A conflict changes nothing and commits nothing. Returns the commit, when one was made.
pub async fn apply_commit(kept: &Kept, message: &str) -> Result<(Applied, Option<String>)> {
    refuse_discarded(kept)?;
    let repo = Path::new(&kept.repo);
    let has_head = git_raw(repo, &["rev-parse", "--verify", "--quiet", "HEAD"], &[])
        .await?
        .success();
    if has_head
        && !git_raw(repo, &["diff", "--cached", "--quiet"], &[])
            .await?
            .success()
    {
        return Err(KeptError::Git {
            what: format!("commit {}'s change in {}", kept.label, kept.repo),
            detail: "the index holds staged changes, which the commit would take along;                      commit or unstage them first"
                .into(),
        });
    }
    let applied = apply_to(kept, true).await?;
    if !matches!(applied, Applied::Clean | Applied::Merged) {
        return Ok((applied, None));
    }
    git(repo, &["commit", "-q", "--no-verify", "-m", message], &[]).await?;
    let commit = git(repo, &["rev-parse", "HEAD"], &[]).await?;
    Ok((applied, Some(commit)))
}

/// The message of the commit `apply --commit` makes for a kept worktree's change.
pub fn commit_message(kept: &Kept) -> String {
    format!("sortie: {} (run {})", kept.label, kept.run)
}

/// Applies one kept worktree's change: as uncommitted changes ([`apply`]), or (`commit`) in a
/// commit of its own with [`commit_message`] ([`apply_commit`]).
pub async fn apply_one(kept: &Kept, commit: bool) -> Result<(Applied, Option<String>)> {
    if commit {
        apply_commit(kept, &commit_message(kept)).await
    } else {
        apply(kept).await.map(|a| (a, None))
    }
}

/// What [`apply_all`] did.
#[derive(Debug)]
pub struct AllApplied<'a> {
    /// The worktrees applied, in task order, each with how it went and the commit made; when
    /// `stopped`, the last one is the conflict.
    pub applied: Vec<(&'a Kept, Applied, Option<String>)>,
    /// Whether it stopped at a conflict.
    pub stopped: bool,
    /// The worktrees after the conflict, not tried (discarded ones aside).
    pub not_applied: Vec<&'a Kept>,
    /// The discarded worktrees, skipped: gone from disk, their patch stays.
    pub discarded: Vec<&'a Kept>,
    /// The worktrees of tasks that did not complete, skipped (without `include_failed`).
    pub not_completed: Vec<&'a Kept>,
}

/// Why [`apply_all`] stopped before its end: an error applying one worktree.
#[derive(Debug)]
pub struct StoppedAt<'a> {
    /// The worktree whose apply failed.
    pub at: &'a Kept,
    /// The ones applied before it.
    pub before: Vec<&'a Kept>,
    /// What went wrong.
    pub error: KeptError,
}

/// Applies every kept worktree of `all` (a run's, in task order: see [`all`]) with
/// [`apply_one`]: discarded ones are skipped, and so are those of tasks that did not complete
/// unless `include_failed` (core's [`TerminalState::applied_by_all`]); each apply is
/// all-or-nothing, and the first conflict stops it (a conflict changes nothing; the ones after
/// it are not tried).
pub async fn apply_all(
    all: &[Kept],
    commit: bool,
    include_failed: bool,
) -> Result<AllApplied<'_>, StoppedAt<'_>> {
    let taken = |k: &&Kept| {
        k.discarded.is_none() && k.ended.is_some_and(|e| e.applied_by_all(include_failed))
    };
    let mut applied: Vec<(&Kept, Applied, Option<String>)> = Vec::new();
    let mut stopped = false;
    for k in all.iter().filter(taken) {
        let (how, made) = apply_one(k, commit).await.map_err(|error| StoppedAt {
            at: k,
            before: applied.iter().map(|(d, _, _)| *d).collect(),
            error,
        })?;
        stopped = matches!(how, Applied::Conflict { .. });
        applied.push((k, how, made));
        if stopped {
            break;
        }
    }
    let not_applied = all
        .iter()
        .filter(|k| taken(k) && !applied.iter().any(|(d, _, _)| d.label == k.label))
        .collect();
    let discarded = all.iter().filter(|k| k.discarded.is_some()).collect();
    let not_completed = all
        .iter()
        .filter(|k| k.discarded.is_none() && !taken(k))
        .collect();
    Ok(AllApplied {
        applied,
        stopped,
        not_applied,
        discarded,
        not_completed,
    })
}

/// Every kept worktree of a run, in task order (one discarded since included: it says so).
pub fn all(state: &RunState, state_dir: &StateDir, run: &RunId) -> Vec<Kept> {
    (0..state.tasks.len())
        .filter_map(|i| {
            let label = state.label(TaskId(u32::try_from(i).ok()?));
            find(state, state_dir, run, &label).ok()
        })
        .collect()
}

/// [`apply`], through the index too when `index` (for [`apply_commit`]).
async fn apply_to(kept: &Kept, index: bool) -> Result<Applied> {
    refuse_discarded(kept)?;
    let patch = diff(kept).await?;
    if patch.iter().all(u8::is_ascii_whitespace) {
        return Ok(Applied::Empty);
    }
    if !kept.patch.exists() {
        // A failed finalize wrote no patch: apply the worktree's diff against its base.
        if let Some(dir) = kept.patch.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        write_atomic(&kept.patch, &patch, 0o644).map_err(|e| KeptError::Io {
            path: kept.patch.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
    }
    let repo = Path::new(&kept.repo);
    let patch_arg = kept.patch.to_string_lossy().into_owned();
    let stage: &[&str] = if index { &["--index"] } else { &[] };
    let args = |rest: &[&'static str], patch: &str| -> Vec<String> {
        std::iter::once("apply")
            .chain(stage.iter().copied())
            .chain(rest.iter().copied())
            .map(str::to_owned)
            .chain([patch.to_owned()])
            .collect()
    };
    let check = args(&["--check"], &patch_arg);
    let check: Vec<&str> = check.iter().map(String::as_str).collect();
    if git_raw(repo, &check, &[]).await?.success() {
        let run = args(&[], &patch_arg);
        let run: Vec<&str> = run.iter().map(String::as_str).collect();
        git(repo, &run, &[]).await?;
        return Ok(Applied::Clean);
    }
    // A three-way merge, tried on a scratch index that holds the checkout's files as they are.
    let scratch = kept.patch.with_extension("apply-index.tmp");
    let merged_patch = kept.patch.with_extension("merged.tmp");
    let result = merge_on_scratch(repo, &patch_arg, &scratch, &merged_patch).await;
    let _ = std::fs::remove_file(&scratch);
    let outcome = match result {
        Ok(None) => Ok(Applied::Merged),
        Ok(Some(detail)) => Ok(Applied::Conflict { detail }),
        Err(e) => Err(e),
    };
    if matches!(outcome, Ok(Applied::Merged)) {
        let merged_arg = merged_patch.to_string_lossy().into_owned();
        let run = args(&[], &merged_arg);
        let run: Vec<&str> = run.iter().map(String::as_str).collect();
        let applied = git(repo, &run, &[]).await;
        let _ = std::fs::remove_file(&merged_patch);
        applied?;
    }
    let _ = std::fs::remove_file(&merged_patch);
    outcome
}

/// Gives `copy` the modification time of `original`.
fn keep_modified(original: &Path, copy: &Path) -> std::io::Result<()> {
    let modified = std::fs::metadata(original)?.modified()?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(copy)?
        .set_modified(modified)
}

/// Merges `patch` three ways into a scratch index made of the checkout's files; on success
/// writes to `out` the patch from the checkout's files to the merged result and returns None;
/// on a conflict returns what git said. The checkout and its index are left alone.
async fn merge_on_scratch(
    repo: &Path,
    patch: &str,
    scratch: &Path,
    out: &Path,
) -> Result<Option<String>> {
    let index = git(
        repo,
        &["rev-parse", "--path-format=absolute", "--git-path", "index"],
        &[],
    )
    .await?;
    match std::fs::copy(&index, scratch) {
        // The copy keeps the index's modification time: git trusts a file's cached stat data
        // only when the file is older than the index, so a copy dated now would hide a file
        // rewritten since with the same size in the same second ("racy git").
        Ok(_) => keep_modified(Path::new(&index), scratch).map_err(io(scratch))?,
        // A repository with no index yet: the scratch index starts empty.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(scratch)(e)),
    }
    let env = vec![(
        "GIT_INDEX_FILE".to_owned(),
        scratch.to_string_lossy().into_owned(),
    )];
    git(repo, &["add", "-A"], &env).await?;
    let before = git(repo, &["write-tree"], &env).await?;
    let merged = git_raw(repo, &["apply", "--3way", "--cached", patch], &env).await?;
    if !merged.success() {
        return Ok(Some(stderr_lines(&merged.stderr)));
    }
    let after = git(repo, &["write-tree"], &env).await?;
    let diff = git_raw(repo, &["diff", "--binary", &before, &after], &[]).await?;
    if !diff.success() {
        return Err(KeptError::Git {
            what: "git diff of the merged result".into(),
            detail: stderr_lines(&diff.stderr),
        });
    }
    std::fs::write(out, &diff.stdout).map_err(io(out))?;
    Ok(None)
}

/// What removing a kept worktree did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Removed {
    /// The run.
    pub run: String,
    /// The task.
    pub label: String,
    /// The worktree's path.
    pub path: String,
    /// Its branch.
    pub branch: String,
    /// Whether the branch was deleted.
    pub branch_deleted: bool,
    /// Why the branch was kept, when it was.
    pub branch_kept_because: Option<String>,
}

/// Removes a kept worktree and deletes its branch, and journals the discard.
pub async fn discard(kept: &Kept, state_dir: &StateDir) -> Result<Removed> {
    refuse_discarded(kept)?;
    remove(kept, state_dir, DiscardedBy::Discard, true).await
}

/// #33: once a run finished, removes the kept worktrees of the samples its `pick` did not
/// choose (journaled `WorktreeDiscarded` by `pick`, branch deleted); their patches stay in the
/// run dir. Returns each removal, or the label and why it failed.
pub async fn discard_losers(
    state: &RunState,
    state_dir: &StateDir,
    run: &RunId,
) -> Vec<std::result::Result<Removed, (String, String)>> {
    let items = sortie_core::samples::items(state);
    let mut out = Vec::new();
    for item in items.iter().filter(|i| i.pick.is_some()) {
        for &task in &item.samples {
            if !sortie_core::samples::lost(state, &items, task) {
                continue;
            }
            let label = state.label(task).to_string();
            let Ok(kept) = find(state, state_dir, run, &label) else {
                continue; // nothing kept
            };
            if kept.discarded.is_some() {
                continue;
            }
            let removed = remove(&kept, state_dir, DiscardedBy::Pick, true).await;
            out.push(removed.map_err(|e| (label, e.to_string())));
        }
    }
    out
}

/// Removes the worktree (and its registration), then the branch when `force_branch` or when
/// no commit of it is found only there. Under the run's lock: the removal is journaled after
/// the worktree is gone (a discard cut short before is done again) and before the branch goes.
async fn remove(
    kept: &Kept,
    state_dir: &StateDir,
    by: DiscardedBy,
    force_branch: bool,
) -> Result<Removed> {
    let run = RunId::new(&kept.run).map_err(|e| KeptError::Io {
        path: PathBuf::from(&kept.run),
        source: std::io::Error::other(e.to_string()),
    })?;
    let run_dir = state_dir.run(&run);
    let _lock = run_dir.lock().map_err(|e| match e {
        crate::Error::Live { pid, .. } => KeptError::Live {
            run: run.clone(),
            pid,
        },
        other => KeptError::Io {
            path: run_dir.owner_lock(),
            source: std::io::Error::other(other.to_string()),
        },
    })?;
    let repo = Path::new(&kept.repo);
    let path = Path::new(&kept.path);
    let removed = git_raw(
        repo,
        &["worktree", "remove", "--force", "--force", &kept.path],
        &[],
    )
    .await?;
    if !removed.success() && path.exists() {
        std::fs::remove_dir_all(path).map_err(io(path))?;
    }
    git(repo, &["worktree", "prune"], &[]).await?;
    let branch_ref = format!("refs/heads/{}", kept.branch);
    let exists = git_raw(
        repo,
        &["rev-parse", "--verify", "--quiet", &branch_ref],
        &[],
    )
    .await?
    .success();
    let mut kept_because = None;
    if exists && !force_branch {
        let only_here = unique_commits(repo, &branch_ref).await?;
        if only_here > 0 {
            kept_because = Some(format!(
                "{only_here} commit(s) of {} are found on no other ref",
                kept.branch
            ));
        }
    }
    let branch_deleted = exists && kept_because.is_none();
    journal_discard(&run, &run_dir, kept, by, kept_because.is_some())?;
    if branch_deleted {
        git(repo, &["branch", "-D", &kept.branch], &[]).await?;
    }
    if let Some(parent) = path.parent() {
        let _ = std::fs::remove_dir(parent);
    }
    Ok(Removed {
        run: kept.run.clone(),
        label: kept.label.clone(),
        path: kept.path.clone(),
        branch: kept.branch.clone(),
        branch_deleted,
        branch_kept_because: kept_because,
    })
}

/// Appends `WorktreeDiscarded` to the run's journal (the caller holds the run's lock); one
/// journaled by a discard cut short before is left as it is.
fn journal_discard(
    run: &RunId,
    run_dir: &RunDir,
    kept: &Kept,
    by: DiscardedBy,
    branch_kept: bool,
) -> Result<()> {
    let task = TaskId(kept.task);
    let journaled = |source| KeptError::Journal {
        run: run.clone(),
        source,
    };
    let journal = sortie_journal::Journal::open(run_dir.path()).map_err(journaled)?;
    let state = journal.replay_latest().map_err(journaled)?;
    if state
        .task(task)
        .is_some_and(|r| r.steps().discarded.is_some())
    {
        return Ok(());
    }
    let event = Event::WorktreeDiscarded {
        task,
        by,
        branch_kept,
    };
    state.check(&event).map_err(|v| KeptError::NotKept {
        label: kept.label.clone(),
        why: v.to_string(),
    })?;
    journal.append(clock::now(), &event).map_err(journaled)?;
    Ok(())
}

/// How many commits of `branch_ref` no other ref (nor any HEAD) reaches.
async fn unique_commits(repo: &Path, branch_ref: &str) -> Result<u64> {
    let exclude = format!("--exclude={branch_ref}");
    let count = git(
        repo,
        &[
            "rev-list", "--count", branch_ref, "--not", &exclude, "--all",
        ],
        &[],
    )
    .await?;
    count.trim().parse().map_err(|_| KeptError::Git {
        what: format!("git rev-list --count {branch_ref}"),
        detail: format!("unexpected output {count:?}"),
    })
}

/// One run's part of a gc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcRun {
    /// The run.
    pub run: String,
    /// Why its worktrees were left alone, when they were.
    pub skipped: Option<String>,
    /// The worktrees removed.
    pub removed: Vec<Removed>,
    /// Worktrees that could not be removed, with why.
    pub failed: Vec<(String, String)>,
}

/// Removes the kept worktrees of finished runs that ended at least `older_than` before `now`
/// (see the module's invariants). Looks at every run with a directory under
/// `<state-dir>/worktrees/`, then prunes each repository's worktree list.
pub async fn gc(state_dir: &StateDir, older_than: Duration, now: Timestamp) -> Result<Vec<GcRun>> {
    let root = state_dir.worktrees();
    let mut names: Vec<String> = match std::fs::read_dir(&root) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(&root)(e)),
    };
    names.sort();
    let mut report = Vec::new();
    for name in names {
        let mut entry = GcRun {
            run: name.clone(),
            skipped: None,
            removed: Vec::new(),
            failed: Vec::new(),
        };
        match gc_run(state_dir, &name, older_than, now, &mut entry).await {
            Ok(()) => {}
            Err(e) => entry.skipped = Some(e.to_string()),
        }
        let _ = std::fs::remove_dir(root.join(&name));
        report.push(entry);
    }
    Ok(report)
}

async fn gc_run(
    state_dir: &StateDir,
    name: &str,
    older_than: Duration,
    now: Timestamp,
    entry: &mut GcRun,
) -> Result<()> {
    let Ok(run) = RunId::new(name) else {
        entry.skipped = Some("not a run id".into());
        return Ok(());
    };
    let run_dir = state_dir.run(&run);
    if !run_dir.exists() {
        entry.skipped = Some("no such run in the state dir".into());
        return Ok(());
    }
    if let Owner::Live { pid } = run_dir.owner() {
        entry.skipped = Some(format!(
            "the run is live (pid {})",
            pid.map_or_else(|| "unknown".to_owned(), |p| p.to_string())
        ));
        return Ok(());
    }
    let journal = sortie_journal::Journal::open_read_only(run_dir.path()).map_err(|source| {
        KeptError::Journal {
            run: run.clone(),
            source,
        }
    })?;
    let state = journal
        .replay_latest()
        .map_err(|source| KeptError::Journal {
            run: run.clone(),
            source,
        })?;
    drop(journal);
    if !matches!(state.status, RunStatus::Finished { .. }) {
        entry.skipped = Some("the run has not finished (resume or cancel it first)".into());
        return Ok(());
    }
    let ended = state.last_at.unwrap_or(Timestamp(0));
    let age = Duration::from_millis(now.0.saturating_sub(ended.0));
    if age < older_than {
        entry.skipped = Some(format!(
            "finished {} ago, within the retention of {}",
            humantime::format_duration(Duration::from_secs(age.as_secs())),
            humantime::format_duration(older_than)
        ));
        return Ok(());
    }
    let mut repos: Vec<String> = Vec::new();
    for (i, rec) in state.tasks.iter().enumerate() {
        let Some(PlannedWorktree { repo, .. }) = rec.steps().worktree.as_ref() else {
            continue;
        };
        let label = state.label(TaskId(i as u32));
        let Ok(kept) = find(&state, state_dir, &run, &label) else {
            continue;
        };
        if !repos.contains(repo) {
            repos.push(repo.clone());
        }
        let branch_ref = format!("refs/heads/{}", kept.branch);
        let branch_there = git_raw(
            Path::new(&kept.repo),
            &["rev-parse", "--verify", "--quiet", &branch_ref],
            &[],
        )
        .await
        .is_ok_and(|o| o.success());
        if !Path::new(&kept.path).exists() && (!branch_there || kept.discarded.is_some()) {
            continue;
        }
        match remove(&kept, state_dir, DiscardedBy::Gc, false).await {
            Ok(r) => entry.removed.push(r),
            Err(e) => entry.failed.push((label.clone(), e.to_string())),
        }
    }
    for repo in repos {
        let _ = git_raw(Path::new(&repo), &["worktree", "prune"], &[]).await;
    }
    Ok(())
}
