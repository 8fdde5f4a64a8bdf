//! Claude Code: `claude -p --output-format stream-json` (`claude-stream-json`).
//!
//! Launched as its template says (its `--` makes any prompt safe). Home: `$CLAUDE_CONFIG_DIR`
//! (default `~/.claude`, plus the global `~/.claude.json` beside it), seeded by allow-list, with
//! `CLAUDE_CODE_MAX_RETRIES=0` and its `DISABLE_*` switches for start-up traffic.

use std::path::Path;

use sortie_core::Protocol;

use sortie_core::Permissions;

use super::home::{HomeError, Rules, UserEnv, copy_if_present};
use super::{Agent, Launch, LaunchInput, Repair};

/// The tools Claude Code may use unasked under `read-only`.
const READ_TOOLS: &str = "Read,Glob,Grep";
/// The tools Claude Code may use unasked under `edit`: the read tools, edits and commands.
const EDIT_TOOLS: &str = "Read,Glob,Grep,Edit,Write,NotebookEdit,Bash";

/// Claude Code's `--effort` for a `thinking` level: its levels are low, medium, high, xhigh
/// (and max); it has no flag that turns thinking off, so `off` and `minimal` are `low`.
fn effort(level: &str) -> &'static str {
    match level {
        "medium" => "medium",
        "high" => "high",
        "xhigh" => "xhigh",
        _ => "low",
    }
}

/// Claude Code's flags for a task's permissions and tools. Headless (`-p`), a tool call that
/// needs approval is denied (and listed in the result's `permission_denials`), so:
/// - `read-only`: `--permission-mode dontAsk --allowedTools Read,Glob,Grep`: every other call
///   is denied;
/// - `edit`: `--permission-mode acceptEdits --allowedTools <the read tools>,Edit,Write,
///   NotebookEdit,Bash`: edits and commands run (Claude Code has no sandbox of its own);
/// - `full`: `--permission-mode bypassPermissions` (Claude Code refuses it when run as root);
/// - `tools`: `--tools A,B`: only those tools are offered at all.
fn permission_args(permissions: Permissions, tools: &[String]) -> Vec<String> {
    let mut args: Vec<String> = match permissions {
        Permissions::ReadOnly => vec![
            "--permission-mode".into(),
            "dontAsk".into(),
            "--allowedTools".into(),
            READ_TOOLS.into(),
        ],
        Permissions::Edit => vec![
            "--permission-mode".into(),
            "acceptEdits".into(),
            "--allowedTools".into(),
            EDIT_TOOLS.into(),
        ],
        Permissions::Full => vec!["--permission-mode".into(), "bypassPermissions".into()],
    };
    if !tools.is_empty() {
        args.push("--tools".into());
        args.push(tools.join(","));
    }
    args
}

/// Claude Code.
#[derive(Debug)]
pub(super) struct Claude;

impl Agent for Claude {
    fn name(&self) -> &'static str {
        "claude"
    }

    fn speaks(&self, protocol: Protocol) -> bool {
        protocol == Protocol::ClaudeStreamJson
    }

    fn home(&self) -> Option<&'static Rules> {
        Some(&CLAUDE)
    }

    fn launch(&self, input: &LaunchInput<'_>, launch: &mut Launch) {
        let spec = input.spec;
        launch.agent_args = permission_args(spec.permissions, &spec.tools);
        if let Some(text) = &spec.system_prompt {
            launch.agent_args.push("--append-system-prompt".into());
            launch.agent_args.push(text.clone());
        }
        if let Some(level) = &spec.thinking {
            launch.agent_args.push("--effort".into());
            launch.agent_args.push(effort(level).into());
        }
        // #13: its sessions (`projects/` of its config dir) are kept in the conversation's
        // store; an attempt that continues a conversation resumes its session by id (Claude
        // Code finds it whatever the cwd, and appends to it). A resumed session's
        // `modelUsage` and cost cover the whole session: the earlier attempts' part is taken
        // off.
        if input.profile.can_continue {
            let store = input.run_dir.conversation(input.conversation_root.0);
            launch.session_store = Some(("projects", store));
            if let Some((id, base)) = super::resumable(input) {
                launch.session_args = vec!["--resume".into(), id.clone()];
                launch.continues = Some(id);
                launch.usage_base = Some(base);
            }
        }
    }

    // #34: `ANTHROPIC_BASE_URL` when set (a gateway, a mock), else Anthropic's API.
    fn providers(
        &self,
        _home: &Path,
        env: &dyn Fn(&str) -> Option<String>,
        _model: Option<&str>,
    ) -> Vec<String> {
        vec![env("ANTHROPIC_BASE_URL").unwrap_or_else(|| "https://api.anthropic.com".into())]
    }

    fn credentials(&self) -> Option<&'static super::Credentials> {
        Some(&CREDENTIALS)
    }

    fn seed_home(&self, user: Option<&Path>, dir: &Path, env: &UserEnv) -> Result<(), HomeError> {
        // Claude Code keeps its global state in `$CLAUDE_CONFIG_DIR/.claude.json` when the
        // variable is set, else in `~/.claude.json` (beside, not inside, `~/.claude`). This
        // is the file concurrent processes corrupt: each attempt gets its own copy.
        let global = match env.get(CLAUDE.env_var) {
            Some(_) => user.map(|u| u.join(".claude.json")),
            None => env.get("HOME").map(|h| Path::new(h).join(".claude.json")),
        };
        if let Some(global) = global {
            copy_if_present(&global, &dir.join(".claude.json"))?;
        }
        Ok(())
    }

    // Issue 13: structured results.
    /// The session is kept (`--no-session-persistence` is dropped: it is written in the
    /// attempt's own `CLAUDE_CONFIG_DIR`, where it is the only one), and the repair run
    /// continues it with `--continue`, the request on stdin.
    fn structured(
        &self,
        _input: &LaunchInput<'_>,
        launch: &mut Launch,
        argv: &mut Vec<String>,
    ) -> Option<Repair> {
        super::drop_switch(argv, "--no-session-persistence");
        let mut repair = argv.clone();
        repair.push("--continue".into());
        launch.prompt_on_stdin.then_some(Repair::Continue {
            argv: repair,
            session_in: None,
            // Its usage is the session's running total, the first run's included.
            cumulative: true,
        })
    }
}

/// Where claude finds its credentials (for `sortie check`): a credential file or a provider
/// config in its config directory, or a key variable.
const CREDENTIALS: super::Credentials = super::Credentials {
    files: &[".credentials.json"],
    env: &[
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "CLAUDE_CODE_USE_BEDROCK",
        "CLAUDE_CODE_USE_VERTEX",
    ],
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

#[cfg(test)]
mod tests {
    use super::super::home::prepare;
    use super::super::home::testing::write;
    use super::*;

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
        let h = prepare(&Claude, &dir, &env).unwrap();
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
        prepare(&Claude, &dir2, &env).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir2.join(".claude.json")).unwrap(),
            r#"{"inside":true}"#
        );
    }
}
