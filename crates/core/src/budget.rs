//! A task's budget while one of its attempts runs: when its usage breaches a budget, whether
//! the agent is asked to wrap up or stopped at once, when a wrap-up has run out of grace
//! turns, and the attempt's final usage. The run's budget is [`crate::run_budget`]'s.
//!
//! Rules:
//! - Budgets cover the whole task: the usage of its earlier attempts ([`TaskBudget::prior`])
//!   counts with the running attempt's.
//! - A breach: turns at or over `max_turns`, tokens over `max_tokens`, cost over
//!   `max_cost_nanos` (checked in that order; the first one met is the reason).
//! - On a breach, an agent that can be steered now (a wrap-up command and an open stdin) with
//!   `grace_turns > 0` is asked to wrap up; any other is stopped at once. A wrap-up is asked
//!   once; the run's budget running out asks the same way ([`BudgetWatch::ask_wrap_up`]).
//! - An agent still working `grace_turns` turns after the wrap-up request is stopped.
//! - Usage never goes backwards: [`final_usage`] is the reader's last word raised to what was
//!   seen, with the reader's word on whether the cost is known.
//!
//! The watchdog (in the runner) keeps the clocks and carries the steps out; this module only
//! says what a usage update means.

use crate::spec::TaskSpec;
use crate::state::{AttemptRecord, TaskRecord};
use crate::usage::Usage;

/// A task's budgets as one attempt sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskBudget {
    /// At most this many turns.
    pub max_turns: Option<u32>,
    /// At most this many tokens.
    pub max_tokens: Option<u64>,
    /// At most this cost, in nano-dollars.
    pub max_cost_nanos: Option<u64>,
    /// Turns granted to wrap up after a breach (steerable agents only).
    pub grace_turns: u32,
    /// The usage of the task's earlier attempts.
    pub prior: Usage,
}

impl TaskBudget {
    /// The budgets of the attempt of `rec` now launching (its last attempt record): the spec's
    /// limits, and the usage of the attempts before it.
    pub fn for_attempt(spec: &TaskSpec, rec: &TaskRecord) -> TaskBudget {
        let earlier = &rec.attempts[..rec.attempts.len().saturating_sub(1)];
        TaskBudget {
            max_turns: spec.max_turns,
            max_tokens: spec.max_tokens,
            max_cost_nanos: spec.max_cost_nanos,
            grace_turns: spec.grace_turns,
            prior: Usage::sum(earlier.iter().map(AttemptRecord::usage)),
        }
    }

    /// Which budget, if any, the task has reached with `usage` (the running attempt's), for
    /// people.
    pub fn breach(&self, usage: &Usage) -> Option<String> {
        let total = self.prior.plus(usage);
        if let Some(max) = self.max_turns
            && total.turns >= max
        {
            return Some(format!(
                "reached max turns budget ({} of {max})",
                total.turns
            ));
        }
        if let Some(max) = self.max_tokens
            && total.tokens() > max
        {
            return Some(format!(
                "exceeded max tokens budget ({} of {max})",
                total.tokens()
            ));
        }
        if let Some(max) = self.max_cost_nanos
            && total.cost.nanos > max
        {
            return Some(format!(
                "exceeded max cost budget (${:.4} of ${:.4})",
                total.cost.usd(),
                max as f64 / 1e9
            ));
        }
        None
    }

    /// The task's turns with `usage` for the running attempt.
    fn turns(&self, usage: &Usage) -> u32 {
        self.prior.plus(usage).turns
    }
}

/// An attempt's final usage: the counters never below what progress showed (`seen`), but
/// whether the cost is known is the reader's last word (Claude Code's cost is unknown until
/// its `result` line, which then reports it).
pub fn final_usage(last_word: Usage, seen: &Usage) -> Usage {
    let mut u = last_word.max(seen);
    u.cost.unreported = last_word.cost.unreported;
    u
}

/// What a usage update means for the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetStep {
    /// Ask the agent to wrap up (send its wrap-up command).
    WrapUp,
    /// Stop the attempt (reason `budget`), with this message.
    Stop(String),
}

/// What [`BudgetWatch::ask_wrap_up`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrapUpAsk {
    /// The agent is to be asked to wrap up now.
    Asked,
    /// It was asked before: nothing more to do.
    AlreadyAsked,
    /// It cannot be asked (not steerable now, or `grace_turns = 0`): stop it instead.
    Cannot,
}

/// A wrap-up request sent after a budget breach.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WrapUp {
    /// Which budget, for people.
    why: String,
    /// The task's turns when it was sent.
    at_turns: u32,
}

/// The budget side of one running attempt: its budgets and its wrap-up, if one was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetWatch {
    budget: TaskBudget,
    wrap_up: Option<WrapUp>,
}

impl BudgetWatch {
    /// An attempt's budget watch, nothing asked yet.
    pub fn new(budget: TaskBudget) -> BudgetWatch {
        BudgetWatch {
            budget,
            wrap_up: None,
        }
    }

    /// The budgets watched.
    pub fn budget(&self) -> &TaskBudget {
        &self.budget
    }

    /// The attempt's usage is now `usage` (monotonic) and the agent's run is `working` (not
    /// between runs); `steerable`: it can be sent its wrap-up command now. Call it only while
    /// no stop was decided.
    pub fn on_usage(
        &mut self,
        usage: &Usage,
        steerable: bool,
        working: bool,
    ) -> Option<BudgetStep> {
        let turns = self.budget.turns(usage);
        match &self.wrap_up {
            None => {
                let why = self.budget.breach(usage)?;
                let message = if !steerable {
                    format!("{why}; stopped at once (the agent cannot be steered), not wrapped up")
                } else if self.budget.grace_turns == 0 {
                    format!("{why}; stopped at once (grace_turns = 0), not wrapped up")
                } else {
                    self.wrap_up = Some(WrapUp {
                        why,
                        at_turns: turns,
                    });
                    return Some(BudgetStep::WrapUp);
                };
                Some(BudgetStep::Stop(message))
            }
            Some(w) if turns >= w.at_turns.saturating_add(self.budget.grace_turns) && working => {
                Some(BudgetStep::Stop(format!(
                    "{}; asked to wrap up, but still working after {} grace turn(s): \
                     stopped, not wrapped up",
                    w.why, self.budget.grace_turns
                )))
            }
            Some(_) => None,
        }
    }

    /// Something else ran out (the run's budget, `why`): a steerable agent is asked to wrap up
    /// within its grace turns, as for its own budget. `usage` is the attempt's so far.
    pub fn ask_wrap_up(&mut self, why: String, usage: &Usage, steerable: bool) -> WrapUpAsk {
        if !steerable || self.budget.grace_turns == 0 {
            return WrapUpAsk::Cannot;
        }
        if self.wrap_up.is_some() {
            return WrapUpAsk::AlreadyAsked;
        }
        self.wrap_up = Some(WrapUp {
            why,
            at_turns: self.budget.turns(usage),
        });
        WrapUpAsk::Asked
    }

    /// The wrap-up command could not be sent: the message the attempt is stopped with, if a
    /// wrap-up was asked.
    pub fn wrap_up_failed(&mut self) -> Option<String> {
        let w = self.wrap_up.take()?;
        Some(format!(
            "{}; stopped (the wrap-up request could not be sent)",
            w.why
        ))
    }

    /// The account of a wrap-up for an attempt that ended by itself after the request, if one
    /// was asked.
    pub fn wrapped_up(&self) -> Option<String> {
        let w = self.wrap_up.as_ref()?;
        Some(format!(
            "{}; asked to wrap up, and it wrapped up within {} grace turn(s)",
            w.why, self.budget.grace_turns
        ))
    }
}
