//! The project's loopback mock model servers (`tests/mock-llm/*.py`, on 127.0.0.1) as the
//! real-agent tests start them: one [`MockServer`] for every script, killed when dropped.

#![allow(
    clippy::disallowed_methods,
    reason = "the tests start the mock servers themselves"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// The text the mocks answer a plain prompt with (`--answer`; Codex's mock has its own).
pub const ANSWER: &str = "Hello from the mock model.";

/// A mock from `tests/mock-llm/`, running until dropped. It prints its port on its first line
/// and logs every response it served, a JSON object a line, to `served.jsonl`.
#[derive(Debug)]
pub struct MockServer {
    child: Child,
    /// The loopback port it listens on.
    pub port: u16,
    log: PathBuf,
}

impl MockServer {
    /// Starts `tests/mock-llm/<script>` with `args`, logging to `dir/served.jsonl` (its stderr
    /// is dropped).
    pub fn start(dir: &Path, script: &str, args: &[String]) -> MockServer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/mock-llm")
            .join(script);
        let log = dir.join("served.jsonl");
        let mut cmd = Command::new("python3");
        cmd.arg(path)
            .arg("--log")
            .arg(&log)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start the mock {script} (python3): {e}"));
        let mut first = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out)
                .read_line(&mut first)
                .unwrap_or_else(|e| panic!("read the port of the mock {script}: {e}"));
        }
        let port = first
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the mock {script} printed {first:?}, not a port"));
        MockServer { child, port, log }
    }

    /// The Anthropic Messages API (`anthropic_server.py`), serving each `(model, kind)`.
    pub fn anthropic(dir: &Path, models: &[(&str, &str)]) -> MockServer {
        MockServer::start(dir, "anthropic_server.py", &answering(models, "--model"))
    }

    /// The OpenAI chat completions API that pi talks to (`server.py`).
    pub fn openai(dir: &Path, models: &[(&str, &str)]) -> MockServer {
        MockServer::start(dir, "server.py", &answering(models, "--model"))
    }

    /// The Responses API that Codex talks to (`codex_server.py`), each `(model, scenario)`.
    pub fn responses(dir: &Path, models: &[(&str, &str)]) -> MockServer {
        let mut args = vec!["--print-port".to_owned()];
        args.extend(pairs(models, "--model-scenario"));
        MockServer::start(dir, "codex_server.py", &args)
    }

    /// Every response the mock logged (Codex's mock logs its GETs too: left out).
    pub fn served(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("the mock logs JSON lines"))
            .filter(|r: &Value| r["method"].is_null() || r["method"] == "POST")
            .collect()
    }

    /// The environment that points Claude Code (run with `cmd`, as the user whose home is
    /// `home`) at this mock, and nowhere else.
    pub fn claude_env(&self, cmd: &mut Command, home: &Path) {
        cmd.env("HOME", home)
            .env(
                "ANTHROPIC_BASE_URL",
                format!("http://127.0.0.1:{}", self.port),
            )
            .env("ANTHROPIC_API_KEY", "mock-key")
            .env_remove("ANTHROPIC_AUTH_TOKEN")
            .env_remove("CLAUDE_CONFIG_DIR");
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `flag id=kind` for each model.
fn pairs(models: &[(&str, &str)], flag: &str) -> Vec<String> {
    models
        .iter()
        .flat_map(|(id, kind)| [flag.to_owned(), format!("{id}={kind}")])
        .collect()
}

/// [`ANSWER`] as the plain answer, a hang of 120 s, and `flag id=kind` for each model.
fn answering(models: &[(&str, &str)], flag: &str) -> Vec<String> {
    let mut args: Vec<String> = ["--answer", ANSWER, "--hang-seconds", "120"]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
    args.extend(pairs(models, flag));
    args
}
