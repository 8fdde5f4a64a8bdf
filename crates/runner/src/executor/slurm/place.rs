//! The Slurm executor of a task (#11): from its spec, or from a journaled placement, both sharing
//! the run's one [`Cluster`] (its one status poller). Resume finds a Slurm attempt like any
//! other (through the seam's `poll`, all of a run's jobs at once): by its job's name, so that a
//! job still pending or running is adopted, one that ended while sortie was down is recorded,
//! one written but never submitted is submitted once under the same name, and one Slurm knows
//! nothing of is orphaned.

use std::sync::Arc;
use std::time::Duration;

use sortie_core::{SlurmOptions, TaskSpec};

use super::{Cluster, Slurm};
use crate::executor::{Choice, Executor};

/// The run's cluster, made at its first use.
fn cluster(choice: &Choice<'_>) -> Arc<Cluster> {
    Arc::clone(
        choice
            .shared
            .slurm
            .get_or_init(|| Cluster::new(choice.run.clone(), choice.incarnation)),
    )
}

/// A Slurm executor for `spec`'s attempts with `options`: Slurm stops its jobs after the
/// attempt timeout (or what is left of the deadline, when sooner), its kill grace and a minute
/// more, even when sortie is not there to.
pub(in crate::executor) fn for_spec(
    spec: &TaskSpec,
    options: &SlurmOptions,
    choice: &Choice<'_>,
) -> Arc<dyn Executor> {
    let left = choice.deadline_at.map(|d| d.since(crate::clock::now()));
    let limit = left.map_or(spec.attempt_timeout, |l| l.min(spec.attempt_timeout));
    let limit = limit + spec.kill_grace + Duration::from_secs(60);
    Arc::new(Slurm::new(
        cluster(choice),
        options.clone(),
        &spec.label,
        Some(limit),
    ))
}

/// The executor of a journaled Slurm placement of a task with `spec`: with the task's options,
/// or, for a task whose spec is no longer Slurm's, still followed on Slurm with the defaults.
pub(in crate::executor) fn for_placement(
    spec: &TaskSpec,
    choice: &Choice<'_>,
) -> Arc<dyn Executor> {
    match &spec.executor {
        sortie_core::Executor::Slurm(options) => for_spec(spec, options, choice),
        _ => Arc::new(Slurm::new(
            cluster(choice),
            SlurmOptions::default(),
            &spec.label,
            None,
        )),
    }
}
