//! Taking over a run that no process owns: open its journal once the owner lock is ours, and
//! make sure no process of an attempt that was live survives before recording it orphaned.

use std::time::Duration;

use sortie_core::{Event, OrphanAction};

use super::Engine;
use crate::{Error, Result, process};

impl Engine {
    /// This run's incarnation (see `process::marker`).
    pub(super) fn incarnation(&self) -> u64 {
        self.state.started_at.map_or(0, |t| t.0)
    }

    /// Resume's first duty: no process of a live attempt may survive, whether or not its pid
    /// made it to the journal. Each live attempt is then recorded as orphaned.
    pub(super) async fn reap_orphans(&mut self) -> Result<()> {
        let plan = sortie_core::resume_plan(&self.state);
        let grace = Duration::from_secs(3);
        let survivor = |pid| Error::Survivor {
            pid,
            run: self.run_id.clone(),
        };
        let killed = process::kill_marked(&self.run_id, self.incarnation(), grace)
            .await
            .map_err(survivor)?;
        let mut events = Vec::new();
        // Attempts adopted before (#11: Slurm jobs still known to the cluster) are not orphans.
        for o in plan
            .orphans
            .iter()
            .filter(|o| !self.live.contains_key(&o.task))
        {
            let mut was_killed = killed.get(&(o.task, o.attempt)).copied().unwrap_or(false);
            if let (Some(pid), Some(st)) = (o.pid, o.start_time) {
                match process::kill_group_if_same(pid, st, grace).await {
                    process::KillResult::Killed => was_killed = true,
                    process::KillResult::Gone => {}
                    // Retrying while the old attempt still runs could do its work twice.
                    process::KillResult::Survived => return Err(survivor(pid)),
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
