//! Resume of a run's Slurm attempts (#11): before anything is recorded orphaned, the attempts
//! that were live when the last owner died are looked for on the cluster by their jobs' names,
//! all in one query. A job still pending or running is adopted (followed from its files as if
//! this process had submitted it, its clocks re-armed from the journaled launch); one that
//! ended while sortie was down is followed to its end and recorded from its files and Slurm's
//! state, not run again; one written but never submitted (a crash between the journal and
//! `sbatch`) is submitted once, under the same name. Only those Slurm knows nothing of are
//! left to be recorded orphaned, and retried.

use sortie_core::Executor as ExecutorSpec;

use super::Engine;
use crate::Result;
use crate::attempt;
use crate::executor::{Adoption, Presence, Started};

impl Engine {
    /// Adopts the live attempts of Slurm tasks that Slurm still knows (see the module doc).
    pub(super) async fn adopt_slurm_jobs(&mut self) -> Result<()> {
        let plan = sortie_core::resume_plan(&self.state);
        let mut found = Vec::new();
        for o in &plan.orphans {
            let is_slurm = self
                .state
                .spec(o.task)
                .is_some_and(|s| matches!(s.executor, ExecutorSpec::Slurm(_)));
            if !is_slurm {
                continue;
            }
            let Some((ctx, _)) = self.attempt_ctx(o.task) else {
                continue;
            };
            let started = o
                .pid
                .zip(o.start_time)
                .map(|(pid, start_time)| Started { pid, start_time });
            let adoption = Adoption {
                placement: ctx.placement.clone(),
                started,
            };
            found.push((ctx, adoption));
        }
        let Some((first, _)) = found.first() else {
            return Ok(());
        };
        // One query for all of them: every Slurm attempt of the run shares its cluster.
        let executor = std::sync::Arc::clone(&first.executor);
        let adoptions: Vec<Adoption> = found.iter().map(|(_, a)| a.clone()).collect();
        let presences = executor.poll(&adoptions).await;
        for ((mut ctx, adoption), presence) in found.into_iter().zip(presences) {
            let task = ctx.task;
            match presence {
                Presence::Alive | Presence::Ended(_) => {
                    tracing::debug!("adopting attempt {} of task {task}", ctx.attempt);
                    ctx.adopt = Some(adoption);
                    let handle = attempt::start(ctx, self.tx.clone());
                    self.live.insert(task, handle);
                }
                Presence::Gone => {}
            }
        }
        Ok(())
    }
}
