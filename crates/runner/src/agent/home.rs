//! Per-attempt agent homes: a private config directory for every attempt of an agent that keeps
//! state in one (pi, Claude Code, Codex), so that parallel attempts never share it.
//!
//! Why: agents written for one interactive user keep mutable state in a per-user directory.
//! Concurrent Claude Code processes corrupt a shared `~/.claude.json`
//! (anthropics/claude-code#28922) and parallel `codex exec` runs pick up each other's sessions
//! (openai/codex#11435). sortie therefore gives each attempt `<run-dir>/agents/<task>.<attempt>/`
//! and points the agent at it through the variable the agent reads ([`Rules::env_var`]).
//!
//! The directory is *seeded* from the user's own (the variable's value when the user set it,
//! else the agent's default under `$HOME`) by an allow-list, so that sessions, history, logs and
//! caches are never carried over:
//! - small config files are copied (`settings.json`, `models.json`, `config.toml`, ...),
//! - credentials are symlinked (`auth.json`, `.credentials.json`): they stay where they are,
//!   and a token the agent refreshes is written through the link to the user's file,
//! - read-only resource directories (extensions, skills, prompts) are symlinked,
//! - anything else is left out.
//!
//! Then the agent's own retry loops are turned off, so that a failing provider shows up at once
//! and sortie's retry policy (journaled, with fallback models) decides what happens next, and
//! its "no start-up network traffic" switches are set: each agent's file says how
//! ([`Agent::seed_home`](super::Agent::seed_home) and its [`Rules`]: pi's `settings.json`,
//! Claude Code's variables, Codex's `config.toml`).
//!
//! Which attempts get a home is keyed on the profile's protocol (the agent that speaks it,
//! [`super::for_protocol`]): the profile itself is journaled in a versioned format, so the rule
//! lives in the agent's file, not in a field.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use super::Agent;

/// How an agent's home is seeded and what its child environment gets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// The variable that points the agent at its config directory.
    pub(crate) env_var: &'static str,
    /// The default config directory, relative to `$HOME`.
    pub(crate) default_dir: &'static str,
    /// Files copied from the user's directory when present (small config only).
    pub(crate) copy: &'static [&'static str],
    /// Files and directories symlinked to the user's when present: credentials, which must
    /// stay where they are, and read-only resources.
    pub(crate) link: &'static [&'static str],
    /// Variables set for the child unless the task's `env` sets them: retries off, no start-up
    /// network traffic.
    pub(crate) env: &'static [(&'static str, &'static str)],
}

/// The variables that locate the user's own config: `HOME` and the agents' directory
/// variables, as the child would see them (the task's `env` over sortie's own environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UserEnv {
    vars: HashMap<String, String>,
}

/// The variables [`UserEnv`] keeps: `HOME` and every agent's directory variable.
fn locating() -> impl Iterator<Item = &'static str> {
    std::iter::once("HOME").chain(super::all().filter_map(|a| a.home().map(|r| r.env_var)))
}

impl UserEnv {
    /// sortie's own environment with `overlay` (the task's `env`) over it.
    pub(crate) fn inherited(overlay: &[(String, String)]) -> UserEnv {
        let mut vars: HashMap<String, String> = locating()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_owned(), v)))
            .collect();
        for (k, v) in overlay {
            if locating().any(|l| l == k) {
                vars.insert(k.clone(), v.clone());
            }
        }
        UserEnv { vars }
    }

    /// Exactly these variables, nothing inherited (for tests).
    #[cfg(test)]
    pub(crate) fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> UserEnv {
        UserEnv {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }
    }

    /// A variable's value; an empty one counts as unset.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// `~/rest` expanded against `HOME` (as the agents themselves do).
    fn expand(&self, path: &str) -> Option<PathBuf> {
        match path.strip_prefix("~/") {
            Some(rest) => self.get("HOME").map(|h| Path::new(h).join(rest)),
            None if path == "~" => self.get("HOME").map(PathBuf::from),
            None => Some(PathBuf::from(path)),
        }
    }
}

/// Where the user's own config is for an agent with these rules: the variable's value if set,
/// else the default under `$HOME`. `None` without either (then the home starts empty).
pub(crate) fn user_dir(rules: &Rules, env: &UserEnv) -> Option<PathBuf> {
    match env.get(rules.env_var) {
        Some(v) => env.expand(v),
        None => env
            .get("HOME")
            .map(|h| Path::new(h).join(rules.default_dir)),
    }
}

/// A prepared home: the directory and the environment the child needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentHome {
    /// The attempt's config directory.
    pub(crate) dir: PathBuf,
    /// Defaults (retries off, no start-up traffic): the task's `env` may override them.
    pub(crate) defaults: Vec<(String, String)>,
    /// The directory variable: set last, over the task's `env` (whose value, if any, was the
    /// seed).
    pub(crate) pointer: (String, String),
}

impl AgentHome {
    /// The child's extra environment: the defaults, then `task_env`, then the pointer.
    pub(crate) fn child_env(&self, task_env: &[(String, String)]) -> Vec<(String, String)> {
        let mut env = self.defaults.clone();
        env.extend(task_env.iter().cloned());
        env.push(self.pointer.clone());
        env
    }
}

/// Why a home could not be prepared.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HomeError {
    /// A file operation failed (transient as far as sortie knows).
    #[error("cannot prepare the agent home at {}: {source}", path.display())]
    Io {
        /// The path the operation was on.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A user config file sortie must edit is not what the agent expects (retrying cannot
    /// help).
    #[error("cannot read {}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> HomeError + '_ {
    move |source| HomeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates (or re-creates: a relaunch after a crash starts clean) the home `dir` for `agent`,
/// seeded from the user's config located through `env`, with the agent's own retries off.
/// The user's directory is only read, never written. An agent without [`Agent::home`] rules
/// has no home to prepare (the launch plan gives it none).
pub(crate) fn prepare(
    agent: &dyn Agent,
    dir: &Path,
    env: &UserEnv,
) -> Result<AgentHome, HomeError> {
    let Some(rules) = agent.home() else {
        return Err(HomeError::Invalid {
            path: dir.to_path_buf(),
            message: format!("agent `{}` keeps no home", agent.name()),
        });
    };
    match std::fs::symlink_metadata(dir) {
        // remove_dir_all removes symlinks, it never follows them into the user's files.
        Ok(_) => std::fs::remove_dir_all(dir).map_err(io_err(dir))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(dir)(e)),
    }
    create_private_dir(dir)?;
    let user = user_dir(rules, env).map(|d| absolute(&d));
    if let Some(user) = user.as_deref().filter(|u| u.is_dir()) {
        for name in rules.copy {
            copy_if_present(&user.join(name), &dir.join(name))?;
        }
        for name in rules.link {
            link_if_present(&user.join(name), &dir.join(name))?;
        }
    }
    agent.seed_home(user.as_deref(), dir, env)?;
    Ok(AgentHome {
        dir: dir.to_path_buf(),
        defaults: rules
            .env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        pointer: (rules.env_var.to_owned(), dir.display().to_string()),
    })
}

/// A relative user dir (a relative variable value) is taken against sortie's cwd, so that a
/// symlink made inside the home points where the agent would have looked.
fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        return p.to_path_buf();
    }
    std::env::current_dir().map_or_else(|_| p.to_path_buf(), |cwd| cwd.join(p))
}

fn create_private_dir(dir: &Path) -> Result<(), HomeError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))
}

/// Copies a regular file (following a symlink to one) with owner-only permissions: config
/// files may hold keys.
pub(crate) fn copy_if_present(from: &Path, to: &Path) -> Result<(), HomeError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(from) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(from)(e)),
    }
    std::fs::copy(from, to).map_err(io_err(from))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o600)).map_err(io_err(to))
}

/// Symlinks `to` to `from` when `from` exists (a dangling link would make the agent create the
/// user's file through it).
fn link_if_present(from: &Path, to: &Path) -> Result<(), HomeError> {
    match std::fs::metadata(from) {
        Ok(_) => std::os::unix::fs::symlink(from, to).map_err(io_err(to)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(from)(e)),
    }
}

/// #13: links `name` in a prepared home to a conversation's session store (created private),
/// so that the agent keeps its sessions there and the next attempt of the conversation, in its
/// own home, finds them. The attempts of one conversation run one after another, never at once.
pub(crate) fn link_store(home: &Path, name: &str, store: &Path) -> Result<(), HomeError> {
    create_private_dir(store)?;
    let link = home.join(name);
    std::os::unix::fs::symlink(store, &link).map_err(io_err(&link))
}

/// Helpers for the agents' home tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::{Path, PathBuf};

    pub(crate) fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    pub(crate) fn read_json(path: &Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// Every file under `dir`, relative, sorted, with its bytes (symlinks not followed).
    pub(crate) fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                if m.is_dir() {
                    stack.push(p);
                } else if m.is_file() {
                    out.push((
                        p.strip_prefix(dir).unwrap().to_path_buf(),
                        std::fs::read(&p).unwrap(),
                    ));
                }
            }
        }
        out.sort();
        out
    }
}
