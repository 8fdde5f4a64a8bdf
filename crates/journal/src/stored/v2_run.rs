//! Format v2's extension of the run's settings (`RunConfig`: its budget, pools, hook and
//! prices) and the mirrors they need; the rules of `v2.rs` hold here too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sortie_core::spec::RunConfig;

use super::v2::Grow;

/// The fields of `RunConfig` added since v1.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RunConfigExtV2 {
    /// `RunConfig::budget` (issue 14).
    budget: Grow<RunBudgetV2>,
    /// `RunConfig::pools` (issue 14).
    pools: BTreeMap<String, Grow<PoolSpecV2>>,
    // #15
    on_task_end: Option<String>,
    // #37: model prices, and the date of the table they were resolved from.
    prices: Grow<PricesV2>,
}

/// Mirrors `sortie_core::prices::Prices` (#37).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct PricesV2 {
    as_of: String,
    models: BTreeMap<String, Grow<ModelPriceV2>>,
}

/// Mirrors `sortie_core::prices::ModelPrice` (#37): nano-dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct ModelPriceV2 {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
}

impl RunConfigExtV2 {
    pub(crate) fn of(c: &RunConfig) -> Self {
        RunConfigExtV2 {
            budget: Grow(RunBudgetV2 {
                max_cost_nanos: c.budget.max_cost_nanos,
                max_tokens: c.budget.max_tokens,
                deadline: c.budget.deadline.map(Into::into),
                warn_percent: c.budget.warn_percent,
            }),
            pools: c
                .pools
                .iter()
                .map(|(k, p)| {
                    let pool = PoolSpecV2 {
                        concurrency: p.concurrency,
                        adaptive: p.adaptive,
                    };
                    (k.clone(), Grow(pool))
                })
                .collect(),
            on_task_end: c.on_task_end.clone(),
            prices: Grow(PricesV2 {
                as_of: c.prices.as_of.clone(),
                models: c
                    .prices
                    .models
                    .iter()
                    .map(|(k, p)| {
                        let price = ModelPriceV2 {
                            input: p.input,
                            output: p.output,
                            cache_read: p.cache_read,
                            cache_write: p.cache_write,
                        };
                        (k.clone(), Grow(price))
                    })
                    .collect(),
            }),
        }
    }
    pub(crate) fn apply(self, c: &mut RunConfig) -> Result<(), String> {
        let Grow(b) = self.budget;
        c.budget = sortie_core::RunBudget {
            max_cost_nanos: b.max_cost_nanos,
            max_tokens: b.max_tokens,
            deadline: b.deadline.map(TryInto::try_into).transpose()?,
            warn_percent: b.warn_percent,
        };
        c.pools = self
            .pools
            .into_iter()
            .map(|(k, Grow(p))| {
                let pool = sortie_core::PoolSpec {
                    concurrency: p.concurrency,
                    adaptive: p.adaptive,
                };
                (k, pool)
            })
            .collect();
        c.on_task_end = self.on_task_end;
        let Grow(prices) = self.prices;
        c.prices.as_of = prices.as_of;
        c.prices.models = prices
            .models
            .into_iter()
            .map(|(k, Grow(p))| {
                let price = sortie_core::prices::ModelPrice {
                    input: p.input,
                    output: p.output,
                    cache_read: p.cache_read,
                    cache_write: p.cache_write,
                };
                (k, price)
            })
            .collect();
        Ok(())
    }
}

/// Mirrors `sortie_core::RunBudget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RunBudgetV2 {
    max_cost_nanos: Option<u64>,
    max_tokens: Option<u64>,
    deadline: Option<super::DurationV1>,
    warn_percent: u8,
}

impl Default for RunBudgetV2 {
    fn default() -> Self {
        RunBudgetV2 {
            max_cost_nanos: None,
            max_tokens: None,
            deadline: None,
            warn_percent: sortie_core::RunBudget::default().warn_percent,
        }
    }
}

/// Mirrors `sortie_core::PoolSpec` (issue 14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct PoolSpecV2 {
    concurrency: Option<u32>,
    adaptive: bool,
}

impl Default for PoolSpecV2 {
    fn default() -> Self {
        PoolSpecV2 {
            concurrency: None,
            adaptive: true,
        }
    }
}

/// Mirrors `sortie_core::BudgetLimit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BudgetLimitV2 {
    Cost,
    Tokens,
    Deadline,
}

impl From<sortie_core::BudgetLimit> for BudgetLimitV2 {
    fn from(l: sortie_core::BudgetLimit) -> Self {
        use sortie_core::BudgetLimit as L;
        match l {
            L::Cost => BudgetLimitV2::Cost,
            L::Tokens => BudgetLimitV2::Tokens,
            L::Deadline => BudgetLimitV2::Deadline,
        }
    }
}

impl From<BudgetLimitV2> for sortie_core::BudgetLimit {
    fn from(l: BudgetLimitV2) -> Self {
        use sortie_core::BudgetLimit as L;
        match l {
            BudgetLimitV2::Cost => L::Cost,
            BudgetLimitV2::Tokens => L::Tokens,
            BudgetLimitV2::Deadline => L::Deadline,
        }
    }
}
