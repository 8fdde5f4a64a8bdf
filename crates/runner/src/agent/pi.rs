//! pi (pi-coding-agent): `pi --mode json` (`pi-json`) and `pi --mode rpc` (`pi-rpc`).
//!
//! - Launch: pi's argument parser has no `--`, so a `pi-json` prompt is guarded
//!   ([`guard_prompt`]). A `pi-rpc` attempt gets its prompt as an RPC command on
//!   stdin instead, and, when its profile can steer, a `steer` command asks it to wrap up on a
//!   budget breach.
//! - Sessions: a continuable profile keeps each attempt's session under
//!   `<run-dir>/sessions/<task>.<attempt>` (`--session-dir`, through `{session_args}`); the retry
//!   of an interrupted attempt continues its session file (`--session`).
//! - Home: `$PI_CODING_AGENT_DIR` (default `~/.pi/agent`), seeded by allow-list, with both of
//!   pi's retry layers off in its `settings.json` and `PI_OFFLINE=1`.

use std::borrow::Cow;
use std::io;
use std::path::{Path, PathBuf};

use sortie_core::{Attempt, AttemptRecord, Permissions, Protocol, TaskId};

use super::home::{HomeError, Rules, UserEnv, io_err};
use super::{Agent, Drive, Launch, LaunchInput, Repair, WRAP_UP};
use crate::layout::RunDir;

/// Makes a prompt safe as pi's last argument. pi's argument parser has no `--`: an argument
/// starting with `-` is read as an option (or refused), one starting with `@` as a file to
/// attach. Such a prompt gets one leading space, which pi passes on as is and a model ignores.
pub(super) fn guard_prompt(prompt: &str) -> Cow<'_, str> {
    if prompt.starts_with('-') || prompt.starts_with('@') {
        Cow::Owned(format!(" {prompt}"))
    } else {
        Cow::Borrowed(prompt)
    }
}

/// pi.
#[derive(Debug)]
pub(super) struct Pi;

impl Agent for Pi {
    fn name(&self) -> &'static str {
        "pi"
    }

    fn speaks(&self, protocol: Protocol) -> bool {
        matches!(protocol, Protocol::PiJson | Protocol::PiRpc)
    }

    fn home(&self) -> Option<&'static Rules> {
        Some(&PI)
    }

    fn credentials(&self) -> Option<&'static super::Credentials> {
        Some(&CREDENTIALS)
    }

    fn seed_home(&self, user: Option<&Path>, dir: &Path, _env: &UserEnv) -> Result<(), HomeError> {
        let from = user.map(|u| u.join("settings.json"));
        write_pi_settings(from.as_deref(), &dir.join("settings.json"))
    }

    // #34: every `baseUrl` of the home's `models.json`, and the API of the built-in provider
    // the model names (`anthropic/...`), when it is one pi knows.
    fn providers(
        &self,
        home: &Path,
        _env: &dyn Fn(&str) -> Option<String>,
        model: Option<&str>,
    ) -> Vec<String> {
        pi_providers(home, model)
    }

    fn launch(&self, input: &LaunchInput<'_>, launch: &mut Launch) {
        let profile = input.profile;
        match profile.protocol {
            Protocol::PiJson if !launch.prompt_on_stdin => {
                launch.prompt = guard_prompt(&launch.prompt).into_owned();
            }
            Protocol::PiRpc => launch.drive = Some(rpc_drive(&launch.prompt, profile.can_steer)),
            _ => {}
        }
        launch.agent_args = tool_args(input.spec.permissions, &input.spec.tools);
        if let Some(text) = &input.spec.system_prompt {
            launch.agent_args.push("--append-system-prompt".into());
            launch.agent_args.push(text.clone());
        }
        if let Some(level) = &input.spec.thinking {
            // pi's levels are sortie's: off, minimal, low, medium, high, xhigh.
            launch.agent_args.push("--thinking".into());
            launch.agent_args.push(level.clone());
        }
        if profile.can_continue {
            let (dir, args, continues) = session_plan(
                input.run_dir,
                input.task,
                input.conversation,
                input.live.attempt,
            );
            launch.session_dir = Some(dir);
            launch.session_args = args;
            launch.continues = continues;
        }
    }

    // Issue 13: structured results.
    /// `pi-rpc` is still running when its answer is checked: the request is a new `prompt`
    /// command in the same session. `pi-json` keeps a session file (`--no-session` is dropped;
    /// `--session-dir <run-dir>/sessions/<task>.<attempt>` unless the template gives one) and
    /// the repair run continues it (`--session FILE`, the request on stdin).
    fn structured(
        &self,
        input: &LaunchInput<'_>,
        launch: &mut Launch,
        argv: &mut Vec<String>,
    ) -> Option<Repair> {
        match input.profile.protocol {
            Protocol::PiRpc => Some(Repair::Steer(prompt_command)),
            Protocol::PiJson if launch.prompt_on_stdin => {
                super::drop_switch(argv, "--no-session");
                let dir = match argv.iter().position(|a| a == "--session-dir") {
                    Some(at) => PathBuf::from(argv.get(at + 1)?),
                    None => {
                        let dir = input.run_dir.sessions(input.task.0, input.live.attempt.0);
                        argv.push("--session-dir".into());
                        argv.push(dir.display().to_string());
                        dir
                    }
                };
                launch.session_dir.get_or_insert_with(|| dir.clone());
                Some(Repair::Continue {
                    argv: argv.clone(),
                    session_in: Some(dir),
                    // pi's usage is per model call: the repair run's own.
                    cumulative: false,
                })
            }
            _ => None,
        }
    }
}

/// pi's RPC `prompt` command: a new turn of the same session (the structured result's repair
/// request, issue 13).
fn prompt_command(message: &str) -> String {
    serde_json::json!({ "type": "prompt", "message": message }).to_string()
}

/// pi's tools that only read.
const READ_TOOLS: &[&str] = &["read", "grep", "find", "ls"];

/// pi's flags for a task's permissions and tools. pi has no permission prompts: what it may do
/// is the tools it is given (`--tools`), and a call of any other tool fails `Tool NAME not
/// found` (read as a denial). `read-only` gives the read tools (those of `tools` among them,
/// when `tools` is set); `edit` and `full` give `tools`, else pi's default set (read, bash,
/// edit, write).
fn tool_args(permissions: Permissions, tools: &[String]) -> Vec<String> {
    let given: Vec<&str> = match permissions {
        Permissions::ReadOnly if tools.is_empty() => READ_TOOLS.to_vec(),
        Permissions::ReadOnly => tools
            .iter()
            .map(String::as_str)
            .filter(|t| READ_TOOLS.contains(t))
            .collect(),
        Permissions::Edit | Permissions::Full if tools.is_empty() => return vec![],
        Permissions::Edit | Permissions::Full => tools.iter().map(String::as_str).collect(),
    };
    if given.is_empty() {
        return vec!["--no-tools".into()];
    }
    vec!["--tools".into(), given.join(",")]
}

/// pi's RPC mode: `prompt`, and `steer` to wrap up.
fn rpc_drive(prompt: &str, can_steer: bool) -> Drive {
    let command = |kind: &str, message: &str| {
        serde_json::json!({ "type": kind, "message": message }).to_string()
    };
    Drive {
        prompt_command: command("prompt", prompt),
        wrap_up_command: can_steer.then(|| command("steer", WRAP_UP)),
        steer_command: can_steer.then_some(steer_command as fn(&str) -> String),
    }
}

/// pi's RPC `steer` command carrying a user's message (`sortie steer`).
fn steer_command(message: &str) -> String {
    serde_json::json!({ "type": "steer", "message": message }).to_string()
}

/// The session arguments of an attempt of a continuable pi profile (see
/// `process::SESSION_ARGS`): its own session directory under the run dir, and, when it
/// continues a conversation (the retry of an interrupted attempt, or the next task of a
/// `session`: core's `session::conversation`, newest first), the session file of the newest
/// of those attempts that left one (`--session`: pi appends to it). Returns the directory, the
/// arguments and the continued session.
fn session_plan(
    run_dir: &RunDir,
    task: TaskId,
    conversation: &[(TaskId, &AttemptRecord)],
    attempt: Attempt,
) -> (PathBuf, Vec<String>, Option<String>) {
    let dir = run_dir.sessions(task.0, attempt.0);
    let mut args = vec!["--session-dir".to_owned(), dir.display().to_string()];
    let continued = conversation.iter().find_map(|(t, p)| {
        p.continues()
            .map(str::to_owned)
            .filter(|s| Path::new(s).is_file())
            .or_else(|| latest_session(&run_dir.sessions(t.0, p.attempt.0)))
    });
    if let Some(session) = &continued {
        args.push("--session".to_owned());
        args.push(session.clone());
    }
    (dir, args, continued)
}

/// The most recently modified session file (`*.jsonl`) in a session directory, if any.
fn latest_session(dir: &Path) -> Option<String> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .filter_map(|e| {
            let modified = e.metadata().and_then(|m| m.modified()).ok()?;
            Some((modified, e.path()))
        })
        .max()
        .map(|(_, p)| p.display().to_string())
}

/// Where pi finds its credentials (for `sortie check`): a credential file or a provider
/// config in its config directory, or a key variable.
const CREDENTIALS: super::Credentials = super::Credentials {
    files: &["auth.json", "models.json"],
    env: &[
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "GEMINI_API_KEY",
        "GROQ_API_KEY",
        "XAI_API_KEY",
        "OPENROUTER_API_KEY",
        "MISTRAL_API_KEY",
        "CEREBRAS_API_KEY",
        "ZAI_API_KEY",
        "AWS_PROFILE",
        "AWS_ACCESS_KEY_ID",
    ],
};

/// The APIs of pi's built-in providers, by the provider's name in a model (`NAME/model`).
const PI_BUILTIN_APIS: &[(&str, &str)] = &[
    ("anthropic", "https://api.anthropic.com"),
    ("openai", "https://api.openai.com"),
    ("google", "https://generativelanguage.googleapis.com"),
    ("groq", "https://api.groq.com"),
    ("xai", "https://api.x.ai"),
    ("openrouter", "https://openrouter.ai"),
    ("mistral", "https://api.mistral.ai"),
    ("cerebras", "https://api.cerebras.ai"),
];

/// The base URLs pi may talk to (see [`Pi::providers`]).
fn pi_providers(home: &Path, model: Option<&str>) -> Vec<String> {
    let models: serde_json::Value = std::fs::read(home.join("models.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let mut urls = Vec::new();
    let mut custom = Vec::new();
    if let Some(providers) = models["providers"].as_object() {
        for (name, p) in providers {
            custom.push(name.as_str());
            if let Some(url) = p["baseUrl"].as_str() {
                urls.push(url.to_owned());
            }
        }
    }
    let named = model.and_then(|m| m.split_once('/')).map(|(p, _)| p);
    match named {
        Some(p) if custom.contains(&p) => {}
        Some(p) => urls.extend(
            PI_BUILTIN_APIS
                .iter()
                .filter(|(n, _)| *n == p)
                .map(|(_, u)| (*u).to_owned()),
        ),
        None if custom.is_empty() => {
            urls.extend(PI_BUILTIN_APIS.iter().map(|(_, u)| (*u).to_owned()))
        }
        None => {}
    }
    urls
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

#[cfg(test)]
mod tests {
    use super::super::home::prepare;
    use super::super::home::testing::{read_json, snapshot, write};
    use super::*;

    #[test]
    fn a_prompt_that_reads_as_an_option_or_a_file_is_guarded() {
        assert_eq!(guard_prompt("-v is broken"), " -v is broken");
        assert_eq!(guard_prompt("@notes.md"), " @notes.md");
        assert!(matches!(guard_prompt("fix it"), Cow::Borrowed("fix it")));
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
        let h = prepare(&Pi, &dir, &env).unwrap();

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
        prepare(&Pi, &dir, &env).unwrap();
        assert_eq!(
            read_json(&dir.join("settings.json")),
            serde_json::json!({"retry": {"enabled": false, "provider": {"maxRetries": 0}}})
        );
        assert!(
            !dir.join("auth.json").exists(),
            "no dangling credential link"
        );
        let env = UserEnv::from_pairs([]);
        prepare(&Pi, &tmp.path().join("b"), &env).unwrap();
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
        prepare(&Pi, &dir, &env).unwrap();
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
        let err = prepare(&Pi, &tmp.path().join("h"), &env).unwrap_err();
        assert!(matches!(err, HomeError::Invalid { .. }), "{err}");
    }

    #[test]
    fn the_rpc_drive_sends_the_prompt_and_steers_only_when_it_can() {
        let d = rpc_drive("do it", true);
        let prompt: serde_json::Value = serde_json::from_str(&d.prompt_command).unwrap();
        assert_eq!(
            prompt,
            serde_json::json!({"type": "prompt", "message": "do it"})
        );
        let steer: serde_json::Value =
            serde_json::from_str(d.wrap_up_command.as_deref().unwrap()).unwrap();
        assert_eq!(
            steer,
            serde_json::json!({"type": "steer", "message": WRAP_UP})
        );
        assert!(rpc_drive("x", false).wrap_up_command.is_none());
    }
}
