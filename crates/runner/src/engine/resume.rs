//! Taking over a run that no process owns: open its journal once the owner lock is ours, and
//! make sure no process of an attempt that was live survives before recording it orphaned.

use std::collections::HashMap;
use std::time::Duration;

use sortie_core::{Attempt, Event, OrphanAction, RunId, TaskId};

use super::Engine;
use super::launch::MARKER;
use crate::{Error, Result, process};

impl Engine {
    /// This run's incarnation (see [`MARKER`]).
    pub(super) fn incarnation(&self) -> u64 {
        self.state.started_at.map_or(0, |t| t.0)
    }

    /// Resume's first duty: no process of a live attempt may survive, whether or not its pid
    /// made it to the journal. Each live attempt is then recorded as orphaned.
    pub(super) async fn reap_orphans(&mut self) -> Result<()> {
        let plan = sortie_core::resume_plan(&self.state);
        let prefix = format!("{}/", self.run_id);
        let marked = process::find_marked(MARKER, &prefix);
        let grace = Duration::from_secs(3);
        let mut killed: HashMap<(TaskId, Attempt), bool> = HashMap::new();
        for m in &marked {
            let key = parse_marker(&m.marker_value, &self.run_id);
            if let Some((_, _, Some(other))) = key
                && other != self.incarnation()
            {
                continue;
            }
            let r = process::kill_group_if_same(m.pid, m.start_time, grace).await;
            if r == process::KillResult::Survived {
                return Err(Error::Survivor {
                    pid: m.pid,
                    run: self.run_id.clone(),
                });
            }
            if let Some((task, attempt, _)) = key {
                *killed.entry((task, attempt)).or_default() |= r == process::KillResult::Killed;
            }
        }
        let mut events = Vec::new();
        for o in &plan.orphans {
            let mut was_killed = killed.get(&(o.task, o.attempt)).copied().unwrap_or(false);
            if let (Some(pid), Some(st)) = (o.pid, o.start_time) {
                match process::kill_group_if_same(pid, st, grace).await {
                    process::KillResult::Killed => was_killed = true,
                    process::KillResult::Gone => {}
                    // Retrying while the old attempt still runs could do its work twice.
                    process::KillResult::Survived => {
                        return Err(Error::Survivor {
                            pid,
                            run: self.run_id.clone(),
                        });
                    }
                }
            }
            let action = if was_killed {
                OrphanAction::Killed
            } else {
                OrphanAction::Gone
            };
            events.push(Event::AttemptOrphaned {
                task: o.task,
                attempt: o.attempt,
                action,
            });
        }
        self.commit(events)
    }
}

/// Reads a [`MARKER`] value of run `run`: task, attempt, and the incarnation when present.
fn parse_marker(value: &str, run: &RunId) -> Option<(TaskId, Attempt, Option<u64>)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_of_this_run_only() {
        let run = RunId::new("r1").expect("valid id");
        assert_eq!(
            parse_marker("r1/3/2/ff", &run),
            Some((TaskId(3), Attempt(2), Some(255)))
        );
        assert_eq!(
            parse_marker("r1/3/2", &run),
            Some((TaskId(3), Attempt(2), None))
        );
        assert_eq!(parse_marker("r10/3/2", &run), None);
        assert_eq!(parse_marker("r1/x/2", &run), None);
        assert_eq!(parse_marker("r1/3/2/zz", &run), None);
    }
}
