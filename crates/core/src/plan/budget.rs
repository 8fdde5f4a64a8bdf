//! The run budget's check, before the planner's passes: which limit of `[budget]` the run's
//! usage (its counters, live progress included) or its wall clock reached, and which reached
//! the warning threshold. Cost and tokens breach when they pass the limit, the deadline when
//! the clock reaches it (as the task budgets do).

use super::{Action, Round};
use crate::event::{BudgetLimit, Event};
use crate::ids::Timestamp;
use crate::state::RunState;
use crate::usage::Cost;

/// Journals the warnings due and, when a limit ran out, `RunBudgetExceeded`; returns its
/// reason then.
pub(super) fn check(state: &RunState, round: &mut Round<'_>) -> Option<String> {
    let budget = state.batch.as_ref()?.config.budget;
    if !budget.is_set() || state.budget_exceeded.is_some() {
        return None;
    }
    let usage = state.usage_counters();
    let elapsed = state
        .started_at
        .map_or(0, |s| round.facts.now.0.saturating_sub(s.0));
    let limits = [
        (BudgetLimit::Cost, usage.cost.nanos, budget.max_cost_nanos),
        (BudgetLimit::Tokens, usage.tokens(), budget.max_tokens),
        (
            BudgetLimit::Deadline,
            elapsed,
            budget
                .deadline
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        ),
    ];
    for (limit, used, of) in limits {
        let Some(of) = of else { continue };
        let out = match limit {
            BudgetLimit::Deadline => used >= of,
            _ => used > of,
        };
        if out {
            let reason = reason(limit, used, of);
            round.push(Action::Append(Event::RunBudgetExceeded {
                limit,
                reason: reason.clone(),
            }));
            return Some(reason);
        }
        let warn = u128::from(used) * 100 >= u128::from(of) * u128::from(budget.warn_percent);
        if warn && !state.budget_warned.contains(&limit) {
            round.push(Action::Append(Event::RunBudgetWarned { limit, used, of }));
        }
    }
    None
}

/// `run cost $5.10 passed max_cost $5.00`, `run tokens 120000 passed max_tokens 100000`,
/// `run wall clock 2h reached deadline 2h`.
pub(crate) fn reason(limit: BudgetLimit, used: u64, of: u64) -> String {
    match limit {
        BudgetLimit::Cost => format!(
            "run cost {} passed max_cost {}",
            Cost::reported_nanos(used),
            Cost::reported_nanos(of)
        ),
        BudgetLimit::Tokens => format!("run tokens {used} passed max_tokens {of}"),
        BudgetLimit::Deadline => format!(
            "run wall clock {} reached deadline {}",
            crate::spec::bounds::format(std::time::Duration::from_millis(used)),
            crate::spec::bounds::format(std::time::Duration::from_millis(of))
        ),
    }
}

/// The times the run's deadline warns and ends, when it has one and they are still to come.
pub(super) fn deadline_wakes(state: &RunState) -> Vec<Timestamp> {
    let (Some(batch), Some(start)) = (&state.batch, state.started_at) else {
        return Vec::new();
    };
    let budget = batch.config.budget;
    let Some(d) = budget.deadline else {
        return Vec::new();
    };
    if state.budget_exceeded.is_some() {
        return Vec::new();
    }
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut out = vec![Timestamp(start.0.saturating_add(ms))];
    if !state.budget_warned.contains(&BudgetLimit::Deadline) {
        let warn = ms.saturating_mul(u64::from(budget.warn_percent)) / 100;
        out.push(Timestamp(start.0.saturating_add(warn)));
    }
    out
}
