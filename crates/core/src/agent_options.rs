//! What a task lets its agent do and how it asks: `permissions`, `thinking`, and the
//! `{agent_args}` template element that carries them into each agent CLI's own flags
//! (docs/agents.md). Re-exported from `spec`, where the task fields that use them live.

use serde::{Deserialize, Serialize};

/// The `thinking` levels a task may ask for, translated per agent (docs/agents.md).
pub const THINKING_LEVELS: &[&str] = &["off", "minimal", "low", "medium", "high", "xhigh"];

/// The argv element of an agent profile's template that expands to the agent's own flags for a
/// task's `permissions` and `tools` (each built-in profile places it; docs/agents.md).
pub const AGENT_ARGS: &str = "{agent_args}";

/// What an agent may do in its working directory, translated per agent (docs/agents.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Permissions {
    /// Read and search only: no edits, no commands that change anything.
    ReadOnly,
    /// Edit files and run commands inside the working directory (the default; a worktree
    /// task's worktree).
    #[default]
    Edit,
    /// Everything the agent can do, without asking.
    Full,
}

impl Permissions {
    /// The name used in batch files.
    pub fn as_str(self) -> &'static str {
        match self {
            Permissions::ReadOnly => "read-only",
            Permissions::Edit => "edit",
            Permissions::Full => "full",
        }
    }

    /// Parses a batch-file name.
    pub fn parse(name: &str) -> Option<Permissions> {
        [Permissions::ReadOnly, Permissions::Edit, Permissions::Full]
            .into_iter()
            .find(|p| p.as_str() == name)
    }
}
