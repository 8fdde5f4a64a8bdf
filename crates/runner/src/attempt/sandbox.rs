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
    /// The attempt's model (its agent's provider may follow from it).
    pub(crate) model: Option<String>,
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
    let (mut linked_files, linked_dirs) = launch
        .home
        .as_ref()
        .map(|h| linked(&h.dir))
        .unwrap_or_default();
    // The session an earlier attempt of its conversation left (another task's, when a
    // session goes on across tasks): the agent appends to that file.
    if let Some(file) = launch.continues.as_deref().map(Path::new)
        && file.is_absolute()
        && file.is_file()
    {
        linked_files.push(text(file));
    }
    let providers = launch.home.as_ref().map_or_else(Vec::new, |h| {
        let env = |key: &str| {
            let own = spec
                .env
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone());
            own.or_else(|| std::env::var(key).ok())
                .filter(|v| !v.is_empty())
        };
        h.agent.providers(&h.dir, &env, plan.model.as_deref())
    });
    let mut agent_write = Vec::new();
    for dir in launch.home.iter().flat_map(|h| h.agent.sandbox_write()) {
        use std::os::unix::fs::DirBuilderExt;
        let made = fs::DirBuilder::new().mode(0o700).create(&dir);
        if made.is_ok() || dir.is_dir() {
            agent_write.push(text(&dir));
        }
    }
    let facts = Facts {
        workdir: text(&workdir),
        home: launch.home.as_ref().map(|h| text(&h.dir)),
        tmp: text(&tmp),
        install: install_of(&resolved).map(|p| text(&p)),
        runtimes: runtimes(&resolved, &spec.env),
        git_write,
        git_read,
        sessions,
        agent_write,
        linked_files,
        linked_dirs,
        providers,
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

/// The installs a program needs beyond its own directory: the package tree it is in (a file
/// under `<prefix>/lib/node_modules/` needs `<prefix>`, whose `bin/node` runs it) and its
/// script's interpreter's (`#!/usr/bin/env node`: the install of the `node` found on `PATH`).
fn runtimes(program: &Path, env: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(real) = fs::canonicalize(program) else {
        return out;
    };
    if let Some(modules) = real
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "node_modules"))
        && let Some(parent) = modules.parent()
    {
        let prefix = match parent.file_name() {
            Some(n) if n == "lib" => parent.parent().unwrap_or(parent),
            _ => parent,
        };
        if prefix != Path::new("/") {
            out.push(prefix.display().to_string());
        }
    }
    let mut head = [0u8; 256];
    let n = fs::File::open(&real)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    let line = String::from_utf8_lossy(&head[..n]);
    let Some(shebang) = line.strip_prefix("#!").and_then(|l| l.lines().next()) else {
        return out;
    };
    let mut words = shebang.split_whitespace();
    let interpreter = match words.next() {
        Some(env_prog) if env_prog.ends_with("/env") => words
            .find(|w| !w.starts_with('-'))
            .and_then(|w| crate::process::resolve::resolve(w, env)),
        Some(path) => Some(PathBuf::from(path)),
        None => None,
    };
    if let Some(found) = interpreter.as_deref().and_then(install_of) {
        out.push(found.display().to_string());
    }
    out
}

/// What an agent home links to outside itself (the user's credentials, resource directories:
/// see `agent::home`): the links' resolved targets, files and directories apart. Landlock
/// checks a link's target, not the link, so the policy must name them.
fn linked(home: &Path) -> (Vec<String>, Vec<String>) {
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    let Ok(entries) = fs::read_dir(home) else {
        return (files, dirs);
    };
    for entry in entries.flatten() {
        let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
        let Some(target) = is_link
            .then(|| fs::canonicalize(entry.path()).ok())
            .flatten()
        else {
            continue;
        };
        let text = target.display().to_string();
        if target.is_dir() {
            dirs.push(text);
        } else {
            files.push(text);
        }
    }
    files.sort();
    dirs.sort();
    (files, dirs)
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
