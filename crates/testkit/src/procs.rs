//! Processes of a run, found by the environment marker sortie gives every attempt
//! (`SORTIE_ATTEMPT=<run>/<task>/<attempt>/...`, read from `/proc/<pid>/environ`).
//!
//! The product has its own scan (`sortie_runner::process::find_marked`); the tests keep this
//! one so that they do not check the product with the product's code.

/// The environment variable that marks an attempt's processes (the runner's `MARKER`).
pub const MARKER: &str = "SORTIE_ATTEMPT";

/// A live process carrying a run's marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marked {
    /// Its pid.
    pub pid: u32,
    /// The (task, attempt) its marker names, when the marker parses.
    pub attempt: Option<(u64, u64)>,
}

/// Live (not zombie) processes whose environment marks them as attempts of `run`.
pub fn marked_processes(run: &str) -> Vec<Marked> {
    scan(&format!("{MARKER}={run}/"))
}

/// The variable that marks an attempt's supervisor (the runner's `SUPERVISOR_MARKER`): its
/// value is the attempt's own marker, `SORTIE_ATTEMPT=<run>/<task>/<attempt>/...`.
pub const SUPERVISOR_MARKER: &str = "SORTIE_SUPERVISOR";

/// Live supervisors of `run`'s attempts (see [`SUPERVISOR_MARKER`]), and its shepherds (see
/// [`SHEPHERD_MARKER`]; their `attempt` is None).
pub fn supervisors_of(run: &str) -> Vec<Marked> {
    let mut found = scan(&format!("{SUPERVISOR_MARKER}={MARKER}={run}/"));
    found.extend(shepherds_of(run));
    found
}

/// The variable that marks a run's shepherd (the runner's `SHEPHERD_MARKER`): its value is
/// `<run>/<incarnation>`.
pub const SHEPHERD_MARKER: &str = "SORTIE_SHEPHERD";

/// Live shepherds of `run` (see [`SHEPHERD_MARKER`]).
pub fn shepherds_of(run: &str) -> Vec<Marked> {
    scan(&format!("{SHEPHERD_MARKER}={run}/"))
        .into_iter()
        .map(|m| Marked { attempt: None, ..m })
        .collect()
}

/// Every live process of `run`: its attempts' processes and their supervisors.
pub fn all_processes_of(run: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = marked_processes(run)
        .into_iter()
        .chain(supervisors_of(run))
        .map(|m| m.pid)
        .collect();
    pids.sort_unstable();
    pids
}

/// Live (not zombie) processes with an environment entry starting with `needle`.
fn scan(needle: &str) -> Vec<Marked> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // Zombies have no environment left to read and are not alive in any useful sense.
        if state_and_parent(pid).is_some_and(|(state, _)| state == "Z") {
            continue;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if let Some(rest) = env
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(needle.as_bytes()))
        {
            found.push(Marked {
                pid,
                attempt: task_attempt(&String::from_utf8_lossy(rest)),
            });
        }
    }
    found
}

/// Children of `parent` that ended and were not reaped (zombies, `<defunct>` in `ps`).
pub fn zombie_children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parent = parent.to_string();
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| state_and_parent(*pid).is_some_and(|(s, p)| s == "Z" && p == parent))
        .collect()
}

/// A process's state letter and parent pid, from `/proc/<pid>/stat` (`pid (comm) state ppid
/// ...`: read after the command's last closing parenthesis, since a command may hold any).
fn state_and_parent(pid: u32) -> Option<(String, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
}

/// Pids of live processes whose environment marks them as attempts of `run`.
pub fn live_processes_of(run: &str) -> Vec<u32> {
    marked_processes(run).into_iter().map(|m| m.pid).collect()
}

/// `<task>/<attempt>/...` as numbers.
fn task_attempt(rest: &str) -> Option<(u64, u64)> {
    let mut parts = rest.split('/');
    let task = parts.next()?.parse().ok()?;
    let attempt = parts.next()?.parse().ok()?;
    Some((task, attempt))
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::disallowed_methods,
        reason = "the test starts a marked `sleep`"
    )]

    use super::*;

    #[test]
    fn a_marked_child_is_found_with_its_attempt_and_others_are_not() {
        let run = crate::unique_run("procs");
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .env(MARKER, format!("{run}/3/2/nonce"))
            .spawn()
            .expect("spawn sleep");
        let found = marked_processes(&run);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            found,
            [Marked {
                pid: child.id(),
                attempt: Some((3, 2))
            }]
        );
        assert!(marked_processes(&format!("{run}-other")).is_empty());
        assert!(live_processes_of(&run).is_empty(), "killed and reaped");
    }

    #[test]
    fn the_marker_value_parses_leniently() {
        assert_eq!(task_attempt("1/2/x"), Some((1, 2)));
        assert_eq!(task_attempt("1/2"), Some((1, 2)));
        assert_eq!(task_attempt("1"), None);
        assert_eq!(task_attempt("a/2"), None);
    }
}

/// Kills every process of a run (its attempts, their supervisors, its shepherds) when dropped:
/// a test that SIGKILLs sortie and fails before its resume leaves nothing behind.
#[derive(Debug)]
pub struct KillOnDrop(pub String);

impl Drop for KillOnDrop {
    #[allow(clippy::disallowed_methods, reason = "the test kit runs `kill`")]
    fn drop(&mut self) {
        let pids = all_processes_of(&self.0)
            .into_iter()
            .chain(shepherds_of(&self.0).into_iter().map(|m| m.pid));
        for pid in pids {
            // `kill` from procps: the testkit has no signal crate, and a test's cleanup may
            // fail silently (the process may be gone already).
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}
