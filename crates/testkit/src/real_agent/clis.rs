//! The real agent CLIs the tests run (Claude Code, Codex, pi): whether the pinned version is
//! installed, and the fake users whose own configuration points Codex and pi at a mock.

use std::path::{Path, PathBuf};

use super::{output_of, python3_found};

/// The Claude Code version the tests run (`.ci/run` installs it).
pub const CLAUDE_VERSION: &str = "2.1.332";
/// The Codex version the tests run.
pub const CODEX_VERSION: &str = "0.171.0";
/// The pi version the tests run.
pub const PI_VERSION: &str = "0.73.1";
/// pi's own variables, removed from a test run as the fake user (the machine's must not leak in).
pub const PI_VARS: &[&str] = &["PI_CODING_AGENT_DIR", "PI_CODING_AGENT_SESSION_DIR"];

/// Whether `program --version` (with `env`) prints `expected` on stdout or stderr, and
/// python3 (for the mocks) is here; if not, why, and how to install it (`npm install -g
/// {package}@{version}`).
pub fn cli_found(
    program: &str,
    expected: &str,
    env: &[(&str, &str)],
    package: &str,
    version: &str,
) -> Result<(), String> {
    let printed = output_of(program, &["--version"], env)
        .map(|(out, err)| format!("{out}{err}"))
        .unwrap_or_else(|e| e);
    if printed.trim() != expected {
        return Err(format!(
            "this test runs the real {program} {version}, but `{program} --version` is \
             {printed:?}: run `bash .ci/run` (or `npm install -g {package}@{version}`) first"
        ));
    }
    python3_found()
}

/// Whether the real Claude Code [`CLAUDE_VERSION`] (and python3) are here.
pub fn claude_found() -> Result<(), String> {
    cli_found(
        "claude",
        &format!("{CLAUDE_VERSION} (Claude Code)"),
        &[("DISABLE_AUTOUPDATER", "1")],
        "@anthropic-ai/claude-code",
        CLAUDE_VERSION,
    )
}

/// Whether the real Codex [`CODEX_VERSION`] (and python3) are here.
pub fn codex_found() -> Result<(), String> {
    cli_found(
        "codex",
        &format!("codex-cli {CODEX_VERSION}"),
        &[],
        "@openai/codex",
        CODEX_VERSION,
    )
}

/// Whether the real pi [`PI_VERSION`] (and python3) are here (pi prints it on stderr).
pub fn pi_found() -> Result<(), String> {
    cli_found(
        "pi",
        PI_VERSION,
        &[("PI_OFFLINE", "1")],
        "@mariozechner/pi-coding-agent",
        PI_VERSION,
    )
}

/// A fake user (home `home`) whose `~/.codex/config.toml` points Codex at the mock on `port`,
/// with Codex's retries left on; returns that `~/.codex`.
pub fn codex_user(home: &Path, port: u16) -> PathBuf {
    let codex = home.join(".codex");
    std::fs::create_dir_all(codex.join("sessions/2026")).expect("mkdir");
    std::fs::write(
        codex.join("config.toml"),
        format!(
            "model_provider = \"mock\"\napproval_policy = \"never\"\n\n\
             [model_providers.mock]\nname = \"mock\"\n\
             base_url = \"http://127.0.0.1:{port}/v1\"\nwire_api = \"responses\"\n\
             env_key = \"MOCK_API_KEY\"\nrequest_max_retries = 4\n"
        ),
    )
    .expect("config.toml");
    std::fs::write(codex.join("sessions/2026/old.jsonl"), "{}\n").expect("old session");
    codex
}

/// A fake user (home `home`) whose `~/.pi/agent` points pi at the mock on `port`, offering
/// `models` (priced $3 / $15 / $0.30 / $3.75 per Mtok), with pi's retries on; returns that
/// `~/.pi/agent`.
pub fn pi_user(home: &Path, port: u16, models: &[&str]) -> PathBuf {
    let agent = home.join(".pi/agent");
    std::fs::create_dir_all(agent.join("sessions")).expect("mkdir");
    let model = |id: &str| {
        serde_json::json!({
            "id": id, "contextWindow": 128000, "maxTokens": 4096,
            "cost": {"input": 3, "output": 15, "cacheRead": 0.3, "cacheWrite": 3.75}
        })
    };
    let config = serde_json::json!({"providers": {"mock": {
        "baseUrl": format!("http://127.0.0.1:{port}/v1"),
        "api": "openai-completions",
        "apiKey": "mock-key",
        "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false,
                   "supportsStore": false},
        "models": models.iter().map(|id| model(id)).collect::<Vec<_>>()
    }}});
    std::fs::write(agent.join("models.json"), config.to_string()).expect("models.json");
    // The user's own settings keep pi's retries on: 12 requests and ~21 s per failed call.
    std::fs::write(
        agent.join("settings.json"),
        r#"{"retry":{"enabled":true,"maxRetries":3},"quietStartup":true}"#,
    )
    .expect("settings.json");
    std::fs::write(agent.join("auth.json"), "{}").expect("auth.json");
    std::fs::write(agent.join("sessions/old.jsonl"), "{\"type\":\"session\"}\n").expect("old");
    agent
}
