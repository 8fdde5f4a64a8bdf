//! Where an attempt runs: on this machine, or as one job of a Slurm cluster, with the job's
//! `[slurm]` options (pure data: the runner builds `sbatch`'s arguments from them).

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
}

impl ExecutorKind {
    /// Every executor's name, as batch files and the command line spell it.
    pub const NAMES: &[&str] = &["local", "slurm"];

    /// The name used in batch files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorKind::Local => "local",
            ExecutorKind::Slurm => "slurm",
        }
    }

    /// The executor named `name` (`local`, `slurm`).
    pub fn parse(name: &str) -> Option<ExecutorKind> {
        match name {
            "local" => Some(ExecutorKind::Local),
            "slurm" => Some(ExecutorKind::Slurm),
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
}

impl Executor {
    /// Which executor this is.
    pub fn kind(&self) -> ExecutorKind {
        match self {
            Executor::Local => ExecutorKind::Local,
            Executor::Slurm(_) => ExecutorKind::Slurm,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executor_names_round_trip() {
        for kind in [ExecutorKind::Local, ExecutorKind::Slurm] {
            assert_eq!(ExecutorKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(ExecutorKind::parse("kubernetes"), None);
        let names: Vec<_> = [ExecutorKind::Local, ExecutorKind::Slurm]
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
