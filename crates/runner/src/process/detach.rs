//! Processes sortie starts to outlive the command that started them: a detached run (`sortie
//! run --detach`: this same binary, in its own process group, its output in a log file) and a
//! user's hook (`--on-task-end CMD`, through `sh -c`, reaped by a thread, never waited for by
//! the run).

use std::fs::File;
use std::path::Path;
use std::process::Stdio;

/// Starts this program again with `args`, in its own process group (a Ctrl-C in the terminal
/// does not reach it), stdin `/dev/null`, stdout and stderr appended to `log` (0600, in
/// directories made 0700). Returns its pid;
/// the caller does not wait for it. `env_key=env_value` is added to its environment.
#[allow(
    clippy::disallowed_methods,
    reason = "the detached run is spawned here"
)]
pub fn spawn_detached_with(
    args: &[String],
    log: &Path,
    env_key: &str,
    env_value: &str,
) -> std::io::Result<std::process::Child> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    // The log holds every task's output: private to the user, as the state dir is (a missing
    // state dir is made here, 0700, as `run` makes it).
    if let Some(dir) = log.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let out = File::options()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)?;
    out.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    let err = out.try_clone()?;
    std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .env(env_key, env_value)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
}

/// Runs a user's hook `command` through `sh -c` with `env` added, stdin `/dev/null`, its output
/// sortie's own; a thread reaps it. A hook that cannot start is a warning, never the run's
/// failure.
pub fn run_hook(command: &str, env: &[(String, String)]) {
    run_hook_in(command, env, None);
}

/// [`run_hook`] in `cwd` (#15: a batch file's `on_task_end` runs in the task's `cwd`; `None`:
/// sortie's own).
#[allow(clippy::disallowed_methods, reason = "the user's hook is spawned here")]
pub fn run_hook_in(command: &str, env: &[(String, String)], cwd: Option<&std::path::Path>) {
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let spawned = cmd.spawn();
    match spawned {
        Ok(mut child) => {
            let _ = std::thread::Builder::new()
                .name("sortie-hook".into())
                .spawn(move || match child.wait() {
                    Ok(s) if !s.success() => tracing::warn!("the task-end hook exited {s}"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("cannot wait for the task-end hook: {e}"),
                });
        }
        Err(e) => tracing::warn!("cannot run the task-end hook `{command}`: {e}"),
    }
}

/// #35: opens `url` in the user's browser (`xdg-open`, or `open` on macOS), not waited for
/// (a thread reaps it).
#[allow(
    clippy::disallowed_methods,
    reason = "the user's browser is started here"
)]
pub fn open_url(url: &str) -> std::io::Result<()> {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let mut child = std::process::Command::new(opener)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    std::thread::spawn(move || child.wait());
    Ok(())
}
