//! #34: a sandboxed attempt's launch: the facts its policy is made of (its working directory,
//! agent home, session directories, private `TMPDIR`, the agent's install, a worktree's git
//! dirs), the policy core decides from them written into `sandbox/<task>.<attempt>/`, and the
//! argv wrapped in `sortie __sandbox`, which applies it before it execs the agent. A machine
//! that cannot sandbox fails the launch: a sandboxed task never runs unconfined.

use std::fs;
use std::path::{Path, PathBuf};

use sortie_core::sandbox::{Facts, policy};

use crate::agent::LaunchPlan;
use crate::process::SpawnSpec;
use crate::supervisor::sandbox::{Support, install_of, probe, wrap, write_policy};

/// A sandboxed task's own lists, and where its attempt's sandbox files go.
#[derive(Debug, Clone)]
pub(crate) struct SandboxPlan {
    /// `<run-dir>/sandbox/<task>.<attempt>`.
    pub(crate) dir: PathBuf,
    /// `sandbox_write`.
    pub(crate) write: Vec<String>,
    /// `sandbox_read`.
    pub(crate) read: Vec<String>,
    /// `sandbox_hosts`.
    pub(crate) hosts: Vec<String>,
}

/// `spec` wrapped in the sandbox of `plan`, or why it cannot be.
pub(crate) fn confine(
    plan: &SandboxPlan,
    mut spec: SpawnSpec,
    launch: &LaunchPlan,
) -> Result<SpawnSpec, String> {
    let Some(sortie) = crate::executor::supervisor() else {
        return Err("the task is sandboxed, and sortie cannot find its own binary".into());
    };
    if let Support::No(why) = probe(sortie) {
        return Err(why.clone());
    }
    let tmp = plan.dir.join("tmp");
    crate::layout::private_dir(&tmp)
        .map_err(|e| format!("cannot create the sandbox's {}: {e}", tmp.display()))?;
    let text = |p: &Path| p.display().to_string();
    let workdir = fs::canonicalize(&spec.cwd).unwrap_or_else(|_| spec.cwd.clone());
    let program = spec.argv.first().cloned().unwrap_or_default();
    let resolved = crate::process::resolve::resolve(&program, &spec.env)
        .unwrap_or_else(|| PathBuf::from(&program));
    let mut sessions: Vec<String> = launch.session_dir.iter().map(|p| text(p)).collect();
    if let Some(home) = &launch.home
        && let Some((_, store)) = &home.session_store
    {
        sessions.push(text(store));
    }
    let (git_write, git_read) = git_dirs(&workdir);
    let facts = Facts {
        workdir: text(&workdir),
        home: launch.home.as_ref().map(|h| text(&h.dir)),
        tmp: text(&tmp),
        install: install_of(&resolved).map(|p| text(&p)),
        git_write,
        git_read,
        sessions,
    };
    let policy = policy(&facts, &plan.write, &plan.read, &plan.hosts);
    let file = plan.dir.join("policy.json");
    write_policy(&file, &policy)
        .map_err(|e| format!("cannot write the sandbox's {}: {e}", file.display()))?;
    if resolved.is_absolute()
        && let Some(first) = spec.argv.first_mut()
    {
        *first = text(&resolved);
    }
    spec.argv = wrap(sortie, &file, std::mem::take(&mut spec.argv));
    Ok(spec)
}

/// A worktree's git dirs, found from its `.git` file (`gitdir: <admin>`, and the admin dir's
/// `commondir`): what a commit writes (the common dir's objects, refs and logs, the admin dir)
/// and what git reads (the common dir, the worktree's root). Nothing outside a worktree (a
/// checkout's `.git` is under its working directory already).
fn git_dirs(workdir: &Path) -> (Vec<String>, Vec<String>) {
    let Some((root, dotgit)) = workdir
        .ancestors()
        .map(|d| (d, d.join(".git")))
        .find(|(_, g)| g.exists())
    else {
        return (vec![], vec![]);
    };
    let mut read = vec![root.display().to_string()];
    let Ok(text) = fs::read_to_string(&dotgit) else {
        return (vec![], read);
    };
    let Some(admin) = text.trim().strip_prefix("gitdir:").map(|s| s.trim()) else {
        return (vec![], read);
    };
    let admin = root.join(admin);
    let common = fs::read_to_string(admin.join("commondir"))
        .map(|c| admin.join(c.trim()))
        .unwrap_or_else(|_| admin.clone());
    let common = fs::canonicalize(&common).unwrap_or(common);
    let write = ["objects", "refs", "logs"]
        .iter()
        .map(|d| common.join(d).display().to_string())
        .chain([admin.display().to_string()])
        .collect();
    read.push(common.display().to_string());
    (write, read)
}
