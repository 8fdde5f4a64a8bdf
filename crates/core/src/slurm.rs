//! Where an attempt runs: on this machine, or as one job of a Slurm cluster, with the job's
//! `[slurm]` options (pure data: the runner builds `sbatch`'s arguments from them), or (#36) as
//! one job of a Ray cluster, with its `[ray]` options.

use serde::{Deserialize, Serialize};

/// Where a task's attempts run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorKind {
    /// A child process of sortie on this machine.
    #[default]
    Local,
    /// One `sbatch` job per attempt on a Slurm cluster.
    Slurm,
    /// #36: one job per attempt through a Ray cluster's job API.
    Ray,
}

impl ExecutorKind {
    /// Every executor's name, as batch files and the command line spell it.
    pub const NAMES: &[&str] = &["local", "slurm", "ray"];

    /// The name used in batch files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorKind::Local => "local",
            ExecutorKind::Slurm => "slurm",
            ExecutorKind::Ray => "ray",
        }
    }

    /// The executor named `name` (`local`, `slurm`, `ray`).
    pub fn parse(name: &str) -> Option<ExecutorKind> {
        match name {
            "local" => Some(ExecutorKind::Local),
            "slurm" => Some(ExecutorKind::Slurm),
            "ray" => Some(ExecutorKind::Ray),
            _ => None,
        }
    }
}

/// Where a task's attempts run, with the executor's options.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Executor {
    /// A child process of sortie on this machine.
    #[default]
    Local,
    /// One `sbatch` job per attempt, with these options.
    Slurm(SlurmOptions),
    /// #36: one Ray job per attempt, with these options.
    Ray(RayOptions),
}

impl Executor {
    /// Which executor this is.
    pub fn kind(&self) -> ExecutorKind {
        match self {
            Executor::Local => ExecutorKind::Local,
            Executor::Slurm(_) => ExecutorKind::Slurm,
            Executor::Ray(_) => ExecutorKind::Ray,
        }
    }
}

/// A task's `[slurm]` options; every one is optional (the cluster's defaults apply).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct SlurmOptions {
    /// `--partition`.
    pub partition: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// `--cpus-per-task`.
    pub cpus: Option<u32>,
    /// `--mem`, in megabytes.
    pub mem_mb: Option<u64>,
    /// More `sbatch` arguments, passed as they are, after the options above.
    pub extra_args: Vec<String>,
}

impl SlurmOptions {
    /// The arguments sortie sets itself, which `extra_args` may not override: the job's name
    /// and comment find it again, `--no-requeue` keeps sortie the only retry loop, and the
    /// output files are the ones sortie follows.
    pub const RESERVED: [&'static str; 10] = [
        "--job-name",
        "-J",
        "--comment",
        "--requeue",
        "--no-requeue",
        "--output",
        "-o",
        "--error",
        "-e",
        "--wrap",
    ];

    /// The first of `extra_args` that sortie sets itself, when one is.
    pub fn reserved_extra_arg(&self) -> Option<&str> {
        self.extra_args.iter().map(String::as_str).find(|a| {
            let flag = a.split('=').next().unwrap_or(a);
            Self::RESERVED.contains(&flag)
                || (flag.len() > 2 && ["-J", "-o", "-e"].iter().any(|s| flag.starts_with(s)))
        })
    }
}

/// #36: an amount of a Ray resource in thousandths (Ray takes fractions: half a GPU), kept
/// exact so that options compare and hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Milli(pub u64);

impl Milli {
    /// The amount as Ray's JSON takes it.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

/// #36: a task's `[ray]` options; every one is optional (the cluster's defaults apply).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct RayOptions {
    /// The job API's address (`http://host:8265`); None: `RAY_ADDRESS`, else
    /// [`RayOptions::DEFAULT_ADDRESS`].
    pub address: Option<String>,
    /// `entrypoint_num_cpus`.
    pub num_cpus: Option<Milli>,
    /// `entrypoint_num_gpus`.
    pub num_gpus: Option<Milli>,
    /// `entrypoint_memory`, in bytes.
    pub memory: Option<u64>,
    /// Custom resources the attempt needs (`entrypoint_resources`), by name.
    pub resources: Vec<(String, Milli)>,
    /// More of `entrypoint_resources`, Ray's own name for them (merged with `resources`; a name
    /// in both takes this one's amount).
    pub entrypoint_resources: Vec<(String, Milli)>,
    /// The job's `runtime_env.env_vars` (no uploads: the working directory must be on a
    /// filesystem the cluster shares).
    pub runtime_env: Vec<(String, String)>,
}

impl RayOptions {
    /// The address when neither the options nor `RAY_ADDRESS` give one.
    pub const DEFAULT_ADDRESS: &'static str = "http://127.0.0.1:8265";

    /// The custom resources of the entrypoint: `resources`, then `entrypoint_resources` over
    /// them.
    pub fn all_resources(&self) -> Vec<(String, Milli)> {
        let mut out: Vec<(String, Milli)> = Vec::new();
        for (k, v) in self.resources.iter().chain(&self.entrypoint_resources) {
            match out.iter_mut().find(|(n, _)| n == k) {
                Some(slot) => slot.1 = *v,
                None => out.push((k.clone(), *v)),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executor_names_round_trip() {
        for kind in [ExecutorKind::Local, ExecutorKind::Slurm, ExecutorKind::Ray] {
            assert_eq!(ExecutorKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(ExecutorKind::parse("kubernetes"), None);
        let names: Vec<_> = [ExecutorKind::Local, ExecutorKind::Slurm, ExecutorKind::Ray]
            .map(ExecutorKind::as_str)
            .to_vec();
        assert_eq!(names, ExecutorKind::NAMES);
    }

    #[test]
    fn reserved_extra_args_are_found_in_every_spelling() {
        let with = |a: &str| SlurmOptions {
            extra_args: vec!["--qos=high".into(), a.into()],
            ..SlurmOptions::default()
        };
        for a in [
            "--job-name=x",
            "-J",
            "-Jx",
            "--requeue",
            "--output=/tmp/o",
            "-o/tmp",
        ] {
            assert_eq!(with(a).reserved_extra_arg(), Some(a), "{a}");
        }
        assert_eq!(with("--gres=gpu:1").reserved_extra_arg(), None);
        assert_eq!(with("--exclusive").reserved_extra_arg(), None);
    }
}
