//! Short-lived tools sortie runs itself (git): run to the end, output held in memory.

use std::io;
use std::process::Stdio;

/// What a short-lived tool (git) printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// Its exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// Everything it printed on stdout.
    pub stdout: Vec<u8>,
    /// Everything it printed on stderr, decoded lossily.
    pub stderr: String,
}

impl ToolOutput {
    /// True when it exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Its stdout, decoded lossily, with surrounding whitespace trimmed.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).trim().to_owned()
    }
}

/// Why a tool could not be run at all (a tool that ran and failed is a [`ToolOutput`]).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The argv is empty.
    #[error("nothing to run: the command is empty")]
    EmptyArgv,
    /// It could not be started or waited for.
    #[error("cannot run `{program}`: {error}")]
    Io {
        /// The program as given.
        program: String,
        /// The failure.
        error: io::Error,
    },
}

/// Runs a short-lived tool (e.g. `git`) to its end in `cwd`, with `env` added to sortie's own
/// environment and stdin `/dev/null`, and returns what it printed. No shell is involved.
/// Dropping the future kills the tool. Unlike [`spawn`](super::spawn), for commands sortie runs itself, not
/// for attempts: no process group, no marker, output held in memory.
#[allow(clippy::disallowed_methods, reason = "the one place besides spawn")]
pub async fn run_tool(
    argv: &[String],
    cwd: &std::path::Path,
    env: &[(String, String)],
) -> Result<ToolOutput, ToolError> {
    let Some(program) = argv.first() else {
        return Err(ToolError::EmptyArgv);
    };
    let out = tokio::process::Command::new(program)
        .args(&argv[1..])
        .current_dir(cwd)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|error| ToolError::Io {
            program: program.clone(),
            error,
        })?;
    Ok(ToolOutput {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
