//! Preflight: what `sortie check` looks at beyond the batch file, before anything runs. Each
//! task's directory exists; its program (the agent profile's, or its own `command`) is on
//! `PATH` and executable; its agent has credentials (a credential file in the agent's config
//! directory, or a key variable: each agent's file says which, [`Agent::credentials`]); a
//! worktree task's directory is in a git repository with a commit; its artifact's directory can
//! be written (not a read-only filesystem, not `/proc`); a prompt, a command's argument and an
//! `env` value fit in one argument (Linux's `MAX_ARG_STRLEN`) and hold no NUL byte; the program
//! is a binary or a `#!` script (not ENOEXEC); its `reads` exist; a batch on Slurm has a
//! controller that answers; (#33) its check (`verify`) parses (`sh -n`) and its program is on
//! `PATH`. Nothing is spawned but `git rev-parse`, `scontrol ping` and `sh -n`, nothing is
//! written.
//!
//! [`Agent::credentials`]: crate::agent::Agent::credentials

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sortie_core::sandbox::Sandbox;
use sortie_core::{Batch, Isolation, TaskSpec};

use crate::agent::{self, UserEnv, home};
use crate::process;

/// The longest single argument Linux passes to a program (`MAX_ARG_STRLEN`, 32 pages).
pub const MAX_ARG_BYTES: usize = 32 * 4096;

/// One problem found, about a task's field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The task's index in the batch.
    pub task: usize,
    /// The field at fault, as written in a batch file.
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

/// Every problem of every task, in task order. `env[i]` is task i's extra environment.
pub async fn check(batch: &Batch, env: &[Vec<(String, sortie_batch::EnvValue)>]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, spec) in batch.tasks.iter().enumerate() {
        let mut found = |field: &'static str, message: String| {
            out.push(Finding {
                task: i,
                field,
                message,
            });
        };
        // #34: a reference that cannot be read now fails the task at launch.
        let mut resolved = Vec::new();
        for (name, value) in env.get(i).map(Vec::as_slice).unwrap_or_default() {
            match value.resolve(name) {
                Ok(v) => resolved.push((name.clone(), v)),
                Err(message) => found("env", message),
            }
        }
        let task_env = resolved.as_slice();
        let cwd = Path::new(&spec.cwd);
        let cwd_ok = match std::fs::metadata(cwd) {
            Ok(m) if m.is_dir() => true,
            Ok(_) => {
                found("cwd", format!("{} is not a directory", cwd.display()));
                false
            }
            Err(e) => {
                found(
                    "cwd",
                    format!("the directory {} {}", cwd.display(), gone(&e)),
                );
                false
            }
        };
        if let Some((field, message)) = program_problem(batch, spec, task_env) {
            found(field, message);
        }
        for (field, message) in argument_problems(spec, task_env) {
            found(field, message);
        }
        if let Some(message) = verify_problem(spec, task_env).await {
            found("verify", message);
        }
        if let Some(message) = credentials_problem(batch, spec, task_env) {
            found("agent", message);
        }
        // #34: a sandboxed task on a machine that cannot sandbox would not start.
        if spec.sandbox == Sandbox::Workspace
            && let Some(sortie) = crate::executor::supervisor()
            && let crate::supervisor::Support::No(why) = crate::supervisor::probe(sortie)
        {
            found("sandbox", why.clone());
        }
        if spec.isolation == Isolation::Worktree
            && cwd_ok
            && let Some(message) = repository_problem(cwd).await
        {
            found("isolation", message);
        }
        if let Some(message) = spec.output.as_deref().and_then(output_problem) {
            found("output", message);
        }
        if let Some(message) = prompt_problem(batch, spec) {
            found("prompt", message);
        }
        for r in &spec.reads {
            if let Err(e) = std::fs::metadata(r) {
                found("reads", format!("{r} {}", gone(&e)));
            }
        }
    }
    // #37: what each executor the tasks use needs to answer (a Slurm controller), asked once.
    let unready = crate::executor::unready(&batch.tasks).await;
    for (tasks, message) in unready {
        for task in tasks {
            out.push(Finding {
                task,
                field: "executor",
                message: message.clone(),
            });
        }
        out.sort_by_key(|f| f.task);
    }
    out
}

fn gone(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "does not exist".into(),
        _ => format!("cannot be read ({e})"),
    }
}

/// The program a task runs, and the field that gives it.
fn program<'a>(batch: &'a Batch, spec: &'a TaskSpec) -> Option<(&'static str, &'a str)> {
    match &spec.command {
        Some(c) => c.first().map(|p| ("command", p.as_str())),
        None => batch
            .agents
            .get(&spec.agent)
            .and_then(|p| p.command.first())
            .map(|p| ("agent", p.as_str())),
    }
}

fn program_problem(
    batch: &Batch,
    spec: &TaskSpec,
    task_env: &[(String, String)],
) -> Option<(&'static str, String)> {
    let (field, program) = program(batch, spec)?;
    let whose = if field == "agent" {
        format!("the agent `{}`'s program", spec.agent)
    } else {
        "the task's command".to_owned()
    };
    on_path(spec, task_env, program, &whose).map(|m| (field, m))
}

/// #33: the task's check: a script `sh` can parse (`sh -n`), whose first word, when it names
/// a program, is on `PATH`; an argv's program on `PATH`.
async fn verify_problem(spec: &TaskSpec, task_env: &[(String, String)]) -> Option<String> {
    let argv = spec.verify.as_deref()?;
    let whose = "the check's program";
    match argv {
        [sh, c, script] if sh == "sh" && c == "-c" => {
            let parse = ["sh", "-n", "-c", script.as_str()].map(str::to_owned);
            if let Ok(out) = process::run_tool(&parse, Path::new("/"), &[]).await
                && !out.success()
            {
                return Some(format!(
                    "sh cannot parse the check: {}",
                    out.stderr.lines().next().unwrap_or("a syntax error").trim()
                ));
            }
            let first = script.split_whitespace().next()?;
            let plain = first
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-+/".contains(c));
            if !plain || first.contains('=') || SHELL_WORDS.contains(&first) {
                return None;
            }
            on_path(spec, task_env, first, whose)
        }
        [program, ..] => on_path(spec, task_env, program, whose),
        [] => Some("the check is empty".to_owned()),
    }
}

/// Words a check's script may start with that are the shell's own, not programs.
const SHELL_WORDS: &[&str] = &[
    ".", ":", "[", "cd", "echo", "exec", "exit", "export", "false", "for", "if", "printf", "read",
    "set", "source", "test", "true", "until", "while", "case", "!", "{", "(",
];

/// Why `program` (run by `whose`, in the task's directory and environment) cannot start, if it
/// cannot.
fn on_path(
    spec: &TaskSpec,
    task_env: &[(String, String)],
    program: &str,
    whose: &str,
) -> Option<String> {
    if program.contains('/') {
        let p = Path::new(&spec.cwd).join(program);
        return match executable(&p).and_then(|()| runnable(&p)) {
            Ok(()) => None,
            Err(why) => Some(format!("{whose} {} {why}", p.display())),
        };
    }
    let path = task_env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| executable(p).is_ok());
    match found {
        None => Some(format!("{whose} `{program}` is not on PATH")),
        Some(p) => runnable(&p)
            .err()
            .map(|why| format!("{whose} {} {why}", p.display())),
    }
}

/// Whether an executable file is a program the system can start: an ELF binary or a script
/// with a `#!` line (anything else fails exec with ENOEXEC). A file that cannot be read is
/// left to the spawn.
fn runnable(p: &Path) -> Result<(), &'static str> {
    use std::io::Read;
    let mut head = [0u8; 4];
    let Ok(n) = std::fs::File::open(p).and_then(|mut f| f.read(&mut head)) else {
        return Ok(());
    };
    let head = &head[..n];
    if head.starts_with(b"#!") || head == b"\x7fELF" {
        Ok(())
    } else {
        Err("is not a program the system can run (neither a binary nor a script with a `#!` line)")
    }
}

/// What no program can be given: a NUL byte in an argument or an `env` value, or one over
/// [`MAX_ARG_BYTES`].
fn argument_problems(
    spec: &TaskSpec,
    task_env: &[(String, String)],
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for (i, a) in spec.command.iter().flatten().enumerate() {
        if a.contains('\0') {
            out.push((
                "command",
                format!("argument {i} holds a NUL byte, which no program can be given"),
            ));
        } else if a.len() >= MAX_ARG_BYTES {
            out.push((
                "command",
                format!(
                    "argument {i} is {} bytes, and Linux passes at most {} bytes in one",
                    a.len(),
                    MAX_ARG_BYTES - 1
                ),
            ));
        }
    }
    for (name, value) in task_env {
        if value.contains('\0') {
            out.push((
                "env",
                format!("{name} holds a NUL byte, which no program can be given"),
            ));
        } else if name.len() + value.len() + 1 >= MAX_ARG_BYTES {
            out.push((
                "env",
                format!(
                    "{name} is {} bytes, and Linux passes at most {} bytes in one variable",
                    value.len(),
                    MAX_ARG_BYTES - 1
                ),
            ));
        }
    }
    out
}

fn executable(p: &Path) -> Result<(), &'static str> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
        Ok(m) if m.is_file() => Err("is not executable"),
        Ok(_) => Err("is not a file"),
        Err(_) => Err("does not exist"),
    }
}

fn credentials_problem(
    batch: &Batch,
    spec: &TaskSpec,
    task_env: &[(String, String)],
) -> Option<String> {
    if spec.command.is_some() {
        return None;
    }
    let profile = batch.agents.get(&spec.agent)?;
    let agent = agent::for_protocol(profile.protocol)?;
    let creds = agent.credentials()?;
    let var_set = |k: &str| {
        task_env
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| !v.is_empty())
            .unwrap_or_else(|| std::env::var(k).is_ok_and(|v| !v.is_empty()))
    };
    if creds.env.iter().any(|k| var_set(k)) {
        return None;
    }
    let dir = agent
        .home()
        .and_then(|rules| home::user_dir(rules, &UserEnv::inherited(task_env)));
    if let Some(dir) = &dir
        && creds.files.iter().any(|f| dir.join(f).exists())
    {
        return None;
    }
    let place = dir.map_or_else(
        || "its config directory (HOME is not set)".to_owned(),
        |d| d.display().to_string(),
    );
    Some(format!(
        "no credentials for {}: none of {} in {place}, and none of {} is set",
        agent.name(),
        creds.files.join(", "),
        creds.env.join(", ")
    ))
}

/// Whether `cwd` is in a git repository whose HEAD is a commit.
async fn repository_problem(cwd: &Path) -> Option<String> {
    let git = |args: &[&str]| {
        let argv: Vec<String> = std::iter::once("git")
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect();
        async move {
            let env = [("GIT_TERMINAL_PROMPT".to_owned(), "0".to_owned())];
            process::run_tool(&argv, cwd, &env).await
        }
    };
    match git(&["rev-parse", "--show-toplevel"]).await {
        Err(e) => return Some(format!("`isolation = \"worktree\"` needs git: {e}")),
        Ok(o) if !o.success() => {
            return Some(format!(
                "`isolation = \"worktree\"` needs a git repository, and {} is not in one",
                cwd.display()
            ));
        }
        Ok(_) => {}
    }
    match git(&["rev-parse", "--verify", "--quiet", "HEAD^{commit}"]).await {
        Ok(o) if o.success() => None,
        _ => Some(format!(
            "`isolation = \"worktree\"` makes the worktree from HEAD, and the repository of {} \
             has no commit yet",
            cwd.display()
        )),
    }
}

/// Whether the artifact can be written: not a directory, and its nearest existing ancestor a
/// directory sortie may create files in.
fn output_problem(output: &str) -> Option<String> {
    let path = Path::new(output);
    if path.is_dir() {
        return Some(format!("{output} is a directory"));
    }
    let mut dir: PathBuf = path.parent()?.to_path_buf();
    while !dir.exists() {
        dir = dir.parent()?.to_path_buf();
    }
    if !dir.is_dir() {
        return Some(format!(
            "{output} cannot be written: {} is not a directory",
            dir.display()
        ));
    }
    if let Some(why) = unwritable_fs(&dir) {
        return Some(format!(
            "{output} cannot be written: {} {why}",
            dir.display()
        ));
    }
    use nix::unistd::{AccessFlags, access};
    match access(&dir, AccessFlags::W_OK | AccessFlags::X_OK) {
        Ok(()) => None,
        Err(e) => Some(format!(
            "{output} cannot be written: {} is not writable ({e})",
            dir.display()
        )),
    }
}

/// Why nothing can be created in `dir` whatever the permissions say (root passes `access`):
/// its filesystem is mounted read-only, or is the kernel's (`/proc`, `/sys`).
fn unwritable_fs(dir: &Path) -> Option<&'static str> {
    use nix::sys::statfs::{PROC_SUPER_MAGIC, SYSFS_MAGIC, statfs};
    use nix::sys::statvfs::{FsFlags, statvfs};
    if statvfs(dir).is_ok_and(|s| s.flags().contains(FsFlags::ST_RDONLY)) {
        return Some("is on a read-only filesystem");
    }
    let kind = statfs(dir).ok()?.filesystem_type();
    (kind == PROC_SUPER_MAGIC || kind == SYSFS_MAGIC)
        .then_some("is in the kernel's filesystem (/proc or /sys), where no file can be made")
}

/// Whether a prompt passed as an argument fits in one.
fn prompt_problem(batch: &Batch, spec: &TaskSpec) -> Option<String> {
    let prompt = spec.prompt.as_deref()?;
    let profile = batch.agents.get(&spec.agent)?;
    let in_argv = spec.command.is_none() && profile.command.iter().any(|a| a.contains("{prompt}"));
    (in_argv && prompt.len() >= MAX_ARG_BYTES).then(|| {
        format!(
            "is {} bytes; the agent `{}` takes it as an argument, and Linux passes at most {} \
             bytes in one",
            prompt.len(),
            spec.agent,
            MAX_ARG_BYTES - 1
        )
    })
}

/// #34: what `sortie check` says of the sandbox: whether this machine can sandbox, and what
/// each sandboxed task may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxReport {
    /// The Landlock ABI found (at least), or why this machine cannot sandbox.
    pub machine: Result<u8, String>,
    /// Each sandboxed task: its label and what it may write, read and reach beyond the
    /// defaults (docs/sandbox.md).
    pub tasks: Vec<SandboxedTask>,
}

/// A sandboxed task, as `sortie check` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxedTask {
    /// Its label.
    pub label: String,
    /// What it may write: its working directory, agent home, TMPDIR, and these.
    pub write: Vec<String>,
    /// What it may read: the system, its agent's install, and these.
    pub read: Vec<String>,
    /// The hosts it lists, forwarded by name.
    pub hosts: Vec<String>,
}

/// The sandbox's report, when a task of `batch` is sandboxed (None: none is).
pub fn sandbox_report(batch: &Batch) -> Option<SandboxReport> {
    let tasks: Vec<SandboxedTask> = batch
        .tasks
        .iter()
        .filter(|t| t.sandbox == Sandbox::Workspace)
        .map(|t| SandboxedTask {
            label: t.label.clone(),
            write: t.sandbox_write.clone(),
            read: t.sandbox_read.clone(),
            hosts: t.sandbox_hosts.clone(),
        })
        .collect();
    if tasks.is_empty() {
        return None;
    }
    let machine = match crate::executor::supervisor().map(crate::supervisor::probe) {
        Some(crate::supervisor::Support::Yes { abi }) => Ok(*abi),
        Some(crate::supervisor::Support::No(why)) => Err(why.clone()),
        None => Err("sortie cannot find its own binary to probe the sandbox".into()),
    };
    Some(SandboxReport { machine, tasks })
}
