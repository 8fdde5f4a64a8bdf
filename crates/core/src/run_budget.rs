//! A whole run's budget (`[budget]`): its limits and warning threshold, as the batch gives
//! them (the planner's `plan/budget.rs` decides on them). Re-exported from `spec`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A whole run's budget (`[budget]` in a batch file). When the run's usage passes a limit, or
/// its wall clock the deadline, nothing new launches, running attempts are asked to wrap up
/// (stopped when they cannot be steered), the tasks not started end cancelled, and the run
/// ends with the reason. A warning is journaled when a limit's use reaches `warn_percent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunBudget {
    /// The run's cost limit in nano-dollars (reported costs; an unreported part counts 0).
    pub max_cost_nanos: Option<u64>,
    /// The run's token limit.
    pub max_tokens: Option<u64>,
    /// The run's wall clock from its start (resumes included).
    pub deadline: Option<Duration>,
    /// The percent of a limit at which the warning is journaled (1 to 100).
    pub warn_percent: u8,
}

impl Default for RunBudget {
    fn default() -> Self {
        RunBudget {
            max_cost_nanos: None,
            max_tokens: None,
            deadline: None,
            warn_percent: 80,
        }
    }
}

impl RunBudget {
    /// Whether any limit is set.
    pub fn is_set(&self) -> bool {
        self.max_cost_nanos.is_some() || self.max_tokens.is_some() || self.deadline.is_some()
    }
}
