//! Codex: `codex exec --json` (`codex-json`).
//!
//! Launched as its template says. Home: `$CODEX_HOME` (default `~/.codex`), seeded by
//! allow-list; its `config.toml` (and each `<profile>.config.toml` layer) is rewritten with
//! every custom provider's retries off and, in the base layer, no start-up traffic and a
//! writable sandbox where the user set nothing.

use std::io;
use std::path::Path;

use sortie_core::Protocol;

use sortie_core::Permissions;

use super::home::{HomeError, Rules, UserEnv, io_err};
use super::{Agent, Launch, LaunchInput, Repair};

/// Codex.
#[derive(Debug)]
pub(super) struct Codex;

impl Agent for Codex {
    fn name(&self) -> &'static str {
        "codex"
    }

    fn speaks(&self, protocol: Protocol) -> bool {
        protocol == Protocol::CodexJson
    }

    fn home(&self) -> Option<&'static Rules> {
        Some(&CODEX)
    }

    // #34: every `base_url` of the home's `config.toml` (its `[model_providers]`, and
    // `openai_base_url`), `OPENAI_BASE_URL`, and OpenAI's API (and ChatGPT's, which a
    // ChatGPT login talks to) when the chosen provider is the built-in `openai`.
    fn providers(
        &self,
        home: &Path,
        env: &dyn Fn(&str) -> Option<String>,
        _model: Option<&str>,
    ) -> Vec<String> {
        codex_providers(home, env)
    }

    // #34: its command runner keeps a daemon directory under `/tmp` whatever `TMPDIR` says
    // (without it every command fails "error building bubblewrap command").
    fn sandbox_write(&self) -> Vec<std::path::PathBuf> {
        vec![std::path::PathBuf::from(format!(
            "/tmp/codex-daemon-{}",
            nix::unistd::getuid()
        ))]
    }

    fn launch(&self, input: &LaunchInput<'_>, launch: &mut Launch) {
        // Codex's sandbox is its permission system: `read-only` (no writes, no network),
        // `workspace-write` (writes inside the working directory), `danger-full-access`.
        let sandbox = match input.spec.permissions {
            Permissions::ReadOnly => "read-only",
            Permissions::Edit => "workspace-write",
            Permissions::Full => "danger-full-access",
        };
        // `-c key=value` takes a TOML value: a JSON string is a TOML basic string.
        let toml_string = |s: &str| serde_json::Value::from(s).to_string();
        // #13: its session files (`sessions/` of its home) are kept in the conversation's
        // store; an attempt that continues a conversation is `codex exec resume ID` (which
        // takes no `--sandbox`: the sandbox is then its config value). A resumed thread's
        // usage covers the whole thread: the earlier attempts' part is taken off.
        let resume = if input.profile.can_continue {
            let store = input.run_dir.conversation(input.conversation_root.0);
            launch.session_store = Some(("sessions", store));
            super::resumable(input)
        } else {
            None
        };
        launch.agent_args = match &resume {
            None => vec!["--sandbox".into(), sandbox.into()],
            Some(_) => vec![
                "-c".into(),
                format!("sandbox_mode={}", toml_string(sandbox)),
            ],
        };
        if let Some((id, base)) = resume {
            launch.session_args = vec!["resume".into(), id.clone()];
            launch.continues = Some(id);
            launch.usage_base = Some(base);
        }
        if let Some(text) = &input.spec.system_prompt {
            launch.agent_args.push("-c".into());
            launch
                .agent_args
                .push(format!("developer_instructions={}", toml_string(text)));
        }
        if let Some(level) = &input.spec.thinking {
            // Codex's reasoning efforts: none, minimal, low, medium, high, xhigh.
            let effort = if level == "off" { "none" } else { level };
            launch.agent_args.push("-c".into());
            launch
                .agent_args
                .push(format!("model_reasoning_effort={}", toml_string(effort)));
        }
    }

    fn credentials(&self) -> Option<&'static super::Credentials> {
        Some(&CREDENTIALS)
    }

    fn seed_home(&self, user: Option<&Path>, dir: &Path, _env: &UserEnv) -> Result<(), HomeError> {
        if let Some(user) = user.filter(|u| u.is_dir()) {
            for profile in codex_profile_layers(user)? {
                write_codex_config(Some(&user.join(&profile)), &dir.join(&profile), false)?;
            }
        }
        let from = user.map(|u| u.join("config.toml"));
        write_codex_config(from.as_deref(), &dir.join("config.toml"), true)
    }

    // Issue 13: structured results.
    /// The session is kept (`--ephemeral` is dropped: it is written in the attempt's own
    /// `CODEX_HOME`, where it is the only one), and the repair run is `codex exec resume
    /// --last` with the request on stdin (see [`resume_argv`]).
    fn structured(
        &self,
        _input: &LaunchInput<'_>,
        launch: &mut Launch,
        argv: &mut Vec<String>,
    ) -> Option<Repair> {
        super::drop_switch(argv, "--ephemeral");
        let repair = resume_argv(argv)?;
        launch.prompt_on_stdin.then_some(Repair::Continue {
            argv: repair,
            session_in: None,
            // Its usage is the session's running total, the first run's included.
            cumulative: true,
        })
    }
}

/// The argv of `codex exec resume --last` from an attempt's `codex exec` argv: `exec`'s own
/// options that `resume` does not take become config overrides (`--sandbox X`:
/// `-c sandbox_mode="X"`, `--profile X`: `-c profile="X"`) or are left out (`--color`,
/// `--cd`: the cwd is the same, `--add-dir`). `None` when the argv has no `exec`.
fn resume_argv(argv: &[String]) -> Option<Vec<String>> {
    let exec = argv.iter().position(|a| a == "exec")?;
    let mut out: Vec<String> = argv[..=exec].to_vec();
    out.push("resume".into());
    out.push("--last".into());
    let toml_string = |s: &str| serde_json::Value::from(s).to_string();
    let mut rest = argv[exec + 1..].iter();
    while let Some(a) = rest.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let key = match flag {
            "-s" | "--sandbox" => Some("sandbox_mode"),
            "-p" | "--profile" => Some("profile"),
            "--color" | "-C" | "--cd" | "--add-dir" => None,
            _ => {
                out.push(a.clone());
                continue;
            }
        };
        let value = match inline {
            Some(v) => v,
            None => rest.next()?.clone(),
        };
        if let Some(key) = key {
            out.push("-c".into());
            out.push(format!("{key}={}", toml_string(&value)));
        }
    }
    Some(out)
}

/// Where codex finds its credentials (for `sortie check`): a credential file or a provider
/// config in its config directory, or a key variable.
const CREDENTIALS: super::Credentials = super::Credentials {
    files: &["auth.json", "config.toml"],
    env: &["OPENAI_API_KEY", "CODEX_API_KEY"],
};

const CODEX: Rules = Rules {
    env_var: "CODEX_HOME",
    default_dir: ".codex",
    // config.toml (and any `<profile>.config.toml`) is rewritten, not copied (see `prepare`).
    copy: &["AGENTS.md", "instructions.md"],
    link: &["auth.json", "prompts", "skills"],
    env: &[],
};

/// The base URLs Codex may talk to (see [`Codex::providers`]).
fn codex_providers(home: &Path, env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let config = std::fs::read_to_string(home.join("config.toml"))
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .unwrap_or_default();
    let mut urls = Vec::new();
    let mut custom = false;
    if let Some(toml::Value::Table(providers)) = config.get("model_providers") {
        for provider in providers.values() {
            if let Some(url) = provider.get("base_url").and_then(toml::Value::as_str) {
                urls.push(url.to_owned());
            }
        }
        let chosen = config.get("model_provider").and_then(toml::Value::as_str);
        custom = chosen.is_some_and(|c| providers.contains_key(c));
    }
    if let Some(url) = config.get("openai_base_url").and_then(toml::Value::as_str) {
        urls.push(url.to_owned());
    }
    urls.extend(env("OPENAI_BASE_URL"));
    if !custom {
        urls.push("https://api.openai.com/v1".into());
        urls.push("https://chatgpt.com/backend-api".into());
    }
    urls
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
    use super::super::home::prepare;
    use super::super::home::testing::{snapshot, write};
    use super::*;

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
        let h = prepare(&Codex, &dir, &env).unwrap();

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
        prepare(&Codex, &dir, &env).unwrap();
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
            let err = prepare(&Codex, &tmp.path().join("h"), &env).unwrap_err();
            assert!(matches!(err, HomeError::Invalid { .. }), "{bad}: {err}");
        }
    }
}
