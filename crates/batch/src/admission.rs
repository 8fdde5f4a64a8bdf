//! Admission checks of a resolved batch that need the filesystem (core's `validate_batch` is
//! pure), run once it is valid: agent tasks that could write in the same checkout at once, and artifact paths inside
//! sortie's own worktrees.
//!
//! Shared writes. Two tasks are refused together when all of these hold:
//! - both are agent tasks that may write (`TaskSpec::may_write`: a known agent unless its
//!   `permissions` are `read-only`; a `plain` profile when it says `may_write = true`; an
//!   unknown profile counts as writing). A task with its own `command` is the user's business:
//!   never refused;
//! - neither is isolated (`isolation = "none"`);
//! - they work in the same checkout: their checkouts (the git work tree that holds the task's
//!   `cwd`, found by looking for `.git` upwards, else the `cwd` itself) are the same, or one
//!   lies inside the other;
//! - they could run at once: `concurrency > 1` and neither needs the other, transitively.
//!
//! The batch file's run-level `allow_shared_writes = true` (or `--allow-shared-writes`) turns
//! the check off. It is a load-time switch only: it is not part of `RunConfig`, since nothing
//! after admission reads it and `RunConfig` is journaled in a versioned schema.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use sortie_core::{Batch, Isolation};

use crate::Overrides;
use crate::error::Issues;
use crate::load::clean;
use crate::resolve::Input;

/// The admission checks that need the filesystem (below), on a batch that passed
/// validation: artifacts inside the state dir's worktrees, and agent tasks that could write in
/// the same checkout at once.
pub(crate) fn admit(input: &Input<'_>, batch: &Batch, ov: &Overrides, issues: &mut Issues) {
    let task_at = |i: usize| {
        input
            .tasks
            .get(i)
            .map_or((input.file, None), |t| (t.file.as_path(), t.line))
    };
    if let Some(worktrees) = &ov.worktrees {
        let worktrees = std::path::absolute(worktrees)
            .map(|d| clean(&d))
            .unwrap_or_else(|_| worktrees.clone());
        for (i, spec) in batch.tasks.iter().enumerate() {
            let Some(out) = &spec.output else { continue };
            if is_inside(Path::new(out), &worktrees) {
                let (file, task_line) = task_at(i);
                let line = input
                    .tasks
                    .get(i)
                    .and_then(|t| t.keys.get("output").copied().flatten())
                    .or(task_line);
                issues.add(
                    file,
                    line,
                    Some("output"),
                    format!(
                        "{out} is inside sortie's worktrees ({}); an artifact must live \
                         outside every worktree",
                        worktrees.display()
                    ),
                );
            }
        }
    }
    let allowed = ov
        .allow_shared_writes
        .or(input.run.allow_shared_writes)
        .unwrap_or(false);
    if allowed {
        return;
    }
    for c in shared_writes(batch) {
        let (file, line) = task_at(c.second);
        let (first_file, first_line) = task_at(c.first);
        let first_at = match first_line {
            Some(l) if first_file == file => format!(" (line {l})"),
            Some(l) => format!(" ({}:{l})", first_file.display()),
            None => String::new(),
        };
        issues.add(
            file,
            line,
            Some("isolation"),
            format!(
                "tasks {:?}{first_at} and {:?} may both write in {} at the same time; give \
                 one of them `isolation = \"worktree\"`, make one need the other, or set \
                 `allow_shared_writes = true` at the top of the batch file",
                batch.tasks[c.first].label,
                batch.tasks[c.second].label,
                c.checkout.display()
            ),
        );
    }
}

/// Two tasks that may write in the same checkout at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedWrite {
    /// The earlier task (index in the batch).
    pub(crate) first: usize,
    /// The later task.
    pub(crate) second: usize,
    /// The checkout they share (the outer one when one holds the other).
    pub(crate) checkout: PathBuf,
}

/// For each task that conflicts with an earlier one, the first such conflict, in task order.
pub(crate) fn shared_writes(batch: &Batch) -> Vec<SharedWrite> {
    if batch.config.concurrency <= 1 {
        return Vec::new();
    }
    let writers: Vec<(usize, PathBuf)> = batch
        .tasks
        .iter()
        .enumerate()
        .filter(|(_, t)| {
            t.command.is_none()
                && t.isolation == Isolation::None
                && t.may_write(batch.agents.get(&t.agent))
        })
        .map(|(i, t)| (i, checkout_of(Path::new(&t.cwd))))
        .collect();
    if writers.len() < 2 {
        return Vec::new();
    }
    let links = sortie_core::session::session_links(batch);
    let needed: Vec<HashSet<usize>> = writers
        .iter()
        .map(|&(i, _)| transitive_needs(batch, &links, i))
        .collect();
    let mut out = Vec::new();
    for (b, (second, root_b)) in writers.iter().enumerate() {
        for (a, (first, root_a)) in writers.iter().enumerate().take(b) {
            let overlap = root_b.starts_with(root_a) || root_a.starts_with(root_b);
            let ordered = needed[b].contains(first) || needed[a].contains(second);
            if overlap && !ordered {
                out.push(SharedWrite {
                    first: *first,
                    second: *second,
                    checkout: if root_b.starts_with(root_a) {
                        root_a.clone()
                    } else {
                        root_b.clone()
                    },
                });
                break;
            }
        }
    }
    out
}

/// Every task that task `i` needs, directly or not (a session task needs the task of its
/// session listed before it, #13).
fn transitive_needs(batch: &Batch, links: &[Option<usize>], i: usize) -> HashSet<usize> {
    let mut seen = HashSet::new();
    let mut stack = vec![i];
    while let Some(t) = stack.pop() {
        let Some(spec) = batch.tasks.get(t) else {
            continue;
        };
        let needs = spec
            .needs
            .iter()
            .filter_map(|need| batch.tasks.iter().position(|o| &o.label == need));
        for dep in needs.chain(links.get(t).copied().flatten()) {
            if seen.insert(dep) {
                stack.push(dep);
            }
        }
    }
    seen
}

/// The checkout a directory belongs to: the nearest directory at or above it holding `.git`
/// (a directory, or a file for a linked worktree), else the directory itself. Symlinks are
/// resolved when the directory exists.
pub(crate) fn checkout_of(dir: &Path) -> PathBuf {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    dir.ancestors()
        .find(|d| d.join(".git").exists())
        .map_or_else(|| dir.clone(), Path::to_path_buf)
}

/// Whether `path` lies inside `dir`, comparing the paths as given and with symlinks resolved
/// (for `path`, through its nearest existing ancestor).
pub(crate) fn is_inside(path: &Path, dir: &Path) -> bool {
    if path.starts_with(dir) {
        return true;
    }
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return false;
    };
    let mut rest = Vec::new();
    for ancestor in path.ancestors() {
        if let Ok(real) = std::fs::canonicalize(ancestor) {
            let full: PathBuf = real.join(rest.iter().rev().collect::<PathBuf>());
            return full.starts_with(&dir);
        }
        if let Some(name) = ancestor.file_name() {
            rest.push(name.to_owned());
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::{AgentProfile, RunConfig, TaskSpec};

    fn batch(tasks: Vec<TaskSpec>, concurrency: u32) -> Batch {
        Batch {
            tasks,
            agents: AgentProfile::builtins(),
            config: RunConfig {
                concurrency,
                fail_fast: false,
                ..RunConfig::default()
            },
            source: "b.toml".into(),
        }
    }

    fn agent(label: &str, cwd: &Path) -> TaskSpec {
        let mut t = TaskSpec::new(label, cwd.to_string_lossy());
        t.prompt = Some("edit things".into());
        t
    }

    #[test]
    fn writers_in_one_checkout_at_once_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(repo.join("sub")).unwrap();
        let other = dir.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        let a = agent("a", &repo);
        let b = agent("b", &repo.join("sub"));
        let c = agent("c", &other);
        let found = shared_writes(&batch(vec![a.clone(), b.clone(), c.clone()], 4));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].first, found[0].second), (0, 1));
        assert!(found[0].checkout.ends_with("repo"), "{found:?}");

        // Serial runs, a dependency (even indirect), isolation, a command, a read-only agent:
        // none is refused.
        assert!(shared_writes(&batch(vec![a.clone(), b.clone()], 1)).is_empty());
        let mut mid = agent("mid", &other);
        mid.needs = vec!["a".into()];
        let mut b_after = b.clone();
        b_after.needs = vec!["mid".into()];
        assert!(shared_writes(&batch(vec![a.clone(), mid, b_after], 4)).is_empty());
        let mut iso = b.clone();
        iso.isolation = Isolation::Worktree;
        assert!(shared_writes(&batch(vec![a.clone(), iso], 4)).is_empty());
        let mut cmd = b.clone();
        cmd.prompt = None;
        cmd.command = Some(vec!["make".into()]);
        assert!(shared_writes(&batch(vec![a.clone(), cmd], 4)).is_empty());
        let mut ro = b.clone();
        ro.agent = "command".into();
        assert!(shared_writes(&batch(vec![a.clone(), ro], 4)).is_empty());
        // A known agent with read-only permissions does not write: it shares the checkout.
        let mut reader = b.clone();
        reader.permissions = sortie_core::Permissions::ReadOnly;
        assert!(shared_writes(&batch(vec![a.clone(), reader], 4)).is_empty());
        let mut full = b;
        full.permissions = sortie_core::Permissions::Full;
        assert_eq!(shared_writes(&batch(vec![a, full], 4)).len(), 1);
    }

    #[test]
    fn inside_follows_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir_all(real.join("worktrees")).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(is_inside(
            &link.join("worktrees/run/x/out.md"),
            &real.join("worktrees")
        ));
        assert!(is_inside(
            &real.join("worktrees/a.md"),
            &link.join("worktrees")
        ));
        assert!(!is_inside(&real.join("out.md"), &real.join("worktrees")));
    }
}
