//! What the tests that run a real agent CLI (`tests/e2e/real_*.rs`) share: their gate, after
//! rust-analyzer's `skip_slow_tests` (below), the CLIs' version checks and fake users
//! ([`clis`]), the loopback mock model servers ([`mock`]) and the attempt table ([`attempts`]).
//!
//! On a machine without the CLI a plain `cargo test` skips them, printing why, so that it is
//! green on a fresh checkout. Under CI (`CI` set, as `.ci/run` sets it) a missing CLI fails the
//! test as before, and every real-agent test that ran leaves a cookie, a file named after it
//! in `target/real-agent-tests/`, holding the time it ran: CI can list that directory to prove
//! they ran rather than skipped.

#![allow(
    clippy::disallowed_methods,
    reason = "the gate asks the CLIs their version"
)]

pub mod attempts;
pub mod clis;
pub mod mock;

use std::path::PathBuf;
use std::process::{Command, Stdio};

pub use attempts::{Attempt, attempts};
pub use clis::{
    CLAUDE_VERSION, CODEX_VERSION, PI_VARS, PI_VERSION, claude_found, cli_found, codex_found,
    codex_user, pi_found, pi_user,
};
pub use mock::{ANSWER, MockServer};

/// The cookie directory's name, under the target directory.
pub const COOKIE_DIR: &str = "real-agent-tests";

/// Whether `CI` is set (to anything but empty, `0` or `false`).
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// Whether the real-agent test `test` runs. `found` says whether the CLI it needs is there
/// (`Err` holds why not, with how to install it).
///
/// - Found: prints that the test runs, writes its cookie, returns true.
/// - Missing, outside CI: prints that the test is skipped and why, returns false (the caller
///   returns at once, passing).
/// - Missing, under CI: panics with the reason.
pub fn should_run(test: &str, found: Result<(), String>) -> bool {
    decide(test, found, under_ci(), &cookie_dir())
}

fn decide(test: &str, found: Result<(), String>, ci: bool, cookies: &std::path::Path) -> bool {
    match found {
        Ok(()) => {
            let cookie = cookies.join(test);
            let written = std::fs::create_dir_all(cookies)
                .and_then(|()| std::fs::write(&cookie, format!("{}\n", now_secs())));
            match written {
                Ok(()) => eprintln!(
                    "real-agent test {test}: the CLI is installed, it runs (cookie {})",
                    cookie.display()
                ),
                Err(e) => eprintln!(
                    "real-agent test {test}: the CLI is installed, it runs (no cookie: cannot \
                     write {}: {e})",
                    cookie.display()
                ),
            }
            true
        }
        Err(why) if ci => panic!("real-agent test {test} cannot run under CI: {why}"),
        Err(why) => {
            eprintln!(
                "real-agent test {test}: SKIPPED (passes without checking anything): {why}\n\
                 (with CI set, this fails instead)"
            );
            false
        }
    }
}

/// What `program ARGS` prints (stdout, stderr; trimmed), with `envs` set and stdin from
/// /dev/null, or why it cannot run: for the version checks of [`should_run`]'s callers.
pub fn output_of(
    program: &str,
    args: &[&str],
    envs: &[(&str, &str)],
) -> Result<(String, String), String> {
    let out = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("`{program}` is not runnable ({e})"))?;
    Ok((
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    ))
}

/// Whether `python3` runs (the mock model servers of the real-agent tests need it).
pub fn python3_found() -> Result<(), String> {
    output_of("python3", &["--version"], &[])
        .map(drop)
        .map_err(|e| format!("{e}; the mock model server needs python3"))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// `<target>/real-agent-tests`: the target directory is found from the test binary's path
/// (`<target>/<profile>/deps/<test>`), so that `CARGO_TARGET_DIR` is followed; a temp dir when
/// the binary is elsewhere.
pub fn cookie_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let deps = exe.parent()?;
            (deps.file_name()? == "deps")
                .then(|| deps.parent()?.parent().map(|t| t.join(COOKIE_DIR)))?
        })
        .unwrap_or_else(|| std::env::temp_dir().join(format!("sortie-{COOKIE_DIR}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_found_cli_runs_and_leaves_a_cookie() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cookies = dir.path().join("cookies");
        assert!(decide("real_x", Ok(()), false, &cookies));
        assert!(decide("real_y", Ok(()), true, &cookies));
        let mut names: Vec<String> = std::fs::read_dir(&cookies)
            .expect("the cookie dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["real_x", "real_y"]);
    }

    #[test]
    fn a_missing_cli_skips_outside_ci_and_leaves_no_cookie() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!decide("real_x", Err("no x".into()), false, dir.path()));
        assert!(!dir.path().join("real_x").exists());
    }

    #[test]
    fn a_missing_cli_fails_under_ci() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_owned();
        let panic =
            std::panic::catch_unwind(move || decide("real_x", Err("no x".into()), true, &path))
                .expect_err("under CI a missing CLI fails");
        let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("real_x") && text.contains("no x"), "{text}");
    }

    #[test]
    fn output_of_says_what_a_program_printed_or_why_it_cannot_run() {
        assert_eq!(
            output_of("sh", &["-c", "echo \"$V\"; echo e >&2"], &[("V", "out")]),
            Ok(("out".to_owned(), "e".to_owned()))
        );
        let e = output_of("sortie-testkit-no-such-cli", &[], &[]).expect_err("missing");
        assert!(
            e.contains("sortie-testkit-no-such-cli` is not runnable"),
            "{e}"
        );
    }

    #[test]
    fn the_cookie_dir_is_under_the_target_dir_of_the_test_binary() {
        // This very test runs from `<target>/debug/deps/sortie_testkit-...`.
        let dir = cookie_dir();
        assert_eq!(dir.file_name().and_then(|n| n.to_str()), Some(COOKIE_DIR));
        let exe = std::env::current_exe().expect("current exe");
        let target = exe
            .parent()
            .and_then(|d| d.parent())
            .and_then(|d| d.parent());
        assert_eq!(dir.parent(), target);
    }
}
