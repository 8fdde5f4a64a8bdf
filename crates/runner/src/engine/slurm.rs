//! The Slurm executor's place in the engine (#11): a task's executor from its spec, and the
//! executor of a journaled placement, both sharing the run's one [`Cluster`] (its one status
//! poller). Resume finds a Slurm attempt like any other (`resume.rs`, through the seam's
//! `find`): by its job's name, so that a job still pending or running is adopted, one that
//! ended while sortie was down is recorded, one written but never submitted is submitted once
//! under the same name, and one Slurm knows nothing of is orphaned.

use std::sync::Arc;
use std::time::Duration;

use sortie_core::{TaskId, TaskSpec, Timestamp};

use super::Engine;
use crate::executor::slurm::{Cluster, SLURM, Slurm};
use crate::executor::{self, Executor};

impl Engine {
    /// The run's cluster, made at its first use.
    fn cluster(&self) -> Arc<Cluster> {
        Arc::clone(
            self.slurm
                .get_or_init(|| Cluster::new(self.run_id.clone(), self.incarnation())),
        )
    }

    /// A Slurm executor for `spec`'s attempts, when its executor is Slurm: Slurm stops its jobs
    /// after the attempt timeout (or what is left of the deadline, when sooner), its kill grace
    /// and a minute more, even when sortie is not there to.
    pub(super) fn slurm_executor(
        &self,
        spec: &TaskSpec,
        deadline_at: Option<Timestamp>,
    ) -> Option<Arc<dyn Executor>> {
        let sortie_core::Executor::Slurm(options) = &spec.executor else {
            return None;
        };
        let left = deadline_at.map(|d| d.since(crate::clock::now()));
        let limit = left.map_or(spec.attempt_timeout, |l| l.min(spec.attempt_timeout));
        let limit = limit + spec.kill_grace + Duration::from_secs(60);
        Some(Arc::new(Slurm::new(
            self.cluster(),
            options.clone(),
            &spec.label,
            Some(limit),
        )))
    }

    /// The executor of a journaled placement's `kind` for `task`: Slurm's with the task's
    /// options, else the seam's `by_kind`.
    pub(super) fn executor_of(&self, kind: &str, task: TaskId) -> Option<Arc<dyn Executor>> {
        if kind == SLURM {
            let spec = self.state.spec(task)?;
            let deadline_at = self.state.task(task)?.deadline_at(spec);
            // A placement of a task whose spec is no longer Slurm's: still followed on Slurm.
            return self.slurm_executor(spec, deadline_at).or_else(|| {
                Some(Arc::new(Slurm::new(
                    self.cluster(),
                    sortie_core::SlurmOptions::default(),
                    &spec.label,
                    None,
                )))
            });
        }
        executor::by_kind(kind)
    }
}
