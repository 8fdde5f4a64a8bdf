//! One command helper, in the style of ripgrep's `TestCommand`: a command that fails panics
//! (or, in `try_` form, errs) with the command line, its cwd, its status, stdout and stderr,
//! so that a failure says everything needed to rerun it by hand.

#![allow(clippy::disallowed_methods, reason = "the test kit runs git and tools")]

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The identity given to every git command (a CI machine has none configured).
const GIT_NAME: &str = "sortie-test";
/// See [`GIT_NAME`].
const GIT_EMAIL: &str = "test@sortie.invalid";

/// A command that could not run, or ran and failed.
#[derive(Debug)]
pub struct CommandFailed {
    /// The whole report: command, cwd, status (or why it could not start), stdout, stderr.
    pub report: String,
    /// Its output, when it ran.
    pub output: Option<Output>,
}

impl std::fmt::Display for CommandFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.report)
    }
}

impl std::error::Error for CommandFailed {}

/// The command line, as a shell would show it (quoted where needed).
fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| {
            let a = a.to_string_lossy();
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+%".contains(c))
            {
                a.into_owned()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn cwd_of(cmd: &Command) -> String {
    match cmd.get_current_dir() {
        Some(d) => d.display().to_string(),
        None => std::env::current_dir()
            .map(|d| format!("{} (inherited)", d.display()))
            .unwrap_or_else(|e| format!("unknown ({e})")),
    }
}

fn report(cmd: &Command, what: &str) -> String {
    format!(
        "\n\n==========\ncommand failed: {what}\n\ncommand: {}\ncwd: {}\n",
        command_line(cmd),
        cwd_of(cmd)
    )
}

/// Runs `cmd` to its end (stdin from /dev/null unless set) and returns its output, or an
/// error naming everything when it cannot start or does not exit 0.
pub fn try_run(cmd: &mut Command) -> Result<Output, CommandFailed> {
    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            return Err(CommandFailed {
                report: format!(
                    "{}\ncannot start it: {e}\n==========\n",
                    report(cmd, "not run")
                ),
                output: None,
            });
        }
    };
    if output.status.success() {
        return Ok(output);
    }
    Err(CommandFailed {
        report: format!(
            "{}\nstatus: {}\n\nstdout: {}\n\nstderr: {}\n==========\n",
            report(cmd, "expected success"),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        output: Some(output),
    })
}

/// [`try_run`], panicking with its report.
pub fn run(cmd: &mut Command) -> Output {
    try_run(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// A git command in `dir` with a fixed identity (as `-c` options and in the environment, for
/// the commits sortie itself makes under the test), `LC_ALL=C`, stdin from /dev/null.
fn git_command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("git");
    c.arg("-c")
        .arg(format!("user.name={GIT_NAME}"))
        .arg("-c")
        .arg(format!("user.email={GIT_EMAIL}"))
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", GIT_NAME)
        .env("GIT_AUTHOR_EMAIL", GIT_EMAIL)
        .env("GIT_COMMITTER_NAME", GIT_NAME)
        .env("GIT_COMMITTER_EMAIL", GIT_EMAIL)
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    c
}

/// Runs git in `dir` (see [`git`]); returns its stdout.
pub fn try_git(dir: &Path, args: &[&str]) -> Result<String, CommandFailed> {
    let out = try_run(&mut git_command(dir, args))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs git in `dir` with a fixed identity, panicking (with the whole report) when it fails;
/// returns its stdout as is.
pub fn git(dir: &Path, args: &[&str]) -> String {
    try_git(dir, args).unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_the_command_cwd_status_and_output() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo to-out; echo to-err >&2; exit 7", "it's"])
            .current_dir(dir.path());
        let e = try_run(&mut cmd).expect_err("exit 7 is a failure");
        let text = e.to_string();
        for part in [
            "command: sh -c 'echo to-out; echo to-err >&2; exit 7' 'it'\\''s'",
            &format!("cwd: {}", dir.path().display()),
            "status: exit status: 7",
            "stdout: to-out",
            "stderr: to-err",
        ] {
            assert!(text.contains(part), "{part:?} missing in {text}");
        }
        assert_eq!(e.output.and_then(|o| o.status.code()), Some(7));
    }

    #[test]
    fn a_command_that_cannot_start_says_why() {
        let e = try_run(&mut Command::new("sortie-testkit-no-such-program"))
            .expect_err("no such program");
        assert!(e.to_string().contains("cannot start it"), "{e}");
        assert!(e.output.is_none());
    }

    #[test]
    fn git_commits_with_its_identity_in_a_fresh_repository() {
        let dir = tempfile::tempdir().expect("tempdir");
        git(dir.path(), &["init", "-q", "-b", "main"]);
        std::fs::write(dir.path().join("f"), "x\n").expect("write");
        git(dir.path(), &["add", "f"]);
        git(dir.path(), &["commit", "-q", "-m", "one"]);
        let author = git(dir.path(), &["log", "-1", "--format=%an <%ae>|%cn"]);
        assert_eq!(author, "sortie-test <test@sortie.invalid>|sortie-test\n");
        let e = try_git(dir.path(), &["no-such-subcommand"]).expect_err("git fails");
        assert!(e.to_string().contains("command: git -c"), "{e}");
    }
}
