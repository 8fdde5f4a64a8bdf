//! sortie-batch: loading a batch: a TOML file, a JSON Lines file (with an optional defaults
//! file), or a one-off prompt or command, resolved into a [`sortie_core::Batch`] (defaults
//! applied, paths absolute) plus the environment values that must never reach the journal.
//!
//! Every problem names the file, the 1-based line and the field, and all the problems found are
//! reported together ([`BatchError::Invalid`]): a batch with any problem never runs.
//!
//! How lines are found. TOML is parsed into a small value tree whose keys carry their spans
//! (`toml::Spanned`), so every key knows its line; a task's own line is its `[[tasks]]` header
//! (the first of its keys when the tasks are written as an inline array). In JSON Lines every
//! field of a task is on the task's line. A JSON defaults file's issues carry no line (a TOML
//! one's do). Core's `validate_batch` names a task and a field; the field is found in the layer
//! that gave it (the task, `[defaults]`, a flag), the same order resolution takes it in.
//!
//! Precedence, lowest first: the built-in defaults, the file's `[defaults]`, the command-line
//! flags `--agent` and `--model` (a flag is a default: it never beats a task's own field), the
//! task's own fields. The `concurrency` and `fail_fast` flags override the file's run settings.
//!
//! The modules, in the order a batch goes through them: `load` (the entry points, the digest),
//! `value` (the value tree with lines, from TOML or JSON), `document` (a file's run settings,
//! `[defaults]` and tasks), `fields` (a task's fields, type-checked), `agents`
//! (`[agents.NAME]`), `resolve` (defaults applied, then core's validation), `locate` (where a
//! validation error belongs), `admission` (the checks that need the filesystem).
//!
//! Invariants:
//! - environment values live only in [`LoadedBatch::env`]; the [`Batch`] holds their names
//!   (`TaskSpec::env_keys`, `AgentProfile::env_keys`), so journaling the batch never journals a
//!   secret;
//! - this crate reads files and looks at the filesystem (canonical paths, `.git`), and never
//!   spawns, writes or journals anything: a batch that does not load leaves no trace.

mod admission;
mod agents;
mod check;
mod document;
mod error;
mod expand;
mod fields;
mod json;
mod load;
mod locate;
mod needs;
mod ray_fields;
mod read;
mod resolve;
mod schema;
mod secret;
mod value;
// #13: roles.
mod roles;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;

use sortie_core::Batch;

pub use check::{Checked, load_for_check};
pub use error::{BatchError, BatchIssue};
pub use load::{load, load_jsonl, load_toml, one_off_command, one_off_prompt};
pub use needs::PatternUse;
pub use roles::RoleUse;
pub use secret::{EnvValue, PAD, Redactor, Resolved, expand_home, resolve_env, unpad};

/// The names a batch file may use, as the loader knows them: these are the very lists its
/// parser matches keys against (a name not in them is refused as an unknown field).
/// docs/batch-file.md describes each; `tests/reference.rs` checks that it names every one.
pub mod known_fields {
    /// The top-level keys of a TOML batch file (and of a JSON Lines batch's defaults file,
    /// which takes all of them but `tasks`).
    pub const RUN: &[&str] = crate::fields::RUN_FIELDS;
    /// The fields of a task; `[defaults]` takes the same keys.
    pub const TASK: &[&str] = crate::fields::TASK_FIELDS;
    /// The keys of an `[agents.NAME]` table.
    pub const AGENT: &[&str] = crate::fields::AGENT_FIELDS;
    /// The keys of a task's (or `[defaults]`'s) `slurm` table.
    pub const SLURM: &[&str] = crate::fields::SLURM_FIELDS;
    /// #36: the keys of a task's (or `[defaults]`'s) `ray` table.
    pub const RAY: &[&str] = crate::ray_fields::RAY_FIELDS;
    /// The keys of the run's `[budget]` table.
    pub const BUDGET: &[&str] = crate::document::BUDGET_FIELDS;
    /// The keys of a `[pools.NAME]` table.
    pub const POOL: &[&str] = crate::document::POOL_FIELDS;
    /// The keys of a `[prices."MODEL"]` table (#37).
    pub const PRICE: &[&str] = crate::document::PRICE_FIELDS;
}

/// The name that issues about a one-off (flags, no file) carry as their file.
pub const COMMAND_LINE: &str = "<command line>";

/// A batch ready to run.
#[derive(Clone)]
pub struct LoadedBatch {
    /// The tasks, resolved: defaults applied, `cwd`, `output` and `reads` absolute (relative to
    /// the batch file's directory; for one-offs relative to the given directory).
    pub batch: Batch,
    /// Per task index: the extra environment of the task's child (the agent profile's `env`,
    /// then `[defaults]`'s, then the task's own; a later one wins), sorted by name; a
    /// reference (#34) is resolved at launch. The names
    /// of `env[i]` are `batch.tasks[i].env_keys`, in the same order. Never journaled.
    pub env: Vec<Vec<(String, EnvValue)>>,
    /// A stable digest of the input: FNV-1a 64 over each input's length (8 bytes, little
    /// endian) then its bytes: the batch file, then the defaults file when there is one. For a
    /// one-off, over its prompt or argv, agent and model. Flags are not part of it.
    pub digest: u64,
}

impl fmt::Debug for LoadedBatch {
    /// Shows the environment's names only: its values are secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env: Vec<Vec<&str>> = self
            .env
            .iter()
            .map(|e| e.iter().map(|(k, _)| k.as_str()).collect())
            .collect();
        f.debug_struct("LoadedBatch")
            .field("batch", &self.batch)
            .field("env (names only)", &env)
            .field("digest", &format_args!("{:016x}", self.digest))
            .finish()
    }
}

/// Command-line flags that change a batch. `agent` and `model` are defaults: they win over the
/// file's `[defaults]` but not over a task's own field. `concurrency` and `fail_fast` override
/// the file's run settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--concurrency`.
    pub concurrency: Option<u32>,
    /// `--fail-fast`.
    pub fail_fast: Option<bool>,
    /// `--agent`.
    pub agent: Option<String>,
    /// `--model`.
    pub model: Option<String>,
    /// `--allow-shared-writes`: overrides the file's `allow_shared_writes`.
    pub allow_shared_writes: Option<bool>,
    /// The worktrees directory of the state dir the batch will run under (the runner's layout
    /// says where it is): an `output` inside it is refused. None: not checked.
    pub worktrees: Option<PathBuf>,
    /// `--executor` (#11): where every task's attempts run, unless a task says otherwise.
    pub executor: Option<sortie_core::ExecutorKind>,
}
