//! Per-attempt agent homes: a private config directory for every attempt of an agent that keeps
//! state in one (pi, Claude Code, Codex), so that parallel attempts never share it.
//!
//! Why: agents written for one interactive user keep mutable state in a per-user directory.
//! Concurrent Claude Code processes corrupt a shared `~/.claude.json`
//! (anthropics/claude-code#28922) and parallel `codex exec` runs pick up each other's sessions
//! (openai/codex#11435). sortie therefore gives each attempt `<run-dir>/agents/<task>.<attempt>/`
//! and points the agent at it through the variable the agent reads ([`Kind::env_var`]).
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
//! and sortie's retry policy (journaled, with fallback models) decides what happens next: pi gets
//! `retry.enabled = false` and `retry.provider.maxRetries = 0` merged into its `settings.json`;
//! Claude Code gets `CLAUDE_CODE_MAX_RETRIES=0`; Codex gets `request_max_retries = 0` and
//! `stream_max_retries = 0` in every custom provider of its `config.toml` (Codex refuses
//! settings for its built-in providers, whose retries stay on). Each kind also gets its "no
//! start-up network traffic" switches (`PI_OFFLINE=1`, Claude Code's `DISABLE_*` variables,
//! Codex's `check_for_update_on_startup`, `analytics.enabled` and `features.plugins`).
//!
//! Which attempts get a home is keyed on the profile's protocol ([`Kind::for_protocol`]): the
//! profile itself is journaled in a versioned format, so the rule lives here, not in a field.
//!
//! The API, for a new agent kind: add a [`Kind`], its [`Rules`] row in [`Kind::rules`], and, if
//! its retry settings live in a config file, a step in [`prepare`] (as pi's `settings.json`).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use sortie_core::Protocol;

/// An agent that keeps its state in a config directory sortie isolates per attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// pi: `$PI_CODING_AGENT_DIR`, default `~/.pi/agent`.
    Pi,
    /// Claude Code: `$CLAUDE_CONFIG_DIR`, default `~/.claude` (plus `~/.claude.json`).
    Claude,
    /// Codex: `$CODEX_HOME`, default `~/.codex`.
    Codex,
}

/// How a kind's home is seeded and what its child environment gets.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// The variable that points the agent at its config directory.
    pub env_var: &'static str,
    /// The default config directory, relative to `$HOME`.
    pub default_dir: &'static str,
    /// Files copied from the user's directory when present (small config only).
    pub copy: &'static [&'static str],
    /// Files and directories symlinked to the user's when present: credentials, which must
    /// stay where they are, and read-only resources.
    pub link: &'static [&'static str],
    /// Variables set for the child unless the task's `env` sets them: retries off, no start-up
    /// network traffic.
    pub env: &'static [(&'static str, &'static str)],
}

const PI: Rules = Rules {
    env_var: "PI_CODING_AGENT_DIR",
    default_dir: ".pi/agent",
    // settings.json is merged, not copied (see `prepare`).
    copy: &[
        "models.json",
        "keybindings.json",
        "AGENTS.md",
        "SYSTEM.md",
        "APPEND_SYSTEM.md",
    ],
    link: &[
        "auth.json",
        "extensions",
        "skills",
        "prompts",
        "themes",
        "tools",
        "bin",
    ],
    env: &[("PI_OFFLINE", "1")],
};

const CLAUDE: Rules = Rules {
    env_var: "CLAUDE_CONFIG_DIR",
    default_dir: ".claude",
    // `.claude.json` is copied from `$HOME` or the user's config dir (see `prepare`).
    copy: &["settings.json", "CLAUDE.md"],
    link: &[
        ".credentials.json",
        "agents",
        "commands",
        "skills",
        "plugins",
        "output-styles",
    ],
    env: &[
        ("CLAUDE_CODE_MAX_RETRIES", "0"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_ERROR_REPORTING", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ],
};

const CODEX: Rules = Rules {
    env_var: "CODEX_HOME",
    default_dir: ".codex",
    // config.toml (and any `<profile>.config.toml`) is rewritten, not copied (see `prepare`).
    copy: &["AGENTS.md", "instructions.md"],
    link: &["auth.json", "prompts", "skills"],
    env: &[],
};

impl Kind {
    /// The kind of home an attempt speaking `protocol` gets; `None` for `plain`.
    pub fn for_protocol(protocol: Protocol) -> Option<Kind> {
        match protocol {
            Protocol::PiJson | Protocol::PiRpc => Some(Kind::Pi),
            Protocol::ClaudeStreamJson => Some(Kind::Claude),
            Protocol::CodexJson => Some(Kind::Codex),
            Protocol::Plain => None,
        }
    }

    /// The kind's seeding rules.
    pub fn rules(self) -> &'static Rules {
        match self {
            Kind::Pi => &PI,
            Kind::Claude => &CLAUDE,
            Kind::Codex => &CODEX,
        }
    }

    /// The variable that points the agent at its config directory.
    pub fn env_var(self) -> &'static str {
        self.rules().env_var
    }

    /// A short name (`pi`, `claude`, `codex`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pi => "pi",
            Kind::Claude => "claude",
            Kind::Codex => "codex",
        }
    }
}

/// The variables that locate the user's own config: `HOME` and the kinds' directory variables,
/// as the child would see them (the task's `env` over sortie's own environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserEnv {
    vars: HashMap<String, String>,
}

/// The variables [`UserEnv`] keeps.
const LOCATING: [&str; 4] = [
    "HOME",
    "PI_CODING_AGENT_DIR",
    "CLAUDE_CONFIG_DIR",
    "CODEX_HOME",
];

impl UserEnv {
    /// sortie's own environment with `overlay` (the task's `env`) over it.
    pub fn inherited(overlay: &[(String, String)]) -> UserEnv {
        let mut vars: HashMap<String, String> = LOCATING
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
            .collect();
        for (k, v) in overlay {
            if LOCATING.contains(&k.as_str()) {
                vars.insert(k.clone(), v.clone());
            }
        }
        UserEnv { vars }
    }

    /// Exactly these variables, nothing inherited (for tests).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> UserEnv {
        UserEnv {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        }
    }

    /// A variable's value; an empty one counts as unset.
    fn get(&self, key: &str) -> Option<&str> {
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

/// Where the user's own config for `kind` is: the variable's value if set, else the default
/// under `$HOME`. `None` without either (then the home starts empty).
pub fn user_dir(kind: Kind, env: &UserEnv) -> Option<PathBuf> {
    match env.get(kind.env_var()) {
        Some(v) => env.expand(v),
        None => env
            .get("HOME")
            .map(|h| Path::new(h).join(kind.rules().default_dir)),
    }
}

/// A prepared home: the directory and the environment the child needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentHome {
    /// The attempt's config directory.
    pub dir: PathBuf,
    /// Defaults (retries off, no start-up traffic): the task's `env` may override them.
    pub defaults: Vec<(String, String)>,
    /// The directory variable: set last, over the task's `env` (whose value, if any, was the
    /// seed).
    pub pointer: (String, String),
}

impl AgentHome {
    /// The child's extra environment: the defaults, then `task_env`, then the pointer.
    pub fn child_env(&self, task_env: &[(String, String)]) -> Vec<(String, String)> {
        let mut env = self.defaults.clone();
        env.extend(task_env.iter().cloned());
        env.push(self.pointer.clone());
        env
    }
}

/// Why a home could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
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

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> HomeError + '_ {
    move |source| HomeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The home of attempt `attempt` of task index `task` under a run directory:
/// `<run-dir>/agents/<task>.<attempt>`.
pub fn dir_for(run_dir: &Path, task: u32, attempt: u32) -> PathBuf {
    run_dir.join("agents").join(format!("{task}.{attempt}"))
}

/// Creates (or re-creates: a relaunch after a crash starts clean) the home `dir` for `kind`,
/// seeded from the user's config located through `env`, with the agent's own retries off.
/// The user's directory is only read, never written.
pub fn prepare(kind: Kind, dir: &Path, env: &UserEnv) -> Result<AgentHome, HomeError> {
    let rules = kind.rules();
    match std::fs::symlink_metadata(dir) {
        // remove_dir_all removes symlinks, it never follows them into the user's files.
        Ok(_) => std::fs::remove_dir_all(dir).map_err(io_err(dir))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(dir)(e)),
    }
    create_private_dir(dir)?;
    let user = user_dir(kind, env).map(|d| absolute(&d));
    if let Some(user) = user.as_deref().filter(|u| u.is_dir()) {
        for name in rules.copy {
            copy_if_present(&user.join(name), &dir.join(name))?;
        }
        for name in rules.link {
            link_if_present(&user.join(name), &dir.join(name))?;
        }
    }
    match kind {
        Kind::Pi => {
            let from = user.as_deref().map(|u| u.join("settings.json"));
            write_pi_settings(from.as_deref(), &dir.join("settings.json"))?;
        }
        Kind::Claude => {
            // Claude Code keeps its global state in `$CLAUDE_CONFIG_DIR/.claude.json` when the
            // variable is set, else in `~/.claude.json` (beside, not inside, `~/.claude`). This
            // is the file concurrent processes corrupt: each attempt gets its own copy.
            let global = match env.get(kind.env_var()) {
                Some(_) => user.as_deref().map(|u| u.join(".claude.json")),
                None => env.get("HOME").map(|h| Path::new(h).join(".claude.json")),
            };
            if let Some(global) = global {
                copy_if_present(&global, &dir.join(".claude.json"))?;
            }
        }
        Kind::Codex => {
            if let Some(user) = user.as_deref().filter(|u| u.is_dir()) {
                for profile in codex_profile_layers(user)? {
                    write_codex_config(Some(&user.join(&profile)), &dir.join(&profile), false)?;
                }
            }
            let from = user.as_deref().map(|u| u.join("config.toml"));
            write_codex_config(from.as_deref(), &dir.join("config.toml"), true)?;
        }
    }
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
fn copy_if_present(from: &Path, to: &Path) -> Result<(), HomeError> {
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

/// Writes pi's `settings.json`: the user's settings (if any) with both retry layers off:
/// `retry.enabled = false` (pi's own agent-level retries: 3 more attempts, 2 s, 4 s, 8 s) and
/// `retry.provider.maxRetries = 0` (the provider SDK's hidden retries: 2 more requests each).
fn write_pi_settings(from: Option<&Path>, to: &Path) -> Result<(), HomeError> {
    use serde_json::{Map, Value};
    let mut settings = match from.map(std::fs::read) {
        Some(Ok(bytes)) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(map)) => map,
            Ok(_) => {
                return Err(HomeError::Invalid {
                    path: from.map(Path::to_path_buf).unwrap_or_default(),
                    message: "pi settings must be a JSON object".into(),
                });
            }
            Err(e) => {
                return Err(HomeError::Invalid {
                    path: from.map(Path::to_path_buf).unwrap_or_default(),
                    message: format!("not valid JSON: {e}"),
                });
            }
        },
        Some(Err(e)) if e.kind() != io::ErrorKind::NotFound => {
            return Err(HomeError::Io {
                path: from.map(Path::to_path_buf).unwrap_or_default(),
                source: e,
            });
        }
        _ => Map::new(),
    };
    let retry = settings
        .entry("retry")
        .or_insert_with(|| Value::Object(Map::new()));
    if !retry.is_object() {
        *retry = Value::Object(Map::new());
    }
    if let Value::Object(retry) = retry {
        retry.insert("enabled".into(), Value::Bool(false));
        let provider = retry
            .entry("provider")
            .or_insert_with(|| Value::Object(Map::new()));
        if !provider.is_object() {
            *provider = Value::Object(Map::new());
        }
        if let Value::Object(provider) = provider {
            provider.insert("maxRetries".into(), Value::from(0));
        }
    }
    let text =
        serde_json::to_vec_pretty(&Value::Object(settings)).map_err(|e| HomeError::Invalid {
            path: to.to_path_buf(),
            message: e.to_string(),
        })?;
    std::fs::write(to, text).map_err(io_err(to))
}

/// The names of the user's Codex profile layers (`<name>.config.toml`, which `codex -p <name>`
/// layers over `config.toml`).
fn codex_profile_layers(user: &Path) -> Result<Vec<String>, HomeError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(user).map_err(io_err(user))? {
        let entry = entry.map_err(io_err(user))?;
        if let Some(name) = entry.file_name().to_str()
            && name.ends_with(".config.toml")
            && name != ".config.toml"
            && entry.path().is_file()
        {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Codex settings the home gives when the user's `config.toml` does not set them: no update
/// check, no analytics, no curated-plugins sync (a git fetch from GitHub at every start, into
/// each attempt's fresh home; the user's installed plugins are not carried over anyway). The
/// base layer also gets `sandbox_mode = "workspace-write"` when the user set none (see
/// [`write_codex_config`]).
const CODEX_DEFAULTS: &[(&[&str], bool)] = &[
    (&["check_for_update_on_startup"], false),
    (&["analytics", "enabled"], false),
    (&["features", "plugins"], false),
];

/// Writes a Codex config layer: the user's (if any) with `request_max_retries = 0` and
/// `stream_max_retries = 0` in every `[model_providers.<id>]` table (request retries: up to 4
/// more HTTP requests per attempt, invisible; stream retries: up to 5 more attempts, visible as
/// `Reconnecting... n/5` error events: 30 requests over about 25 s for a persistent 500). The
/// base layer (`base`) also gets [`CODEX_DEFAULTS`] and `sandbox_mode = "workspace-write"`
/// where the user set nothing: `codex exec` is read-only otherwise, so its commands fail (and
/// the stream does not always show them). Codex's built-in providers (`openai`, `ollama`,
/// `lmstudio`) cannot be given settings (Codex refuses to start), so their retries stay on.
fn write_codex_config(from: Option<&Path>, to: &Path, base: bool) -> Result<(), HomeError> {
    use toml::{Table, Value};
    let invalid = |message: String| HomeError::Invalid {
        path: from.map(Path::to_path_buf).unwrap_or_default(),
        message,
    };
    let mut config = match from.map(std::fs::read_to_string) {
        Some(Ok(text)) => text
            .parse::<Table>()
            .map_err(|e| invalid(format!("not valid TOML: {e}")))?,
        Some(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {
            return Err(invalid("not UTF-8 text".into()));
        }
        Some(Err(e)) if e.kind() != io::ErrorKind::NotFound => {
            return Err(HomeError::Io {
                path: from.map(Path::to_path_buf).unwrap_or_default(),
                source: e,
            });
        }
        _ => Table::new(),
    };
    if let Some(providers) = config.get_mut("model_providers") {
        let Value::Table(providers) = providers else {
            return Err(invalid("model_providers must be a table".into()));
        };
        for (id, provider) in providers.iter_mut() {
            let Value::Table(provider) = provider else {
                return Err(invalid(format!("model_providers.{id} must be a table")));
            };
            provider.insert("request_max_retries".into(), Value::Integer(0));
            provider.insert("stream_max_retries".into(), Value::Integer(0));
        }
    }
    if base {
        for (path, value) in CODEX_DEFAULTS {
            set_default(&mut config, path, Value::Boolean(*value));
        }
        set_default(
            &mut config,
            &["sandbox_mode"],
            Value::String("workspace-write".into()),
        );
    }
    let text = toml::to_string(&config).map_err(|e| invalid(e.to_string()))?;
    std::fs::write(to, text).map_err(io_err(to))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o600)).map_err(io_err(to))
}

/// Sets `path` (a dotted key) to `value` unless the user set it; a non-table on the way (which
/// Codex would reject anyway) is left alone.
fn set_default(table: &mut toml::Table, path: &[&str], value: toml::Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut t = table;
    for key in parents {
        let entry = t
            .entry((*key).to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match entry {
            toml::Value::Table(next) => t = next,
            _ => return,
        }
    }
    t.entry((*last).to_owned()).or_insert(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn read_json(path: &Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// Every file under `dir`, relative, sorted, with its bytes (symlinks not followed).
    fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
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

    #[test]
    fn pi_home_links_credentials_copies_config_skips_sessions_and_turns_retries_off() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let user = home.join(".pi/agent");
        write(
            &user.join("auth.json"),
            r#"{"anthropic":{"type":"api_key","key":"k"}}"#,
        );
        write(&user.join("models.json"), r#"{"providers":{}}"#);
        write(
            &user.join("settings.json"),
            r#"{"theme":"dark","retry":{"baseDelayMs":500,"provider":{"timeoutMs":9000}}}"#,
        );
        write(&user.join("sessions/--x--/s.jsonl"), "{}");
        write(&user.join("pi-debug.log"), "log");
        write(&user.join("extensions/e.ts"), "export {}");
        let before = snapshot(&user);

        let env = UserEnv::from_pairs([("HOME", home.to_str().unwrap())]);
        let dir = tmp.path().join("run/agents/0.1");
        let h = prepare(Kind::Pi, &dir, &env).unwrap();

        let auth = dir.join("auth.json");
        assert!(
            std::fs::symlink_metadata(&auth)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_link(&auth).unwrap(), user.join("auth.json"));
        assert!(
            std::fs::symlink_metadata(dir.join("extensions"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let models = std::fs::symlink_metadata(dir.join("models.json")).unwrap();
        assert!(models.is_file(), "models.json is copied, not linked");
        assert!(!dir.join("sessions").exists());
        assert!(!dir.join("pi-debug.log").exists());
        assert_eq!(
            read_json(&dir.join("settings.json")),
            serde_json::json!({
                "theme": "dark",
                "retry": {"baseDelayMs": 500, "enabled": false,
                          "provider": {"timeoutMs": 9000, "maxRetries": 0}}
            })
        );
        assert_eq!(
            h.child_env(&[("PI_OFFLINE".into(), "0".into()), ("X".into(), "y".into())]),
            vec![
                ("PI_OFFLINE".into(), "1".into()),
                ("PI_OFFLINE".into(), "0".into()),
                ("X".into(), "y".into()),
                ("PI_CODING_AGENT_DIR".into(), dir.display().to_string()),
            ]
        );
        assert_eq!(snapshot(&user), before, "the user's dir is only read");
    }

    #[test]
    fn pi_home_without_user_config_still_turns_retries_off() {
        let tmp = tempfile::tempdir().unwrap();
        let env = UserEnv::from_pairs([("HOME", tmp.path().join("nobody").to_str().unwrap())]);
        let dir = tmp.path().join("a");
        prepare(Kind::Pi, &dir, &env).unwrap();
        assert_eq!(
            read_json(&dir.join("settings.json")),
            serde_json::json!({"retry": {"enabled": false, "provider": {"maxRetries": 0}}})
        );
        assert!(
            !dir.join("auth.json").exists(),
            "no dangling credential link"
        );
        let env = UserEnv::from_pairs([]);
        prepare(Kind::Pi, &tmp.path().join("b"), &env).unwrap();
    }

    #[test]
    fn the_variable_the_user_set_is_the_seed_and_a_relaunch_starts_clean() {
        let tmp = tempfile::tempdir().unwrap();
        let custom = tmp.path().join("custom");
        write(&custom.join("models.json"), "{\"a\":1}");
        write(&tmp.path().join("home/.pi/agent/models.json"), "{\"b\":2}");
        let env = UserEnv::from_pairs([
            ("HOME", tmp.path().join("home").to_str().unwrap()),
            ("PI_CODING_AGENT_DIR", custom.to_str().unwrap()),
        ]);
        let dir = tmp.path().join("h");
        std::fs::create_dir_all(dir.join("sessions")).unwrap();
        prepare(Kind::Pi, &dir, &env).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("models.json")).unwrap(),
            "{\"a\":1}"
        );
        assert!(!dir.join("sessions").exists());
    }

    #[test]
    fn invalid_pi_settings_are_an_error_not_silently_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        write(&tmp.path().join("home/.pi/agent/settings.json"), "{oops");
        let env = UserEnv::from_pairs([("HOME", tmp.path().join("home").to_str().unwrap())]);
        let err = prepare(Kind::Pi, &tmp.path().join("h"), &env).unwrap_err();
        assert!(matches!(err, HomeError::Invalid { .. }), "{err}");
    }

    #[test]
    fn claude_home_copies_the_global_file_links_credentials_and_sets_no_retries() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        write(&home.join(".claude.json"), r#"{"numStartups":3}"#);
        write(
            &home.join(".claude/.credentials.json"),
            r#"{"claudeAiOauth":{}}"#,
        );
        write(&home.join(".claude/settings.json"), r#"{"model":"x"}"#);
        write(&home.join(".claude/projects/p/s.jsonl"), "{}");
        write(&home.join(".claude/history.jsonl"), "{}");
        write(&home.join(".claude/todos/t.json"), "[]");
        let env = UserEnv::from_pairs([("HOME", home.to_str().unwrap())]);
        let dir = tmp.path().join("h");
        let h = prepare(Kind::Claude, &dir, &env).unwrap();
        let global = std::fs::symlink_metadata(dir.join(".claude.json")).unwrap();
        assert!(
            global.is_file(),
            "each attempt has its own copy of .claude.json"
        );
        let creds = std::fs::symlink_metadata(dir.join(".credentials.json")).unwrap();
        assert!(creds.file_type().is_symlink());
        assert!(dir.join("settings.json").is_file());
        for skipped in ["projects", "history.jsonl", "todos"] {
            assert!(!dir.join(skipped).exists(), "{skipped}");
        }
        let env = h.child_env(&[]);
        assert!(env.contains(&("CLAUDE_CODE_MAX_RETRIES".into(), "0".into())));
        assert_eq!(
            env.last(),
            Some(&("CLAUDE_CONFIG_DIR".into(), dir.display().to_string()))
        );

        // With CLAUDE_CONFIG_DIR set, the global file is inside it.
        let cfg = tmp.path().join("cfg");
        write(&cfg.join(".claude.json"), r#"{"inside":true}"#);
        let env = UserEnv::from_pairs([
            ("HOME", home.to_str().unwrap()),
            ("CLAUDE_CONFIG_DIR", cfg.to_str().unwrap()),
        ]);
        let dir2 = tmp.path().join("h2");
        prepare(Kind::Claude, &dir2, &env).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir2.join(".claude.json")).unwrap(),
            r#"{"inside":true}"#
        );
    }

    #[test]
    fn codex_home_rewrites_config_links_auth_and_turns_retries_off() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        write(
            &home.join(".codex/config.toml"),
            "model = \"m\"\nmodel_provider = \"gw\"\nsandbox_mode = \"danger-full-access\"\n\
             [model_providers.gw]\nname = \"gw\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             wire_api = \"responses\"\nenv_key = \"GW_KEY\"\nrequest_max_retries = 4\n\
             [model_providers.other]\nbase_url = \"http://h/v1\"\n\
             [analytics]\nenabled = true\n\
             [projects.\"/work/p\"]\ntrust_level = \"trusted\"\n",
        );
        write(
            &home.join(".codex/work.config.toml"),
            "[model_providers.w]\nbase_url = \"http://w/v1\"\n",
        );
        write(&home.join(".codex/auth.json"), "{}");
        write(&home.join(".codex/sessions/2026/x.jsonl"), "{}");
        write(&home.join(".codex/history.jsonl"), "{}");
        write(&home.join(".codex/state_5.sqlite"), "db");
        let before = snapshot(&home);
        let env = UserEnv::from_pairs([("HOME", home.to_str().unwrap())]);
        let dir = tmp.path().join("h");
        let h = prepare(Kind::Codex, &dir, &env).unwrap();

        let read = |name: &str| -> toml::Table {
            let p = dir.join(name);
            assert!(std::fs::symlink_metadata(&p).unwrap().is_file(), "{name}");
            std::fs::read_to_string(p).unwrap().parse().unwrap()
        };
        let c = read("config.toml");
        let gw = &c["model_providers"]["gw"];
        assert_eq!(gw["request_max_retries"].as_integer(), Some(0));
        assert_eq!(gw["stream_max_retries"].as_integer(), Some(0));
        assert_eq!(gw["env_key"].as_str(), Some("GW_KEY"));
        assert_eq!(
            c["model_providers"]["other"]["stream_max_retries"].as_integer(),
            Some(0)
        );
        assert_eq!(c["model"].as_str(), Some("m"));
        assert_eq!(
            c["sandbox_mode"].as_str(),
            Some("danger-full-access"),
            "the user's choice stays"
        );
        assert_eq!(
            c["analytics"]["enabled"].as_bool(),
            Some(true),
            "the user's choice stays"
        );
        assert_eq!(c["check_for_update_on_startup"].as_bool(), Some(false));
        assert_eq!(c["features"]["plugins"].as_bool(), Some(false));
        assert_eq!(
            c["projects"]["/work/p"]["trust_level"].as_str(),
            Some("trusted")
        );
        let w = read("work.config.toml");
        assert_eq!(
            w["model_providers"]["w"]["request_max_retries"].as_integer(),
            Some(0)
        );
        assert!(
            w.get("features").is_none(),
            "defaults only in the base layer"
        );

        assert!(
            std::fs::symlink_metadata(dir.join("auth.json"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        for skipped in ["sessions", "history.jsonl", "state_5.sqlite"] {
            assert!(!dir.join(skipped).exists(), "{skipped}");
        }
        assert_eq!(h.pointer.0, "CODEX_HOME");
        assert!(h.defaults.is_empty());
        assert_eq!(snapshot(&home), before, "the user's dir is only read");
    }

    #[test]
    fn codex_home_without_user_config_gets_the_defaults() {
        let tmp = tempfile::tempdir().unwrap();
        let env = UserEnv::from_pairs([("HOME", tmp.path().join("nobody").to_str().unwrap())]);
        let dir = tmp.path().join("h");
        prepare(Kind::Codex, &dir, &env).unwrap();
        let c: toml::Table = std::fs::read_to_string(dir.join("config.toml"))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(c["sandbox_mode"].as_str(), Some("workspace-write"));
        assert_eq!(c["analytics"]["enabled"].as_bool(), Some(false));
        assert!(c.get("model_providers").is_none());
        assert!(!dir.join("auth.json").exists());
    }

    #[test]
    fn invalid_codex_config_is_an_error() {
        for bad in [
            "model = ",
            "model_providers = 3",
            "[model_providers]\ngw = \"x\"",
        ] {
            let tmp = tempfile::tempdir().unwrap();
            write(&tmp.path().join("home/.codex/config.toml"), bad);
            let env = UserEnv::from_pairs([("HOME", tmp.path().join("home").to_str().unwrap())]);
            let err = prepare(Kind::Codex, &tmp.path().join("h"), &env).unwrap_err();
            assert!(matches!(err, HomeError::Invalid { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn kinds_follow_the_protocol() {
        assert_eq!(Kind::for_protocol(Protocol::PiJson), Some(Kind::Pi));
        assert_eq!(
            Kind::for_protocol(Protocol::ClaudeStreamJson),
            Some(Kind::Claude)
        );
        assert_eq!(Kind::for_protocol(Protocol::CodexJson), Some(Kind::Codex));
        assert_eq!(Kind::for_protocol(Protocol::Plain), None);
        assert_eq!(
            dir_for(Path::new("/r"), 3, 2),
            PathBuf::from("/r/agents/3.2")
        );
    }
}
