//! The marker every attempt's process carries in its environment,
//! `SORTIE_ATTEMPT=<run>/<task>/<attempt>/<incarnation>`, so that resume finds a crashed run's
//! children (and their children, who inherit it) even when their pid never reached the
//! journal. The incarnation (the run's start time in ms, in hex) tells apart runs of the same
//! id in other state dirs, which are left alone; a marker without it counts as this run's.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sortie_core::{Attempt, RunId, TaskId};

use super::orphan::{KillResult, kill_group_if_same};
use super::procfs::find_marked;

/// The environment variable of the marker.
pub const MARKER: &str = "SORTIE_ATTEMPT";

/// The supervisor's own marker variable: it carries its attempt's marker value under this name
/// (so that resume finds a supervisor too), and gives the agent the attempt's marker
/// ([`MARKER`]) instead.
pub const SUPERVISOR_MARKER: &str = "SORTIE_SUPERVISOR";

/// The marker (name, value) of attempt `attempt` of `task` in run `run`'s `incarnation`.
pub fn marker(run: &RunId, task: TaskId, attempt: Attempt, incarnation: u64) -> (String, String) {
    (
        MARKER.to_owned(),
        format!("{run}/{}/{}/{incarnation:x}", task.0, attempt.0),
    )
}

/// Reads a marker value of run `run`: task, attempt, and the incarnation when present.
fn parse(value: &str, run: &RunId) -> Option<(TaskId, Attempt, Option<u64>)> {
    let rest = value.strip_prefix(run.as_str())?.strip_prefix('/')?;
    let mut parts = rest.split('/');
    let task = parts.next()?.parse().ok()?;
    let attempt = parts.next()?.parse().ok()?;
    let incarnation = match parts.next() {
        Some(i) => Some(u64::from_str_radix(i, 16).ok()?),
        None => None,
    };
    Some((TaskId(task), Attempt(attempt), incarnation))
}

/// Kills every live process marked as run `run`'s in `incarnation` (and its group: TERM,
/// `grace`, KILL), except those of the attempts in `spare` (adopted: they run on). Returns,
/// per attempt, whether one of its processes was still running, or the pid of one that
/// survived SIGKILL.
pub async fn kill_marked(
    run: &RunId,
    incarnation: u64,
    grace: Duration,
    spare: &HashSet<(TaskId, Attempt)>,
) -> Result<HashMap<(TaskId, Attempt), bool>, u32> {
    let mut killed: HashMap<(TaskId, Attempt), bool> = HashMap::new();
    // Supervisors first (their value is `SORTIE_ATTEMPT=<marker>`): one killed after its
    // agent could record the agent's end after resume decided it was gone.
    let prefix = format!("{run}/");
    let mut marked: Vec<_> = find_marked(SUPERVISOR_MARKER, &format!("{MARKER}={prefix}"))
        .into_iter()
        .map(|mut m| {
            m.marker_value = m
                .marker_value
                .strip_prefix(&format!("{MARKER}="))
                .unwrap_or_default()
                .to_owned();
            m
        })
        .collect();
    marked.extend(find_marked(MARKER, &prefix));
    for m in marked {
        let key = parse(&m.marker_value, run);
        if let Some((_, _, Some(other))) = key
            && other != incarnation
        {
            continue;
        }
        if let Some((task, attempt, _)) = key
            && spare.contains(&(task, attempt))
        {
            continue;
        }
        let r = kill_group_if_same(m.pid, m.start_time, grace).await;
        if r == KillResult::Survived {
            return Err(m.pid);
        }
        if let Some((task, attempt, _)) = key {
            *killed.entry((task, attempt)).or_default() |= r == KillResult::Killed;
        }
    }
    Ok(killed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_of_this_run_only() {
        let run = RunId::new("r1").expect("valid id");
        let (_, value) = marker(&run, TaskId(3), Attempt(2), 255);
        assert_eq!(value, "r1/3/2/ff");
        assert_eq!(
            parse(&value, &run),
            Some((TaskId(3), Attempt(2), Some(255)))
        );
        assert_eq!(parse("r1/3/2", &run), Some((TaskId(3), Attempt(2), None)));
        assert_eq!(parse("r10/3/2", &run), None);
        assert_eq!(parse("r1/x/2", &run), None);
        assert_eq!(parse("r1/3/2/zz", &run), None);
    }
}
