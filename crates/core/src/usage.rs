//! Token and cost accounting: one attempt's usage, and how usages add up.
//!
//! Every counter is summed, except `context_tokens`, which is a level (the size of the latest
//! context), not a flow: the later value wins. Cost is kept in integer nano-dollars so that sums
//! are exact and independent of order, and an unreported cost is counted as such, never as 0.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A cost in US dollars, with honesty about what was not reported.
///
/// `nanos` is the sum of the costs that were reported, in units of 1e-9 USD; `unreported` counts
/// the usages folded in whose cost was unknown. A cost with `unreported > 0` is a lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Cost {
    /// Sum of reported costs, in nano-dollars.
    pub nanos: u64,
    /// How many usages in this sum had no reported cost.
    pub unreported: u32,
}

impl Cost {
    /// A reported cost in nano-dollars.
    pub fn reported_nanos(nanos: u64) -> Cost {
        Cost {
            nanos,
            unreported: 0,
        }
    }

    /// A cost that the agent did not report.
    pub fn unreported() -> Cost {
        Cost {
            nanos: 0,
            unreported: 1,
        }
    }

    /// Converts a dollar amount reported by an agent; negative or non-finite values count as 0
    /// (agents have been seen printing both).
    pub fn from_usd(usd: f64) -> Cost {
        let nanos = if usd.is_finite() && usd > 0.0 {
            let n = (usd * 1e9).round();
            if n >= u64::MAX as f64 {
                u64::MAX
            } else {
                n as u64
            }
        } else {
            0
        };
        Cost::reported_nanos(nanos)
    }

    /// The reported part in dollars.
    pub fn usd(self) -> f64 {
        self.nanos as f64 / 1e9
    }

    /// True when every part of this cost was reported.
    pub fn is_complete(self) -> bool {
        self.unreported == 0
    }

    /// The sum of two costs.
    pub fn plus(self, other: Cost) -> Cost {
        Cost {
            nanos: self.nanos.saturating_add(other.nanos),
            unreported: self.unreported.saturating_add(other.unreported),
        }
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.nanos, self.unreported) {
            (0, 0) => f.write_str("$0.0000"),
            (0, _) => f.write_str("unreported"),
            (_, 0) => write!(f, "${:.4}", self.usd()),
            (_, n) => write!(f, "${:.4} + {n} unreported", self.usd()),
        }
    }
}

/// What one attempt (or a sum of attempts) consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub input: u64,
    /// Output (completion) tokens.
    pub output: u64,
    /// Tokens read from the provider's cache.
    pub cache_read: u64,
    /// Tokens written to the provider's cache.
    pub cache_write: u64,
    /// Reasoning tokens, when the provider reports them apart.
    pub reasoning: u64,
    /// Cost in USD.
    pub cost: Cost,
    /// Assistant messages (one message is one turn).
    pub turns: u32,
    /// Size of the latest context in tokens: a level, not summed.
    pub context_tokens: u64,
}

impl Usage {
    /// No usage at all, with a reported cost of 0 (used by plain commands that spend nothing).
    pub const ZERO: Usage = Usage {
        input: 0,
        output: 0,
        cache_read: 0,
        cache_write: 0,
        reasoning: 0,
        cost: Cost {
            nanos: 0,
            unreported: 0,
        },
        turns: 0,
        context_tokens: 0,
    };

    /// The total number of tokens counted (input, output and cache traffic).
    pub fn tokens(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }

    /// The sum of two usages: counters add up, `context_tokens` takes the later (`other`) value
    /// unless it is 0.
    pub fn plus(&self, other: &Usage) -> Usage {
        Usage {
            input: self.input.saturating_add(other.input),
            output: self.output.saturating_add(other.output),
            cache_read: self.cache_read.saturating_add(other.cache_read),
            cache_write: self.cache_write.saturating_add(other.cache_write),
            reasoning: self.reasoning.saturating_add(other.reasoning),
            cost: self.cost.plus(other.cost),
            turns: self.turns.saturating_add(other.turns),
            context_tokens: if other.context_tokens == 0 {
                self.context_tokens
            } else {
                other.context_tokens
            },
        }
    }

    /// What `self` counted beyond `earlier`: each counter's difference, never below zero
    /// (`context_tokens`, a level, is 0).
    pub fn minus(&self, earlier: &Usage) -> Usage {
        Usage {
            input: self.input.saturating_sub(earlier.input),
            output: self.output.saturating_sub(earlier.output),
            cache_read: self.cache_read.saturating_sub(earlier.cache_read),
            cache_write: self.cache_write.saturating_sub(earlier.cache_write),
            reasoning: self.reasoning.saturating_sub(earlier.reasoning),
            cost: Cost {
                nanos: self.cost.nanos.saturating_sub(earlier.cost.nanos),
                unreported: self.cost.unreported.saturating_sub(earlier.cost.unreported),
            },
            turns: self.turns.saturating_sub(earlier.turns),
            context_tokens: 0,
        }
    }

    /// True when no counter of `self` is below the same counter of `earlier`: a live checkpoint
    /// must never go backwards. (`context_tokens` is a level and may shrink, e.g. on compaction.)
    pub fn dominates(&self, earlier: &Usage) -> bool {
        self.input >= earlier.input
            && self.output >= earlier.output
            && self.cache_read >= earlier.cache_read
            && self.cache_write >= earlier.cache_write
            && self.reasoning >= earlier.reasoning
            && self.cost.nanos >= earlier.cost.nanos
            && self.turns >= earlier.turns
    }

    /// The field-wise maximum: what a live counter shows when a new reading may lag an old one.
    pub fn max(&self, other: &Usage) -> Usage {
        Usage {
            input: self.input.max(other.input),
            output: self.output.max(other.output),
            cache_read: self.cache_read.max(other.cache_read),
            cache_write: self.cache_write.max(other.cache_write),
            reasoning: self.reasoning.max(other.reasoning),
            cost: Cost {
                nanos: self.cost.nanos.max(other.cost.nanos),
                unreported: self.cost.unreported.max(other.cost.unreported),
            },
            turns: self.turns.max(other.turns),
            context_tokens: other.context_tokens,
        }
    }

    /// Sums a sequence of usages in order.
    pub fn sum<'a>(usages: impl IntoIterator<Item = &'a Usage>) -> Usage {
        usages.into_iter().fold(Usage::ZERO, |acc, u| acc.plus(u))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(input: u64, ctx: u64, cost: Cost) -> Usage {
        Usage {
            input,
            context_tokens: ctx,
            cost,
            turns: 1,
            ..Usage::ZERO
        }
    }

    #[test]
    fn sums_counters_and_keeps_latest_context() {
        let a = u(10, 100, Cost::reported_nanos(5));
        let b = u(7, 40, Cost::reported_nanos(3));
        let s = a.plus(&b);
        assert_eq!(
            (s.input, s.turns, s.context_tokens, s.cost.nanos),
            (17, 2, 40, 8)
        );
        let c = u(1, 0, Cost::reported_nanos(0));
        assert_eq!(
            s.plus(&c).context_tokens,
            40,
            "a zero context does not erase the level"
        );
    }

    #[test]
    fn unreported_cost_is_not_zero() {
        let s = u(1, 0, Cost::reported_nanos(2_000_000_000)).plus(&u(1, 0, Cost::unreported()));
        assert_eq!(
            s.cost,
            Cost {
                nanos: 2_000_000_000,
                unreported: 1
            }
        );
        assert_eq!(s.cost.to_string(), "$2.0000 + 1 unreported");
        assert_eq!(Cost::unreported().to_string(), "unreported");
        assert!(!s.cost.is_complete());
    }

    #[test]
    fn dollars_convert_exactly_enough_and_refuse_garbage() {
        assert_eq!(Cost::from_usd(0.000123).nanos, 123_000);
        assert_eq!(Cost::from_usd(-1.0).nanos, 0);
        assert_eq!(Cost::from_usd(f64::NAN).nanos, 0);
        assert_eq!(Cost::from_usd(f64::INFINITY).nanos, 0);
    }
}
