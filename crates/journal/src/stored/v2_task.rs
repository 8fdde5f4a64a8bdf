//! Format v2's mirrors of the types of a task's fields added since v1 (its executor and Slurm
//! options, its permissions, its `needs_mode`), with their conversions both ways; the rules of
//! `v2.rs` hold here too (variants appended, never reordered).

use serde::{Deserialize, Serialize};
use sortie_core::{Executor, SlurmOptions};

use super::v2::Grow;

/// Mirrors `sortie_core::Executor` (#11).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ExecutorV2 {
    #[default]
    Local,
    Slurm(Grow<SlurmOptionsV2>),
    /// #36: appended.
    Ray(Grow<RayOptionsV2>),
}

/// Mirrors `sortie_core::RayOptions` (#36; amounts in thousandths).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RayOptionsV2 {
    address: Option<String>,
    num_cpus: Option<u64>,
    num_gpus: Option<u64>,
    memory: Option<u64>,
    resources: Vec<(String, u64)>,
    entrypoint_resources: Vec<(String, u64)>,
    runtime_env: Vec<(String, String)>,
}

fn milli_out(v: &[(String, sortie_core::Milli)]) -> Vec<(String, u64)> {
    v.iter().map(|(k, m)| (k.clone(), m.0)).collect()
}

fn milli_in(v: Vec<(String, u64)>) -> Vec<(String, sortie_core::Milli)> {
    v.into_iter()
        .map(|(k, m)| (k, sortie_core::Milli(m)))
        .collect()
}

/// Mirrors `sortie_core::SlurmOptions` (#11).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct SlurmOptionsV2 {
    partition: Option<String>,
    account: Option<String>,
    cpus: Option<u32>,
    mem_mb: Option<u64>,
    extra_args: Vec<String>,
}

impl From<&Executor> for ExecutorV2 {
    fn from(e: &Executor) -> Self {
        match e {
            Executor::Local => ExecutorV2::Local,
            Executor::Slurm(o) => ExecutorV2::Slurm(Grow(SlurmOptionsV2 {
                partition: o.partition.clone(),
                account: o.account.clone(),
                cpus: o.cpus,
                mem_mb: o.mem_mb,
                extra_args: o.extra_args.clone(),
            })),
            Executor::Ray(o) => ExecutorV2::Ray(Grow(RayOptionsV2 {
                address: o.address.clone(),
                num_cpus: o.num_cpus.map(|m| m.0),
                num_gpus: o.num_gpus.map(|m| m.0),
                memory: o.memory,
                resources: milli_out(&o.resources),
                entrypoint_resources: milli_out(&o.entrypoint_resources),
                runtime_env: o.runtime_env.clone(),
            })),
        }
    }
}

/// Mirrors `sortie_core::Permissions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum PermissionsV2 {
    ReadOnly,
    #[default]
    Edit,
    Full,
}

impl From<sortie_core::Permissions> for PermissionsV2 {
    fn from(p: sortie_core::Permissions) -> Self {
        match p {
            sortie_core::Permissions::ReadOnly => PermissionsV2::ReadOnly,
            sortie_core::Permissions::Edit => PermissionsV2::Edit,
            sortie_core::Permissions::Full => PermissionsV2::Full,
        }
    }
}

impl From<ExecutorV2> for Executor {
    fn from(e: ExecutorV2) -> Self {
        match e {
            ExecutorV2::Local => Executor::Local,
            ExecutorV2::Slurm(Grow(o)) => Executor::Slurm(SlurmOptions {
                partition: o.partition,
                account: o.account,
                cpus: o.cpus,
                mem_mb: o.mem_mb,
                extra_args: o.extra_args,
            }),
            ExecutorV2::Ray(Grow(o)) => Executor::Ray(sortie_core::RayOptions {
                address: o.address,
                num_cpus: o.num_cpus.map(sortie_core::Milli),
                num_gpus: o.num_gpus.map(sortie_core::Milli),
                memory: o.memory,
                resources: milli_in(o.resources),
                entrypoint_resources: milli_in(o.entrypoint_resources),
                runtime_env: o.runtime_env,
            }),
        }
    }
}

impl From<PermissionsV2> for sortie_core::Permissions {
    fn from(p: PermissionsV2) -> Self {
        match p {
            PermissionsV2::ReadOnly => sortie_core::Permissions::ReadOnly,
            PermissionsV2::Edit => sortie_core::Permissions::Edit,
            PermissionsV2::Full => sortie_core::Permissions::Full,
        }
    }
}

/// Mirrors `sortie_core::NeedsMode` (#33).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum NeedsModeV2 {
    #[default]
    Completed,
    Settled,
}

impl From<sortie_core::NeedsMode> for NeedsModeV2 {
    fn from(m: sortie_core::NeedsMode) -> Self {
        match m {
            sortie_core::NeedsMode::Completed => NeedsModeV2::Completed,
            sortie_core::NeedsMode::Settled => NeedsModeV2::Settled,
        }
    }
}

impl From<NeedsModeV2> for sortie_core::NeedsMode {
    fn from(m: NeedsModeV2) -> Self {
        match m {
            NeedsModeV2::Completed => sortie_core::NeedsMode::Completed,
            NeedsModeV2::Settled => sortie_core::NeedsMode::Settled,
        }
    }
}

/// Mirrors `sortie_core::sandbox::Sandbox` (#34).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum SandboxV2 {
    #[default]
    Off,
    Workspace,
}

impl From<sortie_core::sandbox::Sandbox> for SandboxV2 {
    fn from(m: sortie_core::sandbox::Sandbox) -> Self {
        match m {
            sortie_core::sandbox::Sandbox::Off => SandboxV2::Off,
            sortie_core::sandbox::Sandbox::Workspace => SandboxV2::Workspace,
        }
    }
}

impl From<SandboxV2> for sortie_core::sandbox::Sandbox {
    fn from(m: SandboxV2) -> Self {
        match m {
            SandboxV2::Off => sortie_core::sandbox::Sandbox::Off,
            SandboxV2::Workspace => sortie_core::sandbox::Sandbox::Workspace,
        }
    }
}
